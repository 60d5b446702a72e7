//! Configuration: what limits exist. Owns the file format
//! (docs/configuration.md), its validation and normalization
//! (docs/design.md#normalization), and the compiled, immutable
//! [`Config`] the engine decides with.
//!
//! One YAML file is one namespace (Envoy's `domain`); a directory loads every
//! `*.yaml`/`*.yml` in it. A file with any error is rejected whole, and errors
//! carry `file:line:column`. Normalization makes the changes that
//! docs/design.md#normalization lists and reports each as a [`Note`].
//!
//! ```rust
//! let yaml = "domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
//! let loaded = charon::config::load_str(yaml, "shop.yaml").unwrap();
//! assert!(loaded.config.namespace("shop").is_some());
//! ```

pub mod boulder;
pub mod calendar;
pub mod capacity;
mod compile;
mod descriptors;
pub mod duration;
mod error;
pub mod global;
pub mod learned;
mod load;
pub mod overlay;
mod raw;
mod running;
mod yaml;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

pub use descriptors::{Glob, How, Leaf, Level, Match, Metadata, Node};
pub use duration::{FOREVER, Millis, parse as parse_duration};
pub use error::{ConfigError, ConfigErrors, Note};
pub use load::{
    LoadOptions, Loaded, PushedNamespace, check_write, load_path, load_path_with, load_str,
    load_with_overlay,
};
pub use raw::MetaValue;

/// Parses a YAML (or JSON) document of another shape than a namespace with
/// the loader's options and caps: its error with its place.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
    origin: &std::path::Path,
) -> Result<T, ConfigError> {
    overlay::parse(text, origin)
}
pub use running::Running;

/// Sizes past which a file is refused rather than loaded
/// (docs/configuration.md#caps-on-input).
pub mod caps {
    /// A configuration file larger than this is refused.
    pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
    /// Descriptor nesting deeper than this is refused (the YAML parser's own
    /// depth budget stops hostile files earlier than this would).
    pub const MAX_DESCRIPTOR_DEPTH: usize = 32;
    /// Burst tiers per rate configuration.
    pub const MAX_TIERS: usize = 64;
    /// YAML nodes in one file: far more than any file under the size cap
    /// legitimately holds, so only hostile input meets it.
    pub const MAX_YAML_NODES: usize = 8_000_000;
    /// The hits a sliding window log keeps per key: its limit, at most.
    pub const MAX_LOG_HITS: u64 = 10_000;
}

/// Every namespace the server knows, by name.
#[derive(Debug, Clone, Default)]
pub struct Config {
    namespaces: HashMap<String, Arc<Namespace>>,
}

impl Config {
    pub fn namespace(&self, name: &str) -> Option<&Arc<Namespace>> {
        self.namespaces.get(name)
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &Arc<Namespace>> {
        self.namespaces.values()
    }
}

/// One namespace: the limits of one file.
#[derive(Debug)]
pub struct Namespace {
    pub name: String,
    pub source: PathBuf,
    pub settings: Settings,
    pub descriptors: Level,
    pub resources: HashMap<String, Resource>,
    /// The descriptor limits marked `global`, by the name their leases go
    /// by (docs/design.md#global-limits).
    pub globals: std::collections::BTreeMap<String, global::GlobalLimit>,
}

/// Namespace switches (docs/design.md#namespace-settings).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    /// Every request is granted; what fits within the limits is still
    /// counted, and statuses report the real state (as in shadow mode).
    pub ignore_configured: bool,
    /// Unknown resources behave as unlimited (used by the Charon API).
    pub allow_unconfigured: bool,
    /// Use per domain is recorded, so that a limit can be proposed from it.
    pub learn: Option<Learn>,
}

/// `settings.learn`: what is recorded of the use of unconfigured resources
/// and of shadow-mode limits, per domain (docs/design.md#learning-a-limit).
/// The memory it takes is bounded by these three numbers alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Learn {
    /// The window use is counted in: what a proposed limit is per.
    pub window_ms: u64,
    /// How many windows are kept: the recorded period.
    pub windows: u32,
    /// The heaviest domains kept per window (of each resource or limit).
    pub domains: u32,
}

impl Learn {
    pub const DEFAULT: Learn = Learn {
        window_ms: 60_000,
        windows: 60,
        domains: 100,
    };
    /// Bounds of each field: a window of one second to one day, at most a
    /// week of minutes, at most 10 000 domains per window.
    pub const WINDOW_MS: std::ops::RangeInclusive<u64> = 1_000..=86_400_000;
    pub const WINDOWS: std::ops::RangeInclusive<u32> = 1..=10_080;
    pub const DOMAINS: std::ops::RangeInclusive<u32> = 1..=10_000;
    /// The resources and limits recorded per namespace: past this, a new one
    /// is not recorded.
    pub const SUBJECTS: usize = 100;
    /// At most this many (window, domain) entries per resource or limit:
    /// `windows` x `domains`, so a namespace's record holds at most
    /// `SUBJECTS` x `ENTRIES` entries.
    pub const ENTRIES: u64 = 100_000;

