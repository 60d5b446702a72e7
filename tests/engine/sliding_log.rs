//! `algorithm: sliding_log`, the exact sliding window log
//! (docs/design.md#sliding-logs), against a reference model that keeps
//! every logged hit: the engine (whose log keeps only the newest `limit`)
//! agrees hit by hit on grants, remaining and waits, with and without
//! refused hits logged; a hammering client stays out only when they are;
//! and the sliding window counter's error against the exact log on a
//! synthetic trace (docs/performance.md#sliding-window-counter-error).

use charon::config;
use charon::engine::{self, Item, Outcome, SlidingLogItem, Slot, SlotKind};
use proptest::prelude::*;

/// Every logged hit, unbounded: the definition of the trailing window.
#[derive(Debug, Default)]
struct Model {
    hits: Vec<u64>,
}

impl Model {
    /// Hits at `t` count while `now <= t + window`.
    fn count(&self, now: u64, window: u64) -> u64 {
        self.hits.iter().filter(|&&t| t + window >= now).count() as u64
    }

    fn decide(
        &mut self,
        limit: u64,
        window: u64,
        hits: u64,
        now: u64,
        count_rejected: bool,
    ) -> bool {
        let over = self.count(now, window) + hits.max(1) > limit;
        if hits > 0 && (count_rejected || !over) {
            self.hits.extend(std::iter::repeat_n(now, hits as usize));
        }
        !over
    }

    /// The first instant from `now` at which `hits` more would fit.
    fn wait(&self, limit: u64, window: u64, hits: u64, now: u64) -> Option<u64> {
        if hits.max(1) > limit {
            return None;
        }
        (now..now + window + 2)
            .find(|&at| self.count(at, window) + hits.max(1) <= limit)
            .map(|at| at - now)
    }
}

fn log_item(limit: u64, window: u64, hits: u64, count_rejected: bool) -> Item<'static> {
    Item::SlidingLog(SlidingLogItem {
        slot: 0,
        limit,
        period: window,
        hits,
        shadow: false,
        count_rejected,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_engine_agrees_with_the_unbounded_log(
        limit in 0u64..8,
        window in prop::sample::select(vec![10u64, 100, 1_000]),
        count_rejected in any::<bool>(),
        requests in prop::collection::vec((0u64..60, prop_oneof![5 => Just(1u64), 1 => 0u64..4]), 1..120),
    ) {
        let mut model = Model::default();
        let mut slots = vec![Slot::new(SlotKind::TimeLog)];
        let mut now = 1_700_000_000_000u64;
        for (index, (step, hits)) in requests.into_iter().enumerate() {
            now += step;
            let expected = model.decide(limit, window, hits, now, count_rejected);
            let decision = engine::decide(&[log_item(limit, window, hits, count_rejected)], &mut slots, now);
            prop_assert_eq!(decision.granted, expected, "request {} of {} hits at +{}", index, hits, now);
            let Outcome::Window(outcome) = decision.outcomes[0] else {
                panic!("a window outcome");
            };
            prop_assert_eq!(outcome.remaining, limit.saturating_sub(model.count(now, window)));
            let wait = if expected { Some(0) } else { model.wait(limit, window, hits, now) };
            prop_assert_eq!(outcome.wait, wait, "request {}", index);
            prop_assert_eq!(outcome.retry_after, model.wait(limit, window, 1, now), "request {}", index);
        }
    }
}

/// Requests every `gap` ms for `span` ms: how many each decides granted.
fn granted(count_rejected: bool, gap: u64, span: u64) -> Vec<bool> {
    let mut slots = vec![Slot::new(SlotKind::TimeLog)];
    (0..span / gap)
        .map(|n| {
            let item = log_item(10, 1_000, 1, count_rejected);
            engine::decide(&[item], &mut slots, 1_700_000_000_000 + n * gap).granted
        })
        .collect()
}

/// The variant that logs refusals: with refused requests logged, a client that keeps
/// sending faster than the limit stays limited; without, it gets the limit
/// every window.
#[test]
fn a_hammering_client_stays_out_only_when_refusals_are_logged() {
    // 10 a second, asked every 50 ms (20 a second) for 5 s.
    let plain = granted(false, 50, 5_000);
    let logged = granted(true, 50, 5_000);
    let plain_count = plain.iter().filter(|&&g| g).count();
    let logged_count = logged.iter().filter(|&&g| g).count();
    assert_eq!(plain_count, 50, "10 a second for 5 s");
    assert_eq!(
        logged_count, 10,
        "the first 10, then never again while it hammers"
    );
    // Slower than the limit, logging refusals changes nothing.
    assert_eq!(granted(true, 150, 5_000), granted(false, 150, 5_000));
}

#[test]
fn logs_longer_than_the_cap_are_refused_at_load() {
    let yaml = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 20000, algorithm: sliding_log}\n";
    let errors = config::load_str(yaml, "api.yaml")
        .expect_err("refused")
        .to_string();
    assert!(
        errors.contains("api.yaml:4:") && errors.contains("10000 hits"),
        "{errors}"
    );
    let counted = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_log, count_rejected: true}\n";
    config::load_str(counted, "api.yaml").unwrap_or_else(|errors| panic!("{errors}"));
}

/// The sliding window counter against the exact log, request by request,
/// on a synthetic trace, as Cloudflare measured theirs: both count every
/// request (so neither's decisions change what the other sees), and a
/// request is over when the count before it has reached the limit; a
/// request the counter lets through while the exact count says over is
/// wrongly allowed, the other way wrongly refused. 400 clients, each at its
/// own rate (a tenth of the limit to three times it, uniformly), with
/// exponential gaps, for 20 windows each.
#[test]
fn the_sliding_counter_errs_rarely_against_the_exact_log() {
    use std::collections::VecDeque;
    const LIMIT: u64 = 100;
    const WINDOW: u64 = 60_000;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut unit = move || {
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        ((seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let (mut requests, mut wrongly_allowed, mut wrongly_refused) = (0u64, 0u64, 0u64);
    let start = 1_700_000_040_000u64;
    for _client in 0..400 {
        let rate = (0.1 + 2.9 * unit()) * LIMIT as f64 / WINDOW as f64;
        let mut log: VecDeque<u64> = VecDeque::new();
        // (window start, count) of this window and the last.
        let (mut current, mut previous) = ((start, 0u64), 0u64);
        let mut now = start as f64;
        while now < (start + 20 * WINDOW) as f64 {
            now += -unit().ln() / rate;
            let at = now as u64;
            while log.front().is_some_and(|&t| t + WINDOW < at) {
                log.pop_front();
            }
            let window_start = at - at % WINDOW;
            if window_start != current.0 {
                previous = if window_start == current.0 + WINDOW {
                    current.1
                } else {
                    0
                };
                current = (window_start, 0);
            }
            let exact_over = log.len() as u64 >= LIMIT;
            let estimate =
                engine::sliding::estimate(current.1, previous, WINDOW, at - window_start);
            let estimate_over = estimate >= LIMIT;
            requests += 1;
            match (estimate_over, exact_over) {
                (false, true) => wrongly_allowed += 1,
                (true, false) => wrongly_refused += 1,
                _ => {}
            }
            log.push_back(at);
            current.1 += 1;
        }
    }
    let percent = |n: u64| n as f64 * 100.0 / requests as f64;
    eprintln!(
        "sliding window counter against the exact log: {requests} requests, wrongly allowed {:.3}%, wrongly refused {:.3}%",
        percent(wrongly_allowed),
        percent(wrongly_refused)
    );
    assert!(percent(wrongly_allowed) + percent(wrongly_refused) < 1.0);
}
