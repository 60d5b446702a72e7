//! Leased capacities (docs/design.md#capacity-leases): the resource's
//! settings, with defaults, checked by the engine's own rules.

use std::collections::HashMap;

use serde_saphyr::{Location, Spanned};

use crate::config::CapacityResource;
use crate::config::capacity::{Algorithm, CapacityConfig, UNLIMITED_SAFE_CAPACITY};
use crate::config::duration::FOREVER;
use crate::config::raw::RawCapacity;

use super::Ctx;

/// Defaults as Doorman's: a lease of a minute, renewed every five seconds,
/// and a learning period as long as a lease (every lease handed out before a
/// restart has expired or been renewed by then).
const DEFAULT_LEASE: &str = "60s";
const DEFAULT_REFRESH: &str = "5s";

impl Ctx {
    pub(super) fn capacity(
        &mut self,
        name: &str,
        raw: &mut RawCapacity,
    ) -> Option<CapacityResource> {
        let errors_before = self.errors.len();
        let capacity = self.amount(&raw.capacity, "capacity");
        let per_client = raw
            .per_client
            .as_ref()
            .and_then(|value| self.amount(value, "per_client"));
        let algorithm = match raw
            .algorithm
            .as_ref()
            .map(|a| (a.value.as_str(), a.referenced))
        {
            None | Some(("fair_share", _)) => Algorithm::FairShare,
            Some(("proportional_share", _)) => Algorithm::ProportionalShare,
            Some(("none", _)) => Algorithm::None,
            Some(("static", _)) => Algorithm::Static { per_client },
            Some((other, at)) => {
                self.error(
                    at,
                    format!(
                        "resource `{name}`: unknown algorithm `{other}` (none, static, proportional_share, fair_share)"
                    ),
                );
                Algorithm::FairShare
            }
        };
        let lease = self.lease_duration(&raw.lease, DEFAULT_LEASE, "lease");
        let refresh =
            self.lease_duration(&raw.refresh_interval, DEFAULT_REFRESH, "refresh_interval");
        let learning = match &raw.learning {
            Some(value) => self.duration(value, "learning").filter(|ms| {
                *ms != FOREVER || {
                    self.error(value.referenced, "learning: must be finite");
                    false
                }
            }),
            None => lease,
        };
        let safe_capacity = raw
            .safe_capacity
            .as_ref()
            .and_then(|value| self.safe_capacity(value));
        let (Some(capacity), Some(lease_ms), Some(refresh_interval_ms), Some(learning_ms)) =
            (capacity, lease, refresh, learning)
        else {
            return None;
        };
        let default = CapacityConfig {
            capacity,
            algorithm,
            lease_ms,
            refresh_interval_ms,
            safe_capacity,
            learning_ms,
            whole_units: false,
            lends_spare: false,
        };
        let at = raw.capacity.referenced;
        if let Err(error) = default.validate() {
            self.error(at, format!("resource `{name}`: {error}"));
        }
        let mut domains = HashMap::new();
        for (domain, entry) in &raw.domains {
            if domain.is_empty() {
                self.error(entry.referenced, "a domain name is empty");
                continue;
            }
            if self.control_character(entry.referenced, "domain name", domain) {
                continue;
            }
            let Some(capacity) = self.amount(&entry.value.capacity, "capacity") else {
                continue;
            };
            let safe_capacity = match &entry.value.safe_capacity {
                Some(value) => self.safe_capacity(value),
                None => default.safe_capacity,
            };
            domains.insert(
                domain.clone(),
                CapacityConfig {
                    capacity,
                    safe_capacity,
                    ..default
                },
            );
        }
        (self.errors.len() == errors_before).then(|| CapacityResource {
            name: name.to_owned(),
            default,
            domains,
            from_parent: raw.from_parent.as_ref().is_some_and(|on| on.value),
        })
    }

    /// A finite, non-negative amount.
    fn amount(&mut self, value: &Spanned<f64>, what: &str) -> Option<f64> {
        if value.value.is_finite() && value.value >= 0.0 {
            Some(value.value)
        } else {
            self.error(
                value.referenced,
                format!(
                    "{what} must be a finite number of at least 0, got {}",
                    value.value
                ),
            );
            None
        }
    }

    /// A safe capacity: an amount, or -1 for no limit while the server is
    /// away (docs/design.md#doormans-algorithms).
    fn safe_capacity(&mut self, value: &Spanned<f64>) -> Option<f64> {
        if value.value == UNLIMITED_SAFE_CAPACITY {
            return Some(value.value);
        }
        if value.value.is_finite() && value.value >= 0.0 {
            return Some(value.value);
        }
        self.error(
            value.referenced,
            format!(
                "safe_capacity must be -1 (no limit while the server is away), 0 (nothing) or a positive number, got {}",
                value.value
            ),
        );
        None
    }

    fn lease_duration(
        &mut self,
        value: &Option<Spanned<String>>,
        default: &str,
        what: &str,
    ) -> Option<u64> {
        let fallback;
        let value = match value {
            Some(value) => value,
            None => {
                fallback = Spanned::new(default.to_owned(), Location::UNKNOWN, Location::UNKNOWN);
                &fallback
            }
        };
        match self.duration(value, what)? {
            0 => {
                self.error(value.referenced, format!("{what}: must be longer than 0"));
                None
            }
            FOREVER => {
                self.error(value.referenced, format!("{what}: must be finite"));
                None
            }
            ms => Some(ms),
        }
    }
}
