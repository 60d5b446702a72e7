//! `charon inject`: a Kubernetes mutating admission webhook that adds Charon
//! as a native sidecar to pods annotated `charon.io/inject: "true"` (and
//! the throttling sidecar in front of the app's port with
//! `charon.io/throttle: "PORT"`, [`throttle`]).
//!
//! It owns the HTTPS endpoint (`POST /mutate`, AdmissionReview v1 in and out,
//! JSONPatch; and the kit's `/healthz`, `/readyz` and `/metrics`, the
//! process's series), its certificate (reloaded when the files
//! change, see [`tls`]), and the decision ([`review`], pure). It is safe by
//! construction: a pod it does not understand is admitted unchanged and the
//! reason logged; a body that is not an AdmissionReview gets a 400 and a body
//! over 4 MiB a 413, after which the API server applies the webhook's
//! `failurePolicy: Ignore`.

pub mod review;
pub mod throttle;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use self::review::SidecarTemplate;
use crate::kit::admin;

/// Reviews larger than this are refused (413). The API server's own limit on
/// a request is 3 MiB.
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// What `charon inject` was asked to do.
#[derive(Debug, Clone)]
pub struct InjectOptions {
    pub addr: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub template: SidecarTemplate,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    #[error("TLS certificate: {0}")]
    Certificate(String),
    #[error("cannot listen: {0}")]
    Listen(String),
    #[error("the webhook server failed: {0}")]
    Serve(String),
}

/// The webhook's routes (tests drive them without TLS).
pub fn router(template: SidecarTemplate) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Arc::new(template))
        // Ready as soon as it listens; its series are the process's.
        .merge(admin::router(
            admin::always_ready(),
            admin::registries(Vec::new()),
        ))
}

async fn mutate(State(template): State<Arc<SidecarTemplate>>, body: Bytes) -> Response {
    match review::review(&body, &template) {
        Ok(verdict) => {
            let uid = verdict.response["response"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if verdict.patched {
                tracing::info!(%uid, "injected the charon sidecar");
            } else {
                tracing::info!(%uid, reason = %verdict.reason, "admitted unchanged");
            }
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                verdict.response.to_string(),
            )
                .into_response()
        }
        Err(error) => {
            tracing::warn!(%error, bytes = body.len(), "refused a request that is not an AdmissionReview");
            (StatusCode::BAD_REQUEST, format!("{error}\n")).into_response()
        }
    }
}

/// Serves the webhook until SIGTERM or SIGINT.
pub async fn run(options: InjectOptions) -> Result<(), InjectError> {
    let certificate = crate::kit::certificate::ReloadingCert::watch(
        options.tls_cert.clone(),
        options.tls_key.clone(),
    )
    .map_err(|error| InjectError::Certificate(error.to_string()))?;
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|error| InjectError::Listen(format!("{}: {error}", options.addr)))?;
    let listener = tls::TlsListener::new(listener, certificate)?;
    tracing::info!(addr = %options.addr, image = %options.template.image, "charon inject serving /mutate");
    axum::serve(listener, router(options.template))
        .with_graceful_shutdown(crate::kit::shutdown_signal())
        .await
        .map_err(|error| InjectError::Serve(error.to_string()))
}
