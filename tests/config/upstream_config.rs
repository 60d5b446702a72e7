//! envoyproxy/ratelimit's own configuration fixtures, loaded by Charon.
//!
//! The files under `tests/fixtures/upstream/` are upstream's test fixtures
//! (`test/config/*.yaml`) and example configs (`examples/ratelimit/config/`),
//! copied unchanged (see `SOURCE.md` there). This file proves, for every one
//! of them:
//!
//! 1. each file upstream loads, Charon loads too (alone, with `load_path`),
//!    and its lookups give what upstream's config tests assert: the limit
//!    (`requests_per_unit`, `unit`, `name`), `unlimited`, no limit where
//!    upstream finds none, `shadow_mode`, `quota_mode`, `metadata`, and for
//!    `share_threshold` which levels share one counter;
//! 2. each file upstream refuses, Charon refuses too, naming the file, the
//!    line and column where the problem is, and a message a user would
//!    recognize as the same cause as upstream's;
//! 3. upstream's merge cases (`MERGE_DOMAIN_CONFIG`): two files of one domain
//!    merge when merging is on, a descriptor both define is refused, and a
//!    second file for a domain is refused when merging is off.
//!
//! A table lists every fixture with what is expected of it, and a test fails
//! if a fixture is added to either folder without an entry, so no upstream
//! fixture is skipped silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use charon::config::{
    ConfigError, FixedLimit, Leaf, LoadOptions, Loaded, MetaValue, Namespace, Node, Unit,
    load_path, load_path_with,
};

// ---------------------------------------------------------------------------
// The table: every fixture and what is expected of it
// ---------------------------------------------------------------------------

/// What a fixture must do when loaded alone.
enum Expect {
    /// It loads, and this checks its lookups.
    Loads(fn(&Loaded)),
    /// It is refused with exactly one error at `line:column` whose message
    /// contains every fragment.
    Refused {
        line: u64,
        column: u64,
        fragments: &'static [&'static str],
    },
}

use Expect::{Loads, Refused};

