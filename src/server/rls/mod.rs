//! Envoy's `envoy.service.ratelimit.v3.RateLimitService`: translates the wire
//! request into a [`Limiter`] call and the answer back
//! (docs/design.md#envoy-answers), with what envoyproxy/ratelimit adds
//! around the decision: quota headers for the client (`headers`), dynamic
//! metadata (`metadata`), the same decision for `POST /json` callers and
//! `/rlconfig` on the admin port (`http`), the in-flight bound and what to
//! answer past it (`overload`), and its events in the sampled decision log
//! ([`crate::server::decision_log`], shared by every face). Everything here
//! serves Envoy's face only; no decision logic lives here.

mod headers;
pub mod http;
mod metadata;
pub mod overload;
mod wire;

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::limiter::{LimitError, Limiter};
use crate::store::Store;

use self::overload::{Admission, OnOverload};
use super::metrics::upstream::UpstreamMetrics;
use super::metrics::{Decision, LimitOutcome, Metrics};
use crate::server::decision_log::{self, DecisionLog};

pub use wire::SOFT_LIMIT_HEADER;

/// What the sidecar tells Envoy beyond the decision: envoyproxy/ratelimit's
/// process-wide switches for headers and dynamic metadata.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsOptions {
    pub headers: ResponseHeaders,
    /// Which descriptors the quota headers describe
    /// (`--response-headers-for`).
    pub headers_for: HeadersFor,
    /// Fill `dynamic_metadata` (upstream `RESPONSE_DYNAMIC_METADATA`).
    pub dynamic_metadata: bool,
    /// Name the deciding limit in `dynamic_metadata`
    /// (`--response-deciding-limit`).
    pub deciding_limit: bool,
    /// Which requests get a span (`--otlp-endpoint`).
    pub traces: super::trace::TraceSampler,
    /// Which decisions are logged (`--decision-log-sample`): the server
    /// builds the one decision log of every face from it
    /// ([`Metrics::with_decision_log`]).
    pub decision_log: decision_log::DecisionLogOptions,
    /// The bound on calls in flight, and the answer past it.
    pub overload: overload::OverloadOptions,
}

/// `--response-headers`: which headers Envoy is asked to add to the client's
/// response (`response_headers_to_add`), OK and OVER_LIMIT alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ResponseHeaders {
    #[default]
    None,
    /// upstream's `LIMIT_RESPONSE_HEADERS_ENABLED`: limit, remaining and
    /// reset (whole seconds) of the descriptor that decided.
    RateLimit(HeaderNames),
    /// draft-ietf-httpapi-ratelimit-headers-11 `RateLimit-Policy` and
    /// `RateLimit`, as the Tower layer writes them, and `Retry-After` (this
    /// request's wait, whole seconds rounded up) on OVER_LIMIT.
    Ietf,
}

/// `--response-headers-for`: which descriptors of a request the quota
/// headers describe (docs/envoy-compatibility.md#charons-flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeadersFor {
    /// The one that decided, as envoyproxy/ratelimit picks it.
    #[default]
    Deciding,
    /// Every descriptor that had a limit: with `ietf`, each its own policy
    /// in `RateLimit-Policy` (the deciding one's state in `RateLimit`);
    /// with `ratelimit`, every limit in the limit header after the deciding
    /// one's, as Envoy's own `X-RateLimit-Limit` lists them (remaining and
    /// reset stay the deciding one's).
    Every,
}

/// The header names of [`ResponseHeaders::RateLimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The gRPC service.
pub struct RlsService<S> {
    limiter: Arc<Limiter<S>>,
    metrics: Arc<Metrics>,
    options: Arc<RlsOptions>,
    decision_log: Arc<DecisionLog>,
    admission: Arc<Admission>,
}

impl<S> Clone for RlsService<S> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            metrics: self.metrics.clone(),
            options: self.options.clone(),
            decision_log: self.decision_log.clone(),
            admission: self.admission.clone(),
        }
    }
}

