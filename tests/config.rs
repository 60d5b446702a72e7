//! Black-box tests of configuration loading (docs/configuration.md,
//! docs/design.md#matching):
//! `charon::config::{load_str, load_path}` and `charon check`.
//!
//! 1. envoyproxy/ratelimit files load unchanged (fixtures in
//!    `tests/fixtures/config/envoy/`, after the examples of its README);
//! 2. descriptor matching order;
//! 3. errors: `file:line:column`, what is wrong, the whole file rejected;
//! 4. normalization and the notes it leaves;
//! 5. directories (including a Kubernetes ConfigMap mount);
//! 6. the `charon check` binary;
//! 7. regressions: upstream compatibility gaps and unclear messages found and
//!    fixed (empty lists, `---`, `unit_multiplier`, large files, depth,
//!    `replaces`, plain-language parser messages).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use charon::config::{
    Algorithm, ConfigError, CopyGroup, CopyResource, FOREVER, FixedLimit, Leaf, Loaded, Namespace,
    Note, RatePolicy, RateResource, Resource, Tier, Unit, caps, load_path, load_str,
};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const ORIGIN: &str = "test.yaml";

/// A request descriptor: its `(key, value)` entries.
type Entries<'a> = &'a [(&'a str, &'a str)];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config")
}

fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// Loads `yaml`, failing the test with every error if it does not load.
fn load(yaml: &str) -> Loaded {
    load_str(yaml, ORIGIN).unwrap_or_else(|errors| panic!("should load:\n{errors}\n---\n{yaml}"))
}

/// The errors of a file that must not load.
fn errors_of(yaml: &str) -> Vec<ConfigError> {
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
fn assert_error(yaml: &str, line: u64, column: u64, fragments: &[&str]) {
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
fn only(loaded: &Loaded) -> &Namespace {
    let mut all = loaded.config.namespaces();
    let namespace = all.next().expect("one namespace");
    assert!(all.next().is_none(), "exactly one namespace");
    namespace
}

/// The leaf a descriptor leads to, `None` when nothing matches.
fn leaf(namespace: &Namespace, entries: &[(&str, &str)]) -> Option<Leaf> {
    namespace
        .descriptors
        .find(entries.iter().copied())
        .map(|found| found.node.leaf.clone())
}

fn limit(requests_per_unit: u64, unit: Unit) -> Leaf {
    Leaf::Limit(FixedLimit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        name: None,
        replaces: Vec::new(),
        algorithm: Algorithm::FixedWindow,
        soft_limit: None,
    })
}

fn rate<'n>(namespace: &'n Namespace, name: &str) -> &'n RateResource {
    match namespace.resources.get(name) {
        Some(Resource::Rate(resource)) => resource,
        other => panic!("resource `{name}` should be rate-limited, got {other:?}"),
    }
}

fn copies<'n>(namespace: &'n Namespace, name: &str) -> &'n CopyResource {
    match namespace.resources.get(name) {
        Some(Resource::Copies(resource)) => resource,
        other => panic!("resource `{name}` should be copy-limited, got {other:?}"),
    }
}

fn tier(limit: u64, window: u64, active: u64, cooldown: u64, skippable: bool) -> Tier {
    Tier {
        limit,
        window,
        active,
        cooldown,
        skippable,
    }
}

const S: u64 = 1_000;
const MIN: u64 = 60 * S;
const HOUR: u64 = 60 * MIN;

/// `(line, column)` of every note, in order.
fn note_places(notes: &[Note]) -> Vec<(u64, u64)> {
    notes.iter().map(|n| (n.line, n.column)).collect()
}

/// A file with one rate-limited resource `r` whose tier list is `tiers`
/// (flow YAML, on line 6, starting at column 11).
fn one_tier(tier: &str) -> String {
    format!("domain: a\nresources:\n  r:\n    rate:\n      tiers:\n        - {tier}\n")
}

/// Same shape for a descriptor: `rate_limit` written on line 4, column 17.
fn one_limit(rate_limit: &str) -> String {
    format!("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {rate_limit}\n")
}

fn charon(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("check")
        .args(args)
        .output()
        .expect("run charon check")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------
// 1. envoyproxy/ratelimit files load unchanged
// ---------------------------------------------------------------------------

/// The fixtures after envoyproxy/ratelimit's README, with their domains.
const ENVOY_FIXTURES: &[(&str, &str)] = &[
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

fn envoy(file: &str) -> Loaded {
    let path = fixture("envoy").join(file);
    load_path(&path).unwrap_or_else(|errors| panic!("{} should load:\n{errors}", path.display()))
}

#[test]
fn envoy_examples_load_one_by_one_without_notes() {
    for (file, domain) in ENVOY_FIXTURES {
        let loaded = envoy(file);
        let namespace = only(&loaded);
        assert_eq!(namespace.name, *domain, "{file}");
        assert_eq!(namespace.source, fixture("envoy").join(file));
        assert!(namespace.resources.is_empty(), "{file}");
        assert!(
            loaded.notes.is_empty(),
            "{file}: nothing to normalize in an envoyproxy/ratelimit file: {:?}",
            loaded.notes
        );
        // Each loads the same through `load_str`.
        let text = std::fs::read_to_string(fixture("envoy").join(file)).unwrap();
        assert_eq!(only(&load_str(&text, file).unwrap()).name, *domain);
    }
}

#[test]
fn envoy_examples_load_as_one_directory() {
    let loaded = load_path(&fixture("envoy")).unwrap_or_else(|e| panic!("{e}"));
    let mut names: Vec<&str> = loaded
        .config
        .namespaces()
        .map(|n| n.name.as_str())
        .collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = ENVOY_FIXTURES.iter().map(|(_, d)| *d).collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    assert_eq!(loaded.normalized.len(), ENVOY_FIXTURES.len());
}

#[test]
fn mongo_cps_limits_each_database_value() {
    let loaded = envoy("mongo_cps.yaml");
    let ns = loaded
        .config
        .namespace("mongo_cps")
        .expect("namespace mongo_cps");
    for value in ["users", "default"] {
        assert_eq!(
            leaf(ns, &[("database", value)]),
            Some(limit(500, Unit::Second))
        );
    }
    assert_eq!(leaf(ns, &[("database", "other")]), None);
    assert!(loaded.config.namespace("messaging").is_none());
}

#[test]
fn messaging_nested_and_key_only_limits() {
    let loaded = envoy("messaging.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(
            ns,
            &[("message_type", "marketing"), ("to_number", "2061111111")]
        ),
        Some(limit(5, Unit::Day))
    );
    assert_eq!(
        leaf(ns, &[("to_number", "2061111111")]),
        Some(limit(100, Unit::Day))
    );
    // The placeholder itself limits nothing.
    assert_eq!(leaf(ns, &[("message_type", "marketing")]), Some(Leaf::None));
    assert_eq!(
        leaf(ns, &[("message_type", "transactional"), ("to_number", "1")]),
        None
    );
}

#[test]
fn edge_proxy_blocked_address_beats_key_only() {
    let loaded = envoy("edge_proxy_per_ip.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("remote_address", "50.0.0.1")]),
        Some(limit(10, Unit::Second))
    );
    assert_eq!(
        leaf(ns, &[("remote_address", "50.0.0.5")]),
        Some(limit(0, Unit::Second))
    );
}

#[test]
fn example4_limit_applies_at_the_depth_of_the_request() {
    let loaded = envoy("example4.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("key", "value"), ("subkey", "subvalue")]),
        Some(limit(300, Unit::Second))
    );
    assert_eq!(leaf(ns, &[("key", "value")]), Some(Leaf::None));
    assert_eq!(
        leaf(ns, &[("key", "value"), ("subkey", "x"), ("more", "y")]),
        None
    );
}

#[test]
fn unlimited_descriptor_is_kept() {
    let loaded = envoy("internal.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("ldap", "anything")]),
        Some(Leaf::Unlimited {
            name: None,
            replaces: Vec::new()
        })
    );
    assert_eq!(leaf(ns, &[("azure", "x")]), Some(limit(100, Unit::Minute)));
}

#[test]
fn shadow_mode_is_kept_per_node() {
    let loaded = envoy("example6.yaml");
    let ns = only(&loaded);
    let a = ns
        .descriptors
        .find([("service", "auth"), ("user", "user-a")])
        .expect("user-a matches");
    assert!(a.node.shadow_mode);
    assert_eq!(a.node.leaf, limit(10, Unit::Second));
    let b = ns
        .descriptors
        .find([("service", "auth"), ("user", "user-b")])
        .expect("user-b matches");
    assert!(!b.node.shadow_mode);
    assert_eq!(b.node.leaf, limit(20, Unit::Second));
    assert!(
        ns.descriptors
            .find([("service", "auth"), ("user", "user-c")])
            .is_none()
    );
}

#[test]
fn name_and_replaces_are_kept() {
    let loaded = envoy("example7.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("key_1", "value_1"), ("user", "bkthomps")]),
        Some(Leaf::Limit(FixedLimit {
            requests_per_unit: 5,
            unit: Unit::Second,
            unit_multiplier: 1,
            name: Some("specific_limit".into()),
            replaces: Vec::new(),
            algorithm: Algorithm::FixedWindow,
            soft_limit: None,
        }))
    );
    assert_eq!(
        leaf(ns, &[("key_2", "value_2"), ("user", "bkthomps")]),
        Some(Leaf::Limit(FixedLimit {
            requests_per_unit: 10,
            unit: Unit::Second,
            unit_multiplier: 1,
            name: None,
            replaces: vec!["specific_limit".into()],
            algorithm: Algorithm::FixedWindow,
            soft_limit: None,
        }))
    );
}

#[test]
fn detailed_metric_is_accepted_and_changes_no_limit() {
    let loaded = envoy("example8.yaml");
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("key1", "unspecified")]),
        Some(limit(10, Unit::Minute))
    );
    assert_eq!(
        leaf(ns, &[("key1", "value1")]),
        Some(limit(20, Unit::Minute))
    );
}

