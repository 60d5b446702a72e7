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
