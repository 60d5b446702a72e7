//! The token-budget benchmark (scripts/bench-budget.sh) in virtual time, on
//! the engine: 64 streams check, run 0.2-3 s, and charge a log-normal cost
//! (median 500, p95 about 2 500) against 100 000 a minute, for 9 whole
//! minutes on each of 5 fixed seeds. Deterministic: the same draws every
//! run. Predicted admission (`cost: after_response`) must hold the budget on
//! average where check-then-charge (a window counting rejected hits)
//! overshoots it by tens of percent.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use charon::engine::{self, CostItem, CostOp, Item, Slot, SlotKind, WindowItem};
use charon::simulate::costs::{CostDraws, max_tokens};

const PERIOD: u64 = 60_000;
const LIMIT: u64 = 100_000;
const STREAMS: u64 = 64;

/// The shape of a load: the window, how long a request runs, how soon a
/// refused stream asks again.
#[derive(Debug, Clone, Copy)]
struct Load {
    period: u64,
    /// A request's time from admission to charge: uniform in this range (ms).
    duration: (u64, u64),
    retry: u64,
    /// Whole windows measured (after a first one that starts empty).
    windows: u64,
}

/// The benchmark's load (scripts/bench-budget.sh).
const BENCH: Load = Load {
    period: PERIOD,
    duration: (200, 3_000),
    retry: 100,
    windows: 9,
};

/// Short windows, short requests, quick retries: 20-s windows, requests of
/// 0.2 to 1.5 s, a refused stream asking again after 50 ms.
const SHORT: Load = Load {
    period: 20_000,
    duration: (200, 1_500),
    retry: 50,
    windows: 20,
};

/// What a stream asks of the budget.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Before its request, which will cost `cost`.
    Admit { stream: u64, cost: u64 },
    /// After it: `cost` is known.
    Settle { stream: u64, cost: u64 },
}

/// Envoy's way: a check (`hits` 0), then a charge of the cost.
fn envoy(item: impl Fn(u64) -> Item<'static> + Copy) -> impl Fn(Step) -> Item<'static> + Copy {
    move |step| match step {
        Step::Admit { .. } => item(0),
        Step::Settle { cost, .. } => item(cost),
    }
}

/// The overshoot of each whole window (percent of the budget), with `item`
/// making the admission or the settling of a stream's request.
fn overshoots(
    seed: u64,
    load: Load,
    item: impl Fn(Step) -> Item<'static>,
    kind: SlotKind,
    reserving: bool,
) -> Vec<f64> {
    let Load {
        period,
        duration: (shortest, longest),
        retry,
        windows,
    } = load;
    let start = 1_700_000_040_000;
    let mut slots = vec![Slot::new(kind)];
    let mut draws = CostDraws::new(seed);
    // (time, stream, cost to charge, or 0 for a check)
    let mut events: BinaryHeap<Reverse<(u64, u64, u64)>> =
        (0..STREAMS).map(|s| Reverse((start + s, s, 0))).collect();
    let mut charged = BTreeMap::<u64, u64>::new();
    // Each stream's next request's cost, drawn when it is first asked for.
    let mut next_cost = vec![None; STREAMS as usize];
    while let Some(Reverse((now, stream, cost))) = events.pop() {
        if now > start + (windows + 2) * period {
            break;
        }
        let step = if cost > 0 {
            Step::Settle { stream, cost }
        } else if reserving {
            let cost = *next_cost[stream as usize].get_or_insert_with(|| draws.cost());
            Step::Admit { stream, cost }
        } else {
            // A check needs no cost: drawn once admitted, so the draws come
            // in the order the published figures were measured with.
            Step::Admit { stream, cost: 0 }
        };
        let granted = engine::decide(&[item(step)], &mut slots, now).granted;
        if cost > 0 {
            *charged.entry(now / period).or_default() += cost;
            events.push(Reverse((now + 1, stream, 0)));
        } else if granted {
            let cost = next_cost[stream as usize]
                .take()
                .unwrap_or_else(|| draws.cost());
            let took = if (shortest, longest) == BENCH.duration {
                // The benchmark's draws, as the published figures were made.
                draws.duration_ms()
            } else {
                shortest + (draws.unit() * (longest - shortest) as f64) as u64
            };
            events.push(Reverse((now + took, stream, cost)));
        } else {
            events.push(Reverse((now + retry, stream, 0)));
        }
    }
    // The first minute starts empty; the last is cut short.
    charged
        .values()
        .skip(1)
        .take(windows as usize)
        .map(|&sum| (sum as f64 - LIMIT as f64) / LIMIT as f64 * 100.0)
        .collect()
}

fn mean_and_max(
    item: impl Fn(Step) -> Item<'static> + Copy,
    kind: SlotKind,
    reserving: bool,
) -> (f64, f64) {
    let all = all_windows(BENCH, item, kind, reserving);
    let mean = all.iter().sum::<f64>() / all.len() as f64;
    (mean, all.iter().copied().fold(f64::MIN, f64::max))
}

/// Every measured window's overshoot, over 5 fixed seeds.
fn all_windows(
    load: Load,
    item: impl Fn(Step) -> Item<'static> + Copy,
    kind: SlotKind,
    reserving: bool,
) -> Vec<f64> {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|seeds| seeds.parse().ok())
        .unwrap_or(5);
    (1..=seeds)
        .flat_map(|seed| {
            overshoots(
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                load,
                item,
                kind,
                reserving,
            )
        })
        .collect()
}

