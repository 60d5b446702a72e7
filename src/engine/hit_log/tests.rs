//! Unit tests of `hit_log`, beside it rather than inside it.

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

#[test]
fn a_long_log_takes_eight_bytes_an_instant_and_a_fifth_more_room() {
    let mut log = HitLog::default();
    for t in 0..1_000 {
        log.push(t * 3, 2);
        let Entries::Narrow { packed, .. } = &log.entries else {
            panic!("narrow");
        };
        assert!(
            packed.capacity() <= packed.len() * 5 / 4 + 1,
            "{}",
            packed.capacity()
        );
    }
    assert_eq!(log.count(2_997, 3_000), 2_000);
}

#[test]
fn a_log_past_the_narrow_form_goes_wide_and_back_when_cleared() {
    let mut log = HitLog::default();
    log.push(10, 1);
    log.push(10, u64::from(u32::MAX));
    assert!(matches!(log.entries, Entries::Wide(_)));
    assert_eq!(
        log.entries().collect::<Vec<_>>(),
        [(10, u64::from(u32::MAX) + 1)]
    );
    log.clear();
    assert!(matches!(log.entries, Entries::Narrow { .. }));

    // A span of more than 49 days: narrow again once the old ones go.
    let day = 86_400_000;
    log.push(0, 1);
    log.push(60 * day, 1);
    assert!(matches!(log.entries, Entries::Wide(_)));
    log.clear();
    log.push(0, 1);
    log.push(40 * day, 1);
    log.prune(45 * day, 10 * day);
    log.push(60 * day, 1);
    assert!(matches!(log.entries, Entries::Narrow { .. }));
    assert_eq!(
        log.entries().collect::<Vec<_>>(),
        [(40 * day, 1), (60 * day, 1)]
    );
}

mod against_a_plain_log {
    //! The log against the plain `(time, count)` deque it replaced,
    //! operation by operation, with instants and counts on both sides
    //! of 2^32.
    use super::*;
    use proptest::prelude::*;

    #[derive(Default)]
    struct Plain {
        entries: VecDeque<(u64, u64)>,
        total: u64,
    }

    impl Plain {
        fn count(&self, now: u64, window: u64) -> u64 {
            let expired: u64 = self
                .entries
                .iter()
                .take_while(|(t, _)| t.saturating_add(window) < now)
                .map(|(_, n)| n)
                .sum();
            self.total - expired
        }

        fn prune(&mut self, now: u64, window: u64) {
            while let Some(&(t, n)) = self.entries.front() {
                if t.saturating_add(window) >= now {
                    break;
                }
                self.entries.pop_front();
                self.total -= n;
            }
        }

        fn push(&mut self, now: u64, n: u64) {
            if n == 0 {
                return;
            }
            match self.entries.back_mut() {
                Some((t, count)) if *t >= now => *count += n,
                _ => self.entries.push_back((now, n)),
            }
            self.total += n;
        }

        fn truncate(&mut self, limit: u64) {
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
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u64, u64),
        Prune(u64),
        Truncate(u64),
        Clear,
    }

    fn step() -> impl Strategy<Value = u64> {
        prop_oneof![
            4 => 0u64..5,
            2 => 0u64..100_000,
            1 => (1u64 << 32) - 3..(1u64 << 32) + 3,
            1 => 1u64 << 40..1u64 << 41,
        ]
    }

    fn hits() -> impl Strategy<Value = u64> {
        prop_oneof![
            6 => 0u64..10,
            1 => (1u64 << 32) - 3..(1u64 << 32) + 3,
            1 => 1u64 << 33..1u64 << 40,
        ]
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                8 => (step(), hits()).prop_map(|(dt, n)| Op::Push(dt, n)),
                2 => step().prop_map(Op::Prune),
                1 => (0u64..50).prop_map(Op::Truncate),
                1 => Just(Op::Clear),
            ],
            0..60,
        )
    }

    proptest! {
        #[test]
        fn decides_as_the_plain_log(ops in ops(), window in step(), back in 0u64..3) {
            let (mut log, mut plain) = (HitLog::default(), Plain::default());
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Push(dt, n) => {
                        now += dt;
                        // Now and then a clock that stepped back.
                        let at = now.saturating_sub(back * dt.min(2));
                        log.push(at, n);
                        plain.push(at, n);
                    }
                    Op::Prune(dt) => {
                        log.prune(now + dt, window);
                        plain.prune(now + dt, window);
                    }
                    Op::Truncate(limit) => {
                        log.truncate(limit);
                        plain.truncate(limit);
                    }
                    Op::Clear => {
                        log.clear();
                        plain = Plain::default();
                    }
                }
                let expected: Vec<_> = plain.entries.iter().copied().collect();
                prop_assert_eq!(log.entries().collect::<Vec<_>>(), expected);
                prop_assert_eq!(log.len(), plain.entries.len());
                prop_assert_eq!(log.last(), plain.entries.back().map(|e| e.0));
                for at in [now, now + window / 2, now.saturating_add(window)] {
                    prop_assert_eq!(log.count(at, window), plain.count(at, window));
                }
            }
            let copy = HitLog::from_entries(log.entries());
            prop_assert_eq!(copy, log);
        }

        #[test]
        fn any_entries_come_back_as_they_went_in(
            entries in prop::collection::vec((any::<u64>(), any::<u64>()), 0..20),
        ) {
            let log = HitLog::from_entries(entries.iter().copied());
            prop_assert_eq!(log.entries().collect::<Vec<_>>(), entries);
        }
    }
}
