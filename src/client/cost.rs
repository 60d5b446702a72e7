//! Reservations on budgets of a cost known after the response, from Rust
//! (docs/design.md#reservations): [`Client::reserve_cost`] holds an
//! estimate of the budgets a request's descriptors match; the
//! [`CostReservation`] it returns is committed at the actual cost or
//! cancelled, and a [`Committed`] charge can be refunded while its window
//! lasts.
//!
//! Like every call of the client, a reservation fails open: when the sidecar
//! cannot answer and [`fail_open`](super::ClientOptions::fail_open) is on,
//! it is granted unanswered, and its commit and cancel do nothing.

use std::time::Duration;

use crate::api::v1::{
    CostAnswer, CostCancel, CostCommit, CostDescriptor, CostEntry, CostRefund, CostRequest,
    CostReserve, cost_request::Op,
};
use crate::limiter::Descriptor;

use super::{Client, ClientError};

/// A reservation asked of [`Client::reserve_cost`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveCost {
    pub namespace: String,
    pub descriptors: Vec<Descriptor>,
    /// The estimate held from every budget.
    pub amount: u64,
    /// How long it is held without a commit (`None`: the server's default,
    /// a minute).
    pub ttl: Option<Duration>,
    /// Expired without a commit, release it instead of charging the
    /// estimate.
    pub release_on_expiry: bool,
}

impl ReserveCost {
    pub fn new(namespace: impl Into<String>, descriptors: Vec<Descriptor>, amount: u64) -> Self {
        Self {
            namespace: namespace.into(),
            descriptors,
            amount,
            ttl: None,
            release_on_expiry: false,
        }
    }

    pub fn ttl(self, ttl: Duration) -> Self {
        Self {
            ttl: Some(ttl),
            ..self
        }
    }

    pub fn release_on_expiry(self, on: bool) -> Self {
        Self {
            release_on_expiry: on,
            ..self
        }
    }
}

/// What [`Client::reserve_cost`] answered: held, or refused for now.
#[derive(Clone)]
#[must_use = "a reservation holds budget until it is committed, cancelled or expires"]
pub struct CostReservation {
    client: Client,
    namespace: String,
    descriptors: Vec<CostDescriptor>,
    /// Empty when refused or unanswered.
    id: String,
    pub granted: bool,
    /// The least any budget has left.
    pub remaining: u64,
    /// Refused: until it might fit (`None`: never, more than a limit).
    pub retry_after: Option<Duration>,
    /// Granted by the client itself: the sidecar did not answer.
    pub unanswered: bool,
    pub degraded: bool,
}

impl std::fmt::Debug for CostReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CostReservation")
            .field("id", &self.id)
            .field("granted", &self.granted)
            .field("remaining", &self.remaining)
            .field("retry_after", &self.retry_after)
            .field("unanswered", &self.unanswered)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Committed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Committed")
            .field("charged", &self.charged)
            .field("charged_at_ms", &self.charged_at_ms)
            .finish_non_exhaustive()
    }
}

impl CostReservation {
    /// Reservation `id` of the budgets `descriptors` match, made by any
    /// client on any sidecar sharing the store, to settle through `client`.
    pub fn resume(
        client: &Client,
        namespace: impl Into<String>,
        descriptors: Vec<Descriptor>,
        id: impl Into<String>,
    ) -> Self {
        Self {
            client: client.clone(),
            namespace: namespace.into(),
            descriptors: wire(descriptors),
            id: id.into(),
            granted: true,
            remaining: 0,
            retry_after: None,
            unanswered: false,
            degraded: false,
        }
    }

    /// Its id, as the server names it (empty when none is held).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Settles it at `actual`: more than reserved is charged, less is given
    /// back. A reservation not held any more (expired, settled) is
    /// [`ClientError::Refused`] with `UnknownReservation`.
    pub async fn commit(self, actual: u64) -> Result<Committed, ClientError> {
        let answer = self
            .settle(Op::Commit(CostCommit {
                reservation_id: self.id.clone(),
                actual,
            }))
            .await?;
        Ok(Committed {
            client: self.client,
            namespace: self.namespace,
            descriptors: self.descriptors,
            charged: actual,
            charged_at_ms: answer.map_or(0, |answer| answer.decided_at_ms),
        })
    }

