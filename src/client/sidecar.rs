//! The remote backend: one Charon API session to a sidecar over gRPC,
//! multiplexed (every call has its own id, answers are routed back by it),
//! and reopened with backoff when it breaks.
//!
//! A background task owns the connection. While a session is up, calls go
//! straight into it; while the sidecar is away, calls fail at once (the
//! client fails open) instead of each waiting for a connect timeout. When a
//! session ends, the sidecar releases its holds, so the calls still waiting
//! fail and the hold guards of that session release nothing.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::ErrorKind;
use crate::api::v1::charon_client::CharonClient;
use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{
    CostAnswer, CostRequest, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest,
    ReleaseCapacityResponse, ReserveOp, SessionRequest, WatchCapacityRequest,
};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use super::backend::{
    Awaited, Backend, BackendFuture, CapacityFuture, LimitsFuture, NudgeStream, Reply, Unreachable,
    undo,
};
use super::{ClientError, limits};
use crate::limiter::RateLimitRequest;

/// How the sidecar backend connects and reconnects.
#[derive(Debug, Clone)]
pub struct SidecarOptions {
    /// For one connection attempt.
    pub connect_timeout: Duration,
    /// The first wait after a failed attempt; it doubles up to
    /// `max_backoff` and starts over once a session is up.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// For an `https://` sidecar: the CA to trust, and a client
    /// certificate when the sidecar asks for one (mTLS).
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

impl Default for SidecarOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// Operations in flight in one session: one per `SessionRequest`.
const QUEUE: usize = 1024;

/// The state of the link, as calls see it.
#[derive(Clone)]
enum Link {
    /// Opening a session: calls wait (within their deadline).
    Connecting,
    Up {
        outbound: mpsc::Sender<SessionRequest>,
        session: u64,
    },
    /// The last attempt failed: calls fail at once until the next one.
    Down(String),
}

struct Pending {
    answer: oneshot::Sender<Answer>,
    session: u64,
    /// A reserve, to give back if its answer comes for nobody.
    reserve: Option<ReserveOp>,
}

struct Shared {
    link: watch::Sender<Link>,
    pending: Mutex<HashMap<u64, Pending>>,
    next_id: AtomicU64,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A session with a sidecar (`charon serve`), reopened when it breaks.
pub struct Sidecar {
    shared: Arc<Shared>,
    driver: JoinHandle<()>,
    /// For Envoy-style requests, which need no session.
    channel: Channel,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // Ending the session releases its holds on the sidecar.
        self.driver.abort();
    }
}

impl Sidecar {
    /// Starts connecting to `url` (`http://host:port`, `https://host:port`
    /// with [`SidecarOptions::tls`], or `unix:/path/to/socket`) in the
    /// background; calls
    /// made before the session is up wait for it within their deadline.
    /// Must be called within a Tokio runtime.
    pub fn connect(url: &str) -> Result<Self, ClientError> {
        Self::connect_with(url, SidecarOptions::default())
    }

    pub fn connect_with(url: &str, options: SidecarOptions) -> Result<Self, ClientError> {
        let socket = url.strip_prefix("unix:").map(std::path::PathBuf::from);
        // A Unix socket has no authority: the endpoint's URL is a stand-in.
        let endpoint_url = if socket.is_some() {
            "http://charon.sock"
        } else {
            url
        };
        let mut endpoint = Endpoint::from_shared(endpoint_url.to_owned())
            .map_err(|error| ClientError::Invalid(format!("sidecar url `{url}`: {error}")))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            // A sidecar that vanished without closing is noticed, so the
            // session is reopened elsewhere instead of hanging.
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        if let Some(tls) = options.tls.clone() {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|error| ClientError::Invalid(format!("sidecar TLS: {error}")))?;
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ClientError::Invalid("Sidecar::connect must be called within a Tokio runtime".into())
        })?;
        let (link, _) = watch::channel(Link::Connecting);
        let shared = Arc::new(Shared {
            link,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        });
        let channel = match socket {
            Some(path) => endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            })),
            None => endpoint.connect_lazy(),
        };
        let driver = runtime.spawn(drive(channel.clone(), shared.clone(), options));
        Ok(Self {
            shared,
            driver,
            channel,
        })
    }

    /// Whether a session is up now.
    pub fn is_connected(&self) -> bool {
        matches!(*self.shared.link.borrow(), Link::Up { .. })
    }
}

