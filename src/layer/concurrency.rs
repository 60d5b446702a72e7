//! [`ConcurrencyLayer`]: one copy of a copy-limited resource per request,
//! held until the response body has been sent or dropped.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use crate::client::{Client, Hold};

use super::key::{DomainOf, Fixed, Header, ResourceOf, resolve_domain};
use super::rate::{refused, unavailable};
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
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let settings = self.settings.clone();
        let grpc = reply::is_grpc(&request);
        let domain = resolve_domain(settings.domain.domain_of(&request), &settings.missing);
        let resource = settings.resource.resource_of(&request);
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(async move {
            let domain = match domain {
                Ok(domain) => domain,
                Err(status) => return Ok(reply::failed(grpc, status, "missing or invalid domain")),
            };
            let held = settings
                .client
                .hold(&*settings.namespace, resource.as_str(), domain.as_str())
                .await;
            let mut quota = None;
            let hold = match held {
                Ok(hold) if hold.unanswered() && settings.fail_closed => {
                    return Ok(unavailable(grpc));
                }
                Ok(hold) if !hold.is_granted() => {
                    let quota = copy_quota(&resource, &hold);
                    return Ok(reply::rejected(
                        grpc,
                        "concurrency_limited",
                        None,
                        quota.as_ref(),
                    ));
                }
                Ok(hold) => {
                    if settings.headers {
                        quota = copy_quota(&resource, &hold);
                    }
                    Some(hold)
                }
                Err(error) => {
                    if let Some(response) = refused(grpc, &error, settings.fail_closed) {
                        return Ok(response);
                    }
                    None
                }
            };
            // If the service fails, the hold drops here and is released.
            let response = inner.call(request).await?;
            let (mut parts, body) = response.into_parts();
            if let Some(quota) = quota {
                quota.write(&mut parts.headers);
            }
            Ok(Response::from_parts(
                parts,
                ResponseBody::service(body, hold),
            ))
        })
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
