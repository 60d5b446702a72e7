//! The one layer and service every Charon middleware is: [`LimitLayer`]
//! and [`Limit`], generic over a [`Policy`] that says what a request asks
//! Charon and what the answer makes of it. The rate, concurrency and
//! descriptor layers are this with their own policy, so the options and
//! the request path exist once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::client::Client;

use super::ResponseBody;
use super::future::{ResponseFuture, Verdict};

/// A decision under way.
pub type Deciding<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a request asks of Charon, decided by the policy.
pub enum Asked<A, T> {
    /// Decide with this; `A` is what the verdict needs of the request.
    Decide(A, Deciding<T>),
    /// Answer at once with this status (a request without a domain).
    Refuse(StatusCode, &'static str),
    /// Nothing to limit: call the service.
    Pass,
}

/// What a layer asks and how it answers. Implemented by the layer's own
/// policies ([`PerResource`](super::PerResource),
/// [`PerDescriptors`](super::PerDescriptors)); configure those, with
/// closures where a rule of your own is needed.
pub trait Policy<B>: Send + Sync + 'static {
    /// What the verdict needs to know of the request.
    type Asked: Send + 'static;
    /// The client's answer.
    type Decided: Send + 'static;

    /// Starts the decision on `request`.
    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        request: &Request<B>,
    ) -> Asked<Self::Asked, Self::Decided>;

    /// What the answer makes of the request.
    fn verdict<R>(
        &self,
        asked: Self::Asked,
        decided: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<R>;
}

/// What every layer can be told, whatever its policy.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// `RateLimit-Policy` and `RateLimit` on granted responses too.
    pub granted_headers: bool,
    /// No answer from Charon: 503 instead of letting the request through.
    pub fail_closed: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            granted_headers: true,
            fail_closed: false,
        }
    }
}

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
}

impl<P> LimitLayer<P> {
    pub(super) fn with_policy(client: Client, namespace: &str, policy: P) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            policy,
            options: Options::default(),
        }
    }

    /// The same layer with its policy changed.
    pub(super) fn map_policy<Q>(self, change: impl FnOnce(P) -> Q) -> LimitLayer<Q> {
        LimitLayer {
            client: self.client,
            namespace: self.namespace,
            policy: change(self.policy),
            options: self.options,
        }
    }

    /// `RateLimit-Policy` and `RateLimit` on granted responses too
    /// (default true; rejections always carry them).
    pub fn granted_headers(mut self, on: bool) -> Self {
        self.options.granted_headers = on;
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
            }),
        }
    }
}

/// What the clones of one service share.
pub(super) struct Shared<P> {
    pub(super) client: Client,
    pub(super) namespace: Arc<str>,
    pub(super) policy: P,
    pub(super) options: Options,
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
