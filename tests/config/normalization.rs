//! Normalization and the notes it leaves.

use super::helpers::*;

// ---------------------------------------------------------------------------
// 4. Normalization
// ---------------------------------------------------------------------------

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
        // (A newline is a control character, refused in a name: see
        // errors::control_characters_in_names_are_refused_with_their_place.)
        "multi : line # not a comment",
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
