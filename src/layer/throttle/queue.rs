//! The throttler's admission: `capacity` requests in progress, and a queue
//! of at most `max_queue` waiting ones, served by criticality then arrival.
//! A full queue makes room for a newcomer by evicting the most recently
//! queued request of the lowest level below the newcomer's; a queue full of
//! requests at the newcomer's level or above refuses it.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Criticality;

/// What a waiting request is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// A slot is the request's: it runs now.
    Run,
    /// Pushed out of the queue by a more critical request.
    Evicted,
}

/// What a request finds on arrival.
#[derive(Debug)]
pub(super) enum Entry {
    /// A slot was free: it runs now.
    Run,
    /// Queued: its turn comes on the receiver; `ticket` names it to
    /// [`Admission::abandon`].
    Wait {
        turn: oneshot::Receiver<Turn>,
        ticket: u64,
        /// Requests ahead of it (its level and above).
        ahead: usize,
    },
    /// Refused at once: the queue is full of requests as critical.
    Full,
}

struct Waiter {
    ticket: u64,
    turn: oneshot::Sender<Turn>,
}

/// Slots and the queue.
pub(super) struct Admission {
    capacity: usize,
    max_queue: usize,
    in_progress: usize,
    /// One queue per level, the least critical first.
    waiting: [VecDeque<Waiter>; 4],
    next_ticket: u64,
    /// The mean time a request held its slot (ms, moving average).
    mean_held_ms: f64,
}

