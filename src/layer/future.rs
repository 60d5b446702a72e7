//! The response future of both layers: ask Charon, then (if granted) the
//! service. Boxed: the two steps are an `async` block, and one allocation
//! per request is far below the cost of the decision itself.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::ResponseBody;

type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// The future of [`RateLimit`](super::RateLimit) and
/// [`Concurrency`](super::Concurrency).
pub struct ResponseFuture<B, E> {
    inner: Boxed<B, E>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(super) fn new(
        future: impl Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> std::fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
