//! The wire between the sidecar and `decide.lua`: a batch becomes the
//! script's arguments, and the script's reply (the time it decided at, the
//! verdict, and the state it decided on) becomes engine slots again.
//!
//! One piece: what the sidecar writes and what `decide.lua` reads (and back)
//! must change together, kind by kind, so both directions of every kind are
//! kept in one file; its tests are in `codec/tests.rs`.
//!
//! A request of one fixed window or one GCRA bucket, the usual one, travels
//! in a shorter form of its own ([`one_item_arguments`]): its numbers only,
//! answered by one string instead of a table, which is what Redis spends
//! the most on around a small script (docs/performance.md#redis-work-per-decision).
//!
//! Numbers travel as decimal text; `-1` stands for "none" (a limit) and
//! "forever" (a duration), because Lua numbers are doubles and `u64::MAX`
//! is not one of them. Every other number Charon sends fits in 53 bits: counts
//! are capped at `u32::MAX` by the config and times at a century of
//! milliseconds past the epoch.

use redis::ScriptInvocation;
use smallvec::SmallVec;

use crate::config::FOREVER;
use crate::engine::{
    BanState, CostOp, CostState, GcraState, HitLog, HybridState, Item, LogState, Refundable,
    Reservation, SlidingState, Slot, SlotKind, TierState, WindowState, hybrid::Mode,
    tiers::TierLog,
};

/// The largest whole number a Lua double holds exactly: a refund of more
/// gives back everything all the same.
const MAX_EXACT: u64 = (1 << 53) - 1;

use super::RedisError;

/// `-1` for "none" or "forever".
fn bounded(n: Option<u64>) -> i64 {
    match n {
        Some(n) if n != FOREVER => i64::try_from(n).unwrap_or(-1),
        _ => -1,
    }
}

fn flag(flag: bool) -> &'static str {
    if flag { "1" } else { "0" }
}

/// The numbers of a fixed window (`limit period hits flags`, the flags one
/// argument: 1 shadow, 2 count rejected hits) or of a GCRA bucket (`count
/// period burst hits shadow`), as both forms send them; `false` (nothing
/// added) for any other kind.
fn numbers(invocation: &mut ScriptInvocation<'_>, item: &Item<'_>) -> bool {
    match *item {
        Item::Window {
            limit,
            period,
            hits,
            shadow,
            count_rejected,
            ..
        } => {
            invocation
                .arg(limit)
                .arg(period)
                .arg(hits)
                .arg(u8::from(shadow) | (u8::from(count_rejected) << 1));
        }
        Item::Gcra {
            limit,
            hits,
            shadow,
            ..
        } => {
            invocation
                .arg(limit.count)
                .arg(limit.period)
                .arg(limit.burst)
                .arg(hits)
                .arg(flag(shadow));
        }
        _ => return false,
    }
    true
}

/// Adds the ARGV of the one-item form of `window.lua` or `gcra.lua` for
/// `item`, which must be the only item, on the only key; `false` (nothing
/// added) for any other kind. `injected_now` 0 means Redis `TIME`, and is
/// then not sent.
pub fn one_item_arguments(
    invocation: &mut ScriptInvocation<'_>,
    injected_now: u64,
    item: &Item<'_>,
) -> bool {
    if !numbers(invocation, item) {
        return false;
    }
    if injected_now != 0 {
        invocation.arg(injected_now);
    }
    true
}

