//! Each kind's wire beside its Lua chunk (`<kind>.rs` and `<kind>.lua`):
//! the script's arguments for its item and its refunds, the state it
//! stores and how the sidecar reads that state back, and whether a
//! rejection of it may be kept here ([`super::blocked`]). What the sidecar
//! writes and what the script reads must change together, kind by kind.
//!
//! Numbers travel as decimal text; `-1` stands for "none" (a limit) and
//! "forever" (a duration), because Lua numbers are doubles and `u64::MAX`
//! is not one of them. Every other number Charon sends fits in 53 bits:
//! counts are capped at `u32::MAX` by the config and times at a century of
//! milliseconds past the epoch.

mod ban;
mod calendar;
mod cost;
mod gcra;
mod hybrid;
mod max_hold;
mod sliding;
mod sliding_log;
mod tiers;
mod window;

use redis::ScriptInvocation;

use crate::config::FOREVER;
use crate::engine::{Item, Refundable, kinds};

use super::RedisError;

pub(super) use self::ban::ban;
pub(super) use self::cost::cost;
pub(super) use self::gcra::gcra;
pub(super) use self::hybrid::hybrid;
pub(super) use self::sliding::sliding;
pub(super) use self::sliding_log::time_log;
pub(super) use self::tiers::{log, tiers};
pub(super) use self::window::window;

/// What a local rejection ([`super::blocked`]) was computed with: other
/// limits, another answer. Each kind that may be kept says which of these
/// it asks under.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Limits {
    Window { limit: u64, period: u64 },
    Tiers(crate::config::RatePolicy, Option<u64>),
    Gcra(crate::engine::GcraLimit),
}

/// The largest whole number a Lua double holds exactly: a refund of more
/// gives back everything all the same.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// A script of its own for batches of one kind alone: the same decision
/// without the others' code, read and run by Redis faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OwnScript {
    /// `window.lua`.
    Windows,
    /// `gcra.lua`.
    Buckets,
    /// `sliding.lua`.
    Slidings,
    /// `calendar.lua`.
    Calendars,
}

/// One kind's wire.
pub(super) trait Wire {
    /// The letters of the batch script's kind chunks its item uses: its
    /// own, then those its chunk makes with `need`. The script makes the
    /// functions of only the kinds a call names (`decide/head.lua`).
    const CHUNKS: &'static str;

    /// [`Wire::CHUNKS`], for an item whose kind is known at run time.
    fn chunks(&self) -> &'static str {
        Self::CHUNKS
    }

    /// Its letter and arguments in the batch script's ARGV (slots 1-based).
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>);

    /// A refund of it: its letter and the three numbers of `r slot of hits
    /// a b c`. Only asked of kinds that can be refunded.
    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("", 0, 0, 0)
    }

    /// The script of its own that decides a batch of this kind alone;
    /// `None` for a kind without one.
    fn own_script(&self) -> Option<OwnScript> {
        None
    }

    /// The numbers its own script reads (as the batch script's, after the
    /// slot).
    fn own_arguments(&self, _invocation: &mut ScriptInvocation<'_>) {}

    /// Whether a rejection of it may be kept here: `false` for an item
    /// whose every request must reach Redis (its refused hits are recorded,
    /// or its rejection's end is not one instant a block could keep).
    fn blockable(&self) -> bool {
        false
    }

    /// What a local rejection of it is computed with; `None` when not
    /// [`Wire::blockable`].
    fn blocked(&self) -> Option<Limits> {
        None
    }

    /// Whether it asks under `limits` (no copy of its policy: this runs on
    /// every request for a blocked key).
    fn governed_by(&self, _limits: &Limits) -> bool {
        false
    }

    /// The hits it needs to be granted (a blocked rejection's `wait` is
    /// for those hits).
    fn needed(&self) -> u64 {
        0
    }

    /// Itself, owned, when its own script has a queue form (a hot key's
    /// decisions go as one call: `queue.rs`); `None` for a kind without.
    fn queued(&self) -> Option<Item<'static>> {
        None
    }
}

/// The kind chunks `item` uses in the batch script (a refund: those of the
/// kind it gives back to).
pub(super) fn chunks(item: &Item<'_>) -> &'static str {
    kinds!(item, Item, |item| item.chunks();
    Item::Refund(of) => kinds!(of, Refundable, |item| item.chunks()))
}

/// Adds `item`'s letter and arguments to the batch script's ARGV.
pub(super) fn arguments(invocation: &mut ScriptInvocation<'_>, item: &Item<'_>) {
    kinds!(item, Item, |item| item.arguments(invocation);
    Item::Refund(of) => {
        let (letter, a, b, c) = kinds!(of, Refundable, |item| item.refund());
        invocation
            .arg("r")
            .arg(of.slots()[0].unwrap_or(0) + 1)
            .arg(letter)
            .arg(of.hits().min(MAX_EXACT))
            .arg(a)
            .arg(b)
            .arg(c);
    })
}

/// The script of its own that decides `item` alone, if its kind has one.
pub(super) fn own_script(item: &Item<'_>) -> Option<OwnScript> {
    kinds!(item, Item, |item| item.own_script(); Item::Refund(_) => None)
}

/// Adds the numbers `item`'s own script reads.
pub(super) fn own_arguments(invocation: &mut ScriptInvocation<'_>, item: &Item<'_>) {
    kinds!(item, Item, |item| item.own_arguments(invocation); Item::Refund(_) => {})
}

/// Whether a rejection of `item` may be kept here (no refund's is).
pub(super) fn blockable(item: &Item<'_>) -> bool {
    kinds!(item, Item, |item| item.blockable(); Item::Refund(_) => false)
}

/// What a local rejection of `item` is computed with (`None`: never kept).
pub(super) fn blocked(item: &Item<'_>) -> Option<Limits> {
    kinds!(item, Item, |item| item.blocked(); Item::Refund(_) => None)
}

/// Whether `item` asks under `limits`.
pub(super) fn governed_by(item: &Item<'_>, limits: &Limits) -> bool {
    kinds!(item, Item, |item| item.governed_by(limits); Item::Refund(_) => false)
}

/// The hits `item` needs to be granted.
pub(super) fn needed(item: &Item<'_>) -> u64 {
    kinds!(item, Item, |item| item.needed(); Item::Refund(_) => 0)
}

/// `item`, owned, if its kind's own script decides queued decisions.
pub(super) fn queued(item: &Item<'_>) -> Option<Item<'static>> {
    kinds!(item, Item, |item| item.queued(); Item::Refund(_) => None)
}

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

/// Two flags in one argument: 1 shadow, 2 count rejected hits.
fn flags(shadow: bool, count_rejected: bool) -> u8 {
    u8::from(shadow) | (u8::from(count_rejected) << 1)
}

fn number(text: &str) -> Result<u64, RedisError> {
    text.parse()
        .map_err(|_| RedisError::State(format!("not a number: {text:?}")))
}

/// The comma-separated numbers of a state, in order (a missing one is an
/// error when read).
fn numbers(text: &str) -> impl FnMut() -> Result<u64, RedisError> + '_ {
    let mut fields = text.split(',');
    move || number(fields.next().unwrap_or(""))
}
