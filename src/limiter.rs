//! The limiter: one engine and one access history behind every face of
//! Charon. It holds the current configuration (swapped atomically on reload)
//! and a store; it turns an Envoy-style request (namespace + descriptors) into
//! an engine batch, and the decision into per-descriptor statuses
//! (docs/design.md#envoy-answers).
//!
//! ```rust
//! # tokio_test_block_on(async {
//! use charon::limiter::{Limiter, RateLimitRequest, Descriptor};
//! let yaml = "domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
//! let config = charon::config::load_str(yaml, "shop.yaml").unwrap().config;
//! let limiter = Limiter::new(config, charon::store::MemoryStore::new());
//! let request = RateLimitRequest::new("shop", vec![Descriptor::new([("tenant", "acme")])]);
//! assert!(!limiter.should_rate_limit(request.clone()).await.unwrap().over_limit);
//! assert!(limiter.should_rate_limit(request).await.unwrap().over_limit);
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let waker = std::task::Waker::noop();
//! #     let mut cx = std::task::Context::from_waker(&waker);
//! #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
//! # }
//! ```

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use crate::config::{
    Algorithm, Config, FixedLimit, Leaf, Metadata, Namespace, Node, RateResource, Resource,
    SoftLimit, Unit, duration,
};
use crate::engine::{Decision, GcraLimit, Item, Outcome, SlotKind, TierOutcome, keys};
use crate::store::{Batch, Store, StoreError};
use crate::watch::{Recent, Watch};

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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Over its limit, but reported OK: shadow mode or `ignore_configured`.
    pub shadowed: bool,
    /// envoyproxy/ratelimit's statistics key of the matched limit
    /// (`domain.key_value…`), which `detailed_metric` and `value_to_metric`
    /// shape; the per-limit metrics are labelled with it.
    pub stats_key: Option<Arc<str>>,
}

impl DescriptorStatus {
    fn unlimited(remaining: u64) -> Self {
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
            shadowed: false,
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

/// What a descriptor resolved to.
enum Resolved<'c> {
    NotLimited,
    Unlimited {
        name: Option<&'c str>,
        replaces: &'c [String],
        stats: Arc<str>,
    },
    Fixed {
        limit: FixedLimitRef<'c>,
        shadow: bool,
        shared_values: SmallVec<[Option<&'c str>; 4]>,
        /// `None` for a limit sent with the request.
        node: Option<&'c Node>,
        stats: Arc<str>,
    },
    Resource {
        rate: &'c RateResource,
        shadow: bool,
        node: &'c Node,
        stats: Arc<str>,
    },
}

impl<'c> Resolved<'c> {
    /// The per-limit metric key, where a limit matched.
    fn stats(&self) -> Option<&Arc<str>> {
        match self {
            Resolved::NotLimited => None,
            Resolved::Unlimited { stats, .. }
            | Resolved::Fixed { stats, .. }
            | Resolved::Resource { stats, .. } => Some(stats),
        }
    }

    /// The configuration node that matched, if a limit applies.
    fn node(&self) -> Option<&'c Node> {
        match self {
            Resolved::Fixed { node, .. } => *node,
            Resolved::Resource { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The limit's `name`, for `replaces`.
    fn name(&self) -> Option<&'c str> {
        match self {
            Resolved::Unlimited { name, .. } => *name,
            Resolved::Fixed {
                limit: FixedLimitRef::Configured(limit),
                ..
            } => limit.name.as_deref(),
            _ => None,
        }
    }

    /// The names of the limits this one replaces.
    fn replaces(&self) -> impl Iterator<Item = &'c str> + use<'c> {
        let replaces: &'c [String] = match self {
            Resolved::Unlimited { replaces, .. } => replaces,
            Resolved::Fixed {
                limit: FixedLimitRef::Configured(limit),
                ..
            } => &limit.replaces,
            _ => &[],
        };
        replaces.iter().map(String::as_str)
    }
}

enum FixedLimitRef<'c> {
    Configured(&'c FixedLimit),
    Override(LimitOverride),
}

impl FixedLimitRef<'_> {
    fn period(&self) -> u64 {
        match self {
            FixedLimitRef::Configured(l) => l.period(),
            FixedLimitRef::Override(o) => o.unit.millis(),
        }
    }
    fn requests_per_unit(&self) -> u64 {
        match self {
            FixedLimitRef::Configured(l) => l.requests_per_unit,
            FixedLimitRef::Override(o) => o.requests_per_unit,
        }
    }
    fn unit(&self) -> Unit {
        match self {
            FixedLimitRef::Configured(l) => l.unit,
            FixedLimitRef::Override(o) => o.unit,
        }
    }
    fn name(&self) -> Option<&String> {
        match self {
            FixedLimitRef::Configured(l) => l.name.as_ref(),
            FixedLimitRef::Override(_) => None,
        }
    }
    /// A limit sent with the request has no soft limit.
    fn soft_limit(&self) -> Option<SoftLimit> {
        match self {
            FixedLimitRef::Configured(l) => l.soft_limit,
            FixedLimitRef::Override(_) => None,
        }
    }
    /// A limit sent with the request is a fixed window, as in
    /// envoyproxy/ratelimit.
    fn algorithm(&self) -> Algorithm {
        match self {
            FixedLimitRef::Configured(l) => l.algorithm,
            FixedLimitRef::Override(_) => Algorithm::FixedWindow,
        }
    }
}

/// Decides requests against the current configuration and a store.
pub struct Limiter<S> {
    config: ArcSwap<Config>,
    store: S,
    watch: Watch,
    modes: Modes,
}

impl<S: Store> Limiter<S> {
    pub fn new(config: Config, store: S) -> Self {
        Self {
            config: ArcSwap::from_pointee(config),
            store,
            watch: Watch::default(),
            modes: Modes::default(),
        }
    }

