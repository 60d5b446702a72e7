//! Recent decisions for the state view (`/debug/state`, `/ui/state`), kept
//! only for the (namespace, resource, domain) someone is looking at.
//!
//! Recording every decision would cost the hot path a lock and an allocation
//! for a page that is rarely open. Instead a look at the state view starts a
//! watch; decisions are recorded from then on, while the view keeps looking
//! (a watch ends [`WATCH_FOR`] after the last look). With nobody watching,
//! recording is one relaxed atomic load; while someone watches, decisions on
//! other keys compare against a lock-free list and take no lock. Bounded: at most [`MAX_WATCHED`]
//! watches (a new one ends the stalest) of [`RECENT`] decisions each.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;

/// Watches at most.
pub const MAX_WATCHED: usize = 16;
/// Decisions kept per watch.
pub const RECENT: usize = 50;
/// A watch ends this long after its last look.
pub const WATCH_FOR: Duration = Duration::from_secs(60);

/// One decision, as the state view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recent {
    /// The store's time of the decision (Unix ms).
    pub at_ms: u64,
    /// `request` (Charon API, layer, client), `envoy` (RLS), `reserve`,
    /// `release`, `transfer`, `seize`.
    pub op: &'static str,
    pub granted: bool,
    /// Hits or copies granted (asked, when rejected).
    pub copies: u64,
    /// The current tier after the decision (1-indexed; 0 for copies).
    pub tier: usize,
}

/// What a look returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// When this watch started (Unix ms): no decision before it is shown.
    pub watching_since_ms: u64,
    /// Oldest first.
    pub recent: Vec<Recent>,
}

/// The watches of one process.
#[derive(Default)]
pub struct Watch {
    /// How many watches are open: the hot path's only cost when 0.
    open: AtomicUsize,
    /// What is watched, read without the lock, so that decisions on other
    /// keys never take it.
    keys: ArcSwap<Vec<WatchedKey>>,
    watched: Mutex<Vec<Watched>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct WatchedKey {
    namespace: String,
    resource: String,
    domain: String,
}

impl WatchedKey {
    fn is(&self, namespace: &str, resource: &str, domain: &str) -> bool {
        self.domain == domain && self.resource == resource && self.namespace == namespace
    }
}

struct Watched {
    key: WatchedKey,
    since_ms: u64,
    last_look: Instant,
    recent: VecDeque<Recent>,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, Vec<Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the watches nobody looked at for [`WATCH_FOR`], and publishes
    /// what is watched.
    fn forget_stale(&self, watched: &mut Vec<Watched>, now: Instant) {
        let before = watched.len();
        watched.retain(|watch| now.duration_since(watch.last_look) < WATCH_FOR);
        if watched.len() != before {
            self.publish(watched);
        }
    }

    fn publish(&self, watched: &[Watched]) {
        self.keys.store(Arc::new(
            watched.iter().map(|watch| watch.key.clone()).collect(),
        ));
        self.open.store(watched.len(), Ordering::Relaxed);
    }

    /// Whether anything is watched: callers with work to do before
    /// [`record`](Self::record) check this first.
    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Relaxed) > 0
    }

    /// Records a decision if its (namespace, resource, domain) is watched;
    /// `decision` is only called then.
    #[inline]
    pub fn record(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        decision: impl FnOnce() -> Recent,
    ) {
        if !self.is_open() {
            return;
        }
        let watched = self.keys.load();
        if watched
            .iter()
            .any(|key| key.is(namespace, resource, domain))
        {
            self.record_watched(namespace, resource, domain, decision());
        }
    }

    #[cold]
    fn record_watched(&self, namespace: &str, resource: &str, domain: &str, decision: Recent) {
        let mut watched = self.lock();
        self.forget_stale(&mut watched, Instant::now());
        if let Some(watch) = watched
            .iter_mut()
            .find(|watch| watch.key.is(namespace, resource, domain))
        {
            if watch.recent.len() >= RECENT {
                watch.recent.pop_front();
            }
            watch.recent.push_back(decision);
        }
    }

    /// Looks at (namespace, resource, domain): starts or renews its watch,
    /// and returns the decisions recorded since the watch started.
    pub fn look(&self, namespace: &str, resource: &str, domain: &str, now_ms: u64) -> Seen {
        let now = Instant::now();
        let mut watched = self.lock();
        self.forget_stale(&mut watched, now);
        if let Some(watch) = watched
            .iter_mut()
            .find(|watch| watch.key.is(namespace, resource, domain))
        {
            watch.last_look = now;
            return Seen {
                watching_since_ms: watch.since_ms,
                recent: watch.recent.iter().cloned().collect(),
            };
        }
        if watched.len() >= MAX_WATCHED
            && let Some(stalest) = watched
                .iter()
                .enumerate()
                .min_by_key(|(_, watch)| watch.last_look)
                .map(|(index, _)| index)
        {
            watched.swap_remove(stalest);
        }
        watched.push(Watched {
            key: WatchedKey {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
                domain: domain.to_owned(),
            },
            since_ms: now_ms,
            last_look: now,
            recent: VecDeque::with_capacity(RECENT),
        });
        self.publish(&watched);
        Seen {
            watching_since_ms: now_ms,
            recent: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(at_ms: u64) -> Recent {
        Recent {
            at_ms,
            op: "request",
            granted: true,
            copies: 1,
            tier: 1,
        }
    }

    #[test]
    fn records_only_what_is_watched_and_keeps_the_latest() {
        let watch = Watch::default();
        watch.record("ns", "api", "acme", || unreachable!("nobody watches"));
        assert!(watch.look("ns", "api", "acme", 7).recent.is_empty());
        watch.record("ns", "api", "other", || decision(1));
        for at in 0..(RECENT as u64 + 5) {
            watch.record("ns", "api", "acme", || decision(at));
        }
        let seen = watch.look("ns", "api", "acme", 99);
        assert_eq!(seen.watching_since_ms, 7);
        assert_eq!(seen.recent.len(), RECENT);
        assert_eq!(seen.recent[0].at_ms, 5);
        assert_eq!(seen.recent[RECENT - 1].at_ms, RECENT as u64 + 4);
    }

    #[test]
    fn at_most_so_many_watches() {
        let watch = Watch::default();
        for domain in 0..(MAX_WATCHED + 3) {
            watch.look("ns", "api", &domain.to_string(), 0);
        }
        assert_eq!(watch.lock().len(), MAX_WATCHED);
        assert_eq!(watch.open.load(Ordering::Relaxed), MAX_WATCHED);
    }
}
