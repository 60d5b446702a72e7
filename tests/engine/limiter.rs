//! Envoy RateLimitService semantics (docs/design.md#envoy-answers) at the
//! limiter, on the memory
//! store with a manual clock: matching, statuses, all-or-nothing, hits,
//! overrides, replaces, shadow mode, caps, and bounded memory.

use charon::clock::ManualClock;
use charon::config::{self, Unit};
use charon::limiter::{
    Descriptor, LimitError, LimitOverride, Limiter, RateLimitAnswer, RateLimitRequest, caps,
};
use charon::store::MemoryStore;

/// A minute boundary, so fixed windows start here.
const START: u64 = 1_700_000_040_000;

const CONFIG: &str = r#"
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    value: vip
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: "/api/*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 1}
  - key: office
    rate_limit: {unit: hour, requests_per_unit: 10, replaces: [{name: per_ip}]}
  - key: a_b
    descriptors:
      - key: c
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: b_c
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: customer
    resource: search
resources:
  search:
    rate:
      hard_limit: 4
      global_limit: 6
      tiers:
        - {limit: 2, window: 1s, active: forever, cooldown: 0s}
        - {limit: 3, window: 1s, active: 5s, cooldown: 15s}
"#;

struct Harness {
    limiter: Limiter<MemoryStore<ManualClock>>,
    clock: ManualClock,
}

impl Harness {
    fn new(yaml: &str) -> Self {
        let config = config::load_str(yaml, "shop.yaml")
            .expect("config loads")
            .config;
        let clock = ManualClock::new(START);
        Self {
            limiter: Limiter::new(config, MemoryStore::with_clock(clock.clone())),
            clock,
        }
    }

    async fn ask(&self, descriptors: Vec<Descriptor>) -> RateLimitAnswer {
        self.limiter
            .should_rate_limit(RateLimitRequest::new("shop", descriptors))
            .await
            .expect("answer")
    }

    async fn one(&self, key: &str, value: &str) -> RateLimitAnswer {
        self.ask(vec![d(key, value)]).await
    }
}

fn d(key: &str, value: &str) -> Descriptor {
    Descriptor::new([(key, value)])
}

#[tokio::test]
async fn fixed_window_statuses_follow_the_config() {
    let h = Harness::new(CONFIG);
    for remaining in [2, 1, 0] {
        let answer = h.one("tenant", "acme").await;
        assert!(!answer.over_limit);
        let status = &answer.statuses[0];
        let limit = status.limit.as_ref().expect("limited");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, Unit::Minute));
        assert_eq!(status.remaining, remaining);
        assert_eq!(status.reset_after_ms, Some(60_000));
    }
    h.clock.advance(15_000);
    let answer = h.one("tenant", "acme").await;
    assert!(answer.over_limit);
    // Over the limit: the exact time until the next hit passes (window end).
    assert_eq!(answer.statuses[0].reset_after_ms, Some(45_000));
    assert_eq!(answer.statuses[0].remaining, 0);
    // Exact value beats key-only.
    assert_eq!(h.one("tenant", "vip").await.statuses[0].remaining, 99);
    // The window is aligned to the epoch: a new minute, a new window.
    h.clock.advance(45_000);
    assert_eq!(h.one("tenant", "acme").await.statuses[0].remaining, 2);
}

#[tokio::test]
async fn unknown_namespace_and_unmatched_descriptors_are_not_limited() {
    let h = Harness::new(CONFIG);
    let answer = h
        .limiter
        .should_rate_limit(RateLimitRequest::new(
            "elsewhere",
            vec![d("tenant", "acme")],
        ))
        .await
        .expect("answer");
    assert!(!answer.over_limit && !answer.namespace_known);
    assert!(answer.statuses[0].limit.is_none());
    let answer = h
        .ask(vec![d("nothing", "here"), Descriptor::new([("org", "x")])])
        .await;
    assert!(
        answer
            .statuses
            .iter()
            .all(|s| s.limit.is_none() && !s.over_limit)
    );
}

#[tokio::test]
async fn statuses_come_back_in_request_order() {
    let h = Harness::new(CONFIG);
    let answer = h
        .ask(vec![
            d("nothing", "x"),
            d("tenant", "vip"),
            d("tenant", "acme"),
            d("free", "x"),
        ])
        .await;
    let limits: Vec<Option<u64>> = answer
        .statuses
        .iter()
        .map(|s| s.limit.as_ref().map(|l| l.requests_per_unit))
        .collect();
    assert_eq!(limits, vec![None, Some(100), Some(3), None]);
    assert_eq!(
        answer.statuses[3].remaining,
        u64::from(u32::MAX),
        "unlimited"
    );
}