    /// The same limiter with process-wide `modes`.
    pub fn with_modes(mut self, modes: Modes) -> Self {
        self.modes = modes;
        self
    }

    /// Replaces the configuration; requests in flight finish on the old one.
    pub fn replace_config(&self, config: Config) {
        self.config.store(Arc::new(config));
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The recent decisions of what the state view looks at.
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Envoy's `ShouldRateLimit`, with Charon's semantics
    /// (docs/design.md#envoy-answers).
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitAnswer, LimitError> {
        validate(&request)?;
        let config = self.config.load_full();
        let Some(namespace) = config.namespace(&request.domain) else {
            return Ok(RateLimitAnswer {
                over_limit: false,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| DescriptorStatus::unlimited(0))
                    .collect(),
                namespace_known: false,
                shadowed: false,
            });
        };
        let default_hits = if request.hits_addend == 0 {
            1
        } else {
            request.hits_addend
        };
        let resolved = resolve_all(namespace, &request);

        let mut batch = Batch::default();
        let mut item_of: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        let quotas: SmallVec<[bool; 4]> = resolved.iter().map(|r| self.is_quota(r)).collect();
        for ((descriptor, resolved), &quota) in
            request.descriptors.iter().zip(&resolved).zip(&quotas)
        {
            let hits = descriptor.hits_addend.unwrap_or(default_hits);
            item_of.push(add_item(
                &mut batch, namespace, descriptor, resolved, hits, quota,
            ));
        }
        let decision = if batch.items.is_empty() {
            None
        } else {
            Some(self.store.decide(batch).await?)
        };

        if let Some(decision) = &decision
            && self.watch.is_open()
        {
            self.record_resources(namespace, &request, &resolved, &item_of, decision);
        }
        let ignore = namespace.settings.ignore_configured;
        let statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .zip(&resolved)
            .zip(&item_of)
            .zip(&quotas)
            .map(|(((descriptor, resolved), item), &quota)| {
                let outcome = item.and_then(|i| decision.as_ref().map(|d| &d.outcomes[i]));
                let mut status = status(resolved, outcome, ignore);
                status.quota = quota;
                status.metadata = resolved.node().and_then(|node| node.metadata.clone());
                status.hits = descriptor.hits_addend.unwrap_or(default_hits);
                status.stats_key = resolved.stats().cloned();
                status
            })
            .collect();
        let over_limit = !ignore && over_limit(&resolved, &statuses);
        Ok(RateLimitAnswer {
            over_limit: over_limit && !self.modes.shadow,
            shadowed: over_limit && self.modes.shadow,
            statuses,
            namespace_known: true,
        })
    }

