//! The throttler's requests-per-second form (docs/design.md#the-throttling-sidecar):
//! a first-in first-out queue of fixed size, released at a fixed rate. A
//! leaky bucket as a queue, not as a meter: a request waits its turn rather
//! than being refused, and only a full queue refuses (503, `Retry-After`:
//! the time the queue takes to drain).
//!
//! One task releases the queue: the head goes when its turn comes, at most
//! one request every `1 / rate`. A request whose caller gave up leaves the
//! queue without using a turn, so the rate holds for those that wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::forward::{ProxyBody, own_answer};

/// A queue of `size` requests released `rate` a second.
#[derive(Clone)]
pub struct DrainQueue {
    sender: mpsc::Sender<oneshot::Sender<()>>,
    /// How long the whole queue takes to drain, for `Retry-After`.
    drain_time: Duration,
    refused: Arc<AtomicU64>,
}

impl DrainQueue {
    /// Starts the task that releases the queue (it ends when every clone of
    /// the queue is dropped). `rate` is at least one request a minute.
    pub fn start(rate: f64, size: usize) -> Self {
        let every = Duration::from_secs_f64(1.0 / rate.clamp(1.0 / 60.0, 1e9));
        let (sender, receiver) = mpsc::channel(size.max(1));
        tokio::spawn(release(receiver, every));
        Self {
            sender,
            drain_time: every.saturating_mul(u32::try_from(size.max(1)).unwrap_or(u32::MAX)),
            refused: Arc::default(),
        }
    }

    /// Requests refused because the queue was full.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.sender.max_capacity() - self.sender.capacity()
    }

    /// Wraps `inner`: each request waits its turn first.
    pub fn layer<S>(&self, inner: S) -> Drained<S> {
        Drained {
            queue: self.clone(),
            inner,
        }
    }
}

/// Releases the head of the queue every `every`, skipping those gone.
async fn release(mut queue: mpsc::Receiver<oneshot::Sender<()>>, every: Duration) {
    let mut next = Instant::now();
    while let Some(waiter) = queue.recv().await {
        // On the grid while the queue is busy (a late wake-up does not
        // push the next turns back); from now after it was idle.
        let turn = next.max(Instant::now());
        tokio::time::sleep_until(turn).await;
        if waiter.send(()).is_ok() {
            next = turn + every;
        }
    }
}

/// A service whose requests wait their turn in a [`DrainQueue`].
#[derive(Clone)]
pub struct Drained<S> {
    queue: DrainQueue,
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for Drained<S>
where
    S: tower::Service<Request<B>, Response = Response<ProxyBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ProxyBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (turn, wait) = oneshot::channel();
        if self.queue.sender.try_send(turn).is_err() {
            self.queue.refused.fetch_add(1, Ordering::Relaxed);
            let mut refusal = own_answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded: the queue is full",
            );
            let seconds = self.queue.drain_time.as_secs_f64().ceil().max(1.0) as u64;
            refusal
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
            return Box::pin(async move { Ok(refusal) });
        }
        // The service that was made ready is this one; a clone stands in.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            if wait.await.is_err() {
                return Ok(own_answer(StatusCode::SERVICE_UNAVAILABLE, "shutting down"));
            }
            inner.call(request).await
        })
    }
}
