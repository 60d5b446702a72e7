//! The live state view's JSON (`/debug/state`, `/debug/resources`), read
//! from the store the sidecar decides on, without changing it.
//!
//! For a rate-limited resource and one domain: the current tier, each tier's
//! phase and window fill and `retry_after`, read back from the stored state
//! exactly as `charon simulate` reads its own (one function); for a
//! copy-limited one: the holds of the domain, of all domains and of each
//! group, against their limits. Both with the recent decisions of the
//! domain, recorded from the first look on ([`crate::state_view`]). For a
//! global limit (its `rate_limit:` name, any domain): this server's share,
//! how much of it is lent, and whether it is the safe share. It shows
//! counts and limits only: no transfer ids (they are the capability to
//! seize), no store address. The admin port listens on localhost by default.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::clock::{Clock, SystemClock};
use crate::config::{CopyResource, RateResource, Resource};
use crate::engine::SlotKind;
use crate::engine::copies::CopyLimits;
use crate::limiter::{Limiter, caps};
use crate::simulate::{self, TierConfig, TierView};
use crate::state_view::Recent;
use crate::store::ResourceRef;
use crate::store::copies::CopyLog;
use crate::store::keys;
use crate::store::{SlotKey, Store};

use super::simulator::Refusal;
use crate::store::open::SidecarStore;

/// What the state view reads from.
#[derive(Clone)]
pub struct StateSources {
    pub limiter: Arc<Limiter<SidecarStore>>,
    pub copies: Arc<dyn CopyLog>,
    /// Where a (namespace, resource, domain)'s limits come from: a file or
    /// the configuration API (none: files only).
    pub origins: Option<Origins>,
    /// What proposes limits from recorded use (`/debug/learned`; none: not
    /// served).
    pub proposals: Option<Arc<crate::service::Service>>,
}

/// Says where the limits of (namespace, resource, domain) come from.
pub type Origins = Arc<dyn Fn(&str, &str, &str) -> LimitsFrom + Send + Sync>;

/// Where a domain's limits come from.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LimitsFrom {
    /// `file`, `api namespace` or `api override`.
    pub source: &'static str,
    /// The file, or the API path.
    pub path: String,
    /// The API object's version (its ETag).
    pub version: Option<u64>,
}

/// One resource of the configuration.
#[derive(Debug, Serialize)]
pub struct Listed {
    pub namespace: String,
    pub resource: String,
    /// `rate` or `copies`.
    pub kind: &'static str,
}

/// `GET /debug/resources`: every resource of the running configuration.
pub async fn resources(State(sources): State<StateSources>) -> Json<Vec<Listed>> {
    let config = sources.limiter.config();
    let mut listed: Vec<Listed> = config
        .namespaces()
        .flat_map(|namespace| {
            namespace.resources.iter().map(|(name, resource)| Listed {
                namespace: namespace.name.clone(),
                resource: name.clone(),
                kind: match resource {
                    Resource::Rate(_) => "rate",
                    Resource::Copies(_) => "copies",
                    Resource::Capacity(_) => "capacity",
                },
            })
        })
        .collect();
    listed.sort_by(|a, b| (&a.namespace, &a.resource).cmp(&(&b.namespace, &b.resource)));
    Json(listed)
}

#[derive(Debug, Deserialize)]
pub struct Asked {
    namespace: Option<String>,
    resource: Option<String>,
    domain: Option<String>,
}

/// What `/debug/state` shows: the same envelope for every kind.
#[derive(Debug, Serialize)]
struct Shown {
    namespace: String,
    resource: String,
    domain: String,
    store: &'static str,
    now_ms: u64,
    #[serde(flatten)]
    detail: Detail,
    #[serde(skip_serializing_if = "Option::is_none")]
    limits_from: Option<LimitsFrom>,
    recent: Vec<Recent>,
    watching_since_ms: u64,
}

/// `"kind": "rate"` or `"kind": "copies"`, and what that kind shows.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Detail {
    Rate {
        /// Redis was unreachable: this is the in-process fallback's state.
        degraded: bool,
        hard_limit: Option<u64>,
        global_limit: Option<u64>,
        tiers: Vec<TierConfig>,
        state: Reading,
    },
    Copies {
        holds: Holds,
    },
    /// A global limit (`resource` is `rate_limit:` and its descriptor
    /// path; any domain): this server's share of it.
    Global {
        /// The whole limit, per window of `window_ms`.
        limit: u64,
        window_ms: u64,
        /// What this server may admit per window now.
        share: u64,
        /// How much of that is spare capacity lent beyond what it asked for.
        lent: u64,
        /// Whether the share is the safe share: the parent away and its
        /// last grant expired (docs/design.md#global-limits).
        on_safe_share: bool,
    },
}

