//! The decision engine: pure functions of (limits, state, now, request) →
//! (answer, new state). No I/O, no clock, no async, no locks: a store gives
//! the engine the state of every key a request touches, atomically, and writes
//! back what the engine changed. That is what makes every store decide alike.
//!
//! A request is a batch of [`Item`]s (one per limited descriptor) over a set
//! of [`Slot`]s (one per state key). A batch is all or nothing: if any item
//! that is not in shadow mode is over its limit, no slot changes
//! (docs/design.md#all-or-nothing).
//!
//! This file is the hub and holds no algorithm: each algorithm's state,
//! its item's check and its run live in the algorithm's own file
//! (`window.rs`, `gcra.rs`, `tiers/item.rs`…); the hub dispatches an item
//! to its file, and decides a batch all or nothing.
//!
//! ```rust
//! use charon::engine::{self, Item, Slot, SlotKind};
//! let mut slots = vec![Slot::new(SlotKind::Window)];
//! let items = [Item::Window {
//!     slot: 0, limit: 2, period: 60_000, hits: 1, shadow: false, count_rejected: false,
//! }];
//! assert!(engine::decide(&items, &mut slots, 1_000).granted);
//! assert!(engine::decide(&items, &mut slots, 1_001).granted);
//! assert!(!engine::decide(&items, &mut slots, 1_002).granted);
//! ```

pub mod ban;
pub mod capacity;
pub mod concurrency;
pub mod copies;
pub mod cost;
pub mod gcra;
mod hit_log;
pub mod hybrid;
mod item;
mod outcome;
pub mod refund;
pub mod sliding;
pub mod sliding_log;
mod slot;
pub mod tiers;
pub mod window;

pub use ban::{BanLimit, BanState};
pub use concurrency::Hold;
pub use cost::{CostOp, CostState, Reservation};
pub use gcra::{GcraLimit, GcraOutcome, GcraState};
pub use hit_log::HitLog;
pub use hybrid::HybridState;
pub use item::Item;
pub use outcome::{Decision, Outcome, TierOutcome, WindowOutcome};
pub use refund::Refundable;
pub use sliding::SlidingState;
pub use sliding_log::LogState;
pub use slot::{Slot, SlotKind};
pub use tiers::{Global, Phase, Snapshot, TierState};
pub use window::WindowState;

use smallvec::SmallVec;

/// The unit of a tier item's `wait`: Envoy carries whole seconds, and with
/// tiers the first whole second after the first fitting millisecond may not
/// fit any more ([`tiers::wait_for`]).
pub const WAIT_STEP: u64 = 1_000;

