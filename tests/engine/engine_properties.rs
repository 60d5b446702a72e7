//! Properties of the burst-tier engine (docs/design.md#burst-tiers), checked
//! against a naive hit-by-hit reference model written straight from that
//! page's rules, and against the grant history itself.

use crate::support;

use charon::config::RatePolicy;
use charon::engine::{self, Item, Outcome, Slot, SlotKind, TierOutcome, TiersItem};
use proptest::prelude::*;
use support::properties::arb_policy;

const DOMAINS: usize = 2;
const GLOBAL_SLOT: usize = DOMAINS;

/// The reference: docs/design.md#burst-tiers, literally, one hit at a time.
#[derive(Clone, Debug, Default)]
struct RefDomain {
    entered: Vec<Option<u64>>,
    hits: Vec<Vec<u64>>,
    recent: Vec<u64>,
    /// A bucket's theoretical arrival time, in 1/count ms (docs/design.md#gcra).
    tat: u128,
}

#[derive(Clone, Debug)]
struct Reference {
    policy: RatePolicy,
    global_limit: Option<u64>,
    domains: Vec<RefDomain>,
    global: Vec<u64>,
}

#[derive(PartialEq)]
enum RefPhase {
    Inactive,
    Active,
    Cooldown,
}

impl Reference {
    fn new(policy: RatePolicy, global_limit: Option<u64>) -> Self {
        let n = policy.tiers.len();
        let domain = RefDomain {
            entered: vec![None; n],
            hits: vec![Vec::new(); n],
            recent: Vec::new(),
            tat: 0,
        };
        Self {
            policy,
            global_limit,
            domains: vec![domain; DOMAINS],
            global: Vec::new(),
        }
    }

    fn phase(&self, d: usize, i: usize, now: u64) -> RefPhase {
        let tier = &self.policy.tiers[i];
        match self.domains[d].entered[i] {
            None => RefPhase::Inactive,
            Some(e) => {
                let end = e.saturating_add(tier.active);
                if e <= now && now < end {
                    RefPhase::Active
                } else if end <= now && now < end.saturating_add(tier.cooldown) {
                    RefPhase::Cooldown
                } else {
                    RefPhase::Inactive
                }
            }
        }
    }

    fn in_window(times: &[u64], window: u64, now: u64) -> u64 {
        times
            .iter()
            .filter(|&&t| now <= t.saturating_add(window))
            .count() as u64
    }

    /// One hit: Some(new state) if granted.
    fn one(&self, d: usize, now: u64) -> Option<Reference> {
        let mut next = self.clone();
        if let Some(h) = self.policy.hard_limit
            && Self::in_window(&self.domains[d].recent, 1000, now) >= h
        {
            return None;
        }
        if let Some(g) = self.global_limit
            && Self::in_window(&self.global, 1000, now) >= g
        {
            return None;
        }
        if let Some(gcra) = self.policy.gcra {
            // Seed 003: allowed if max(TAT, now) + T <= now + burst·T.
            let now_t = u128::from(now) * u128::from(gcra.count);
            let interval = u128::from(gcra.period);
            let tat = self.domains[d].tat.max(now_t);
            if tat + interval > now_t + u128::from(gcra.burst) * interval {
                return None;
            }
            next.domains[d].tat = tat + interval;
            next.domains[d].recent.push(now);
            next.global.push(now);
            return Some(next);
        }
        let n = self.policy.tiers.len();
        let current = (0..n)
            .rev()
            .find(|&i| self.phase(d, i, now) == RefPhase::Active);
        let mut placed = false;
        if let Some(c) = current {
            let tier = &self.policy.tiers[c];
            if Self::in_window(&self.domains[d].hits[c], tier.window, now) < tier.limit {
                next.domains[d].hits[c].push(now);
                placed = true;
            }
        }
        if !placed {
            let mut j = current.map_or(0, |c| c + 1);
            loop {
                if j >= n {
                    return None;
                }
                match self.phase(d, j, now) {
                    RefPhase::Cooldown if self.policy.tiers[j].skippable => j += 1,
                    RefPhase::Cooldown => return None,
                    RefPhase::Active => unreachable!("a tier above the current one is active"),
                    RefPhase::Inactive => {
                        next.domains[d].entered[j] = Some(now);
                        next.domains[d].hits[j].clear();
                        if self.policy.tiers[j].limit > 0 {
                            next.domains[d].hits[j].push(now);
                            break;
                        }
                        j += 1;
                    }
                }
            }
        }
        next.domains[d].recent.push(now);
        next.global.push(now);
        Some(next)
    }

