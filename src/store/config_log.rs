//! The configuration API's log (docs/configuration-api.md): the objects the
//! API owns (whole namespaces, per-domain overrides), each with the version
//! of its last change, and the ordered list of changes that is also the
//! delta a sidecar applies to catch up. On the memory store it lives in the
//! process (and in `--config-state FILE` when given); on Redis every sidecar
//! sharing the store reads and writes the same log, each write one atomic
//! script that checks the object's version first (optimistic concurrency).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::overlay::Overlay;

/// One change: a put (with its body) or a delete (without).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub version: u64,
    /// Milliseconds since the Unix epoch, by the store's clock.
    pub at_ms: u64,
    /// Who asked (the `X-Charon-Actor` header, or the peer's address).
    pub who: String,
    pub path: ObjectPath,
    pub body: Option<String>,
}

/// What a change is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ObjectPath {
    Override {
        namespace: String,
        resource: String,
        domain: String,
    },
    Namespace {
        namespace: String,
    },
}

impl ObjectPath {
    /// The key an object is stored under: its API path.
    pub fn key(&self) -> String {
        match self {
            ObjectPath::Namespace { namespace } => format!("namespaces/{namespace}"),
            ObjectPath::Override {
                namespace,
                resource,
                domain,
            } => format!("namespaces/{namespace}/resources/{resource}/domains/{domain}"),
        }
    }
}

/// An object's body and the version of its last change (its ETag).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    pub version: u64,
    pub path: ObjectPath,
    pub body: String,
}

/// Every object at one version of the log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u64,
    pub objects: BTreeMap<String, Object>,
}

impl Snapshot {
    /// Applies a change of the log (changes must come in order).
    pub fn apply(&mut self, change: &Change) {
        let key = change.path.key();
        match &change.body {
            Some(body) => {
                self.objects.insert(
                    key,
                    Object {
                        version: change.version,
                        path: change.path.clone(),
                        body: body.clone(),
                    },
                );
            }
            None => {
                self.objects.remove(&key);
            }
        }
        self.version = self.version.max(change.version);
    }

    /// The objects as the configuration loader takes them.
    pub fn overlay(&self) -> Overlay {
        let mut overlay = Overlay::default();
        for object in self.objects.values() {
            match &object.path {
                ObjectPath::Namespace { namespace } => {
                    overlay
                        .namespaces
                        .insert(namespace.clone(), object.body.clone());
                }
                ObjectPath::Override {
                    namespace,
                    resource,
                    domain,
                } => overlay.set_override(namespace, resource, domain, Some(object.body.clone())),
            }
        }
        overlay
    }

    /// The object at `path`, if any.
    pub fn object(&self, path: &ObjectPath) -> Option<&Object> {
        self.objects.get(&path.key())
    }
}

/// A write's precondition on the object's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// No precondition.
    Any,
    /// The object must be at this version (0: it must not exist).
    Version(u64),
}

/// A change asked of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub path: ObjectPath,
    pub body: Option<String>,
    pub expect: Expect,
    pub who: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// The object changed since the version the writer read.
    #[error("the object is at version {current}, not the one expected")]
    Stale { current: u64 },
    /// A delete of nothing.
    #[error("no such object")]
    Missing,
    #[error("the configuration log is unavailable: {0}")]
    Unavailable(String),
    #[error("the configuration log is corrupt: {0}")]
    Corrupt(String),
}

/// The changes after a version, or the whole state when the log no longer
/// holds them all (it keeps the last [`MAX_CHANGES`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    Changes(Vec<Change>),
    Snapshot(Snapshot),
}

/// How many changes the log keeps; a sidecar further behind reads the
/// whole state instead.
pub const MAX_CHANGES: u64 = 10_000;

/// Where the log lives: `MemoryLog` (the process, and a state file when
/// given: `store/memory/config_log.rs`) or, with the `redis` feature,
/// `RedisLog` (`store/redis/config_log.rs`: every sidecar on one
/// Redis reads and writes the same log).
#[async_trait::async_trait]
pub trait ConfigLog: Send + Sync {
    /// The log's version (that of its last change; 0 when empty).
    async fn version(&self) -> Result<u64, LogError>;

    async fn snapshot(&self) -> Result<Snapshot, LogError>;

    /// What happened after `version`.
    async fn since(&self, version: u64) -> Result<Delta, LogError>;

    /// Makes one change, atomically, if its precondition holds.
    async fn write(&self, write: Write) -> Result<Change, LogError>;

    /// Whether changes outlive the process (Redis, or a state file).
    fn is_durable(&self) -> bool;

    /// Whether other processes write to this log too: then a sidecar
    /// follows it (docs/configuration-api.md).
    fn is_shared(&self) -> bool {
        false
    }

    /// The changes after `version`, at most `limit`, oldest first (the
    /// history; `None` when the log no longer holds them).
    async fn history(&self, version: u64, limit: usize) -> Result<Option<Vec<Change>>, LogError> {
        Ok(match self.since(version).await? {
            Delta::Changes(mut changes) => {
                changes.truncate(limit);
                Some(changes)
            }
            Delta::Snapshot(_) => None,
        })
    }
}

/// Checks a write's precondition against the object's current version.
pub(crate) fn check(
    expect: Expect,
    current: Option<&Object>,
    deleting: bool,
) -> Result<(), LogError> {
    let version = current.map_or(0, |object| object.version);
    if let Expect::Version(wanted) = expect
        && wanted != version
    {
        return Err(LogError::Stale { current: version });
    }
    if deleting && current.is_none() {
        return Err(LogError::Missing);
    }
    Ok(())
}
