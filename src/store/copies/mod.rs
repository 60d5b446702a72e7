//! Copy logs: where the holds of copy-limited resources are counted
//! (docs/design.md#copy-limits).
//!
//! A copy log keeps, per resource, the holds of each domain, of each group
//! and of all domains, and the staged transfers. [`CopyStore`] is the one the
//! sidecar runs on: [`MemoryCopies`] (one process) or, with Redis, the shared
//! log whose every sidecar also records its own contribution and heartbeat,
//! so that a dead sidecar's holds are reaped by the others. Which session
//! holds what is not the store's business: the sessions keep that (the
//! server's hold sets); the store only counts.

mod membership;
mod memory;
mod redis;
mod timings;

use std::fmt::Write;
use std::sync::Arc;

pub use memory::MemoryCopies;
pub use redis::RedisCopies;
pub use timings::{CopyTimings, TimingsError};

use crate::engine::copies::{CopyCounts, CopyLimits};
use crate::store::ResourceRef;

/// Whose holds an operation changes: one session of one sidecar. The copy
/// log keeps each session's contribution apart, so a session's end subtracts
/// exactly what the log recorded for it.
#[derive(Debug, Clone, Copy)]
pub struct Contributor<'a> {
    /// The sidecar's id in the copy log (its membership's).
    pub server: &'a str,
    /// The session's number, unique within the sidecar's process.
    pub session: u64,
}

impl Contributor<'_> {
    /// `<sidecar id>.<session number>`: the contribution's name.
    pub fn name(&self) -> String {
        format!("{}.{}", self.server, self.session)
    }
}

/// What an operation changed and the holds after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// Copies granted, released or staged.
    pub copies: u64,
    /// After the operation, over the groups the caller asked about.
    pub counts: CopyCounts,
}

/// What a reserve did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Copies granted (perhaps none) and the holds after.
    Decided(Changed),
    /// The work was released as done since the reserve began waiting for
    /// anyone's result: nothing granted.
    Done,
}

/// Copies moved into the staging area.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub changed: Changed,
    pub transfer_id: String,
}

/// Copies moved out of the staging area into the caller's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seized {
    pub namespace: String,
    pub resource: String,
    pub domain: String,
    /// The groups of the hold, as they were reserved.
    pub groups: Vec<String>,
    pub copies: u64,
}

/// Whether a sidecar may serve copy operations, and under which id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// Bumped on every resignation and registration: a session started under
    /// another generation has lost its holds and must end.
    pub generation: u64,
    /// The id this sidecar's contributions are recorded under.
    pub server_id: Arc<str>,
    pub serving: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// A server error: the store did not answer.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A server error: this sidecar's holds were reaped (its heartbeat
    /// expired) or it has not registered yet.
    #[error("this sidecar is not registered in the copy log ({0}); it has resigned")]
    Resigned(String),
    /// A client error.
    #[error("no such transfer, or it has expired")]
    UnknownTransfer,
    #[error("copy log: {0}")]
    Internal(String),
}

/// How long a count of work done is kept after it last moved: longer than
/// any reserve waits, so a waiter never sees it vanish.
pub const DONE_KEPT: std::time::Duration = std::time::Duration::from_secs(120);

/// The copy log the sidecar runs on.
pub enum CopyStore {
    Memory(MemoryCopies),
    Redis(Arc<RedisCopies>),
}

