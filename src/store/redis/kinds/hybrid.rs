//! The hybrid quota-linear limiter on the wire: `h slot quota window hits
//! shadow`; its state `mode,time,bucket,expires_at`.

use redis::ScriptInvocation;

use crate::engine::hybrid::Mode;
use crate::engine::{HybridItem, HybridState};
use crate::store::redis::RedisError;

use super::{Wire, flag, number};

/// Never blocked locally: kept simple, its waits move with its mode.
impl Wire for HybridItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg("h")
            .arg(self.slot + 1)
            .arg(self.quota)
            .arg(self.window)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    const CHUNKS: &'static str = "h";
}

/// `mode,time,bucket,expires_at`: mode `b` bursty or `s` smooth; the
/// bucket may be negative.
pub fn hybrid(text: &str) -> Result<HybridState, RedisError> {
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
