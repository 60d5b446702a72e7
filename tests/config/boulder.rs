//! Boulder's rate limit files loaded as a namespace (a `format: boulder`
//! marker naming them): defaults become GCRA limits per limit name,
//! overrides per canonical id beside them; bad ids are refused naming the
//! key, with the file and line; and the README's walkthrough holds.

use std::path::{Path, PathBuf};

use charon::clock::ManualClock;
use charon::config::{self, load_path};
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/boulder")
}

/// A marker and Boulder files written to a fresh directory.
fn written(defaults: &str, overrides: Option<&str>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut marker = String::from("domain: ca\nformat: boulder\ndefaults: defaults.yaml\n");
    std::fs::create_dir(dir.path().join("limits")).expect("a directory");
    std::fs::write(dir.path().join("defaults.yaml"), defaults).expect("written");
    if let Some(overrides) = overrides {
        marker.push_str("overrides: overrides.yaml\n");
        std::fs::write(dir.path().join("overrides.yaml"), overrides).expect("written");
    }
    let path = dir.path().join("ca.yaml");
    std::fs::write(&path, marker).expect("written");
    (dir, path)
}

async fn ask(limiter: &Limiter<MemoryStore<ManualClock>>, name: &str, id: &str) -> (bool, u64) {
    let answer = limiter
        .should_rate_limit(RateLimitRequest::new(
            "acme-ca",
            vec![Descriptor::new([(name, id)])],
        ))
        .await
        .expect("decided");
    (!answer.over_limit, answer.statuses[0].remaining)
}

/// The README's walkthrough: 20 a second, bursts of 20, at one address.
#[tokio::test]
async fn boulders_walkthrough_holds() {
    let loaded = load_path(&fixture()).unwrap_or_else(|errors| panic!("{errors}"));
    let start = 1_700_000_000_000;
    let clock = ManualClock::new(start);
    let limiter = Limiter::new(loaded.config, MemoryStore::with_clock(clock.clone()));
    let ip = "172.23.45.22";
    // The first request leaves 19 tokens.
    assert_eq!(
        ask(&limiter, "NewRegistrationsPerIPAddress", ip).await,
        (true, 19)
    );
    // 5 ms later another; then 18 more within the next 44 ms ...
    clock.set(start + 5);
    assert!(ask(&limiter, "NewRegistrationsPerIPAddress", ip).await.0);
    for ms in 0..18 {
        clock.set(start + 6 + ms * 2);
        assert!(
            ask(&limiter, "NewRegistrationsPerIPAddress", ip).await.0,
            "+{ms}"
        );
    }
    // ... so the next one within 50 ms of the first is refused,
    clock.set(start + 49);
    assert!(!ask(&limiter, "NewRegistrationsPerIPAddress", ip).await.0);
    // and then one every 50 ms.
    for slot in 1..=10u64 {
        clock.set(start + 50 * slot);
        assert!(
            ask(&limiter, "NewRegistrationsPerIPAddress", ip).await.0,
            "slot {slot}"
        );
        assert!(
            !ask(&limiter, "NewRegistrationsPerIPAddress", ip).await.0,
            "slot {slot}"
        );
    }
    // Another address has the default's bucket; 10.0.0.2's override doubles
    // the rate, not the burst.
    assert_eq!(
        ask(&limiter, "NewRegistrationsPerIPAddress", "10.0.0.9").await,
        (true, 19)
    );
    assert_eq!(
        ask(&limiter, "NewRegistrationsPerIPAddress", "10.0.0.2").await,
        (true, 19)
    );
}

#[test]
fn overrides_are_keyed_by_canonical_ids() {
    let loaded = load_path(&fixture()).unwrap_or_else(|errors| panic!("{errors}"));
    let namespace = loaded.config.namespace("acme-ca").expect("the namespace");
    let text = format!("{namespace:?}");
    for canonical in ["2001:db8::/48", "\"12345678\"", "example.com,example.org"] {
        assert!(text.contains(canonical), "{canonical} in {text}");
    }
}

#[test]
fn the_list_format_of_overrides_loads_too() {
    let (_dir, path) = written(
        "NewOrdersPerAccount: {burst: 3, count: 3, period: 1h}\n",
        Some(
            "- NewOrdersPerAccount:\n    burst: 9\n    count: 9\n    period: 1h\n    ids:\n      - id: \"42\"\n        comment: a big customer\n      - id: \"43\"\n",
        ),
    );
    let loaded = load_path(&path).unwrap_or_else(|errors| panic!("{errors}"));
    let text = format!("{:?}", loaded.config.namespace("ca").expect("ca"));
    assert!(text.contains("\"42\"") && text.contains("\"43\""), "{text}");
}

#[test]
fn bad_files_are_refused_naming_the_key_and_line() {
    let cases = [
        (
            "NewRegistrationsPerIPAddress: {burst: 20, count: 20, period: 1s}\n",
            Some("NewRegistrationsPerIPAddress:10.0.0:\n  burst: 1\n  count: 1\n  period: 1s\n"),
            "overrides.yaml:2:",
            "override `NewRegistrationsPerIPAddress:10.0.0`: \"10.0.0\" is not an IP address",
        ),
        (
            "NewRegistrationsPerIPv6Range: {burst: 20, count: 20, period: 1s}\n",
            Some("NewRegistrationsPerIPv6Range:2001:db8::/56: {burst: 1, count: 1, period: 1s}\n"),
            "overrides.yaml:1:",
            "must be a /48",
        ),
        (
            "NewFoosPerIPAddress: {burst: 20, count: 20, period: 1s}\n",
            None,
            "defaults.yaml:1:",
            "unknown limit name `NewFoosPerIPAddress`",
        ),
        (
            "NewOrdersPerAccount: {burst: 0, count: 20, period: 1s}\n",
            None,
            "defaults.yaml:1:",
            "burst must be more than 0",
        ),
        (
            "NewOrdersPerAccount: {burst: 2, count: 20, period: 1500ms}\n",
            None,
            "defaults.yaml:1:",
            "not a whole number of seconds",
        ),
        (
            "NewOrdersPerAccount: {burst: 2, count: 20, period: 1s}\n",
            Some(
                "NewOrdersPerAccount:7: {burst: 1, count: 1, period: 1s}\nNewOrdersPerAccount:007: {burst: 1, count: 1, period: 1s}\n",
            ),
            "overrides.yaml:",
            "names the same bucket as",
        ),
        (
            "NewOrdersPerAccount: {burst: 2, count: 20, period: 1s, extra: 1}\n",
            None,
            "defaults.yaml:1:",
            "extra",
        ),
    ];
    for (defaults, overrides, at, message) in cases {
        let (_dir, path) = written(defaults, overrides);
        let errors = load_path(&path).expect_err("refused").to_string();
        assert!(errors.contains(at), "{at} in {errors}");
        assert!(errors.contains(message), "{message} in {errors}");
    }
}

#[test]
fn a_missing_boulder_file_is_named() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("ca.yaml");
    std::fs::write(
        &path,
        "domain: ca\nformat: boulder\ndefaults: nowhere.yaml\n",
    )
    .expect("written");
    let errors = load_path(&path).expect_err("refused").to_string();
    assert!(errors.contains("nowhere.yaml"), "{errors}");
    let unknown = dir.path().join("other.yaml");
    std::fs::write(
        &unknown,
        "domain: ca\nformat: boulder\ndefaults: d.yaml\nsurprise: 1\n",
    )
    .expect("written");
    let errors = config::load_path(&unknown)
        .expect_err("refused")
        .to_string();
    assert!(errors.contains("surprise"), "{errors}");
}
