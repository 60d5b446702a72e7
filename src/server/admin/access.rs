//! Who may use the admin routes that read tenant state or change anything
//! (`/debug/*`, the simulator's sessions): docs/operations.md#admin-access.
//!
//! - With `--admin-token-file`, every such request needs
//!   `Authorization: Bearer <token>`, compared in constant time; others get
//!   401.
//! - Without one, they answer only requests from a loopback address: from
//!   the machine (the pod), or through `kubectl port-forward`. From
//!   anywhere else they answer 401, so an admin port bound to `0.0.0.0` (as
//!   the Kubernetes manifests bind it, for probes and Prometheus) shows no
//!   tenant's state to the cluster.
//!
//! Probes and `/metrics` are never guarded: the kubelet and Prometheus hold
//! no token, and they reveal no tenant's state.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// Why the admin token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read --admin-token-file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("--admin-token-file {0} is empty")]
    Empty(String),
}

/// The rule for the guarded routes.
#[derive(Clone)]
pub enum Access {
    /// No token: served to loopback peers only.
    Loopback,
    /// Served with this bearer token, to anyone.
    Token(Arc<[u8]>),
}

impl Access {
    /// The rule with the token in `token_file` if one is given (its
    /// content, surrounding whitespace trimmed).
    pub fn new(token_file: Option<&Path>) -> Result<Self, TokenError> {
        let Some(path) = token_file else {
            return Ok(Access::Loopback);
        };
        let text = std::fs::read_to_string(path).map_err(|error| TokenError::Read {
            path: path.display().to_string(),
            error,
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty(path.display().to_string()));
        }
        Ok(Access::Token(token.as_bytes().into()))
    }

    fn check(&self, request: &Request) -> Result<(), &'static str> {
        match self {
            Access::Loopback => {
                let peer = request
                    .extensions()
                    .get::<ConnectInfo<SocketAddr>>()
                    .map(|info| info.0.ip());
                match peer {
                    Some(ip) if ip.is_loopback() => Ok(()),
                    _ => Err(
                        "this admin route reads tenant state: from another machine it needs \
                         the sidecar's --admin-token-file and Authorization: Bearer <token>",
                    ),
                }
            }
            Access::Token(token) => {
                let given = request
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.strip_prefix("Bearer "))
                    .map(str::trim);
                match given {
                    Some(given) if bool::from(given.as_bytes().ct_eq(token)) => Ok(()),
                    Some(_) => Err("wrong admin token"),
                    None => Err("this admin route needs Authorization: Bearer <admin token>"),
                }
            }
        }
    }
}

/// The middleware: `from_fn_with_state(access, guard)`.
pub async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    match access.check(&request) {
        Ok(()) => next.run(request).await,
        Err(message) => refused(message),
    }
}

fn refused(message: &'static str) -> Response {
    let mut response = (StatusCode::UNAUTHORIZED, format!("{message}\n")).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}
