//! Burst tiers with hard and global limits (docs/design.md#burst-tiers).
//!
//! One piece: phases, windows, bursts, fallback and the hard and global
//! limits are one state machine over one `TierState` (the design's section
//! on burst tiers); its item in a batch is in `tiers/item.rs`.
//!
//! State per (namespace, resource, domain) is a [`TierState`]: per tier, when
//! it was last entered and the hits granted while it was current; plus the
//! domain's grants of the last second (for the hard limit H). The resource's
//! grants of the last second across domains (for the global limit G) are a
//! separate [`HitLog`] shared by all domains.
//!
//! Everything here is a function of (policy, state, now): evaluating never
//! mutates, and only a grant does (leniency: a rejection changes nothing).

mod item;

pub use self::item::TiersItem;

use smallvec::SmallVec;

use crate::config::{FOREVER, RatePolicy, Tier};

use super::gcra::{self, GcraState};
use super::hit_log::HitLog;

/// The span of the hard and global limits' sliding window.
pub const SECOND: u64 = 1_000;

/// The access log of one domain for one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierState {
    pub tiers: Vec<TierLog>,
    /// The domain's grants, kept for a second (hard limit).
    pub recent: HitLog,
    /// After this instant nothing in this state can change a decision.
    pub expires_at: u64,
    /// The token bucket of a policy with `gcra` instead of tiers.
    pub bucket: GcraState,
}

/// One tier's part of the access log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierLog {
    pub entered_at: Option<u64>,
    pub hits: HitLog,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Inactive,
    Active,
    Cooldown,
}

/// The phase of a tier entered at `entered` (active while `e <= now < e+Ta`,
/// cooldown while `e+Ta <= now < e+Ta+Tc`, inactive otherwise).
pub fn phase(tier: &Tier, entered: Option<u64>, now: u64) -> Phase {
    let Some(entered) = entered else {
        return Phase::Inactive;
    };
    let active_end = entered.saturating_add(tier.active);
    if now < active_end {
        Phase::Active
    } else if now < active_end.saturating_add(tier.cooldown) {
        Phase::Cooldown
    } else {
        Phase::Inactive
    }
}

/// The resource-wide log for the global limit, with its limit.
#[derive(Debug, Clone, Copy)]
pub struct Global<'a> {
    pub log: &'a HitLog,
    pub limit: u64,
}

/// How many hits could be granted at once, and what bounds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// The largest grantable `k <= asked`.
    pub grantable: u64,
    pub tiers: u64,
    pub hard: u64,
    pub global: u64,
}

struct View<'a> {
    policy: &'a RatePolicy,
    state: &'a TierState,
    now: u64,
}

impl View<'_> {
    fn entered(&self, index: usize) -> Option<u64> {
        self.state.tiers.get(index).and_then(|log| log.entered_at)
    }

    fn phase(&self, index: usize) -> Phase {
        phase(&self.policy.tiers[index], self.entered(index), self.now)
    }

    fn count(&self, index: usize) -> u64 {
        self.state.tiers.get(index).map_or(0, |log| {
            log.hits.count(self.now, self.policy.tiers[index].window)
        })
    }

    /// The current tier, one-indexed; 0 when no tier is active.
    fn current(&self) -> usize {
        (0..self.policy.tiers.len())
            .rev()
            .find(|&i| self.phase(i) == Phase::Active)
            .map_or(0, |i| i + 1)
    }

    /// Room in the current tier (0 for the fake tier 0).
    fn room_in_current(&self, current: usize) -> u64 {
        match current {
            0 => 0,
            c => self.policy.tiers[c - 1]
                .limit
                .saturating_sub(self.count(c - 1)),
        }
    }

    /// Room in the tiers, bursting as far as needed for `asked` hits.
    fn tier_room(&self, asked: u64) -> u64 {
        if let Some(gcra) = &self.policy.gcra {
            return gcra::room(gcra, &self.state.bucket, self.now);
        }
        let current = self.current();
        let mut room = self.room_in_current(current);
        for index in current..self.policy.tiers.len() {
            if room >= asked {
                break;
            }
            match self.phase(index) {
                Phase::Cooldown if self.policy.tiers[index].skippable => continue,
                Phase::Cooldown => break,
                // Above the current tier nothing is active; an inactive tier is
                // entered with an empty window.
                Phase::Inactive | Phase::Active => {
                    room = room.saturating_add(self.policy.tiers[index].limit);
                }
            }
        }
        room
    }
}

