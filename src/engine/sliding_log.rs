//! The sliding window log (docs/design.md#sliding-logs): per key, the time
//! of every hit of the last window (grouped by millisecond), so a request
//! passes when the hits of the exact trailing window leave room for it. With
//! `count_rejected`, refused hits are logged too, so a client that keeps
//! hammering stays refused until it pauses for a whole window.
//!
//! The log keeps at most `limit` hits, the most recent: a decision only
//! asks whether `limit` is reached, and when the oldest of the `limit`
//! newest hits leaves, so a longer log could never decide otherwise. That
//! bounds a key's state by the limit, even for a client hammering it.

use super::{Kind, Outcome, Slot, Step, WindowOutcome};

use super::hit_log::HitLog;

/// A key's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    pub log: HitLog,
    /// When the last hit leaves the window: the log matters no more.
    pub expires_at: u64,
}

/// What a decision of `hits` at `now` finds, and what it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOutcome {
    pub over: bool,
    /// Hits the trailing window leaves room for, after the decision.
    pub remaining: u64,
    /// Until the log is empty (0 when it is).
    pub reset_after: u64,
    /// Until one more hit would pass; `None`: never (a limit of 0).
    pub retry_after: Option<u64>,
    /// Until this request's hits would pass; `None`: never.
    pub wait: Option<u64>,
}

/// Whether `hits` (at least one) fit under `limit` in the window at `now`.
pub fn is_over(state: &LogState, limit: u64, window: u64, hits: u64, now: u64) -> bool {
    state.log.count(now, window).saturating_add(hits.max(1)) > limit
}

/// Records `hits` at `now`: the granted hits of a request, or with
/// `count_rejected` a refused request's too.
pub fn record(state: &mut LogState, limit: u64, window: u64, hits: u64, now: u64) {
    state.log.prune(now, window);
    state.log.push(now, hits);
    state.log.truncate(limit);
    state.expires_at = state.log.counts_until(window);
}

/// Gives `hits` back at `now`: the oldest that still count go first.
pub(super) fn refund_in(slots: &mut [Slot], slot: usize, window: u64, hits: u64, now: u64) {
    if let Some(Slot::TimeLog(state)) = slots.get_mut(slot) {
        state.log.prune(now, window);
        let counting = state.log.total();
        if counting > 0 {
            state.log.truncate(counting.saturating_sub(hits));
            state.expires_at = state.log.counts_until(window);
        }
    }
}

/// The answer for `hits` at `now`, on the state after the decision.
pub fn outcome(
    after: &LogState,
    over: bool,
    limit: u64,
    window: u64,
    hits: u64,
    now: u64,
) -> LogOutcome {
    let counting = after.log.count(now, window);
    let until = |fewer_than: u64| -> Option<u64> {
        after
            .log
            .below_limit_at(now, window, fewer_than)
            .map(|at| at.saturating_sub(now))
    };
    let asked = hits.max(1);
    LogOutcome {
        over,
        remaining: limit.saturating_sub(counting),
        reset_after: after.log.counts_until(window).saturating_sub(now),
        retry_after: until(limit),
        wait: if !over {
            Some(0)
        } else if asked > limit {
            None
        } else {
            until(limit - asked + 1)
        },
    }
}

/// A sliding window log in a batch. `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLogItem {
    pub slot: usize,
    pub limit: u64,
    pub period: u64,
    pub hits: u64,
    pub shadow: bool,
    /// Refused hits are logged too, whatever the verdict.
    pub count_rejected: bool,
}

impl Kind for SlidingLogItem {
    const REFUNDABLE: bool = true;

    super::one_slot!();

    /// Whether a sliding window log's item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        const EMPTY: &LogState = &LogState {
            log: HitLog::EMPTY,
            expires_at: 0,
        };
        let state = state_in(slots, self.slot).unwrap_or(EMPTY);
        is_over(state, self.limit, self.period, self.hits, now)
    }

    /// Decides a sliding window log's item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let (slot, limit, period, hits) = (self.slot, self.limit, self.period, self.hits);
        let count_rejected = self.count_rejected;
        let Step { slots, now, commit } = step;
        let mut fresh = LogState::default();
        let state = match slots.get_mut(slot) {
            Some(Slot::TimeLog(state)) => state,
            _ => &mut fresh,
        };
        let over = is_over(state, limit, period, hits, now);
        let before = state.log.count(now, period);
        if hits > 0 && (count_rejected || (commit && !over)) {
            record(state, limit, period, hits, now);
        }
        let seen = outcome(state, over, limit, period, hits, now);
        Outcome::Window(WindowOutcome {
            over,
            limit,
            period,
            remaining: seen.remaining,
            before,
            reset_after: seen.reset_after,
            wait: seen.wait,
            retry_after: seen.retry_after,
            unreturned: 0,
        })
    }

    fn record_refused(&self, slots: &mut [Slot], now: u64) {
        if self.count_rejected
            && self.hits > 0
            && let Some(Slot::TimeLog(state)) = slots.get_mut(self.slot)
        {
            record(state, self.limit, self.period, self.hits, now);
        }
    }

    /// Its oldest hits that still count.
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

/// The log in `slots[index]`, if it holds one.
fn state_in(slots: &[Slot], index: usize) -> Option<&LogState> {
    match slots.get(index) {
        Some(Slot::TimeLog(state)) => Some(state),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hammering_client_is_kept_out_with_the_log_bounded() {
        let mut state = LogState::default();
        for now in 0..3 {
            assert!(!is_over(&state, 3, 1_000, 1, now));
            record(&mut state, 3, 1_000, 1, now);
        }
        // Refused hits logged (count_rejected): the oldest leave the log,
        // the newest keep the client out.
        for now in 500..600 {
            assert!(is_over(&state, 3, 1_000, 1, now));
            record(&mut state, 3, 1_000, 1, now);
        }
        assert_eq!(state.log.entries().count(), 3);
        let answer = outcome(&state, true, 3, 1_000, 1, 600);
        assert_eq!(answer.retry_after, Some(1_000 - 600 + 597 + 1));
        assert!(!is_over(&state, 3, 1_000, 1, 1_598));
    }
}