#[test]
fn wildcard_value_example() {
    let loaded = envoy("example9.yaml");
    let ns = only(&loaded);
    for value in ["value", "value_1", "value_2", "values/and/more"] {
        assert_eq!(
            leaf(ns, &[("key1", value)]),
            Some(limit(20, Unit::Minute)),
            "{value}"
        );
    }
    assert_eq!(leaf(ns, &[("key1", "valu")]), None);
    assert_eq!(leaf(ns, &[("key1", "a_value")]), None);
}

#[test]
fn basic_config_overrides_and_allow_list() {
    let loaded = envoy("basic.yaml");
    let ns = only(&loaded);
    let cases: &[(Entries, Option<Leaf>)] = &[
        (&[("key1", "something")], None),
        (&[("key1", "value1")], Some(Leaf::None)),
        (
            &[("key1", "value1"), ("subkey1", "x")],
            Some(limit(5, Unit::Second)),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            Some(limit(10, Unit::Second)),
        ),
        (&[("key2", "something")], Some(limit(20, Unit::Minute))),
        (&[("key2", "value2")], Some(limit(30, Unit::Minute))),
        // Allow-listed: an exact value with neither limit nor children.
        (&[("key2", "value3")], Some(Leaf::None)),
        (&[("key2", "value2"), ("subkey", "subvalue")], None),
        (&[("key3", "foo")], Some(limit(1, Unit::Hour))),
        (&[("key4", "foo")], Some(limit(1, Unit::Day))),
        (&[("key5", "value5")], Some(limit(15, Unit::Day))),
        (
            &[("key5", "value5"), ("subkey5", "subvalue5")],
            Some(limit(25, Unit::Day)),
        ),
        (&[("key5", "value5"), ("subkey5", "subvalue")], None),
    ];
    for (entries, expected) in cases {
        assert_eq!(&leaf(ns, entries), expected, "{entries:?}");
    }
}

#[test]
fn wildcards_trailing_middle_and_repeated() {
    let loaded = envoy("wildcards.yaml");
    let ns = only(&loaded);
    assert_eq!(leaf(ns, &[("wild", "foo")]), Some(limit(20, Unit::Minute)));
    assert_eq!(
        leaf(ns, &[("wild", "foobar")]),
        Some(limit(20, Unit::Minute))
    );
    assert_eq!(leaf(ns, &[("wild", "fo")]), None);
    // No `*`: exact only.
    assert_eq!(
        leaf(ns, &[("noWild", "foo")]),
        Some(limit(21, Unit::Minute))
    );
    assert_eq!(leaf(ns, &[("noWild", "foobar")]), None);
    assert_eq!(
        leaf(ns, &[("midWild", "barab")]),
        Some(limit(22, Unit::Minute))
    );
    assert_eq!(leaf(ns, &[("midWild", "bab")]), None);
    assert_eq!(leaf(ns, &[("midWild", "barba")]), None);
    assert_eq!(
        leaf(ns, &[("multiroute", "svc-a.ep-b.rpc")]),
        Some(limit(50, Unit::Minute))
    );
    assert_eq!(leaf(ns, &[("multiroute", "svc-a.rpc")]), None);
    assert_eq!(
        leaf(ns, &[("route", "api/v1"), ("method", "GET")]),
        Some(limit(60, Unit::Minute))
    );

    // share_threshold: every value the pattern matches shares one counter,
    // so the pattern stands in for the value.
    let shared = ns
        .descriptors
        .find([("files", "files/a.txt")])
        .expect("files/* matches");
    assert_eq!(shared.node.shared_value.as_deref(), Some("files/*"));
    assert_eq!(shared.shared_values.as_slice(), [Some("files/*")]);
    let own = ns
        .descriptors
        .find([("wild", "foobar")])
        .expect("foo* matches");
    assert_eq!(own.node.shared_value, None);
    assert_eq!(own.shared_values.as_slice(), [None]);
    let nested = ns
        .descriptors
        .find([("route", "api/v2"), ("method", "POST")])
        .expect("nested under a shared wildcard");
    assert_eq!(nested.shared_values.as_slice(), [Some("api/*"), None]);
}

#[test]
fn every_unit_in_any_case() {
    let loaded = envoy("units.yaml");
    let ns = only(&loaded);
    let cases = [
        ("s", 1, Unit::Second),
        ("m", 2, Unit::Minute),
        ("h", 3, Unit::Hour),
        ("d", 4, Unit::Day),
        ("w", 5, Unit::Week),
        ("mo", 6, Unit::Month),
        ("y", 7, Unit::Year),
        ("S", 8, Unit::Second),
        ("M", 9, Unit::Minute),
        ("H", 10, Unit::Hour),
        ("W", 11, Unit::Week),
        ("Y", 12, Unit::Year),
    ];
    for (key, requests, unit) in cases {
        assert_eq!(
            leaf(ns, &[(key, "v")]),
            Some(limit(requests, unit)),
            "{key}"
        );
    }
}

#[test]
fn nested_remote_address_and_path() {
    let yaml = "\
domain: edge
descriptors:
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 50}
";
    let loaded = load(yaml);
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("remote_address", "10.0.0.1"), ("path", "/login")]),
        Some(limit(5, Unit::Minute))
    );
    assert_eq!(
        leaf(ns, &[("remote_address", "10.0.0.1"), ("path", "/")]),
        Some(limit(50, Unit::Second))
    );
    assert_eq!(
        leaf(ns, &[("remote_address", "10.0.0.1")]),
        Some(Leaf::None)
    );
    assert_eq!(leaf(ns, &[("path", "/login")]), None);
}

#[test]
fn scalar_values_keep_their_text() {
    // yaml.v2 (envoyproxy/ratelimit) reads any scalar into a string field as
    // written: numbers, booleans and octal-looking values keep their text.
    let yaml = "\
domain: 123
descriptors:
  - key: to_number
    value: 2061234567
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: flag
    value: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: code
    value: 007
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: ratio
    value: 1.50
    rate_limit: {unit: day, requests_per_unit: 4}
";
    let loaded = load(yaml);
    let ns = loaded
        .config
        .namespace("123")
        .expect("numeric domain is text");
    assert_eq!(
        leaf(ns, &[("to_number", "2061234567")]),
        Some(limit(1, Unit::Day))
    );
    assert_eq!(leaf(ns, &[("flag", "true")]), Some(limit(2, Unit::Day)));
    assert_eq!(leaf(ns, &[("code", "007")]), Some(limit(3, Unit::Day)));
    assert_eq!(leaf(ns, &[("code", "7")]), None);
    assert_eq!(leaf(ns, &[("ratio", "1.50")]), Some(limit(4, Unit::Day)));
    assert_eq!(leaf(ns, &[("ratio", "1.5")]), None);
}

