//! The copy log of one process: counts and staged transfers in a map behind
//! one lock. Nothing to reap: when the process dies, its holds die with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::clock::{Clock, SystemClock};
use crate::engine::copies::{self, CopyCounts, CopyLimits};
use crate::store::ResourceRef;
use crate::store::copies::{
    Changed, Contributor, CopyError, CopyLog, Membership, Reserved, Seized, Staged, hold_fields,
};

pub struct MemoryCopies<C = SystemClock> {
    clock: C,
    logs: Mutex<HashMap<(String, String), Log>>,
    membership: watch::Sender<Membership>,
}

#[derive(Default)]
struct Log {
    /// `g`, `d:<domain>`, `p:<group>` → holds, as in the Redis copy log.
    counts: HashMap<String, u64>,
    staged: HashMap<String, StagedHold>,
    /// Per domain: how many times work was released as done, and when it
    /// last was (ms), kept [`DONE_KEPT`](crate::store::copies::DONE_KEPT) after that.
    done: HashMap<String, (u64, u64)>,
}

struct StagedHold {
    domain: String,
    groups: Vec<String>,
    copies: u64,
    expires_at: u64,
}

/// Counts of work done that no reserve can still be waiting on.
fn forget_old_done(log: &mut Log, now: u64) {
    let kept = u64::try_from(crate::store::copies::DONE_KEPT.as_millis()).unwrap_or(u64::MAX);
    log.done.retain(|_, (_, at)| now.saturating_sub(*at) < kept);
}

impl Log {
    fn get(&self, field: &str) -> u64 {
        self.counts.get(field).copied().unwrap_or(0)
    }

    fn add(&mut self, fields: &[String], n: u64) {
        for field in fields {
            let count = self.counts.entry(field.clone()).or_default();
            *count = count.saturating_add(n);
        }
    }

    fn sub(&mut self, fields: &[String], n: u64) {
        for field in fields {
            if let Some(count) = self.counts.get_mut(field) {
                *count = count.saturating_sub(n);
                if *count == 0 {
                    self.counts.remove(field);
                }
            }
        }
    }

    fn context(&self, domain: &str, groups: &[&str]) -> CopyCounts {
        CopyCounts {
            domain: self.get(&format!("d:{domain}")),
            global: self.get("g"),
            groups: groups
                .iter()
                .map(|group| self.get(&format!("p:{group}")))
                .collect(),
        }
    }

    /// All `copies`, or the most between `min_copies` and them that fit.
    fn grant(
        &mut self,
        domain: &str,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
    ) -> Changed {
        let groups: Vec<&str> = limits.group_names().collect();
        let before = self.context(domain, &groups);
        let granted = copies::grantable(limits, &before, copies, min_copies);
        if granted > 0 {
            self.add(&hold_fields(domain, groups.iter().copied()), granted);
        }
        Changed {
            copies: granted,
            counts: self.context(domain, &groups),
        }
    }

    fn unstage_expired(&mut self, now: u64) -> usize {
        let due: Vec<String> = self
            .staged
            .iter()
            .filter(|(_, hold)| hold.expires_at <= now)
            .map(|(secret, _)| secret.clone())
            .collect();
        for secret in &due {
            if let Some(hold) = self.staged.remove(secret) {
                self.sub(
                    &hold_fields(&hold.domain, hold.groups.iter().map(String::as_str)),
                    hold.copies,
                );
            }
        }
        due.len()
    }
}

