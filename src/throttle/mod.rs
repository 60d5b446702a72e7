//! The throttling sidecar, `charon throttle` (docs/design.md#the-throttling-sidecar):
//! a reverse proxy in front of one upstream that gives an app in any
//! language what [`crate::layer::ThrottleLayer`] gives a Rust service. At
//! most so many requests reach the upstream at once (a fixed number, or a
//! limit that adapts to the upstream's latency); the rest wait in a bounded
//! queue served by criticality (`x-criticality`) then arrival, each until
//! its deadline (`grpc-timeout`, `x-envoy-expected-rq-timeout-ms`, or the
//! proxy's longest wait). Or, in the requests-per-second form, a fixed-size
//! queue released at a fixed rate ([`drain`]). Refusals are 503 with
//! `Retry-After`; an upstream that fails is 502, one that hangs 504.
//!
//! A slow or hostile client holds a connection, never a slot
//! ([`protect`]): a request queues once its body is in ([`buffer`]), its
//! slot is given back once the upstream's answer is in, and connections
//! are capped and timed ([`conn`]).
//!
//! - [`forward`]: the request to the upstream and back (answers streamed,
//!   upgrades joined).
//! - [`buffer`]: the request body read before the queue, the answer read
//!   ahead of the client.
//! - [`conn`]: the connection cap, the reset budget, the write timeout.
//! - [`credit`]: how many of a connection's requests may queue at once.
//! - [`protect`]: the bounds, what they stopped, the descriptor limit.
//! - [`drain`]: the queue released at a fixed rate.
//! - [`admin`]: readiness, `/stats` and `/metrics` on their own port.
//!
//! On shutdown the proxy stops being ready, stops accepting, and lets the
//! requests in flight finish (up to a limit) before it returns.

pub mod admin;
pub mod buffer;
pub mod conn;
pub mod credit;
pub mod drain;
pub mod forward;
mod options;
pub mod protect;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;
use tower::util::BoxCloneSyncService;

use crate::layer::{Action, Actions, DescriptorLimitLayer, ThrottleCounts, ThrottleLayer};

pub use self::options::{ADAPTIVE_MAX, ADAPTIVE_START, ProxyOptions, TenantLimits, UpstreamSlots};

use self::conn::{Admitted, Connections, WriteStall};
use self::drain::DrainQueue;
use self::forward::{Buffered, Forward, ProxyBody};
use self::protect::{Protection, ProtectionCounts, Reason};

/// HTTP/2 streams a client may reset before the proxy has accepted them,
/// at once, before the connection is closed (hyper's own guard).
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// HTTP/2 streams the proxy may reset for a client's protocol errors
/// before it closes the connection.
const MAX_LOCAL_ERROR_RESETS: usize = 256;

/// What the proxy counted, for `/stats` and `/metrics`.
#[derive(Debug, Default)]
pub struct ProxyCounts {
    requests: AtomicU64,
    /// Refused 429 by the per-tenant limits.
    tenant_refused: AtomicU64,
    upstream_failures: AtomicU64,
    upstream_timeouts: AtomicU64,
}

