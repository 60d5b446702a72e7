//! When to try again after a rejection (docs/design.md#retries): after the
//! i-th rejection, sleep `min(max_wait - elapsed, jitter(max(retry_after,
//! base * 2^i)))`, and give up with the last answer once nothing is left of
//! `max_wait`. Pure, with the randomness passed in, so it is tested exactly.

use std::time::Duration;

/// How long to sleep before attempt `i + 1`, or `None` to give up.
/// `retry_after` is the server's (`None` when it cannot say, as for copies);
/// `unit` is a uniform random number in `[0, 1)`.
pub fn sleep_before_retry(
    rejections: u32,
    retry_after: Option<Duration>,
    base: Duration,
    left: Duration,
    unit: f64,
) -> Option<Duration> {
    if left.is_zero() {
        return None;
    }
    let backoff = base.saturating_mul(1u32.checked_shl(rejections).unwrap_or(u32::MAX));
    let wanted = retry_after.map_or(backoff, |after| after.max(backoff));
    Some(jitter(wanted, unit).min(left))
}

/// A value uniform in `[v - v/4, v + v/4]`.
pub fn jitter(value: Duration, unit: f64) -> Duration {
    let quarter = value / 4;
    (value - quarter).saturating_add(quarter.mul_f64(2.0 * unit.clamp(0.0, 1.0)))
}

/// A uniform number in `[0, 1)` from the system's randomness (0.5 if it
/// has none: no jitter then, but still a backoff).
pub fn random_unit() -> f64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backs_off_exponentially_within_a_quarter_either_way() {
        let base = 100 * MS;
        let left = Duration::from_secs(60);
        for (i, expected) in [(0, 100), (1, 200), (2, 400), (5, 3200)] {
            let exact = sleep_before_retry(i, None, base, left, 0.5).unwrap();
            assert_eq!(exact, expected * MS);
            let low = sleep_before_retry(i, None, base, left, 0.0).unwrap();
            assert_eq!(low, expected * MS - expected * MS / 4);
            let high = sleep_before_retry(i, None, base, left, 0.999_999).unwrap();
            assert!(high <= expected * MS + expected * MS / 4 && high > expected * MS);
        }
    }

    #[test]
    fn waits_at_least_what_the_server_said() {
        let sleep = sleep_before_retry(0, Some(2000 * MS), 100 * MS, 10_000 * MS, 0.5);
        assert_eq!(sleep, Some(2000 * MS));
        // A short retry_after does not cut the backoff.
        let sleep = sleep_before_retry(3, Some(MS), 100 * MS, 10_000 * MS, 0.5);
        assert_eq!(sleep, Some(800 * MS));
    }

    #[test]
    fn never_sleeps_past_max_wait_and_gives_up_when_it_is_spent() {
        assert_eq!(
            sleep_before_retry(0, Some(5000 * MS), 100 * MS, 300 * MS, 0.9),
            Some(300 * MS)
        );
        assert_eq!(
            sleep_before_retry(0, None, 100 * MS, Duration::ZERO, 0.5),
            None
        );
        // Huge attempt numbers saturate instead of overflowing.
        assert_eq!(
            sleep_before_retry(200, None, 100 * MS, 300 * MS, 0.5),
            Some(300 * MS)
        );
    }

    #[test]
    fn random_units_are_in_range() {
        for _ in 0..1000 {
            let unit = random_unit();
            assert!((0.0..1.0).contains(&unit));
        }
    }
}
