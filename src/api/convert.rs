//! The Charon API's messages to the service's domain types and back. Each
//! wire message is parsed once, here, into an operation the service checks
//! no further for shape ([`crate::service::ops`]); each answer and error goes
//! back the same way, with the gRPC code of each error kind (the table in
//! the proto) in one place.

use crate::criticality::Criticality;
use crate::engine::capacity::Lease;
use crate::limiter::Descriptor;
use crate::service::cost::{CostCall, CostOperation, CostReply};
use crate::service::error::{Error, Kind};
use crate::service::ops::{
    Answer, CapacityWant, CopyContext, GetCapacity, Leases, Operation, RateAnswer, RateContext,
    RateRequest, Release, ReleaseAnswer, ReleaseCapacity, Reserve, ReserveAnswer, ResourceKey,
    Seize, SeizeAnswer, Transfer, TransferAnswer,
};

use super::v1;
use super::v1::capacity_answer::Result as Answered;
use super::v1::session_request::Op;
use super::v1::session_response::Result as Wired;

impl TryFrom<v1::RequestOp> for RateRequest {
    type Error = Error;

    fn try_from(op: v1::RequestOp) -> Result<Self, Error> {
        let at = ResourceKey::new(op.namespace, op.resource, op.domain);
        RateRequest::new(at, op.copies, op.min_copies)
    }
}

impl TryFrom<v1::ReserveOp> for Reserve {
    type Error = Error;

    fn try_from(op: v1::ReserveOp) -> Result<Self, Error> {
        let at = ResourceKey::new(op.namespace, op.resource, op.domain);
        let criticality = op
            .criticality
            .as_deref()
            .and_then(Criticality::parse)
            .unwrap_or_default();
        Ok(Reserve::new(at, op.copies, op.min_copies)?
            .waiting(op.max_wait_ms, criticality)?
            .for_anyone(op.for_anyone.unwrap_or(false)))
    }
}

impl TryFrom<v1::ReleaseOp> for Release {
    type Error = Error;

    fn try_from(op: v1::ReleaseOp) -> Result<Self, Error> {
        let at = ResourceKey::new(op.namespace, op.resource, op.domain);
        Ok(Release::new(at, op.groups, op.copies)?.done(op.done.unwrap_or(false)))
    }
}

impl TryFrom<v1::TransferOp> for Transfer {
    type Error = Error;

    fn try_from(op: v1::TransferOp) -> Result<Self, Error> {
        let at = ResourceKey::new(op.namespace, op.resource, op.domain);
        Transfer::new(at, op.groups, op.copies, op.ttl_ms)
    }
}

impl From<v1::SeizeOp> for Seize {
    fn from(op: v1::SeizeOp) -> Self {
        Seize {
            transfer_id: op.transfer_id,
        }
    }
}

/// A session message's operation, or its name (`none` when the message
/// names none) and why it is refused.
pub fn operation_from_wire(op: Option<Op>) -> Result<Operation, (&'static str, Error)> {
    match op {
        None => Err(("none", Error::malformed("the message names no operation"))),
        Some(Op::Request(op)) => RateRequest::try_from(op)
            .map(Operation::Request)
            .map_err(|error| ("request", error)),
        Some(Op::Reserve(op)) => Reserve::try_from(op)
            .map(Operation::Reserve)
            .map_err(|error| ("reserve", error)),
        Some(Op::Release(op)) => Release::try_from(op)
            .map(Operation::Release)
            .map_err(|error| ("release", error)),
        Some(Op::Transfer(op)) => Transfer::try_from(op)
            .map(Operation::Transfer)
            .map_err(|error| ("transfer", error)),
        Some(Op::Seize(op)) => Ok(Operation::Seize(op.into())),
    }
}

impl From<RateContext> for v1::RateContext {
    fn from(context: RateContext) -> Self {
        v1::RateContext {
            hard_limit: context.hard_limit,
            global_limit: context.global_limit,
            tier_limit: context.tier_limit,
            tier_index: context.tier_index,
            tier_hits: context.tier_hits,
            domain_hits_last_second: context.domain_hits_last_second,
            global_hits_last_second: context.global_hits_last_second,
            burst: context.burst,
            limited_by_hard: context.limited_by_hard,
            limited_by_global: context.limited_by_global,
            remaining: context.remaining,
            tier_window_ms: context.tier_window_ms,
            reset_after_ms: context.reset_after_ms,
        }
    }
}

impl From<RateAnswer> for v1::RequestAnswer {
    fn from(answer: RateAnswer) -> Self {
        v1::RequestAnswer {
            granted: answer.granted,
            retry_after_ms: answer.retry_after_ms,
            degraded: answer.degraded,
            soft_limit_exceeded: answer.soft_limit_exceeded,
            context: Some(answer.context.into()),
        }
    }
}

