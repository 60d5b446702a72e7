//! One shard of the memory store: its keys' states in open-addressing
//! tables of fixed-size entries (docs/performance.md#footprint-and-growth).
//!
//! Each kind with a compact layout has its own [`Table`] of 32-byte
//! [`Packed`] entries; sliding logs and tier resources are held as
//! [`flat`](super::flat) bytes in a table of their own; every other state
//! (costs, bans, resource-wide logs, and a compact kind whose numbers do
//! not fit) is boxed in one more table of 24-byte entries. A key is in at
//! most one table: its kind picks the compact or the flat table, and a
//! state moves to the boxed one only when it stops fitting (and back
//! when it fits again).
//!
//! The shards differ in size on purpose ([`staggered`]): a table doubles
//! its capacity when it fills, and equal shards would all double at once,
//! leaving the whole store half empty at that moment. Shards whose shares
//! of the keys are spread over a factor of two double one after another,
//! so that the store's spare room stays near its average.

use hashbrown::HashTable;

use crate::engine::{Slot, SlotKind};

use super::flat;
use super::id::KeyId;
use super::packed::{COMPACT_KINDS, Packed, table_of};
use super::table::Table;

/// What became of a key's entry after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
    /// No change in the number of keys held.
    Same,
    Added,
    Dropped,
    /// A new key's state, not kept: the store is full.
    Unrecorded,
}

#[derive(Default)]
pub(super) struct Shard {
    compact: [Table; COMPACT_KINDS.len()],
    flat: HashTable<(KeyId, Box<[u8]>)>,
    scratch: flat::Scratch,
    boxed: HashTable<(KeyId, Box<Slot>)>,
    decisions_since_sweep: u32,
    added_since_sweep: usize,
    held_after_sweep: usize,
}

/// A shard is swept once it has added a quarter of what its last sweep
/// left, and at least this many keys: sweeping costs a visit of every
/// entry, so about five visits per key added.
const SWEEP_AFTER_ADDED: usize = 1_024;
/// A full store's shard is swept after this many of its decisions, so
/// that keys past their expiry make room for new ones.
const SWEEP_WHEN_FULL_EVERY: u32 = 4_096;

impl Shard {
    /// Runs `decide` on the state `id` holds (a fresh one if it holds
    /// none, or only state past its expiry), and keeps what it leaves if
    /// that can still matter (a new key only when there is `room`).
    pub fn decide<R>(
        &mut self,
        id: KeyId,
        kind: SlotKind,
        now: u64,
        room: bool,
        decide: impl FnOnce(&mut Slot) -> R,
    ) -> (R, Kept) {
        if let Some(table) = table_of(kind)
            && let Some(index) = self.compact[table].find(id)
        {
            let held = self.compact[table].get(index).unpack(kind);
            let live = held.expires_at() > now;
            let mut slot = if live { held } else { Slot::new(kind) };
            let answer = decide(&mut slot);
            return (answer, self.write_back(table, index, id, slot, now));
        }
        if flat::is_flat(kind)
            && let Ok(mut entry) = self
                .flat
                .find_entry(id.table_hash(), |(held, _)| *held == id)
        {
            let slot = self.scratch.read(kind, &entry.get().1, now);
            let answer = decide(slot);
            if slot.expires_at() <= now {
                entry.remove();
                return (answer, Kept::Dropped);
            }
            match flat::write(slot) {
                Some(bytes) => overwrite(&mut entry.get_mut().1, &bytes),
                // Too many instants to be flat any more.
                None => {
                    let slot = std::mem::replace(slot, Slot::new(kind));
                    entry.remove();
                    self.unflatten(id, slot);
                }
            }
            return (answer, Kept::Same);
        }
        if !self.boxed.is_empty()
            && let Ok(mut entry) = self
                .boxed
                .find_entry(id.table_hash(), |(held, _)| *held == id)
        {
            let slot = &mut entry.get_mut().1;
            if slot.expires_at() <= now {
                **slot = Slot::new(kind);
            }
            let answer = decide(slot);
            if slot.expires_at() <= now {
                entry.remove();
                return (answer, Kept::Dropped);
            }
            // A log too long to be flat that has become short enough.
            if let Some(bytes) = flat::encode(slot) {
                entry.remove();
                self.insert_flat(id, bytes);
                shrink_if_sparse(&mut self.boxed);
            }
            return (answer, Kept::Same);
        }
        let mut slot = Slot::new(kind);
        let answer = decide(&mut slot);
        (answer, self.keep(id, slot, false, now, room))
    }

