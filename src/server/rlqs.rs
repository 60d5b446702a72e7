//! Envoy's Rate Limit Quota Service on the gRPC port
//! (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`,
//! docs/design.md#rlqs): each Envoy's stream of usage reports is answered
//! with a token bucket per bucket, its share of the bucket's limit, which
//! Envoy then enforces without a call per request. The apportioning is the
//! service's ([`crate::service::quota`]).
//!
//! Every report is answered for the buckets it names, so a share that
//! changed (an Envoy joined, left, or its demand moved) reaches each Envoy
//! at its next report. A bucket that no limit applies to (an unknown
//! domain, a bucket id that selects no limited descriptor) gets no
//! assignment: Envoy applies its configured no-assignment behaviour, the
//! bucket is counted, and the stream goes on. A bucket that had a share
//! and no longer selects a limit (the configuration changed) is abandoned.
//! When the stream ends, its shares go back to the other Envoys at once.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::service::Service;
use crate::service::error::Kind;
use crate::service::quota::{Bucket, Quota};

use super::metrics::Metrics;

/// The most distinct buckets one stream may report (past it, new ones get
/// no assignment).
pub const MAX_BUCKETS: usize = 10_000;

/// The RLQS face of a sidecar.
#[derive(Clone)]
pub struct RlqsService {
    service: Arc<Service>,
    metrics: Arc<Metrics>,
    /// Names this sidecar's streams in the shared lease state.
    prefix: String,
    streams: Arc<AtomicU64>,
}

impl RlqsService {
    pub fn new(service: Arc<Service>, metrics: Arc<Metrics>) -> Self {
        let mut random = [0u8; 8];
        // A fixed prefix if the system has no randomness: streams of one
        // sidecar are still told apart by their number.
        let _ = getrandom::fill(&mut random);
        Self {
            service,
            metrics,
            prefix: format!("rlqs-{:016x}", u64::from_le_bytes(random)),
            streams: Arc::default(),
        }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let number = self.streams.fetch_add(1, Ordering::Relaxed);
        let stream = EnvoyStream {
            face: self.clone(),
            client: format!("{}-{number}", self.prefix),
            namespace: None,
            assigned: HashMap::new(),
        };
        let (answers, receiver) = mpsc::channel(16);
        tokio::spawn(stream.run(request.into_inner(), answers));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// One Envoy's stream.
struct EnvoyStream {
    face: RlqsService,
    /// This Envoy, in the lease state.
    client: String,
    /// From the first report that names one.
    namespace: Option<String>,
    /// The buckets it has a share of, by name.
    assigned: HashMap<String, Bucket>,
}

impl EnvoyStream {
    async fn run(
        mut self,
        mut reports: Streaming<RateLimitQuotaUsageReports>,
        answers: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    ) {
        loop {
            let report = tokio::select! {
                report = reports.message() => report,
                () = answers.closed() => break,
            };
            let report = match report {
                Ok(Some(report)) => report,
                // The Envoy closed its side, went away, or sent garbage.
                Ok(None) | Err(_) => break,
            };
            let actions = self.answer(report).await;
            if !actions.is_empty() {
                let response = RateLimitQuotaResponse {
                    bucket_action: actions,
                };
                if answers.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        }
        if let Some(namespace) = &self.namespace {
            for bucket in self.assigned.values() {
                self.face
                    .service
                    .quota_gone(namespace, bucket, &self.client)
                    .await;
            }
        }
    }

    async fn answer(&mut self, report: RateLimitQuotaUsageReports) -> Vec<BucketAction> {
        if !report.domain.is_empty() && self.namespace.is_none() {
            self.namespace = Some(report.domain);
        }
        let metrics = &self.face.metrics;
        let Some(namespace) = self.namespace.clone() else {
            for _ in &report.bucket_quota_usages {
                metrics.quota_bucket("malformed");
            }
            return Vec::new();
        };
        let mut actions = Vec::new();
        for usage in report.bucket_quota_usages {
            let Some(id) = usage.bucket_id.clone() else {
                metrics.quota_bucket("malformed");
                continue;
            };
            let bucket = Bucket::new(id.bucket.clone());
            if self.assigned.len() >= MAX_BUCKETS && !self.assigned.contains_key(&bucket.name) {
                metrics.quota_bucket("malformed");
                continue;
            }
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            let elapsed = usage.time_elapsed.map_or(Duration::ZERO, |d| {
                // Negative or out of range: as if unset.
                let seconds = u64::try_from(d.seconds).unwrap_or(0);
                let nanos = u32::try_from(d.nanos).unwrap_or(0).min(999_999_999);
                Duration::new(seconds, nanos)
            });
            let quota = self
                .face
                .service
                .quota(&namespace, &bucket, &self.client, requests, elapsed)
                .await;
            let action = match quota {
                Ok(Quota::NotLimited) => {
                    if let Some(bucket) = self.assigned.remove(&bucket.name) {
                        // It had a share; no limit applies any more.
                        self.face
                            .service
                            .quota_gone(&namespace, &bucket, &self.client)
                            .await;
                        metrics.quota_bucket("abandoned");
                        Some(Action::AbandonAction(AbandonAction {}))
                    } else {
                        metrics.quota_bucket("no_limit");
                        None
                    }
                }
                Ok(quota) => {
                    metrics.quota_bucket(match quota {
                        Quota::Unlimited { .. } => "unlimited",
                        _ => "assigned",
                    });
                    self.assigned.insert(bucket.name.clone(), bucket);
                    Some(Action::QuotaAssignmentAction(assignment(quota)))
                }
                Err(error) => {
                    metrics.quota_bucket(match error.kind {
                        Kind::UnknownResource => "unknown_domain",
                        Kind::Malformed => "malformed",
                        _ => "store_error",
                    });
                    tracing::debug!(%error, "an RLQS bucket got no assignment");
                    None
                }
            };
            if let Some(action) = action {
                actions.push(BucketAction {
                    bucket_id: Some(BucketId { bucket: id.bucket }),
                    bucket_action: Some(action),
                });
            }
        }
        actions
    }
}

fn duration(duration: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

fn assignment(quota: Quota) -> QuotaAssignmentAction {
    let (strategy, ttl) = match quota {
        Quota::Assigned {
            tokens_per_fill: 0,
            ttl,
            ..
        } => (Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl),
        Quota::Assigned {
            max_tokens,
            tokens_per_fill,
            fill_interval,
            ttl,
        } => (
            Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(envoy_types::pb::google::protobuf::UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(duration(fill_interval)),
            }),
            ttl,
        ),
        Quota::Unlimited { ttl } => (Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl),
        // Answered by abandoning the bucket, not with an assignment.
        Quota::NotLimited => (
            Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            crate::service::quota::LEASE,
        ),
    };
    QuotaAssignmentAction {
        assignment_time_to_live: Some(duration(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    }
}
