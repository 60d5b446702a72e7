//! The sidecar: Envoy's RateLimitService and gRPC health on one port, admin
//! HTTP on another, configuration reload, and graceful shutdown on SIGTERM or
//! SIGINT (stop being ready, finish what is in flight, exit).

pub mod admin;
pub mod api;
pub mod metrics;
pub mod reload;
pub mod rls;
pub mod rls_http;
pub mod runtime;
pub mod simulator;
pub mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::v1::charon_server::CharonServer;
use crate::config::{self};
use crate::limiter::{Limiter, Modes};
use crate::store::Store;
use crate::store::copies::{CopyStore, CopyTimings};

use self::api::ApiService;
use self::metrics::Metrics;
use self::rls::{RlsOptions, RlsService};
use crate::service::core::Core;
use crate::service::store::{self, SidecarStore, StoreOptions};
use crate::service::{copy_resources, spawn_sweeper};

/// What `charon serve` was asked to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub config: PathBuf,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub store: StoreOptions,
    pub copies: CopyOptions,
    /// envoyproxy/ratelimit's switches: how files combine, shadow and quota
    /// modes, and what the RLS answer carries besides the decision.
    pub envoy: EnvoyOptions,
}

/// `--merge-domain-config`, `--shadow-mode`, `--quota-mode`,
/// `--response-headers` and `--response-dynamic-metadata`.
#[derive(Debug, Clone, Default)]
pub struct EnvoyOptions {
    pub load: config::LoadOptions,
    pub modes: Modes,
    pub rls: RlsOptions,
}

/// `--heartbeat`, `--heartbeat-ttl`, `--reap-interval`, `--max-sessions`.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    pub timings: CopyTimings,
    pub max_sessions: usize,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            timings: CopyTimings::default(),
            max_sessions: 10_000,
        }
    }
}