/// Every fixture, by its path under `tests/fixtures/upstream/`. Upstream's
/// expected message is quoted beside each refused file.
const FIXTURES: &[(&str, Expect)] = &[
    // `invalid rate limit unit 'foo'`
    (
        "test-config/bad_limit_unit.yaml",
        Refused {
            line: 6,
            column: 13,
            fragments: &["invalid rate limit unit", "foo"],
        },
    ),
    // `error loading config file: yaml: line 2: found unexpected end of
    // stream` (the file is `'''`: a quoted string never closed).
    (
        "test-config/bad_yaml.yaml",
        Refused {
            line: 1,
            column: 1,
            fragments: &["unclosed quote"],
        },
    ),
    ("test-config/basic_config.yaml", Loads(basic_config)),
    // Upstream never loads it alone; it has a domain and no descriptors.
    ("test-config/duplicate_domain.yaml", Loads(duplicate_domain)),
    // `duplicate descriptor composite key 'test-domain.key1_value1'`
    (
        "test-config/duplicate_key.yaml",
        Refused {
            line: 6,
            column: 10,
            fragments: &["duplicate descriptor", "key1", "value1"],
        },
    ),
    // `config file cannot have empty domain`
    (
        "test-config/empty_domain.yaml",
        Refused {
            line: 1,
            column: 1,
            fragments: &["missing field `domain`", "non-empty `domain`"],
        },
    ),
    // `descriptor has empty key`
    (
        "test-config/empty_key.yaml",
        Refused {
            line: 3,
            column: 5,
            fragments: &[
                "missing field `key`",
                "every descriptor needs a non-empty `key`",
            ],
        },
    ),
    (
        "test-config/merge_domain_key1.yaml",
        Loads(merge_domain_key1),
    ),
    (
        "test-config/merge_domain_key2.yaml",
        Loads(merge_domain_key2),
    ),
    ("test-config/metadata.yaml", Loads(metadata)),
    // `config error, unknown key 'ratelimit'`
    (
        "test-config/misspelled_key.yaml",
        Refused {
            line: 5,
            column: 5,
            fragments: &["unknown field `ratelimit`", "rate_limit"],
        },
    ),
    // `config error, unknown key 'requestsperunit'`
    (
        "test-config/misspelled_key2.yaml",
        Refused {
            line: 7,
            column: 7,
            fragments: &["unknown field `requestsperunit`", "requests_per_unit"],
        },
    ),
    // `config error, yaml file contains list of type other than map: a`
    (
        "test-config/non_map_list.yaml",
        Refused {
            line: 3,
            column: 5,
            fragments: &["expected a mapping", "not a single value or a list"],
        },
    ),
    // `config error, key is not of type string: 0.25`
    (
        "test-config/non_string_key.yaml",
        Refused {
            line: 1,
            column: 1,
            fragments: &["unknown field `0.25`", "domain"],
        },
    ),
    // `should not have an empty replaces entry` (the file has `- name:`
    // with nothing after it; the error points at that empty name).
    (
        "test-config/replaces_empty.yaml",
        Refused {
            line: 10,
            column: 19,
            fragments: &["a value is required"],
        },
    ),
    // `replaces should not contain name of same descriptor`
    (
        "test-config/replaces_self.yaml",
        Refused {
            line: 8,
            column: 11,
            fragments: &["the limit `self` replaces itself"],
        },
    ),
    (
        "test-config/shadowmode_config.yaml",
        Loads(shadowmode_config),
    ),
    ("test-config/share_threshold.yaml", Loads(share_threshold)),
    // `should not specify rate limit unit when unlimited`
    (
        "test-config/unlimited_with_unit.yaml",
        Refused {
            line: 5,
            column: 7,
            fragments: &["unlimited", "must not have a unit"],
        },
    ),
    ("test-config/wildcard.yaml", Loads(wildcard)),
    ("examples/config.yaml", Loads(examples_config)),
    ("examples/example.yaml", Loads(examples_example)),
];

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A request descriptor: its `(key, value)` entries.
type Entries<'a> = &'a [(&'a str, &'a str)];

fn upstream() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream")
}

fn fixture(name: &str) -> PathBuf {
    upstream().join(name)
}

/// The fixture names of a folder (relative to `tests/fixtures/upstream/`).
fn yaml_files(folder: &str) -> BTreeSet<String> {
    std::fs::read_dir(upstream().join(folder))
        .unwrap_or_else(|e| panic!("cannot read {folder}: {e}"))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .map(|path| {
            let name = path.file_name().expect("a file name").to_string_lossy();
            format!("{folder}/{name}")
        })
        .collect()
}

/// The namespace of `domain`.
fn domain<'l>(loaded: &'l Loaded, name: &str) -> &'l Namespace {
    loaded
        .config
        .namespace(name)
        .unwrap_or_else(|| panic!("domain `{name}` should be loaded"))
}

/// The only namespace of a loaded file, which must be `name`.
fn only<'l>(loaded: &'l Loaded, name: &str) -> &'l Namespace {
    assert_eq!(loaded.config.namespaces().count(), 1, "exactly one domain");
    domain(loaded, name)
}

/// The node a request descriptor leads to, `None` when nothing matches.
fn node<'n>(namespace: &'n Namespace, entries: &[(&str, &str)]) -> Option<&'n Node> {
    namespace
        .descriptors
        .find(entries.iter().copied())
        .map(|found| found.node)
}

/// The node a request descriptor leads to, which must exist.
fn matched<'n>(namespace: &'n Namespace, entries: &[(&str, &str)]) -> &'n Node {
    node(namespace, entries).unwrap_or_else(|| panic!("{entries:?} should match a descriptor"))
}

