//! The embedded store: state in this process, shared by every thread.
//!
//! Keys are spread over many mutex-guarded shards so both cores work at once;
//! a request locks the shards of its keys in ascending order (no deadlock)
//! and holds them for the few hundred nanoseconds the engine needs, which is
//! what makes a multi-key decision atomic. Memory is bounded: a slot is
//! dropped once the engine says it can no longer change a decision
//! ([`Slot::expires_at`]), on access and by periodic sweeps.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

// foldhash: a fast hash with a random per-process seed, so tenants cannot
// choose keys that collide (SipHash costs more than the decision itself).
use foldhash::fast::RandomState;
use smallvec::SmallVec;

use crate::clock::{Clock, SystemClock};
use crate::engine::{self, Decision, Slot};

use super::{Batch, Store, StoreError};

/// Shards: enough that two cores rarely meet on one lock.
const SHARDS: usize = 128;
/// Decisions on a shard between two sweeps of it.
const SWEEP_EVERY: u32 = 4_096;

/// The embedded, in-process store.
pub struct MemoryStore<C = SystemClock> {
    clock: C,
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
}

#[derive(Default)]
struct Shard {
    slots: HashMap<String, Slot, RandomState>,
    decisions_since_sweep: u32,
}

impl Shard {
    fn sweep(&mut self, now: u64) -> usize {
        let before = self.slots.len();
        self.slots.retain(|_, slot| slot.expires_at() > now);
        self.decisions_since_sweep = 0;
        before - self.slots.len()
    }
}

impl MemoryStore<SystemClock> {
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryStore<C> {
    /// A store reading time from `clock` (tests inject a manual clock).
    pub fn with_clock(clock: C) -> Self {
        Self {
            clock,
            hasher: RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic while a shard was locked cannot leave a slot half-written
        // (slots are taken out, decided on, then put back whole), so the data
        // is still sound: keep serving.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Decides `batch` at `now`, synchronously.
    pub fn decide_at(&self, batch: Batch<'_>, now: u64) -> Decision {
        let shard_of: SmallVec<[usize; 4]> = batch
            .slots
            .iter()
            .map(|slot| (self.hasher.hash_one(&slot.key) as usize) % SHARDS)
            .collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            order.iter().map(|&shard| self.lock(shard)).collect();
        let position = |shard: usize| order.binary_search(&shard).unwrap_or(0);

        let mut slots: SmallVec<[Slot; 2]> = batch
            .slots
            .iter()
            .zip(&shard_of)
            .map(|(key, &shard)| {
                guards[position(shard)]
                    .slots
                    .remove(&key.key)
                    .filter(|slot| slot.kind() == key.kind && slot.expires_at() > now)
                    .unwrap_or_else(|| Slot::new(key.kind))
            })
            .collect();

        let decision = engine::decide(&batch.items, &mut slots, now);

        for ((key, slot), shard) in batch.slots.into_iter().zip(slots).zip(&shard_of) {
            if slot.expires_at() > now {
                guards[position(*shard)].slots.insert(key.key, slot);
            }
        }
        for guard in &mut guards {
            guard.decisions_since_sweep += 1;
            if guard.decisions_since_sweep >= SWEEP_EVERY {
                guard.sweep(now);
            }
        }
        decision
    }

    /// Drops every slot that can no longer change a decision; returns how
    /// many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        (0..SHARDS).map(|shard| self.lock(shard).sweep(now)).sum()
    }

    /// How many keys hold state.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|shard| self.lock(shard).slots.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn decide(
        &self,
        batch: Batch<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let now = self.clock.now_ms();
        std::future::ready(Ok(self.decide_at(batch, now)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
