//! Tower middleware: Charon's limits for axum, hyper and tonic services, in
//! a few lines.
//!
//! - [`RateLimitLayer`]: one hit per request on a rate-limited resource.
//! - [`ConcurrencyLayer`]: one copy of a copy-limited resource, held until
//!   the response body has been sent (or dropped).
//!
//! Both ask a [`Client`] — a remote sidecar or the
//! engine embedded in the process, switched in one line — map each request
//! to a domain ([`Header`] `x-tenant-id` by default, [`PeerAddr`], or any
//! closure) and a resource ([`Fixed`], [`MethodAndRoute`], or any closure),
//! and turn a rejection into an `Ok` response: 429 with `Retry-After`,
//! `RateLimit-Policy`, `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11)
//! and a JSON body, or for gRPC requests a `RESOURCE_EXHAUSTED` status.
//! When Charon cannot answer, requests go through (fail open: logged, and
//! counted in the client's stats) unless the layer is set to fail closed
//! (503).
//!
//! ```no_run
//! # async fn example(config: charon::config::Config) {
//! use axum::{Router, routing::get};
//! use charon::client::Client;
//! use charon::layer::RateLimitLayer;
//! let client = Client::embedded(config); // or Client::sidecar("http://127.0.0.1:8081")?
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(client, "shop", "api"));
//! # }
//! ```
//!
//! Layout, as in tower-http: a module per middleware (layer, service), the
//! [`ResponseBody`] both return, the [`ResponseFuture`], and the shared
//! pieces: [`key`] (domain and resource), [`reply`] (rejections and
//! headers).

mod body;
mod concurrency;
mod future;
pub mod key;
mod rate;
pub mod reply;

pub use body::ResponseBody;
pub use concurrency::{Concurrency, ConcurrencyLayer};
pub use future::ResponseFuture;
pub use key::{DomainOf, Fixed, Header, MethodAndRoute, MissingDomain, PeerAddr, ResourceOf};
pub use rate::{RateLimit, RateLimitLayer};

use std::sync::Arc;

use crate::client::Client;

/// What both layers are configured with.
#[derive(Clone)]
struct Settings<D, R> {
    client: Client,
    namespace: Arc<str>,
    domain: D,
    resource: R,
    missing: MissingDomain,
    /// RateLimit headers on granted responses too.
    headers: bool,
    /// No answer from Charon: 503 instead of letting the request through.
    fail_closed: bool,
}

impl<R> Settings<Header, R> {
    fn new(client: Client, namespace: &str, resource: R) -> Self {
        Self {
            client,
            namespace: namespace.into(),
            domain: Header::default(),
            resource,
            missing: MissingDomain::default(),
            headers: true,
            fail_closed: false,
        }
    }
}

impl<D, R> Settings<D, R> {
    fn with_domain<D2>(self, domain: D2) -> Settings<D2, R> {
        Settings {
            client: self.client,
            namespace: self.namespace,
            domain,
            resource: self.resource,
            missing: self.missing,
            headers: self.headers,
            fail_closed: self.fail_closed,
        }
    }

    fn with_resource<R2>(self, resource: R2) -> Settings<D, R2> {
        Settings {
            client: self.client,
            namespace: self.namespace,
            domain: self.domain,
            resource,
            missing: self.missing,
            headers: self.headers,
            fail_closed: self.fail_closed,
        }
    }
}

/// A layer and its service over one kind of decision: the module invoking
/// it provides `ask` (start the decision) and `verdict` (answer or pass).
/// Both layers are this, so they cannot drift apart.
macro_rules! limit_layer {
    ($layer:ident, $service:ident, $layer_doc:literal, $new_doc:literal) => {
        #[doc = $layer_doc]
        #[derive(Clone)]
        pub struct $layer<D = $crate::layer::Header, R = $crate::layer::Fixed> {
            settings: $crate::layer::Settings<D, R>,
        }

        impl $layer {
            #[doc = $new_doc]
            pub fn new(
                client: $crate::client::Client,
                namespace: &str,
                resource: impl Into<String>,
            ) -> Self {
                Self {
                    settings: $crate::layer::Settings::new(
                        client,
                        namespace,
                        $crate::layer::Fixed::new(resource),
                    ),
                }
            }
        }

        impl<D, R> $layer<D, R> {
            /// Where the domain (tenant) comes from: a [`Header`](crate::layer::Header),
            /// [`PeerAddr`](crate::layer::PeerAddr), or a closure
            /// `Fn(&Request<B>) -> Option<String>`.
            pub fn domain<D2>(self, domain: D2) -> $layer<D2, R> {
                $layer {
                    settings: self.settings.with_domain(domain),
                }
            }

            /// Which resource a request is: [`Fixed`](crate::layer::Fixed) (what
            /// `new` set), [`MethodAndRoute`](crate::layer::MethodAndRoute), or a
            /// closure `Fn(&Request<B>) -> String`.
            pub fn resource<R2>(self, resource: R2) -> $layer<D, R2> {
                $layer {
                    settings: self.settings.with_resource(resource),
                }
            }

            /// A request without a domain: one shared domain (default
            /// `anonymous`), or rejected with a status (400, 401).
            pub fn missing_domain(mut self, missing: $crate::layer::MissingDomain) -> Self {
                self.settings.missing = missing;
                self
            }

            /// `RateLimit-Policy` and `RateLimit` on granted responses too
            /// (default true; rejections always carry them).
            pub fn granted_headers(mut self, on: bool) -> Self {
                self.settings.headers = on;
                self
            }

            /// When Charon cannot answer, answer 503 (gRPC `UNAVAILABLE`)
            /// instead of letting the request through.
            pub fn fail_closed(mut self, on: bool) -> Self {
                self.settings.fail_closed = on;
                self
            }
        }

        impl<S, D: Clone, R: Clone> tower::Layer<S> for $layer<D, R> {
            type Service = $service<S, D, R>;

            fn layer(&self, inner: S) -> Self::Service {
                $service {
                    inner,
                    settings: std::sync::Arc::new(self.settings.clone()),
                }
            }
        }

        #[doc = concat!("The service of [`", stringify!($layer), "`].")]
        pub struct $service<S, D = $crate::layer::Header, R = $crate::layer::Fixed> {
            inner: S,
            settings: std::sync::Arc<$crate::layer::Settings<D, R>>,
        }

        impl<S: Clone, D, R> Clone for $service<S, D, R> {
            fn clone(&self) -> Self {
                Self {
                    inner: self.inner.clone(),
                    settings: self.settings.clone(),
                }
            }
        }

        impl<S, D, R, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for $service<S, D, R>
        where
            S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
                + Clone
                + Send
                + 'static,
            S::Future: Send,
            S::Error: Send,
            D: $crate::layer::DomainOf<ReqBody>,
            R: $crate::layer::ResourceOf<ReqBody>,
            ReqBody: Send + 'static,
            ResBody: Send + 'static,
        {
            type Response = http::Response<$crate::layer::ResponseBody<ResBody>>;
            type Error = S::Error;
            type Future = $crate::layer::ResponseFuture<S::Future, ResBody, S::Error>;

            fn poll_ready(
                &mut self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Result<(), Self::Error>> {
                self.inner.poll_ready(cx)
            }

            fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
                $crate::layer::future::limit(&mut self.inner, &self.settings, request, ask, verdict)
            }
        }
    };
}
use limit_layer;
