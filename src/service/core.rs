//! The Charon API's rate requests on the [`Service`], whatever carries them
//! (the gRPC service or the embedded client), the typed [`ApiError`], and
//! the checks every operation passes first.

use std::sync::Arc;

use tonic::Status;

use crate::api::v1::{
    CopyContext, Error as WireError, GroupContext, RateContext, RequestAnswer, RequestOp,
    error::Kind,
};
use crate::config::{CapacityResource, Config, CopyResource, Namespace, RateResource, Resource};
use crate::engine::TierOutcome;
use crate::engine::copies::{CopyCounts, CopyLimits};
use crate::limiter::caps;
use crate::store::copies::CopyError;

use super::Service;

/// Copies asked for in one operation, at most.
pub const MAX_COPIES: u64 = 1_000_000_000;
/// Groups named in one release or transfer, at most.
pub const MAX_GROUPS: usize = 64;
/// The longest a transfer may stay staged.
pub const MAX_TRANSFER_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// A typed error of the Charon API (see the table in the proto).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: Kind,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(Kind::Malformed, message)
    }

    pub fn code(&self) -> tonic::Code {
        match self.kind {
            Kind::Malformed | Kind::Unspecified => tonic::Code::InvalidArgument,
            Kind::UnknownResource | Kind::UnknownTransfer => tonic::Code::NotFound,
            Kind::WrongKind | Kind::NotHeld => tonic::Code::FailedPrecondition,
            Kind::TooMany => tonic::Code::ResourceExhausted,
            Kind::StoreUnavailable | Kind::Resigned => tonic::Code::Unavailable,
            Kind::Internal => tonic::Code::Internal,
        }
    }

    pub fn is_server_error(&self) -> bool {
        matches!(
            self.kind,
            Kind::StoreUnavailable | Kind::Resigned | Kind::Internal
        )
    }

    pub fn into_wire(self) -> WireError {
        WireError {
            kind: self.kind as i32,
            code: self.code() as i32,
            server_error: self.is_server_error(),
            message: self.message,
        }
    }

    pub fn into_status(self) -> Status {
        Status::new(self.code(), self.message)
    }
}

impl From<CopyError> for ApiError {
    fn from(error: CopyError) -> Self {
        let kind = match &error {
            CopyError::Unavailable(_) => Kind::StoreUnavailable,
            CopyError::Resigned(_) => Kind::Resigned,
            CopyError::UnknownTransfer => Kind::UnknownTransfer,
            CopyError::Internal(_) => Kind::Internal,
        };
        ApiError::new(kind, error.to_string())
    }
}

/// What a (namespace, resource) names in the running configuration.
pub enum Target {
    Rate(Arc<Namespace>, Arc<RateResource>),
    Copies(Arc<Namespace>, Arc<CopyResource>),
    Capacity(Arc<Namespace>, Arc<CapacityResource>),
    /// Not configured, but the namespace has `allow_unconfigured`.
    Unconfigured(Arc<Namespace>),
}

/// `resource` of `namespace` in `config`, or the typed error saying which of
/// the two is not configured.
pub fn target_in(config: &Config, namespace: &str, resource: &str) -> Result<Target, ApiError> {
    let Some(found) = config.namespace(namespace) else {
        return Err(ApiError::new(
            Kind::UnknownResource,
            format!("namespace `{namespace}` is not configured"),
        ));
    };
    match found.resources.get(resource) {
        Some(Resource::Rate(rate)) => Ok(Target::Rate(found.clone(), rate.clone())),
        Some(Resource::Copies(copies)) => Ok(Target::Copies(found.clone(), copies.clone())),
        Some(Resource::Capacity(capacity)) => Ok(Target::Capacity(found.clone(), capacity.clone())),
        None if found.settings.allow_unconfigured => Ok(Target::Unconfigured(found.clone())),
        None => Err(not_configured(namespace, resource)),
    }
}

/// `resource` is not in `namespace`.
pub fn not_configured(namespace: &str, resource: &str) -> ApiError {
    ApiError::new(
        Kind::UnknownResource,
        format!("resource `{resource}` is not configured in namespace `{namespace}`"),
    )
}

impl Service {
    pub fn target(&self, namespace: &str, resource: &str) -> Result<Target, ApiError> {
        target_in(&self.limiter.config(), namespace, resource)
    }

    /// The unary `Request`, and `request` in a session.
    pub async fn request(&self, op: &RequestOp) -> Result<RequestAnswer, ApiError> {
        check_names(&op.namespace, &op.resource, &op.domain)?;
        let (copies, min_copies) = copies_range(op.copies, op.min_copies)?;
        match self.target(&op.namespace, &op.resource)? {
            Target::Rate(namespace, rate) => {
                let (outcome, degraded) = self
                    .limiter
                    .request_hits(&namespace, &rate, &op.domain, copies, min_copies)
                    .await
                    .map_err(|error| ApiError::new(Kind::StoreUnavailable, error.to_string()))?;
                let mut answer = rate_answer(
                    &outcome,
                    degraded,
                    namespace.settings.ignore_configured,
                    copies,
                );
                answer.soft_limit_exceeded = !outcome.over
                    && rate.soft_limit.is_some_and(|soft| {
                        soft.exceeded(outcome.snapshot.tier_hits, outcome.snapshot.tier_limit)
                    });
                self.observer.rate_request(
                    &namespace.name,
                    &rate.name,
                    copies,
                    rate_outcome(&outcome, namespace.settings.ignore_configured),
                );
                Ok(answer)
            }
            Target::Copies(..) => Err(ApiError::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is copy-limited: use reserve and release, not request",
                    op.resource
                ),
            )),
            Target::Capacity(..) => Err(ApiError::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is a leased capacity: use GetCapacity, not request",
                    op.resource
                ),
            )),
            Target::Unconfigured(namespace) => {
                self.observer
                    .unconfigured_request(&namespace.name, &op.resource, copies);
                Ok(RequestAnswer {
                    granted: copies,
                    retry_after_ms: Some(0),
                    degraded: false,
                    context: Some(RateContext::default()),
                    soft_limit_exceeded: false,
                })
            }
        }
    }
}