    /// Whether a descriptor is a quota descriptor: its node says so, or the
    /// process does for every descriptor that is not unlimited.
    fn is_quota(&self, resolved: &Resolved<'_>) -> bool {
        match resolved {
            Resolved::Unlimited { .. } => false,
            _ => self.modes.quota || resolved.node().is_some_and(|node| node.quota_mode),
        }
    }
}

/// envoyproxy/ratelimit's overall code: over when a descriptor that is not a
/// quota descriptor is over, or when there are quota descriptors and every
/// one is over. Unlimited descriptors take no part; with the process-wide
/// quota mode, a descriptor without a limit is a quota descriptor that
/// passed.
fn over_limit(resolved: &[Resolved<'_>], statuses: &[DescriptorStatus]) -> bool {
    let (mut quotas, mut quotas_over) = (0usize, 0usize);
    for (resolved, status) in resolved.iter().zip(statuses) {
        if matches!(resolved, Resolved::Unlimited { .. }) {
            continue;
        }
        if !status.quota {
            if status.over_limit {
                return true;
            }
            continue;
        }
        quotas += 1;
        if status.over_limit {
            quotas_over += 1;
        }
    }
    quotas > 0 && quotas == quotas_over
}

impl<S: Store> Limiter<S> {
    /// Envoy's decisions on resources, for the state view's watches.
    fn record_resources(
        &self,
        namespace: &Namespace,
        request: &RateLimitRequest,
        resolved: &[Resolved<'_>],
        item_of: &[Option<usize>],
        decision: &Decision,
    ) {
        let default_hits = if request.hits_addend == 0 {
            1
        } else {
            request.hits_addend
        };
        for ((descriptor, resolved), item) in request.descriptors.iter().zip(resolved).zip(item_of)
        {
            if let (Resolved::Resource { rate, .. }, Some(item)) = (resolved, item)
                && let Some(Outcome::Tiers(outcome)) = decision.outcomes.get(*item)
            {
                let domain = descriptor.entries.last().map_or("", |(_, v)| v.as_str());
                let hits = descriptor.hits_addend.unwrap_or(default_hits);
                self.watch.record(&namespace.name, &rate.name, domain, || {
                    recent(decision.now, "envoy", outcome, hits)
                });
            }
        }
    }

    /// Hits on one rate-limited resource for one domain (the Charon API's
    /// `request`): the largest `k` in `[min_copies, copies]`, or nothing.
    /// `ignore_configured` grants and still counts what fits.
    pub async fn request_hits(
        &self,
        namespace: &Namespace,
        rate: &RateResource,
        domain: &str,
        copies: u64,
        min_copies: u64,
    ) -> Result<(TierOutcome, bool), StoreError> {
        let mut batch = Batch::default();
        let item = tiers_item(
            &mut batch,
            &namespace.name,
            rate,
            domain,
            copies,
            min_copies,
            namespace.settings.ignore_configured,
        );
        batch.items.push(item);
        let decision = self.store.decide(batch).await?;
        match decision.outcomes.first() {
            Some(Outcome::Tiers(outcome)) => {
                self.watch.record(&namespace.name, &rate.name, domain, || {
                    recent(decision.now, "request", outcome, copies)
                });
                Ok((*outcome, decision.degraded))
            }
            _ => Err(StoreError::Unavailable(
                "the store answered another kind of decision".into(),
            )),
        }
    }
}

/// A decision on a resource as the state view shows it: asking for 0 hits
/// is a check (granted: it would fit); a rejection shows the hits asked.
fn recent(at_ms: u64, op: &'static str, outcome: &TierOutcome, asked: u64) -> Recent {
    let check = asked == 0;
    Recent {
        at_ms,
        op: if check { "check" } else { op },
        granted: if check {
            !outcome.over
        } else {
            outcome.granted > 0
        },
        copies: if outcome.granted > 0 {
            outcome.granted
        } else {
            asked
        },
        tier: outcome.snapshot.tier,
    }
}

fn validate(request: &RateLimitRequest) -> Result<(), LimitError> {
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

fn resolve_all<'c>(
    namespace: &'c Namespace,
    request: &RateLimitRequest,
) -> SmallVec<[Resolved<'c>; 2]> {
    let mut resolved: SmallVec<[Resolved<'c>; 2]> = request
        .descriptors
        .iter()
        .map(|descriptor| resolve(namespace, descriptor))
        .collect();
    // envoyproxy/ratelimit: a limit whose name another matched limit
    // `replaces` does not apply.
    let replaced: HashSet<&str> = resolved.iter().flat_map(Resolved::replaces).collect();
    if !replaced.is_empty() {
        for entry in &mut resolved {
            if entry.name().is_some_and(|name| replaced.contains(name)) {
                *entry = Resolved::NotLimited;
            }
        }
    }
    resolved
}

fn resolve<'c>(namespace: &'c Namespace, descriptor: &Descriptor) -> Resolved<'c> {
    if let Some(limit) = descriptor.limit {
        // As in envoyproxy/ratelimit: a limit sent with the request wins
        // over the configuration, and is never in shadow mode.
        // upstream's key for it: the request's own keys and values.
        let mut stats = namespace.name.clone();
        for (key, value) in &descriptor.entries {
            stats.push('.');
            stats.push_str(key);
            if !value.is_empty() {
                stats.push('_');
                stats.push_str(value);
            }
        }
        return Resolved::Fixed {
            limit: FixedLimitRef::Override(limit),
            shadow: false,
            shared_values: SmallVec::new(),
            node: None,
            stats: Arc::from(stats),
        };
    }
    let entries = descriptor
        .entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()));
    let Some(found) = namespace.descriptors.find(entries) else {
        return Resolved::NotLimited;
    };
    let node = found.node;
    let stats = || found.stats_key(&namespace.name, &descriptor.entries);
    match &node.leaf {
        Leaf::None => Resolved::NotLimited,
        Leaf::Unlimited { name, replaces } => Resolved::Unlimited {
            name: name.as_deref(),
            replaces,
            stats: stats(),
        },
        Leaf::Limit(limit) => Resolved::Fixed {
            limit: FixedLimitRef::Configured(limit),
            shadow: node.shadow_mode,
            stats: stats(),
            shared_values: found.shared_values,
            node: Some(node),
        },
        Leaf::Resource(name) => match namespace.resources.get(name) {
            Some(Resource::Rate(rate)) => Resolved::Resource {
                rate,
                shadow: node.shadow_mode,
                node,
                stats: stats(),
            },
            // Loading guarantees a leaf names a rate-limited resource.
            _ => Resolved::NotLimited,
        },
    }
}

