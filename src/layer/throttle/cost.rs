//! What a request costs in CPU time: measured on the thread that polls its
//! handler, and predicted per request class from the measured cost of the
//! class's recent requests (docs/design.md#the-server-throttler).
//!
//! The prediction is a moving average (weight 1/5 on the newest request),
//! so a class whose cost changes is followed within a few requests. Classes
//! are bounded: past [`MAX_CLASSES`], new ones share one class, so a client
//! that invents paths cannot grow the table.

use std::collections::HashMap;
use std::time::Duration;

/// The most classes a layer keeps apart.
pub const MAX_CLASSES: usize = 256;

/// The class that new classes share once [`MAX_CLASSES`] are known.
pub const OTHER_CLASS: &str = "(other)";

/// How many recent prediction errors a class keeps for its median.
const RECENT_ERRORS: usize = 128;

/// The weight of the newest measurement in a class's prediction.
const NEWEST_WEIGHT: f64 = 0.2;

/// The CPU time the calling thread has used so far (zero where the
/// platform has no per-thread clock).
pub fn thread_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid timespec the call writes into; the clock
        // id is a constant every unix this builds on defines.
        let failed = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0;
        if failed {
            return Duration::ZERO;
        }
        Duration::new(
            u64::try_from(now.tv_sec).unwrap_or(0),
            u32::try_from(now.tv_nsec).unwrap_or(0),
        )
    }
    #[cfg(not(unix))]
    {
        Duration::ZERO
    }
}

/// One class's costs.
#[derive(Debug, Clone, Default)]
struct Class {
    requests: u64,
    /// What the next request is predicted to cost (ms).
    predicted_ms: f64,
    measured_total_ms: f64,
    /// |predicted − measured| / measured of the latest requests, a ring.
    errors: Vec<f64>,
    next_error: usize,
}

/// What a class has cost, for metrics and `/stats` pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClassCost {
    pub class: String,
    /// Requests that ran and were measured.
    pub requests: u64,
    /// What the class's next request is predicted to cost (ms of CPU).
    pub predicted_ms: f64,
    /// The mean measured cost (ms of CPU).
    pub measured_mean_ms: f64,
    /// All the CPU time the class's requests used (ms).
    pub measured_total_ms: f64,
    /// The median relative error of the prediction over the class's latest
    /// 128 requests (0.1 is 10 %); `None` before any.
    pub median_error: Option<f64>,
}

/// The classes' predictions.
#[derive(Debug, Default)]
pub struct Predictor {
    classes: HashMap<String, Class, foldhash::fast::RandomState>,
    /// The moving average over every class: the guess for a new class.
    overall_ms: f64,
}

impl Predictor {
    /// The class a request is counted in: its own, or the shared one once
    /// the table is full.
    pub fn class_of(&self, class: String) -> String {
        if self.classes.len() >= MAX_CLASSES && !self.classes.contains_key(&class) {
            OTHER_CLASS.to_owned()
        } else {
            class
        }
    }

    /// What a request of `class` is predicted to cost (ms): the class's
    /// average, or every class's for a class not measured yet.
    pub fn predict(&self, class: &str) -> f64 {
        match self.classes.get(class) {
            Some(known) if known.requests > 0 => known.predicted_ms,
            _ => self.overall_ms,
        }
    }

    /// A request of `class`, predicted at `predicted_ms`, used `measured`.
    pub fn record(&mut self, class: &str, predicted_ms: f64, measured: Duration) {
        let measured_ms = measured.as_secs_f64() * 1_000.0;
        let class = if self.classes.len() >= MAX_CLASSES && !self.classes.contains_key(class) {
            OTHER_CLASS
        } else {
            class
        };
        let entry = self.classes.entry(class.to_owned()).or_default();
        if entry.requests > 0 && measured_ms > 0.0 {
            let error = (predicted_ms - measured_ms).abs() / measured_ms;
            if entry.errors.len() < RECENT_ERRORS {
                entry.errors.push(error);
            } else {
                entry.errors[entry.next_error] = error;
            }
            entry.next_error = (entry.next_error + 1) % RECENT_ERRORS;
        }
        entry.predicted_ms = average(entry.requests, entry.predicted_ms, measured_ms);
        entry.requests += 1;
        entry.measured_total_ms += measured_ms;
        self.overall_ms = average(
            u64::from(self.overall_ms > 0.0),
            self.overall_ms,
            measured_ms,
        );
    }

    /// Every class's costs, by name.
    pub fn costs(&self) -> Vec<ClassCost> {
        let mut costs: Vec<ClassCost> = self
            .classes
            .iter()
            .map(|(name, class)| ClassCost {
                class: name.clone(),
                requests: class.requests,
                predicted_ms: class.predicted_ms,
                measured_mean_ms: class.measured_total_ms / class.requests.max(1) as f64,
                measured_total_ms: class.measured_total_ms,
                median_error: median(&class.errors),
            })
            .collect();
        costs.sort_by(|a, b| a.class.cmp(&b.class));
        costs
    }
}

fn average(seen: u64, average: f64, newest: f64) -> f64 {
    if seen == 0 {
        newest
    } else {
        (1.0 - NEWEST_WEIGHT) * average + NEWEST_WEIGHT * newest
    }
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(sorted[sorted.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1_000.0)
    }

    #[test]
    fn the_prediction_converges_on_a_class_cost() {
        let mut predictor = Predictor::default();
        assert_eq!(predictor.predict("/a"), 0.0);
        // The class's cost is 10 ms, give or take 5 %.
        for i in 0..100 {
            let measured = if i % 2 == 0 { 9.5 } else { 10.5 };
            let predicted = predictor.predict("/a");
            predictor.record("/a", predicted, ms(measured));
        }
        let cost = &predictor.costs()[0];
        assert_eq!(cost.requests, 100);
        assert!((cost.predicted_ms - 10.0).abs() < 0.6, "{cost:?}");
        assert!((cost.measured_mean_ms - 10.0).abs() < 1e-9, "{cost:?}");
        let error = cost.median_error.unwrap_or(1.0);
        assert!(error < 0.1, "{cost:?}");
        // A class not measured yet is guessed from the others.
        assert!((predictor.predict("/new") - 10.0).abs() < 1.0);
    }

    #[test]
    fn a_class_whose_cost_changes_is_followed() {
        let mut predictor = Predictor::default();
        for _ in 0..50 {
            let predicted = predictor.predict("/a");
            predictor.record("/a", predicted, ms(1.0));
        }
        for _ in 0..20 {
            let predicted = predictor.predict("/a");
            predictor.record("/a", predicted, ms(5.0));
        }
        assert!((predictor.predict("/a") - 5.0).abs() < 0.1);
    }

    #[test]
    fn classes_past_the_bound_share_one() {
        let mut predictor = Predictor::default();
        for i in 0..MAX_CLASSES + 10 {
            let class = predictor.class_of(format!("/{i}"));
            predictor.record(&class, 0.0, ms(1.0));
        }
        let costs = predictor.costs();
        assert_eq!(costs.len(), MAX_CLASSES + 1);
        let other = costs.iter().find(|c| c.class == OTHER_CLASS);
        assert_eq!(other.map(|c| c.requests), Some(10));
        // A known class keeps its own.
        assert_eq!(predictor.class_of("/3".to_owned()), "/3");
    }
}