    /// A bulk request: the largest k in [m, n] grantable hit by hit.
    fn request(&mut self, d: usize, n: u64, m: u64, now: u64) -> u64 {
        let mut trial = self.clone();
        let mut k = 0;
        while k < n {
            match trial.one(d, now) {
                Some(next) => {
                    trial = next;
                    k += 1;
                }
                None => break,
            }
        }
        if k >= m {
            *self = trial;
            k
        } else {
            0
        }
    }
}

/// The engine under test, with two domains and a shared global log.
#[derive(Clone)]
struct Engine {
    policy: RatePolicy,
    global_limit: Option<u64>,
    slots: Vec<Slot>,
}

impl Engine {
    fn new(policy: RatePolicy, global_limit: Option<u64>) -> Self {
        let mut slots: Vec<Slot> = (0..DOMAINS).map(|_| Slot::new(SlotKind::Tiers)).collect();
        slots.push(Slot::new(SlotKind::Log));
        Self {
            policy,
            global_limit,
            slots,
        }
    }

    fn ask(&mut self, d: usize, n: u64, m: u64, check_only: bool, now: u64) -> TierOutcome {
        let items = [Item::Tiers(TiersItem {
            slot: d,
            global_slot: Some(GLOBAL_SLOT),
            policy: &self.policy,
            global_limit: self.global_limit,
            copies: n,
            min_copies: m,
            check_only,
            shadow: false,
        })];
        match engine::decide(&items, &mut self.slots, now).outcomes[0] {
            Outcome::Tiers(outcome) => outcome,
            Outcome::Window(_) | Outcome::Gcra(_) => unreachable!(),
        }
    }

    fn request(&mut self, d: usize, n: u64, m: u64, now: u64) -> TierOutcome {
        self.ask(d, n, m, false, now)
    }

    fn would_grant_one(&self, d: usize, now: u64) -> bool {
        let mut probe = self.clone();
        !probe.ask(d, 1, 1, true, now).over
    }
}

#[derive(Debug, Clone)]
struct Op {
    advance: u64,
    domain: usize,
    copies: u64,
    min_copies: u64,
}

fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        (
            prop_oneof![Just(0u64), 1u64..50, 50u64..1500, 1500u64..8000],
            0..DOMAINS,
            1u64..7,
            0u64..7,
        )
            .prop_map(|(advance, domain, copies, min)| Op {
                advance,
                domain,
                copies,
                min_copies: min.clamp(1, copies),
            }),
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The engine grants exactly what the hit-by-hit model of the rules grants.
    #[test]
    fn engine_matches_the_reference_model((policy, global) in arb_policy(0..4, 0..12, 0..16), ops in arb_ops()) {
        let mut engine = Engine::new(policy.clone(), global);
        let mut reference = Reference::new(policy, global);
        let mut now = 1_000_000;
        for op in ops {
            now += op.advance;
            let expected = reference.request(op.domain, op.copies, op.min_copies, now);
            let got = engine.request(op.domain, op.copies, op.min_copies, now);
            prop_assert_eq!(got.granted, expected, "at {}: {:?}", now, op);
            prop_assert_eq!(got.over, expected == 0);
        }
    }

    /// Never more than L_c hits in a tier window, H per domain or G per
    /// resource in any one-second window (checked on the grant history).
    #[test]
    fn limits_hold_over_any_window((policy, global) in arb_policy(0..4, 0..12, 0..16), ops in arb_ops()) {
        let mut engine = Engine::new(policy.clone(), global);
        let mut now = 1_000_000;
        let mut grants: Vec<(u64, usize, u64)> = Vec::new();
        for op in ops {
            now += op.advance;
            let outcome = engine.request(op.domain, op.copies, op.min_copies, now);
            if outcome.granted > 0 {
                grants.push((now, op.domain, outcome.granted));
            }
            for slot in &engine.slots[..DOMAINS] {
                let Slot::Tiers(state) = slot else { unreachable!() };
                for (tier, log) in policy.tiers.iter().zip(&state.tiers) {
                    if engine::tiers::phase(tier, log.entered_at, now) == engine::Phase::Active {
                        prop_assert!(log.hits.count(now, tier.window) <= tier.limit);
                    }
                }
            }
        }
        for &(t, _, _) in &grants {
            let in_second = |domain: Option<usize>| -> u64 {
                grants
                    .iter()
                    .filter(|&&(u, d, _)| u <= t && t <= u + 1000 && domain.is_none_or(|x| x == d))
                    .map(|&(_, _, k)| k)
                    .sum()
            };
            if let Some(h) = policy.hard_limit {
                for d in 0..DOMAINS {
                    prop_assert!(in_second(Some(d)) <= h);
                }
            }
            if let Some(g) = global {
                prop_assert!(in_second(None) <= g);
            }
        }
    }

    /// A rejection changes nothing; a check changes nothing.
    #[test]
    fn rejections_and_checks_change_nothing((policy, global) in arb_policy(0..4, 0..12, 0..16), ops in arb_ops(), probe in 1u64..10) {
        let mut engine = Engine::new(policy, global);
        let mut now = 1_000_000;
        for op in ops {
            now += op.advance;
            let before = engine.slots.clone();
            let outcome = engine.request(op.domain, op.copies, op.min_copies, now);
            if outcome.over {
                prop_assert_eq!(&before, &engine.slots);
            }
            let before = engine.slots.clone();
            engine.ask(op.domain, probe, probe, true, now);
            prop_assert_eq!(&before, &engine.slots);
        }
    }

    /// retry_after is exact: granted at now + retry_after, rejected 1 ms
    /// before when it is positive; `None` means no later instant helps.
    #[test]
    fn retry_after_is_exact((policy, global) in arb_policy(0..4, 0..12, 0..16), ops in arb_ops()) {
        let mut engine = Engine::new(policy, global);
        let mut now = 1_000_000;
        for op in ops {
            now += op.advance;
            let outcome = engine.request(op.domain, op.copies, op.min_copies, now);
            match outcome.retry_after {
                Some(0) => prop_assert!(engine.would_grant_one(op.domain, now)),
                Some(delay) => {
                    // No earlier instant grants: every one for short delays,
                    // a spread of them (and the last) for long ones.
                    let step = (delay / 64).max(1);
                    let mut earlier: Vec<u64> = (0..delay).step_by(step as usize).collect();
                    earlier.push(delay - 1);
                    for d in earlier {
                        prop_assert!(!engine.would_grant_one(op.domain, now + d), "granted at +{} < +{}", d, delay);
                    }
                    prop_assert!(engine.would_grant_one(op.domain, now + delay));
                }
                None => {
                    for later in [now, now + 1, now + 1_001, now + 60_000, now + 10_000_000] {
                        prop_assert!(!engine.would_grant_one(op.domain, later));
                    }
                }
            }
        }
    }

    /// A granted bulk request leaves the same state as the same hits sent one
    /// by one at the same instant.
    #[test]
    fn bulk_equals_one_by_one((policy, global) in arb_policy(0..4, 0..12, 0..16), ops in arb_ops(), bulk in 1u64..12, domain in 0..DOMAINS) {
        let mut engine = Engine::new(policy, global);
        let mut now = 1_000_000;
        for op in ops {
            now += op.advance;
            engine.request(op.domain, op.copies, op.min_copies, now);
        }
        now += 1;
        let mut singles = engine.clone();
        let outcome = engine.request(domain, bulk, bulk, now);
        if !outcome.over {
            for _ in 0..bulk {
                prop_assert!(!singles.request(domain, 1, 1, now).over);
            }
            prop_assert_eq!(&engine.slots, &singles.slots);
        }
    }
}