#[test]
fn spec_example_loads() {
    let loaded = load_path(&fixture("charon/shop.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    let ns = loaded.config.namespace("shop").expect("namespace shop");
    assert!(!ns.settings.ignore_configured);
    assert!(!ns.settings.allow_unconfigured);
    assert_eq!(
        leaf(ns, &[("remote_address", "1.2.3.4")]),
        Some(limit(100, Unit::Minute))
    );
    assert_eq!(
        leaf(ns, &[("tenant", "acme")]),
        Some(Leaf::Resource("search".into()))
    );

    let search = rate(ns, "search");
    assert_eq!(search.name, "search");
    assert_eq!(search.global_limit, Some(1000));
    assert_eq!(
        *search.default,
        RatePolicy {
            hard_limit: Some(20),
            tiers: vec![
                tier(5, S, FOREVER, 0, false),
                tier(50, S, 5 * S, 15 * S, false),
            ],
            gcra: None,
        }
    );
    assert_eq!(
        **search.policy_for("acme"),
        RatePolicy {
            hard_limit: Some(100),
            tiers: vec![tier(50, S, FOREVER, 0, false)],
            gcra: None,
        }
    );
    assert_eq!(search.policy_for("globex"), &search.default);

    let transcoder = copies(ns, "transcoder");
    assert_eq!(
        *transcoder,
        CopyResource {
            name: "transcoder".into(),
            domain_limit: 4,
            global_limit: Some(100),
            domains: HashMap::from([("acme".to_owned(), 10)]),
            groups: vec![CopyGroup {
                name: "big".into(),
                limit: 40,
                domains: HashSet::from(["acme".to_owned(), "globex".to_owned()]),
            }],
        }
    );
}

#[test]
fn settings_switches_are_read() {
    let loaded =
        load("domain: a\nsettings:\n  ignore_configured: true\n  allow_unconfigured: true\n");
    let ns = only(&loaded);
    assert!(ns.settings.ignore_configured);
    assert!(ns.settings.allow_unconfigured);
}

// ---------------------------------------------------------------------------
// 2. Matching order (docs/design.md#matching)
// ---------------------------------------------------------------------------

const MATCHING: &str = "\
domain: m
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: ab*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: a*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: abc
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: k
    value: '*z*'
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: outer
    value: o
    descriptors:
      - key: inner
        rate_limit: {unit: minute, requests_per_unit: 6}
";

#[test]
fn match_exact_then_wildcard_then_key_only() {
    let loaded = load(MATCHING);
    let ns = only(&loaded);
    // Exact, although it comes after two wildcards that match too.
    assert_eq!(leaf(ns, &[("k", "abc")]), Some(limit(4, Unit::Second)));
    // Wildcards, in file order: `ab*` before `a*`.
    assert_eq!(leaf(ns, &[("k", "abd")]), Some(limit(2, Unit::Second)));
    assert_eq!(leaf(ns, &[("k", "ab")]), Some(limit(2, Unit::Second)));
    assert_eq!(leaf(ns, &[("k", "azz")]), Some(limit(3, Unit::Second)));
    // `*` anywhere: `*z*` comes after `a*`, so only values not starting
    // with `a` reach it.
    assert_eq!(leaf(ns, &[("k", "xzy")]), Some(limit(5, Unit::Second)));
    assert_eq!(leaf(ns, &[("k", "z")]), Some(limit(5, Unit::Second)));
    // Key only.
    assert_eq!(leaf(ns, &[("k", "b")]), Some(limit(1, Unit::Second)));
    assert_eq!(leaf(ns, &[("k", "")]), Some(limit(1, Unit::Second)));
}

#[test]
fn match_applies_only_where_the_descriptor_ends() {
    let loaded = load(MATCHING);
    let ns = only(&loaded);
    assert_eq!(
        leaf(ns, &[("outer", "o"), ("inner", "x")]),
        Some(limit(6, Unit::Minute))
    );
    // The intermediate node has no limit of its own.
    assert_eq!(leaf(ns, &[("outer", "o")]), Some(Leaf::None));
    // A limit at level one does not apply to a longer descriptor.
    assert_eq!(leaf(ns, &[("k", "abc"), ("inner", "x")]), None);
    assert_eq!(
        leaf(ns, &[("outer", "o"), ("inner", "x"), ("deeper", "y")]),
        None
    );
}

#[test]
fn match_nothing_is_none() {
    let loaded = load(MATCHING);
    let ns = only(&loaded);
    assert_eq!(leaf(ns, &[("unknown", "abc")]), None);
    assert_eq!(leaf(ns, &[("outer", "p")]), None);
    assert_eq!(leaf(ns, &[("outer", "o"), ("other", "x")]), None);
    // Keys and values are case-sensitive.
    assert_eq!(leaf(ns, &[("K", "abc")]), None);
    assert_eq!(leaf(ns, &[("outer", "O")]), None);
    // An empty descriptor matches nothing.
    assert_eq!(leaf(ns, &[]), None);
}

#[test]
fn match_wildcard_star_anywhere() {
    let yaml = "\
domain: g
descriptors:
  - {key: a, value: '*', rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: b, value: '*.example.com', rate_limit: {unit: second, requests_per_unit: 2}}
  - {key: c, value: 'x*y*z', rate_limit: {unit: second, requests_per_unit: 3}}
  - {key: d, value: '**', rate_limit: {unit: second, requests_per_unit: 4}}
";
    let loaded = load(yaml);
    let ns = only(&loaded);
    let cases = [
        ("a", "", true),
        ("a", "anything at all", true),
        ("b", "api.example.com", true),
        ("b", ".example.com", true),
        ("b", "example.com", false),
        ("b", "api.example.com.evil", false),
        ("c", "xyz", true),
        ("c", "x--y--z", true),
        ("c", "xzy", false),
        ("c", "x-y-z-", false),
        ("d", "", true),
    ];
    for (key, value, matches) in cases {
        assert_eq!(
            leaf(ns, &[(key, value)]).is_some(),
            matches,
            "{key} = {value:?}"
        );
    }
    // A long hostile value does not take long.
    let started = Instant::now();
    let hostile = "x".repeat(100_000) + "y";
    assert_eq!(leaf(ns, &[("c", &hostile)]), None);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn match_with_unicode_keys_and_values() {
    let yaml = "\
domain: ünï
descriptors:
  - key: ключ
    value: 値*
    rate_limit: {unit: Minute, requests_per_unit: 7}
  - key: emoji
    value: 🦀
    rate_limit: {unit: hour, requests_per_unit: 8}
";
    let loaded = load(yaml);
    let ns = loaded.config.namespace("ünï").expect("unicode domain");
    assert_eq!(leaf(ns, &[("ключ", "値段")]), Some(limit(7, Unit::Minute)));
    assert_eq!(leaf(ns, &[("ключ", "価")]), None);
    assert_eq!(leaf(ns, &[("emoji", "🦀")]), Some(limit(8, Unit::Hour)));
}

// ---------------------------------------------------------------------------
// 3. Errors: file:line:column, what is wrong, the whole file rejected
// ---------------------------------------------------------------------------

#[test]
fn malformed_yaml() {
    // An unclosed flow sequence.
    assert_error("domain: a\ndescriptors:\n  - key: [\n", 3, 10, &[]);
    // A mapping where none may start.
    assert_error(
        "domain: a\n descriptors: x\n",
        2,
        13,
        &["mapping values are not allowed"],
    );
    // A tab in indentation.
    let errors = errors_of("domain: a\ndescriptors:\n\t- key: k\n");
    assert_eq!(errors[0].line, 3, "{errors:?}");
    // Not a mapping at all.
    let errors = errors_of("- just\n- a list\n");
    assert_eq!(errors[0].line, 1, "{errors:?}");
    // An empty file has no domain.
    let errors = errors_of("");
    assert_eq!(errors.len(), 1);
}

#[test]
fn missing_domain() {
    assert_error("descriptors: []\n", 1, 1, &["missing field `domain`"]);
}

#[test]
fn unknown_fields_are_errors() {
    assert_error(
        "domain: a\nfoo: 1\n",
        2,
        1,
        &["unknown field `foo`", "domain", "descriptors"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    vaule: v\n",
        4,
        5,
        &["unknown field `vaule`", "value"],
    );
    assert_error(
        &one_limit("{unit: second, requestsperunit: 5}"),
        4,
        32,
        &["unknown field `requestsperunit`", "requests_per_unit"],
    );
    assert_error(
        &one_tier("{limit: 1, window: 1s, burst: 3}"),
        6,
        34,
        &["unknown field `burst`", "cooldown"],
    );
    assert_error(
        "domain: a\nresources:\n  r:\n    rate:\n      tiers: []\n      hard: 3\n",
        6,
        7,
        &["unknown field `hard`", "hard_limit"],
    );
    assert_error(
        "domain: a\nsettings:\n  ignore: true\n",
        3,
        3,
        &["unknown field `ignore`", "ignore_configured"],
    );
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1\n      groups:\n        - {name: g, limit: 1, members: [x]}\n",
        7,
        31,
        &["unknown field `members`"],
    );
}

#[test]
fn requests_per_unit_must_be_a_u32() {
    // `rate_limit: {unit: second, requests_per_unit: N}`: N at line 4, column 51.
    let at = |n: &str| one_limit(&format!("{{unit: second, requests_per_unit: {n}}}"));
    assert_error(&at("-1"), 4, 51, &["requests_per_unit", "-1", "4294967295"]);
    assert_error(
        &at("4294967296"),
        4,
        51,
        &["requests_per_unit", "4294967296", "4294967295"],
    );
    assert_error(&at("abc"), 4, 51, &["whole number", "4294967295"]);
    assert_error(&at("1.5"), 4, 51, &["whole number", "4294967295"]);
    assert_error(
        &at("99999999999999999999"),
        4,
        51,
        &["whole number", "4294967295"],
    );

    let loaded = load(&at("4294967295"));
    assert_eq!(
        leaf(only(&loaded), &[("k", "v")]),
        Some(limit(4_294_967_295, Unit::Second))
    );
    let loaded = load(&at("0"));
    assert_eq!(
        leaf(only(&loaded), &[("k", "v")]),
        Some(limit(0, Unit::Second))
    );
}

#[test]
fn limits_must_be_u32() {
    // Tier limit: `- {limit: N, ...}`, N at line 6, column 19.
    assert_error(
        &one_tier("{limit: -1, window: 1s}"),
        6,
        19,
        &["limit", "-1"],
    );
    assert_error(
        &one_tier("{limit: 4294967296, window: 1s}"),
        6,
        19,
        &["limit", "4294967296"],
    );
    assert_error(
        "domain: a\nresources:\n  r:\n    rate:\n      hard_limit: -3\n      tiers: []\n",
        5,
        19,
        &["hard_limit", "-3"],
    );
    assert_error(
        "domain: a\nresources:\n  r:\n    rate:\n      global_limit: -3\n      tiers: []\n",
        5,
        21,
        &["global_limit", "-3"],
    );
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: -1\n",
        5,
        21,
        &["domain_limit", "-1"],
    );
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1\n      groups:\n        - {name: g, limit: -2}\n",
        7,
        28,
        &["group limit", "-2"],
    );
}

#[test]
fn durations_are_checked() {
    // `- {limit: 1, window: W}`: W at line 6, column 30.
    let window = |w: &str| one_tier(&format!("{{limit: 1, window: {w}}}"));
    assert_error(&window("0s"), 6, 30, &["window", "longer than 0s"]);
    assert_error(&window("0ms"), 6, 30, &["window", "longer than 0s"]);
    assert_error(&window("-1s"), 6, 30, &["window", "`-1s`"]);
    assert_error(
        &window("1 fortnight"),
        6,
        30,
        &["window", "`1 fortnight`", "unknown unit"],
    );
    assert_error(&window("1.5s"), 6, 30, &["window", "`1.5s`"]);
    assert_error(&window("10"), 6, 30, &["window", "`10`", "no unit"]);
    assert_error(
        &window("36501d"),
        6,
        30,
        &["window", "`36501d`", "100 years", "forever"],
    );
    assert_error(&window("s"), 6, 30, &["window", "`s`"]);
    assert_error(&window("1S"), 6, 30, &["window", "`1S`"]);
    // `active` and `cooldown` are read the same way.
    assert_error(
        &one_tier("{limit: 1, window: 1s, active: 5 min}"),
        6,
        42,
        &["active", "`5 min`"],
    );
    assert_error(
        &one_tier("{limit: 1, window: 1s, cooldown: -5s}"),
        6,
        44,
        &["cooldown", "`-5s`"],
    );
    // Every unit is accepted, and 100 years exactly.
    for ok in ["250ms", "1s", "15m", "24h", "7d", "36500d", "forever"] {
        load(&one_tier(&format!(
            "{{limit: 1, window: 1ms, active: {ok}, cooldown: {ok}}}"
        )));
    }
}

#[test]
fn active_zero_is_not_an_error() {
    let loaded = load(&one_tier("{limit: 1, window: 1s, active: 0s}"));
    let r = rate(only(&loaded), "r");
    assert!(r.default.tiers.is_empty());
    assert_eq!(loaded.notes[0].line, 6);
    assert_eq!(loaded.notes[0].column, 11);
    assert!(loaded.notes[0].message.contains("removed"));
}

#[test]
fn duplicate_descriptors_at_one_level() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
        5,
        10,
        &["duplicate descriptor", "`k`", "`v`"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n  - key: k\n",
        4,
        10,
        &["duplicate descriptor", "`k`"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - {key: k, value: 'a*'}\n  - {key: k, value: 'a*'}\n",
        4,
        11,
        &["duplicate descriptor", "`a*`"],
    );
    // The same key and value at different levels, or under different
    // parents, is fine.
    load(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - {key: k, value: v}\n  - key: j\n    descriptors:\n      - {key: k, value: v}\n",
    );
    // As is one key with and without a value.
    load("domain: a\ndescriptors:\n  - {key: k}\n  - {key: k, value: v}\n");
}

#[test]
fn leaf_with_rate_limit_and_resource() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    resource: r\n    rate_limit: {unit: second, requests_per_unit: 1}\nresources:\n  r:\n    rate: {tiers: [{limit: 1, window: 1s}]}\n",
        5,
        17,
        &["`rate_limit`", "`resource`", "not both"],
    );
}

