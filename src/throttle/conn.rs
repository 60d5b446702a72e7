//! The proxy's client connections (docs/design.md#the-throttling-sidecar):
//! how many may be open ([`Connections`]: a cap under the descriptor limit;
//! at the cap the connection idle longest is closed for the new one, or
//! the new one if none is idle), how long a client may keep one without
//! sending a first byte, and how long a write to it may stall
//! ([`WriteStall`]). Each connection counts the requests its client
//! cancelled; past its budget it is closed, so a client that resets
//! streams as fast as it opens them pays a new handshake for each batch;
//! and how many of its requests may be past it at once ([`super::credit`]).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::credit::Credit;
use super::protect::{ProtectionCounts, RESET_WINDOW, Reason};

/// The open connections, capped.
pub struct Connections {
    max: usize,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    counts: Arc<ProtectionCounts>,
    epoch: Instant,
}

/// One client connection's state beside hyper's.
pub struct Connection {
    id: u64,
    /// Requests whose answer has not started yet (reading their body
    /// included): a connection with none is idle.
    in_flight: AtomicUsize,
    /// When it last began a request (or was accepted), in ms from the epoch.
    last_active_ms: AtomicU64,
    /// Told to close (evicted, or past its reset budget).
    pub(super) close: Notify,
    /// How many of its requests may be past it at once.
    pub(super) credit: Credit,
    /// Cancelled requests in the current window, and when it began.
    resets: Mutex<(Instant, u32)>,
    max_resets: u32,
    counts: Arc<ProtectionCounts>,
}

impl Connections {
    pub fn new(max: usize, counts: Arc<ProtectionCounts>) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            next_id: AtomicU64::new(0),
            open: Mutex::default(),
            counts,
            epoch: Instant::now(),
        })
    }

    /// A place for a new connection: at the cap, the connection idle
    /// longest is told to close; `None` if none is idle (the new one is
    /// closed at once, before the listen backlog fills).
    pub fn admit(self: &Arc<Self>, max_resets: u32, max_streams: u32) -> Option<Admitted> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= self.max {
            let victim = open
                .values()
                .filter(|connection| connection.in_flight.load(Ordering::Relaxed) == 0)
                .min_by_key(|connection| connection.last_active_ms.load(Ordering::Relaxed))
                .map(|connection| connection.id);
            match victim.and_then(|id| open.remove(&id)) {
                Some(victim) => {
                    victim.close.notify_one();
                    self.counts.count(Reason::ConnectionEvicted);
                }
                None => {
                    self.counts.count(Reason::ConnectionRefused);
                    return None;
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            id,
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
            credit: Credit::new(max_streams),
            resets: Mutex::new((Instant::now(), 0)),
            max_resets,
            counts: self.counts.clone(),
        });
        open.insert(id, connection.clone());
        self.counts.open_connections.fetch_add(1, Ordering::Relaxed);
        Some(Admitted {
            connections: self.clone(),
            connection,
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// A connection's place under the cap, given back when dropped.
pub struct Admitted {
    connections: Arc<Connections>,
    pub(super) connection: Arc<Connection>,
}

impl Admitted {
    /// A request begins on this connection: it is busy until
    /// [`InFlight::answered`], or cancelled if that guard drops first.
    pub fn begin(&self) -> InFlight {
        let connection = &self.connection;
        connection.in_flight.fetch_add(1, Ordering::Relaxed);
        connection
            .last_active_ms
            .store(self.connections.now_ms(), Ordering::Relaxed);
        InFlight {
            connection: connection.clone(),
            answered: false,
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.remove(&self.connection.id);
        self.connections
            .counts
            .open_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request on its way to its answer.
pub struct InFlight {
    connection: Arc<Connection>,
    answered: bool,
}

impl InFlight {
    /// Its answer is ready.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let connection = &self.connection;
        connection.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.answered {
            return;
        }
        // Dropped unanswered: hyper drops a request's future when its
        // client resets the stream or closes the connection.
        connection.counts.count(Reason::Cancelled);
        let mut resets = connection
            .resets
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if now.duration_since(resets.0) >= RESET_WINDOW {
            *resets = (now, 0);
        }
        resets.1 += 1;
        if resets.1 == connection.max_resets.saturating_add(1) {
            connection.counts.count(Reason::TooManyResets);
            connection.close.notify_one();
        }
    }
}

/// A client connection's stream whose writes fail once one has made no
/// progress for `timeout`: a client that stops reading its answer loses
/// its connection instead of keeping it forever.
pub struct WriteStall {
    stream: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
    counts: Arc<ProtectionCounts>,
}

impl WriteStall {
    pub fn new(stream: TcpStream, timeout: Duration, counts: Arc<ProtectionCounts>) -> Self {
        Self {
            stream,
            timeout,
            stalled: None,
            counts,
        }
    }

    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            self.counts.count(Reason::WriteTimeout);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of its answer in time",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for WriteStall {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteStall {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.progress(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.progress(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
