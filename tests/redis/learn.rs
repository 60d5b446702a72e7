//! Learning a limit on Redis (docs/design.md#learning-a-limit): two
//! sidecars of one `redis-server` (and of one Cluster) take traffic at
//! known rates per domain through the Charon API, and the proposal asked
//! of one of them (`/debug/learned`) is the fleet's: within 5 % of those
//! rates, as a namespace file `charon check` accepts.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::client::Client;
use support::redis::{RedisCluster, RedisServer};
use support::sidecar::{Sidecar, tempdir, write_config};

use super::cost_reservations::client_of;

const CONFIG: &str = "domain: shop
settings:
  allow_unconfigured: true
  learn: {window: 2s, windows: 30, domains: 10}
";

/// Each sidecar's rates: `acme` 50 a second, `globex` 10; so the fleet's
/// per 2-s window are 200 and 40.
const TICK: Duration = Duration::from_millis(20);
const TICKS: u32 = 800;

async fn traffic(client: Client) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for tick in 0..TICKS {
        ticks.tick().await;
        let mut domains = vec!["acme"];
        if tick % 5 == 0 {
            domains.push("globex");
        }
        for domain in domains {
            let answer = client
                .request("shop", "search", domain)
                .await
                .expect("an unconfigured resource is granted");
            assert_eq!(answer.granted, 1);
        }
    }
}

/// The limit the proposal sets for `domain` (`"acme": {tiers: [{limit: N,`).
fn proposed(text: &str, domain: &str) -> u64 {
    let line = text
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("\"{domain}\":")))
        .unwrap_or_else(|| panic!("no {domain} in:\n{text}"));
    line.split("limit: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|limit| limit.parse().ok())
        .unwrap_or_else(|| panic!("no limit in {line}"))
}

fn within_5_percent(found: u64, expected: u64) -> bool {
    found.abs_diff(expected) * 20 <= expected
}

