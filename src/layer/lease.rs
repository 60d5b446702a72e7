//! [`LeaseLimitLayer`]: requests limited at a leased capacity
//! (docs/design.md#capacity-leases), decided in the process by the lease's
//! local limiter ([`LeaseLimiter`]) with no call to a sidecar on the request
//! path: the lease is renewed in the background
//! ([`LeaseRenewer`](crate::client::lease::LeaseRenewer)). Over the rate, a
//! request is answered 429 (gRPC `RESOURCE_EXHAUSTED`) with the exact
//! `Retry-After` the limiter computes, rounded up to whole seconds; or,
//! as the rate layers do, redirected or let through degraded
//! ([`Exceed`]). With [`max_wait`](LeaseLimitLayer::max_wait) it first
//! waits for the refill that lets it through, if that comes in time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::{Layer, Service};

use crate::client::lease::LeaseLimiter;

use super::ResponseBody;
use super::exceed::{Exceed, OverLimit, redirect};
use super::reply;

/// Limits every request to the leased rate of `limiter`, one unit each.
#[derive(Debug, Clone)]
pub struct LeaseLimitLayer {
    limiter: Arc<LeaseLimiter>,
    exceed: Exceed,
    max_wait: Duration,
}

impl LeaseLimitLayer {
    pub fn new(limiter: Arc<LeaseLimiter>) -> Self {
        Self {
            limiter,
            exceed: Exceed::default(),
            max_wait: Duration::ZERO,
        }
    }

    /// What a request over the rate gets: refused (the default),
    /// redirected, or served degraded with an [`OverLimit`] in its
    /// extensions (nothing is taken from the lease for it).
    pub fn on_exceed(mut self, exceed: Exceed) -> Self {
        self.exceed = exceed;
        self
    }

    /// A request over the rate waits for the refill that lets it through
    /// if that comes within `max_wait`: its unit is taken at once and owed,
    /// so waiters go in order at the leased rate. A longer wait is not
    /// begun. Default: no wait.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<S> Layer<S> for LeaseLimitLayer {
    type Service = LeaseLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LeaseLimit {
            inner,
            limiter: self.limiter.clone(),
            exceed: self.exceed.clone(),
            max_wait: self.max_wait,
        }
    }
}

/// The service of [`LeaseLimitLayer`].
#[derive(Debug, Clone)]
pub struct LeaseLimit<S> {
    inner: S,
    limiter: Arc<LeaseLimiter>,
    exceed: Exceed,
    max_wait: Duration,
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
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<ResponseBody<RB>>;
    type Error = S::Error;
    type Future = LeaseFuture<S::Future, RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        match self.limiter.acquire_within(1, self.max_wait) {
            Ok(wait) if wait.is_zero() => LeaseFuture::Called {
                future: self.inner.call(request),
            },
            Ok(wait) => {
                // The ready service answers after the wait; a clone takes
                // its place for the next request.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                LeaseFuture::Waiting {
                    future: Box::pin(async move {
                        tokio::time::sleep(wait).await;
                        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                        inner.call(request).await
                    }),
                }
            }
            Err(retry_after) => {
                let grpc = reply::is_grpc(&request);
                match &self.exceed {
                    Exceed::Degrade => {
                        request.extensions_mut().insert(OverLimit { retry_after });
                        LeaseFuture::Called {
                            future: self.inner.call(request),
                        }
                    }
                    exceed => LeaseFuture::Rejected {
                        response: Some(redirect(exceed, grpc).unwrap_or_else(|| {
                            reply::rejected(grpc, "over the leased capacity", retry_after, None)
                        })),
                    },
                }
            }
        }
    }
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The response future of [`LeaseLimit`].
    #[project = Projection]
    pub enum LeaseFuture<F, RB, E> {
        Called { #[pin] future: F },
        Waiting { future: Boxed<Result<Response<RB>, E>> },
        Rejected { response: Option<Response<ResponseBody<RB>>> },
    }
}

impl<F, RB, E> Future for LeaseFuture<F, RB, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<ResponseBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let wrap =
            |response: Response<RB>| response.map(|body| ResponseBody::service(body, None, None));
        match self.project() {
            Projection::Called { future } => future.poll(cx).map_ok(wrap),
            Projection::Waiting { future } => future.as_mut().poll(cx).map_ok(wrap),
            Projection::Rejected { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled again after it answered: a caller's bug; never ready.
                None => Poll::Pending,
            },
        }
    }
}
