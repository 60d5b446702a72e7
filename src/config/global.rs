//! Global limits (docs/design.md#global-limits): a descriptor limit marked
//! `global: true` is one limit shared by every server of a hierarchy, each
//! deciding its own requests locally against its current share. This module
//! owns what the configuration carries for one: the limit as written, the
//! name its shares are leased under, and how often they are renewed. The
//! shares themselves are runtime state: the limiter's
//! (`crate::limiter::shares`), renewed by the service.
//!
//! A share is a lease of the limit's `requests_per_unit`, apportioned like a
//! capacity (`crate::engine::capacity`) among the servers that want it:
//! the root has the configured limit, every other server asks its parent
//! (`--parent`) for what it and its own children want.

use super::FixedLimit;

/// What a global limit's leases are named by, in `GetCapacity`: this
/// prefix and the descriptor's path as written (`key_value.key`).
pub const RESOURCE_PREFIX: &str = "rate_limit:";

/// How often a server renews its share, and its parent's lease of the
/// limit, unless told otherwise; a share is a lease of `LEASE_MS`.
pub const REFRESH_MS: u64 = 500;
pub const LEASE_MS: u64 = 10_000;

/// The shortest refresh interval: a link asks its parent at most every
/// 100 ms, whatever it is told.
pub const FASTEST_REFRESH_MS: u64 = 100;

/// How a server leases its global limits' shares: how often it renews its
/// own and its children renew theirs, and how long a share lasts
/// (`--global-refresh-interval`, `--global-lease`). The parent's answer
/// paces a child's renewals, so each level may set its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GlobalTiming {
    refresh_ms: u64,
    lease_ms: u64,
    /// The safe share of the limits that do not set their own
    /// (`--global-safe-share`).
    safe_share: SafeShare,
}

impl Default for GlobalTiming {
    fn default() -> Self {
        Self {
            refresh_ms: REFRESH_MS,
            lease_ms: LEASE_MS,
            safe_share: SafeShare::Last,
        }
    }
}

/// What a server may admit of a global limit while its parent is away,
/// once its last share expired (docs/design.md#global-limits, "The parent away"). Until
/// then, the last share stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SafeShare {
    /// Its last grant, kept: the parent's last allocation among its
    /// children, which adds up to at most the parent's share (the spare of
    /// a limit with room lent, so it adds up to all of it). The servers
    /// below a missing parent then admit the parent's share together, no
    /// more, split as the demand last was.
    Last,
    /// Its part of the parent's last equal split: the limit in equal parts
    /// among the parent's children that wanted some (Doorman's safe
    /// capacity). Also at most the parent's share together; fairer when
    /// the demand moves during the outage, wasteful when it is uneven.
    Split,
    /// The whole limit, as if it were not global: each server below a
    /// missing parent admits up to the limit.
    Whole,
    /// So many requests per window.
    Requests(u64),
    /// So many percent of the limit.
    Percent(f64),
}

/// A safe share that cannot be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "a safe share is `last`, `split`, `whole`, a count of requests or a percentage of the limit (`25%`), got `{0}`"
)]
pub struct SafeShareError(String);

impl SafeShare {
    /// `last`, `split`, `whole`, `30` or `25%`.
    pub fn parse(text: &str) -> Result<Self, SafeShareError> {
        let refused = || SafeShareError(text.to_owned());
        match text.trim() {
            "last" => Ok(Self::Last),
            "split" => Ok(Self::Split),
            "whole" => Ok(Self::Whole),
            other => match other.strip_suffix('%') {
                Some(percent) => match percent.trim().parse::<f64>() {
                    Ok(percent) if (0.0..=100.0).contains(&percent) => Ok(Self::Percent(percent)),
                    _ => Err(refused()),
                },
                None => other
                    .parse::<u64>()
                    .map(Self::Requests)
                    .map_err(|_| refused()),
            },
        }
    }

