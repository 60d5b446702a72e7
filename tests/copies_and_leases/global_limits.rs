//! Global limits (docs/design.md#global-limits), as real processes on the
//! memory store: a root holding a descriptor limit of 100 a second marked
//! `global`, and two leaves under it (`--parent`) that answer Envoy's
//! `ShouldRateLimit` each on its own, against its share. The shares follow
//! the leaves' demand, and in no second do the two admit more than 100.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::global_edges::load_answered;
use crate::support::redis::RedisServer;
use crate::support::sidecar::{Sidecar, tempdir, write_config};

const LIMITS: &str = "
domain: api
descriptors:
  - key: route
    value: search
    rate_limit: {unit: second, requests_per_unit: 100, global: true}
";

fn start(dir: &std::path::Path, name: &str, extra: &[&str]) -> Sidecar {
    start_on(dir, name, "memory", extra)
}

fn start_on(dir: &std::path::Path, name: &str, store: &str, extra: &[&str]) -> Sidecar {
    let own = dir.join(name);
    std::fs::create_dir_all(&own).expect("a directory per server");
    let config = write_config(&own, LIMITS);
    Sidecar::start(&own, &config, store, extra)
}

/// Admitted requests by the second (since the epoch) they were answered in.
type Admitted = Arc<Mutex<BTreeMap<u64, u64>>>;

/// Sends `rate` requests a second (0: none) to `sidecar` until the test
/// ends, counting what is admitted.
fn load(sidecar: &Sidecar, rate: Arc<AtomicU64>, admitted: Admitted) {
    load_answered(sidecar.grpc_url(), rate, move |granted| {
        if granted {
            *admitted
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .entry(now_second())
                .or_default() += 1;
        }
    });
}

fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs())
}

