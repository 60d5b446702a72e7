//! The calls a [`Client`] hands out, ready to be awaited: a rate request
//! ([`RequestCall`]) and a copy hold ([`HoldCall`]), with what they ask for
//! (copies, a minimum, how long to retry) and one attempt of each.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{RequestOp, ReserveOp};

use crate::criticality::Criticality;

use super::{Attempt, Client, ClientError, Failure, Hold, RateAnswer, RateContext, Reply};

/// How many copies (or hits) a call asks for, and how long it may wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Amount {
    pub(super) copies: u64,
    pub(super) min_copies: Option<u64>,
    pub(super) max_wait: Duration,
}

impl Default for Amount {
    fn default() -> Self {
        Self {
            copies: 1,
            min_copies: None,
            max_wait: Duration::ZERO,
        }
    }
}

impl Amount {
    /// `(copies, min_copies)` as the wire wants them, checked.
    fn wire(&self) -> Result<(i64, i64), ClientError> {
        let min = self.min_copies.unwrap_or(self.copies);
        if self.copies == 0 || min == 0 || min > self.copies {
            return Err(ClientError::Invalid(format!(
                "copies must be at least 1 and min_copies between 1 and copies (got {} and {min})",
                self.copies
            )));
        }
        let wide = |value: u64| {
            i64::try_from(value)
                .map_err(|_| ClientError::Invalid(format!("{value} copies is too many")))
        };
        Ok((wide(self.copies)?, wide(min)?))
    }

    fn min(&self) -> u64 {
        self.min_copies.unwrap_or(self.copies)
    }
}

macro_rules! amount_setters {
    () => {
        /// At most this many (default 1).
        pub fn copies(mut self, copies: u64) -> Self {
            self.amount.copies = copies;
            self
        }

        /// At least this many, or nothing (default: `copies`).
        pub fn min_copies(mut self, min_copies: u64) -> Self {
            self.amount.min_copies = Some(min_copies);
            self
        }

        /// Retry rejections for up to this long (default 0: no retries).
        pub fn max_wait(mut self, max_wait: Duration) -> Self {
            self.amount.max_wait = max_wait;
            self
        }
    };
}

/// [`Client::request`], ready to be awaited.
#[must_use = "a request does nothing until awaited"]
pub struct RequestCall {
    pub(super) client: Client,
    pub(super) namespace: String,
    pub(super) resource: String,
    pub(super) domain: String,
    pub(super) amount: Amount,
}

impl RequestCall {
    amount_setters!();
}

impl IntoFuture for RequestCall {
    type Output = Result<RateAnswer, ClientError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        // The op is built before the future, so the future holds it once.
        let (copies, min_copies) = match self.amount.wire() {
            Ok(range) => range,
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let op = RequestOp {
            namespace: self.namespace,
            resource: self.resource,
            domain: self.domain,
            copies: Some(copies),
            min_copies: Some(min_copies),
        };
        let (client, amount) = (self.client, self.amount);
        Box::pin(async move {
            let min = amount.min();
            let (mut answer, waited) = client
                .retrying(amount.max_wait, op, |op| client.request_once(op, min))
                .await?;
            answer.waited = waited;
            Ok(answer)
        })
    }
}

impl Client {
    async fn request_once(
        &self,
        op: RequestOp,
        min: u64,
    ) -> Result<Attempt<RateAnswer>, ClientError> {
        match self.call_with(|backend| backend.request(op)).await {
            Ok(Reply {
                answer: Answer::Request(answer),
                ..
            }) => {
                let retry_after = answer.retry_after_ms.map(Duration::from_millis);
                let mut rate = RateAnswer {
                    granted: answer.granted,
                    retry_after,
                    degraded: answer.degraded,
                    unanswered: false,
                    overridden: false,
                    soft_limit_exceeded: answer.soft_limit_exceeded,
                    context: answer.context.unwrap_or_default(),
                    waited: Duration::ZERO,
                };
                if rate.granted > 0 {
                    return Ok(Attempt::Done(rate));
                }
                if self.overridden() {
                    rate.granted = min;
                    rate.overridden = true;
                    return Ok(Attempt::Done(rate));
                }
                Ok(Attempt::Rejected(
                    rate,
                    Some(retry_after.unwrap_or(Duration::MAX)),
                ))
            }
            Ok(_) => Err(ClientError::Unavailable(
                "the server answered another operation".into(),
            )),
            Err(Failure::Client(error)) => Err(error),
            Err(Failure::Server(reason)) => {
                self.degraded(&reason)?;
                Ok(Attempt::Done(RateAnswer {
                    granted: min,
                    retry_after: None,
                    degraded: true,
                    unanswered: true,
                    overridden: false,
                    soft_limit_exceeded: false,
                    context: RateContext::default(),
                    waited: Duration::ZERO,
                }))
            }
        }
    }

