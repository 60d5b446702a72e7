//! This server's shares of its global limits (docs/design.md#global-limits):
//! runtime state beside the configuration, not in it. The decisions read a
//! share and count the hits asked of it; the service's renewals set it. A
//! share is found by its namespace and the limit's name, so a reload is a
//! plain swap of the configuration: a limit that stays (the same limit at
//! the same place) keeps its share, a changed or new one starts at its
//! configured limit.
//!
//! The instance id is this server's among the servers that share a store:
//! a global limit's counter is each server's own (its share is), so its
//! key carries the id, and so does the server's own lease of the share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::config::{Config, FixedLimit};

/// One server's share of a global limit, and the hits it counted.
#[derive(Debug)]
pub struct GlobalShare {
    /// The limit it is a share of, as configured when it was made.
    configured: FixedLimit,
    /// This server's instance id (see [`GlobalShares::instance_id`]).
    instance_id: Arc<str>,
    /// What this server may admit per window now.
    requests_per_unit: AtomicU64,
    /// How much of that is spare capacity lent beyond what it asked for
    /// (docs/design.md#global-limits, "Spare capacity lent").
    lent: AtomicU64,
    /// Whether the share is the safe share: the parent away, its last
    /// grant expired (docs/design.md#global-limits, "The parent away").
    on_safe_share: AtomicBool,
    /// Hits asked for since the last renewal, admitted or not: the demand.
    hits: AtomicU64,
    /// Hits asked for in the limit's current window: a bound on what it
    /// admitted there.
    asked: Mutex<AskedInWindow>,
}

/// How far the store's clock (Redis's) may be ahead of this server's: the
/// hits of the previous window's last `CLOCK_SKEW_MS` may count in the
/// store's current window.
pub const CLOCK_SKEW_MS: u64 = 100;

/// The hits asked for in one window, by this server's clock.
#[derive(Debug, Default)]
struct AskedInWindow {
    /// The window's start (ms since the epoch) and length.
    start_ms: u64,
    period_ms: u64,
    /// All its hits, and those of its last `CLOCK_SKEW_MS`.
    hits: u64,
    late: u64,
    /// The previous window's late hits, if it came just before.
    late_before: u64,
}

impl AskedInWindow {
    /// Moves to the window of `now_ms`, if it is a new one.
    fn at(&mut self, now_ms: u64, period_ms: u64) {
        let period_ms = period_ms.max(1);
        let start_ms = now_ms - now_ms % period_ms;
        if start_ms == self.start_ms && period_ms == self.period_ms {
            return;
        }
        let follows =
            self.period_ms == period_ms && self.start_ms.saturating_add(period_ms) == start_ms;
        *self = Self {
            start_ms,
            period_ms,
            late_before: if follows { self.late } else { 0 },
            ..Self::default()
        };
    }
}

impl GlobalShare {
    /// Until its first renewal a server admits up to the configured limit,
    /// as it would without `global` (docs/design.md#global-limits).
    fn new(configured: &FixedLimit, instance_id: Arc<str>) -> Self {
        Self {
            configured: configured.clone(),
            instance_id,
            requests_per_unit: AtomicU64::new(configured.requests_per_unit),
            lent: AtomicU64::new(0),
            on_safe_share: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            asked: Mutex::default(),
        }
    }

    pub fn requests_per_unit(&self) -> u64 {
        self.requests_per_unit.load(Ordering::Relaxed)
    }

    pub fn set_requests_per_unit(&self, requests: u64) {
        self.requests_per_unit.store(requests, Ordering::Relaxed);
    }

    /// How much of the share is lent spare capacity.
    pub fn lent(&self) -> u64 {
        self.lent.load(Ordering::Relaxed)
    }

    /// Whether the share is the safe share (the parent away).
    pub fn on_safe_share(&self) -> bool {
        self.on_safe_share.load(Ordering::Relaxed)
    }

    /// Says how the share now in force came about.
    pub fn set_provenance(&self, lent: u64, on_safe_share: bool) {
        self.lent.store(lent, Ordering::Relaxed);
        self.on_safe_share.store(on_safe_share, Ordering::Relaxed);
    }

    /// Counts `hits` asked for (admitted or not) at `now_ms`, of a limit
    /// whose windows are `period_ms` long.
    pub fn count(&self, hits: u64, now_ms: u64, period_ms: u64) {
        self.hits.fetch_add(hits, Ordering::Relaxed);
        let mut asked = lock(&self.asked);
        asked.at(now_ms, period_ms);
        asked.hits = asked.hits.saturating_add(hits);
        if now_ms % period_ms.max(1) >= period_ms.saturating_sub(CLOCK_SKEW_MS) {
            asked.late = asked.late.saturating_add(hits);
        }
    }

    /// At most what this server admitted in the store's window of `now_ms`
    /// (fixed windows of `period_ms`): the hits asked for in it, plus those
    /// of the previous window's last `CLOCK_SKEW_MS`, for a store whose
    /// clock is ahead of this server's.
    pub fn asked_in_window(&self, now_ms: u64, period_ms: u64) -> u64 {
        let mut asked = lock(&self.asked);
        asked.at(now_ms, period_ms);
        asked.hits.saturating_add(asked.late_before)
    }

