//! The response future of both layers, and the step they share: ask
//! Charon, then answer or call the service.
//!
//! An embedded engine decides within the first poll, so `call` polls the
//! decision once on the spot: when it is ready, the service is called at
//! once (on the service that `poll_ready` readied, no clone, no box). Only
//! a decision that must wait (a sidecar's round trip) takes the slow path:
//! a boxed `async` block over a clone of the service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use crate::client::{Client, Hold};

use super::key::{DomainOf, ResourceOf, resolve_domain};
use super::reply::{self, Quota, SOFT_LIMIT};
use super::{ResponseBody, Settings};

/// What a layer does with a request once Charon has answered.
pub(super) enum Verdict<B> {
    /// Answer this, without calling the service.
    Answer(Response<ResponseBody<B>>),
    /// Call the service, and add these to its response.
    Pass(Extra),
}

/// What a granted response carries from the decision.
#[derive(Default)]
pub(super) struct Extra {
    pub quota: Option<Quota>,
    /// `x-charon-soft-limit`, past the soft limit.
    pub soft_limit: Option<HeaderValue>,
    /// Released when the body ends.
    pub hold: Option<Hold>,
}

impl Extra {
    fn finish<B>(self, response: Response<B>) -> Response<ResponseBody<B>> {
        let (mut parts, body) = response.into_parts();
        if let Some(quota) = self.quota {
            quota.write(&mut parts.headers);
        }
        if let Some(value) = self.soft_limit {
            parts.headers.insert(SOFT_LIMIT.clone(), value);
        }
        Response::from_parts(parts, ResponseBody::service(body, self.hold))
    }
}

type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

pin_project! {
    /// The future of [`RateLimit`](super::RateLimit) and
    /// [`Concurrency`](super::Concurrency).
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        state: State<F, B, E>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<F, B, E> {
        Answered { response: Option<Response<ResponseBody<B>>> },
        Service { #[pin] future: F, extra: Option<Extra> },
        Deciding { future: Boxed<B, E> },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Answered { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                // Polled after completion.
                None => Poll::Pending,
            },
            StateProjection::Service { future, extra } => {
                let response = std::task::ready!(future.poll(cx))?;
                Poll::Ready(Ok(extra.take().unwrap_or_default().finish(response)))
            }
            StateProjection::Deciding { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, B, E> std::fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Answers `request` at once with `response`.
fn answered<F, B, E>(response: Response<ResponseBody<B>>) -> ResponseFuture<F, B, E> {
    ResponseFuture {
        state: State::Answered {
            response: Some(response),
        },
    }
}

/// Starts a layer's decision: (client, namespace, resource, domain).
pub(super) type Ask<Decided> =
    fn(&Client, &str, String, String) -> Pin<Box<dyn Future<Output = Decided> + Send>>;

/// One request through a layer: its domain and resource, the decision
/// `ask` starts, and `verdict` on it; a request without a usable domain is
/// answered at once.
pub(super) fn limit<S, D, R, ReqBody, ResBody, Decided>(
    inner: &mut S,
    settings: &Arc<Settings<D, R>>,
    request: Request<ReqBody>,
    ask: Ask<Decided>,
    verdict: fn(&Settings<D, R>, bool, String, Decided) -> Verdict<ResBody>,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    D: DomainOf<ReqBody>,
    R: ResourceOf<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
    Decided: Send + 'static,
{
    let grpc = reply::is_grpc(&request);
    let domain = match resolve_domain(settings.domain.domain_of(&request), &settings.missing) {
        Ok(domain) => domain,
        Err(status) => return answered(reply::failed(grpc, status, "missing or invalid domain")),
    };
    let resource = settings.resource.resource_of(&request);
    let deciding = ask(
        &settings.client,
        &settings.namespace,
        resource.clone(),
        domain,
    );
    let settings = settings.clone();
    respond(inner, request, deciding, move |decided| {
        verdict(&settings, grpc, resource, decided)
    })
}

/// Decides with `deciding`, then answers or calls `inner` (see the module
/// doc for the two paths).
fn respond<S, ReqBody, ResBody, D>(
    inner: &mut S,
    request: Request<ReqBody>,
    mut deciding: Pin<Box<dyn Future<Output = D> + Send>>,
    verdict: impl FnOnce(D) -> Verdict<ResBody> + Send + 'static,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
    D: Send + 'static,
{
    let mut cx = Context::from_waker(Waker::noop());
    match deciding.as_mut().poll(&mut cx) {
        Poll::Ready(decided) => match verdict(decided) {
            Verdict::Answer(response) => answered(response),
            Verdict::Pass(extra) => ResponseFuture {
                state: State::Service {
                    future: inner.call(request),
                    extra: Some(extra),
                },
            },
        },
        Poll::Pending => {
            // The service `poll_ready` readied goes into the future; the
            // clone stays, to be readied next time.
            let clone = inner.clone();
            let mut inner = std::mem::replace(inner, clone);
            ResponseFuture {
                state: State::Deciding {
                    future: Box::pin(async move {
                        match verdict(deciding.await) {
                            Verdict::Answer(response) => Ok(response),
                            Verdict::Pass(extra) => Ok(extra.finish(inner.call(request).await?)),
                        }
                    }),
                },
            }
        }
    }
}