    /// The start of the window `now_ms` falls in.
    pub fn window_start(&self, now_ms: u64) -> u64 {
        now_ms - now_ms % self.window_ms
    }

    /// How long a window's record is kept: until the recorded period has
    /// moved past it.
    pub fn retention_ms(&self) -> u64 {
        self.window_ms.saturating_mul(u64::from(self.windows) + 1)
    }
}

/// A named resource of a namespace.
#[derive(Debug, Clone)]
pub enum Resource {
    Rate(Arc<RateResource>),
    Copies(Arc<CopyResource>),
    Capacity(Arc<CapacityResource>),
}

/// A capacity shared out in leases (docs/design.md#capacity-leases).
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityResource {
    pub name: String,
    pub default: capacity::CapacityConfig,
    /// Domains with a capacity of their own.
    pub domains: HashMap<String, capacity::CapacityConfig>,
    /// Its capacity is a lease from the parent server (`--parent`), at
    /// most the configured one (docs/design.md#a-hierarchy-of-servers).
    pub from_parent: bool,
}

impl CapacityResource {
    /// The configuration that applies to `domain`.
    pub fn config_for(&self, domain: &str) -> &capacity::CapacityConfig {
        self.domains.get(domain).unwrap_or(&self.default)
    }
}

/// A rate-limited resource: burst tiers with hard and global limits.
#[derive(Debug, Clone, PartialEq)]
pub struct RateResource {
    pub name: String,
    /// G: hits per second across all domains.
    pub global_limit: Option<u64>,
    pub default: Arc<RatePolicy>,
    /// Domain-specific configurations: replace the default whole.
    pub domains: HashMap<String, Arc<RatePolicy>>,
    /// Past it (of the current tier's window), granted answers warn.
    pub soft_limit: Option<SoftLimit>,
    /// Instead of the default policy's tiers, another algorithm (domains
    /// with their own policy keep theirs).
    pub alternative: Option<ResourceLimit>,
}

/// A ban as Cloud Armor defines it (`ban: {…, mode: cloud_armor}`; the
/// engine's `ban.rs` decides it): up to `limit` hits in an interval of
/// `window` ms from a client's first, then banned to the interval's end
/// plus `duration` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BanLimit {
    pub limit: u64,
    pub window: u64,
    pub duration: u64,
}

/// A resource's algorithm other than burst tiers or a token bucket
/// (docs/configuration.md#other-algorithms-on-a-resource): one key per
/// domain, answered as tier 1 (a Cloud Armor ban's ban as tier 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceLimit {
    /// `ban: {…, mode: cloud_armor}`.
    Ban(BanLimit),
    /// `hybrid: {quota, window}`.
    Hybrid { quota: u64, window: u64 },
    /// `sliding_window: {limit, window}`.
    SlidingWindow { limit: u64, window: u64 },
    /// `sliding_log: {limit, window, count_rejected}`.
    SlidingLog {
        limit: u64,
        window: u64,
        count_rejected: bool,
    },
    /// `budget: {limit, window, initial_cost, max_charge}`: a cost known
    /// after the response, as `cost: after_response` on a descriptor.
    Budget {
        limit: u64,
        window: u64,
        initial_cost: u64,
        max_charge: u64,
    },
}

impl RateResource {
    /// The policy that applies to `domain`.
    pub fn policy_for(&self, domain: &str) -> &Arc<RatePolicy> {
        self.domains.get(domain).unwrap_or(&self.default)
    }
}

/// The per-domain part of a rate configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatePolicy {
    /// H: hits per second for one domain, across tiers.
    pub hard_limit: Option<u64>,
    /// One-indexed in docs/design.md#burst-tiers; index 0 here is tier 1.
    pub tiers: Vec<Tier>,
    /// Instead of tiers: a token bucket (`burst`, `count`, `period`;
    /// docs/design.md#gcra), with H and G still applying.
    pub gcra: Option<GcraLimit>,
}

/// A GCRA limit: `count` per `period` ms, bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraLimit {
    pub count: u64,
    pub period: u64,
    pub burst: u64,
}

/// One burst tier, normalized: `window <= active`, and a finite `active` is a
/// whole number of windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tier {
    pub limit: u64,
    pub window: Millis,
    pub active: Millis,
    pub cooldown: Millis,
    pub skippable: bool,
}