/// The fixed limit a request descriptor gets, which must have one.
fn limit<'n>(namespace: &'n Namespace, entries: &[(&str, &str)]) -> &'n FixedLimit {
    match &matched(namespace, entries).leaf {
        Leaf::Limit(limit) => limit,
        other => panic!("{entries:?} should have a limit, got {other:?}"),
    }
}

/// The request descriptor is limited to `requests_per_unit` per `unit`.
fn assert_limit(namespace: &Namespace, entries: &[(&str, &str)], requests: u64, unit: Unit) {
    let found = limit(namespace, entries);
    assert_eq!(
        (found.requests_per_unit, found.unit, found.unit_multiplier),
        (requests, unit, 1),
        "limit of {entries:?}"
    );
}

/// Upstream's `nil`: nothing matches, or the matched node has no limit (an
/// intermediate node, or one that allow-lists its value).
fn assert_no_limit(namespace: &Namespace, entries: &[(&str, &str)]) {
    if let Some(found) = node(namespace, entries) {
        assert_eq!(found.leaf, Leaf::None, "{entries:?} should have no limit");
    }
}

/// Upstream's `Unlimited == true`.
fn assert_unlimited(namespace: &Namespace, entries: &[(&str, &str)]) {
    let leaf = &matched(namespace, entries).leaf;
    assert!(
        matches!(leaf, Leaf::Unlimited { .. }),
        "{entries:?} should be unlimited, got {leaf:?}"
    );
}

/// Which entries of a request descriptor share one counter, and under which
/// pattern (`None`: the request's own value).
fn shared(namespace: &Namespace, entries: &[(&str, &str)]) -> Vec<Option<String>> {
    namespace
        .descriptors
        .find(entries.iter().copied())
        .unwrap_or_else(|| panic!("{entries:?} should match a descriptor"))
        .shared_values
        .iter()
        .map(|value| value.map(str::to_owned))
        .collect()
}

fn text(value: &str) -> MetaValue {
    MetaValue::String(value.to_owned())
}

fn map<const N: usize>(pairs: [(&str, MetaValue); N]) -> BTreeMap<String, MetaValue> {
    pairs
        .into_iter()
        .map(|(key, value)| (key.to_owned(), value))
        .collect()
}

/// The `metadata:` of the node a request descriptor leads to.
fn metadata_of(
    namespace: &Namespace,
    entries: &[(&str, &str)],
) -> Option<BTreeMap<String, MetaValue>> {
    matched(namespace, entries).metadata.as_deref().cloned()
}

/// The errors of a path that must not load.
fn refused(path: &Path, options: LoadOptions) -> Vec<ConfigError> {
    match load_path_with(path, options) {
        Ok(_) => panic!("{} should be refused", path.display()),
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an Err carries at least one error");
            errors.0
        }
    }
}

/// A directory holding copies of fixtures, under the given names.
fn directory_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (fixture_name, name) in files {
        std::fs::copy(fixture(fixture_name), dir.path().join(name))
            .unwrap_or_else(|e| panic!("cannot copy {fixture_name}: {e}"));
    }
    dir
}

const MERGE: LoadOptions = LoadOptions {
    merge_domains: true,
    files_optional: false,
};
const NO_MERGE: LoadOptions = LoadOptions {
    merge_domains: false,
    files_optional: false,
};

// ---------------------------------------------------------------------------
// The table is complete
// ---------------------------------------------------------------------------

#[test]
fn every_upstream_fixture_is_in_the_table() {
    let on_disk: BTreeSet<String> = yaml_files("test-config")
        .into_iter()
        .chain(yaml_files("examples"))
        .collect();
    let listed: BTreeSet<String> = FIXTURES
        .iter()
        .map(|(name, _)| (*name).to_owned())
        .collect();
    assert_eq!(listed.len(), FIXTURES.len(), "a fixture is listed twice");
    let unlisted: Vec<&String> = on_disk.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "upstream fixtures with no expectation in FIXTURES: {unlisted:?}"
    );
    let missing: Vec<&String> = listed.difference(&on_disk).collect();
    assert!(
        missing.is_empty(),
        "FIXTURES lists files that do not exist: {missing:?}"
    );
    // Upstream has 20 files under test/config and 2 example configs.
    assert_eq!((on_disk.len(), FIXTURES.len()), (22, 22));
}

