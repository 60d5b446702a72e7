//! Global limits at their edges (docs/design.md#spare-capacity-lent,
//! docs/design.md#the-parent-away), as real processes: a root, two regions
//! (one on the memory store, one on its own Redis) and three leaves, one
//! global limit of 100 a second, shares renewed every 200 ms. A leaf whose
//! demand is under the limit is never refused once the shares settled; in
//! no second do the leaves admit more than the limit; and with the root
//! gone, the leaves together admit about the limit, never half again as
//! much, until it is back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use crate::support::redis::RedisServer;
use crate::support::sidecar::{Sidecar, tempdir, write_config};

const LIMITS: &str = "
domain: api
descriptors:
  - key: route
    value: search
    rate_limit: {unit: second, requests_per_unit: 100, global: true}
";

const SHARE: &str = "rate_limit:route_search";

/// (sent, admitted) by the second (since the epoch) they were answered in.
type Counted = Arc<Mutex<BTreeMap<u64, (u64, u64)>>>;

fn now_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs())
}

/// Sends `rate` requests a second (0: none), evenly spaced, to the leaf at
/// `url` until the test ends, counting what was sent and admitted.
fn load(url: String, rate: Arc<AtomicU64>, counted: Counted) {
    load_answered(url, rate, move |admitted| {
        let mut counted = counted.lock().unwrap_or_else(|p| p.into_inner());
        let second = counted.entry(now_second()).or_default();
        second.0 += 1;
        second.1 += u64::from(admitted);
    });
}

/// Sends `rate` requests a second (0: none), evenly spaced, for the global
/// limit `route=search` of namespace `api` to the server at `url` until the
/// test ends; `answered(admitted)` after each answer (an error is a
/// refusal).
pub(super) fn load_answered(
    url: String,
    rate: Arc<AtomicU64>,
    answered: impl Fn(bool) + Send + 'static,
) {
    tokio::spawn(async move {
        let mut client = RateLimitServiceClient::connect(url)
            .await
            .expect("the leaf answers");
        let request = RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "route".into(),
                    value: "search".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        loop {
            let per_second = rate.load(Ordering::Relaxed);
            if per_second == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            let gap = Duration::from_secs(1) / u32::try_from(per_second).unwrap_or(1);
            let sent = tokio::time::Instant::now();
            let admitted = client
                .should_rate_limit(request.clone())
                .await
                .is_ok_and(|answer| answer.into_inner().overall_code == Code::Ok as i32);
            answered(admitted);
            tokio::time::sleep_until(sent + gap).await;
        }
    });
}

/// The hierarchy: a root, region A (memory) with leaves A1 and A2, region
/// B (on `redis`) with leaf B1.
struct Hierarchy {
    dir: tempfile::TempDir,
    root: Sidecar,
    regions: [Sidecar; 2],
    leaves: [Sidecar; 3],
    rates: [Arc<AtomicU64>; 3],
    counted: [Counted; 3],
}

fn start(dir: &std::path::Path, name: &str, store: &str, extra: &[&str]) -> Sidecar {
    start_at(dir, name, store, None, extra)
}

fn start_at(
    dir: &std::path::Path,
    name: &str,
    store: &str,
    ports: Option<(u16, u16)>,
    extra: &[&str],
) -> Sidecar {
    let own = dir.join(name);
    std::fs::create_dir_all(&own).expect("a directory per server");
    let config = write_config(&own, LIMITS);
    match ports {
        Some(ports) => Sidecar::start_at(&own, &config, store, ports, extra),
        None => Sidecar::start(&own, &config, store, extra),
    }
}

impl Hierarchy {
    async fn start(redis: &RedisServer, timing: &[&str]) -> Self {
        let dir = tempdir();
        let root = start(dir.path(), "root", "memory", timing);
        root.wait_serving().await;
        let under = |parent: &Sidecar, id: &str| {
            let mut args = vec![
                "--parent".to_owned(),
                parent.grpc_url(),
                "--level-id".to_owned(),
                id.to_owned(),
            ];
            args.extend(timing.iter().map(|arg| (*arg).to_owned()));
            args
        };
        let args = under(&root, "region-a");
        let region_a = start(dir.path(), "region-a", "memory", &strs(&args));
        let args = under(&root, "region-b");
        let region_b = start(dir.path(), "region-b", &redis.url(), &strs(&args));
        region_a.wait_serving().await;
        region_b.wait_serving().await;
        let args = under(&region_a, "leaf-a1");
        let a1 = start(dir.path(), "leaf-a1", "memory", &strs(&args));
        let args = under(&region_a, "leaf-a2");
        let a2 = start(dir.path(), "leaf-a2", "memory", &strs(&args));
        let args = under(&region_b, "leaf-b1");
        let b1 = start(dir.path(), "leaf-b1", "memory", &strs(&args));
        for leaf in [&a1, &a2, &b1] {
            leaf.wait_serving().await;
        }
        let rates: [Arc<AtomicU64>; 3] = Default::default();
        let counted: [Counted; 3] = Default::default();
        for (leaf, (rate, counted)) in [&a1, &a2, &b1].into_iter().zip(rates.iter().zip(&counted)) {
            load(leaf.grpc_url(), rate.clone(), counted.clone());
        }
        Self {
            dir,
            root,
            regions: [region_a, region_b],
            leaves: [a1, a2, b1],
            rates,
            counted,
        }
    }

