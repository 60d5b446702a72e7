//! Envoy's Rate Limit Quota Service on the gRPC port
//! (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`,
//! docs/design.md#rlqs): each Envoy's stream of usage reports is answered
//! with a token bucket per bucket, its share of the bucket's limit, which
//! Envoy then enforces without a call per request. The apportioning is the
//! service's ([`crate::service::leases::quota`]).
//!
//! Every report is answered for the buckets it names. When a stream is new
//! to a bucket or its share moved, the service decides the other Envoys of
//! this sidecar reporting the bucket again and nudges them
//! ([`Service::settle_quota`]), through the same nudges as `WatchCapacity`:
//! each stream watches its own id, and a nudged one tells its Envoy what
//! changed at once (before the newcomer's answer, so that what they gave
//! back is free for it); a share that stayed costs the others nothing.
//! Every stream asks again for all its buckets each second, which renews
//! its leases and brings it the shares that moved on other sidecars of the
//! same Redis: a changed share reaches an Envoy here at once, elsewhere
//! within a second. A bucket that no limit
//! applies to (an unknown domain, a bucket id that selects no limited
//! descriptor) gets no assignment: Envoy applies its configured
//! no-assignment behaviour, the bucket is counted, and the stream goes on.
//! A bucket that had a share and no longer selects a limit (the
//! configuration changed) is abandoned. When the stream ends, its shares go
//! back to the other Envoys at once.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::service::Service;
use crate::service::error::Kind;
use crate::service::leases::quota::{
    Bucket, BucketAssignment, Demand, MAX_BUCKET_ID_BYTES, MAX_BUCKET_ID_ENTRIES,
};

use super::metrics::Metrics;

mod assignment;

use self::assignment::{assignment, described, paced};

/// The most distinct buckets one stream may report (past it, new ones get
/// no assignment).
pub const MAX_BUCKETS: usize = 10_000;

/// How often a stream asks again for all its buckets.
const REFRESH: Duration = Duration::from_secs(1);

type Answer = Result<RateLimitQuotaResponse, Status>;

/// A stream's share of one bucket.
struct Assigned {
    bucket: Bucket,
    id: BucketId,
    /// What it was taken to want, to ask with again.
    wants: Demand,
    /// What its Envoy was told last.
    told: BucketAssignment,
    /// When its Envoy last reported it.
    reported: Instant,
}

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

type Answers = Pin<Box<dyn Stream<Item = Answer> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        let number = self.streams.fetch_add(1, Ordering::Relaxed);
        let (answers, receiver) = mpsc::channel(64);
        let client = format!("{}-{number}", self.prefix);
        // Without a watch (too many watched ids), the stream still learns
        // of moved shares at its next refresh.
        let nudges = self.service.leases.nudges.watch(&client).ok();
        let stream = EnvoyStream {
            face: self.clone(),
            client,
            namespace: None,
            assigned: HashMap::new(),
            nudges,
            answers,
        };
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }
}

/// One Envoy's stream.
struct EnvoyStream {
    face: RlqsService,
    /// This Envoy, in the lease state and among the nudges' watchers.
    client: String,
    /// From the first report that names one.
    namespace: Option<String>,
    /// The buckets it has a share of, by name.
    assigned: HashMap<String, Assigned>,
    /// Changes when the service decided one of its shares again.
    nudges: Option<watch::Receiver<u64>>,
    answers: mpsc::Sender<Answer>,
}

