//! The embedded store: state in this process, shared by every thread.
//!
//! Keys are spread over many mutex-guarded shards so both cores work at once;
//! a request locks the shards of its keys in ascending order (no deadlock)
//! and holds them for the few hundred nanoseconds the engine needs, which is
//! what makes a multi-key decision atomic. Time is read *after* the locks are
//! held and never goes back for a store, so two requests on one key are
//! decided in the order of their times even if the system clock steps back.
//!
//! Memory is bounded twice: a slot is dropped once the engine says it can no
//! longer change a decision ([`Slot::expires_at`]), on access and by sweeps;
//! and the number of keys is capped. At the cap, a request that needs a new
//! key is decided as for a fresh domain but not remembered (lenient:
//! docs/design.md#goals), and counted in [`MemoryStats::unrecorded`].
//!
//! ```rust
//! use charon::clock::ManualClock;
//! use charon::engine::{Item, SlotKind};
//! use charon::store::{Batch, MemoryStore};
//!
//! let store = MemoryStore::with_clock(ManualClock::new(0));
//! let decide = |now| {
//!     let mut batch = Batch::default();
//!     let slot = batch.slot("counter".into(), SlotKind::Window);
//!     batch.items.push(Item::Window { slot, limit: 1, period: 1_000, hits: 1, shadow: false, count_rejected: false });
//!     store.decide_at(batch, now).granted
//! };
//! assert!(decide(10));
//! assert!(!decide(20));
//! assert!(decide(1_000)); // the next window
//! ```

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

// foldhash: a fast hash with a random per-process seed, so tenants cannot
// choose keys that collide (SipHash costs more than the decision itself).
use foldhash::fast::RandomState;
use smallvec::SmallVec;

use crate::clock::{Clock, SystemClock};
use crate::engine::{self, Decision, Slot};

use super::{Batch, SlotKey, Store, StoreError};

/// Shards: enough that two cores rarely meet on one lock.
const SHARDS: usize = 128;
/// Decisions on a shard between two sweeps of it.
const SWEEP_EVERY: u32 = 4_096;
/// The default cap on keys (a few hundred bytes each).
pub const DEFAULT_MAX_KEYS: usize = 2_000_000;

/// The embedded, in-process store.
pub struct MemoryStore<C = SystemClock> {
    clock: C,
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// The latest `now` any decision used.
    high_water: AtomicU64,
    keys: AtomicUsize,
    max_keys: usize,
    unrecorded: AtomicU64,
}

/// What the store holds, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    pub keys: usize,
    pub max_keys: usize,
    /// Decisions whose new state was not kept because the store was full.
    pub unrecorded: u64,
}

