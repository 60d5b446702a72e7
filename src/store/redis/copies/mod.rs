//! The shared copy log on Redis: one script (`copies.lua`) per operation,
//! each atomic on one resource's keys, plus the sidecar's membership tasks
//! (heartbeat, resignation, reaper: `membership.rs`).

mod membership;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use redis::Value;
use tokio::sync::{Notify, watch};

use crate::engine::copies::{self, CopyCounts, CopyLimits};
use crate::store::ResourceRef;
use crate::store::copies::CopyTimings;
use crate::store::copies::{
    Changed, Contributor, CopyError, CopyLog, Membership, Reserved, ResourceList, Seized, Staged,
};
use crate::store::keys::{self, CopyKeys};
use crate::store::redis::{RedisError, RedisStore};

const SCRIPT: &str = include_str!("copies.lua");

pub struct RedisCopies {
    pub(super) redis: RedisStore,
    pub(super) script: redis::Script,
    pub(super) timings: CopyTimings,
    pub(super) membership: watch::Sender<Membership>,
    pub(super) resign: Notify,
    /// (sidecar id, reason) of the last request to resign.
    pub(super) resign_request: Mutex<Option<(String, String)>>,
    /// Resources already in the copy index, so it is written once each.
    pub(super) indexed: Mutex<HashSet<(String, String)>>,
}

/// What one reaper pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// (sidecar id, copies subtracted across domains).
    pub servers: Vec<(String, u64)>,
    pub expired_transfers: u64,
}

impl From<RedisError> for CopyError {
    fn from(error: RedisError) -> Self {
        if error.is_outage() {
            CopyError::Unavailable(error.to_string())
        } else {
            CopyError::Internal(error.to_string())
        }
    }
}

impl RedisCopies {
    /// On `redis` (a store sharing another's connection, see
    /// [`RedisStore::sharing`]). Copy operations are refused until
    /// [`spawn`](Self::spawn)'s tasks register.
    pub fn on(redis: RedisStore, timings: CopyTimings) -> Self {
        let (membership, _) = watch::channel(Membership {
            generation: 0,
            server_id: Arc::from(""),
            serving: false,
        });
        Self {
            redis,
            script: redis::Script::new(SCRIPT),
            timings,
            membership,
            resign: Notify::new(),
            resign_request: Mutex::new(None),
            indexed: Mutex::new(HashSet::new()),
        }
    }

    pub fn timings(&self) -> CopyTimings {
        self.timings
    }

    pub(super) fn invocation<'s>(
        &'s self,
        keys: &CopyKeys,
        contributor: &str,
        op: &str,
    ) -> redis::ScriptInvocation<'s> {
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(keys.counts.as_str())
            .key(keys.contributors.as_str())
            .key(keys.reaped.as_str())
            .key(keys.transfers.as_str())
            .key(keys.staged.as_str())
            .key(format!("{}{contributor}", keys.contribution_prefix))
            .arg(op);
        invocation
    }

    async fn ensure_indexed(&self, namespace: &str, resource: &str) -> Result<(), CopyError> {
        let entry = (namespace.to_owned(), resource.to_owned());
        if self.indexed.lock().is_ok_and(|set| set.contains(&entry)) {
            return Ok(());
        }
        let mut command = redis::cmd("SADD");
        command
            .arg(self.redis.key(&keys::copy_index_key()).as_ref())
            .arg(keys::copy_index_member(namespace, resource));
        self.redis.query("index", &command).await?;
        if let Ok(mut set) = self.indexed.lock() {
            set.insert(entry);
        }
        Ok(())
    }

    async fn release_or_transfer(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
        transfer: Option<(&str, u64)>,
    ) -> Result<(Changed, u64), CopyError> {
        let keys = self.redis.copy_keys(at.namespace, at.resource);
        let op = if transfer.is_some() {
            "transfer"
        } else {
            "release"
        };
        let name = who.name();
        let mut invocation = self.invocation(&keys, &name, op);
        invocation
            .arg(name.as_str())
            .arg(at.domain)
            .arg(copies)
            .arg(groups.len());
        for group in groups {
            invocation.arg(group.as_str());
        }
        invocation.arg(now_groups.len());
        for group in now_groups {
            invocation.arg(*group);
        }
        if let Some((secret, ttl_ms)) = transfer {
            invocation.arg(secret).arg(ttl_ms);
        }
        let reply = array(self.redis.invoke(op, &invocation).await?)?;
        let counts = counts(&reply, now_groups.len())?;
        let moved = int(reply.get(3 + now_groups.len()))?;
        let expires = int(reply.get(4 + now_groups.len()))?;
        if moved < copies {
            // The session held them, the log did not: the log was reaped or
            // lost. Only what was there was taken.
            tracing::warn!(
                asked = copies,
                moved,
                namespace = at.namespace,
                resource = at.resource,
                "the copy log held less than this session"
            );
        }
        Ok((
            Changed {
                copies: moved,
                counts,
            },
            expires,
        ))
    }

    /// Subtracts everything one session's contribution to one resource
    /// still counts (the end of the session).
    pub async fn drop_session(
        &self,
        who: Contributor<'_>,
        namespace: &str,
        resource: &str,
    ) -> Result<(), CopyError> {
        let keys = self.redis.copy_keys(namespace, resource);
        let name = who.name();
        let mut invocation = self.invocation(&keys, &name, "drop");
        invocation.arg(name.as_str()).arg(who.server);
        array(self.redis.invoke("drop_session", &invocation).await?)?;
        Ok(())
    }

    fn done_key(&self, at: ResourceRef<'_>) -> String {
        self.redis
            .key(&crate::store::keys::copy_done_key(
                at.namespace,
                at.resource,
                at.domain,
            ))
            .into_owned()
    }
}

