//! `algorithm: sliding_window` through the limiter on the memory store: the
//! previous window weighs as much as the sliding window still covers it, so
//! a burst at the end of one window does not buy a second burst at the start
//! of the next (docs/design.md#sliding-windows).

use charon::clock::ManualClock;
use charon::config;
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;

/// A minute boundary.
const START: u64 = 1_700_000_040_000;

fn limiter(clock: &ManualClock) -> Limiter<MemoryStore<ManualClock>> {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}\n";
    let config = config::load_str(yaml, "api.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Limiter::new(config, MemoryStore::with_clock(clock.clone()))
}

/// (granted, remaining) of one request at `+at` ms.
async fn ask(
    limiter: &Limiter<MemoryStore<ManualClock>>,
    clock: &ManualClock,
    at: u64,
) -> (bool, u64) {
    clock.set(START + at);
    let answer = limiter
        .should_rate_limit(RateLimitRequest::new(
            "api",
            vec![Descriptor::new([("user", "ada")])],
        ))
        .await
        .expect("decided");
    (!answer.over_limit, answer.statuses[0].remaining)
}

#[tokio::test]
async fn a_burst_at_a_windows_end_is_still_counted_after_it() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock);
    for _ in 0..10 {
        assert!(ask(&limiter, &clock, 59_000).await.0);
    }
    assert!(!ask(&limiter, &clock, 59_500).await.0, "10 a minute");
    // A fixed window would open at 60 000; here the last window's 10 still
    // weigh 10·(1 − elapsed/60 s): one request fits once they weigh < 10.
    assert!(!ask(&limiter, &clock, 60_000).await.0);
    let (granted, _) = ask(&limiter, &clock, 60_000 + 6_001).await;
    assert!(granted, "10·0.9 = 9 counted: one more fits");
    // Half way through the window, 5 of the 10 (and the 1) count.
    assert_eq!(ask(&limiter, &clock, 90_000).await, (true, 10 - 5 - 2));
}

#[test]
fn sliding_window_takes_no_burst() {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window, burst: 3}\n";
    let errors = config::load_str(yaml, "api.yaml").expect_err("refused");
    assert!(
        errors
            .to_string()
            .contains("`burst` applies only to `algorithm: gcra`"),
        "{errors}"
    );
}
