//! The admin pages (docs/simulator.md) on a real `charon serve`: the
//! simulator's endpoints give the very timeline `charon simulate` computes,
//! however the requests are split into calls, and refuse nonsense with a
//! message and bounded work; the state view shows what the store holds for
//! one domain (tiers on memory and on a real Redis, copy holds by domain and
//! group) and the decisions since the first look; and both pages, in a real
//! headless Chromium driven by Playwright, agree with `charon simulate --json`
//! and with `/debug/state` (screenshots kept under `target/tmp/browser/`).
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

use charon::simulate::{self, Source};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use support::redis::RedisServer;
use support::sidecar::{Sidecar, memory_sidecar, sidecar_client, tempdir, write_config};

const PENALTY: &str = "{tiers: [{limit: 5, window: 1s, active: forever, cooldown: 0s}, {limit: 20, window: 1s, active: 5s, cooldown: 10s}]}";

/// A rate resource whose windows outlast any test, and a copy resource.
const CONFIG: &str = r#"
domain: ui-test
descriptors:
  - key: tenant
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 3, window: 1h, active: forever, cooldown: 0s}
        - {limit: 5, window: 1h, active: 1h, cooldown: 1h}
  transcoder:
    copies:
      domain_limit: 10
      global_limit: 100
      domains: {acme: 30}
      groups:
        - {name: high-volume, limit: 40, domains: [acme, globex]}
"#;

