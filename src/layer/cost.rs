//! [`CostLimitLayer`]: budgets of a cost known only when the response ends
//! (LLM tokens, bytes, CPU time), on descriptors whose limit is
//! `cost: after_response` (docs/configuration.md#costs-known-after-the-response).
//!
//! At admission the layer checks the descriptors (`hits_addend` 0): the
//! engine admits the request only while the budget left covers the
//! predicted cost of the requests in flight and of this one. The handler
//! says what the request cost by putting a [`Cost`] in its response's
//! extensions, and may keep adding to it while a streaming body runs; the
//! layer charges it when the body ends, or when the body is dropped (a
//! client that went away is still charged what was spent). A response with
//! a server-error status is not charged unless the layer is told to
//! ([`CostLimitLayer::charge_errors`]); a response without a `Cost`, or with
//! a cost of 0, charges nothing, and its admission stops counting after the
//! learned time to charge.
//!
//! With an estimate ([`CostLimitLayer::estimate`], such as a `max_tokens`
//! header), the layer reserves it instead (docs/design.md#reservations):
//! the request is admitted only if the estimate fits what the budget has
//! left, and when the body ends the reservation is committed at the
//! response's cost, or cancelled when nothing is charged (no `Cost`, a
//! server error). A request abandoned before its response keeps its
//! reservation until it expires, and is charged its estimate then.
//!
//! A service that knows the cost only at the very end (a gRPC stream) can
//! state it in a trailer instead ([`CostLimitLayer::cost_trailer`]).

use std::sync::Arc;

use http::{HeaderMap, HeaderName, Request};

use crate::client::{Client, ClientError, CostReservation, LimitStatus, LimitsAnswer, ReserveCost};
use crate::limiter::RateLimitRequest;

use super::Actions;
use super::descriptors::{DescriptorsOf, boxed, keys, verdict};
use super::limit::{Limit, LimitLayer};
use super::policy::{Asked, Extra, Options, Policy, Verdict};
use super::settle::Settle;

/// Checks a budget before each request and charges what the response says
/// it cost when its body ends.
pub type CostLimitLayer<F = Actions> = LimitLayer<PerCost<F>>;

/// The service of [`CostLimitLayer`].
pub type CostLimit<S, F = Actions> = Limit<S, PerCost<F>>;

impl<F> CostLimitLayer<F> {
    /// The budgets of the descriptors `descriptors` builds from each
    /// request, in `namespace`.
    pub fn new(client: Client, namespace: &str, descriptors: F) -> Self {
        Self::with_policy(
            client,
            namespace,
            PerCost {
                descriptors,
                charge_errors: false,
                estimate: None,
                trailer: None,
            },
        )
    }

    /// Reserve what `estimate` says a request will cost, from its headers
    /// (`None`: check with the predicted cost instead).
    pub fn estimate(
        self,
        estimate: impl Fn(&HeaderMap) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        let estimate: Arc<Estimate> = Arc::new(estimate);
        self.map_policy(|policy| PerCost {
            estimate: Some(estimate),
            ..policy
        })
    }

    /// Read the cost from the response's trailer `name` (a gRPC service's,
    /// or a streaming body's), when the body ends: it states the whole
    /// cost, replacing what a [`Cost`](super::Cost) extension counted.
    pub fn cost_trailer(self, name: HeaderName) -> Self {
        self.map_policy(|policy| PerCost {
            trailer: Some(name.clone()),
            ..policy
        })
    }

    /// Reserve the number a request's `header` carries (a `max_tokens`
    /// the client sent); a request without it, or with a value that is not
    /// a whole number above 0, is checked with the predicted cost instead.
    pub fn estimate_header(self, header: &'static str) -> Self {
        self.estimate(move |headers| {
            headers
                .get(header)?
                .to_str()
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|estimate| *estimate > 0)
        })
    }

    /// Charge responses with a server-error status (5xx) too (default:
    /// work that failed is not charged).
    pub fn charge_errors(self, on: bool) -> Self {
        self.map_policy(|policy| PerCost {
            charge_errors: on,
            ..policy
        })
    }
}

