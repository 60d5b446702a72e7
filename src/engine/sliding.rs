//! The sliding window counter (docs/design.md#sliding-windows): the count
//! of the current fixed window plus the previous window's, weighted by how
//! much of the previous window the sliding window still covers. O(1) state
//! per key, an estimate that assumes the previous window's hits were
//! spread evenly.
//!
//! The weight is kept in fixed point (1/65 536) and every product stays
//! below 2^53, so that `decide.lua` computes the same estimate to the hit.

use super::{Kind, Outcome, Slot, Step, WindowOutcome};

use super::window::window_start;

/// Fixed-point scale of the previous window's weight.
pub const WEIGHT_SCALE: u64 = 65_536;

/// The two windows of a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlidingState {
    /// Start of the window `current` counts.
    pub start: u64,
    pub current: u64,
    /// The window before `start`'s.
    pub previous: u64,
    pub expires_at: u64,
}

/// What a check sees at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingCheck {
    pub over: bool,
    /// The estimate before this request.
    pub estimate: u64,
    /// The current window's count and the previous one's, as of `now`.
    pub current: u64,
    pub previous: u64,
    pub window_start: u64,
}

/// The counts as of `now`'s window: (current, previous).
fn rolled(state: &SlidingState, period: u64, now: u64) -> (u64, u64) {
    let start = window_start(now, period);
    if state.start == start {
        (state.current, state.previous)
    } else if state.start.saturating_add(period) == start {
        (0, state.current)
    } else {
        (0, 0)
    }
}

/// The estimate `elapsed` ms into a window with these counts.
pub fn estimate(current: u64, previous: u64, period: u64, elapsed: u64) -> u64 {
    let period = period.max(1);
    let left = period.saturating_sub(elapsed);
    let weight = left.saturating_mul(WEIGHT_SCALE) / period;
    current.saturating_add(previous.saturating_mul(weight) / WEIGHT_SCALE)
}

/// Checks `hits` (0: would one more pass?) against `limit` at `now`.
pub fn check(state: &SlidingState, limit: u64, period: u64, hits: u64, now: u64) -> SlidingCheck {
    let (current, previous) = rolled(state, period, now);
    let start = window_start(now, period);
    let estimate = estimate(current, previous, period, now - start);
    SlidingCheck {
        over: estimate.saturating_add(hits.max(1)) > limit,
        estimate,
        current,
        previous,
        window_start: start,
    }
}

/// Records `hits` granted at `now`.
pub fn record(state: &mut SlidingState, period: u64, hits: u64, now: u64) {
    let (current, previous) = rolled(state, period, now);
    let start = window_start(now, period);
    *state = SlidingState {
        start,
        current: current.saturating_add(hits),
        previous,
        // The current window still counts, as the previous one, for a
        // whole window after it.
        expires_at: start.saturating_add(period.saturating_mul(2)),
    };
}