    fn offer(&self, rates: [u64; 3]) {
        for (rate, per_second) in self.rates.iter().zip(rates) {
            rate.store(per_second, Ordering::Relaxed);
        }
    }

    /// Each whole second of `from..to`: what each leaf was sent and admitted.
    fn seconds(&self, from: u64, to: u64) -> Vec<[(u64, u64); 3]> {
        (from..to)
            .map(|second| {
                let mut row = [(0, 0); 3];
                for (cell, counted) in row.iter_mut().zip(&self.counted) {
                    let counted = counted.lock().unwrap_or_else(|p| p.into_inner());
                    *cell = counted.get(&second).copied().unwrap_or((0, 0));
                }
                row
            })
            .collect()
    }

    /// Runs `rates` for `seconds` whole seconds; the rows of all but the
    /// first `settle` of them.
    async fn phase(&self, rates: [u64; 3], seconds: u64, settle: u64) -> Vec<[(u64, u64); 3]> {
        self.offer(rates);
        let began = now_second() + 1;
        tokio::time::sleep(Duration::from_secs(seconds + 1)).await;
        let rows = self.seconds(began, began + seconds);
        eprintln!("{rates:?} a second: (sent, admitted) {rows:?}");
        rows.into_iter().skip(settle as usize).collect()
    }
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn refused(row: &[(u64, u64); 3]) -> u64 {
    row.iter().map(|(sent, admitted)| sent - admitted).sum()
}

fn admitted(row: &[(u64, u64); 3]) -> u64 {
    row.iter().map(|(_, admitted)| admitted).sum()
}

/// The state view of the global limit on `server`.
async fn global_state(server: &Sidecar) -> serde_json::Value {
    let url = server.admin_url(&format!("/debug/state?namespace=api&resource={SHARE}"));
    let text = reqwest::get(url)
        .await
        .expect("the state view answers")
        .text()
        .await
        .expect("a body");
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

const TIMING: [&str; 2] = ["--global-refresh-interval", "200ms"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demand_under_the_limit_is_never_refused_and_one_over_it_gets_the_limit() {
    let redis = RedisServer::start();
    let hierarchy = Hierarchy::start(&redis, &TIMING).await;

    // One leaf alone at a fifth of the limit: the limit's spare is lent to
    // it, so its noise never meets its share.
    let rows = hierarchy.phase([20, 0, 0], 7, 2).await;
    for row in &rows {
        assert_eq!(refused(row), 0, "alone at 20 % of the limit: {rows:?}");
    }
    let lent = hierarchy.leaves[0]
        .metric(&format!(
            "charon_global_limit_share_lent{{namespace=\"api\",resource=\"{SHARE}\"}}"
        ))
        .await;
    assert!(lent >= 50.0, "the spare is lent: {lent}");
    let state = global_state(&hierarchy.leaves[0]).await;
    assert_eq!(state["share"], 100, "{state}");
    assert_eq!(state["lent"], lent as u64, "{state}");
    assert_eq!(state["on_safe_share"], false, "{state}");

    // Three leaves at 10, 10 and 3 % of the limit: 23 % in all.
    let rows = hierarchy.phase([10, 10, 3], 7, 2).await;
    for row in &rows {
        assert_eq!(refused(row), 0, "at 10/10/3 % of the limit: {rows:?}");
    }

    // 180 % of the limit: in no second more than the limit (2 for requests
    // answered just after the second they were admitted in), and the limit
    // used once the shares settled.
    let rows = hierarchy.phase([60, 60, 60], 8, 0).await;
    for row in &rows {
        assert!(admitted(row) <= 102, "over the limit: {rows:?}");
    }
    let steady: u64 = rows[4..].iter().map(admitted).sum();
    assert!(
        steady * 100 >= 98 * 100 * rows[4..].len() as u64,
        "under 98 % used: {rows:?}"
    );

    // A shift: B1's demand grows ten times, from 10 to 100 a second, while
    // A1 and A2 still ask 50 each. Region B's share grows as region A's
    // leaves give theirs back, within a few refresh intervals.
    let rows = hierarchy.phase([50, 50, 10], 5, 0).await;
    for row in &rows {
        assert!(admitted(row) <= 102, "over the limit: {rows:?}");
    }
    let rows = hierarchy.phase([50, 50, 100], 6, 0).await;
    for row in &rows {
        assert!(
            admitted(row) <= 102,
            "over the limit in the shift: {rows:?}"
        );
    }
    for row in &rows[2..] {
        assert!(admitted(row) >= 95, "the shift did not settle: {rows:?}");
        assert!(row[2].1 >= 45, "B1 did not get its half: {rows:?}");
    }
    hierarchy.offer([0, 0, 0]);
}

/// The root killed as the leaves jump from 23 % to 180 % of the limit,
/// with the regions on `safe_share` (`None`: the default); `shares`, what
/// each leaf's share must be on its region's safe share. Shares last 3 s:
/// the last grant stands 3 s, then the safe share.
async fn the_root_away(safe_share: Option<&str>, shares: impl Fn([u64; 3]) -> bool) {
    let redis = RedisServer::start();
    let mut timing = vec!["--global-refresh-interval", "200ms", "--global-lease", "3s"];
    if let Some(safe_share) = safe_share {
        timing.extend(["--global-safe-share", safe_share]);
    }
    let mut hierarchy = Hierarchy::start(&redis, &timing).await;
    hierarchy.phase([10, 10, 3], 4, 0).await;

    let ports = hierarchy.root.ports();
    hierarchy.root.kill();
    let rows = hierarchy.phase([60, 60, 60], 12, 0).await;
    for (second, row) in rows.iter().enumerate() {
        assert!(admitted(row) <= 150, "over 1.5 x the limit: {rows:?}");
        if second >= 4 {
            assert!(admitted(row) >= 80, "under 0.8 x the limit: {rows:?}");
        }
    }
    let safe =
        format!("charon_global_limit_on_safe_share{{namespace=\"api\",resource=\"{SHARE}\"}}");
    for region in &hierarchy.regions {
        assert_eq!(region.metric(&safe).await, 1.0, "on its safe share");
    }
    // The state view says so too. A region serves no requests and holds
    // no share of its own: its safe share is its leaves'.
    let state = global_state(&hierarchy.regions[1]).await;
    assert_eq!(state["kind"], "global", "{state}");
    assert_eq!(state["on_safe_share"], true, "{state}");
    assert_eq!(state["share"], 0, "{state}");
    let mut leaves = [0; 3];
    for (share, leaf) in leaves.iter_mut().zip(&hierarchy.leaves) {
        let state = global_state(leaf).await;
        assert_eq!(state["on_safe_share"], false, "{state}");
        *share = state["share"].as_u64().unwrap_or(0);
    }
    eprintln!("the leaves' shares on their regions' safe shares: {leaves:?}");
    assert!(shares(leaves), "{leaves:?}");

    // The root back where the regions expect it: the shares are the
    // parent's again within a refresh or two, and hold the limit.
    let dir = hierarchy.dir.path().to_owned();
    hierarchy.root = start_at(&dir, "root-again", "memory", Some(ports), &timing);
    hierarchy.root.wait_serving().await;
    let rows = hierarchy.phase([60, 60, 60], 6, 2).await;
    for row in &rows {
        assert!(admitted(row) <= 102, "over the limit once back: {rows:?}");
        assert!(admitted(row) >= 90, "under the limit once back: {rows:?}");
    }
    for region in &hierarchy.regions {
        assert_eq!(region.metric(&safe).await, 0.0, "back on its grant");
    }
    hierarchy.offer([0, 0, 0]);
}

/// By default a region keeps its last grant: the root's last allocation,
/// which (the spare lent) adds up to the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_root_away_the_leaves_admit_about_the_limit_until_it_is_back() {
    the_root_away(None, |[a1, a2, b1]| {
        a1.abs_diff(a2) <= 1 && b1 < 50 && (95..=100).contains(&(a1 + a2 + b1))
    })
    .await;
}

/// With `--global-safe-share split`, the root's equal split: half the
/// limit for each region, whatever their demand was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_root_away_a_split_gives_each_region_its_equal_part() {
    the_root_away(Some("split"), |leaves| leaves == [25, 25, 50]).await;
}