impl Admission {
    pub fn new(capacity: usize, max_queue: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            max_queue,
            in_progress: 0,
            waiting: Default::default(),
            next_ticket: 0,
            mean_held_ms: 0.0,
        }
    }

    fn queued(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// A request of `level` arrives.
    pub fn enter(&mut self, level: Criticality) -> Entry {
        if self.in_progress < self.capacity && self.queued() == 0 {
            self.in_progress += 1;
            return Entry::Run;
        }
        if self.queued() >= self.max_queue && !self.evict_below(level) {
            return Entry::Full;
        }
        let (sender, turn) = oneshot::channel();
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.waiting[level.rank()].push_back(Waiter {
            ticket,
            turn: sender,
        });
        let ahead = self.waiting[level.rank()..]
            .iter()
            .map(VecDeque::len)
            .sum::<usize>()
            - 1;
        Entry::Wait {
            turn,
            ticket,
            ahead,
        }
    }

    /// Evicts the most recently queued request of the lowest level below
    /// `level`; whether there was one.
    fn evict_below(&mut self, level: Criticality) -> bool {
        for queue in &mut self.waiting[..level.rank()] {
            if let Some(evicted) = queue.pop_back() {
                let _ = evicted.turn.send(Turn::Evicted);
                return true;
            }
        }
        false
    }

    /// A request that held a slot for `held` is done: its slot goes to the
    /// most critical, longest waiting request still there.
    pub fn leave(&mut self, held: Duration) {
        let held_ms = held.as_secs_f64() * 1_000.0;
        self.mean_held_ms = if self.mean_held_ms == 0.0 {
            held_ms
        } else {
            0.9 * self.mean_held_ms + 0.1 * held_ms
        };
        self.in_progress = self.in_progress.saturating_sub(1);
        while self.in_progress < self.capacity {
            let Some(next) = self.waiting.iter_mut().rev().find_map(VecDeque::pop_front) else {
                return;
            };
            // A waiter that has gone (its deadline passed, its client left)
            // takes no slot.
            if next.turn.send(Turn::Run).is_ok() {
                self.in_progress += 1;
            }
        }
    }

    /// A queued request gives up (its deadline passed): out of the queue.
    /// `false` if it was no longer queued (its turn came meanwhile).
    pub fn abandon(&mut self, level: Criticality, ticket: u64) -> bool {
        let queue = &mut self.waiting[level.rank()];
        match queue.iter().position(|waiter| waiter.ticket == ticket) {
            Some(at) => {
                queue.remove(at);
                true
            }
            None => false,
        }
    }

    /// How long a request with `ahead` requests before it should wait for
    /// a slot, from the mean time a slot is held (zero before any).
    pub fn expected_wait(&self, ahead: usize) -> Duration {
        let rounds = (ahead / self.capacity + 1) as f64;
        Duration::from_secs_f64(self.mean_held_ms * rounds / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Criticality::*;

    fn waits(entry: Entry) -> (oneshot::Receiver<Turn>, u64) {
        match entry {
            Entry::Wait { turn, ticket, .. } => (turn, ticket),
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    #[test]
    fn slots_then_queue_served_by_criticality_then_arrival() {
        let mut admission = Admission::new(1, 10);
        assert!(matches!(admission.enter(Sheddable), Entry::Run));
        let (mut shed, _) = waits(admission.enter(Sheddable));
        let (mut first, _) = waits(admission.enter(Critical));
        let (mut second, _) = waits(admission.enter(Critical));
        let (mut plus, _) = waits(admission.enter(CriticalPlus));
        let ms = Duration::from_millis(10);
        admission.leave(ms);
        assert_eq!(plus.try_recv(), Ok(Turn::Run));
        admission.leave(ms);
        assert_eq!(first.try_recv(), Ok(Turn::Run));
        assert!(second.try_recv().is_err() && shed.try_recv().is_err());
        admission.leave(ms);
        assert_eq!(second.try_recv(), Ok(Turn::Run));
        admission.leave(ms);
        assert_eq!(shed.try_recv(), Ok(Turn::Run));
    }

    #[test]
    fn a_full_queue_evicts_the_newest_of_the_lowest_level_below() {
        let mut admission = Admission::new(1, 3);
        assert!(matches!(admission.enter(Critical), Entry::Run));
        let (mut shed_old, _) = waits(admission.enter(Sheddable));
        let (mut shed_new, _) = waits(admission.enter(Sheddable));
        let (mut plus, _) = waits(admission.enter(SheddablePlus));
        // Full: a critical newcomer pushes out the newest sheddable.
        let (_critical, _) = waits(admission.enter(Critical));
        assert_eq!(shed_new.try_recv(), Ok(Turn::Evicted));
        assert!(shed_old.try_recv().is_err() && plus.try_recv().is_err());
        // A sheddable newcomer finds nothing below it: refused.
        assert!(matches!(admission.enter(Sheddable), Entry::Full));
        assert_eq!(admission.queued(), 3);
    }

    #[test]
    fn a_queue_full_of_critical_requests_refuses_rather_than_grows() {
        let mut admission = Admission::new(1, 1);
        assert!(matches!(admission.enter(Critical), Entry::Run));
        let _queued = waits(admission.enter(Critical));
        assert!(matches!(admission.enter(Critical), Entry::Full));
        assert!(matches!(admission.enter(Sheddable), Entry::Full));
        assert_eq!(admission.queued(), 1);
    }

    #[test]
    fn an_abandoned_waiter_leaves_the_queue_and_takes_no_slot() {
        let mut admission = Admission::new(1, 10);
        assert!(matches!(admission.enter(Critical), Entry::Run));
        let (gone, ticket) = waits(admission.enter(Critical));
        let (mut next, _) = waits(admission.enter(Sheddable));
        assert!(admission.abandon(Critical, ticket));
        assert!(!admission.abandon(Critical, ticket));
        drop(gone);
        admission.leave(Duration::from_millis(1));
        assert_eq!(next.try_recv(), Ok(Turn::Run));
        // A waiter dropped without abandoning is skipped too.
        let (dropped, _) = waits(admission.enter(Critical));
        drop(dropped);
        admission.leave(Duration::from_millis(1));
        assert_eq!(admission.in_progress, 0);
    }

    #[test]
    fn the_expected_wait_follows_the_time_slots_are_held() {
        let mut admission = Admission::new(2, 10);
        assert_eq!(admission.expected_wait(5), Duration::ZERO);
        assert!(matches!(admission.enter(Critical), Entry::Run));
        admission.leave(Duration::from_millis(100));
        // Four ahead on two slots: two rounds, then this one's: three.
        assert_eq!(admission.expected_wait(4), Duration::from_millis(300));
    }
}
