//! The envoyproxy/ratelimit fixed window: a counter per window aligned to the
//! Unix epoch, reset when the next window starts.

use super::{Kind, Outcome, Slot, Step, WindowOutcome};

/// The counter of the current window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowState {
    /// Start of the window `count` belongs to (ms since the epoch).
    pub start: u64,
    pub count: u64,
    /// The window's end: after it this counter means nothing.
    pub expires_at: u64,
}

/// What a fixed-window check says at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCheck {
    pub over: bool,
    /// Hits already counted in the current window.
    pub count: u64,
    pub window_end: u64,
}

pub fn window_start(now: u64, period: u64) -> u64 {
    now - now % period.max(1)
}

/// Checks `hits` against `limit` (0 hits: would the next hit pass?).
pub fn check(state: &WindowState, limit: u64, period: u64, hits: u64, now: u64) -> WindowCheck {
    let start = window_start(now, period);
    check_in(state, limit, start, start.saturating_add(period), hits)
}

/// [`check`] in the window `[start, end)`, wherever its boundaries come
/// from (the epoch's periods, or a calendar's).
pub fn check_in(state: &WindowState, limit: u64, start: u64, end: u64, hits: u64) -> WindowCheck {
    let count = if state.start == start { state.count } else { 0 };
    WindowCheck {
        over: count.saturating_add(hits.max(1)) > limit,
        count,
        window_end: end,
    }
}

/// The answer to `hits` of a window of `period` ms that `check` saw,
/// `count` hits in it after the decision.
pub(super) fn outcome(
    check: &WindowCheck,
    count: u64,
    limit: u64,
    period: u64,
    hits: u64,
    now: u64,
) -> WindowOutcome {
    let wait = if !check.over {
        Some(0)
    } else if hits.max(1) > limit {
        None
    } else {
        Some(check.window_end - now)
    };
    WindowOutcome {
        over: check.over,
        limit,
        period,
        remaining: limit.saturating_sub(count),
        before: check.count,
        reset_after: check.window_end - now,
        wait,
        retry_after: retry_after(&WindowCheck { count, ..*check }, limit, now),
        unreturned: 0,
    }
}

/// Records `hits` granted at `now`.
pub fn record(state: &mut WindowState, period: u64, hits: u64, now: u64) {
    let start = window_start(now, period);
    if state.start != start {
        *state = WindowState {
            start,
            count: 0,
            expires_at: start.saturating_add(period),
        };
    }
    state.count = state.count.saturating_add(hits);
}

/// Gives `hits` back to the current window's count at `now` (a window
/// that has ended has nothing to give back to).
pub(super) fn refund_in(slots: &mut [Slot], slot: usize, period: u64, hits: u64, now: u64) {
    if let Some(Slot::Window(state)) = slots.get_mut(slot)
        && state.start == window_start(now, period)
    {
        state.count = state.count.saturating_sub(hits);
    }
}

/// When a one-hit request would pass: now if there is room, at the next
/// window otherwise, never if the limit is 0.
pub fn retry_after(check: &WindowCheck, limit: u64, now: u64) -> Option<u64> {
    if limit == 0 {
        None
    } else if check.count < limit {
        Some(0)
    } else {
        Some(check.window_end - now)
    }
}

/// A fixed window in a batch (envoyproxy/ratelimit's). `hits == 0` only
/// checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowItem {
    pub slot: usize,
    pub limit: u64,
    pub period: u64,
    pub hits: u64,
    pub shadow: bool,
    /// Its hits are recorded even when it, or the batch, is rejected, as
    /// envoyproxy/ratelimit records them (docs/design.md#all-or-nothing).
    pub count_rejected: bool,
}

impl Kind for WindowItem {
    const REFUNDABLE: bool = true;

    super::one_slot!();

    /// Whether a fixed-window item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        let state = state_in(slots, self.slot);
        check(&state, self.limit, self.period, self.hits, now).over
    }

    /// Decides a fixed-window item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let (slot, limit, period, hits) = (self.slot, self.limit, self.period, self.hits);
        let count_rejected = self.count_rejected;
        let Step { slots, now, commit } = step;
        let before = state_in(slots, slot);
        let check = check(&before, limit, period, hits, now);
        let mut count = check.count;
        if hits > 0 && (count_rejected || (commit && !check.over)) {
            count = record_in(slots, slot, period, hits, now);
        }
        Outcome::Window(outcome(&check, count, limit, period, hits, now))
    }

    fn record_refused(&self, slots: &mut [Slot], now: u64) {
        if self.count_rejected && self.hits > 0 {
            record_in(slots, self.slot, self.period, self.hits, now);
        }
    }

    /// The current window's count, never below 0.
    fn refund(&self, step: Step<'_>) -> Outcome {
        if step.commit {
            refund_in(step.slots, self.slot, self.period, self.hits, step.now);
        }
        Self {
            hits: 0,
            count_rejected: false,
            ..*self
        }
        .run(step.seeing())
    }
}

/// The window in `slots[index]`, or an empty one.
pub(super) fn state_in(slots: &[Slot], index: usize) -> WindowState {
    match slots.get(index) {
        Some(Slot::Window(state)) => state.clone(),
        _ => WindowState::default(),
    }
}

/// Records `hits` of a window at `now` in `slots[slot]`; the count after.
pub(super) fn record_in(slots: &mut [Slot], slot: usize, period: u64, hits: u64, now: u64) -> u64 {
    match slots.get_mut(slot) {
        Some(Slot::Window(state)) => {
            record(state, period, hits, now);
            state.expires_at = window_start(now, period).saturating_add(period);
            state.count
        }
        _ => 0,
    }
}
