//! A rate-based ban as Google Cloud Armor defines it (docs/design.md#bans,
//! `ban: {mode: cloud_armor}`): up to `limit` hits in an interval of
//! `window` that starts at a client's first hit; the hit past the limit is
//! refused and trips the ban, which refuses everything until the interval
//! has ended and for `duration` after that. The trip is a fact: it is
//! recorded even though its request is refused.
//!
//! A resource's item, answered as a resource's are (a [`TierOutcome`], the
//! interval shown as tier 1, the ban as tier 2), so that every face reads it
//! as it reads burst tiers.

use super::{Kind, Outcome, Slot, Step};

use super::outcome::{TierOutcome, WindowOutcome};
pub use crate::config::BanLimit;

/// One client's interval and ban.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BanState {
    /// When the interval began (its first hit).
    pub start: u64,
    /// Hits granted in it.
    pub count: u64,
    /// Refused until then (0: not banned).
    pub banned_until: u64,
    pub expires_at: u64,
}

/// What `hits` at `now` find: over or not, and the state after them (a
/// grant's, or a trip's; for a check, or a client already banned, the
/// state as seen: recording it changes nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanDecision {
    pub over: bool,
    pub after: BanState,
}

/// Decides `hits` (0: would one pass? nothing recorded) at `now`.
pub fn decide(state: &BanState, limit: &BanLimit, hits: u64, now: u64) -> BanDecision {
    if state.banned_until > now {
        return BanDecision {
            over: true,
            after: *state,
        };
    }
    // An interval that ended (or a ban served) starts afresh.
    let mut seen = *state;
    if seen.expires_at <= now || seen.start.saturating_add(limit.window) <= now {
        seen = BanState {
            start: now,
            ..BanState::default()
        };
    }
    let over = seen.count.saturating_add(hits.max(1)) > limit.limit;
    let mut after = seen;
    if over {
        after.banned_until = seen
            .start
            .saturating_add(limit.window)
            .saturating_add(limit.duration);
    } else {
        after.count += hits;
    }
    after.expires_at = after
        .start
        .saturating_add(limit.window)
        .max(after.banned_until);
    BanDecision {
        over,
        after: if hits > 0 { after } else { seen },
    }
}

/// The answer, as a resource's: the interval as tier 1, the ban as tier 2
/// (limit 0, for its duration).
pub fn outcome(decision: &BanDecision, limit: &BanLimit, hits: u64, now: u64) -> TierOutcome {
    let state = decision.after;
    let banned = state.banned_until > now;
    let interval_end = state.start.saturating_add(limit.window);
    let until = |at: u64| at.saturating_sub(now);
    let remaining = if banned {
        0
    } else {
        limit.limit.saturating_sub(state.count)
    };
    let retry_after = if banned {
        Some(until(state.banned_until))
    } else if remaining > 0 {
        Some(0)
    } else if limit.limit == 0 {
        None
    } else {
        // One more now would trip the ban: wait for the next interval.
        Some(until(interval_end))
    };
    let wait = if !decision.over {
        Some(0)
    } else if hits.max(1) > limit.limit {
        None
    } else {
        retry_after
    };
    let window = WindowOutcome {
        over: decision.over,
        limit: if banned { 0 } else { limit.limit },
        period: if banned { limit.duration } else { limit.window },
        remaining,
        before: if decision.over {
            state.count
        } else {
            state.count.saturating_sub(hits)
        },
        reset_after: until(state.banned_until.max(interval_end)),
        retry_after,
        wait,
        unreturned: 0,
    };
    let mut outcome = TierOutcome::from_window(&window, hits);
    outcome.snapshot.tier_hits = state.count;
    if banned {
        outcome.snapshot.tier = 2;
        outcome.snapshot.shown_tier = 2;
    }
    outcome
}

/// A resource's ban in a batch: the hit that trips it is refused and
/// recorded. `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanItem {
    pub slot: usize,
    pub limit: BanLimit,
    pub hits: u64,
    pub shadow: bool,
}

impl Kind for BanItem {
    super::one_slot!();

    /// Whether a ban's item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        decide(&state_in(slots, self.slot), &self.limit, self.hits, now).over
    }

    /// Decides a ban's item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let Self {
            slot, limit, hits, ..
        } = *self;
        let Step { slots, now, commit } = step;
        let decision = decide(&state_in(slots, slot), &limit, hits, now);
        // A trip is recorded whatever the verdict; a grant only with it.
        if hits > 0
            && (decision.over || commit)
            && let Some(entry) = slots.get_mut(slot)
        {
            *entry = Slot::Ban(decision.after);
        }
        Outcome::Tiers(outcome(&decision, &limit, hits, now))
    }

    /// The trip, if these hits trip it.
    fn record_refused(&self, slots: &mut [Slot], now: u64) {
        if self.hits > 0
            && let Some(Slot::Ban(state)) = slots.get_mut(self.slot)
        {
            let decision = decide(state, &self.limit, self.hits, now);
            if decision.over {
                *state = decision.after;
            }
        }
    }
}

/// The ban state in `slots[index]`, or a fresh one.
fn state_in(slots: &[Slot], index: usize) -> BanState {
    match slots.get(index) {
        Some(Slot::Ban(state)) => *state,
        _ => BanState::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cloud Armor's example: 2 000 per 1 200 s, a ban of 3 600 s.
    const LIMIT: BanLimit = BanLimit {
        limit: 2_000,
        window: 1_200_000,
        duration: 3_600_000,
    };

    #[test]
    fn the_tripping_hit_is_refused_and_bans_past_the_interval() {
        let mut state = BanState::default();
        for at in 0..2_000 {
            let decision = decide(&state, &LIMIT, 1, 10_000 + at);
            assert!(!decision.over);
            state = decision.after;
        }
        let trip = decide(&state, &LIMIT, 1, 600_000);
        assert!(trip.over, "the 2 001st is refused");
        state = trip.after;
        assert_eq!(state.banned_until, 10_000 + 1_200_000 + 3_600_000);
        let answer = outcome(&trip, &LIMIT, 1, 600_000);
        assert_eq!(answer.retry_after, Some(4_810_000 - 600_000));
        assert!(decide(&state, &LIMIT, 1, 4_809_999).over);
        assert!(!decide(&state, &LIMIT, 1, 4_810_000).over, "served");
    }
}
