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

use http::Request;

use crate::client::{Client, ClientError, LimitsAnswer};
use crate::limiter::{Descriptor, RateLimitRequest};

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
            },
        )
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

/// The policy of [`CostLimitLayer`].
#[derive(Debug, Clone)]
pub struct PerCost<F> {
    descriptors: F,
    charge_errors: bool,
}

impl<B, F: DescriptorsOf<B>> Policy<B> for PerCost<F> {
    type Asked = (Vec<String>, Settle);
    type Decided = Result<LimitsAnswer, ClientError>;

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
        let checks = descriptors
            .iter()
            .map(|descriptor| Descriptor {
                hits_addend: Some(0),
                ..descriptor.clone()
            })
            .collect();
        let settle = Settle {
            client: client.clone(),
            namespace: namespace.into(),
            descriptors,
            charge_errors: self.charge_errors,
        };
        let client = client.clone();
        let request = RateLimitRequest {
            hits_addend: 0,
            ..RateLimitRequest::new(namespace, checks)
        };
        Asked::Decide(
            (names, settle),
            boxed(async move { client.should_rate_limit(request).await }),
        )
    }

    fn verdict<R>(
        &self,
        (names, settle): Self::Asked,
        answer: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<R> {
        match verdict(&names, answer, grpc, options) {
            Verdict::Pass(extra) => Verdict::Pass(Extra {
                settle: Some(settle),
                ..extra
            }),
            answer => answer,
        }
    }
}
