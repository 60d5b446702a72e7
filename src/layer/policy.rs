//! What a layer asks Charon and what it makes of the answer: the [`Policy`]
//! a layer is generic over, the [`Verdict`] it reaches, and what the clones
//! of one service share. The layer and service (`limit.rs`) and the
//! response future (`future.rs`) both build on this; it builds on neither.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode};

use crate::client::{Client, Hold};

use super::ResponseBody;
use super::reply::{Quota, SOFT_LIMIT};

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
    /// `RateLimit-Policy` names the policy of every descriptor that had a
    /// limit, not only the tightest's.
    pub every_descriptor_headers: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            granted_headers: true,
            fail_closed: false,
            every_descriptor_headers: false,
        }
    }
}

/// What a layer does with a request once Charon has answered.
pub enum Verdict<B> {
    /// Answer this, without calling the service.
    Answer(Response<ResponseBody<B>>),
    /// Over the limit: answer this refusal, unless the layer redirects or
    /// degrades ([`Exceed`](super::Exceed)).
    Exceeded {
        refusal: Response<ResponseBody<B>>,
        retry_after: Option<std::time::Duration>,
    },
    /// Call the service, and add these to its response.
    Pass(Extra),
}

/// What a granted response carries from the decision.
#[derive(Default)]
pub struct Extra {
    /// The quota closest to refusing: `RateLimit`, and its policy.
    pub quota: Option<Quota>,
    /// When not empty, every descriptor's policy, `quota`'s among them:
    /// all of them in `RateLimit-Policy`.
    pub policies: Vec<Quota>,
    /// `x-charon-soft-limit`, past the soft limit.
    pub soft_limit: Option<HeaderValue>,
    /// Released when the body ends (as done, for a successful response to
    /// a request that waited for anyone's result).
    pub hold: Option<Hold>,
    /// Another request did the work and released as done: the handler is
    /// told so ([`ResultReady`](super::ResultReady)).
    pub anyone_done: bool,
    /// What the response cost, charged when the body ends.
    pub(super) settle: Option<super::settle::Settle>,
}

impl Extra {
    pub(super) fn finish<B>(mut self, response: Response<B>) -> Response<ResponseBody<B>> {
        let (mut parts, body) = response.into_parts();
        if parts.status.is_success()
            && let Some(hold) = &mut self.hold
        {
            hold.succeeded();
        }
        match &self.quota {
            Some(quota) if self.policies.is_empty() => quota.write(&mut parts.headers),
            Some(quota) => Quota::write_every(&self.policies, quota, &mut parts.headers),
            None => {}
        }
        if let Some(value) = self.soft_limit {
            parts.headers.insert(SOFT_LIMIT.clone(), value);
        }
        let response = Response::from_parts(parts, body);
        let settlement = self.settle.and_then(|settle| settle.of(&response));
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, ResponseBody::service(body, self.hold, settlement))
    }
}

/// What the clones of one service share.
pub(super) struct Shared<P> {
    pub(super) client: Client,
    pub(super) namespace: Arc<str>,
    pub(super) policy: P,
    pub(super) options: Options,
    pub(super) exceed: super::Exceed,
}
