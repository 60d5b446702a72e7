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
    /// Hits the limit had counted before this request's: envoyproxy/
    /// ratelimit's statistics split a request's hits at the near-limit
    /// threshold and at the limit from it
    /// (docs/envoy-compatibility.md#metrics).
    pub before: u64,
    /// Until the window ends.
    pub reset_after: u64,
    /// Until a one-hit request would pass; `None`: never (limit 0).
    pub retry_after: Option<u64>,
    /// Until this request's own hits would pass (0 when granted): the next
    /// window; `None`: never (more hits than the limit).
    pub wait: Option<u64>,
    /// A concurrency limit's hits that were held past `max_hold`, never
    /// given back, and left its log in this decision (0 for other kinds).
    pub unreturned: u64,
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
    /// A window's answer for `hits`, as a resource answers: the window
    /// shown as tier 1 (a resource of another algorithm than tiers).
    pub fn from_window(w: &WindowOutcome, hits: u64) -> Self {
        TierOutcome {
            over: w.over,
            granted: if w.over { 0 } else { hits },
            hard_limit: None,
            global_limit: None,
            burst: false,
            limited_by_hard: false,
            limited_by_global: false,
            snapshot: Snapshot {
                tier: 1,
                shown_tier: 1,
                tier_limit: w.limit,
                tier_window: w.period,
                tier_hits: w.limit.saturating_sub(w.remaining),
                domain_hits: 0,
                resource_hits: None,
                remaining: w.remaining,
                reset_after: w.reset_after,
            },
            retry_after: w.retry_after,
            // Whole steps, as Envoy reads a resource's wait.
            wait: w
                .wait
                .map(|ms| ms.div_ceil(super::WAIT_STEP) * super::WAIT_STEP),
        }
    }

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