/// How many of `asked` hits can be granted at `now`.
pub fn room(
    policy: &RatePolicy,
    state: &TierState,
    global: Option<Global<'_>>,
    asked: u64,
    now: u64,
) -> Room {
    let view = View { policy, state, now };
    let tiers = view.tier_room(asked);
    let hard = policy.hard_limit.map_or(u64::MAX, |h| {
        h.saturating_sub(state.recent.count(now, SECOND))
    });
    let global = global.map_or(u64::MAX, |g| {
        g.limit.saturating_sub(g.log.count(now, SECOND))
    });
    Room {
        grantable: asked.min(tiers).min(hard).min(global),
        tiers,
        hard,
        global,
    }
}

/// Records `k` hits granted at `now` (as computed by [`room`] at the same
/// `now`), hit by hit: fill the current tier, then burst. Returns whether a
/// tier was entered.
pub fn grant(
    policy: &RatePolicy,
    state: &mut TierState,
    global: Option<&mut HitLog>,
    k: u64,
    now: u64,
) -> bool {
    if let Some(gcra) = &policy.gcra {
        gcra::spend(gcra, &mut state.bucket, k, now);
    }
    let tiers = &policy.tiers;
    state.tiers.resize_with(tiers.len(), TierLog::default);
    for (tier, log) in tiers.iter().zip(&mut state.tiers) {
        if phase(tier, log.entered_at, now) == Phase::Inactive {
            // Forgotten: nothing of an inactive tier matters any more.
            log.entered_at = None;
            log.hits.clear();
        } else {
            log.hits.prune(now, tier.window);
        }
    }
    state.recent.prune(now, SECOND);
    let current = {
        let view = View { policy, state, now };
        view.current()
    };
    let mut left = k;
    if current > 0 {
        let index = current - 1;
        let log = &mut state.tiers[index];
        let room = tiers[index]
            .limit
            .saturating_sub(log.hits.count(now, tiers[index].window));
        let take = left.min(room);
        log.hits.push(now, take);
        left -= take;
    }
    let mut burst = false;
    for (tier, log) in tiers.iter().zip(&mut state.tiers).skip(current) {
        if left == 0 {
            break;
        }
        match phase(tier, log.entered_at, now) {
            Phase::Cooldown if tier.skippable => continue,
            Phase::Cooldown => break,
            Phase::Inactive | Phase::Active => {
                log.entered_at = Some(now);
                log.hits.clear();
                burst = true;
                let take = left.min(tier.limit);
                log.hits.push(now, take);
                left -= take;
            }
        }
    }
    state.recent.push(now, k);
    if let Some(global) = global {
        global.prune(now, SECOND);
        global.push(now, k);
    }
    state.expires_at = expiry(policy, state);
    burst
}

/// The instant after which `state` cannot change any decision: every finite
/// tier inactive and every window empty. An entered `forever` tier above the
/// first keeps the state for good (dropping it would let the domain start
/// over in tier 1); the first tier entered forever is equivalent to no state
/// once its window is empty.
pub fn expiry(policy: &RatePolicy, state: &TierState) -> u64 {
    let mut until = state.recent.counts_until(SECOND);
    if policy.gcra.is_some() {
        until = until.max(state.bucket.expires_at());
    }
    for (index, (tier, log)) in policy.tiers.iter().zip(&state.tiers).enumerate() {
        if let Some(entered) = log.entered_at {
            if tier.active == FOREVER {
                if index > 0 {
                    return u64::MAX;
                }
            } else {
                until = until.max(
                    entered
                        .saturating_add(tier.active)
                        .saturating_add(tier.cooldown),
                );
            }
        }
        if let Some(last) = log.hits.last() {
            until = until.max(last.saturating_add(tier.window).saturating_add(1));
        }
    }
    until
}