impl<S> RlsService<S> {
    pub fn new(limiter: Arc<Limiter<S>>, metrics: Arc<Metrics>, options: RlsOptions) -> Self {
        Self {
            limiter,
            metrics: metrics.clone(),
            decision_log: metrics.decision_log(),
            admission: Admission::new(options.overload),
            options: Arc::new(options),
        }
    }

    /// The limiter this service decides with.
    pub fn limiter(&self) -> &Arc<Limiter<S>> {
        &self.limiter
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // upstream's server interceptor times every call, answered or not;
        // without its series, no clock is read here.
        let Some(upstream) = self.metrics.upstream() else {
            return self.answer(request).await;
        };
        let started = Instant::now();
        let answer = self.answer(request).await;
        upstream.request(started.elapsed());
        answer
    }
}

impl<S: Store> RlsService<S> {
    async fn answer(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (metadata, _, request) = request.into_parts();
        let Some(_permit) = self.admission.enter() else {
            return Ok(Response::new(self.overloaded(&request)));
        };
        let span = self
            .options
            .traces
            .decision_span(&metadata, &request.domain);
        if span.is_none() {
            return self.decide(request).await.map(Response::new);
        }
        let answer = self.decide(request).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &answer {
                Ok(response) if response.overall_code == Code::OverLimit as i32 => "over_limit",
                Ok(_) => "ok",
                Err(status) => status_label(status.code()),
            },
        );
        answer.map(Response::new)
    }
}

impl<S: Store> RlsService<S> {
    /// One `ShouldRateLimit`, for gRPC and `POST /json` alike.
    pub async fn decide(&self, request: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let namespace = request.domain.clone();
        // Metrics label: the namespace when configured (bounded), else
        // `unknown`. A decision knows; errors (rare) look it up.
        let error_label = || {
            if self.limiter.config().namespace(&namespace).is_some() {
                namespace.as_str()
            } else {
                "unknown"
            }
        };
        let echo = self
            .options
            .dynamic_metadata
            .then(|| metadata::Echo::of(&request));
        let logged = self.decision_log.sample(&request);
        let request = match wire::from_wire(request) {
            Ok(request) => request,
            Err(message) => {
                self.metrics
                    .decision(error_label(), Decision::InvalidArgument, started.elapsed());
                return Err(Status::invalid_argument(message));
            }
        };
        match self.limiter.should_rate_limit(request).await {
            Ok(answer) => {
                let label = if answer.namespace_known {
                    namespace.as_str()
                } else {
                    "unknown"
                };
                let result = if answer.over_limit {
                    Decision::OverLimit
                } else {
                    Decision::Ok
                };
                if !answer.over_limit && answer.statuses.iter().any(|s| s.soft_limit_exceeded) {
                    self.metrics.soft_limit_warning(label);
                }
                if answer.shadowed {
                    self.metrics.global_shadow(label);
                }
                if answer.namespace_known {
                    count_limits(&self.metrics, label, &answer);
                }
                if let Some(upstream) = self.metrics.upstream() {
                    count_upstream(upstream, &answer);
                }
                if let Some(logged) = logged {
                    self.decision_log.record(logged, label, &answer);
                }
                self.metrics.decision(label, result, started.elapsed());
                let mut dynamic_metadata = echo.map(|echo| echo.into_struct(&answer));
                if self.options.deciding_limit
                    && let Some(deciding) = metadata::deciding_limit(&answer)
                {
                    dynamic_metadata
                        .get_or_insert_with(Default::default)
                        .fields
                        .insert("decidingLimit".to_owned(), deciding);
                }
                let mut response =
                    wire::to_wire(answer, &self.options.headers, self.options.headers_for);
                response.dynamic_metadata = dynamic_metadata;
                Ok(response)
            }
            Err(LimitError::InvalidArgument(message)) => {
                self.metrics
                    .decision(error_label(), Decision::InvalidArgument, started.elapsed());
                Err(Status::invalid_argument(message))
            }
            Err(LimitError::Store(error)) => {
                self.metrics
                    .decision(error_label(), Decision::StoreError, started.elapsed());
                tracing::warn!(%error, "store error");
                Err(Status::unavailable(error.to_string()))
            }
        }
    }
}

