use std::sync::Arc;

use crate::clock::ManualClock;
use crate::config::learned::Pick;
use crate::limiter::Modes;
use crate::service::error::Kind;
use crate::service::ops::{RateRequest, ResourceKey};
use crate::service::{Service, Unobserved};
use crate::store::MemoryLearn;
use crate::store::open::Stores;

const CONFIG: &str = "
domain: shop
settings:
  allow_unconfigured: true
  learn: {window: 1s, windows: 10, domains: 4}
";

fn service(clock: &ManualClock) -> Service {
    service_of(clock, CONFIG)
}

fn service_of(clock: &ManualClock, yaml: &str) -> Service {
    let config = crate::config::load_str(yaml, "shop.yaml")
        .expect("loads")
        .config;
    let stores = Stores {
        learn: Arc::new(MemoryLearn::with_clock(Arc::new(clock.clone()))),
        ..Stores::memory(crate::store::DEFAULT_MAX_KEYS)
    };
    Service::new(
        config,
        stores,
        Modes::default(),
        Arc::new(Unobserved),
        Arc::new(clock.clone()),
    )
}

async fn request(service: &Service, namespace: &str, domain: &str, hits: i64) {
    let op = RateRequest::new(
        ResourceKey::new(namespace, "search", domain),
        Some(hits),
        None,
    )
    .expect("a valid request");
    let answer = service.request(&op).await.expect("granted");
    assert_eq!(answer.granted, u64::try_from(hits).expect("positive"));
}

#[tokio::test]
async fn a_proposal_is_each_domains_use_per_window() {
    let clock = ManualClock::new(100_000);
    let service = service(&clock);
    for second in 0..10u64 {
        clock.set(100_000 + second * 1_000 + 10);
        for _ in 0..50 {
            request(&service, "shop", "acme", 1).await;
        }
        // 20 a window, and 40 in one of them.
        request(
            &service,
            "shop",
            "globex",
            if second == 3 { 40 } else { 20 },
        )
        .await;
    }
    clock.set(110_500);
    let text = service
        .proposal("shop", Pick::P50)
        .await
        .expect("a proposal");
    let loaded = crate::config::load_str(&text, "proposal.yaml")
        .unwrap_or_else(|errors| panic!("{errors}\n{text}"));
    let namespace = loaded.config.namespace("shop").expect("the namespace");
    let Some(crate::config::Resource::Rate(search)) = namespace.resources.get("search") else {
        panic!("a rate resource: {text}");
    };
    let limit = |domain: &str| search.domains[domain].tiers[0].limit;
    assert_eq!((limit("acme"), limit("globex")), (50, 20), "{text}");
    assert_eq!(search.domains["acme"].tiers[0].window, 1_000);
    assert!(text.contains("peak 40, p99 40, p95 40, p50 20;"), "{text}");
    let peak = service
        .proposal("shop", Pick::Peak)
        .await
        .expect("a proposal");
    assert!(peak.contains("\"globex\": {tiers: [{limit: 40,"), "{peak}");
}

#[tokio::test]
async fn past_the_bound_the_heaviest_domains_are_still_right() {
    let clock = ManualClock::new(0);
    let service = service(&clock);
    for second in 0..10u64 {
        clock.set(second * 1_000);
        // 2 000 domains once each, around two heavy ones: four kept a window.
        for round in 0..1_000u64 {
            request(&service, "shop", "heavy", 3).await;
            request(&service, "shop", &format!("once-{second}-{round}"), 1).await;
            request(&service, "shop", "second", 2).await;
            request(&service, "shop", &format!("twice-{second}-{round}"), 1).await;
        }
    }
    clock.set(10_000);
    let text = service
        .proposal("shop", Pick::Peak)
        .await
        .expect("a proposal");
    assert!(text.contains("\"heavy\": {tiers: [{limit: 3000,"), "{text}");
    assert!(
        text.contains("\"second\": {tiers: [{limit: 2000,"),
        "{text}"
    );
    let domains = text
        .lines()
        .filter(|line| line.contains("tiers: [{limit"))
        .count();
    // The default, and at most 4 domains a window over 10 windows.
    assert!(domains <= 1 + 40, "{domains} lines:\n{text}");
}

