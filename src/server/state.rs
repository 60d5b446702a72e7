//! The live state view's JSON (`/debug/state`, `/debug/resources`), read
//! from the store the sidecar decides on, without changing it.
//!
//! For a rate-limited resource and one domain: the current tier, each tier's
//! phase and window fill and `retry_after`, read back from the stored state
//! exactly as `charon simulate` reads its own (one function); for a
//! copy-limited one: the holds of the domain, of all domains and of each
//! group, against their limits. Both with the recent decisions of the
//! domain, recorded from the first look on ([`crate::watch`]). It shows
//! counts and limits only: no transfer ids (they are the capability to
//! seize), no store address. The admin port listens on localhost by default.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::config::Resource;
use crate::engine::copies::CopyLimits;
use crate::engine::{SlotKind, keys};
use crate::limiter::{Limiter, caps};
use crate::simulate::{self, TierConfig, TierView};
use crate::store::copies::{CopyRef, CopyStore};
use crate::store::{SlotKey, Store};
use crate::watch::Recent;

use super::simulator::Refusal;
use super::store::SidecarStore;

/// What the state view reads from.
#[derive(Clone)]
pub struct StateSources {
    pub limiter: Arc<Limiter<SidecarStore>>,
    pub copies: Arc<CopyStore>,
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

#[derive(Debug, Serialize)]
struct RateState {
    namespace: String,
    resource: String,
    domain: String,
    kind: &'static str,
    store: &'static str,
    /// Redis was unreachable: this is the in-process fallback's state.
    degraded: bool,
    now_ms: u64,
    hard_limit: Option<u64>,
    global_limit: Option<u64>,
    tiers: Vec<TierConfig>,
    state: Reading,
    recent: Vec<Recent>,
    watching_since_ms: u64,
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
struct CopiesState {
    namespace: String,
    resource: String,
    domain: String,
    kind: &'static str,
    store: &'static str,
    now_ms: u64,
    holds: Holds,
    recent: Vec<Recent>,
    watching_since_ms: u64,
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

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    Refusal(status, message.into()).into_response()
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
    let Query(asked) = match query {
        Ok(query) => query,
        Err(rejection) => return refuse(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    let (namespace, resource, domain) = match (
        parameter(asked.namespace, "namespace"),
        parameter(asked.resource, "resource"),
        parameter(asked.domain, "domain"),
    ) {
        (Ok(namespace), Ok(resource), Ok(domain)) => (namespace, resource, domain),
        (Err(refused), _, _) | (_, Err(refused), _) | (_, _, Err(refused)) => {
            return refuse(StatusCode::BAD_REQUEST, refused);
        }
    };
    let config = sources.limiter.config();
    let Some(found) = config.namespace(&namespace) else {
        return refuse(
            StatusCode::NOT_FOUND,
            format!("no namespace `{namespace}` in the configuration"),
        );
    };
    match found.resources.get(&resource) {
        None => refuse(
            StatusCode::NOT_FOUND,
            format!("no resource `{resource}` in namespace `{namespace}`"),
        ),
        Some(Resource::Rate(rate)) => {
            let has_global = rate.global_limit.is_some();
            let mut keys = vec![SlotKey {
                key: keys::tiers_key(&namespace, &resource, &domain, has_global),
                kind: SlotKind::Tiers,
            }];
            if has_global {
                keys.push(SlotKey {
                    key: keys::global_key(&namespace, &resource),
                    kind: SlotKind::Log,
                });
            }
            let (slots, now, degraded) = match sources.limiter.store().peek(&keys).await {
                Ok(peeked) => peeked,
                Err(error) => {
                    return refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot read the store: {error}"),
                    );
                }
            };
            let tick = simulate::read_back(rate, &domain, &slots, now, 0);
            let seen = sources
                .limiter
                .watch()
                .look(&namespace, &resource, &domain, now);
            let policy = rate.policy_for(&domain);
            Json(RateState {
                kind: "rate",
                store: sources.limiter.store().name(),
                degraded,
                now_ms: now,
                hard_limit: policy.hard_limit,
                global_limit: rate.global_limit,
                tiers: simulate::tier_configs(rate, &domain),
                state: Reading {
                    tier: tick.tier,
                    tiers: tick.tiers,
                    retry_after_ms: tick.retry_after_ms,
                    domain_hits_last_second: tick.domain_hits_last_second,
                },
                recent: seen.recent,
                watching_since_ms: seen.watching_since_ms,
                namespace,
                resource,
                domain,
            })
            .into_response()
        }
        Some(Resource::Copies(copies)) => {
            let limits = CopyLimits::for_domain(copies, &domain);
            let names: Vec<&str> = copies.groups.iter().map(|g| g.name.as_str()).collect();
            let at = CopyRef {
                namespace: &namespace,
                resource: &resource,
                domain: &domain,
            };
            let counts = match sources.copies.counts(at, &names).await {
                Ok(counts) => counts,
                Err(error) => {
                    return refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("cannot read the copy log: {error}"),
                    );
                }
            };
            let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
            let seen = sources
                .limiter
                .watch()
                .look(&namespace, &resource, &domain, now);
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
            Json(CopiesState {
                kind: "copies",
                store: sources.limiter.store().name(),
                now_ms: now,
                holds: Holds {
                    domain: counts.domain,
                    domain_limit: limits.domain_limit.unwrap_or(copies.domain_limit),
                    global: counts.global,
                    global_limit: copies.global_limit,
                    groups,
                },
                recent: seen.recent,
                watching_since_ms: seen.watching_since_ms,
                namespace,
                resource,
                domain,
            })
            .into_response()
        }
    }
}