#[tokio::test]
async fn a_rejected_request_consumes_nothing() {
    let h = Harness::new(CONFIG);
    for _ in 0..3 {
        h.one("tenant", "full").await;
    }
    // One descriptor over: the other's counter must not move.
    for _ in 0..5 {
        let answer = h.ask(vec![d("tenant", "fresh"), d("tenant", "full")]).await;
        assert!(answer.over_limit);
        assert!(!answer.statuses[0].over_limit);
        assert!(answer.statuses[1].over_limit);
    }
    assert_eq!(h.one("tenant", "fresh").await.statuses[0].remaining, 2);
    // Same for a burst-tier resource beside a full fixed window.
    for _ in 0..5 {
        assert!(
            h.ask(vec![d("customer", "c1"), d("tenant", "full")])
                .await
                .over_limit
        );
    }
    let answer = h.one("customer", "c1").await;
    let tiers = answer.statuses[0].tiers.expect("tiers");
    assert_eq!(
        (tiers.snapshot.tier, tiers.snapshot.tier_hits, tiers.burst),
        (1, 1, true)
    );
}

#[tokio::test]
async fn hits_addend_zero_means_one_and_per_descriptor_hits_override() {
    let h = Harness::new(CONFIG);
    let mut request = RateLimitRequest::new("shop", vec![d("tenant", "acme")]);
    request.hits_addend = 0;
    let answer = h.limiter.should_rate_limit(request).await.expect("answer");
    assert_eq!(answer.statuses[0].remaining, 2);
    let mut two = d("tenant", "acme");
    two.hits_addend = Some(2);
    assert_eq!(h.ask(vec![two.clone()]).await.statuses[0].remaining, 0);
    // Huge hits: over, and nothing recorded.
    let mut huge = d("tenant", "other");
    huge.hits_addend = Some(u64::from(u32::MAX));
    assert!(h.ask(vec![huge]).await.over_limit);
    let mut max = d("customer", "c2");
    max.hits_addend = Some(u64::MAX);
    assert!(h.ask(vec![max]).await.over_limit);
    assert_eq!(h.one("tenant", "other").await.statuses[0].remaining, 2);
}

#[tokio::test]
async fn check_only_is_over_when_the_next_hit_would_be_rejected() {
    let h = Harness::new(CONFIG);
    let mut check = d("tenant", "acme");
    check.hits_addend = Some(0);
    for _ in 0..3 {
        let answer = h.ask(vec![check.clone()]).await;
        assert!(!answer.over_limit);
        assert_eq!(answer.statuses[0].remaining, 3, "a check records nothing");
    }
    for _ in 0..3 {
        h.one("tenant", "acme").await;
    }
    assert!(h.ask(vec![check]).await.over_limit);
    // Same on a burst-tier resource.
    let mut check = d("customer", "c3");
    check.hits_addend = Some(0);
    assert!(!h.ask(vec![check.clone()]).await.over_limit);
    let answer = h.ask(vec![check]).await;
    assert_eq!(
        answer.statuses[0].tiers.expect("tiers").snapshot.tier,
        0,
        "nothing entered"
    );
}

#[tokio::test]
async fn per_descriptor_limit_override_wins() {
    let h = Harness::new(CONFIG);
    let mut overridden = d("tenant", "acme");
    overridden.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Second,
    });
    let status = &h.ask(vec![overridden.clone()]).await.statuses[0];
    let limit = status.limit.as_ref().expect("limited");
    assert_eq!((limit.requests_per_unit, limit.unit), (1, Unit::Second));
    assert!(h.ask(vec![overridden.clone()]).await.over_limit);
    // It works even where the config has no match.
    let mut unmatched = d("nothing", "x");
    unmatched.limit = overridden.limit;
    assert!(!h.ask(vec![unmatched.clone()]).await.over_limit);
    assert!(h.ask(vec![unmatched]).await.over_limit);
    // The configured counter was not touched.
    assert_eq!(h.one("tenant", "acme").await.statuses[0].remaining, 2);
}

