//! The compact states' table: open addressing with linear probing over
//! 32-byte entries laid two to a 64-byte cache line
//! (docs/performance.md#the-compact-memory-store).
//!
//! Why not a general hash map: a SwissTable (hashbrown) reads a group of
//! control bytes, then the entry, two cache lines in different places.
//! Once a store outgrows the CPU's caches each is a miss, and the two are
//! most of what a decision at 10^6 keys costs over one at 10^4. Here the
//! entry holds the whole identity, so a lookup starts at the entry itself
//! and usually ends in the line it started in. An empty entry is the
//! identity no key has ([`KeyId::EMPTY`]).
//!
//! Removal shifts the entries after it back (no tombstones), so a table
//! that keys come and go in never fills with dead entries.

use super::id::KeyId;
use super::lines::Lines;
use super::packed::Packed;

/// Two entries: the unit the table is allocated in, so that an entry
/// never straddles two cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([Packed; 2]);

const EMPTY_LINE: Line = Line([Packed::EMPTY; 2]);

/// At most four entries in five are used; past that the table doubles.
/// (Linear probing's probes grow quickly above that load.)
const MAX_LOAD: (usize, usize) = (4, 5);

/// The first allocation: four lines.
const FIRST_ENTRIES: usize = 8;

#[derive(Default)]
pub(super) struct Table {
    lines: Lines<Line>,
    len: usize,
}

