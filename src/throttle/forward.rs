//! Forwarding to the one upstream: the request goes on as it came (HTTP/1.1
//! as HTTP/1.1, h2c as h2c), its body as [`super::buffer`] read it, without
//! the hop-by-hop headers; the upstream's answer comes back streamed. What the
//! upstream cannot answer becomes the proxy's own answer: 502 when it
//! refused, reset or answered something that is not HTTP, 504 when it gave
//! no response headers in time. An upgrade (WebSocket) is passed through:
//! once both sides agreed (101), the two connections are joined and bytes
//! flow both ways until either closes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::ProxyCounts;

/// The body of a request the proxy forwards: read whole
/// ([`super::buffer::read_request`]).
pub type Buffered = Full<Bytes>;

/// What the proxy answers with: the upstream's body, or its own.
pub type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The headers of one hop only (RFC 9110 §7.6.1), never forwarded as such.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Sends every request to one upstream, over HTTP/1.1 or h2c as it came.
#[derive(Clone)]
pub struct Forward {
    shared: Arc<Shared>,
}

struct Shared {
    /// The upstream's scheme and authority.
    upstream: Uri,
    http1: Client<HttpConnector, Buffered>,
    h2c: Client<HttpConnector, Buffered>,
    /// The longest the upstream may take to send its response headers.
    timeout: Duration,
    counts: Arc<ProxyCounts>,
}

impl Forward {
    /// Forwards to `upstream` (`http://host:port`), waiting at most
    /// `timeout` for response headers.
    pub fn new(upstream: Uri, timeout: Duration, counts: Arc<ProxyCounts>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let http1 = Client::builder(TokioExecutor::new()).build(connector.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        Self {
            shared: Arc::new(Shared {
                upstream,
                http1,
                h2c,
                timeout,
                counts,
            }),
        }
    }
}

impl tower::Service<Request<Buffered>> for Forward {
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Buffered>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { Ok(shared.forward(request).await) })
    }
}

impl Shared {
    async fn forward(&self, mut request: Request<Buffered>) -> Response<ProxyBody> {
        let upgrade = upgrade_of(request.headers());
        let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
        let h2 = request.version() == Version::HTTP_2;
        let (mut parts, body) = request.into_parts();
        parts.uri = match self.upstream_uri(&parts.uri) {
            Ok(uri) => uri,
            Err(message) => return own_answer(StatusCode::BAD_REQUEST, message),
        };
        strip_hop_by_hop(&mut parts.headers);
        if let Some(upgrade) = &upgrade {
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, upgrade.clone());
        }
        // The client speaks to the upstream's authority; HTTP/2 carries it
        // in the URI, HTTP/1.1 in Host (kept as the caller sent it).
        parts.version = if h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        let client = if h2 { &self.h2c } else { &self.http1 };
        let sent = client.request(Request::from_parts(parts, body));
        let mut response = match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => {
                self.counts.upstream_failed();
                tracing::debug!(error = %error_chain(&error), "the upstream did not answer");
                return own_answer(StatusCode::BAD_GATEWAY, "the upstream did not answer");
            }
            Err(_) => {
                self.counts.upstream_timed_out();
                return own_answer(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the upstream gave no answer in time",
                );
            }
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_side) = client_side
        {
            let upstream_side = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                let (Ok(client), Ok(upstream)) = (client_side.await, upstream_side.await) else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(
                    &mut TokioIo::new(client),
                    &mut TokioIo::new(upstream),
                )
                .await;
            });
            return response.map(|_| empty());
        }
        strip_hop_by_hop(response.headers_mut());
        response.map(|body| body.map_err(Into::into).boxed())
    }

    /// `uri`'s path and query on the upstream.
    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, &'static str> {
        let path = uri.path_and_query().map_or("/", |path| path.as_str());
        let mut parts = self.upstream.clone().into_parts();
        parts.path_and_query = Some(
            path.parse()
                .map_err(|_| "a request target that is not a path")?,
        );
        Uri::from_parts(parts).map_err(|_| "a request target that is not a path")
    }
}

/// The protocol a request asks to upgrade to, if it asks (HTTP/1.1 only).
fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    if asks {
        headers.get(header::UPGRADE).cloned()
    } else {
        None
    }
}

/// Removes the hop-by-hop headers, and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}

fn empty() -> ProxyBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

/// An answer of the proxy's own, as plain text.
pub fn own_answer(status: StatusCode, message: &'static str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from_static(message.as_bytes()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert("x-criticality", HeaderValue::from_static("critical"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1, "{headers:?}");
        assert!(headers.contains_key("x-criticality"));
    }

    #[test]
    fn an_upgrade_is_asked_by_connection_and_upgrade_together() {
        let mut headers = HeaderMap::new();
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_of(&headers), None);
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert_eq!(
            upgrade_of(&headers),
            Some(HeaderValue::from_static("websocket"))
        );
    }
}
