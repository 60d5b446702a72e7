//! envoyproxy/ratelimit's Prometheus series, with its names, labels and
//! meaning (docs/envoy-compatibility.md#metrics), beside Charon's own:
//! `ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,
//! within_limit,shadow_mode}{domain,key1,key2}` per limit (and
//! `total_negative_hits` for refunds, as upstream's PR #1140), the service's
//! `total_requests`, `response_time_seconds`, `should_rate_limit_error`,
//! `config_load_{success,error}` and `global_shadow_mode`, and the gauge
//! of each configured limit, `ratelimit_service_rate_limit_limit`.
//!
//! The hot path: a decision looks its limit's statistics key up in a map
//! under a read lock (the handle resolved at the key's first use) and adds
//! to at most five atomic counters; a new key takes the write lock once.
//! Label sets are capped as Charon's per-limit series are: past the cap,
//! new ones count in one `overflow` series, and the folds are counted.

mod mapper;
mod stat_name;

pub use self::mapper::Mapper;
pub use self::stat_name::{Split, StatLabels, near_threshold, sanitize, split};

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use crate::config::{Config, Leaf};

/// Distinct `{domain, key1, key2}` sets counted before new ones fold into
/// the overflow series (as `MAX_LIMIT_SERIES` caps Charon's own).
pub const MAX_UPSTREAM_SERIES: usize = 10_000;

/// Statistics keys remembered with their handle; past this, a new key's
/// labels are worked out at each decision (detailed_metric's keys are
/// shaped by requests, and fold into far fewer label sets).
const MAX_KEYS: usize = 4 * MAX_UPSTREAM_SERIES;

/// statsd_exporter's default histogram buckets (client_golang's
/// `DefBuckets`), which the response time is observed into.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The counters of one label set, in the order of [`STATS`].
#[derive(Default)]
struct LimitStats {
    counts: [AtomicU64; STATS.len()],
}

/// The per-limit families, in [`LimitStats::counts`] order.
const STATS: [&str; 6] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
    "total_negative_hits",
];

impl LimitStats {
    fn add(&self, split: Split) {
        let values = [
            split.total_hits,
            split.over_limit,
            split.near_limit,
            split.within_limit,
            split.shadow_mode,
            split.total_negative_hits,
        ];
        for (count, value) in self.counts.iter().zip(values) {
            if value > 0 {
                count.fetch_add(value, Ordering::Relaxed);
            }
        }
    }
}

/// The response time, as statsd_exporter keeps a histogram: whole
/// milliseconds observed (as upstream's timer reports them), scaled; each
/// bucket counts the calls that fall in it alone.
struct ResponseTime {
    scale: f64,
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ms: AtomicU64,
}

/// envoyproxy/ratelimit's series.
pub struct UpstreamMetrics {
    by_key: RwLock<HashMap<Arc<str>, Arc<LimitStats>, foldhash::fast::RandomState>>,
    by_labels: Mutex<BTreeMap<StatLabels, Arc<LimitStats>>>,
    overflow: Arc<LimitStats>,
    folded: AtomicU64,
    requests: AtomicU64,
    response_time: ResponseTime,
    redis_errors: AtomicU64,
    service_errors: AtomicU64,
    config_loads: AtomicU64,
    config_errors: AtomicU64,
    global_shadow: AtomicU64,
}

/// What an error answer counts in `should_rate_limit_error{err_type}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// The store failed (upstream's `redis_error`).
    Redis,
    /// The request was refused (upstream's `service_error`).
    Service,
}

impl UpstreamMetrics {
    /// The series, the response time scaled by `mapper`'s factor.
    pub fn new(mapper: &Mapper) -> Self {
        Self {
            by_key: RwLock::default(),
            by_labels: Mutex::default(),
            overflow: Arc::default(),
            folded: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            response_time: ResponseTime {
                scale: mapper.response_time_scale,
                buckets: Default::default(),
                count: AtomicU64::new(0),
                sum_ms: AtomicU64::new(0),
            },
            redis_errors: AtomicU64::new(0),
            service_errors: AtomicU64::new(0),
            config_loads: AtomicU64::new(0),
            config_errors: AtomicU64::new(0),
            global_shadow: AtomicU64::new(0),
        }
    }