/// Adds the script's ARGV for `items` over slots of `kinds` to `invocation`
/// (slot indexes become Lua's 1-based KEYS). `injected_now` 0 means Redis
/// `TIME`. Numbers are written by redis-rs as decimal text.
pub fn arguments(
    invocation: &mut ScriptInvocation<'_>,
    injected_now: u64,
    kinds: impl Iterator<Item = SlotKind>,
    items: &[Item<'_>],
) {
    let kinds: SmallVec<[u8; 4]> = kinds.map(SlotKind::letter).collect();
    invocation
        .arg(injected_now)
        .arg(kinds.as_slice())
        .arg(items.len());
    for item in items {
        match *item {
            Item::Window { slot, .. } => {
                invocation.arg("w").arg(slot + 1);
                numbers(invocation, item);
            }
            Item::Ban {
                slot,
                limit,
                hits,
                shadow,
            } => {
                invocation
                    .arg("b")
                    .arg(slot + 1)
                    .arg(limit.limit)
                    .arg(limit.window)
                    .arg(limit.duration)
                    .arg(hits)
                    .arg(flag(shadow));
            }
            Item::SlidingLog {
                slot,
                limit,
                period,
                hits,
                shadow,
                count_rejected,
            } => {
                // One argument, two flags: 1 shadow, 2 count rejected hits.
                invocation
                    .arg("l")
                    .arg(slot + 1)
                    .arg(limit)
                    .arg(period)
                    .arg(hits)
                    .arg(u8::from(shadow) | (u8::from(count_rejected) << 1));
            }
            Item::Hybrid {
                slot,
                quota,
                window,
                hits,
                shadow,
            } => {
                invocation
                    .arg("h")
                    .arg(slot + 1)
                    .arg(quota)
                    .arg(window)
                    .arg(hits)
                    .arg(flag(shadow));
            }
            Item::Sliding {
                slot,
                limit,
                period,
                hits,
                shadow,
            } => {
                invocation
                    .arg("s")
                    .arg(slot + 1)
                    .arg(limit)
                    .arg(period)
                    .arg(hits)
                    .arg(flag(shadow));
            }
            Item::Cost {
                slot,
                limit,
                period,
                op,
                shadow,
                initial_cost,
            } => {
                // `op amount id extra flag`: the id as text (Lua's numbers
                // are doubles), `extra` a reservation's ttl or when a
                // refund's charge was made.
                let (code, id, extra, on_expiry) = match op {
                    CostOp::Hits(_) => ("h", 0, 0, false),
                    CostOp::Reserve {
                        id,
                        ttl,
                        charge_on_expiry,
                        ..
                    } => ("r", id, ttl, charge_on_expiry),
                    CostOp::Commit { id, .. } => ("m", id, 0, false),
                    CostOp::Cancel { id } => ("x", id, 0, false),
                    CostOp::Refund { charged_at, .. } => ("f", 0, charged_at, false),
                };
                invocation
                    .arg("c")
                    .arg(slot + 1)
                    .arg(limit)
                    .arg(period)
                    .arg(op.amount())
                    .arg(flag(shadow))
                    .arg(initial_cost)
                    .arg(code)
                    .arg(id)
                    .arg(extra)
                    .arg(flag(on_expiry));
            }
            Item::Gcra { slot, .. } => {
                invocation.arg("a").arg(slot + 1);
                numbers(invocation, item);
            }
            Item::Concurrency {
                slot,
                hold,
                hits,
                shadow,
            } => {
                invocation
                    .arg("k")
                    .arg(slot + 1)
                    .arg(hold.owed_slot + 1)
                    .arg(hold.limit)
                    .arg(hold.max_hold)
                    .arg(hits)
                    .arg(flag(shadow));
            }
            Item::Refund { slot, hits, of } => {
                // `r slot of hits` and three numbers, whatever the kind.
                let (of, a, b, c) = match of {
                    Refundable::Window { limit, period } => ("w", limit, period, 0),
                    Refundable::Sliding { limit, period } => ("s", limit, period, 0),
                    Refundable::SlidingLog { limit, period } => ("l", limit, period, 0),
                    Refundable::Gcra(limit) => ("a", limit.count, limit.period, limit.burst),
                    Refundable::Cost {
                        limit,
                        period,
                        initial_cost,
                    } => ("c", limit, period, initial_cost),
                    Refundable::Concurrency(hold) => {
                        ("k", hold.owed_slot as u64 + 1, hold.limit, hold.max_hold)
                    }
                };
                invocation
                    .arg("r")
                    .arg(slot + 1)
                    .arg(of)
                    .arg(hits.min(MAX_EXACT))
                    .arg(a)
                    .arg(b)
                    .arg(c);
            }
            Item::Tiers {
                slot,
                global_slot,
                policy,
                global_limit,
                copies,
                min_copies,
                check_only,
                shadow,
            } => {
                invocation
                    .arg("t")
                    .arg(slot + 1)
                    .arg(global_slot.map_or(0, |g| g + 1))
                    .arg(bounded(global_limit))
                    .arg(copies)
                    .arg(min_copies)
                    .arg(flag(check_only))
                    .arg(flag(shadow))
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
        }
    }
}

/// A stored value back as an engine slot, as of `now`: state past its expiry
/// is a fresh slot, exactly as the script and the memory store treat it.
pub fn slot(kind: SlotKind, raw: Option<&[u8]>, now: u64) -> Result<Slot, RedisError> {
    let slot = match raw {
        None => Slot::new(kind),
        Some(raw) => {
            let text =
                std::str::from_utf8(raw).map_err(|_| RedisError::State("not UTF-8".into()))?;
            match kind {
                SlotKind::Window => Slot::Window(window(text)?),
                SlotKind::Tiers => Slot::Tiers(tiers(text)?),
                SlotKind::Log => Slot::Log(log(text)?),
                SlotKind::Gcra => Slot::Gcra(gcra(text)?),
                SlotKind::Cost => Slot::Cost(cost(text)?),
                SlotKind::Sliding => Slot::Sliding(sliding(text)?),
                SlotKind::Hybrid => Slot::Hybrid(hybrid(text)?),
                SlotKind::SlidingLog => Slot::SlidingLog(sliding_log(text)?),
                SlotKind::Ban => Slot::Ban(ban(text)?),
            }
        }
    };
    Ok(if slot.expires_at() > now {
        slot
    } else {
        Slot::new(kind)
    })
}

fn number(text: &str) -> Result<u64, RedisError> {
    text.parse()
        .map_err(|_| RedisError::State(format!("not a number: {text:?}")))
}

fn window(text: &str) -> Result<WindowState, RedisError> {
    let mut fields = text.split(',');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(WindowState {
        start: next()?,
        count: next()?,
        expires_at: next()?,
    })
}

/// `start,current,previous,expires_at`.
fn sliding(text: &str) -> Result<SlidingState, RedisError> {
    let mut fields = text.split(',');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(SlidingState {
        start: next()?,
        current: next()?,
        previous: next()?,
        expires_at: next()?,
    })
}

/// `start,count,banned_until,expires_at`.
fn ban(text: &str) -> Result<BanState, RedisError> {
    let mut fields = text.split(',');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(BanState {
        start: next()?,
        count: next()?,
        banned_until: next()?,
        expires_at: next()?,
    })
}

/// `expires_at|log` (the log as the tier logs are written).
fn sliding_log(text: &str) -> Result<LogState, RedisError> {
    let (expires_at, entries) = text.split_once('|').unwrap_or((text, ""));
    Ok(LogState {
        log: log(entries)?,
        expires_at: number(expires_at)?,
    })
}

/// `mode,time,bucket,expires_at`: mode `b` bursty or `s` smooth; the
/// bucket may be negative.
fn hybrid(text: &str) -> Result<HybridState, RedisError> {
    let mut fields = text.split(',');
    let mode = match fields.next() {
        Some("b") => Mode::Bursty,
        Some("s") => Mode::Smooth,
        other => return Err(RedisError::State(format!("not a hybrid mode: {other:?}"))),
    };
    let time = number(fields.next().unwrap_or(""))?;
    let bucket = fields.next().unwrap_or("");
    let bucket = bucket
        .parse::<i64>()
        .map_err(|_| RedisError::State(format!("not a bucket: {bucket:?}")))?;
    Ok(HybridState {
        mode,
        time,
        bucket,
        expires_at: number(fields.next().unwrap_or(""))?,
    })
}

/// `start,used,mean,dev,duration,expires_at|t,t,...` (the admissions in
/// flight, oldest first).
fn cost(text: &str) -> Result<CostState, RedisError> {
    let mut parts = text.splitn(3, '|');
    let head = parts.next().unwrap_or("");
    let pending = parts.next().unwrap_or("");
    let reservations = parts.next().unwrap_or("");
    let mut fields = head.split(',');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(CostState {
        start: next()?,
        used: next()?,
        mean: next()?,
        dev: next()?,
        duration: next()?,
        expires_at: next()?,
        pending: pending
            .split(',')
            .filter(|t| !t.is_empty())
            .map(number)
            .collect::<Result<_, _>>()?,
        reservations: reservations
            .split(',')
            .filter(|r| !r.is_empty())
            .map(reservation)
            .collect::<Result<_, _>>()?,
    })
}

/// `id:amount:expires_at:charge_on_expiry` (0 or 1).
fn reservation(text: &str) -> Result<Reservation, RedisError> {
    let mut fields = text.split(':');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(Reservation {
        id: next()?,
        amount: next()?,
        expires_at: next()?,
        charge_on_expiry: next()? == 1,
    })
}

/// `tat_ms,ticks,count`: the TAT is `tat_ms` plus `ticks`/`count` ms.
fn gcra(text: &str) -> Result<GcraState, RedisError> {
    let mut fields = text.split(',');
    let mut next = || number(fields.next().unwrap_or(""));
    let (ms, ticks, count) = (next()?, next()?, next()?);
    Ok(GcraState {
        tat: u128::from(ms) * u128::from(count) + u128::from(ticks),
        count,
    })
}

/// `total~t:n,t:n,...`; logs written by older scripts have no `total~`
/// (the total is the sum either way, and `HitLog` keeps its own).
fn log(text: &str) -> Result<HitLog, RedisError> {
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

fn tiers(text: &str) -> Result<TierState, RedisError> {
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

mod reply;
#[cfg(test)]
mod tests;

pub use reply::reply;
