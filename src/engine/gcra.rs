//! GCRA (docs/design.md#gcra): a token bucket kept as one number per key, the
//! "theoretical arrival time" (TAT) of the next request at the permitted
//! rate. With `count` requests per `period` the emission interval is
//! `T = period / count`; a request of `n` hits moves the TAT to
//! `max(TAT, now) + n·T` and is allowed when that is no later than
//! `now + burst·T`, so a quiet key can spend `burst` at once and then
//! `count` per `period`. A denied request changes nothing.
//!
//! Time is counted in **ticks of 1/count ms**: `T` is then exactly `period`
//! ticks, so the arithmetic is exact whatever the rate (3 per second is not
//! a whole number of milliseconds). The Redis script does the same
//! arithmetic relative to `now`, which keeps its numbers small enough for
//! Lua's doubles.

use super::{Kind, Outcome, Slot, Step};

/// The limit is configuration; the engine only reads it.
pub use crate::config::GcraLimit;

/// The state of one key: the TAT in ticks of 1/`count` ms (0: never used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcraState {
    pub tat: u128,
    /// The `count` the ticks are in (a state of another rate is ignored).
    pub count: u64,
}

impl GcraState {
    /// After this instant (ms) the state cannot change any decision.
    pub fn expires_at(&self) -> u64 {
        if self.count == 0 {
            return 0;
        }
        u64::try_from(self.tat.div_ceil(u128::from(self.count))).unwrap_or(u64::MAX)
    }
}

/// The answer for one GCRA item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraOutcome {
    pub over: bool,
    /// Requests per period (what Envoy shows as the limit).
    pub limit: u64,
    /// One-hit requests that would be granted now.
    pub remaining: u64,
    /// Until the bucket is full again (`TAT - now`), ms.
    pub reset_after: u64,
    /// Until a one-hit request would be granted; `None`: never (count 0).
    pub retry_after: Option<u64>,
    /// Until this request's own hits would be granted (0 when granted);
    /// `None`: never (more hits than the burst).
    pub wait: Option<u64>,
}

fn ticks(ms: u64, count: u64) -> u128 {
    u128::from(ms) * u128::from(count)
}

/// Ticks → ms, rounded up (a wait must not end early).
fn ceil_ms(ticks: u128, count: u64) -> u64 {
    u64::try_from(ticks.div_ceil(u128::from(count.max(1)))).unwrap_or(u64::MAX)
}

/// Decides `hits` (0: only whether one more would pass) at `now`; records
/// them in `state` when `commit` and allowed.
pub fn decide(
    limit: &GcraLimit,
    state: &mut GcraState,
    hits: u64,
    now: u64,
    commit: bool,
) -> GcraOutcome {
    let GcraLimit {
        count,
        period,
        burst,
    } = *limit;
    if count == 0 || period == 0 {
        return GcraOutcome {
            over: true,
            limit: count,
            remaining: 0,
            reset_after: 0,
            retry_after: None,
            wait: None,
        };
    }
    let now_t = ticks(now, count);
    let interval = u128::from(period);
    let capacity = u128::from(burst) * interval;
    let tat = if state.count == count {
        state.tat.max(now_t)
    } else {
        now_t
    };
    let cost = u128::from(hits.max(1)) * interval;
    let next = tat + cost;
    let over = next > now_t + capacity;
    let after = if !over && hits > 0 {
        if commit {
            *state = GcraState { tat: next, count };
        }
        next
    } else {
        tat
    };
    let headroom = (now_t + capacity).saturating_sub(after);
    let one_hit = (after + interval).saturating_sub(now_t + capacity);
    let wait = if !over {
        Some(0)
    } else if hits.max(1) > burst {
        None
    } else {
        Some(ceil_ms(next.saturating_sub(now_t + capacity), count))
    };
    GcraOutcome {
        over,
        limit: count,
        remaining: u64::try_from(headroom / interval).unwrap_or(u64::MAX),
        reset_after: ceil_ms(after - now_t, count),
        retry_after: Some(ceil_ms(one_hit, count)),
        wait,
    }
}

/// The TAT a key starts from at `now` (a state of another rate is ignored).
fn start(limit: &GcraLimit, state: &GcraState, now: u64) -> u128 {
    let now_t = ticks(now, limit.count);
    if state.count == limit.count {
        state.tat.max(now_t)
    } else {
        now_t
    }
}

/// Hits the bucket allows at once at `now` (burst tiers' room, for a
/// resource whose policy is a bucket).
pub fn room(limit: &GcraLimit, state: &GcraState, now: u64) -> u64 {
    if limit.count == 0 || limit.period == 0 {
        return 0;
    }
    let interval = u128::from(limit.period);
    let ceiling = ticks(now, limit.count) + u128::from(limit.burst) * interval;
    let room = ceiling.saturating_sub(start(limit, state, now)) / interval;
    u64::try_from(room).unwrap_or(u64::MAX)
}

/// Records `hits` granted at `now` (as [`room`] allowed).
pub fn spend(limit: &GcraLimit, state: &mut GcraState, hits: u64, now: u64) {
    if limit.count == 0 || limit.period == 0 || hits == 0 {
        return;
    }
    let tat = start(limit, state, now) + u128::from(hits) * u128::from(limit.period);
    *state = GcraState {
        tat,
        count: limit.count,
    };
}

/// The instant (ms) from which one hit fits; `None`: never (count 0).
pub fn room_at(limit: &GcraLimit, state: &GcraState, now: u64) -> Option<u64> {
    if limit.count == 0 || limit.period == 0 || limit.burst == 0 {
        return None;
    }
    let interval = u128::from(limit.period);
    let capacity = u128::from(limit.burst) * interval;
    // One hit fits once tat + interval <= t + capacity.
    let at = (start(limit, state, now) + interval).saturating_sub(capacity);
    Some(ceil_ms(at, limit.count).max(now))
}

