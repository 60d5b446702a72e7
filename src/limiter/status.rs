//! Engine outcomes as the per-descriptor statuses of an answer.

use crate::config::{Algorithm, Unit};
use crate::engine::{Outcome, TierOutcome};

use super::batch::tier_name;
use super::request::{CurrentLimit, DescriptorStatus};
use super::resolve::Resolved;

pub(super) fn status(
    resolved: &Resolved<'_>,
    outcome: Option<&Outcome>,
    hits: u64,
    ignore: bool,
) -> DescriptorStatus {
    let mut status = match (resolved, outcome) {
        (Resolved::Unlimited { .. }, _) => DescriptorStatus::unlimited(u64::from(u32::MAX)),
        (Resolved::Fixed { limit, shadow, .. }, Some(Outcome::Window(w))) => DescriptorStatus {
            over_limit: w.over && !shadow,
            limit: Some(CurrentLimit {
                name: limit.name().cloned(),
                requests_per_unit: limit.requests_per_unit(),
                unit: limit.unit(),
                // The window's own length: a calendar month's is its days.
                window_ms: w.period,
            }),
            remaining: if w.over { 0 } else { w.remaining },
            before: w.before,
            reset_after_ms: Some(if w.over {
                w.wait.unwrap_or(w.reset_after)
            } else {
                w.reset_after
            }),
            tiers: None,
            shadowed: w.over && *shadow,
            soft_limit_exceeded: !w.over
                && limit.soft_limit().is_some_and(|soft| {
                    soft.exceeded(w.limit.saturating_sub(w.remaining), w.limit)
                }),
            ..DescriptorStatus::unlimited(0)
        },
        (Resolved::Fixed { limit, shadow, .. }, Some(Outcome::Gcra(g))) => DescriptorStatus {
            over_limit: g.over && !shadow,
            limit: Some(CurrentLimit {
                name: limit.name().cloned(),
                requests_per_unit: limit.requests_per_unit(),
                unit: limit.unit(),
                window_ms: limit.period(),
            }),
            remaining: if g.over { 0 } else { g.remaining },
            // A bucket has no count: the burst it had spent.
            before: limit
                .requests_per_unit()
                .saturating_sub(g.remaining)
                .saturating_sub(if g.over { 0 } else { hits }),
            // Rejected: when these hits pass (never: a period from now);
            // granted: when the bucket is full again (TAT - now),
            // docs/design.md#resets.
            reset_after_ms: Some(if g.over {
                g.wait.unwrap_or(limit.period())
            } else {
                g.reset_after
            }),
            tiers: None,
            // In use: the burst not available now.
            shadowed: g.over && *shadow,
            soft_limit_exceeded: !g.over
                && match (limit.soft_limit(), limit.algorithm()) {
                    (Some(soft), Algorithm::Gcra { burst }) => {
                        soft.exceeded(burst.saturating_sub(g.remaining), burst)
                    }
                    _ => false,
                },
            ..DescriptorStatus::unlimited(0)
        },
        (Resolved::Resource { rate, shadow, .. }, Some(outcome)) => {
            // Tiers answer as they are; another algorithm's window is shown
            // as tier 1 (converted only then: a tier answer is not copied).
            let converted;
            let t = match outcome {
                Outcome::Tiers(t) => t,
                Outcome::Window(w) => {
                    converted = TierOutcome::from_window(w, hits);
                    &converted
                }
                Outcome::Gcra(_) => return DescriptorStatus::unlimited(0),
            };
            DescriptorStatus {
                over_limit: t.over && !shadow,
                limit: Some(CurrentLimit {
                    name: Some(tier_name(
                        &rate.name,
                        t.snapshot.shown_tier,
                        t.snapshot.tier_window,
                    )),
                    requests_per_unit: t.snapshot.tier_limit,
                    unit: Unit::covering(t.snapshot.tier_window),
                    window_ms: t.snapshot.tier_window,
                }),
                remaining: if t.over { 0 } else { t.snapshot.remaining },
                before: t.snapshot.tier_hits.saturating_sub(t.granted),
                // Rejected and never to fit: a window of the shown tier.
                reset_after_ms: Some(if t.over {
                    t.wait.unwrap_or(t.snapshot.tier_window)
                } else {
                    t.snapshot.reset_after
                }),
                tiers: Some(*t),
                // The current tier's window fill.
                shadowed: t.over && *shadow,
                soft_limit_exceeded: !t.over
                    && rate.soft_limit.is_some_and(|soft| {
                        soft.exceeded(t.snapshot.tier_hits, t.snapshot.tier_limit)
                    }),
                ..DescriptorStatus::unlimited(0)
            }
        }
        _ => DescriptorStatus::unlimited(0),
    };
    if ignore {
        status.shadowed |= status.over_limit;
        status.over_limit = false;
    }
    status
}
