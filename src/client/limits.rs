//! Envoy-style requests from Rust: a namespace and a list of descriptors,
//! decided as one request, all or nothing (docs/design.md#all-or-nothing),
//! by the same rules as Envoy's `ShouldRateLimit`
//! (docs/design.md#envoy-answers). The embedded engine hands the request to
//! its limiter as it is; a sidecar is asked over Envoy's own
//! `RateLimitService` on the connection the client already has.

use std::time::Duration;

use crate::limiter::{CurrentLimit, DescriptorStatus, RateLimitAnswer};

/// The answer to [`Client::should_rate_limit`](super::Client::should_rate_limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitsAnswer {
    /// Some descriptor is over its limit: nothing of the request was
    /// counted.
    pub over_limit: bool,
    /// One per descriptor, in request order (empty when unanswered).
    pub statuses: Vec<LimitStatus>,
    /// Granted by the client itself: Charon did not answer (fail-open).
    pub unanswered: bool,
    /// Over its limits, granted by the kill switch.
    pub overridden: bool,
}

impl LimitsAnswer {
    pub fn is_granted(&self) -> bool {
        !self.over_limit
    }

    /// How long until the request could pass: the longest reset among the
    /// descriptors that are over (`None` when none is, or none says).
    pub fn retry_after(&self) -> Option<Duration> {
        self.statuses
            .iter()
            .filter(|status| status.over_limit)
            .filter_map(|status| status.reset_after)
            .max()
    }

    /// The granted answer of a client that could not ask.
    pub(super) fn unanswered() -> Self {
        Self {
            unanswered: true,
            ..Self::default()
        }
    }
}

/// What one descriptor's limit says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LimitStatus {
    pub over_limit: bool,
    /// `None`: no limit applies to the descriptor.
    pub limit: Option<StatusLimit>,
    /// 0 when over.
    pub remaining: u64,
    /// OK: until the limit is whole again; over: until this request would
    /// pass. A sidecar sends whole seconds (rounded up), the embedded engine
    /// milliseconds.
    pub reset_after: Option<Duration>,
}

/// The limit that applied to a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusLimit {
    /// The limit's `name`, if it has one.
    pub name: Option<String>,
    pub requests_per_unit: u64,
    /// Its window: a tier's, or the unit times its multiplier (a sidecar
    /// says only the unit).
    pub window: Duration,
}

impl From<&CurrentLimit> for StatusLimit {
    fn from(limit: &CurrentLimit) -> Self {
        Self {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            window: Duration::from_millis(limit.window_ms),
        }
    }
}

impl From<&DescriptorStatus> for LimitStatus {
    fn from(status: &DescriptorStatus) -> Self {
        Self {
            over_limit: status.over_limit,
            limit: status.limit.as_ref().map(StatusLimit::from),
            remaining: status.remaining,
            reset_after: status.reset_after_ms.map(Duration::from_millis),
        }
    }
}

impl From<&RateLimitAnswer> for LimitsAnswer {
    fn from(answer: &RateLimitAnswer) -> Self {
        Self {
            over_limit: answer.over_limit,
            statuses: answer.statuses.iter().map(LimitStatus::from).collect(),
            unanswered: false,
            overridden: false,
        }
    }
}

/// Envoy's wire and back, for a sidecar.
pub(super) mod wire {
    use std::time::Duration;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, rate_limit::Unit,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::{LimitStatus, LimitsAnswer, StatusLimit};
    use crate::client::ClientError;
    use crate::limiter;