async fn post(sidecar: &Sidecar, path: &str, body: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(sidecar.admin_url(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await;
    answer(response).await
}

async fn get(sidecar: &Sidecar, path: &str) -> (u16, Value) {
    answer(reqwest::get(sidecar.admin_url(path)).await).await
}

/// The status and the JSON body (a body that is not JSON as `{"text": …}`).
async fn answer(response: reqwest::Result<reqwest::Response>) -> (u16, Value) {
    let response = response.expect("the admin port answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    let value = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text }));
    (status, value)
}

async fn start_simulation(sidecar: &Sidecar, rate: &str) -> String {
    let (status, started) = post(
        sidecar,
        "/ui/simulator/sessions",
        &json!({ "rate": rate, "domain": "acme", "tick_ms": 100 }).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{started}");
    started["id"].as_str().expect("an id").to_owned()
}

/// Feeds simulation `id`; the answer of a call that must succeed.
async fn feed(sidecar: &Sidecar, id: &str, body: Value) -> Value {
    let path = format!("/ui/simulator/sessions/{id}/requests");
    let (status, fed) = post(sidecar, &path, &body.to_string()).await;
    assert_eq!(status, 200, "{body} → {fed}");
    fed
}

#[tokio::test]
async fn the_simulator_endpoint_gives_the_timeline_of_charon_simulate() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let pattern_text =
        "burst 30, pause 1s, 10/s for 3s, at 7050ms 7050ms 7999ms, pause 9s, 30/s for 2s";
    let rate = simulate::resolve(Source::Inline(PENALTY)).unwrap();
    let pattern = simulate::parse_pattern(pattern_text).unwrap();
    let expected = simulate::simulate(&rate, "acme", &pattern, 100).unwrap();
    let expected_ticks = serde_json::to_value(&expected.ticks).unwrap();

    // The same requests, cut into calls at odd places; each call closes the
    // ticks its clock passed.
    for batch in [1usize, 7, 1000] {
        let id = start_simulation(&sidecar, PENALTY).await;
        let mut ticks: Vec<Value> = Vec::new();
        for chunk in pattern.requests.chunks(batch) {
            let requests: Vec<Value> = chunk
                .iter()
                .map(|&(at, count)| json!({ "at_ms": at, "count": count }))
                .collect();
            let fed = feed(&sidecar, &id, json!({ "requests": requests })).await;
            ticks.extend(fed["ticks"].as_array().unwrap().iter().cloned());
        }
        let end = expected.ticks.len() as u64 * 100;
        let fed = feed(&sidecar, &id, json!({ "until_ms": end })).await;
        ticks.extend(fed["ticks"].as_array().unwrap().iter().cloned());
        assert_eq!(Value::Array(ticks), expected_ticks, "batches of {batch}");
        assert_eq!(fed["totals"]["granted"], json!(expected.granted));
        assert_eq!(fed["totals"]["rejected"], json!(expected.rejected));
        assert!(expected.rejected > 0 && expected.ticks.iter().any(|t| t.tier == 2));
    }
}

/// The page's capacity-lease simulation is `charon simulate --capacity`'s
/// timeline, in one call; nonsense and oversized runs are refused with the
/// reason.
#[tokio::test]
async fn the_lease_simulation_endpoint_gives_the_timeline_of_charon_simulate() {
    use charon::simulate::leases;
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let capacity =
        "{capacity: 100, algorithm: fair_share, lease: 10s, refresh_interval: 2s, learning: 0s}";
    let clients = "a: 100; b: 30 from 5s; c: 100 from 10s until 20s";
    let expected = leases::run(capacity, clients, "24s", "500ms", simulate::MAX_TICKS).unwrap();
    let (status, timeline) = post(
        &sidecar,
        "/ui/simulator/leases",
        &json!({ "capacity": capacity, "clients": clients, "duration": "24s", "tick": "500ms" })
            .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{timeline}");
    assert_eq!(timeline, serde_json::to_value(&expected).unwrap());
    assert_eq!(timeline["ticks"].as_array().map(Vec::len), Some(49));

    let many_clients: Vec<String> = (0..65).map(|i| format!("c{i}: 1")).collect();
    for (body, message) in [
        (
            json!({ "capacity": capacity, "clients": "a: lots" }),
            "start with what the client wants",
        ),
        (
            json!({ "capacity": "{capacity: -1}", "clients": "a: 1" }),
            "invalid --capacity",
        ),
        (
            json!({ "capacity": capacity, "clients": many_clients.join("; ") }),
            "at most 64 clients",
        ),
        (
            json!({ "capacity": capacity, "clients": "a: 1", "duration": "1h", "tick": "1s" }),
            "at most 2000 ticks",
        ),
        (
            json!({ "capacity": capacity, "clients": "a: 1", "duration": "forever" }),
            "give a finite duration",
        ),
        (
            json!({ "capacity": capacity, "clients": "a: 1", "tick": "0s" }),
            "ticks",
        ),
        (
            json!({ "capacity": capacity, "clients": "a: 1", "speed": 2 }),
            "unknown field",
        ),
    ] {
        let (status, refused) = post(&sidecar, "/ui/simulator/leases", &body.to_string()).await;
        assert_eq!(status, 400, "{body} → {refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(error.contains(message), "{body} → {error}");
    }
}

#[tokio::test]
async fn the_simulator_refuses_nonsense_and_bounds_its_work() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let start = "/ui/simulator/sessions";
    for (body, message) in [
        (
            json!({ "rate": "{tiers: [{limit: -5, window: 1s}]}" }).to_string(),
            "limit must be between 0 and",
        ),
        (
            json!({ "rate": "{tiers: [{limit: 5, window: 0s}]}" }).to_string(),
            "window",
        ),
        (json!({ "rate": PENALTY, "tick_ms": 0 }).to_string(), "tick"),
        (
            json!({ "rate": PENALTY, "domain": "" }).to_string(),
            "domain",
        ),
        (
            json!({ "rate": PENALTY, "colour": "red" }).to_string(),
            "unknown field",
        ),
        ("{\"rate\": ".to_owned(), "JSON"),
    ] {
        let (status, refused) = post(&sidecar, start, &body).await;
        assert_eq!(status, 400, "{body} → {refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(message),
            "{body}: `{error}` lacks `{message}`"
        );
    }

    let id = start_simulation(&sidecar, PENALTY).await;
    let feed_path = format!("/ui/simulator/sessions/{id}/requests");
    for (body, message) in [
        (
            json!({ "requests": [{ "at_ms": 0, "count": 10_001 }] }),
            "at most 10000 requests per call",
        ),
        (
            json!({ "requests": [{ "at_ms": 0, "count": u64::MAX }, { "at_ms": 0, "count": 2 }] }),
            "at most 10000 requests per call",
        ),
        (
            json!({ "requests": vec![json!({ "at_ms": 0, "count": 0 }); 10_001] }),
            "at most 10000 requests per call",
        ),
        (json!({ "until_ms": 8 * 24 * 3_600_000u64 }), "at most"),
        (
            json!({ "requests": [{ "at_ms": 500, "count": 1 }, { "at_ms": 400, "count": 1 }] }),
            "time only goes forward",
        ),
    ] {
        let (status, refused) = post(&sidecar, &feed_path, &body.to_string()).await;
        assert_eq!(status, 400, "{body} → {refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(message),
            "{body}: `{error}` lacks `{message}`"
        );
    }
    // A refused call changed nothing: the clock is still at 0.
    let fed = feed(
        &sidecar,
        &id,
        json!({ "requests": [{ "at_ms": 0, "count": 6 }] }),
    )
    .await;
    assert_eq!((&fed["granted"], &fed["clock_ms"]), (&json!(6), &json!(0)));

    // A page left open for a week of virtual time gets a bounded answer.
    let fed = feed(&sidecar, &id, json!({ "until_ms": 7 * 24 * 3_600_000u64 })).await;
    let ticks = fed["ticks"].as_array().unwrap();
    // The latest 1 000 ticks; the others are counted, not read back.
    let week_ticks: u64 = 7 * 24 * 36_000;
    assert_eq!(ticks.len(), 1_000);
    assert_eq!(fed["skipped_ticks"], json!(week_ticks - 1_000));
    assert_eq!(ticks[0]["at_ms"], json!((week_ticks - 1_000) * 100));
    assert_eq!(
        ticks[999]["tiers"][1],
        json!({ "phase": "inactive", "hits": 0, "limit": 20 }),
        "the burst tier is long inactive"
    );
    assert_eq!(fed["totals"]["granted"], json!(6));

    // At most 16 open: the 17th ends the idlest, whose page is told so.
    let mut ids = vec![id];
    for _ in 0..16 {
        ids.push(start_simulation(&sidecar, PENALTY).await);
    }
    let (status, gone) = post(
        &sidecar,
        &format!("/ui/simulator/sessions/{}/requests", ids[0]),
        "{}",
    )
    .await;
    assert_eq!(status, 404, "{gone}");
    assert!(
        gone["error"].as_str().unwrap().contains("start a new one"),
        "{gone}"
    );
    feed(&sidecar, &ids[16], json!({})).await;
    let deleted = reqwest::Client::new()
        .delete(sidecar.admin_url(&format!("/ui/simulator/sessions/{}", ids[16])))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status().as_u16(), 204);
}

/// `/debug/state` of the rate resource for `domain`: (tier, hits per tier).
fn tiers_of(state: &Value) -> (u64, Vec<u64>) {
    let tier = state["state"]["tier"].as_u64().expect("a tier");
    let hits = state["state"]["tiers"]
        .as_array()
        .expect("tiers")
        .iter()
        .map(|tier| tier["hits"].as_u64().expect("hits"))
        .collect();
    (tier, hits)
}

async fn rate_state_shows_the_store(sidecar: &Sidecar) {
    let client = sidecar_client(sidecar).await;
    let path = "/debug/state?namespace=ui-test&resource=api&domain=acme";
    let (status, before) = get(sidecar, path).await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(tiers_of(&before), (0, vec![0, 0]));
    assert_eq!(before["recent"], json!([]));
    for _ in 0..9 {
        client.request("ui-test", "api", "acme").await.unwrap();
    }
    client.request("ui-test", "api", "other").await.unwrap();
    let (status, after) = get(sidecar, path).await;
    assert_eq!(status, 200, "{after}");
    // 3 in tier 1, 5 in tier 2 (now active), the 9th rejected.
    assert_eq!(tiers_of(&after), (2, vec![3, 5]));
    let phases: Vec<&str> = after["state"]["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tier| tier["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["active", "active"]);
    assert!(after["state"]["retry_after_ms"].as_u64().unwrap() > 3_000_000);
    let recent = after["recent"].as_array().unwrap();
    let granted: Vec<bool> = recent
        .iter()
        .map(|r| r["granted"].as_bool().unwrap())
        .collect();
    assert_eq!(
        granted,
        [true, true, true, true, true, true, true, true, false]
    );
    let tiers: Vec<u64> = recent.iter().map(|r| r["tier"].as_u64().unwrap()).collect();
    assert_eq!(tiers, [1, 1, 1, 2, 2, 2, 2, 2, 2]);
    assert!(recent.iter().all(|r| r["op"] == "request"));
    assert_eq!(after["tiers"][1]["active_ms"], json!(3_600_000));

    let (status, other) = get(
        sidecar,
        "/debug/state?namespace=ui-test&resource=api&domain=other",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(tiers_of(&other), (1, vec![1, 0]));
    assert_eq!(other["recent"], json!([]), "not watched before this look");
}

#[tokio::test]
async fn the_state_view_shows_a_domains_tiers_and_recent_decisions() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    rate_state_shows_the_store(&sidecar).await;
    for (path, status, message) in [
        (
            "/debug/state?namespace=ui-test&resource=api",
            400,
            "name the domain",
        ),
        (
            "/debug/state?namespace=nope&resource=api&domain=a",
            404,
            "no namespace `nope`",
        ),
        (
            "/debug/state?namespace=ui-test&resource=nope&domain=a",
            404,
            "no resource `nope`",
        ),
    ] {
        let (got, refused) = get(&sidecar, path).await;
        assert_eq!(got, status, "{path} → {refused}");
        let error = refused["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(message),
            "{path}: `{error}` lacks `{message}`"
        );
    }
    let long = format!(
        "/debug/state?namespace=ui-test&resource=api&domain={}",
        "x".repeat(5_000)
    );
    assert_eq!(get(&sidecar, &long).await.0, 400);
    let (status, listed) = get(&sidecar, "/debug/resources").await;
    assert_eq!(status, 200);
    assert_eq!(
        listed,
        json!([
            { "namespace": "ui-test", "resource": "api", "kind": "rate" },
            { "namespace": "ui-test", "resource": "transcoder", "kind": "copies" },
        ])
    );
}

#[tokio::test]
async fn the_state_view_reads_redis() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    sidecar.wait_readyz(200, "ready: store reachable").await;
    rate_state_shows_the_store(&sidecar).await;
}

#[tokio::test]
async fn the_state_view_shows_copy_holds_by_domain_and_group() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let client = sidecar_client(&sidecar).await;
    let path = |domain: &str| {
        format!("/debug/state?namespace=ui-test&resource=transcoder&domain={domain}")
    };
    get(&sidecar, &path("acme")).await;
    let mut acme = client
        .hold("ui-test", "transcoder", "acme")
        .copies(4)
        .await
        .unwrap();
    let _initech = client
        .hold("ui-test", "transcoder", "initech")
        .copies(2)
        .await
        .unwrap();
    let (status, state) = get(&sidecar, &path("acme")).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(
        state["holds"],
        json!({
            "domain": 4, "domain_limit": 30, "global": 6, "global_limit": 100,
            "groups": [{ "name": "high-volume", "held": 4, "limit": 40, "member": true }],
        })
    );
    assert_eq!(state["recent"][0]["op"], "reserve");
    assert_eq!(state["recent"][0]["copies"], 4);
    let (_, initech) = get(&sidecar, &path("initech")).await;
    assert_eq!(initech["holds"]["domain"], 2);
    assert_eq!(initech["holds"]["domain_limit"], 10);
    assert_eq!(initech["holds"]["groups"][0]["member"], false);
    acme.release(4).await.unwrap();
    let (_, state) = get(&sidecar, &path("acme")).await;
    assert_eq!(state["holds"]["domain"], 0);
    assert_eq!(state["recent"][1]["op"], "release");
}

/// Where the browser test's tools are (scripts/test-deps.sh installs them).
fn browser_tools() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let playwright = std::env::var_os("CHARON_PLAYWRIGHT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/browser-tests/node_modules/playwright-core"));
    let chromium = std::env::var_os("CHARON_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        playwright.join("package.json").exists() && chromium.exists(),
        "the browser test needs Debian's chromium and playwright-core: run `bash scripts/test-deps.sh` \
         (looked for {} and {})",
        chromium.display(),
        playwright.display()
    );
    (playwright, chromium)
}

