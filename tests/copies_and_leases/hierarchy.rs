//! A hierarchy of servers (docs/design.md#a-hierarchy-of-servers), as real
//! processes on the memory store: a root with the capacity, a region
//! leasing from it, two leaves leasing from the region. Clients of the
//! leaves get shares of the root's capacity that follow their demand; with
//! the root stopped, the leaves' grants stand until they expire, then the
//! region's safe capacity is all there is; the root back, shares return.
//! A cut comes down as nudges (`WatchCapacity`), not at each level's round.

use std::time::{Duration, Instant};

use charon::api::v1::charon_client::CharonClient;
use tonic::transport::Channel;

use super::capacity_leases::lease_of;
use crate::support::sidecar::{Sidecar, tempdir, write_config};

const ROOT: &str = "
domain: jobs
resources:
  backend:
    capacity: {capacity: 100, lease: 2s, refresh_interval: 200ms, learning: 0s}
";

/// A level below: its capacity is the parent's lease (at most 1000); 10
/// when the parent is away and its lease has expired.
fn below(refresh: &str) -> String {
    format!(
        "
domain: jobs
resources:
  backend:
    capacity: {{capacity: 1000, from_parent: true, lease: 2s, refresh_interval: {refresh}, learning: 0s, safe_capacity: 10}}
"
    )
}

fn start(dir: &std::path::Path, name: &str, yaml: &str, extra: &[&str]) -> Sidecar {
    let own = dir.join(name);
    std::fs::create_dir_all(&own).expect("a directory per level");
    let config = write_config(&own, yaml);
    Sidecar::start(&own, &config, "memory", extra)
}

/// `client` of `server` asks for `wants` of jobs/backend/acme; what it is
/// granted.
async fn lease(server: &mut CharonClient<Channel>, client: &str, wants: f64) -> f64 {
    lease_of(server, client, wants).await.capacity
}

