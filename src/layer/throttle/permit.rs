//! The slot a running request holds ([`Permit`]) and the cost it is
//! measured (or reported) at: given to the next in the queue when dropped,
//! its cost settled with the budget and the predictor.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::Criticality;
use super::cost::{Predictor, thread_cpu_time};
use super::queue::{Admission, drain_later, lock};

/// From this predicted cost (ms) a request's polls are timed with the
/// thread's CPU clock; cheaper ones with the monotonic clock.
///
/// The thread CPU clock is exact even when the thread is preempted, but
/// reading it is a system call (about 0.2 µs here, twice per poll): under
/// 1 % of a request of 50 µs, most of the cost of a request of 1 µs. The
/// monotonic clock is read without one, and a poll that short is seldom
/// preempted.
pub(super) const THREAD_CLOCK_FROM_MS: f64 = 0.05;

/// A measured request's class, its predicted cost, and the CPU time its
/// handler has used so far.
pub(super) struct Cost {
    pub(super) class: String,
    pub(super) predicted_ms: f64,
    pub(super) used: Duration,
    /// Whether its polls are timed with the thread CPU clock (else the
    /// monotonic one).
    pub(super) thread_clock: bool,
    /// The response header that reports the cost instead (its polls are
    /// then not timed).
    pub(super) reported: Option<http::HeaderName>,
    pub(super) predictor: Arc<Mutex<Predictor>>,
}

/// A running request's slot: given to the next in the queue when dropped,
/// and its measured cost settled.
pub struct Permit {
    pub(super) admission: Arc<Mutex<Admission>>,
    pub(super) since: Instant,
    pub(super) cost: Option<Cost>,
    pub(super) level: Criticality,
}

impl Permit {
    /// Runs a poll of the request's handler, adding the thread CPU time
    /// it used to the request's cost. (Creating the handler's future is
    /// routing, not the handler's work: it is not measured.)
    /// The poll runs as a request of the request's criticality
    /// ([`Criticality::current`]).
    pub(super) fn measured<T>(&mut self, step: impl FnOnce() -> T) -> T {
        let level = self.level;
        let Some(cost) = self.cost.as_mut().filter(|cost| cost.reported.is_none()) else {
            return level.scope(step);
        };
        let step = || level.scope(step);
        if cost.thread_clock {
            let before = thread_cpu_time();
            let result = step();
            cost.used += thread_cpu_time().saturating_sub(before);
            result
        } else {
            let before = std::time::Instant::now();
            let result = step();
            cost.used += before.elapsed();
            result
        }
    }
}

impl Permit {
    /// The cost the response reports, if the layer reads it there: its
    /// header's milliseconds, else the time since the request started.
    pub(super) fn reported(&mut self, headers: &HeaderMap) {
        let since = self.since;
        let Some(cost) = &mut self.cost else {
            return;
        };
        let Some(header) = &cost.reported else {
            return;
        };
        cost.used = headers
            .get(header)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms <= 3_600_000.0)
            .map_or_else(
                || since.elapsed(),
                |ms| Duration::from_secs_f64(ms / 1_000.0),
            );
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let (predicted_ms, measured_ms) = match &self.cost {
            Some(cost) => {
                lock(&cost.predictor).record(&cost.class, cost.predicted_ms, cost.used);
                (cost.predicted_ms, cost.used.as_secs_f64() * 1_000.0)
            }
            None => (0.0, 0.0),
        };
        let mut admission = lock(&self.admission);
        admission.leave(
            self.since.elapsed(),
            predicted_ms,
            measured_ms,
            Instant::now(),
        );
        drain_later(&self.admission, &mut admission);
    }
}
