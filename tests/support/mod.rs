//! What the test binaries share: a Redis harness that starts its own
//! servers on free ports (`redis`), a sidecar harness that runs
//! `charon serve` (`sidecar`), the Python tools of the test venv (`venv`),
//! the generators of the property tests (`properties`), an OTLP collector
//! that keeps the spans it is sent (`otlp`), and a TCP proxy that stalls on
//! demand (`proxy`).
//!
//! Each binary declares `mod support;` and uses what it needs, so the rest
//! is dead code there.
#![allow(dead_code)]

pub mod certs;
pub mod otlp;
pub mod properties;
pub mod proxy;
pub mod redis;
pub mod sidecar;
pub mod venv;