/// How long a stopping sidecar waits for its gRPC clients to go.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// How long a stopping sidecar waits for its sessions to release their holds.
const RELEASE_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// Runs the sidecar until SIGTERM or SIGINT.
pub async fn run(options: ServeOptions) -> anyhow::Result<()> {
    let loaded = config::load_path_with(&options.config, options.envoy.load)
        .map_err(|errors| anyhow::anyhow!("invalid configuration:\n{errors}"))?;
    for note in &loaded.notes {
        tracing::info!(%note, "normalized");
    }
    let metrics = Arc::new(Metrics::new());
    metrics.set_namespaces(loaded.config.namespaces().count());
    let store = SidecarStore::open(&options.store).context("cannot open --store")?;
    options
        .copies
        .timings
        .validate()
        .context("invalid copy-log timings")?;
    let copies = Arc::new(
        store::open_copies(&options.store, options.copies.timings)
            .context("cannot open --store")?,
    );
    store.settle().await;
    let limiter = Arc::new(Limiter::new(loaded.config, store).with_modes(options.envoy.modes));

    let grpc_listener = TcpListener::bind(options.grpc_addr)
        .await
        .with_context(|| format!("cannot listen on --grpc-addr {}", options.grpc_addr))?;
    let admin_listener = TcpListener::bind(options.admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {}", options.admin_addr))?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let ready = Arc::new(AtomicBool::new(false));
    let _watcher = reload::spawn(
        options.config.clone(),
        options.envoy.load,
        limiter.clone(),
        metrics.clone(),
        shutdown_rx.clone(),
    )?;
    spawn_sweeper(limiter.clone(), copies.clone(), shutdown_rx.clone());
    if let CopyStore::Redis(redis) = &*copies {
        let limiter = limiter.clone();
        redis.spawn(
            Arc::new(move || copy_resources(&limiter)),
            shutdown_rx.clone(),
        );
    }
    spawn_membership_metric(copies.clone(), metrics.clone());
    let api = ApiService::new(
        Arc::new(Core {
            limiter: limiter.clone(),
            copies: copies.clone(),
            observer: metrics.clone(),
        }),
        metrics.clone(),
        options.copies.max_sessions,
        shutdown_rx.clone(),
    );
    let open_sessions = api.open_sessions();

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RlsService<SidecarStore>>>()
        .await;
    health.set_serving::<CharonServer<ApiService>>().await;
    let (reflection, reflection_alpha) = reflection()?;
    let rls_service = RlsService::new(limiter.clone(), metrics.clone(), options.envoy.rls.clone());
    let rls = RateLimitServiceServer::new(rls_service.clone());
    let grpc = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            decode_errors_are_invalid_arguments as fn(_) -> _,
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(rls)
        .add_service(CharonServer::new(api))
        .serve_with_incoming_shutdown(grpc_incoming(grpc_listener), wait_for(shutdown_rx.clone()));
    let admin = axum::serve(
        admin_listener,
        admin::router(
            admin::AdminState {
                ready: ready.clone(),
                metrics: metrics.clone(),
                store_status: {
                    let limiter = limiter.clone();
                    Arc::new(move || limiter.store().status())
                },
            },
            state::StateSources {
                limiter: limiter.clone(),
                copies: copies.clone(),
            },
        )
        .merge(rls_http::router(rls_service)),
    )
    .with_graceful_shutdown(wait_for(shutdown_rx.clone()));

    let mut grpc_task = tokio::spawn(grpc);
    let mut admin_task = tokio::spawn(async move { admin.await });
    ready.store(true, Ordering::SeqCst);
    tracing::info!(
        grpc = %options.grpc_addr,
        admin = %options.admin_addr,
        config = %options.config.display(),
        store = limiter.store().name(),
        on_store_error = options.store.on_error.as_str(),
        "charon serving"
    );

    // Until a signal, or until a server stops on its own (then the process
    // must not stay alive looking ready).
    tokio::select! {
        () = shutdown_signal() => {}
        ended = &mut grpc_task => {
            ready.store(false, Ordering::SeqCst);
            ended?.context("gRPC server failed")?;
            anyhow::bail!("gRPC server stopped unexpectedly");
        }
        ended = &mut admin_task => {
            ready.store(false, Ordering::SeqCst);
            ended?.context("admin server failed")?;
            anyhow::bail!("admin server stopped unexpectedly");
        }
    }
    tracing::info!("shutting down: finishing requests in flight");
    ready.store(false, Ordering::SeqCst);
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<RateLimitServiceServer<RlsService<SidecarStore>>>()
        .await;
    health.set_not_serving::<CharonServer<ApiService>>().await;
    let _ = shutdown_tx.send(true);
    // A client that never reads its closed stream must not hold the process.
    match tokio::time::timeout(DRAIN_LIMIT, &mut grpc_task).await {
        Ok(ended) => ended?.context("gRPC server failed")?,
        Err(_) => {
            tracing::warn!(limit = ?DRAIN_LIMIT, "gRPC connections still open after the drain limit: closing them");
            grpc_task.abort();
        }
    }
    admin_task.await?.context("admin server failed")?;
    // Sessions end on the shutdown signal and release what they hold.
    let waiting = tokio::time::Instant::now();
    while open_sessions.load(Ordering::SeqCst) > 0 && waiting.elapsed() < RELEASE_ON_SHUTDOWN {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let CopyStore::Redis(redis) = &*copies {
        redis.deregister().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The gRPC port's connections, with Nagle's algorithm off: an answer is one
/// small write that must leave at once, not wait up to 40 ms for the
/// client's delayed ACK. (tonic sets `TCP_NODELAY` only on listeners it
/// binds itself; this one is bound before the configuration is served.)
fn grpc_incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// gRPC server reflection (v1, and v1alpha for older clients) of the Charon
/// API and gRPC health, so that grpcurl needs no proto files. Envoy's RLS is
/// not described: its descriptors are not shipped with the crate that
/// generates it (docs/envoy-compatibility.md#grpc-reflection-and-grpcurl).
fn reflection() -> anyhow::Result<(
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
)> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::api::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((
        builder()
            .build_v1()
            .context("cannot build gRPC reflection")?,
        builder()
            .build_v1alpha()
            .context("cannot build gRPC reflection")?,
    ))
}

/// tonic answers a request it cannot decode (bad protobuf, a string that is
/// not UTF-8) with INTERNAL, which tells clients to retry elsewhere. It is the
/// request that is wrong: answer INVALID_ARGUMENT, message unchanged.
fn decode_errors_are_invalid_arguments(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let headers = response.headers_mut();
    let internal = headers
        .get("grpc-status")
        .is_some_and(|status| status == "13");
    let decode_failure = headers.get("grpc-message").is_some_and(|message| {
        let message = message.as_bytes();
        message.starts_with(b"failed to decode") || message.starts_with(b"failed%20to%20decode")
    });
    if internal && decode_failure {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from(tonic::Code::InvalidArgument as i32),
        );
    }
    response
}

async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn spawn_membership_metric(copies: Arc<CopyStore>, metrics: Arc<Metrics>) {
    let mut membership = copies.membership();
    tokio::spawn(async move {
        loop {
            metrics.set_copy_log_registered(membership.borrow_and_update().serving);
            if membership.changed().await.is_err() {
                return;
            }
        }
    });
}

pub(crate) async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn grpc_connections_have_nagle_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let address = listener.local_addr().expect("an address");
        let mut incoming = super::grpc_incoming(listener);
        let _client = tokio::net::TcpStream::connect(address)
            .await
            .expect("connects");
        let accepted = incoming
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(accepted.nodelay().expect("readable"), "TCP_NODELAY is set");
    }
}