#[test]
fn resource_leaf_must_name_a_rate_limited_resource() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    resource: nope\n",
        4,
        15,
        &["`nope`", "not defined"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    resource: c\nresources:\n  c:\n    copies: {domain_limit: 1}\n",
        4,
        15,
        &["`c`", "copy-limited"],
    );
    // Resource names are case-sensitive.
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    resource: API\nresources:\n  api:\n    rate: {tiers: [{limit: 1, window: 1s}]}\n",
        4,
        15,
        &["`API`", "not defined"],
    );
    // Nested as well.
    let loaded = load(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - {key: tenant, resource: api}\nresources:\n  api:\n    rate: {tiers: [{limit: 1, window: 1s}]}\n",
    );
    assert_eq!(
        leaf(only(&loaded), &[("k", "v"), ("tenant", "acme")]),
        Some(Leaf::Resource("api".into()))
    );
}

#[test]
fn resource_needs_exactly_one_of_rate_and_copies() {
    assert_error(
        "domain: a\nresources:\n  r:\n    rate: {tiers: []}\n    copies: {domain_limit: 1}\n",
        4,
        5,
        &["`r`", "both", "exactly one"],
    );
    assert_error(
        "domain: a\nresources:\n  r: {}\n",
        3,
        6,
        &["`r`", "`rate:`, `copies:` or `capacity:`"],
    );
}

#[test]
fn duplicate_yaml_keys_are_errors() {
    assert_error(
        "domain: a\nresources:\n  r:\n    copies: {domain_limit: 1}\n  r:\n    copies: {domain_limit: 2}\n",
        5,
        3,
        &["duplicate", "r"],
    );
    assert_error("domain: a\ndomain: b\n", 2, 1, &["duplicate", "domain"]);
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    key: j\n",
        4,
        5,
        &["duplicate", "key"],
    );
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1\n      domains: {acme: 1, acme: 2}\n",
        6,
        26,
        &["duplicate", "acme"],
    );
}

