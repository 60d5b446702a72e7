//! What a layer does with a request over its limit ([`Exceed`]): refuse it
//! (429, gRPC `RESOURCE_EXHAUSTED`; the default), redirect it, or let it
//! through degraded, the handler told by an [`OverLimit`] in the request's
//! extensions so that it serves a reduced answer. A request past a soft
//! limit carries a [`SoftLimitExceeded`] the same way, so the handler sees
//! the warning before it answers (the response still gets the
//! `x-charon-soft-limit` header).

use std::time::Duration;

use http::header::LOCATION;
use http::{HeaderValue, Response, StatusCode};

use super::ResponseBody;

/// What a layer does with a request over its limit.
#[derive(Debug, Clone, Default)]
pub enum Exceed {
    /// 429 with `Retry-After` and the quota headers (gRPC:
    /// `RESOURCE_EXHAUSTED`).
    #[default]
    Reject,
    /// A redirect to `location` (303 or 307; gRPC requests are refused
    /// instead, as gRPC has no redirects).
    Redirect {
        location: HeaderValue,
        status: StatusCode,
    },
    /// Call the service anyway, with an [`OverLimit`] in the request's
    /// extensions; nothing is counted for it.
    Degrade,
}

impl Exceed {
    /// A redirect to `location` with `303 See Other`.
    pub fn redirect(location: &'static str) -> Self {
        Self::Redirect {
            location: HeaderValue::from_static(location),
            status: StatusCode::SEE_OTHER,
        }
    }
}

/// In a degraded request's extensions: it is over its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    /// When a request would pass again, if known.
    pub retry_after: Option<Duration>,
}

/// In a granted request's extensions: it is past a soft limit of this
/// resource (docs/design.md#soft-limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftLimitExceeded {
    pub resource: String,
}

/// The redirect `exceed` makes of a refusal, if it redirects.
pub(super) fn redirect<B>(exceed: &Exceed, grpc: bool) -> Option<Response<ResponseBody<B>>> {
    match exceed {
        Exceed::Redirect { location, status } if !grpc => {
            let mut response = Response::new(ResponseBody::empty());
            *response.status_mut() = *status;
            response.headers_mut().insert(LOCATION, location.clone());
            Some(response)
        }
        _ => None,
    }
}
