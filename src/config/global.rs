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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use super::FixedLimit;

/// What a global limit's leases are named by, in `GetCapacity`: this
/// prefix and the descriptor's path as written (`key_value.key`).
pub const RESOURCE_PREFIX: &str = "rate_limit:";

/// How often a server renews its share, and its parent's lease of the
/// limit, unless told otherwise; a share is a lease of `LEASE_MS`.
pub const REFRESH_MS: u64 = 500;
pub const LEASE_MS: u64 = 10_000;

/// The shortest refresh interval: a link asks its parent at most every
/// 100 ms, whatever it is told.
pub const FASTEST_REFRESH_MS: u64 = 100;

/// How a server leases its global limits' shares: how often it renews its
/// own and its children renew theirs, and how long a share lasts
/// (`--global-refresh-interval`, `--global-lease`). The parent's answer
/// paces a child's renewals, so each level may set its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalTiming {
    refresh_ms: u64,
    lease_ms: u64,
}

impl Default for GlobalTiming {
    fn default() -> Self {
        Self {
            refresh_ms: REFRESH_MS,
            lease_ms: LEASE_MS,
        }
    }
}

/// A refresh interval or lease that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalTimingError {
    #[error("a global limit's refresh interval must be at least {FASTEST_REFRESH_MS}ms, got {0}ms")]
    RefreshTooShort(u64),
    #[error(
        "a global limit's lease ({lease_ms}ms) must be at least twice its refresh interval ({refresh_ms}ms), so that a renewal can fail once without the share lapsing"
    )]
    LeaseTooShort { refresh_ms: u64, lease_ms: u64 },
    #[error("a global limit's lease must be at most a day, got {0}ms")]
    LeaseTooLong(u64),
}

impl GlobalTiming {
    pub fn new(refresh_ms: u64, lease_ms: u64) -> Result<Self, GlobalTimingError> {
        if refresh_ms < FASTEST_REFRESH_MS {
            return Err(GlobalTimingError::RefreshTooShort(refresh_ms));
        }
        if lease_ms > 86_400_000 {
            return Err(GlobalTimingError::LeaseTooLong(lease_ms));
        }
        if lease_ms < refresh_ms.saturating_mul(2) {
            return Err(GlobalTimingError::LeaseTooShort {
                refresh_ms,
                lease_ms,
            });
        }
        Ok(Self {
            refresh_ms,
            lease_ms,
        })
    }

    pub fn refresh_ms(&self) -> u64 {
        self.refresh_ms
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }
}

/// One server's share of a global limit, and the hits it counted.
#[derive(Debug)]
pub struct GlobalShare {
    /// What this server may admit per window now.
    requests_per_unit: AtomicU64,
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
    pub fn new(configured: u64) -> Self {
        Self {
            requests_per_unit: AtomicU64::new(configured),
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

    /// The hits counted since the last call.
    pub fn take_hits(&self) -> u64 {
        self.hits.swap(0, Ordering::Relaxed)
    }
}

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change leaves the counts whole.
    state.lock().unwrap_or_else(PoisonError::into_inner)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hits_asked_in_a_window_bound_what_it_admitted() {
        let share = GlobalShare::new(100);
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
    fn a_refresh_interval_or_lease_that_cannot_work_is_refused() {
        assert_eq!(
            GlobalTiming::new(500, 10_000).map(|timing| (timing.refresh_ms(), timing.lease_ms())),
            Ok((500, 10_000))
        );
        assert_eq!(
            GlobalTiming::new(50, 10_000),
            Err(GlobalTimingError::RefreshTooShort(50))
        );
        assert!(matches!(
            GlobalTiming::new(500, 900),
            Err(GlobalTimingError::LeaseTooShort { .. })
        ));
        assert!(matches!(
            GlobalTiming::new(500, 90_000_000),
            Err(GlobalTimingError::LeaseTooLong(_))
        ));
    }
}