#[tokio::test]
async fn the_pages_in_a_real_browser_agree_with_charon_simulate() {
    let (playwright, chromium) = browser_tools();
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let client = sidecar_client(&sidecar).await;
    // A first look starts the watch: the page will list these decisions.
    get(
        &sidecar,
        "/debug/state?namespace=ui-test&resource=api&domain=acme",
    )
    .await;
    for _ in 0..6 {
        client.request("ui-test", "api", "acme").await.unwrap();
    }
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    std::fs::create_dir_all(&artifacts).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/simulator.mjs");
    // Killed (with its Chromium) if it outlives the limit.
    let run = Command::new("node")
        .arg(script)
        .env("CHARON_ADMIN", sidecar.admin_url(""))
        .env("CHARON_BIN", env!("CARGO_BIN_EXE_charon"))
        .env("CHARON_ARTIFACTS", &artifacts)
        .env("CHARON_PLAYWRIGHT", playwright)
        .env("CHARON_CHROMIUM", chromium)
        .env(
            "CHARON_STATE_QUERY",
            "namespace=ui-test&resource=api&domain=acme",
        )
        .env(
            "CHARON_STATE_EXPECT",
            json!({ "tier": 2, "hits": [3, 3], "phases": ["active", "active"], "recent": 6 })
                .to_string(),
        )
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the browser test ends within 5 minutes")
        .expect("node runs");
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "the browser test failed:\n{printed}"
    );
    for screenshot in ["simulator.png", "leases.png", "state.png"] {
        let size = std::fs::metadata(artifacts.join(screenshot)).map_or(0, |m| m.len());
        assert!(
            size > 10_000,
            "{screenshot} was kept ({size} bytes):\n{printed}"
        );
    }
}

