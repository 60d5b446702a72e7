//! The promise behind every OVER_LIMIT status Envoy receives
//! (docs/design.md#resets):
//! its `duration_until_reset`, in the whole seconds Envoy reads (rounded up,
//! at least 1), is exactly when the same request would be granted. Repeated
//! that many seconds later it is granted; one second earlier it is not.
//! Checked on random histories over fixed windows, GCRA and burst tiers with
//! a hard limit, with bulk hits and checks, on a manual clock.

use charon::clock::{Clock, ManualClock};
use charon::config;
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;
use proptest::prelude::*;

/// A minute boundary.
const START: u64 = 1_700_000_040_000;

/// Every limit here can hold any request the test makes (at most 3 hits),
/// so every rejected request fits again some day.
const CONFIG: &str = r#"
domain: p
descriptors:
  - key: w
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: g
    rate_limit: {algorithm: gcra, unit: minute, requests_per_unit: 6, burst: 4}
  - key: t
    resource: tiers
  - key: b
    resource: bucket
resources:
  tiers:
    rate:
      hard_limit: 6
      global_limit: 9
      tiers:
        - {limit: 3, window: 5s, active: forever, cooldown: 0s}
        - {limit: 2, window: 3s, active: 6s, cooldown: 10s}
        - {limit: 2, window: 1s, active: 2s, cooldown: 20s, skippable: true}
  bucket:
    rate:
      hard_limit: 5
      gcra: {burst: 4, count: 2, period: 1s}
"#;

const KEYS: [&str; 5] = ["w", "m", "g", "t", "b"];

fn request(key: &str, hits: u64) -> RateLimitRequest {
    let mut descriptor = Descriptor::new([(key, "x")]);
    descriptor.hits_addend = Some(hits);
    RateLimitRequest::new("p", vec![descriptor])
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(future)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_rejection_s_reset_is_when_the_same_request_passes(
        steps in prop::collection::vec((0u64..1_500, 0usize..KEYS.len(), 0u64..=3), 1..40)
    ) {
        block_on(async {
            let loaded = config::load_str(CONFIG, "p.yaml").expect("config loads").config;
            let clock = ManualClock::new(START);
            let limiter = Limiter::new(loaded, MemoryStore::with_clock(clock.clone()));
            for (pause, key, hits) in steps {
                clock.advance(pause);
                let asked = request(KEYS[key], hits);
                let answer = limiter.should_rate_limit(asked.clone()).await.expect("decided");
                if !answer.over_limit {
                    continue;
                }
                let status = &answer.statuses[0];
                prop_assert_eq!(status.remaining, 0);
                let ms = status.reset_after_ms.expect("an over status says when");
                let seconds = ms.div_ceil(1_000).max(1);
                let rejected_at = clock.now_ms();
                // One second earlier than the reset Envoy reads: still over
                // (a rejection records nothing, so this probe is harmless).
                clock.set(rejected_at + (seconds - 1) * 1_000);
                let early = limiter.should_rate_limit(asked.clone()).await.expect("decided");
                prop_assert!(
                    early.over_limit,
                    "{} with {} hits: granted {} s early (reset {} ms)",
                    KEYS[key], hits, 1, ms
                );
                clock.set(rejected_at + seconds * 1_000);
                let later = limiter.should_rate_limit(asked).await.expect("decided");
                prop_assert!(
                    !later.over_limit,
                    "{} with {} hits: still over after {} s (reset {} ms): {:?}",
                    KEYS[key], hits, seconds, ms, later.statuses[0]
                );
            }
            Ok(())
        })?;
    }
}