// ---------------------------------------------------------------------------
// Valid files load, with upstream's lookups
// ---------------------------------------------------------------------------

#[test]
fn valid_fixtures_load_and_give_upstreams_lookups() {
    let mut checked = 0;
    for (name, expect) in FIXTURES {
        let Loads(check) = expect else { continue };
        let path = fixture(name);
        let loaded = load_path(&path)
            .unwrap_or_else(|errors| panic!("{name} should load, as upstream does:\n{errors}"));
        // Loaded as written: nothing for normalization to change.
        assert!(loaded.notes.is_empty(), "{name}: {:?}", loaded.notes);
        eprintln!("checking the lookups of {name}");
        check(&loaded);
        checked += 1;
    }
    assert_eq!(checked, 10);
}

/// TestBasicConfig.
fn basic_config(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    assert!(loaded.config.namespace("foo_domain").is_none());
    // An empty descriptor matches nothing.
    assert!(node(ns, &[]).is_none());
    assert_no_limit(ns, &[("key1", "something")]);
    // A node with children and no limit of its own.
    assert_no_limit(ns, &[("key1", "value1")]);
    // A request deeper than the configuration.
    assert_no_limit(ns, &[("key2", "value2"), ("subkey", "subvalue")]);
    assert_no_limit(ns, &[("key5", "value5"), ("subkey5", "subvalue")]);
    assert_limit(
        ns,
        &[("key1", "value1"), ("subkey1", "something")],
        5,
        Unit::Second,
    );
    assert_limit(
        ns,
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        10,
        Unit::Second,
    );
    assert_limit(ns, &[("key2", "something")], 20, Unit::Minute);
    assert_limit(ns, &[("key2", "value2")], 30, Unit::Minute);
    // Allow-listed: a node with neither limit nor children.
    assert_no_limit(ns, &[("key2", "value3")]);
    assert_eq!(matched(ns, &[("key2", "value3")]).leaf, Leaf::None);
    assert_limit(ns, &[("key3", "foo")], 1, Unit::Hour);
    assert_eq!(limit(ns, &[("key3", "foo")]).name, None);
    assert_limit(ns, &[("key4", "foo")], 1, Unit::Day);
    assert_eq!(
        limit(ns, &[("key4", "foo")]).name.as_deref(),
        Some("key4_rate_limit")
    );
    assert_limit(ns, &[("key5", "value5")], 15, Unit::Day);
    assert_limit(
        ns,
        &[("key5", "value5"), ("subkey5", "subvalue5")],
        25,
        Unit::Day,
    );
    assert_unlimited(ns, &[("key6", "foo")]);
    for value in ["unspecified_value", "another_value"] {
        assert_limit(ns, &[("key7", value)], 70, Unit::Minute);
        assert!(matched(ns, &[("key7", value)]).detailed_metric);
    }
    // No node carries a mode upstream's test would see.
    for entries in [
        &[("key1", "value1"), ("subkey1", "x")][..],
        &[("key2", "x")],
        &[("key4", "x")],
    ] {
        let found = matched(ns, entries);
        assert!(!found.shadow_mode && !found.quota_mode, "{entries:?}");
        assert!(found.metadata.is_none(), "{entries:?}");
    }
}

/// Loaded alone: the domain, with nothing under it.
fn duplicate_domain(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    assert_eq!(ns.descriptors.nodes().count(), 0);
    assert!(node(ns, &[("key1", "value1")]).is_none());
}

