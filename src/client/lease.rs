//! Capacity leases on the client (docs/design.md#capacity-leases), in the
//! two halves the design names. The top half, [`LeaseLimiter`], is a token
//! bucket at the leased rate that requests take from with no network at all
//! ([`LeaseLimiter::try_acquire`]); it also counts what was asked of it, which
//! is the demand the bottom half reports. The bottom half, [`LeaseRenewer`],
//! renews the lease in the background every refresh interval, asking for the
//! measured demand (with headroom), and sets the bucket's rate to what the
//! sidecar grants, through the one renewer a server's link to its parent
//! also uses ([`super::renewal`]); when no sidecar answers it follows the
//! [`FailureMode`].
//!
//! Time is Tokio's clock, so tests can pause and advance it.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Client;
use super::renewal::{self, LeaseWant, Renewed};
use crate::api::v1::{CapacityRef, ReleaseCapacityRequest};

/// What the limiter allows when the sidecar cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// As if all it wants were granted.
    Optimistic,
    /// Nothing.
    Pessimistic,
    /// The safe capacity of the last answer (or the configured one before
    /// any answer); a safe capacity of -1 lets everything through.
    #[default]
    Safe,
}

/// The top half: a token bucket at the leased rate (per second), holding at
/// most one second of it (and at least one request).
#[derive(Debug)]
pub struct LeaseLimiter {
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    refilled: Instant,
    /// Asked of it since the last renewal (granted or not): the demand.
    asked: f64,
    since: Instant,
    /// No limit (a safe capacity of -1 while the sidecar is away).
    unlimited: bool,
}

impl Bucket {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(capacity_of(self.rate));
        self.refilled = now;
    }
}

fn capacity_of(rate: f64) -> f64 {
    rate.max(1.0)
}