/// A load's windows, summed up: mean, 90th and 95th percentiles, worst,
/// and how many passed the budget by more than 5 %.
#[derive(Debug)]
struct Distribution {
    windows: usize,
    mean: f64,
    p90: f64,
    p95: f64,
    worst: f64,
    over_5: usize,
}

fn distribution(mut windows: Vec<f64>) -> Distribution {
    windows.sort_by(f64::total_cmp);
    let at = |share: usize| windows[(windows.len() * share / 100).min(windows.len() - 1)];
    Distribution {
        windows: windows.len(),
        mean: windows.iter().sum::<f64>() / windows.len() as f64,
        p90: at(90),
        p95: at(95),
        worst: windows[windows.len() - 1],
        over_5: windows.iter().filter(|w| **w > 5.0).count(),
    }
}

fn predicted(period: u64) -> impl Fn(Step) -> Item<'static> + Copy {
    envoy(move |hits| {
        Item::Cost(CostItem {
            slot: 0,
            limit: LIMIT,
            period,
            op: CostOp::Hits(hits),
            shadow: false,
            initial_cost: 1_000,
        })
    })
}

/// Predicted admission per window, on the benchmark's load and on short
/// windows with short requests and quick retries, where it passed the
/// budget by 8 to 10 % in most windows while the prediction's spread was
/// three deviations (docs/performance.md#token-budgets-under-concurrency
/// has the figures and why). `SIM_SEEDS=20` runs four times the windows.
#[test]
fn predicted_admission_holds_the_budget_in_nearly_every_window() {
    for (name, load) in [("benchmark", BENCH), ("short windows", SHORT)] {
        let seen = distribution(all_windows(
            load,
            predicted(load.period),
            SlotKind::Cost,
            false,
        ));
        eprintln!(
            "{name}: {} windows, overshoot mean {:+.1}%, p90 {:+.1}%, p95 {:+.1}%, worst {:+.1}%, {} over +5%",
            seen.windows, seen.mean, seen.p90, seen.p95, seen.worst, seen.over_5
        );
        assert!(seen.mean >= -10.0, "{name}: at least 90 % used: {seen:?}");
        assert!(seen.p95 <= 0.0, "{name}: {seen:?}");
        assert!(
            seen.over_5 * 100 <= seen.windows * 3,
            "{name}: at most 3 % of the windows over +5 %: {seen:?}"
        );
    }
}

#[test]
fn predicted_admission_holds_a_budget_on_average_where_check_then_charge_does_not() {
    let (predicted, predicted_max) = mean_and_max(
        envoy(|hits| {
            Item::Cost(CostItem {
                slot: 0,
                limit: LIMIT,
                period: PERIOD,
                op: CostOp::Hits(hits),
                shadow: false,
                initial_cost: 1_000,
            })
        }),
        SlotKind::Cost,
        false,
    );
    let (counted, counted_max) = mean_and_max(
        envoy(|hits| {
            Item::Window(WindowItem {
                slot: 0,
                limit: LIMIT,
                period: PERIOD,
                hits,
                shadow: false,
                count_rejected: true,
            })
        }),
        SlotKind::Window,
        false,
    );
    eprintln!(
        "overshoot per minute, mean (max) of 45: cost: after_response {predicted:+.1}% ({predicted_max:+.1}%), check-then-charge {counted:+.1}% ({counted_max:+.1}%)"
    );
    assert!(predicted <= 2.0, "cost: after_response: {predicted:+.1}%");
    assert!(counted >= 20.0, "check-then-charge: {counted:+.1}%");
}

/// Reserving each request's `max_tokens` (an upper bound within twice its
/// cost) and committing the cost never overshoots: what is in flight is
/// held at no less than it will cost. What it gives up is use: the budget
/// held but not spent by requests still running when a window ends.
#[test]
fn reserving_max_tokens_never_overshoots_and_uses_most_of_the_budget() {
    let reserve = |step| {
        let op = match step {
            Step::Admit { stream, cost } => CostOp::Reserve {
                id: stream + 1,
                amount: max_tokens(cost),
                ttl: 10_000,
                charge_on_expiry: true,
            },
            Step::Settle { stream, cost } => CostOp::Commit {
                id: stream + 1,
                actual: cost,
            },
        };
        Item::Cost(CostItem {
            slot: 0,
            limit: LIMIT,
            period: PERIOD,
            op,
            shadow: false,
            initial_cost: 1_000,
        })
    };
    let (mean, max) = mean_and_max(reserve, SlotKind::Cost, true);
    eprintln!(
        "reserve max_tokens, commit the cost: overshoot per minute, mean {mean:+.1}% (max {max:+.1}%)"
    );
    assert!(max <= 0.0, "never over: {max:+.1}%");
    assert!(mean >= -5.0, "most of the budget used: {mean:+.1}%");
}
