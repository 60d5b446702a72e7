//! Crash safety across sidecars (docs/design.md#sidecar-crashes):
//! heartbeats, resignation, and the reaper.
//!
//! - **Heartbeat.** A sidecar registers under a fresh random id with a key
//!   that expires after `ttl`, and renews it every `heartbeat` (`SET … XX`).
//! - **Resignation.** If the key is gone when it renews (Redis lost its data,
//!   or the sidecar was reaped), or if no renewal has succeeded for
//!   `ttl - heartbeat`, the sidecar resigns: its membership generation moves
//!   on, which ends every session (their holds are the reaper's now), and copy
//!   operations are refused until it has registered again under a new id.
//! - **Reaper.** Every `reap_interval`, the sidecar holding the reaper lease
//!   (`SET NX PX`, renewed by its holder) looks at the contributors of every
//!   copy-limited resource; a contributor whose heartbeat key is gone is dead:
//!   one script subtracts its contribution from the counts, deletes it and
//!   bars the id from contributing again. It also releases expired transfers.
//!
//! A SIGKILLed sidecar's holds are therefore gone within
//! `ttl + reap_interval` (plus one lease period if the dead sidecar held the
//! lease), and a sidecar that cannot reach Redis stops serving copies before
//! its heartbeat can expire.

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
