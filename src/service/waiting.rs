//! Reserves waiting for copies (docs/design.md#waiting-for-a-copy): a queue
//! per (namespace, resource, domain), served by criticality then arrival.
//!
//! Only the head of a queue tries the store, so the queue's order is the
//! order copies are granted in. The head tries again when a release on this
//! sidecar frees copies of its resource (any domain: copies of a resource
//! may be counted across domains), when the head before it leaves, and at
//! least every [`POLL`]: copies released on another sidecar of the same
//! Redis, or by a transfer that expired, are seen within that bound. A
//! waiter that leaves, granted, gone or past its deadline, hands the head to
//! the next one at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::criticality::Criticality;

use super::ops::ResourceKey;

/// The most reserves that may wait in one queue.
pub const MAX_WAITERS: usize = 1_024;

/// The longest a queue's head goes without trying the store.
pub const POLL: Duration = Duration::from_millis(50);

struct Waiter {
    ticket: u64,
    wake: Arc<Notify>,
}

/// One (namespace, resource, domain)'s waiting reserves, one line per level.
#[derive(Default)]
struct Queue {
    levels: [VecDeque<Waiter>; 4],
}

impl Queue {
    fn len(&self) -> usize {
        self.levels.iter().map(VecDeque::len).sum()
    }

    /// The most critical, longest waiting.
    fn head(&self) -> Option<&Waiter> {
        self.levels.iter().rev().find_map(VecDeque::front)
    }
}

/// (namespace, resource) → domain → queue.
type Queues = HashMap<(String, String), HashMap<String, Queue>>;

#[derive(Default)]
struct State {
    queues: Queues,
    next_ticket: u64,
}

/// Every queue of the service.
#[derive(Default, Clone)]
pub struct WaitQueues {
    state: Arc<Mutex<State>>,
    /// Reserves waiting in all queues: a release checks it before the lock.
    waiting: Arc<AtomicUsize>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Each method leaves the queues whole.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl WaitQueues {
    /// Whether reserves wait for copies of `at`'s resource and domain.
    pub fn has_waiters(&self, at: &ResourceKey) -> bool {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let state = lock(&self.state);
        state
            .queues
            .get(&(at.namespace.clone(), at.resource.clone()))
            .and_then(|domains| domains.get(&at.domain))
            .is_some_and(|queue| queue.len() > 0)
    }

    /// Takes a place in `at`'s queue at `level`.
    pub fn join(&self, at: &ResourceKey, level: Criticality) -> Result<Place, Full> {
        let mut state = lock(&self.state);
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let queue = state
            .queues
            .entry((at.namespace.clone(), at.resource.clone()))
            .or_default()
            .entry(at.domain.clone())
            .or_default();
        if queue.len() >= MAX_WAITERS {
            return Err(Full);
        }
        let wake = Arc::new(Notify::new());
        queue.levels[level.rank()].push_back(Waiter {
            ticket,
            wake: wake.clone(),
        });
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Ok(Place {
            queues: self.clone(),
            resource: (at.namespace.clone(), at.resource.clone()),
            domain: at.domain.clone(),
            level,
            ticket,
            wake,
        })
    }

    /// Work guarded by copies of `at` was released as done here: every
    /// reserve waiting on `at` looks now (those waiting for anyone's
    /// result are answered; the others try on as before).
    pub fn done(&self, at: &ResourceKey) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let state = lock(&self.state);
        let queue = state
            .queues
            .get(&(at.namespace.clone(), at.resource.clone()))
            .and_then(|domains| domains.get(&at.domain));
        for waiter in queue
            .into_iter()
            .flat_map(|queue| queue.levels.iter().flatten())
        {
            waiter.wake.notify_one();
        }
    }

    /// Copies of `namespace`/`resource` were released here: the head of
    /// each of its queues tries now.
    pub fn released(&self, namespace: &str, resource: &str) {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let state = lock(&self.state);
        let key = (namespace.to_owned(), resource.to_owned());
        for queue in state.queues.get(&key).into_iter().flat_map(HashMap::values) {
            if let Some(head) = queue.head() {
                head.wake.notify_one();
            }
        }
    }
}

/// A reserve's place in its queue; leaving it (by drop) hands the head to
/// the next.
pub struct Place {
    queues: WaitQueues,
    /// (namespace, resource) and domain: where its queue is.
    resource: (String, String),
    domain: String,
    level: Criticality,
    ticket: u64,
    wake: Arc<Notify>,
}

impl Place {
    /// Whether this reserve is its queue's head: the one that tries.
    pub fn is_head(&self) -> bool {
        let state = lock(&self.queues.state);
        state
            .queues
            .get(&self.resource)
            .and_then(|domains| domains.get(&self.domain))
            .and_then(Queue::head)
            .is_some_and(|head| head.ticket == self.ticket)
    }

    /// Until this reserve is told to try.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = lock(&self.queues.state);
        let Some(domains) = state.queues.get_mut(&self.resource) else {
            return;
        };
        let Some(queue) = domains.get_mut(&self.domain) else {
            return;
        };
        let line = &mut queue.levels[self.level.rank()];
        if let Some(at) = line.iter().position(|waiter| waiter.ticket == self.ticket) {
            line.remove(at);
            self.queues.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        match queue.head() {
            Some(next) => next.wake.notify_one(),
            None => {
                domains.remove(&self.domain);
                if domains.is_empty() {
                    state.queues.remove(&self.resource);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Criticality::*;

    fn at(domain: &str) -> ResourceKey {
        ResourceKey::new("ns", "pool", domain)
    }

    #[test]
    fn the_head_is_the_most_critical_then_the_longest_waiting() {
        let queues = WaitQueues::default();
        let first = queues.join(&at("a"), Sheddable).ok();
        let second = queues.join(&at("a"), Critical).ok();
        let third = queues.join(&at("a"), Critical).ok();
        let other = queues.join(&at("b"), Sheddable).ok();
        let heads = |places: &[&Option<Place>]| -> Vec<bool> {
            places
                .iter()
                .map(|place| place.as_ref().is_some_and(Place::is_head))
                .collect()
        };
        assert_eq!(
            heads(&[&first, &second, &third, &other]),
            [false, true, false, true]
        );
        drop(second);
        assert_eq!(heads(&[&first, &third]), [false, true]);
        drop(third);
        assert_eq!(heads(&[&first]), [true]);
        assert!(queues.has_waiters(&at("a")));
        drop(first);
        assert!(!queues.has_waiters(&at("a")));
        drop(other);
        assert_eq!(queues.waiting.load(Ordering::Relaxed), 0);
        assert!(lock(&queues.state).queues.is_empty());
    }

    #[test]
    fn a_full_queue_takes_no_more() {
        let queues = WaitQueues::default();
        let places: Vec<Place> = (0..MAX_WAITERS)
            .filter_map(|_| queues.join(&at("a"), CriticalPlus).ok())
            .collect();
        assert_eq!(places.len(), MAX_WAITERS);
        assert!(queues.join(&at("a"), CriticalPlus).is_err());
        // Another domain has its own queue.
        assert!(queues.join(&at("b"), Sheddable).is_ok());
    }
}
