//! The label sets of the sidecar's metrics. Every value is bounded: an
//! enumeration, a name from the configuration, or a key under a series cap.

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Decision {
    Ok,
    OverLimit,
    InvalidArgument,
    StoreError,
}

impl EncodeLabelValue for Decision {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            Decision::Ok => "ok",
            Decision::OverLimit => "over_limit",
            Decision::InvalidArgument => "invalid_argument",
            Decision::StoreError => "store_error",
        })
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub namespace: String,
    pub result: Decision,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ReloadResult {
    Ok,
    Rejected,
}

impl EncodeLabelValue for ReloadResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ReloadResult::Ok => "ok",
            ReloadResult::Rejected => "rejected",
        })
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    pub result: ReloadResult,
}

/// What happened to a limit's hits.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum LimitOutcome {
    WithinLimit,
    NearLimit,
    OverLimit,
    ShadowMode,
    /// Given back (Envoy's `is_negative_hits`).
    Refunded,
    /// A concurrency limit's hits held past `max_hold`, never given back.
    Unreturned,
}

impl LimitOutcome {
    /// A decision's main outcome: over but let through (shadow mode,
    /// `ignore_configured`) first, then over, else within.
    pub fn of(over: bool, shadowed: bool) -> Self {
        if shadowed {
            Self::ShadowMode
        } else if over {
            Self::OverLimit
        } else {
            Self::WithinLimit
        }
    }
}

impl EncodeLabelValue for LimitOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            LimitOutcome::WithinLimit => "within_limit",
            LimitOutcome::NearLimit => "near_limit",
            LimitOutcome::OverLimit => "over_limit",
            LimitOutcome::ShadowMode => "shadow_mode",
            LimitOutcome::Refunded => "refunded",
            LimitOutcome::Unreturned => "unreturned",
        })
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub namespace: String,
    pub limit: SharedLabel,
    pub outcome: LimitOutcome,
}

/// A label value shared with the configuration: counting a hit clones a
/// pointer instead of copying the key.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
pub struct SharedLabel(pub Arc<str>);

impl EncodeLabelValue for SharedLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

/// One call to the shared store and how it ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreCallLabels {
    /// `decide`, `peek`, `ping`, a copy operation (`reserve`, `release`,
    /// `transfer`, `seize`, `drop_session`, `counts`, `index`) or the copy
    /// log's housekeeping (`heartbeat`, `register`, `deregister`,
    /// `reaper_lease`, `reap_scan`, `reap`, `expire`).
    pub operation: &'static str,
    /// `ok` or `error` (a failure or a missed deadline).
    pub result: &'static str,
}

/// A Charon API session operation and how it ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CopyOperationLabels {
    pub operation: &'static str,
    /// `ok`, `rejected` (a reserve granted nothing) or the error kind.
    pub result: &'static str,
}

/// The tier a burst-tier decision was made in (one-indexed; 0: none active).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub struct TierLabel(pub usize);

impl EncodeLabelValue for TierLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(itoa::Buffer::new().format(self.0))
    }
}

/// A burst-tier limit's hits by outcome, tier and what limited them.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub namespace: String,
    pub limit: SharedLabel,
    pub outcome: LimitOutcome,
    pub tier: TierLabel,
    /// `none` (granted), `tier`, `hard` or `global`.
    pub limited_by: &'static str,
}

/// Hits on a resource a namespace does not configure but allows.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub namespace: String,
    pub resource: SharedLabel,
}

/// A copy-limited resource.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CopyResourceLabels {
    pub namespace: String,
    pub resource: String,
}

/// A group of a copy-limited resource.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CopyGroupLabels {
    pub namespace: String,
    pub resource: String,
    pub group: String,
}

/// A membership event of the copy log.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CopyLogEventLabels {
    pub event: &'static str,
}

/// What an RLQS report's bucket was answered.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    pub outcome: &'static str,
}

/// `--on-overload`'s policy.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: &'static str,
}

/// A configured limit: its namespace, statistics key and unit.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfiguredLimitLabels {
    pub namespace: String,
    pub limit: SharedLabel,
    /// `second`, `minute`, `hour`, `day`, `week`, `month` or `year`.
    pub unit: &'static str,
}
