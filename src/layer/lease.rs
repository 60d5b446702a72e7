//! [`LeaseLimitLayer`]: requests limited at a leased capacity
//! (docs/design.md#capacity-leases), decided in the process by the lease's
//! local limiter ([`LeaseLimiter`]) with no call to a sidecar on the request
//! path: the lease is renewed in the background
//! ([`LeaseRenewer`](crate::client::lease::LeaseRenewer)). Over the rate, a
//! request is answered 429 (gRPC `RESOURCE_EXHAUSTED`) with the exact
//! `Retry-After` the limiter computes, rounded up to whole seconds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::client::lease::LeaseLimiter;

use super::ResponseBody;
use super::reply;

/// Limits every request to the leased rate of `limiter`, one unit each.
#[derive(Debug, Clone)]
pub struct LeaseLimitLayer {
    limiter: Arc<LeaseLimiter>,
}

impl LeaseLimitLayer {
    pub fn new(limiter: Arc<LeaseLimiter>) -> Self {
        Self { limiter }
    }
}

impl<S> Layer<S> for LeaseLimitLayer {
    type Service = LeaseLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaseLimit {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// The service of [`LeaseLimitLayer`].
#[derive(Debug, Clone)]
pub struct LeaseLimit<S> {
    inner: S,
    limiter: Arc<LeaseLimiter>,
}

impl<S> LeaseLimit<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for LeaseLimit<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = S::Error;
    type Future = LeaseFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.limiter.try_acquire(1) {
            Ok(()) => LeaseFuture::Called {
                future: self.inner.call(request),
            },
            Err(wait) => LeaseFuture::Rejected {
                response: Some(reply::rejected(
                    reply::is_grpc(&request),
                    "over the leased capacity",
                    wait,
                    None,
                )),
            },
        }
    }
}

pin_project! {
    /// The response future of [`LeaseLimit`].
    #[project = Projection]
    pub enum LeaseFuture<F, RB> {
        Called { #[pin] future: F },
        Rejected { response: Option<Response<ResponseBody<RB>>> },
    }
}

impl<F, RB, E> Future for LeaseFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<ResponseBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::Called { future } => future
                .poll(cx)
                .map_ok(|response| response.map(|body| ResponseBody::service(body, None, None))),
            Projection::Rejected { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after it answered: a caller's bug; never ready.
                None => Poll::Pending,
            },
        }
    }
}