fn merge_domain_key1(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    assert_limit(ns, &[("key1", "value1")], 10, Unit::Minute);
    assert!(node(ns, &[("key2", "value2")]).is_none());
}

fn merge_domain_key2(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    assert_limit(ns, &[("key2", "value2")], 20, Unit::Minute);
    assert!(node(ns, &[("key1", "value1")]).is_none());
}

/// TestMetadata.
fn metadata(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    let service_1 = [("key1", "value1"), ("subkey1", "something")];
    assert_limit(ns, &service_1, 5, Unit::Second);
    assert_eq!(
        metadata_of(ns, &service_1),
        Some(map([("name", text("service_1"))]))
    );
    let service_2 = [("key2", "something")];
    assert_limit(ns, &service_2, 20, Unit::Minute);
    assert_eq!(
        metadata_of(ns, &service_2),
        Some(map([(
            "service_with_quota",
            MetaValue::Map(map([("name", text("service_2"))]))
        )]))
    );
    // A sibling without `metadata:` carries none.
    let plain = [("key1", "value1"), ("subkey1", "subvalue1")];
    assert_limit(ns, &plain, 10, Unit::Second);
    assert_eq!(metadata_of(ns, &plain), None);
}

/// TestShadowModeConfig.
fn shadowmode_config(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    let cases: [(Entries, u64, Unit, bool); 4] = [
        (
            &[("key1", "value1"), ("subkey1", "something")],
            5,
            Unit::Second,
            false,
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            10,
            Unit::Second,
            true,
        ),
        (&[("key2", "something")], 20, Unit::Minute, true),
        (&[("key2", "value2")], 30, Unit::Minute, false),
    ];
    for (entries, requests, unit, shadow) in cases {
        assert_limit(ns, entries, requests, unit);
        assert_eq!(
            matched(ns, entries).shadow_mode,
            shadow,
            "shadow_mode of {entries:?}"
        );
        assert!(!matched(ns, entries).quota_mode, "{entries:?}");
    }
}

/// TestShareThreshold: the limits, and which levels share one counter (by
/// pattern) for all the values they match.
fn share_threshold(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    let pattern = |p: &str| Some(p.to_owned());
    for file in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        assert_limit(ns, &[("files", file)], 100, Unit::Minute);
        assert_eq!(shared(ns, &[("files", file)]), [pattern("files/*")]);
    }
    let nested = [("nested", "parent"), ("files", "nested/file1.txt")];
    assert_limit(ns, &nested, 200, Unit::Minute);
    assert_eq!(shared(ns, &nested), [None, pattern("nested/*")]);
    let same_key = [("files", "top/a"), ("files", "nested/b")];
    assert_limit(ns, &same_key, 300, Unit::Minute);
    assert_eq!(
        shared(ns, &same_key),
        [pattern("top/*"), pattern("nested/*")]
    );
    let route = [("route", "api/v1"), ("method", "GET")];
    assert_limit(ns, &route, 60, Unit::Minute);
    assert_eq!(shared(ns, &route), [pattern("api/*"), None]);
    assert!(matched(ns, &[("route", "api/v2")]).value_to_metric);
    let service = [("service", "svc/user"), ("endpoint", "get")];
    assert_limit(ns, &service, 80, Unit::Minute);
    assert!(matched(ns, &service).detailed_metric);
    assert_eq!(shared(ns, &service), [pattern("svc/*"), None]);
    // `share_threshold: false` on the middle wildcard: its values count apart.
    let path = [("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")];
    assert_limit(ns, &path, 120, Unit::Minute);
    assert_eq!(shared(ns, &path), [pattern("path/*"), None, None]);
    let user = [
        ("user", "user/alice"),
        ("resource", "res/file1"),
        ("action", "read"),
    ];
    assert_limit(ns, &user, 150, Unit::Minute);
    assert_eq!(
        shared(ns, &user),
        [pattern("user/*"), pattern("res/*"), None]
    );
    // An explicit value beats the wildcard, and does not share its counter.
    assert_limit(ns, &[("file", "test1")], 50, Unit::Minute);
    assert_eq!(shared(ns, &[("file", "test1")]), [None]);
    for value in ["test2", "test23", "test123"] {
        assert_limit(ns, &[("file", value)], 100, Unit::Minute);
        assert_eq!(shared(ns, &[("file", value)]), [pattern("test*")]);
    }
    // `*` in the middle, and several `*`.
    assert_limit(ns, &[("midpath", "/api/foo/v1")], 100, Unit::Minute);
    assert_eq!(
        shared(ns, &[("midpath", "/api/foo/v1")]),
        [pattern("/api*v1")]
    );
    assert_no_limit(ns, &[("midpath", "/api/v2")]);
    assert_limit(ns, &[("multiroute", "svcXepYrpc")], 50, Unit::Minute);
    assert_eq!(
        shared(ns, &[("multiroute", "svcXepYrpc")]),
        [pattern("svc*ep*rpc")]
    );
    assert_no_limit(ns, &[("multiroute", "svcABCrpc")]);
    assert_limit(ns, &[("midroute", "/api/users/v2")], 80, Unit::Minute);
    assert_eq!(
        shared(ns, &[("midroute", "/api/users/v2")]),
        [pattern("/api*v2")]
    );
    let tenant = [("tenant", "t1prod"), ("resource", "resAv2")];
    assert_limit(ns, &tenant, 60, Unit::Minute);
    assert_eq!(shared(ns, &tenant), [pattern("t*prod"), pattern("res*v2")]);
}

