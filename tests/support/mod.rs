//! What the test binaries share: a Redis harness that starts its own
//! servers on free ports (`redis`), a sidecar harness that runs
//! `charon serve` (`sidecar`), the Python tools of the test venv (`venv`),
//! the generators of the property tests (`properties`), an OTLP collector
//! that keeps the spans it is sent (`otlp`), a real Prometheus scraping
//! a sidecar and asked through its query API (`prometheus`), TCP proxies that stall or
//! close on demand (`proxy`), and where the examples' programs are
//! ([`example_binary`]) with a guard that stops them ([`KilledOnDrop`]).
//!
//! Each binary declares `mod support;` and uses what it needs, so the rest
//! is dead code there.
#![allow(dead_code)]

pub mod certs;
pub mod otlp;
pub mod prometheus;
pub mod properties;
pub mod proxy;
pub mod redis;
pub mod sidecar;
pub mod venv;

/// The program of `examples/NAME.rs`, built by `cargo build --examples`
/// (which `scripts/test.sh` runs before the tests: `cargo test` builds
/// examples as test harnesses, not as the program).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(env!("CARGO_BIN_EXE_charon"))
        .parent()
        .map(|dir| dir.join("examples").join(name))
        .expect("the binaries' directory");
    assert!(
        path.is_file(),
        "no {}: build it with `cargo build --examples` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A child process (an example's program), killed and reaped when the test
/// ends however it ends.
pub struct KilledOnDrop(pub std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