/// Until `nudges` changes, or forever without a watch.
async fn nudged(nudges: &mut Option<watch::Receiver<u64>>) {
    match nudges {
        Some(receiver) => {
            if receiver.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

impl EnvoyStream {
    async fn run(mut self, mut reports: Streaming<RateLimitQuotaUsageReports>) {
        let mut refresh = tokio::time::interval(REFRESH);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let actions = tokio::select! {
                report = reports.message() => match report {
                    Ok(Some(report)) => self.answer(report).await,
                    // The Envoy closed its side, went away, or sent garbage.
                    Ok(None) | Err(_) => break,
                },
                _ = refresh.tick() => self.refresh().await,
                () = nudged(&mut self.nudges) => self.refresh().await,
                () = self.answers.closed() => break,
            };
            if !actions.is_empty() {
                let response = RateLimitQuotaResponse {
                    bucket_action: actions,
                };
                if self.answers.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        }
        self.end().await;
    }

    /// The stream is over: its shares go back, and the others of each
    /// bucket get them now.
    async fn end(&mut self) {
        // No nudge for a stream that is gone.
        self.nudges = None;
        let Some(namespace) = self.namespace.clone() else {
            return;
        };
        let buckets: Vec<Bucket> = self
            .assigned
            .drain()
            .map(|(_, assigned)| assigned.bucket)
            .collect();
        for bucket in &buckets {
            self.face
                .service
                .quota_gone(&namespace, bucket, &self.client)
                .await;
        }
    }

    async fn answer(&mut self, report: RateLimitQuotaUsageReports) -> Vec<BucketAction> {
        if !report.domain.is_empty() && self.namespace.is_none() {
            self.namespace = Some(report.domain);
        }
        let metrics = self.face.metrics.clone();
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
            if id.bucket.len() > MAX_BUCKET_ID_ENTRIES
                || id.bucket.iter().any(|(key, value)| {
                    key.len() > MAX_BUCKET_ID_BYTES || value.len() > MAX_BUCKET_ID_BYTES
                })
            {
                metrics.quota_bucket("too_large");
                continue;
            }
            let bucket = Bucket::new(id.bucket.clone());
            if self.assigned.len() >= MAX_BUCKETS && !self.assigned.contains_key(&bucket.name) {
                metrics.quota_bucket("too_many");
                continue;
            }
            let elapsed = usage.time_elapsed.map_or(Duration::ZERO, |d| {
                // Negative or out of range: as if unset.
                let seconds = u64::try_from(d.seconds).unwrap_or(0);
                let nanos = u32::try_from(d.nanos).unwrap_or(0).min(999_999_999);
                Duration::new(seconds, nanos)
            });
            // Envoy says whole seconds (4 for 4.9): the time since its
            // previous report of the bucket by this server's clock, if more.
            let now = Instant::now();
            let elapsed = self.assigned.get(&bucket.name).map_or(elapsed, |assigned| {
                elapsed.max(now.duration_since(assigned.reported))
            });
            let demand = Demand::Measured {
                requests: usage
                    .num_requests_allowed
                    .saturating_add(usage.num_requests_denied),
                elapsed,
            };
            if let Some(action) = self.decide(&namespace, bucket, id, demand, now).await {
                actions.push(action);
            }
        }
        actions
    }

    /// Asks again for every bucket, with what each was taken to want:
    /// renews the leases, and brings the shares that moved (here, decided
    /// again by the service; elsewhere, on the same Redis).
    async fn refresh(&mut self) -> Vec<BucketAction> {
        let Some(namespace) = self.namespace.clone() else {
            return Vec::new();
        };
        let held: Vec<(Bucket, BucketId, Demand, Instant)> = self
            .assigned
            .values()
            .map(|assigned| {
                (
                    assigned.bucket.clone(),
                    assigned.id.clone(),
                    assigned.wants,
                    assigned.reported,
                )
            })
            .collect();
        let mut actions = Vec::new();
        for (bucket, id, wants, reported) in held {
            let before = self.assigned.get(&bucket.name).map(|a| a.told);
            let action = self
                .decide(&namespace, bucket.clone(), id, wants, reported)
                .await;
            // Only what changed is said again.
            if let Some(action) = action {
                let now = self.assigned.get(&bucket.name).map(|a| a.told);
                if now != before {
                    actions.push(action);
                }
            }
        }
        actions
    }

    /// Decides `bucket` for this stream, lets the others of this sidecar
    /// that report it follow, and says what this stream is told.
    async fn decide(
        &mut self,
        namespace: &str,
        bucket: Bucket,
        id: BucketId,
        demand: Demand,
        reported: Instant,
    ) -> Option<BucketAction> {
        let metrics = self.face.metrics.clone();
        let service = self.face.service.clone();
        let decided = service
            .quota(namespace, &bucket, &self.client, demand)
            .await;
        tracing::debug!(
            client = %self.client,
            bucket = %bucket.name,
            ?demand,
            ?decided,
            "RLQS bucket"
        );
        let action = match decided {
            Ok((BucketAssignment::NotLimited, _)) => {
                if let Some(assigned) = self.assigned.remove(&bucket.name) {
                    // It had a share; no limit applies any more.
                    service
                        .quota_gone(namespace, &assigned.bucket, &self.client)
                        .await;
                    metrics.quota_bucket("abandoned");
                    Some(Action::AbandonAction(AbandonAction {}))
                } else {
                    metrics.quota_bucket("no_limit");
                    None
                }
            }
            Ok((quota, wants)) => {
                metrics.quota_bucket(match quota {
                    BucketAssignment::Unlimited { .. } => "unlimited",
                    _ => "assigned",
                });
                let before = self.assigned.get(&bucket.name).map(|a| a.told);
                // A newcomer, or a share that moved: the others follow, and
                // what they give back may be this one's. A share that stayed
                // costs the others nothing.
                let others = if before == Some(quota) {
                    0
                } else {
                    service.settle_quota(namespace, &bucket, &self.client).await
                };
                let quota = if others > 0 {
                    service
                        .quota(namespace, &bucket, &self.client, wants)
                        .await
                        .map_or(quota, |(again, _)| again)
                } else {
                    quota
                };
                let quota = paced(&service, namespace, &bucket, before, quota);
                if before != Some(quota) {
                    // What Envoy is told, after pacing: the line above is
                    // what the share was before it.
                    tracing::debug!(
                        client = %self.client,
                        bucket = %bucket.name,
                        told = ?quota,
                        "RLQS assignment"
                    );
                    let (outcome, per_second) = described(quota);
                    metrics.rlqs_assignment(
                        namespace,
                        &bucket.name,
                        &self.client,
                        outcome,
                        per_second,
                    );
                }
                self.assigned.insert(
                    bucket.name.clone(),
                    Assigned {
                        bucket,
                        id: id.clone(),
                        wants,
                        told: quota,
                        reported,
                    },
                );
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
        action.map(|action| BucketAction {
            bucket_id: Some(id),
            bucket_action: Some(action),
        })
    }
}
