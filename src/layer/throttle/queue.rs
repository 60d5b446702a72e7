//! The throttler's admission: `capacity` requests in progress, and a queue
//! of at most `max_queue` waiting ones, served by criticality then arrival.
//! A full queue makes room for a newcomer by evicting the most recently
//! queued request of the lowest level below the newcomer's; a queue full of
//! requests at the newcomer's level or above refuses it.
//!
//! With a CPU budget, a request also needs the budget not to be in debt to
//! start: the budget fills at its rate (ms of CPU per second), a request
//! takes its predicted cost when it starts, and its measured cost settles
//! the difference when it ends.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Criticality;
use super::limit::AdaptiveLimit;

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
    /// Its predicted cost (ms of CPU), taken from the budget when it starts.
    cost_ms: f64,
}

/// A budget of CPU time: a bucket of milliseconds that fills at `rate`.
#[derive(Debug)]
pub(super) struct CpuBudget {
    /// Milliseconds of CPU per second.
    rate: f64,
    /// The most the bucket holds (ms): how much may start at once after a
    /// quiet spell.
    burst: f64,
    /// What the bucket holds now (ms; negative when in debt).
    tokens: f64,
    filled_at: Instant,
}

impl CpuBudget {
    /// `rate` ms of CPU per second; bursts of a twentieth of a second.
    pub fn new(rate: f64, now: Instant) -> Self {
        let rate = if rate.is_finite() {
            rate.max(1e-3)
        } else {
            1e-3
        };
        let burst = rate / 20.0;
        Self {
            rate,
            burst,
            tokens: burst,
            filled_at: now,
        }
    }

    fn fill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.filled_at);
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        self.filled_at = now;
    }

    /// How long until `debt_ms` more than what is owed now is paid off.
    fn time_to_pay(&self, debt_ms: f64) -> Duration {
        let owed = (debt_ms - self.tokens).max(0.0);
        Duration::from_secs_f64(owed / self.rate)
    }
}

/// Slots and the queue.
pub(super) struct Admission {
    capacity: usize,
    max_queue: usize,
    in_progress: usize,
    /// One queue per level, the least critical first.
    waiting: [VecDeque<Waiter>; 4],
    /// The predicted cost of each level's waiting requests (ms).
    waiting_cost: [f64; 4],
    next_ticket: u64,
    /// The mean time a request held its slot (ms, moving average).
    mean_held_ms: f64,
    budget: Option<CpuBudget>,
    /// If set, `capacity` follows it.
    limit: Option<AdaptiveLimit>,
    /// Whether a task is waking waiters as the budget fills.
    pub draining: bool,
}

impl Admission {
    pub fn new(
        capacity: usize,
        max_queue: usize,
        budget: Option<CpuBudget>,
        limit: Option<AdaptiveLimit>,
    ) -> Self {
        Self {
            capacity: limit
                .as_ref()
                .map_or(capacity, AdaptiveLimit::current)
                .max(1),
            limit,
            max_queue,
            in_progress: 0,
            waiting: Default::default(),
            waiting_cost: [0.0; 4],
            next_ticket: 0,
            mean_held_ms: 0.0,
            budget,
            draining: false,
        }
    }

    /// Whether one more request may start now: a free slot, and the budget
    /// (if any) not in debt.
    fn may_start(&mut self, now: Instant) -> bool {
        if self.in_progress >= self.capacity {
            return false;
        }
        match &mut self.budget {
            Some(budget) => {
                budget.fill(now);
                budget.tokens >= 0.0
            }
            None => true,
        }
    }

    fn start(&mut self, cost_ms: f64) {
        self.in_progress += 1;
        if let Some(budget) = &mut self.budget {
            budget.tokens -= cost_ms;
        }
    }