impl From<CopyContext> for v1::CopyContext {
    fn from(context: CopyContext) -> Self {
        let limits = context.limits.as_ref();
        v1::CopyContext {
            domain_limit: limits.and_then(|l| l.domain_limit),
            global_limit: limits.and_then(|l| l.global_limit),
            domain_holds: context.counts.domain,
            global_holds: context.counts.global,
            groups: limits
                .map(|limits| {
                    limits
                        .groups
                        .iter()
                        .zip(&context.counts.groups)
                        .map(|((name, limit), holds)| v1::GroupContext {
                            name: name.clone(),
                            limit: *limit,
                            holds: *holds,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl From<ReserveAnswer> for v1::ReserveAnswer {
    fn from(answer: ReserveAnswer) -> Self {
        v1::ReserveAnswer {
            granted: answer.granted,
            groups: answer.groups,
            retry_after_ms: answer.retry_after_ms,
            degraded: false,
            context: Some(answer.context.into()),
            done: answer.done,
        }
    }
}

impl From<ReleaseAnswer> for v1::ReleaseAnswer {
    fn from(answer: ReleaseAnswer) -> Self {
        v1::ReleaseAnswer {
            released: answer.released,
            context: Some(answer.context.into()),
        }
    }
}

impl From<TransferAnswer> for v1::TransferAnswer {
    fn from(answer: TransferAnswer) -> Self {
        v1::TransferAnswer {
            transfer_id: answer.transfer_id,
            copies: answer.copies,
        }
    }
}

impl From<SeizeAnswer> for v1::SeizeAnswer {
    fn from(answer: SeizeAnswer) -> Self {
        v1::SeizeAnswer {
            namespace: answer.at.namespace,
            resource: answer.at.resource,
            domain: answer.at.domain,
            groups: answer.groups,
            copies: answer.copies,
            context: answer.context.map(Into::into),
        }
    }
}

/// An operation's answer, or its error, as a session message carries it.
pub fn answer_to_wire(result: Result<Answer, Error>) -> Wired {
    match result {
        Ok(Answer::Request(answer)) => Wired::Request(answer.into()),
        Ok(Answer::Reserve(answer)) => Wired::Reserve(answer.into()),
        Ok(Answer::Release(answer)) => Wired::Release(answer.into()),
        Ok(Answer::Transfer(answer)) => Wired::Transfer(answer.into()),
        Ok(Answer::Seize(answer)) => Wired::Seize(answer.into()),
        Err(error) => Wired::Error(error.into()),
    }
}

impl From<Kind> for v1::error::Kind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Malformed => v1::error::Kind::Malformed,
            Kind::UnknownResource => v1::error::Kind::UnknownResource,
            Kind::WrongKind => v1::error::Kind::WrongKind,
            Kind::NotHeld => v1::error::Kind::NotHeld,
            Kind::UnknownTransfer => v1::error::Kind::UnknownTransfer,
            Kind::TooMany => v1::error::Kind::TooMany,
            Kind::UnknownReservation => v1::error::Kind::UnknownReservation,
            Kind::WindowOver => v1::error::Kind::WindowOver,
            Kind::StoreUnavailable => v1::error::Kind::StoreUnavailable,
            Kind::Resigned => v1::error::Kind::Resigned,
            Kind::Internal => v1::error::Kind::Internal,
            Kind::Cancelled => v1::error::Kind::Cancelled,
        }
    }
}

/// The gRPC code of an error kind (the table in the proto).
pub fn error_code(kind: Kind) -> tonic::Code {
    match kind {
        Kind::Malformed => tonic::Code::InvalidArgument,
        Kind::UnknownResource | Kind::UnknownTransfer | Kind::UnknownReservation => {
            tonic::Code::NotFound
        }
        Kind::WrongKind | Kind::NotHeld | Kind::WindowOver => tonic::Code::FailedPrecondition,
        Kind::TooMany => tonic::Code::ResourceExhausted,
        Kind::StoreUnavailable | Kind::Resigned => tonic::Code::Unavailable,
        Kind::Internal => tonic::Code::Internal,
        Kind::Cancelled => tonic::Code::Cancelled,
    }
}

impl From<Error> for v1::Error {
    fn from(error: Error) -> Self {
        v1::Error {
            kind: v1::error::Kind::from(error.kind) as i32,
            code: error_code(error.kind) as i32,
            server_error: error.is_server_error(),
            message: error.message,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        let mut status = tonic::Status::new(error_code(error.kind), error.message);
        status.metadata_mut().insert(
            super::ERROR_KIND_HEADER,
            tonic::metadata::MetadataValue::from_static(error.kind.as_str()),
        );
        status
    }
}

impl TryFrom<v1::GetCapacityRequest> for GetCapacity {
    type Error = Error;

    fn try_from(request: v1::GetCapacityRequest) -> Result<Self, Error> {
        let wants = request
            .resources
            .into_iter()
            .map(|want| CapacityWant {
                at: ResourceKey::new(want.namespace, want.resource, want.domain),
                wants: want.wants,
                has: want.has,
                held_below: want.held_below,
            })
            .collect();
        GetCapacity::new(request.client_id, wants)
    }
}

impl TryFrom<v1::ReleaseCapacityRequest> for ReleaseCapacity {
    type Error = Error;

    fn try_from(request: v1::ReleaseCapacityRequest) -> Result<Self, Error> {
        let resources = request
            .resources
            .into_iter()
            .map(|at| ResourceKey::new(at.namespace, at.resource, at.domain))
            .collect();
        ReleaseCapacity::new(request.client_id, resources)
    }
}

impl TryFrom<v1::CostRequest> for CostOperation {
    type Error = Error;

    fn try_from(request: v1::CostRequest) -> Result<Self, Error> {
        use v1::cost_request::Op;
        let call = match request.op {
            Some(Op::Reserve(reserve)) => CostCall::Reserve {
                amount: reserve.amount,
                ttl_ms: reserve.ttl_ms,
                charge_on_expiry: !reserve.release_on_expiry,
            },
            Some(Op::Commit(commit)) => CostCall::Commit {
                reservation: commit.reservation_id,
                actual: commit.actual,
            },
            Some(Op::Cancel(cancel)) => CostCall::Cancel {
                reservation: cancel.reservation_id,
            },
            Some(Op::Refund(refund)) => CostCall::Refund {
                amount: refund.amount,
                charged_at_ms: refund.charged_at_ms,
            },
            None => {
                return Err(Error::malformed(
                    "no operation: reserve, commit, cancel or refund",
                ));
            }
        };
        let descriptors = request
            .descriptors
            .into_iter()
            .map(|descriptor| {
                Descriptor::new(
                    descriptor
                        .entries
                        .into_iter()
                        .map(|entry| (entry.key, entry.value)),
                )
            })
            .collect();
        Ok(CostOperation {
            namespace: request.namespace,
            descriptors,
            call,
        })
    }
}

impl From<CostReply> for v1::CostAnswer {
    fn from(reply: CostReply) -> Self {
        v1::CostAnswer {
            applied: reply.applied,
            reservation_id: reply.reservation,
            expires_at_ms: reply.expires_at_ms,
            decided_at_ms: reply.decided_at_ms,
            remaining: reply.remaining,
            retry_after_ms: reply.retry_after_ms,
            degraded: reply.degraded,
        }
    }
}

impl From<Lease> for v1::CapacityLease {
    fn from(lease: Lease) -> Self {
        v1::CapacityLease {
            capacity: lease.capacity,
            expiry_ms: lease.expiry_ms,
            refresh_interval_ms: lease.refresh_interval_ms,
            safe_capacity: lease.safe_capacity,
        }
    }
}

/// Each resource's lease, or its error, as `GetCapacity` answers.
pub fn capacity_response(leases: Leases) -> v1::GetCapacityResponse {
    v1::GetCapacityResponse {
        answers: leases
            .into_iter()
            .map(|lease| v1::CapacityAnswer {
                result: Some(match lease {
                    Ok(lease) => Answered::Lease(lease.into()),
                    Err(error) => Answered::Error(error.into()),
                }),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_code_and_wire_kind() {
        let wire = |kind| v1::Error::from(Error::new(kind, "x"));
        let malformed = wire(Kind::Malformed);
        assert_eq!(malformed.kind, v1::error::Kind::Malformed as i32);
        assert_eq!(malformed.code, tonic::Code::InvalidArgument as i32);
        assert!(!malformed.server_error);
        let unavailable = wire(Kind::StoreUnavailable);
        assert_eq!(unavailable.code, tonic::Code::Unavailable as i32);
        assert!(unavailable.server_error);
        for kind in [
            Kind::Malformed,
            Kind::UnknownResource,
            Kind::WrongKind,
            Kind::NotHeld,
            Kind::UnknownTransfer,
            Kind::TooMany,
            Kind::StoreUnavailable,
            Kind::Resigned,
            Kind::Internal,
            Kind::Cancelled,
        ] {
            // The metrics' label is the API's name of the kind.
            assert_eq!(kind.as_str(), v1::error::Kind::from(kind).as_str_name());
        }
    }

    #[test]
    fn a_bad_count_is_refused_when_parsed() {
        let op = Op::Reserve(v1::ReserveOp {
            namespace: "ns".into(),
            resource: "r".into(),
            domain: "d".into(),
            copies: Some(0),
            min_copies: None,
            ..v1::ReserveOp::default()
        });
        let (name, error) = operation_from_wire(Some(op)).unwrap_err();
        assert_eq!(name, "reserve");
        assert_eq!(error.kind, Kind::Malformed);
        assert_eq!(
            tonic::Status::from(error).code(),
            tonic::Code::InvalidArgument
        );
    }
}