#[tokio::test]
async fn the_state_view_records_envoys_decisions_and_checks() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    get(
        &sidecar,
        "/debug/state?namespace=ui-test&resource=api&domain=acme",
    )
    .await;
    let mut envoy = RateLimitServiceClient::connect(sidecar.grpc_url())
        .await
        .unwrap();
    let ask = |hits: u32, check: bool| RateLimitRequest {
        domain: "ui-test".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            hits_addend: check
                .then_some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 }),
            ..Default::default()
        }],
        hits_addend: hits,
    };
    // 3 + 5 fit (tier 1, then tier 2); 4 more do not; then a check (a
    // descriptor's `hits_addend` of 0 only checks).
    for (hits, check) in [(3, false), (5, false), (4, false), (1, true)] {
        envoy.should_rate_limit(ask(hits, check)).await.unwrap();
    }
    let (_, state) = get(
        &sidecar,
        "/debug/state?namespace=ui-test&resource=api&domain=acme",
    )
    .await;
    let recent: Vec<(String, bool, u64)> = state["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["op"].as_str().unwrap().to_owned(),
                r["granted"].as_bool().unwrap(),
                r["copies"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        recent,
        [
            ("envoy".to_owned(), true, 3),
            ("envoy".to_owned(), true, 5),
            ("envoy".to_owned(), false, 4),
            ("check".to_owned(), false, 0),
        ],
        "{state}"
    );
}