#[async_trait::async_trait]
impl CopyLog for RedisCopies {
    fn membership(&self) -> watch::Receiver<Membership> {
        self.membership.subscribe()
    }

    /// Resigns if `server_id` is still this sidecar's id: the late answers
    /// of calls made under an id already given up change nothing.
    fn resign(&self, server_id: &str, reason: &str) {
        if let Ok(mut slot) = self.resign_request.lock() {
            *slot = Some((server_id.to_owned(), reason.to_owned()));
        }
        self.resign.notify_one();
    }

    async fn reserve(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
        done_past: Option<u64>,
    ) -> Result<Reserved, CopyError> {
        self.ensure_indexed(at.namespace, at.resource).await?;
        let keys = self.redis.copy_keys(at.namespace, at.resource);
        let name = who.name();
        let mut invocation = self.invocation(&keys, &name, "reserve");
        // The count of work done shares the copy log's hash tag: read in the
        // same script as the grant, on a Cluster too.
        invocation.key(self.done_key(at));
        invocation
            .arg(name.as_str())
            .arg(who.server)
            .arg(at.domain)
            .arg(copies)
            .arg(min_copies)
            .arg(limit_arg(limits.domain_limit))
            .arg(limit_arg(limits.global_limit))
            .arg(limits.groups.len());
        for (name, _) in &limits.groups {
            invocation.arg(name.as_str());
        }
        invocation.arg(limits.groups.len());
        for (_, limit) in &limits.groups {
            invocation.arg(*limit);
        }
        invocation.arg(done_past.map_or(-1, |past| i64::try_from(past).unwrap_or(i64::MAX)));
        let reply = array(self.redis.invoke("reserve", &invocation).await?)?;
        match status(&reply) {
            Some("resigned") => return Err(CopyError::Resigned("its holds were reaped".into())),
            Some("done") => return Ok(Reserved::Done),
            _ => {}
        }
        let granted = int(reply.first())?;
        let before = counts(&reply, limits.groups.len())?;
        // The script ports the engine; a disagreement is a bug to report,
        // but what the script recorded is what the session holds.
        let expected = copies::grantable(limits, &before, copies, min_copies);
        if expected != granted {
            tracing::error!(
                script = granted,
                engine = expected,
                "the copy script and the engine decided differently"
            );
        }
        let mut after = before;
        if granted > 0 {
            after.domain += granted;
            after.global += granted;
            for group in &mut after.groups {
                *group += granted;
            }
        }
        Ok(Reserved::Decided(Changed {
            copies: granted,
            counts: after,
        }))
    }

    async fn release(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
    ) -> Result<Changed, CopyError> {
        let (changed, _) = self
            .release_or_transfer(who, at, groups, copies, now_groups, None)
            .await?;
        Ok(changed)
    }

    async fn transfer(
        &self,
        who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        ttl_ms: u64,
    ) -> Result<Staged, CopyError> {
        let secret = crate::store::copies::random_hex()?;
        let (changed, _) = self
            .release_or_transfer(who, at, groups, copies, &[], Some((&secret, ttl_ms)))
            .await?;
        Ok(Staged {
            changed,
            transfer_id: crate::store::copies::transfer_id(&secret, at.namespace, at.resource),
        })
    }

    async fn seize(&self, who: Contributor<'_>, transfer_id: &str) -> Result<Seized, CopyError> {
        // No copy-index entry here: the reserve that made the hold wrote it,
        // and a made-up id must not grow the index.
        let (secret, namespace, resource) = crate::store::copies::parse_transfer_id(transfer_id)
            .ok_or(CopyError::UnknownTransfer)?;
        let keys = self.redis.copy_keys(&namespace, &resource);
        let name = who.name();
        let mut invocation = self.invocation(&keys, &name, "seize");
        invocation.arg(name.as_str()).arg(who.server).arg(secret);
        let reply = array(self.redis.invoke("seize", &invocation).await?)?;
        match status(&reply) {
            Some("ok") => {}
            Some("resigned") => return Err(CopyError::Resigned("its holds were reaped".into())),
            Some("unknown") => return Err(CopyError::UnknownTransfer),
            _ => return Err(CopyError::Internal("unexpected seize reply".into())),
        }
        let domain = text(reply.get(1))?;
        let copies = int(reply.get(2))?;
        let groups = reply
            .get(3..)
            .unwrap_or_default()
            .iter()
            .map(|group| text(Some(group)))
            .collect::<Result<_, _>>()?;
        Ok(Seized {
            namespace,
            resource,
            domain,
            groups,
            copies,
        })
    }

