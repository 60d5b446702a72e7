//! The sidecar, `charon serve`: on the gRPC port Envoy's RateLimitService
//! ([`rls`]), its quota service ([`rlqs`]), the Charon API ([`api`]), health; admin HTTP ([`admin`], [`metrics`]); files reloaded ([`reload`])
//! or xDS ([`xds`]); a parent ([`parent`]); traces ([`trace`]); upstream's
//! environment variables as `serve`'s flags ([`upstream_env`]); graceful
//! shutdown on SIGTERM or SIGINT (unready, finish what is in flight, exit).
//!
//! One piece: `charon serve` is one sequence, start, serve, stop, whose
//! steps hand each other what they opened (listeners, stores, shutdown).

pub mod admin;
pub mod api;
pub mod decision_log;
pub mod metrics;
pub mod parent;
mod process;
pub mod reload;
pub mod rlqs;
pub mod rls;
mod session;
mod shutdown;
pub mod trace;
pub mod upstream_env;
pub mod xds;

use crate::kit::{listen, resident, shutdown_signal};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::v1::charon_server::CharonServer;
use crate::config::{self};
use crate::limiter::Modes;
use crate::store::Store;
use crate::store::copies::{CopyLog, CopyTimings};

use self::api::ApiService;
use self::metrics::Metrics;
pub use self::process::run_process;
use self::rls::{RlsOptions, RlsService};
use crate::service::Service;
use crate::service::configuration::Configuration;
use crate::store::open::{SidecarStore, StoreOptions, Stores};

/// What `charon serve` was asked to do.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub config: PathBuf,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The bearer token of the admin routes that read tenant state
    /// (see [`admin::access`]).
    pub admin_token_file: Option<PathBuf>,
    /// The metrics' own listener, and envoyproxy/ratelimit's series.
    pub metrics: metrics::MetricsOptions,
    /// Where the configuration API keeps its changes on the memory store
    /// (none: in memory only).
    pub config_state: Option<PathBuf>,
    pub grpc: GrpcOptions,
    pub store: StoreOptions,
    pub copies: CopyOptions,
    /// envoyproxy/ratelimit's switches: how files combine, shadow and quota
    /// modes, and what the RLS answer carries besides the decision.
    pub envoy: EnvoyOptions,
    /// Namespaces pushed by a control plane over xDS, besides the files.
    pub xds: Option<xds::XdsOptions>,
    /// The parent server of a hierarchy, if any.
    pub parent: Option<ParentOptions>,
    /// How this server leases global limits' shares
    /// (`--global-refresh-interval`, `--global-lease`).
    pub global_timing: crate::config::global::GlobalTiming,
    /// After SIGTERM, how long to answer while not ready (a Service drops
    /// the endpoint meanwhile), before the gRPC port stops taking calls.
    pub shutdown_delay: Duration,
}

/// `--parent` and `--level-id` (docs/design.md#a-hierarchy-of-servers).
#[derive(Debug, Clone)]
pub struct ParentOptions {
    /// The parent's gRPC URL.
    pub url: String,
    /// Who this level is to the parent.
    pub level_id: String,
}

/// What one gRPC connection may ask of the sidecar
/// (docs/configuration.md#caps-on-input).
#[derive(Debug, Clone)]
pub struct GrpcOptions {
    /// Streams in flight per HTTP/2 connection; more wait in the client.
    pub max_concurrent_streams: u32,
    /// HTTP/2 pings on an idle connection, to find peers that vanished.
    pub keepalive_interval: Duration,
    /// Connections older than this are closed gracefully (none: never). A
    /// Charon API session ends with its connection, releasing its holds.
    pub max_connection_age: Option<Duration>,
    /// TLS on the gRPC port, with client certificates when it names a CA.
    pub tls: Option<listen::TlsOptions>,
    /// A Unix socket beside the TCP port.
    pub uds: Option<listen::UdsOptions>,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        Self {
            max_concurrent_streams: 1024,
            keepalive_interval: Duration::from_secs(30),
            max_connection_age: None,
            tls: None,
            uds: None,
        }
    }
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

