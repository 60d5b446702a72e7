//! Overload: a bound on the `ShouldRateLimit` calls being decided at once,
//! across every connection, so that latency cannot grow without bound when
//! requests arrive faster than the sidecar (or its store) can decide. Past
//! `--max-in-flight`, a call is answered at once by `--on-overload` (`allow`,
//! as Envoy's own fail-open default; or `deny`), counted, and logged at most
//! once every ten seconds (docs/operations.md#overload). Per connection,
//! `--grpc-max-concurrent-streams` already bounds what one peer sends.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often, at most, an overload is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// `--on-overload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnOverload {
    #[default]
    Allow,
    Deny,
}

impl FromStr for OnOverload {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Self::Allow),
            "deny" => Ok(Self::Deny),
            other => Err(format!(
                "unknown --on-overload {other:?}: expected allow or deny"
            )),
        }
    }
}

impl OnOverload {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// `--max-in-flight` and `--on-overload`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverloadOptions {
    /// Calls decided at once, at most (0: no bound).
    pub max_in_flight: usize,
    pub policy: OnOverload,
}

impl Default for OverloadOptions {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            policy: OnOverload::Allow,
        }
    }
}

/// `--max-in-flight`'s default: far above what one sidecar decides at once
/// when healthy (a few hundred), far below what would exhaust its memory.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// The calls in flight, and the overloads not yet logged.
#[derive(Debug)]
pub struct Admission {
    options: OverloadOptions,
    in_flight: AtomicUsize,
    unlogged: AtomicU64,
    last_warning: Mutex<Option<Instant>>,
}

/// A call being decided; leaves the count when dropped.
pub struct Permit(Arc<Admission>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(options: OverloadOptions) -> Arc<Self> {
        Arc::new(Self {
            options,
            in_flight: AtomicUsize::new(0),
            unlogged: AtomicU64::new(0),
            last_warning: Mutex::new(None),
        })
    }

    pub fn policy(&self) -> OnOverload {
        self.options.policy
    }

    /// A permit to decide, or `None` when the bound is reached (the caller
    /// answers by the policy; the overload is noted for the log).
    pub fn enter(self: &Arc<Self>) -> Option<Permit> {
        let max = self.options.max_in_flight;
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if max == 0 || before < max {
            return Some(Permit(self.clone()));
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.note_overload();
        None
    }

    fn note_overload(&self) {
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        let Ok(mut last) = self.last_warning.try_lock() else {
            // Another call is logging right now.
            return;
        };
        if last.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        let answered = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(
            answered,
            max_in_flight = self.options.max_in_flight,
            policy = self.options.policy.as_str(),
            "overloaded: calls answered by --on-overload without a decision (this line repeats at most every 10 s)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bound_calls_are_refused_until_one_leaves() {
        let admission = Admission::new(OverloadOptions {
            max_in_flight: 2,
            policy: OnOverload::Deny,
        });
        let first = admission.enter();
        let second = admission.enter();
        assert!(first.is_some() && second.is_some());
        assert!(admission.enter().is_none());
        drop(first);
        assert!(admission.enter().is_some());
        assert_eq!(admission.in_flight.load(Ordering::Acquire), 1);
    }

    #[test]
    fn zero_means_no_bound() {
        let admission = Admission::new(OverloadOptions {
            max_in_flight: 0,
            policy: OnOverload::Allow,
        });
        let permits: Vec<_> = (0..100).filter_map(|_| admission.enter()).collect();
        assert_eq!(permits.len(), 100);
    }
}