    /// Transfers staged for `namespace`/`resource` and not yet seized.
    async fn staged_transfers(&self, namespace: &str, resource: &str) -> Result<u64, CopyError> {
        let keys = self.redis.copy_keys(namespace, resource);
        let mut count = redis::cmd("HLEN");
        count.arg(&keys.staged);
        match self.redis.query("staged", &count).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(CopyError::Internal(format!("HLEN answered {other:?}"))),
        }
    }

    async fn done_count(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        let key = self.done_key(at);
        let mut get = redis::cmd("GET");
        get.arg(key.as_str());
        match self.redis.query("done_count", &get).await? {
            Value::Nil => Ok(0),
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| {
                    CopyError::Internal("a count of work done that is not a number".into())
                }),
            other => Err(CopyError::Internal(format!(
                "a count of work done: {other:?}"
            ))),
        }
    }

    async fn mark_done(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        let key = self.done_key(at);
        let mut add = redis::cmd("INCR");
        add.arg(key.as_str());
        let count = match self.redis.query("mark_done", &add).await? {
            Value::Int(count) => u64::try_from(count).unwrap_or(0),
            other => {
                return Err(CopyError::Internal(format!(
                    "a count of work done: {other:?}"
                )));
            }
        };
        // Kept while a reserve may still wait on it; a failure here leaves
        // a counter that the next release as done sets to expire.
        let mut expire = redis::cmd("PEXPIRE");
        expire
            .arg(key.as_str())
            .arg(millis(crate::store::copies::DONE_KEPT));
        self.redis.query("mark_done", &expire).await?;
        Ok(count)
    }

    async fn counts(&self, at: ResourceRef<'_>, groups: &[&str]) -> Result<CopyCounts, CopyError> {
        let keys = self.redis.copy_keys(at.namespace, at.resource);
        let mut invocation = self.invocation(&keys, "", "counts");
        invocation.arg(at.domain).arg(groups.len());
        for group in groups {
            invocation.arg(*group);
        }
        counts(
            &array(self.redis.invoke("counts", &invocation).await?)?,
            groups.len(),
        )
    }

    async fn end_session(
        &self,
        who: Contributor<'_>,
        _held: &[(ResourceRef<'_>, &[String], u64)],
        touched: &[(&str, &str)],
    ) -> Result<(), CopyError> {
        for (namespace, resource) in touched {
            self.drop_session(who, namespace, resource).await?;
        }
        Ok(())
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn spawn_membership(self: Arc<Self>, resources: ResourceList, shutdown: watch::Receiver<bool>) {
        self.spawn(resources, shutdown);
    }

    async fn deregister(&self) {
        self.remove_heartbeat().await;
    }
}

pub(super) fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn limit_arg(limit: Option<u64>) -> String {
    match limit {
        Some(limit) => limit.to_string(),
        None => "-1".into(),
    }
}

pub(super) fn array(value: Value) -> Result<Vec<Value>, CopyError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(CopyError::Internal(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn status(reply: &[Value]) -> Option<&str> {
    match reply.first() {
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok(),
        Some(Value::SimpleString(text)) => Some(text),
        _ => None,
    }
}

pub(super) fn int(value: Option<&Value>) -> Result<u64, CopyError> {
    match value {
        Some(Value::Int(n)) => Ok(u64::try_from(*n).unwrap_or(0)),
        other => Err(CopyError::Internal(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

fn text(value: Option<&Value>) -> Result<String, CopyError> {
    match value {
        Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone())
            .map_err(|_| CopyError::Internal("a name that is not UTF-8".into())),
        other => Err(CopyError::Internal(format!(
            "expected a string, got {other:?}"
        ))),
    }
}

pub(super) fn strings(value: Value) -> Vec<String> {
    match value {
        Value::Array(items) | Value::Set(items) => items
            .into_iter()
            .filter_map(|item| match item {
                Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `[status, domain, global, group…]` → counts over `groups` groups.
fn counts(reply: &[Value], groups: usize) -> Result<CopyCounts, CopyError> {
    Ok(CopyCounts {
        domain: int(reply.get(1))?,
        global: int(reply.get(2))?,
        groups: (0..groups)
            .map(|i| int(reply.get(3 + i)))
            .collect::<Result<_, _>>()?,
    })
}
