//! What the layers answer without calling the service (rejections, missing
//! domains, Charon unreachable), and the quota headers they add:
//! `Retry-After` in whole seconds rounded up (at least 1), and
//! `RateLimit-Policy` / `RateLimit` as draft-ietf-httpapi-ratelimit-headers-11
//! writes them (`"name";q=5;w=10` and `"name";r=3;t=7`). A gRPC request gets
//! its status in `grpc-status` instead of an HTTP error.

use std::time::Duration;

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};

use crate::client::{ClientError, ErrorKind};

use super::ResponseBody;

pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// On granted responses past the resource's `soft_limit`
/// (docs/design.md#soft-limits): the
/// resource's name. The same header the sidecar asks Envoy to add.
pub static SOFT_LIMIT: HeaderName = HeaderName::from_static("x-charon-soft-limit");

/// One quota, as the headers describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// The policy's name: the resource.
    pub name: String,
    /// `q`: requests (or copies) the policy allows.
    pub limit: u64,
    /// `w`: its window (`None` for concurrency: no window).
    pub window: Option<Duration>,
    /// `r`: what is left of it.
    pub remaining: u64,
    /// `t`: until it is whole again.
    pub reset: Option<Duration>,
}

impl Quota {
    /// Adds `RateLimit-Policy` and `RateLimit`.
    pub fn write(&self, headers: &mut HeaderMap) {
        // Per request, so no `format!`: two small strings built in place.
        let mut policy = String::with_capacity(self.name.len() + 32);
        self.push_policy(&mut policy);
        let mut current = String::with_capacity(self.name.len() + 32);
        self.push_current(&mut current);
        insert(headers, policy, current);
    }

    /// `RateLimit-Policy` naming every one of `quotas` (the draft lets a
    /// server list each policy a request was under), and `RateLimit` for
    /// `tightest`, the one closest to refusing it.
    pub fn write_every(quotas: &[Quota], tightest: &Quota, headers: &mut HeaderMap) {
        let mut policy = String::with_capacity(quotas.len() * 48);
        for (index, quota) in quotas.iter().enumerate() {
            if index > 0 {
                policy.push_str(", ");
            }
            quota.push_policy(&mut policy);
        }
        let mut current = String::with_capacity(tightest.name.len() + 32);
        tightest.push_current(&mut current);
        insert(headers, policy, current);
    }

    /// `"name";q=5;w=10`: the policy, as a list member.
    fn push_policy(&self, out: &mut String) {
        let mut numbers = itoa::Buffer::new();
        out.push_str(&sf_string(&self.name));
        out.push_str(";q=");
        out.push_str(numbers.format(self.limit));
        if let Some(window) = self.window {
            out.push_str(";w=");
            out.push_str(numbers.format(whole_seconds(window).max(1)));
        }
    }

    /// `"name";r=3;t=7`: what is left of it now.
    fn push_current(&self, out: &mut String) {
        let mut numbers = itoa::Buffer::new();
        out.push_str(&sf_string(&self.name));
        out.push_str(";r=");
        out.push_str(numbers.format(self.remaining));
        if let Some(reset) = self.reset {
            out.push_str(";t=");
            out.push_str(numbers.format(whole_seconds(reset)));
        }
    }
}

fn insert(headers: &mut HeaderMap, policy: String, current: String) {
    for (header, value) in [(&RATELIMIT_POLICY, policy), (&RATELIMIT, current)] {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(header.clone(), value);
        }
    }
}

/// Seconds, rounded up.
pub fn whole_seconds(duration: Duration) -> u64 {
    duration
        .as_millis()
        .div_ceil(1000)
        .try_into()
        .unwrap_or(u64::MAX)
}

/// The `Retry-After` value: whole seconds rounded up, at least 1.
pub fn retry_after_seconds(retry_after: Option<Duration>) -> u64 {
    retry_after.map_or(1, |after| whole_seconds(after).max(1))
}

/// A structured-field string (RFC 8941): printable ASCII, with `"` and `\`
/// escaped; anything else becomes `?`.
pub(crate) fn sf_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                quoted.push('\\');
                quoted.push(c);
            }
            ' '..='~' => quoted.push(c),
            _ => quoted.push('?'),
        }
    }
    quoted.push('"');
    quoted
}

