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
//! ```rust
//! use charon::engine::{self, Item, Slot, SlotKind};
//! let mut slots = vec![Slot::new(SlotKind::Window)];
//! let items = [Item::Window {
//!     slot: 0, limit: 2, period: 60_000, hits: 1, shadow: false, count_rejected: false,
//! }];
//! assert!(engine::decide(&items, &mut slots, 1_000).granted);
//! assert!(engine::decide(&items, &mut slots, 1_001).granted);
//! assert!(!engine::decide(&items, &mut slots, 1_002).granted);
//! ```

pub mod ban;
pub mod capacity;
pub mod copies;
pub mod cost;
pub mod gcra;
mod hit_log;
pub mod hybrid;
mod outcome;
pub mod sliding;
pub mod sliding_log;
pub mod tiers;
pub mod window;

pub use ban::{BanLimit, BanState};
pub use cost::{CostOp, CostState, Reservation};
pub use gcra::{GcraLimit, GcraOutcome, GcraState};
pub use hit_log::HitLog;
pub use hybrid::HybridState;
pub use outcome::{Decision, Outcome, TierOutcome, WindowOutcome};
pub use sliding::SlidingState;
pub use sliding_log::LogState;
pub use tiers::{Global, Phase, Snapshot, TierState};
pub use window::WindowState;

use smallvec::SmallVec;

use crate::config::RatePolicy;

/// The state behind one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    Window(WindowState),
    Tiers(TierState),
    /// A resource's grants of the last second, across domains.
    Log(HitLog),
    /// A GCRA key's theoretical arrival time.
    Gcra(GcraState),
    /// A cost known after the response: charges, admissions, what was learned.
    Cost(CostState),
    /// A sliding window counter's two windows.
    Sliding(SlidingState),
    /// A hybrid quota-linear key's mode, time and bucket.
    Hybrid(HybridState),
    /// A sliding window log's hits.
    SlidingLog(LogState),
    /// A Cloud Armor ban's interval and ban.
    Ban(BanState),
}

/// Which kind of state a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotKind {
    Window,
    Tiers,
    Log,
    Gcra,
    Cost,
    Sliding,
    Hybrid,
    SlidingLog,
    Ban,
}

impl SlotKind {
    /// The letter that names the kind in stored keys and in the Redis
    /// script's arguments.
    pub fn letter(self) -> u8 {
        match self {
            SlotKind::Window => b'w',
            SlotKind::Tiers => b't',
            SlotKind::Log => b'g',
            SlotKind::Gcra => b'a',
            SlotKind::Cost => b'c',
            SlotKind::Sliding => b's',
            SlotKind::Hybrid => b'h',
            SlotKind::SlidingLog => b'l',
            SlotKind::Ban => b'b',
        }
    }
}

impl Slot {
    pub fn new(kind: SlotKind) -> Self {
        match kind {
            SlotKind::Window => Slot::Window(WindowState::default()),
            SlotKind::Tiers => Slot::Tiers(TierState::default()),
            SlotKind::Log => Slot::Log(HitLog::default()),
            SlotKind::Gcra => Slot::Gcra(GcraState::default()),
            SlotKind::Cost => Slot::Cost(CostState::default()),
            SlotKind::Sliding => Slot::Sliding(SlidingState::default()),
            SlotKind::Hybrid => Slot::Hybrid(HybridState::default()),
            SlotKind::SlidingLog => Slot::SlidingLog(LogState::default()),
            SlotKind::Ban => Slot::Ban(BanState::default()),
        }
    }

    pub fn kind(&self) -> SlotKind {
        match self {
            Slot::Window(_) => SlotKind::Window,
            Slot::Tiers(_) => SlotKind::Tiers,
            Slot::Log(_) => SlotKind::Log,
            Slot::Gcra(_) => SlotKind::Gcra,
            Slot::Cost(_) => SlotKind::Cost,
            Slot::Sliding(_) => SlotKind::Sliding,
            Slot::Hybrid(_) => SlotKind::Hybrid,
            Slot::SlidingLog(_) => SlotKind::SlidingLog,
            Slot::Ban(_) => SlotKind::Ban,
        }
    }

