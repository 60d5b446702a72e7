//! The decision log: a structured event for a sample of the decisions of
//! every face, so that limits can be tuned from real traffic
//! (docs/operations.md#decision-log): Envoy's `ShouldRateLimit`
//! (namespace, descriptors, outcome, the limit that decided, its tier and
//! what limited it, the wait), the Charon API's operations and cost calls,
//! RLQS assignments, and global limits' share moves (an
//! [`OperationEvent`] and the face it came from). It goes to
//! the log stream (target `charon::decision`), so `--log-format json` makes
//! it one JSON object per decision for a log pipeline. Every face shares
//! one per-second budget.
//!
//! It can never hurt the hot path: the sample is drawn before anything is
//! formatted, and at most `max_per_second` events leave per second; what is
//! held back past that is counted and said once the second is over.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::limiter::{DescriptorStatus, RateLimitAnswer};
use crate::service::OperationEvent;

/// The log target the events carry.
pub const TARGET: &str = "charon::decision";

/// `--decision-log-sample` and `--decision-log-max-per-second`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecisionLogOptions {
    /// A decision is logged when a uniform `u64` falls below this (0: off).
    threshold: u64,
    /// Events per second at most.
    pub max_per_second: u32,
}

impl DecisionLogOptions {
    /// `ratio` (0 to 1) of decisions, at most `max_per_second` a second.
    pub fn new(ratio: f64, max_per_second: u32) -> Self {
        Self {
            threshold: crate::server::trace::threshold(ratio),
            max_per_second,
        }
    }

    pub fn is_on(&self) -> bool {
        self.threshold > 0 && self.max_per_second > 0
    }
}

/// The log's state: the options and this second's budget.
#[derive(Debug, Default)]
pub struct DecisionLog {
    options: DecisionLogOptions,
    budget: Mutex<Budget>,
}

#[derive(Debug, Default)]
struct Budget {
    second: u64,
    logged: u32,
    held_back: u64,
}

/// A decision drawn for the log: what of the request it will say.
pub struct Sampled {
    descriptors: String,
}

impl DecisionLog {
    pub fn new(options: DecisionLogOptions) -> Self {
        Self {
            options,
            budget: Mutex::new(Budget::default()),
        }
    }

    /// Draws the sample for one request, before it is decided (and moved):
    /// `None` for most requests, at the cost of one random number.
    pub fn sample(&self, request: &RateLimitRequest) -> Option<Sampled> {
        if !self.options.is_on() || crate::server::trace::random() >= self.options.threshold {
            return None;
        }
        let descriptors = request
            .descriptors
            .iter()
            .map(|descriptor| {
                descriptor
                    .entries
                    .iter()
                    .map(|entry| format!("{}={}", entry.key, entry.value))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect::<Vec<_>>()
            .join(";");
        Some(Sampled { descriptors })
    }

    /// Whether the next decision is drawn for the log: `false` for most,
    /// at the cost of one random number.
    pub fn draw(&self) -> bool {
        self.options.is_on() && crate::server::trace::random() < self.options.threshold
    }

    /// Logs `event` of `face` (`charon_api`, `rlqs` or `global`) within
    /// this second's budget (drawn by the caller with [`draw`](Self::draw),
    /// or always, for rare events such as a share's move, when the log is
    /// on).
    pub fn event(&self, face: &'static str, event: &OperationEvent<'_>) {
        if !self.options.is_on() || !self.admit() {
            return;
        }
        tracing::info!(
            target: TARGET,
            face,
            operation = event.operation,
            namespace = event.namespace,
            resource = event.resource,
            domain = event.domain,
            outcome = event.outcome,
            amount = event.amount,
            "decision"
        );
    }

    /// Logs a sampled decision, within this second's budget.
    pub fn record(&self, sampled: Sampled, namespace: &str, answer: &RateLimitAnswer) {
        if !self.admit() {
            return;
        }
        // The status that decided: the first over its limit, else the first
        // with a limit at all.
        let deciding = answer
            .statuses
            .iter()
            .find(|status| status.over_limit || status.shadowed)
            .or_else(|| answer.statuses.iter().find(|status| status.limit.is_some()));
        let outcome = if answer.over_limit {
            "over_limit"
        } else if answer.shadowed || answer.statuses.iter().any(|status| status.shadowed) {
            "shadow_mode"
        } else if answer.statuses.iter().all(|status| status.refund) {
            "refunded"
        } else {
            "ok"
        };
        let limit = deciding.and_then(|status| status.stats_key.as_deref());
        let (tier, limited_by) = deciding.map_or((None, None), tier_of);
        tracing::info!(
            target: TARGET,
            namespace,
            descriptors = sampled.descriptors,
            outcome,
            limit,
            tier,
            limited_by,
            retry_after_s = deciding.and_then(|status| status.reset_after_ms).map(|ms| ms.div_ceil(1000)),
            hits = deciding.map(|status| status.hits),
            "decision"
        );
    }

    /// Whether one more event fits this second; says how many were held
    /// back when a new second starts.
    fn admit(&self) -> bool {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        let Ok(mut budget) = self.budget.lock() else {
            return false;
        };
        if budget.second != second {
            if budget.held_back > 0 {
                tracing::info!(
                    target: TARGET,
                    held_back = budget.held_back,
                    max_per_second = self.options.max_per_second,
                    "decisions sampled but not logged: over --decision-log-max-per-second"
                );
            }
            *budget = Budget {
                second,
                logged: 0,
                held_back: 0,
            };
        }
        if budget.logged < self.options.max_per_second {
            budget.logged += 1;
            true
        } else {
            budget.held_back += 1;
            false
        }
    }
}

/// A burst-tier status's tier (one-indexed, 0 when none is active) and
/// what limited it.
fn tier_of(status: &DescriptorStatus) -> (Option<usize>, Option<&'static str>) {
    let Some(tiers) = &status.tiers else {
        return (None, None);
    };
    let limited_by = tiers.over.then(|| tiers.limited_by());
    (Some(tiers.snapshot.tier), limited_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_holds_back_past_the_cap() {
        let log = DecisionLog::new(DecisionLogOptions::new(1.0, 3));
        let admitted = (0..10).filter(|_| log.admit()).count();
        // Unless the second turned over in between, exactly the cap.
        assert!((3..=6).contains(&admitted), "{admitted}");
    }

    #[test]
    fn off_samples_nothing() {
        let request = RateLimitRequest::default();
        let off = DecisionLog::new(DecisionLogOptions::default());
        assert!(off.sample(&request).is_none());
        let zero_rate = DecisionLog::new(DecisionLogOptions::new(1.0, 0));
        assert!(zero_rate.sample(&request).is_none());
        let all = DecisionLog::new(DecisionLogOptions::new(1.0, 10));
        assert!(all.sample(&request).is_some());
    }
}
