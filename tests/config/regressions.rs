//! Regressions: upstream compatibility gaps and unclear messages found and
//! fixed (empty lists, `---`, `unit_multiplier`, large files, depth,
//! `replaces`, plain-language parser messages).

use super::helpers::*;

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
