//! Local rejections: a key that Redis said is over its limit until a known
//! instant is rejected here, without a round trip, until then.
//!
//! Exact for what it answers: a one-hit request on a key was rejected with a
//! `retry_after`, which is when a one-hit request would pass if nothing else
//! happened; and the only other things that can happen are more grants
//! (elsewhere, on the global log) or more time. Grants only tighten a limit,
//! so before that instant every request on the key, of any size, is rejected.
//! Only single-item, non-shadow batches use it (a multi-item answer needs the
//! state of the other items), and only while the limits are those the
//! rejection was computed with.
//!
//! The instant is kept on this machine's clock and starts from the time the
//! request was *sent*, which is no later than the Redis time it was decided
//! at: a local rejection can end early (and ask Redis again), never late.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use foldhash::fast::RandomState;

use crate::engine::{Item, Outcome};

use super::kinds::{self, Limits, needed};
use crate::store::Batch;

/// Keys remembered at most (a bound on memory under many hot tenants).
const CAPACITY: usize = 100_000;

#[derive(Debug, Clone)]
struct Block {
    /// Local time (ms) until which the key is over.
    until: u64,
    /// The rejection as Redis answered it, and when (local time).
    outcome: Outcome,
    decided_at: u64,
    limits: Limits,
    /// The hits the rejected request needed: its `wait` is theirs.
    needed: u64,
}

#[derive(Default)]
pub struct Blocked {
    keys: Mutex<HashMap<String, Block, RandomState>>,
}

impl Blocked {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Block, RandomState>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rejection to answer for `item` on `key` at local time `now`, if
    /// the key is known to be over.
    pub fn check(&self, key: &str, item: &Item<'_>, now: u64) -> Option<Outcome> {
        let mut keys = self.lock();
        let block = keys.get(key)?;
        if now >= block.until || !kinds::governed_by(item, &block.limits) {
            keys.remove(key);
            return None;
        }
        if block.needed != needed(item) {
            // Rejected too, but its own wait is another request's to compute.
            return None;
        }
        let elapsed = now.saturating_sub(block.decided_at);
        Some(age(block.outcome, elapsed))
    }

    /// Forgets the keys `batch` gave hits back to: they may have room
    /// before their blocks end.
    pub fn forget_refunded(&self, batch: &Batch<'_>) {
        for item in &batch.items {
            if let Item::Refund(_) = item
                && let Some(key) = batch.slots.get(item.slot())
            {
                self.lock().remove(&key.key);
            }
        }
    }

    /// Remembers a one-hit-or-more rejection of `item` decided with
    /// `outcome`, for a request sent at local time `sent`.
    pub fn remember(&self, key: &str, item: &Item<'_>, outcome: &Outcome, sent: u64) {
        let retry_after = match outcome {
            Outcome::Window(w) if w.over && w.remaining == 0 => w.retry_after,
            Outcome::Tiers(t) if t.over => t.retry_after,
            _ => None,
        };
        let Some(retry_after) = retry_after.filter(|r| *r > 0) else {
            return;
        };
        let Some(limits) = kinds::blocked(item) else {
            return;
        };
        let mut keys = self.lock();
        if keys.len() >= CAPACITY {
            keys.retain(|_, block| block.until > sent);
            if keys.len() >= CAPACITY {
                return;
            }
        }
        keys.insert(
            key.to_string(),
            Block {
                until: sent.saturating_add(retry_after),
                outcome: *outcome,
                decided_at: sent,
                limits,
                needed: needed(item),
            },
        );
    }
}

/// The remembered rejection, `elapsed` ms later.
fn age(outcome: Outcome, elapsed: u64) -> Outcome {
    match outcome {
        Outcome::Window(mut w) => {
            w.reset_after = w.reset_after.saturating_sub(elapsed);
            w.retry_after = w.retry_after.map(|r| r.saturating_sub(elapsed));
            w.wait = w.wait.map(|r| r.saturating_sub(elapsed));
            Outcome::Window(w)
        }
        Outcome::Tiers(mut t) => {
            t.retry_after = t.retry_after.map(|r| r.saturating_sub(elapsed));
            t.wait = t.wait.map(|r| r.saturating_sub(elapsed));
            t.snapshot.reset_after = t.snapshot.reset_after.saturating_sub(elapsed);
            Outcome::Tiers(t)
        }
        Outcome::Gcra(mut g) => {
            g.retry_after = g.retry_after.map(|r| r.saturating_sub(elapsed));
            g.wait = g.wait.map(|r| r.saturating_sub(elapsed));
            g.reset_after = g.reset_after.saturating_sub(elapsed);
            Outcome::Gcra(g)
        }
    }
}