    /// This server's id among the servers that share a store.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The hits counted since the last call.
    pub fn take_hits(&self) -> u64 {
        self.hits.swap(0, Ordering::Relaxed)
    }
}

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change leaves the counts whole.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Every global share of this server, by namespace and limit name.
#[derive(Debug)]
pub struct GlobalShares {
    instance_id: Arc<str>,
    shares: RwLock<HashMap<String, HashMap<String, Arc<GlobalShare>>>>,
}

impl Default for GlobalShares {
    fn default() -> Self {
        Self::new()
    }
}

impl GlobalShares {
    /// None yet, under a new random instance id.
    pub fn new() -> Self {
        let mut bytes = [0u8; 8];
        // Without randomness, the process id still tells apart the
        // servers of one host.
        if getrandom::fill(&mut bytes).is_err() {
            bytes = u64::from(std::process::id()).to_le_bytes();
        }
        let id: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        Self {
            instance_id: Arc::from(id),
            shares: RwLock::default(),
        }
    }

    /// This server's id among the servers that share a store.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The share of `namespace`'s global limit `name`, configured as
    /// `limit`: made at the configured limit the first time it is asked
    /// for, and again when the limit at that place changed.
    pub fn share(&self, namespace: &str, name: &str, limit: &FixedLimit) -> Arc<GlobalShare> {
        {
            let shares = self.shares.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(share) = shares
                .get(namespace)
                .and_then(|limits| limits.get(name))
                .filter(|share| share.configured == *limit)
            {
                return share.clone();
            }
        }
        let mut shares = self.shares.write().unwrap_or_else(PoisonError::into_inner);
        let limits = shares.entry(namespace.to_owned()).or_default();
        match limits.get(name) {
            Some(share) if share.configured == *limit => share.clone(),
            _ => {
                let share = Arc::new(GlobalShare::new(limit, self.instance_id.clone()));
                limits.insert(name.to_owned(), share.clone());
                share
            }
        }
    }

    /// Forgets the shares of limits `config` no longer has.
    pub fn retain(&self, config: &Config) {
        let mut shares = self.shares.write().unwrap_or_else(PoisonError::into_inner);
        shares.retain(|namespace, limits| {
            let Some(configured) = config.namespace(namespace) else {
                return false;
            };
            limits.retain(|name, share| {
                configured
                    .globals
                    .get(name)
                    .is_some_and(|global| global.limit == share.configured)
            });
            !limits.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Unit;

    fn limit(requests_per_unit: u64) -> FixedLimit {
        crate::config::load_str(
            &format!(
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {{unit: second, requests_per_unit: {requests_per_unit}, global: true}}\n"
            ),
            "d.yaml",
        )
        .ok()
        .and_then(|loaded| loaded.config.namespace("d").and_then(|n| n.globals.values().next().cloned()))
        .map(|global| global.limit)
        .filter(|limit| limit.unit == Unit::Second)
        .unwrap_or_else(|| panic!("a global limit of {requests_per_unit}"))
    }

    fn share() -> GlobalShare {
        GlobalShare::new(&limit(100), Arc::from("test"))
    }

    #[test]
    fn the_hits_asked_in_a_window_bound_what_it_admitted() {
        let share = share();
        // A window of 1 s from 10 s: 30 hits early, 5 in its last 100 ms.
        share.count(30, 10_200, 1_000);
        assert_eq!(share.asked_in_window(10_500, 1_000), 30);
        share.count(5, 10_950, 1_000);
        assert_eq!(share.asked_in_window(10_960, 1_000), 35);
        // The next window starts with the previous one's last 100 ms, for
        // a store whose clock is ahead of this server's.
        assert_eq!(share.asked_in_window(11_300, 1_000), 5);
        share.count(2, 11_400, 1_000);
        assert_eq!(share.asked_in_window(11_500, 1_000), 7);
        // A window after a quiet one starts from nothing.
        assert_eq!(share.asked_in_window(13_100, 1_000), 0);
        // All hits are the demand, whatever the window.
        assert_eq!(share.take_hits(), 37);
    }

    #[test]
    fn a_share_stays_while_its_limit_does_and_starts_again_when_it_changes() {
        let shares = GlobalShares::new();
        let first = shares.share("d", "rate_limit:k_v", &limit(100));
        first.set_requests_per_unit(40);
        assert_eq!(
            shares
                .share("d", "rate_limit:k_v", &limit(100))
                .requests_per_unit(),
            40
        );
        // Another limit at the same place: a share of its own, whole.
        assert_eq!(
            shares
                .share("d", "rate_limit:k_v", &limit(50))
                .requests_per_unit(),
            50
        );
        assert_eq!(shares.instance_id().len(), 16);
        assert_ne!(GlobalShares::new().instance_id(), shares.instance_id());
    }
}
