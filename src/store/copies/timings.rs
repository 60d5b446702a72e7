//! How often a sidecar renews its membership of the shared copy log and how
//! long it may go without (`--heartbeat`, `--heartbeat-ttl`,
//! `--reap-interval`; docs/design.md#sidecar-crashes), checked. The tasks
//! that keep these timings are in `membership.rs`.

use std::time::Duration;

/// The timings of heartbeats and reaping (`--heartbeat`, `--heartbeat-ttl`,
/// `--reap-interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyTimings {
    pub heartbeat: Duration,
    pub ttl: Duration,
    pub reap_interval: Duration,
}

impl Default for CopyTimings {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(1),
            ttl: Duration::from_secs(5),
            reap_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    #[error("--heartbeat, --heartbeat-ttl and --reap-interval must be at least 10ms")]
    TooShort,
    #[error(
        "--heartbeat-ttl ({ttl:?}) must be at least twice --heartbeat ({heartbeat:?}): a sidecar resigns after ttl - heartbeat without a renewal"
    )]
    TtlTooShort { ttl: Duration, heartbeat: Duration },
}

impl CopyTimings {
    pub fn validate(&self) -> Result<(), TimingsError> {
        let floor = Duration::from_millis(10);
        if self.heartbeat < floor || self.ttl < floor || self.reap_interval < floor {
            return Err(TimingsError::TooShort);
        }
        if self.ttl < self.heartbeat * 2 {
            return Err(TimingsError::TtlTooShort {
                ttl: self.ttl,
                heartbeat: self.heartbeat,
            });
        }
        Ok(())
    }

    /// How long a sidecar may go without a renewal before it resigns.
    pub fn resign_after(&self) -> Duration {
        self.ttl.saturating_sub(self.heartbeat)
    }

    /// How long the reaper lease lasts without renewal.
    pub fn lease(&self) -> Duration {
        self.reap_interval * 3
    }
}