    async fn reserve_once(
        &self,
        op: ReserveOp,
        min: u64,
        patience: Duration,
    ) -> Result<Attempt<Hold>, ClientError> {
        let reserved = self.call_patiently(Op::Reserve(op.clone()), patience).await;
        match reserved {
            Ok(Reply {
                answer: Answer::Reserve(answer),
                session,
            }) => {
                if answer.granted > 0 || answer.done {
                    return Ok(Attempt::Done(Hold::reserved(
                        self.clone(),
                        op,
                        answer,
                        session,
                    )));
                }
                let mut hold = Hold::reserved(self.clone(), op, answer, session);
                if self.overridden() {
                    hold.set_overridden(min);
                    return Ok(Attempt::Done(hold));
                }
                Ok(Attempt::Rejected(hold, None))
            }
            Ok(_) => Err(ClientError::Unavailable(
                "the server answered another operation".into(),
            )),
            Err(Failure::Client(error)) => Err(error),
            Err(Failure::Server(reason)) => {
                self.degraded(&reason)?;
                Ok(Attempt::Done(Hold::in_the_dark(self.clone(), op, min)))
            }
        }
    }
}

/// The longest a server waits for copies in one reserve (the Charon API's
/// bound on `max_wait_ms`).
const MAX_SERVER_WAIT: Duration = Duration::from_secs(60);

/// [`Client::hold`], ready to be awaited.
#[must_use = "a hold does nothing until awaited"]
pub struct HoldCall {
    pub(super) client: Client,
    pub(super) namespace: String,
    pub(super) resource: String,
    pub(super) domain: String,
    pub(super) amount: Amount,
    pub(super) criticality: Option<Criticality>,
    pub(super) for_anyone: bool,
}

impl HoldCall {
    amount_setters!();

    /// The reserve's place in the server's queue while it waits (with
    /// `max_wait`). Default: the criticality of the request being handled
    /// ([`Criticality::current`]), else `critical`.
    pub fn criticality(mut self, level: Criticality) -> Self {
        self.criticality = Some(level);
        self
    }

    /// Waits "for anyone" (PoolCounter's ACQ4ANY; with `max_wait`): if
    /// another holder [releases as done](Hold::release_done) while this
    /// waits, the answer is a hold that [`is_done`](Hold::is_done), holding
    /// nothing: read the result that holder cached instead of computing it
    /// again. A copy freed without `done` is still granted as usual
    /// (docs/design.md#waiting-for-anyones-result).
    pub fn for_anyone(mut self) -> Self {
        self.for_anyone = true;
        self
    }
}

impl IntoFuture for HoldCall {
    type Output = Result<Hold, ClientError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (copies, min_copies) = self.amount.wire()?;
            let max_wait = self.amount.max_wait;
            let op = ReserveOp {
                namespace: self.namespace,
                resource: self.resource,
                domain: self.domain,
                copies: Some(copies),
                min_copies: Some(min_copies),
                max_wait_ms: None,
                // A reserve made while handling a throttled request waits
                // in the place of that request's criticality.
                criticality: self
                    .criticality
                    .or_else(Criticality::current)
                    .map(|level| level.as_str().to_owned()),
                for_anyone: self.for_anyone.then_some(true),
            };
            let client = &self.client;
            let min = self.amount.min();
            // The server waits for copies in its queue (served in order);
            // retries cover a server that answered sooner.
            let started = tokio::time::Instant::now();
            let (mut hold, waited) = client
                .retrying(max_wait, op, |mut op| {
                    let left = max_wait
                        .saturating_sub(started.elapsed())
                        .min(MAX_SERVER_WAIT);
                    op.max_wait_ms = (!left.is_zero()).then_some(left.as_millis() as u64);
                    client.reserve_once(op, min, left)
                })
                .await?;
            hold.set_waited(waited);
            Ok(hold)
        })
    }
}