fn add_item<'c>(
    batch: &mut Batch<'c>,
    namespace: &Namespace,
    descriptor: &Descriptor,
    resolved: &Resolved<'c>,
    hits: u64,
    quota: bool,
) -> Option<usize> {
    // `ignore_configured`: nothing is rejected, but what fits is counted and
    // the real state reported, exactly as for shadow-mode descriptors. A
    // quota descriptor does not reject on its own either: the limiter
    // decides over all of them together once the batch is decided.
    let ignore = namespace.settings.ignore_configured || quota;
    let item = match resolved {
        Resolved::NotLimited | Resolved::Unlimited { .. } => return None,
        Resolved::Fixed {
            limit,
            shadow,
            shared_values,
            ..
        } => {
            let period = limit.period();
            let entries = descriptor.entries.iter().enumerate().map(|(i, (k, v))| {
                let value = shared_values
                    .get(i)
                    .copied()
                    .flatten()
                    .unwrap_or(v.as_str());
                (k.as_str(), value)
            });
            match limit.algorithm() {
                Algorithm::FixedWindow => {
                    let key = keys::window_key(&namespace.name, entries, period);
                    Item::Window {
                        slot: batch.slot(key, SlotKind::Window),
                        limit: limit.requests_per_unit(),
                        period,
                        hits,
                        shadow: *shadow || ignore,
                    }
                }
                Algorithm::Gcra { burst } => {
                    let key = keys::gcra_key(&namespace.name, entries, period);
                    Item::Gcra {
                        slot: batch.slot(key, SlotKind::Gcra),
                        limit: GcraLimit {
                            count: limit.requests_per_unit(),
                            period,
                            burst,
                        },
                        hits,
                        shadow: *shadow || ignore,
                    }
                }
            }
        }
        Resolved::Resource { rate, shadow, .. } => {
            // The domain is the value of the descriptor's last entry.
            let domain = descriptor.entries.last().map_or("", |(_, v)| v.as_str());
            tiers_item(
                batch,
                &namespace.name,
                rate,
                domain,
                hits,
                hits.max(1),
                *shadow || ignore,
            )
        }
    };
    batch.items.push(item);
    Some(batch.items.len() - 1)
}

/// A burst-tier item for `domain` of `rate`, its keys added to `batch`:
/// `copies` hits (0: only check whether one more would pass), at least
/// `min_copies` of them or none.
fn tiers_item<'c>(
    batch: &mut Batch<'c>,
    namespace: &str,
    rate: &'c RateResource,
    domain: &str,
    copies: u64,
    min_copies: u64,
    shadow: bool,
) -> Item<'c> {
    let has_global = rate.global_limit.is_some();
    let slot = batch.slot(
        keys::tiers_key(namespace, &rate.name, domain, has_global),
        SlotKind::Tiers,
    );
    let global_slot = rate
        .global_limit
        .map(|_| batch.slot(keys::global_key(namespace, &rate.name), SlotKind::Log));
    Item::Tiers {
        slot,
        global_slot,
        policy: rate.policy_for(domain),
        global_limit: rate.global_limit,
        copies: copies.max(1),
        min_copies: min_copies.max(1),
        check_only: copies == 0,
        shadow,
    }
}