    /// The state `id` holds, for [`keep`](Self::keep) to put back: a
    /// boxed state is taken out; a compact or flat entry stays where it
    /// is, so that `keep` writes it back in place rather than removing it
    /// (which shifts a compact table's entries after it) and inserting it
    /// again.
    pub fn take(&mut self, id: KeyId, kind: SlotKind) -> Option<Slot> {
        if let Some(table) = table_of(kind)
            && let Some(index) = self.compact[table].find(id)
        {
            return Some(self.compact[table].get(index).unpack(kind));
        }
        if flat::is_flat(kind)
            && let Some((_, bytes)) = self.flat.find(id.table_hash(), |(held, _)| *held == id)
        {
            return Some(self.scratch.take(kind, bytes));
        }
        if self.boxed.is_empty() {
            return None;
        }
        let entry = self
            .boxed
            .find_entry(id.table_hash(), |(held, _)| *held == id)
            .ok()?;
        Some(*entry.remove().0.1)
    }

    /// Puts `slot` under `id` if it can still matter (and, for a key that
    /// did not exist, if there is `room`), after [`take`](Self::take).
    pub fn keep(&mut self, id: KeyId, slot: Slot, existed: bool, now: u64, room: bool) -> Kept {
        if existed
            && let Some(table) = table_of(slot.kind())
            && let Some(index) = self.compact[table].find(id)
        {
            return self.write_back(table, index, id, slot, now);
        }
        if existed
            && flat::is_flat(slot.kind())
            && let Ok(mut entry) = self
                .flat
                .find_entry(id.table_hash(), |(held, _)| *held == id)
        {
            if slot.expires_at() <= now {
                entry.remove();
                self.scratch.give_back(slot);
                return Kept::Dropped;
            }
            match flat::write(&slot) {
                Some(bytes) => {
                    overwrite(&mut entry.get_mut().1, &bytes);
                    self.scratch.give_back(slot);
                }
                None => {
                    entry.remove();
                    self.unflatten(id, slot);
                }
            }
            return Kept::Same;
        }
        let keep = slot.expires_at() > now;
        match (keep, existed) {
            (false, false) => return Kept::Same,
            (false, true) => return Kept::Dropped,
            (true, false) if !room => return Kept::Unrecorded,
            (true, _) => {}
        }
        if let Some((table, packed)) =
            table_of(slot.kind()).and_then(|table| Some((table, Packed::pack(id, &slot)?)))
        {
            self.compact[table].insert(packed);
        } else if let Some(bytes) = flat::encode(&slot) {
            self.insert_flat(id, bytes);
        } else {
            self.insert_boxed(id, Box::new(slot));
        }
        if existed {
            Kept::Same
        } else {
            self.added_since_sweep += 1;
            Kept::Added
        }
    }

    /// Writes `slot` over the compact entry at `index` of `table`: in
    /// place while it fits, boxed when it stops fitting, dropped once it
    /// can no longer change a decision.
    fn write_back(&mut self, table: usize, index: usize, id: KeyId, slot: Slot, now: u64) -> Kept {
        if slot.expires_at() <= now {
            self.compact[table].remove(index);
            return Kept::Dropped;
        }
        match Packed::pack(id, &slot) {
            Some(packed) => self.compact[table].set(index, packed),
            None => {
                self.compact[table].remove(index);
                self.insert_boxed(id, Box::new(slot));
            }
        }
        Kept::Same
    }

    fn insert_flat(&mut self, id: KeyId, bytes: Box<[u8]>) {
        self.flat
            .insert_unique(id.table_hash(), (id, bytes), |(id, _)| id.table_hash());
    }

    /// A flat state grown past the flat form, into the boxed table.
    fn unflatten(&mut self, id: KeyId, slot: Slot) {
        self.insert_boxed(id, Box::new(slot));
        shrink_if_sparse(&mut self.flat);
    }

    fn insert_boxed(&mut self, id: KeyId, slot: Box<Slot>) {
        self.boxed
            .insert_unique(id.table_hash(), (id, slot), |(id, _)| id.table_hash());
    }

