//! Capacity leases (docs/design.md#capacity-leases): a resource's capacity
//! (say, requests per second to a backend) apportioned among the clients that
//! want it, as YouTube's Doorman does. A client asks for what it `wants` and
//! gets a [`Lease`] — a share it enforces itself, valid until `expiry_ms`, to
//! be renewed every `refresh_interval_ms`. This module owns the arithmetic:
//! the target allocation of an [`Algorithm`] ([`shares`]) and the step that
//! answers one request against one resource's [`LeaseState`] ([`request`]).
//! Pure: `now_ms` comes in, nothing is read from a clock, nothing is stored.
//!
//! One piece: the apportioning algorithms, the lease state they answer
//! against and the hierarchy's grants are one arithmetic, checked by the
//! same invariants (below); its tests are in `capacity/tests.rs`.
//!
//! # Invariants
//!
//! - The sum of live leases never exceeds the capacity (up to floating-point
//!   rounding), whatever the order of requests or what clients claim —
//!   except under the two algorithms that the paper says may overcommit:
//!   `none` (each client gets what it wants) and `static` without
//!   `per_client` (the capacity is each client's maximum).
//! - No client is granted more than it wants, unless the capacity lends
//!   its spare (`lends_spare`): then a client that wants some may be lent
//!   an equal part of what no client wants.
//! - A client that leases for clients of its own (a level of a hierarchy,
//!   [`request_want`]) is counted for what they still hold of it, up to
//!   what it was granted before: a shrunk share is given to another client
//!   only once it has been given back.
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
//! client holds its share after two refresh intervals. (The overcommitting
//! algorithms grant their share at once: they wait for nobody.)
//!
//! Those intervals are shorter while shares move: a lease that is still on
//! its way (what it wants or is granted changed, it waits for others to
//! give back, or its own clients hold more than its grant; see [`MOVING`])
//! is answered with a fifth of the refresh interval, a settled one with
//! the interval.
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
//!     whole_units: false,
//!     lends_spare: false,
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

mod apportion;
pub use crate::config::capacity::{
    Algorithm, CapacityConfig, CapacityError, UNLIMITED_SAFE_CAPACITY,
};
use apportion::{UNIT_EPSILON, apportion, targets};

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

/// What a client asks for in one request.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Want {
    /// What it would use.
    pub wants: f64,
    /// What it says it holds (given back in the learning period).
    pub has: f64,
    /// A server leasing from this one (a level of a hierarchy): what its
    /// own clients hold of its lease now. See [`request_want`].
    pub held_below: Option<f64>,
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
    let want = Want {
        wants,
        has,
        held_below: None,
    };
    request_want(config, state, client, want, now_ms)
}

