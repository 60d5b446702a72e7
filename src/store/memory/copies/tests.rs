use super::*;
use crate::clock::ManualClock;

fn at(domain: &str) -> ResourceRef<'_> {
    ResourceRef {
        namespace: "ns",
        resource: "pool",
        domain,
    }
}

fn limits() -> CopyLimits {
    CopyLimits {
        domain_limit: Some(4),
        global_limit: Some(6),
        groups: vec![("big".into(), 5)],
    }
}

/// The holder releases as done in two steps (the count, then the
/// copies); a waiter for anyone's result, which read the count before,
/// tries at any point between them, once or twice: it is never granted
/// the copy, and it is told done whenever the count has moved.
#[test]
fn a_waiter_for_anyones_result_never_takes_a_copy_released_as_done() {
    let one = CopyLimits {
        domain_limit: Some(1),
        global_limit: None,
        groups: Vec::new(),
    };
    // Waiter tries at positions among the holder's steps (0: before
    // the count moves, 1: between, 2: after the release).
    for tries in [
        vec![0],
        vec![1],
        vec![2],
        vec![0, 1],
        vec![0, 2],
        vec![1, 2],
    ] {
        let log = MemoryCopies::new();
        assert_eq!(log.reserve(at("a"), &one, 1, 1).copies, 1);
        let before = log.done_count(at("a"));
        let mut answers = Vec::new();
        for step in 0..=2 {
            for _ in tries.iter().filter(|at| **at == step) {
                answers.push(log.reserve_unless_done(at("a"), &one, 1, 1, before));
            }
            match step {
                0 => {
                    log.mark_done(at("a"));
                }
                1 => {
                    log.release(at("a"), &[], 1, &[]);
                }
                _ => {}
            }
        }
        for (position, answer) in tries.iter().zip(&answers) {
            match answer {
                Reserved::Done => assert!(*position >= 1, "{tries:?}: {answers:?}"),
                Reserved::Decided(changed) => {
                    assert_eq!(*position, 0, "{tries:?}: {answers:?}");
                    assert_eq!(changed.copies, 0, "{tries:?}: the copy is still held");
                }
            }
        }
    }
}

#[test]
fn a_staged_transfer_counts_until_its_ttl_then_is_released() {
    let clock = ManualClock::new(1_000);
    let log = MemoryCopies::with_clock(clock.clone());
    let groups = vec!["big".to_owned()];
    assert_eq!(log.reserve(at("a"), &limits(), 4, 1).copies, 4);
    let staged = log.transfer(at("a"), &groups, 3, 500).unwrap();
    assert_eq!(staged.changed.copies, 3);
    // Still counted: `a` holds 1 in a session and 3 staged.
    assert_eq!(log.reserve(at("a"), &limits(), 1, 1).copies, 0);
    clock.set(1_499);
    assert_eq!(log.expire(), 0);
    clock.set(1_500);
    // Expired: it cannot be seized, and its copies are free again.
    assert_eq!(
        log.seize(&staged.transfer_id),
        Err(CopyError::UnknownTransfer)
    );
    assert_eq!(log.counts(at("a"), &["big"]).domain, 1);
    assert_eq!(log.reserve(at("a"), &limits(), 3, 3).copies, 3);
}

#[test]
fn a_seized_transfer_keeps_its_domain_and_groups_and_is_seized_once() {
    let log = MemoryCopies::new();
    let groups = vec!["big".to_owned()];
    log.reserve(at("a"), &limits(), 2, 2);
    let staged = log.transfer(at("a"), &groups, 2, 60_000).unwrap();
    let seized = log.seize(&staged.transfer_id).unwrap();
    assert_eq!((seized.domain.as_str(), seized.copies), ("a", 2));
    assert_eq!(seized.groups, groups);
    assert_eq!(
        log.seize(&staged.transfer_id),
        Err(CopyError::UnknownTransfer)
    );
    let released = log.release(at("a"), &groups, 2, &["big"]);
    assert_eq!(released.copies, 2);
    assert_eq!(
        released.counts,
        CopyCounts {
            domain: 0,
            global: 0,
            groups: vec![0]
        }
    );
    assert!(log.is_empty());
}

#[test]
fn a_release_never_takes_more_than_is_counted() {
    let log = MemoryCopies::new();
    log.reserve(at("a"), &limits(), 1, 1);
    let released = log.release(at("a"), &["big".to_owned()], 5, &["big"]);
    assert_eq!(released.copies, 1);
    assert!(log.is_empty());
}
