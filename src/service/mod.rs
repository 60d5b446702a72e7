//! The service: what the sidecar and the embedded client both run. It owns
//! the Charon API's decisions ([`core`]), a session's life and its hold set
//! ([`session`]), the store behind the limiter and the copy log ([`store`]),
//! and housekeeping (the memory store's sweeper, expired transfers). The
//! gRPC faces in `server` translate the wire into these calls; the embedded
//! client calls them in process.

#[cfg(feature = "server")]
pub mod configuration;
pub mod core;
#[cfg(feature = "server")]
pub mod leases;
pub mod session;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Resource;
use crate::limiter::Limiter;
use crate::store::copies::CopyStore;

use self::store::SidecarStore;

/// What the service reports as it works. The sidecar's Prometheus metrics
/// implement it; the embedded client reports to [`Unobserved`], so an
/// in-process engine builds no registry nobody reads.
pub trait Observer: Send + Sync {
    /// A copy operation was answered: its name and its result's label.
    fn copy_operation(&self, operation: &'static str, result: &'static str) {
        let _ = (operation, result);
    }

    /// A rate request on a configured resource was decided.
    fn rate_request(&self, namespace: &str, resource: &str, hits: u64, outcome: RateOutcome) {
        let _ = (namespace, resource, hits, outcome);
    }

    /// A rate request named a resource its namespace does not configure
    /// but allows (`allow_unconfigured`): granted, and recorded so that a
    /// limit can be learned from it.
    fn unconfigured_request(&self, namespace: &str, resource: &str, hits: u64) {
        let _ = (namespace, resource, hits);
    }
}

/// How a rate request on a burst-tier resource ended, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateOutcome {
    /// Over its limits (and rejected, unless `shadow`).
    pub over: bool,
    /// Over, but granted: `ignore_configured`.
    pub shadow: bool,
    /// Granted past 80% of the current tier's limit.
    pub near: bool,
    /// The tier it was decided in (one-indexed; 0 when none is active).
    pub tier: usize,
    /// What rejected it: `tier`, `hard` or `global`; `none` when granted.
    pub limited_by: &'static str,
}

/// Reports nowhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl Observer for Unobserved {}

/// How often the memory copy log releases expired transfers (a seize checks
/// the expiry itself; this frees the copies).
const TRANSFER_EXPIRY_INTERVAL: Duration = Duration::from_secs(1);

/// How often the memory store drops state that can no longer matter.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The copy-limited resources of the running configuration.
pub fn copy_resources(limiter: &Limiter<SidecarStore>) -> Vec<(String, String)> {
    let config = limiter.config();
    config
        .namespaces()
        .flat_map(|namespace| {
            namespace
                .resources
                .iter()
                .filter(|(_, resource)| matches!(resource, Resource::Copies(_)))
                .map(|(name, _)| (namespace.name.clone(), name.clone()))
        })
        .collect()
}

pub fn spawn_sweeper(
    limiter: Arc<Limiter<SidecarStore>>,
    copies: Arc<CopyStore>,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
        let mut transfer_ticks = tokio::time::interval(TRANSFER_EXPIRY_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticks.tick() => {
                    let dropped = limiter.store().memory().sweep();
                    tracing::trace!(dropped, "swept the memory store");
                }
                _ = transfer_ticks.tick() => {
                    if let CopyStore::Memory(memory) = &*copies {
                        let expired = memory.expire();
                        tracing::trace!(expired, "released expired transfers");
                    }
                }
            }
        }
    });
}