/// The smallest delay after which a one-hit request would be granted if
/// nothing else happened; `None` if never.
///
/// Exact because the decision only changes when a hit leaves a window or a
/// tier changes phase: the hard and global limits free up at one known
/// instant each (their counts only fall), and after that the answer can only
/// change at a phase boundary or where a tier's count drops below its limit,
/// so those instants are tried in order.
pub fn retry_after(
    policy: &RatePolicy,
    state: &TierState,
    global: Option<Global<'_>>,
    now: u64,
) -> Option<u64> {
    if room(policy, state, global, 1, now).grantable >= 1 {
        return Some(0);
    }
    let mut earliest = now;
    if let Some(hard) = policy.hard_limit {
        earliest = earliest.max(state.recent.below_limit_at(now, SECOND, hard)?);
    }
    if let Some(global) = global {
        earliest = earliest.max(global.log.below_limit_at(now, SECOND, global.limit)?);
    }
    // At most three instants per tier (two phase ends, one window).
    let mut candidates: SmallVec<[u64; 16]> = SmallVec::new();
    candidates.push(earliest);
    if let Some(gcra) = &policy.gcra {
        candidates.push(gcra::room_at(gcra, &state.bucket, now)?);
    }
    for (tier, log) in policy.tiers.iter().zip(&state.tiers) {
        let Some(entered) = log.entered_at else {
            continue;
        };
        let active_end = entered.saturating_add(tier.active);
        if tier.active != FOREVER {
            candidates.push(active_end);
            if tier.cooldown != FOREVER {
                candidates.push(active_end.saturating_add(tier.cooldown));
            }
        }
        if phase(tier, Some(entered), now) == Phase::Active
            && let Some(at) = log.hits.below_limit_at(now, tier.window, tier.limit)
        {
            candidates.push(at);
        }
    }
    candidates.retain(|t| *t >= earliest && *t != u64::MAX);
    candidates.sort_unstable();
    candidates.dedup();
    candidates
        .into_iter()
        .find(|&t| room(policy, state, global, 1, t).grantable >= 1)
        .map(|t| t - now)
}

/// The smallest delay, a whole number of `step`s, after which a request
/// needing `needed` hits would be granted if nothing else happened; `None` if
/// never (more than the limits can ever hold at once).
///
/// Whole steps because Envoy carries whole seconds: with tiers, a chance can
/// open and close within a second (a tier's active period ends), so the
/// first fitting millisecond rounded up may no longer fit. With the phases
/// fixed, room only grows as hits leave their windows (the tier logs, the
/// hard and global logs, the bucket), so between two phase boundaries the
/// first fitting instant is found by bisection and the first whole step
/// after it fits too if it is still in that stretch; after the last boundary
/// nothing changes once every log has emptied.
pub fn wait_for(
    policy: &RatePolicy,
    state: &TierState,
    global: Option<Global<'_>>,
    needed: u64,
    now: u64,
    step: u64,
) -> Option<u64> {
    let (needed, step) = (needed.max(1), step.max(1));
    let fits = |t: u64| room(policy, state, global, needed, t).grantable >= needed;
    if fits(now) {
        return Some(0);
    }
    let mut boundaries: SmallVec<[u64; 16]> = SmallVec::new();
    let mut settled = now
        .max(state.recent.counts_until(SECOND))
        .max(global.map_or(0, |g| g.log.counts_until(SECOND)));
    if let Some(gcra) = &policy.gcra {
        settled =
            settled
                .max(state.bucket.expires_at())
                .max(gcra::room_at(gcra, &state.bucket, now)?);
    }
    for (tier, log) in policy.tiers.iter().zip(&state.tiers) {
        if let Some(last) = log.hits.last() {
            settled = settled.max(last.saturating_add(tier.window).saturating_add(1));
        }
        let Some(entered) = log.entered_at else {
            continue;
        };
        if tier.active != FOREVER {
            let active_end = entered.saturating_add(tier.active);
            boundaries.push(active_end);
            if tier.cooldown != FOREVER {
                boundaries.push(active_end.saturating_add(tier.cooldown));
            }
        }
    }
    boundaries.retain(|t| *t > now && *t != u64::MAX);
    boundaries.sort_unstable();
    boundaries.dedup();
    settled = settled.max(boundaries.last().copied().unwrap_or(now));
    if settled == u64::MAX {
        return None;
    }
    // Stretches [start, end] with the phases fixed inside each; the last one
    // goes on for ever unchanged after `settled`.
    let mut start = now;
    let ends = boundaries.iter().map(|b| (b - 1, false));
    for (end, last) in ends.chain(std::iter::once((settled, true))) {
        if end >= start && fits(end) {
            let (mut low, mut high) = (start, end);
            while low < high {
                let middle = low + (high - low) / 2;
                if fits(middle) {
                    high = middle;
                } else {
                    low = middle + 1;
                }
            }
            let wait = (low - now).div_ceil(step).saturating_mul(step);
            if last || now.saturating_add(wait) <= end {
                return Some(wait);
            }
        }
        start = end.saturating_add(1);
    }
    None
}