impl Backend for Sidecar {
    fn call(&self, op: Op) -> BackendFuture<'_> {
        Box::pin(async move {
            let mut link = self.shared.link.subscribe();
            let (outbound, session) = loop {
                match &*link.borrow_and_update() {
                    Link::Up { outbound, session } => break (outbound.clone(), *session),
                    Link::Down(reason) => return Err(Unreachable(reason.clone())),
                    Link::Connecting => {}
                }
                if link.changed().await.is_err() {
                    return Err(Unreachable("the client is closed".into()));
                }
            };
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            let (answer, answered) = oneshot::channel();
            let reserve = match &op {
                Op::Reserve(reserve) => Some(reserve.clone()),
                _ => None,
            };
            self.shared.pending().insert(
                id,
                Pending {
                    answer,
                    session,
                    reserve: reserve.clone(),
                },
            );
            // The session may have ended between reading the link and
            // registering: its end cleared the pending calls before this one.
            if !matches!(&*self.shared.link.borrow(), Link::Up { session: now, .. } if *now == session)
            {
                self.shared.pending().remove(&id);
                return Err(Unreachable("the session ended".into()));
            }
            // Until sent, a cancelled call leaves nothing behind; once sent,
            // its answer removes the entry (or the session's end does).
            let unsent = Unsent {
                shared: &self.shared,
                id,
                armed: true,
            };
            let request = SessionRequest { id, op: Some(op) };
            if outbound.send(request).await.is_err() {
                return Err(Unreachable("the session ended".into()));
            }
            unsent.disarm();
            let shared = self.shared.clone();
            let answered = Awaited::new(answered, move |answer| {
                shared.undo(reserve.as_ref(), &answer, &outbound);
            });
            match answered.answer().await {
                Some(answer) => Ok(Reply { answer, session }),
                None => Err(Unreachable(
                    "the session ended before the sidecar answered".into(),
                )),
            }
        })
    }

    fn should_rate_limit(&self, request: RateLimitRequest) -> LimitsFuture<'_> {
        // Envoy's own service, on the same connection: the sidecar decides
        // exactly as it does for Envoy.
        let mut client = RateLimitServiceClient::new(self.channel.clone());
        Box::pin(async move {
            let request = limits::wire::request(request)?;
            match client.should_rate_limit(request).await {
                Ok(response) => Ok(limits::wire::answer(response.into_inner())),
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    Err(ClientError::Invalid(status.message().to_owned()))
                }
                Err(status) => Err(ClientError::Unavailable(format!(
                    "ShouldRateLimit: {}: {}",
                    status.code(),
                    status.message()
                ))),
            }
        })
    }

    fn get_capacity(&self, request: GetCapacityRequest) -> CapacityFuture<'_, GetCapacityResponse> {
        let mut client = CharonClient::new(self.channel.clone());
        Box::pin(async move {
            client
                .get_capacity(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| unary_error("GetCapacity", &status))
        })
    }

    fn watch_capacity(&self, client_id: String) -> CapacityFuture<'_, NudgeStream> {
        let mut client = CharonClient::new(self.channel.clone());
        Box::pin(async move {
            let nudges = client
                .watch_capacity(WatchCapacityRequest { client_id })
                .await
                .map_err(|status| match status.code() {
                    tonic::Code::Unimplemented => {
                        ClientError::Unsupported(format!("WatchCapacity: {}", status.message()))
                    }
                    _ => unary_error("WatchCapacity", &status),
                })?
                .into_inner();
            let nudges = tokio_stream::StreamExt::map(nudges, |nudge| {
                nudge
                    .map(drop)
                    .map_err(|status| unary_error("WatchCapacity", &status))
            });
            Ok(Box::pin(nudges) as NudgeStream)
        })
    }

    fn release_capacity(
        &self,
        request: ReleaseCapacityRequest,
    ) -> CapacityFuture<'_, ReleaseCapacityResponse> {
        let mut client = CharonClient::new(self.channel.clone());
        Box::pin(async move {
            client
                .release_capacity(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| unary_error("ReleaseCapacity", &status))
        })
    }

    fn cost(&self, request: CostRequest) -> CapacityFuture<'_, CostAnswer> {
        let mut client = CharonClient::new(self.channel.clone());
        Box::pin(async move {
            client
                .cost(request)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|status| unary_error("Cost", &status))
        })
    }

    fn session(&self) -> u64 {
        match &*self.shared.link.borrow() {
            Link::Up { session, .. } => *session,
            _ => 0,
        }
    }

    fn ready(&self, timeout: Duration) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async move {
            let mut link = self.shared.link.subscribe();
            let up = link.wait_for(|link| matches!(link, Link::Up { .. }));
            matches!(tokio::time::timeout(timeout, up).await, Ok(Ok(_)))
        })
    }
}

