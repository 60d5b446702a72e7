//! The Charon API (`proto/charon/v1/charon.proto`): the unary `Request` and
//! the `Session` stream, on the same gRPC port as Envoy's service: a thin
//! face over the [`Service`] (which decides; [`crate::service::session`]
//! owns a session's life and its hold set), with `GetCapacity`,
//! `ReleaseCapacity`, `WatchCapacity` (nudges to the levels below) and
//! `Cost` (reservations on cost budgets) beside them. This file counts open sessions against
//! `--max-sessions` and reports them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::api::v1::charon_server::Charon;
use crate::api::v1::{
    CapacityNudge, CostAnswer, CostRequest, GetCapacityRequest, GetCapacityResponse,
    ReleaseCapacityRequest, ReleaseCapacityResponse, RequestAnswer, RequestOp, SessionRequest,
    SessionResponse, WatchCapacityRequest,
};

use super::metrics::Metrics;
use super::trace::TraceSampler;
use crate::api::capacity_response;
use crate::service::OperationEvent;
use crate::service::Service;
use crate::service::cost::{CostCall, CostOperation};
use crate::service::ops::{GetCapacity, RateRequest, ReleaseCapacity};
use crate::service::session::Session;
use tracing::Instrument;

/// The gRPC service.
pub struct ApiService {
    service: Arc<Service>,
    metrics: Arc<Metrics>,
    sessions: Arc<AtomicUsize>,
    max_sessions: usize,
    shutdown: watch::Receiver<bool>,
    traces: TraceSampler,
}

impl ApiService {
    pub fn new(
        service: Arc<Service>,
        metrics: Arc<Metrics>,
        max_sessions: usize,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Self {
            service,
            metrics,
            sessions: Arc::new(AtomicUsize::new(0)),
            max_sessions,
            shutdown,
            traces: TraceSampler::off(),
        }
    }

    /// Traces unary `Request`s as `traces` says (`--otlp-endpoint`).
    pub fn with_traces(mut self, traces: TraceSampler) -> Self {
        self.traces = traces;
        self
    }
}

impl ApiService {
    /// The number of open sessions (shutdown waits for it to reach zero).
    pub fn open_sessions(&self) -> Arc<AtomicUsize> {
        self.sessions.clone()
    }
}

/// One open session, counted until dropped.
pub struct SessionSlot(Arc<AtomicUsize>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tonic::async_trait]
impl Charon for ApiService {
    type SessionStream = ReceiverStream<Result<SessionResponse, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let open = self.sessions.fetch_add(1, Ordering::SeqCst);
        let slot = SessionSlot(self.sessions.clone());
        if open >= self.max_sessions {
            return Err(Status::resource_exhausted(format!(
                "this sidecar already serves {} sessions (--max-sessions)",
                self.max_sessions
            )));
        }
        self.metrics.set_sessions(open + 1);
        let (outbound, receiver) = mpsc::channel(64);
        let session = Session::new(self.service.clone());
        let shutdown = self.shutdown.clone();
        let metrics = self.metrics.clone();
        let sessions = self.sessions.clone();
        tokio::spawn(async move {
            super::session::run(session, request.into_inner(), outbound, shutdown).await;
            drop(slot);
            metrics.set_sessions(sessions.load(Ordering::SeqCst));
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let request = GetCapacity::try_from(request.into_inner())?;
        let leases = self.service.get_capacity(&request).await;
        Ok(Response::new(capacity_response(leases)))
    }

    type WatchCapacityStream = ReceiverStream<Result<CapacityNudge, Status>>;

    async fn watch_capacity(
        &self,
        request: Request<WatchCapacityRequest>,
    ) -> Result<Response<Self::WatchCapacityStream>, Status> {
        let mut nudges = self
            .service
            .leases
            .nudges
            .watch(&request.into_inner().client_id)?;
        let (outbound, receiver) = mpsc::channel(1);
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = nudges.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                    // The watcher goes when its client does.
                    () = outbound.closed() => return,
                    _ = shutdown.changed() => return,
                }
                let sequence = *nudges.borrow_and_update();
                // A nudge still unread says it all: this one may go.
                if let Err(mpsc::error::TrySendError::Closed(_)) =
                    outbound.try_send(Ok(CapacityNudge { sequence }))
                {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(receiver)))
    }

    async fn release_capacity(
        &self,
        request: Request<ReleaseCapacityRequest>,
    ) -> Result<Response<ReleaseCapacityResponse>, Status> {
        let request = ReleaseCapacity::try_from(request.into_inner())?;
        let released = self.service.release_capacity(&request).await?;
        Ok(Response::new(ReleaseCapacityResponse { released }))
    }

    async fn cost(&self, request: Request<CostRequest>) -> Result<Response<CostAnswer>, Status> {
        let operation = CostOperation::try_from(request.into_inner())?;
        let namespace = operation.namespace.clone();
        let (call, amount) = match &operation.call {
            CostCall::Reserve { amount, .. } => ("reserve", *amount),
            CostCall::Commit { actual, .. } => ("commit", *actual),
            CostCall::Cancel { .. } => ("cancel", 0),
            CostCall::Refund { amount, .. } => ("refund", *amount),
        };
        let reply = self.service.cost(operation).await;
        self.metrics.operation_answered(&OperationEvent {
            operation: "cost",
            namespace: &namespace,
            resource: call,
            domain: "",
            outcome: match &reply {
                Ok(reply) if !reply.applied => "rejected",
                Ok(_) => "ok",
                Err(error) => error.kind.as_str(),
            },
            amount,
        });
        Ok(Response::new(reply?.into()))
    }

    async fn request(
        &self,
        request: Request<RequestOp>,
    ) -> Result<Response<RequestAnswer>, Status> {
        let (metadata, _, op) = request.into_parts();
        let span = self
            .traces
            .charon_request(&metadata, &op.namespace, &op.resource);
        if span.is_none() {
            return self.answer_request(op).await;
        }
        let answer = self.answer_request(op).instrument(span.clone()).await;
        match &answer {
            Ok(answer) => {
                let answer = answer.get_ref();
                span.record(
                    "outcome",
                    if answer.granted > 0 {
                        "granted"
                    } else {
                        "rejected"
                    },
                );
                span.record("degraded", answer.degraded);
            }
            Err(status) => {
                span.record("outcome", "error");
                span.record("error", status.message());
            }
        }
        answer
    }
}

impl ApiService {
    /// The unary `Request`: parsed, decided, and back on the wire.
    async fn answer_request(&self, op: RequestOp) -> Result<Response<RequestAnswer>, Status> {
        let op = RateRequest::try_from(op)?;
        let answer = self.service.request(&op).await;
        self.metrics.operation_answered(&OperationEvent {
            operation: "request",
            namespace: &op.at.namespace,
            resource: &op.at.resource,
            domain: &op.at.domain,
            outcome: match &answer {
                Ok(answer) if answer.granted == 0 => "rejected",
                Ok(_) => "ok",
                Err(error) => error.kind.as_str(),
            },
            amount: answer.as_ref().map_or(0, |answer| answer.granted),
        });
        Ok(Response::new(answer?.into()))
    }
}