#[derive(Default)]
struct Shard {
    slots: HashMap<String, Slot, RandomState>,
    decisions_since_sweep: u32,
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
            high_water: AtomicU64::new(0),
            keys: AtomicUsize::new(0),
            max_keys: DEFAULT_MAX_KEYS,
            unrecorded: AtomicU64::new(0),
        }
    }

    /// Caps the number of keys held (at least 1).
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        // A panic inside the engine loses the slots of the one request being
        // decided (they were taken out of the map); every other slot is whole,
        // so keep serving.
        self.shards[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// `now`, never earlier than any time already used by this store.
    fn monotonic(&self, now: u64) -> u64 {
        now.max(self.high_water.fetch_max(now, Ordering::SeqCst))
    }

    /// Decides `batch` at `now` (or later, if the store has already decided
    /// at a later time), synchronously.
    pub fn decide_at(&self, batch: Batch<'_>, now: u64) -> Decision {
        self.decide_with(batch, || now)
    }

    /// Decides with the time read once every lock is held.
    fn decide_with(&self, batch: Batch<'_>, now: impl FnOnce() -> u64) -> Decision {
        if batch.slots.len() == 1 {
            return self.decide_one(batch, now);
        }
        let shard_of: SmallVec<[usize; 4]> = batch
            .slots
            .iter()
            .map(|slot| self.shard_of(&slot.key))
            .collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[MutexGuard<'_, Shard>; 4]> =
            order.iter().map(|&shard| self.lock(shard)).collect();
        let position = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let now = self.monotonic(now());

        let mut existed: SmallVec<[bool; 4]> = SmallVec::new();
        let mut slots: SmallVec<[Slot; 2]> = batch
            .slots
            .iter()
            .zip(&shard_of)
            .map(|(key, &shard)| {
                let held = guards[position(shard)].slots.remove(&key.key);
                existed.push(held.is_some());
                held.filter(|slot| slot.kind() == key.kind && slot.expires_at() > now)
                    .unwrap_or_else(|| Slot::new(key.kind))
            })
            .collect();

        let decision = engine::decide(&batch.items, &mut slots, now);

        for (((key, slot), shard), existed) in batch
            .slots
            .into_iter()
            .zip(slots)
            .zip(&shard_of)
            .zip(existed)
        {
            let guard = &mut guards[position(*shard)];
            self.put_back(guard, key, slot, existed, now);
        }
        for guard in &mut guards {
            self.after_decision(guard, now);
        }
        decision
    }

    /// The common case (one key): decided in place, one hash.
    fn decide_one(&self, mut batch: Batch<'_>, now: impl FnOnce() -> u64) -> Decision {
        let Some(key) = batch.slots.pop() else {
            return engine::decide(&batch.items, &mut [], now());
        };
        let mut guard = self.lock(self.shard_of(&key.key));
        let now = self.monotonic(now());
        if let Some(slot) = guard
            .slots
            .get_mut(&key.key)
            .filter(|slot| slot.kind() == key.kind && slot.expires_at() > now)
        {
            let decision = engine::decide(&batch.items, std::slice::from_mut(slot), now);
            if slot.expires_at() <= now && guard.slots.remove(&key.key).is_some() {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            self.after_decision(&mut guard, now);
            return decision;
        }
        let mut slot = Slot::new(key.kind);
        let decision = engine::decide(&batch.items, std::slice::from_mut(&mut slot), now);
        let existed = guard.slots.remove(&key.key).is_some();
        self.put_back(&mut guard, key, slot, existed, now);
        self.after_decision(&mut guard, now);
        decision
    }

    /// Keeps `slot` under `key` if it can still matter (and there is room).
    fn put_back(&self, shard: &mut Shard, key: SlotKey, slot: Slot, existed: bool, now: u64) {
        let keep = slot.expires_at() > now;
        match (keep, existed) {
            (true, true) => {
                shard.slots.insert(key.key, slot);
            }
            (true, false) => {
                if self.keys.load(Ordering::Relaxed) < self.max_keys {
                    self.keys.fetch_add(1, Ordering::Relaxed);
                    shard.slots.insert(key.key, slot);
                } else {
                    self.unrecorded.fetch_add(1, Ordering::Relaxed);
                }
            }
            (false, true) => {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            (false, false) => {}
        }
    }

    fn after_decision(&self, shard: &mut Shard, now: u64) {
        shard.decisions_since_sweep += 1;
        if shard.decisions_since_sweep >= SWEEP_EVERY {
            self.sweep_shard(shard, now);
        }
    }

    fn sweep_shard(&self, shard: &mut Shard, now: u64) -> usize {
        let before = shard.slots.len();
        shard.slots.retain(|_, slot| slot.expires_at() > now);
        shard.decisions_since_sweep = 0;
        let dropped = before - shard.slots.len();
        self.keys.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// The state of `keys` now, read without changing it (a key that holds
    /// nothing, or state past its expiry, reads as fresh), and that "now".
    pub fn peek(&self, keys: &[SlotKey]) -> (Vec<Slot>, u64) {
        let now = self
            .clock
            .now_ms()
            .max(self.high_water.load(Ordering::SeqCst));
        let slots = keys
            .iter()
            .map(|key| {
                let shard = self.lock(self.shard_of(&key.key));
                shard
                    .slots
                    .get(&key.key)
                    .filter(|slot| slot.kind() == key.kind && slot.expires_at() > now)
                    .cloned()
                    .unwrap_or_else(|| Slot::new(key.kind))
            })
            .collect();
        (slots, now)
    }

    /// Drops every slot that can no longer change a decision; returns how
    /// many were dropped.
    pub fn sweep(&self) -> usize {
        let now = self.monotonic(self.clock.now_ms());
        (0..SHARDS)
            .map(|shard| {
                let mut guard = self.lock(shard);
                self.sweep_shard(&mut guard, now)
            })
            .sum()
    }

    /// How many keys hold state.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|shard| self.lock(shard).slots.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> MemoryStats {
        MemoryStats {
            keys: self.keys.load(Ordering::Relaxed),
            max_keys: self.max_keys,
            unrecorded: self.unrecorded.load(Ordering::Relaxed),
        }
    }
}

impl<C: Clock> Store for MemoryStore<C> {
    fn decide(
        &self,
        batch: Batch<'_>,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        std::future::ready(Ok(self.decide_with(batch, || self.clock.now_ms())))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn decides_now(&self) -> bool {
        true
    }

    fn decide_now(&self, batch: Batch<'_>) -> Option<Decision> {
        Some(self.decide_with(batch, || self.clock.now_ms()))
    }
}