impl Shared {
    /// Gives back what an answer nobody received granted.
    fn undo(
        &self,
        reserve: Option<&ReserveOp>,
        answer: &Answer,
        outbound: &mpsc::Sender<SessionRequest>,
    ) {
        let Some(op) = undo(reserve, answer) else {
            return;
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let outbound = outbound.clone();
        let request = SessionRequest { id, op: Some(op) };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if outbound.send(request).await.is_err() {
                        // The session ended: it released everything anyway.
                        tracing::debug!("an undo found its session ended");
                    }
                });
            }
            Err(_) => {
                if outbound.try_send(request).is_err() {
                    tracing::warn!(
                        "cannot undo a late grant: its copies go back when the session ends"
                    );
                }
            }
        }
    }
}

struct Unsent<'a> {
    shared: &'a Shared,
    id: u64,
    armed: bool,
}

impl Unsent<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.pending().remove(&self.id);
        }
    }
}

/// Opens sessions for as long as the client lives.
async fn drive(channel: Channel, shared: Arc<Shared>, options: SidecarOptions) {
    let mut session = 0;
    let mut backoff = options.initial_backoff;
    loop {
        shared.link.send_replace(Link::Connecting);
        let (outbound, requests) = mpsc::channel(QUEUE);
        let mut client = CharonClient::new(channel.clone());
        let opened = tokio::time::timeout(
            options.connect_timeout,
            client.session(ReceiverStream::new(requests)),
        )
        .await;
        let failure = match opened {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(format!("cannot open a session: {}", status.message())),
            Err(_) => Err(format!(
                "no session within the connect timeout ({:?})",
                options.connect_timeout
            )),
        };
        let mut inbound = match failure {
            Ok(inbound) => inbound,
            Err(reason) => {
                tracing::warn!(%reason, retry_in = ?backoff, "charon sidecar unreachable");
                shared.link.send_replace(Link::Down(reason));
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2).min(options.max_backoff);
                continue;
            }
        };
        session += 1;
        backoff = options.initial_backoff;
        shared.link.send_replace(Link::Up {
            outbound: outbound.clone(),
            session,
        });
        tracing::debug!(session, "charon session open");
        let reason = loop {
            match inbound.message().await {
                Ok(Some(response)) => {
                    let Some(answer) = response.result else {
                        continue;
                    };
                    let Some(pending) = shared.pending().remove(&response.id) else {
                        continue;
                    };
                    if let Err(answer) = pending.answer.send(answer) {
                        // The caller gave up; the copies must not stay held.
                        shared.undo(pending.reserve.as_ref(), &answer, &outbound);
                    }
                }
                Ok(None) => break "the sidecar closed the session".to_owned(),
                Err(status) => break format!("the session broke: {}", status.message()),
            }
        };
        tracing::warn!(%reason, session, "charon session ended: reopening");
        shared.link.send_replace(Link::Down(reason));
        shared
            .pending()
            .retain(|_, pending| pending.session != session);
    }
}

/// A unary call's failure, sorted as the embedded engine sorts it: the
/// request's fault, with the kind the status names (or its code's), or no
/// answer (fail open).
fn unary_error(call: &str, status: &tonic::Status) -> ClientError {
    let refused = |kind| ClientError::Refused {
        kind,
        message: status.message().to_owned(),
    };
    let named = status
        .metadata()
        .get(crate::api::ERROR_KIND_HEADER)
        .and_then(|kind| kind.to_str().ok())
        .and_then(ErrorKind::from_str_name)
        .filter(|kind| !matches!(kind, ErrorKind::Unspecified));
    match (status.code(), named) {
        (tonic::Code::Unavailable | tonic::Code::Internal, _) => {
            ClientError::Unavailable(format!("{call}: {}: {}", status.code(), status.message()))
        }
        (_, Some(kind)) => refused(kind),
        (tonic::Code::InvalidArgument, None) => refused(ErrorKind::Malformed),
        (tonic::Code::ResourceExhausted, None) => refused(ErrorKind::TooMany),
        (code, None) => ClientError::Unavailable(format!("{call}: {code}: {}", status.message())),
    }
}