    /// The concurrency limit now (the adaptive limit's, if any).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn queued(&self) -> usize {
        self.waiting.iter().map(VecDeque::len).sum()
    }

    /// A request of `level`, predicted to cost `cost_ms` of CPU, arrives.
    pub fn enter(&mut self, level: Criticality, cost_ms: f64, now: Instant) -> Entry {
        if self.queued() == 0 && self.may_start(now) {
            self.start(cost_ms);
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
            cost_ms,
        });
        self.waiting_cost[level.rank()] += cost_ms;
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
        for (queue, cost) in self.waiting[..level.rank()]
            .iter_mut()
            .zip(&mut self.waiting_cost)
        {
            if let Some(evicted) = queue.pop_back() {
                *cost -= evicted.cost_ms;
                let _ = evicted.turn.send(Turn::Evicted);
                return true;
            }
        }
        false
    }

    /// A request that held a slot for `held` is done; it was predicted to
    /// cost `predicted_ms` of CPU and used `measured_ms`. Its slot goes to
    /// the most critical, longest waiting request still there.
    pub fn leave(&mut self, held: Duration, predicted_ms: f64, measured_ms: f64, now: Instant) {
        let held_ms = held.as_secs_f64() * 1_000.0;
        self.mean_held_ms = if self.mean_held_ms == 0.0 {
            held_ms
        } else {
            0.9 * self.mean_held_ms + 0.1 * held_ms
        };
        if let Some(limit) = &mut self.limit {
            self.capacity = limit.update(held, self.in_progress, now).max(1);
        }
        self.in_progress = self.in_progress.saturating_sub(1);
        if let Some(budget) = &mut self.budget {
            budget.tokens += predicted_ms - measured_ms;
        }
        self.drain(now);
    }

    /// A slot started for a waiter that was gone before it could run: free
    /// again, its predicted cost refunded, nothing measured.
    pub fn give_back(&mut self, cost_ms: f64, now: Instant) {
        self.in_progress = self.in_progress.saturating_sub(1);
        if let Some(budget) = &mut self.budget {
            budget.tokens += cost_ms;
        }
        self.drain(now);
    }

    /// Starts waiting requests, the most critical and longest waiting
    /// first, while they may start.
    pub fn drain(&mut self, now: Instant) {
        while self.may_start(now) {
            let Some((rank, next)) = self
                .waiting
                .iter_mut()
                .enumerate()
                .rev()
                .find_map(|(rank, queue)| Some((rank, queue.pop_front()?)))
            else {
                return;
            };
            self.waiting_cost[rank] -= next.cost_ms;
            // A waiter that has gone (its deadline passed, its client left)
            // takes no slot.
            if next.turn.send(Turn::Run).is_ok() {
                self.start(next.cost_ms);
            }
        }
    }

    /// When waiting requests that only the budget holds back may start
    /// (`None`: nothing waits on the budget).
    pub fn budget_wait(&self) -> Option<Duration> {
        let budget = self.budget.as_ref()?;
        let held_by_budget =
            self.in_progress < self.capacity && self.queued() > 0 && budget.tokens < 0.0;
        // A millisecond more: the budget is back at zero, not just short.
        held_by_budget.then(|| budget.time_to_pay(0.0) + Duration::from_millis(1))
    }

    /// A queued request gives up (its deadline passed): out of the queue.
    /// `false` if it was no longer queued (its turn came meanwhile).
    pub fn abandon(&mut self, level: Criticality, ticket: u64) -> bool {
        let queue = &mut self.waiting[level.rank()];
        match queue.iter().position(|waiter| waiter.ticket == ticket) {
            Some(at) => {
                if let Some(gone) = queue.remove(at) {
                    self.waiting_cost[level.rank()] -= gone.cost_ms;
                }
                true
            }
            None => false,
        }
    }

    /// How long a queued request of `level` and predicted cost `own_cost_ms`,
    /// with `ahead` requests before it, should
    /// wait to start: for a slot, from the mean time a slot is held (zero
    /// before any); for the budget, until it has paid what is owed and what
    /// the requests before it are predicted to cost.
    pub fn expected_wait(&self, level: Criticality, ahead: usize, own_cost_ms: f64) -> Duration {
        let rounds = (ahead / self.capacity + 1) as f64;
        let for_a_slot = Duration::from_secs_f64(self.mean_held_ms * rounds / 1_000.0);
        let Some(budget) = &self.budget else {
            return for_a_slot;
        };
        let cost_ahead = self.waiting_cost[level.rank()..].iter().sum::<f64>() - own_cost_ms;
        for_a_slot.max(budget.time_to_pay(cost_ahead))
    }
}

