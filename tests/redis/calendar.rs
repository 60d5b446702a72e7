//! Calendar windows on Redis (docs/design.md#calendar-windows): sidecars
//! whose clocks differ by 30 s, on one Redis (and one Cluster), see a
//! tenant's calendar month roll over once, at the store's boundary, and
//! its key expire when the month ends.

use std::sync::Arc;
use std::time::Duration;

use charon::clock::ManualClock;
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::{RedisOptions, RedisStore};

use crate::support::redis::{RedisCluster, RedisServer};

const CONFIG: &str = "
domain: billing
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 3, calendar: {time_zone: UTC}}
";

/// 1 February 2025, 00:00 UTC: the month's boundary.
const BOUNDARY: u64 = 1_738_368_000_000;
const SKEW: u64 = 15_000;

/// A sidecar: its own clock `ahead` of the store's or behind it, deciding
/// on Redis at the store's clock.
fn sidecar(url: &str, store: &ManualClock, own: &ManualClock) -> Limiter<RedisStore> {
    let config = charon::config::load_str(CONFIG, "billing.yaml")
        .map(|loaded| loaded.config)
        .unwrap_or_else(|errors| panic!("{errors}"));
    let options = RedisOptions {
        timeout: Duration::from_secs(5),
        local_rejections: false,
        injected_clock: Some(Arc::new(store.clone())),
        local_clock: Some(Arc::new(own.clone())),
        ..RedisOptions::default()
    };
    Limiter::new(config, RedisStore::open(url, options).expect("a valid URL"))
}

async fn granted(sidecar: &Limiter<RedisStore>) -> bool {
    let request = RateLimitRequest::new("billing", vec![Descriptor::new([("tenant", "acme")])]);
    let answer = sidecar
        .should_rate_limit(request)
        .await
        .expect("Redis answers");
    !answer.over_limit
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// Sets the store's clock, the late sidecar's 15 s behind, the early one's
/// 15 s ahead.
fn at(store: &ManualClock, late: &ManualClock, early: &ManualClock, now: u64) {
    store.set(now);
    late.set(now - SKEW);
    early.set(now + SKEW);
}

async fn the_month_rolls_over_once_at_the_stores_boundary(url: &str) {
    let (store, late, early) = (
        ManualClock::new(0),
        ManualClock::new(0),
        ManualClock::new(0),
    );
    let a = sidecar(url, &store, &late);
    let b = sidecar(url, &store, &early);
    // 10 s before the boundary: b's clock says February already; the
    // store's says January, and January it is for both.
    at(&store, &late, &early, BOUNDARY - 10_000);
    assert!(granted(&a).await && granted(&b).await && granted(&a).await);
    assert!(!granted(&b).await, "b counts in the store's January, full");
    assert!(!granted(&a).await);
    // 10 s after: a's clock still says January; the store's February has
    // room, for both, once.
    at(&store, &late, &early, BOUNDARY + 10_000);
    assert!(granted(&a).await, "a counts in the store's February");
    assert!(granted(&b).await && granted(&a).await);
    assert!(!granted(&a).await && !granted(&b).await);
    // The last millisecond of February is still February.
    let march = BOUNDARY + 28 * 86_400_000;
    at(&store, &late, &early, march - 1);
    assert!(!granted(&b).await);
    at(&store, &late, &early, march);
    assert!(granted(&a).await);
}

#[test]
fn sidecars_30_seconds_apart_roll_a_calendar_month_over_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    runtime().block_on(the_month_rolls_over_once_at_the_stores_boundary(&url));
    // The key expires when its month ends (plus the day of slack given to
    // keys under an injected clock), not a nominal 30 days on.
    let keys = redis.command(&["KEYS", "*"]);
    let key = keys
        .lines()
        .find(|key| key.contains("acme"))
        .unwrap_or_else(|| panic!("the tenant's key among {keys:?}"))
        .to_owned();
    let ttl: u64 = redis
        .command(&["PTTL", &key])
        .trim()
        .parse()
        .expect("a TTL");
    let to_april = 31 * 86_400_000 + 86_400_000;
    assert!(ttl <= to_april && ttl > to_april - 60_000, "{ttl} ms");
}

#[test]
fn a_cluster_rolls_a_calendar_month_over_as_one_redis_does() {
    let cluster = RedisCluster::start(3);
    let url = cluster.url();
    runtime().block_on(the_month_rolls_over_once_at_the_stores_boundary(&url));
}
