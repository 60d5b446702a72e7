//! A concurrency limit on the wire: `k slot owed_slot limit max_hold hits
//! shadow`; its held hits are a log of hit times (`sliding_log.rs`), what
//! is owed a window's state (`window.rs`).

use redis::ScriptInvocation;

use crate::engine::MaxHoldItem;

use super::{Wire, flag};

/// Never blocked locally: its refused hits are owed refunds.
impl Wire for MaxHoldItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg("k")
            .arg(self.slot + 1)
            .arg(self.hold.owed_slot + 1)
            .arg(self.hold.limit)
            .arg(self.hold.max_hold)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        (
            "k",
            self.hold.owed_slot as u64 + 1,
            self.hold.limit,
            self.hold.max_hold,
        )
    }

    /// Its own, and the fixed window's: what is owed is a window's state.
    const CHUNKS: &'static str = "kw";
}