    /// A copy of the state `id` holds, if any.
    pub fn get(&self, id: KeyId, kind: SlotKind) -> Option<Slot> {
        if let Some(table) = table_of(kind)
            && let Some(index) = self.compact[table].find(id)
        {
            return Some(self.compact[table].get(index).unpack(kind));
        }
        if flat::is_flat(kind)
            && let Some((_, bytes)) = self.flat.find(id.table_hash(), |(held, _)| *held == id)
        {
            return flat::decode(bytes, kind);
        }
        self.boxed
            .find(id.table_hash(), |(held, _)| *held == id)
            .map(|(_, slot)| (**slot).clone())
    }

    /// Counts a decision; whether the shard is due a sweep, given whether
    /// the store has `room` for new keys.
    ///
    /// Sweeps follow the keys a shard adds, not its decisions: a store
    /// whose keys stay (however many decisions they take) is never swept
    /// on the decision path, and one whose keys come and go is swept
    /// before its tables double for keys already past their expiry
    /// (docs/performance.md#footprint-and-growth).
    pub fn count_decision(&mut self, room: bool) -> bool {
        self.decisions_since_sweep = self.decisions_since_sweep.saturating_add(1);
        self.added_since_sweep >= (self.held_after_sweep / 4).max(SWEEP_AFTER_ADDED)
            || (!room && self.decisions_since_sweep >= SWEEP_WHEN_FULL_EVERY)
    }

    /// Drops every state that can no longer change a decision; how many.
    pub fn sweep(&mut self, now: u64) -> usize {
        let before = self.len();
        for (table, kind) in self.compact.iter_mut().zip(COMPACT_KINDS) {
            table.retain(|packed| packed.expires_at(kind) > now);
        }
        self.flat.retain(|(_, bytes)| flat::expires_at(bytes) > now);
        self.boxed.retain(|(_, slot)| slot.expires_at() > now);
        shrink_if_sparse(&mut self.flat);
        shrink_if_sparse(&mut self.boxed);
        self.decisions_since_sweep = 0;
        self.added_since_sweep = 0;
        self.held_after_sweep = self.len();
        before - self.held_after_sweep
    }

    pub fn len(&self) -> usize {
        self.compact.iter().map(Table::len).sum::<usize>() + self.flat.len() + self.boxed.len()
    }
}

/// Tables of at least this many places give back their room when
/// mostly empty (smaller ones are not worth the rehash).
const SHRINK_FROM: usize = 1_024;

/// Gives back most of `table`'s room once it holds less than an eighth
/// of it: keys that moved to another table (a log grown past the flat
/// form) or expired leave no room behind (hashbrown tables never shrink
/// by themselves). It keeps twice what it holds, so it shrinks again only
/// after losing most of that, and grows only after quadrupling: both stay
/// amortized over the keys that came and went.
fn shrink_if_sparse<T>(table: &mut HashTable<(KeyId, T)>) {
    if table.capacity() >= SHRINK_FROM && table.len() < table.capacity() / 8 {
        table.shrink_to(table.len() * 2, |(id, _)| id.table_hash());
    }
}

/// Writes a flat state's new `bytes` over its `held` ones: in place
/// when their length has not changed.
fn overwrite(held: &mut Box<[u8]>, bytes: &[u8]) {
    if held.len() == bytes.len() {
        held.copy_from_slice(bytes);
    } else {
        *held = Box::from(bytes);
    }
}

/// Which shard each of 4 096 slices of the identities' shard bits goes
/// to: shard `i` gets a share of the keys proportional to `2^(i/shards)`,
/// so the largest has twice the smallest's.
pub(super) fn staggered(shards: usize) -> Box<[u16]> {
    let weight = |i: usize| (i as f64 / shards as f64).exp2();
    let total: f64 = (0..shards).map(weight).sum();
    let mut map = Vec::with_capacity(SLICES);
    let (mut shard, mut bound) = (0, weight(0) / total);
    for slice in 0..SLICES {
        let middle = (slice as f64 + 0.5) / SLICES as f64;
        while middle > bound && shard + 1 < shards {
            shard += 1;
            bound += weight(shard) / total;
        }
        map.push(shard as u16);
    }
    map.into_boxed_slice()
}

