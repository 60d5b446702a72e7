//! The Rust client: how a Rust service asks Charon for hits and copies.
//!
//! A [`Client`] runs on one [`Backend`]: a remote [`Sidecar`] (one
//! multiplexed Charon API session, reopened with backoff) or, with the
//! `server` feature, an [`Embedded`] engine in the process, on the memory or
//! Redis store. Switching is one line; everything else is the client's own
//! and the same for both: a per-call deadline, retries within `max_wait`
//! using the server's `retry_after` (docs/design.md#retries), fail-open
//! when the backend is unreachable or answers a server error (the grant is
//! flagged `degraded` and recorded nowhere), a kill switch, hold guards that
//! give back what is left when dropped (docs/design.md#hold-guards), and the
//! multi-resource pattern of docs/design.md#multi-resource-acquire
//! ([`Client::acquire`]).
//!
//! Beside hits and copies: Envoy-style requests, several descriptors
//! decided as one (`limits.rs`, [`Client::should_rate_limit`]);
//! reservations on budgets of a cost known after the response ([`cost`]);
//! capacity leases, a token bucket at the leased rate renewed in the
//! background ([`lease`]), through the one renewer a server's link to its
//! parent also uses ([`renewal`]); and the retry policy ([`retry`]).
//!
//! ```no_run
//! # async fn example() -> Result<(), charon::client::ClientError> {
//! use std::time::Duration;
//! use charon::client::Client;
//! let client = Client::sidecar("http://127.0.0.1:8081")?;
//! let answer = client.request("shop", "search", "acme").max_wait(Duration::from_secs(1)).await?;
//! if answer.is_granted() {
//!     // call the API
//! }
//! let mut hold = client.hold("shop", "workers", "acme").copies(10).min_copies(2).await?;
//! if hold.is_granted() {
//!     hold.release(hold.copies() / 2).await?; // keep the rest until `hold` drops
//! }
//! # Ok(()) }
//! ```

mod backend;
mod call;
pub mod cost;
#[cfg(feature = "embedded")]
mod embedded;
mod hold;
pub mod lease;
mod limits;
pub mod renewal;
pub mod retry;
mod sidecar;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

pub use backend::{
    Backend, BackendFuture, CapacityFuture, LimitsFuture, NudgeStream, Reply, Unreachable, undo,
};
use call::Amount;
pub use call::{HoldCall, RequestCall};
pub use cost::{Committed, CostReservation, ReserveCost};
#[cfg(feature = "embedded")]
pub use embedded::{Embedded, EmbeddedError};
pub use hold::{Acquired, Hold, Target};
pub use limits::{LimitStatus, LimitsAnswer, StatusLimit};
pub use sidecar::{Sidecar, SidecarOptions};

pub use crate::api::v1::error::Kind as ErrorKind;
pub use crate::api::v1::{CopyContext, RateContext};

use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{Error as WireError, SeizeOp};

/// How the client calls its backend.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The deadline of one call; past it the backend counts as unreachable.
    pub call_timeout: Duration,
    /// Unreachable backend or server error: grant `min_copies`, flagged
    /// degraded (true), or return [`ClientError::Unavailable`] (false).
    pub fail_open: bool,
    /// The first backoff after a rejection (doubled each time).
    pub retry_base: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(100),
            fail_open: true,
            retry_base: Duration::from_millis(50),
        }
    }
}

/// Why a call has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The server refused the call itself (a client error: unknown
    /// resource, wrong kind, not held…): repeating it will fail again.
    #[error("refused ({kind:?}): {message}")]
    Refused { kind: ErrorKind, message: String },
    /// No usable answer and fail-open is off.
    #[error("charon unavailable: {0}")]
    Unavailable(String),
    /// Bad arguments, caught before sending.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The server does not know the call (an older Charon): asking again
    /// soon will not help.
    #[error("unsupported by the server: {0}")]
    Unsupported(String),
}

