//! The one renewer of capacity leases over a [`Client`]
//! (docs/design.md#capacity-leases): a round asks for every lease a client
//! id holds in one `GetCapacity` and reads each answer back. A leaf's
//! [`LeaseRenewer`](super::lease::LeaseRenewer) renews its one resource
//! with it; a server's link to its parent (`server::parent`) renews every
//! resource its level leases from the parent, as the level's one client
//! (docs/design.md#a-hierarchy-of-servers). Beside the rounds,
//! [`Client::watch_capacity`] carries the nudges that ask for a round now.

use crate::api::v1::capacity_answer::Result as Answered;
use crate::api::v1::{CapacityLease, CapacityWant, GetCapacityRequest};

use super::{Client, ClientError};

/// One lease a round asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseWant {
    pub namespace: String,
    pub resource: String,
    pub domain: String,
    /// What the client wants now.
    pub wants: f64,
    /// What it was granted last (0 if nothing live).
    pub has: f64,
    /// From a server leasing for clients of its own: what they hold of it
    /// in all, more than `has` while they have not given back what a
    /// shrunk grant took away.
    pub held_below: Option<f64>,
}

/// What a round brought back for one [`LeaseWant`].
#[derive(Debug, Clone, PartialEq)]
pub enum Renewed {
    /// The lease: its capacity, expiry, refresh interval and safe capacity.
    Lease(CapacityLease),
    /// The server refused this resource (unknown, wrong kind…), with why.
    Refused(String),
    /// The answer named nothing for it.
    Unanswered,
}

/// Renews `wants` as `client_id`, in one call: each want's answer, in
/// order, or why the call had none (the server unreachable).
pub async fn renew(
    client: &Client,
    client_id: &str,
    wants: &[LeaseWant],
) -> Result<Vec<Renewed>, ClientError> {
    let resources = wants
        .iter()
        .map(|want| CapacityWant {
            namespace: want.namespace.clone(),
            resource: want.resource.clone(),
            domain: want.domain.clone(),
            wants: want.wants,
            has: want.has,
            held_below: want.held_below,
        })
        .collect();
    let answer = client
        .get_capacity(GetCapacityRequest {
            client_id: client_id.to_owned(),
            resources,
        })
        .await?;
    let mut answers = answer.answers.into_iter();
    Ok(wants
        .iter()
        .map(|_| match answers.next().and_then(|answer| answer.result) {
            Some(Answered::Lease(lease)) => Renewed::Lease(lease),
            Some(Answered::Error(error)) => Renewed::Refused(error.message),
            None => Renewed::Unanswered,
        })
        .collect())
}