/// How finely [`staggered`] divides the identities.
pub(super) const SLICES: usize = 4_096;

/// The slice of [`staggered`]'s map an identity falls in.
pub(super) fn slice_of(id: KeyId) -> usize {
    (id.shard_bits() >> (32 - SLICES.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staggered_shares_span_a_factor_of_two() {
        let map = staggered(128);
        let mut share = [0usize; 128];
        for &shard in map.iter() {
            share[usize::from(shard)] += 1;
        }
        assert!(share.iter().all(|&s| s > 0));
        // Slices are whole: each share is within one slice of its ideal.
        let (first, last) = (share[0] as f64, share[127] as f64);
        assert!((1.8..=2.2).contains(&(last / first)), "{first} {last}");
        assert!(map.windows(2).all(|pair| pair[0] <= pair[1]));
    }

    #[test]
    fn a_compact_state_taken_and_kept_is_written_back_in_place() {
        use crate::engine::WindowState;
        let window = |count, expires_at| {
            Slot::Window(WindowState {
                start: 1_000,
                count,
                expires_at,
            })
        };
        let mut shard = Shard::default();
        let ids: Vec<KeyId> = (1..=20).map(|i| KeyId::from_parts([i % 3, i, 5])).collect();
        for &id in &ids {
            assert_eq!(
                shard.keep(id, window(1, 2_000), false, 1_500, true),
                Kept::Added
            );
        }
        let first = ids[0];
        let taken = shard.take(first, SlotKind::Window);
        assert_eq!(taken, Some(window(1, 2_000)));
        assert_eq!(shard.len(), 20, "a compact entry stays while taken");
        assert_eq!(
            shard.keep(first, window(2, 2_000), true, 1_500, true),
            Kept::Same
        );
        assert_eq!(shard.get(first, SlotKind::Window), Some(window(2, 2_000)));
        assert_eq!(shard.len(), 20);
        // Kept past its expiry: dropped, and the others are still found.
        assert!(shard.take(first, SlotKind::Window).is_some());
        assert_eq!(
            shard.keep(first, window(2, 1_400), true, 1_500, true),
            Kept::Dropped
        );
        assert_eq!(shard.len(), 19);
        assert_eq!(shard.get(first, SlotKind::Window), None);
        for &id in &ids[1..] {
            assert_eq!(shard.get(id, SlotKind::Window), Some(window(1, 2_000)));
        }
        // A state that stops fitting while taken moves to the boxed table.
        let second = ids[1];
        assert!(shard.take(second, SlotKind::Window).is_some());
        let long = window(3, 1_000 + 365 * 86_400_000);
        assert_eq!(
            shard.keep(second, long.clone(), true, 1_500, true),
            Kept::Same
        );
        assert_eq!((shard.compact[0].len(), shard.boxed.len()), (18, 1));
        // And back: taken out of the boxed table, kept compact again.
        assert_eq!(shard.take(second, SlotKind::Window), Some(long));
        assert_eq!(
            shard.keep(second, window(4, 2_000), true, 1_500, true),
            Kept::Same
        );
        assert_eq!((shard.compact[0].len(), shard.boxed.len()), (19, 0));
    }

    #[test]
    fn sweeps_follow_the_keys_a_shard_adds_not_its_decisions() {
        use crate::engine::WindowState;
        let window = |expires_at| {
            Slot::Window(WindowState {
                start: 0,
                count: 1,
                expires_at,
            })
        };
        let id = |i: u32| KeyId::from_parts([i.wrapping_mul(2_654_435_761), i, 3]);
        let mut shard = Shard::default();
        // Keys that stay: any number of decisions on them sweeps nothing.
        for i in 0..100 {
            assert_eq!(
                shard.keep(id(i), window(1_000), false, 10, true),
                Kept::Added
            );
        }
        for _ in 0..100_000 {
            assert!(!shard.count_decision(true));
        }
        // Keys that come: a sweep is due once the shard has added
        // `SWEEP_AFTER_ADDED` of them (it held fewer than 4 times that).
        let mut added = 100;
        while !shard.count_decision(true) {
            shard.keep(id(added), window(500), false, 10, true);
            added += 1;
        }
        assert_eq!(added, SWEEP_AFTER_ADDED as u32);
        // Those past their expiry go; the sweep restarts the count.
        assert_eq!(shard.sweep(600), SWEEP_AFTER_ADDED - 100);
        assert_eq!(shard.len(), 100);
        assert!(!shard.count_decision(true));
        // A shard that held 8 192 after its sweep waits for 2 048 more.
        for i in 0..8_092 {
            shard.keep(id(10_000 + i), window(1_000), false, 10, true);
        }
        shard.sweep(600);
        assert_eq!(shard.len(), 8_192);
        for i in 0..2_047 {
            shard.keep(id(20_000 + i), window(1_000), false, 10, true);
            assert!(!shard.count_decision(true));
        }
        shard.keep(id(30_000), window(1_000), false, 10, true);
        assert!(shard.count_decision(true));
        shard.sweep(600);
        // A full store: swept every `SWEEP_WHEN_FULL_EVERY` decisions, so
        // that keys past their expiry make room.
        let due = (1..=2 * SWEEP_WHEN_FULL_EVERY)
            .find(|_| shard.count_decision(false))
            .expect("a full store's shard is swept");
        assert_eq!(due, SWEEP_WHEN_FULL_EVERY);
    }

    #[test]
    fn a_state_that_stops_fitting_moves_to_the_boxed_table_and_back_out() {
        use crate::engine::WindowState;
        let id = KeyId::from_parts([7, 8, 9]);
        let mut shard = Shard::default();
        let window = |count| {
            Slot::Window(WindowState {
                start: 1_000,
                count,
                expires_at: 2_000,
            })
        };
        assert_eq!(shard.keep(id, window(1), false, 1_500, true), Kept::Added);
        assert_eq!(shard.compact[0].len(), 1);
        // A year-long window does not fit 32 bits of span: boxed, same key.
        let (_, kept) = shard.decide(id, SlotKind::Window, 1_500, true, |slot| {
            *slot = Slot::Window(WindowState {
                start: 1_000,
                count: 2,
                expires_at: 1_000 + 365 * 86_400_000,
            });
        });
        assert_eq!(kept, Kept::Same);
        assert_eq!((shard.compact[0].len(), shard.boxed.len()), (0, 1));
        assert_eq!(
            shard.get(id, SlotKind::Window).map(|s| s.expires_at()),
            Some(1_000 + 365 * 86_400_000)
        );
        assert_eq!(
            shard.take(id, SlotKind::Window).map(|s| s.expires_at()),
            Some(1_000 + 365 * 86_400_000)
        );
        assert_eq!(shard.len(), 0);
        assert_eq!(shard.keep(id, window(3), false, 1_500, true), Kept::Added);
        assert_eq!(shard.sweep(2_000), 1);
        // Full: a new key's state is not kept.
        assert_eq!(
            shard.keep(id, window(3), false, 1_500, false),
            Kept::Unrecorded
        );
        assert_eq!(shard.len(), 0);
    }

    #[test]
    fn logs_that_grew_past_the_flat_form_leave_no_room_behind() {
        use crate::store::memory::flat::MAX_INSTANTS;
        let mut shard = Shard::default();
        let kind = SlotKind::SlidingLog;
        let keys = 4_096u32;
        let record = |shard: &mut Shard, key: u32, now: u64| {
            shard.decide(KeyId::from_parts([key, 0, 0]), kind, now, true, |slot| {
                if let Slot::SlidingLog(state) = slot {
                    crate::engine::sliding_log::record(state, 1_000, 60_000, 1, now);
                }
            })
        };
        for now in 0..MAX_INSTANTS as u64 {
            for key in 0..keys {
                record(&mut shard, key, now);
            }
        }
        let flat_room = shard.flat.capacity();
        assert!(flat_room >= keys as usize, "{flat_room}");
        // One instant more: every log moves to the boxed table.
        for key in 0..keys {
            record(&mut shard, key, MAX_INSTANTS as u64);
        }
        assert_eq!((shard.flat.len(), shard.boxed.len()), (0, keys as usize));
        assert!(
            shard.flat.capacity() < SHRINK_FROM,
            "{}",
            shard.flat.capacity()
        );
        // And the boxed table's room follows them back when they expire.
        assert_eq!(shard.sweep(60_000 + MAX_INSTANTS as u64 + 1), keys as usize);
        assert!(
            shard.boxed.capacity() < SHRINK_FROM,
            "{}",
            shard.boxed.capacity()
        );
    }

    #[test]
    fn a_log_is_flat_while_short_boxed_while_long_and_flat_again() {
        use crate::engine::{HitLog, LogState};
        use crate::store::memory::flat::MAX_INSTANTS;
        let id = KeyId::from_parts([4, 5, 6]);
        let mut shard = Shard::default();
        let kind = SlotKind::SlidingLog;
        let record = |shard: &mut Shard, now: u64| {
            shard.decide(id, kind, now, true, |slot| {
                if let Slot::SlidingLog(state) = slot {
                    crate::engine::sliding_log::record(state, 1_000, 100, 1, now);
                }
            })
        };
        assert_eq!(record(&mut shard, 1_000).1, Kept::Added);
        assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
        for now in 1_001..1_000 + MAX_INSTANTS as u64 {
            assert_eq!(record(&mut shard, now).1, Kept::Same);
        }
        assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
        // One instant more than a flat state holds: boxed, nothing lost.
        let last = 1_000 + MAX_INSTANTS as u64;
        assert_eq!(record(&mut shard, last).1, Kept::Same);
        assert_eq!((shard.flat.len(), shard.boxed.len()), (0, 1));
        let expected = HitLog::from_entries((1_000..=last).map(|t| (t, 1)));
        assert_eq!(
            shard.get(id, kind),
            Some(Slot::SlidingLog(LogState {
                log: expected.clone(),
                expires_at: last + 101,
            }))
        );
        // Taken and kept (a request of several keys) stays boxed.
        let taken = shard.take(id, kind);
        assert_eq!(shard.len(), 0);
        assert_eq!(
            shard.keep(id, taken.clone().expect("held"), true, last, true),
            Kept::Same
        );
        assert_eq!((shard.flat.len(), shard.boxed.len()), (0, 1));
        assert_eq!(shard.get(id, kind), taken);
        // Once the oldest hits leave the window, flat again.
        assert_eq!(record(&mut shard, 1_110).1, Kept::Same);
        assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
        let Some(Slot::SlidingLog(state)) = shard.get(id, kind) else {
            panic!("the log is held");
        };
        assert_eq!(state.log.entries().next(), Some((1_010, 1)));
        // And swept once its last hit has left.
        assert_eq!(shard.sweep(1_110 + 100), 0);
        assert_eq!(shard.sweep(1_110 + 101), 1);
        assert_eq!(shard.len(), 0);
    }

    #[test]
    fn a_flat_state_taken_and_kept_is_written_back_in_place() {
        use crate::engine::{HitLog, LogState};
        let kind = SlotKind::SlidingLog;
        let log = |hits: &[(u64, u64)], expires_at| {
            Slot::SlidingLog(LogState {
                log: HitLog::from_entries(hits.iter().copied()),
                expires_at,
            })
        };
        let (id, other) = (KeyId::from_parts([1, 1, 1]), KeyId::from_parts([2, 2, 2]));
        let mut shard = Shard::default();
        assert_eq!(
            shard.keep(id, log(&[(10, 1)], 111), false, 10, true),
            Kept::Added
        );
        assert_eq!(
            shard.keep(other, log(&[(10, 2)], 111), false, 10, true),
            Kept::Added
        );
        // Taken, the entry stays; kept, it holds the new state.
        assert_eq!(shard.take(id, kind), Some(log(&[(10, 1)], 111)));
        assert_eq!(shard.len(), 2);
        let longer = log(&[(10, 1), (20, 3)], 121);
        assert_eq!(shard.keep(id, longer.clone(), true, 20, true), Kept::Same);
        assert_eq!(shard.get(id, kind), Some(longer));
        // The room the scratch slot kept does not leak into another key.
        assert_eq!(shard.take(other, kind), Some(log(&[(10, 2)], 111)));
        assert_eq!(
            shard.keep(other, log(&[], 0), true, 20, true),
            Kept::Dropped
        );
        assert_eq!(shard.len(), 1);
        assert_eq!(shard.get(other, kind), None);
        assert_eq!(shard.get(id, kind), Some(log(&[(10, 1), (20, 3)], 121)));
    }
}
