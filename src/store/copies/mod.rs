//! Copy logs: where the holds of copy-limited resources are counted
//! (docs/design.md#copy-limits).
//!
//! A copy log keeps, per resource, the holds of each domain, of each group
//! and of all domains, and the staged transfers. [`CopyLog`] is what every
//! backend answers: `MemoryCopies` (one process, `store/memory/copies.rs`)
//! or, with the `redis` feature, the shared log (`store/redis/copies/`)
//! whose every sidecar also records its own contribution and heartbeat, so
//! that a dead sidecar's holds are reaped by the others. Which session
//! holds what is not the store's business: the sessions keep that (the
//! server's hold sets); the store only counts.

mod timings;

use std::fmt::Write;
use std::sync::Arc;

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

/// The configured copy-limited resources, as (namespace, resource), whose
/// contributors a shared log's reaper looks at: asked on every reap, so a
/// reload is seen at once.
pub type ResourceList = Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>;

/// A copy log: `MemoryCopies` (one process) or, with the `redis` feature,
/// `RedisCopies` (every sidecar on one Redis, each recording its own
/// contribution and heartbeat). The service holds one as
/// `Arc<dyn CopyLog>`: a copy operation costs a round trip to the store
/// or a lock, so one boxed future more is nothing.
#[async_trait::async_trait]
pub trait CopyLog: Send + Sync {
    /// Grants `copies` (or the most between `min_copies` and them that
    /// fit); with `done_past`, grants nothing and answers [`Reserved::Done`]
    /// if the count of work done on `at` has moved past it, in the same
    /// atomic step as the grant (docs/design.md#waiting-for-anyones-result).
    async fn reserve(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
        done_past: Option<u64>,
    ) -> Result<Reserved, CopyError>;

    /// How many times work on `at` was released as done so far (for
    /// reserves waiting for anyone's result: they watch it move).
    async fn done_count(&self, at: ResourceRef<'_>) -> Result<u64, CopyError>;

    /// Records that work on `at` was released as done; the count after it.
    async fn mark_done(&self, at: ResourceRef<'_>) -> Result<u64, CopyError>;

    /// Gives back up to `copies` of a hold of `groups`; `now_groups` are the
    /// groups whose holds the answer reports.
    async fn release(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
    ) -> Result<Changed, CopyError>;

    /// Moves `copies` of a hold of `groups` into the staging area for
    /// `ttl_ms`, under a new transfer id.
    async fn transfer(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        ttl_ms: u64,
    ) -> Result<Staged, CopyError>;

    /// Moves a staged transfer into the caller's session.
    async fn seize(&self, who: Contributor<'_>, transfer_id: &str) -> Result<Seized, CopyError>;

    /// The holds of a domain, of all domains and of `groups`.
    async fn counts(&self, at: ResourceRef<'_>, groups: &[&str]) -> Result<CopyCounts, CopyError>;

    /// Transfers staged for `namespace`/`resource` and not yet seized.
    async fn staged_transfers(&self, namespace: &str, resource: &str) -> Result<u64, CopyError>;

    /// Gives back everything a closed session holds. `held` is its hold set
    /// (what the memory log releases); `touched` every resource it changed,
    /// whose contribution the shared log drops whole, so that a call whose
    /// answer was lost (a timeout) cannot leak or release twice.
    async fn end_session(
        &self,
        who: Contributor<'_>,
        held: &[(ResourceRef<'_>, &[String], u64)],
        touched: &[(&str, &str)],
    ) -> Result<(), CopyError>;

    /// Who this sidecar is in the copy log, and its changes.
    fn membership(&self) -> tokio::sync::watch::Receiver<Membership>;

    /// Whether other processes share this log: then a sidecar's holds
    /// outlive it unless it gives them back, and it has a membership to
    /// keep.
    fn is_shared(&self) -> bool {
        false
    }

    /// The store showed that the holds of sidecar `server_id` are gone: if
    /// that is still this sidecar's id, resign now.
    fn resign(&self, _server_id: &str, _reason: &str) {}

    /// Starts what keeps a shared log's membership: the heartbeat, the
    /// resignation and the reaper of dead sidecars, until `shutdown`.
    fn spawn_membership(
        self: Arc<Self>,
        _resources: ResourceList,
        _shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
    }

    /// Removes this sidecar from a shared log on a clean shutdown (after
    /// its sessions released their holds), so nothing waits for its
    /// heartbeat to expire.
    async fn deregister(&self) {}

    /// Releases the transfers whose time is up, for a log that has no
    /// reaper to do it; how many.
    fn expire_transfers(&self) -> usize {
        0
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
pub(crate) fn hold_fields<'g>(
    domain: &str,
    groups: impl IntoIterator<Item = &'g str>,
) -> Vec<String> {
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
