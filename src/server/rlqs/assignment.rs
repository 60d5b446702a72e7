//! What an Envoy is told of a bucket: a share as Envoy's assignment (a
//! token bucket, a blanket rule), and the pacing of the new buckets' tokens
//! (docs/design.md#rlqs): Envoy starts every new bucket full, so what new
//! buckets hold adds to a second beyond the limit.

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;

use crate::service::Service;
use crate::service::leases::quota::{Bucket, BucketAssignment};

/// What an Envoy is told of `bucket` now, `wanted` if the bucket's new
/// tokens of this second allow it: Envoy starts every new bucket full, and
/// those tokens add to a second beyond the limit (docs/design.md#rlqs). An
/// Envoy's first bucket holds one token. A bucket that grows (its rate, or
/// its tokens) waits for a second with room, keeping what it was told; a
/// first one, one whose rate shrinks, or one that was told to deny
/// everything, goes now, with as many tokens as are left (at least one).
/// Denying everything is no bucket to keep: waiting would refuse all of the
/// Envoy's share for a second or more, while another's changes spend the
/// seconds' room.
pub(super) fn paced(
    service: &Service,
    namespace: &str,
    bucket: &Bucket,
    told: Option<BucketAssignment>,
    wanted: BucketAssignment,
) -> BucketAssignment {
    let BucketAssignment::Assigned {
        max_tokens,
        tokens_per_fill,
        fill_interval,
        ttl,
    } = wanted
    else {
        return wanted;
    };
    if told == Some(wanted) || tokens_per_fill == 0 {
        return wanted;
    }
    let told = told.filter(|told| told.per_second().is_none_or(|rate| rate > 0.0));
    let max_tokens = if told.is_none() { 1 } else { max_tokens };
    let with_tokens = |max_tokens| BucketAssignment::Assigned {
        max_tokens,
        tokens_per_fill,
        fill_interval,
        ttl,
    };
    // A first bucket, or a shrinking rate, cannot wait.
    let urgent = match told.and_then(BucketAssignment::per_second) {
        Some(before) => wanted.per_second().is_some_and(|now| now < before),
        None => true,
    };
    let taken = service.new_bucket_tokens(namespace, bucket, max_tokens, urgent);
    match told {
        _ if taken == max_tokens => with_tokens(max_tokens),
        _ if urgent => with_tokens(taken.max(1)),
        Some(told) => told,
        None => with_tokens(1),
    }
}

/// What the decision log says of an assignment: its kind, and its rate in
/// whole requests a second.
pub(super) fn described(quota: BucketAssignment) -> (&'static str, u64) {
    match quota {
        BucketAssignment::Assigned {
            tokens_per_fill: 0, ..
        } => ("deny_all", 0),
        BucketAssignment::Assigned { .. } => (
            "assigned",
            quota.per_second().map_or(0, |rate| rate.round() as u64),
        ),
        BucketAssignment::Unlimited { .. } => ("allow_all", 0),
        BucketAssignment::NotLimited => ("not_limited", 0),
    }
}

fn duration(duration: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
    }
}

pub(super) fn assignment(quota: BucketAssignment) -> QuotaAssignmentAction {
    let (strategy, ttl) = match quota {
        BucketAssignment::Assigned {
            tokens_per_fill: 0,
            ttl,
            ..
        } => (Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl),
        BucketAssignment::Assigned {
            max_tokens,
            tokens_per_fill,
            fill_interval,
            ttl,
        } => (
            Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(envoy_types::pb::google::protobuf::UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(duration(fill_interval)),
            }),
            ttl,
        ),
        BucketAssignment::Unlimited { ttl } => {
            (Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl)
        }
        // Answered by abandoning the bucket, not with an assignment.
        BucketAssignment::NotLimited => (
            Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            crate::service::leases::quota::LEASE,
        ),
    };
    QuotaAssignmentAction {
        assignment_time_to_live: Some(duration(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::paced;
    use crate::clock::ManualClock;
    use crate::limiter::Modes;
    use crate::service::leases::quota::{Bucket, BucketAssignment};
    use crate::service::{Service, Unobserved};
    use crate::store::open::Stores;

    /// Ten a second for each tenant, on a clock that stands still: one
    /// second's room for new tokens is a fifth of that, 2.
    fn ten_a_second() -> Service {
        let config = crate::config::load_str(
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
            "edge.yaml",
        )
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
        Service::new(
            config,
            Stores::memory(crate::store::DEFAULT_MAX_KEYS),
            Modes::default(),
            Arc::new(Unobserved),
            Arc::new(ManualClock::new(1_000_000)),
        )
    }

    fn share(max_tokens: u32, tokens_per_fill: u32) -> BucketAssignment {
        BucketAssignment::Assigned {
            max_tokens,
            tokens_per_fill,
            fill_interval: Duration::from_secs(10),
            ttl: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_bucket_told_to_deny_everything_gets_its_share_in_a_second_without_room() {
        let service = ten_a_second();
        let acme = Bucket::new([("tenant".to_owned(), "acme".to_owned())]);
        // Another Envoy's new bucket took this second's room.
        assert_eq!(service.new_bucket_tokens("edge", &acme, 2, false), 2);

        // A bucket that had a share waits for a second with room.
        assert_eq!(
            paced(&service, "edge", &acme, Some(share(1, 30)), share(2, 50)),
            share(1, 30)
        );
        // One told to deny everything has nothing to keep: it goes now,
        // with one token, as an Envoy's first bucket does.
        assert_eq!(
            paced(&service, "edge", &acme, Some(share(0, 0)), share(2, 50)),
            share(1, 50)
        );
        assert_eq!(
            paced(&service, "edge", &acme, None, share(2, 50)),
            share(1, 50)
        );
    }
}
