//! Stores: where the access history lives, and the one atomic step that runs
//! the [`engine`](crate::engine) on it.
//!
//! A store receives a [`Batch`] (the state keys a request touches and the
//! engine items over them), reads the time from its own clock (the memory
//! store's injected clock; Redis `TIME` for Redis), runs
//! [`engine::decide`](crate::engine::decide) on the state of those keys with
//! nothing else interleaved, and keeps what the engine changed. Because the
//! decision itself is the engine's, every store decides alike.

#[cfg(feature = "embedded")]
pub mod config_log;
#[cfg(feature = "embedded")]
pub mod copies;
#[cfg(feature = "redis")]
mod failover;
pub mod keys;
#[cfg(feature = "embedded")]
pub mod learn;
#[cfg(feature = "embedded")]
pub mod leases;
mod memory;
mod on_error;
#[cfg(feature = "embedded")]
pub mod open;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;

use smallvec::SmallVec;

#[cfg(feature = "redis")]
pub use failover::{Failover, FailoverStats};
pub use memory::{DEFAULT_MAX_KEYS, MemoryStats, MemoryStore, mapped_table_bytes};
#[cfg(feature = "embedded")]
pub use memory::{
    config_log::MemoryLog, copies::MemoryCopies, learn::MemoryLearn, leases::MemoryLeases,
};
pub use on_error::OnStoreError;
#[cfg(feature = "redis")]
pub use redis::{RedisError, RedisOptions, RedisStore, StoreTls};
#[cfg(all(feature = "redis", feature = "embedded"))]
pub use redis::{
    config_log::RedisLog, copies::RedisCopies, learn::RedisLearn, leases::RedisLeases,
};

use crate::engine::{Decision, Item, SlotKind};

/// One (namespace, resource, domain): what a copy operation, a capacity
/// lease or a rate request is about, as the stores are asked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResourceRef<'a> {
    pub namespace: &'a str,
    pub resource: &'a str,
    pub domain: &'a str,
}

/// The keys a request touches and the items to decide over them.
#[derive(Debug, Default, Clone)]
pub struct Batch<'a> {
    pub slots: SmallVec<[SlotKey; 2]>,
    pub items: SmallVec<[Item<'a>; 2]>,
}

/// A state key and the kind of state it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotKey {
    pub key: String,
    pub kind: SlotKind,
}

impl Batch<'_> {
    /// The index of `key`'s slot, adding it if new: items naming one key share
    /// one slot, so the engine sees them both.
    pub fn slot(&mut self, key: String, kind: SlotKind) -> usize {
        if let Some(index) = self.slots.iter().position(|s| s.key == key) {
            return index;
        }
        self.slots.push(SlotKey { key, kind });
        self.slots.len() - 1
    }
}

/// A store failed to answer. A server error: the client may retry elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store did not answer within {0} ms")]
    Timeout(u64),
}

/// Somewhere to keep state and decide on it atomically.
pub trait Store: Send + Sync + 'static {
    /// Decides `batch` at the store's "now", atomically.
    fn decide(&self, batch: Batch<'_>)
    -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// A short name for logs and metrics (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// This process's time, not the store's: what a server counts its own
    /// demand by (a global limit's hits asked). A store in this process
    /// reads the clock it decides with, so a test's manual clock moves both;
    /// a store across the network leaves it to the machine's clock.
    fn local_now_ms(&self) -> u64 {
        use crate::clock::Clock;
        crate::clock::SystemClock.now_ms()
    }

    /// Whether [`decide_now`](Store::decide_now) decides (a store in this
    /// process does; one across the network cannot).
    fn decides_now(&self) -> bool {
        false
    }

    /// Decides `batch` within this call, when the store can (see
    /// [`decides_now`](Store::decides_now)); `None`: not decided, nothing
    /// recorded. Saves the future of [`decide`](Store::decide) where
    /// nothing waits.
    fn decide_now(&self, batch: Batch<'_>) -> Option<Decision> {
        let _ = batch;
        None
    }
}
