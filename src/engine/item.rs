//! One limit to check in a batch: an [`Item`] of each algorithm's shape,
//! over the slots of the batch it reads. Each algorithm decides its own
//! item in its own file (`window.rs`, `gcra.rs`, `tiers/item.rs`…).

use crate::config::RatePolicy;

use super::{BanLimit, CostOp, GcraLimit, Hold, Refundable};

/// One limit to check in a batch.
#[derive(Debug, Clone, Copy)]
pub enum Item<'a> {
    /// A fixed window (envoyproxy/ratelimit). `hits == 0` only checks.
    Window {
        slot: usize,
        limit: u64,
        period: u64,
        hits: u64,
        shadow: bool,
        /// Its hits are recorded even when it, or the batch, is rejected, as
        /// envoyproxy/ratelimit records them (docs/design.md#all-or-nothing).
        count_rejected: bool,
    },
    /// A cost known after the response (`cost.rs`): a charge (recorded
    /// whatever the verdict), a check that, admitted, counts one request in
    /// flight, or a reservation and its settling.
    Cost {
        slot: usize,
        limit: u64,
        period: u64,
        op: CostOp,
        shadow: bool,
        /// The cost of one request before any was charged.
        initial_cost: u64,
    },
    /// A sliding window counter (`sliding.rs`). `hits == 0` only checks.
    Sliding {
        slot: usize,
        limit: u64,
        period: u64,
        hits: u64,
        shadow: bool,
    },
    /// The hybrid quota-linear limiter (`hybrid.rs`): `quota` per
    /// `window`. `hits == 0` only checks.
    Hybrid {
        slot: usize,
        quota: u64,
        window: u64,
        hits: u64,
        shadow: bool,
    },
    /// A resource's ban as Cloud Armor defines it (`ban.rs`): the hit that
    /// trips it is refused and recorded. `hits == 0` only checks.
    Ban {
        slot: usize,
        limit: BanLimit,
        hits: u64,
        shadow: bool,
    },
    /// A sliding window log (`sliding_log.rs`). `hits == 0` only checks.
    SlidingLog {
        slot: usize,
        limit: u64,
        period: u64,
        hits: u64,
        shadow: bool,
        /// Refused hits are logged too, whatever the verdict.
        count_rejected: bool,
    },
    /// GCRA (a token bucket). `hits == 0` only checks.
    Gcra {
        slot: usize,
        limit: GcraLimit,
        hits: u64,
        shadow: bool,
    },
    /// A concurrency limit (`concurrency.rs`): hits held until given back
    /// or for `max_hold`; a hit not held is owed its refund instead.
    /// `hits == 0` only checks.
    Concurrency {
        slot: usize,
        hold: Hold,
        hits: u64,
        shadow: bool,
    },
    /// Hits given back (`refund.rs`): never over, and applied only if its
    /// batch is granted; the limiter gives refunds a batch of their own.
    Refund {
        slot: usize,
        hits: u64,
        of: Refundable,
    },
    /// Burst tiers: grant the largest `k` in `[min_copies, copies]`.
    Tiers {
        slot: usize,
        /// The resource's global log, when it has a global limit.
        global_slot: Option<usize>,
        policy: &'a RatePolicy,
        global_limit: Option<u64>,
        copies: u64,
        min_copies: u64,
        /// Only ask whether one more hit would be granted.
        check_only: bool,
        shadow: bool,
    },
}

impl Item<'_> {
    /// Whether this item only reports, never rejects.
    pub fn shadow(&self) -> bool {
        match self {
            Item::Window { shadow, .. }
            | Item::Tiers { shadow, .. }
            | Item::Cost { shadow, .. }
            | Item::Sliding { shadow, .. }
            | Item::Hybrid { shadow, .. }
            | Item::SlidingLog { shadow, .. }
            | Item::Ban { shadow, .. }
            | Item::Gcra { shadow, .. }
            | Item::Concurrency { shadow, .. } => *shadow,
            // A refund never rejects.
            Item::Refund { .. } => true,
        }
    }

    /// The slots this item reads: its own, then the global log if any.
    pub fn slots(&self) -> [Option<usize>; 2] {
        match self {
            Item::Window { slot, .. }
            | Item::Gcra { slot, .. }
            | Item::Cost { slot, .. }
            | Item::Hybrid { slot, .. }
            | Item::SlidingLog { slot, .. }
            | Item::Ban { slot, .. }
            | Item::Sliding { slot, .. } => [Some(*slot), None],
            Item::Tiers {
                slot, global_slot, ..
            } => [Some(*slot), *global_slot],
            Item::Concurrency { slot, hold, .. }
            | Item::Refund {
                slot,
                of: Refundable::Concurrency(hold),
                ..
            } => [Some(*slot), Some(hold.owed_slot)],
            Item::Refund { slot, .. } => [Some(*slot), None],
        }
    }

    /// The item's own slot (a domain's tier log, a window's counter).
    pub fn slot(&self) -> usize {
        match self {
            Item::Window { slot, .. }
            | Item::Tiers { slot, .. }
            | Item::Gcra { slot, .. }
            | Item::Cost { slot, .. }
            | Item::Hybrid { slot, .. }
            | Item::SlidingLog { slot, .. }
            | Item::Ban { slot, .. }
            | Item::Sliding { slot, .. }
            | Item::Concurrency { slot, .. }
            | Item::Refund { slot, .. } => *slot,
        }
    }

    /// The same item over renumbered slots (a store deciding part of a batch).
    pub fn map_slots(mut self, map: impl Fn(usize) -> usize) -> Self {
        match &mut self {
            Item::Window { slot, .. }
            | Item::Gcra { slot, .. }
            | Item::Cost { slot, .. }
            | Item::Hybrid { slot, .. }
            | Item::SlidingLog { slot, .. }
            | Item::Ban { slot, .. }
            | Item::Sliding { slot, .. } => *slot = map(*slot),
            Item::Concurrency { slot, hold, .. }
            | Item::Refund {
                slot,
                of: Refundable::Concurrency(hold),
                ..
            } => {
                *slot = map(*slot);
                hold.owed_slot = map(hold.owed_slot);
            }
            Item::Refund { slot, .. } => *slot = map(*slot),
            Item::Tiers {
                slot, global_slot, ..
            } => {
                *slot = map(*slot);
                *global_slot = global_slot.map(&map);
            }
        }
        self
    }
}