#[tokio::test]
async fn a_namespace_must_learn_to_be_asked() {
    let clock = ManualClock::new(0);
    let service = service_of(
        &clock,
        "domain: plain\nsettings: {allow_unconfigured: true}\n",
    );
    request(&service, "plain", "acme", 1).await;
    let error = service
        .proposal("plain", Pick::Peak)
        .await
        .expect_err("no record");
    assert_eq!(error.kind, Kind::WrongKind);
    assert!(
        error.message.contains("settings.learn"),
        "{}",
        error.message
    );
    let error = service
        .proposal("nowhere", Pick::Peak)
        .await
        .expect_err("no namespace");
    assert_eq!(error.kind, Kind::UnknownResource);
}

const EDGE: &str = r#"
domain: edge
settings:
  learn: {window: 1m, windows: 10, domains: 10}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10}
    shadow_mode: true
  - key: generic_key
    value: api
    descriptors:
      - key: path
        value: "/v1/*"
        rate_limit: {unit: minute, requests_per_unit: 10}
        shadow_mode: true
      - key: host
        value: "*.example.com"
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
        shadow_mode: true
  - key: enforced
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

async fn envoy<S: crate::store::Store>(
    limiter: &crate::limiter::Limiter<S>,
    entries: &[(&str, &str)],
) -> crate::limiter::RateLimitAnswer {
    let request = crate::limiter::RateLimitRequest::new(
        "edge",
        vec![crate::limiter::Descriptor::new(entries.iter().copied())],
    );
    limiter.should_rate_limit(request).await.expect("decided")
}

#[tokio::test]
async fn shadow_mode_limits_are_proposed_per_value() {
    let clock = ManualClock::new(0);
    let service = service_of(&clock, EDGE);
    let limiter = &service.limiter;
    for minute in 0..5u64 {
        clock.set(minute * 60_000 + 1_000);
        for _ in 0..30 {
            envoy(limiter, &[("remote_address", "10.0.0.1")]).await;
        }
        for _ in 0..5 {
            envoy(limiter, &[("remote_address", "10.0.0.2")]).await;
        }
        for _ in 0..12 {
            envoy(limiter, &[("generic_key", "api"), ("path", "/v1/users")]).await;
        }
        for host in ["a.example.com", "b.example.com", "c.example.com"] {
            envoy(limiter, &[("generic_key", "api"), ("host", host)]).await;
        }
        for _ in 0..7 {
            envoy(limiter, &[("enforced", "x")]).await;
        }
    }
    clock.set(5 * 60_000 + 1);
    let text = service
        .proposal("edge", Pick::Peak)
        .await
        .expect("a proposal");
    if std::env::var_os("CHARON_SHOW_PROPOSAL").is_some() {
        eprintln!("{text}");
    }
    assert!(
        !text.contains("enforced"),
        "an enforced limit is not learned:\n{text}"
    );
    let proposed = crate::config::load_str(&text, "proposal.yaml")
        .unwrap_or_else(|errors| panic!("{errors}\n{text}"))
        .config;
    let proposed = crate::limiter::Limiter::new(proposed, crate::store::MemoryStore::new());
    let limit_of = |answer: crate::limiter::RateLimitAnswer| {
        let limit = answer.statuses[0].limit.clone().expect("a limit");
        (limit.requests_per_unit, limit.window_ms)
    };
    for (entries, expected) in [
        (vec![("remote_address", "10.0.0.1")], 30),
        (vec![("remote_address", "10.0.0.2")], 5),
        // Any other address: the median of the two.
        (vec![("remote_address", "10.9.9.9")], 5),
        (vec![("generic_key", "api"), ("path", "/v1/users")], 12),
        // One count for every host the pattern matches.
        (vec![("generic_key", "api"), ("host", "z.example.com")], 3),
    ] {
        assert_eq!(
            limit_of(envoy(&proposed, &entries).await),
            (expected, 60_000),
            "{entries:?}:\n{text}"
        );
    }
}
