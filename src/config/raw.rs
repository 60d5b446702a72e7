//! The configuration file exactly as written: serde types that mirror the
//! YAML, with source locations kept on the nodes that validation may need to
//! point at. Normalization rewrites these in place (so `charon check` can print
//! the normalized file back); compilation turns them into [`super::Namespace`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};

/// One file: one namespace.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawFile {
    pub domain: Spanned<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<RawSettings>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub descriptors: Vec<RawDescriptor>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub resources: BTreeMap<String, Spanned<RawResource>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSettings {
    #[serde(default)]
    pub ignore_configured: bool,
    #[serde(default)]
    pub allow_unconfigured: bool,
    /// Record use per domain so that a limit can be proposed from it
    /// (docs/configuration.md#learning-a-limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learn: Option<Spanned<RawLearn>>,
}

/// `settings.learn`: each field optional, with its default.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLearn {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Spanned<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<Spanned<i64>>,
}

/// An envoyproxy/ratelimit descriptor, plus Charon's `resource:` leaf.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    pub key: Spanned<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<Spanned<RawRateLimit>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit: the per-limit metric key carries the request's
    /// own values (docs/envoy-compatibility.md, "Per-limit metrics").
    #[serde(default, skip_serializing_if = "is_false")]
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit: this level's request value appears in the
    /// per-limit metric key.
    #[serde(default, skip_serializing_if = "is_false")]
    pub value_to_metric: bool,
    /// envoyproxy/ratelimit: over this limit, a request is rejected only when
    /// every quota descriptor in it is over.
    #[serde(default, skip_serializing_if = "is_false")]
    pub quota_mode: bool,
    /// envoyproxy/ratelimit: returned in the response's `dynamic_metadata`
    /// for descriptors that matched (when the server is asked to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, MetaValue>>,
    /// On a wildcard entry: every value it matches shares one counter.
    #[serde(default, skip_serializing_if = "is_false")]
    pub share_threshold: bool,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub replaces: Vec<RawReplace>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_unit: Option<Spanned<i64>>,
    /// envoyproxy/ratelimit: the window is `unit_multiplier` units long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_multiplier: Option<Spanned<i64>>,
    /// Charon: `fixed_window` (the default) or `gcra`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Spanned<String>>,
    /// Charon, GCRA only: requests allowed at once (default: requests_per_unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Spanned<i64>>,
    /// Charon: warn past this many (or this share, `80%`) of the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_limit: Option<RawSoftLimit>,
    /// Charon, fixed windows only: count every hit, rejected or not, as
    /// envoyproxy/ratelimit does (docs/configuration.md#counting-rejected-hits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_rejected: Option<Spanned<bool>>,
    /// Charon: the window is the calendar's day, week, month or year in a
    /// time zone (docs/configuration.md#calendar-windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calendar: Option<Spanned<RawCalendar>>,
    /// Charon: one limit shared by the servers of a hierarchy, each with a
    /// share that follows its demand (docs/design.md#global-limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<Spanned<bool>>,
    /// Charon, with `global`: what each server may admit while its parent
    /// is away, once its last share expired: `last` (the default: its last
    /// grant, kept), `split` (the parent's equal split), `whole`, a count
    /// or a share of the
    /// limit (`25%`) (docs/design.md#global-limits, "The parent away").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_share: Option<Spanned<RawSafeShare>>,
    /// Charon: a concurrency limit, each hit held until it is given back
    /// (Envoy's `is_negative_hits`) or for this long at most
    /// (docs/design.md#concurrency-limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hold: Option<Spanned<String>>,
    /// Charon: `after_response`, a cost charged when the response ends
    /// (docs/configuration.md#costs-known-after-the-response).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<Spanned<String>>,
    /// With `cost: after_response`: one request's predicted cost before any
    /// was charged (default: 1% of the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_cost: Option<Spanned<i64>>,
    /// With `cost: after_response`: the largest charge accepted (default:
    /// the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_charge: Option<Spanned<i64>>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub unlimited: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplace {
    pub name: String,
}

/// A Charon resource: exactly one of `rate`, `copies` and `capacity`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawResource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RawRate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<RawCopies>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<RawCapacity>,
}

