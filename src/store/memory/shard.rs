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
mod tests;
