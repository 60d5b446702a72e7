//! A calendar window on the wire: `d slot limit b0 b1 b2 b3 hits shadow`,
//! the boundaries the sidecar computed, also the one-item form of
//! `calendar.lua`; Redis `TIME` picks the window. Its state is a fixed
//! window's (`window.rs`).

use redis::ScriptInvocation;

use crate::engine::CalendarItem;

use super::{OwnScript, Wire, flag};

/// Never blocked locally: a rejection lasts until a boundary the store's
/// clock decides, not one this process could keep.
impl Wire for CalendarItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation.arg("d").arg(self.slot + 1);
        self.own_arguments(invocation);
    }

    fn own_script(&self) -> Option<OwnScript> {
        Some(OwnScript::Calendars)
    }

    fn own_arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        let [b0, b1, b2, b3] = self.bounds;
        invocation
            .arg(self.limit)
            .arg(b0)
            .arg(b1)
            .arg(b2)
            .arg(b3)
            .arg(self.hits)
            .arg(flag(self.shadow));
    }

    /// The boundaries that tell the window of the store's clock.
    fn refund(&self) -> (&'static str, u64, u64, u64) {
        let [b0, b1, b2, _] = self.bounds;
        ("d", b0, b1, b2)
    }

    /// Its own, and the fixed window's: its state is a window's.
    const CHUNKS: &'static str = "dw";
}
