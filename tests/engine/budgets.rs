//! A cost known after the response, charged the way Envoy charges it
//! (docs/configuration.md#counting-rejected-hits): a check with
//! `hits_addend` 0 before the request, the real cost as `hits_addend`
//! after it. By default a rejected charge consumes nothing, so a budget
//! only stops a client when a charge fills it exactly; counting rejected
//! hits (`--count-rejected-hits`, or `count_rejected: true` on the limit)
//! records every charge, as envoyproxy/ratelimit does, and the next check
//! is refused once the budget is spent.

use charon::clock::ManualClock;
use charon::config;
use charon::limiter::{Descriptor, Limiter, Modes, RateLimitRequest};
use charon::store::MemoryStore;

/// A minute boundary, so the budget's window starts here.
const START: u64 = 1_700_000_040_000;

fn budget(extra: &str) -> String {
    format!(
        "domain: ai\ndescriptors:\n  - key: generic_key\n    value: tokens\n    rate_limit: {{unit: minute, requests_per_unit: 10000{extra}}}\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
    )
}

fn limiter(yaml: &str, modes: Modes) -> Limiter<MemoryStore<ManualClock>> {
    let config = config::load_str(yaml, "ai.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Limiter::new(config, MemoryStore::with_clock(ManualClock::new(START))).with_modes(modes)
}

/// One call: the budget's descriptor with `hits` (0: a check), and the
/// user's descriptor when `user` is given. (over, budget remaining).
async fn call(
    limiter: &Limiter<MemoryStore<ManualClock>>,
    hits: u64,
    user: Option<&str>,
) -> (bool, u64) {
    let mut tokens = Descriptor::new([("generic_key", "tokens")]);
    tokens.hits_addend = Some(hits);
    let mut descriptors = vec![tokens];
    if let Some(user) = user {
        descriptors.push(Descriptor::new([("user", user)]));
    }
    let answer = limiter
        .should_rate_limit(RateLimitRequest::new("ai", descriptors))
        .await
        .expect("decided");
    (answer.over_limit, answer.statuses[0].remaining)
}

/// check, charge 6 000, charge 6 000, check.
async fn two_charges(limiter: &Limiter<MemoryStore<ManualClock>>) -> Vec<(bool, u64)> {
    vec![
        call(limiter, 0, None).await,
        call(limiter, 6_000, None).await,
        call(limiter, 6_000, None).await,
        call(limiter, 0, None).await,
    ]
}

#[tokio::test]
async fn by_default_a_rejected_charge_consumes_nothing() {
    let limiter = limiter(&budget(""), Modes::default());
    assert_eq!(
        two_charges(&limiter).await,
        [(false, 10_000), (false, 4_000), (true, 0), (false, 4_000)],
        "the second charge is refused and not recorded: the check passes"
    );
}

#[tokio::test]
async fn counting_rejected_hits_stops_the_next_check() {
    let counted = [(false, 10_000), (false, 4_000), (true, 0), (true, 0)];
    let switch = limiter(
        &budget(""),
        Modes {
            count_rejected: true,
            ..Modes::default()
        },
    );
    assert_eq!(two_charges(&switch).await, counted, "--count-rejected-hits");
    let per_limit = limiter(&budget(", count_rejected: true"), Modes::default());
    assert_eq!(
        two_charges(&per_limit).await,
        counted,
        "count_rejected: true"
    );
}

#[tokio::test]
async fn a_counted_charge_is_recorded_when_another_descriptor_rejects_the_call() {
    let limiter = limiter(&budget(", count_rejected: true"), Modes::default());
    assert_eq!(call(&limiter, 1_000, Some("alice")).await, (false, 9_000));
    // alice is over her own limit: the call is rejected, the charge counts,
    // and the user's limit (not counting rejected hits) records nothing.
    assert_eq!(call(&limiter, 1_000, Some("alice")).await, (true, 8_000));
    assert_eq!(call(&limiter, 1_000, Some("bob")).await, (false, 7_000));
}

#[test]
fn count_rejected_is_for_fixed_windows_only() {
    let yaml = "domain: ai\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: gcra, count_rejected: true}\n";
    let errors = config::load_str(yaml, "ai.yaml").expect_err("refused");
    let message = errors.to_string();
    assert!(
        message.contains("ai.yaml:4:")
            && message.contains("`count_rejected` applies only to fixed windows"),
        "{message}"
    );
    // Off is fine anywhere.
    let off = yaml.replace("count_rejected: true", "count_rejected: false");
    assert!(config::load_str(&off, "ai.yaml").is_ok());
}

// ---------------------------------------------------------------------------
// `cost: after_response` (docs/configuration.md#costs-known-after-the-response)

/// A call to `limiter` with its budget's descriptor charged `hits`, at
/// `+at` ms from the start; (over, remaining).
async fn at(
    limiter: &Limiter<MemoryStore<ManualClock>>,
    clock: &ManualClock,
    at: u64,
    hits: u64,
) -> (bool, u64) {
    clock.set(START + at);
    call(limiter, hits, None).await
}

fn predicted(extra: &str) -> (Limiter<MemoryStore<ManualClock>>, ManualClock) {
    let yaml = budget(&format!(", cost: after_response{extra}"));
    let config = config::load_str(&yaml, "ai.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    let clock = ManualClock::new(START);
    (
        Limiter::new(config, MemoryStore::with_clock(clock.clone())),
        clock,
    )
}

#[tokio::test]
async fn checks_leave_room_for_the_predicted_cost_of_what_is_in_flight() {
    // 10 000 a minute, one request predicted at 1 000 (deviation 500): a
    // check passes while used + n·1000 + 3·500·sqrt(n) fits, so 6 requests
    // may be in flight at once (6 000 + 3 675), not 7.
    let (limiter, clock) = predicted(", initial_cost: 1000");
    let mut admitted = 0;
    while !at(&limiter, &clock, 10, 0).await.0 {
        admitted += 1;
        assert!(admitted < 100, "checks never refused");
    }
    assert_eq!(admitted, 6);
    // They come back cheaper than predicted: each charge retires one, and
    // what is learned (200 a request) lets more in.
    for _ in 0..6 {
        assert!(
            !at(&limiter, &clock, 500, 200).await.0,
            "a charge is a fact"
        );
    }
    let (over, remaining) = at(&limiter, &clock, 600, 0).await;
    assert!(!over, "1 200 used, nothing in flight");
    assert!(
        remaining < 10_000 - 1_200,
        "remaining counts what is in flight: {remaining}"
    );
}

#[tokio::test]
async fn charges_past_the_budget_are_recorded_and_stop_the_next_checks() {
    let (limiter, clock) = predicted(", initial_cost: 100");
    assert!(!at(&limiter, &clock, 0, 0).await.0);
    assert_eq!(at(&limiter, &clock, 100, 9_000).await, (false, 1_000));
    assert!(
        !at(&limiter, &clock, 200, 3_000).await.0,
        "charged past the budget: recorded"
    );
    assert!(at(&limiter, &clock, 300, 0).await.0, "12 000 used: refused");
    // The next minute opens the budget again.
    assert!(!at(&limiter, &clock, 60_000, 0).await.0);
}

#[tokio::test]
async fn a_call_without_a_cost_is_a_check_and_a_charge_over_the_cap_is_refused() {
    let (limiter, clock) = predicted(", initial_cost: 100, max_charge: 5000");
    clock.set(START + 5);
    // Envoy's request-phase call names no cost: hits_addend 0 on the request
    // (1 for any other limit, as upstream reads it).
    let no_addend = limiter
        .should_rate_limit(RateLimitRequest {
            hits_addend: 0,
            ..RateLimitRequest::new("ai", vec![Descriptor::new([("generic_key", "tokens")])])
        })
        .await
        .expect("decided");
    assert_eq!(no_addend.statuses[0].hits, 0, "no hits_addend: a check");
    let mut big = Descriptor::new([("generic_key", "tokens")]);
    big.hits_addend = Some(5_001);
    let error = limiter
        .should_rate_limit(RateLimitRequest::new("ai", vec![big]))
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("max_charge, 5000"), "{error}");
}

#[test]
fn cost_after_response_is_checked_like_any_field() {
    for (extra, expected) in [
        (", cost: later", "unknown cost `later`"),
        (
            ", algorithm: gcra, cost: after_response",
            "not with `algorithm: gcra`",
        ),
        (
            ", initial_cost: 5",
            "`initial_cost` applies only to `cost: after_response`",
        ),
        (
            ", cost: after_response, max_charge: 0",
            "max_charge must be at least 1",
        ),
        (
            ", cost: after_response, count_rejected: true",
            "`count_rejected` is implied by `cost: after_response`",
        ),
    ] {
        let errors = config::load_str(&budget(extra), "ai.yaml").expect_err(extra);
        assert!(errors.to_string().contains(expected), "{extra}: {errors}");
    }
}
