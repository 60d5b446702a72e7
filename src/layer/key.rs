//! Which domain (tenant) and which resource a request is. Both are traits
//! over the request, with ready-made sources and a blanket impl for
//! closures, so any rule fits.

use std::net::SocketAddr;

use http::header::HeaderName;
use http::{Request, StatusCode};

use crate::limiter::caps::MAX_STRING_BYTES;

/// The domain of a request; `None` when it has none.
pub trait DomainOf<B>: Send + Sync + 'static {
    fn domain_of(&self, request: &Request<B>) -> Option<String>;
}

impl<B, F> DomainOf<B> for F
where
    F: Fn(&Request<B>) -> Option<String> + Send + Sync + 'static,
{
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        self(request)
    }
}

/// The resource a request asks for.
pub trait ResourceOf<B>: Send + Sync + 'static {
    fn resource_of(&self, request: &Request<B>) -> String;
}

impl<B, F> ResourceOf<B> for F
where
    F: Fn(&Request<B>) -> String + Send + Sync + 'static,
{
    fn resource_of(&self, request: &Request<B>) -> String {
        self(request)
    }
}

/// The domain is a header's value (default `x-tenant-id`); empty or not
/// UTF-8 counts as missing.
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    pub fn new(name: HeaderName) -> Self {
        Self(name)
    }
}

impl Default for Header {
    fn default() -> Self {
        Self(HeaderName::from_static("x-tenant-id"))
    }
}

impl<B> DomainOf<B> for Header {
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        let value = request.headers().get(&self.0)?.to_str().ok()?.trim();
        (!value.is_empty()).then(|| value.to_owned())
    }
}

/// The domain is a cookie's value (a session or client id); a request
/// without it, or with an empty one, has none.
#[derive(Debug, Clone)]
pub struct Cookie(String);

impl Cookie {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }
}

impl<B> DomainOf<B> for Cookie {
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        request
            .headers()
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|line| line.split(';'))
            .filter_map(|pair| pair.split_once('='))
            .find(|(name, _)| name.trim() == self.0)
            .map(|(_, value)| value.trim().trim_matches('"'))
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
    }
}

/// The domain is the client's region, from a header an edge sets (a CDN's
/// country or region header), or `fallback` when the header is missing or
/// empty.
#[derive(Debug, Clone)]
pub struct Region {
    header: HeaderName,
    fallback: String,
}

impl Region {
    pub fn new(header: HeaderName, fallback: impl Into<String>) -> Self {
        Self {
            header,
            fallback: fallback.into(),
        }
    }
}

impl<B> DomainOf<B> for Region {
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        Header::new(self.header.clone())
            .domain_of(request)
            .or_else(|| Some(self.fallback.clone()))
            .filter(|region| !region.is_empty())
    }
}

/// The domain is the client's IP address: from axum's `ConnectInfo`
/// (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's
/// `TcpConnectInfo`, or a `SocketAddr` extension.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerAddr;

impl<B> DomainOf<B> for PeerAddr {
    fn domain_of(&self, request: &Request<B>) -> Option<String> {
        Some(peer_ip(request)?.to_string())
    }
}

/// The socket peer's address, from the extensions [`PeerAddr`] reads.
pub(super) fn peer_ip<B>(request: &Request<B>) -> Option<std::net::IpAddr> {
    {
        let extensions = request.extensions();
        #[cfg(feature = "axum")]
        let from_axum = extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|info| info.0);
        #[cfg(not(feature = "axum"))]
        let from_axum = None;
        let address = from_axum
            .or_else(|| {
                extensions
                    .get::<tonic::transport::server::TcpConnectInfo>()
                    .and_then(|info| info.remote_addr())
            })
            .or_else(|| extensions.get::<SocketAddr>().copied())?;
        Some(address.ip())
    }
}

/// One resource for every request.
#[derive(Debug, Clone)]
pub struct Fixed(String);

impl Fixed {
    pub fn new(resource: impl Into<String>) -> Self {
        Self(resource.into())
    }
}

impl<B> ResourceOf<B> for Fixed {
    fn resource_of(&self, _: &Request<B>) -> String {
        self.0.clone()
    }
}

/// The resource is `METHOD route`: `GET /users/{id}` with axum's matched
/// route (feature `axum`; the layer added with `Router::layer` or
/// `route_layer`), else the request's path. Configure those names as resources, or let the
/// namespace `allow_unconfigured`; a request whose resource is not
/// configured is not limited.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodAndRoute;

