//! `algorithm: hybrid`, the hybrid quota-linear limiter
//! (docs/design.md#hybrid-quota-linear), against a reference model written
//! clause by clause from its description: the engine agrees with it hit by
//! hit, on single requests and bulk ones; a client at twice the permitted
//! rate gets one quota in the first window where GCRA gives it two; and the
//! limiter answers through the memory store with its `remaining` and waits.

use charon::clock::ManualClock;
use charon::config;
use charon::engine::{self, GcraItem, GcraLimit, HybridItem, Item, Slot, SlotKind};
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;
use proptest::prelude::*;

/// The description's client, its bucket a fraction over `window` (so the
/// model is exact: `rate × elapsed` tokens is `quota × elapsed` over
/// `window`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum ModelMode {
    Bursty,
    Smooth,
}

#[derive(Debug, Clone, Copy)]
struct Client {
    /// Tokens, times `window`.
    bucket: i128,
    time: u64,
    mode: ModelMode,
}

#[derive(Debug, Clone)]
struct Model {
    quota: i128,
    window: u64,
    client: Option<Client>,
}

impl Model {
    fn new(quota: u64, window: u64) -> Self {
        Self {
            quota: i128::from(quota),
            window,
            client: None,
        }
    }

    fn one(&self) -> i128 {
        i128::from(self.window)
    }

    /// "a client that returns after a long absence is reinitialized like a
    /// new client … we subtract one from the quota to account for the
    /// current request"
    fn reset(&mut self, now: u64) -> bool {
        self.client = Some(Client {
            bucket: (self.quota - 1) * self.one(),
            time: now,
            mode: ModelMode::Bursty,
        });
        true
    }

    /// One request at `now`: the clauses in their order.
    fn request(&mut self, now: u64) -> bool {
        // "initialize the state of a new client"
        let Some(mut c) = self.client else {
            return self.reset(now);
        };
        // "reset the state when a bursty client's window has expired"
        if c.mode == ModelMode::Bursty && c.time + self.window <= now {
            return self.reset(now);
        }
        // "when a client consumes its last token, switch modes … apply a
        // negative penalty … add one to allow the next request at the start
        // of the next window"
        if c.mode == ModelMode::Bursty && c.bucket == self.one() {
            let remaining = i128::from(c.time + self.window - now);
            c.bucket = -remaining * self.quota + self.one();
            c.time = now;
            c.mode = ModelMode::Smooth;
            self.client = Some(c);
            return true;
        }
        // "smooth mode accumulates tokens proportional to the time since
        // the client's previous request"
        if c.mode == ModelMode::Smooth {
            c.bucket += i128::from(now - c.time) * self.quota;
            c.time = now;
        }
        // "when the bucket has refilled, switch back to bursty mode"
        if c.mode == ModelMode::Smooth && c.bucket >= self.quota * self.one() {
            return self.reset(now);
        }
        // "in either mode the request is allowed if the client has a token"
        let allowed = c.bucket >= self.one();
        if allowed {
            c.bucket -= self.one();
        }
        self.client = Some(c);
        allowed
    }

    /// `hits` requests at once: all of them, or none (nothing changes).
    fn bulk(&mut self, hits: u64, now: u64) -> bool {
        let mut trial = self.clone();
        if (0..hits.max(1)).all(|_| trial.request(now)) {
            *self = trial;
            true
        } else {
            false
        }
    }
}

