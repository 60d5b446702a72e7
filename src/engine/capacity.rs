//! Capacity leases (docs/design.md#capacity-leases): a resource's capacity
//! (say, requests per second to a backend) apportioned among the clients that
//! want it, as YouTube's Doorman does. A client asks for what it `wants` and
//! gets a [`Lease`] — a share it enforces itself, valid until `expiry_ms`, to
//! be renewed every `refresh_interval_ms`. This module owns the arithmetic:
//! the target allocation of an [`Algorithm`] ([`shares`]) and the step that
//! answers one request against one resource's [`LeaseState`] ([`request`]).
//! Pure: `now_ms` comes in, nothing is read from a clock, nothing is stored.
//!
//! # Invariants
//!
//! - The sum of live leases never exceeds the capacity (up to floating-point
//!   rounding), whatever the algorithm, the order of requests, or what
//!   clients claim.
//! - No client is granted more than it wants.
//! - A lease is live while `now_ms < expiry_ms`; an expired one is dropped
//!   before anything else is decided, and its share goes to the others.
//!
//! # Convergence
//!
//! A grant is `min(wants, share, capacity − Σ others' live leases)`: a share
//! is a target, and a client only gets the part of it that is free now. When
//! shares move (a client joins, leaves or changes what it wants), a client
//! whose share grew may have to wait for those whose share shrank to renew
//! and give back the difference. Every grant is at most its share, so once
//! every live client has renewed, each holds at most its share; on the next
//! renewal each gets all of it. With membership and wants stable, every
//! client holds its share after two refresh intervals. (`Algorithm::None`
//! has no share: first come, first served, and a holder keeps what it has.)
//!
//! # Learning mode
//!
//! A server that starts (or loses its state) does not know the leases it
//! handed out before. For `learning_ms` after [`LeaseState::started_ms`] a
//! client gets what it says it `has` — never more than it wants, never more
//! than is free — so the leases of a restarted server are not broken while
//! it relearns them. After that, the `has` a client reports is ignored: the
//! server's own record is what counts.
//!
//! ```rust
//! use charon::engine::capacity::{self, Algorithm, CapacityConfig, LeaseState};
//! let config = CapacityConfig {
//!     capacity: 100.0,
//!     algorithm: Algorithm::FairShare,
//!     lease_ms: 60_000,
//!     refresh_interval_ms: 15_000,
//!     safe_capacity: None,
//!     learning_ms: 0,
//! };
//! let mut state = LeaseState::new(0);
//! let a = capacity::request(&config, &mut state, "a", 100.0, 0.0, 0)?;
//! assert_eq!(a.capacity, 100.0);
//! // b's fair share is 50, but a holds everything until it renews.
//! let b = capacity::request(&config, &mut state, "b", 100.0, 0.0, 1)?;
//! assert_eq!(b.capacity, 0.0);
//! let a = capacity::request(&config, &mut state, "a", 100.0, 100.0, 15_000)?;
//! let b = capacity::request(&config, &mut state, "b", 100.0, 0.0, 15_001)?;
//! assert_eq!((a.capacity, b.capacity), (50.0, 50.0));
//! # Ok::<(), capacity::CapacityError>(())
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::capacity::amount;
pub use crate::config::capacity::{Algorithm, CapacityConfig, CapacityError};

/// One client's lease, as the server recorded it. Short serde names: the
/// state of a resource is stored whole, one entry per client.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClientLease {
    /// What the client asked for last.
    #[serde(rename = "w")]
    pub wants: f64,
    /// What it was granted last (the server's record, not the client's word).
    #[serde(rename = "h")]
    pub has: f64,
    /// The lease is live while `now_ms < expiry_ms`.
    #[serde(rename = "e")]
    pub expiry_ms: u64,
}

/// The leases of one resource key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LeaseState {
    /// When the server keeping this state started: learning mode runs from
    /// here. A store that loses its state starts a new one at its own start.
    #[serde(rename = "s")]
    pub started_ms: u64,
    /// Ordered by client id, so that sums and shares come out the same
    /// wherever the state is decided.
    #[serde(rename = "c", default)]
    pub clients: BTreeMap<String, ClientLease>,
}

impl LeaseState {
    pub fn new(started_ms: u64) -> Self {
        Self {
            started_ms,
            clients: BTreeMap::new(),
        }
    }
}

/// The answer to a request: what the client may use, and until when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lease {
    /// The granted capacity.
    pub capacity: f64,
    pub expiry_ms: u64,
    pub refresh_interval_ms: u64,
    /// What to use while the server cannot be reached (safe mode).
    pub safe_capacity: f64,
}