/// A decided rate request as the metrics see it.
fn rate_outcome(outcome: &TierOutcome, ignore: bool) -> super::RateOutcome {
    let snapshot = &outcome.snapshot;
    let used = snapshot.tier_limit.saturating_sub(snapshot.remaining);
    super::RateOutcome {
        over: outcome.over,
        shadow: outcome.over && ignore,
        near: !outcome.over && used.saturating_mul(5) > snapshot.tier_limit.saturating_mul(4),
        tier: snapshot.tier,
        limited_by: outcome.limited_by(),
    }
}

fn rate_answer(outcome: &TierOutcome, degraded: bool, ignore: bool, copies: u64) -> RequestAnswer {
    let snapshot = &outcome.snapshot;
    let granted = if ignore && outcome.granted == 0 {
        // `ignore_configured`: granted whatever the limits say.
        copies
    } else {
        outcome.granted
    };
    RequestAnswer {
        granted,
        retry_after_ms: outcome.retry_after,
        degraded,
        soft_limit_exceeded: false,
        context: Some(RateContext {
            hard_limit: outcome.hard_limit,
            global_limit: outcome.global_limit,
            tier_limit: snapshot.tier_limit,
            tier_index: u32::try_from(snapshot.tier).unwrap_or(u32::MAX),
            tier_hits: snapshot.tier_hits,
            domain_hits_last_second: snapshot.domain_hits,
            global_hits_last_second: snapshot.resource_hits.unwrap_or(0),
            burst: outcome.burst,
            limited_by_hard: outcome.limited_by_hard,
            limited_by_global: outcome.limited_by_global,
            remaining: snapshot.remaining,
            tier_window_ms: snapshot.tier_window,
            reset_after_ms: snapshot.reset_after,
        }),
    }
}

/// The wire context of a copy answer: `limits` are the domain's now (`None`
/// when the resource is no longer configured), `counts` over their groups.
pub fn copy_context(limits: Option<&CopyLimits>, counts: &CopyCounts) -> CopyContext {
    CopyContext {
        domain_limit: limits.and_then(|l| l.domain_limit),
        global_limit: limits.and_then(|l| l.global_limit),
        domain_holds: counts.domain,
        global_holds: counts.global,
        groups: limits
            .map(|limits| {
                limits
                    .groups
                    .iter()
                    .zip(&counts.groups)
                    .map(|((name, limit), holds)| GroupContext {
                        name: name.clone(),
                        limit: *limit,
                        holds: *holds,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub fn check_names(namespace: &str, resource: &str, domain: &str) -> Result<(), ApiError> {
    for (what, value) in [
        ("namespace", namespace),
        ("resource", resource),
        ("domain", domain),
    ] {
        check_name(what, value)?;
    }
    Ok(())
}

pub fn check_name(what: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::malformed(format!("{what} is empty")));
    }
    if value.len() > caps::MAX_STRING_BYTES {
        return Err(ApiError::malformed(format!(
            "{what} is longer than {} bytes",
            caps::MAX_STRING_BYTES
        )));
    }
    Ok(())
}

/// `copies` (unset: 1) and `min_copies` (unset: `copies`), checked.
pub fn copies_range(copies: Option<i64>, min_copies: Option<i64>) -> Result<(u64, u64), ApiError> {
    let copies = count("copies", copies.unwrap_or(1))?;
    let min_copies = match min_copies {
        Some(min) => count("min_copies", min)?,
        None => copies,
    };
    if min_copies > copies {
        return Err(ApiError::malformed(format!(
            "min_copies ({min_copies}) is more than copies ({copies})"
        )));
    }
    Ok((copies, min_copies))
}

/// A count of copies: between 1 and [`MAX_COPIES`].
pub fn count(what: &str, value: i64) -> Result<u64, ApiError> {
    match u64::try_from(value) {
        Ok(value) if (1..=MAX_COPIES).contains(&value) => Ok(value),
        _ => Err(ApiError::malformed(format!(
            "{what} must be between 1 and {MAX_COPIES}, not {value}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_checked() {
        assert_eq!(copies_range(None, None), Ok((1, 1)));
        assert_eq!(copies_range(Some(5), None), Ok((5, 5)));
        assert_eq!(copies_range(Some(5), Some(2)), Ok((5, 2)));
        for (copies, min) in [
            (Some(-1), None),
            (Some(0), None),
            (Some(5), Some(6)),
            (Some(5), Some(0)),
            (Some(i64::MAX), None),
        ] {
            let error = copies_range(copies, min).unwrap_err();
            assert_eq!(error.kind, Kind::Malformed, "{copies:?} {min:?}");
            assert_eq!(error.code(), tonic::Code::InvalidArgument);
        }
    }
}
