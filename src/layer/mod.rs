//! Tower middleware: Charon's limits for axum, hyper and tonic services, in
//! a few lines.
//!
//! - [`RateLimitLayer`]: one hit per request on a rate-limited resource.
//! - [`ConcurrencyLayer`]: one copy of a copy-limited resource, held until
//!   the response body has been sent (or dropped).
//! - [`DescriptorLimitLayer`]: Envoy-style descriptors in a namespace (the
//!   limits of a `descriptors:` tree), several limits decided at once, all
//!   or nothing.
//! - [`CostLimitLayer`]: budgets of a cost known when the response ends
//!   (`cost: after_response` descriptors): checked before the request,
//!   charged the response's [`Cost`] when its body ends.
//! - [`LeaseLimitLayer`]: the rate of a capacity lease, decided in the
//!   process by the lease's local limiter and renewed in the background: no
//!   call per request; 429 with `Retry-After` over the rate.
//! - [`ThrottleLayer`]: the server throttler, which asks no one: at most
//!   `capacity` requests at once (and, with a CPU budget, so many ms of CPU
//!   a second), the rest queued by [`Criticality`] then arrival until their
//!   deadline; a refusal is 503 (gRPC `UNAVAILABLE`) with `Retry-After`.
//! - [`AdaptiveThrottleLayer`]: client-side adaptive throttling of a
//!   service's outgoing calls: a backend that has been refusing is sent
//!   about `K` times what it accepts, the rest refused before they leave
//!   ([`AdaptiveError::Throttled`]).
//!
//! The first four are one [`LimitLayer`] each and ask a
//! [`Client`](crate::client::Client) — a remote sidecar or the engine
//! embedded in the process, switched in one line. The first two map each
//! request to a domain ([`Header`] `x-tenant-id` by default, [`PeerAddr`],
//! [`ClientIp`] behind trusted proxies, a [`Cookie`], a [`Region`] header,
//! or any closure) and a resource ([`Fixed`], [`MethodAndRoute`], or any
//! closure); the third and the fourth to descriptors ([`Actions`], as
//! Envoy's route actions make them, or any closure). Each turns a
//! rejection into an `Ok` response ([`Exceed`]: refused by default, or
//! redirected, or let through degraded): 429 with `Retry-After`,
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
//! `t` in `RateLimit` is whole seconds rounded up, never early: under the
//! window rule (docs/design.md#window-rule) a hit leaves its window `w`
//! plus 1 ms after it was granted, so the first hit on a `w=10` policy says
//! `t=11`.
//!
//! Layout, as in tower-http: one generic [`LimitLayer`] and its service
//! [`Limit`] (`limit`) over a policy (`policy`), the policies that make
//! each middleware (`resource` with its kinds `rate` and `concurrency`;
//! `descriptors`; `cost`, settled by `settle`), the [`ResponseBody`] they
//! return, the [`ResponseFuture`], and the shared pieces: [`key`] (domain
//! and resource), `client_ip`, `exceed`, [`reply`] (rejections and
//! headers). The other three stand alone: `lease`, `throttle` and
//! `adaptive`.

mod adaptive;
mod body;
mod client_ip;
mod concurrency;
mod cost;
mod descriptors;
mod exceed;
mod future;
pub mod key;
mod lease;
mod limit;
mod policy;
mod rate;
pub mod reply;
mod resource;
mod settle;
mod throttle;

pub use adaptive::{AdaptiveError, AdaptiveFuture, AdaptiveThrottle, AdaptiveThrottleLayer};
pub use body::ResponseBody;
pub use client_ip::{BadRange, ClientIp};
pub use concurrency::{Concurrency, ConcurrencyLayer, Copies, ResultReady};
pub use cost::{Admission, CostLimit, CostLimitLayer, PerCost};
pub use descriptors::{
    Action, Actions, DescriptorLimit, DescriptorLimitLayer, DescriptorsOf, PerDescriptors,
};
pub use exceed::{Exceed, OverLimit, SoftLimitExceeded};
pub use future::ResponseFuture;
pub use key::{
    Cookie, DomainOf, Fixed, Header, MethodAndRoute, MissingDomain, PeerAddr, Region, ResourceOf,
};
pub use lease::{LeaseFuture, LeaseLimit, LeaseLimitLayer};
pub use limit::{Limit, LimitLayer};
pub use rate::{Hits, RateLimit, RateLimitLayer};
pub use resource::PerResource;
pub use settle::{Cost, Settle, Settlement};
pub use throttle::{
    ClassCost, Classify, Criticality, MAX_CLASSES, OTHER_CLASS, Throttle, ThrottleCounts,
    ThrottleFuture, ThrottleLayer, thread_cpu_time,
};
