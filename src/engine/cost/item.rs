//! A cost budget in a batch ([`CostItem`]): a charge, a check, a
//! reservation or its settling, decided on the budget's state by the rules
//! of `cost.rs`.

use crate::engine::{Kind, Outcome, Slot, Step, WindowOutcome};

use super::{CostOp, CostState, admit, apply, charge, check};

/// A cost known after the response, in a batch: a charge (recorded
/// whatever the verdict), a check that, admitted, counts one request in
/// flight, or a reservation and its settling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostItem {
    pub slot: usize,
    pub limit: u64,
    pub period: u64,
    pub op: CostOp,
    pub shadow: bool,
    /// The cost of one request before any was charged.
    pub initial_cost: u64,
}

impl Kind for CostItem {
    const REFUNDABLE: bool = true;

    fn shadow(&self) -> bool {
        self.shadow
    }

    fn slots(&self) -> [Option<usize>; 2] {
        [Some(self.slot), None]
    }

    fn map_slots(&mut self, map: &dyn Fn(usize) -> usize) {
        self.slot = map(self.slot);
    }

    fn hits(&self) -> u64 {
        self.op.amount()
    }

    fn set_hits(&mut self, hits: u64) {
        self.op = CostOp::Hits(hits);
    }

    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        item_is_over(
            slots,
            self.slot,
            self.limit,
            self.period,
            self.op,
            self.initial_cost,
            now,
        )
    }

    fn run(&self, step: Step<'_>) -> Outcome {
        run_item(
            step,
            self.slot,
            self.limit,
            self.period,
            self.op,
            self.initial_cost,
        )
    }

    /// A charge is recorded whatever the verdict.
    fn record_refused(&self, slots: &mut [Slot], now: u64) {
        if let CostOp::Hits(hits) = self.op
            && hits > 0
            && let Some(Slot::Cost(state)) = slots.get_mut(self.slot)
        {
            charge(state, self.period, hits, now);
        }
    }

    /// Cost units back, in the current window: a refund is its own
    /// operation, applied as it is decided.
    fn refund(&self, step: Step<'_>) -> Outcome {
        let hits = self.op.amount();
        let op = if hits > 0 {
            CostOp::Refund {
                amount: hits,
                charged_at: step.now,
            }
        } else {
            CostOp::Hits(0)
        };
        let step = Step {
            commit: step.commit && hits > 0,
            ..step
        };
        run_item(
            step,
            self.slot,
            self.limit,
            self.period,
            op,
            self.initial_cost,
        )
    }
}

/// Whether a cost budget's item is over its limit at `now`.
fn item_is_over(
    slots: &[Slot],
    slot: usize,
    limit: u64,
    period: u64,
    op: CostOp,
    initial_cost: u64,
    now: u64,
) -> bool {
    const FRESH: CostState = CostState::FRESH;
    let state = match slots.get(slot) {
        Some(Slot::Cost(state)) => state,
        _ => &FRESH,
    };
    check(state, limit, period, initial_cost, op, now).over
}

/// Decides a cost budget's item and, committing, records what passes (and what
/// counts whatever the verdict).
fn run_item(
    step: Step<'_>,
    slot: usize,
    limit: u64,
    period: u64,
    op: CostOp,
    initial_cost: u64,
) -> Outcome {
    let Step { slots, now, commit } = step;
    let mut fresh = CostState::FRESH;
    let state = match slots.get_mut(slot) {
        Some(Slot::Cost(state)) => state,
        _ => &mut fresh,
    };
    let seen = check(state, limit, period, initial_cost, op, now);
    match op {
        CostOp::Hits(hits) if hits > 0 => charge(state, period, hits, now),
        _ if !commit || seen.over => {}
        CostOp::Hits(_) => admit(state, period, now),
        _ => apply(state, period, op, now),
    }
    let after = check(state, limit, period, initial_cost, CostOp::Hits(0), now);
    let spent = after.spent();
    let reset_after = seen.window_end - now;
    // Room comes back when the window ends (or sooner, as requests
    // in flight are charged less than predicted); a reservation
    // larger than the limit never fits, and a commit, cancel or
    // refund that did not apply will not apply later.
    let wait = match op {
        _ if !seen.over => Some(0),
        CostOp::Hits(_) => Some(reset_after),
        CostOp::Reserve { amount, .. } if amount <= limit => Some(reset_after),
        _ => None,
    };
    Outcome::Window(WindowOutcome {
        over: seen.over,
        limit,
        period,
        remaining: limit.saturating_sub(spent),
        before: seen.spent(),
        reset_after,
        wait,
        retry_after: Some(if spent < limit { 0 } else { reset_after }),
        unreturned: 0,
    })
}
