//! A hierarchy of servers (docs/design.md#a-hierarchy-of-servers): a
//! capacity resource marked `from_parent` takes its capacity as a lease
//! from a parent Charon (`--parent`), asking for what its own clients want
//! in all, and apportions what it is granted among them with the
//! resource's algorithm. The parent may have a parent of its own: leaf,
//! region, root.
//!
//! - The link (`server::parent`) is a background task, never on a
//!   request's path: each round
//!   asks the parent for every (namespace, resource, domain) its clients
//!   have asked about, one call, as the level's one client (`--level-id`,
//!   shared by the replicas of a level, so that the parent sees a level
//!   once), then waits the parent's refresh interval.
//! - Nested expiry: a lease given here never outlives the parent's lease
//!   it is a share of.
//! - The parent away: the current grant stands until it expires; then the
//!   resource's safe capacity (-1: the configured capacity; unset: none).
//! - A restart: a first round asks with what the level has (nothing), and
//!   the parent, in its learning period, gives back what the level says it
//!   has; leases given here meanwhile come from the safe capacity.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, watch};

use crate::engine::capacity::{self, CapacityConfig, Grant, Lease};
use crate::store::ResourceRef;
use crate::store::leases::LeaseKey;

use super::Leased;

use crate::service::Service;

/// (namespace, resource, domain).
type Key = (String, String, String);

/// The level's leases from its parent, and what it must ask for.
#[derive(Default)]
pub struct ParentShares {
    /// Whether this server has a parent (`--parent`).
    linked: AtomicBool,
    grants: Mutex<HashMap<Key, Grant>>,
    /// The longest refresh interval the parent answered, by key.
    usual_refresh_ms: Mutex<HashMap<Key, u64>>,
    asked: Mutex<HashSet<Key>>,
    /// A key asked about for the first time, or a lease below moving: the
    /// link asks at once.
    ask_now: Notify,
    /// The rounds the link has ended (answered or not).
    rounds: watch::Sender<u64>,
}

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each change leaves the maps whole.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ParentShares {
    /// This server follows a parent from now on.
    pub fn set_linked(&self) {
        self.linked.store(true, Ordering::Relaxed);
    }

    pub fn is_linked(&self) -> bool {
        self.linked.load(Ordering::Relaxed)
    }

    /// Watches the rounds the link ends: `changed()` after the next one.
    pub fn rounds(&self) -> watch::Receiver<u64> {
        self.rounds.subscribe()
    }

    /// The configuration a lease of `at` is decided with: the parent's
    /// grant as the capacity (at most the configured one), and leases
    /// that end with it; once it expired, the safe capacity.
    pub fn effective(
        &self,
        at: ResourceRef<'_>,
        config: CapacityConfig,
        now_ms: u64,
    ) -> CapacityConfig {
        let key = key_of(at);
        if lock(&self.asked).insert(key.clone()) {
            self.ask_now.notify_one();
        }
        let grant = lock(&self.grants).get(&key).copied();
        capacity::under_grant(&config, grant, now_ms)
    }
}

impl ParentShares {
    /// The parent's last grant for `at`, live or expired; `None` if it
    /// never answered for it.
    pub fn grant(&self, at: ResourceRef<'_>) -> Option<Grant> {
        lock(&self.grants).get(&key_of(at)).copied()
    }
}

/// The key of `at` in the maps above.
fn key_of(at: ResourceRef<'_>) -> Key {
    (
        at.namespace.to_owned(),
        at.resource.to_owned(),
        at.domain.to_owned(),
    )
}

/// What the parent granted for one [`ParentWant`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParentGrant {
    pub capacity: f64,
    pub expiry_ms: u64,
    /// When to ask again.
    pub refresh_interval_ms: u64,
    /// What to use once the grant expired while the parent is away.
    pub safe_capacity: f64,
}

/// What a level asks its parent for one (namespace, resource, domain).
#[derive(Debug, Clone, PartialEq)]
pub struct ParentWant {
    pub namespace: String,
    pub resource: String,
    pub domain: String,
    /// What the level's clients' live leases want, in all.
    pub wants: f64,
    /// What the parent's live grant is (0 if none).
    pub has: f64,
    /// What the level's clients' live leases hold, in all: more than `has`
    /// while they have not yet given back what a shrunk grant took away.
    pub held_below: f64,
}

impl Service {
    /// What to ask the parent for in a round: every key this level's
    /// clients asked about that is still leased from the parent.
    pub async fn parent_wants(&self) -> Vec<ParentWant> {
        let config = self.config();
        let keys: Vec<Key> = lock(&self.leases.parent.asked)
            .iter()
            .filter(|(namespace, resource, domain)| {
                let at = ResourceRef {
                    namespace,
                    resource,
                    domain,
                };
                self.capacity_of(&config, at)
                    .is_ok_and(|leased| leased.from_parent)
            })
            .cloned()
            .collect();
        let now = self.clock.now_ms();
        let mut wants = Vec::with_capacity(keys.len());
        for (namespace, resource, domain) in keys {
            let at = ResourceRef {
                namespace: &namespace,
                resource: &resource,
                domain: &domain,
            };
            // A store that cannot say asks for nothing this round.
            let usage = self
                .leases
                .store
                .usage(super::wire_key(at))
                .await
                .unwrap_or_default();
            let has = lock(&self.leases.parent.grants)
                .get(&(namespace.clone(), resource.clone(), domain.clone()))
                .filter(|grant| now < grant.expiry_ms)
                .map_or(0.0, |grant| grant.capacity);
            wants.push(ParentWant {
                namespace,
                resource,
                domain,
                wants: usage.wants,
                has,
                held_below: usage.held,
            });
        }
        wants
    }