impl MemoryCopies {
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryCopies {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock> MemoryCopies<C> {
    pub fn with_clock(clock: C) -> Self {
        let (membership, _) = watch::channel(Membership {
            generation: 0,
            server_id: Arc::from("memory"),
            serving: true,
        });
        Self {
            clock,
            logs: Mutex::new(HashMap::new()),
            membership,
        }
    }

    fn logs(&self) -> MutexGuard<'_, HashMap<(String, String), Log>> {
        // A panic elsewhere while holding the lock leaves counts that are
        // still whole (every change is a few integer updates).
        self.logs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_log<T>(&self, at: ResourceRef<'_>, change: impl FnOnce(&mut Log) -> T) -> T {
        let mut logs = self.logs();
        let key = (at.namespace.to_owned(), at.resource.to_owned());
        let log = logs.entry(key.clone()).or_default();
        let result = change(log);
        if log.counts.is_empty() && log.staged.is_empty() && log.done.is_empty() {
            logs.remove(&key);
        }
        result
    }

    pub fn done_count(&self, at: ResourceRef<'_>) -> u64 {
        let now = self.clock.now_ms();
        self.with_log(at, |log| {
            forget_old_done(log, now);
            log.done.get(at.domain).map_or(0, |(count, _)| *count)
        })
    }

    pub fn mark_done(&self, at: ResourceRef<'_>) -> u64 {
        let now = self.clock.now_ms();
        self.with_log(at, |log| {
            forget_old_done(log, now);
            let entry = log.done.entry(at.domain.to_owned()).or_insert((0, now));
            *entry = (entry.0.saturating_add(1), now);
            entry.0
        })
    }

    pub fn reserve(
        &self,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
    ) -> Changed {
        self.with_log(at, |log| log.grant(at.domain, limits, copies, min_copies))
    }

    /// [`Self::reserve`], unless the count of work done on `at` is already
    /// past `done_past`: checked under the same lock as the grant, so a
    /// waiter for anyone's result never takes a copy released as done.
    pub fn reserve_unless_done(
        &self,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
        done_past: u64,
    ) -> Reserved {
        let now = self.clock.now_ms();
        self.with_log(at, |log| {
            forget_old_done(log, now);
            if log
                .done
                .get(at.domain)
                .is_some_and(|(count, _)| *count > done_past)
            {
                Reserved::Done
            } else {
                Reserved::Decided(log.grant(at.domain, limits, copies, min_copies))
            }
        })
    }

    pub fn release(
        &self,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
    ) -> Changed {
        self.with_log(at, |log| {
            let fields = hold_fields(at.domain, groups.iter().map(String::as_str));
            let held = fields.iter().map(|f| log.get(f)).min().unwrap_or(0);
            let released = copies.min(held);
            log.sub(&fields, released);
            Changed {
                copies: released,
                counts: log.context(at.domain, now_groups),
            }
        })
    }

    pub fn transfer(
        &self,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        ttl_ms: u64,
    ) -> Result<Staged, CopyError> {
        let secret = crate::store::copies::random_hex()?;
        let now = self.clock.now_ms();
        let changed = self.with_log(at, |log| {
            let fields = hold_fields(at.domain, groups.iter().map(String::as_str));
            let staged = fields
                .iter()
                .map(|f| log.get(f))
                .min()
                .unwrap_or(0)
                .min(copies);
            if staged > 0 {
                log.staged.insert(
                    secret.clone(),
                    StagedHold {
                        domain: at.domain.to_owned(),
                        groups: groups.to_vec(),
                        copies: staged,
                        expires_at: now.saturating_add(ttl_ms),
                    },
                );
            }
            Changed {
                copies: staged,
                counts: log.context(at.domain, &[]),
            }
        });
        Ok(Staged {
            changed,
            transfer_id: crate::store::copies::transfer_id(&secret, at.namespace, at.resource),
        })
    }

    pub fn seize(&self, transfer_id: &str) -> Result<Seized, CopyError> {
        let (secret, namespace, resource) = crate::store::copies::parse_transfer_id(transfer_id)
            .ok_or(CopyError::UnknownTransfer)?;
        let now = self.clock.now_ms();
        let at = ResourceRef {
            namespace: &namespace,
            resource: &resource,
            domain: "",
        };
        self.with_log(at, |log| {
            log.unstage_expired(now);
            let hold = log
                .staged
                .remove(secret)
                .ok_or(CopyError::UnknownTransfer)?;
            Ok(Seized {
                namespace: namespace.clone(),
                resource: resource.clone(),
                domain: hold.domain,
                groups: hold.groups,
                copies: hold.copies,
            })
        })
    }

    pub fn counts(&self, at: ResourceRef<'_>, groups: &[&str]) -> CopyCounts {
        let logs = self.logs();
        match logs.get(&(at.namespace.to_owned(), at.resource.to_owned())) {
            Some(log) => log.context(at.domain, groups),
            None => CopyCounts {
                groups: vec![0; groups.len()],
                ..CopyCounts::default()
            },
        }
    }

    /// Transfers staged for `namespace`/`resource` and not yet seized (nor
    /// released by expiry).
    pub fn staged_transfers(&self, namespace: &str, resource: &str) -> u64 {
        let logs = self.logs();
        logs.get(&(namespace.to_owned(), resource.to_owned()))
            .map_or(0, |log| log.staged.len() as u64)
    }

    /// Releases every staged transfer past its ttl; how many.
    pub fn expire(&self) -> usize {
        let now = self.clock.now_ms();
        let mut logs = self.logs();
        let expired = logs.values_mut().map(|log| log.unstage_expired(now)).sum();
        logs.retain(|_, log| !log.counts.is_empty() || !log.staged.is_empty());
        expired
    }

    /// Never changes: one process has nothing to resign from.
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.membership.subscribe()
    }

    /// Whether nothing is held or staged anywhere (tests, shutdown).
    pub fn is_empty(&self) -> bool {
        self.logs().is_empty()
    }
}

/// One process's log: every operation decided under the lock, at once.
/// The contributor is not recorded: when the process dies, its holds die
/// with it.
#[async_trait::async_trait]
impl<C: Clock + Send + Sync> CopyLog for MemoryCopies<C> {
    async fn reserve(
        &self,
        _who: Contributor<'_>,
        at: ResourceRef<'_>,
        limits: &CopyLimits,
        copies: u64,
        min_copies: u64,
        done_past: Option<u64>,
    ) -> Result<Reserved, CopyError> {
        Ok(match done_past {
            Some(past) => self.reserve_unless_done(at, limits, copies, min_copies, past),
            None => Reserved::Decided(MemoryCopies::reserve(self, at, limits, copies, min_copies)),
        })
    }

