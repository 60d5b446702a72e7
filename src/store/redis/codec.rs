//! The wire between the sidecar and the batch script: a batch becomes the
//! script's arguments, and the script's reply (the time it decided at, the
//! verdict, and the state it decided on) becomes engine slots again.
//!
//! What each kind writes and reads back is its own, in `kinds/<kind>.rs`
//! beside the Lua chunk that reads and writes the same (`kinds/<kind>.lua`);
//! this file is the envelope around them. Its tests are in `codec/tests.rs`.
//!
//! A request of one item of a kind with a script of its own (a fixed
//! window, a GCRA bucket, a sliding or a calendar window), the usual one,
//! travels
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

use crate::engine::{Item, Slot, SlotKind};

use super::RedisError;
use super::kinds::{self, ban, cost, gcra, hybrid, log, sliding, tiers, time_log, window};

/// Adds the ARGV of the one-item form of a kind's own script (`window.lua`,
/// `gcra.lua`, `sliding.lua`, `calendar.lua`) for
/// `item`, which must be the only item, on the only key; `false` (nothing
/// added) for a kind without a script of its own. `injected_now` 0 means
/// Redis `TIME`, and is then not sent.
pub fn one_item_arguments(
    invocation: &mut ScriptInvocation<'_>,
    injected_now: u64,
    item: &Item<'_>,
) -> bool {
    if kinds::own_script(item).is_none() {
        return false;
    }
    kinds::own_arguments(invocation, item);
    if injected_now != 0 {
        invocation.arg(injected_now);
    }
    true
}

/// Adds the script's ARGV for `items` over slots of `kinds` to `invocation`
/// (slot indexes become Lua's 1-based KEYS), each item as its kind writes
/// it (`kinds/`). `injected_now` 0 means Redis `TIME`. Numbers are written
/// by redis-rs as decimal text.
pub fn arguments(
    invocation: &mut ScriptInvocation<'_>,
    injected_now: u64,
    slot_kinds: impl Iterator<Item = SlotKind>,
    items: &[Item<'_>],
) {
    // The keys' state letters, then the kind chunks the items use, each
    // named once: the script makes a set of them on every call.
    let mut letters: SmallVec<[u8; 8]> = slot_kinds.map(SlotKind::letter).collect();
    for item in items {
        for &letter in kinds::chunks(item).as_bytes() {
            if !letters.contains(&letter) {
                letters.push(letter);
            }
        }
    }
    invocation
        .arg(injected_now)
        .arg(letters.as_slice())
        .arg(items.len());
    for item in items {
        kinds::arguments(invocation, item);
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
                SlotKind::TimeLog => Slot::TimeLog(time_log(text)?),
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

mod reply;

/// `TIME`'s `[seconds, microseconds]` as milliseconds.
pub(super) fn redis_time_ms(value: &redis::Value) -> Result<u64, RedisError> {
    let part = |part: &redis::Value| match part {
        redis::Value::BulkString(text) => std::str::from_utf8(text).ok()?.parse::<u64>().ok(),
        redis::Value::Int(number) => u64::try_from(*number).ok(),
        _ => None,
    };
    let parsed = match value {
        redis::Value::Array(parts) => match parts.as_slice() {
            [seconds, micros] => part(seconds)
                .zip(part(micros))
                .and_then(|(seconds, micros)| {
                    seconds.checked_mul(1_000)?.checked_add(micros / 1_000)
                }),
            _ => None,
        },
        _ => None,
    };
    parsed.ok_or_else(|| RedisError::State(format!("TIME answered {value:?}")))
}

#[cfg(test)]
mod tests;

pub use reply::{queue_reply, reply};
