//! The embedded store: state in this process, shared by every thread.
//! Beside the rate store (this file and the tables below it), the folder
//! holds the memory half of every other family: the copy log
//! (`copies.rs`), capacity leases (`leases.rs`), the configuration API's
//! log (`config_log.rs`) and recorded use (`learn.rs`).
//!
//! Keys are spread over many mutex-guarded shards so both cores work at once;
//! a request locks the shards of its keys in ascending order (no deadlock)
//! and holds them for the few hundred nanoseconds the engine needs, which is
//! what makes a multi-key decision atomic. Time is read *after* the locks are
//! held and never goes back for a store, so two requests on one key are
//! decided in the order of their times even if the system clock steps back.
//!
//! A key is held by a 96-bit keyed hash of its name (`id.rs`), and the state
//! of the common algorithms in a fixed 20-byte layout (`packed.rs`), in
//! tables of fixed-size entries (`shard.rs`): under a hundred bytes per key
//! whatever its name's length (docs/performance.md#footprint-and-growth).
//!
//! Memory is bounded twice: a slot is dropped once the engine says it can no
//! longer change a decision ([`Slot::expires_at`]), on access and by sweeps
//! (a shard's, once it has added a quarter of what it held; every shard's
//! by the service's timer; a full store's shard after 4 096 of its
//! decisions); and the number of keys is capped. At the cap, a request that needs a new
//! key is decided as for a fresh domain but not remembered (lenient:
//! docs/design.md#goals), and counted in [`MemoryStats::unrecorded`].
//!
//! ```rust
//! use charon::clock::ManualClock;
//! use charon::engine::{Item, SlotKind, WindowItem};
//! use charon::store::{Batch, MemoryStore};
//!
//! let store = MemoryStore::with_clock(ManualClock::new(0));
//! let decide = |now| {
//!     let mut batch = Batch::default();
//!     let slot = batch.slot("counter".into(), SlotKind::Window);
//!     batch.items.push(Item::Window(WindowItem { slot, limit: 1, period: 1_000, hits: 1, shadow: false, count_rejected: false }));
//!     store.decide_at(batch, now).granted
//! };
//! assert!(decide(10));
//! assert!(!decide(20));
//! assert!(decide(1_000)); // the next window
//! ```

#[cfg(feature = "embedded")]
pub(crate) mod config_log;
#[cfg(feature = "embedded")]
pub(crate) mod copies;
mod flat;
mod id;
#[cfg(feature = "embedded")]
pub(crate) mod learn;
#[cfg(feature = "embedded")]
pub(crate) mod leases;
mod lines;
mod packed;
mod shard;
mod table;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::clock::{Clock, SystemClock};
use crate::engine::{self, Decision, Slot};

pub use self::lines::mapped_bytes as mapped_table_bytes;

use self::id::{KeyHasher, KeyId};
use self::shard::{Kept, Shard, slice_of, staggered};
use super::{Batch, SlotKey, Store, StoreError};

/// Shards: enough that the cores rarely meet on one lock, few enough that
/// a store of 10^6 keys has tables of huge-page size
/// (docs/performance.md#huge-pages-for-large-tables).
const SHARDS: usize = 16;
/// The default cap on keys (under a hundred bytes each for the compact
/// kinds, docs/performance.md#footprint-and-growth).
pub const DEFAULT_MAX_KEYS: usize = 2_000_000;

/// The embedded, in-process store.
pub struct MemoryStore<C = SystemClock> {
    clock: C,
    ids: KeyHasher,
    /// Which shard each slice of the identities goes to.
    shard_of_slice: Box<[u16]>,
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
            ids: KeyHasher::random(),
            shard_of_slice: staggered(SHARDS),
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

    fn id_of(&self, key: &SlotKey) -> KeyId {
        self.ids.id(key.kind, &key.key)
    }

    fn shard_of(&self, id: KeyId) -> usize {
        usize::from(self.shard_of_slice[slice_of(id)])
    }

    /// `now`, never earlier than any time already used by this store.
    fn monotonic(&self, now: u64) -> u64 {
        now.max(self.high_water.fetch_max(now, Ordering::SeqCst))
    }

