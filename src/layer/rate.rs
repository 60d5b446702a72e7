//! [`RateLimitLayer`]: one hit per request on a rate-limited resource.

use std::future::IntoFuture;
use std::time::Duration;

use crate::client::{Client, ClientError, RateAnswer};

use super::limit::{Limit, LimitLayer};
use super::policy::{Deciding, Options};
use super::policy::{Extra, Verdict};
use super::reply::{self, Quota};
use super::resource::{Kind, PerResource};
use super::{Fixed, Header};

/// Applies a rate limit to every request: one hit of a resource for the
/// request's domain; a rejection is a 429 (gRPC `RESOURCE_EXHAUSTED`).
pub type RateLimitLayer<D = Header, R = Fixed> = LimitLayer<PerResource<Hits, D, R>>;

/// The service of [`RateLimitLayer`].
pub type RateLimit<S, D = Header, R = Fixed> = Limit<S, PerResource<Hits, D, R>>;

impl RateLimitLayer {
    /// Hits of `resource` in `namespace`, the domain from `x-tenant-id`.
    pub fn new(client: Client, namespace: &str, resource: impl Into<String>) -> Self {
        Self::per_resource(client, namespace, resource, Hits::default())
    }
}

/// One hit per request; waited for up to `max_wait`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hits {
    max_wait: Duration,
}

impl<D, R> LimitLayer<PerResource<Hits, D, R>> {
    /// Over the limit, waits up to `max_wait` for the next refill (the
    /// server's `retry_after`, asked again then, with the client's jittered
    /// backoff) before the request is refused, redirected or degraded; once
    /// `max_wait` is spent, it is answered as its last try came out.
    /// Default: no wait (docs/client-and-layer.md#waiting-a-bounded-time).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.map_kind(|_| Hits { max_wait })
    }
}

impl Kind for Hits {
    type Decided = Result<RateAnswer, ClientError>;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        resource: String,
        domain: String,
    ) -> Deciding<Self::Decided> {
        client
            .request(namespace, resource, domain)
            .max_wait(self.max_wait)
            .into_future()
    }

    fn verdict<B>(
        resource: String,
        answer: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<B> {
        verdict(resource, answer, grpc, options)
    }
}

fn verdict<B>(
    resource: String,
    answer: Result<RateAnswer, ClientError>,
    grpc: bool,
    options: Options,
) -> Verdict<B> {
    match answer {
        Ok(answer) if answer.unanswered && options.fail_closed => {
            Verdict::Answer(reply::unavailable(grpc))
        }
        Ok(answer) if !answer.is_granted() => {
            let quota = rate_quota(&resource, &answer);
            Verdict::Exceeded {
                retry_after: answer.retry_after,
                refusal: reply::rejected(grpc, "rate_limited", answer.retry_after, quota.as_ref()),
            }
        }
        Ok(answer) => Verdict::Pass(Extra {
            quota: if options.granted_headers {
                rate_quota(&resource, &answer)
            } else {
                None
            },
            soft_limit: if answer.soft_limit_exceeded {
                http::HeaderValue::try_from(resource).ok()
            } else {
                None
            },
            ..Extra::default()
        }),
        Err(error) => match reply::refused(grpc, &error, options.fail_closed) {
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
