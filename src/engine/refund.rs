//! Refunds (docs/design.md#refunds): hits given back, as Envoy's
//! `is_negative_hits` asks. A refund is never over its limit and never
//! credits past it: a count never goes below 0, a bucket never holds more
//! than its burst. Each algorithm gives back in its own file; this one
//! dispatches, and answers with the state after the refund.
//!
//! A refund is applied with its batch, so that the Redis script and the
//! engine agree without replaying anything; the limiter puts a request's
//! refunds in a batch of their own, which is always granted.

use super::concurrency::{self, Hold};
use super::{CostOp, GcraLimit, Outcome, Step, cost, gcra, sliding, sliding_log, window};

/// The limit a refund gives back to: the kinds that can take hits back.
/// Burst tiers, bans and the hybrid limiter cannot (docs/design.md#refunds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refundable {
    /// A fixed window: the current window's count.
    Window { limit: u64, period: u64 },
    /// A sliding window counter: the current window's count.
    Sliding { limit: u64, period: u64 },
    /// A sliding window log: its oldest hits that still count.
    SlidingLog { limit: u64, period: u64 },
    /// A token bucket: tokens back, up to its burst.
    Gcra(GcraLimit),
    /// A cost budget: cost units back, in the current window.
    Cost {
        limit: u64,
        period: u64,
        initial_cost: u64,
    },
    /// A concurrency limit: what is owed first, then held hits.
    Concurrency(Hold),
}

/// Gives `hits` back to the key in `slots[slot]` (committing), and answers
/// with the state after, never over.
pub(super) fn run_item(step: Step<'_>, slot: usize, hits: u64, of: Refundable) -> Outcome {
    let Step { slots, now, commit } = step;
    // Hits held past their time leave a concurrency limit's log here too,
    // counted as they go.
    let unreturned = match of {
        Refundable::Concurrency(hold) if commit => {
            concurrency::unreturned(slots, slot, hold.max_hold, now)
        }
        _ => 0,
    };
    if commit {
        match of {
            Refundable::Window { period, .. } => window::refund_in(slots, slot, period, hits, now),
            Refundable::Sliding { period, .. } => {
                sliding::refund_in(slots, slot, period, hits, now)
            }
            Refundable::SlidingLog { period, .. } => {
                sliding_log::refund_in(slots, slot, period, hits, now)
            }
            Refundable::Gcra(limit) => gcra::refund_in(slots, slot, limit, hits, now),
            Refundable::Cost { .. } => {}
            Refundable::Concurrency(hold) => {
                concurrency::refund_in(slots, slot, hold.owed_slot, hold.max_hold, hits, now)
            }
        }
    }
    // The answer: the state after, as a check would see it.
    let seen = Step {
        slots,
        now,
        commit: false,
    };
    let outcome = match of {
        Refundable::Window { limit, period } => {
            window::run_item(seen, slot, limit, period, 0, false)
        }
        Refundable::Sliding { limit, period } => sliding::run_item(seen, slot, limit, period, 0),
        Refundable::SlidingLog { limit, period } => {
            sliding_log::run_item(seen, slot, limit, period, 0, false)
        }
        Refundable::Gcra(limit) => gcra::run_item(seen, slot, limit, 0),
        Refundable::Cost {
            limit,
            period,
            initial_cost,
        } => {
            // A cost's refund is its own operation: in the current window.
            let op = if hits > 0 {
                CostOp::Refund {
                    amount: hits,
                    charged_at: now,
                }
            } else {
                CostOp::Hits(0)
            };
            let step = Step {
                slots: seen.slots,
                now,
                commit: commit && hits > 0,
            };
            cost::run_item(step, slot, limit, period, op, initial_cost)
        }
        Refundable::Concurrency(hold) => concurrency::run_item(seen, slot, hold, 0),
    };
    let mut outcome = never_over(outcome);
    if let Outcome::Window(w) = &mut outcome {
        w.unreturned = unreturned;
    }
    outcome
}

/// A refund's answer: whatever the state after, it passed.
fn never_over(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Window(mut w) => {
            w.over = false;
            w.wait = Some(0);
            Outcome::Window(w)
        }
        Outcome::Gcra(mut g) => {
            g.over = false;
            g.wait = Some(0);
            Outcome::Gcra(g)
        }
        Outcome::Tiers(mut t) => {
            t.over = false;
            t.wait = Some(0);
            Outcome::Tiers(t)
        }
    }
}