    /// Gives it back unspent.
    pub async fn cancel(self) -> Result<(), ClientError> {
        self.settle(Op::Cancel(CostCancel {
            reservation_id: self.id.clone(),
        }))
        .await
        .map(drop)
    }

    async fn settle(&self, op: Op) -> Result<Option<CostAnswer>, ClientError> {
        if self.id.is_empty() {
            return Ok(None);
        }
        let request = CostRequest {
            namespace: self.namespace.clone(),
            descriptors: self.descriptors.clone(),
            op: Some(op),
        };
        self.client.cost(request).await
    }
}

/// A committed charge, refundable while its window lasts.
#[derive(Clone)]
pub struct Committed {
    client: Client,
    namespace: String,
    descriptors: Vec<CostDescriptor>,
    pub charged: u64,
    /// When the charge was made, on the store's clock (0: unanswered).
    pub charged_at_ms: u64,
}

impl Committed {
    /// Gives back `amount` of the charge (work that failed after it was
    /// charged): never below zero, and refused with `WindowOver` once the
    /// window it was charged in has ended.
    pub async fn refund(&self, amount: u64) -> Result<(), ClientError> {
        if self.charged_at_ms == 0 {
            return Ok(());
        }
        let request = CostRequest {
            namespace: self.namespace.clone(),
            descriptors: self.descriptors.clone(),
            op: Some(Op::Refund(CostRefund {
                amount: amount.min(self.charged),
                charged_at_ms: self.charged_at_ms,
            })),
        };
        self.client.cost(request).await.map(drop)
    }
}

fn wire(descriptors: Vec<Descriptor>) -> Vec<CostDescriptor> {
    descriptors
        .into_iter()
        .map(|descriptor| CostDescriptor {
            entries: descriptor
                .entries
                .into_iter()
                .map(|(key, value)| CostEntry { key, value })
                .collect(),
        })
        .collect()
}

impl Client {
    /// Holds `reserve.amount` of every `cost: after_response` budget the
    /// descriptors match, all or nothing.
    pub async fn reserve_cost(&self, reserve: ReserveCost) -> Result<CostReservation, ClientError> {
        let ttl_ms = reserve
            .ttl
            .map_or(0, |ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        let descriptors = wire(reserve.descriptors);
        let request = CostRequest {
            namespace: reserve.namespace.clone(),
            descriptors: descriptors.clone(),
            op: Some(Op::Reserve(CostReserve {
                amount: reserve.amount,
                ttl_ms,
                release_on_expiry: reserve.release_on_expiry,
            })),
        };
        let answer = self.cost(request).await?;
        let mut reservation = CostReservation {
            client: self.clone(),
            namespace: reserve.namespace,
            descriptors,
            id: String::new(),
            granted: true,
            remaining: 0,
            retry_after: None,
            unanswered: answer.is_none(),
            degraded: false,
        };
        if let Some(answer) = answer {
            reservation.id = answer.reservation_id;
            reservation.granted = answer.applied;
            reservation.remaining = answer.remaining;
            reservation.retry_after = answer.retry_after_ms.map(Duration::from_millis);
            reservation.degraded = answer.degraded;
        }
        Ok(reservation)
    }

    /// One `Cost` call: its answer, `None` when the sidecar did not answer
    /// and the client fails open.
    async fn cost(&self, request: CostRequest) -> Result<Option<CostAnswer>, ClientError> {
        let answered = match self
            .within_deadline(self.shared.backend.cost(request))
            .await
        {
            Ok(answered) => answered,
            Err(reason) => Err(ClientError::Unavailable(reason)),
        };
        match answered {
            Ok(answer) => Ok(Some(answer)),
            Err(ClientError::Unavailable(reason)) => {
                self.degraded(&reason)?;
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }
}