/// A copy-limited resource (served by a later issue; loaded and validated now).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyResource {
    pub name: String,
    pub domain_limit: u64,
    pub global_limit: Option<u64>,
    pub domains: HashMap<String, u64>,
    pub groups: Vec<CopyGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyGroup {
    pub name: String,
    pub limit: u64,
    pub domains: HashSet<String>,
}

/// A fixed-window limit on a descriptor leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedLimit {
    pub requests_per_unit: u64,
    pub unit: Unit,
    /// The window is this many units long (envoyproxy/ratelimit's
    /// `unit_multiplier`; 1 by default).
    pub unit_multiplier: u64,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    /// How hits are counted: a fixed window, or GCRA.
    pub algorithm: Algorithm,
    /// Past it, granted answers carry a warning (docs/design.md#soft-limits).
    pub soft_limit: Option<SoftLimit>,
    /// Every hit is counted, rejected or not, as envoyproxy/ratelimit
    /// counts (fixed windows only; docs/configuration.md#counting-rejected-hits).
    pub count_rejected: bool,
    /// Shared by every server of a hierarchy (docs/design.md#global-limits).
    pub global: bool,
    /// With [`Algorithm::Calendar`]: the calendar whose windows it counts in.
    pub calendar: Option<calendar::Calendar>,
}

/// A soft limit (docs/design.md#soft-limits): granted requests
/// past it are still granted, with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftLimit {
    /// Past this many in use.
    Count(u64),
    /// Past this percentage (1 to 100) of the limit in use.
    Percent(u64),
}

impl SoftLimit {
    /// Whether `used` of `limit` is past the soft limit.
    pub fn exceeded(&self, used: u64, limit: u64) -> bool {
        let threshold = match *self {
            SoftLimit::Count(count) => count,
            SoftLimit::Percent(percent) => {
                u64::try_from(u128::from(limit) * u128::from(percent) / 100).unwrap_or(u64::MAX)
            }
        };
        used > threshold
    }
}

/// The algorithm of a descriptor's `rate_limit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Algorithm {
    /// envoyproxy/ratelimit's: a window aligned to the epoch.
    #[default]
    FixedWindow,
    /// A token bucket (docs/design.md#gcra): `requests_per_unit` per unit,
    /// up to `burst` at once.
    Gcra { burst: u64 },
    /// The sliding window counter (docs/design.md#sliding-windows): this
    /// window's count plus the last one's, weighted by how much of it the
    /// sliding window still covers.
    SlidingWindow,
    /// The sliding window log (docs/design.md#sliding-logs): every hit of
    /// the trailing window, exactly.
    SlidingLog,
    /// A fixed window on the calendar (docs/design.md#calendar-windows): a
    /// day, week, month or year in a time zone, its rule in the limit's
    /// `calendar`.
    Calendar,
    /// The hybrid quota-linear limiter (docs/design.md#hybrid-quota-linear):
    /// bursts of up to a quota per window until a client spends it all, then
    /// an even rate until it has saved a whole quota again.
    Hybrid,
    /// `cost: after_response` (docs/design.md#costs-known-after-the-response):
    /// a fixed window of cost units, charged after the response and checked
    /// with the cost of the requests in flight predicted.
    AfterResponse {
        /// What one request is predicted to cost before any was charged.
        initial_cost: u64,
        /// The largest charge accepted.
        max_charge: u64,
    },
    /// `max_hold` (docs/design.md#concurrency-limits): a hit is held until
    /// it is given back, or for `max_hold` ms at most.
    MaxHold { max_hold: u64 },
}

impl Algorithm {
    /// As `algorithm:` names it (or the field that makes it, for the kinds
    /// no `algorithm:` names).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow | Algorithm::AfterResponse { .. } => "fixed_window",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Hybrid => "hybrid",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Calendar => "calendar",
            Algorithm::MaxHold { .. } => "max_hold",
        }
    }

    /// As a configuration writes it, for messages: `` `algorithm: gcra` ``,
    /// `` `calendar` `` for a calendar window, `` `max_hold` `` for a
    /// concurrency limit.
    pub fn as_written(&self) -> String {
        match self {
            Algorithm::Calendar => "`calendar`".to_owned(),
            Algorithm::MaxHold { .. } => "`max_hold`".to_owned(),
            other => format!("`algorithm: {}`", other.name()),
        }
    }

    /// Whether `count_rejected` may record refused hits: only where a
    /// refused hit is something to remember (a window's count, a log).
    pub fn may_count_rejected(&self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingLog)
    }

    /// Whether `global` may share the limit across a hierarchy: only for
    /// counts a parent can split (docs/design.md#global-limits).
    pub fn may_be_global(&self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }
}

impl FixedLimit {
    /// The window's length.
    pub fn period(&self) -> u64 {
        self.unit.millis().saturating_mul(self.unit_multiplier)
    }
}

/// envoyproxy/ratelimit's time units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}
