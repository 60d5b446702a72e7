//! A sliding window counter on the wire: `s slot limit period hits
//! shadow`, also the one-item form of `sliding.lua`; its state
//! `start,current,previous,expires_at`.

use redis::ScriptInvocation;

use crate::engine::{SlidingItem, SlidingState};
use crate::store::redis::RedisError;

use super::{OwnScript, Wire, flag, numbers};

/// Never blocked locally: its rejection's end is not one instant a block
/// could keep.
impl Wire for SlidingItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.arg("s").arg(self.slot + 1);
        self.own_arguments(invocation);
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("s", self.limit, self.period, 0)
    }

    fn own_script(&self) -> Option<OwnScript> {
        Some(OwnScript::Slidings)
    }

    fn own_arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg(self.limit)
            .arg(self.period)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    const CHUNKS: &'static str = "s";
}

/// `start,current,previous,expires_at`.
pub fn sliding(text: &str) -> Result<SlidingState, RedisError> {
    let mut next = numbers(text);
    Ok(SlidingState {
        start: next()?,
        current: next()?,
        previous: next()?,
        expires_at: next()?,
    })
}