/// Whether the request is gRPC (answered with a `grpc-status`).
pub fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// A rejection: 429 (gRPC: `RESOURCE_EXHAUSTED`) with its headers and a JSON
/// body `{"error":…,"retry_after_ms":…}`.
pub(super) fn rejected<B>(
    grpc: bool,
    error: &str,
    retry_after: Option<Duration>,
    quota: Option<&Quota>,
) -> Response<ResponseBody<B>> {
    let retry_after_ms =
        retry_after.map_or_else(|| "null".to_owned(), |after| after.as_millis().to_string());
    let mut response = if grpc {
        grpc_status(8, &format!("{error}: retry after {retry_after_ms} ms"))
    } else {
        let body = format!(r#"{{"error":"{error}","retry_after_ms":{retry_after_ms}}}"#);
        let mut response = Response::new(ResponseBody::full(body.into()));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    };
    let headers = response.headers_mut();
    headers.insert(
        RETRY_AFTER,
        HeaderValue::from(retry_after_seconds(retry_after)),
    );
    if let Some(quota) = quota {
        quota.write(headers);
    }
    response
}

/// An error answered by the layer itself (missing domain, Charon
/// unreachable with fail-closed, a misconfigured layer).
pub(super) fn failed<B>(
    grpc: bool,
    status: StatusCode,
    message: &str,
) -> Response<ResponseBody<B>> {
    if grpc {
        let code = match status {
            StatusCode::BAD_REQUEST => 3,
            StatusCode::UNAUTHORIZED => 16,
            StatusCode::FORBIDDEN => 7,
            StatusCode::SERVICE_UNAVAILABLE => 14,
            StatusCode::INTERNAL_SERVER_ERROR => 13,
            _ => 2,
        };
        return grpc_status(code, message);
    }
    let body = format!(r#"{{"error":"{}"}}"#, message.replace(['"', '\\'], "'"));
    let mut response = Response::new(ResponseBody::full(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A trailers-only gRPC response: the status in the headers.
fn grpc_status<B>(code: u16, message: &str) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    // grpc-message is percent-encoded: keep it to plain printable ASCII.
    let message: String = message
        .chars()
        .map(|c| {
            if (' '..='~').contains(&c) && c != '%' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if let Ok(message) = HeaderValue::try_from(message) {
        headers.insert("grpc-message", message);
    }
    response
}

pub(super) fn unavailable<B>(grpc: bool) -> Response<ResponseBody<B>> {
    failed(
        grpc,
        http::StatusCode::SERVICE_UNAVAILABLE,
        "rate limiter unavailable",
    )
}

/// What a failed call becomes: `None` lets the request through.
pub(super) fn refused<B>(
    grpc: bool,
    error: &ClientError,
    fail_closed: bool,
) -> Option<Response<ResponseBody<B>>> {
    match error {
        ClientError::Unavailable(_) if fail_closed => Some(unavailable(grpc)),
        ClientError::Unavailable(_) => None,
        // As in Envoy: what no limit is configured for is not limited.
        ClientError::Refused {
            kind: ErrorKind::UnknownResource,
            ..
        } => None,
        ClientError::Refused {
            kind: ErrorKind::Malformed,
            message,
        } => Some(failed(grpc, http::StatusCode::BAD_REQUEST, message)),
        other => {
            tracing::error!(error = %other, "charon refused the layer's call: check the layer's resource and the configuration");
            Some(failed(
                grpc,
                http::StatusCode::INTERNAL_SERVER_ERROR,
                "rate limiter misconfigured",
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        let ms = Duration::from_millis;
        assert_eq!(retry_after_seconds(Some(ms(0))), 1);
        assert_eq!(retry_after_seconds(Some(ms(1))), 1);
        assert_eq!(retry_after_seconds(Some(ms(1000))), 1);
        assert_eq!(retry_after_seconds(Some(ms(1001))), 2);
        assert_eq!(retry_after_seconds(Some(ms(9_999))), 10);
        assert_eq!(retry_after_seconds(None), 1);
    }

    #[test]
    fn quota_headers_follow_the_draft() {
        let mut headers = HeaderMap::new();
        Quota {
            name: "api".into(),
            limit: 5,
            window: Some(Duration::from_secs(10)),
            remaining: 2,
            reset: Some(Duration::from_millis(6_500)),
        }
        .write(&mut headers);
        assert_eq!(headers["ratelimit-policy"], r#""api";q=5;w=10"#);
        assert_eq!(headers["ratelimit"], r#""api";r=2;t=7"#);

        let mut headers = HeaderMap::new();
        Quota {
            name: "we\"ird ünï".into(),
            limit: 2,
            window: None,
            remaining: 0,
            reset: None,
        }
        .write(&mut headers);
        assert_eq!(headers["ratelimit-policy"], r#""we\"ird ?n?";q=2"#);
        assert_eq!(headers["ratelimit"], r#""we\"ird ?n?";r=0"#);
    }

    #[test]
    fn every_policy_is_listed_and_the_tightest_is_current() {
        let per_second = Quota {
            name: "per-ip".into(),
            limit: 10,
            window: Some(Duration::from_secs(1)),
            remaining: 9,
            reset: Some(Duration::from_millis(400)),
        };
        let per_hour = Quota {
            name: "per-user".into(),
            limit: 1000,
            window: Some(Duration::from_secs(3600)),
            remaining: 2,
            reset: Some(Duration::from_secs(1800)),
        };
        let mut headers = HeaderMap::new();
        Quota::write_every(&[per_second, per_hour.clone()], &per_hour, &mut headers);
        assert_eq!(
            headers["ratelimit-policy"],
            r#""per-ip";q=10;w=1, "per-user";q=1000;w=3600"#
        );
        assert_eq!(headers["ratelimit"], r#""per-user";r=2;t=1800"#);
    }
}
