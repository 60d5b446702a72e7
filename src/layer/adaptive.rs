//! [`AdaptiveThrottleLayer`]: client-side adaptive throttling, for a
//! service's outgoing calls (a hyper, tonic or any Tower HTTP client) —
//! docs/design.md#client-side-adaptive-throttling.
//!
//! Per backend (the request URI's authority), the layer counts over the last
//! 30 seconds (its window) the requests the caller attempted and those the backend
//! accepted, and refuses a new request locally, before sending it, with
//! probability `max(0, (requests − K·accepts) / (requests + 1))` (Google's
//! SRE book, "Handling Overload"), at most `max_refusal` (0.9 by default).
//! While the backend accepts, nothing is refused; as it refuses, the caller
//! sends it only about `K` times what it accepts, so a rejected caller
//! backs off instead of adding to the overload.
//!
//! The requests counted include those the caller refused itself, so once
//! the backend is back a caller sends `K` times more each window: from the
//! bound's tenth to all of it in about four windows (two minutes with the
//! default window; the SRE book's two-minute window takes eight). Without
//! the bound, against a backend that accepted nothing for a whole window
//! the formula refuses all but one request in `requests + 1`, and coming
//! back takes several times longer.
//!
//! The backend *refused* when it answered 429 or 503, or a gRPC status
//! `RESOURCE_EXHAUSTED` or `UNAVAILABLE` in the response's headers, or
//! failed to answer; any other answer is an accept. Outgoing requests
//! without an `x-criticality` header get the criticality of the request
//! being handled, when a [`ThrottleLayer`](super::ThrottleLayer) admitted
//! it ([`Criticality::current`](super::Criticality::current)).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::Criticality;

/// The most backends a layer keeps counts for; past it, new backends share
/// one count.
const MAX_BACKENDS: usize = 1_024;

/// Refused by the caller's own throttling, or the inner service's error.
#[derive(Debug, thiserror::Error)]
pub enum AdaptiveError<E> {
    /// Not sent: the backend has been refusing (`requests` attempted and
    /// `accepts` accepted in the window).
    #[error(
        "not sent: the backend accepted {accepts} of the last {requests} requests (client-side throttling)"
    )]
    Throttled { requests: u64, accepts: u64 },
    #[error(transparent)]
    Inner(E),
}

/// Requests and accepts per second, for the window's seconds.
#[derive(Debug)]
struct Counts {
    /// `(second, requests, accepts)`, a ring indexed by second.
    seconds: Vec<(u64, u64, u64)>,
}

impl Counts {
    fn new(window_seconds: usize) -> Self {
        Self {
            seconds: vec![(u64::MAX, 0, 0); window_seconds.max(1)],
        }
    }

    fn slot(&mut self, second: u64) -> &mut (u64, u64, u64) {
        let ring = self.seconds.len() as u64;
        let slot = &mut self.seconds[(second % ring) as usize];
        if slot.0 != second {
            *slot = (second, 0, 0);
        }
        slot
    }

    /// Requests and accepts in the window that ends at `second`.
    fn totals(&self, second: u64) -> (u64, u64) {
        let since = second.saturating_sub(self.seconds.len() as u64 - 1);
        self.seconds
            .iter()
            .filter(|(at, _, _)| *at != u64::MAX && *at >= since && *at <= second)
            .fold((0, 0), |(requests, accepts), (_, r, a)| {
                (requests + r, accepts + a)
            })
    }
}

struct Shared {
    /// `K`: how many requests per accept the caller may send.
    k: f64,
    /// The highest probability of a local refusal.
    max_refusal: f64,
    /// How many seconds the counts remember.
    window_seconds: usize,
    started: Instant,
    backends: Mutex<HashMap<String, Counts>>,
    /// Draws for the refusal's probability (splitmix64 of a counter).
    draws: AtomicU64,
    header: HeaderName,
}

