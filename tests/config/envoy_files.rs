//! envoyproxy/ratelimit files load unchanged (fixtures in
//! `tests/fixtures/config/envoy/`, after the examples of its README).

use super::helpers::*;

// ---------------------------------------------------------------------------
// 1. envoyproxy/ratelimit files load unchanged
// ---------------------------------------------------------------------------

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
            count_rejected: false,
            global: false,
            calendar: None,
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
            count_rejected: false,
            global: false,
            calendar: None,
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