/// Runs the sidecar until SIGTERM or SIGINT: start, serve, stop.
pub async fn run(options: ServeOptions) -> anyhow::Result<()> {
    let started = start(&options).await?;
    let mut serving = serve(started, &options).await?;
    tokio::spawn(release_startup_pages());
    shutdown::until_signal(&mut serving).await?;
    let stopped = shutdown::stop(serving, options.shutdown_delay).await;
    if let Some(uds) = &options.grpc.uds {
        listen::remove_uds(&uds.path);
    }
    stopped
}

/// Gives back the pages only starting ran, a moment after start
/// (docs/performance.md#the-sidecars-resident-memory).
async fn release_startup_pages() {
    tokio::time::sleep(resident::AFTER_START).await;
    if let Ok(released) = tokio::task::spawn_blocking(resident::release_startup_pages).await {
        tracing::info!(
            mappings = released.mappings,
            kib = released.bytes / 1024,
            "startup pages released"
        );
    }
}

/// What `start` sets up: the configuration, the stores and the limiter,
/// the bound ports and the background tasks, before anything is served.
struct Started {
    service: Arc<Service>,
    metrics: Arc<Metrics>,
    grpc_listener: TcpListener,
    admin_listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    grpc_tls: Option<listen::Tls>,
    grpc_uds: Option<tokio::net::UnixListener>,
    access: admin::access::Access,
    configuration: Arc<Configuration>,
    shutdown_tx: watch::Sender<bool>,
    shutdown_rx: watch::Receiver<bool>,
    /// Config reload, for as long as the sidecar runs (none when there are
    /// no files to watch: namespaces come over xDS).
    watcher: Option<notify::RecommendedWatcher>,
    /// Set once the first xDS snapshot is applied: readiness waits for it.
    xds_applied: Option<watch::Receiver<bool>>,
}

/// Loads the configuration, opens the stores, binds both ports and starts
/// reload, the sweeper and the copy log's membership. Any failure here stops
/// the process before it answers anything.
async fn start(options: &ServeOptions) -> anyhow::Result<Started> {
    // The files alone first: a broken file stops the sidecar whatever the
    // configuration API holds.
    config::load_path_with(&options.config, options.envoy.load)
        .map_err(|errors| anyhow::anyhow!("invalid configuration:\n{errors}"))?;
    let access = admin::access::Access::new(options.admin_token_file.as_deref())?;
    if matches!(access, admin::access::Access::Loopback) && !options.admin_addr.ip().is_loopback() {
        tracing::info!(
            admin = %options.admin_addr,
            "no --admin-token-file: /debug/* and the simulator's sessions answer loopback \
             peers only (kubectl port-forward), 401 to the network"
        );
    }
    // One decision log for every face, configured with Envoy's options.
    let metrics = Metrics::serving(options.envoy.rls.decision_log, &options.metrics);
    let store_options = StoreOptions {
        observer: Some(metrics.store_call_observer()),
        events: Some(metrics.copy_log_event_observer()),
        ..options.store.clone()
    };
    options
        .copies
        .timings
        .validate()
        .context("invalid copy-log timings")?;
    let stores =
        Stores::open(&store_options, options.copies.timings).context("cannot open --store")?;
    stores.rate.settle().await;
    let config_log = stores
        .config_log(&store_options, options.config_state.as_deref())
        .context("cannot open --store for the configuration API's log")?;
    if !config_log.is_durable() {
        tracing::info!(
            "configuration API changes are kept in memory only (no --config-state file)"
        );
    }
    let configuration = Configuration::open(options.config.clone(), options.envoy.load, config_log)
        .await
        .map_err(|errors| anyhow::anyhow!("invalid configuration:\n{errors}"))?;
    for note in &configuration.view().notes {
        tracing::info!(%note, "normalized");
    }
    metrics.set_namespaces(configuration.running().load().namespaces().count());
    metrics.first_load(options.xds.is_some());
    let configuration = Arc::new(configuration);
    let mut service = Service::on_configuration(
        configuration.clone(),
        stores,
        options.envoy.modes,
        metrics.clone(),
        Arc::new(crate::clock::SystemClock),
    );
    service.leases.global_timing = options.global_timing;
    if options.parent.is_some() {
        // Before the housekeeping starts renewing global shares: on a
        // server with a parent, no global limit admits anything until the
        // parent has been asked for its share.
        service.leases.parent.set_linked();
        service.close_global_shares();
    }
    let service = Arc::new(service);

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let watcher = if options.xds.is_some() && !options.config.exists() {
        tracing::info!(
            config = %options.config.display(),
            "no configuration files: namespaces come over xDS only"
        );
        None
    } else {
        Some(reload::spawn(
            options.config.clone(),
            configuration.clone(),
            metrics.clone(),
            shutdown_rx.clone(),
        )?)
    };
    let xds_applied = match &options.xds {
        None => None,
        Some(xds_options) => {
            let status = xds::spawn(
                xds_options.clone(),
                configuration.clone(),
                metrics.clone(),
                shutdown_rx.clone(),
            )?;
            let mut applied = status.applied_first;
            if !xds_options.force_start {
                tracing::info!(
                    server = %xds_options.server,
                    "waiting for the first xDS snapshot before serving"
                );
                tokio::select! {
                    waited = applied.wait_for(|applied| *applied) => {
                        waited.context("the xDS client stopped")?;
                    }
                    _ = shutdown_signal() => anyhow::bail!("stopped before the first xDS snapshot"),
                }
            }
            Some(applied)
        }
    };
    let grpc_listener = TcpListener::bind(options.grpc_addr)
        .await
        .with_context(|| format!("cannot listen on --grpc-addr {}", options.grpc_addr))?;
    let metrics_listener = match options.metrics.addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on --metrics-addr {addr}"))?,
        ),
        None => None,
    };
    let admin_listener = TcpListener::bind(options.admin_addr)
        .await
        .with_context(|| format!("cannot listen on --admin-addr {}", options.admin_addr))?;
    let grpc_tls = options
        .grpc
        .tls
        .as_ref()
        .map(listen::Tls::new)
        .transpose()?;
    let grpc_uds = options
        .grpc
        .uds
        .as_ref()
        .map(listen::bind_uds)
        .transpose()?;

    service.spawn_housekeeping(shutdown_rx.clone());
    spawn_membership_metric(service.copies.clone(), metrics.clone());
    Ok(Started {
        service,
        metrics,
        grpc_listener,
        admin_listener,
        metrics_listener,
        grpc_tls,
        grpc_uds,
        access,
        configuration,
        shutdown_tx,
        shutdown_rx,
        watcher,
        xds_applied,
    })
}