/// What the client did, for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Answers granted without the server (fail-open).
    pub degraded: u64,
    /// Rejections turned into grants by the kill switch.
    pub overridden: u64,
}

/// The answer to [`Client::request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateAnswer {
    /// Hits granted: 0 on rejection.
    pub granted: u64,
    /// Until one more hit would be granted (`None`: never, or unknown).
    pub retry_after: Option<Duration>,
    /// Granted without the server (it was unreachable or failed), or by a
    /// sidecar that answered without its shared store.
    pub degraded: bool,
    /// Granted by the client itself: Charon did not answer (fail-open).
    pub unanswered: bool,
    /// The server rejected, the kill switch granted.
    pub overridden: bool,
    pub soft_limit_exceeded: bool,
    /// What the server said (default when degraded).
    pub context: RateContext,
    /// Time spent retrying.
    pub waited: Duration,
}

impl RateAnswer {
    pub fn is_granted(&self) -> bool {
        self.granted > 0
    }
}

/// A client of Charon: cheap to clone, one session per backend.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
}

struct Shared {
    backend: Box<dyn Backend>,
    options: ClientOptions,
    kill_switch: AtomicBool,
    degraded: AtomicU64,
    overridden: AtomicU64,
}

/// A call that failed, sorted by what the caller does about it.
enum Failure {
    /// Fail open (or report unavailable).
    Server(String),
    Client(ClientError),
}

impl Client {
    pub fn new(backend: impl Backend) -> Self {
        Self::with_options(backend, ClientOptions::default())
    }

    pub fn with_options(backend: impl Backend, options: ClientOptions) -> Self {
        Self {
            shared: Arc::new(Shared {
                backend: Box::new(backend),
                options,
                kill_switch: AtomicBool::new(false),
                degraded: AtomicU64::new(0),
                overridden: AtomicU64::new(0),
            }),
        }
    }

    /// A client of the sidecar at `url` (`http://127.0.0.1:8081`).
    pub fn sidecar(url: &str) -> Result<Self, ClientError> {
        Ok(Self::new(Sidecar::connect(url)?))
    }

    /// A client of an engine in this process, on the memory store.
    #[cfg(feature = "embedded")]
    pub fn embedded(config: crate::config::Config) -> Self {
        Self::new(Embedded::memory(config))
    }

    pub fn options(&self) -> &ClientOptions {
        &self.shared.options
    }

    /// On: every rejection becomes a grant (flagged `overridden`), while the
    /// server is still asked and its answer reported. For when limits are
    /// wrong and must stop biting now.
    pub fn set_kill_switch(&self, on: bool) {
        self.shared.kill_switch.store(on, Ordering::Relaxed);
    }