impl Table {
    pub fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.lines.len() * 2
    }

    fn at(&self, index: usize) -> &Packed {
        &self.lines[index / 2].0[index % 2]
    }

    fn at_mut(&mut self, index: usize) -> &mut Packed {
        &mut self.lines[index / 2].0[index % 2]
    }

    fn home(&self, id: KeyId) -> usize {
        // The capacity is a power of two.
        (id.table_hash() as usize) & (self.capacity() - 1)
    }

    /// Where `id`'s entry is, if it has one.
    pub fn find(&self, id: KeyId) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.capacity() - 1;
        let mut index = self.home(id);
        // The table is never full, so an empty entry ends every probe.
        loop {
            let entry = self.at(index);
            if entry.id == id {
                return Some(index);
            }
            if entry.id == KeyId::EMPTY {
                return None;
            }
            index = (index + 1) & mask;
        }
    }

    pub fn get(&self, index: usize) -> &Packed {
        self.at(index)
    }

    pub fn set(&mut self, index: usize, packed: Packed) {
        debug_assert!(self.at(index).id == packed.id);
        *self.at_mut(index) = packed;
    }

    /// Adds an entry for an identity the table does not hold.
    pub fn insert(&mut self, packed: Packed) {
        debug_assert!(packed.id != KeyId::EMPTY && self.find(packed.id).is_none());
        if (self.len + 1) * MAX_LOAD.1 > self.capacity() * MAX_LOAD.0 {
            self.grow();
        }
        self.place(packed);
        self.len += 1;
    }

    fn place(&mut self, packed: Packed) {
        let mask = self.capacity() - 1;
        let mut index = self.home(packed.id);
        while self.at(index).id != KeyId::EMPTY {
            index = (index + 1) & mask;
        }
        *self.at_mut(index) = packed;
    }

    fn grow(&mut self) {
        let entries = (self.capacity() * 2).max(FIRST_ENTRIES);
        let old = std::mem::replace(&mut self.lines, Lines::filled(entries / 2, EMPTY_LINE));
        for line in old.iter() {
            for packed in line.0 {
                if packed.id != KeyId::EMPTY {
                    self.place(packed);
                }
            }
        }
    }

    /// Takes the entry at `index` out, moving the entries after it back
    /// to where a lookup still finds them.
    pub fn remove(&mut self, index: usize) -> Packed {
        let mask = self.capacity() - 1;
        let removed = *self.at(index);
        let mut hole = index;
        let mut next = index;
        loop {
            next = (next + 1) & mask;
            let entry = *self.at(next);
            if entry.id == KeyId::EMPTY {
                break;
            }
            // It may fill the hole if the hole lies between its home and
            // where it is: a lookup from its home passes the hole first.
            let home = self.home(entry.id);
            if (next.wrapping_sub(home) & mask) >= (next.wrapping_sub(hole) & mask) {
                *self.at_mut(hole) = entry;
                hole = next;
            }
        }
        *self.at_mut(hole) = Packed::EMPTY;
        self.len -= 1;
        removed
    }

    /// Keeps only the entries `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&Packed) -> bool) {
        let mut index = 0;
        while index < self.capacity() {
            let entry = *self.at(index);
            if entry.id != KeyId::EMPTY && !keep(&entry) {
                // What moves into `index` is looked at next; an entry
                // moved from the start to the end is looked at twice,
                // which `keep` (a pure test) does not mind.
                self.remove(index);
                continue;
            }
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn entry(id: KeyId, value: u64) -> Packed {
        Packed::with_value_for_tests(id, value)
    }

    #[test]
    fn an_entry_shares_its_line_with_one_other() {
        assert_eq!(std::mem::size_of::<Line>(), 64);
        assert_eq!(std::mem::align_of::<Line>(), 64);
    }

    proptest! {
        /// Inserts, updates, removals and sweeps against a HashMap, with
        /// identities crowded onto few homes so that probes wrap and
        /// removals shift entries back.
        #[test]
        fn behaves_as_a_map(
            ops in prop::collection::vec((0u8..4, 0u32..64, 0u32..4, any::<u64>()), 1..400)
        ) {
            let mut table = Table::default();
            let mut model: HashMap<KeyId, u64> = HashMap::new();
            for (op, key, home, value) in ops {
                // Few homes: the low bits of the table hash.
                let id = KeyId::from_parts([home, key + 1, key]);
                match op {
                    0 | 1 => match table.find(id) {
                        Some(index) => {
                            table.set(index, entry(id, value));
                            model.insert(id, value);
                        }
                        None => {
                            table.insert(entry(id, value));
                            model.insert(id, value);
                        }
                    },
                    2 => {
                        if let Some(index) = table.find(id) {
                            let removed = table.remove(index);
                            prop_assert_eq!(removed.id, id);
                        }
                        model.remove(&id);
                    }
                    _ => {
                        let odd = |v: u64| v % 2 == 1;
                        table.retain(|p| !odd(p.value_for_tests()));
                        model.retain(|_, v| !odd(*v));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
                for (&id, &value) in &model {
                    let index = table.find(id);
                    prop_assert!(index.is_some(), "{:?} lost", id);
                    if let Some(index) = index {
                        prop_assert_eq!(table.get(index).value_for_tests(), value);
                    }
                }
            }
            for key in 0..64 {
                for home in 0..4 {
                    let id = KeyId::from_parts([home, key + 1, key]);
                    prop_assert_eq!(table.find(id).is_some(), model.contains_key(&id));
                }
            }
        }
    }

    #[test]
    fn grows_in_doublings_and_keeps_every_entry() {
        let mut table = Table::default();
        for key in 0..10_000u32 {
            table.insert(entry(
                KeyId::from_parts([key.wrapping_mul(2_654_435_761), key, 1]),
                u64::from(key),
            ));
        }
        assert_eq!(table.len(), 10_000);
        assert!(table.capacity().is_power_of_two());
        assert!(table.len() * 5 <= table.capacity() * 4);
        for key in 0..10_000u32 {
            let index = table.find(KeyId::from_parts([key.wrapping_mul(2_654_435_761), key, 1]));
            assert_eq!(
                index.map(|i| table.get(i).value_for_tests()),
                Some(u64::from(key))
            );
        }
        table.retain(|_| false);
        assert_eq!(table.len(), 0);
        assert_eq!(table.find(KeyId::from_parts([0, 0, 1])), None);
    }
}
