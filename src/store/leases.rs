//! Where capacity leases live (docs/design.md#capacity-leases): the state of
//! each leased capacity of each domain (every client's lease), in the
//! process for one sidecar, or in Redis so that every sidecar on it hands
//! out shares of one pool. The apportioning itself is the engine's
//! ([`crate::engine::capacity`]); a store reads the state and the time,
//! runs it, and keeps the result atomically.

use crate::engine::capacity::{self, CapacityConfig, CapacityError, Lease, Want};
use crate::store::ResourceRef;

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
    pub(crate) fn of(state: &capacity::LeaseState, now_ms: u64) -> Self {
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
pub(crate) fn live_clients(state: &capacity::LeaseState, now_ms: u64) -> Vec<LiveClient> {
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

/// Where capacity leases are kept: `MemoryLeases` (this process,
/// `store/memory/leases.rs`) or, with the `redis` feature, `RedisLeases`
/// (`store/redis/leases.rs`: every sidecar on one Redis
/// apportions one pool). A lease is asked for once per client per refresh
/// interval, so the service holds one as `Box<dyn LeaseLog>`.
#[async_trait::async_trait]
pub trait LeaseLog: Send + Sync {
    /// Asks for (or renews) `client`'s lease ([`capacity::request_want`]).
    async fn get(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        want: Want,
    ) -> Result<Lease, LeaseError>;

    /// What the live leases of `at` want and hold, in all: what a server
    /// asks its parent for (docs/design.md#a-hierarchy-of-servers).
    async fn usage(&self, at: LeaseKey<'_>) -> Result<Usage, LeaseError>;

    /// The clients other than `except` that a server nudges about `at`
    /// under `config`: past their share, or waiting for a free one
    /// ([`capacity::to_nudge`], docs/design.md#a-hierarchy-of-servers).
    async fn to_nudge(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) -> Result<Vec<String>, LeaseError>;

    /// The clients with a live lease of `at`: whom a server may decide
    /// again when a share moves (docs/design.md#rlqs).
    async fn clients(&self, at: LeaseKey<'_>) -> Result<Vec<LiveClient>, LeaseError>;

    /// Gives `client`'s lease back; whether it had one.
    async fn release(&self, at: LeaseKey<'_>, client: &str) -> Result<bool, LeaseError>;

    /// Drops what nobody renews, for a store whose keys do not expire by
    /// themselves; the number of resources dropped.
    fn sweep(&self) -> usize {
        0
    }
}