#[test]
fn rate_limit_unit_rules() {
    // `rate_limit: {...}` is at line 4, column 17.
    assert_error(
        &one_limit("{unlimited: true, unit: second}"),
        4,
        17,
        &["unlimited", "unit"],
    );
    assert_error(
        &one_limit("{requests_per_unit: 1}"),
        4,
        17,
        &["needs a `unit`"],
    );
    assert_error(
        &one_limit("{unit: fortnight, requests_per_unit: 1}"),
        4,
        24,
        &["invalid rate limit unit `fortnight`"],
    );
    assert_error(
        &one_limit("{unit: seconds, requests_per_unit: 1}"),
        4,
        24,
        &["invalid rate limit unit `seconds`"],
    );
    assert_error(
        &one_limit("{unit: '', requests_per_unit: 1}"),
        4,
        24,
        &["invalid rate limit unit"],
    );
    assert_error(
        &one_limit("{unit: unknown, requests_per_unit: 1}"),
        4,
        24,
        &["invalid rate limit unit `unknown`"],
    );
    // `unlimited: true` with a count and no unit is fine, as upstream.
    let loaded = load(&one_limit(
        "{unlimited: true, requests_per_unit: 5, name: free}",
    ));
    assert_eq!(
        leaf(only(&loaded), &[("k", "v")]),
        Some(Leaf::Unlimited {
            name: Some("free".into()),
            replaces: Vec::new()
        })
    );
    // `unlimited: false` is an ordinary limit.
    let loaded = load(&one_limit(
        "{unlimited: false, unit: second, requests_per_unit: 5}",
    ));
    assert_eq!(
        leaf(only(&loaded), &[("k", "v")]),
        Some(limit(5, Unit::Second))
    );
}

#[test]
fn empty_names_are_errors() {
    assert_error("domain: \"\"\n", 1, 9, &["domain is empty"]);
    assert_error(
        "domain: a\ndescriptors:\n  - key: \"\"\n",
        3,
        10,
        &["descriptor key is empty"],
    );
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1\n      groups:\n        - {name: '', limit: 1}\n",
        7,
        18,
        &["group name is empty"],
    );
    let errors = errors_of("domain: a\nresources:\n  '':\n    copies: {domain_limit: 1}\n");
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("resource name is empty")),
        "{errors:?}"
    );
}

#[test]
fn duplicate_group_names() {
    assert_error(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1\n      groups:\n        - {name: g, limit: 1}\n        - {name: g, limit: 2}\n",
        8,
        18,
        &["duplicate group `g`"],
    );
}

#[test]
fn share_threshold_needs_a_wildcard() {
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: x\n    share_threshold: true\n",
        3,
        10,
        &["share_threshold", "wildcard"],
    );
}

#[test]
fn too_many_tiers() {
    let tiers = "{limit: 1, window: 1s}, ".repeat(caps::MAX_TIERS + 1);
    let errors = errors_of(&format!(
        "domain: a\nresources:\n  r:\n    rate:\n      tiers: [{tiers}]\n"
    ));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!((errors[0].line, errors[0].column), (5, 15));
    assert!(errors[0].message.contains(&caps::MAX_TIERS.to_string()));
    // Exactly the cap is fine.
    let tiers = "{limit: 1, window: 1s}, ".repeat(caps::MAX_TIERS);
    load(&format!(
        "domain: a\nresources:\n  r:\n    rate:\n      tiers: [{tiers}]\n"
    ));
}

/// `domain: a` then descriptors nested `depth` deep in flow style, on line 2.
fn nested_flow(depth: usize) -> String {
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
fn nested_block(depth: usize) -> String {
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

#[test]
fn deep_nesting_is_a_clean_quick_error() {
    let started = Instant::now();
    let errors = errors_of(&nested_flow(10_000));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    // The parser's depth budget (68 YAML levels: a descriptor is two, its
    // list and its mapping, so 32 descriptor levels and some room) stops at
    // the 34th `{`: `descriptors: ` is 13 columns, each
    // `[{key: k, descriptors: ` is 23.
    assert_eq!((errors[0].line, errors[0].column), (2, 14 + 33 * 23 + 1));
    assert!(
        errors[0].message.to_lowercase().contains("depth"),
        "{}",
        errors[0].message
    );

    let started = Instant::now();
    let errors = errors_of(&nested_block(100));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].line > 2, "{errors:?}");

    // What is allowed loads, and matches at its depth.
    let loaded = load(&nested_block(20));
    let entries: Vec<(String, String)> = (0..20).map(|i| (format!("k{i}"), "v".into())).collect();
    let found = only(&loaded)
        .descriptors
        .find(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .expect("20-deep descriptor matches");
    assert_eq!(found.node.leaf, limit(1, Unit::Second));
}

#[test]
fn one_mebibyte_value_loads_quickly() {
    let value = "x".repeat(1 << 20);
    let yaml = format!(
        "domain: a\ndescriptors:\n  - key: k\n    value: \"{value}\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    );
    let started = Instant::now();
    let loaded = load(&yaml);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let ns = only(&loaded);
    assert_eq!(leaf(ns, &[("k", &value)]), Some(limit(1, Unit::Second)));
    assert_eq!(leaf(ns, &[("k", "x")]), None);
}

#[test]
fn several_errors_are_all_reported() {
    let yaml = "\
domain: a
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: j
    rate_limit: {unit: second, requests_per_unit: -5}
  - key: j
  - key: t
    resource: missing
resources:
  r:
    rate:
      tiers:
        - {limit: 1, window: 0s}
        - {limit: 1, window: 1s, cooldown: soon}
  c:
    copies:
      domain_limit: 1
      groups:
        - {name: g, limit: 1}
        - {name: g, limit: 1}
";
    let errors = errors_of(yaml);
    let mut places: Vec<(u64, u64)> = errors.iter().map(|e| (e.line, e.column)).collect();
    places.sort_unstable();
    assert_eq!(
        places,
        vec![
            (4, 24),
            (6, 51),
            (7, 10),
            (9, 15),
            (14, 30),
            (15, 44),
            (21, 18)
        ],
        "{errors:#?}"
    );
    assert!(errors.iter().all(|e| e.file == Path::new(ORIGIN)));
}

#[test]
fn load_path_reports_file_errors() {
    let dir = tempfile::tempdir().unwrap();
    // Missing.
    let missing = dir.path().join("missing.yaml");
    let errors = load_path(&missing).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, missing);
    assert_eq!((errors[0].line, errors[0].column), (0, 0));
    assert!(errors[0].message.contains("cannot read"), "{errors:?}");
    // Not UTF-8.
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"domain: caf\xe9\n").unwrap();
    let errors = load_path(&latin1).unwrap_err().0;
    assert!(errors[0].message.contains("UTF-8"), "{errors:?}");
    // Too large: refused by its size, without reading it.
    let huge = dir.path().join("huge.yaml");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(caps::MAX_FILE_BYTES + 1)
        .unwrap();
    let errors = load_path(&huge).unwrap_err().0;
    assert_eq!(errors[0].file, huge);
    assert!(
        errors[0]
            .message
            .contains(&caps::MAX_FILE_BYTES.to_string()),
        "{errors:?}"
    );
    // Errors name the path they came from.
    let bad = fixture("charon/bad.yaml");
    let errors = load_path(&bad).unwrap_err().0;
    assert!(errors.iter().all(|e| e.file == bad), "{errors:?}");
    assert_eq!(
        errors
            .iter()
            .map(|e| (e.line, e.column))
            .collect::<Vec<_>>(),
        vec![(5, 13), (8, 15)]
    );
}

// ---------------------------------------------------------------------------
// 4. Normalization
// ---------------------------------------------------------------------------