/// A sidecar that answers: both servers running, ready, and what stopping
/// them needs.
struct Serving {
    grpc_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    admin_task: tokio::task::JoinHandle<std::io::Result<()>>,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    open_sessions: Arc<std::sync::atomic::AtomicUsize>,
    copies: Arc<dyn CopyLog>,
    shutdown_tx: watch::Sender<bool>,
    _watcher: Option<notify::RecommendedWatcher>,
}

/// Builds the gRPC port (Envoy RLS, the Charon API, health, reflection) and
/// the admin port over what `start` set up, serves both, and says ready.
async fn serve(started: Started, options: &ServeOptions) -> anyhow::Result<Serving> {
    let Started {
        service,
        metrics,
        grpc_listener,
        admin_listener,
        metrics_listener,
        grpc_tls,
        grpc_uds,
        access,
        configuration,
        shutdown_tx,
        shutdown_rx,
        watcher,
        xds_applied,
    } = started;
    if let Some(parent) = &options.parent {
        if parent_is_self(&parent.url, options.grpc_addr) {
            anyhow::bail!(
                "--parent {}: that is this server's own gRPC address; a server cannot be its own ancestor",
                parent.url
            );
        }
        let sidecar = crate::client::Sidecar::connect(&parent.url)
            .map_err(|error| anyhow::anyhow!("--parent {}: {error}", parent.url))?;
        let client = crate::client::Client::with_options(
            sidecar,
            crate::client::ClientOptions {
                call_timeout: Duration::from_secs(1),
                ..Default::default()
            },
        );
        tokio::spawn(parent::follow(
            service.clone(),
            client,
            parent.level_id.clone(),
            shutdown_rx.clone(),
        ));
    }
    let ready = Arc::new(AtomicBool::new(false));
    let limiter = service.limiter.clone();
    let proposals = service.clone();
    let rlqs =
        RateLimitQuotaServiceServer::new(rlqs::RlqsService::new(service.clone(), metrics.clone()));
    let api = ApiService::new(
        service,
        metrics.clone(),
        options.copies.max_sessions,
        shutdown_rx.clone(),
    )
    .with_traces(options.envoy.rls.traces);
    let open_sessions = api.open_sessions();

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<RlsService<SidecarStore>>>()
        .await;
    health.set_serving::<CharonServer<ApiService>>().await;
    let (reflection, reflection_alpha) = reflection()?;
    let rls_service = RlsService::new(limiter.clone(), metrics.clone(), options.envoy.rls.clone());
    let rls = RateLimitServiceServer::new(rls_service.clone());
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(options.grpc.max_concurrent_streams)
        .http2_keepalive_interval(Some(options.grpc.keepalive_interval))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(age) = options.grpc.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    let grpc = builder
        .layer(tower::util::MapResponseLayer::new(
            decode_errors_are_invalid_arguments as fn(_) -> _,
        ))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(rls)
        .add_service(rlqs)
        .add_service(CharonServer::new(api))
        .serve_with_incoming_shutdown(
            listen::incoming(grpc_listener, grpc_tls, grpc_uds),
            shutdown::wait_for(shutdown_rx.clone()),
        );
    let admin_state = admin::AdminState {
        ready: ready.clone(),
        metrics: metrics.clone(),
        store_status: {
            let limiter = limiter.clone();
            Arc::new(move || limiter.store().status())
        },
    };
    let sources = admin::state::StateSources {
        limiter: limiter.clone(),
        copies: proposals.copies.clone(),
        origins: Some(admin::config_api::origins(configuration.clone())),
        proposals: Some(proposals.clone()),
    };
    if let Some(listener) = metrics_listener {
        let metrics_only = axum::serve(
            listener,
            admin::metrics_router(admin_state.clone(), sources.clone(), &options.metrics.path),
        )
        .with_graceful_shutdown(shutdown::wait_for(shutdown_rx.clone()));
        tokio::spawn(async move {
            if let Err(error) = metrics_only.await {
                tracing::error!(%error, "the --metrics-addr listener failed");
            }
        });
    }
    let admin = axum::serve(
        admin_listener,
        admin::router(admin_state, sources, access.clone())
            .merge(admin::guarded(
                admin::config_api::router(configuration),
                access,
            ))
            .merge(rls::http::router(rls_service))
            // The peer's address, for the guarded routes' loopback rule.
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown::wait_for(shutdown_rx.clone()));

    let grpc_task = tokio::spawn(grpc);
    let admin_task = tokio::spawn(async move { admin.await });
    match xds_applied {
        Some(mut applied) if !*applied.borrow() => {
            // Serving already (unknown domains answer as with no files);
            // ready once the control plane's first snapshot is in.
            let (ready, mut shutdown) = (ready.clone(), shutdown_rx.clone());
            tokio::spawn(async move {
                tokio::select! {
                    waited = applied.wait_for(|applied| *applied) => {
                        if waited.is_ok() && !*shutdown.borrow() {
                            ready.store(true, Ordering::SeqCst);
                            tracing::info!("first xDS snapshot applied: ready");
                        }
                    }
                    _ = shutdown.changed() => {}
                }
            });
        }
        _ => ready.store(true, Ordering::SeqCst),
    }
    tracing::info!(
        grpc = listen::describe(
            options.grpc_addr,
            options.grpc.tls.is_some(),
            options.grpc.uds.as_ref()
        ),
        admin = %options.admin_addr,
        config = %options.config.display(),
        store = limiter.store().name(),
        on_store_error = options.store.on_error.as_str(),
        "charon serving"
    );
    Ok(Serving {
        grpc_task,
        admin_task,
        ready,
        health,
        open_sessions,
        copies: proposals.copies.clone(),
        shutdown_tx,
        _watcher: watcher,
    })
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

fn spawn_membership_metric(copies: Arc<dyn CopyLog>, metrics: Arc<Metrics>) {
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

/// Whether `url` names this server's own gRPC address (a loop of one).
fn parent_is_self(url: &str, own: SocketAddr) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return false;
    };
    let port = uri.port_u16();
    let local = matches!(
        uri.host(),
        Some("127.0.0.1" | "localhost" | "[::1]" | "0.0.0.0")
    ) || uri.host() == Some(own.ip().to_string().as_str());
    port == Some(own.port()) && local
}
