//! Burst tiers in a batch ([`TiersItem`]): a domain's
//! tier state and, with a global limit, the resource's log of the last
//! second, decided as one item.

use crate::config::RatePolicy;
use crate::engine::{Global, HitLog, Kind, Outcome, Slot, Step, TierOutcome, TierState, WAIT_STEP};

/// Burst tiers in a batch: grant the largest `k` in `[min_copies, copies]`.
#[derive(Debug, Clone, Copy)]
pub struct TiersItem<'a> {
    pub slot: usize,
    /// The resource's global log, when it has a global limit.
    pub global_slot: Option<usize>,
    pub policy: &'a RatePolicy,
    pub global_limit: Option<u64>,
    pub copies: u64,
    pub min_copies: u64,
    /// Only ask whether one more hit would be granted.
    pub check_only: bool,
    pub shadow: bool,
}

impl TiersItem<'_> {
    fn ask(&self) -> TierAsk {
        TierAsk {
            copies: self.copies,
            min_copies: self.min_copies,
            check_only: self.check_only,
        }
    }
}

impl Kind for TiersItem<'_> {
    fn shadow(&self) -> bool {
        self.shadow
    }

    fn slots(&self) -> [Option<usize>; 2] {
        [Some(self.slot), self.global_slot]
    }

    fn map_slots(&mut self, map: &dyn Fn(usize) -> usize) {
        self.slot = map(self.slot);
        self.global_slot = self.global_slot.map(map);
    }

    fn hits(&self) -> u64 {
        self.copies
    }

    fn set_hits(&mut self, hits: u64) {
        self.copies = hits;
    }

    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        item_is_over(
            slots,
            self.slot,
            self.global_slot,
            self.policy,
            self.global_limit,
            self.ask(),
            now,
        )
    }

    fn run(&self, step: Step<'_>) -> Outcome {
        run_item(
            step,
            self.slot,
            self.global_slot,
            self.policy,
            self.global_limit,
            self.ask(),
        )
    }
}

/// What a tier item asks: the largest `k` in `[min_copies, copies]`, or
/// only whether one more hit would be granted.
#[derive(Debug, Clone, Copy)]
struct TierAsk {
    pub copies: u64,
    pub min_copies: u64,
    pub check_only: bool,
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

/// Whether a tier item cannot be granted what it needs at `now`.
fn item_is_over(
    slots: &[Slot],
    slot: usize,
    global_slot: Option<usize>,
    policy: &RatePolicy,
    global_limit: Option<u64>,
    ask: TierAsk,
    now: u64,
) -> bool {
    let TierAsk {
        copies,
        min_copies,
        check_only,
    } = ask;
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
    super::room(policy, state, global, asked, now).grantable < needed
}

/// Decides a tier item and, committing, grants what it can: hits recorded
/// in the tiers (a burst entering the next) and the global log.
fn run_item(
    step: Step<'_>,
    slot: usize,
    global_slot: Option<usize>,
    policy: &RatePolicy,
    global_limit: Option<u64>,
    ask: TierAsk,
) -> Outcome {
    let Step { slots, now, commit } = step;
    let TierAsk {
        copies,
        min_copies,
        check_only,
    } = ask;
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
        super::room(policy, state, global, asked, now)
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
        burst = super::grant(policy, state, log.as_deref_mut(), granted, now);
    }
    let global = log
        .as_deref()
        .zip(global_limit)
        .map(|(log, limit)| Global { log, limit });
    let snapshot = super::snapshot(policy, state, global, now);
    let retry_after = if snapshot.remaining > 0 {
        Some(0)
    } else {
        super::retry_after(policy, state, global, now)
    };
    let wait = if over {
        let global = log
            .as_deref()
            .zip(global_limit)
            .map(|(log, limit)| Global { log, limit });
        super::wait_for(policy, state, global, needed, now, WAIT_STEP)
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
