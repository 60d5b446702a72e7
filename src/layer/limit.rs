//! The one layer and service every Charon middleware is: [`LimitLayer`]
//! and [`Limit`], generic over a [`Policy`] that says what a request asks
//! Charon and what the answer makes of it. The rate, concurrency and
//! descriptor layers are this with their own policy, so the options and
//! the request path exist once.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::client::Client;

use super::future::ResponseFuture;
use super::policy::{Options, Policy, Shared};
use super::{Exceed, ResponseBody};

/// A Tower layer that asks Charon before each request, by policy `P`
/// (see [`RateLimitLayer`](super::RateLimitLayer),
/// [`ConcurrencyLayer`](super::ConcurrencyLayer) and
/// [`DescriptorLimitLayer`](super::DescriptorLimitLayer)).
#[derive(Clone)]
pub struct LimitLayer<P> {
    pub(super) client: Client,
    pub(super) namespace: Arc<str>,
    pub(super) policy: P,
    pub(super) options: Options,
    pub(super) exceed: Exceed,
}

impl<P> LimitLayer<P> {
    pub(super) fn with_policy(client: Client, namespace: &str, policy: P) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            policy,
            options: Options::default(),
            exceed: Exceed::default(),
        }
    }

    /// What to do with a request over its limit: refuse it (the default),
    /// redirect it, or let it through degraded ([`Exceed`]).
    pub fn on_exceed(mut self, exceed: Exceed) -> Self {
        self.exceed = exceed;
        self
    }

    /// The same layer with its policy changed.
    pub(super) fn map_policy<Q>(self, change: impl FnOnce(P) -> Q) -> LimitLayer<Q> {
        LimitLayer {
            client: self.client,
            namespace: self.namespace,
            policy: change(self.policy),
            options: self.options,
            exceed: self.exceed,
        }
    }

    /// `RateLimit-Policy` and `RateLimit` on granted responses too
    /// (default true; rejections always carry them).
    pub fn granted_headers(mut self, on: bool) -> Self {
        self.options.granted_headers = on;
        self
    }

    /// `RateLimit-Policy` naming the policy of every descriptor of the
    /// request that had a limit (default false: the tightest's alone, as
    /// `RateLimit` is); for the layers that send several descriptors.
    pub fn every_descriptor_headers(mut self, on: bool) -> Self {
        self.options.every_descriptor_headers = on;
        self
    }

    /// When Charon cannot answer, answer 503 (gRPC `UNAVAILABLE`) instead
    /// of letting the request through.
    pub fn fail_closed(mut self, on: bool) -> Self {
        self.options.fail_closed = on;
        self
    }
}

impl<S, P: Clone> Layer<S> for LimitLayer<P> {
    type Service = Limit<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Limit {
            inner,
            shared: Arc::new(Shared {
                client: self.client.clone(),
                namespace: self.namespace.clone(),
                policy: self.policy.clone(),
                options: self.options,
                exceed: self.exceed.clone(),
            }),
        }
    }
}

/// The service of a [`LimitLayer`].
pub struct Limit<S, P> {
    inner: S,
    shared: Arc<Shared<P>>,
}

impl<S, P> Limit<S, P> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, P> Clone for Limit<S, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P, ReqBody, ResBody> Service<Request<ReqBody>> for Limit<S, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    P: Policy<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        super::future::limit(&mut self.inner, &self.shared, request)
    }
}