/// TestWildcardConfig.
fn wildcard(loaded: &Loaded) {
    let ns = only(loaded, "test-domain");
    // One node (upstream: the same limit) for every value that matches.
    let same = |a: &[(&str, &str)], b: &[(&str, &str)]| {
        assert!(
            std::ptr::eq(matched(ns, a), matched(ns, b)),
            "{a:?} and {b:?} should match one descriptor"
        );
    };
    assert_limit(ns, &[("noVal", "foo1")], 20, Unit::Minute);
    same(&[("noVal", "foo1")], &[("noVal", "foo2")]);
    assert_limit(ns, &[("wild", "foo1")], 20, Unit::Minute);
    same(&[("wild", "foo1")], &[("wild", "foo2")]);
    assert_limit(
        ns,
        &[("nestedWild", "val1"), ("wild", "goo2")],
        20,
        Unit::Minute,
    );
    assert_no_limit(ns, &[("wild", "bar")]);
    assert_no_limit(ns, &[("noWild", "foo1")]);
    // `*` in the middle may match nothing.
    for value in ["barab", "bar123b", "barb"] {
        assert_limit(ns, &[("midWild", value)], 20, Unit::Minute);
        same(&[("midWild", "barab")], &[("midWild", value)]);
    }
    for value in ["bara", "xbarb"] {
        assert_no_limit(ns, &[("midWild", value)]);
    }
    // Every `*` counts.
    for value in ["foo123bar456baz", "foobarbaz"] {
        assert_limit(ns, &[("multiWild", value)], 10, Unit::Minute);
    }
    for value in ["foo123baz", "bar456baz"] {
        assert_no_limit(ns, &[("multiWild", value)]);
    }
}

/// examples/ratelimit/config/config.yaml.
fn examples_config(loaded: &Loaded) {
    let ns = only(loaded, "mongo_cps");
    assert_limit(ns, &[("database", "users")], 500, Unit::Second);
    assert_limit(ns, &[("database", "default")], 500, Unit::Second);
    assert_no_limit(ns, &[("database", "other")]);
}