/// `<resource>/tier<N>/<window>`: Envoy's units cannot say "10 s", so the
/// name carries the tier's real window (Envoy shows it in X-RateLimit-Limit).
fn tier_name(resource: &str, tier: usize, window: u64) -> String {
    let mut name = String::with_capacity(resource.len() + 16);
    name.push_str(resource);
    name.push_str("/tier");
    name.push_str(itoa::Buffer::new().format(tier));
    name.push('/');
    duration::write(&mut name, window);
    name
}

fn status(resolved: &Resolved<'_>, outcome: Option<&Outcome>, ignore: bool) -> DescriptorStatus {
    let mut status = match (resolved, outcome) {
        (Resolved::Unlimited { .. }, _) => DescriptorStatus::unlimited(u64::from(u32::MAX)),
        (Resolved::Fixed { limit, shadow, .. }, Some(Outcome::Window(w))) => DescriptorStatus {
            over_limit: w.over && !shadow,
            limit: Some(CurrentLimit {
                name: limit.name().cloned(),
                requests_per_unit: limit.requests_per_unit(),
                unit: limit.unit(),
                window_ms: limit.period(),
            }),
            remaining: if w.over { 0 } else { w.remaining },
            reset_after_ms: Some(if w.over {
                w.wait.unwrap_or(w.reset_after)
            } else {
                w.reset_after
            }),
            tiers: None,
            shadowed: w.over && *shadow,
            soft_limit_exceeded: !w.over
                && limit.soft_limit().is_some_and(|soft| {
                    soft.exceeded(w.limit.saturating_sub(w.remaining), w.limit)
                }),
            ..DescriptorStatus::unlimited(0)
        },
        (Resolved::Fixed { limit, shadow, .. }, Some(Outcome::Gcra(g))) => DescriptorStatus {
            over_limit: g.over && !shadow,
            limit: Some(CurrentLimit {
                name: limit.name().cloned(),
                requests_per_unit: limit.requests_per_unit(),
                unit: limit.unit(),
                window_ms: limit.period(),
            }),
            remaining: if g.over { 0 } else { g.remaining },
            // Rejected: when these hits pass (never: a period from now);
            // granted: when the bucket is full again (TAT - now),
            // docs/design.md#resets.
            reset_after_ms: Some(if g.over {
                g.wait.unwrap_or(limit.period())
            } else {
                g.reset_after
            }),
            tiers: None,
            // In use: the burst not available now.
            shadowed: g.over && *shadow,
            soft_limit_exceeded: !g.over
                && match (limit.soft_limit(), limit.algorithm()) {
                    (Some(soft), Algorithm::Gcra { burst }) => {
                        soft.exceeded(burst.saturating_sub(g.remaining), burst)
                    }
                    _ => false,
                },
            ..DescriptorStatus::unlimited(0)
        },
        (Resolved::Resource { rate, shadow, .. }, Some(Outcome::Tiers(t))) => DescriptorStatus {
            over_limit: t.over && !shadow,
            limit: Some(CurrentLimit {
                name: Some(tier_name(
                    &rate.name,
                    t.snapshot.shown_tier,
                    t.snapshot.tier_window,
                )),
                requests_per_unit: t.snapshot.tier_limit,
                unit: Unit::covering(t.snapshot.tier_window),
                window_ms: t.snapshot.tier_window,
            }),
            remaining: if t.over { 0 } else { t.snapshot.remaining },
            // Rejected and never to fit: a window of the shown tier.
            reset_after_ms: Some(if t.over {
                t.wait.unwrap_or(t.snapshot.tier_window)
            } else {
                t.snapshot.reset_after
            }),
            tiers: Some(*t),
            // The current tier's window fill.
            shadowed: t.over && *shadow,
            soft_limit_exceeded: !t.over
                && rate
                    .soft_limit
                    .is_some_and(|soft| soft.exceeded(t.snapshot.tier_hits, t.snapshot.tier_limit)),
            ..DescriptorStatus::unlimited(0)
        },
        _ => DescriptorStatus::unlimited(0),
    };
    if ignore {
        status.shadowed |= status.over_limit;
        status.over_limit = false;
    }
    status
}
