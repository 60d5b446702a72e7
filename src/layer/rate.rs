//! [`RateLimitLayer`]: one hit per request on a rate-limited resource.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use crate::client::{Client, ClientError, RateAnswer};

use super::future::{Extra, Verdict};
use super::reply::{self, Quota};
use super::{Settings, limit_layer};

limit_layer!(
    RateLimitLayer,
    RateLimit,
    "Applies a rate limit to every request: one hit of `resource` for the \
     request's domain; a rejection is a 429 (gRPC `RESOURCE_EXHAUSTED`).",
    "Hits of `resource` in `namespace`, the domain from `x-tenant-id`."
);

/// One hit of `resource` for `domain`.
fn ask(
    client: &Client,
    namespace: &str,
    resource: String,
    domain: String,
) -> Pin<Box<dyn Future<Output = Result<RateAnswer, ClientError>> + Send>> {
    client.request(namespace, resource, domain).into_future()
}

fn verdict<D, R, B>(
    settings: &Settings<D, R>,
    grpc: bool,
    resource: String,
    answer: Result<RateAnswer, ClientError>,
) -> Verdict<B> {
    match answer {
        Ok(answer) if answer.unanswered && settings.fail_closed => {
            Verdict::Answer(reply::unavailable(grpc))
        }
        Ok(answer) if !answer.is_granted() => {
            let quota = rate_quota(&resource, &answer);
            Verdict::Answer(reply::rejected(
                grpc,
                "rate_limited",
                answer.retry_after,
                quota.as_ref(),
            ))
        }
        Ok(answer) => Verdict::Pass(Extra {
            quota: if settings.headers {
                rate_quota(&resource, &answer)
            } else {
                None
            },
            soft_limit: if answer.soft_limit_exceeded {
                http::HeaderValue::try_from(resource).ok()
            } else {
                None
            },
            hold: None,
        }),
        Err(error) => match reply::refused(grpc, &error, settings.fail_closed) {
            Some(response) => Verdict::Answer(response),
            None => Verdict::Pass(Extra::default()),
        },
    }
}

/// The quota headers of a rate answer (none when Charon did not answer or
/// the resource has no limit).
fn rate_quota(resource: &str, answer: &RateAnswer) -> Option<Quota> {
    let context = &answer.context;
    if answer.unanswered || context.tier_window_ms == 0 {
        return None;
    }
    let granted = answer.is_granted();
    Some(Quota {
        name: resource.to_owned(),
        limit: context.tier_limit,
        window: Some(Duration::from_millis(context.tier_window_ms)),
        remaining: if granted { context.remaining } else { 0 },
        reset: if granted {
            Some(Duration::from_millis(context.reset_after_ms))
        } else {
            answer.retry_after
        },
    })
}