fn normalize_fixture() -> Loaded {
    load_path(&fixture("charon/normalize.yaml")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn normalization_notes_say_what_changed_and_where() {
    let loaded = normalize_fixture();
    let file = fixture("charon/normalize.yaml");
    assert!(loaded.notes.iter().all(|n| n.file == file));
    assert_eq!(
        note_places(&loaded.notes),
        vec![
            (12, 11),
            (13, 11),
            (14, 11),
            (18, 15),
            (21, 21),
            (23, 23),
            (25, 30)
        ],
        "{:#?}",
        loaded.notes
    );
    let expected: [&[&str]; 7] = [
        &["`api`", "tier 2", "active: 0s", "removed"],
        &["`api`", "tier 3", "25s", "trimmed to 20s"],
        &[
            "`api`",
            "tier 4",
            "window 1m",
            "active 30s",
            "shortened to 30s",
        ],
        &[
            "`api`",
            "domain `acme`",
            "tier 1",
            "1s",
            "300ms",
            "trimmed to 900ms",
        ],
        &[
            "`pool`",
            "domain_limit 12",
            "global_limit 10",
            "lowered to 10",
        ],
        &["`pool`", "`acme`", "15", "lowered to 10"],
        &["`pool`", "group `big`", "11", "lowered to 10"],
    ];
    for (note, fragments) in loaded.notes.iter().zip(expected) {
        for fragment in fragments {
            assert!(
                note.message.contains(fragment),
                "note `{note}` should mention `{fragment}`"
            );
        }
        assert_eq!(
            note.to_string(),
            format!(
                "{}:{}:{}: {}",
                file.display(),
                note.line,
                note.column,
                note.message
            )
        );
    }
}

#[test]
fn normalized_rate_tiers() {
    let loaded = normalize_fixture();
    let api = rate(only(&loaded), "api");
    assert_eq!(
        *api.default,
        RatePolicy {
            hard_limit: Some(50),
            tiers: vec![
                // forever is left alone
                tier(5, S, FOREVER, 0, false),
                // the `active: 0s` tier is gone; 25s is trimmed to 2 windows
                tier(20, 10 * S, 20 * S, MIN, false),
                // a 1m window is shortened to the 30s active period
                tier(40, 30 * S, 30 * S, HOUR, true),
            ],
            gcra: None,
        }
    );
    // Domain configurations are normalized the same way, and replace the
    // default whole (no hard_limit inherited).
    assert_eq!(
        **api.policy_for("acme"),
        RatePolicy {
            hard_limit: None,
            tiers: vec![tier(7, 300, 900, 0, false)],
            gcra: None,
        }
    );
    assert_eq!(api.policy_for("other"), &api.default);
}

#[test]
fn normalized_copy_limits() {
    let loaded = normalize_fixture();
    let pool = copies(only(&loaded), "pool");
    assert_eq!(
        *pool,
        CopyResource {
            name: "pool".into(),
            domain_limit: 10,
            global_limit: Some(10),
            domains: HashMap::from([("acme".to_owned(), 10), ("small".to_owned(), 3)]),
            groups: vec![
                CopyGroup {
                    name: "big".into(),
                    limit: 10,
                    domains: HashSet::from(["acme".to_owned()]),
                },
                CopyGroup {
                    name: "tiny".into(),
                    limit: 2,
                    domains: HashSet::from(["small".to_owned()]),
                },
            ],
        }
    );
    // Without a global_limit nothing is lowered.
    let loaded = load(
        "domain: a\nresources:\n  c:\n    copies:\n      domain_limit: 1000\n      domains: {x: 5000}\n      groups: [{name: g, limit: 9000}]\n",
    );
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
    assert_eq!(copies(only(&loaded), "c").domain_limit, 1000);
    // Equal to global_limit is not above it.
    let loaded =
        load("domain: a\nresources:\n  c:\n    copies: {domain_limit: 5, global_limit: 5}\n");
    assert!(loaded.notes.is_empty(), "{:?}", loaded.notes);
}

#[test]
fn normalization_edge_cases() {
    // Already whole: nothing to say.
    for tier in [
        "{limit: 1, window: 10s, active: 30s}",
        "{limit: 1, window: 5s, active: 5s}",
        "{limit: 1, window: 1h, active: forever}",
        "{limit: 1, window: forever}",
        "{limit: 1, window: 1s, cooldown: forever}",
    ] {
        let loaded = load(&one_tier(tier));
        assert!(loaded.notes.is_empty(), "{tier}: {:?}", loaded.notes);
    }
    // A `forever` window with a finite active period is shortened to it.
    let loaded = load(&one_tier("{limit: 1, window: forever, active: 10s}"));
    assert_eq!(
        rate(only(&loaded), "r").default.tiers,
        vec![tier(1, 10 * S, 10 * S, 0, false)]
    );
    assert_eq!(note_places(&loaded.notes), vec![(6, 11)]);
    // 7s windows in 15s: trimmed to 14s.
    let loaded = load(&one_tier("{limit: 1, window: 7s, active: 15s}"));
    assert_eq!(rate(only(&loaded), "r").default.tiers[0].active, 14 * S);
    // Defaults: active forever, cooldown 0s, not skippable.
    let loaded = load(&one_tier("{limit: 3, window: 2s}"));
    assert_eq!(
        rate(only(&loaded), "r").default.tiers,
        vec![tier(3, 2 * S, FOREVER, 0, false)]
    );
}

#[test]
fn every_tier_removed_leaves_a_note() {
    let loaded = load(&one_tier("{limit: 1, window: 1s, active: 0s}"));
    assert!(rate(only(&loaded), "r").default.tiers.is_empty());
    assert_eq!(loaded.notes.len(), 2, "{:?}", loaded.notes);
    assert!(loaded.notes[1].message.contains("no tier left"));
}

#[test]
fn normalized_yaml_shows_the_changes_and_reloads_the_same() {
    let loaded = normalize_fixture();
    assert_eq!(loaded.normalized.len(), 1);
    let (file, yaml) = &loaded.normalized[0];
    assert_eq!(file, &fixture("charon/normalize.yaml"));
    for shown in [
        "active: 20s",
        "window: 30s",
        "active: 900ms",
        "domain_limit: 10",
        "acme: 10",
        "limit: 10",
    ] {
        assert!(
            yaml.contains(shown),
            "normalized YAML should show `{shown}`:\n{yaml}"
        );
    }
    for gone in [
        "active: 0s",
        "active: 25s",
        "window: 1m",
        "limit: 9\n",
        "domain_limit: 12",
        "acme: 15",
        "limit: 11",
    ] {
        assert!(
            !yaml.contains(gone),
            "normalized YAML still has `{gone}`:\n{yaml}"
        );
    }

    let again = load_str(yaml, "normalized.yaml").unwrap_or_else(|e| panic!("{e}\n---\n{yaml}"));
    assert!(
        again.notes.is_empty(),
        "normalizing is idempotent: {:?}",
        again.notes
    );
    assert_eq!(
        again.normalized[0].1, *yaml,
        "printing the normalized file again changes nothing"
    );
    let (first, second) = (only(&loaded), only(&again));
    assert_eq!(first.name, second.name);
    assert_eq!(first.settings, second.settings);
    assert_eq!(rate(first, "api"), rate(second, "api"));
    assert_eq!(copies(first, "pool"), copies(second, "pool"));
    assert_eq!(
        leaf(second, &[("tenant", "acme")]),
        Some(Leaf::Resource("api".into()))
    );
}

#[test]
fn normalized_yaml_round_trips_envoy_files_and_odd_strings() {
    for (file, _) in ENVOY_FIXTURES {
        let loaded = envoy(file);
        let yaml = &loaded.normalized[0].1;
        let again = load_str(yaml, file).unwrap_or_else(|e| panic!("{file}: {e}\n---\n{yaml}"));
        assert_eq!(only(&again).name, only(&loaded).name);
    }
    let spec = load_path(&fixture("charon/shop.yaml")).unwrap();
    let again = load_str(&spec.normalized[0].1, "shop.yaml").unwrap();
    assert_eq!(rate(only(&spec), "search"), rate(only(&again), "search"));
    assert_eq!(
        copies(only(&spec), "transcoder"),
        copies(only(&again), "transcoder")
    );

    // Values and keys that YAML would read as something else unless quoted.
    for odd in [
        "null",
        "~",
        "true",
        "no",
        "1e3",
        "0x10",
        "007",
        "*",
        "a: b",
        "- x",
        "#x",
        " lead",
        "multi\nline",
        "'q'",
        "\"dq\"",
        "&a",
        "!t",
        "{x}",
        "[x]",
        "<<",
        ".inf",
        "12:30",
        "é",
    ] {
        let quoted = odd
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let yaml = format!(
            "domain: \"{quoted}\"\ndescriptors:\n  - key: \"{quoted}\"\n    value: \"{quoted}\"\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
        );
        let loaded = load(&yaml);
        let normalized = &loaded.normalized[0].1;
        let again = load_str(normalized, "again.yaml")
            .unwrap_or_else(|e| panic!("{odd:?}: {e}\n---\n{normalized}"));
        let ns = again
            .config
            .namespace(odd)
            .unwrap_or_else(|| panic!("{odd:?}: domain lost\n---\n{normalized}"));
        assert_eq!(
            leaf(ns, &[(odd, odd)]),
            Some(limit(1, Unit::Second)),
            "{odd:?}\n---\n{normalized}"
        );
    }
}

// ---------------------------------------------------------------------------
// 5. Directories
// ---------------------------------------------------------------------------

fn write(path: &Path, yaml: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, yaml).unwrap();
}

fn names(loaded: &Loaded) -> Vec<String> {
    let mut names: Vec<String> = loaded.config.namespaces().map(|n| n.name.clone()).collect();
    names.sort();
    names
}

#[test]
fn directory_loads_yaml_and_yml_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("a.yaml"), "domain: a\n");
    write(&d.join("b.yml"), "domain: b\n");
    // Ignored: other extensions, hidden names, subdirectories, and a
    // directory that looks like a file.
    write(&d.join("c.json"), "domain: c\n");
    write(&d.join("d.yaml.bak"), "domain: d\n");
    write(&d.join("README.md"), "not yaml: [\n");
    write(&d.join(".hidden.yaml"), "domain: hidden\n");
    write(&d.join("sub/e.yaml"), "domain: e\n");
    std::fs::create_dir_all(d.join("f.yaml")).unwrap();
    let loaded = load_path(d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&loaded), ["a", "b"]);
    let files: Vec<&PathBuf> = loaded.normalized.iter().map(|(f, _)| f).collect();
    assert_eq!(files, [&d.join("a.yaml"), &d.join("b.yml")]);
    assert_eq!(
        loaded.config.namespace("b").unwrap().source,
        d.join("b.yml")
    );
}

