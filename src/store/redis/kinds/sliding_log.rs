//! A sliding window log on the wire: `l slot limit period hits flags`; its
//! state, a log of hit times, `expires_at|log` (a concurrency limit's held
//! hits are kept alike).

use redis::ScriptInvocation;

use crate::engine::{LogState, SlidingLogItem};
use crate::store::redis::RedisError;

use super::{Wire, flags, log, number};

/// Never blocked locally: its refused hits may be logged.
impl Wire for SlidingLogItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg("l")
            .arg(self.slot + 1)
            .arg(self.limit)
            .arg(self.period)
            .arg(self.hits)
            .arg(flags(self.shadow, self.count_rejected));
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("l", self.limit, self.period, 0)
    }

    const CHUNKS: &'static str = "l";
}

/// `expires_at|log` (the log as the tier logs are written).
pub fn time_log(text: &str) -> Result<LogState, RedisError> {
    let (expires_at, entries) = text.split_once('|').unwrap_or((text, ""));
    Ok(LogState {
        log: log(entries)?,
        expires_at: number(expires_at)?,
    })
}
