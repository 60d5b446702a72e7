//! A Cloud Armor ban on the wire: `b slot limit window duration hits
//! shadow`; its state `start,count,banned_until,expires_at`.

use redis::ScriptInvocation;

use crate::engine::{BanItem, BanState};
use crate::store::redis::RedisError;

use super::{Wire, flag, numbers};

/// Never blocked locally: its trip must be recorded.
impl Wire for BanItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg("b")
            .arg(self.slot + 1)
            .arg(self.limit.limit)
            .arg(self.limit.window)
            .arg(self.limit.duration)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    const CHUNKS: &'static str = "b";
}

/// `start,count,banned_until,expires_at`.
pub fn ban(text: &str) -> Result<BanState, RedisError> {
    let mut next = numbers(text);
    Ok(BanState {
        start: next()?,
        count: next()?,
        banned_until: next()?,
        expires_at: next()?,
    })
}