    /// A round of the link ended: `granted` holds the parent's grant for
    /// each want it answered (nothing when the parent did not answer, or
    /// there was nothing to ask). Records the grants, nudges the level's
    /// clients under each grant that changed (those that now hold more
    /// than their share give it back at once, those waiting for a share
    /// now free take it), and wakes what waits for the round (the global
    /// renewals).
    pub async fn parent_round(&self, granted: &[(ParentWant, ParentGrant)]) {
        let mut moved = Vec::new();
        for (want, grant) in granted {
            if self.record_grant(want, *grant) {
                moved.push(want);
            }
        }
        for want in moved {
            self.parent_moved(want).await;
        }
        self.leases.parent.rounds.send_modify(|rounds| *rounds += 1);
    }

    /// Records `grant` for `want`'s key. The grant is moving when its
    /// refresh interval is sooner than the longest the parent answered for
    /// the key: its usual one. Whether the grant changed.
    fn record_grant(&self, want: &ParentWant, grant: ParentGrant) -> bool {
        let ParentGrant {
            capacity,
            expiry_ms,
            refresh_interval_ms,
            safe_capacity,
        } = grant;
        let key = (
            want.namespace.clone(),
            want.resource.clone(),
            want.domain.clone(),
        );
        let usual = {
            let mut usual = lock(&self.leases.parent.usual_refresh_ms);
            let usual = usual.entry(key.clone()).or_default();
            *usual = (*usual).max(refresh_interval_ms);
            *usual
        };
        let previous = lock(&self.leases.parent.grants).insert(
            key,
            Grant {
                capacity,
                expiry_ms,
                refresh_interval_ms,
                moving: refresh_interval_ms < usual,
                safe_capacity,
            },
        );
        previous.is_none_or(|previous| capacity != previous.capacity)
    }

    /// The parent changed `want`'s grant: nudges the level's clients it
    /// affects.
    async fn parent_moved(&self, want: &ParentWant) {
        let config = self.config();
        let at = ResourceRef {
            namespace: &want.namespace,
            resource: &want.resource,
            domain: &want.domain,
        };
        if let Ok(Leased {
            key,
            config,
            from_parent: true,
        }) = self.capacity_of(&config, at)
        {
            let effective = self
                .leases
                .parent
                .effective(key.at, config, self.clock.now_ms());
            self.nudge_others(key, &effective, "").await;
        }
    }

    /// The parent nudged this level (`WatchCapacity`): one of its grants
    /// must shrink, so the link asks at once.
    pub fn parent_nudged(&self) {
        self.leases.parent.ask_now.notify_one();
    }

    /// Until the link should ask at once: a key was asked about for the
    /// first time, or a lease given from a parent's grant is moving.
    pub async fn parent_ask_now(&self) {
        self.leases.parent.ask_now.notified().await;
    }

    /// `client`'s `lease` of `key` was answered under `config`. If it moved
    /// (answered sooner than `config`'s interval: what its client wants or
    /// holds changed), a lease given `from_parent`'s grant makes the link
    /// carry the change up at once rather than at its next round, and the
    /// other clients it affects are nudged
    /// (docs/design.md#a-hierarchy-of-servers).
    pub(super) async fn lease_answered(
        &self,
        key: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        lease: &Lease,
        from_parent: bool,
    ) {
        if lease.refresh_interval_ms >= config.refresh_interval_ms {
            return;
        }
        if from_parent {
            self.leases.parent.ask_now.notify_one();
        }
        self.nudge_others(key, config, client).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::capacity::Algorithm;

    fn config(safe: Option<f64>) -> CapacityConfig {
        CapacityConfig {
            capacity: 100.0,
            algorithm: Algorithm::FairShare,
            lease_ms: 10_000,
            refresh_interval_ms: 2_000,
            safe_capacity: safe,
            learning_ms: 0,
            whole_units: false,
            lends_spare: false,
        }
    }

    const AT: ResourceRef<'static> = ResourceRef {
        namespace: "ns",
        resource: "backend",
        domain: "acme",
    };

    #[test]
    fn the_grant_is_the_capacity_and_leases_end_with_it() {
        let shares = ParentShares::default();
        // Nothing granted yet: the safe capacity, or nothing.
        let now = 1_000_000;
        assert_eq!(shares.effective(AT, config(Some(10.0)), now).capacity, 10.0);
        assert_eq!(shares.effective(AT, config(None), now).capacity, 0.0);
        assert_eq!(
            shares.effective(AT, config(Some(-1.0)), now).capacity,
            100.0
        );
        lock(&shares.grants).insert(
            ("ns".into(), "backend".into(), "acme".into()),
            Grant {
                capacity: 40.0,
                expiry_ms: now + 3_000,
                refresh_interval_ms: 2_000,
                moving: false,
                safe_capacity: 30.0,
            },
        );
        let effective = shares.effective(AT, config(None), now);
        assert_eq!(effective.capacity, 40.0);
        assert_eq!(effective.lease_ms, 3_000);
        assert!(effective.refresh_interval_ms <= effective.lease_ms);
        // Asked about: the link asks for it.
        assert!(lock(&shares.asked).contains(&("ns".into(), "backend".into(), "acme".into())));
    }
}