#[test]
fn directory_with_duplicate_domains_names_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("first.yaml"), "domain: shop\n");
    write(&d.join("second.yaml"), "# again\ndomain:   shop\n");
    let errors = load_path(d).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    let shown = error.to_string();
    assert!(shown.contains("first.yaml"), "{shown}");
    assert!(shown.contains("second.yaml"), "{shown}");
    assert!(shown.contains("`shop`"), "{shown}");
    assert_eq!(error.file, d.join("second.yaml"));
    assert_eq!((error.line, error.column), (2, 11));
}

#[test]
fn empty_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let errors = load_path(dir.path()).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, dir.path());
    assert!(errors[0].message.contains("*.yaml"), "{errors:?}");
    // Only ignored files: still empty.
    write(&dir.path().join("notes.txt"), "domain: a\n");
    write(&dir.path().join(".x.yaml"), "domain: a\n");
    assert!(load_path(dir.path()).is_err());
}

#[test]
fn directory_with_one_bad_file_is_rejected_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("good.yaml"), "domain: good\n");
    write(
        &d.join("bad1.yaml"),
        "domain: bad1\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    write(&d.join("bad2.yaml"), "domain: bad2\nnope: 1\n");
    let errors = load_path(d).unwrap_err().0;
    let places: Vec<(PathBuf, u64, u64)> = errors
        .iter()
        .map(|e| (e.file.clone(), e.line, e.column))
        .collect();
    assert_eq!(
        places,
        vec![(d.join("bad1.yaml"), 4, 24), (d.join("bad2.yaml"), 2, 1)]
    );
}

#[cfg(unix)]
#[test]
fn kubernetes_configmap_layout_loads_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("..2026_01_01_00_00_00.000000000");
    write(&data.join("shop.yaml"), "domain: shop\n");
    write(&data.join("edge.yml"), "domain: edge\n");
    symlink("..2026_01_01_00_00_00.000000000", d.join("..data")).unwrap();
    symlink("..data/shop.yaml", d.join("shop.yaml")).unwrap();
    symlink("..data/edge.yml", d.join("edge.yml")).unwrap();
    let loaded = load_path(d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&loaded), ["edge", "shop"]);
    assert_eq!(loaded.normalized.len(), 2);
    assert_eq!(
        loaded.config.namespace("shop").unwrap().source,
        d.join("shop.yaml")
    );
    // The mount point itself may be a symlink too.
    let link = tempfile::tempdir().unwrap();
    let mount = link.path().join("config");
    symlink(d, &mount).unwrap();
    assert_eq!(names(&load_path(&mount).unwrap()), ["edge", "shop"]);
}

// ---------------------------------------------------------------------------
// 6. charon check
// ---------------------------------------------------------------------------

