//! A fixed window on the calendar (docs/design.md#calendar-windows): a
//! counter per calendar day, week, month or year, reset when the next one
//! starts. The item carries the boundaries of three windows, computed from
//! the sidecar's clock (`config::calendar`); the store's clock picks the one
//! it decides in, so sidecars whose clocks differ roll over at one instant,
//! the store's. Its state is a fixed window's.

use super::window::{self, WindowState};
use super::{Kind, Outcome, Slot, Step};

/// A calendar window in a batch. `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalendarItem {
    pub slot: usize,
    pub limit: u64,
    /// Four boundaries in ms, ascending: three windows, the middle one
    /// holding the clock of whoever built the item.
    pub bounds: [u64; 4],
    pub hits: u64,
    pub shadow: bool,
}

impl CalendarItem {
    /// The window `[start, end)` that holds `now`; before the first or past
    /// the last (clocks a whole window apart), the nearest of the three.
    pub fn window_at(&self, now: u64) -> (u64, u64) {
        let [before, start, end, after] = self.bounds;
        if now < start {
            (before, start)
        } else if now < end {
            (start, end)
        } else {
            (end, after)
        }
    }
}

impl Kind for CalendarItem {
    const REFUNDABLE: bool = true;

    super::one_slot!();

    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        let (start, end) = self.window_at(now);
        window::check_in(
            &window::state_in(slots, self.slot),
            self.limit,
            start,
            end,
            self.hits,
        )
        .over
    }

    fn run(&self, step: Step<'_>) -> Outcome {
        let Step { slots, now, commit } = step;
        let (start, end) = self.window_at(now);
        let state = window::state_in(slots, self.slot);
        let check = window::check_in(&state, self.limit, start, end, self.hits);
        let mut count = check.count;
        if commit && !check.over && self.hits > 0 {
            count = check.count.saturating_add(self.hits);
            if let Some(slot) = slots.get_mut(self.slot) {
                *slot = Slot::Window(WindowState {
                    start,
                    count,
                    expires_at: end,
                });
            }
        }
        let period = end - start;
        Outcome::Window(window::outcome(
            &check, count, self.limit, period, self.hits, now,
        ))
    }

    /// The window of `now`'s count, never below 0; an ended window has
    /// nothing to give back to.
    fn refund(&self, step: Step<'_>) -> Outcome {
        let start = self.window_at(step.now).0;
        if step.commit
            && let Some(Slot::Window(state)) = step.slots.get_mut(self.slot)
            && state.start == start
        {
            state.count = state.count.saturating_sub(self.hits);
        }
        Self { hits: 0, ..*self }.run(step.seeing())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Item, SlotKind, decide};

    const DAY: u64 = 86_400_000;

    /// Windows of 31, 28 and 31 days from day 0.
    fn item(hits: u64) -> Item<'static> {
        Item::Calendar(CalendarItem {
            slot: 0,
            limit: 3,
            bounds: [0, 31 * DAY, 59 * DAY, 90 * DAY],
            hits,
            shadow: false,
        })
    }

    #[test]
    fn the_window_is_the_one_of_the_deciding_clock() {
        let mut slots = vec![Slot::new(SlotKind::Window)];
        let last = 59 * DAY - 1;
        for _ in 0..3 {
            assert!(decide(&[item(1)], &mut slots, last).granted);
        }
        let refused = decide(&[item(1)], &mut slots, last);
        assert!(!refused.granted);
        let Outcome::Window(outcome) = refused.outcomes[0] else {
            panic!("a window's outcome");
        };
        assert_eq!((outcome.reset_after, outcome.period), (1, 28 * DAY));
        // The next window starts at its boundary, not a period later.
        assert!(decide(&[item(1)], &mut slots, 59 * DAY).granted);
        // A clock a window behind decides in the first window.
        let mut early = vec![Slot::new(SlotKind::Window)];
        decide(&[item(1)], &mut early, 5);
        let Slot::Window(state) = &early[0] else {
            panic!("a window's state");
        };
        assert_eq!((state.start, state.expires_at), (0, 31 * DAY));
    }

    #[test]
    fn a_refund_gives_back_to_the_window_of_now_only() {
        let mut slots = vec![Slot::new(SlotKind::Window)];
        for _ in 0..3 {
            assert!(decide(&[item(1)], &mut slots, 40 * DAY).granted);
        }
        let refund = item(1).refund_of(1).expect("refundable");
        decide(&[refund], &mut slots, 41 * DAY);
        assert!(decide(&[item(1)], &mut slots, 42 * DAY).granted);
        assert!(!decide(&[item(1)], &mut slots, 42 * DAY).granted);
        decide(&[refund], &mut slots, 60 * DAY);
        let Slot::Window(state) = &slots[0] else {
            panic!("a window's state");
        };
        assert_eq!(
            state.count, 3,
            "a refund after the window ended changes nothing"
        );
    }
}
