//! What the client talks to: one session of the Charon API, remote or in
//! the process. A [`Backend`] sends one operation and returns its answer;
//! the client builds retries, fail-open and hold guards on top, the same for
//! every backend.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{
    CostAnswer, CostRequest, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest,
    ReleaseCapacityResponse, ReleaseOp, RequestOp, ReserveOp,
};
use crate::limiter::RateLimitRequest;

use super::{ClientError, LimitsAnswer};

/// The answer to one operation, and the session that answered it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub answer: Answer,
    /// Holds belong to the session that made them: when it ends, the server
    /// releases them, and a later release must not be sent.
    pub session: u64,
}

/// No answer: the backend is unreachable, or its session ended before it
/// answered. A server error: the client fails open
/// (docs/design.md#fail-open).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreachable(pub String);

/// The future of [`Backend::call`].
pub type BackendFuture<'a> = Pin<Box<dyn Future<Output = Result<Reply, Unreachable>> + Send + 'a>>;

/// The future of [`Backend::should_rate_limit`]: the answer,
/// [`ClientError::Invalid`] for a request the backend refuses as it is, or
/// [`ClientError::Unavailable`] when it cannot answer (the client fails
/// open).
pub type LimitsFuture<'a> =
    Pin<Box<dyn Future<Output = Result<LimitsAnswer, ClientError>> + Send + 'a>>;

/// The future of [`Backend::get_capacity`] and
/// [`Backend::release_capacity`]: the answer, or why there is none.
pub type CapacityFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, ClientError>> + Send + 'a>>;

/// The nudges of [`Backend::watch_capacity`]: an item each time the server
/// asks this client id to renew its leases now; the stream ends (or fails)
/// when the watch does.
pub type NudgeStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<(), ClientError>> + Send>>;

/// One Charon API session: the remote [`Sidecar`](super::Sidecar), the
/// in-process [`Embedded`](super::Embedded) engine, or your own.
pub trait Backend: Send + Sync + 'static {
    /// Sends `op` in the session and waits for its answer. Dropping the
    /// future must not leak copies: an answer that arrives for nobody is
    /// undone (see [`undo`]).
    fn call(&self, op: Op) -> BackendFuture<'_>;

    /// Hits on a rate-limited resource: [`call`](Backend::call) with
    /// `Op::Request`, unless the backend has a shorter way.
    fn request(&self, op: RequestOp) -> BackendFuture<'_> {
        self.call(Op::Request(op))
    }

    /// Envoy-style descriptors, decided as one request
    /// (docs/design.md#envoy-answers). A backend that cannot says so.
    fn should_rate_limit(&self, request: RateLimitRequest) -> LimitsFuture<'_> {
        let _ = request;
        Box::pin(std::future::ready(Err(ClientError::Unavailable(
            "this backend does not decide descriptors".into(),
        ))))
    }

    /// Whether `request`'s descriptors would pass, each asking for 0 hits
    /// whatever it says; the request stays the caller's (to charge it
    /// later). [`should_rate_limit`](Backend::should_rate_limit) on a
    /// copy, unless the backend has a shorter way.
    fn check<'a>(&'a self, request: &'a RateLimitRequest) -> LimitsFuture<'a> {
        let checks = RateLimitRequest {
            domain: request.domain.clone(),
            descriptors: request
                .descriptors
                .iter()
                .map(|descriptor| crate::limiter::Descriptor {
                    hits_addend: Some(0),
                    refund: false,
                    ..descriptor.clone()
                })
                .collect(),
            hits_addend: 0,
        };
        self.should_rate_limit(checks)
    }

    /// Descriptors whose answer nobody reads (a cost charged after the
    /// response): [`should_rate_limit`](Backend::should_rate_limit), its
    /// answer dropped, unless the backend has a shorter way.
    fn charge(&self, request: RateLimitRequest) -> CapacityFuture<'_, ()> {
        let answered = self.should_rate_limit(request);
        Box::pin(async move { answered.await.map(drop) })
    }

    /// [`charge`](Backend::charge) within this call, when the backend
    /// decides in the process; `None` (nothing done) when it cannot.
    fn charge_now(&self, request: &RateLimitRequest) -> Option<Result<(), ClientError>> {
        let _ = request;
        None
    }

    /// Capacity leases (docs/design.md#capacity-leases): the share of each
    /// resource this client is granted now. A backend that cannot says so.
    fn get_capacity(&self, request: GetCapacityRequest) -> CapacityFuture<'_, GetCapacityResponse> {
        let _ = request;
        Box::pin(std::future::ready(Err(ClientError::Unavailable(
            "this backend does not lease capacity".into(),
        ))))
    }

    /// Gives leases back before they expire.
    fn release_capacity(
        &self,
        request: ReleaseCapacityRequest,
    ) -> CapacityFuture<'_, ReleaseCapacityResponse> {
        let _ = request;
        Box::pin(std::future::ready(Err(ClientError::Unavailable(
            "this backend does not lease capacity".into(),
        ))))
    }

    /// Watches `client_id`'s leases (docs/design.md#a-hierarchy-of-servers):
    /// the server nudges it when one must shrink, or a share it waits for
    /// is free. A backend that cannot says so.
    fn watch_capacity(&self, client_id: String) -> CapacityFuture<'_, NudgeStream> {
        let _ = client_id;
        Box::pin(std::future::ready(Err(ClientError::Unavailable(
            "this backend does not push nudges".into(),
        ))))
    }

    /// Reservations on cost budgets (docs/design.md#reservations). A
    /// backend that cannot says so.
    fn cost(&self, request: CostRequest) -> CapacityFuture<'_, CostAnswer> {
        let _ = request;
        Box::pin(std::future::ready(Err(ClientError::Unavailable(
            "this backend does not keep cost budgets".into(),
        ))))
    }

    /// The session operations go to now.
    fn session(&self) -> u64;

    /// Waits (up to `timeout`) until calls can be answered; false if they
    /// cannot yet. A backend that is always ready says so at once.
    fn ready(&self, timeout: Duration) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        let _ = timeout;
        Box::pin(std::future::ready(true))
    }
}