/// What each leaf admitted in each whole second of `from..to`.
fn seconds(a: &Admitted, b: &Admitted, from: u64, to: u64) -> Vec<(u64, u64)> {
    let a = a.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let b = b.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    (from..to)
        .map(|second| {
            (
                a.get(&second).copied().unwrap_or(0),
                b.get(&second).copied().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leaves_share_one_global_limit_by_their_demand() {
    let dir = tempdir();
    let root = start(dir.path(), "root", &[]);
    root.wait_serving().await;
    // A logs a hundredth of its decisions, and every move of its share.
    let leaf_a = start(
        dir.path(),
        "leaf-a",
        &[
            "--parent",
            &root.grpc_url(),
            "--level-id",
            "leaf-a",
            "--log-format",
            "json",
            "--decision-log-sample",
            "0.01",
        ],
    );
    let leaf_b = start(
        dir.path(),
        "leaf-b",
        &["--parent", &root.grpc_url(), "--level-id", "leaf-b"],
    );
    leaf_a.wait_serving().await;
    leaf_b.wait_serving().await;

    let (rate_a, rate_b) = (Arc::new(AtomicU64::new(150)), Arc::new(AtomicU64::new(30)));
    let (admitted_a, admitted_b): (Admitted, Admitted) = Default::default();
    let began = now_second();
    load(&leaf_a, rate_a.clone(), admitted_a.clone());
    load(&leaf_b, rate_b.clone(), admitted_b.clone());

    // A wants 150 a second, B 30: B gets what it asks for (the peak of its
    // demand and 5 % more), A the rest.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let uneven = now_second();
    let last = seconds(&admitted_a, &admitted_b, uneven - 3, uneven);
    eprintln!("A 150/s, B 30/s: {last:?}");
    for &(a, b) in &last {
        assert!(b >= 25, "B is refused though it asks for little: {last:?}");
        assert!((55..=75).contains(&a), "A does not get the rest: {last:?}");
    }

    // B's demand grows to A's: the limit is split evenly. A share moves a
    // level per refresh interval (500 ms), and what A admitted under its
    // larger share counts until that window ends: 1 to 3 s.
    rate_b.store(150, Ordering::Relaxed);
    let shifted = now_second() + 1;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let even = now_second();
    let last = seconds(&admitted_a, &admitted_b, even - 3, even);
    let settled = seconds(&admitted_a, &admitted_b, shifted, even)
        .iter()
        .position(|&(a, b)| a >= 45 && b >= 45);
    eprintln!("both 150/s: {last:?}, even {settled:?} s after the shift");
    for &(a, b) in &last {
        assert!((40..=60).contains(&a) && (40..=60).contains(&b), "{last:?}");
    }
    // Each leaf says its share.
    let share = "charon_global_limit_share{namespace=\"api\",resource=\"rate_limit:route_search\"}";
    for leaf in [&leaf_a, &leaf_b] {
        let share = leaf.metric(share).await;
        assert!((45.0..=55.0).contains(&share), "a share of {share}");
    }

    // In no second, not even while the shares moved, did the two admit
    // more than the global 100 (2 for requests answered just after the
    // second they were admitted in).
    let all = seconds(&admitted_a, &admitted_b, began, even);
    eprintln!("every second: {all:?}");
    for &(a, b) in &all {
        assert!(a + b <= 102, "{} admitted in one second: {all:?}", a + b);
    }
    rate_a.store(0, Ordering::Relaxed);
    rate_b.store(0, Ordering::Relaxed);

    // A's share moves are in its decision log, each with its new size.
    let moves: Vec<serde_json::Value> = leaf_a
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["target"] == "charon::decision")
        .map(|event| event["fields"].clone())
        .filter(|fields| fields["face"] == "global")
        .collect();
    assert!(moves.len() >= 2, "{moves:?}");
    for moved in &moves {
        assert_eq!(moved["operation"], "share");
        assert_eq!(moved["namespace"], "api");
        assert_eq!(moved["resource"], "rate_limit:route_search");
        assert!(
            moved["amount"].as_u64().is_some_and(|share| share <= 100),
            "{moved}"
        );
    }
}

/// Two sidecars of one region on the region's Redis, with one
/// `--level-id`: one level to the root (their leases live in that Redis),
/// each with its own share of the level's grant and its own counter. Each
/// is offered more than the whole limit: together they admit the limit,
/// half each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecars_of_a_region_on_one_redis_share_its_grant() {
    let dir = tempdir();
    let redis = RedisServer::start();
    let root = start(dir.path(), "root", &[]);
    root.wait_serving().await;
    let level = ["--parent", &root.grpc_url(), "--level-id", "region-eu"];
    let a = start_on(dir.path(), "a", &redis.url(), &level);
    let b = start_on(dir.path(), "b", &redis.url(), &level);
    a.wait_serving().await;
    b.wait_serving().await;

    let (rate_a, rate_b) = (Arc::new(AtomicU64::new(150)), Arc::new(AtomicU64::new(150)));
    let (admitted_a, admitted_b): (Admitted, Admitted) = Default::default();
    let began = now_second();
    load(&a, rate_a.clone(), admitted_a.clone());
    load(&b, rate_b.clone(), admitted_b.clone());
    tokio::time::sleep(Duration::from_secs(8)).await;
    let end = now_second();
    let last = seconds(&admitted_a, &admitted_b, end - 3, end);
    let all = seconds(&admitted_a, &admitted_b, began, end);
    eprintln!("both 150/s on one Redis: {all:?}");
    for &(a, b) in &last {
        assert!((40..=60).contains(&a) && (40..=60).contains(&b), "{last:?}");
    }
    for &(a, b) in &all {
        assert!(a + b <= 102, "{} admitted in one second: {all:?}", a + b);
    }
    // Each counts on its own key, in the one Redis.
    let keys = redis.command(&["--scan", "--pattern", "*instance*"]);
    assert_eq!(keys.lines().count(), 2, "counters: {keys}");
    rate_a.store(0, Ordering::Relaxed);
    rate_b.store(0, Ordering::Relaxed);
}

/// `--global-refresh-interval` and `--global-lease` set what a server
/// answers its children for a global limit's share; values that cannot
/// work stop it at start with a clear error.
#[tokio::test]
async fn the_refresh_interval_and_lease_of_shares_are_set_per_server() {
    use charon::api::v1::capacity_answer::Result as Answered;
    use charon::api::v1::charon_client::CharonClient;
    use charon::api::v1::{CapacityWant, GetCapacityRequest};

    let dir = tempdir();
    let root = start(
        dir.path(),
        "root",
        &["--global-refresh-interval", "200ms", "--global-lease", "2s"],
    );
    root.wait_serving().await;
    let mut client = CharonClient::connect(root.grpc_url())
        .await
        .expect("the root answers");
    let ask = GetCapacityRequest {
        client_id: "region-a".into(),
        resources: vec![CapacityWant {
            namespace: "api".into(),
            resource: "rate_limit:route_search".into(),
            domain: "global".into(),
            wants: 40.0,
            has: 0.0,
            held_below: Some(0.0),
        }],
    };
    // (capacity, refresh interval) of each answer until the lease settles.
    let mut answers = vec![];
    let began = std::time::Instant::now();
    while began.elapsed() < Duration::from_secs(10) {
        let answer = client
            .get_capacity(ask.clone())
            .await
            .expect("GetCapacity answers")
            .into_inner();
        let Some(Answered::Lease(lease)) = answer.answers.first().and_then(|a| a.result.clone())
        else {
            panic!("no lease: {answer:?}");
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |now| now.as_millis() as u64);
        assert!(
            lease.expiry_ms > now + 1_500 && lease.expiry_ms <= now + 2_100,
            "a 2-s lease: {} at {now}",
            lease.expiry_ms
        );
        answers.push((lease.capacity, lease.refresh_interval_ms));
        if lease.refresh_interval_ms == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new lease moves (the root gives back what it kept for itself) and
    // is answered with a fifth of the interval; once it holds its share,
    // the interval. Its share is the whole 100: the 40 it asked for and
    // the 60 nobody wants, lent.
    assert_eq!(
        answers.first().map(|&(_, interval)| interval),
        Some(40),
        "{answers:?}"
    );
    assert_eq!(answers.last(), Some(&(100.0, 200)), "{answers:?}");

    for (flags, error) in [
        (["--global-refresh-interval", "50ms"], "at least 100ms"),
        (
            ["--global-lease", "600ms"],
            "at least twice its refresh interval",
        ),
    ] {
        let mut refused = start(dir.path(), "refused", &flags);
        let began = std::time::Instant::now();
        while refused.is_alive() && began.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!refused.is_alive(), "{flags:?}: it kept running");
        assert!(refused.log().contains(error), "{}", refused.log());
    }
}