#[tokio::test]
async fn the_pages_answer_only_to_localhost_or_an_address() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let http = reqwest::Client::new();
    for (path, host, status) in [
        ("/ui/simulator", "evil.example", 403),
        ("/debug/resources", "evil.example:80", 403),
        ("/ui/state", "localhost", 200),
        ("/ui/simulator", "127.0.0.1", 200),
        ("/metrics", "evil.example", 200),
    ] {
        let response = http
            .get(sidecar.admin_url(path))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{path} for {host}");
    }
    let page = http
        .get(sidecar.admin_url("/ui/simulator"))
        .send()
        .await
        .unwrap();
    let html = page.text().await.unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "the page fetches nothing from elsewhere"
    );
}

/// The guarded routes and the open ones, with the status each gets, asked
/// at `host` (the admin port's own, or another address of this machine).
async fn admin_statuses(sidecar: &Sidecar, host: &str, token: Option<&str>) -> Vec<(String, u16)> {
    let http = reqwest::Client::new();
    let mut statuses = Vec::new();
    for (method, path) in [
        ("GET", "/debug/resources"),
        (
            "GET",
            "/debug/state?namespace=ui-test&resource=api&domain=acme",
        ),
        ("POST", "/ui/simulator/sessions"),
        ("POST", "/ui/simulator/leases"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/ui/simulator"),
    ] {
        let url = format!("http://{host}:{}{path}", sidecar.admin);
        let body = if path.ends_with("/leases") {
            json!({ "capacity": "{capacity: 10}", "clients": "a: 5" })
        } else {
            json!({ "rate": PENALTY, "domain": "acme", "tick_ms": 100 })
        };
        let mut request = match method {
            "POST" => http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string()),
            _ => http.get(&url),
        };
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        statuses.push((format!("{method} {path}"), response.status().as_u16()));
    }
    statuses
}

