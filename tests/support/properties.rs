//! Generators shared by the property tests.

use std::ops::Range;

use charon::config::{FOREVER, RatePolicy, Tier};
use charon::engine::GcraLimit;
use proptest::prelude::*;

/// A normalized burst-tier policy (windows of 100 ms steps, active a whole
/// number of windows or `forever`) with optional H, and an optional G; or,
/// one time in four, a GCRA bucket instead of the tiers.
/// The ranges bound the number of tiers and the values of H and G.
pub fn arb_policy(
    tiers: Range<usize>,
    hard: Range<u64>,
    global: Range<u64>,
) -> impl Strategy<Value = (RatePolicy, Option<u64>)> {
    let tier = (
        0u64..5,
        1u64..30,
        prop::option::of(1u64..6),
        0u64..60,
        any::<bool>(),
    )
        .prop_map(
            |(limit, window_tenths, windows_active, cooldown_tenths, skippable)| {
                let window = window_tenths * 100;
                Tier {
                    limit,
                    window,
                    active: windows_active.map_or(FOREVER, |k| k * window),
                    cooldown: cooldown_tenths * 100,
                    skippable,
                }
            },
        );
    // One policy in four is a token bucket instead of tiers.
    let gcra = prop::option::weighted(
        0.25,
        (1u64..20, 1u64..30, 1u64..30).prop_map(|(count, period_tenths, burst)| GcraLimit {
            count,
            period: period_tenths * 100,
            burst,
        }),
    );
    (
        prop::collection::vec(tier, tiers),
        prop::option::of(hard),
        prop::option::of(global),
        gcra,
    )
        .prop_map(|(tiers, hard_limit, global, gcra)| {
            let tiers = if gcra.is_some() { Vec::new() } else { tiers };
            (
                RatePolicy {
                    hard_limit,
                    tiers,
                    gcra,
                },
                global,
            )
        })
}
