//! The list of kinds: one line per algorithm, from which [`Item`] and
//! [`Refundable`] are made and every dispatch over them is generated.
//!
//! Adding an algorithm is a line in `kinds!` and the algorithm's
//! own file, whose item type implements [`Kind`]: its check, its run, what
//! it records for refused hits, and its refunds. Nothing here, nor in the
//! hub (`mod.rs`), names an algorithm; the stores dispatch their own wire
//! with the same list (CONTRIBUTING.md, "Adding an algorithm").

// The item types, re-exported from here so that the hub need not name a
// kind.
use super::{Outcome, Slot, Step};
pub use super::{
    ban::BanItem, calendar::CalendarItem, cost::CostItem, gcra::GcraItem, hybrid::HybridItem,
    max_hold::MaxHoldItem, sliding::SlidingItem, sliding_log::SlidingLogItem, tiers::TiersItem,
    window::WindowItem,
};

/// The one list of kinds, and what is made from it: `kinds!(value, Enum,
/// |item| body; other arms)` is `match value { Enum::Kind(item) => body, …,
/// other arms }` over every kind (the other arms for an enum with more
/// variants than the kinds, as [`Item`]). Each store dispatches its own
/// wire the same way, through a trait of its own on the item types.
macro_rules! kinds {
    ($value:expr, $enum:ident, |$item:ident| $body:expr $(; $($arm:tt)*)?) => {
        $crate::engine::kinds!(@list arms ($value), $enum, $item, ($body), ($($($arm)*)?))
    };
    // The list: every rule below is called with it, after its arguments.
    (@list $rule:ident $($argument:tt)*) => {
        $crate::engine::kinds! { @$rule $($argument)* ('a) [
            Window(WindowItem),
            Cost(CostItem),
            Sliding(SlidingItem),
            Hybrid(HybridItem),
            Ban(BanItem),
            SlidingLog(SlidingLogItem),
            Gcra(GcraItem),
            MaxHold(MaxHoldItem),
            Tiers(TiersItem<'a>),
            Calendar(CalendarItem),
        ] }
    };
    (@arms ($value:expr), $enum:ident, $item:ident, ($body:expr), ($($arm:tt)*)
        ($lifetime:lifetime) [$($kind:ident($($type:tt)+)),* $(,)?]) => {
        match $value {
            $($enum::$kind($item) => $body,)*
            $($arm)*
        }
    };
    (@refund ($value:expr), $hits:ident ($lifetime:lifetime) [$($kind:ident($($type:tt)+)),* $(,)?]) => {
        match $value {
            $(Item::$kind(mut item) if refundable(&item) => {
                item.set_hits($hits);
                Some(Item::Refund(Refundable::$kind(item)))
            })*
            _ => None,
        }
    };
    (@define ($lifetime:lifetime) [$($kind:ident($($type:tt)+)),* $(,)?]) => {
        /// One limit to check in a batch, of one algorithm's shape, over the
        /// slots of the batch it reads. `hits == 0` only checks.
        #[derive(Debug, Clone, Copy)]
        pub enum Item<$lifetime> {
            $($kind($($type)+),)*
            /// Hits given back (`refund.rs`), the item's `hits` of them:
            /// never over, and applied only if its batch is granted; the
            /// limiter gives refunds a batch of their own.
            Refund(Refundable<$lifetime>),
        }

        /// The item a refund gives back to: only kinds that can take hits
        /// back are ever refunded ([`Item::refund_of`]).
        #[derive(Debug, Clone, Copy)]
        pub enum Refundable<$lifetime> {
            $($kind($($type)+),)*
        }

        $(
            impl<$lifetime> From<$($type)+> for Item<$lifetime> {
                fn from(item: $($type)+) -> Self {
                    Item::$kind(item)
                }
            }
        )*
    };
}
pub(crate) use kinds;

kinds!(@list define);

/// [`Kind`]'s bookkeeping for an item of one `slot`, `hits` and `shadow`.
macro_rules! one_slot {
    () => {
        fn shadow(&self) -> bool {
            self.shadow
        }

        fn slots(&self) -> [Option<usize>; 2] {
            [Some(self.slot), None]
        }

        fn map_slots(&mut self, map: &dyn Fn(usize) -> usize) {
            self.slot = map(self.slot);
        }

        fn hits(&self) -> u64 {
            self.hits
        }

        fn set_hits(&mut self, hits: u64) {
            self.hits = hits;
        }
    };
}
pub(crate) use one_slot;

fn refundable<K: Kind>(_: &K) -> bool {
    K::REFUNDABLE
}

/// What each algorithm's item does in a batch, in the algorithm's file.
pub(crate) trait Kind {
    /// Whether a refund can give this kind hits back (docs/design.md#refunds).
    const REFUNDABLE: bool = false;

    /// Whether this item only reports, never rejects.
    fn shadow(&self) -> bool;

    /// The slots this item reads: its own, then a second if it has one.
    fn slots(&self) -> [Option<usize>; 2];

    /// The same item over renumbered slots.
    fn map_slots(&mut self, map: &dyn Fn(usize) -> usize);

    /// Whether it is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool;

    /// Decides it and, if `step.commit` and it passes, records it.
    fn run(&self, step: Step<'_>) -> Outcome;

    /// In a refused batch, records what counts whatever the verdict, in
    /// order with the batch's other items.
    fn record_refused(&self, _slots: &mut [Slot], _now: u64) {}

    /// Gives its `hits` back (committing) and answers with the state after,
    /// never over. Only called when [`Kind::REFUNDABLE`].
    fn refund(&self, step: Step<'_>) -> Outcome {
        self.run(step)
    }

    /// The hits it asks for (for a refund, gives back).
    fn hits(&self) -> u64;

    /// The same item asking for (giving back) `hits`.
    fn set_hits(&mut self, hits: u64);
}

impl Item<'_> {
    /// Whether this item only reports, never rejects.
    pub fn shadow(&self) -> bool {
        // A refund never rejects.
        kinds!(self, Item, |item| item.shadow(); Item::Refund(_) => true)
    }

    /// The slots this item reads: its own, then a second if any (a
    /// resource's global log, a concurrency limit's owed refunds).
    pub fn slots(&self) -> [Option<usize>; 2] {
        kinds!(self, Item, |item| item.slots(); Item::Refund(of) => of.slots())
    }

    /// The item's own slot (a domain's tier log, a window's counter).
    pub fn slot(&self) -> usize {
        self.slots()[0].unwrap_or(0)
    }

    /// The hits it asks for, or a refund gives back.
    pub fn hits(&self) -> u64 {
        kinds!(self, Item, |item| item.hits(); Item::Refund(of) => of.hits())
    }

    /// The same item over renumbered slots (a store deciding part of a batch).
    pub fn map_slots(mut self, map: impl Fn(usize) -> usize) -> Self {
        kinds!(&mut self, Item, |item| item.map_slots(&map);
            Item::Refund(of) => kinds!(of, Refundable, |item| item.map_slots(&map)));
        self
    }

    /// A refund of `hits` to this item's limit; `None` for a kind that
    /// cannot take hits back (burst tiers, bans, the hybrid limiter), or a
    /// refund.
    pub fn refund_of(self, hits: u64) -> Option<Self> {
        kinds!(@list refund (self), hits)
    }

    pub(super) fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        kinds!(self, Item, |item| item.is_over(slots, now); Item::Refund(_) => false)
    }

    pub(super) fn run(&self, step: Step<'_>) -> Outcome {
        kinds!(self, Item, |item| item.run(step);
        Item::Refund(of) => super::refund::never_over(
            kinds!(of, Refundable, |item| item.refund(step))
        ))
    }

    pub(super) fn record_refused(&self, slots: &mut [Slot], now: u64) {
        kinds!(self, Item, |item| item.record_refused(slots, now); Item::Refund(_) => {})
    }
}

impl Refundable<'_> {
    /// The slots the refunded item reads.
    pub fn slots(&self) -> [Option<usize>; 2] {
        kinds!(self, Refundable, |item| item.slots())
    }

    /// The hits given back.
    pub fn hits(&self) -> u64 {
        kinds!(self, Refundable, |item| item.hits())
    }
}