/// Until the bucket is full again (ms).
pub fn full_after(limit: &GcraLimit, state: &GcraState, now: u64) -> u64 {
    if limit.count == 0 {
        return 0;
    }
    ceil_ms(
        start(limit, state, now) - ticks(now, limit.count),
        limit.count,
    )
}

// A GCRA item in a batch (`super::Item`): this algorithm's own
// part of the engine's decision.

/// A token bucket in a batch. `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraItem {
    pub slot: usize,
    pub limit: GcraLimit,
    pub hits: u64,
    pub shadow: bool,
}

impl Kind for GcraItem {
    const REFUNDABLE: bool = true;

    super::one_slot!();

    /// Whether a GCRA item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        let mut state = state_in(slots, self.slot);
        decide(&self.limit, &mut state, self.hits, now, false).over
    }

    /// Decides a GCRA item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let Self {
            slot, limit, hits, ..
        } = *self;
        let Step { slots, now, commit } = step;
        let mut state = state_in(slots, slot);
        let outcome = decide(&limit, &mut state, hits, now, commit);
        if commit
            && !outcome.over
            && hits > 0
            && let Some(entry) = slots.get_mut(slot)
        {
            *entry = Slot::Gcra(state);
        }
        Outcome::Gcra(outcome)
    }

    /// Tokens back, up to its burst.
    fn refund(&self, step: Step<'_>) -> Outcome {
        if step.commit {
            refund_in(step.slots, self.slot, self.limit, self.hits, step.now);
        }
        Self { hits: 0, ..*self }.run(step.seeing())
    }
}

/// The TAT in `slots[index]`, or a fresh one.
fn state_in(slots: &[Slot], index: usize) -> GcraState {
    match slots.get(index) {
        Some(Slot::Gcra(state)) => *state,
        _ => GcraState::default(),
    }
}

/// Gives `hits` tokens back at `now`: the TAT moves back by their emission
/// intervals, never before `now` (a full bucket holds `burst`, no more).
pub(super) fn refund_in(slots: &mut [Slot], slot: usize, limit: GcraLimit, hits: u64, now: u64) {
    if limit.count == 0 || limit.period == 0 {
        return;
    }
    if let Some(Slot::Gcra(state)) = slots.get_mut(slot)
        && state.count == limit.count
    {
        let now_t = ticks(now, limit.count);
        if state.tat > now_t {
            let back = u128::from(hits).saturating_mul(u128::from(limit.period));
            state.tat = state.tat.saturating_sub(back).max(now_t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        // 2 per second, bursts of 4.
        let limit = GcraLimit {
            count: 2,
            period: 1_000,
            burst: 4,
        };
        let mut state = GcraState::default();
        for i in 0..4 {
            let outcome = decide(&limit, &mut state, 1, 10_000, true);
            assert!(!outcome.over, "{i}");
            assert_eq!(outcome.remaining, 3 - i);
        }
        let over = decide(&limit, &mut state, 1, 10_000, true);
        assert!(over.over);
        assert_eq!(over.retry_after, Some(500));
        assert_eq!(over.reset_after, 2_000);
        // A denial changes nothing; 500 ms later one more fits.
        assert!(decide(&limit, &mut state, 1, 10_499, true).over);
        let later = decide(&limit, &mut state, 1, 10_500, true);
        assert!(!later.over);
        assert_eq!(later.remaining, 0);
    }

    #[test]
    fn rates_that_are_not_whole_milliseconds_are_exact() {
        // 3 per second: one every 333⅓ ms. Polled every ms for 30 s, never
        // more than burst + 30 s / T.
        let limit = GcraLimit {
            count: 3,
            period: 1_000,
            burst: 1,
        };
        let mut state = GcraState::default();
        let mut granted = 0;
        for ms in 0..=30_000u64 {
            if !decide(&limit, &mut state, 1, 1_000_000 + ms, true).over {
                granted += 1;
            }
        }
        assert!((89..=91).contains(&granted), "{granted}");
        // A client at the permitted rate, its requests rounded up to whole
        // milliseconds, is never denied once the burst absorbs the rounding.
        let limit = GcraLimit {
            count: 3,
            period: 1_000,
            burst: 2,
        };
        let mut state = GcraState::default();
        for k in 0..3_000u64 {
            let at = 2_000_000 + (k * 1_000).div_ceil(3);
            assert!(
                !decide(&limit, &mut state, 1, at, true).over,
                "request {k} at {at}"
            );
        }
        // And the fraction is never lost: after 3 000 requests in 1 000 s the
        // bucket is exactly where it started (one slot used).
        assert_eq!(
            decide(&limit, &mut state, 0, 2_000_000 + 1_000_000, false).remaining,
            1
        );
    }

    #[test]
    fn check_only_and_bulk() {
        let limit = GcraLimit {
            count: 10,
            period: 1_000,
            burst: 5,
        };
        let mut state = GcraState::default();
        assert!(!decide(&limit, &mut state, 0, 0, true).over);
        assert_eq!(state, GcraState::default(), "a check records nothing");
        assert!(
            decide(&limit, &mut state, 6, 0, true).over,
            "more than the burst at once"
        );
        assert!(!decide(&limit, &mut state, 5, 0, true).over);
        assert!(
            decide(&limit, &mut state, 0, 0, true).over,
            "full: the check says so"
        );
        let never = GcraLimit {
            count: 0,
            period: 1_000,
            burst: 0,
        };
        assert_eq!(
            decide(&never, &mut GcraState::default(), 1, 0, true).retry_after,
            None
        );
    }
}
