//! Other algorithms than burst tiers on a resource's `rate:`: `hybrid`,
//! `sliding_window`, `sliding_log` (and a ban in cloud_armor mode, in the
//! cookbook), per domain, answered as tier 1 on Envoy's face and the
//! Charon API's alike; a domain with its own tiers keeps them; and what
//! may not stand beside them is refused at load.

use charon::clock::ManualClock;
use charon::config::{self, Resource};
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;

const START: u64 = 1_700_000_040_000;

fn limiter(rate: &str, clock: &ManualClock) -> Limiter<MemoryStore<ManualClock>> {
    let yaml = format!(
        "domain: api\ndescriptors:\n  - key: tenant\n    resource: calls\nresources:\n  calls:\n    rate: {rate}\n"
    );
    let config = config::load_str(&yaml, "api.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Limiter::new(config, MemoryStore::with_clock(clock.clone()))
}

/// Envoy's answer for one hit of `tenant`: (granted, remaining).
async fn envoy(limiter: &Limiter<MemoryStore<ManualClock>>, tenant: &str) -> (bool, u64) {
    let answer = limiter
        .should_rate_limit(RateLimitRequest::new(
            "api",
            vec![Descriptor::new([("tenant", tenant)])],
        ))
        .await
        .expect("decided");
    (!answer.over_limit, answer.statuses[0].remaining)
}

/// The Charon API's `request` of `hits`: granted hits and the exact wait.
async fn request(
    limiter: &Limiter<MemoryStore<ManualClock>>,
    tenant: &str,
    hits: u64,
) -> (u64, Option<u64>) {
    let config = limiter.config();
    let namespace = config.namespace("api").expect("api").clone();
    let Some(Resource::Rate(rate)) = namespace.resources.get("calls").cloned() else {
        panic!("a rate resource");
    };
    let (outcome, _) = limiter
        .request_hits(&namespace, &rate, tenant, hits, hits)
        .await
        .expect("decided");
    (outcome.granted, outcome.retry_after)
}

#[tokio::test]
async fn a_hybrid_resource_bursts_then_holds_an_even_rate_per_domain() {
    let clock = ManualClock::new(START);
    let limiter = limiter(
        "{hybrid: {quota: 4, window: 1m}, domains: {vip: {tiers: [{limit: 100, window: 1m}]}}}",
        &clock,
    );
    assert_eq!(envoy(&limiter, "acme").await, (true, 3));
    assert_eq!(
        request(&limiter, "acme", 3).await.0,
        3,
        "the rest of the quota at once"
    );
    let (granted, retry_after) = request(&limiter, "acme", 1).await;
    assert_eq!(
        (granted, retry_after),
        (0, Some(60_000)),
        "owes the rest of its minute"
    );
    assert!(!envoy(&limiter, "acme").await.0);
    clock.set(START + 60_000);
    assert!(envoy(&limiter, "acme").await.0);
    assert!(!envoy(&limiter, "acme").await.0, "then one every 15 s");
    // Another domain has its own key; vip keeps its tiers.
    assert_eq!(envoy(&limiter, "other").await, (true, 3));
    assert_eq!(envoy(&limiter, "vip").await, (true, 99));
}

#[tokio::test]
async fn sliding_resources_count_the_trailing_window() {
    let clock = ManualClock::new(START + 59_000);
    let counter = limiter("{sliding_window: {limit: 10, window: 1m}}", &clock);
    for _ in 0..10 {
        assert!(envoy(&counter, "acme").await.0);
    }
    clock.set(START + 75_000);
    // 15 s into the next minute the last one still weighs ⌊10 · 0.75⌋ = 7.
    assert_eq!(request(&counter, "acme", 4).await.0, 0);
    assert_eq!(request(&counter, "acme", 3).await.0, 3);

    let clock = ManualClock::new(START);
    let log = limiter(
        "{sliding_log: {limit: 3, window: 1s, count_rejected: true}}",
        &clock,
    );
    assert_eq!(request(&log, "acme", 3).await.0, 3);
    clock.set(START + 900);
    // Refused, and logged: the log keeps the newest 3 (two at 0, one now),
    // so one hit fits again when the two at 0 leave, at 1 001.
    assert_eq!(request(&log, "acme", 1).await, (0, Some(101)));
    clock.set(START + 1_001);
    assert_eq!(
        request(&log, "acme", 2).await.0,
        2,
        "the refusal at 900 still counts"
    );
    assert!(!envoy(&log, "acme").await.0);
}

#[test]
fn other_algorithms_stand_alone_and_are_checked() {
    let refused = |rate: &str, expected: &str| {
        let yaml = format!("domain: api\nresources:\n  calls:\n    rate: {rate}\n");
        let errors = config::load_str(&yaml, "api.yaml")
            .expect_err("refused")
            .to_string();
        assert!(errors.contains(expected), "{expected} in {errors}");
        assert!(errors.contains("api.yaml:4:"), "{errors}");
    };
    refused(
        "{hybrid: {quota: 4, window: 1m}, hard_limit: 5}",
        "`hybrid` stands alone",
    );
    refused(
        "{sliding_window: {limit: 4, window: 1m}, tiers: [{limit: 1, window: 1s}]}",
        "`sliding_window` stands alone",
    );
    refused(
        "{sliding_log: {limit: 4, window: 1m}, hybrid: {quota: 4, window: 1m}}",
        "stands alone",
    );
    refused(
        "{sliding_log: {limit: 20000, window: 1h}}",
        "at most 10000 hits",
    );
    refused(
        "{hybrid: {quota: 1000000000, window: 365d}}",
        "must stay below 2^53",
    );
    refused(
        "{hybrid: {quota: 4, window: 0s}}",
        "window must be longer than 0s",
    );
    refused(
        "{sliding_window: {limit: 4, window: 1m, count_rejected: true}}",
        "`count_rejected` applies to sliding_log",
    );
}

/// A resource's `budget`: Envoy's check (0 hits) and charge through a
/// descriptor naming it, per domain; reservations through the same
/// descriptor; the Charon API's `request` told to use those instead.
#[tokio::test]
async fn a_budget_on_a_resource_checks_charges_and_reserves_per_domain() {
    use charon::engine::CostOp;
    use charon::limiter::CostRequest;
    let clock = ManualClock::new(START);
    let limiter = limiter(
        "{budget: {limit: 1000, window: 1h, initial_cost: 100, max_charge: 900}}",
        &clock,
    );
    let call = |tenant: &str, hits: u64| {
        let mut request = RateLimitRequest::new("api", vec![Descriptor::new([("tenant", tenant)])]);
        request.hits_addend = hits;
        request
    };
    let check = limiter
        .should_rate_limit(call("acme", 0))
        .await
        .expect("decided");
    assert!(!check.over_limit);
    let charge = limiter
        .should_rate_limit(call("acme", 800))
        .await
        .expect("decided");
    assert!(!charge.over_limit, "a charge is a fact");
    // 800 charged: one more request predicted at 800 plus its deviation.
    let check = limiter
        .should_rate_limit(call("acme", 0))
        .await
        .expect("decided");
    assert!(check.over_limit);
    assert!(
        !limiter
            .should_rate_limit(call("other", 0))
            .await
            .expect("decided")
            .over_limit
    );
    let too_big = limiter.should_rate_limit(call("other", 901)).await;
    assert!(too_big.is_err(), "past max_charge");
    // A reservation on globex's budget, committed below its estimate.
    let reserve = |op| CostRequest {
        domain: "api".into(),
        descriptors: vec![Descriptor::new([("tenant", "globex")])],
        op,
    };
    let held = limiter
        .cost(reserve(CostOp::Reserve {
            id: 7,
            amount: 900,
            ttl: 60_000,
            charge_on_expiry: true,
        }))
        .await
        .expect("decided");
    assert!(held.applied);
    assert_eq!(held.statuses[0].remaining, 100);
    let more = limiter
        .cost(reserve(CostOp::Reserve {
            id: 8,
            amount: 200,
            ttl: 60_000,
            charge_on_expiry: true,
        }))
        .await
        .expect("decided");
    assert!(!more.applied);
    let committed = limiter
        .cost(reserve(CostOp::Commit { id: 7, actual: 300 }))
        .await
        .expect("decided");
    assert!(committed.applied);
    assert_eq!(committed.statuses[0].remaining, 700);

    let client = charon::client::Client::embedded(limiter.config().as_ref().clone());
    match client.request("api", "calls", "acme").await {
        Err(charon::client::ClientError::Refused { kind, message }) => {
            assert_eq!(kind, charon::client::ErrorKind::WrongKind);
            assert!(message.contains("use Cost"), "{message}");
        }
        other => panic!("refused as the wrong kind, not {other:?}"),
    }
}