    /// After this instant the slot cannot change any decision and may be
    /// dropped; 0 for a slot that never recorded anything.
    pub fn expires_at(&self) -> u64 {
        match self {
            Slot::Window(w) => w.expires_at,
            Slot::Tiers(t) => t.expires_at,
            Slot::Log(log) => log.counts_until(tiers::SECOND),
            Slot::Gcra(state) => state.expires_at(),
            Slot::Cost(state) => state.expires_at,
            Slot::Sliding(state) => state.expires_at,
            Slot::Hybrid(state) => state.expires_at,
            Slot::SlidingLog(state) => state.expires_at,
            Slot::Ban(state) => state.expires_at,
        }
    }
}

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
            | Item::Gcra { shadow, .. } => *shadow,
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
            | Item::Sliding { slot, .. } => *slot,
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
        .all(|item| item.shadow() || !is_over(item, slots, now));
    // Granted: record and report. Rejected: report against the unchanged
    // state, but for what counts rejected hits.
    let outcomes = items
        .iter()
        .map(|item| run(item, slots, now, granted))
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
    let outcomes: SmallVec<[Outcome; 1]> = items
        .iter()
        .map(|item| run(item, &mut scratch, now, true))
        .collect();
    let granted = passes(items, &outcomes);
    if granted {
        slots.clone_from_slice(&scratch);
    } else {
        // Rejected: only the hits that count anyway, in order.
        for item in items {
            match *item {
                Item::Window {
                    slot,
                    period,
                    hits,
                    count_rejected: true,
                    ..
                } if hits > 0 => {
                    record_window(slots, slot, period, hits, now);
                }
                Item::Ban {
                    slot, limit, hits, ..
                } if hits > 0 => {
                    if let Some(Slot::Ban(state)) = slots.get_mut(slot) {
                        let decision = ban::decide(state, &limit, hits, now);
                        if decision.over {
                            *state = decision.after;
                        }
                    }
                }
                Item::SlidingLog {
                    slot,
                    limit,
                    period,
                    hits,
                    count_rejected: true,
                    ..
                } if hits > 0 => {
                    if let Some(Slot::SlidingLog(state)) = slots.get_mut(slot) {
                        sliding_log::record(state, limit, period, hits, now);
                    }
                }
                Item::Cost {
                    slot,
                    period,
                    op: CostOp::Hits(hits),
                    ..
                } if hits > 0 => {
                    if let Some(Slot::Cost(state)) = slots.get_mut(slot) {
                        cost::charge(state, period, hits, now);
                    }
                }
                _ => {}
            }
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

fn gcra_state(slots: &[Slot], index: usize) -> GcraState {
    match slots.get(index) {
        Some(Slot::Gcra(state)) => *state,
        _ => GcraState::default(),
    }
}

fn ban_state(slots: &[Slot], index: usize) -> BanState {
    match slots.get(index) {
        Some(Slot::Ban(state)) => *state,
        _ => BanState::default(),
    }
}

fn hybrid_state(slots: &[Slot], index: usize) -> HybridState {
    match slots.get(index) {
        Some(Slot::Hybrid(state)) => *state,
        _ => HybridState::default(),
    }
}

fn log_state(slots: &[Slot], index: usize) -> Option<&LogState> {
    match slots.get(index) {
        Some(Slot::SlidingLog(state)) => Some(state),
        _ => None,
    }
}

fn sliding_state(slots: &[Slot], index: usize) -> SlidingState {
    match slots.get(index) {
        Some(Slot::Sliding(state)) => *state,
        _ => SlidingState::default(),
    }
}

fn window_state(slots: &[Slot], index: usize) -> WindowState {
    match slots.get(index) {
        Some(Slot::Window(state)) => state.clone(),
        _ => WindowState::default(),
    }
}

/// A domain's tier state and the resource's global log.
type TierSlots<'s> = (Option<&'s mut TierState>, Option<&'s mut HitLog>);

fn split_tiers(slots: &mut [Slot], slot: usize, global_slot: Option<usize>) -> TierSlots<'_> {
    // Two distinct indexes into one slice, borrowed mutably at once.
    let (mut tiers, mut log) = (None, None);
    for (index, entry) in slots.iter_mut().enumerate() {
        if index == slot {
            if let Slot::Tiers(state) = entry {
                tiers = Some(state);
            }
        } else if Some(index) == global_slot
            && let Slot::Log(l) = entry
        {
            log = Some(l);
        }
    }
    (tiers, log)
}

fn is_over(item: &Item<'_>, slots: &[Slot], now: u64) -> bool {
    match *item {
        Item::Window {
            slot,
            limit,
            period,
            hits,
            ..
        } => window::check(&window_state(slots, slot), limit, period, hits, now).over,
        Item::Hybrid {
            slot,
            quota,
            window,
            hits,
            ..
        } => hybrid::decide(&hybrid_state(slots, slot), quota, window, hits, now).over,
        Item::Ban {
            slot, limit, hits, ..
        } => ban::decide(&ban_state(slots, slot), &limit, hits, now).over,
        Item::SlidingLog {
            slot,
            limit,
            period,
            hits,
            ..
        } => {
            const EMPTY: &LogState = &LogState {
                log: HitLog::EMPTY,
                expires_at: 0,
            };
            sliding_log::is_over(
                log_state(slots, slot).unwrap_or(EMPTY),
                limit,
                period,
                hits,
                now,
            )
        }
        Item::Sliding {
            slot,
            limit,
            period,
            hits,
            ..
        } => sliding::check(&sliding_state(slots, slot), limit, period, hits, now).over,
        Item::Cost {
            slot,
            limit,
            period,
            op,
            initial_cost,
            ..
        } => {
            const FRESH: CostState = CostState::FRESH;
            let state = match slots.get(slot) {
                Some(Slot::Cost(state)) => state,
                _ => &FRESH,
            };
            cost::check(state, limit, period, initial_cost, op, now).over
        }
        Item::Gcra {
            slot, limit, hits, ..
        } => {
            let mut state = gcra_state(slots, slot);
            gcra::decide(&limit, &mut state, hits, now, false).over
        }
        Item::Tiers {
            slot,
            global_slot,
            policy,
            global_limit,
            copies,
            min_copies,
            check_only,
            ..
        } => {
            let empty = TierState::default();
            let state = match slots.get(slot) {
                Some(Slot::Tiers(state)) => state,
                _ => &empty,
            };
            let global = global_view(slots, global_slot, global_limit);
            let (asked, needed) = if check_only {
                (1, 1)
            } else {
                (copies, min_copies)
            };
            tiers::room(policy, state, global, asked, now).grantable < needed
        }
    }
}

fn global_view<'s>(
    slots: &'s [Slot],
    global_slot: Option<usize>,
    global_limit: Option<u64>,
) -> Option<Global<'s>> {
    let limit = global_limit?;
    match global_slot.and_then(|i| slots.get(i)) {
        Some(Slot::Log(log)) => Some(Global { log, limit }),
        _ => None,
    }
}

