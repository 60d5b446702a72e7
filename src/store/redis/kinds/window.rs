//! A fixed window on the wire: `w slot limit period hits flags`, also the
//! one-item form of `window.lua`; its state `start,count,expires_at`.

use redis::ScriptInvocation;

use crate::engine::{Item, WindowItem, WindowState};
use crate::store::redis::RedisError;

use super::{Limits, OwnScript, Wire, flags, numbers};

impl Wire for WindowItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.arg("w").arg(self.slot + 1);
        self.own_arguments(invocation);
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("w", self.limit, self.period, 0)
    }

    fn own_script(&self) -> Option<OwnScript> {
        Some(OwnScript::Windows)
    }

    fn own_arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg(self.limit)
            .arg(self.period)
            .arg(self.hits)
            .arg(flags(self.shadow, self.count_rejected));
    }

    fn blockable(&self) -> bool {
        !self.count_rejected
    }

    /// Never when it counts rejected hits: they must reach Redis.
    fn blocked(&self) -> Option<Limits> {
        (!self.count_rejected).then_some(Limits::Window {
            limit: self.limit,
            period: self.period,
        })
    }

    fn governed_by(&self, limits: &Limits) -> bool {
        *limits
            == Limits::Window {
                limit: self.limit,
                period: self.period,
            }
    }

    fn needed(&self) -> u64 {
        self.hits.max(1)
    }

    fn queued(&self) -> Option<Item<'static>> {
        Some(Item::Window(*self))
    }

    const CHUNKS: &'static str = "w";
}

/// `start,count,expires_at`.
pub fn window(text: &str) -> Result<WindowState, RedisError> {
    let mut next = numbers(text);
    Ok(WindowState {
        start: next()?,
        count: next()?,
        expires_at: next()?,
    })
}