    pub fn kill_switch(&self) -> bool {
        self.shared.kill_switch.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> ClientStats {
        ClientStats {
            degraded: self.shared.degraded.load(Ordering::Relaxed),
            overridden: self.shared.overridden.load(Ordering::Relaxed),
        }
    }

    /// Hits on a rate-limited resource: `.copies(n)`, `.min_copies(m)`,
    /// `.max_wait(d)`, then `.await`.
    pub fn request(
        &self,
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> RequestCall {
        RequestCall {
            client: self.clone(),
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
            amount: Amount::default(),
        }
    }

    /// Copies of a copy-limited resource, held until the [`Hold`] is
    /// dropped: `.copies(n)`, `.min_copies(m)`, `.max_wait(d)`, then
    /// `.await`.
    pub fn hold(
        &self,
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> HoldCall {
        HoldCall {
            client: self.clone(),
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
            amount: Amount::default(),
            criticality: None,
            for_anyone: false,
        }
    }

    /// Takes over the copies another session staged with
    /// [`Hold::transfer`]; they are held until the returned hold drops.
    pub async fn seize(&self, transfer_id: &str) -> Result<Hold, ClientError> {
        let op = Op::Seize(SeizeOp {
            transfer_id: transfer_id.to_owned(),
        });
        match self.call(op).await {
            Ok(Reply {
                answer: Answer::Seize(seized),
                session,
            }) => Ok(Hold::seized(self.clone(), seized, session)),
            Ok(_) => Err(ClientError::Unavailable(
                "the server answered another operation".into(),
            )),
            Err(Failure::Client(error)) => Err(error),
            // Nothing to grant in the dark: the copies were someone else's.
            Err(Failure::Server(reason)) => Err(ClientError::Unavailable(reason)),
        }
    }

    /// `call` within the call deadline; past it, why not.
    async fn within_deadline<T>(&self, call: impl Future<Output = T>) -> Result<T, String> {
        self.within(Duration::ZERO, call).await
    }

    /// `call` within the call deadline plus `patience` (how long the server
    /// may wait before it answers); past it, why not.
    async fn within<T>(
        &self,
        patience: Duration,
        call: impl Future<Output = T>,
    ) -> Result<T, String> {
        let timeout = self.shared.options.call_timeout.saturating_add(patience);
        let mut call = std::pin::pin!(call);
        // An embedded engine answers within the first poll: no timer then.
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        match first {
            Poll::Ready(answered) => Ok(answered),
            // Boxed: the timer would otherwise make every call's future
            // larger, and most embedded calls never need it.
            Poll::Pending => Box::pin(tokio::time::timeout(timeout, call))
                .await
                .map_err(|_| format!("no answer within {timeout:?}")),
        }
    }

    /// One call with the deadline, its failures sorted.
    async fn call(&self, op: Op) -> Result<Reply, Failure> {
        self.call_with(|backend| backend.call(op)).await
    }

    /// One call the server may hold up to `patience` before answering (a
    /// reserve that waits for copies): the deadline is that much later.
    async fn call_patiently(&self, op: Op, patience: Duration) -> Result<Reply, Failure> {
        let answered = self
            .within(patience, self.shared.backend.call(op))
            .await
            .map_err(Failure::Server)?;
        sorted(answered)
    }

    /// [`call`](Self::call) by any of the backend's ways.
    async fn call_with<'a>(
        &'a self,
        send: impl FnOnce(&'a dyn Backend) -> BackendFuture<'a>,
    ) -> Result<Reply, Failure> {
        let answered = self
            .within_deadline(send(self.shared.backend.as_ref()))
            .await
            .map_err(Failure::Server)?;
        sorted(answered)
    }

    /// Sends an operation that needs no answer beyond success (a release).
    async fn call_quietly(&self, op: Op) -> Result<Reply, ClientError> {
        self.call(op).await.map_err(|failure| match failure {
            Failure::Client(error) => error,
            Failure::Server(reason) => ClientError::Unavailable(reason),
        })
    }

    fn session(&self) -> u64 {
        self.shared.backend.session()
    }

    /// A release sent without the call deadline (for dropped holds).
    async fn release_unbounded(&self, op: Op) -> Result<(), String> {
        match self.shared.backend.call(op).await {
            Ok(Reply {
                answer: Answer::Error(error),
                ..
            }) => Err(error.message),
            Ok(_) => Ok(()),
            Err(Unreachable(reason)) => Err(reason),
        }
    }

    /// Capacity leases of `request.resources` for `request.client_id`
    /// (docs/design.md#capacity-leases). [`lease::LeaseRenewer`] renews one
    /// in the background; this is the call it makes.
    pub async fn get_capacity(
        &self,
        request: crate::api::v1::GetCapacityRequest,
    ) -> Result<crate::api::v1::GetCapacityResponse, ClientError> {
        self.shared.backend.get_capacity(request).await
    }

    /// Watches `client_id`'s leases: an item each time the server asks for
    /// a renewal now (docs/design.md#a-hierarchy-of-servers).
    /// [`ClientError::Unsupported`] from a server that does not push them.
    pub async fn watch_capacity(&self, client_id: &str) -> Result<NudgeStream, ClientError> {
        self.shared
            .backend
            .watch_capacity(client_id.to_owned())
            .await
    }

    /// Gives leases back before they expire, so their share goes to the
    /// other clients now.
    pub async fn release_capacity(
        &self,
        request: crate::api::v1::ReleaseCapacityRequest,
    ) -> Result<crate::api::v1::ReleaseCapacityResponse, ClientError> {
        self.shared.backend.release_capacity(request).await
    }

    /// Waits up to `timeout` until the backend can answer (a sidecar
    /// client's first session is open); false if it cannot yet. Calls made
    /// before that fail open. Worth awaiting once at startup.
    pub async fn ready(&self, timeout: Duration) -> bool {
        self.shared.backend.ready(timeout).await
    }

    fn degraded(&self, reason: &str) -> Result<(), ClientError> {
        if !self.shared.options.fail_open {
            return Err(ClientError::Unavailable(reason.to_owned()));
        }
        let before = self.shared.degraded.fetch_add(1, Ordering::Relaxed);
        if before == 0 || before.is_power_of_two() {
            tracing::warn!(
                reason,
                degraded = before + 1,
                "charon unavailable: failing open"
            );
        }
        Ok(())
    }

    fn overridden(&self) -> bool {
        let on = self.kill_switch();
        if on {
            self.shared.overridden.fetch_add(1, Ordering::Relaxed);
        }
        on
    }

    /// Runs `attempt` until it is granted or `max_wait` is spent
    /// (docs/design.md#retries).
    /// `op` is sent as it is when there will be no retry, cloned otherwise.
    async fn retrying<O: Clone, T, Fut>(
        &self,
        max_wait: Duration,
        op: O,
        attempt: impl Fn(O) -> Fut,
    ) -> Result<(T, Duration), ClientError>
    where
        Fut: Future<Output = Result<Attempt<T>, ClientError>>,
    {
        if max_wait.is_zero() {
            return match attempt(op).await? {
                Attempt::Done(value) | Attempt::Rejected(value, _) => Ok((value, Duration::ZERO)),
            };
        }
        let started = Instant::now();
        let mut rejections = 0;
        loop {
            match attempt(op.clone()).await? {
                Attempt::Done(value) => return Ok((value, started.elapsed())),
                // A limit of 0 never grants: waiting cannot help.
                Attempt::Rejected(value, Some(Duration::MAX)) => {
                    return Ok((value, started.elapsed()));
                }
                Attempt::Rejected(value, retry_after) => {
                    let left = max_wait.saturating_sub(started.elapsed());
                    let sleep = retry::sleep_before_retry(
                        rejections,
                        retry_after,
                        self.shared.options.retry_base,
                        left,
                        retry::random_unit(),
                    );
                    match sleep {
                        Some(sleep) => tokio::time::sleep(sleep).await,
                        None => return Ok((value, started.elapsed())),
                    }
                    rejections = rejections.saturating_add(1);
                }
            }
        }
    }
}

enum Attempt<T> {
    Done(T),
    /// Rejected, with the server's retry-after (`Some(MAX)`: never).
    Rejected(T, Option<Duration>),
}

/// A backend's answer, its failures sorted.
fn sorted(answered: Result<Reply, Unreachable>) -> Result<Reply, Failure> {
    match answered {
        Err(Unreachable(reason)) => Err(Failure::Server(reason)),
        Ok(Reply {
            answer: Answer::Error(error),
            ..
        }) => Err(failure(error)),
        Ok(reply) => Ok(reply),
    }
}

fn failure(error: WireError) -> Failure {
    let kind = ErrorKind::try_from(error.kind).unwrap_or(ErrorKind::Unspecified);
    if error.server_error {
        Failure::Server(format!("{}: {}", kind.as_str_name(), error.message))
    } else {
        Failure::Client(ClientError::Refused {
            kind,
            message: error.message,
        })
    }
}