/// When `hits` more would pass (ms from `now`): the first millisecond the
/// estimate leaves room, found by bisection (it only falls within a
/// window); `None` if never (more hits than the limit).
pub fn retry_after(
    state: &SlidingState,
    limit: u64,
    period: u64,
    hits: u64,
    now: u64,
) -> Option<u64> {
    let hits = hits.max(1);
    if hits > limit {
        return None;
    }
    let period = period.max(1);
    let (current, previous) = rolled(state, period, now);
    let start = window_start(now, period);
    let fits = |current: u64, previous: u64, elapsed: u64| {
        estimate(current, previous, period, elapsed).saturating_add(hits) <= limit
    };
    // In this window, from now on; else in the next, where this window's
    // count is the previous one.
    for (window, current, previous, from) in [
        (start, current, previous, now - start),
        (start + period, 0, current, 0),
    ] {
        if !fits(current, previous, period - 1) {
            continue;
        }
        let (mut low, mut high) = (from, period - 1);
        while low < high {
            let middle = low + (high - low) / 2;
            if fits(current, previous, middle) {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        return Some((window + low).saturating_sub(now));
    }
    // Two windows on, both counts have slid out.
    Some((start + 2 * period).saturating_sub(now))
}

/// A sliding window counter in a batch. `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingItem {
    pub slot: usize,
    pub limit: u64,
    pub period: u64,
    pub hits: u64,
    pub shadow: bool,
}

impl Kind for SlidingItem {
    const REFUNDABLE: bool = true;

    super::one_slot!();

    /// Whether a sliding window counter's item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        let state = state_in(slots, self.slot);
        check(&state, self.limit, self.period, self.hits, now).over
    }

    /// Decides a sliding window counter's item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let (slot, limit, period, hits) = (self.slot, self.limit, self.period, self.hits);
        let Step { slots, now, commit } = step;
        let before = state_in(slots, slot);
        let seen = check(&before, limit, period, hits, now);
        let mut after = before;
        if commit && !seen.over && hits > 0 {
            record(&mut after, period, hits, now);
            if let Some(entry) = slots.get_mut(slot) {
                *entry = Slot::Sliding(after);
            }
        }
        let counted = check(&after, limit, period, 0, now);
        let reset_after = if counted.current > 0 {
            counted.window_start + 2 * period - now
        } else if counted.previous > 0 {
            counted.window_start + period - now
        } else {
            0
        };
        Outcome::Window(WindowOutcome {
            over: seen.over,
            limit,
            period,
            remaining: limit.saturating_sub(counted.estimate),
            before: seen.estimate,
            reset_after,
            wait: if seen.over {
                retry_after(&before, limit, period, hits, now)
            } else {
                Some(0)
            },
            retry_after: retry_after(&after, limit, period, 1, now),
            unreturned: 0,
        })
    }

    /// The current window's count, never below 0.
    fn refund(&self, step: Step<'_>) -> Outcome {
        if step.commit {
            refund_in(step.slots, self.slot, self.period, self.hits, step.now);
        }
        Self { hits: 0, ..*self }.run(step.seeing())
    }
}

/// The counters in `slots[index]`, or empty ones.
fn state_in(slots: &[Slot], index: usize) -> SlidingState {
    match slots.get(index) {
        Some(Slot::Sliding(state)) => *state,
        _ => SlidingState::default(),
    }
}

/// Gives `hits` back to the current window's count at `now` (the previous
/// window's hits are only weighed, never given back).
pub(super) fn refund_in(slots: &mut [Slot], slot: usize, period: u64, hits: u64, now: u64) {
    if let Some(Slot::Sliding(state)) = slots.get_mut(slot)
        && state.start == window_start(now, period)
    {
        state.current = state.current.saturating_sub(hits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    #[test]
    fn the_previous_window_counts_as_much_as_it_is_still_covered() {
        let mut state = SlidingState::default();
        for _ in 0..10 {
            record(&mut state, MINUTE, 1, 30_000);
        }
        // A quarter into the next window, 3/4 of the previous 10 count.
        let seen = check(&state, 10, MINUTE, 1, MINUTE + 15_000);
        assert_eq!((seen.current, seen.previous, seen.estimate), (0, 10, 7));
        assert!(!seen.over);
        assert!(check(&state, 7, MINUTE, 1, MINUTE + 15_000).over);
        // Two windows on: nothing left.
        assert_eq!(check(&state, 1, MINUTE, 1, 2 * MINUTE + 1).estimate, 0);
    }

    #[test]
    fn retry_after_is_the_first_millisecond_with_room() {
        let mut state = SlidingState::default();
        for _ in 0..10 {
            record(&mut state, MINUTE, 1, 59_000);
        }
        // Limit 10, full: in the next window the estimate falls below 10
        // once the previous 10 weigh less than 10, right after its start.
        let now = 59_500;
        let wait = retry_after(&state, 10, MINUTE, 1, now).expect("some time");
        let at = now + wait;
        assert!(!check(&state, 10, MINUTE, 1, at).over);
        assert!(check(&state, 10, MINUTE, 1, at - 1).over);
        assert_eq!(retry_after(&state, 0, MINUTE, 1, now), None);
        assert_eq!(retry_after(&state, 10, MINUTE, 11, now), None);
        assert_eq!(
            retry_after(&SlidingState::default(), 5, MINUTE, 1, now),
            Some(0)
        );
    }
}
