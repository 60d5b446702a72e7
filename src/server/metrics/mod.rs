//! Prometheus metrics. Labels are bounded: namespaces come from the
//! configuration (unknown ones are labelled `unknown`), never domains; keys
//! that requests shape (a `detailed_metric` limit, an unconfigured resource)
//! stop at a cap of distinct values and fold into `overflow` past it.

mod events;
pub mod exposition;
mod hooks;
mod labels;
mod series_cap;
pub mod upstream;

pub use self::events::MAX_DOMAIN_SERIES;
pub use self::exposition::MetricsOptions;
pub use self::labels::*;

use self::events::DomainView;
use self::series_cap::SeriesCap;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Every metric the sidecar exports.
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    latency: Histogram,
    reloads: Family<ReloadLabels, Counter>,
    namespaces: Gauge,
    store_keys: Gauge,
    store_max_keys: Gauge,
    store_unrecorded: Gauge,
    store_reachable: Gauge,
    store_degraded: Counter,
    store_errors: Counter,
    store_outages: Counter,
    sessions: Gauge,
    soft_limit_warnings: Family<NamespaceLabel, Counter>,
    global_shadow: Family<NamespaceLabel, Counter>,
    limit_hits: Family<LimitLabels, Counter>,
    tier_hits: Family<TierLabels, Counter>,
    /// The limit keys counted so far (each starts with its namespace).
    limit_keys: SeriesCap,
    limit_folds: Counter,
    unconfigured_hits: Family<ResourceLabels, Counter>,
    /// The unconfigured resources counted so far.
    unconfigured_keys: SeriesCap,
    unconfigured_folds: Counter,
    /// Each configured limit's requests per unit (set at each scrape).
    configured_limits: Family<ConfiguredLimitLabels, Gauge>,
    copy_operations: Family<CopyOperationLabels, Counter>,
    copy_serving: Gauge,
    copies_held: Family<CopyResourceLabels, Gauge>,
    global_shares: Family<CopyResourceLabels, Gauge>,
    global_shares_lent: Family<CopyResourceLabels, Gauge>,
    global_on_safe_share: Family<CopyResourceLabels, Gauge>,
    overloads: Family<PolicyLabels, Counter>,
    quota_buckets: Family<QuotaLabels, Counter>,
    copy_log_events: Family<CopyLogEventLabels, Counter>,
    copies_held_by_group: Family<CopyGroupLabels, Gauge>,
    transfers_staged: Family<CopyResourceLabels, Gauge>,
    store_calls: Family<StoreCallLabels, Histogram, fn() -> Histogram>,
    /// Every face's sampled decisions, on the log stream.
    decision_log: Arc<crate::server::decision_log::DecisionLog>,
    /// The Charon API's operations per domain, capped.
    domains: DomainView,
    /// The `process_*` series, under no prefix.
    process: Registry,
    /// envoyproxy/ratelimit's series, when asked for (`--upstream-metrics`).
    upstream: Option<upstream::UpstreamMetrics>,
}

/// Distinct limit keys the per-limit metrics keep before folding new ones
/// into `overflow`: a `detailed_metric` limit can see unbounded values.
pub const MAX_LIMIT_SERIES: usize = 10_000;

/// Distinct unconfigured resources (`allow_unconfigured`) counted before new
/// ones fold into `overflow`: clients name them.
pub const MAX_UNCONFIGURED_SERIES: usize = 1_000;

/// 50 µs .. ~0.8 s: a loopback call, up to well past any sane deadline.
fn store_call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
}

impl Metrics {
    pub fn new() -> Self {
        Self::with_decision_log(crate::server::decision_log::DecisionLogOptions::default())
    }

    /// Metrics, and the decision log every face writes to.
    pub fn with_decision_log(options: crate::server::decision_log::DecisionLogOptions) -> Self {
        Self::build(options, &MetricsOptions::default())
    }

    /// Metrics with the decision log every face writes to and, if asked
    /// for, envoyproxy/ratelimit's series (what their mapper file changes
    /// and Charon does not follow, logged), shared by the faces.
    pub fn serving(
        options: crate::server::decision_log::DecisionLogOptions,
        served: &MetricsOptions,
    ) -> Arc<Self> {
        Arc::new(Self::build(options, served))
    }

