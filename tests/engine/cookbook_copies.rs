//! The copy-limited cookbook patterns (docs/design.md#cookbook-patterns),
//! loaded from
//! `examples/cookbook/copies-*.yaml` and decided by the memory copy log:
//! each behaves as its comment says. (The sidecar tests prove that Redis
//! decides alike.)
#![cfg(feature = "server")]

use charon::config::{self, Resource};
use charon::engine::copies::CopyLimits;
use charon::store::MemoryCopies;
use charon::store::ResourceRef;

fn limits_of(file: &str, resource: &str) -> (String, impl Fn(&str) -> CopyLimits) {
    let path = format!("{}/examples/cookbook/{file}", env!("CARGO_MANIFEST_DIR"));
    let loaded = config::load_path(path.as_ref()).expect("cookbook example loads");
    let namespace = loaded
        .config
        .namespaces()
        .next()
        .expect("one namespace")
        .clone();
    let Some(Resource::Copies(copies)) = namespace.resources.get(resource).cloned() else {
        panic!("{resource} is copy-limited");
    };
    (namespace.name.clone(), move |domain: &str| {
        CopyLimits::for_domain(&copies, domain)
    })
}

fn at<'a>(namespace: &'a str, resource: &'a str, domain: &'a str) -> ResourceRef<'a> {
    ResourceRef {
        namespace,
        resource,
        domain,
    }
}

#[test]
fn the_bulkhead_keeps_sixty_slots_for_everyone_else() {
    let (ns, limits) = limits_of("copies-bulkhead.yaml", "transcoder");
    let log = MemoryCopies::new();
    let reserve = |domain: &str, copies: u64| {
        log.reserve(at(&ns, "transcoder", domain), &limits(domain), copies, 1)
            .copies
    };
    // acme may hold 30, globex 10: together the bulkhead's 40.
    assert_eq!(reserve("acme", 100), 30);
    assert_eq!(reserve("globex", 100), 10);
    assert_eq!(reserve("acme", 100), 0);
    assert_eq!(reserve("globex", 100), 0);
    // Everyone else: 10 each, up to the 60 left of the global 100.
    let others: u64 = (0..7).map(|i| reserve(&format!("small-{i}"), 100)).sum();
    assert_eq!(others, 60);
    assert_eq!(reserve("small-99", 1), 0);
}

#[test]
fn probation_caps_new_clients_together_until_they_are_trusted() {
    let (ns, limits) = limits_of("copies-probation.yaml", "report-export");
    let log = MemoryCopies::new();
    let reserve = |domain: &str, copies: u64| {
        log.reserve(at(&ns, "report-export", domain), &limits(domain), copies, 1)
    };
    assert_eq!(reserve("newco", 3).copies, 3);
    let second = reserve("startup-1", 3);
    assert_eq!(second.copies, 2, "the probation pool has 5 in all");
    assert_eq!(second.counts.groups, vec![5]);
    assert_eq!(reserve("startup-2", 1).copies, 0);
    // A trusted client is in no group: its own limit only.
    assert_eq!(reserve("trusted", 3).copies, 3);
    // Releasing names the groups of the reserve.
    let released = log.release(
        at(&ns, "report-export", "newco"),
        &["probation".to_owned()],
        3,
        &["probation"],
    );
    assert_eq!(released.copies, 3);
    assert_eq!(reserve("startup-2", 3).copies, 3);
}

#[test]
fn blacklisted_domains_never_hold_a_copy() {
    let (ns, limits) = limits_of("copies-blacklist.yaml", "db-connection");
    let log = MemoryCopies::new();
    let reserve = |domain: &str| {
        log.reserve(at(&ns, "db-connection", domain), &limits(domain), 1, 1)
            .copies
    };
    assert_eq!(reserve("abuser-1"), 0);
    assert_eq!(reserve("abuser-2"), 0);
    assert_eq!(reserve("customer"), 1);
}
