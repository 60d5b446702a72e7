//! What the configuration tests share: loading YAML, finding a namespace's
//! limits, asserting an error's place and words, running `charon check`.
#![allow(dead_code, unused_imports)]

pub use std::collections::{HashMap, HashSet};
pub use std::path::{Path, PathBuf};
pub use std::process::{Command, Output};
pub use std::time::{Duration, Instant};

pub use charon::config::{
    Algorithm, ConfigError, CopyGroup, CopyResource, FOREVER, FixedLimit, Leaf, Loaded, Namespace,
    Note, RatePolicy, RateResource, Resource, Tier, Unit, caps, load_path, load_str,
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

pub const ORIGIN: &str = "test.yaml";

/// A request descriptor: its `(key, value)` entries.
pub type Entries<'a> = &'a [(&'a str, &'a str)];

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// Loads `yaml`, failing the test with every error if it does not load.
pub fn load(yaml: &str) -> Loaded {
    load_str(yaml, ORIGIN).unwrap_or_else(|errors| panic!("should load:\n{errors}\n---\n{yaml}"))
}

/// The errors of a file that must not load.
pub fn errors_of(yaml: &str) -> Vec<ConfigError> {
    match load_str(yaml, ORIGIN) {
        Ok(_) => panic!("should be rejected:\n{yaml}"),
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an Err carries at least one error");
            errors.0
        }
    }
}

/// `yaml` is rejected with exactly one error, at `line:column`, whose message
/// contains every fragment.
pub fn assert_error(yaml: &str, line: u64, column: u64, fragments: &[&str]) {
    let errors = errors_of(yaml);
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one error, got {errors:#?}\n---\n{yaml}"
    );
    let error = &errors[0];
    assert_eq!(error.file, Path::new(ORIGIN), "{error}");
    assert_eq!(
        (error.line, error.column),
        (line, column),
        "wrong location for `{error}`\n---\n{yaml}"
    );
    for fragment in fragments {
        assert!(
            error.message.contains(fragment),
            "message `{}` should mention `{fragment}`",
            error.message
        );
    }
    // The Display form is compiler style: `file:line:column: message`.
    assert_eq!(
        error.to_string(),
        format!("{ORIGIN}:{line}:{column}: {}", error.message)
    );
}

/// The only namespace of a loaded file.
pub fn only(loaded: &Loaded) -> &Namespace {
    let mut all = loaded.config.namespaces();
    let namespace = all.next().expect("one namespace");
    assert!(all.next().is_none(), "exactly one namespace");
    namespace
}

/// The leaf a descriptor leads to, `None` when nothing matches.
pub fn leaf(namespace: &Namespace, entries: &[(&str, &str)]) -> Option<Leaf> {
    namespace
        .descriptors
        .find(entries.iter().copied())
        .map(|found| found.node.leaf.clone())
}

pub fn limit(requests_per_unit: u64, unit: Unit) -> Leaf {
    Leaf::Limit(FixedLimit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        name: None,
        replaces: Vec::new(),
        algorithm: Algorithm::FixedWindow,
        soft_limit: None,
        count_rejected: false,
        global: false,
        calendar: None,
    })
}

pub fn rate<'n>(namespace: &'n Namespace, name: &str) -> &'n RateResource {
    match namespace.resources.get(name) {
        Some(Resource::Rate(resource)) => resource,
        other => panic!("resource `{name}` should be rate-limited, got {other:?}"),
    }
}

pub fn copies<'n>(namespace: &'n Namespace, name: &str) -> &'n CopyResource {
    match namespace.resources.get(name) {
        Some(Resource::Copies(resource)) => resource,
        other => panic!("resource `{name}` should be copy-limited, got {other:?}"),
    }
}

pub fn tier(limit: u64, window: u64, active: u64, cooldown: u64, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

pub const S: u64 = 1_000;
pub const MIN: u64 = 60 * S;
pub const HOUR: u64 = 60 * MIN;

/// `(line, column)` of every note, in order.
pub fn note_places(notes: &[Note]) -> Vec<(u64, u64)> {
    notes.iter().map(|n| (n.line, n.column)).collect()
}

/// A file with one rate-limited resource `r` whose tier list is `tiers`
/// (flow YAML, on line 6, starting at column 11).
pub fn one_tier(tier: &str) -> String {
    format!("domain: a\nresources:\n  r:\n    rate:\n      tiers:\n        - {tier}\n")
}

/// Same shape for a descriptor: `rate_limit` written on line 4, column 17.
pub fn one_limit(rate_limit: &str) -> String {
    format!("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n")
}

pub fn charon(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("check")
        .args(args)
        .output()
        .expect("run charon check")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn write(path: &Path, yaml: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, yaml).unwrap();
}

/// The fixtures after envoyproxy/ratelimit's README, with their domains.
pub const ENVOY_FIXTURES: &[(&str, &str)] = &[
    ("basic.yaml", "basic"),
    ("edge_proxy_per_ip.yaml", "edge_proxy_per_ip"),
    ("example4.yaml", "example4"),
    ("example6.yaml", "example6"),
    ("example7.yaml", "example7"),
    ("example8.yaml", "example8"),
    ("example9.yaml", "example9"),
    ("internal.yaml", "internal"),
    ("messaging.yaml", "messaging"),
    ("mongo_cps.yaml", "mongo_cps"),
    ("units.yaml", "units"),
    ("wildcards.yaml", "wildcards"),
];

pub fn envoy(file: &str) -> Loaded {
    let path = fixture("envoy").join(file);
    load_path(&path).unwrap_or_else(|errors| panic!("{} should load:\n{errors}", path.display()))
}

/// `domain: a` then descriptors nested `depth` deep in flow style, on line 2.
pub fn nested_flow(depth: usize) -> String {
    let mut yaml = String::from("domain: a\ndescriptors: ");
    for _ in 0..depth {
        yaml.push_str("[{key: k, descriptors: ");
    }
    yaml.push_str("[]");
    for _ in 0..depth {
        yaml.push_str("}]");
    }
    yaml.push('\n');
    yaml
}

/// The same in block style, two columns deeper per level.
pub fn nested_block(depth: usize) -> String {
    let mut yaml = String::from("domain: a\ndescriptors:\n");
    for level in 0..depth {
        let indent = "  ".repeat(2 * level);
        yaml.push_str(&format!("{indent}  - key: k{level}\n"));
        if level + 1 < depth {
            yaml.push_str(&format!("{indent}    descriptors:\n"));
        } else {
            yaml.push_str(&format!(
                "{indent}    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        }
    }
    yaml
}

pub fn normalize_fixture() -> Loaded {
    load_path(&fixture("charon/normalize.yaml")).unwrap_or_else(|e| panic!("{e}"))
}
