//! Where capacity leases live (docs/design.md#capacity-leases): the state of
//! each leased capacity of each domain (every client's lease), in the
//! process for one sidecar, or in Redis so that every sidecar on it hands
//! out shares of one pool. The apportioning itself is the engine's
//! ([`crate::engine::capacity`]); a store reads the state and the time,
//! runs it, and keeps the result atomically.

mod memory;
mod redis;

use crate::engine::capacity::{self, CapacityConfig, CapacityError, Lease, Want};
use crate::store::{ResourceRef, keys};

pub use self::memory::MemoryLeases;
pub use self::redis::RedisLeases;

/// The kinds of lease state a server keeps, each a key space of its own:
/// a name in one can never meet the same name in another, so a user's
/// resource called `rlqs` or a domain called `global` shares nothing with
/// an RLQS bucket or a global limit's shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaseSpace {
    /// A `capacity:` resource of the configuration, asked for through
    /// `GetCapacity`.
    Capacity,
    /// The shares of a `global: true` descriptor limit among the servers of
    /// a hierarchy (docs/design.md#global-limits).
    GlobalLimit,
    /// The shares of an RLQS bucket among the Envoys that report it
    /// (docs/design.md#rlqs).
    RlqsBucket,
}

impl LeaseSpace {
    /// The letter a Redis key of this space is typed by. A capacity's is
    /// the one every lease had before there were spaces, so that its state
    /// on Redis survives an upgrade.
    fn letter(self) -> char {
        match self {
            LeaseSpace::Capacity => 'l',
            LeaseSpace::GlobalLimit => 'G',
            LeaseSpace::RlqsBucket => 'Q',
        }
    }
}

/// One lease state: its space and its (namespace, resource, domain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseKey<'a> {
    pub space: LeaseSpace,
    pub at: ResourceRef<'a>,
}

impl<'a> LeaseKey<'a> {
    pub fn capacity(at: ResourceRef<'a>) -> Self {
        Self {
            space: LeaseSpace::Capacity,
            at,
        }
    }

    /// The Redis key of this lease state (before the store's prefix).
    fn redis_key(&self) -> String {
        keys::lease_key(
            self.space.letter(),
            self.at.namespace,
            self.at.resource,
            self.at.domain,
        )
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseError {
    /// What the client sent (or the configuration) cannot be apportioned.
    #[error(transparent)]
    Invalid(#[from] CapacityError),
    #[error("the lease store is unavailable: {0}")]
    Unavailable(String),
}

/// What the live leases of one resource key want and hold, in all.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    pub wants: f64,
    pub held: f64,
    /// The clients with a live lease.
    pub clients: usize,
}

impl Usage {
    fn of(state: &capacity::LeaseState, now_ms: u64) -> Self {
        Self {
            wants: capacity::live_wants(state, now_ms),
            held: capacity::live_sum(state, now_ms),
            clients: state
                .clients
                .values()
                .filter(|lease| now_ms < lease.expiry_ms)
                .count(),
        }
    }
}

/// A client with a live lease: what it wants, and what it was granted.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveClient {
    pub id: String,
    pub wants: f64,
    pub has: f64,
}

/// The clients with a live lease of one state.
fn live_clients(state: &capacity::LeaseState, now_ms: u64) -> Vec<LiveClient> {
    state
        .clients
        .iter()
        .filter(|(_, lease)| now_ms < lease.expiry_ms)
        .map(|(id, lease)| LiveClient {
            id: id.clone(),
            wants: lease.wants,
            has: lease.has,
        })
        .collect()
}

pub enum LeaseStore {
    Memory(MemoryLeases),
    Redis(Box<RedisLeases>),
}

impl LeaseStore {
    /// Asks for (or renews) `client`'s lease ([`capacity::request_want`]).
    pub async fn get(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        want: Want,
    ) -> Result<Lease, LeaseError> {
        match self {
            LeaseStore::Memory(store) => store.get(at, config, client, want),
            LeaseStore::Redis(store) => store.get(at, config, client, want).await,
        }
    }

    /// What the live leases of `at` want and hold, in all: what a server
    /// asks its parent for (docs/design.md#a-hierarchy-of-servers).
    pub async fn usage(&self, at: LeaseKey<'_>) -> Result<Usage, LeaseError> {
        match self {
            LeaseStore::Memory(store) => Ok(store.usage(at)),
            LeaseStore::Redis(store) => store.usage(at).await,
        }
    }

    /// The clients other than `except` that a server nudges about `at`
    /// under `config`: past their share, or waiting for a free one
    /// ([`capacity::to_nudge`], docs/design.md#a-hierarchy-of-servers).
    pub async fn to_nudge(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) -> Result<Vec<String>, LeaseError> {
        match self {
            LeaseStore::Memory(store) => Ok(store.to_nudge(at, config, except)),
            LeaseStore::Redis(store) => store.to_nudge(at, config, except).await,
        }
    }

    /// The clients with a live lease of `at`: whom a server may decide
    /// again when a share moves (docs/design.md#rlqs).
    pub async fn clients(&self, at: LeaseKey<'_>) -> Result<Vec<LiveClient>, LeaseError> {
        match self {
            LeaseStore::Memory(store) => Ok(store.clients(at)),
            LeaseStore::Redis(store) => store.clients(at).await,
        }
    }

    /// Gives `client`'s lease back; whether it had one.
    pub async fn release(&self, at: LeaseKey<'_>, client: &str) -> Result<bool, LeaseError> {
        match self {
            LeaseStore::Memory(store) => Ok(store.release(at, client)),
            LeaseStore::Redis(store) => store.release(at, client).await,
        }
    }
}