fn hybrid(quota: u64, window: u64, hits: u64) -> Item<'static> {
    Item::Hybrid(HybridItem {
        slot: 0,
        quota,
        window,
        hits,
        shadow: false,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The engine decides every request as the model does.
    #[test]
    fn the_engine_agrees_with_the_description_hit_by_hit(
        quota in 1u64..12,
        window in prop::sample::select(vec![7u64, 100, 1_000, 3_000]),
        requests in prop::collection::vec((0u64..400, prop_oneof![6 => Just(1u64), 1 => 2u64..5]), 1..150),
    ) {
        let mut model = Model::new(quota, window);
        let mut slots = vec![Slot::new(SlotKind::Hybrid)];
        let mut now = 1_700_000_000_000u64;
        for (index, (step, hits)) in requests.into_iter().enumerate() {
            now += step;
            let expected = model.bulk(hits, now);
            let decision = engine::decide(&[hybrid(quota, window, hits)], &mut slots, now);
            prop_assert_eq!(decision.granted, expected, "request {} ({} hits) at +{}", index, hits, now);
            // A check says what one more request would get, recording nothing.
            let check = engine::decide(&[hybrid(quota, window, 0)], &mut slots, now);
            prop_assert_eq!(check.granted, model.clone().request(now), "check after request {}", index);
        }
    }
}

/// Requests at `rate_per_window` a window, evenly, over `windows` windows:
/// how many each window grants, with `item` deciding.
fn granted_per_window(
    item: Item<'static>,
    kind: SlotKind,
    window: u64,
    rate_per_window: u64,
    windows: u64,
) -> Vec<u64> {
    let mut slots = vec![Slot::new(kind)];
    let start = 1_700_000_040_000u64;
    let gap = window / rate_per_window;
    let mut granted = vec![0; windows as usize];
    for n in 0..rate_per_window * windows {
        let now = start + n * gap;
        if engine::decide(&[item], &mut slots, now).granted {
            granted[(n * gap / window) as usize] += 1;
        }
    }
    granted
}

/// The description's motivating number: a client at twice the permitted
/// rate (a = 2) gets q·a/(a−1) = 2q requests from a token bucket before it
/// is throttled; the hybrid gives it one quota in the first window, and
/// about one quota a window after.
#[test]
fn a_client_at_twice_the_rate_gets_one_quota_in_the_first_window_not_two() {
    let (quota, window) = (100, 60_000);
    let hybrid = granted_per_window(
        hybrid(quota, window, 1),
        SlotKind::Hybrid,
        window,
        2 * quota,
        5,
    );
    let bucket = Item::Gcra(GcraItem {
        slot: 0,
        limit: GcraLimit {
            count: quota,
            period: window,
            burst: quota,
        },
        hits: 1,
        shadow: false,
    });
    let gcra = granted_per_window(bucket, SlotKind::Gcra, window, 2 * quota, 5);
    eprintln!("granted per window at twice the rate: hybrid {hybrid:?}, GCRA {gcra:?}");
    assert_eq!(hybrid[0], quota, "one quota in the first window");
    assert!(gcra[0] >= 2 * quota - 1, "GCRA: about two quotas: {gcra:?}");
    for (window, granted) in hybrid.iter().enumerate().skip(1) {
        assert!(
            (quota - 1..=quota + 1).contains(granted),
            "window {window}: {granted} (smooth mode: the permitted rate)"
        );
    }
}

fn limiter(clock: &ManualClock) -> Limiter<MemoryStore<ManualClock>> {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: hybrid}\n";
    let config = config::load_str(yaml, "api.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Limiter::new(config, MemoryStore::with_clock(clock.clone()))
}

const START: u64 = 1_700_000_040_000;

/// (granted, remaining, reset in ms) of one request at `+at` ms.
async fn ask(
    limiter: &Limiter<MemoryStore<ManualClock>>,
    clock: &ManualClock,
    at: u64,
) -> (bool, u64, Option<u64>) {
    clock.set(START + at);
    let answer = limiter
        .should_rate_limit(RateLimitRequest::new(
            "api",
            vec![Descriptor::new([("user", "ada")])],
        ))
        .await
        .expect("decided");
    let status = &answer.statuses[0];
    (!answer.over_limit, status.remaining, status.reset_after_ms)
}

#[tokio::test]
async fn a_burst_then_an_even_rate_through_the_limiter() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock);
    // Bursty: the window starts at the first request; 4 at once.
    assert_eq!(ask(&limiter, &clock, 10_000).await, (true, 3, Some(60_000)));
    assert_eq!(ask(&limiter, &clock, 10_001).await.1, 2);
    assert_eq!(ask(&limiter, &clock, 10_002).await.1, 1);
    // The last token: smooth mode, owing the 59 997 ms left of the window.
    assert!(ask(&limiter, &clock, 10_003).await.0);
    let refused = ask(&limiter, &clock, 20_000).await;
    assert!(!refused.0);
    assert_eq!(
        refused.2,
        Some(50_000),
        "one token back when the window that began at 10 000 ends"
    );
    assert!(!ask(&limiter, &clock, 69_999).await.0);
    assert!(ask(&limiter, &clock, 70_000).await.0, "the window's end");
    assert!(!ask(&limiter, &clock, 70_001).await.0);
    // Then one every 15 s (4 a minute).
    assert!(!ask(&limiter, &clock, 84_999).await.0);
    assert!(ask(&limiter, &clock, 85_000).await.0);
    assert!(!ask(&limiter, &clock, 85_001).await.0);
    // A whole quota saved (a minute of silence): bursty again.
    for at in [150_000, 150_001, 150_002] {
        assert!(ask(&limiter, &clock, at).await.0);
    }
}

#[test]
fn hybrid_windows_too_large_to_count_exactly_are_refused() {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: year, requests_per_unit: 1000000000, algorithm: hybrid}\n";
    let errors = config::load_str(yaml, "api.yaml").expect_err("refused");
    let text = errors.to_string();
    assert!(text.contains("must stay below 2^53"), "{text}");
    assert!(text.contains("api.yaml:4:"), "{text}");
    let burst = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 4, algorithm: hybrid, burst: 9}\n";
    let errors = config::load_str(burst, "api.yaml").expect_err("refused");
    assert!(
        errors
            .to_string()
            .contains("`burst` applies only to `algorithm: gcra`"),
        "{errors}"
    );
}