impl<S> RlsService<S> {
    /// The answer to a call past `--max-in-flight`: `--on-overload`'s, at
    /// once, for every descriptor.
    fn overloaded(&self, request: &RateLimitRequest) -> RateLimitResponse {
        let policy = self.admission.policy();
        self.metrics.overload(policy.as_str());
        let code = match policy {
            OnOverload::Allow => Code::Ok,
            OnOverload::Deny => Code::OverLimit,
        };
        RateLimitResponse {
            overall_code: code as i32,
            statuses: request
                .descriptors
                .iter()
                .map(|_| DescriptorStatus {
                    code: code as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// A failed answer's outcome in its span.
fn status_label(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "invalid_argument",
        tonic::Code::Unavailable => "unavailable",
        _ => "error",
    }
}

/// Counts each limit's hits by outcome, in hits as envoyproxy/ratelimit
/// does: granted (and, past 80% of the limit, near it), over, or over but
/// let through by shadow mode or `ignore_configured`; given back; held past
/// a concurrency limit's `max_hold`.
fn count_limits(metrics: &Metrics, namespace: &str, answer: &crate::limiter::RateLimitAnswer) {
    for status in &answer.statuses {
        let Some(key) = &status.stats_key else {
            continue;
        };
        let hits = status.hits.max(1);
        if status.unreturned > 0 {
            metrics.limit_hits(namespace, key, LimitOutcome::Unreturned, status.unreturned);
        }
        if status.refund {
            // No refund gives back more than its limit (a refund of
            // u64::MAX would wrap the counter).
            let limit = status.limit.as_ref().map_or(0, |l| l.requests_per_unit);
            metrics.limit_hits(
                namespace,
                key,
                LimitOutcome::Refunded,
                status.hits.min(limit),
            );
            continue;
        }
        let outcome = LimitOutcome::of(status.over_limit, status.shadowed);
        metrics.limit_hits(namespace, key, outcome, hits);
        if let Some(tiers) = &status.tiers {
            let at = (tiers.snapshot.tier, tiers.limited_by());
            metrics.tier_hits(namespace, key, outcome, at, hits);
        }
        let near = status.limit.as_ref().is_some_and(|limit| {
            let used = limit.requests_per_unit.saturating_sub(status.remaining);
            outcome == LimitOutcome::WithinLimit
                && used.saturating_mul(5) > limit.requests_per_unit.saturating_mul(4)
        });
        if near {
            metrics.limit_hits(namespace, key, LimitOutcome::NearLimit, hits);
        }
    }
}

/// envoyproxy/ratelimit's per-limit statistics of an answer
/// (docs/envoy-compatibility.md#metrics): each descriptor with a limit,
/// its hits split at the near-limit threshold and the limit from its count
/// before them; a refund adds its hits to `total_negative_hits` alone.
fn count_upstream(upstream: &UpstreamMetrics, answer: &crate::limiter::RateLimitAnswer) {
    if answer.shadowed {
        upstream.global_shadow();
    }
    for status in &answer.statuses {
        let (Some(key), Some(limit)) = (&status.stats_key, &status.limit) else {
            continue;
        };
        if status.refund {
            let split = super::metrics::upstream::Split {
                total_negative_hits: status.hits,
                ..Default::default()
            };
            upstream.count(key, split);
            continue;
        }
        let over = status.over_limit || status.shadowed;
        let split = super::metrics::upstream::split(
            limit.requests_per_unit,
            status.before,
            status.hits,
            over,
            status.shadowed,
        );
        upstream.count(key, split);
    }
}