/// [`request`], for a client that may be a server with clients of its own.
///
/// When such a client's grant shrinks, the leases it gave its own clients
/// under the larger one stay live until they renew. So that the difference
/// is not given to another client meanwhile, the record of what the client
/// holds is `max(grant, min(held_below, its previous record))`: what is
/// still held below counts as in use, but never more than this server
/// gave. The answer is the grant: the client apportions that, and its
/// record follows `held_below` down as its clients renew.
pub fn request_want(
    config: &CapacityConfig,
    state: &mut LeaseState,
    client: &str,
    want: Want,
    now_ms: u64,
) -> Result<Lease, CapacityError> {
    config.validate()?;
    let mut wants = amount("wants", want.wants)?;
    let mut has = amount("has", want.has)?;
    let mut held_below = want
        .held_below
        .map(|held| amount("held_below", held))
        .transpose()?;
    let whole;
    let config = if config.whole_units {
        // Whole units: what is wanted or still held below rounds up, what
        // a client says it has and the capacity down (a tiny epsilon
        // forgives floating-point sums).
        wants = (wants - UNIT_EPSILON).ceil().max(0.0);
        has = (has + UNIT_EPSILON).floor();
        held_below = held_below.map(|held| (held - UNIT_EPSILON).ceil().max(0.0));
        whole = CapacityConfig {
            capacity: (config.capacity + UNIT_EPSILON).floor(),
            ..*config
        };
        &whole
    } else {
        config
    };
    expire(state, now_ms);
    let (previous, wanted) = state
        .clients
        .get(client)
        .map_or((0.0, 0.0), |lease| (lease.has, lease.wants));
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
    let most = most_of(config, wants);
    let granted = if config.algorithm.overcommits() {
        target.min(most)
    } else {
        target.min(most).min(free)
    };
    let held = held_below.map_or(granted, |held| granted.max(held.min(previous)));
    if let Some(lease) = state.clients.get_mut(client) {
        lease.has = held;
        lease.expiry_ms = expiry_ms;
    }
    let safe_capacity = config
        .safe_capacity
        .unwrap_or_else(|| split(config, state, client));
    // Whether this client's lease is still on its way to its share: then it
    // renews sooner (see the module's doc, "Convergence").
    let moved = |size: f64| moving_bound(config, size);
    let moving = (wants - wanted).abs() > moved(wants.max(wanted))
        || (granted - previous).abs() > moved(granted.max(previous))
        || target.min(most) - granted > moved(target.min(most))
        || held - granted > moved(held);
    let refresh_interval_ms = if moving {
        (config.refresh_interval_ms / FASTER).max(1)
    } else {
        config.refresh_interval_ms
    };
    Ok(Lease {
        capacity: granted,
        expiry_ms,
        refresh_interval_ms,
        safe_capacity,
    })
}

/// The change that makes a lease *moving*: what it wants or is granted
/// changed by more than this fraction of the capacity and `MOVING_OWN` of
/// itself, or it is that far from its share, or its own clients hold that
/// much more than it. The second bound keeps a small client's noise (a
/// demand that drifts by a few percent) from making it move all the time.
pub const MOVING: f64 = 0.02;
pub const MOVING_OWN: f64 = 0.1;

/// How much sooner a moving lease renews.
pub const FASTER: u64 = 5;

/// How far a lease of `size` must move to count as moving (see [`MOVING`]).
fn moving_bound(config: &CapacityConfig, size: f64) -> f64 {
    (MOVING * config.capacity).max(MOVING_OWN * size)
}

/// The clients other than `except` that should renew now rather than at
/// their next refresh: those whose live lease at `now_ms` holds more than
/// their share (never more than they want) by more than a moving bound
/// (their share must shrink before another's grows), and those waiting
/// for that much more of their share while it is free (it was given
/// back). A server pushes them a nudge
/// (docs/design.md#a-hierarchy-of-servers). None under an algorithm that
/// overcommits (nobody waits) or in the learning period (the shares are
/// what clients say they have).
pub fn to_nudge<'a>(
    config: &CapacityConfig,
    state: &'a LeaseState,
    except: &str,
    now_ms: u64,
) -> Vec<&'a str> {
    if config.algorithm.overcommits()
        || now_ms < state.started_ms.saturating_add(config.learning_ms)
    {
        return Vec::new();
    }
    let live: Vec<(&'a str, &ClientLease)> = state
        .clients
        .iter()
        .filter(|(_, lease)| now_ms < lease.expiry_ms)
        .map(|(id, lease)| (id.as_str(), lease))
        .collect();
    let wants: Vec<f64> = live.iter().map(|(_, lease)| lease.wants).collect();
    let shares = targets(config, &wants);
    let free = config.capacity - live.iter().map(|(_, lease)| lease.has).sum::<f64>();
    live.into_iter()
        .zip(shares)
        .filter(|&((id, lease), share)| {
            let target = share.min(most_of(config, lease.wants));
            let over = lease.has - target > moving_bound(config, lease.has);
            let waiting = (target - lease.has).min(free) > moving_bound(config, target);
            id != except && (over || waiting)
        })
        .map(|((id, _), _)| id)
        .collect()
}