impl LeaseLimiter {
    /// A limiter at `rate` per second, full.
    pub fn with_rate(rate: f64) -> Self {
        let now = Instant::now();
        let rate = sanitize(rate);
        Self {
            bucket: Mutex::new(Bucket {
                rate,
                tokens: if rate > 0.0 { capacity_of(rate) } else { 0.0 },
                refilled: now,
                asked: 0.0,
                since: now,
                unlimited: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bucket> {
        // Every holder leaves the bucket consistent: a poisoned lock's is.
        self.bucket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes `n` now if the bucket holds them, or if it will within
    /// `max_wait`: then they are taken ahead (the bucket owes them) and the
    /// answer is how long to wait before going on, so that waiters go in
    /// the order they came at the leased rate and each is counted once in
    /// the demand the lease renews with. Otherwise how long until they
    /// would be there (`None`: never at the current rate).
    pub fn acquire_within(&self, n: u32, max_wait: Duration) -> Result<Duration, Option<Duration>> {
        let now = Instant::now();
        let n = f64::from(n);
        let mut bucket = self.lock();
        bucket.asked += n;
        if bucket.unlimited {
            return Ok(Duration::ZERO);
        }
        bucket.refill(now);
        if bucket.tokens >= n {
            bucket.tokens -= n;
            return Ok(Duration::ZERO);
        }
        if bucket.rate <= 0.0 || n > capacity_of(bucket.rate) {
            return Err(None);
        }
        let wait = Duration::from_secs_f64((n - bucket.tokens) / bucket.rate);
        if wait > max_wait {
            return Err(Some(wait));
        }
        bucket.tokens -= n;
        Ok(wait)
    }

    /// Takes `n` if the bucket holds them; otherwise how long until it
    /// will (`None`: never at the current rate, which is 0 or too low).
    pub fn try_acquire(&self, n: u32) -> Result<(), Option<Duration>> {
        self.acquire_within(n, Duration::ZERO).map(|_| ())
    }

    /// The leased rate now.
    pub fn rate(&self) -> f64 {
        self.lock().rate
    }

    /// Sets the rate (what the sidecar granted).
    pub fn set_rate(&self, rate: f64) {
        let now = Instant::now();
        let mut bucket = self.lock();
        bucket.refill(now);
        bucket.unlimited = false;
        bucket.rate = sanitize(rate);
        bucket.tokens = bucket.tokens.min(capacity_of(bucket.rate));
    }

    /// Lets every request through until the next [`set_rate`](Self::set_rate)
    /// (the safe capacity -1: no limit while the sidecar is away).
    pub fn set_unlimited(&self) {
        self.lock().unlimited = true;
    }

    /// The demand since the last call (per second), and starts again.
    pub fn take_demand(&self) -> f64 {
        let now = Instant::now();
        let mut bucket = self.lock();
        let seconds = now.saturating_duration_since(bucket.since).as_secs_f64();
        let demand = if seconds > 0.0 {
            bucket.asked / seconds
        } else {
            0.0
        };
        bucket.asked = 0.0;
        bucket.since = now;
        demand
    }
}

fn sanitize(rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 {
        rate
    } else {
        0.0
    }
}

/// What the bottom half asks for.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// This process's id, stable across its renewals.
    pub client_id: String,
    pub namespace: String,
    pub resource: String,
    pub domain: String,
    /// Asked for before any demand was measured.
    pub initial_wants: f64,
    /// Asks for this times the measured demand, so growth shows.
    pub headroom: f64,
    pub failure_mode: FailureMode,
    /// The safe capacity before a sidecar has given one.
    pub safe_capacity: f64,
    /// How often to retry when the sidecar cannot be reached.
    pub retry_interval: Duration,
}

impl LeaseOptions {
    pub fn new(
        client_id: impl Into<String>,
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> Self {
        Self {
            client_id: client_id.into(),
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
            initial_wants: 1.0,
            headroom: 1.2,
            failure_mode: FailureMode::Safe,
            safe_capacity: 0.0,
            retry_interval: Duration::from_secs(1),
        }
    }
}

/// The bottom half: renews in the background for as long as its
/// [`LeaseLimiter`] is in use, and gives the lease back when it is dropped.
pub struct LeaseRenewer;

impl LeaseRenewer {
    /// Starts renewing through `client` (inside a Tokio runtime): a
    /// sidecar's, or an embedded engine's. The limiter starts at rate 0
    /// until the first answer (or the failure mode).
    pub fn spawn(client: Client, options: LeaseOptions) -> Arc<LeaseLimiter> {
        let limiter = Arc::new(LeaseLimiter::with_rate(0.0));
        let weak = Arc::downgrade(&limiter);
        tokio::spawn(renew(client, options, weak));
        limiter
    }
}

async fn renew(client: Client, options: LeaseOptions, limiter: Weak<LeaseLimiter>) {
    let mut safe = options.safe_capacity;
    let mut measured = false;
    while let Some(strong) = limiter.upgrade() {
        let demand = strong.take_demand();
        let wants = if measured {
            demand * options.headroom
        } else {
            options.initial_wants
        };
        measured = true;
        let has = strong.rate();
        drop(strong);
        let want = LeaseWant {
            namespace: options.namespace.clone(),
            resource: options.resource.clone(),
            domain: options.domain.clone(),
            wants,
            has,
            held_below: None,
        };
        let lease = match renewal::renew(&client, &options.client_id, &[want]).await {
            Ok(mut answers) => match answers.pop() {
                Some(Renewed::Lease(lease)) => Some(lease),
                Some(Renewed::Refused(message)) => {
                    tracing::warn!(%message, "capacity lease refused");
                    None
                }
                Some(Renewed::Unanswered) | None => None,
            },
            Err(error) => {
                tracing::debug!(%error, "capacity lease not renewed");
                None
            }
        };
        let Some(strong) = limiter.upgrade() else {
            break;
        };
        let wait = match lease {
            Some(lease) => {
                strong.set_rate(lease.capacity);
                safe = lease.safe_capacity;
                Duration::from_millis(lease.refresh_interval_ms.max(10))
            }
            None => {
                match options.failure_mode {
                    FailureMode::Optimistic => strong.set_rate(wants),
                    FailureMode::Pessimistic => strong.set_rate(0.0),
                    FailureMode::Safe if safe < 0.0 => strong.set_unlimited(),
                    FailureMode::Safe => strong.set_rate(safe),
                }
                options.retry_interval
            }
        };
        drop(strong);
        tokio::time::sleep(wait).await;
    }
    // Nobody uses the lease any more: its share goes to the others now
    // rather than at expiry.
    let _ = client
        .release_capacity(ReleaseCapacityRequest {
            client_id: options.client_id.clone(),
            resources: vec![CapacityRef {
                namespace: options.namespace,
                resource: options.resource,
                domain: options.domain,
            }],
        })
        .await;
}
