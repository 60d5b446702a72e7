//! The service: what the sidecar and the embedded client both run, one
//! [`Service`] that owns the running configuration (through the limiter),
//! the rate store, the copy log, the capacity leases and the observer, and
//! one [`Service::spawn_housekeeping`] for every sweeper. Its parts: what it
//! is asked and answers, as domain types with the checks a request fails by
//! itself ([`ops`]), and what it refuses ([`error`]); rate requests and the
//! lookup of a resource in the running configuration ([`core`]);
//! reservations on budgets of a cost known after the response ([`cost`]); a
//! session's hold set ([`session`]); the lease wing under one roof
//! ([`leases`]: capacity leases, global limits' shares and RLQS buckets,
//! taken from a parent ([`leases::parent`]) and pushed down as nudges
//! ([`leases::nudge`])); limits proposed from recorded use ([`learn`]);
//! and, for an engine on configuration files, the configuration API
//! ([`configuration`]). The faces in `server`
//! and the embedded client parse their wire into these calls (`api`).

pub mod configuration;
pub mod core;
pub mod cost;
pub mod error;
pub mod learn;
pub mod leases;
pub mod ops;
pub mod session;
pub mod waiting;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::{Config, Resource, Running};
use crate::limiter::{Limiter, Modes};
use crate::store::MemoryStore;
use crate::store::copies::CopyLog;
use crate::store::learn::LearnLog;

use self::configuration::Configuration;
use crate::store::open::{SidecarStore, Stores};

/// The one owner of what every face decides with.
pub struct Service {
    /// Rate decisions, and the handle of the running configuration: a
    /// reload or the configuration API swaps it here, whole.
    pub limiter: Arc<Limiter<SidecarStore>>,
    /// Copy holds and staged transfers.
    pub copies: Arc<dyn CopyLog>,
    /// Every kind of lease state, each with its one owner: capacity
    /// leases, global limits' shares, RLQS buckets, a parent's grants and
    /// the nudges pushed down ([`leases::LeaseStates`]).
    pub leases: leases::LeaseStates,
    /// Where operations are reported (the sidecar's metrics, or nowhere).
    pub observer: Arc<dyn Observer>,
    /// This server's time, for what it decides by its own clock rather
    /// than the store's: lease renewals, a parent's grants, recent
    /// operations. Whoever builds the service chooses it.
    pub clock: Arc<dyn Clock>,
    /// The configuration API: the files plus its objects, from its log.
    /// `None` for an engine built from a configuration value.
    pub configuration: Option<Arc<Configuration>>,
    /// Reserves waiting for copies.
    pub waiting: waiting::WaitQueues,
    /// Use recorded per domain for namespaces that learn
    /// ([`Service::proposal`]).
    pub learn: Arc<dyn LearnLog>,
}

impl Service {
    /// Over `stores` (see [`Stores::open`]), deciding with `config`, on
    /// `clock`.
    pub fn new(
        config: Config,
        stores: Stores,
        modes: Modes,
        observer: Arc<dyn Observer>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::on(Running::new(config), stores, modes, observer, clock)
    }

    /// Deciding with `running`, a configuration others may swap (a reload,
    /// the configuration API).
    pub fn on(
        running: Running,
        stores: Stores,
        modes: Modes,
        observer: Arc<dyn Observer>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            clock,
            limiter: Arc::new(
                Limiter::on(running, stores.rate)
                    .with_modes(modes)
                    .with_learner(learner(stores.learn.clone())),
            ),
            copies: stores.copies,
            leases: leases::LeaseStates::new(stores.leases),
            learn: stores.learn,
            observer,
            configuration: None,
            waiting: waiting::WaitQueues::default(),
        }
    }

    /// Deciding with what `configuration` loaded and swaps (files plus the
    /// configuration API's objects), with that API.
    pub fn on_configuration(
        configuration: Arc<Configuration>,
        stores: Stores,
        modes: Modes,
        observer: Arc<dyn Observer>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut service = Self::on(
            configuration.running().clone(),
            stores,
            modes,
            observer,
            clock,
        );
        service.configuration = Some(configuration);
        service
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        self.limiter.config()
    }

    /// Replaces the running configuration (a reload).
    pub fn replace_config(&self, config: Config) {
        self.limiter.replace_config(config);
    }

    /// The copy-limited resources of the running configuration.
    pub fn copy_resources(&self) -> Vec<(String, String)> {
        copy_resources(&self.config())
    }

    /// Starts every background task the service needs, until `shutdown`:
    /// sweeping the memory stores (rate state, expired transfers, leases
    /// nobody renews), renewing this server's shares of its global limits,
    /// and, on Redis, the copy log's heartbeat and reaper and the
    /// configuration log's sync. Call it once, inside a Tokio runtime, after
    /// [`leases::parent::ParentShares::set_linked`] if the server has a
    /// parent.
    pub fn spawn_housekeeping(self: &Arc<Self>, shutdown: watch::Receiver<bool>) {
        spawn_sweeper(self.clone(), shutdown.clone());
        tokio::spawn(self.clone().renew_global_shares_until(shutdown.clone()));
        if let Some(configuration) = &self.configuration
            && configuration.log().is_shared()
        {
            configuration.clone().spawn_sync(shutdown.clone());
        }
        let service = self.clone();
        self.copies
            .clone()
            .spawn_membership(Arc::new(move || service.copy_resources()), shutdown);
    }
}

