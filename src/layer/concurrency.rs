//! [`ConcurrencyLayer`]: one copy of a copy-limited resource per request,
//! held until the response body has been sent or dropped. With
//! [`max_wait`](LimitLayer::max_wait), a request waits for a copy in the
//! server's queue (by criticality then arrival) instead of being refused;
//! with [`for_anyone`](LimitLayer::for_anyone), for anyone's result
//! (PoolCounter's ACQ4ANY): one request does the work, the others are
//! served once it succeeded, told so by [`ResultReady`].

use std::future::IntoFuture;
use std::time::Duration;

use crate::client::{Client, ClientError, Hold};

use super::limit::{Limit, LimitLayer};
use super::policy::{Deciding, Options};
use super::policy::{Extra, Verdict};
use super::reply::{self, Quota};
use super::resource::{Kind, PerResource};
use super::{Fixed, Header};

/// Limits requests in progress: each holds one copy of a resource for its
/// domain until its response body ends; past the limit (after waiting up
/// to `max_wait`, if set), 429 (gRPC `RESOURCE_EXHAUSTED`) with
/// `Retry-After: 1`.
pub type ConcurrencyLayer<D = Header, R = Fixed> = LimitLayer<PerResource<Copies, D, R>>;

/// The service of [`ConcurrencyLayer`].
pub type Concurrency<S, D = Header, R = Fixed> = Limit<S, PerResource<Copies, D, R>>;

impl ConcurrencyLayer {
    /// One copy of `resource` in `namespace` per request, the domain from
    /// `x-tenant-id`.
    pub fn new(client: Client, namespace: &str, resource: impl Into<String>) -> Self {
        Self::per_resource(client, namespace, resource, Copies::default())
    }
}

/// One copy per request, held until its response body ends; waited for
/// up to `max_wait`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Copies {
    max_wait: Duration,
    for_anyone: bool,
}

/// In a request's extensions, with [`for_anyone`](LimitLayer::for_anyone):
/// another request of the same resource and domain did the work and
/// succeeded while this one waited. Read the result it left (a cache)
/// rather than doing the work again; this request holds no copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultReady;

impl<D, R> LimitLayer<PerResource<Copies, D, R>> {
    /// Waits up to `max_wait` for a copy to be released (in the server's
    /// queue for the resource and domain, served by criticality then
    /// arrival: the criticality of the request a `ThrottleLayer` admitted)
    /// before refusing the request. Default: no wait.
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.map_kind(|copies| Copies { max_wait, ..copies })
    }

    /// Waits (up to `max_wait`) for anyone's result: while a request holds
    /// the copy, the others of the same domain wait; when its response is a
    /// success (2xx) and its body ends, the copy is released as done and
    /// every waiting request is served at once with [`ResultReady`] in its
    /// extensions (docs/design.md#waiting-for-anyones-result). A failed
    /// response releases the copy to the next request, which does the work.
    pub fn for_anyone(self) -> Self {
        self.map_kind(|copies| Copies {
            for_anyone: true,
            ..copies
        })
    }
}

impl Kind for Copies {
    type Decided = Result<Hold, ClientError>;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        resource: String,
        domain: String,
    ) -> Deciding<Self::Decided> {
        let hold = client
            .hold(namespace, resource, domain)
            .max_wait(self.max_wait);
        if self.for_anyone {
            hold.for_anyone().into_future()
        } else {
            hold.into_future()
        }
    }

    fn verdict<B>(
        resource: String,
        held: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<B> {
        verdict(resource, held, grpc, options)
    }
}

fn verdict<B>(
    resource: String,
    held: Result<Hold, ClientError>,
    grpc: bool,
    options: Options,
) -> Verdict<B> {
    match held {
        Ok(hold) if hold.unanswered() && options.fail_closed => {
            Verdict::Answer(reply::unavailable(grpc))
        }
        Ok(hold) if hold.is_done() => Verdict::Pass(Extra {
            anyone_done: true,
            ..Extra::default()
        }),
        Ok(hold) if !hold.is_granted() => {
            let quota = copy_quota(&resource, &hold);
            // A semaphore cannot say when a copy frees up: try in a second.
            Verdict::Exceeded {
                retry_after: Some(std::time::Duration::from_secs(1)),
                refusal: reply::rejected(
                    grpc,
                    "concurrency_limited",
                    Some(std::time::Duration::from_secs(1)),
                    quota.as_ref(),
                ),
            }
        }
        // If the service fails, the hold drops with the future: released.
        Ok(hold) => Verdict::Pass(Extra {
            quota: if options.granted_headers {
                copy_quota(&resource, &hold)
            } else {
                None
            },
            hold: Some(hold),
            ..Extra::default()
        }),
        Err(error) => match reply::refused(grpc, &error, options.fail_closed) {
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
