//! Errors: `file:line:column`, what is wrong, the whole file rejected.

use super::helpers::*;

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

#[test]
fn control_characters_in_names_are_refused_with_their_place() {
    // YAML's double-quoted escapes put them in: a NUL, a newline, an escape.
    assert_error(
        "domain: \"a\\u0000b\"\n",
        1,
        9,
        &["domain contains a control character (U+0000 at byte 1)"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: \"line\\nbreak\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        3,
        10,
        &["descriptor key contains a control character (U+000A"],
    );
    assert_error(
        "domain: a\ndescriptors:\n  - key: k\n    value: \"\\e[31m\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        4,
        12,
        &["descriptor value contains a control character (U+001B at byte 0)"],
    );
    let resource = "domain: a\nresources:\n  \"api\\t\":\n    rate:\n      tiers:\n        - {limit: 1, window: 1s}\n";
    let errors = errors_of(resource);
    assert!(
        errors.iter().any(|e| e
            .message
            .contains("resource name contains a control character (U+0009")),
        "{errors:#?}"
    );
    let override_domain = "domain: a\nresources:\n  api:\n    rate:\n      tiers:\n        - {limit: 1, window: 1s}\n      domains:\n        \"x\\u0007\":\n          tiers:\n            - {limit: 2, window: 1s}\n";
    let errors = errors_of(override_domain);
    assert!(
        errors.iter().any(|e| e
            .message
            .contains("domain name contains a control character (U+0007")),
        "{errors:#?}"
    );
    // Unicode that is not a control character is a name like any other.
    assert!(load_str("domain: \"café ☕\"\n", "u.yaml").is_ok());
}

/// A `global` limit (docs/design.md#global-limits) is one limit shared by
/// the servers of a hierarchy: it needs one counter per server, so every
/// level of its descriptor names one value, and a window it can share.
#[test]
fn a_global_limit_names_one_value_at_every_level() {
    let loaded = load(
        "domain: api\ndescriptors:\n  - key: route\n    value: search\n    descriptors:\n      - key: path\n        value: \"/v1/*\"\n        share_threshold: true\n        rate_limit: {unit: second, requests_per_unit: 100, global: true}\n",
    );
    let namespace = loaded.config.namespace("api").expect("the namespace");
    let names: Vec<&String> = namespace.globals.keys().collect();
    assert_eq!(names, ["rate_limit:route_search.path_/v1/*"]);
    assert_error(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10, global: true}\n",
        4,
        63,
        &["a `global` limit needs every level of its descriptor to name one value"],
    );
    assert_error(
        "domain: api\ndescriptors:\n  - key: user\n    descriptors:\n      - key: route\n        value: search\n        rate_limit: {unit: second, requests_per_unit: 10, global: true}\n",
        7,
        67,
        &["each value would be a limit of its own"],
    );
    assert_error(
        "domain: api\ndescriptors:\n  - key: route\n    value: search\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, global: true}\n",
        5,
        80,
        &["`global` applies only to fixed and sliding windows (not to `algorithm: gcra`)"],
    );
}

#[test]
fn a_safe_share_is_read_or_refused_with_its_place() {
    // docs/design.md#global-limits, "The parent away".
    let limits = |rate: &str| {
        format!(
            "domain: api\ndescriptors:\n  - key: route\n    value: search\n    rate_limit: {rate}\n"
        )
    };
    for good in ["last", "split", "whole", "30", "'25%'"] {
        let yaml = limits(&format!(
            "{{unit: second, requests_per_unit: 100, global: true, safe_share: {good}}}"
        ));
        let loaded = charon::config::load_str(&yaml, "limits.yaml");
        assert!(loaded.is_ok(), "{good}: {:?}", loaded.err());
    }
    assert_error(
        &limits("{unit: second, requests_per_unit: 100, global: true, safe_share: half}"),
        5,
        82,
        &[
            "`safe_share` is `last`, `split`, `whole`, a count of requests or a percentage of the limit (`25%`), got `half`",
        ],
    );
    assert_error(
        &limits("{unit: second, requests_per_unit: 100, global: true, safe_share: -3}"),
        5,
        82,
        &["got `-3`"],
    );
    assert_error(
        &limits("{unit: second, requests_per_unit: 100, safe_share: whole}"),
        5,
        68,
        &["`safe_share` applies only to a limit marked `global: true`"],
    );
}