    /// As a capacity's safe capacity for a limit of `limit` requests:
    /// `None` is one the parent said (its last grant, or its split).
    pub fn safe_capacity(self, limit: f64) -> Option<f64> {
        match self {
            Self::Last | Self::Split => None,
            Self::Whole => Some(crate::config::capacity::UNLIMITED_SAFE_CAPACITY),
            Self::Requests(requests) => Some((requests as f64).min(limit)),
            Self::Percent(percent) => Some((limit * percent / 100.0).floor()),
        }
    }
}

/// A refresh interval or lease that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobalTimingError {
    #[error("a global limit's refresh interval must be at least {FASTEST_REFRESH_MS}ms, got {0}ms")]
    RefreshTooShort(u64),
    #[error(
        "a global limit's lease ({lease_ms}ms) must be at least twice its refresh interval ({refresh_ms}ms), so that a renewal can fail once without the share lapsing"
    )]
    LeaseTooShort { refresh_ms: u64, lease_ms: u64 },
    #[error("a global limit's lease must be at most a day, got {0}ms")]
    LeaseTooLong(u64),
}

impl GlobalTiming {
    pub fn new(refresh_ms: u64, lease_ms: u64) -> Result<Self, GlobalTimingError> {
        if refresh_ms < FASTEST_REFRESH_MS {
            return Err(GlobalTimingError::RefreshTooShort(refresh_ms));
        }
        if lease_ms > 86_400_000 {
            return Err(GlobalTimingError::LeaseTooLong(lease_ms));
        }
        if lease_ms < refresh_ms.saturating_mul(2) {
            return Err(GlobalTimingError::LeaseTooShort {
                refresh_ms,
                lease_ms,
            });
        }
        Ok(Self {
            refresh_ms,
            lease_ms,
            safe_share: SafeShare::Last,
        })
    }

    /// With `safe_share` for the limits that do not set their own.
    pub fn with_safe_share(self, safe_share: SafeShare) -> Self {
        Self { safe_share, ..self }
    }

    pub fn safe_share(&self) -> SafeShare {
        self.safe_share
    }

    pub fn refresh_ms(&self) -> u64 {
        self.refresh_ms
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }
}

/// A global limit of a namespace, as configured: its `requests_per_unit`
/// is the whole, shared by every server. This server's share of it is
/// runtime state, the limiter's (`crate::limiter::shares`).
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalLimit {
    pub limit: FixedLimit,
    /// Its own safe share (`safe_share:`), if it sets one.
    pub safe_share: Option<SafeShare>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_shares_are_read_or_refused_clearly() {
        assert_eq!(SafeShare::parse("last"), Ok(SafeShare::Last));
        assert_eq!(SafeShare::parse("split"), Ok(SafeShare::Split));
        assert_eq!(SafeShare::parse("whole"), Ok(SafeShare::Whole));
        assert_eq!(SafeShare::parse("30"), Ok(SafeShare::Requests(30)));
        assert_eq!(SafeShare::parse("25%"), Ok(SafeShare::Percent(25.0)));
        for bad in ["", "half", "-3", "150%", "x%", "1e999"] {
            let refused = SafeShare::parse(bad).map_err(|error| error.to_string());
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|message| message.contains("percentage")),
                "{bad}: {refused:?}"
            );
        }
        assert_eq!(SafeShare::Percent(25.0).safe_capacity(90.0), Some(22.0));
        assert_eq!(SafeShare::Requests(500).safe_capacity(90.0), Some(90.0));
        assert_eq!(SafeShare::Split.safe_capacity(90.0), None);
    }

    #[test]
    fn a_refresh_interval_or_lease_that_cannot_work_is_refused() {
        assert_eq!(
            GlobalTiming::new(500, 10_000).map(|timing| (timing.refresh_ms(), timing.lease_ms())),
            Ok((500, 10_000))
        );
        assert_eq!(
            GlobalTiming::new(50, 10_000),
            Err(GlobalTimingError::RefreshTooShort(50))
        );
        assert!(matches!(
            GlobalTiming::new(500, 900),
            Err(GlobalTimingError::LeaseTooShort { .. })
        ));
        assert!(matches!(
            GlobalTiming::new(500, 90_000_000),
            Err(GlobalTimingError::LeaseTooLong(_))
        ));
    }
}