impl CopyStore {
    /// Grants `copies` (or the most between `min_copies` and them that
    /// fit); with `done_past`, grants nothing and answers [`Reserved::Done`]
    /// if the count of work done on `at` has moved past it, in the same
    /// atomic step as the grant (docs/design.md#waiting-for-anyones-result).
    pub async fn reserve(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
        done_past: Option<u64>,
    ) -> Result<Reserved, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(match done_past {
                Some(past) => memory.reserve_unless_done(at, limits, copies, min_copies, past),
                None => Reserved::Decided(memory.reserve(at, limits, copies, min_copies)),
            }),
            CopyStore::Redis(redis) => {
                redis
                    .reserve(who, at, limits, copies, min_copies, done_past)
                    .await
            }
        }
    }

    /// How many times work on `at` was released as done so far (for
    /// reserves waiting for anyone's result: they watch it move).
    pub async fn done_count(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(memory.done_count(at)),
            CopyStore::Redis(redis) => redis.done_count(at).await,
        }
    }

    /// Records that work on `at` was released as done; the count after it.
    pub async fn mark_done(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(memory.mark_done(at)),
            CopyStore::Redis(redis) => redis.mark_done(at).await,
        }
    }

    /// Gives back up to `copies` of a hold of `groups`; `now_groups` are the
    /// groups whose holds the answer reports.
    pub async fn release(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
    ) -> Result<Changed, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(memory.release(at, groups, copies, now_groups)),
            CopyStore::Redis(redis) => redis.release(who, at, groups, copies, now_groups).await,
        }
    }

    pub async fn transfer(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        ttl_ms: u64,
    ) -> Result<Staged, CopyError> {
        match self {
            CopyStore::Memory(memory) => memory.transfer(at, groups, copies, ttl_ms),
            CopyStore::Redis(redis) => redis.transfer(who, at, groups, copies, ttl_ms).await,
        }
    }

    pub async fn seize(
        &self,
        who: Contributor<'_>,
        transfer_id: &str,
    ) -> Result<Seized, CopyError> {
        match self {
            CopyStore::Memory(memory) => memory.seize(transfer_id),
            CopyStore::Redis(redis) => redis.seize(who, transfer_id).await,
        }
    }

    /// The holds of a domain, of all domains and of `groups`.
    pub async fn counts(
        &self,
        at: ResourceRef<'_>,
        groups: &[&str],
    ) -> Result<CopyCounts, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(memory.counts(at, groups)),
            CopyStore::Redis(redis) => redis.counts(at, groups).await,
        }
    }

    /// Transfers staged for `namespace`/`resource` and not yet seized.
    pub async fn staged_transfers(
        &self,
        namespace: &str,
        resource: &str,
    ) -> Result<u64, CopyError> {
        match self {
            CopyStore::Memory(memory) => Ok(memory.staged_transfers(namespace, resource)),
            CopyStore::Redis(redis) => redis.staged_transfers(namespace, resource).await,
        }
    }

    /// Who this sidecar is in the copy log, and its changes.
    pub fn membership(&self) -> tokio::sync::watch::Receiver<Membership> {
        match self {
            CopyStore::Memory(memory) => memory.membership(),
            CopyStore::Redis(redis) => redis.membership(),
        }
    }

    /// The store showed that the holds of sidecar `server_id` are gone: if
    /// that is still this sidecar's id, resign now.
    pub fn resign(&self, server_id: &str, reason: &str) {
        match self {
            CopyStore::Memory(_) => {}
            CopyStore::Redis(redis) => redis.resign(server_id, reason),
        }
    }

    /// Gives back everything a closed session holds. `held` is its hold set
    /// (what the memory log releases); `touched` every resource it changed,
    /// whose contribution the shared log drops whole, so that a call whose
    /// answer was lost (a timeout) cannot leak or release twice.
    pub async fn end_session(
        &self,
        who: Contributor<'_>,
        held: &[(ResourceRef<'_>, &[String], u64)],
        touched: &[(&str, &str)],
    ) -> Result<(), CopyError> {
        match self {
            CopyStore::Memory(memory) => {
                for (at, groups, copies) in held {
                    memory.release(*at, groups, *copies, &[]);
                }
                let _ = touched;
                Ok(())
            }
            CopyStore::Redis(redis) => {
                let _ = held;
                for (namespace, resource) in touched {
                    redis.drop_session(who, namespace, resource).await?;
                }
                Ok(())
            }
        }
    }
}

/// A transfer id: an unguessable secret, then the namespace and resource in
/// hex, so that any sidecar can find the staged copies from the id alone.
pub fn transfer_id(secret: &str, namespace: &str, resource: &str) -> String {
    let mut id = String::with_capacity(secret.len() + 2 + 2 * (namespace.len() + resource.len()));
    id.push_str(secret);
    for part in [namespace, resource] {
        id.push('.');
        for byte in part.as_bytes() {
            let _ = write!(id, "{byte:02x}");
        }
    }
    id
}

/// The (secret, namespace, resource) of a transfer id.
pub fn parse_transfer_id(id: &str) -> Option<(&str, String, String)> {
    let mut parts = id.split('.');
    let secret = parts.next()?;
    let namespace = unhex(parts.next()?)?;
    let resource = unhex(parts.next()?)?;
    let well_formed = parts.next().is_none()
        && secret.len() == 32
        && secret.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then_some((secret, namespace, resource))
}

fn unhex(text: &str) -> Option<String> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// 128 random bits in hex: a transfer's secret, a sidecar's id.
pub fn random_hex() -> Result<String, CopyError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|error| CopyError::Internal(format!("no randomness: {error}")))?;
    let mut hex = String::with_capacity(32);
    for byte in bytes {
        let _ = write!(hex, "{byte:02x}");
    }
    Ok(hex)
}

/// The fields of the counts a hold of `domain` in `groups` counts in.
fn hold_fields<'g>(domain: &str, groups: impl IntoIterator<Item = &'g str>) -> Vec<String> {
    let mut fields = vec!["g".to_owned(), format!("d:{domain}")];
    fields.extend(groups.into_iter().map(|group| format!("p:{group}")));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_ids_round_trip_and_reject_garbage() {
        let secret = random_hex().unwrap();
        let id = transfer_id(&secret, "shop.eu", "ünïcode");
        let (parsed, namespace, resource) = parse_transfer_id(&id).unwrap();
        assert_eq!(
            (parsed, namespace.as_str(), resource.as_str()),
            (secret.as_str(), "shop.eu", "ünïcode")
        );
        for bad in [
            "",
            "x",
            "abc.61.62",
            &format!("{secret}.6"),
            &format!("{secret}.61.62.63"),
            &format!("{secret}.zz.61"),
        ] {
            assert!(parse_transfer_id(bad).is_none(), "{bad}");
        }
        assert_ne!(random_hex().unwrap(), secret);
    }
}
