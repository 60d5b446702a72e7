//! The configuration of a leased capacity (docs/design.md#capacity-leases),
//! as compiled from a `capacity:` resource and checked. The engine
//! apportions it (`engine::capacity`); the configuration owns what it is, so
//! that loading a file never needs the engine.

/// How a resource's capacity is divided among the clients that want it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Algorithm {
    /// Each client gets what it asks for while there is room: first come,
    /// first served.
    None,
    /// Each client gets at most `per_client`. If even those capped wants do
    /// not fit the capacity, the capacity is shared fairly among them (as
    /// [`Algorithm::FairShare`]), so the result does not depend on who asked
    /// first.
    Static { per_client: f64 },
    /// Over-subscribed, each client gets `capacity × wants / Σ wants`;
    /// otherwise what it wants.
    ProportionalShare,
    /// Max-min fair (water-filling): equal shares, and what a client does
    /// not want of its share is divided equally among the others.
    FairShare,
}

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
    /// What a client may use when it cannot reach the server (safe mode).
    /// `None`: the capacity divided by the number of live clients.
    pub safe_capacity: Option<f64>,
    /// How long after a lease state starts (`engine::capacity::LeaseState`)
    /// clients get what they say they have (learning mode,
    /// docs/design.md#capacity-leases).
    pub learning_ms: u64,
}

impl CapacityConfig {
    /// Every amount finite and non-negative, a lease that lasts, and a
    /// refresh interval within it.
    pub fn validate(&self) -> Result<(), CapacityError> {
        amount("capacity", self.capacity)?;
        if let Algorithm::Static { per_client } = self.algorithm {
            amount("per_client", per_client)?;
        }
        if let Some(safe) = self.safe_capacity {
            amount("safe_capacity", safe)?;
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