/// Answers `client`, which wants `wants` and says it has `has`, at `now_ms`:
/// drops expired leases, records what the client wants, grants it
/// `min(wants, share, free)` (see the module's doc) and records the grant.
/// A bad amount or configuration changes nothing.
pub fn request(
    config: &CapacityConfig,
    state: &mut LeaseState,
    client: &str,
    wants: f64,
    has: f64,
    now_ms: u64,
) -> Result<Lease, CapacityError> {
    config.validate()?;
    let wants = amount("wants", wants)?;
    let has = amount("has", has)?;
    expire(state, now_ms);
    let others: f64 = state
        .clients
        .iter()
        .filter(|(id, _)| id.as_str() != client)
        .map(|(_, lease)| lease.has)
        .sum();
    let free = (config.capacity - others).max(0.0);
    let expiry_ms = now_ms.saturating_add(config.lease_ms);
    match state.clients.get_mut(client) {
        Some(lease) => lease.wants = wants,
        None => {
            let lease = ClientLease {
                wants,
                has: 0.0,
                expiry_ms,
            };
            state.clients.insert(client.to_owned(), lease);
        }
    }
    let learning = now_ms < state.started_ms.saturating_add(config.learning_ms);
    let target = if learning {
        has
    } else {
        share_of(config, state, client)
    };
    let granted = target.min(wants).min(free);
    if let Some(lease) = state.clients.get_mut(client) {
        lease.has = granted;
        lease.expiry_ms = expiry_ms;
    }
    let safe_capacity = config
        .safe_capacity
        .unwrap_or(config.capacity / state.clients.len().max(1) as f64);
    Ok(Lease {
        capacity: granted,
        expiry_ms,
        refresh_interval_ms: config.refresh_interval_ms,
        safe_capacity,
    })
}

/// Gives up `client`'s lease at once; whether it had one.
pub fn release(state: &mut LeaseState, client: &str) -> bool {
    state.clients.remove(client).is_some()
}

/// Drops the leases that expired by `now_ms`; how many.
pub fn expire(state: &mut LeaseState, now_ms: u64) -> usize {
    let before = state.clients.len();
    state.clients.retain(|_, lease| now_ms < lease.expiry_ms);
    before - state.clients.len()
}

/// The capacity held by leases live at `now_ms`.
pub fn live_sum(state: &LeaseState, now_ms: u64) -> f64 {
    state
        .clients
        .values()
        .filter(|lease| now_ms < lease.expiry_ms)
        .map(|lease| lease.has)
        .sum()
}

/// The target allocation of `capacity` among clients wanting `wants`, in
/// the same order. Each share is at most its want and the shares sum to at
/// most `capacity` (up to rounding). For [`Algorithm::None`] the list is
/// taken in arrival order: each gets what it wants of what is left.
pub fn shares(
    algorithm: Algorithm,
    capacity: f64,
    wants: &[f64],
) -> Result<Vec<f64>, CapacityError> {
    amount("capacity", capacity)?;
    if let Algorithm::Static { per_client } = algorithm {
        amount("per_client", per_client)?;
    }
    for &want in wants {
        amount("wants", want)?;
    }
    Ok(apportion(algorithm, capacity, wants))
}

/// `client`'s target among the live clients (already validated).
fn share_of(config: &CapacityConfig, state: &LeaseState, client: &str) -> f64 {
    if config.algorithm == Algorithm::None {
        return config.capacity;
    }
    let wants: Vec<f64> = state.clients.values().map(|lease| lease.wants).collect();
    let shares = apportion(config.algorithm, config.capacity, &wants);
    state
        .clients
        .keys()
        .position(|id| id == client)
        .and_then(|index| shares.get(index).copied())
        .unwrap_or(0.0)
}

fn apportion(algorithm: Algorithm, capacity: f64, wants: &[f64]) -> Vec<f64> {
    match algorithm {
        Algorithm::None => first_come(capacity, wants),
        Algorithm::Static { per_client } => {
            let capped: Vec<f64> = wants.iter().map(|want| want.min(per_client)).collect();
            water_fill(capacity, &capped)
        }
        Algorithm::ProportionalShare => proportional(capacity, wants),
        Algorithm::FairShare => water_fill(capacity, wants),
    }
}

fn first_come(capacity: f64, wants: &[f64]) -> Vec<f64> {
    let mut left = capacity;
    wants
        .iter()
        .map(|want| {
            let give = want.min(left);
            left = (left - give).max(0.0);
            give
        })
        .collect()
}

/// Max-min fairness: the smallest wants first, each getting at most an
/// equal part of what is left; what it does not take stays for the rest.
fn water_fill(capacity: f64, wants: &[f64]) -> Vec<f64> {
    let mut order: Vec<(usize, f64)> = wants.iter().copied().enumerate().collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut shares = vec![0.0; wants.len()];
    let mut left = capacity;
    let count = order.len();
    for (done, (index, want)) in order.into_iter().enumerate() {
        let give = want.min(left / (count - done) as f64);
        if let Some(share) = shares.get_mut(index) {
            *share = give;
        }
        left = (left - give).max(0.0);
    }
    shares
}

