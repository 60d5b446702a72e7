//! The copy log of one process: counts and staged transfers in a map behind
//! one lock. Nothing to reap: when the process dies, its holds die with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use super::{Changed, CopyError, Membership, Reserved, Seized, Staged, hold_fields};
use crate::clock::{Clock, SystemClock};
use crate::engine::copies::{self, CopyCounts, CopyLimits};
use crate::store::ResourceRef;

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
    /// last was (ms), kept [`DONE_KEPT`](super::DONE_KEPT) after that.
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
    let kept = u64::try_from(super::DONE_KEPT.as_millis()).unwrap_or(u64::MAX);
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
        let secret = super::random_hex()?;
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
            transfer_id: super::transfer_id(&secret, at.namespace, at.resource),
        })
    }

    pub fn seize(&self, transfer_id: &str) -> Result<Seized, CopyError> {
        let (secret, namespace, resource) =
            super::parse_transfer_id(transfer_id).ok_or(CopyError::UnknownTransfer)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn at(domain: &str) -> ResourceRef<'_> {
        ResourceRef {
            namespace: "ns",
            resource: "pool",
            domain,
        }
    }

    fn limits() -> CopyLimits {
        CopyLimits {
            domain_limit: Some(4),
            global_limit: Some(6),
            groups: vec![("big".into(), 5)],
        }
    }

    /// The holder releases as done in two steps (the count, then the
    /// copies); a waiter for anyone's result, which read the count before,
    /// tries at any point between them, once or twice: it is never granted
    /// the copy, and it is told done whenever the count has moved.
    #[test]
    fn a_waiter_for_anyones_result_never_takes_a_copy_released_as_done() {
        let one = CopyLimits {
            domain_limit: Some(1),
            global_limit: None,
            groups: Vec::new(),
        };
        // Waiter tries at positions among the holder's steps (0: before
        // the count moves, 1: between, 2: after the release).
        for tries in [
            vec![0],
            vec![1],
            vec![2],
            vec![0, 1],
            vec![0, 2],
            vec![1, 2],
        ] {
            let log = MemoryCopies::new();
            assert_eq!(log.reserve(at("a"), &one, 1, 1).copies, 1);
            let before = log.done_count(at("a"));
            let mut answers = Vec::new();
            for step in 0..=2 {
                for _ in tries.iter().filter(|at| **at == step) {
                    answers.push(log.reserve_unless_done(at("a"), &one, 1, 1, before));
                }
                match step {
                    0 => {
                        log.mark_done(at("a"));
                    }
                    1 => {
                        log.release(at("a"), &[], 1, &[]);
                    }
                    _ => {}
                }
            }
            for (position, answer) in tries.iter().zip(&answers) {
                match answer {
                    Reserved::Done => assert!(*position >= 1, "{tries:?}: {answers:?}"),
                    Reserved::Decided(changed) => {
                        assert_eq!(*position, 0, "{tries:?}: {answers:?}");
                        assert_eq!(changed.copies, 0, "{tries:?}: the copy is still held");
                    }
                }
            }
        }
    }

    #[test]
    fn a_staged_transfer_counts_until_its_ttl_then_is_released() {
        let clock = ManualClock::new(1_000);
        let log = MemoryCopies::with_clock(clock.clone());
        let groups = vec!["big".to_owned()];
        assert_eq!(log.reserve(at("a"), &limits(), 4, 1).copies, 4);
        let staged = log.transfer(at("a"), &groups, 3, 500).unwrap();
        assert_eq!(staged.changed.copies, 3);
        // Still counted: `a` holds 1 in a session and 3 staged.
        assert_eq!(log.reserve(at("a"), &limits(), 1, 1).copies, 0);
        clock.set(1_499);
        assert_eq!(log.expire(), 0);
        clock.set(1_500);
        // Expired: it cannot be seized, and its copies are free again.
        assert_eq!(
            log.seize(&staged.transfer_id),
            Err(CopyError::UnknownTransfer)
        );
        assert_eq!(log.counts(at("a"), &["big"]).domain, 1);
        assert_eq!(log.reserve(at("a"), &limits(), 3, 3).copies, 3);
    }

    #[test]
    fn a_seized_transfer_keeps_its_domain_and_groups_and_is_seized_once() {
        let log = MemoryCopies::new();
        let groups = vec!["big".to_owned()];
        log.reserve(at("a"), &limits(), 2, 2);
        let staged = log.transfer(at("a"), &groups, 2, 60_000).unwrap();
        let seized = log.seize(&staged.transfer_id).unwrap();
        assert_eq!((seized.domain.as_str(), seized.copies), ("a", 2));
        assert_eq!(seized.groups, groups);
        assert_eq!(
            log.seize(&staged.transfer_id),
            Err(CopyError::UnknownTransfer)
        );
        let released = log.release(at("a"), &groups, 2, &["big"]);
        assert_eq!(released.copies, 2);
        assert_eq!(
            released.counts,
            CopyCounts {
                domain: 0,
                global: 0,
                groups: vec![0]
            }
        );
        assert!(log.is_empty());
    }

    #[test]
    fn a_release_never_takes_more_than_is_counted() {
        let log = MemoryCopies::new();
        log.reserve(at("a"), &limits(), 1, 1);
        let released = log.release(at("a"), &["big".to_owned()], 5, &["big"]);
        assert_eq!(released.copies, 1);
        assert!(log.is_empty());
    }
}