async fn the_fleet_learns_its_rates(url: &str) {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|_| Sidecar::start(dir.path(), &config, url, &["--store-timeout", "2s"]))
        .collect();
    let a = client_of(&sidecars[0]).await;
    let b = client_of(&sidecars[1]).await;
    tokio::join!(traffic(a), traffic(b));
    // Both sidecars write what they added up within a second.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let response = reqwest::get(sidecars[0].admin_url("/debug/learned?namespace=shop&pick=p50"))
        .await
        .expect("the admin port answers");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("a body");
    let (acme, globex) = (proposed(&text, "acme"), proposed(&text, "globex"));
    if std::env::var_os("CHARON_SHOW_PROPOSAL").is_some() {
        eprintln!("{text}");
    }
    assert!(
        within_5_percent(acme, 200) && within_5_percent(globex, 40),
        "acme {acme} (200), globex {globex} (40):\n{text}\n{}",
        sidecars[0].log()
    );
    let file = dir.path().join("proposal.yaml");
    std::fs::write(&file, &text).expect("writable");
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("check")
        .arg(&file)
        .output()
        .expect("charon check runs");
    assert!(
        check.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_of_one_redis_propose_the_fleets_rates() {
    let redis = RedisServer::start();
    the_fleet_learns_its_rates(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_of_one_cluster_propose_the_fleets_rates() {
    let cluster = RedisCluster::start(3);
    the_fleet_learns_its_rates(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_that_does_not_learn_says_so() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), "domain: plain\n");
    let sidecar = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    sidecar.wait_serving().await;
    for (query, status, says) in [
        ("namespace=plain", 409, "settings.learn"),
        ("namespace=nowhere", 404, "not configured"),
        ("namespace=plain&pick=p90", 400, "peak, p99, p95 or p50"),
    ] {
        let response = reqwest::get(sidecar.admin_url(&format!("/debug/learned?{query}")))
            .await
            .expect("the admin port answers");
        assert_eq!(response.status().as_u16(), status, "{query}");
        let body = response.text().await.expect("a body");
        assert!(body.contains(says), "{query}: {body}");
    }
}

const EDGE: &str = "domain: edge
settings:
  learn: {window: 2s, windows: 30, domains: 10}
descriptors:
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
";

/// Envoy's `ShouldRateLimit` as upstream's `/json` takes it.
async fn from_address(http: &reqwest::Client, sidecar: &Sidecar, address: &str) {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{address}"}}]}}]}}"#
    );
    let response = http
        .post(sidecar.admin_url("/json"))
        .body(body)
        .send()
        .await
        .expect("/json answers");
    assert_eq!(response.status(), 200, "shadow mode refuses nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_mode_limit_is_proposed_per_address_from_the_fleet() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), EDGE);
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|_| {
            Sidecar::start(
                dir.path(),
                &config,
                &redis.url(),
                &["--store-timeout", "2s"],
            )
        })
        .collect();
    for sidecar in &sidecars {
        sidecar.wait_serving().await;
    }
    let http = reqwest::Client::new();
    // Each sidecar: 10.0.0.1 at 25 a second, 10.0.0.2 at 5; per 2-s window
    // the fleet's are 100 and 20.
    let traffic = async |sidecar: &Sidecar| {
        let mut ticks = tokio::time::interval(Duration::from_millis(40));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        for tick in 0..400u32 {
            ticks.tick().await;
            from_address(&http, sidecar, "10.0.0.1").await;
            if tick % 5 == 0 {
                from_address(&http, sidecar, "10.0.0.2").await;
            }
        }
    };
    tokio::join!(traffic(&sidecars[0]), traffic(&sidecars[1]));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let text = reqwest::get(sidecars[1].admin_url("/debug/learned?namespace=edge&pick=p50"))
        .await
        .expect("the admin port answers")
        .text()
        .await
        .expect("a body");
    let limit_of = |address: &str| -> u64 {
        let at = text
            .find(&format!("value: \"{address}\""))
            .unwrap_or_else(|| panic!("no {address} in:\n{text}"));
        text[at..]
            .split("requests_per_unit: ")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .and_then(|limit| limit.parse().ok())
            .unwrap_or_else(|| panic!("no limit for {address} in:\n{text}"))
    };
    let (first, second) = (limit_of("10.0.0.1"), limit_of("10.0.0.2"));
    assert!(
        within_5_percent(first, 100) && within_5_percent(second, 20),
        "10.0.0.1 {first} (100), 10.0.0.2 {second} (20):\n{text}"
    );
    assert!(text.contains("unit: second, unit_multiplier: 2"), "{text}");
    charon::config::load_str(&text, "proposal.yaml")
        .unwrap_or_else(|errors| panic!("{errors}\n{text}"));
}

/// Past the bound, on Redis: 20 000 domains once each around two heavy
/// ones, in each of three windows. Each window keeps 10 domains, the two
/// heavy ones among them, each over its true count by at most what it
/// inherited when it came into a full table (a few hits of 1), and Redis
/// holds one key per window however many domains came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_redis_keeps_the_heaviest_and_no_more() {
    use charon::clock::ManualClock;
    use charon::config::Learn;
    use charon::config::learned::Subject;
    use charon::store::learn::LearnLog;
    use charon::store::{RedisLearn, RedisOptions, RedisStore};
    use std::sync::Arc;

    let redis = RedisServer::start();
    let clock = ManualClock::new(1_000_000);
    let options = RedisOptions {
        timeout: Duration::from_secs(5),
        injected_clock: Some(Arc::new(clock.clone())),
        ..RedisOptions::default()
    };
    let log = RedisLearn::on(RedisStore::open(&redis.url(), options).expect("a valid URL"));
    let learn = Learn {
        window_ms: 10_000,
        windows: 6,
        domains: 10,
    };
    let subject = Subject::Resource("search".into()).encode();
    let mut keys_after = Vec::new();
    for window in 0..3u64 {
        clock.set(1_000_000 + window * 10_000);
        for round in 0..20_000u64 {
            log.record("shop", &subject, &format!("once-{round}"), 1, &learn);
            if round % 100 == 0 {
                log.record("shop", &subject, "heavy", 30, &learn);
                log.record("shop", &subject, "second", 20, &learn);
            }
        }
        // A proposal writes what was added up first.
        let (recorded, _) = log.recorded("shop", &learn).await.expect("Redis answers");
        assert_eq!(recorded.len(), 1);
        keys_after.push(redis.command(&["DBSIZE"]).trim().to_owned());
    }
    clock.set(1_030_000);
    let (recorded, _) = log.recorded("shop", &learn).await.expect("Redis answers");
    let windows = &recorded[0].windows;
    assert_eq!(windows.len(), 3, "{windows:?}");
    for window in windows {
        assert_eq!(window.domains.len(), 10, "{window:?}");
        let count = |domain: &str| {
            window
                .domains
                .iter()
                .find(|(name, _)| name == domain)
                .map(|(_, hits)| *hits)
        };
        for (domain, hits) in [("heavy", 6_000), ("second", 4_000)] {
            let counted = count(domain).unwrap_or_else(|| panic!("no {domain}: {window:?}"));
            assert!(
                (hits..=hits + hits / 100).contains(&counted),
                "{domain}: {counted} for {hits}"
            );
        }
    }
    // One more key per window (beside the store's own and the subjects'
    // set): nothing per domain.
    let keys: Vec<u64> = keys_after
        .iter()
        .map(|keys| keys.parse().expect("DBSIZE is a count"))
        .collect();
    assert_eq!([keys[1] - keys[0], keys[2] - keys[1]], [1, 1], "{keys:?}");
}