fn proportional(capacity: f64, wants: &[f64]) -> Vec<f64> {
    let total: f64 = wants.iter().sum();
    if total <= capacity {
        return wants.to_vec();
    }
    // Over-subscribed, so the largest want is positive. Dividing by it first
    // keeps the sum finite however large the wants.
    let largest = wants.iter().copied().fold(0.0, f64::max);
    let scaled: f64 = wants.iter().map(|want| want / largest).sum();
    wants
        .iter()
        .map(|want| (capacity * (want / largest) / scaled).min(*want))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(capacity: f64, algorithm: Algorithm) -> CapacityConfig {
        CapacityConfig {
            capacity,
            algorithm,
            lease_ms: 10_000,
            refresh_interval_ms: 2_500,
            safe_capacity: None,
            learning_ms: 0,
        }
    }

    fn grant(
        config: &CapacityConfig,
        state: &mut LeaseState,
        client: &str,
        wants: f64,
        now: u64,
    ) -> f64 {
        request(config, state, client, wants, 0.0, now).map_or(-1.0, |lease| lease.capacity)
    }

    #[test]
    fn fair_share_fills_water_levels() {
        let fair = |capacity, wants: &[f64]| shares(Algorithm::FairShare, capacity, wants);
        assert_eq!(fair(100.0, &[10.0, 50.0, 80.0]), Ok(vec![10.0, 45.0, 45.0]));
        assert_eq!(fair(100.0, &[80.0, 10.0, 50.0]), Ok(vec![45.0, 10.0, 45.0]));
        assert_eq!(fair(100.0, &[10.0, 20.0, 30.0]), Ok(vec![10.0, 20.0, 30.0]));
        assert_eq!(fair(90.0, &[0.0, 100.0, 100.0]), Ok(vec![0.0, 45.0, 45.0]));
        assert_eq!(fair(100.0, &[]), Ok(vec![]));
    }

    #[test]
    fn proportional_share_scales_only_when_over_subscribed() {
        let prop = |capacity, wants: &[f64]| shares(Algorithm::ProportionalShare, capacity, wants);
        assert_eq!(
            prop(100.0, &[50.0, 50.0, 100.0]),
            Ok(vec![25.0, 25.0, 50.0])
        );
        assert_eq!(prop(100.0, &[10.0, 50.0, 40.0]), Ok(vec![10.0, 50.0, 40.0]));
        assert_eq!(prop(0.0, &[10.0, 30.0]), Ok(vec![0.0, 0.0]));
        assert_eq!(prop(10.0, &[f64::MAX, f64::MAX]), Ok(vec![5.0, 5.0]));
    }

    #[test]
    fn static_caps_each_client_then_shares_fairly() {
        let fixed = Algorithm::Static { per_client: 30.0 };
        assert_eq!(shares(fixed, 100.0, &[10.0, 50.0]), Ok(vec![10.0, 30.0]));
        // Capped wants [30, 30, 10] do not fit 50: water-filled.
        assert_eq!(
            shares(fixed, 50.0, &[40.0, 40.0, 10.0]),
            Ok(vec![20.0, 20.0, 10.0])
        );
    }

    #[test]
    fn none_is_first_come_first_served() {
        assert_eq!(
            shares(Algorithm::None, 100.0, &[60.0, 60.0, 5.0]),
            Ok(vec![60.0, 40.0, 0.0])
        );
        let config = config(100.0, Algorithm::None);
        let mut state = LeaseState::new(0);
        assert_eq!(grant(&config, &mut state, "a", 60.0, 0), 60.0);
        assert_eq!(grant(&config, &mut state, "b", 60.0, 1), 40.0);
        assert_eq!(grant(&config, &mut state, "a", 60.0, 2), 60.0);
    }

    #[test]
    fn bad_amounts_are_refused_and_change_nothing() {
        assert!(matches!(
            shares(Algorithm::FairShare, 1.0, &[f64::NAN]),
            Err(CapacityError::NotFinite { field: "wants", .. })
        ));
        assert_eq!(
            shares(Algorithm::FairShare, f64::INFINITY, &[]),
            Err(CapacityError::NotFinite {
                field: "capacity",
                value: f64::INFINITY
            })
        );
        assert_eq!(
            shares(Algorithm::Static { per_client: -1.0 }, 1.0, &[]),
            Err(CapacityError::Negative {
                field: "per_client",
                value: -1.0
            })
        );
        let good = config(100.0, Algorithm::FairShare);
        let mut state = LeaseState::new(0);
        let refused = request(&good, &mut state, "a", 1.0, f64::NEG_INFINITY, 0);
        assert!(matches!(
            refused,
            Err(CapacityError::NotFinite { field: "has", .. })
        ));
        assert!(state.clients.is_empty());
        let zero = CapacityConfig {
            lease_ms: 0,
            ..good
        };
        assert_eq!(
            request(&zero, &mut state, "a", 1.0, 0.0, 0),
            Err(CapacityError::ZeroLease)
        );
        let late = CapacityConfig {
            refresh_interval_ms: 20_000,
            ..good
        };
        assert!(matches!(
            late.validate(),
            Err(CapacityError::RefreshInterval { .. })
        ));
    }
}
