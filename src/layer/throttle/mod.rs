//! [`ThrottleLayer`]: the server throttler (docs/design.md#the-server-throttler).
//! At most `capacity` requests run at once; the rest wait in a bounded queue
//! instead of failing, served by criticality then arrival, until their
//! deadline (the layer's `max_wait`, or the request's own `grpc-timeout`
//! when shorter). A request that cannot start before its deadline, by the
//! time slots have been held lately, is refused at once rather than after
//! waiting. A full queue evicts the most recently queued request of the
//! lowest level below a newcomer's; a queue full of requests as critical as
//! the newcomer refuses it. Refusals are 503 (gRPC `UNAVAILABLE`) with
//! `Retry-After`.
//!
//! A request's slot is held until its response body ends or is dropped (a
//! handler that fails or panics frees it too).

mod queue;
mod service;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderName;
use tower::Layer;

use self::queue::Admission;
pub use self::service::{Permit, Throttle, ThrottleFuture};

/// How much a request matters when the server is overloaded (the levels of
/// the SRE book's criticality, least critical first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Criticality {
    Sheddable,
    SheddablePlus,
    Critical,
    CriticalPlus,
}

impl Criticality {
    fn rank(self) -> usize {
        self as usize
    }

    /// A header's value: `critical_plus`, `critical`, `sheddable_plus`,
    /// `sheddable`, in any case, `-` for `_`.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim().to_ascii_lowercase().replace('-', "_");
        match value.as_str() {
            "critical_plus" => Some(Criticality::CriticalPlus),
            "critical" => Some(Criticality::Critical),
            "sheddable_plus" => Some(Criticality::SheddablePlus),
            "sheddable" => Some(Criticality::Sheddable),
            _ => None,
        }
    }
}

/// Requests the layer has counted, for metrics.
#[derive(Debug, Default)]
pub struct ThrottleCounts {
    /// Criticality values it did not know (given the default level).
    pub unknown_criticality: AtomicU64,
    /// `grpc-timeout` values it could not read (ignored).
    pub bad_deadlines: AtomicU64,
    /// Refused: at once, after waiting, or evicted.
    pub refused: AtomicU64,
}

/// Runs at most `capacity` requests at once; the others wait their turn.
#[derive(Clone)]
pub struct ThrottleLayer {
    settings: Arc<Settings>,
    admission: Arc<Mutex<Admission>>,
}

#[derive(Clone)]
struct Settings {
    capacity: usize,
    max_queue: usize,
    max_wait: Duration,
    header: HeaderName,
    default_level: Criticality,
    counts: Arc<ThrottleCounts>,
}

impl ThrottleLayer {
    /// At most `capacity` requests in progress (at least 1); up to four
    /// times as many wait, each at most a second.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self::with(Settings {
            capacity,
            max_queue: capacity.saturating_mul(4),
            max_wait: Duration::from_secs(1),
            header: HeaderName::from_static("x-criticality"),
            default_level: Criticality::Critical,
            counts: Arc::default(),
        })
    }

    fn with(settings: Settings) -> Self {
        Self {
            admission: Arc::new(Mutex::new(Admission::new(
                settings.capacity,
                settings.max_queue,
            ))),
            settings: Arc::new(settings),
        }
    }

    fn map(self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = Settings::clone(&self.settings);
        change(&mut settings);
        Self::with(settings)
    }

    /// How many requests may wait (0: none wait, the layer only sheds).
    pub fn max_queue(self, max_queue: usize) -> Self {
        self.map(|settings| settings.max_queue = max_queue)
    }

    /// The longest a request waits for its turn.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.map(|settings| settings.max_wait = max_wait)
    }

    /// The header that says a request's criticality (default
    /// `x-criticality`).
    pub fn criticality_header(self, header: HeaderName) -> Self {
        self.map(|settings| settings.header = header)
    }

    /// The level of a request without the header, or with a value the
    /// layer does not know (default: critical).
    pub fn default_criticality(self, level: Criticality) -> Self {
        self.map(|settings| settings.default_level = level)
    }

    /// What the layer counted (shared by its services).
    pub fn counts(&self) -> Arc<ThrottleCounts> {
        self.settings.counts.clone()
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::new(inner, self.settings.clone(), self.admission.clone())
    }
}
