//! The configuration of a leased capacity (docs/design.md#capacity-leases),
//! as compiled from a `capacity:` resource and checked. The engine
//! apportions it (`engine::capacity`); the configuration owns what it is, so
//! that loading a file never needs the engine.

/// How a resource's capacity is divided among the clients that want it:
/// Doorman's algorithms as the Charon paper (§5.1) defines them
/// (docs/design.md#doormans-algorithms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// Each client gets what it wants: no limit, and the leases may add up
    /// to more than the capacity (the paper's no-op "pseudo-algorithm").
    None,
    /// Without `per_client` (the paper's): the capacity is each client's
    /// maximum, not a total, and the leases may add up to more than it.
    /// With `per_client` (Charon's own): each client gets at most
    /// `per_client`, and if even those capped wants do not fit the capacity
    /// it is shared fairly among them (as [`Algorithm::FairShare`]).
    Static { per_client: Option<f64> },
    /// An equal share each (at most what it wants); the capacity that
    /// clients wanting less leave is divided among the others in
    /// proportion to what they want beyond their equal share.
    ProportionalShare,
    /// Max-min fair (water-filling): equal shares, and what a client does
    /// not want of its share is divided equally among the others.
    FairShare,
}

impl Algorithm {
    /// Whether the leases may add up to more than the capacity.
    pub fn overcommits(self) -> bool {
        matches!(
            self,
            Algorithm::None | Algorithm::Static { per_client: None }
        )
    }
}

/// The safe capacity that means "no limit while the server is away" (the
/// paper's −1: rate limiting disabled). 0 forbids the resource then.
pub const UNLIMITED_SAFE_CAPACITY: f64 = -1.0;

/// The configuration of one capacity resource.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacityConfig {
    /// What all live leases together may not exceed (units per second, or
    /// any unit the clients agree on).
    pub capacity: f64,
    pub algorithm: Algorithm,
    /// How long a lease lasts without renewal.
    pub lease_ms: u64,
    /// How often a client should renew; at most `lease_ms`, so a client that
    /// renews on time never loses its lease.
    pub refresh_interval_ms: u64,
    /// What a client may use when it cannot reach the server (safe mode):
    /// [`UNLIMITED_SAFE_CAPACITY`] for no limit, 0 for nothing. `None`: the
    /// capacity divided by the number of live clients.
    pub safe_capacity: Option<f64>,
    /// How long after a lease state starts (`engine::capacity::LeaseState`)
    /// clients get what they say they have (learning mode,
    /// docs/design.md#capacity-leases).
    pub learning_ms: u64,
    /// Whether shares are whole units: a global limit's shares are whole
    /// requests, so its capacity is apportioned in whole units (what a
    /// client wants rounded up, the shares by largest remainder) rather
    /// than rounded down by each server, which would leave up to a unit
    /// per server unused (docs/design.md#global-limits).
    pub whole_units: bool,
    /// Whether the capacity that no client wants is lent to the clients
    /// that want some, an equal part each, on top of their share: a global
    /// limit's or an RLQS bucket's server whose demand is under its share
    /// is then never refused while the limit has room. A lent part is
    /// taken back (the client nudged) before any share it covers moves
    /// (docs/design.md#global-limits, "Spare capacity lent").
    pub lends_spare: bool,
}

impl CapacityConfig {
    /// Every amount finite and non-negative, a lease that lasts, and a
    /// refresh interval within it.
    pub fn validate(&self) -> Result<(), CapacityError> {
        amount("capacity", self.capacity)?;
        if let Algorithm::Static {
            per_client: Some(per_client),
        } = self.algorithm
        {
            amount("per_client", per_client)?;
        }
        if let Some(safe) = self.safe_capacity {
            safe_capacity(safe)?;
        }
        if self.lease_ms == 0 {
            return Err(CapacityError::ZeroLease);
        }
        if self.refresh_interval_ms == 0 || self.refresh_interval_ms > self.lease_ms {
            return Err(CapacityError::RefreshInterval {
                refresh_interval_ms: self.refresh_interval_ms,
                lease_ms: self.lease_ms,
            });
        }
        Ok(())
    }
}

/// An amount or a configuration the engine refuses.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum CapacityError {
    #[error("{field} must be a finite number, got {value}")]
    NotFinite { field: &'static str, value: f64 },
    #[error("{field} must not be negative, got {value}")]
    Negative { field: &'static str, value: f64 },
    #[error("lease_ms must be positive")]
    ZeroLease,
    #[error(
        "refresh_interval_ms must be positive and at most lease_ms ({lease_ms}), got {refresh_interval_ms}"
    )]
    RefreshInterval {
        refresh_interval_ms: u64,
        lease_ms: u64,
    },
}

/// A safe capacity: an amount, or [`UNLIMITED_SAFE_CAPACITY`].
pub(crate) fn safe_capacity(value: f64) -> Result<f64, CapacityError> {
    if value == UNLIMITED_SAFE_CAPACITY {
        Ok(value)
    } else {
        amount("safe_capacity", value)
    }
}

/// `value` if it is a finite, non-negative amount (-0.0 becomes 0.0).
pub(crate) fn amount(field: &'static str, value: f64) -> Result<f64, CapacityError> {
    if !value.is_finite() {
        Err(CapacityError::NotFinite { field, value })
    } else if value < 0.0 {
        Err(CapacityError::Negative { field, value })
    } else {
        // -0.0 passes the test above; keep it out of the state.
        Ok(value.max(0.0))
    }
}
