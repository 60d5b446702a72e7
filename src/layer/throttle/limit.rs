//! An adaptive concurrency limit (AIMD on latency): the throttler's
//! capacity found from how long requests take, not configured by hand
//! (docs/design.md#an-adaptive-limit).
//!
//! The no-load latency is estimated as the shortest time a request held its
//! slot lately (the lower of this period's and the previous period's
//! minimum, periods of 30 s, so a service that becomes slower for good is
//! followed within a minute). A request that took at most `tolerance` times
//! that raises the limit by `1 / limit` (about one per limit's worth of
//! requests), but only while the limit is in use (half of it at least in
//! progress); a slower one cuts the limit by a tenth, at most once per
//! no-load latency, so that the requests of one congested moment count as
//! one signal.

use std::time::Duration;

use tokio::time::Instant;

/// How long a period of the minimum latency lasts.
const PERIOD: Duration = Duration::from_secs(30);

/// What the limit keeps between requests.
#[derive(Debug)]
pub(super) struct AdaptiveLimit {
    limit: f64,
    min: f64,
    max: f64,
    tolerance: f64,
    /// The shortest latency of the previous period and of this one.
    previous_min: Option<Duration>,
    current_min: Option<Duration>,
    period_began: Instant,
    last_cut: Option<Instant>,
}

impl AdaptiveLimit {
    /// Starts at `initial`, within `min..=max` (at least 1).
    pub fn new(initial: usize, min: usize, max: usize, tolerance: f64, now: Instant) -> Self {
        let min = min.max(1) as f64;
        let max = (max as f64).max(min);
        Self {
            limit: (initial as f64).clamp(min, max),
            min,
            max,
            tolerance: if tolerance.is_finite() {
                tolerance.max(1.0)
            } else {
                2.0
            },
            previous_min: None,
            current_min: None,
            period_began: now,
            last_cut: None,
        }
    }

    /// The limit, in whole requests.
    pub fn current(&self) -> usize {
        self.limit.floor() as usize
    }

    /// The no-load latency as estimated now.
    fn no_load(&self) -> Option<Duration> {
        match (self.previous_min, self.current_min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A request held its slot for `latency` while `in_progress` requests
    /// (itself included) ran; the new limit.
    pub fn update(&mut self, latency: Duration, in_progress: usize, now: Instant) -> usize {
        let elapsed = now.saturating_duration_since(self.period_began);
        if elapsed >= PERIOD * 2 {
            (self.previous_min, self.current_min) = (None, None);
            self.period_began = now;
        } else if elapsed >= PERIOD {
            self.previous_min = self.current_min.take();
            self.period_began = now;
        }
        self.current_min = Some(self.current_min.map_or(latency, |min| min.min(latency)));
        let Some(no_load) = self.no_load() else {
            return self.current();
        };
        if latency.as_secs_f64() <= no_load.as_secs_f64() * self.tolerance {
            if in_progress as f64 * 2.0 >= self.limit {
                self.limit = (self.limit + 1.0 / self.limit).min(self.max);
            }
        } else if self
            .last_cut
            .is_none_or(|cut| now.saturating_duration_since(cut) >= no_load)
        {
            self.limit = (self.limit * 0.9).max(self.min);
            self.last_cut = Some(now);
        }
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn fast_requests_raise_the_limit_while_it_is_used() {
        let now = Instant::now();
        let mut limit = AdaptiveLimit::new(4, 1, 10, 2.0, now);
        // Used: each request at the no-load latency adds 1/limit.
        for _ in 0..4 {
            limit.update(10 * MS, 4, now);
        }
        assert_eq!(limit.current(), 4);
        for _ in 0..40 {
            limit.update(10 * MS, 8, now);
        }
        assert_eq!(limit.current(), 10, "up to its maximum");
        // Unused (one in progress of ten): it does not grow.
        let mut idle = AdaptiveLimit::new(4, 1, 10, 2.0, now);
        for _ in 0..100 {
            idle.update(10 * MS, 1, now);
        }
        assert_eq!(idle.current(), 4);
    }

    #[test]
    fn slow_requests_cut_it_once_per_no_load_latency() {
        let start = Instant::now();
        let mut limit = AdaptiveLimit::new(10, 2, 10, 2.0, start);
        limit.update(10 * MS, 10, start);
        // Three slow requests at once: one cut, by a tenth.
        for _ in 0..3 {
            limit.update(50 * MS, 10, start + MS);
        }
        assert_eq!(limit.current(), 9);
        // Then one per 10 ms, down to the minimum.
        for step in 1..100u32 {
            limit.update(50 * MS, 10, start + MS + step * 10 * MS);
        }
        assert_eq!(limit.current(), 2);
    }

    #[test]
    fn the_no_load_latency_is_forgotten_after_two_periods() {
        let start = Instant::now();
        let mut limit = AdaptiveLimit::new(5, 1, 10, 2.0, start);
        limit.update(MS, 5, start);
        // The service is slower for good: 10 ms is its no-load latency now.
        let later = start + PERIOD * 2;
        limit.update(10 * MS, 5, later);
        assert_eq!(limit.no_load(), Some(10 * MS));
    }
}