/// examples/ratelimit/config/example.yaml, as upstream's integration tests
/// use it.
fn examples_example(loaded: &Loaded) {
    let ns = only(loaded, "rl");
    let account = limit(ns, &[("category", "account")]);
    assert_eq!((account.requests_per_unit, account.unit), (4, Unit::Minute));
    assert_eq!(account.replaces, ["bkthomps", "fake_name"]);
    let bkthomps = [
        ("source_cluster", "proxy"),
        ("destination_cluster", "bkthomps"),
    ];
    assert_limit(ns, &bkthomps, 2, Unit::Minute);
    assert_eq!(limit(ns, &bkthomps).replaces, ["bkthomps"]);
    assert_limit(
        ns,
        &[("source_cluster", "proxy"), ("destination_cluster", "mock")],
        1,
        Unit::Minute,
    );
    assert_no_limit(ns, &[("source_cluster", "proxy")]);
    assert_limit(ns, &[("foo", "x")], 2, Unit::Minute);
    assert_limit(ns, &[("foo", "x"), ("bar", "y")], 3, Unit::Minute);
    assert_eq!(
        limit(ns, &[("foo", "x"), ("bar", "bkthomps")])
            .name
            .as_deref(),
        Some("bkthomps")
    );
    let banned = limit(ns, &[("foo", "x"), ("bar", "banned")]);
    assert_eq!(
        (banned.requests_per_unit, banned.name.as_deref()),
        (0, Some("banned_limit"))
    );
    assert_limit(ns, &[("foo", "x"), ("baz", "y")], 1, Unit::Second);
    let shady = [("foo", "x"), ("baz", "shady")];
    assert_limit(ns, &shady, 3, Unit::Minute);
    assert!(matched(ns, &shady).shadow_mode);
    assert!(!matched(ns, &[("foo", "x"), ("baz", "not-so-shady")]).shadow_mode);
    assert_unlimited(ns, &[("foo", "x"), ("bay", "y")]);
    assert_unlimited(ns, &[("qux", "y")]);
    assert!(matched(ns, &[("unspec", "y")]).detailed_metric);
    // The quota descriptors of integration-test/scripts/quota.sh.
    for (service, requests) in [("service_1", 1), ("service_2", 2)] {
        let entries = [("service", service)];
        assert_limit(ns, &entries, requests, Unit::Minute);
        let found = matched(ns, &entries);
        assert!(found.quota_mode, "{service} should be in quota mode");
        assert!(!found.shadow_mode);
        assert_eq!(
            metadata_of(ns, &entries),
            Some(map([(
                "service_with_quota",
                MetaValue::Map(map([("name", text(service))]))
            )]))
        );
    }
    assert!(!matched(ns, &[("foo", "x")]).quota_mode);
}

// ---------------------------------------------------------------------------
// Invalid files are refused: file, place, cause
// ---------------------------------------------------------------------------

#[test]
fn invalid_fixtures_are_refused_with_file_place_and_cause() {
    let mut checked = 0;
    for (name, expect) in FIXTURES {
        let Refused {
            line,
            column,
            fragments,
        } = expect
        else {
            continue;
        };
        let path = fixture(name);
        let errors = match load_path(&path) {
            Ok(_) => panic!("{name} should be refused, as upstream refuses it"),
            Err(errors) => errors.0,
        };
        assert_eq!(
            errors.len(),
            1,
            "{name}: expected one error, got {errors:#?}"
        );
        let error = &errors[0];
        assert_eq!(error.file, path, "{name}: the error names the file");
        assert_eq!(
            (error.line, error.column),
            (*line, *column),
            "{name}: wrong place for `{error}`"
        );
        for fragment in *fragments {
            assert!(
                error.message.contains(fragment),
                "{name}: message `{}` should mention `{fragment}`",
                error.message
            );
        }
        // Compiler style: `file:line:column: message`.
        assert_eq!(
            error.to_string(),
            format!("{}:{line}:{column}: {}", path.display(), error.message)
        );
        checked += 1;
    }
    assert_eq!(checked, 12);
}

// ---------------------------------------------------------------------------
// Merging files of one domain
// ---------------------------------------------------------------------------

