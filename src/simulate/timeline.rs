//! What a simulation shows: the [`Timeline`] of ticks, each tier's view at
//! a tick read back from the engine's state, and the timeline as text.

use serde::Serialize;

use crate::config::{FOREVER, RateResource, duration};
use crate::engine::tiers::{self, Global, Phase};
use crate::engine::{Slot, gcra};

/// What a simulation shows, tick by tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timeline {
    pub resource: String,
    pub domain: String,
    pub tick_ms: u64,
    pub hard_limit: Option<u64>,
    pub global_limit: Option<u64>,
    /// The tiers (or the bucket, shown as one tier).
    pub tiers: Vec<TierConfig>,
    pub granted: u64,
    pub rejected: u64,
    /// Granted past the resource's `soft_limit` (docs/design.md#soft-limits).
    pub warned: u64,
    pub ticks: Vec<Tick>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TierConfig {
    pub limit: u64,
    pub window_ms: u64,
    /// `None`: forever.
    pub active_ms: Option<u64>,
    pub cooldown_ms: u64,
    pub skippable: bool,
    /// A GCRA bucket (limit = burst, window = period, count per period).
    pub bucket_count: Option<u64>,
}

/// One tick: its requests, and the state at its last millisecond.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tick {
    /// The tick's start, from the start of the pattern.
    pub at_ms: u64,
    pub granted: u64,
    pub rejected: u64,
    /// Of the granted, those past the soft limit.
    pub warned: u64,
    /// One-indexed; 0 when no tier is active.
    pub tier: usize,
    pub tiers: Vec<TierView>,
    /// Until one more request would be granted; `None`: never.
    pub retry_after_ms: Option<u64>,
    /// The domain's grants in the last second (what H counts).
    pub domain_hits_last_second: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseName {
    Active,
    Cooldown,
    Inactive,
    Bucket,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TierView {
    pub phase: PhaseName,
    /// Hits in the tier's window now (a bucket: the part of its burst in use).
    pub hits: u64,
    pub limit: u64,
}

/// The limits of `domain` on `rate`, as a timeline shows them.
pub fn tier_configs(rate: &RateResource, domain: &str) -> Vec<TierConfig> {
    let policy = rate.policy_for(domain);
    if let Some(bucket) = &policy.gcra {
        return vec![TierConfig {
            limit: bucket.burst,
            window_ms: bucket.period,
            active_ms: None,
            cooldown_ms: 0,
            skippable: false,
            bucket_count: Some(bucket.count),
        }];
    }
    policy
        .tiers
        .iter()
        .map(|tier| TierConfig {
            limit: tier.limit,
            window_ms: tier.window,
            active_ms: (tier.active != FOREVER).then_some(tier.active),
            cooldown_ms: tier.cooldown,
            skippable: tier.skippable,
            bucket_count: None,
        })
        .collect()
}

/// The state in `slots` (the domain's tier state, then the resource's
/// global log if it has a global limit) at `now`, as the engine sees it: the
/// state view reads the store's slots with it, the simulation its own.
pub fn read_back(rate: &RateResource, domain: &str, slots: &[Slot], now: u64, at_ms: u64) -> Tick {
    let policy = rate.policy_for(domain);
    let empty = tiers::TierState::default();
    let state = match slots.first() {
        Some(Slot::Tiers(state)) => state,
        _ => &empty,
    };
    let log = match slots.get(1) {
        Some(Slot::Log(log)) => Some(log),
        _ => None,
    };
    let global = log
        .zip(rate.global_limit)
        .map(|(log, limit)| Global { log, limit });
    let snapshot = tiers::snapshot(policy, state, global, now);
    let views = match &policy.gcra {
        Some(bucket) => vec![TierView {
            phase: PhaseName::Bucket,
            hits: bucket
                .burst
                .saturating_sub(gcra::room(bucket, &state.bucket, now)),
            limit: bucket.burst,
        }],
        None => policy
            .tiers
            .iter()
            .enumerate()
            .map(|(index, tier)| {
                let log = state.tiers.get(index);
                let phase = tiers::phase(tier, log.and_then(|log| log.entered_at), now);
                TierView {
                    phase: match phase {
                        Phase::Active => PhaseName::Active,
                        Phase::Cooldown => PhaseName::Cooldown,
                        Phase::Inactive => PhaseName::Inactive,
                    },
                    hits: match phase {
                        Phase::Inactive => 0,
                        _ => log.map_or(0, |log| log.hits.count(now, tier.window)),
                    },
                    limit: tier.limit,
                }
            })
            .collect(),
    };
    Tick {
        at_ms,
        granted: 0,
        rejected: 0,
        warned: 0,
        tier: snapshot.tier,
        tiers: views,
        retry_after_ms: tiers::retry_after(policy, state, global, now),
        domain_hits_last_second: snapshot.domain_hits,
    }
}

impl Timeline {
    /// The timeline as text: a header, then one line per tick.
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "resource {} for domain {}: {} granted, {} rejected\n",
            self.resource, self.domain, self.granted, self.rejected
        );
        for (index, tier) in self.tiers.iter().enumerate() {
            let line = match tier.bucket_count {
                Some(count) => format!(
                    "  bucket: {count} per {}, bursts of {}\n",
                    duration::format(tier.window_ms),
                    tier.limit
                ),
                None => format!(
                    "  tier {}: {} per {}, active {}, cooldown {}{}\n",
                    index + 1,
                    tier.limit,
                    duration::format(tier.window_ms),
                    tier.active_ms.map_or("forever".into(), duration::format),
                    duration::format(tier.cooldown_ms),
                    if tier.skippable { ", skippable" } else { "" }
                ),
            };
            text.push_str(&line);
        }
        if let Some(hard) = self.hard_limit {
            text.push_str(&format!("  hard limit: {hard} per second\n"));
        }
        if let Some(global) = self.global_limit {
            text.push_str(&format!("  global limit: {global} per second\n"));
        }
        if self.warned > 0 {
            text.push_str(&format!(
                "  {} of the granted were past the soft limit\n",
                self.warned
            ));
        }
        text.push_str(
            "      at  granted rejected  tier  tiers (phase hits/limit)            retry after\n",
        );
        for tick in &self.ticks {
            let tiers: Vec<String> = tick
                .tiers
                .iter()
                .map(|view| {
                    let phase = match view.phase {
                        PhaseName::Active => "active",
                        PhaseName::Cooldown => "cooldown",
                        PhaseName::Inactive => "inactive",
                        PhaseName::Bucket => "bucket",
                    };
                    format!("{phase} {}/{}", view.hits, view.limit)
                })
                .collect();
            text.push_str(&format!(
                "{:>8}  {:>7} {:>8}  {:>4}  {:<36} {}\n",
                duration::format(tick.at_ms),
                tick.granted,
                tick.rejected,
                tick.tier,
                tiers.join(" | "),
                tick.retry_after_ms.map_or("never".into(), duration::format)
            ));
        }
        text
    }
}
