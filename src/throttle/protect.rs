//! What the proxy does against hostile clients (docs/design.md#the-throttling-sidecar):
//! the bounds a request and a connection live under ([`Protection`]), what
//! each bound stopped ([`ProtectionCounts`], `/metrics`), and the process's
//! side of them: the descriptor limit raised at start and a listen backlog
//! sized for it.
//!
//! The rule they keep: a slow or hostile client holds a connection, never
//! a slot. The proxy reads a request's whole body before the request
//! queues ([`super::buffer`]), and reads the upstream's answer as fast as
//! the upstream sends it, so the slot is given back once the answer is in
//! whatever the client's pace; each phase a client controls has a timeout,
//! and the connections themselves are capped below the descriptor limit.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

/// The bounds a client's requests and connections live under.
#[derive(Debug, Clone)]
pub struct Protection {
    /// The most of a request body read before it queues, and of a response
    /// read ahead of its client; a larger request is refused 413, a larger
    /// response streams at the client's pace without its slot.
    pub max_buffered_body: usize,
    /// The longest a request body may take to arrive whole (then 408).
    pub request_body_timeout: Duration,
    /// The longest a client may take to send a request's headers, the
    /// first request's first byte included (then the connection closes).
    pub header_read_timeout: Duration,
    /// The longest a write to a client may make no progress (then the
    /// connection closes).
    pub response_write_timeout: Duration,
    /// The most connections open at once (none: derived from the
    /// descriptor limit at start).
    pub max_connections: Option<usize>,
    /// The listen backlog.
    pub listen_backlog: u32,
    /// The most HTTP/2 streams open at once on one connection.
    pub max_streams_per_connection: u32,
    /// The most requests one connection may cancel (reset, or abandon)
    /// within [`RESET_WINDOW`] before it is closed.
    pub max_resets_per_connection: u32,
}

/// The window [`Protection::max_resets_per_connection`] counts over.
pub const RESET_WINDOW: Duration = Duration::from_secs(10);

/// Descriptors kept aside from connections: the listeners, the log, the
/// admin port's clients.
const SPARE_DESCRIPTORS: u64 = 64;

impl Default for Protection {
    fn default() -> Self {
        Self {
            max_buffered_body: 1 << 20,
            request_body_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            response_write_timeout: Duration::from_secs(30),
            max_connections: None,
            listen_backlog: 1_024,
            max_streams_per_connection: 100,
            max_resets_per_connection: 100,
        }
    }
}

/// The connection cap a descriptor limit allows: each client connection
/// may need one to the upstream too.
pub fn connections_for(descriptors: u64) -> usize {
    let usable = descriptors.saturating_sub(SPARE_DESCRIPTORS) / 2;
    usize::try_from(usable).unwrap_or(usize::MAX).max(1)
}

/// What a protection stopped, each a `reason` of
/// `charon_throttle_protection_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A request body not in whole before its timeout: 408.
    BodyTimeout,
    /// A request body past the buffer's bound: 413.
    BodyTooLarge,
    /// A connection closed for sending headers too slowly (or nothing).
    HeaderTimeout,
    /// A connection closed for reading its answer too slowly.
    WriteTimeout,
    /// A request cancelled by its client before its answer (reset, gone).
    Cancelled,
    /// A connection closed for cancelling too many requests.
    TooManyResets,
    /// An idle connection closed to make room under the cap.
    ConnectionEvicted,
    /// A connection closed at once: the cap reached, none idle.
    ConnectionRefused,
    /// A response past the buffer's bound, streamed without its slot.
    ResponseStreamed,
}

impl Reason {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Reason; 9] = [
        Reason::BodyTimeout,
        Reason::BodyTooLarge,
        Reason::HeaderTimeout,
        Reason::WriteTimeout,
        Reason::Cancelled,
        Reason::TooManyResets,
        Reason::ConnectionEvicted,
        Reason::ConnectionRefused,
        Reason::ResponseStreamed,
    ];

    /// Its `reason` label and `/stats` key.
    pub fn name(self) -> &'static str {
        match self {
            Reason::BodyTimeout => "body_timeout",
            Reason::BodyTooLarge => "body_too_large",
            Reason::HeaderTimeout => "header_timeout",
            Reason::WriteTimeout => "write_timeout",
            Reason::Cancelled => "cancelled",
            Reason::TooManyResets => "too_many_resets",
            Reason::ConnectionEvicted => "connection_evicted",
            Reason::ConnectionRefused => "connection_refused",
            Reason::ResponseStreamed => "response_streamed",
        }
    }
}

/// How many times each [`Reason`] happened.
#[derive(Debug, Default)]
pub struct ProtectionCounts {
    counts: [AtomicU64; Reason::ALL.len()],
    /// Connections open now.
    pub(super) open_connections: AtomicU64,
}

impl ProtectionCounts {
    pub(super) fn count(&self, reason: Reason) {
        self.counts[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many times `reason` happened.
    pub fn get(&self, reason: Reason) -> u64 {
        self.counts[reason as usize].load(Ordering::Relaxed)
    }
}

/// Raises the soft limit on open descriptors to the hard limit, and
/// returns the limit in force: a proxy holds two per connection, and an
/// inherited soft limit (often 1024) is far below what it can serve.
pub fn raise_descriptor_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1_024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        } else {
            tracing::warn!(
                soft = limit.rlim_cur,
                hard = limit.rlim_max,
                "could not raise the descriptor limit"
            );
        }
    }
    limit.rlim_cur
}

/// A listener on `addr` with a backlog of `backlog` (the kernel caps it at
/// `net.core.somaxconn`).
pub fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}