impl Shared {
    fn second(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn with_counts<T>(&self, backend: &str, change: impl FnOnce(&mut Counts) -> T) -> T {
        let mut backends = self.backends.lock().unwrap_or_else(PoisonError::into_inner);
        let backend = if backends.len() >= MAX_BACKENDS && !backends.contains_key(backend) {
            ""
        } else {
            backend
        };
        if !backends.contains_key(backend) {
            backends.insert(backend.to_owned(), Counts::new(self.window_seconds));
        }
        match backends.get_mut(backend) {
            Some(counts) => change(counts),
            None => change(&mut Counts::new(self.window_seconds)),
        }
    }

    /// Counts an attempt; `Err` with the totals if it is refused locally.
    fn attempt(&self, backend: &str) -> Result<(), (u64, u64)> {
        let second = self.second();
        let (requests, accepts) = self.with_counts(backend, |counts| {
            counts.slot(second).1 += 1;
            counts.totals(second)
        });
        let refuse = ((requests as f64 - self.k * accepts as f64) / (requests as f64 + 1.0))
            .min(self.max_refusal);
        if refuse > 0.0 && self.draw() < refuse {
            Err((requests, accepts))
        } else {
            Ok(())
        }
    }

    fn accepted(&self, backend: &str) {
        let second = self.second();
        self.with_counts(backend, |counts| counts.slot(second).2 += 1);
    }

    /// A number in [0, 1).
    fn draw(&self) -> f64 {
        let mut z = self
            .draws
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Client-side adaptive throttling for outgoing calls; see the module.
#[derive(Clone)]
pub struct AdaptiveThrottleLayer {
    shared: Arc<Shared>,
}

impl Default for AdaptiveThrottleLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveThrottleLayer {
    /// `K` = 2: up to twice as many requests as the backend accepts.
    pub fn new() -> Self {
        Self::with_k(2.0)
    }

    /// `k` requests sent per request accepted (at least 1; the SRE book
    /// suggests 2, lower is more aggressive).
    pub fn with_k(k: f64) -> Self {
        let k = if k.is_finite() { k.max(1.0) } else { 2.0 };
        Self::with(k, 0.9, 30, HeaderName::from_static("x-criticality"))
    }

    fn with(k: f64, max_refusal: f64, window_seconds: usize, header: HeaderName) -> Self {
        Self {
            shared: Arc::new(Shared {
                k,
                max_refusal,
                window_seconds,
                started: Instant::now(),
                backends: Mutex::default(),
                draws: AtomicU64::new(0),
                header,
            }),
        }
    }

    /// The highest probability of refusing a request locally (0 to 1;
    /// default 0.9): what is always sent to find out the backend is back.
    pub fn max_refusal(self, probability: f64) -> Self {
        let probability = if probability.is_finite() {
            probability.clamp(0.0, 1.0)
        } else {
            0.9
        };
        let shared = &self.shared;
        Self::with(
            shared.k,
            probability,
            shared.window_seconds,
            shared.header.clone(),
        )
    }

    /// How long the counts remember (whole seconds, 1 to 600; default 30
    /// seconds, as gRPC's adaptive throttler; the SRE book uses two
    /// minutes).
    pub fn window(self, window: std::time::Duration) -> Self {
        let seconds = window.as_secs().clamp(1, 600) as usize;
        let shared = &self.shared;
        Self::with(shared.k, shared.max_refusal, seconds, shared.header.clone())
    }

    /// The header outgoing requests carry their criticality in (default
    /// `x-criticality`).
    pub fn criticality_header(self, header: HeaderName) -> Self {
        let shared = &self.shared;
        Self::with(shared.k, shared.max_refusal, shared.window_seconds, header)
    }

    /// Requests attempted and accepted over the window, for
    /// `backend` (an authority such as `api.example:443`).
    pub fn counts(&self, backend: &str) -> (u64, u64) {
        let second = self.shared.second();
        self.shared
            .with_counts(backend, |counts| counts.totals(second))
    }
}

impl<S> Layer<S> for AdaptiveThrottleLayer {
    type Service = AdaptiveThrottle<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveThrottle {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`AdaptiveThrottleLayer`].
#[derive(Clone)]
pub struct AdaptiveThrottle<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveThrottle<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = AdaptiveError<S::Error>;
    type Future = AdaptiveFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(AdaptiveError::Inner)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let backend = request
            .uri()
            .authority()
            .map_or_else(String::new, |authority| authority.as_str().to_owned());
        if let Err((requests, accepts)) = self.shared.attempt(&backend) {
            return AdaptiveFuture::Refused {
                counts: Some((requests, accepts)),
            };
        }
        if let Some(level) = Criticality::current() {
            let header = self.shared.header.clone();
            request
                .headers_mut()
                .entry(header)
                .or_insert(HeaderValue::from_static(level.as_str()));
        }
        AdaptiveFuture::Sent {
            future: self.inner.call(request),
            shared: self.shared.clone(),
            backend,
        }
    }
}

/// Whether a response says the backend refused the request.
fn refused<B>(response: &Response<B>) -> bool {
    if matches!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        return true;
    }
    // gRPC's RESOURCE_EXHAUSTED (8) and UNAVAILABLE (14), trailers-only.
    matches!(
        response
            .headers()
            .get("grpc-status")
            .map(HeaderValue::as_bytes),
        Some(b"8" | b"14")
    )
}

pin_project! {
    /// The future of [`AdaptiveThrottle`].
    #[project = Projection]
    pub enum AdaptiveFuture<F> {
        Sent { #[pin] future: F, shared: Arc<Shared>, backend: String },
        /// Not sent: the requests and accepts that refused it.
        Refused { counts: Option<(u64, u64)> },
    }
}

impl<F, B, E> Future for AdaptiveFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, AdaptiveError<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::Sent {
                future,
                shared,
                backend,
            } => {
                let answer = std::task::ready!(future.poll(cx));
                if let Ok(response) = &answer
                    && !refused(response)
                {
                    shared.accepted(backend);
                }
                Poll::Ready(answer.map_err(AdaptiveError::Inner))
            }
            Projection::Refused { counts } => match counts.take() {
                Some((requests, accepts)) => {
                    Poll::Ready(Err(AdaptiveError::Throttled { requests, accepts }))
                }
                None => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_forgets_after_its_seconds() {
        let mut counts = Counts::new(120);
        counts.slot(0).1 += 5;
        counts.slot(0).2 += 2;
        counts.slot(100).1 += 1;
        assert_eq!(counts.totals(100), (6, 2));
        assert_eq!(counts.totals(119), (6, 2));
        assert_eq!(counts.totals(120), (1, 0));
        // A second's slot is reused 120 seconds later, from zero.
        counts.slot(120).1 += 1;
        assert_eq!(counts.totals(120), (2, 0));
    }

    #[test]
    fn draws_are_spread_over_the_unit_interval() {
        let shared = AdaptiveThrottleLayer::new().shared;
        let draws: Vec<f64> = (0..10_000).map(|_| shared.draw()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let below_half = draws.iter().filter(|d| **d < 0.5).count();
        assert!((4_800..5_200).contains(&below_half), "{below_half}");
    }

    #[test]
    fn grpc_and_http_refusals_are_recognised() {
        let answer = |status: u16, grpc: Option<&'static str>| {
            let mut response = Response::new(());
            *response.status_mut() = StatusCode::from_u16(status).unwrap_or_default();
            if let Some(grpc) = grpc {
                response
                    .headers_mut()
                    .insert("grpc-status", HeaderValue::from_static(grpc));
            }
            refused(&response)
        };
        assert!(answer(429, None) && answer(503, None));
        assert!(answer(200, Some("8")) && answer(200, Some("14")));
        assert!(!answer(200, None) && !answer(200, Some("0")) && !answer(500, None));
    }
}