#[derive(Debug, Serialize)]
struct Reading {
    /// One-indexed; 0 when no tier is active.
    tier: usize,
    tiers: Vec<TierView>,
    retry_after_ms: Option<u64>,
    domain_hits_last_second: u64,
}

#[derive(Debug, Serialize)]
struct Holds {
    domain: u64,
    domain_limit: u64,
    global: u64,
    global_limit: Option<u64>,
    groups: Vec<GroupHolds>,
}

#[derive(Debug, Serialize)]
struct GroupHolds {
    name: String,
    held: u64,
    limit: u64,
    /// Whether the domain is in the group (its holds count there).
    member: bool,
}

/// A query parameter, or why it is refused.
fn parameter(value: Option<String>, name: &str) -> Result<String, String> {
    match value {
        Some(value) if !value.is_empty() && value.len() <= caps::MAX_STRING_BYTES => Ok(value),
        Some(value) if !value.is_empty() => Err(format!(
            "`{name}` is longer than {} bytes",
            caps::MAX_STRING_BYTES
        )),
        _ => Err(format!(
            "name the {name}: /debug/state?namespace=…&resource=…&domain=…"
        )),
    }
}

/// `GET /debug/state?namespace=&resource=&domain=`.
pub async fn state(
    State(sources): State<StateSources>,
    query: Result<Query<Asked>, axum::extract::rejection::QueryRejection>,
) -> Response {
    match read(&sources, query).await {
        Ok(shown) => Json(shown).into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn read(
    sources: &StateSources,
    query: Result<Query<Asked>, axum::extract::rejection::QueryRejection>,
) -> Result<Shown, Refusal> {
    let bad_request = |message: String| Refusal(StatusCode::BAD_REQUEST, message);
    let Query(asked) = query.map_err(|rejection| bad_request(rejection.body_text()))?;
    let namespace = parameter(asked.namespace, "namespace").map_err(bad_request)?;
    let resource = parameter(asked.resource, "resource").map_err(bad_request)?;
    let config = sources.limiter.config();
    let found = config.namespace(&namespace).ok_or_else(|| {
        Refusal(
            StatusCode::NOT_FOUND,
            format!("no namespace `{namespace}` in the configuration"),
        )
    })?;
    if let Some(global) = found.globals.get(&resource) {
        // A global limit's share is the server's, whatever the domain.
        let share = sources
            .limiter
            .global_shares()
            .share(&namespace, &resource, &global.limit);
        return Ok(Shown {
            store: sources.limiter.store().name(),
            now_ms: SystemClock.now_ms(),
            detail: Detail::Global {
                limit: global.limit.requests_per_unit,
                window_ms: global.limit.period(),
                share: share.requests_per_unit(),
                lent: share.lent(),
                on_safe_share: share.on_safe_share(),
            },
            limits_from: None,
            recent: Vec::new(),
            watching_since_ms: 0,
            namespace,
            resource,
            domain: asked.domain.unwrap_or_else(|| "global".to_owned()),
        });
    }
    let domain = parameter(asked.domain, "domain").map_err(bad_request)?;
    let (detail, now) = match found.resources.get(&resource) {
        None => {
            return Err(Refusal(
                StatusCode::NOT_FOUND,
                format!("no resource `{resource}` in namespace `{namespace}`"),
            ));
        }
        Some(Resource::Rate(rate)) => rate_detail(sources, &namespace, rate, &domain).await?,
        Some(Resource::Copies(copies)) => {
            copies_detail(sources, &namespace, copies, &domain).await?
        }
        Some(Resource::Capacity(_)) => {
            return Err(Refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "resource `{resource}` is a leased capacity: the state view shows rate and copy limits"
                ),
            ));
        }
    };
    let seen = sources
        .limiter
        .watch()
        .look(&namespace, &resource, &domain, now);
    let limits_from = sources
        .origins
        .as_ref()
        .map(|origins| origins(&namespace, &resource, &domain));
    Ok(Shown {
        store: sources.limiter.store().name(),
        now_ms: now,
        detail,
        limits_from,
        recent: seen.recent,
        watching_since_ms: seen.watching_since_ms,
        namespace,
        resource,
        domain,
    })
}

