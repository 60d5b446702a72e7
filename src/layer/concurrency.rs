//! [`ConcurrencyLayer`]: one copy of a copy-limited resource per request,
//! held until the response body has been sent or dropped.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::client::{Client, ClientError, Hold};

use super::future::{self, Extra, Verdict};
use super::key::{DomainOf, Fixed, Header, ResourceOf};
use super::reply::{self, Quota};
use super::{ResponseBody, ResponseFuture, Settings, layer_builders};

/// Limits requests in progress: each holds one copy of `resource` for its
/// domain until its response body ends; past the limit, 429 (gRPC
/// `RESOURCE_EXHAUSTED`) with `Retry-After: 1`.
#[derive(Clone)]
pub struct ConcurrencyLayer<D = Header, R = Fixed> {
    settings: Settings<D, R>,
}

impl ConcurrencyLayer {
    pub fn new(client: Client, namespace: &str, resource: impl Into<String>) -> Self {
        Self {
            settings: Settings::new(client, namespace, Fixed::new(resource)),
        }
    }
}

layer_builders!(ConcurrencyLayer);

impl<S, D: Clone, R: Clone> Layer<S> for ConcurrencyLayer<D, R> {
    type Service = Concurrency<S, D, R>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency {
            inner,
            settings: Arc::new(self.settings.clone()),
        }
    }
}

/// The service of [`ConcurrencyLayer`].
pub struct Concurrency<S, D = Header, R = Fixed> {
    inner: S,
    settings: Arc<Settings<D, R>>,
}

impl<S: Clone, D, R> Clone for Concurrency<S, D, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<S, D, R, ReqBody, ResBody> Service<Request<ReqBody>> for Concurrency<S, D, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    D: DomainOf<ReqBody>,
    R: ResourceOf<ReqBody>,
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
        future::limit(&mut self.inner, &self.settings, request, ask, verdict)
    }
}

/// One copy of `resource` for `domain`, held until the body ends.
fn ask(
    client: &Client,
    namespace: &str,
    resource: String,
    domain: String,
) -> Pin<Box<dyn Future<Output = Result<Hold, ClientError>> + Send>> {
    client.hold(namespace, resource, domain).into_future()
}

fn verdict<D, R, B>(
    settings: &Settings<D, R>,
    grpc: bool,
    resource: String,
    held: Result<Hold, ClientError>,
) -> Verdict<B> {
    match held {
        Ok(hold) if hold.unanswered() && settings.fail_closed => {
            Verdict::Answer(reply::unavailable(grpc))
        }
        Ok(hold) if !hold.is_granted() => {
            let quota = copy_quota(&resource, &hold);
            // A semaphore cannot say when a copy frees up: try in a second.
            Verdict::Answer(reply::rejected(
                grpc,
                "concurrency_limited",
                Some(std::time::Duration::from_secs(1)),
                quota.as_ref(),
            ))
        }
        // If the service fails, the hold drops with the future: released.
        Ok(hold) => Verdict::Pass(Extra {
            quota: if settings.headers {
                copy_quota(&resource, &hold)
            } else {
                None
            },
            soft_limit: None,
            hold: Some(hold),
        }),
        Err(error) => match reply::refused(grpc, &error, settings.fail_closed) {
            Some(response) => Verdict::Answer(response),
            None => Verdict::Pass(Extra::default()),
        },
    }
}

/// The quota headers of a hold: the domain's limit and what is left of it
/// (no window: copies are held, not spent).
fn copy_quota(resource: &str, hold: &Hold) -> Option<Quota> {
    let context = hold.context();
    let limit = context.domain_limit?;
    if hold.unanswered() {
        return None;
    }
    Some(Quota {
        name: resource.to_owned(),
        limit,
        window: None,
        remaining: limit.saturating_sub(context.domain_holds),
        reset: None,
    })
}