// GCRA (docs/design.md#gcra): the bucket's promises, over random traffic.

mod gcra_properties {
    use charon::engine::gcra::{GcraLimit, GcraState, decide};
    use proptest::prelude::*;

    fn arb_limit() -> impl Strategy<Value = GcraLimit> {
        (
            1u64..8,
            prop::sample::select(vec![1_000u64, 2_500, 60_000]),
            1u64..6,
        )
            .prop_map(|(count, period, burst)| GcraLimit {
                count,
                period,
                burst,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Over any interval of length L, grants <= burst + L / T.
        #[test]
        fn no_interval_grants_more_than_burst_plus_rate(
            limit in arb_limit(),
            requests in prop::collection::vec((0u64..800, 0u64..4), 1..120),
        ) {
            let mut state = GcraState::default();
            let mut now = 1_700_000_000_000u64;
            let mut granted: Vec<(u64, u64)> = Vec::new();
            for (step, hits) in requests {
                now += step;
                let before = state;
                let outcome = decide(&limit, &mut state, hits, now, true);
                if outcome.over || hits == 0 {
                    // A denial (or a check) changes nothing.
                    prop_assert_eq!(state, before);
                } else {
                    granted.push((now, hits));
                }
            }
            for (i, (start, _)) in granted.iter().enumerate() {
                let mut total = 0u128;
                for (at, hits) in &granted[i..] {
                    total += u128::from(*hits);
                    let length = u128::from(at - start);
                    // total <= burst + length * count / period, in integers.
                    prop_assert!(
                        total * u128::from(limit.period)
                            <= u128::from(limit.burst) * u128::from(limit.period)
                                + length * u128::from(limit.count),
                        "{} hits in {} ms under {:?}", total, length, limit
                    );
                }
            }
        }

        /// A client that never comes earlier than the emission interval is
        /// never denied (whole-millisecond intervals).
        #[test]
        fn a_client_at_the_permitted_rate_is_never_denied(
            interval in 1u64..500,
            count in 1u64..10,
            burst in 1u64..4,
            lateness in prop::collection::vec(0u64..50, 1..200),
        ) {
            let limit = GcraLimit { count, period: interval * count, burst };
            let mut state = GcraState::default();
            let mut now = 1_700_000_000_000u64;
            for late in lateness {
                let outcome = decide(&limit, &mut state, 1, now, true);
                prop_assert!(!outcome.over, "denied at {} under {:?}", now, limit);
                now += interval + late;
            }
        }

        /// remaining and retry_after say exactly what happens next.
        #[test]
        fn remaining_and_retry_after_are_exact(
            limit in arb_limit(),
            steps in prop::collection::vec(0u64..700, 1..60),
        ) {
            let mut state = GcraState::default();
            let mut now = 1_700_000_000_000u64;
            for step in steps {
                now += step;
                let outcome = decide(&limit, &mut state, 1, now, true);
                // `remaining` more one-hit requests pass now, and not one more.
                let mut probe = state;
                for _ in 0..outcome.remaining {
                    prop_assert!(!decide(&limit, &mut probe, 1, now, true).over);
                }
                prop_assert!(decide(&limit, &mut probe, 1, now, true).over);
                // After a denial, one hit passes exactly at retry_after.
                if outcome.over {
                    let wait = outcome.retry_after.expect("a finite wait");
                    prop_assert!(wait > 0);
                    let mut later = state;
                    prop_assert!(!decide(&limit, &mut later, 1, now + wait, false).over);
                    prop_assert!(decide(&limit, &mut later, 1, now + wait - 1, false).over);
                }
            }
        }
    }
}
