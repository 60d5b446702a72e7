//! Rules of the house that later work must not undo, each read from the
//! source text:
//!
//! - no file under `src/` is over 600 lines, and one of 501 to 600 says at
//!   its top why it is one piece ("One piece: …");
//! - only the client (`src/client`), the generated API (`src/api`) and the
//!   load tool open a gRPC `CharonClient`: every other caller goes through
//!   `client::Client`;
//! - the compiled configuration is data: no atomics, mutexes or locks
//!   under `src/config` (runtime state belongs to the service and the
//!   limiter; a `OnceLock` that caches text derived from the
//!   configuration, as a descriptor's metric key, holds no state and is
//!   allowed);
//! - the service and the limiter read no clock of their own: their time
//!   comes in from whoever builds them (no `SystemClock` in `src/service`
//!   or `src/limiter`);
//! - only the kit's admin skeleton routes `/healthz`, the readiness paths
//!   and `/metrics`: one admin server for every program.

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// Every Rust file under `src/<under>`, with its text.
fn rust_files(under: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    files(&src().join(under), &mut found);
    found.sort();
    found
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable file");
            let name = path
                .strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR")))
                .expect("under the root")
                .display()
                .to_string();
            (name, text)
        })
        .collect()
}

/// The lines of `text` that are code: `//` comments dropped.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(number, line)| (number + 1, line.split("//").next().unwrap_or("")))
}

/// Where `words` appear in the code of the files under `src/<under>`, but
/// for the files `allowed` starts.
fn found(under: &str, words: &[&str], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, text) in rust_files(under) {
        if allowed.iter().any(|allowed| name.starts_with(allowed)) {
            continue;
        }
        for (number, code) in code_lines(&text) {
            for word in words {
                if code.contains(word) {
                    found.push(format!("{name}:{number}: {word}"));
                }
            }
        }
    }
    found
}

#[test]
fn no_file_is_over_600_lines_and_a_long_one_says_why() {
    let mut over = Vec::new();
    for (name, text) in rust_files("") {
        let lines = text.lines().count();
        let says_why = text
            .lines()
            .take(40)
            .any(|line| line.contains("One piece:"));
        if lines > 600 || (lines > 500 && !says_why) {
            over.push(format!("{name}: {lines} lines"));
        }
    }
    assert!(
        over.is_empty(),
        "files over 600 lines, or over 500 without \"One piece: <why>\" at the top:\n{}",
        over.join("\n")
    );
}

/// The binary parses flags and calls the library (ARCHITECTURE.md): what
/// it does beyond that belongs in a module that a test, an embedding
/// program or another subcommand can reach.
#[test]
fn the_binary_stays_thin() {
    let lines: usize = rust_files("bin")
        .iter()
        .map(|(_, text)| text.lines().count())
        .sum();
    assert!(lines > 500, "the binary's files were not read");
    assert!(
        lines <= 1_500,
        "src/bin/ holds {lines} lines, over 1 500: move what is not a flag into the library"
    );
}

#[test]
fn only_the_client_opens_a_grpc_client_of_charon() {
    let found = found("", &["CharonClient"], &["src/client/", "src/api/"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_configuration_holds_no_runtime_state() {
    let found = found("config", &["Atomic", "Mutex", "RwLock", "Cell<"], &[]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_service_and_the_limiter_read_no_clock_of_their_own() {
    let mut found = found("service", &["SystemClock"], &[]);
    found.extend(self::found("limiter", &["SystemClock"], &[]));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_rules_read_code_not_comments() {
    let text = "let a = 1; // SystemClock\n// Mutex\nlet b = SystemClock;";
    let lines: Vec<_> = code_lines(text)
        .filter(|(_, code)| code.contains("SystemClock") || code.contains("Mutex"))
        .collect();
    assert_eq!(lines, vec![(3, "let b = SystemClock;")]);
}

/// Every program's probes and metrics come from one admin skeleton
/// (`src/kit/admin.rs`): no program routes `/healthz`, a readiness path or
/// `/metrics` itself, so that a probe finds the same paths on every pod.
#[test]
fn only_the_kit_routes_probes_and_metrics() {
    let mut found = Vec::new();
    for (file, text) in rust_files("") {
        if file == "src/kit/admin.rs" {
            continue;
        }
        for (number, line) in code_lines(&text) {
            for path in ["\"/healthz\"", "\"/readyz\"", "\"/ready\"", "\"/metrics\""] {
                if line.contains(&format!(".route({path}")) {
                    found.push(format!("{file}:{number}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "routes the kit's admin skeleton serves, served again:\n{}",
        found.join("\n")
    );
}
