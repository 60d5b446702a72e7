//! A token bucket on the wire: `a slot count period burst hits shadow`,
//! also the one-item form of `gcra.lua`; its state `tat_ms,ticks,count`.

use redis::ScriptInvocation;

use crate::engine::{GcraItem, GcraState, Item};
use crate::store::redis::RedisError;

use super::{Limits, OwnScript, Wire, flag, numbers};

impl Wire for GcraItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.arg("a").arg(self.slot + 1);
        self.own_arguments(invocation);
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("a", self.limit.count, self.limit.period, self.limit.burst)
    }

    fn own_script(&self) -> Option<OwnScript> {
        Some(OwnScript::Buckets)
    }

    fn own_arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg(self.limit.count)
            .arg(self.limit.period)
            .arg(self.limit.burst)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    fn blockable(&self) -> bool {
        true
    }

    fn blocked(&self) -> Option<Limits> {
        Some(Limits::Gcra(self.limit))
    }

    fn governed_by(&self, limits: &Limits) -> bool {
        *limits == Limits::Gcra(self.limit)
    }

    fn needed(&self) -> u64 {
        self.hits.max(1)
    }

    fn queued(&self) -> Option<Item<'static>> {
        Some(Item::Gcra(*self))
    }

    const CHUNKS: &'static str = "a";
}

/// `tat_ms,ticks,count`: the TAT is `tat_ms` plus `ticks`/`count` ms.
pub fn gcra(text: &str) -> Result<GcraState, RedisError> {
    let mut next = numbers(text);
    let (ms, ticks, count) = (next()?, next()?, next()?);
    Ok(GcraState {
        tat: u128::from(ms) * u128::from(count) + u128::from(ticks),
        count,
    })
}
