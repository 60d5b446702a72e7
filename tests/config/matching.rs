//! Descriptor matching order (docs/design.md#matching).

use super::helpers::*;

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
