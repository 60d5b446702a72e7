//! `charon simulate` (docs/simulator.md): the timeline is exactly what the
//! limiter decides for the same requests at the same instants, for every
//! rate pattern of the cookbook (tiers, prisons, batches, buckets, soft
//! limits); the CLI prints it as text or JSON, and refuses nonsense and
//! oversized input with a clear message.
#![cfg(feature = "server")]

use std::process::Command;

use charon::clock::ManualClock;
use charon::config::{self, Resource};
use charon::limiter::Limiter;
use charon::simulate::{self, PhaseName, Source};
use charon::store::MemoryStore;

fn cookbook(file: &str) -> String {
    format!("{}/examples/cookbook/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs the pattern through a real limiter on a manual clock; grants per tick.
async fn limiter_grants(file: &str, domain: &str, pattern: &str, tick: u64) -> Vec<u64> {
    let loaded = config::load_path(cookbook(file).as_ref()).unwrap();
    let namespace = loaded.config.namespaces().next().unwrap().clone();
    let rate = namespace
        .resources
        .values()
        .find_map(|resource| match resource {
            Resource::Rate(rate) => Some(rate.clone()),
            Resource::Copies(_) | Resource::Capacity(_) => None,
        })
        .unwrap();
    let start = 1_800_000_000_000;
    let clock = ManualClock::new(start);
    let limiter = Limiter::new(
        loaded.config.clone(),
        MemoryStore::with_clock(clock.clone()),
    );
    let pattern = simulate::parse_pattern(pattern).unwrap();
    let mut grants = vec![0; pattern.span_ms.div_ceil(tick).max(1) as usize];
    for &(at, count) in &pattern.requests {
        clock.set(start + at);
        for _ in 0..count {
            let (outcome, _) = limiter
                .request_hits(&namespace, &rate, domain, 1, 1)
                .await
                .unwrap();
            grants[(at / tick) as usize] += outcome.granted;
        }
    }
    grants
}

#[tokio::test]
async fn the_timeline_is_what_the_limiter_decides() {
    let cases = [
        ("simple.yaml", "acme", "10/s for 3s, pause 1s, burst 8"),
        (
            "penalty.yaml",
            "acme",
            "10/s for 8s, pause 5s, 30/s for 12s",
        ),
        (
            "penalty-stacked.yaml",
            "acme",
            "60/s for 20s, pause 30s, 15/s for 10s",
        ),
        ("punishment.yaml", "acme", "8/s for 3s, 2/s for 20s"),
        ("batch.yaml", "acme", "20/s for 5s, pause 10s, 20/s for 40s"),
        (
            "token-bucket-resource.yaml",
            "client",
            "40/s for 5s, at 7s 7001ms",
        ),
        ("token-bucket-resource.yaml", "bigcorp", "200/s for 3s"),
        ("punishment-buffer.yaml", "acme", "12/s for 5s, 3/s for 10s"),
        (
            "batch-daily.yaml",
            "acme",
            "50/s for 120s, pause 200s, 10/s for 30s",
        ),
        ("ban.yaml", "acme", "200/s for 15s, 1/s for 30s"),
        ("ban-shorthand.yaml", "acme", "200/s for 15s, 1/s for 30s"),
    ];
    let mut covered = std::collections::BTreeSet::new();
    for (file, domain, pattern) in cases {
        covered.insert(file);
        let rate = simulate::resolve(Source::Config {
            path: cookbook(file).as_ref(),
            namespace: None,
            resource: None,
        })
        .unwrap();
        let parsed = simulate::parse_pattern(pattern).unwrap();
        let timeline = simulate::simulate(&rate, domain, &parsed, 1_000).unwrap();
        let shown: Vec<u64> = timeline.ticks.iter().map(|tick| tick.granted).collect();
        let decided = limiter_grants(file, domain, pattern, 1_000).await;
        assert_eq!(shown, decided, "{file} {domain} `{pattern}`");
        assert_eq!(timeline.granted + timeline.rejected, parsed.total());
    }
    // Every rate resource of the cookbook is run here; a new pattern must
    // join the list above.
    let mut files: Vec<String> = std::fs::read_dir(cookbook(""))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut missing = Vec::new();
    for file in &files {
        let loaded = config::load_path(cookbook(file).as_ref()).unwrap();
        let has_rate_resource = loaded.config.namespaces().any(|namespace| {
            namespace
                .resources
                .values()
                .any(|resource| matches!(resource, Resource::Rate(_)))
        });
        // A Cloud Armor ban is not burst tiers: simulate says so (below).
        let cloud_armor = file == "ban-cloud-armor.yaml";
        if has_rate_resource && !covered.contains(file.as_str()) && !cloud_armor {
            missing.push(file.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "cookbook rate patterns never simulated: {missing:?}"
    );
    assert!(covered.len() >= 10, "{covered:?}");
    let refused = simulate::resolve(Source::Config {
        path: cookbook("ban-cloud-armor.yaml").as_ref(),
        namespace: None,
        resource: None,
    })
    .expect_err("not simulated");
    assert!(refused.contains("cloud_armor"), "{refused}");
}

#[test]
fn the_penalty_tier_is_entered_then_cools_down() {
    let rate = simulate::resolve(Source::Config {
        path: cookbook("penalty.yaml").as_ref(),
        namespace: None,
        resource: None,
    })
    .unwrap();
    let pattern = simulate::parse_pattern("10/s for 8s").unwrap();
    let timeline = simulate::simulate(&rate, "acme", &pattern, 1_000).unwrap();
    let phases: Vec<(usize, PhaseName)> = timeline
        .ticks
        .iter()
        .map(|tick| (tick.tier, tick.tiers[1].phase))
        .collect();
    // 10/s needs the 20/s tier, entered at 500 ms by the 6th request, for
    // 5 s; then 10 s of cooldown at 5/s (phases as at each tick's end).
    assert_eq!(&phases[..5], &[(2, PhaseName::Active); 5]);
    assert_eq!(&phases[5..], &[(1, PhaseName::Cooldown); 3]);
    let grants: Vec<u64> = timeline.ticks.iter().map(|tick| tick.granted).collect();
    assert_eq!(grants, [10, 10, 10, 10, 10, 10, 4, 4]);
}

fn charon(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("simulate")
        .args(args)
        .output()
        .expect("charon runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_cli_prints_text_and_json() {
    let penalty = cookbook("penalty.yaml");
    let (ok, text, _) = charon(&["--config", &penalty, "--pattern", "10/s for 3s"]);
    assert!(ok);
    assert!(
        text.starts_with("resource api for domain tenant: 30 granted, 0 rejected"),
        "{text}"
    );
    assert!(
        text.contains("tier 2: 20 per 1s, active 5s, cooldown 10s"),
        "{text}"
    );

    let (ok, json, _) = charon(&["--config", &penalty, "--pattern", "10/s for 3s", "--json"]);
    assert!(ok);
    let timeline: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(timeline["granted"], 30);
    assert_eq!(timeline["ticks"].as_array().unwrap().len(), 3);
    assert_eq!(timeline["ticks"][0]["tier"], 2);
    assert_eq!(timeline["ticks"][0]["tiers"][1]["phase"], "active");
    assert_eq!(timeline["tiers"][1]["active_ms"], 5_000);

    // Inline limits, with a soft limit.
    let (ok, json, _) = charon(&[
        "--rate",
        "{soft_limit: 3, tiers: [{limit: 5, window: 1s}]}",
        "--pattern",
        "burst 10",
        "--json",
    ]);
    assert!(ok);
    let timeline: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (timeline["granted"].as_u64(), timeline["warned"].as_u64()),
        (Some(5), Some(2))
    );
}

#[test]
fn nonsense_and_oversized_input_get_a_clear_message() {
    let bulkhead = cookbook("copies-bulkhead.yaml");
    for (args, expected) in [
        (
            vec![
                "--rate",
                "{tiers: [{limit: -5, window: 1s}]}",
                "--pattern",
                "burst 1",
            ],
            "limit must be between",
        ),
        (
            vec![
                "--rate",
                "{tiers: [{limit: 5, window: 0s}]}",
                "--pattern",
                "burst 1",
            ],
            "window must be longer",
        ),
        (
            vec![
                "--rate",
                "{tiers: [{limit: 5, window: 1s}]}",
                "--pattern",
                "10000000/s for 1s",
            ],
            "more than 1000000 requests",
        ),
        (
            vec![
                "--rate",
                "{tiers: [{limit: 5, window: 1s}]}",
                "--pattern",
                "pause 7d",
                "--tick",
                "1ms",
            ],
            "choose a longer tick",
        ),
        (
            vec![
                "--rate",
                "{tiers: [{limit: 5, window: 1s}]}",
                "--pattern",
                "often",
            ],
            "cannot read",
        ),
        (
            vec![
                "--rate",
                "{tiers: [{limit: 5, window: 1s}]}",
                "--pattern",
                "burst 1",
                "--tick",
                "0s",
            ],
            "longer than 0ms",
        ),
        (
            vec!["--config", &bulkhead, "--pattern", "burst 1"],
            "no rate-limited resource",
        ),
        (
            vec![
                "--config",
                &bulkhead,
                "--resource",
                "transcoder",
                "--pattern",
                "burst 1",
            ],
            "copy-limited",
        ),
        (
            vec![
                "--config",
                &bulkhead,
                "--resource",
                "nope",
                "--pattern",
                "burst 1",
            ],
            "no resource `nope`",
        ),
    ] {
        let (ok, _, stderr) = charon(&args);
        assert!(!ok, "{args:?}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_pattern_of_a_whole_week_is_simulated_to_its_last_tick() {
    let rate = simulate::resolve(Source::Inline("{tiers: [{limit: 5, window: 1s}]}")).unwrap();
    // The span is a week and 1 ms: the last tick ends past the week.
    let pattern = simulate::parse_pattern("pause 7d, burst 1").unwrap();
    let timeline = simulate::simulate(&rate, "acme", &pattern, 3_600_000).unwrap();
    assert_eq!(timeline.ticks.len(), 7 * 24 + 1);
    assert_eq!(timeline.ticks.last().unwrap().granted, 1);
    // A tick longer than the pattern is one tick.
    let timeline = simulate::simulate(&rate, "acme", &pattern, 14 * 86_400_000).unwrap();
    assert_eq!((timeline.ticks.len(), timeline.granted), (1, 1));
}

/// `charon simulate --capacity`: clients joining and leaving a leased
/// capacity, per tick, through the real engine: shares converge to max-min
/// fair and never sum past the capacity.
#[test]
fn simulate_shows_leases_converging_to_fair_shares() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_charon"))
        .args([
            "simulate",
            "--capacity",
            "{capacity: 100, algorithm: fair_share, lease: 10s, refresh_interval: 2s, learning: 0s}",
            "--clients",
            "a: 100; b: 30 from 5s; c: 100 from 10s until 20s",
            "--duration",
            "24s",
            "--tick",
            "2s",
            "--json",
        ])
        .output()
        .expect("charon simulate runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let timeline: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let ticks = timeline["ticks"].as_array().expect("ticks");
    let at = |ms: u64| {
        ticks
            .iter()
            .find(|tick| tick["at_ms"] == ms)
            .map(|tick| tick["leases"].clone())
            .expect("a tick")
    };
    assert_eq!(at(0), serde_json::json!([100.0, null, null]));
    assert_eq!(at(16_000), serde_json::json!([35.0, 30.0, 35.0]));
    assert_eq!(at(24_000), serde_json::json!([70.0, 30.0, null]));
    for tick in ticks {
        assert!(
            tick["total"].as_f64().expect("a total") <= 100.0 + 1e-9,
            "{tick}"
        );
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_charon"))
        .args([
            "simulate",
            "--capacity",
            "{capacity: 100}",
            "--clients",
            "a 100",
        ])
        .output()
        .expect("charon simulate runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("name: WANTS"));
}