impl ProxyCounts {
    fn took(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
    fn upstream_failed(&self) {
        self.upstream_failures.fetch_add(1, Ordering::Relaxed);
    }
    fn upstream_timed_out(&self) {
        self.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Errors the proxy stops on.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("the upstream `{0}` is not an http://host:port address")]
    Upstream(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the admin server failed: {0}")]
    Admin(#[source] std::io::Error),
}

/// `charon throttle`: serves `listen` (and the admin port on `admin`)
/// until SIGTERM or SIGINT, then drains.
pub async fn run(
    listen: std::net::SocketAddr,
    admin: Option<std::net::SocketAddr>,
    options: ProxyOptions,
) -> Result<(), ProxyError> {
    let proxy = Proxy::new(&options)?;
    let bind = |addr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| ProxyError::Listen { addr, source })
    };
    let listener =
        protect::listen(listen, options.protection.listen_backlog).map_err(|source| {
            ProxyError::Listen {
                addr: listen,
                source,
            }
        })?;
    let admin_task = match admin {
        Some(addr) => {
            let admin_listener = bind(addr).await?;
            let router = proxy.admin_router();
            Some(tokio::spawn(async move {
                axum::serve(admin_listener, router).await
            }))
        }
        None => None,
    };
    tracing::info!(
        %listen,
        upstream = %options.upstream,
        slots = ?options.slots,
        drain_rate = ?options.drain_rate,
        max_connections = proxy.max_connections,
        "charon throttle serving"
    );
    proxy.serve(listener, crate::kit::shutdown_signal()).await;
    if let Some(task) = admin_task {
        task.abort();
    }
    tracing::info!("charon throttle stopped");
    Ok(())
}

/// The proxy's state beside its requests: what the admin port shows.
#[derive(Clone)]
pub struct Proxy {
    pub(crate) ready: Arc<AtomicBool>,
    pub(crate) counts: Arc<ProxyCounts>,
    pub(crate) throttle: Option<ThrottleLayer>,
    pub(crate) throttle_counts: Option<Arc<ThrottleCounts>>,
    pub(crate) drain: Option<DrainQueue>,
    pub(crate) protection_counts: Arc<ProtectionCounts>,
    pub(crate) max_connections: usize,
    protection: Arc<Protection>,
    service: BoxCloneSyncService<Request<Buffered>, Response<ProxyBody>, Infallible>,
    drain_timeout: Duration,
}

impl Proxy {
    /// The proxy `options` describe (its drain queue's task started).
    pub fn new(options: &ProxyOptions) -> Result<Self, ProxyError> {
        let upstream = &options.upstream;
        if upstream.scheme_str() != Some("http")
            || upstream.authority().is_none()
            || upstream
                .path_and_query()
                .is_some_and(|path| path.as_str() != "/")
        {
            return Err(ProxyError::Upstream(upstream.to_string()));
        }
        let counts = Arc::new(ProxyCounts::default());
        let protection_counts = Arc::new(ProtectionCounts::default());
        let max_connections = options
            .protection
            .max_connections
            .unwrap_or_else(|| protect::connections_for(protect::raise_descriptor_limit()));
        let forward = Forward::new(
            options.upstream.clone(),
            options.upstream_timeout,
            counts.clone(),
        );
        let throttle = match options.slots {
            UpstreamSlots::Fixed(limit) => Some(ThrottleLayer::new(limit)),
            UpstreamSlots::Adaptive => {
                Some(ThrottleLayer::new(ADAPTIVE_START).adaptive_limit(1, ADAPTIVE_MAX))
            }
            UpstreamSlots::Unlimited => None,
        }
        .map(|layer| {
            let layer = layer
                .max_queue(options.queue)
                .max_wait(options.max_wait)
                .reported_cost(options.cost_header.clone());
            match options.cpu_budget {
                Some(budget) => layer.cpu_budget(budget),
                None => layer,
            }
        });
        let bound = options.protection.max_buffered_body;
        let read_ahead_counts = protection_counts.clone();
        let limited: BoxCloneSyncService<_, _, Infallible> = match &throttle {
            // The answer is read ahead of the client, so the slot is free
            // once the upstream is done, whatever the client's pace.
            Some(layer) => {
                BoxCloneSyncService::new(tower::Layer::layer(layer, forward).map_response(
                    move |response| buffer::read_ahead(response, bound, read_ahead_counts.clone()),
                ))
            }
            None => BoxCloneSyncService::new(forward),
        };
        let drain = options
            .drain_rate
            .map(|rate| DrainQueue::start(rate, options.queue));
        let queued = match &drain {
            Some(queue) => BoxCloneSyncService::new(queue.layer(limited)),
            None => limited,
        };
        let service = match &options.tenants {
            Some(tenants) => {
                let client = crate::client::Client::embedded(tenants.config.clone());
                let actions = Actions::new().descriptor([Action::request_header(
                    tenants.header.clone(),
                    tenants.header.as_str(),
                )]);
                let limit = DescriptorLimitLayer::new(client, &tenants.namespace, actions);
                let counts = counts.clone();
                BoxCloneSyncService::new(tower::Layer::layer(&limit, queued).map_response(
                    move |response| {
                        if response.status() == http::StatusCode::TOO_MANY_REQUESTS {
                            counts.tenant_refused.fetch_add(1, Ordering::Relaxed);
                        }
                        response.map(|body| body.boxed())
                    },
                ))
            }
            None => queued,
        };
        Ok(Self {
            ready: Arc::new(AtomicBool::new(false)),
            throttle_counts: throttle.as_ref().map(ThrottleLayer::counts),
            throttle,
            drain,
            counts,
            protection_counts,
            max_connections,
            protection: Arc::new(options.protection.clone()),
            service,
            drain_timeout: options.drain_timeout,
        })
    }

