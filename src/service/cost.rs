//! Reservations on budgets of a cost known after the response, on the
//! [`Service`] (docs/design.md#reservations): the checks a call fails by
//! itself, the reservation's id (drawn here, so that one request's
//! reservation has the same id on every budget, whatever sidecar commits
//! it), and the limiter's answer in the service's terms.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::engine::CostOp;
use crate::limiter::{CostRequest, Descriptor, LimitError, MAX_COST};

use super::Service;
use super::error::{Error, Kind};

/// A reservation lives this long unless asked otherwise.
pub const DEFAULT_TTL_MS: u64 = 60_000;
/// And at most this long: a reservation is budget nobody else may use.
pub const MAX_TTL_MS: u64 = 3_600_000;

/// What is asked of the budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CostCall {
    Reserve {
        amount: u64,
        /// 0: [`DEFAULT_TTL_MS`].
        ttl_ms: u64,
        charge_on_expiry: bool,
    },
    Commit {
        reservation: String,
        actual: u64,
    },
    Cancel {
        reservation: String,
    },
    /// Gives back part of a commit's charge, in its window.
    Refund {
        amount: u64,
        charged_at_ms: u64,
    },
}

/// A call on the budgets the descriptors of `namespace` match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostOperation {
    pub namespace: String,
    pub descriptors: Vec<Descriptor>,
    pub call: CostCall,
}

/// What a [`CostOperation`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostReply {
    /// A reservation: held. Commit, cancel, refund: always (else an error).
    pub applied: bool,
    /// A reservation's id (empty otherwise).
    pub reservation: String,
    /// A reservation's expiry, on the store's clock.
    pub expires_at_ms: u64,
    /// When the operation was decided, on the store's clock: a commit's
    /// charge is refunded by naming it.
    pub decided_at_ms: u64,
    /// The least any budget has left.
    pub remaining: u64,
    /// `None`: never (more than a limit).
    pub retry_after_ms: Option<u64>,
    pub degraded: bool,
}

/// A reservation id as the wire carries it.
fn parse_id(text: &str) -> Result<u64, Error> {
    text.parse::<u64>()
        .ok()
        .filter(|id| *id <= MAX_COST)
        .ok_or_else(|| {
            Error::malformed(format!(
                "reservation id {text:?} is not one Charon gave out"
            ))
        })
}

/// A fresh reservation id, below 2^53 (Redis's script keeps it as text,
/// but the id must survive any JSON a caller puts it through): a counter
/// from a random start, scrambled (splitmix64's finalizer, a bijection), so
/// that sidecars sharing a store do not draw the same ids, without a system
/// call per reservation.
fn draw_id() -> Result<u64, Error> {
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = match START.get() {
        Some(start) => *start,
        None => {
            let mut bytes = [0u8; 8];
            getrandom::fill(&mut bytes)
                .map_err(|error| Error::new(Kind::Internal, format!("no randomness: {error}")))?;
            *START.get_or_init(|| u64::from_le_bytes(bytes))
        }
    };
    let mut x = start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed));
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    Ok((x & MAX_COST).max(1))
}

impl Service {
    /// The unary `Cost` call.
    pub async fn cost(&self, operation: CostOperation) -> Result<CostReply, Error> {
        let (op, id) = match operation.call {
            CostCall::Reserve {
                amount,
                ttl_ms,
                charge_on_expiry,
            } => {
                if ttl_ms > MAX_TTL_MS {
                    return Err(Error::malformed(format!(
                        "ttl_ms {ttl_ms} is more than {MAX_TTL_MS}"
                    )));
                }
                let id = draw_id()?;
                let ttl = if ttl_ms == 0 { DEFAULT_TTL_MS } else { ttl_ms };
                let op = CostOp::Reserve {
                    id,
                    amount,
                    ttl,
                    charge_on_expiry,
                };
                (op, id)
            }
            CostCall::Commit {
                reservation,
                actual,
            } => {
                let id = parse_id(&reservation)?;
                (CostOp::Commit { id, actual }, id)
            }
            CostCall::Cancel { reservation } => {
                let id = parse_id(&reservation)?;
                (CostOp::Cancel { id }, id)
            }
            CostCall::Refund {
                amount,
                charged_at_ms,
            } => {
                let op = CostOp::Refund {
                    amount,
                    charged_at: charged_at_ms,
                };
                (op, 0)
            }
        };
        let request = CostRequest {
            domain: operation.namespace,
            descriptors: operation.descriptors,
            op,
        };
        let answer = self
            .limiter
            .cost(request)
            .await
            .map_err(|error| match error {
                LimitError::InvalidArgument(message) => Error::malformed(message),
                LimitError::Store(error) => Error::new(Kind::StoreUnavailable, error.to_string()),
            })?;
        if answer.budgets == 0 {
            return Err(Error::new(
                Kind::UnknownResource,
                "no descriptor matches a `cost: after_response` limit",
            ));
        }
        let limited = || answer.statuses.iter().filter(|s| s.limit.is_some());
        let mut reply = CostReply {
            applied: answer.applied,
            remaining: limited().map(|s| s.remaining).min().unwrap_or(0),
            degraded: answer.degraded,
            decided_at_ms: answer.now,
            retry_after_ms: Some(0),
            ..CostReply::default()
        };
        match op {
            CostOp::Reserve { ttl, .. } if answer.applied => {
                reply.reservation = id.to_string();
                reply.expires_at_ms = answer.now.saturating_add(ttl);
            }
            CostOp::Reserve { amount, .. } => {
                let never = limited().any(|s| {
                    s.limit
                        .as_ref()
                        .is_some_and(|l| l.requests_per_unit < amount)
                });
                reply.retry_after_ms = if never {
                    None
                } else {
                    limited()
                        .filter(|s| s.over_limit)
                        .filter_map(|s| s.reset_after_ms)
                        .max()
                };
            }
            _ if answer.applied => {}
            CostOp::Refund { charged_at, .. } => {
                return Err(Error::new(
                    Kind::WindowOver,
                    format!(
                        "the window of the charge made at {charged_at} ms is over: \
                         nothing to refund"
                    ),
                ));
            }
            _ => {
                return Err(Error::new(
                    Kind::UnknownReservation,
                    format!("reservation {id} is not held: unknown, expired, or settled"),
                ));
            }
        }
        Ok(reply)
    }
}