impl<B> ResourceOf<B> for MethodAndRoute {
    fn resource_of(&self, request: &Request<B>) -> String {
        #[cfg(feature = "axum")]
        let route = request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or_else(|| request.uri().path(), |matched| matched.as_str());
        #[cfg(not(feature = "axum"))]
        let route = request.uri().path();
        format!("{} {route}", request.method())
    }
}

/// What to do with a request that has no domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissingDomain {
    /// Count it in this one domain, shared by all such requests.
    Shared(String),
    /// Answer this status (400, 401) without asking Charon.
    Reject(StatusCode),
}

impl Default for MissingDomain {
    fn default() -> Self {
        MissingDomain::Shared("anonymous".into())
    }
}

/// The domain to ask for, or the status to answer without asking.
pub(super) fn resolve_domain(
    found: Option<String>,
    missing: &MissingDomain,
) -> Result<String, StatusCode> {
    match found {
        Some(domain) if domain.len() > MAX_STRING_BYTES => Err(StatusCode::BAD_REQUEST),
        Some(domain) => Ok(domain),
        None => match missing {
            MissingDomain::Shared(domain) => Ok(domain.clone()),
            MissingDomain::Reject(status) => Err(*status),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tenant: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().uri("/users/7");
        if let Some(tenant) = tenant {
            builder = builder.header("x-tenant-id", tenant);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn header_domains_ignore_blank_values() {
        assert_eq!(
            Header::default().domain_of(&request(Some("acme"))),
            Some("acme".into())
        );
        assert_eq!(Header::default().domain_of(&request(Some("  "))), None);
        assert_eq!(Header::default().domain_of(&request(None)), None);
    }

    #[test]
    fn cookies_and_regions_are_sources() {
        let request = Request::builder()
            .header("cookie", "theme=dark; session=\"abc123\"")
            .header("cookie", "other=1")
            .header("x-region", "eu-west")
            .body(())
            .unwrap();
        assert_eq!(
            Cookie::new("session").domain_of(&request).as_deref(),
            Some("abc123")
        );
        assert_eq!(
            Cookie::new("other").domain_of(&request).as_deref(),
            Some("1")
        );
        assert_eq!(Cookie::new("missing").domain_of(&request), None);
        let huge = Request::builder()
            .header("cookie", "x=".repeat(32 * 1024))
            .body(())
            .unwrap();
        assert_eq!(Cookie::new("session").domain_of(&huge), None);
        let region = Region::new(HeaderName::from_static("x-region"), "elsewhere");
        assert_eq!(region.domain_of(&request).as_deref(), Some("eu-west"));
        assert_eq!(region.domain_of(&huge).as_deref(), Some("elsewhere"));
    }

    #[test]
    fn closures_are_sources() {
        let by_path = |request: &Request<()>| Some(request.uri().path().to_owned());
        assert_eq!(by_path.domain_of(&request(None)), Some("/users/7".into()));
        let fixed = |_: &Request<()>| "pages".to_owned();
        assert_eq!(fixed.resource_of(&request(None)), "pages");
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_addresses_come_from_extensions() {
        let mut with_peer = request(None);
        with_peer
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::from((
                [10, 0, 0, 7],
                5000,
            ))));
        assert_eq!(PeerAddr.domain_of(&with_peer), Some("10.0.0.7".into()));
        assert_eq!(PeerAddr.domain_of(&request(None)), None);
    }

    #[test]
    fn a_socket_address_extension_is_a_peer_address() {
        let mut with_peer = request(None);
        with_peer
            .extensions_mut()
            .insert(SocketAddr::from(([10, 0, 0, 8], 5000)));
        assert_eq!(PeerAddr.domain_of(&with_peer), Some("10.0.0.8".into()));
    }

    #[test]
    fn routes_fall_back_to_the_path() {
        assert_eq!(MethodAndRoute.resource_of(&request(None)), "GET /users/7");
    }

    #[test]
    fn missing_and_oversized_domains() {
        let shared = MissingDomain::default();
        assert_eq!(resolve_domain(None, &shared), Ok("anonymous".into()));
        let reject = MissingDomain::Reject(StatusCode::UNAUTHORIZED);
        assert_eq!(resolve_domain(None, &reject), Err(StatusCode::UNAUTHORIZED));
        let huge = "x".repeat(MAX_STRING_BYTES + 1);
        assert_eq!(
            resolve_domain(Some(huge), &shared),
            Err(StatusCode::BAD_REQUEST)
        );
    }
}
