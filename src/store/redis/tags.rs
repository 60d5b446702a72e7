//! A batch split by hash tag, for Redis Cluster: one script per tag, since
//! a script may only touch keys of one slot (docs/redis.md#redis-cluster).
//! Every key of one item shares its item's tag ([`keys`]), so an item never
//! straddles two groups.

use smallvec::SmallVec;

use crate::store::{Batch, keys};

/// Items whose keys share a hash tag, with their keys.
pub(super) struct Group {
    /// Indexes into the batch's items, in order.
    pub items: SmallVec<[usize; 2]>,
    /// Indexes into the batch's slots; position here is the script's slot.
    pub slots: SmallVec<[usize; 2]>,
}

impl Group {
    pub fn local(&self, slot: usize) -> usize {
        self.slots.iter().position(|&s| s == slot).unwrap_or(0)
    }
}

/// Splits a batch by the hash tag of each item's own key (an item's keys
/// always share one: see [`keys`]).
pub(super) fn groups_by_tag(batch: &Batch<'_>) -> Vec<Group> {
    let mut tags: Vec<(&str, Group)> = Vec::new();
    for (index, item) in batch.items.iter().enumerate() {
        let Some(key) = batch.slots.get(item.slot()) else {
            continue;
        };
        let tag = keys::tag_of(&key.key);
        let position = match tags.iter().position(|(t, _)| *t == tag) {
            Some(position) => position,
            None => {
                tags.push((
                    tag,
                    Group {
                        items: SmallVec::new(),
                        slots: SmallVec::new(),
                    },
                ));
                tags.len() - 1
            }
        };
        let group = &mut tags[position].1;
        group.items.push(index);
        for slot in item.slots().into_iter().flatten() {
            if !group.slots.contains(&slot) {
                group.slots.push(slot);
            }
        }
    }
    tags.into_iter().map(|(_, group)| group).collect()
}