#[tokio::test]
async fn replaces_removes_the_named_limit() {
    let h = Harness::new(CONFIG);
    assert!(!h.one("remote_address", "10.0.0.1").await.over_limit);
    assert!(h.one("remote_address", "10.0.0.1").await.over_limit);
    // Alongside `office`, whose limit replaces `per_ip`, the IP is not limited.
    let answer = h
        .ask(vec![d("remote_address", "10.0.0.1"), d("office", "hq")])
        .await;
    assert!(!answer.over_limit);
    assert!(answer.statuses[0].limit.is_none());
    assert_eq!(answer.statuses[1].remaining, 9);
}

#[tokio::test]
async fn shadow_mode_reports_ok_and_never_rejects() {
    let h = Harness::new(CONFIG);
    for _ in 0..3 {
        let answer = h.ask(vec![d("shadow", "x"), d("tenant", "acme")]).await;
        assert!(!answer.over_limit);
        assert!(!answer.statuses[0].over_limit);
        assert!(answer.statuses[0].limit.is_some());
    }
    // The other descriptor was counted each time.
    assert!(h.one("tenant", "acme").await.over_limit);
}

#[tokio::test]
async fn share_threshold_puts_every_matching_value_on_one_counter() {
    let h = Harness::new(CONFIG);
    assert!(!h.one("path", "/api/a").await.over_limit);
    assert!(!h.one("path", "/api/b").await.over_limit);
    assert!(h.one("path", "/api/c").await.over_limit);
}

#[tokio::test]
async fn keys_do_not_collide_on_separators() {
    let h = Harness::new(CONFIG);
    assert!(
        !h.ask(vec![Descriptor::new([("a_b", "x"), ("c", "y")])])
            .await
            .over_limit
    );
    assert!(
        !h.ask(vec![Descriptor::new([("a", "x"), ("b_c", "y")])])
            .await
            .over_limit
    );
    // Nested: value boundaries matter too.
    assert!(
        !h.ask(vec![Descriptor::new([("org", "a_b"), ("user", "c")])])
            .await
            .over_limit
    );
    let answer = h
        .ask(vec![Descriptor::new([("org", "a"), ("user", "b_c")])])
        .await;
    assert_eq!(answer.statuses[0].remaining, 1);
}

#[tokio::test]
async fn the_same_counter_twice_in_one_request_counts_twice() {
    let h = Harness::new(CONFIG);
    let answer = h.ask(vec![d("tenant", "dup"), d("tenant", "dup")]).await;
    assert!(!answer.over_limit);
    assert_eq!(answer.statuses[1].remaining, 1);
    // Two more would make four: all or nothing, so nothing is recorded; the
    // occurrences are counted in order, so the second is the one over.
    let answer = h.ask(vec![d("tenant", "dup"), d("tenant", "dup")]).await;
    assert!(answer.over_limit);
    assert!(!answer.statuses[0].over_limit);
    assert_eq!(answer.statuses[0].remaining, 0);
    assert!(answer.statuses[1].over_limit);
    assert_eq!(answer.statuses[1].remaining, 0);
    assert_eq!(h.one("tenant", "dup").await.statuses[0].remaining, 0);
}

#[tokio::test]
async fn burst_tiers_with_hard_and_global_limits_through_envoy_descriptors() {
    let h = Harness::new(CONFIG);
    let mut granted = 0;
    while !h.one("customer", "c1").await.over_limit {
        granted += 1;
    }
    // Tier 1 (2) + tier 2 (3) = 5, but H = 4 per second.
    assert_eq!(granted, 4);
    let answer = h.one("customer", "c1").await;
    let tiers = answer.statuses[0].tiers.expect("tiers");
    assert!(tiers.limited_by_hard);
    assert_eq!(tiers.snapshot.tier, 2);
    // H frees a hit at 1 001 ms; Envoy carries whole seconds, so 2 s.
    assert_eq!(answer.statuses[0].reset_after_ms, Some(2_000));
    assert_eq!(tiers.retry_after, Some(1_001), "the Charon API keeps ms");
    // G = 6 across domains: another customer gets 2.
    assert!(!h.one("customer", "c2").await.statuses[0].over_limit);
    assert!(!h.one("customer", "c2").await.statuses[0].over_limit);
    let answer = h.one("customer", "c2").await;
    assert!(answer.over_limit);
    assert!(answer.statuses[0].tiers.expect("tiers").limited_by_global);
}

