//! A concurrency limit (docs/design.md#concurrency-limits): hits held until
//! they are given back ([`refund`](super::refund)) or until `max_hold` has
//! passed, whichever comes first, so that a caller that dies with hits held
//! cannot keep them longer than `max_hold`.
//!
//! Two keys: a log of the held hits (a sliding log whose window is
//! `max_hold`: a hit leaves it `max_hold` after it was taken), and the
//! refunds *owed*. Envoy gives back every hit it asked for, the refused
//! ones too, and says nothing that tells them apart; so a hit that is not
//! held (refused, or in a refused batch) is owed instead, and a refund
//! first pays what is owed before it frees a held hit. Without that, each
//! refused request's refund would free a hit an admitted request still
//! holds. What is owed is forgotten `max_hold` after the last refusal: a
//! lost refund of a refused hit holds an admitted hit longer, never less.

use super::hit_log::HitLog;
use super::sliding_log::{self, LogState};
use super::{Kind, Outcome, Slot, Step, WindowOutcome, WindowState};

/// When a held log stops mattering: `max_hold` after its last hit leaves,
/// so that hits held past their time are still there to be counted by the
/// next decision on the key within another `max_hold`.
fn kept_until(log: &HitLog, max_hold: u64) -> u64 {
    match log.counts_until(max_hold) {
        0 => 0,
        until => until.saturating_add(max_hold),
    }
}

/// The owed refunds in `slots[owed_slot]` at `now`: its count while it
/// lasts (its `expires_at`, `max_hold` after the last hit owed).
fn owed_in(slots: &[Slot], owed_slot: usize, now: u64) -> u64 {
    match slots.get(owed_slot) {
        Some(Slot::Window(state)) if state.expires_at > now => state.count,
        _ => 0,
    }
}

/// Owes `hits` refunds more at `now`: they are forgotten `max_hold` from now.
pub(super) fn owe(slots: &mut [Slot], owed_slot: usize, max_hold: u64, hits: u64, now: u64) {
    let owed = owed_in(slots, owed_slot, now);
    if let Some(slot @ Slot::Window(_)) = slots.get_mut(owed_slot) {
        *slot = Slot::Window(WindowState {
            start: now,
            count: owed.saturating_add(hits),
            expires_at: now.saturating_add(max_hold),
        });
    }
}

/// Gives back `hits`: what is owed first, then the oldest held hits (never
/// below none).
pub(super) fn refund_in(
    slots: &mut [Slot],
    slot: usize,
    owed_slot: usize,
    max_hold: u64,
    hits: u64,
    now: u64,
) {
    let owed = owed_in(slots, owed_slot, now);
    let paid = owed.min(hits);
    if paid > 0
        && let Some(Slot::Window(state)) = slots.get_mut(owed_slot)
    {
        state.count = owed - paid;
    }
    // Hits held past `max_hold` leave first (the caller counts them).
    if let Some(Slot::TimeLog(state)) = slots.get_mut(slot) {
        state.log.prune(now, max_hold);
        let held = state.log.total();
        state.log.truncate(held.saturating_sub(hits - paid));
        state.expires_at = kept_until(&state.log, max_hold);
    }
}

/// The held log in `slots[index]`, if it holds one.
fn log_in(slots: &[Slot], index: usize) -> Option<&LogState> {
    match slots.get(index) {
        Some(Slot::TimeLog(state)) => Some(state),
        _ => None,
    }
}

/// Hits taken more than `max_hold` ago and never given back: they leave
/// the log at the next decision that keeps its state.
pub(super) fn unreturned(slots: &[Slot], slot: usize, max_hold: u64, now: u64) -> u64 {
    log_in(slots, slot).map_or(0, |state| {
        state
            .log
            .total()
            .saturating_sub(state.log.count(now, max_hold))
    })
}

/// Whether a concurrency item is over its limit at `now`.
pub(super) fn item_is_over(
    slots: &[Slot],
    slot: usize,
    limit: u64,
    max_hold: u64,
    hits: u64,
    now: u64,
) -> bool {
    const EMPTY: &LogState = &LogState {
        log: HitLog::EMPTY,
        expires_at: 0,
    };
    sliding_log::is_over(
        log_in(slots, slot).unwrap_or(EMPTY),
        limit,
        max_hold,
        hits,
        now,
    )
}

/// A concurrency limit in a batch: hits held until given back or for
/// `max_hold`; a hit not held is owed its refund instead. `hits == 0` only
/// checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxHoldItem {
    pub slot: usize,
    pub hold: MaxHoldLimits,
    pub hits: u64,
    pub shadow: bool,
}

impl Kind for MaxHoldItem {
    const REFUNDABLE: bool = true;

    fn shadow(&self) -> bool {
        self.shadow
    }

    fn slots(&self) -> [Option<usize>; 2] {
        [Some(self.slot), Some(self.hold.owed_slot)]
    }

    fn map_slots(&mut self, map: &dyn Fn(usize) -> usize) {
        self.slot = map(self.slot);
        self.hold.owed_slot = map(self.hold.owed_slot);
    }

    fn hits(&self) -> u64 {
        self.hits
    }