    async fn done_count(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        Ok(MemoryCopies::done_count(self, at))
    }

    async fn mark_done(&self, at: ResourceRef<'_>) -> Result<u64, CopyError> {
        Ok(MemoryCopies::mark_done(self, at))
    }

    async fn release(
        &self,
        _who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        now_groups: &[&str],
    ) -> Result<Changed, CopyError> {
        Ok(MemoryCopies::release(self, at, groups, copies, now_groups))
    }

    async fn transfer(
        &self,
        _who: Contributor<'_>,
        at: ResourceRef<'_>,
        groups: &[String],
        copies: u64,
        ttl_ms: u64,
    ) -> Result<Staged, CopyError> {
        MemoryCopies::transfer(self, at, groups, copies, ttl_ms)
    }

    async fn seize(&self, _who: Contributor<'_>, transfer_id: &str) -> Result<Seized, CopyError> {
        MemoryCopies::seize(self, transfer_id)
    }

    async fn counts(&self, at: ResourceRef<'_>, groups: &[&str]) -> Result<CopyCounts, CopyError> {
        Ok(MemoryCopies::counts(self, at, groups))
    }

    async fn staged_transfers(&self, namespace: &str, resource: &str) -> Result<u64, CopyError> {
        Ok(MemoryCopies::staged_transfers(self, namespace, resource))
    }

    async fn end_session(
        &self,
        _who: Contributor<'_>,
        held: &[(ResourceRef<'_>, &[String], u64)],
        _touched: &[(&str, &str)],
    ) -> Result<(), CopyError> {
        for (at, groups, copies) in held {
            MemoryCopies::release(self, *at, groups, *copies, &[]);
        }
        Ok(())
    }

    fn membership(&self) -> watch::Receiver<Membership> {
        MemoryCopies::membership(self)
    }

    fn expire_transfers(&self) -> usize {
        self.expire()
    }
}

#[cfg(test)]
mod tests;