/// Decides a batch at `now`, changing `slots` only if it is granted (but
/// for windows that count rejected hits, which record theirs either way).
pub fn decide(items: &[Item<'_>], slots: &mut [Slot], now: u64) -> Decision {
    if shares_slots(items) {
        return decide_in_order(items, slots, now);
    }
    let granted = items
        .iter()
        .all(|item| item.shadow() || !is_over(item, slots, now));
    // Granted: record and report. Rejected: report against the unchanged
    // state, but for what counts rejected hits.
    let outcomes = items
        .iter()
        .map(|item| {
            run(
                item,
                Step {
                    slots,
                    now,
                    commit: granted,
                },
            )
        })
        .collect();
    Decision {
        granted,
        outcomes,
        now,
        degraded: false,
    }
}

/// Two items on one key must see each other's hits, in order: run them one
/// by one on a copy and keep it only if the batch passes. A rejected batch
/// records nothing, but each item is reported as it was counted in order, so
/// the occurrence that crosses its limit is the one over it
/// (docs/design.md#all-or-nothing).
fn decide_in_order(items: &[Item<'_>], slots: &mut [Slot], now: u64) -> Decision {
    let mut scratch = slots.to_vec();
    let mut outcomes: SmallVec<[Outcome; 1]> = items
        .iter()
        .map(|item| {
            run(
                item,
                Step {
                    slots: &mut scratch,
                    now,
                    commit: true,
                },
            )
        })
        .collect();
    let granted = passes(items, &outcomes);
    if granted {
        slots.clone_from_slice(&scratch);
    } else {
        // Nothing held past its time left a log either.
        for outcome in &mut outcomes {
            if let Outcome::Window(w) = outcome {
                w.unreturned = 0;
            }
        }
        // Rejected: only the hits that count anyway, in order.
        for item in items {
            match *item {
                Item::Window {
                    slot,
                    period,
                    hits,
                    count_rejected: true,
                    ..
                } if hits > 0 => {
                    window::record_in(slots, slot, period, hits, now);
                }
                Item::Ban {
                    slot, limit, hits, ..
                } if hits > 0 => {
                    if let Some(Slot::Ban(state)) = slots.get_mut(slot) {
                        let decision = ban::decide(state, &limit, hits, now);
                        if decision.over {
                            *state = decision.after;
                        }
                    }
                }
                Item::SlidingLog {
                    slot,
                    limit,
                    period,
                    hits,
                    count_rejected: true,
                    ..
                } if hits > 0 => {
                    if let Some(Slot::SlidingLog(state)) = slots.get_mut(slot) {
                        sliding_log::record(state, limit, period, hits, now);
                    }
                }
                Item::Cost {
                    slot,
                    period,
                    op: CostOp::Hits(hits),
                    ..
                } if hits > 0 => {
                    if let Some(Slot::Cost(state)) = slots.get_mut(slot) {
                        cost::charge(state, period, hits, now);
                    }
                }
                // Not held: its refund is owed.
                Item::Concurrency { hold, hits, .. } if hits > 0 => {
                    concurrency::owe(slots, hold.owed_slot, hold.max_hold, hits, now);
                }
                _ => {}
            }
        }
    }
    Decision {
        granted,
        outcomes,
        now,
        degraded: false,
    }
}

fn passes(items: &[Item<'_>], outcomes: &[Outcome]) -> bool {
    items
        .iter()
        .zip(outcomes)
        .all(|(item, outcome)| !outcome.over() || item.shadow())
}

fn shares_slots(items: &[Item<'_>]) -> bool {
    let mut used: SmallVec<[usize; 8]> = items.iter().flat_map(Item::slots).flatten().collect();
    let count = used.len();
    used.sort_unstable();
    used.dedup();
    used.len() != count
}

/// Where one item is decided: the batch's slots, the instant, and whether
/// what passes is recorded.
struct Step<'s> {
    slots: &'s mut [Slot],
    now: u64,
    commit: bool,
}

/// Whether `item` is over its limit at `now`, in its algorithm's file.
fn is_over(item: &Item<'_>, slots: &[Slot], now: u64) -> bool {
    match *item {
        Item::Window {
            slot,
            limit,
            period,
            hits,
            ..
        } => window::item_is_over(slots, slot, limit, period, hits, now),
        Item::Sliding {
            slot,
            limit,
            period,
            hits,
            ..
        } => sliding::item_is_over(slots, slot, limit, period, hits, now),
        Item::Cost {
            slot,
            limit,
            period,
            op,
            initial_cost,
            ..
        } => cost::item_is_over(slots, slot, limit, period, op, initial_cost, now),
        Item::Hybrid {
            slot,
            quota,
            window,
            hits,
            ..
        } => hybrid::item_is_over(slots, slot, quota, window, hits, now),
        Item::Ban {
            slot, limit, hits, ..
        } => ban::item_is_over(slots, slot, limit, hits, now),
        Item::SlidingLog {
            slot,
            limit,
            period,
            hits,
            ..
        } => sliding_log::item_is_over(slots, slot, limit, period, hits, now),
        Item::Gcra {
            slot, limit, hits, ..
        } => gcra::item_is_over(slots, slot, limit, hits, now),
        Item::Concurrency {
            slot, hold, hits, ..
        } => concurrency::item_is_over(slots, slot, hold.limit, hold.max_hold, hits, now),
        Item::Refund { .. } => false,
        Item::Tiers {
            slot,
            global_slot,
            policy,
            global_limit,
            copies,
            min_copies,
            check_only,
            ..
        } => tiers::item_is_over(
            slots,
            slot,
            global_slot,
            policy,
            global_limit,
            tiers::TierAsk {
                copies,
                min_copies,
                check_only,
            },
            now,
        ),
    }
}

/// Decides one item in its algorithm's file and, if `step.commit` and it
/// passes, records it (a window that counts rejected hits records them
/// whatever the verdict).
fn run(item: &Item<'_>, step: Step<'_>) -> Outcome {
    match *item {
        Item::Window {
            slot,
            limit,
            period,
            hits,
            count_rejected,
            ..
        } => window::run_item(step, slot, limit, period, hits, count_rejected),
        Item::Sliding {
            slot,
            limit,
            period,
            hits,
            ..
        } => sliding::run_item(step, slot, limit, period, hits),
        Item::Cost {
            slot,
            limit,
            period,
            op,
            initial_cost,
            ..
        } => cost::run_item(step, slot, limit, period, op, initial_cost),
        Item::Ban {
            slot, limit, hits, ..
        } => ban::run_item(step, slot, limit, hits),
        Item::SlidingLog {
            slot,
            limit,
            period,
            hits,
            count_rejected,
            ..
        } => sliding_log::run_item(step, slot, limit, period, hits, count_rejected),
        Item::Hybrid {
            slot,
            quota,
            window,
            hits,
            ..
        } => hybrid::run_item(step, slot, quota, window, hits),
        Item::Gcra {
            slot, limit, hits, ..
        } => gcra::run_item(step, slot, limit, hits),
        Item::Concurrency {
            slot, hold, hits, ..
        } => concurrency::run_item(step, slot, hold, hits),
        Item::Refund { slot, hits, of } => refund::run_item(step, slot, hits, of),
        Item::Tiers {
            slot,
            global_slot,
            policy,
            global_limit,
            copies,
            min_copies,
            check_only,
            ..
        } => tiers::run_item(
            step,
            slot,
            global_slot,
            policy,
            global_limit,
            tiers::TierAsk {
                copies,
                min_copies,
                check_only,
            },
        ),
    }
}
