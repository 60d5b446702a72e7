//! [`ConcurrencyLayer`]: one copy of a copy-limited resource per request,
//! held until the response body has been sent or dropped.

use std::future::{Future, IntoFuture};
use std::pin::Pin;

use crate::client::{Client, ClientError, Hold};

use super::future::{Extra, Verdict};
use super::reply::{self, Quota};
use super::{Settings, limit_layer};

limit_layer!(
    ConcurrencyLayer,
    Concurrency,
    "Limits requests in progress: each holds one copy of `resource` for its \
     domain until its response body ends; past the limit, 429 (gRPC \
     `RESOURCE_EXHAUSTED`) with `Retry-After: 1`.",
    "One copy of `resource` in `namespace` per request, the domain from \
     `x-tenant-id`."
);

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
