//! What the engine answers: a [`Decision`] for the batch, an [`Outcome`] per
//! item, with what each face turns into remaining, resets and waits.

use smallvec::SmallVec;

use super::{GcraOutcome, Snapshot};

/// The answer for a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// No non-shadow item was over: everything asked for was recorded.
    pub granted: bool,
    /// One per item, in order.
    pub outcomes: SmallVec<[Outcome; 1]>,
    pub now: u64,
    /// Not the shared state's answer: the store could not reach it and
    /// answered by its failure policy (the engine itself never sets this).
    pub degraded: bool,
}

/// The answer for one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Window(WindowOutcome),
    Tiers(TierOutcome),
    Gcra(GcraOutcome),
}

impl Outcome {
    pub fn over(&self) -> bool {
        match self {
            Outcome::Window(w) => w.over,
            Outcome::Tiers(t) => t.over,
            Outcome::Gcra(g) => g.over,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowOutcome {
    pub over: bool,
    pub limit: u64,
    pub period: u64,
    /// Hits left in this window after this decision.
    pub remaining: u64,
    /// Until the window ends.
    pub reset_after: u64,
    /// Until a one-hit request would pass; `None`: never (limit 0).
    pub retry_after: Option<u64>,
    /// Until this request's own hits would pass (0 when granted): the next
    /// window; `None`: never (more hits than the limit).
    pub wait: Option<u64>,
}

/// A burst-tier answer: the context of docs/design.md#rate-answers, with
/// `retry_after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierOutcome {
    pub over: bool,
    /// Hits granted (0 on rejection or check).
    pub granted: u64,
    pub hard_limit: Option<u64>,
    pub global_limit: Option<u64>,
    /// Whether this request entered a tier.
    pub burst: bool,
    pub limited_by_hard: bool,
    pub limited_by_global: bool,
    /// The state after the decision.
    pub snapshot: Snapshot,
    /// Until a one-hit request would be granted; `None`: never.
    pub retry_after: Option<u64>,
    /// Until this request's own hits (`min_copies`, or one for a check)
    /// would be granted (0 when granted), in whole [`WAIT_STEP`](super::WAIT_STEP)s; `None`:
    /// never.
    pub wait: Option<u64>,
}

impl TierOutcome {
    /// What rejected the request, for metrics and logs: `none` when it was
    /// granted, else `global`, `hard` or `tier`, the first that applies.
    pub fn limited_by(&self) -> &'static str {
        if !self.over {
            "none"
        } else if self.limited_by_global {
            "global"
        } else if self.limited_by_hard {
            "hard"
        } else {
            "tier"
        }
    }
}