/// Records `hits` of a window at `now` in `slots[slot]`.
fn record_window(slots: &mut [Slot], slot: usize, period: u64, hits: u64, now: u64) -> u64 {
    match slots.get_mut(slot) {
        Some(Slot::Window(state)) => {
            window::record(state, period, hits, now);
            state.expires_at = window::window_start(now, period).saturating_add(period);
            state.count
        }
        _ => 0,
    }
}

/// Decides one item and, if `commit` and it passes, records it (a window
/// that counts rejected hits records them whatever the verdict).
fn run(item: &Item<'_>, slots: &mut [Slot], now: u64, commit: bool) -> Outcome {
    match *item {
        Item::Window {
            slot,
            limit,
            period,
            hits,
            count_rejected,
            ..
        } => {
            let before = window_state(slots, slot);
            let check = window::check(&before, limit, period, hits, now);
            let mut count = check.count;
            if hits > 0 && (count_rejected || (commit && !check.over)) {
                count = record_window(slots, slot, period, hits, now);
            }
            let wait = if !check.over {
                Some(0)
            } else if hits.max(1) > limit {
                None
            } else {
                Some(check.window_end - now)
            };
            Outcome::Window(WindowOutcome {
                over: check.over,
                limit,
                period,
                remaining: limit.saturating_sub(count),
                reset_after: check.window_end - now,
                wait,
                retry_after: window::retry_after(
                    &window::WindowCheck { count, ..check },
                    limit,
                    now,
                ),
            })
        }
        Item::Sliding {
            slot,
            limit,
            period,
            hits,
            ..
        } => {
            let before = sliding_state(slots, slot);
            let seen = sliding::check(&before, limit, period, hits, now);
            let mut after = before;
            if commit && !seen.over && hits > 0 {
                sliding::record(&mut after, period, hits, now);
                if let Some(entry) = slots.get_mut(slot) {
                    *entry = Slot::Sliding(after);
                }
            }
            let counted = sliding::check(&after, limit, period, 0, now);
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
                reset_after,
                wait: if seen.over {
                    sliding::retry_after(&before, limit, period, hits, now)
                } else {
                    Some(0)
                },
                retry_after: sliding::retry_after(&after, limit, period, 1, now),
            })
        }
        Item::Cost {
            slot,
            limit,
            period,
            op,
            initial_cost,
            ..
        } => {
            let mut fresh = CostState::FRESH;
            let state = match slots.get_mut(slot) {
                Some(Slot::Cost(state)) => state,
                _ => &mut fresh,
            };
            let seen = cost::check(state, limit, period, initial_cost, op, now);
            match op {
                CostOp::Hits(hits) if hits > 0 => cost::charge(state, period, hits, now),
                _ if !commit || seen.over => {}
                CostOp::Hits(_) => cost::admit(state, period, now),
                _ => cost::apply(state, period, op, now),
            }
            let after = cost::check(state, limit, period, initial_cost, CostOp::Hits(0), now);
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
                reset_after,
                wait,
                retry_after: Some(if spent < limit { 0 } else { reset_after }),
            })
        }
        Item::Ban {
            slot, limit, hits, ..
        } => {
            let decision = ban::decide(&ban_state(slots, slot), &limit, hits, now);
            // A trip is recorded whatever the verdict; a grant only with it.
            if hits > 0
                && (decision.over || commit)
                && let Some(entry) = slots.get_mut(slot)
            {
                *entry = Slot::Ban(decision.after);
            }
            Outcome::Tiers(ban::outcome(&decision, &limit, hits, now))
        }
        Item::SlidingLog {
            slot,
            limit,
            period,
            hits,
            count_rejected,
            ..
        } => {
            let mut fresh = LogState::default();
            let state = match slots.get_mut(slot) {
                Some(Slot::SlidingLog(state)) => state,
                _ => &mut fresh,
            };
            let over = sliding_log::is_over(state, limit, period, hits, now);
            if hits > 0 && (count_rejected || (commit && !over)) {
                sliding_log::record(state, limit, period, hits, now);
            }
            let seen = sliding_log::outcome(state, over, limit, period, hits, now);
            Outcome::Window(WindowOutcome {
                over,
                limit,
                period,
                remaining: seen.remaining,
                reset_after: seen.reset_after,
                wait: seen.wait,
                retry_after: seen.retry_after,
            })
        }
        Item::Hybrid {
            slot,
            quota,
            window,
            hits,
            ..
        } => {
            let seen = hybrid::decide(&hybrid_state(slots, slot), quota, window, hits, now);
            if commit
                && !seen.over
                && hits > 0
                && let Some(entry) = slots.get_mut(slot)
            {
                *entry = Slot::Hybrid(seen.after);
            }
            Outcome::Window(WindowOutcome {
                over: seen.over,
                limit: quota,
                period: window,
                remaining: seen.remaining,
                reset_after: seen.reset_after,
                wait: seen.wait,
                retry_after: seen.retry_after,
            })
        }
        Item::Gcra {
            slot, limit, hits, ..
        } => {
            let mut state = gcra_state(slots, slot);
            let outcome = gcra::decide(&limit, &mut state, hits, now, commit);
            if commit
                && !outcome.over
                && hits > 0
                && let Some(entry) = slots.get_mut(slot)
            {
                *entry = Slot::Gcra(state);
            }
            Outcome::Gcra(outcome)
        }
        Item::Tiers {
            slot,
            global_slot,
            policy,
            global_limit,
            copies,
            min_copies,
            check_only,
            ..
        } => {
            let (asked, needed) = if check_only {
                (1, 1)
            } else {
                (copies, min_copies)
            };
            let global_limit = global_limit.filter(|_| global_slot.is_some());
            let (state, log) = split_tiers(slots, slot, global_slot);
            let mut fallback = TierState::default();
            let state = state.unwrap_or(&mut fallback);
            let room = {
                let global = log
                    .as_deref()
                    .zip(global_limit)
                    .map(|(log, limit)| Global { log, limit });
                tiers::room(policy, state, global, asked, now)
            };
            let over = room.grantable < needed;
            let granted = if over || check_only {
                0
            } else {
                room.grantable
            };
            let mut burst = false;
            let mut log = log;
            if commit && granted > 0 {
                burst = tiers::grant(policy, state, log.as_deref_mut(), granted, now);
            }
            let global = log
                .as_deref()
                .zip(global_limit)
                .map(|(log, limit)| Global { log, limit });
            let snapshot = tiers::snapshot(policy, state, global, now);
            let retry_after = if snapshot.remaining > 0 {
                Some(0)
            } else {
                tiers::retry_after(policy, state, global, now)
            };
            let wait = if over {
                let global = log
                    .as_deref()
                    .zip(global_limit)
                    .map(|(log, limit)| Global { log, limit });
                tiers::wait_for(policy, state, global, needed, now, WAIT_STEP)
            } else {
                Some(0)
            };
            let limited = !check_only && room.grantable < asked;
            Outcome::Tiers(TierOutcome {
                wait,
                over,
                granted,
                hard_limit: policy.hard_limit,
                global_limit,
                burst,
                limited_by_hard: limited && room.hard == room.grantable,
                limited_by_global: limited && room.global == room.grantable,
                snapshot,
                retry_after,
            })
        }
    }
}
