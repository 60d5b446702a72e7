//! The service of [`ThrottleLayer`](super::ThrottleLayer) and its future:
//! a request runs, waits its turn, or is refused. The slot a running
//! request holds is [`Permit`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::Service;

use crate::layer::ResponseBody;
use crate::layer::reply;

use super::cost::Predictor;
use super::permit::{Cost, Permit, THREAD_CLOCK_FROM_MS};
use super::queue::{Admission, Entry, Turn, drain_later, lock};
use super::{Criticality, Settings, ThrottleCounts};

/// Runs at most the layer's capacity of requests at once.
#[derive(Clone)]
pub struct Throttle<S> {
    inner: S,
    settings: Arc<Settings>,
    admission: Arc<Mutex<Admission>>,
    predictor: Arc<Mutex<Predictor>>,
}

impl<S> Throttle<S> {
    pub(super) fn new(
        inner: S,
        settings: Arc<Settings>,
        admission: Arc<Mutex<Admission>>,
        predictor: Arc<Mutex<Predictor>>,
    ) -> Self {
        Self {
            inner,
            settings,
            admission,
            predictor,
        }
    }

    /// The request's class and predicted cost, if the layer measures.
    fn cost_of<B>(&self, request: &Request<B>) -> Option<Cost> {
        if !self.settings.measures() {
            return None;
        }
        let class = self.settings.class_of(request.uri(), request.headers());
        let predictor = lock(&self.predictor);
        let class = predictor.class_of(class);
        let predicted_ms = predictor.predict(&class);
        Some(Cost {
            class,
            predicted_ms,
            used: Duration::ZERO,
            thread_clock: predicted_ms >= THREAD_CLOCK_FROM_MS,
            reported: self.settings.reported_cost.clone(),
            predictor: self.predictor.clone(),
        })
    }

    fn level_of(&self, headers: &HeaderMap) -> Criticality {
        let Some(value) = headers.get(&self.settings.header) else {
            return self.settings.default_level;
        };
        match value.to_str().ok().and_then(Criticality::parse) {
            Some(level) => level,
            None => {
                self.settings
                    .counts
                    .unknown_criticality
                    .fetch_add(1, Ordering::Relaxed);
                self.settings.default_level
            }
        }
    }

    /// How long the request may wait: `max_wait`, or the request's own
    /// deadline if shorter: its `grpc-timeout`, or the
    /// `x-envoy-expected-rq-timeout-ms` Envoy puts on what it forwards. A
    /// value that does not parse is ignored, and counted.
    fn patience(&self, headers: &HeaderMap) -> Duration {
        let mut patience = self.settings.max_wait;
        let deadlines: [(&str, ParseDeadline); 2] = [
            ("grpc-timeout", grpc_timeout),
            ("x-envoy-expected-rq-timeout-ms", envoy_timeout),
        ];
        for (name, parse) in deadlines {
            let Some(value) = headers.get(name) else {
                continue;
            };
            match value.to_str().ok().and_then(parse) {
                Some(timeout) => patience = patience.min(timeout),
                None => {
                    self.settings
                        .counts
                        .bad_deadlines
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        patience
    }
}

/// Reads a deadline header's value.
type ParseDeadline = fn(&str) -> Option<Duration>;

/// `x-envoy-expected-rq-timeout-ms`: whole milliseconds.
fn envoy_timeout(value: &str) -> Option<Duration> {
    if value.is_empty() || value.len() > 12 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().map(Duration::from_millis)
}

/// `grpc-timeout`: at most 8 digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3_600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project! {
    /// The future of [`Throttle`].
    #[project = Projection]
    pub enum ThrottleFuture<F, T> {
        /// A slot was free: the inner service's future.
        Running { #[pin] future: F, permit: Option<Permit> },
        /// Waiting for a turn, then running.
        Waiting { future: Boxed<T> },
        Refused { response: Option<T> },
    }
}

impl<F, B, E> Future for ThrottleFuture<F, Result<Response<ResponseBody<B>>, E>>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::Running { future, permit } => {
                let polled = match permit {
                    Some(permit) => permit.measured(|| future.poll(cx)),
                    None => future.poll(cx),
                };
                let response = std::task::ready!(polled)?;
                Poll::Ready(Ok(carrying(response, permit.take())))
            }
            Projection::Waiting { future } => future.as_mut().poll(cx),
            Projection::Refused { response } => match response.take() {
                Some(response) => Poll::Ready(response),
                None => Poll::Pending,
            },
        }
    }
}

fn carrying<B>(response: Response<B>, mut permit: Option<Permit>) -> Response<ResponseBody<B>> {
    if let Some(permit) = &mut permit {
        permit.reported(response.headers());
    }
    response.map(|body| ResponseBody::throttled(body, permit))
}