    /// Adds one descriptor's `split` to its limit's statistics.
    pub fn count(&self, stats_key: &Arc<str>, split: Split) {
        // Added under the read lock: cloning the handle out would be two
        // more atomic operations on a line every decision shares.
        if let Some(stats) = self
            .by_key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&**stats_key)
        {
            stats.add(split);
            return;
        }
        self.resolve(stats_key).add(split);
    }

    /// The handle of a key seen for the first time: its label set's, or
    /// the overflow's past the cap.
    fn resolve(&self, stats_key: &Arc<str>) -> Arc<LimitStats> {
        let Some(labels) = StatLabels::of(stats_key) else {
            return self.overflow.clone();
        };
        let stats = {
            let mut by_labels = self
                .by_labels
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let len = by_labels.len();
            match by_labels.get(&labels) {
                Some(stats) => stats.clone(),
                None if len < MAX_UPSTREAM_SERIES => by_labels.entry(labels).or_default().clone(),
                None => {
                    self.folded.fetch_add(1, Ordering::Relaxed);
                    self.overflow.clone()
                }
            }
        };
        // Past the cap of keys remembered, the write lock is not taken:
        // decisions on keys requests keep making stay on read locks.
        let room = self
            .by_key
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < MAX_KEYS;
        if room {
            let mut by_key = self.by_key.write().unwrap_or_else(PoisonError::into_inner);
            if by_key.len() < MAX_KEYS {
                by_key.insert(stats_key.clone(), stats.clone());
            }
        }
        stats
    }

    /// One gRPC `ShouldRateLimit` answered in `elapsed` (upstream's server
    /// interceptor counts every call, overloaded ones too).
    pub fn request(&self, elapsed: Duration) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let time = &self.response_time;
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        let value = ms as f64 * time.scale;
        // One bucket counted per call; the cumulative counts are summed at
        // each scrape. Past the last bound, only `count` (`+Inf`) counts it.
        if let Some(bucket) = BUCKETS.iter().position(|bound| value <= *bound) {
            time.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        time.count.fetch_add(1, Ordering::Relaxed);
        time.sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    pub fn error(&self, kind: ErrorType) {
        let count = match kind {
            ErrorType::Redis => &self.redis_errors,
            ErrorType::Service => &self.service_errors,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// A configuration loaded (`ok`) or refused.
    pub fn config_load(&self, ok: bool) {
        let count = if ok {
            &self.config_loads
        } else {
            &self.config_errors
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// An answer over its limits that `--shadow-mode` turned into OK.
    pub fn global_shadow(&self) {
        self.global_shadow.fetch_add(1, Ordering::Relaxed);
    }

    /// The families as text: the classic format's (`openmetrics` false),
    /// counters under their bare names as statsd_exporter serves them, or
    /// OpenMetrics', where a counter's samples must end in `_total`, so
    /// they are typed `unknown` to keep the names dashboards query.
    pub fn encode(&self, config: &Config, openmetrics: bool, out: &mut String) {
        let counter = if openmetrics { "unknown" } else { "counter" };
        let by_labels = self
            .by_labels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(labels, stats)| (labels.clone(), stats.clone()))
            .collect::<Vec<_>>();
        let overflow = StatLabels {
            domain: "overflow".into(),
            key1: "overflow".into(),
            key2: None,
        };
        for (index, stat) in STATS.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let samples: Vec<(&StatLabels, u64)> = by_labels
                .iter()
                .map(|(labels, stats)| (labels, &**stats))
                .chain(std::iter::once((&overflow, &*self.overflow)))
                .map(|(labels, stats)| (labels, stats.counts[index].load(Ordering::Relaxed)))
                .filter(|(_, value)| *value > 0)
                .collect();
            if samples.is_empty() {
                continue;
            }
            family(out, &name, counter);
            for (labels, value) in samples {
                sample(out, &name, &limit_labels(labels), value);
            }
        }
        let limits = configured_limits(config);
        if !limits.is_empty() {
            let name = "ratelimit_service_rate_limit_limit";
            let _ = writeln!(
                out,
                "# HELP {name} The requests per unit of each configured limit (the tightest of those folded into one label set)."
            );
            let _ = writeln!(out, "# TYPE {name} gauge");
            for (labels, value) in &limits {
                sample(out, name, &limit_labels(labels), *value);
            }
        }
        let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
        let requests = load(&self.requests);
        if requests > 0 {
            let name = "ratelimit_service_total_requests";
            family(out, name, counter);
            sample(out, name, "grpc_method=\"ShouldRateLimit\"", requests);
            self.encode_response_time(out);
        }
        let errors = [
            ("redis_error", load(&self.redis_errors)),
            ("service_error", load(&self.service_errors)),
        ];
        if errors.iter().any(|(_, value)| *value > 0) {
            let name = "ratelimit_service_should_rate_limit_error";
            family(out, name, counter);
            for (kind, value) in errors.into_iter().filter(|(_, value)| *value > 0) {
                sample(out, name, &format!("err_type=\"{kind}\""), value);
            }
        }
        for (name, value) in [
            (
                "ratelimit_service_config_load_success",
                load(&self.config_loads),
            ),
            (
                "ratelimit_service_config_load_error",
                load(&self.config_errors),
            ),
            (
                "ratelimit_service_global_shadow_mode",
                load(&self.global_shadow),
            ),
        ] {
            if value > 0 {
                family(out, name, counter);
                sample(out, name, "", value);
            }
        }
        let name = "charon_upstream_series_folded";
        let _ = writeln!(
            out,
            "# HELP {name}{} Limits counted in the overflow series of ratelimit_service_rate_limit_* because the label sets had reached their cap.",
            if openmetrics { "" } else { "_total" }
        );
        let _ = writeln!(
            out,
            "# TYPE {name}{} counter",
            if openmetrics { "" } else { "_total" }
        );
        sample(
            out,
            "charon_upstream_series_folded_total",
            "",
            load(&self.folded),
        );
    }

    fn encode_response_time(&self, out: &mut String) {
        let time = &self.response_time;
        let name = "ratelimit_service_response_time_seconds";
        family(out, name, "histogram");
        let labels = "grpc_method=\"ShouldRateLimit\"";
        let mut cumulative = 0;
        for (bucket, bound) in time.buckets.iter().zip(BUCKETS) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let count = time.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = time.sum_ms.load(Ordering::Relaxed) as f64 * time.scale;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

fn family(out: &mut String, name: &str, kind: &str) {
    // statsd_exporter's help text for the families it makes.
    let _ = writeln!(
        out,
        "# HELP {name} Metric autogenerated by statsd_exporter."
    );
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, value: u64) {
    if labels.is_empty() {
        let _ = writeln!(out, "{name} {value}");
    } else {
        let _ = writeln!(out, "{name}{{{labels}}} {value}");
    }
}

fn limit_labels(labels: &StatLabels) -> String {
    let mut text = format!(
        "domain=\"{}\",key1=\"{}\"",
        escape(&labels.domain),
        escape(&labels.key1)
    );
    if let Some(key2) = &labels.key2 {
        let _ = write!(text, ",key2=\"{}\"", escape(key2));
    }
    text
}

/// A label value in the exposition formats: `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Each configured fixed-window limit's requests per unit, by the label
/// set its statistics key maps to (the smallest where several fold into
/// one), up to the series cap.
pub fn configured_limits(config: &Config) -> BTreeMap<StatLabels, u64> {
    let mut limits = BTreeMap::new();
    for namespace in config.namespaces() {
        namespace
            .descriptors
            .each_node(&namespace.name, &mut |key, node| {
                if let Leaf::Limit(limit) = &node.leaf
                    && let Some(labels) = StatLabels::of(key)
                    && (limits.len() < MAX_UPSTREAM_SERIES || limits.contains_key(&labels))
                {
                    let value = limits.entry(labels).or_insert(u64::MAX);
                    *value = (*value).min(limit.requests_per_unit);
                }
            });
    }
    limits
}

#[cfg(test)]
mod tests;