#[test]
fn check_prints_the_normalized_file_and_notes() {
    let file = fixture("charon/normalize.yaml");
    let out = charon(&[&file]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!("# {}", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("domain: norm"), "{stdout}");
    assert!(stdout.contains("active: 20s"), "{stdout}");
    assert!(stdout.contains("domain_limit: 10"), "{stdout}");
    assert!(!stdout.contains("active: 0s"), "{stdout}");
    for (line, column) in [
        (12, 11),
        (13, 11),
        (14, 11),
        (18, 15),
        (21, 21),
        (23, 23),
        (25, 30),
    ] {
        let place = format!("{}:{line}:{column}: ", file.display());
        assert!(
            stderr.contains(&place),
            "stderr should have {place}:\n{stderr}"
        );
    }
    // The YAML printed (without the `# file` line) is the normalized file.
    let loaded = normalize_fixture();
    assert!(stdout.contains(&loaded.normalized[0].1));
}

#[test]
fn check_of_an_envoy_file_is_quiet_on_stderr() {
    let file = fixture("envoy/mongo_cps.yaml");
    let out = charon(&[&file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("domain: mongo_cps"));
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn check_of_a_bad_file_fails_with_locations() {
    let file = fixture("charon/bad.yaml");
    let out = charon(&[&file]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "{}:5:13: invalid rate limit unit `fortnight`",
            file.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{}:8:15: resource `missing` is not defined",
            file.display()
        )),
        "{stderr}"
    );
    assert!(
        !text(&out.stdout).contains("domain:"),
        "nothing is printed as loaded"
    );
}

#[test]
fn check_of_a_directory() {
    let dir = fixture("envoy");
    let out = charon(&[&dir]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (file, domain) in ENVOY_FIXTURES {
        assert!(
            stdout.contains(&format!("# {}", dir.join(file).display())),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("domain: {domain}\n")), "{stdout}");
    }

    // A directory with a bad file fails.
    let temp = tempfile::tempdir().unwrap();
    write(&temp.path().join("ok.yaml"), "domain: ok\n");
    write(&temp.path().join("dup.yaml"), "domain: ok\n");
    let out = charon(&[temp.path()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    // Files load in name order: dup.yaml first, so ok.yaml is the duplicate.
    assert!(stderr.contains("dup.yaml"), "{stderr}");
    assert!(stderr.contains("ok.yaml:1:9: "), "{stderr}");
}

#[test]
fn check_of_a_missing_path_fails() {
    let temp = tempfile::tempdir().unwrap();
    let out = charon(&[&temp.path().join("nope.yaml")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("nope.yaml"));
    let out = charon(&[temp.path()]);
    assert!(!out.status.success(), "an empty directory is an error");
}

// ---------------------------------------------------------------------------
// Known bugs
// ---------------------------------------------------------------------------

#[test]
fn bug_empty_descriptors_list_loads() {
    load("domain: placeholder\ndescriptors:\n");
    let loaded = load(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_eq!(
        leaf(only(&loaded), &[("k", "v")]),
        Some(limit(1, Unit::Second))
    );
}

#[test]
fn bug_trailing_document_separator_loads() {
    let loaded = load("domain: a\n---\n");
    assert_eq!(only(&loaded).name, "a");
}

#[test]
fn bug_unit_multiplier_is_accepted() {
    load(
        "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n      unit_multiplier: 5\n  - key: key2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 25\n",
    );
}

#[test]
fn bug_large_blocklist_loads() {
    let mut yaml = String::from("domain: blocklist\ndescriptors:\n");
    for i in 0..25_000u32 {
        yaml.push_str(&format!(
            "  - key: remote_address\n    value: 10.{}.{}.{}\n    rate_limit: {{unit: second, requests_per_unit: 0}}\n",
            i >> 16,
            (i >> 8) & 255,
            i & 255
        ));
    }
    assert!((yaml.len() as u64) < caps::MAX_FILE_BYTES);
    let loaded = load(&yaml);
    assert_eq!(
        leaf(only(&loaded), &[("remote_address", "10.0.97.167")]),
        Some(limit(0, Unit::Second))
    );
}

#[test]
fn bug_descriptor_depth_cap_is_the_one_enforced() {
    let loaded = load(&nested_block(caps::MAX_DESCRIPTOR_DEPTH));
    assert_eq!(only(&loaded).name, "a");
    let errors = errors_of(&nested_block(caps::MAX_DESCRIPTOR_DEPTH + 1));
    assert!(
        errors[0].message.contains(&format!(
            "nested deeper than {}",
            caps::MAX_DESCRIPTOR_DEPTH
        )),
        "{errors:?}"
    );
}

#[test]
fn bug_replaces_is_validated() {
    assert_error(
        &one_limit("{unit: second, requests_per_unit: 1, replaces: [{name: ''}]}"),
        4,
        17,
        &["replaces"],
    );
    assert_error(
        &one_limit("{unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}"),
        4,
        17,
        &["replaces", "`n`"],
    );
}

#[test]
fn bug_parser_messages_speak_to_users() {
    let leaks = [
        "i64", "Option<", "Options", "from_str", "Depth {", "Nodes {",
    ];
    for yaml in [
        one_limit("{unit: second, requests_per_unit: abc}"),
        "domain:\n".to_owned(),
        "domain: a\ndomain: b\n".to_owned(),
        "domain: a\n---\ndomain: b\n".to_owned(),
        nested_flow(40),
    ] {
        for error in errors_of(&yaml) {
            for leak in leaks {
                assert!(
                    !error.message.contains(leak),
                    "`{error}` talks about `{leak}`"
                );
            }
        }
    }
}

#[test]
fn a_policy_without_tiers_is_reported() {
    let yaml = "domain: d\nresources:\n  api:\n    rate:\n      tiers: [{limit: 1, window: 1s}]\n      domains:\n        acme: {hard_limit: 100}\n";
    let loaded = load(yaml);
    let notes: Vec<String> = loaded.notes.iter().map(ToString::to_string).collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("domain `acme` has no tiers"), "{notes:?}");
    assert!(notes[0].contains("replaces the default whole"), "{notes:?}");
}

#[test]
fn whole_file_errors_print_without_a_fake_location() {
    let errors = load_path(Path::new("/nonexistent/charon.yaml")).expect_err("missing");
    let text = errors.0[0].to_string();
    assert!(text.starts_with("/nonexistent/charon.yaml: "), "{text}");
}

#[test]
fn gcra_on_a_descriptor_leaf() {
    let yaml = "domain: d
descriptors:
  - key: a
    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 20, burst: 40}
  - key: b
    rate_limit: {algorithm: gcra, unit: minute, requests_per_unit: 3}
  - key: c
    rate_limit: {algorithm: fixed_window, unit: minute, requests_per_unit: 3}
";
    let loaded = load_str(yaml, "d.yaml").expect("valid");
    let ns = only(&loaded);
    let algorithm = |key: &str| match leaf(ns, &[(key, "x")]) {
        Some(Leaf::Limit(limit)) => limit.algorithm,
        other => panic!("{other:?}"),
    };
    assert_eq!(algorithm("a"), Algorithm::Gcra { burst: 40 });
    assert_eq!(
        algorithm("b"),
        Algorithm::Gcra { burst: 3 },
        "burst defaults to requests_per_unit"
    );
    assert_eq!(algorithm("c"), Algorithm::FixedWindow);

    for (bad, message) in [
        (
            "{algorithm: leaky, unit: second, requests_per_unit: 1}",
            "unknown algorithm `leaky`",
        ),
        (
            "{unit: second, requests_per_unit: 1, burst: 5}",
            "`burst` applies only to `algorithm: gcra`",
        ),
        (
            "{algorithm: gcra, unit: second, requests_per_unit: 1, burst: 0}",
            "burst must be at least 1",
        ),
        (
            "{algorithm: gcra, unit: second, requests_per_unit: 1, burst: -2}",
            "burst",
        ),
    ] {
        let yaml = format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {bad}\n");
        let errors = load_str(&yaml, "d.yaml").expect_err(bad);
        assert!(errors.to_string().contains(message), "{bad}: {errors}");
    }
}

#[test]
fn soft_limits_are_a_count_or_a_share() {
    let yaml = r#"domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, soft_limit: 8}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 10, soft_limit: "80%"}
"#;
    let loaded = load_str(yaml, "d.yaml").expect("valid");
    let ns = only(&loaded);
    let soft = |key: &str| match leaf(ns, &[(key, "x")]) {
        Some(Leaf::Limit(limit)) => limit.soft_limit,
        other => panic!("{other:?}"),
    };
    assert_eq!(soft("a"), Some(charon::config::SoftLimit::Count(8)));
    assert_eq!(soft("b"), Some(charon::config::SoftLimit::Percent(80)));
    for bad in ["-1", "\"120%\"", "\"0%\"", "\"lots\""] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{unit: second, requests_per_unit: 1, soft_limit: {bad}}}\n"
        );
        let errors = load_str(&yaml, "d.yaml").expect_err(bad);
        assert!(errors.to_string().contains("soft_limit"), "{bad}: {errors}");
    }
}

#[test]
fn a_ban_is_shorthand_for_two_tiers() {
    let dir = format!("{}/examples/cookbook", env!("CARGO_MANIFEST_DIR"));
    let explicit = load_path(format!("{dir}/ban.yaml").as_ref()).expect("ban.yaml");
    let shorthand = load_path(format!("{dir}/ban-shorthand.yaml").as_ref()).expect("shorthand");
    let tiers = |loaded: &Loaded| rate(only(loaded), "api").default.tiers.clone();
    assert_eq!(tiers(&shorthand), tiers(&explicit));
    assert!(
        shorthand
            .notes
            .iter()
            .any(|note| note.to_string().contains("ban normalized into two tiers")),
        "{:?}",
        shorthand.notes
    );
    // `charon check` prints the tiers, not the shorthand.
    let (_, yaml) = &shorthand.normalized[0];
    assert!(yaml.contains("tiers") && !yaml.contains("ban:"), "{yaml}");

    let both = "domain: d
resources:
  api:
    rate:
      ban: {limit: 1, window: 1s, duration: 1m}
      tiers: [{limit: 1, window: 1s}]
";
    let errors = load_str(both, "d.yaml").expect_err("both");
    assert!(
        errors.to_string().contains("both `ban` and `tiers`"),
        "{errors}"
    );
    let bad = "domain: d
resources:
  api:
    rate:
      ban: {limit: 1, window: 1s, duration: soon}
";
    assert!(load_str(bad, "d.yaml").is_err());
}

#[test]
fn gcra_resources_load_with_overrides_and_refuse_nonsense() {
    let yaml = "domain: shop\nresources:\n  api:\n    rate:\n      hard_limit: 30\n      gcra: {burst: 20, count: 10, period: 1s}\n      domains:\n        acme:\n          gcra: {count: 5, period: 2s}\n";
    let loaded = charon::config::load_str(yaml, "shop.yaml").expect("loads");
    let namespace = loaded.config.namespace("shop").expect("namespace");
    let Some(charon::config::Resource::Rate(api)) = namespace.resources.get("api") else {
        panic!("api is a rate resource");
    };
    let bucket = |count, period, burst| charon::engine::GcraLimit {
        count,
        period,
        burst,
    };
    assert_eq!(api.default.gcra, Some(bucket(10, 1_000, 20)));
    assert_eq!(api.default.hard_limit, Some(30));
    assert!(api.default.tiers.is_empty());
    // burst defaults to count; a domain replaces the default whole.
    assert_eq!(api.policy_for("acme").gcra, Some(bucket(5, 2_000, 5)));
    assert_eq!(api.policy_for("acme").hard_limit, None);

    for (bad, expected) in [
        ("gcra: {count: 0, period: 1s}", "at least 1"),
        ("gcra: {count: 5, burst: 0, period: 1s}", "at least 1"),
        ("gcra: {count: 5, period: 0s}", "longer than 0s"),
        ("gcra: {count: 5, period: forever}", "longer than 0s"),
        ("gcra: {count: -1, period: 1s}", "between 0 and"),
        ("gcra: {count: 5, period: soon}", "soon"),
        ("gcra: {count: 5}", "period"),
        ("gcra: {count: 5, period: 1s, rate: 3}", "rate"),
        (
            "gcra: {count: 5, period: 1s}\n      tiers: [{limit: 1, window: 1s}]",
            "both `gcra` and `tiers`",
        ),
    ] {
        let yaml = format!("domain: shop\nresources:\n  api:\n    rate:\n      {bad}\n");
        let errors = charon::config::load_str(&yaml, "shop.yaml")
            .err()
            .unwrap_or_else(|| panic!("`{bad}` loads"))
            .to_string();
        assert!(errors.contains(expected), "`{bad}`: {errors}");
    }
}