#[test]
fn max_hold_only_on_a_plain_fixed_window() {
    // A concurrency limit (docs/design.md#concurrency-limits).
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, algorithm: gcra, max_hold: 60s}"),
        4,
        78,
        &["`max_hold` makes a concurrency limit", "algorithm: gcra"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, algorithm: sliding_window, max_hold: 60s}"),
        4,
        88,
        &["algorithm: sliding_window"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, cost: after_response, max_hold: 60s}"),
        4,
        83,
        &["cost: after_response"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, count_rejected: true, max_hold: 60s}"),
        4,
        83,
        &["`count_rejected` cannot be combined with `max_hold`"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, global: true, max_hold: 60s}"),
        4,
        75,
        &["`global` cannot be combined with `max_hold`"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, max_hold: 0s}"),
        4,
        61,
        &["max_hold must be a duration longer than 0"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, max_hold: forever}"),
        4,
        61,
        &["max_hold must be a duration longer than 0"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 2, max_hold: soon}"),
        4,
        61,
        &["max_hold:", "not a duration"],
    );
    assert_error(
        &one_limit("{unit: day, requests_per_unit: 20000, max_hold: 60s}"),
        4,
        65,
        &["more than the 10000 hits"],
    );
}

#[test]
fn a_calendar_window_says_what_is_wrong_where() {
    let limit =
        |fields: &str| one_limit(&format!("{{unit: month, requests_per_unit: 5, {fields}}}"));
    // Each error at the value it is about.
    assert_error(
        &limit("calendar: {time_zone: Mars/Olympus}"),
        4,
        75,
        &["unknown time zone `Mars/Olympus`", "IANA"],
    );
    assert_error(
        &limit("calendar: {starts_on: 0}"),
        4,
        75,
        &["starts_on must be a day of the month, 1 to 31, not 0"],
    );
    assert_error(
        &limit("calendar: {time_zone: UTC, weekday: 1}"),
        4,
        80,
        &["unknown field `weekday`", "starts_on"],
    );
    assert_error(
        &limit("algorithm: gcra, calendar: {}"),
        4,
        80,
        &["`calendar` makes a fixed window on the calendar, not a `gcra`"],
    );
    assert_error(
        &limit("unit_multiplier: 2, calendar: {}"),
        4,
        83,
        &["a calendar window is one month: no unit_multiplier"],
    );
    assert_error(
        &limit("count_rejected: true, calendar: {}"),
        4,
        69,
        &["`count_rejected` applies only to fixed windows and sliding logs (not to `calendar`)"],
    );
    assert_error(
        &one_limit("{unit: hour, requests_per_unit: 5, calendar: {}}"),
        4,
        62,
        &["a calendar window is a day, week, month or year"],
    );
    assert_error(
        &one_limit("{unit: week, requests_per_unit: 5, calendar: {starts_on: 3}}"),
        4,
        74,
        &["starts_on applies only to `unit: month`"],
    );
}

#[test]
fn a_calendar_window_is_printed_back_as_written() {
    let loaded = load(&one_limit(
        "{unit: month, requests_per_unit: 5, calendar: {time_zone: Europe/Paris, starts_on: 15}}",
    ));
    let normalized = &loaded.normalized[0].1;
    assert!(
        normalized.contains("time_zone: Europe/Paris") && normalized.contains("starts_on: 15"),
        "{normalized}"
    );
}

#[test]
fn learning_settings_out_of_bounds_are_errors_at_their_place() {
    let settings = |learn: &str| format!("domain: a\nsettings:\n  learn: {learn}\n");
    assert_error(&settings("{window: 1500ms}"), 3, 19, &["whole seconds"]);
    assert_error(&settings("{window: 2d}"), 3, 19, &["from 1s to 1d"]);
    assert_error(&settings("{window: soon}"), 3, 19, &["learn.window"]);
    assert_error(
        &settings("{windows: 0}"),
        3,
        20,
        &["learn.windows must be from 1 to 10080"],
    );
    assert_error(
        &settings("{domains: 10001}"),
        3,
        20,
        &["learn.domains must be from 1 to 10000"],
    );
    assert_error(&settings("{domain: 5}"), 3, 11, &["unknown field `domain`"]);
    assert_error(
        &settings("{windows: 1440, domains: 1000}"),
        3,
        10,
        &["1440000 entries per resource, over 100000"],
    );
    let loaded = charon::config::load_str(&settings("{}"), "a.yaml").expect("defaults");
    let learn = loaded.config.namespace("a").expect("a").settings.learn;
    assert_eq!(learn, Some(charon::config::Learn::DEFAULT));
}