pub(super) fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    // The admission's and the predictor's states stay whole between their
    // methods.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts a task that wakes waiting requests as the CPU budget fills, if
/// some wait only on it and no such task runs yet. It ends when none wait
/// on the budget any more.
pub(super) fn drain_later(shared: &Arc<Mutex<Admission>>, admission: &mut Admission) {
    if admission.draining {
        return;
    }
    let Some(mut wait) = admission.budget_wait() else {
        return;
    };
    // Outside a runtime nothing can sleep: waiters start as requests end.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    admission.draining = true;
    let shared = shared.clone();
    runtime.spawn(async move {
        loop {
            tokio::time::sleep(wait).await;
            let mut admission = lock(&shared);
            admission.drain(Instant::now());
            match admission.budget_wait() {
                Some(next) => wait = next,
                None => {
                    admission.draining = false;
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use Criticality::*;

    fn now() -> Instant {
        Instant::now()
    }

    fn waits(entry: Entry) -> (oneshot::Receiver<Turn>, u64) {
        match entry {
            Entry::Wait { turn, ticket, .. } => (turn, ticket),
            other => panic!("expected to wait, got {other:?}"),
        }
    }

    #[test]
    fn slots_then_queue_served_by_criticality_then_arrival() {
        let mut admission = Admission::new(1, 10, None, None);
        assert!(matches!(admission.enter(Sheddable, 0.0, now()), Entry::Run));
        let (mut shed, _) = waits(admission.enter(Sheddable, 0.0, now()));
        let (mut first, _) = waits(admission.enter(Critical, 0.0, now()));
        let (mut second, _) = waits(admission.enter(Critical, 0.0, now()));
        let (mut plus, _) = waits(admission.enter(CriticalPlus, 0.0, now()));
        let ms = Duration::from_millis(10);
        admission.leave(ms, 0.0, 0.0, now());
        assert_eq!(plus.try_recv(), Ok(Turn::Run));
        admission.leave(ms, 0.0, 0.0, now());
        assert_eq!(first.try_recv(), Ok(Turn::Run));
        assert!(second.try_recv().is_err() && shed.try_recv().is_err());
        admission.leave(ms, 0.0, 0.0, now());
        assert_eq!(second.try_recv(), Ok(Turn::Run));
        admission.leave(ms, 0.0, 0.0, now());
        assert_eq!(shed.try_recv(), Ok(Turn::Run));
    }

    #[test]
    fn a_full_queue_evicts_the_newest_of_the_lowest_level_below() {
        let mut admission = Admission::new(1, 3, None, None);
        assert!(matches!(admission.enter(Critical, 0.0, now()), Entry::Run));
        let (mut shed_old, _) = waits(admission.enter(Sheddable, 0.0, now()));
        let (mut shed_new, _) = waits(admission.enter(Sheddable, 0.0, now()));
        let (mut plus, _) = waits(admission.enter(SheddablePlus, 0.0, now()));
        // Full: a critical newcomer pushes out the newest sheddable.
        let (_critical, _) = waits(admission.enter(Critical, 0.0, now()));
        assert_eq!(shed_new.try_recv(), Ok(Turn::Evicted));
        assert!(shed_old.try_recv().is_err() && plus.try_recv().is_err());
        // A sheddable newcomer finds nothing below it: refused.
        assert!(matches!(
            admission.enter(Sheddable, 0.0, now()),
            Entry::Full
        ));
        assert_eq!(admission.queued(), 3);
    }

    #[test]
    fn a_queue_full_of_critical_requests_refuses_rather_than_grows() {
        let mut admission = Admission::new(1, 1, None, None);
        assert!(matches!(admission.enter(Critical, 0.0, now()), Entry::Run));
        let _queued = waits(admission.enter(Critical, 0.0, now()));
        assert!(matches!(admission.enter(Critical, 0.0, now()), Entry::Full));
        assert!(matches!(
            admission.enter(Sheddable, 0.0, now()),
            Entry::Full
        ));
        assert_eq!(admission.queued(), 1);
    }

    #[test]
    fn an_abandoned_waiter_leaves_the_queue_and_takes_no_slot() {
        let mut admission = Admission::new(1, 10, None, None);
        assert!(matches!(admission.enter(Critical, 0.0, now()), Entry::Run));
        let (gone, ticket) = waits(admission.enter(Critical, 0.0, now()));
        let (mut next, _) = waits(admission.enter(Sheddable, 0.0, now()));
        assert!(admission.abandon(Critical, ticket));
        assert!(!admission.abandon(Critical, ticket));
        drop(gone);
        admission.leave(Duration::from_millis(1), 0.0, 0.0, now());
        assert_eq!(next.try_recv(), Ok(Turn::Run));
        // A waiter dropped without abandoning is skipped too.
        let (dropped, _) = waits(admission.enter(Critical, 0.0, now()));
        drop(dropped);
        admission.leave(Duration::from_millis(1), 0.0, 0.0, now());
        assert_eq!(admission.in_progress, 0);
    }

    #[test]
    fn the_expected_wait_follows_the_time_slots_are_held() {
        let mut admission = Admission::new(2, 10, None, None);
        assert_eq!(admission.expected_wait(Critical, 5, 0.0), Duration::ZERO);
        assert!(matches!(admission.enter(Critical, 0.0, now()), Entry::Run));
        admission.leave(Duration::from_millis(100), 0.0, 0.0, now());
        // Four ahead on two slots: two rounds, then this one's: three.
        assert_eq!(
            admission.expected_wait(Critical, 4, 0.0),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn the_budget_holds_requests_until_it_is_paid() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // 100 ms of CPU per second: bursts of 5 ms.
        let budget = CpuBudget::new(100.0, start);
        let mut admission = Admission::new(10, 10, Some(budget), None);
        // The first request may start (5 ms in the bucket) and owes 5 ms.
        assert!(matches!(admission.enter(Critical, 10.0, at(0)), Entry::Run));
        let (mut second, _) = waits(admission.enter(Sheddable, 10.0, at(0)));
        let (mut third, _) = waits(admission.enter(Critical, 10.0, at(0)));
        // Owed: 5 ms, then the critical one ahead: 10 ms more, at 100 ms/s.
        let close = |wait: Option<Duration>, ms: f64| {
            let wait = wait.map_or(f64::NAN, |wait| wait.as_secs_f64() * 1_000.0);
            assert!((wait - ms).abs() < 1e-3, "{wait} ms, not {ms}");
        };
        close(Some(admission.expected_wait(Sheddable, 1, 10.0)), 150.0);
        close(admission.budget_wait(), 51.0);
        admission.drain(at(40));
        assert!(third.try_recv().is_err());
        admission.drain(at(50));
        assert_eq!(third.try_recv(), Ok(Turn::Run));
        assert!(second.try_recv().is_err());
        // The first used only 1 ms of its predicted 10: the 9 back and the
        // 1 filled since pay the third's 10 at once.
        admission.leave(Duration::from_millis(60), 10.0, 1.0, at(60));
        assert_eq!(second.try_recv(), Ok(Turn::Run));
        assert_eq!(admission.budget_wait(), None);
    }
}
