//! A time-ordered log of granted hits, grouped by millisecond.
//!
//! Held in 8 bytes an instant (its offset from an instant at or before the
//! log's oldest, and its hits, 32 bits each) while both fit, which they do
//! unless the log spans more than 49 days or an instant holds more than 4
//! billion hits; then in 16 (docs/performance.md#flat-logs-and-tiers: a long
//! log's memory is its entries). Its room grows by a quarter, not by
//! doubling, for the same reason.

use std::collections::VecDeque;

/// An entry of the narrow form: the instant's offset above, its hits below.
const NARROW: u64 = 1 << 32;

/// A narrow entry as `(t, n)`, its offset counted from `base`.
fn unpack(base: u64, entry: u64) -> (u64, u64) {
    (base + (entry >> 32), entry & (NARROW - 1))
}

/// How many of the oldest `entries` have left a window of span `window` at
/// `now`, and their hits (one pass over them, not the log).
fn leading_expired(
    entries: impl Iterator<Item = (u64, u64)>,
    now: u64,
    window: u64,
) -> (usize, u64) {
    let (mut expired, mut hits) = (0, 0);
    for (t, n) in entries {
        if t.saturating_add(window) >= now {
            break;
        }
        expired += 1;
        hits += n;
    }
    (expired, hits)
}

/// Granted hits as `(time, count)` pairs in time order; a bulk grant at one
/// instant is one pair, so memory is bounded by distinct instants, not hits.
///
/// Window rule (docs/design.md#window-rule): a hit at `t` counts in a
/// window of span `w` while `now <= t + w`; it leaves the window at
/// `t + w + 1`.
#[derive(Debug, Clone, Default)]
pub struct HitLog {
    entries: Entries,
    total: u64,
}

#[derive(Debug, Clone)]
enum Entries {
    /// `(t - base) << 32 | n`, every offset and count below 2^32, and
    /// `base` at or below every instant.
    Narrow { base: u64, packed: VecDeque<u64> },
    /// `(t, n)`: a log that did not fit the narrow form (it stays wide
    /// until cleared).
    Wide(VecDeque<(u64, u64)>),
}

impl Default for Entries {
    fn default() -> Self {
        Entries::Narrow {
            base: 0,
            packed: VecDeque::new(),
        }
    }
}

/// Two logs are equal when they hold the same entries, whatever the form.
impl PartialEq for HitLog {
    fn eq(&self, other: &Self) -> bool {
        self.total == other.total && self.entries().eq(other.entries())
    }
}

impl Eq for HitLog {}

/// Room for one more entry: one for a first entry (most logs of a store of
/// many keys hold one instant), then a quarter more, so a long log wastes at
/// most a fifth of its room (pushes stay amortized constant time).
fn make_room<T>(entries: &mut VecDeque<T>) {
    if entries.len() == entries.capacity() {
        entries.reserve_exact((entries.len() / 4).max(1));
    }
}

/// The entries of either form, oldest first.
enum Iter<'a> {
    Narrow(u64, std::collections::vec_deque::Iter<'a, u64>),
    Wide(std::collections::vec_deque::Iter<'a, (u64, u64)>),
}

impl Iterator for Iter<'_> {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        match self {
            Iter::Narrow(base, packed) => packed.next().map(|&entry| unpack(*base, entry)),
            Iter::Wide(entries) => entries.next().copied(),
        }
    }
}

impl HitLog {
    /// A log with no hits (for a `const`).
    pub const EMPTY: HitLog = HitLog {
        entries: Entries::Narrow {
            base: 0,
            packed: VecDeque::new(),
        },
        total: 0,
    };

