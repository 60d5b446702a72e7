//! The response future of every layer, and the step they share: ask
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

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use super::policy::{Asked, Extra, Policy, Shared, Verdict};
use super::reply;
use super::{Exceed, OverLimit, ResponseBody, SoftLimitExceeded};

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

/// One request through a layer: the policy asks, then answers or calls
/// the service (see the module doc for the two paths).
pub(super) fn limit<S, P, ReqBody, ResBody>(
    inner: &mut S,
    shared: &Arc<Shared<P>>,
    request: Request<ReqBody>,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    P: Policy<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    let grpc = reply::is_grpc(&request);
    let (asked, mut deciding) = match shared
        .policy
        .ask(&shared.client, &shared.namespace, &request)
    {
        Asked::Decide(asked, deciding) => (asked, deciding),
        Asked::Refuse(status, message) => return answered(reply::failed(grpc, status, message)),
        Asked::Pass => return serve(inner, request, Extra::default()),
    };
    let mut cx = Context::from_waker(Waker::noop());
    if let Poll::Ready(decided) = deciding.as_mut().poll(&mut cx) {
        let verdict = shared.policy.verdict(asked, decided, grpc, shared.options);
        return match next_step(verdict, &shared.exceed, grpc, request) {
            Next::Answer(response) => answered(response),
            Next::Serve(request, extra) => serve(inner, request, extra),
        };
    }
    // The service `poll_ready` readied goes into the future; the clone
    // stays, to be readied next time.
    let clone = inner.clone();
    let mut inner = std::mem::replace(inner, clone);
    let shared = shared.clone();
    ResponseFuture {
        state: State::Deciding {
            future: Box::pin(async move {
                let decided = deciding.await;
                let verdict = shared.policy.verdict(asked, decided, grpc, shared.options);
                match next_step(verdict, &shared.exceed, grpc, request) {
                    Next::Answer(response) => Ok(response),
                    Next::Serve(request, extra) => Ok(extra.finish(inner.call(request).await?)),
                }
            }),
        },
    }
}

/// A verdict as the layer's [`Exceed`] has it: the answer to send, or the
/// request to serve (with what the handler is told in its extensions) and
/// what to add to its response.
fn next_step<B, R>(
    verdict: Verdict<B>,
    exceed: &Exceed,
    grpc: bool,
    mut request: Request<R>,
) -> Next<B, R> {
    match verdict {
        Verdict::Answer(response) => Next::Answer(response),
        Verdict::Exceeded {
            refusal,
            retry_after,
        } => match exceed {
            Exceed::Degrade => {
                request.extensions_mut().insert(OverLimit { retry_after });
                Next::Serve(request, Extra::default())
            }
            _ => Next::Answer(super::exceed::redirect(exceed, grpc).unwrap_or(refusal)),
        },
        Verdict::Pass(extra) => {
            if extra.anyone_done {
                request.extensions_mut().insert(super::ResultReady);
            }
            if let Some(resource) = extra.soft_limit.as_ref().and_then(|v| v.to_str().ok()) {
                request.extensions_mut().insert(SoftLimitExceeded {
                    resource: resource.to_owned(),
                });
            }
            Next::Serve(request, extra)
        }
    }
}

/// What [`next_step`] leads to.
enum Next<B, R> {
    Answer(Response<ResponseBody<B>>),
    Serve(Request<R>, Extra),
}

/// Calls the service, adding `extra` to its response.
fn serve<S, ReqBody, ResBody>(
    inner: &mut S,
    request: Request<ReqBody>,
    extra: Extra,
) -> ResponseFuture<S::Future, ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    ResponseFuture {
        state: State::Service {
            future: inner.call(request),
            extra: Some(extra),
        },
    }
}