fn expect(statuses: &[(String, u16)], guarded: u16) {
    for (route, status) in statuses {
        let open = route.contains("/healthz")
            || route.contains("/readyz")
            || route.contains("/metrics")
            || route.ends_with("/ui/simulator");
        let wanted = if open { 200 } else { guarded };
        assert_eq!(*status, wanted, "{route}: {statuses:?}");
    }
}

/// An address of this machine that is not loopback (the one its default
/// route leaves from), so a request to it comes from a non-loopback peer.
fn network_address() -> String {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    socket
        .connect("203.0.113.1:9")
        .expect("this machine has a route off loopback (the test needs one)");
    let ip = socket.local_addr().expect("a local address").ip();
    assert!(!ip.is_loopback(), "no address off loopback: {ip}");
    ip.to_string()
}

#[tokio::test]
async fn without_a_token_the_state_routes_answer_loopback_peers_only() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let ports = (support::redis::free_port(), support::redis::free_port());
    let sidecar = Sidecar::start_admin_on(dir.path(), &config, "memory", "0.0.0.0", ports, &[]);
    sidecar.wait_serving().await;
    expect(&admin_statuses(&sidecar, "127.0.0.1", None).await, 200);
    expect(
        &admin_statuses(&sidecar, &network_address(), None).await,
        401,
    );
}

#[tokio::test]
async fn with_a_token_the_state_routes_need_it_from_everywhere() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "s3cret-admin-token\n").unwrap();
    let ports = (support::redis::free_port(), support::redis::free_port());
    let token_arg = token_file.display().to_string();
    let sidecar = Sidecar::start_admin_on(
        dir.path(),
        &config,
        "memory",
        "0.0.0.0",
        ports,
        &["--admin-token-file", &token_arg],
    );
    sidecar.wait_serving().await;
    let network = network_address();
    for host in ["127.0.0.1", network.as_str()] {
        expect(&admin_statuses(&sidecar, host, None).await, 401);
        expect(&admin_statuses(&sidecar, host, Some("wrong")).await, 401);
        expect(
            &admin_statuses(&sidecar, host, Some("s3cret-admin-token")).await,
            200,
        );
    }
    assert!(!sidecar.log().contains("s3cret"), "the token is logged");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", sidecar.pid())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains("s3cret"),
        "the token is on the command line"
    );
}