/// The two clients renew until their grants are `expected` (within 0.5),
/// B every 100 ms and A every `a_every`; how long that took, and the most
/// the two held at once.
async fn settle(
    a: &mut CharonClient<Channel>,
    b: &mut CharonClient<Channel>,
    wants: (f64, f64),
    expected: (f64, f64),
    what: &str,
    a_every: Duration,
) -> (Duration, f64) {
    let began = Instant::now();
    let mut last = (f64::NAN, f64::NAN);
    let mut a_renewed: Option<Instant> = None;
    let mut most = 0.0_f64;
    while began.elapsed() < Duration::from_secs(20) {
        // A lease (2 s) outlives every gap between renewals here: what a
        // client was granted last, it still holds.
        if a_renewed.is_none_or(|at| at.elapsed() >= a_every) {
            last.0 = lease(a, "worker-a", wants.0).await;
            a_renewed = Some(Instant::now());
            most = most.max(last.0 + last.1);
        }
        last.1 = lease(b, "worker-b", wants.1).await;
        most = most.max(last.0 + last.1);
        if (last.0 - expected.0).abs() < 0.5 && (last.1 - expected.1).abs() < 0.5 {
            return (began.elapsed(), most);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what}: the grants stayed at {last:?}, not {expected:?}");
}

/// How often a client renews when the test does not say otherwise.
const OFTEN: Duration = Duration::from_millis(100);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_levels_share_the_roots_capacity_and_ride_out_its_absence() {
    let dir = tempdir();
    let root = start(dir.path(), "root", ROOT, &[]);
    root.wait_serving().await;
    let root_ports = (root.grpc, root.admin);
    let region = start(
        dir.path(),
        "region",
        &below("300ms"),
        &["--parent", &root.grpc_url(), "--level-id", "region-eu"],
    );
    region.wait_serving().await;
    let leaf_a = start(
        dir.path(),
        "leaf-a",
        &below("500ms"),
        &["--parent", &region.grpc_url(), "--level-id", "leaf-a"],
    );
    let leaf_b = start(
        dir.path(),
        "leaf-b",
        &below("500ms"),
        &["--parent", &region.grpc_url(), "--level-id", "leaf-b"],
    );
    leaf_a.wait_serving().await;
    leaf_b.wait_serving().await;
    let mut a = leaf_a.client().await;
    let mut b = leaf_b.client().await;

    // Both want more than there is: half of the root's 100 each.
    let (took, _) = settle(&mut a, &mut b, (150.0, 150.0), (50.0, 50.0), "even", OFTEN).await;
    eprintln!("even shares after {took:?}");
    // B's demand falls: A gets what B leaves.
    let shift = async |a: &mut CharonClient<Channel>, b: &mut CharonClient<Channel>| {
        let (took, _) = settle(a, b, (150.0, 10.0), (90.0, 10.0), "a shift", OFTEN).await;
        eprintln!("shares after the shift in {took:?}");
    };
    shift(&mut a, &mut b).await;
    // B wants more again: A must give back 40 before B may have it. A
    // renews at its leaf's refresh interval (500 ms), slower than the
    // levels' rounds: its leaf reports what A still holds, and the region
    // counts it until A renews under the smaller grant, so the two never
    // hold more than 100 at once.
    let slowly = Duration::from_millis(500);
    let (took, most) = settle(&mut a, &mut b, (150.0, 150.0), (50.0, 50.0), "back", slowly).await;
    eprintln!("even again after {took:?}, at most {most} held at once");
    assert!(most <= 100.5, "the two held {most} of 100 at once");
    shift(&mut a, &mut b).await;

    // The root goes away: the grants stand until the root's lease (2 s)
    // expires, then the region has its safe 10 to share.
    let mut root = root;
    root.kill();
    let held = (lease(&mut a, "worker-a", 150.0).await, 0.0);
    assert!(held.0 > 10.0, "the grant stands at first: {held:?}");
    let (took, _) = settle(
        &mut a,
        &mut b,
        (150.0, 10.0),
        (5.0, 5.0),
        "root away",
        OFTEN,
    )
    .await;
    eprintln!("safe capacity after {took:?}");

    // The root is back: shares return.
    let root = Sidecar::start_at(
        &dir.path().join("root"),
        &dir.path().join("root").join("limits.yaml"),
        "memory",
        root_ports,
        &[],
    );
    root.wait_serving().await;
    let (took, _) = settle(
        &mut a,
        &mut b,
        (150.0, 10.0),
        (90.0, 10.0),
        "root back",
        OFTEN,
    )
    .await;
    eprintln!("shares back after {took:?}");
}

/// Levels whose rounds are slow (every 10 s once settled): a cut that
/// waited for them would take that long to come down.
const SLOW_ROOT: &str = "
domain: jobs
resources:
  backend:
    capacity: {capacity: 100, lease: 60s, refresh_interval: 10s, learning: 0s}
";

const SLOW_BELOW: &str = "
domain: jobs
resources:
  backend:
    capacity: {capacity: 1000, from_parent: true, lease: 60s, refresh_interval: 10s, learning: 0s, safe_capacity: 0}
";

/// `client` of `server` asks for `wants` every 100 ms until it is granted
/// `expected` (within 0.5), for at most `within`; the lease then.
async fn lease_until(
    server: &mut CharonClient<Channel>,
    client: &str,
    wants: f64,
    expected: f64,
    within: Duration,
) -> charon::api::v1::CapacityLease {
    let began = Instant::now();
    loop {
        let lease = lease_of(server, client, wants).await;
        if (lease.capacity - expected).abs() < 0.5 {
            return lease;
        }
        assert!(
            began.elapsed() < within,
            "{client}: granted {} after {within:?}, not {expected}",
            lease.capacity
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_is_pushed_down_the_levels_without_waiting_for_their_rounds() {
    let dir = tempdir();
    let root = start(dir.path(), "root", SLOW_ROOT, &[]);
    root.wait_serving().await;
    let level = |name: &str| {
        start(
            dir.path(),
            name,
            SLOW_BELOW,
            &["--parent", &root.grpc_url(), "--level-id", name],
        )
    };
    let (level_a, level_b) = (level("level-a"), level("level-b"));
    level_a.wait_serving().await;
    level_b.wait_serving().await;
    let mut a = level_a.client().await;
    let mut b = level_b.client().await;

    // worker-a alone: all 100, through level-a. Then both settle, so that
    // neither level-a nor worker-a would ask again for 10 s.
    lease_until(&mut a, "worker-a", 100.0, 100.0, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = lease_until(&mut a, "worker-a", 100.0, 100.0, Duration::from_secs(1)).await;
    assert_eq!(settled.refresh_interval_ms, 10_000, "{settled:?}");
    let mut nudges = a
        .watch_capacity(charon::api::v1::WatchCapacityRequest {
            client_id: "worker-a".into(),
        })
        .await
        .expect("level-a takes watchers")
        .into_inner();

    // worker-b wants 100 through level-b: the root nudges level-a, whose
    // grant shrinks to 50, and level-a nudges worker-a, which holds 100 of
    // it: within seconds, not the 10 s of anyone's next round.
    let asked = Instant::now();
    lease_of(&mut b, "worker-b", 100.0).await;
    let nudge = tokio::time::timeout(Duration::from_secs(5), nudges.message())
        .await
        .expect("worker-a is nudged within 5 s")
        .expect("the stream stays open")
        .expect("a nudge, not the stream's end");
    eprintln!("worker-a nudged after {:?} ({nudge:?})", asked.elapsed());
    // worker-a gives back: its share is 50 now, and worker-b gets it.
    lease_until(&mut a, "worker-a", 100.0, 50.0, Duration::from_secs(1)).await;
    lease_until(&mut b, "worker-b", 100.0, 50.0, Duration::from_secs(8)).await;
    eprintln!("even shares {:?} after worker-b asked", asked.elapsed());
    // An empty client id is refused.
    let refused = a
        .watch_capacity(charon::api::v1::WatchCapacityRequest {
            client_id: String::new(),
        })
        .await
        .expect_err("an empty client id is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn a_server_that_is_its_own_parent_is_refused_at_start() {
    use crate::support::redis::free_port;

    let dir = tempdir();
    let (grpc, admin) = (free_port(), free_port());
    let own = format!("http://127.0.0.1:{grpc}");
    let mut looped = Sidecar::start_at(
        dir.path(),
        &write_config(dir.path(), &below("500ms")),
        "memory",
        (grpc, admin),
        &["--parent", &own, "--level-id", "loop"],
    );
    let began = Instant::now();
    while looped.is_alive() && began.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!looped.is_alive(), "it kept running");
    assert!(
        looped.log().contains("its own ancestor"),
        "{}",
        looped.log()
    );
}