/// TestDomainMerge: merge_domain_key1 + merge_domain_key2, merging on.
#[test]
fn merged_domain_files_add_their_descriptors() {
    let dir = directory_of(&[
        (
            "test-config/merge_domain_key1.yaml",
            "merge_domain_key1.yaml",
        ),
        (
            "test-config/merge_domain_key2.yaml",
            "merge_domain_key2.yaml",
        ),
    ]);
    let loaded = load_path_with(dir.path(), MERGE).unwrap_or_else(|e| panic!("{e}"));
    let ns = only(&loaded, "test-domain");
    assert_limit(ns, &[("key1", "value1")], 10, Unit::Minute);
    assert_limit(ns, &[("key2", "value2")], 20, Unit::Minute);
    assert!(node(ns, &[]).is_none());
    assert!(loaded.config.namespace("foo_domain").is_none());
}

/// TestDuplicateKeyDomainMerge: merge_domain_key1 twice, merging on.
#[test]
fn merged_domain_files_refuse_a_descriptor_both_define() {
    let dir = directory_of(&[
        (
            "test-config/merge_domain_key1.yaml",
            "merge_domain_key1.yaml",
        ),
        (
            "test-config/merge_domain_key1.yaml",
            "merge_domain_key1_copy.yaml",
        ),
    ]);
    let errors = refused(dir.path(), MERGE);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let error = &errors[0];
    // The second file (in name order) is the one that repeats the descriptor,
    // at its `domain:` line.
    assert_eq!(error.file, dir.path().join("merge_domain_key1_copy.yaml"));
    assert_eq!((error.line, error.column), (2, 9), "{error}");
    assert!(
        error
            .message
            .contains("duplicate descriptor composite key 'test-domain.key1_value1'"),
        "{error}"
    );
    assert!(error.message.contains("merge_domain_key1.yaml"), "{error}");
}

/// TestDuplicateDomain: basic_config then duplicate_domain, merging off.
#[test]
fn second_file_of_a_domain_is_refused_without_merging() {
    let dir = directory_of(&[
        ("test-config/basic_config.yaml", "basic_config.yaml"),
        ("test-config/duplicate_domain.yaml", "duplicate_domain.yaml"),
    ]);
    for errors in [
        refused(dir.path(), NO_MERGE),
        load_path(dir.path()).unwrap_err().0,
    ] {
        assert_eq!(errors.len(), 1, "{errors:#?}");
        let error = &errors[0];
        assert_eq!(error.file, dir.path().join("duplicate_domain.yaml"));
        assert_eq!((error.line, error.column), (1, 9), "{error}");
        for fragment in ["test-domain", "already defined", "basic_config.yaml"] {
            assert!(
                error.message.contains(fragment),
                "`{error}` should mention `{fragment}`"
            );
        }
    }
    // The same pair of upstream's merge fixtures, merging off.
    let dir = directory_of(&[
        (
            "test-config/merge_domain_key1.yaml",
            "merge_domain_key1.yaml",
        ),
        (
            "test-config/merge_domain_key2.yaml",
            "merge_domain_key2.yaml",
        ),
    ]);
    let errors = refused(dir.path(), NO_MERGE);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_eq!(errors[0].file, dir.path().join("merge_domain_key2.yaml"));
    assert!(
        errors[0].message.contains("already defined"),
        "{}",
        errors[0]
    );
}

/// basic_config + duplicate_domain, merging on: the second adds nothing.
#[test]
fn duplicate_domain_merges_when_merging_is_on() {
    let dir = directory_of(&[
        ("test-config/basic_config.yaml", "basic_config.yaml"),
        ("test-config/duplicate_domain.yaml", "duplicate_domain.yaml"),
    ]);
    let loaded = load_path_with(dir.path(), MERGE).unwrap_or_else(|e| panic!("{e}"));
    basic_config(&loaded);
}
