//! Burst tiers on the wire: `t slot global_slot global_limit copies
//! min_copies check_only shadow hard_limit n` then each tier's `limit
//! window active cooldown skippable` and the GCRA bucket's `count period
//! burst` (zeros without one); its state `expires_at|recent|entered;log|…`
//! with the bucket as a `b`-prefixed field, and a resource's global log
//! `total~t:n,t:n,…`.

use redis::ScriptInvocation;

use crate::config::FOREVER;
use crate::engine::tiers::TierLog;
use crate::engine::{GcraState, HitLog, TierState, TiersItem};
use crate::store::redis::RedisError;

use super::{Limits, Wire, bounded, flag, gcra, number};

impl Wire for TiersItem<'_> {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        let policy = self.policy;
        invocation
            .arg("t")
            .arg(self.slot + 1)
            .arg(self.global_slot.map_or(0, |g| g + 1))
            .arg(bounded(self.global_limit))
            .arg(self.copies)
            .arg(self.min_copies)
            .arg(flag(self.check_only))
            .arg(flag(self.shadow))
            .arg(bounded(policy.hard_limit))
            .arg(policy.tiers.len());
        for tier in &policy.tiers {
            invocation
                .arg(tier.limit)
                .arg(bounded(Some(tier.window)))
                .arg(bounded(Some(tier.active)))
                .arg(bounded(Some(tier.cooldown)))
                .arg(flag(tier.skippable));
        }
        match policy.gcra {
            Some(gcra) => invocation.arg(gcra.count).arg(gcra.period).arg(gcra.burst),
            None => invocation.arg(0).arg(0).arg(0),
        };
    }

    fn blockable(&self) -> bool {
        true
    }

    fn blocked(&self) -> Option<Limits> {
        Some(Limits::Tiers(self.policy.clone(), self.global_limit))
    }

    fn governed_by(&self, limits: &Limits) -> bool {
        match limits {
            Limits::Tiers(policy, global) => policy == self.policy && *global == self.global_limit,
            _ => false,
        }
    }

    fn needed(&self) -> u64 {
        if self.check_only {
            1
        } else {
            self.min_copies.max(1)
        }
    }

    /// Tiers, and GCRA's chunk: a bucket instead of tiers is its state.
    const CHUNKS: &'static str = "ta";
}

/// `total~t:n,t:n,...`; logs written by older scripts have no `total~`
/// (the total is the sum either way, and `HitLog` keeps its own).
pub fn log(text: &str) -> Result<HitLog, RedisError> {
    let entries = match text.split_once('~') {
        Some((total, entries)) => {
            number(total)?;
            entries
        }
        None => text,
    };
    let mut log = HitLog::default();
    for entry in entries.split(',').filter(|e| !e.is_empty()) {
        let (at, hits) = entry
            .split_once(':')
            .ok_or_else(|| RedisError::State(format!("not a log entry: {entry:?}")))?;
        log.push(number(at)?, number(hits)?);
    }
    Ok(log)
}

/// `expires_at|recent|entered;log|…`, `f` for an expiry of never, a
/// `b`-prefixed field for the GCRA bucket.
pub fn tiers(text: &str) -> Result<TierState, RedisError> {
    let mut fields = text.split('|');
    let expires_at = match fields.next() {
        Some("f") => FOREVER,
        other => number(other.unwrap_or(""))?,
    };
    let recent = log(fields.next().unwrap_or(""))?;
    let mut bucket = GcraState::default();
    let mut tiers = Vec::new();
    for field in fields {
        if let Some(encoded) = field.strip_prefix('b') {
            bucket = gcra(encoded)?;
            continue;
        }
        let (entered, hits) = field
            .split_once(';')
            .ok_or_else(|| RedisError::State(format!("not a tier: {field:?}")))?;
        tiers.push(TierLog {
            entered_at: if entered.is_empty() {
                None
            } else {
                Some(number(entered)?)
            },
            hits: log(hits)?,
        });
    }
    Ok(TierState {
        tiers,
        recent,
        expires_at,
        bucket,
    })
}