    fn build(
        options: crate::server::decision_log::DecisionLogOptions,
        served: &MetricsOptions,
    ) -> Self {
        let upstream = served.upstream.as_ref();
        for note in upstream.iter().flat_map(|mapper| &mapper.notes) {
            tracing::warn!("PROMETHEUS_MAPPER_YAML: {note}");
        }
        let mut process = Registry::default();
        crate::kit::process::register(&mut process);
        let mut registry = Registry::with_prefix("charon");
        let domains = DomainView::register(&mut registry);
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "ShouldRateLimit answers by namespace and result",
            decisions.clone(),
        );
        // 10 µs .. ~0.33 s
        let latency = Histogram::new(exponential_buckets(0.000_01, 2.0, 16));
        registry.register(
            "decision_latency_seconds",
            "Time to answer one ShouldRateLimit, store included",
            latency.clone(),
        );
        let reloads = Family::<ReloadLabels, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads by result (a rejected one keeps the previous configuration)",
            reloads.clone(),
        );
        let namespaces = Gauge::default();
        registry.register(
            "config_namespaces",
            "Namespaces in the running configuration",
            namespaces.clone(),
        );
        let store_keys = Gauge::default();
        registry.register(
            "store_keys",
            "Keys holding state in the memory store (with Redis: its local fallback)",
            store_keys.clone(),
        );
        let store_max_keys = Gauge::default();
        registry.register(
            "store_max_keys",
            "The memory store's cap on keys (--max-keys)",
            store_max_keys.clone(),
        );
        let store_unrecorded = Gauge::default();
        registry.register(
            "store_unrecorded_decisions",
            "Decisions, since start, whose new state was not kept because the store was full",
            store_unrecorded.clone(),
        );
        let store_reachable = Gauge::default();
        registry.register(
            "store_reachable",
            "1 while the shared store (Redis) answers, 0 while answers come from --on-store-error",
            store_reachable.clone(),
        );
        let store_degraded = Counter::default();
        registry.register(
            "store_degraded_decisions",
            "Decisions answered by --on-store-error instead of the shared store",
            store_degraded.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Shared-store calls that failed or missed --store-timeout",
            store_errors.clone(),
        );
        let store_outages = Counter::default();
        registry.register(
            "store_outages",
            "Times the shared store became unreachable (the circuit breaker opened)",
            store_outages.clone(),
        );
        let soft_limit_warnings = Family::<NamespaceLabel, Counter>::default();
        let global_shadow = Family::<NamespaceLabel, Counter>::default();
        let limit_hits = Family::<LimitLabels, Counter>::default();
        registry.register(
            "limit_hits",
            "Hits per limit (envoyproxy/ratelimit's statistics key) by outcome: within_limit, near_limit (granted past 80% of the limit), over_limit, shadow_mode, refunded (given back: Envoy's is_negative_hits), unreturned (a concurrency limit's hits held past max_hold, never given back)",
            limit_hits.clone(),
        );
        let limit_folds = Counter::default();
        registry.register(
            "limit_series_folded",
            "Hits counted under limit=\"overflow\" because the limit label had reached its cap of distinct values",
            limit_folds.clone(),
        );
        registry.register(
            "global_shadow_mode",
            "Answers over their limits that --shadow-mode turned into OK, by namespace",
            global_shadow.clone(),
        );
        registry.register(
            "soft_limit_warnings",
            "Granted answers past a soft limit, by namespace",
            soft_limit_warnings.clone(),
        );
        let sessions = Gauge::default();
        registry.register("sessions", "Open Charon API sessions", sessions.clone());
        let configured_limits = Family::<ConfiguredLimitLabels, Gauge>::default();
        registry.register(
            "limit_requests_per_unit",
            "The requests per unit of each configured envoyproxy/ratelimit-style limit, by its statistics key (limit) and unit; past the cap of limit keys, not shown",
            configured_limits.clone(),
        );
        let copy_operations = Family::<CopyOperationLabels, Counter>::default();
        registry.register(
            "session_operations",
            "Charon API session operations by operation and result",
            copy_operations.clone(),
        );
        let store_calls =
            Family::<StoreCallLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                store_call_histogram,
            );
        registry.register(
            "store_call_duration_seconds",
            "Calls to the shared store (Redis) by operation and result, deadline included",
            store_calls.clone(),
        );
        let tier_hits = Family::<TierLabels, Counter>::default();
        registry.register(
            "tier_hits",
            "Hits per burst-tier limit (the statistics key; for the Charon API, the resource) by outcome, the tier they were decided in (0: none active) and what limited them: none, tier, hard or global",
            tier_hits.clone(),
        );
        let unconfigured_hits = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "unconfigured_hits",
            "Charon API hits on resources a namespace does not configure but allows (allow_unconfigured), by resource",
            unconfigured_hits.clone(),
        );
        let unconfigured_folds = Counter::default();
        registry.register(
            "unconfigured_series_folded",
            "Hits counted under resource=\"overflow\" because the unconfigured resources had reached their cap of distinct names",
            unconfigured_folds.clone(),
        );
        let overloads = Family::<PolicyLabels, Counter>::default();
        registry.register(
            "overload_answers",
            "ShouldRateLimit calls past --max-in-flight, answered at once by --on-overload (policy: allow or deny)",
            overloads.clone(),
        );
        let quota_buckets = Family::<QuotaLabels, Counter>::default();
        registry.register(
            "rlqs_buckets",
            "Buckets of RLQS usage reports, by what they were answered (assigned, unlimited, abandoned; no_limit, unknown_domain, malformed, too_large, too_many: past 10 000 buckets a stream, store_error: no assignment)",
            quota_buckets.clone(),
        );
        let copies_held = Family::<CopyResourceLabels, Gauge>::default();
        registry.register(
            "copies_held",
            "Copies held of each copy-limited resource, across its domains (read from the copy log at each scrape)",
            copies_held.clone(),
        );
        let global_shares = Family::<CopyResourceLabels, Gauge>::default();
        registry.register(
            "global_limit_share",
            "This server's share of each global limit (docs/design.md#global-limits), in requests per window; resource is rate_limit: and the descriptor path",
            global_shares.clone(),
        );
        let global_shares_lent = Family::<CopyResourceLabels, Gauge>::default();
        registry.register(
            "global_limit_share_lent",
            "How much of this server's share of each global limit is spare capacity lent beyond what it asked for (docs/design.md#global-limits), in requests per window",
            global_shares_lent.clone(),
        );
        let global_on_safe_share = Family::<CopyResourceLabels, Gauge>::default();
        registry.register(
            "global_limit_on_safe_share",
            "1 while this server decides a global limit on its safe share: its parent away and the last grant expired (docs/design.md#global-limits)",
            global_on_safe_share.clone(),
        );
        let copies_held_by_group = Family::<CopyGroupLabels, Gauge>::default();
        registry.register(
            "copies_held_by_group",
            "Copies held by the members of each group of a copy-limited resource",
            copies_held_by_group.clone(),
        );
        let transfers_staged = Family::<CopyResourceLabels, Gauge>::default();
        registry.register(
            "transfers_staged",
            "Transfers staged and not yet seized, per copy-limited resource (read from the copy log at each scrape)",
            transfers_staged.clone(),
        );
        let copy_log_events = Family::<CopyLogEventLabels, Counter>::default();
        registry.register(
            "copy_log_events",
            "The copy log's membership events: registered, resigned, reaped_sidecars, reaped_copies (copies released by reaping), expired_transfers",
            copy_log_events.clone(),
        );
        let copy_serving = Gauge::default();
        registry.register(
            "copy_log_registered",
            "1 while this sidecar is registered in the copy log and serves copy operations",
            copy_serving.clone(),
        );
        Self {
            registry,
            process,
            upstream: upstream.map(upstream::UpstreamMetrics::new),
            decision_log: Arc::new(crate::server::decision_log::DecisionLog::new(options)),
            domains,
            soft_limit_warnings,
            global_shadow,
            limit_hits,
            tier_hits,
            limit_keys: SeriesCap::new(MAX_LIMIT_SERIES),
            limit_folds,
            unconfigured_hits,
            unconfigured_keys: SeriesCap::new(MAX_UNCONFIGURED_SERIES),
            unconfigured_folds,
            configured_limits,
            sessions,
            copy_operations,
            copy_serving,
            copies_held,
            global_shares,
            global_shares_lent,
            global_on_safe_share,
            overloads,
            quota_buckets,
            copies_held_by_group,
            transfers_staged,
            copy_log_events,
            store_calls,
            store_reachable,
            store_degraded,
            store_errors,
            store_outages,
            decisions,
            latency,
            reloads,
            namespaces,
            store_keys,
            store_max_keys,
            store_unrecorded,
        }
    }

    /// One `ShouldRateLimit` answered: counted, timed, and, with upstream's
    /// series, an error counted as upstream's `should_rate_limit_error`.
    pub fn decision(&self, namespace: &str, result: Decision, elapsed: Duration) {
        if let Some(upstream) = &self.upstream {
            match result {
                Decision::InvalidArgument => upstream.error(upstream::ErrorType::Service),
                Decision::StoreError => upstream.error(upstream::ErrorType::Redis),
                Decision::Ok | Decision::OverLimit => {}
            }
        }
        self.decisions
            .get_or_create(&DecisionLabels {
                namespace: namespace.to_owned(),
                result,
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    pub fn reload(&self, result: ReloadResult) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
        if let Some(upstream) = &self.upstream {
            upstream.config_load(result == ReloadResult::Ok);
        }
    }

    pub fn set_namespaces(&self, count: usize) {
        self.namespaces
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn soft_limit_warning(&self, namespace: &str) {
        self.soft_limit_warnings
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_owned(),
            })
            .inc();
    }

    pub fn global_shadow(&self, namespace: &str) {
        self.global_shadow
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_owned(),
            })
            .inc();
    }

    /// Counts `hits` of the limit `key` of `namespace` as `outcome`; past
    /// [`MAX_LIMIT_SERIES`] distinct keys, new ones count as `overflow`.
    pub fn limit_hits(&self, namespace: &str, key: &str, outcome: LimitOutcome, hits: u64) {
        self.limit_hits
            .get_or_create(&LimitLabels {
                namespace: namespace.to_owned(),
                limit: self.limit_keys.label(key, &self.limit_folds),
                outcome,
            })
            .inc_by(hits);
    }

    /// Counts `hits` of the burst-tier limit `key` by outcome, the tier they
    /// were decided in and what limited them (under the same cap as
    /// [`limit_hits`](Self::limit_hits)).
    pub fn tier_hits(
        &self,
        namespace: &str,
        key: &str,
        outcome: LimitOutcome,
        (tier, limited_by): (usize, &'static str),
        hits: u64,
    ) {
        self.tier_hits
            .get_or_create(&TierLabels {
                namespace: namespace.to_owned(),
                limit: self.limit_keys.label(key, &self.limit_folds),
                outcome,
                tier: TierLabel(tier),
                limited_by,
            })
            .inc_by(hits);
    }

    /// A bucket of an RLQS report, and what it was answered.
    pub fn quota_bucket(&self, outcome: &'static str) {
        self.quota_buckets
            .get_or_create(&QuotaLabels { outcome })
            .inc();
    }

    /// A call answered by `--on-overload` without a decision.
    pub fn overload(&self, policy: &'static str) {
        self.overloads.get_or_create(&PolicyLabels { policy }).inc();
    }

    pub fn set_sessions(&self, open: usize) {
        self.sessions.set(i64::try_from(open).unwrap_or(i64::MAX));
    }

    pub fn session_operation(&self, operation: &'static str, result: &'static str) {
        self.copy_operations
            .get_or_create(&CopyOperationLabels { operation, result })
            .inc();
    }

    /// The decision log every face writes to.
    pub fn decision_log(&self) -> Arc<crate::server::decision_log::DecisionLog> {
        self.decision_log.clone()
    }

    pub fn set_copy_log_registered(&self, registered: bool) {
        self.copy_serving.set(i64::from(registered));
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!(%error, "cannot encode metrics");
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
