//! Which configured limit each descriptor of a request falls under.

use std::collections::HashSet;
use std::sync::Arc;

use smallvec::SmallVec;

use super::shares::{GlobalShare, GlobalShares};
use crate::config::{
    Algorithm, FixedLimit, Leaf, Namespace, Node, RateResource, Resource, ResourceLimit, SoftLimit,
    Unit,
};

use super::request::{Descriptor, LimitOverride, RateLimitRequest};

/// What a descriptor resolved to.
pub(super) enum Resolved<'c> {
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
    pub(super) fn stats(&self) -> Option<&Arc<str>> {
        match self {
            Resolved::NotLimited => None,
            Resolved::Unlimited { stats, .. }
            | Resolved::Fixed { stats, .. }
            | Resolved::Resource { stats, .. } => Some(stats),
        }
    }

    /// The configuration node that matched, if a limit applies.
    pub(super) fn node(&self) -> Option<&'c Node> {
        match self {
            Resolved::Fixed { node, .. } => *node,
            Resolved::Resource { node, .. } => Some(node),
            _ => None,
        }
    }

    /// A `cost: after_response` limit's largest charge.
    pub(super) fn max_charge(&self) -> Option<u64> {
        match self {
            Resolved::Fixed { limit, .. } => match limit.algorithm() {
                Algorithm::AfterResponse { max_charge, .. } => Some(max_charge),
                _ => None,
            },
            Resolved::Resource { rate, .. } => match rate.alternative {
                Some(ResourceLimit::Budget { max_charge, .. }) => Some(max_charge),
                _ => None,
            },
            _ => None,
        }
    }

    /// The hits a descriptor asks for: its own `hits_addend`, else the
    /// request's (0 meaning 1, as in envoyproxy/ratelimit), but for a cost
    /// known after the response, where a call that names no cost is a
    /// check (0).
    pub(super) fn hits(&self, descriptor: &Descriptor, request_hits: u64) -> u64 {
        match descriptor.hits_addend {
            Some(hits) => hits,
            None if request_hits == 0 && self.max_charge().is_none() => 1,
            None => request_hits,
        }
    }

    /// The limit's `name`, for `replaces`.
    pub(super) fn name(&self) -> Option<&'c str> {
        match self {
            Resolved::Unlimited { name, .. } => *name,
            Resolved::Fixed { limit, .. } => limit.configured().and_then(|l| l.name.as_deref()),
            _ => None,
        }
    }

    /// The names of the limits this one replaces.
    pub(super) fn replaces(&self) -> impl Iterator<Item = &'c str> + use<'c> {
        let replaces: &'c [String] = match self {
            Resolved::Unlimited { replaces, .. } => replaces,
            Resolved::Fixed { limit, .. } => limit.configured().map_or(&[], |l| &l.replaces),
            _ => &[],
        };
        replaces.iter().map(String::as_str)
    }
}

pub(super) enum FixedLimitRef<'c> {
    Configured(&'c FixedLimit),
    Override(LimitOverride),
    /// A `global` limit: this server's share of it
    /// (docs/design.md#global-limits).
    Global(&'c FixedLimit, Arc<GlobalShare>),
}

impl<'c> FixedLimitRef<'c> {
    /// The limit as configured, if it is not one sent with the request.
    fn configured(&self) -> Option<&'c FixedLimit> {
        match self {
            FixedLimitRef::Configured(l) | FixedLimitRef::Global(l, _) => Some(l),
            FixedLimitRef::Override(_) => None,
        }
    }
    pub(super) fn period(&self) -> u64 {
        match self {
            FixedLimitRef::Configured(l) | FixedLimitRef::Global(l, _) => l.period(),
            FixedLimitRef::Override(o) => o.unit.millis(),
        }
    }
    pub(super) fn requests_per_unit(&self) -> u64 {
        match self {
            FixedLimitRef::Configured(l) => l.requests_per_unit,
            FixedLimitRef::Override(o) => o.requests_per_unit,
            FixedLimitRef::Global(_, share) => share.requests_per_unit(),
        }
    }
    /// A global limit's share, which counts the hits asked of it.
    pub(super) fn global(&self) -> Option<&GlobalShare> {
        match self {
            FixedLimitRef::Global(_, share) => Some(share),
            _ => None,
        }
    }
    pub(super) fn unit(&self) -> Unit {
        match self {
            FixedLimitRef::Configured(l) | FixedLimitRef::Global(l, _) => l.unit,
            FixedLimitRef::Override(o) => o.unit,
        }
    }
    pub(super) fn name(&self) -> Option<&String> {
        self.configured().and_then(|l| l.name.as_ref())
    }
    /// A limit sent with the request has no soft limit.
    /// Whether rejected hits count too (an override sent with a request
    /// follows the process-wide switch alone).
    pub(super) fn calendar(&self) -> Option<&'c crate::config::calendar::Calendar> {
        self.configured().and_then(|l| l.calendar.as_ref())
    }

    pub(super) fn count_rejected(&self) -> bool {
        self.configured().is_some_and(|l| l.count_rejected)
    }

    pub(super) fn soft_limit(&self) -> Option<SoftLimit> {
        self.configured().and_then(|l| l.soft_limit)
    }
    /// A limit sent with the request is a fixed window, as in
    /// envoyproxy/ratelimit.
    pub(super) fn algorithm(&self) -> Algorithm {
        self.configured()
            .map_or(Algorithm::FixedWindow, |l| l.algorithm)
    }
}

pub(super) fn resolve_all<'c>(
    namespace: &'c Namespace,
    request: &RateLimitRequest,
    shares: &GlobalShares,
) -> SmallVec<[Resolved<'c>; 2]> {
    let mut resolved: SmallVec<[Resolved<'c>; 2]> = request
        .descriptors
        .iter()
        .map(|descriptor| resolve(namespace, descriptor, shares))
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

pub(super) fn resolve<'c>(
    namespace: &'c Namespace,
    descriptor: &Descriptor,
    shares: &GlobalShares,
) -> Resolved<'c> {
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
            limit: match &node.global {
                Some(name) => {
                    FixedLimitRef::Global(limit, shares.share(&namespace.name, name, limit))
                }
                None => FixedLimitRef::Configured(limit),
            },
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