    fn set_hits(&mut self, hits: u64) {
        self.hits = hits;
    }

    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        item_is_over(
            slots,
            self.slot,
            self.hold.limit,
            self.hold.max_hold,
            self.hits,
            now,
        )
    }

    fn run(&self, step: Step<'_>) -> Outcome {
        run_item(step, self.slot, self.hold, self.hits)
    }

    /// Not held: its refund is owed.
    fn record_refused(&self, slots: &mut [Slot], now: u64) {
        if self.hits > 0 {
            owe(
                slots,
                self.hold.owed_slot,
                self.hold.max_hold,
                self.hits,
                now,
            );
        }
    }

    /// What is owed first, then held hits; hits held past their time leave
    /// the log here too, counted as they go.
    fn refund(&self, step: Step<'_>) -> Outcome {
        let Step { slots, now, commit } = step;
        let MaxHoldLimits {
            owed_slot,
            max_hold,
            ..
        } = self.hold;
        let mut gone = 0;
        if commit {
            gone = unreturned(slots, self.slot, max_hold, now);
            refund_in(slots, self.slot, owed_slot, max_hold, self.hits, now);
        }
        let seen = Step {
            slots,
            now,
            commit: false,
        };
        let mut outcome = run_item(seen, self.slot, self.hold, 0);
        if let Outcome::Window(w) = &mut outcome {
            w.unreturned = gone;
        }
        outcome
    }
}

/// The limits of a concurrency item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxHoldLimits {
    /// The owed refunds' slot.
    pub owed_slot: usize,
    pub limit: u64,
    /// How long a hit is held at most (ms).
    pub max_hold: u64,
}

/// Decides a concurrency item: committing and not over, its hits are held;
/// otherwise they are owed (their refunds will come all the same).
/// Committing, hits held past `max_hold` leave the log.
pub(super) fn run_item(step: Step<'_>, slot: usize, hold: MaxHoldLimits, hits: u64) -> Outcome {
    let Step { slots, now, commit } = step;
    let MaxHoldLimits {
        owed_slot,
        limit,
        max_hold,
    } = hold;
    let unreturned = if commit {
        unreturned(slots, slot, max_hold, now)
    } else {
        0
    };
    let over = item_is_over(slots, slot, limit, max_hold, hits, now);
    if hits > 0 && (!commit || over) {
        owe(slots, owed_slot, max_hold, hits, now);
    }
    let mut fresh = LogState::default();
    let state = match slots.get_mut(slot) {
        Some(Slot::TimeLog(state)) => state,
        _ => &mut fresh,
    };
    let before = state.log.count(now, max_hold);
    if commit {
        if hits > 0 && !over {
            sliding_log::record(state, limit, max_hold, hits, now);
        } else {
            state.log.prune(now, max_hold);
        }
        state.expires_at = kept_until(&state.log, max_hold);
    }
    let seen = sliding_log::outcome(state, over, limit, max_hold, hits, now);
    Outcome::Window(WindowOutcome {
        over,
        limit,
        period: max_hold,
        remaining: seen.remaining,
        before,
        reset_after: seen.reset_after,
        wait: seen.wait,
        retry_after: seen.retry_after,
        unreturned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, Item, SlotKind};

    const HOLD: u64 = 60_000;

    fn slots() -> Vec<Slot> {
        vec![Slot::new(SlotKind::TimeLog), Slot::new(SlotKind::Window)]
    }

    fn take(slots: &mut [Slot], now: u64) -> bool {
        let item = Item::MaxHold(MaxHoldItem {
            slot: 0,
            hold: MaxHoldLimits {
                owed_slot: 1,
                limit: 2,
                max_hold: HOLD,
            },
            hits: 1,
            shadow: false,
        });
        engine::decide(&[item], slots, now).granted
    }

    fn give_back(slots: &mut [Slot], now: u64) {
        let item = Item::Refund(engine::Refundable::MaxHold(MaxHoldItem {
            slot: 0,
            hold: MaxHoldLimits {
                owed_slot: 1,
                limit: 2,
                max_hold: HOLD,
            },
            hits: 1,
            shadow: false,
        }));
        assert!(engine::decide(&[item], slots, now).granted);
    }

    #[test]
    fn a_refused_hits_refund_pays_what_it_owes_not_a_held_hit() {
        let mut slots = slots();
        assert!(take(&mut slots, 1_000));
        assert!(take(&mut slots, 1_001));
        assert!(!take(&mut slots, 1_002));
        // Envoy gives back the refused hit too: two still held.
        give_back(&mut slots, 1_003);
        assert!(!take(&mut slots, 1_004));
        give_back(&mut slots, 1_005);
        // One admitted hit given back: one slot free, one only.
        give_back(&mut slots, 1_006);
        assert!(take(&mut slots, 1_007));
        assert!(!take(&mut slots, 1_008));
    }

    #[test]
    fn hits_never_given_back_leave_after_max_hold() {
        let mut slots = slots();
        assert!(take(&mut slots, 1_000));
        assert!(take(&mut slots, 2_000));
        assert!(!take(&mut slots, 1_000 + HOLD));
        give_back(&mut slots, 1_000 + HOLD + 1);
        assert_eq!(unreturned(&slots, 0, HOLD, 1_000 + HOLD + 1), 0);
        // The first hit left the log; the second stays until its own end.
        assert_eq!(unreturned(&slots, 0, HOLD, 2_001 + HOLD), 1);
        assert!(take(&mut slots, 2_001 + HOLD));
        assert_eq!(unreturned(&slots, 0, HOLD, 2_001 + HOLD), 0);
    }

    #[test]
    fn refunds_never_go_below_nothing() {
        let mut slots = slots();
        for now in 0..5 {
            give_back(&mut slots, 1_000 + now);
        }
        assert!(take(&mut slots, 2_000));
        assert!(take(&mut slots, 2_001));
        assert!(!take(&mut slots, 2_002));
    }
}
