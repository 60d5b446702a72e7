//! [`ThrottleLayer`]: the server throttler (docs/design.md#the-server-throttler).
//! At most `capacity` requests run at once; the rest wait in a bounded queue
//! instead of failing, served by criticality then arrival, until their
//! deadline (the layer's `max_wait`, or the request's own `grpc-timeout` or
//! Envoy's `x-envoy-expected-rq-timeout-ms` when shorter). A request that cannot start before its deadline, by the
//! time slots have been held lately, is refused at once rather than after
//! waiting. A full queue evicts the most recently queued request of the
//! lowest level below a newcomer's; a queue full of requests as critical as
//! the newcomer refuses it. Refusals are 503 (gRPC `UNAVAILABLE`) with
//! `Retry-After`.
//!
//! A request's slot is held until its response body ends or is dropped (a
//! handler that fails or panics frees it too).
//!
//! With [`ThrottleLayer::cpu_budget`], capacity is also CPU time: each
//! request's handler is measured (the thread CPU time of its polls), each
//! request class (the path by default) has a predicted cost, and a request
//! starts only while the budget, filled at so many ms of CPU per second,
//! is not in debt. A request takes its predicted cost when it starts; its
//! measured cost settles the difference when it ends.

mod cost;
mod limit;
mod permit;
mod queue;
mod service;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderMap, HeaderName, Uri};
use tower::Layer;

pub use crate::criticality::Criticality;

use self::cost::Predictor;
pub use self::cost::{ClassCost, MAX_CLASSES, OTHER_CLASS, thread_cpu_time};
use self::limit::AdaptiveLimit;
pub use self::permit::Permit;
use self::queue::{Admission, CpuBudget};
pub use self::service::{Throttle, ThrottleFuture};

/// Names a request's class from its URI and headers.
pub type Classify = dyn Fn(&Uri, &HeaderMap) -> String + Send + Sync;

/// Requests the layer has counted, for metrics.
#[derive(Debug, Default)]
pub struct ThrottleCounts {
    /// Criticality values it did not know (given the default level).
    pub unknown_criticality: AtomicU64,
    /// Deadline headers (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`)
    /// it could not read (ignored).
    pub bad_deadlines: AtomicU64,
    /// Refused: at once, after waiting, or evicted.
    pub refused: AtomicU64,
}

/// Runs at most `capacity` requests at once; the others wait their turn.
#[derive(Clone)]
pub struct ThrottleLayer {
    settings: Arc<Settings>,
    admission: Arc<Mutex<Admission>>,
    predictor: Arc<Mutex<Predictor>>,
}

#[derive(Clone)]
struct Settings {
    capacity: usize,
    max_queue: usize,
    max_wait: Duration,
    header: HeaderName,
    default_level: Criticality,
    counts: Arc<ThrottleCounts>,
    /// Milliseconds of CPU per second, if the layer has a budget.
    cpu_budget: Option<f64>,
    classify: Option<Arc<Classify>>,
    /// The adaptive limit's bounds and tolerance, if the capacity adapts.
    adaptive: Option<(usize, usize, f64)>,
    /// The response header that reports a request's cost, if the handler
    /// runs in another process.
    reported_cost: Option<HeaderName>,
}

impl Settings {
    /// Whether requests' CPU time is measured and predicted.
    fn measures(&self) -> bool {
        self.cpu_budget.is_some() || self.classify.is_some() || self.reported_cost.is_some()
    }

    fn class_of(&self, uri: &Uri, headers: &HeaderMap) -> String {
        match &self.classify {
            Some(classify) => classify(uri, headers),
            None => uri.path().chars().take(128).collect(),
        }
    }
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
            cpu_budget: None,
            classify: None,
            adaptive: None,
            reported_cost: None,
        })
    }

    fn with(settings: Settings) -> Self {
        let now = tokio::time::Instant::now();
        let budget = settings.cpu_budget.map(|rate| CpuBudget::new(rate, now));
        let limit = settings.adaptive.map(|(min, max, tolerance)| {
            AdaptiveLimit::new(settings.capacity, min, max, tolerance, now)
        });
        Self {
            admission: Arc::new(Mutex::new(Admission::new(
                settings.capacity,
                settings.max_queue,
                budget,
                limit,
            ))),
            predictor: Arc::default(),
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

    /// A budget of `ms_per_second` milliseconds of CPU per second for the
    /// handlers (1 000 is one core; leave room for the server's own work):
    /// a request also waits while the budget is in debt. Bursts of a
    /// twentieth of a second of budget start at once after a quiet spell.
    pub fn cpu_budget(self, ms_per_second: f64) -> Self {
        self.map(|settings| settings.cpu_budget = Some(ms_per_second))
    }

    /// Names each request's class, whose cost is predicted from its own
    /// recent requests (default: the path). Also measures requests when
    /// the layer has no CPU budget. At most [`MAX_CLASSES`] are kept apart.
    pub fn classify(
        self,
        classify: impl Fn(&Uri, &HeaderMap) -> String + Send + Sync + 'static,
    ) -> Self {
        let classify: Arc<Classify> = Arc::new(classify);
        self.map(move |settings| settings.classify = Some(classify))
    }

    /// For a layer in front of another process (`charon throttle`), whose
    /// CPU it cannot measure: a request's cost is what its response reports
    /// in `header` (milliseconds, such as `x-cpu-ms: 12.5`), or, without
    /// one, the time until its response headers came. What the budget and
    /// the predictions count then.
    pub fn reported_cost(self, header: HeaderName) -> Self {
        self.map(move |settings| settings.reported_cost = Some(header))
    }

    /// Lets the concurrency limit adapt between `min` and `max`, starting
    /// at the layer's capacity: raised while requests take at most twice
    /// the no-load latency, cut by a tenth when one takes longer
    /// (docs/design.md#an-adaptive-limit).
    pub fn adaptive_limit(self, min: usize, max: usize) -> Self {
        self.map(|settings| settings.adaptive = Some((min, max, 2.0)))
    }

    /// The concurrency limit now: the capacity, or where the adaptive limit
    /// has moved it.
    pub fn limit(&self) -> usize {
        queue::lock(&self.admission).capacity()
    }

    /// What the layer counted (shared by its services).
    pub fn counts(&self) -> Arc<ThrottleCounts> {
        self.settings.counts.clone()
    }

    /// Each class's predicted and measured CPU cost (empty unless the
    /// layer measures: with a CPU budget or a classifier).
    pub fn costs(&self) -> Vec<ClassCost> {
        queue::lock(&self.predictor).costs()
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttle::new(
            inner,
            self.settings.clone(),
            self.admission.clone(),
            self.predictor.clone(),
        )
    }
}