/// Shadow-mode limits' use, recorded where the service records the rest.
fn learner(log: Arc<dyn LearnLog>) -> crate::limiter::Learner {
    Arc::new(move |namespace, subject, domain, hits, learn| {
        log.record(namespace, subject, domain, hits, learn);
    })
}

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

    /// A Charon API operation was answered, with its domain: for a view per
    /// domain and the decision log.
    fn operation(&self, event: &OperationEvent<'_>) {
        let _ = event;
    }

    /// A global limit's share on this server moved, from its parent's
    /// grant (or to its safe share, the parent away).
    fn global_share_moved(&self, namespace: &str, limit: &str, share: u64, on_safe_share: bool) {
        let _ = (namespace, limit, share, on_safe_share);
    }
}

/// One decision of a face, as [`Observer::operation`] is told a Charon
/// API operation and the decision log records every face's.
#[derive(Debug, Clone, Copy)]
pub struct OperationEvent<'a> {
    /// `request`, `reserve`, `release`, `transfer`, `seize`, `cost`;
    /// `assign` (RLQS), `share` (a global limit).
    pub operation: &'static str,
    pub namespace: &'a str,
    /// The resource, RLQS bucket or global limit.
    pub resource: &'a str,
    /// The domain; the Envoy's stream for RLQS; empty when there is none
    /// (a cost call, a refused seize, a share).
    pub domain: &'a str,
    /// `ok`, `rejected` (nothing granted), `done` (a reserve for anyone's
    /// result), or the error kind; `assigned`, `deny_all`, `allow_all`;
    /// `moved`, `safe_share`.
    pub outcome: &'static str,
    /// Hits or copies granted or given back; a cost call's amount; an RLQS
    /// bucket's rate a second; a share's new size.
    pub amount: u64,
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

/// The copy-limited resources of `config`.
fn copy_resources(config: &Config) -> Vec<(String, String)> {
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

/// Sweeps `store` a shard at a time, letting the runtime's other tasks run
/// between shards: a whole store of 10^6 keys takes about 11 ms, which
/// would hold one of the few worker threads from the requests queued on
/// it (docs/performance.md#huge-pages-for-large-tables).
async fn sweep_yielding<C: Clock>(store: &MemoryStore<C>) -> usize {
    let mut dropped = 0;
    for shard in 0..store.shards() {
        dropped += store.sweep_one(shard);
        tokio::task::yield_now().await;
    }
    dropped
}

fn spawn_sweeper(service: Arc<Service>, mut shutdown: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
        let mut transfer_ticks = tokio::time::interval(TRANSFER_EXPIRY_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticks.tick() => {
                    let dropped = sweep_yielding(service.limiter.store().memory()).await;
                    tracing::trace!(dropped, "swept the memory store");
                    let dropped = service.leases.store.sweep();
                    tracing::trace!(dropped, "swept the capacity leases");
                }
                _ = transfer_ticks.tick() => {
                    let expired = service.copies.expire_transfers();
                    tracing::trace!(expired, "released expired transfers");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use crate::clock::ManualClock;
    use crate::engine::{Item, SlotKind, WindowItem};
    use crate::store::{Batch, MemoryStore};

    use super::sweep_yielding;

    #[tokio::test(flavor = "current_thread")]
    async fn the_timer_sweep_lets_other_tasks_run_between_shards() {
        let store = MemoryStore::with_clock(ManualClock::new(0));
        for tenant in 0..1_000 {
            let mut batch = Batch::default();
            let slot = batch.slot(format!("t{tenant}"), SlotKind::Window);
            batch.items.push(Item::Window(WindowItem {
                slot,
                limit: 5,
                period: 1_000,
                hits: 1,
                shadow: false,
                count_rejected: false,
            }));
            store.decide_at(batch, 10);
        }
        store.clock().set(5_000);
        // One thread: the other task runs only when the sweep yields.
        let (ran, done) = (Cell::new(0), Cell::new(false));
        let sweep = async {
            let dropped = sweep_yielding(&store).await;
            done.set(true);
            dropped
        };
        let other = async {
            while !done.get() {
                ran.set(ran.get() + 1);
                tokio::task::yield_now().await;
            }
        };
        let (dropped, ()) = tokio::join!(sweep, other);
        assert_eq!(dropped, 1_000);
        assert_eq!(store.stats().keys, 0);
        assert!(ran.get() >= store.shards() / 2, "ran {} times", ran.get());
    }
}
