//! Capacity leases in this process: one sidecar's, or an embedded engine's.
//! The engine runs under one lock at the clock's `now`; [`MemoryLeases::sweep`]
//! drops what nobody renews.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::clock::{Clock, SystemClock};
use crate::engine::capacity::{self, CapacityConfig, Lease, LeaseState, Want};

use crate::store::leases::{LeaseError, LeaseKey, LeaseLog, LeaseSpace, LiveClient, Usage};

/// A lease state's space, namespace, resource and domain.
type StateKey = (LeaseSpace, String, String, String);

/// Leases in this process. Its learning period starts with the process: a
/// restarted sidecar gives clients back what they say they have.
pub struct MemoryLeases {
    clock: Arc<dyn Clock>,
    started_ms: u64,
    states: Mutex<HashMap<StateKey, LeaseState>>,
}

impl MemoryLeases {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let started_ms = clock.now_ms();
        Self {
            clock,
            started_ms,
            states: Mutex::new(HashMap::new()),
        }
    }

    fn key(key: LeaseKey<'_>) -> StateKey {
        (
            key.space,
            key.at.namespace.to_owned(),
            key.at.resource.to_owned(),
            key.at.domain.to_owned(),
        )
    }

    pub(super) fn get(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        want: Want,
    ) -> Result<Lease, LeaseError> {
        let now = self.clock.now_ms();
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let state = states
            .entry(Self::key(at))
            .or_insert_with(|| LeaseState::new(self.started_ms));
        Ok(capacity::request_want(config, state, client, want, now)?)
    }

    /// `read` of the state of `at` and the time, if there is one.
    fn read<T>(&self, at: LeaseKey<'_>, read: impl FnOnce(&LeaseState, u64) -> T) -> Option<T> {
        let now = self.clock.now_ms();
        let states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        states.get(&Self::key(at)).map(|state| read(state, now))
    }

    /// The clients other than `except` to nudge about `at` under `config`
    /// ([`capacity::to_nudge`]).
    pub(super) fn to_nudge(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) -> Vec<String> {
        self.read(at, |state, now| {
            capacity::to_nudge(config, state, except, now)
                .into_iter()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
    }

    /// The clients with a live lease of `at`.
    pub(super) fn clients(&self, at: LeaseKey<'_>) -> Vec<LiveClient> {
        self.read(at, crate::store::leases::live_clients)
            .unwrap_or_default()
    }

    /// What the live leases of `at` want and hold, in all.
    pub(super) fn usage(&self, at: LeaseKey<'_>) -> Usage {
        self.read(at, Usage::of).unwrap_or_default()
    }

    /// Drops the expired leases of every resource, and the resources no
    /// client holds any more: what nobody renews does not stay in memory.
    /// The number of resources dropped.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = states.len();
        states.retain(|_, state| {
            capacity::expire(state, now);
            !state.clients.is_empty()
        });
        before - states.len()
    }

    /// Resources with at least one live or not yet swept lease.
    pub fn len(&self) -> usize {
        self.states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn release(&self, at: LeaseKey<'_>, client: &str) -> bool {
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = Self::key(at);
        let Some(state) = states.get_mut(&key) else {
            return false;
        };
        let released = capacity::release(state, client);
        if state.clients.is_empty() {
            states.remove(&key);
        }
        released
    }
}

impl Default for MemoryLeases {
    fn default() -> Self {
        Self::new()
    }
}

/// This process's leases: decided under one lock, at once.
#[async_trait::async_trait]
impl LeaseLog for MemoryLeases {
    async fn get(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        want: Want,
    ) -> Result<Lease, LeaseError> {
        MemoryLeases::get(self, at, config, client, want)
    }

    async fn usage(&self, at: LeaseKey<'_>) -> Result<Usage, LeaseError> {
        Ok(MemoryLeases::usage(self, at))
    }

    async fn to_nudge(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) -> Result<Vec<String>, LeaseError> {
        Ok(MemoryLeases::to_nudge(self, at, config, except))
    }

    async fn clients(&self, at: LeaseKey<'_>) -> Result<Vec<LiveClient>, LeaseError> {
        Ok(MemoryLeases::clients(self, at))
    }

    async fn release(&self, at: LeaseKey<'_>, client: &str) -> Result<bool, LeaseError> {
        Ok(MemoryLeases::release(self, at, client))
    }

    fn sweep(&self) -> usize {
        MemoryLeases::sweep(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::engine::capacity::Algorithm;

    #[test]
    fn a_sweep_drops_what_nobody_renews() {
        let clock = ManualClock::new(1_000);
        let leases = MemoryLeases::with_clock(Arc::new(clock.clone()));
        let config = CapacityConfig {
            capacity: 10.0,
            algorithm: Algorithm::FairShare,
            lease_ms: 5_000,
            refresh_interval_ms: 1_000,
            safe_capacity: None,
            learning_ms: 0,
            whole_units: false,
            lends_spare: false,
        };
        let want = |wants| Want {
            wants,
            ..Want::default()
        };
        let at = |domain| {
            LeaseKey::capacity(crate::store::ResourceRef {
                namespace: "jobs",
                resource: "backend",
                domain,
            })
        };
        leases.get(at("a"), &config, "one", want(4.0)).unwrap();
        clock.set(4_000);
        leases.get(at("b"), &config, "two", want(4.0)).unwrap();
        assert_eq!((leases.sweep(), leases.len()), (0, 2));
        // a's lease ends at 6 000, b's at 9 000.
        clock.set(6_000);
        assert_eq!((leases.sweep(), leases.len()), (1, 1));
        clock.set(9_000);
        assert_eq!((leases.sweep(), leases.len()), (1, 0));
        assert!(leases.is_empty());
    }
}