    pub fn request(request: limiter::RateLimitRequest) -> Result<RateLimitRequest, ClientError> {
        let hits = |hits: u64| {
            u32::try_from(hits)
                .map_err(|_| ClientError::Invalid(format!("{hits} hits is more than Envoy sends")))
        };
        let descriptors = request
            .descriptors
            .into_iter()
            .map(|descriptor| {
                if descriptor.limit.is_some() {
                    return Err(ClientError::Invalid(
                        "a limit override cannot be sent to a sidecar from Rust".into(),
                    ));
                }
                Ok(RateLimitDescriptor {
                    entries: descriptor
                        .entries
                        .into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect(),
                    hits_addend: descriptor.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: descriptor.refund,
                    ..RateLimitDescriptor::default()
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RateLimitRequest {
            domain: request.domain,
            descriptors,
            hits_addend: hits(request.hits_addend)?,
        })
    }

    pub fn answer(response: RateLimitResponse) -> LimitsAnswer {
        LimitsAnswer {
            over_limit: response.overall_code == Code::OverLimit as i32,
            statuses: response
                .statuses
                .into_iter()
                .map(|status| LimitStatus {
                    over_limit: status.code == Code::OverLimit as i32,
                    limit: status.current_limit.map(|limit| StatusLimit {
                        name: (!limit.name.is_empty()).then_some(limit.name),
                        requests_per_unit: u64::from(limit.requests_per_unit),
                        window: unit_window(limit.unit),
                    }),
                    remaining: u64::from(status.limit_remaining),
                    reset_after: status.duration_until_reset.map(|reset| {
                        Duration::from_secs(u64::try_from(reset.seconds).unwrap_or(0))
                    }),
                })
                .collect(),
            unanswered: false,
            overridden: false,
        }
    }

    /// A unit's window (zero for a unit this client does not know).
    fn unit_window(unit: i32) -> Duration {
        use crate::config::Unit as Window;
        let window = match Unit::try_from(unit) {
            Ok(Unit::Second) => Window::Second,
            Ok(Unit::Minute) => Window::Minute,
            Ok(Unit::Hour) => Window::Hour,
            Ok(Unit::Day) => Window::Day,
            Ok(Unit::Week) => Window::Week,
            Ok(Unit::Month) => Window::Month,
            Ok(Unit::Year) => Window::Year,
            Ok(Unit::Unknown) | Err(_) => return Duration::ZERO,
        };
        Duration::from_millis(window.millis())
    }
}

impl super::Client {
    /// Records descriptors whose answer nobody reads (a cost charged after
    /// the response). No answer in time fails open as any call does.
    pub async fn charge(
        &self,
        request: crate::limiter::RateLimitRequest,
    ) -> Result<(), super::ClientError> {
        let answered = match self
            .within_deadline(self.shared.backend.charge(request))
            .await
        {
            Ok(answered) => answered,
            Err(reason) => Err(super::ClientError::Unavailable(reason)),
        };
        self.charged(answered)
    }

    /// A charge's result, failing open when nobody answered.
    fn charged(&self, answered: Result<(), super::ClientError>) -> Result<(), super::ClientError> {
        match answered {
            Err(super::ClientError::Unavailable(reason)) => self.degraded(&reason),
            other => other,
        }
    }

    /// [`charge`](super::Client::charge) within this call, on an embedded
    /// engine over the memory store; `None` (nothing done) when the
    /// backend cannot answer without waiting.
    pub fn charge_now(
        &self,
        request: &crate::limiter::RateLimitRequest,
    ) -> Option<Result<(), super::ClientError>> {
        Some(self.charged(self.shared.backend.charge_now(request)?))
    }

    /// Envoy-style descriptors in a namespace, decided as one request: when
    /// any descriptor is over its limit, nothing is counted
    /// (docs/design.md#all-or-nothing). Fails open like
    /// [`request`](super::Client::request); the kill switch turns an
    /// over-limit answer into a grant.
    pub async fn should_rate_limit(
        &self,
        request: crate::limiter::RateLimitRequest,
    ) -> Result<LimitsAnswer, super::ClientError> {
        self.limits_answer(self.shared.backend.should_rate_limit(request))
            .await
    }

    /// Whether `request`'s descriptors would pass, each asking for 0 hits
    /// whatever it says, counting nothing; the request stays yours (to
    /// [`charge`](super::Client::charge) it once the cost is known). Fails
    /// open like [`should_rate_limit`](super::Client::should_rate_limit).
    pub async fn check(
        &self,
        request: &crate::limiter::RateLimitRequest,
    ) -> Result<LimitsAnswer, super::ClientError> {
        self.limits_answer(self.shared.backend.check(request)).await
    }

    async fn limits_answer(
        &self,
        answer: super::backend::LimitsFuture<'_>,
    ) -> Result<LimitsAnswer, super::ClientError> {
        let answered = match self.within_deadline(answer).await {
            Ok(answered) => answered,
            Err(reason) => Err(super::ClientError::Unavailable(reason)),
        };
        match answered {
            Ok(mut answer) => {
                if answer.over_limit && self.overridden() {
                    answer.over_limit = false;
                    answer.overridden = true;
                }
                Ok(answer)
            }
            Err(super::ClientError::Unavailable(reason)) => {
                self.degraded(&reason)?;
                Ok(LimitsAnswer::unanswered())
            }
            Err(error) => Err(error),
        }
    }
}
