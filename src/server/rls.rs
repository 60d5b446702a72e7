//! Envoy's `envoy.service.ratelimit.v3.RateLimitService`: translates the wire
//! request into a [`Limiter`] call and the answer back (SPEC §5). No decision
//! logic lives here.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as WireUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as WireDuration;
use tonic::{Request, Response, Status};

use crate::config::Unit;
use crate::limiter::{self, LimitError, LimitOverride, Limiter};
use crate::store::Store;

use super::metrics::{Decision, Metrics};

/// The gRPC service.
pub struct RlsService<S> {
    limiter: Arc<Limiter<S>>,
    metrics: Arc<Metrics>,
}

impl<S> RlsService<S> {
    pub fn new(limiter: Arc<Limiter<S>>, metrics: Arc<Metrics>) -> Self {
        Self { limiter, metrics }
    }
}

#[tonic::async_trait]
impl<S: Store> RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let started = Instant::now();
        let request = request.into_inner();
        let namespace = request.domain.clone();
        // Metrics label: the namespace when configured (bounded), else
        // `unknown`. A decision knows; errors (rare) look it up.
        let error_label = || {
            if self.limiter.config().namespace(&namespace).is_some() {
                namespace.as_str()
            } else {
                "unknown"
            }
        };
        let request = match from_wire(request) {
            Ok(request) => request,
            Err(message) => {
                self.metrics
                    .decision(error_label(), Decision::InvalidArgument, started.elapsed());
                return Err(Status::invalid_argument(message));
            }
        };
        match self.limiter.should_rate_limit(request).await {
            Ok(answer) => {
                let label = if answer.namespace_known {
                    namespace.as_str()
                } else {
                    "unknown"
                };
                let result = if answer.over_limit {
                    Decision::OverLimit
                } else {
                    Decision::Ok
                };
                if !answer.over_limit && answer.statuses.iter().any(|s| s.soft_limit_exceeded) {
                    self.metrics.soft_limit_warning(label);
                }
                self.metrics.decision(label, result, started.elapsed());
                Ok(Response::new(to_wire(answer)))
            }
            Err(LimitError::InvalidArgument(message)) => {
                self.metrics
                    .decision(error_label(), Decision::InvalidArgument, started.elapsed());
                Err(Status::invalid_argument(message))
            }
            Err(LimitError::Store(error)) => {
                self.metrics
                    .decision(error_label(), Decision::StoreError, started.elapsed());
                tracing::warn!(%error, "store error");
                Err(Status::unavailable(error.to_string()))
            }
        }
    }
}

fn from_wire(request: RateLimitRequest) -> Result<limiter::RateLimitRequest, String> {
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(index, descriptor)| {
            let limit = match descriptor.limit {
                None => None,
                Some(limit) => Some(LimitOverride {
                    requests_per_unit: u64::from(limit.requests_per_unit),
                    unit: unit_from_wire(limit.unit).ok_or_else(|| {
                        format!(
                            "descriptor {index}: limit override has an unknown unit ({})",
                            limit.unit
                        )
                    })?,
                }),
            };
            // Charon never gives hits back (a grant cannot be un-requested):
            // a descriptor with negative hits is only checked.
            let hits_addend = if descriptor.is_negative_hits {
                Some(0)
            } else {
                descriptor.hits_addend.map(|h| h.value)
            };
            Ok(limiter::Descriptor {
                entries: descriptor
                    .entries
                    .into_iter()
                    .map(|entry| (entry.key, entry.value))
                    .collect(),
                hits_addend,
                limit,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(limiter::RateLimitRequest {
        domain: request.domain,
        descriptors,
        hits_addend: u64::from(request.hits_addend),
    })
}

fn unit_from_wire(unit: i32) -> Option<Unit> {
    Some(match WireUnit::try_from(unit).ok()? {
        WireUnit::Second => Unit::Second,
        WireUnit::Minute => Unit::Minute,
        WireUnit::Hour => Unit::Hour,
        WireUnit::Day => Unit::Day,
        WireUnit::Week => Unit::Week,
        WireUnit::Month => Unit::Month,
        WireUnit::Year => Unit::Year,
        WireUnit::Unknown => return None,
    })
}

fn unit_to_wire(unit: Unit) -> WireUnit {
    match unit {
        Unit::Second => WireUnit::Second,
        Unit::Minute => WireUnit::Minute,
        Unit::Hour => WireUnit::Hour,
        Unit::Day => WireUnit::Day,
        Unit::Week => WireUnit::Week,
        Unit::Month => WireUnit::Month,
        Unit::Year => WireUnit::Year,
    }
}

fn duration(ms: u64) -> WireDuration {
    WireDuration {
        seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
        // < 1e9, fits.
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

/// The response header of a granted answer with descriptors past their soft
/// limit (seed 004): their indexes in the request, `0,2`.
pub const SOFT_LIMIT_HEADER: &str = "x-charon-soft-limit";

fn to_wire(answer: limiter::RateLimitAnswer) -> RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    let soft: Vec<String> = answer
        .statuses
        .iter()
        .enumerate()
        .filter(|(_, status)| status.soft_limit_exceeded)
        .map(|(index, _)| index.to_string())
        .collect();
    let response_headers_to_add = if answer.over_limit || soft.is_empty() {
        Vec::new()
    } else {
        vec![HeaderValue {
            key: SOFT_LIMIT_HEADER.to_owned(),
            value: soft.join(","),
            ..Default::default()
        }]
    };
    RateLimitResponse {
        response_headers_to_add,
        overall_code: code(answer.over_limit),
        statuses: answer
            .statuses
            .into_iter()
            .map(|status| DescriptorStatus {
                code: code(status.over_limit),
                current_limit: status.limit.map(|limit| RateLimit {
                    name: limit.name.unwrap_or_default(),
                    requests_per_unit: u32::try_from(limit.requests_per_unit).unwrap_or(u32::MAX),
                    unit: unit_to_wire(limit.unit) as i32,
                }),
                limit_remaining: u32::try_from(status.remaining).unwrap_or(u32::MAX),
                duration_until_reset: status.reset_after_ms.map(duration),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(soft: bool) -> limiter::DescriptorStatus {
        limiter::DescriptorStatus {
            over_limit: false,
            limit: None,
            remaining: 1,
            reset_after_ms: None,
            tiers: None,
            soft_limit_exceeded: soft,
        }
    }

    #[test]
    fn granted_answers_past_a_soft_limit_carry_the_header() {
        let answer = limiter::RateLimitAnswer {
            over_limit: false,
            statuses: vec![status(true), status(false), status(true)],
            namespace_known: true,
        };
        let wire = to_wire(answer);
        assert_eq!(wire.response_headers_to_add.len(), 1);
        assert_eq!(wire.response_headers_to_add[0].key, SOFT_LIMIT_HEADER);
        assert_eq!(wire.response_headers_to_add[0].value, "0,2");
        let quiet = limiter::RateLimitAnswer {
            over_limit: false,
            statuses: vec![status(false)],
            namespace_known: true,
        };
        assert!(to_wire(quiet).response_headers_to_add.is_empty());
    }
}
