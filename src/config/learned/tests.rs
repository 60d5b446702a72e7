use super::*;

const LEARN: Learn = Learn {
    window_ms: 1_000,
    windows: 10,
    domains: 3,
};

fn window(start_ms: u64, domains: &[(&str, u64)]) -> WindowUse {
    WindowUse {
        start_ms,
        domains: domains.iter().map(|(d, n)| ((*d).to_owned(), *n)).collect(),
    }
}

#[test]
fn statistics_are_over_the_complete_windows_since_first_use() {
    // Now is 20.5 s: the period is windows 10..20 s; 20 s is still running.
    let windows: Vec<WindowUse> = (10..21)
        .map(|second| window(second * 1_000, &[("acme", second), ("tiny", 1)]))
        .chain([window(5_000, &[("acme", 1_000)])])
        .collect();
    let uses = summarize(&LEARN, &windows, 20_500);
    assert_eq!(uses.len(), 2);
    let acme = &uses[0];
    assert_eq!(acme.domain, "acme");
    // 10..=19: the running window (20) and the one before the period (5)
    // do not count.
    assert_eq!((acme.peak, acme.p99, acme.p95, acme.p50), (19, 19, 19, 14));
    assert_eq!(acme.seen, 10);
    assert_eq!(uses[1].peak, 1);
}

#[test]
fn a_window_without_the_domain_counts_as_no_use() {
    // Used from 10 s; acme only in two of the ten windows.
    let windows = vec![
        window(10_000, &[("acme", 50), ("other", 1)]),
        window(15_000, &[("acme", 40)]),
    ];
    let acme = &summarize(&LEARN, &windows, 20_000)[0];
    assert_eq!((acme.peak, acme.p95, acme.p50, acme.seen), (50, 50, 0, 2));
}

#[test]
fn a_resource_first_used_late_is_judged_on_its_own_windows() {
    let windows = vec![
        window(18_000, &[("acme", 7)]),
        window(19_000, &[("acme", 9)]),
    ];
    let acme = &summarize(&LEARN, &windows, 20_000)[0];
    assert_eq!((acme.peak, acme.p50, acme.seen), (9, 7, 2));
}

#[test]
fn nothing_complete_proposes_nothing() {
    let windows = vec![window(20_000, &[("acme", 7)])];
    assert!(summarize(&LEARN, &windows, 20_100).is_empty());
    let text = snippet(
        "shop",
        &LEARN,
        &[Recorded {
            subject: Subject::Resource("search".into()).encode(),
            windows,
        }],
        Pick::Peak,
        20_100,
    );
    assert!(text.contains("nothing recorded"), "{text}");
    crate::config::load_str(&text, "learned.yaml").expect("an empty proposal loads");
}

#[test]
fn the_snippet_loads_and_sets_each_domains_pick() {
    let windows: Vec<WindowUse> = (10..20)
        .map(|second| {
            window(
                second * 1_000,
                &[
                    ("acme", 100 + second),
                    ("globex \"quoted\" \\ ünï", 20),
                    ("", 5),
                    ("bad\u{7}", 5),
                ],
            )
        })
        .collect();
    let recorded = [Recorded {
        subject: Subject::Resource("search".into()).encode(),
        windows,
    }];
    let text = snippet("shop", &LEARN, &recorded, Pick::P50, 20_000);
    let loaded = crate::config::load_str(&text, "learned.yaml")
        .unwrap_or_else(|errors| panic!("{errors}\n{text}"));
    let namespace = loaded.config.namespace("shop").expect("the namespace");
    let Some(crate::config::Resource::Rate(search)) = namespace.resources.get("search") else {
        panic!("a rate resource: {text}");
    };
    let limit_of = |domain: &str| {
        search
            .domains
            .get(domain)
            .map(|rate| rate.tiers[0].limit)
            .unwrap_or_else(|| panic!("{domain} in {text}"))
    };
    assert_eq!(limit_of("acme"), 114);
    assert_eq!(limit_of("globex \"quoted\" \\ ünï"), 20);
    // The median of the two writable domains' picks (20 and 114).
    assert_eq!(search.default.tiers[0].limit, 20);
    assert_eq!(search.domains.len(), 2, "unwritable names are left out");
    assert!(
        text.contains("peak 119, p99 119, p95 119, p50 114"),
        "{text}"
    );
}

#[test]
fn picks_parse_as_written() {
    for pick in [Pick::Peak, Pick::P99, Pick::P95, Pick::P50] {
        assert_eq!(Pick::parse(pick.as_str()), Some(pick));
    }
    assert_eq!(Pick::parse("p90"), None);
}