#[tokio::test]
async fn ignore_configured_grants_but_reports() {
    let yaml = CONFIG.replace(
        "domain: shop\n",
        "domain: shop\nsettings: {ignore_configured: true}\n",
    );
    let h = Harness::new(&yaml);
    for remaining in [2, 1, 0, 0, 0] {
        let answer = h.one("tenant", "acme").await;
        assert!(!answer.over_limit && !answer.statuses[0].over_limit);
        // Still counted: the status says what the limit would have said.
        assert_eq!(answer.statuses[0].remaining, remaining);
    }
    // A descriptor that would be rejected does not stop the others being counted.
    let answer = h.ask(vec![d("tenant", "acme"), d("tenant", "other")]).await;
    assert!(!answer.over_limit);
    assert_eq!(answer.statuses[1].remaining, 2);
}

#[tokio::test]
async fn bad_requests_are_invalid_arguments() {
    let h = Harness::new(CONFIG);
    let invalid = |request: RateLimitRequest| async {
        match h.limiter.should_rate_limit(request).await {
            Err(LimitError::InvalidArgument(message)) => message,
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    };
    assert!(
        invalid(RateLimitRequest::new("", vec![d("tenant", "x")]))
            .await
            .contains("domain")
    );
    assert!(
        invalid(RateLimitRequest::new("shop", vec![]))
            .await
            .contains("descriptors")
    );
    let deep = Descriptor::new((0..10_000).map(|i| (format!("k{i}"), "v".to_owned())));
    assert!(
        invalid(RateLimitRequest::new("shop", vec![deep]))
            .await
            .contains("entries")
    );
    let big = d("tenant", &"x".repeat(1 << 20));
    assert!(
        invalid(RateLimitRequest::new("shop", vec![big]))
            .await
            .contains("bytes")
    );
    let many = vec![d("tenant", "x"); caps::MAX_DESCRIPTORS + 1];
    assert!(
        invalid(RateLimitRequest::new("shop", many))
            .await
            .contains("descriptors")
    );
    // A descriptor without entries matches nothing (as in envoyproxy/ratelimit).
    let answer = h.ask(vec![Descriptor::default(), d("tenant", "x")]).await;
    assert!(answer.statuses[0].limit.is_none() && !answer.over_limit);
    // Unicode is just bytes to us.
    assert!(!h.one("tenant", "ünïcødé-租户-🦀").await.over_limit);
}

#[tokio::test]
async fn memory_is_dropped_once_it_cannot_matter() {
    let h = Harness::new(CONFIG);
    for i in 0..1_000 {
        h.one("tenant", &format!("t{i}")).await;
        h.one("customer", &format!("c{i}")).await;
    }
    // Customers past the global limit were rejected and recorded nothing.
    assert!(h.limiter.store().len() >= 1_000);
    // Fixed windows end at the minute; tier 1 windows are 1 s.
    h.clock.advance(60_000);
    h.limiter.store().sweep();
    assert_eq!(h.limiter.store().len(), 0);
}

#[tokio::test]
async fn a_reload_applies_to_the_next_request() {
    let h = Harness::new(CONFIG);
    assert_eq!(h.one("tenant", "acme").await.statuses[0].remaining, 2);
    let stricter = CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 1");
    h.limiter.replace_config(
        config::load_str(&stricter, "shop.yaml")
            .expect("loads")
            .config,
    );
    assert!(h.one("tenant", "acme").await.over_limit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_exceed_the_limit() {
    let yaml = r#"
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 500}
  - key: customer
    resource: search
resources:
  search:
    rate:
      global_limit: 100000
      tiers:
        - {limit: 300, window: 1h, active: forever}
        - {limit: 200, window: 1h, active: 1h, cooldown: 1h}
"#;
    let h = std::sync::Arc::new(Harness::new(yaml));
    let mut tasks = Vec::new();
    for task in 0..8 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let mut granted = (0u64, 0u64);
            for i in 0..400 {
                // Half the tasks also touch other tenants, to spread over shards.
                let other = format!("noise-{task}-{i}");
                let answer = h.ask(vec![d("tenant", "hot"), d("customer", &other)]).await;
                if !answer.over_limit {
                    granted.0 += 1;
                }
                if !h.one("customer", "hot").await.over_limit {
                    granted.1 += 1;
                }
            }
            granted
        }));
    }
    let mut total = (0, 0);
    for task in tasks {
        let (fixed, tiers) = task.await.expect("task");
        total = (total.0 + fixed, total.1 + tiers);
    }
    // Demand (3200 each) far exceeds the limits: exactly the limit is granted.
    assert_eq!(total, (500, 500));
}

