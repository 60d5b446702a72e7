//! The wire and back: Envoy's request into the limiter's, the limiter's
//! answer into Envoy's (docs/design.md#resets: resets in whole seconds,
//! rounded up).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as WireUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as WireDuration;

use crate::config::Unit;
use crate::limiter::{self, LimitOverride};

use super::headers::{self, header, whole_seconds};
use super::{HeadersFor, ResponseHeaders};

/// The response header of a granted answer with descriptors past their soft
/// limit (docs/design.md#soft-limits): their indexes in the request, `0,2`.
pub const SOFT_LIMIT_HEADER: &str = "x-charon-soft-limit";

pub(super) fn from_wire(request: RateLimitRequest) -> Result<limiter::RateLimitRequest, String> {
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
            // `is_negative_hits`: the hits are given back
            // (docs/design.md#refunds).
            let hits_addend = descriptor.hits_addend.map(|h| h.value);
            Ok(limiter::Descriptor {
                refund: descriptor.is_negative_hits,
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

fn duration(seconds: u64) -> WireDuration {
    WireDuration {
        seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

pub(super) fn to_wire(
    answer: limiter::RateLimitAnswer,
    quota_headers: &ResponseHeaders,
    headers_for: HeadersFor,
) -> RateLimitResponse {
    let code = |over: bool| if over { Code::OverLimit } else { Code::Ok } as i32;
    let soft: Vec<String> = answer
        .statuses
        .iter()
        .enumerate()
        .filter(|(_, status)| status.soft_limit_exceeded)
        .map(|(index, _)| index.to_string())
        .collect();
    let mut response_headers_to_add = if answer.over_limit || soft.is_empty() {
        Vec::new()
    } else {
        vec![header(SOFT_LIMIT_HEADER, soft.join(","))]
    };
    headers::add(
        &answer,
        quota_headers,
        headers_for,
        &mut response_headers_to_add,
    );
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
                duration_until_reset: status
                    .reset_after_ms
                    .map(|ms| duration(whole_seconds(ms, status.over_limit))),
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
            quota: false,
            metadata: None,
            hits: 1,
            shadowed: false,
            refund: false,
            unreturned: 0,
            before: 0,
            stats_key: None,
        }
    }

    #[test]
    fn granted_answers_past_a_soft_limit_carry_the_header() {
        let answer = limiter::RateLimitAnswer {
            over_limit: false,
            statuses: vec![status(true), status(false), status(true)],
            namespace_known: true,
            shadowed: false,
        };
        let wire = to_wire(answer, &ResponseHeaders::None, HeadersFor::Deciding);
        assert_eq!(wire.response_headers_to_add.len(), 1);
        assert_eq!(wire.response_headers_to_add[0].key, SOFT_LIMIT_HEADER);
        assert_eq!(wire.response_headers_to_add[0].value, "0,2");
        let quiet = limiter::RateLimitAnswer {
            over_limit: false,
            statuses: vec![status(false)],
            namespace_known: true,
            shadowed: false,
        };
        assert!(
            to_wire(quiet, &ResponseHeaders::None, HeadersFor::Deciding)
                .response_headers_to_add
                .is_empty()
        );
    }
}