/// The domain's tiers, read from the store, and the store's "now".
async fn rate_detail(
    sources: &StateSources,
    namespace: &str,
    rate: &RateResource,
    domain: &str,
) -> Result<(Detail, u64), Refusal> {
    let has_global = rate.global_limit.is_some();
    let mut keys = vec![SlotKey {
        key: keys::tiers_key(namespace, &rate.name, domain, has_global),
        kind: SlotKind::Tiers,
    }];
    if has_global {
        keys.push(SlotKey {
            key: keys::global_key(namespace, &rate.name),
            kind: SlotKind::Log,
        });
    }
    let (slots, now, degraded) = sources.limiter.store().peek(&keys).await.map_err(|error| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the store: {error}"),
        )
    })?;
    let tick = simulate::read_back(rate, domain, &slots, now, 0);
    let detail = Detail::Rate {
        degraded,
        hard_limit: rate.policy_for(domain).hard_limit,
        global_limit: rate.global_limit,
        tiers: simulate::tier_configs(rate, domain),
        state: Reading {
            tier: tick.tier,
            tiers: tick.tiers,
            retry_after_ms: tick.retry_after_ms,
            domain_hits_last_second: tick.domain_hits_last_second,
        },
    };
    Ok((detail, now))
}

/// The holds of the domain, of all domains and of each group, and "now".
async fn copies_detail(
    sources: &StateSources,
    namespace: &str,
    copies: &CopyResource,
    domain: &str,
) -> Result<(Detail, u64), Refusal> {
    let limits = CopyLimits::for_domain(copies, domain);
    let names: Vec<&str> = copies.groups.iter().map(|g| g.name.as_str()).collect();
    let at = ResourceRef {
        namespace,
        resource: &copies.name,
        domain,
    };
    let counts = sources.copies.counts(at, &names).await.map_err(|error| {
        Refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the copy log: {error}"),
        )
    })?;
    let groups = copies
        .groups
        .iter()
        .zip(&counts.groups)
        .map(|(group, held)| GroupHolds {
            name: group.name.clone(),
            held: *held,
            limit: group.limit,
            member: limits.groups.iter().any(|(name, _)| *name == group.name),
        })
        .collect();
    let holds = Holds {
        domain: counts.domain,
        domain_limit: limits.domain_limit.unwrap_or(copies.domain_limit),
        global: counts.global,
        global_limit: copies.global_limit,
        groups,
    };
    Ok((Detail::Copies { holds }, SystemClock.now_ms()))
}

/// The copies held of one copy-limited resource, across its domains, and
/// per group: what `/metrics` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceHolds {
    pub namespace: String,
    pub resource: String,
    pub held: u64,
    /// (group, copies held by its members).
    pub groups: Vec<(String, u64)>,
    /// Transfers staged and not yet seized.
    pub staged: u64,
}

/// The holds of every copy-limited resource of the running configuration
/// (one copy-log read each, within the store's deadline). A resource whose
/// read fails is left out: the scrape still answers.
pub async fn copy_holds(sources: &StateSources) -> Vec<ResourceHolds> {
    let config = sources.limiter.config();
    let mut holds = Vec::new();
    for namespace in config.namespaces() {
        for resource in namespace.resources.values() {
            let crate::config::Resource::Copies(copies) = resource else {
                continue;
            };
            let names: Vec<&str> = copies.groups.iter().map(|g| g.name.as_str()).collect();
            let at = ResourceRef {
                namespace: &namespace.name,
                resource: &copies.name,
                domain: "",
            };
            let staged = sources
                .copies
                .staged_transfers(&namespace.name, &copies.name)
                .await
                .unwrap_or(0);
            match sources.copies.counts(at, &names).await {
                Ok(counts) => holds.push(ResourceHolds {
                    staged,
                    namespace: namespace.name.clone(),
                    resource: copies.name.clone(),
                    held: counts.global,
                    groups: names
                        .iter()
                        .map(|name| (*name).to_owned())
                        .zip(counts.groups)
                        .collect(),
                }),
                Err(error) => {
                    tracing::debug!(%error, resource = %copies.name, "copy holds not read for /metrics");
                }
            }
        }
    }
    holds
}