/// What the state looks like at `now`, for answers
/// (docs/design.md#rate-answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The current tier, one-indexed (0: none active).
    pub tier: usize,
    /// The tier whose limit and window are shown: the current one, or with
    /// none active, tier 1 (where the next hit would go); 0 without tiers.
    pub shown_tier: usize,
    /// The limit and window shown for the current tier; with no active tier,
    /// those of tier 1 (where the next hit would go).
    pub tier_limit: u64,
    pub tier_window: u64,
    pub tier_hits: u64,
    pub domain_hits: u64,
    /// The resource's hits in the last second, across domains; tracked only
    /// when it has a global limit (`None` otherwise).
    pub resource_hits: Option<u64>,
    /// One-hit requests that would be granted now without a burst.
    pub remaining: u64,
    /// When the oldest hit of the current tier's window leaves it (0 if none).
    pub reset_after: u64,
}

pub fn snapshot(
    policy: &RatePolicy,
    state: &TierState,
    global: Option<Global<'_>>,
    now: u64,
) -> Snapshot {
    let view = View { policy, state, now };
    let current = view.current();
    let hard_room = policy.hard_limit.map_or(u64::MAX, |h| {
        h.saturating_sub(state.recent.count(now, SECOND))
    });
    let resource_hits = global.map(|g| g.log.count(now, SECOND));
    let global_room = global.map_or(u64::MAX, |g| {
        g.limit.saturating_sub(g.log.count(now, SECOND))
    });
    let shown = match (current, &policy.gcra) {
        // A token bucket shows as tier 1: its burst per period.
        (_, Some(gcra)) => {
            let room = gcra::room(gcra, &state.bucket, now);
            (
                gcra.burst,
                gcra.period,
                gcra.burst.saturating_sub(room),
                room,
                gcra::full_after(gcra, &state.bucket, now),
            )
        }
        (0, None) => match policy.tiers.first() {
            Some(first) => {
                let room = if view.phase(0) == Phase::Inactive {
                    first.limit
                } else {
                    0
                };
                (first.limit, first.window, 0, room, 0)
            }
            None => (0, SECOND, 0, 0, 0),
        },
        (c, None) => {
            let tier = &policy.tiers[c - 1];
            let hits = view.count(c - 1);
            let reset = state.tiers[c - 1]
                .hits
                .oldest_counting(now, tier.window)
                .map_or(0, |t| t.saturating_add(tier.window).saturating_add(1) - now);
            (
                tier.limit,
                tier.window,
                hits,
                tier.limit.saturating_sub(hits),
                reset,
            )
        }
    };
    let (tier_limit, tier_window, tier_hits, tier_room, reset_after) = shown;
    Snapshot {
        tier: current,
        shown_tier: if current == 0 && (!policy.tiers.is_empty() || policy.gcra.is_some()) {
            1
        } else {
            current
        },
        tier_limit,
        tier_window,
        tier_hits,
        domain_hits: state.recent.count(now, SECOND),
        resource_hits,
        remaining: tier_room.min(hard_room).min(global_room),
        reset_after,
    }
}