/// The most a client wanting `wants` may be granted: what it wants, or
/// while spare capacity is lent (and it wants some), the whole capacity.
fn most_of(config: &CapacityConfig, wants: f64) -> f64 {
    if config.lends_spare && wants > 0.0 && !config.algorithm.overcommits() {
        config.capacity
    } else {
        wants
    }
}

/// Doorman's default safe capacity, the parent's split: the capacity in
/// equal parts among the live clients that want some of it (and `client`,
/// whatever it wants). A client that wants nothing does not thin the
/// others' parts, so the parts of the clients that want some add up to the
/// capacity (docs/design.md#global-limits, "The parent away").
fn split(config: &CapacityConfig, state: &LeaseState, client: &str) -> f64 {
    let wanting = state
        .clients
        .iter()
        .filter(|(id, lease)| lease.wants > 0.0 || id.as_str() == client)
        .count();
    config.capacity / wanting.max(1) as f64
}

/// What a parent granted a level of a hierarchy
/// (docs/design.md#a-hierarchy-of-servers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub capacity: f64,
    pub expiry_ms: u64,
    /// How soon the parent asked to be asked again.
    pub refresh_interval_ms: u64,
    /// Whether that was sooner than the parent's usual interval: the
    /// level's grant is moving.
    pub moving: bool,
    /// The parent's safe capacity for the level, its split (-1: the
    /// configured capacity): what a global limit's share falls back to
    /// once the grant expired while the parent is away.
    pub safe_capacity: f64,
}

/// The configuration a level apportions with at `now_ms`, given its
/// parent's live `grant`: the grant as the capacity (at most the
/// configured one), leases that end no later than the grant and, while
/// the grant moves, renewed at least as often as the level renews it (so
/// that its clients follow as fast as it does). Without
/// a live grant, the safe capacity (-1: the configured capacity; unset:
/// nothing).
pub fn under_grant(config: &CapacityConfig, grant: Option<Grant>, now_ms: u64) -> CapacityConfig {
    match grant {
        Some(grant) if now_ms < grant.expiry_ms => {
            let lease_ms = config.lease_ms.min(grant.expiry_ms - now_ms).max(1);
            CapacityConfig {
                capacity: grant.capacity.min(config.capacity),
                lease_ms,
                refresh_interval_ms: config
                    .refresh_interval_ms
                    .min(if grant.moving {
                        grant.refresh_interval_ms
                    } else {
                        u64::MAX
                    })
                    .min(lease_ms)
                    .max(1),
                ..*config
            }
        }
        _ => CapacityConfig {
            capacity: match config.safe_capacity {
                Some(UNLIMITED_SAFE_CAPACITY) => config.capacity,
                Some(safe) => safe.min(config.capacity),
                None => 0.0,
            },
            ..*config
        },
    }
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

/// What the clients with leases live at `now_ms` want, in all.
pub fn live_wants(state: &LeaseState, now_ms: u64) -> f64 {
    state
        .clients
        .values()
        .filter(|lease| now_ms < lease.expiry_ms)
        .map(|lease| lease.wants)
        .sum()
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
/// the same order. Each share is at most its want; the shares sum to at
/// most `capacity` (up to rounding) unless the algorithm
/// [overcommits](Algorithm::overcommits).
pub fn shares(
    algorithm: Algorithm,
    capacity: f64,
    wants: &[f64],
) -> Result<Vec<f64>, CapacityError> {
    amount("capacity", capacity)?;
    if let Algorithm::Static {
        per_client: Some(per_client),
    } = algorithm
    {
        amount("per_client", per_client)?;
    }
    for &want in wants {
        amount("wants", want)?;
    }
    Ok(apportion(algorithm, capacity, wants))
}

/// `client`'s target among the live clients (already validated).
fn share_of(config: &CapacityConfig, state: &LeaseState, client: &str) -> f64 {
    let wants: Vec<f64> = state.clients.values().map(|lease| lease.wants).collect();
    let shares = targets(config, &wants);
    state
        .clients
        .keys()
        .position(|id| id == client)
        .and_then(|index| shares.get(index).copied())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests;