/// The receiving end of one call's answer. If the caller gives up (drops
/// the call) while the answer is on its way, `on_lost` gets it: an answer
/// that arrives just as the caller leaves is never silently dropped.
pub(crate) struct Awaited {
    receiver: Option<oneshot::Receiver<Answer>>,
    on_lost: Option<Box<dyn FnOnce(Answer) + Send>>,
}

impl Awaited {
    pub(crate) fn new(
        receiver: oneshot::Receiver<Answer>,
        on_lost: impl FnOnce(Answer) + Send + 'static,
    ) -> Self {
        Self {
            receiver: Some(receiver),
            on_lost: Some(Box::new(on_lost)),
        }
    }

    /// The answer, or `None` if its sender went away without one.
    pub(crate) async fn answer(mut self) -> Option<Answer> {
        let receiver = self.receiver.as_mut()?;
        let answer = receiver.await.ok();
        self.receiver = None;
        answer
    }
}

impl Drop for Awaited {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            // After `close`, an answer is either here now or its sender
            // finds the channel closed (and undoes it itself).
            receiver.close();
            if let Ok(answer) = receiver.try_recv()
                && let Some(on_lost) = self.on_lost.take()
            {
                on_lost(answer);
            }
        }
    }
}

/// What gives back the copies of an answer nobody received: the reserve or
/// seize that granted them was cancelled (its caller timed out) after it
/// was sent.
pub fn undo(op: Option<&ReserveOp>, answer: &Answer) -> Option<Op> {
    match (op, answer) {
        (Some(reserve), Answer::Reserve(granted)) if granted.granted > 0 => {
            Some(Op::Release(ReleaseOp {
                namespace: reserve.namespace.clone(),
                resource: reserve.resource.clone(),
                domain: reserve.domain.clone(),
                copies: i64::try_from(granted.granted).unwrap_or(i64::MAX),
                groups: granted.groups.clone(),
                done: None,
            }))
        }
        (_, Answer::Seize(seized)) if seized.copies > 0 => Some(Op::Release(ReleaseOp {
            namespace: seized.namespace.clone(),
            resource: seized.resource.clone(),
            domain: seized.domain.clone(),
            copies: i64::try_from(seized.copies).unwrap_or(i64::MAX),
            groups: seized.groups.clone(),
            done: None,
        })),
        _ => None,
    }
}