type Estimate = dyn Fn(&HeaderMap) -> Option<u64> + Send + Sync;

/// The policy of [`CostLimitLayer`].
#[derive(Clone)]
pub struct PerCost<F> {
    descriptors: F,
    charge_errors: bool,
    estimate: Option<Arc<Estimate>>,
    trailer: Option<HeaderName>,
}

impl<F: std::fmt::Debug> std::fmt::Debug for PerCost<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerCost")
            .field("descriptors", &self.descriptors)
            .field("charge_errors", &self.charge_errors)
            .field("estimate", &self.estimate.is_some())
            .field("trailer", &self.trailer)
            .finish()
    }
}

/// How a request was admitted.
pub enum Admission {
    /// Checked with the predicted cost; the request, to charge later.
    Checked(Result<LimitsAnswer, ClientError>, RateLimitRequest),
    /// Its estimate reserved.
    Reserved(Result<CostReservation, ClientError>),
}

impl<B, F: DescriptorsOf<B>> Policy<B> for PerCost<F> {
    type Asked = (Vec<String>, Settle);
    type Decided = Admission;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        request: &Request<B>,
    ) -> Asked<Self::Asked, Self::Decided> {
        let descriptors = self.descriptors.descriptors_of(request);
        if descriptors.is_empty() {
            return Asked::Pass;
        }
        let names = descriptors.iter().map(keys).collect();
        let settle = Settle {
            client: client.clone(),
            // The check's request, once it is answered.
            charge: RateLimitRequest::default(),
            charge_errors: self.charge_errors,
            reservation: None,
            trailer: self.trailer.clone(),
        };
        let client = client.clone();
        if let Some(amount) = self.estimate.as_ref().and_then(|f| f(request.headers())) {
            // A reservation is committed by its id: the settlement needs
            // no descriptors.
            let reserve = ReserveCost::new(namespace, descriptors, amount);
            return Asked::Decide(
                (names, settle),
                boxed(async move { Admission::Reserved(client.reserve_cost(reserve).await) }),
            );
        }
        // Checked by reference, then kept to be charged: one request, no
        // copy of its descriptors.
        let request = RateLimitRequest {
            hits_addend: 0,
            ..RateLimitRequest::new(namespace, descriptors)
        };
        Asked::Decide(
            (names, settle),
            boxed(async move {
                let answer = client.check(&request).await;
                Admission::Checked(answer, request)
            }),
        )
    }

    fn verdict<R>(
        &self,
        (names, mut settle): Self::Asked,
        answer: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<R> {
        let answer = match answer {
            Admission::Checked(answer, request) => {
                settle.charge = request;
                answer
            }
            Admission::Reserved(Ok(reservation)) => {
                let answer = reserved(&names, &reservation);
                if reservation.granted {
                    settle.reservation = Some(reservation);
                }
                Ok(answer)
            }
            Admission::Reserved(Err(error)) => Err(error),
        };
        match verdict(&names, answer, grpc, options) {
            Verdict::Pass(extra) => Verdict::Pass(Extra {
                settle: Some(settle),
                ..extra
            }),
            answer => answer,
        }
    }
}

/// A reservation's answer as the descriptors' statuses: each budget as
/// tight as the tightest (the reservation says no more).
fn reserved(names: &[String], reservation: &CostReservation) -> LimitsAnswer {
    LimitsAnswer {
        over_limit: !reservation.granted,
        statuses: names
            .iter()
            .map(|_| LimitStatus {
                over_limit: !reservation.granted,
                limit: None,
                remaining: reservation.remaining,
                reset_after: reservation.retry_after,
            })
            .collect(),
        unanswered: reservation.unanswered,
        overridden: false,
    }
}
