//! `algorithm: sliding_window` against its formula (docs/design.md#sliding-windows) written in
//! exact arithmetic, hit by hit, and through the limiter on the memory store: the
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

/// The sliding window counter, written from its description in
/// exact rational arithmetic: the current window's count plus the previous
/// window's times the share of it the sliding window still covers.
#[derive(Debug, Default)]
struct Model {
    /// (window start, granted hits) of every window so far.
    counts: std::collections::BTreeMap<u64, u64>,
}

impl Model {
    /// The estimate at `now`, times `period` (exact, no rounding).
    fn scaled_estimate(&self, period: u64, now: u64) -> u128 {
        let start = now - now % period;
        let current = self.counts.get(&start).copied().unwrap_or(0);
        let previous = start
            .checked_sub(period)
            .and_then(|before| self.counts.get(&before))
            .copied()
            .unwrap_or(0);
        let covered = u128::from(period - (now - start));
        u128::from(current) * u128::from(period) + u128::from(previous) * covered
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, ..Default::default() })]

    /// The engine decides as the exact formula, but where the formula's
    /// estimate lies within the engine's fixed-point step (a weight kept
    /// in 1/65 536) of the limit: there the engine may round one way.
    #[test]
    fn the_engine_agrees_with_the_formula_hit_by_hit(
        limit in 1u64..12,
        period in proptest::sample::select(vec![100u64, 1_000, 60_000]),
        requests in proptest::collection::vec((0u64..700, 1u64..3), 1..200),
    ) {
        use charon::engine::{self, Item, SlidingItem, Slot, SlotKind};
        let mut model = Model::default();
        let mut slots = vec![Slot::new(SlotKind::Sliding)];
        let mut now = START;
        for (index, (step, hits)) in requests.into_iter().enumerate() {
            now += step;
            let item = Item::Sliding(SlidingItem { slot: 0, limit, period, hits, shadow: false });
            let granted = engine::decide(&[item], &mut slots, now).granted;
            let scaled = model.scaled_estimate(period, now);
            let threshold = u128::from(limit - hits.min(limit)) * u128::from(period);
            let exact = hits <= limit && scaled < threshold + u128::from(period);
            // ⌊estimate⌋ + hits ≤ limit  ⟺  estimate < limit − hits + 1.
            if granted != exact {
                let start = now - now % period;
                let previous = model.counts.get(&start.saturating_sub(period)).copied().unwrap_or(0);
                let slack = u128::from(previous) * u128::from(period) / 65_536 + u128::from(period);
                let edge = threshold + u128::from(period);
                proptest::prop_assert!(
                    scaled.abs_diff(edge) <= slack,
                    "request {index} at +{}: engine {granted}, formula {exact} far from the edge",
                    now - START
                );
            }
            if granted {
                *model.counts.entry(now - now % period).or_default() += hits;
            }
        }
    }
}