/// A refusal, counted.
fn refused<B>(
    counts: &ThrottleCounts,
    grpc: bool,
    retry_after: Duration,
) -> Response<ResponseBody<B>> {
    counts.refused.fetch_add(1, Ordering::Relaxed);
    let mut response = reply::failed(
        grpc,
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded: no turn before the request's deadline",
    );
    response.headers_mut().insert(
        RETRY_AFTER,
        HeaderValue::from(reply::retry_after_seconds(Some(retry_after)).max(1)),
    );
    response
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Throttle<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ThrottleFuture<S::Future, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let level = self.level_of(request.headers());
        let patience = self.patience(request.headers());
        let grpc = reply::is_grpc(&request);
        let cost = self.cost_of(&request);
        let predicted_ms = cost.as_ref().map_or(0.0, |cost| cost.predicted_ms);
        let (turn, ticket, expected) = {
            let mut admission = lock(&self.admission);
            let now = Instant::now();
            match admission.enter(level, predicted_ms, now) {
                Entry::Run => {
                    drop(admission);
                    let permit = Permit {
                        admission: self.admission.clone(),
                        since: now,
                        cost,
                        level,
                    };
                    return ThrottleFuture::Running {
                        future: self.inner.call(request),
                        permit: Some(permit),
                    };
                }
                Entry::Full => {
                    let expected = admission.expected_wait(level, 0, 0.0);
                    drop(admission);
                    return self.refuse(grpc, expected);
                }
                Entry::Wait {
                    turn,
                    ticket,
                    ahead,
                } => {
                    let expected = admission.expected_wait(level, ahead, predicted_ms);
                    if expected > patience {
                        // It would not start in time: refused now, not
                        // after waiting.
                        admission.abandon(level, ticket);
                        drop(admission);
                        return self.refuse(grpc, expected);
                    }
                    drain_later(&self.admission, &mut admission);
                    (turn, ticket, expected)
                }
            }
        };
        // The ready service answers this request once its turn comes; the
        // clone takes its place for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let waiting = Waiting {
            admission: self.admission.clone(),
            counts: self.settings.counts.clone(),
            level,
            ticket,
            queued: true,
            cost,
            turn,
        };
        ThrottleFuture::Waiting {
            future: Box::pin(waiting.run(patience, expected, grpc, inner, request)),
        }
    }
}

impl<S> Throttle<S> {
    fn refuse<F, B, E>(
        &self,
        grpc: bool,
        expected: Duration,
    ) -> ThrottleFuture<F, Result<Response<ResponseBody<B>>, E>> {
        ThrottleFuture::Refused {
            response: Some(Ok(refused(&self.settings.counts, grpc, expected))),
        }
    }
}

/// A queued request: leaves the queue if it is dropped while waiting (its
/// client went away), and gives back a turn that came as it was dropped.
struct Waiting {
    admission: Arc<Mutex<Admission>>,
    counts: Arc<ThrottleCounts>,
    level: Criticality,
    ticket: u64,
    queued: bool,
    cost: Option<Cost>,
    turn: tokio::sync::oneshot::Receiver<Turn>,
}

impl Waiting {
    async fn run<S, ReqBody, ResBody>(
        mut self,
        patience: Duration,
        expected: Duration,
        grpc: bool,
        mut inner: S,
        request: Request<ReqBody>,
    ) -> Result<Response<ResponseBody<ResBody>>, S::Error>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let told = tokio::select! {
            told = &mut self.turn => told,
            () = tokio::time::sleep(patience) => {
                if lock(&self.admission).abandon(self.level, self.ticket) {
                    self.queued = false;
                    return Ok(refused(&self.counts, grpc, expected));
                }
                // Its turn came as the deadline passed: take it.
                (&mut self.turn).await
            }
        };
        self.queued = false;
        match told {
            Ok(Turn::Run) => {
                let mut permit = Permit {
                    admission: self.admission.clone(),
                    since: Instant::now(),
                    cost: self.cost.take(),
                    level: self.level,
                };
                std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                let mut future = std::pin::pin!(inner.call(request));
                let response =
                    std::future::poll_fn(|cx| permit.measured(|| future.as_mut().poll(cx))).await?;
                Ok(carrying(response, Some(permit)))
            }
            Ok(Turn::Evicted) | Err(_) => Ok(refused(&self.counts, grpc, expected)),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        let mut admission = lock(&self.admission);
        if admission.abandon(self.level, self.ticket) {
            return;
        }
        // Its turn was sent (under the lock just taken) but never read: the
        // slot started for it is free again, or it would be lost for good.
        if let Ok(Turn::Run) = self.turn.try_recv() {
            let cost_ms = self.cost.as_ref().map_or(0.0, |cost| cost.predicted_ms);
            admission.give_back(cost_ms, Instant::now());
            drain_later(&self.admission, &mut admission);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_or_are_refused() {
        assert_eq!(grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(grpc_timeout("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "100", "100x", "123456789m", "-1m", "1.5S", "é"] {
            assert_eq!(grpc_timeout(bad), None, "{bad}");
        }
        assert_eq!(envoy_timeout("250"), Some(Duration::from_millis(250)));
        for bad in ["", "-1", "1.5", "15s", "9999999999999", "é"] {
            assert_eq!(envoy_timeout(bad), None, "{bad}");
        }
    }
}