    fn iter(&self) -> Iter<'_> {
        match &self.entries {
            Entries::Narrow { base, packed } => Iter::Narrow(*base, packed.iter()),
            Entries::Wide(entries) => Iter::Wide(entries.iter()),
        }
    }

    /// The log in the wide form, from now on.
    fn widen(&mut self) -> &mut VecDeque<(u64, u64)> {
        if let Entries::Narrow { .. } = self.entries {
            let mut wide = VecDeque::with_capacity(self.len() + 1);
            wide.extend(self.iter());
            self.entries = Entries::Wide(wide);
        }
        match &mut self.entries {
            Entries::Wide(entries) => entries,
            Entries::Narrow { .. } => unreachable!("widened above"),
        }
    }

    /// Appends `(t, n)` as a new entry, in whichever form holds it.
    fn append(&mut self, t: u64, n: u64) {
        if let Entries::Narrow { base, packed } = &mut self.entries {
            if packed.is_empty() {
                *base = t;
            }
            if t >= *base && n < NARROW {
                if t - *base >= NARROW
                    && let Some(shift) = packed.iter().map(|&entry| entry >> 32).min()
                {
                    // Offsets count from the first instant pushed: move
                    // them down to the oldest left (once per 49 days of a
                    // long window).
                    *base += shift;
                    for entry in packed.iter_mut() {
                        *entry -= shift << 32;
                    }
                }
                if t - *base < NARROW {
                    make_room(packed);
                    packed.push_back(((t - *base) << 32) | n);
                    return;
                }
            }
        }
        let entries = self.widen();
        make_room(entries);
        entries.push_back((t, n));
    }

    /// Every hit the log holds, counting or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Hits that count in a window of span `window` at `now`.
    pub fn count(&self, now: u64, window: u64) -> u64 {
        self.total - self.expired(now, window).1
    }

    /// How many entries have left a window of span `window` at `now`, and
    /// their hits. Each form is scanned by its own loop, not through
    /// [`Iter`], whose `next` would ask for the form at every entry.
    fn expired(&self, now: u64, window: u64) -> (usize, u64) {
        match &self.entries {
            Entries::Narrow { base, packed } => leading_expired(
                packed.iter().map(|&entry| unpack(*base, entry)),
                now,
                window,
            ),
            Entries::Wide(wide) => leading_expired(wide.iter().copied(), now, window),
        }
    }

    /// Drops what no longer counts at `now`.
    pub fn prune(&mut self, now: u64, window: u64) {
        let (entries, hits) = self.expired(now, window);
        self.drop_oldest(entries, hits);
    }

    /// Records `n` hits at `now` (`now` never goes below the last entry's time
    /// for a given store; if a clock steps back, the hits join the last entry).
    pub fn push(&mut self, now: u64, n: u64) {
        if n == 0 {
            return;
        }
        if self.last().is_some_and(|last| last >= now) {
            self.add_to_newest(n);
        } else {
            self.append(now, n);
        }
        self.total += n;
    }

    /// Adds `n` hits to the newest entry, in the wide form if they take its
    /// count past 32 bits.
    fn add_to_newest(&mut self, n: u64) {
        if let Entries::Narrow { packed, .. } = &mut self.entries
            && let Some(entry) = packed.back_mut()
            && (*entry & (NARROW - 1))
                .checked_add(n)
                .is_some_and(|sum| sum < NARROW)
        {
            *entry += n;
            return;
        }
        if let Some((_, count)) = self.widen().back_mut() {
            *count += n;
        }
    }

    /// Keeps only the `limit` most recent hits (the oldest go first, part
    /// of an instant's if need be).
    pub fn truncate(&mut self, limit: u64) {
        let mut excess = self.total.saturating_sub(limit);
        let (mut whole, mut hits) = (0, 0);
        for (_, n) in self.iter() {
            if excess == 0 || n > excess {
                break;
            }
            excess -= n;
            whole += 1;
            hits += n;
        }
        self.drop_oldest(whole, hits);
        // What is left of the excess is part of the oldest entry, if any.
        let oldest = match &mut self.entries {
            Entries::Narrow { packed, .. } => packed.front_mut(),
            Entries::Wide(entries) => entries.front_mut().map(|(_, count)| count),
        };
        if excess > 0
            && let Some(count) = oldest
        {
            *count -= excess;
            self.total -= excess;
        }
    }

    /// Drops the oldest `entries`, which hold `hits`.
    fn drop_oldest(&mut self, entries: usize, hits: u64) {
        if entries == 0 {
            return;
        }
        match &mut self.entries {
            Entries::Narrow { packed, .. } => packed.drain(..entries).for_each(drop),
            Entries::Wide(wide) => wide.drain(..entries).for_each(drop),
        }
        self.total -= hits;
    }

    /// Empties the log, keeping its room (in the narrow form, which a
    /// wide log leaves here).
    pub fn clear(&mut self) {
        match &mut self.entries {
            Entries::Narrow { packed, .. } => packed.clear(),
            Entries::Wide(_) => self.entries = Entries::default(),
        }
        self.total = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time of the most recent hit.
    pub fn last(&self) -> Option<u64> {
        match &self.entries {
            Entries::Narrow { base, packed } => packed.back().map(|&entry| unpack(*base, entry).0),
            Entries::Wide(entries) => entries.back().map(|&(t, _)| t),
        }
    }

    /// The first instant at which no hit counts any more in a window of
    /// span `window` (0 for an empty log).
    pub fn counts_until(&self, window: u64) -> u64 {
        self.last()
            .map_or(0, |t| t.saturating_add(window).saturating_add(1))
    }

    /// The oldest hit that still counts at `now`.
    pub fn oldest_counting(&self, now: u64, window: u64) -> Option<u64> {
        self.iter()
            .map(|(t, _)| t)
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
        for (t, n) in self.iter() {
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
        self.iter()
    }

    /// How many entries (distinct instants) the log holds.
    pub fn len(&self) -> usize {
        match &self.entries {
            Entries::Narrow { packed, .. } => packed.len(),
            Entries::Wide(entries) => entries.len(),
        }
    }

    /// The log of `entries` as [`entries`](Self::entries) gave them, with
    /// room for exactly those when the iterator knows its length (stores
    /// refill a log in place with [`push_entry`](Self::push_entry)).
    #[cfg(test)]
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut log = HitLog::default();
        for (t, n) in entries {
            log.push_entry(t, n);
        }
        log
    }

    /// Appends an entry as [`entries`](Self::entries) gave it, unmerged
    /// (for stores that serialize state: after [`clear`](Self::clear), a
    /// log refilled in the room it already has).
    pub fn push_entry(&mut self, t: u64, n: u64) {
        self.append(t, n);
        self.total = self.total.wrapping_add(n);
    }
}

#[cfg(test)]
mod tests;
