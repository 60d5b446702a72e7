//! Global limits (docs/design.md#global-limits): a descriptor limit marked
//! `global: true` is one limit shared by every server of a hierarchy, each
//! deciding its own requests locally against its current share. This module
//! owns what the configuration carries for one: the limit as written, and
//! the [`GlobalShare`] the decisions read and a background task sets.
//!
//! A share is a lease of the limit's `requests_per_unit`, apportioned like a
//! capacity (`crate::engine::capacity`) among the servers that want it:
//! the root has the configured limit, every other server asks its parent
//! (`--parent`) for what it and its own children want.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::FixedLimit;

/// What a global limit's leases are named by, in `GetCapacity`: this
/// prefix and the descriptor's path as written (`key_value.key`).
pub const RESOURCE_PREFIX: &str = "rate_limit:";

/// How often a server renews its share, and its parent's lease of the
/// limit; a share is a lease of `LEASE_MS`.
pub const REFRESH_MS: u64 = 500;
pub const LEASE_MS: u64 = 10_000;

/// One server's share of a global limit, and the hits it counted.
#[derive(Debug)]
pub struct GlobalShare {
    /// What this server may admit per window now.
    requests_per_unit: AtomicU64,
    /// Hits asked for since the last renewal, admitted or not: the demand.
    hits: AtomicU64,
}

impl GlobalShare {
    /// Until its first renewal a server admits up to the configured limit,
    /// as it would without `global` (docs/design.md#global-limits).
    pub fn new(configured: u64) -> Self {
        Self {
            requests_per_unit: AtomicU64::new(configured),
            hits: AtomicU64::new(0),
        }
    }

    pub fn requests_per_unit(&self) -> u64 {
        self.requests_per_unit.load(Ordering::Relaxed)
    }

    pub fn set_requests_per_unit(&self, requests: u64) {
        self.requests_per_unit.store(requests, Ordering::Relaxed);
    }

    /// Counts `hits` asked for (admitted or not).
    pub fn count(&self, hits: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
    }

    /// The hits counted since the last call.
    pub fn take_hits(&self) -> u64 {
        self.hits.swap(0, Ordering::Relaxed)
    }
}

/// A global limit of a namespace: the limit as configured (its
/// `requests_per_unit` is the whole, shared by every server) and this
/// server's share.
#[derive(Debug, Clone)]
pub struct GlobalLimit {
    pub limit: FixedLimit,
    pub share: Arc<GlobalShare>,
}

/// This process's id among the servers that share a store: a global
/// limit's counter is each server's own (its share is), so its key carries
/// it, and so does the server's own lease of the share.
pub fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let mut bytes = [0u8; 8];
        // Without randomness, the process id still tells apart the
        // servers of one host.
        if getrandom::fill(&mut bytes).is_err() {
            bytes = u64::from(std::process::id()).to_le_bytes();
        }
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    })
}