#[tokio::test]
async fn gcra_statuses_are_exact_token_bucket_answers() {
    let h = Harness::new(
        "domain: shop
descriptors:
  - key: key
    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 2, burst: 3}
",
    );
    // A quiet key spends its burst at once; the bucket is full again
    // `TAT - now` later.
    for (remaining, full_in) in [(2, 500), (1, 1_000), (0, 1_500)] {
        let answer = h.one("key", "k1").await;
        assert!(!answer.over_limit);
        let status = &answer.statuses[0];
        let limit = status.limit.as_ref().expect("limited");
        assert_eq!((limit.requests_per_unit, limit.unit), (2, Unit::Second));
        assert_eq!(status.remaining, remaining);
        assert_eq!(status.reset_after_ms, Some(full_in));
    }
    // Over: the exact wait for the next hit; a denial moves nothing.
    for _ in 0..3 {
        let answer = h.one("key", "k1").await;
        assert!(answer.over_limit);
        assert_eq!(answer.statuses[0].reset_after_ms, Some(500));
    }
    h.clock.advance(499);
    assert!(h.one("key", "k1").await.over_limit);
    h.clock.advance(1);
    assert!(!h.one("key", "k1").await.over_limit);
    // Other keys have their own bucket; a check-only descriptor (hits 0)
    // records nothing.
    let mut check = d("key", "k2");
    check.hits_addend = Some(0);
    for _ in 0..5 {
        assert!(!h.ask(vec![check.clone()]).await.over_limit);
    }
    assert_eq!(h.one("key", "k2").await.statuses[0].remaining, 2);
}

#[tokio::test]
async fn soft_limits_warn_before_the_hard_limit_rejects() {
    let h = Harness::new(
        r#"domain: shop
descriptors:
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 10, soft_limit: "80%"}
  - key: bucket
    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 1, burst: 4, soft_limit: 2}
  - key: tenant
    resource: api
resources:
  api:
    rate:
      soft_limit: 50%
      tiers:
        - {limit: 4, window: 1s, active: forever, cooldown: 0s}
"#,
    );
    // Past 8 of 10: the 9th and 10th warn, the 11th is rejected (no warning).
    for i in 1..=10 {
        let answer = h.one("window", "w").await;
        assert!(!answer.over_limit);
        assert_eq!(answer.statuses[0].soft_limit_exceeded, i > 8, "request {i}");
    }
    let rejected = h.one("window", "w").await;
    assert!(rejected.over_limit && !rejected.statuses[0].soft_limit_exceeded);
    // GCRA: past 2 of the burst of 4 in use.
    for i in 1..=4 {
        let status = &h.one("bucket", "b").await.statuses[0];
        assert_eq!(status.soft_limit_exceeded, i > 2, "request {i}");
    }
    // Tiers: past half the current tier's window.
    for i in 1..=4 {
        let status = &h.one("tenant", "t").await.statuses[0];
        assert_eq!(status.soft_limit_exceeded, i > 2, "request {i}");
    }
}

#[tokio::test]
async fn a_check_counts_nothing_whatever_the_request_asks() {
    let h = Harness::new(CONFIG);
    // Hits asked for by the request and by a descriptor: a check ignores both.
    let mut request = RateLimitRequest::new("shop", vec![d("tenant", "acme"), d("org", "x")]);
    request.hits_addend = 2;
    request.descriptors[1].hits_addend = Some(5);
    for _ in 0..5 {
        let answer = h.limiter.check(&request).await.expect("answer");
        assert!(!answer.over_limit);
        assert_eq!(answer.statuses[0].remaining, 3);
    }
    // The request is still the caller's, and nothing was counted.
    assert_eq!(request.descriptors.len(), 2);
    assert_eq!(h.one("tenant", "acme").await.statuses[0].remaining, 2);
    // Once the window is full, a check sees it.
    h.one("tenant", "acme").await;
    h.one("tenant", "acme").await;
    let answer = h.limiter.check(&request).await.expect("answer");
    assert!(answer.over_limit);
    assert_eq!(answer.statuses[0].remaining, 0);
}
