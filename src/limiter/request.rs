//! What a caller hands the limiter and gets back, and the checks a request
//! passes before anything is decided.

use std::sync::Arc;

use crate::config::{Metadata, Unit};
use crate::engine::TierOutcome;
use crate::store::StoreError;

/// Request sizes past which a request is refused as invalid
/// (docs/configuration.md#caps-on-input).
pub mod caps {
    /// Descriptors in one request.
    pub const MAX_DESCRIPTORS: usize = 256;
    /// Entries in one descriptor.
    pub const MAX_ENTRIES: usize = 64;
    /// Bytes in one entry key or value, and in a namespace, resource or domain.
    pub const MAX_STRING_BYTES: usize = 4_096;
}

/// An Envoy-style request: a namespace and descriptors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimitRequest {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// Hits for every descriptor without its own; 0 means 1 (as in Envoy).
    pub hits_addend: u64,
}

impl RateLimitRequest {
    pub fn new(domain: impl Into<String>, descriptors: Vec<Descriptor>) -> Self {
        Self {
            domain: domain.into(),
            descriptors,
            hits_addend: 1,
        }
    }
}

/// One descriptor: an ordered list of (key, value) entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// Overrides the request's hits; `Some(0)` only checks.
    pub hits_addend: Option<u64>,
    /// A limit sent with the request, replacing the configured one.
    pub limit: Option<LimitOverride>,
    /// Its hits are given back, not asked for (Envoy's `is_negative_hits`;
    /// docs/design.md#refunds): always answered OK.
    pub refund: bool,
}

impl Descriptor {
    pub fn new<K: Into<String>, V: Into<String>>(
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            entries: entries
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u64,
    pub unit: Unit,
}

/// Process-wide switches of envoyproxy/ratelimit (`SHADOW_MODE`,
/// `QUOTA_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Modes {
    /// A request over its limits is answered OK; its statuses still say
    /// which descriptors are over.
    pub shadow: bool,
    /// Every descriptor is a quota descriptor (see [`DescriptorStatus::quota`]).
    pub quota: bool,
    /// Every fixed-window hit is counted, rejected or not, as
    /// envoyproxy/ratelimit counts (`--count-rejected-hits`;
    /// docs/configuration.md#counting-rejected-hits).
    pub count_rejected: bool,
}

/// The answer to a [`RateLimitRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitAnswer {
    /// Some non-shadow, non-quota descriptor is over its limit, or every
    /// quota descriptor is (and the namespace does not ignore its
    /// configuration, and the process is not in shadow mode).
    pub over_limit: bool,
    /// Over its limits, but answered OK by the process-wide shadow mode.
    pub shadowed: bool,
    /// One per descriptor, in request order.
    pub statuses: Vec<DescriptorStatus>,
    /// Whether the namespace is known; metrics label unknown ones as such.
    pub namespace_known: bool,
}

/// The status of one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorStatus {
    pub over_limit: bool,
    /// `None`: not limited (no match, unlimited, or replaced).
    pub limit: Option<CurrentLimit>,
    /// 0 when over the limit.
    pub remaining: u64,
    /// OK: until the limit is whole again; OVER: until this request's own
    /// hits would pass, or, when they never can (a zero limit, more hits
    /// than the limit), the window's end (docs/design.md#resets). `None`: not
    /// limited.
    pub reset_after_ms: Option<u64>,
    /// For a burst-tier descriptor: the full engine answer.
    pub tiers: Option<TierOutcome>,
    /// Granted, but past the limit's `soft_limit` (docs/design.md#soft-limits):
    /// warn.
    pub soft_limit_exceeded: bool,
    /// A quota descriptor (`quota_mode`): over its limit, it rejects the
    /// request only if every quota descriptor of the request is over too.
    pub quota: bool,
    /// The matched node's `metadata`.
    pub metadata: Option<Arc<Metadata>>,
    /// The hits this descriptor asked for (0: a check).
    pub hits: u64,
    /// The hits its limit had counted before this request's, from which
    /// envoyproxy/ratelimit's statistics split them at the near-limit
    /// threshold and at the limit (docs/envoy-compatibility.md#metrics).
    pub before: u64,
    /// Over its limit, but reported OK: shadow mode or `ignore_configured`.
    pub shadowed: bool,
    /// Its `hits` were given back (docs/design.md#refunds).
    pub refund: bool,
    /// A concurrency limit's hits held past `max_hold`, never given back,
    /// that left it in this decision.
    pub unreturned: u64,
    /// envoyproxy/ratelimit's statistics key of the matched limit
    /// (`domain.key_value…`), which `detailed_metric` and `value_to_metric`
    /// shape; the per-limit metrics are labelled with it.
    pub stats_key: Option<Arc<str>>,
}

impl DescriptorStatus {
    pub(super) fn unlimited(remaining: u64) -> Self {
        Self {
            over_limit: false,
            limit: None,
            remaining,
            reset_after_ms: None,
            tiers: None,
            soft_limit_exceeded: false,
            quota: false,
            metadata: None,
            hits: 0,
            before: 0,
            shadowed: false,
            refund: false,
            unreturned: 0,
            stats_key: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentLimit {
    pub name: Option<String>,
    pub requests_per_unit: u64,
    pub unit: Unit,
    /// The real window (a tier's or a `unit_multiplier`'s), ms.
    pub window_ms: u64,
}

/// Why a request got no decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The request itself is wrong: a client error, do not retry it.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The store failed: a server error, retrying may help.
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(super) fn validate(request: &RateLimitRequest) -> Result<(), LimitError> {
    let invalid = |message: String| Err(LimitError::InvalidArgument(message));
    if request.domain.is_empty() {
        return invalid("domain is empty".into());
    }
    if request.domain.len() > caps::MAX_STRING_BYTES {
        return invalid(format!(
            "domain is longer than {} bytes",
            caps::MAX_STRING_BYTES
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("descriptors list is empty".into());
    }
    if request.descriptors.len() > caps::MAX_DESCRIPTORS {
        return invalid(format!(
            "{} descriptors; at most {} are accepted",
            request.descriptors.len(),
            caps::MAX_DESCRIPTORS
        ));
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > caps::MAX_ENTRIES {
            return invalid(format!(
                "descriptor {index} has {} entries; at most {} are accepted",
                descriptor.entries.len(),
                caps::MAX_ENTRIES
            ));
        }
        for (key, value) in &descriptor.entries {
            if key.len() > caps::MAX_STRING_BYTES || value.len() > caps::MAX_STRING_BYTES {
                return invalid(format!(
                    "descriptor {index} has an entry longer than {} bytes",
                    caps::MAX_STRING_BYTES
                ));
            }
        }
    }
    Ok(())
}