/// A capacity shared out in leases (docs/design.md#capacity-leases):
/// `capacity: {capacity: 1000, algorithm: fair_share, lease: 60s,
/// refresh_interval: 5s, safe_capacity: 10, learning: 20s}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCapacity {
    pub capacity: Spanned<f64>,
    /// `none`, `static`, `proportional_share` or `fair_share` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Spanned<String>>,
    /// `static` only: the most one client gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<Spanned<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_interval: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_capacity: Option<Spanned<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning: Option<Spanned<String>>,
    /// The capacity is leased from the parent server (`--parent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_parent: Option<Spanned<bool>>,
    /// Per-domain capacities (the rest of the settings are the resource's).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub domains: BTreeMap<String, Spanned<RawDomainCapacity>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomainCapacity {
    pub capacity: Spanned<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub safe_capacity: Option<Spanned<f64>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawRate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_limit: Option<Spanned<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_limit: Option<Spanned<i64>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tiers: Vec<Spanned<RawTier>>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub domains: BTreeMap<String, Spanned<RawDomainRate>>,
    /// Charon: warn past this many (or this share) of the current tier's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_limit: Option<RawSoftLimit>,
    /// Charon shorthand (docs/design.md#bans): normalized into two tiers at
    /// load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<Spanned<RawBan>>,
    /// A token bucket instead of tiers (docs/design.md#gcra).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcra: Option<Spanned<RawGcra>>,
    /// The hybrid quota-linear limiter instead of tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<Spanned<RawHybrid>>,
    /// A sliding window counter instead of tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<Spanned<RawSliding>>,
    /// A sliding window log instead of tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_log: Option<Spanned<RawSliding>>,
    /// A budget of a cost known after the response instead of tiers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Spanned<RawBudget>>,
}

/// `budget: {limit: 100000, window: 1m, initial_cost: 1000, max_charge:
/// 20000}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    pub limit: Spanned<i64>,
    pub window: Spanned<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_cost: Option<Spanned<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_charge: Option<Spanned<i64>>,
}

/// `hybrid: {quota: 60, window: 1m}`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawHybrid {
    pub quota: Spanned<i64>,
    pub window: Spanned<String>,
}

/// `calendar: {time_zone, starts_on}` on a rate limit.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCalendar {
    /// An IANA name; `UTC` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<Spanned<String>>,
    /// With `unit: month`: the day of the month a window starts on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_on: Option<Spanned<i64>>,
}

/// `sliding_window: {limit: 100, window: 1m}`, or `sliding_log:` with
/// `count_rejected: true` to log refused hits too.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawSliding {
    pub limit: Spanned<i64>,
    pub window: Spanned<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_rejected: Option<Spanned<bool>>,
}

/// `gcra: {burst: 20, count: 20, period: 1s}` (docs/design.md#gcra):
/// `count` per `period` on average, up to `burst` at once (default `count`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGcra {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Spanned<i64>>,
    pub count: Spanned<i64>,
    pub period: Spanned<String>,
}

/// `ban: {limit: 2000, window: 1200s, duration: 3600s}`: more than `limit`
/// hits in `window`, and the domain is banned for `duration`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawBan {
    pub limit: Spanned<i64>,
    pub window: Spanned<String>,
    pub duration: Spanned<String>,
    /// `prison` (the default: two tiers, the tripping hit granted) or
    /// `cloud_armor` (the tripping hit refused, banned from the interval's
    /// end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Spanned<String>>,
}

/// Any YAML value under `metadata:`, kept as written.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum MetaValue {
    Null,
    Bool(bool),
    Number(f64),
    String(String),
    List(Vec<MetaValue>),
    Map(BTreeMap<String, MetaValue>),
}

/// `safe_share: last`, `split`, `whole`, `30` or `"25%"`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawSafeShare {
    Count(i64),
    Word(String),
}

/// `soft_limit: 8` or `soft_limit: "80%"`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum RawSoftLimit {
    Count(i64),
    Share(String),
}

/// A domain-specific rate configuration: replaces the default one whole.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomainRate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_limit: Option<Spanned<i64>>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tiers: Vec<Spanned<RawTier>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcra: Option<Spanned<RawGcra>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawTier {
    pub limit: Spanned<i64>,
    pub window: Spanned<String>,
    #[serde(default = "forever")]
    pub active: Spanned<String>,
    #[serde(default = "zero")]
    pub cooldown: Spanned<String>,
    #[serde(default)]
    pub skippable: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCopies {
    pub domain_limit: Spanned<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_limit: Option<Spanned<i64>>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub domains: BTreeMap<String, Spanned<i64>>,
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub groups: Vec<Spanned<RawGroup>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroup {
    pub name: Spanned<String>,
    pub limit: Spanned<i64>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub domains: Vec<String>,
}

/// An empty YAML value (`descriptors:` with nothing after it) is an empty
/// list, as in envoyproxy/ratelimit.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn forever() -> Spanned<String> {
    Spanned::new("forever".to_owned(), Location::UNKNOWN, Location::UNKNOWN)
}

fn zero() -> Spanned<String> {
    Spanned::new("0s".to_owned(), Location::UNKNOWN, Location::UNKNOWN)
}