    /// Whether a new key may be kept.
    fn room(&self) -> bool {
        self.keys.load(Ordering::Relaxed) < self.max_keys
    }

    fn count(&self, kept: Kept) {
        match kept {
            Kept::Same => {}
            Kept::Added => {
                self.keys.fetch_add(1, Ordering::Relaxed);
            }
            Kept::Dropped => {
                self.keys.fetch_sub(1, Ordering::Relaxed);
            }
            Kept::Unrecorded => {
                self.unrecorded.fetch_add(1, Ordering::Relaxed);
            }
        }
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
        let ids: SmallVec<[KeyId; 4]> = batch.slots.iter().map(|key| self.id_of(key)).collect();
        let shard_of: SmallVec<[usize; 4]> = ids.iter().map(|&id| self.shard_of(id)).collect();
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
            .zip(&ids)
            .zip(&shard_of)
            .map(|((key, &id), &shard)| {
                let held = guards[position(shard)].take(id, key.kind);
                existed.push(held.is_some());
                held.filter(|slot| slot.expires_at() > now)
                    .unwrap_or_else(|| Slot::new(key.kind))
            })
            .collect();

        let decision = engine::decide(&batch.items, &mut slots, now);

        for (((slot, &id), shard), existed) in
            slots.into_iter().zip(&ids).zip(&shard_of).zip(existed)
        {
            let kept = guards[position(*shard)].keep(id, slot, existed, now, self.room());
            self.count(kept);
        }
        for guard in &mut guards {
            self.after_decision(guard, now);
        }
        decision
    }

    /// The common case (one key): decided in place.
    fn decide_one(&self, mut batch: Batch<'_>, now: impl FnOnce() -> u64) -> Decision {
        let Some(key) = batch.slots.pop() else {
            return engine::decide(&batch.items, &mut [], now());
        };
        let id = self.id_of(&key);
        let mut guard = self.lock(self.shard_of(id));
        let now = self.monotonic(now());
        let (decision, kept) = guard.decide(id, key.kind, now, self.room(), |slot| {
            engine::decide(&batch.items, std::slice::from_mut(slot), now)
        });
        self.count(kept);
        self.after_decision(&mut guard, now);
        decision
    }

    fn after_decision(&self, shard: &mut Shard, now: u64) {
        if shard.count_decision(self.room()) {
            self.sweep_shard(shard, now);
        }
    }

    fn sweep_shard(&self, shard: &mut Shard, now: u64) -> usize {
        let dropped = shard.sweep(now);
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
                let id = self.id_of(key);
                self.lock(self.shard_of(id))
                    .get(id, key.kind)
                    .filter(|slot| slot.expires_at() > now)
                    .unwrap_or_else(|| Slot::new(key.kind))
            })
            .collect();
        (slots, now)
    }

    /// Drops every slot that can no longer change a decision; returns how
    /// many were dropped.
    pub fn sweep(&self) -> usize {
        (0..SHARDS).map(|shard| self.sweep_one(shard)).sum()
    }

    /// How many shards [`sweep_one`](Self::sweep_one) takes.
    pub fn shards(&self) -> usize {
        SHARDS
    }

    /// Sweeps shard `shard` (of [`shards`](Self::shards); none past them):
    /// [`sweep`](Self::sweep) a shard at a time, for a caller that lets
    /// other work run between shards, since one shard of a large store
    /// takes most of a millisecond.
    pub fn sweep_one(&self, shard: usize) -> usize {
        if shard >= SHARDS {
            return 0;
        }
        let now = self.monotonic(self.clock.now_ms());
        let mut guard = self.lock(shard);
        self.sweep_shard(&mut guard, now)
    }

    /// How many keys hold state.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|shard| self.lock(shard).len()).sum()
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

    fn local_now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn decides_now(&self) -> bool {
        true
    }

    fn decide_now(&self, batch: Batch<'_>) -> Option<Decision> {
        Some(self.decide_with(batch, || self.clock.now_ms()))
    }
}
