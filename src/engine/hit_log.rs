//! A time-ordered log of granted hits, grouped by millisecond.

use std::collections::VecDeque;

/// Granted hits as `(time, count)` pairs in time order; a bulk grant at one
/// instant is one pair, so memory is bounded by distinct instants, not hits.
///
/// Window rule (docs/design.md#window-rule): a hit at `t` counts in a
/// window of span `w` while `now <= t + w`; it leaves the window at
/// `t + w + 1`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HitLog {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl HitLog {
    /// A log with no hits (for a `const`).
    pub const EMPTY: HitLog = HitLog {
        entries: VecDeque::new(),
        total: 0,
    };

    /// Hits that count in a window of span `window` at `now`.
    pub fn count(&self, now: u64, window: u64) -> u64 {
        let mut expired = 0;
        for &(t, n) in &self.entries {
            if t.saturating_add(window) >= now {
                break;
            }
            expired += n;
        }
        self.total - expired
    }

    /// Drops what no longer counts at `now`.
    pub fn prune(&mut self, now: u64, window: u64) {
        while let Some(&(t, n)) = self.entries.front() {
            if t.saturating_add(window) >= now {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
    }

    /// Records `n` hits at `now` (`now` never goes below the last entry's time
    /// for a given store; if a clock steps back, the hits join the last entry).
    pub fn push(&mut self, now: u64, n: u64) {
        if n == 0 {
            return;
        }
        match self.entries.back_mut() {
            Some((t, count)) if *t >= now => *count += n,
            _ => {
                // Most logs of a store of many keys hold one instant: room
                // for one (16 bytes), not the four a first push would
                // allocate (docs/performance.md#footprint-and-growth).
                if self.entries.capacity() == 0 {
                    self.entries.reserve_exact(1);
                }
                self.entries.push_back((now, n));
            }
        }
        self.total += n;
    }

    /// Keeps only the `limit` most recent hits (the oldest go first, part
    /// of an instant's if need be).
    pub fn truncate(&mut self, limit: u64) {
        while self.total > limit {
            let Some(front) = self.entries.front_mut() else {
                break;
            };
            let excess = self.total - limit;
            if front.1 <= excess {
                self.total -= front.1;
                self.entries.pop_front();
            } else {
                front.1 -= excess;
                self.total = limit;
            }
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.total = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The time of the most recent hit.
    pub fn last(&self) -> Option<u64> {
        self.entries.back().map(|&(t, _)| t)
    }

    /// The first instant at which no hit counts any more in a window of
    /// span `window` (0 for an empty log).
    pub fn counts_until(&self, window: u64) -> u64 {
        self.last()
            .map_or(0, |t| t.saturating_add(window).saturating_add(1))
    }

    /// The oldest hit that still counts at `now`.
    pub fn oldest_counting(&self, now: u64, window: u64) -> Option<u64> {
        self.entries
            .iter()
            .map(|&(t, _)| t)
            .find(|t| t.saturating_add(window) >= now)
    }

    /// The earliest instant `>= now` at which fewer than `limit` hits count,
    /// if nothing else is recorded. `None` when that never happens (`limit` 0).
    pub fn below_limit_at(&self, now: u64, window: u64, limit: u64) -> Option<u64> {
        if limit == 0 {
            return None;
        }
        let mut counting = self.count(now, window);
        if counting < limit {
            return Some(now);
        }
        for &(t, n) in &self.entries {
            if t.saturating_add(window) < now {
                continue;
            }
            counting -= n;
            if counting < limit {
                // A window of `forever` never lets a hit go.
                return t.checked_add(window).and_then(|end| end.checked_add(1));
            }
        }
        None
    }

    /// The entries, oldest first (for stores that serialize state).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// How many entries (distinct instants) the log holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The log of `entries` as [`entries`](Self::entries) gave them, with
    /// room for exactly those when the iterator knows its length (stores
    /// refill a log in place with [`push_entry`](Self::push_entry)).
    #[cfg(test)]
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let entries = entries.into_iter();
        let mut log = HitLog {
            entries: VecDeque::with_capacity(entries.size_hint().0),
            total: 0,
        };
        for (t, n) in entries {
            log.push_entry(t, n);
        }
        log
    }

    /// Appends an entry as [`entries`](Self::entries) gave it, unmerged
    /// (for stores that serialize state: after [`clear`](Self::clear), a
    /// log refilled in the room it already has).
    pub fn push_entry(&mut self, t: u64, n: u64) {
        self.entries.push_back((t, n));
        self.total = self.total.wrapping_add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_counts_until_its_window_has_passed() {
        let mut log = HitLog::default();
        log.push(1_000, 2);
        assert_eq!(log.count(1_000, 100), 2);
        assert_eq!(log.count(1_100, 100), 2);
        assert_eq!(log.count(1_101, 100), 0);
        assert_eq!(log.below_limit_at(1_000, 100, 2), Some(1_101));
        assert_eq!(log.below_limit_at(1_000, 100, 3), Some(1_000));
        assert_eq!(log.below_limit_at(1_000, 100, 0), None);
        log.prune(1_101, 100);
        assert!(log.is_empty());
    }

    #[test]
    fn bulk_hits_at_one_instant_are_one_entry() {
        let mut log = HitLog::default();
        log.push(5, 3);
        log.push(5, 4);
        log.push(6, 1);
        assert_eq!(log.entries().collect::<Vec<_>>(), vec![(5, 7), (6, 1)]);
        assert_eq!(log.below_limit_at(6, 10, 2), Some(16));
    }
}
