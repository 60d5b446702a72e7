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
//! its item's check, its run, what it records when refused and its refunds
//! live in the algorithm's own file (`window.rs`, `gcra.rs`,
//! `tiers/item.rs`…); `item.rs` lists the kinds, and the hub decides a
//! batch all or nothing.
//!
//! ```rust
//! use charon::engine::{self, Item, Slot, SlotKind, WindowItem};
//! let mut slots = vec![Slot::new(SlotKind::Window)];
//! let items = [Item::Window(WindowItem {
//!     slot: 0, limit: 2, period: 60_000, hits: 1, shadow: false, count_rejected: false,
//! })];
//! assert!(engine::decide(&items, &mut slots, 1_000).granted);
//! assert!(engine::decide(&items, &mut slots, 1_001).granted);
//! assert!(!engine::decide(&items, &mut slots, 1_002).granted);
//! ```

pub mod ban;
pub mod calendar;
pub mod capacity;
pub mod copies;
pub mod cost;
pub mod gcra;
mod hit_log;
pub mod hybrid;
mod item;
pub mod max_hold;
mod outcome;
pub mod refund;
pub mod sliding;
pub mod sliding_log;
mod slot;
pub mod tiers;
pub mod window;

pub use ban::{BanLimit, BanState};
pub use cost::{CostOp, CostState, Reservation};
pub use gcra::{GcraLimit, GcraOutcome, GcraState};
pub use hit_log::HitLog;
pub use hybrid::HybridState;
pub use item::*;
pub(crate) use item::{Kind, kinds, one_slot};
pub use max_hold::MaxHoldLimits;
pub use outcome::{Decision, Outcome, TierOutcome, WindowOutcome};
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
        .all(|item| item.shadow() || !item.is_over(slots, now));
    // Granted: record and report. Rejected: report against the unchanged
    // state, but for what counts rejected hits.
    let outcomes = items
        .iter()
        .map(|item| {
            item.run(Step {
                slots,
                now,
                commit: granted,
            })
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
            item.run(Step {
                slots: &mut scratch,
                now,
                commit: true,
            })
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
            item.record_refused(slots, now);
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
pub(crate) struct Step<'s> {
    pub(crate) slots: &'s mut [Slot],
    pub(crate) now: u64,
    pub(crate) commit: bool,
}

impl<'s> Step<'s> {
    /// The same step, seeing without recording.
    pub(crate) fn seeing(self) -> Step<'s> {
        Step {
            commit: false,
            ..self
        }
    }
}