    /// Serves `listener` until `shutdown` ends, then drains.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let protection = self.protection.clone();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Without a timer hyper keeps no header-read timeout at all.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(protection.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(protection.max_streams_per_connection)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
            .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS);
        let builder = Arc::new(builder);
        let connections = Connections::new(self.max_connections, self.protection_counts.clone());
        let graceful = GracefulShutdown::new();
        self.ready.store(true, Ordering::SeqCst);
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = &mut shutdown => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, most likely: try again shortly.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            // At the cap with none idle: closed now, not left in the backlog.
            let Some(admitted) = connections.admit(
                protection.max_resets_per_connection,
                protection.max_streams_per_connection,
            ) else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let admitted = Arc::new(admitted);
            let service = connection_service(self.clone(), admitted.clone());
            let (builder, watcher) = (builder.clone(), graceful.watcher());
            let counts = self.protection_counts.clone();
            let protection = protection.clone();
            tokio::spawn(async move {
                let Some(stream) = first_byte(stream, &admitted, &protection, &counts).await else {
                    return;
                };
                let io = TokioIo::new(WriteStall::new(
                    stream,
                    protection.response_write_timeout,
                    counts.clone(),
                ));
                let connection = builder
                    .serve_connection_with_upgrades(io, service)
                    .into_owned();
                tokio::select! {
                    ended = watcher.watch(connection) => {
                        if let Err(error) = ended {
                            if is_header_timeout(&*error) {
                                counts.count(Reason::HeaderTimeout);
                            }
                            tracing::debug!(%error, "a connection ended with an error");
                        }
                    }
                    // Evicted, or past its reset budget: closed now.
                    () = admitted.connection.close.notified() => {}
                }
            });
        }
        self.ready.store(false, Ordering::SeqCst);
        drop(listener);
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(self.drain_timeout) => {
                tracing::warn!("requests still in flight at the end of the drain");
            }
        }
    }
}

/// What serves one connection's requests: each body read whole before
/// the request goes on, each request counted busy until its answer.
fn connection_service(
    proxy: Proxy,
    admitted: Arc<Admitted>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<ProxyBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<ProxyBody>, Infallible>> + Send,
> + Clone
+ Send
+ 'static {
    hyper::service::service_fn(move |request: Request<Incoming>| {
        proxy.counts.took();
        let in_flight = admitted.begin();
        let proxy = proxy.clone();
        let admitted = admitted.clone();
        async move {
            let read = buffer::read_request(request, &proxy.protection, &proxy.protection_counts);
            let response = match read.await {
                Ok(request) => {
                    let turn = admitted.connection.credit.turn().await;
                    let response = proxy.service.oneshot(request).await?;
                    turn.answered();
                    response
                }
                Err(answer) => answer,
            };
            in_flight.answered();
            Ok(response)
        }
    })
}

/// Waits for a new connection's first byte, under the header timeout
/// (hyper's own starts only once it reads a request); `None` if it never
/// came, or the connection was told to close meanwhile.
async fn first_byte(
    stream: TcpStream,
    admitted: &Admitted,
    protection: &Protection,
    counts: &ProtectionCounts,
) -> Option<TcpStream> {
    let mut byte = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(protection.header_read_timeout, stream.peek(&mut byte)) => peeked,
        () = admitted.connection.close.notified() => return None,
    };
    match peeked {
        Ok(Ok(read)) if read > 0 => Some(stream),
        Ok(_) => None,
        Err(_) => {
            counts.count(Reason::HeaderTimeout);
            None
        }
    }
}

/// Whether a connection ended because its client sent headers too slowly.
fn is_header_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout)
        {
            return true;
        }
        source = error.source();
    }
    false
}
