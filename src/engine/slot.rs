//! The state behind each key a batch touches: one [`Slot`] per key, of
//! the [`SlotKind`] its algorithm keeps. A kind is a shape of state, not an
//! algorithm: sliding logs and concurrency limits both keep a
//! [`Slot::TimeLog`]. An algorithm whose state has a new shape adds a kind
//! here (its letter names it in stored keys and in the Redis script's
//! arguments; CONTRIBUTING.md has the whole checklist).

use super::{
    BanState, CostState, GcraState, HitLog, HybridState, LogState, SlidingState, TierState,
    WindowState, tiers,
};

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
    /// The instants of a sliding window log's hits, or of a concurrency
    /// limit's holds.
    TimeLog(LogState),
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
    TimeLog,
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
            SlotKind::TimeLog => b'l',
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
            SlotKind::TimeLog => Slot::TimeLog(LogState::default()),
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
            Slot::TimeLog(_) => SlotKind::TimeLog,
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
            Slot::TimeLog(state) => state.expires_at,
            Slot::Ban(state) => state.expires_at,
        }
    }
}
