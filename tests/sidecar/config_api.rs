//! The configuration API end to end (docs/configuration-api.md): the real
//! `charon` binary, its admin port asked over HTTP, its decisions asked over
//! the Charon API, on the memory store and on real `redis-server`s.
//!
//! What it proves:
//!
//! - a per-domain override put on a file-defined namespace is enforced at
//!   once; its ETag is its version; a stale `If-Match` gets 412 and an
//!   invalid body 400 with the line and column, and neither changes
//!   anything; a dry run shows the normalization and commits nothing; a file
//!   reload keeps the override; the API cannot define a file's namespace
//!   (409) but can own a namespace of its own, which it can delete;
//!   `/v1/changes` lists every change with who made it;
//! - with `--config-state`, changes survive a restart (even a SIGKILL);
//! - on Redis (standalone and Cluster), an override put through one of
//!   three sidecars is enforced by the other two within a second or so (the
//!   test allows 5 s and prints what it measured), a sidecar started later
//!   serves it, and an invalid body changes nothing anywhere.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::{Duration, Instant};

use charon::api::v1::RequestOp;
use serde_json::Value;
use support::redis::{RedisCluster, RedisServer};
use support::sidecar::{READY_TIMEOUT, Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 1h, active: forever}
  seats:
    copies:
      domain_limit: 1
      groups:
        - {name: big, limit: 10, domains: []}
";

/// Enough asks that any limit of these tests is passed.
const ASKS: u64 = 12;

/// How many of [`ASKS`] requests for (`namespace`, `api`, `domain`) the
/// sidecar grants (an unknown namespace: none).
async fn granted(sidecar: &Sidecar, namespace: &str, domain: &str) -> u64 {
    let mut client = sidecar.client().await;
    let mut granted = 0;
    for _ in 0..ASKS {
        let answer = client
            .request(RequestOp {
                namespace: namespace.into(),
                resource: "api".into(),
                domain: domain.into(),
                copies: None,
                min_copies: None,
            })
            .await;
        if let Ok(answer) = answer {
            granted += answer.into_inner().granted;
        }
    }
    granted
}

/// An HTTP answer: status, ETag, JSON body.
#[derive(Debug)]
struct Reply {
    status: u16,
    etag: Option<String>,
    json: Value,
}

async fn call(
    sidecar: &Sidecar,
    method: reqwest::Method,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Reply {
    let client = reqwest::Client::new();
    let mut request = client
        .request(method, sidecar.admin_url(path))
        .header("x-charon-actor", "the test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request
        .send()
        .await
        .unwrap_or_else(|error| panic!("{path}: {error}"));
    let status = response.status().as_u16();
    let etag = response
        .headers()
        .get("etag")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let text = response.text().await.unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Reply { status, etag, json }
}

async fn get(sidecar: &Sidecar, path: &str) -> Reply {
    call(sidecar, reqwest::Method::GET, path, None, &[]).await
}

async fn put(sidecar: &Sidecar, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
    call(sidecar, reqwest::Method::PUT, path, Some(body), headers).await
}

const VIP: &str = "/v1/namespaces/shop/resources/api/domains/vip";

fn override_path(domain: &str) -> String {
    format!("/v1/namespaces/shop/resources/api/domains/{domain}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_are_refused_in_names_from_the_api() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    // A namespace named NUL, as a file would be refused.
    let nul = put(&sidecar, "/v1/namespaces/%00", "domain: \"\\u0000\"\n", &[]).await;
    assert_eq!(nul.status, 400, "{nul:?}");
    assert!(
        nul.json.to_string().contains("control character (U+0000"),
        "the reason: {nul:?}"
    );
    // An override for a domain with a bell in its name.
    let bell = put(
        &sidecar,
        &override_path("%07"),
        r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#,
        &[],
    )
    .await;
    assert_eq!(bell.status, 400, "{bell:?}");
    assert!(
        bell.json.to_string().contains("control character (U+0007"),
        "the reason: {bell:?}"
    );
    // Nothing was written.
    let changes = get(&sidecar, "/v1/changes").await;
    assert_eq!(changes.status, 200, "{changes:?}");
    assert!(
        !changes.json.to_string().contains("%00") && !changes.json.to_string().contains("\\u0007"),
        "{changes:?}"
    );
    assert_eq!(granted(&sidecar, "shop", "plain").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_and_namespaces_through_the_api_on_one_sidecar() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;

    // An override of a file namespace, in JSON: enforced at once.
    let reply = put(
        &sidecar,
        VIP,
        r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#,
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.etag.as_deref(), Some("\"1\""), "{reply:?}");
    assert_eq!(granted(&sidecar, "shop", "vip").await, 5);
    assert_eq!(granted(&sidecar, "shop", "plain").await, 2);

    // The state view says where each domain's limits come from.
    let vip = get(
        &sidecar,
        "/debug/state?namespace=shop&resource=api&domain=vip",
    )
    .await;
    assert_eq!(vip.json["limits_from"]["source"], "api override", "{vip:?}");
    assert_eq!(vip.json["limits_from"]["version"], 1, "{vip:?}");
    assert_eq!(vip.json["tiers"][0]["limit"], 5, "{vip:?}");
    let plain = get(
        &sidecar,
        "/debug/state?namespace=shop&resource=api&domain=plain",
    )
    .await;
    assert_eq!(plain.json["limits_from"]["source"], "file", "{plain:?}");

    let namespace = get(&sidecar, "/v1/namespaces/shop").await;
    assert_eq!(namespace.status, 200);
    assert_eq!(
        namespace.json["overrides"][0]["domain"], "vip",
        "{namespace:?}"
    );
    assert!(
        namespace.json["normalized"]
            .as_str()
            .is_some_and(|yaml| yaml.contains("vip")),
        "the effective configuration shows the override: {namespace:?}"
    );

    // A stale If-Match, an invalid body: 412, 400, and nothing changes.
    let stale = put(
        &sidecar,
        VIP,
        r#"{"tiers": [{"limit": 9, "window": "1h"}]}"#,
        &[("if-match", "\"7\"")],
    )
    .await;
    assert_eq!(stale.status, 412, "{stale:?}");
    assert_eq!(stale.json["current_version"], 1);
    let invalid = put(
        &sidecar,
        VIP,
        "tiers:\n  - {limit: 3, window: soon}\n",
        &[("if-match", "\"1\"")],
    )
    .await;
    assert_eq!(invalid.status, 400, "{invalid:?}");
    let error = &invalid.json["errors"][0];
    assert!(
        error["line"].as_u64().is_some_and(|line| line > 0),
        "the error says where: {invalid:?}"
    );
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("soon")),
        "{invalid:?}"
    );
    let unknown = put(
        &sidecar,
        &override_path("x").replace("/api/", "/nothing/"),
        "{}",
        &[],
    )
    .await;
    assert_eq!(unknown.status, 400, "{unknown:?}");
    let dry = put(
        &sidecar,
        &format!("{VIP}?dry_run=true"),
        r#"{"tiers": [{"limit": 7, "window": "1h", "active": "2h"}]}"#,
        &[],
    )
    .await;
    assert_eq!(dry.status, 200, "{dry:?}");
    assert_eq!(dry.json["dry_run"], true);
    let now = get(&sidecar, VIP).await;
    assert_eq!(now.etag.as_deref(), Some("\"1\""), "{now:?}");
    assert!(now.json["body"].as_str().is_some_and(|b| b.contains('5')));

    // A write with the current ETag: the domain's history is kept (5 used
    // of 8 leaves 3).
    let update = put(
        &sidecar,
        VIP,
        r#"{"tiers": [{"limit": 8, "window": "1h"}]}"#,
        &[("if-match", "\"1\"")],
    )
    .await;
    assert_eq!(update.status, 200, "{update:?}");
    assert_eq!(update.etag.as_deref(), Some("\"2\""));
    assert_eq!(granted(&sidecar, "shop", "vip").await, 3);

    // A file reload keeps the API's overrides.
    let gold = put(
        &sidecar,
        &override_path("gold"),
        "tiers:\n  - {limit: 6, window: 1h}\n",
        &[],
    )
    .await;
    assert_eq!(gold.status, 200, "{gold:?}");
    std::fs::write(&config, CONFIG.replace("limit: 2,", "limit: 3,")).expect("rewrite");
    eventually("the file reloaded", READY_TIMEOUT, async || match granted(
        &sidecar,
        "shop",
        &format!("fresh-{}", rand_suffix()),
    )
    .await
    {
        3 => Ok(()),
        other => Err(format!("a fresh domain granted {other}")),
    })
    .await;
    assert_eq!(
        granted(&sidecar, "shop", "gold").await,
        6,
        "the override outlived the reload"
    );

    // The API cannot define a file's namespace, but can own one.
    let taken = put(&sidecar, "/v1/namespaces/shop", CONFIG, &[]).await;
    assert_eq!(taken.status, 409, "{taken:?}");
    let lab = CONFIG.replace("domain: shop", "domain: lab");
    let created = put(
        &sidecar,
        "/v1/namespaces/lab",
        &lab,
        &[("if-none-match", "*")],
    )
    .await;
    assert_eq!(created.status, 200, "{created:?}");
    assert_eq!(granted(&sidecar, "lab", "anyone").await, 2);
    let again = put(
        &sidecar,
        "/v1/namespaces/lab",
        &lab,
        &[("if-none-match", "*")],
    )
    .await;
    assert_eq!(again.status, 412, "{again:?}");
    let mismatch = put(&sidecar, "/v1/namespaces/other", &lab, &[]).await;
    assert_eq!(mismatch.status, 400, "{mismatch:?}");
    let list = get(&sidecar, "/v1/namespaces").await;
    let sources: Vec<(String, String)> = list.json["namespaces"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|n| {
            (
                n["namespace"].as_str().unwrap_or("").to_owned(),
                n["source"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        sources,
        [
            ("lab".to_owned(), "api".to_owned()),
            ("shop".to_owned(), "file".to_owned())
        ]
    );
    let etag = created.etag.expect("an ETag");
    let deleted = call(
        &sidecar,
        reqwest::Method::DELETE,
        "/v1/namespaces/lab",
        None,
        &[("if-match", &etag)],
    )
    .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert_eq!(granted(&sidecar, "lab", "anyone").await, 0);
    assert_eq!(get(&sidecar, "/v1/namespaces/lab").await.status, 404);

    // Every committed change, in order, with who made it.
    let changes = get(&sidecar, "/v1/changes?since=0").await;
    let versions: Vec<u64> = changes.json["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|change| {
            assert_eq!(change["who"], "the test");
            change["version"].as_u64().expect("a version")
        })
        .collect();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    let later = get(&sidecar, "/v1/changes?since=3").await;
    assert_eq!(later.json["changes"].as_array().map(Vec::len), Some(2));
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_state_keeps_changes_across_a_restart() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let state = dir.path().join("config-state.json");
    let state_arg = state.to_string_lossy().into_owned();
    let args = ["--config-state", state_arg.as_str()];
    let mut sidecar = Sidecar::start(dir.path(), &config, "memory", &args);
    sidecar.wait_readyz(200, "ready").await;
    let reply = put(
        &sidecar,
        VIP,
        r#"{"tiers": [{"limit": 4, "window": "1h"}]}"#,
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let seats = put(
        &sidecar,
        "/v1/namespaces/shop/resources/seats/domains/acme",
        "{domain_limit: 3, groups: [big]}",
        &[],
    )
    .await;
    assert_eq!(seats.status, 200, "{seats:?}");
    let ports = (sidecar.grpc, sidecar.admin);
    sidecar.kill();

    let sidecar = Sidecar::start_at(dir.path(), &config, "memory", ports, &args);
    sidecar.wait_readyz(200, "ready").await;
    assert_eq!(granted(&sidecar, "shop", "vip").await, 4);
    let back = get(&sidecar, VIP).await;
    assert_eq!(back.status, 200, "{back:?}");
    assert_eq!(back.etag.as_deref(), Some("\"1\""));
    let mut session = sidecar.session().await;
    assert_eq!(
        session.hold("shop", "seats", "acme", 5).await,
        (3, vec!["big".to_owned()])
    );
}

/// Three sidecars on `store`: an override through the first is enforced by
/// the others; one started afterwards serves it; an invalid body changes
/// nothing anywhere.
async fn shared_by_every_sidecar(store: &str) {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let args = ["--store-timeout", "2s"];
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|_| Sidecar::start(dir.path(), &config, store, &args))
        .collect();
    for sidecar in &sidecars {
        sidecar.wait_readyz(200, "ready: store reachable").await;
    }
    let put_at = Instant::now();
    let reply = put(
        &sidecars[0],
        VIP,
        r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#,
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let mut seen = Vec::new();
    for sidecar in &sidecars[1..] {
        eventually(
            "the override on another sidecar",
            Duration::from_secs(5),
            async || match get(sidecar, VIP).await.status {
                200 => Ok(()),
                other => Err(format!("{other}")),
            },
        )
        .await;
        seen.push(put_at.elapsed());
    }
    eprintln!("{store}: the override was seen by the other sidecars after {seen:?}");
    // The three share one count: 5 in all for vip.
    let mut total = 0;
    for sidecar in &sidecars {
        total += granted(sidecar, "shop", "vip").await;
    }
    assert_eq!(total, 5, "vip's limit, shared by three sidecars");

    let invalid = put(
        &sidecars[1],
        VIP,
        r#"{"tiers": [{"limit": 1, "window": "later"}]}"#,
        &[],
    )
    .await;
    assert_eq!(invalid.status, 400, "{invalid:?}");
    let late = Sidecar::start(dir.path(), &config, store, &args);
    late.wait_readyz(200, "ready: store reachable").await;
    for sidecar in sidecars.iter().chain([&late]) {
        let now = get(sidecar, VIP).await;
        assert_eq!(now.etag.as_deref(), Some("\"1\""), "{now:?}");
        let changes = get(sidecar, "/v1/changes?since=0").await;
        assert_eq!(
            changes.json["changes"].as_array().map(Vec::len),
            Some(1),
            "{changes:?}"
        );
    }
    assert_eq!(
        granted(&late, "shop", "vip").await,
        0,
        "the late sidecar shares the count"
    );
    assert_eq!(granted(&late, "shop", "fresh").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_is_shared_by_every_sidecar_on_redis() {
    let redis = RedisServer::start();
    shared_by_every_sidecar(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_is_shared_by_every_sidecar_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    shared_by_every_sidecar(&cluster.url()).await;
}

/// Runs `charon config ARGS --admin <sidecar>`: (success, stdout, stderr).
fn charon_config(sidecar: &Sidecar, args: &[&str]) -> (bool, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("config")
        .args(args)
        .args(["--admin", &sidecar.admin_url("")])
        .env("USER", "cli-test")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("charon config runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charon_config_applies_diffs_and_reads_back() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let lab = dir.path().join("lab.yaml");
    std::fs::write(&lab, CONFIG.replace("domain: shop", "domain: lab")).expect("write");
    let lab_arg = lab.to_string_lossy().into_owned();

    // Without --yes and no answer on stdin, nothing is applied.
    let (ok, _, stderr) = charon_config(&sidecar, &["apply", "-f", &lab_arg]);
    assert!(!ok, "applied without a yes: {stderr}");
    assert_eq!(get(&sidecar, "/v1/namespaces/lab").await.status, 404);

    let (ok, stdout, stderr) = charon_config(&sidecar, &["apply", "--yes", "-f", &lab_arg]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("+domain: lab"),
        "the diff shows the new namespace:\n{stdout}"
    );
    assert_eq!(granted(&sidecar, "lab", "anyone").await, 2);

    // Read back: the normalized namespace the diff proposed is served.
    let (ok, served, stderr) = charon_config(&sidecar, &["get", "lab"]);
    assert!(ok, "{stderr}");
    assert!(served.contains("# source: api"), "{served}");
    assert!(served.contains("domain: lab"), "{served}");
    let (ok, again, _) = charon_config(&sidecar, &["apply", "--yes", "-f", &lab_arg]);
    assert!(ok);
    assert!(
        again.contains("nothing to change"),
        "a round trip changes nothing:\n{again}"
    );

    // A diff of a change shows it and commits nothing.
    std::fs::write(
        &lab,
        CONFIG
            .replace("domain: shop", "domain: lab")
            .replace("limit: 2,", "limit: 4,"),
    )
    .expect("write");
    let (ok, diff, stderr) = charon_config(&sidecar, &["diff", "-f", &lab_arg]);
    assert!(ok, "{stderr}");
    assert!(
        diff.lines()
            .any(|line| line.starts_with('-') && line.contains("2"))
            && diff
                .lines()
                .any(|line| line.starts_with('+') && line.contains("4")),
        "{diff}"
    );
    assert_eq!(granted(&sidecar, "lab", "other").await, 2);

    // An override, and the history of both changes.
    let body = dir.path().join("vip.json");
    std::fs::write(&body, r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#).expect("write");
    let body_arg = body.to_string_lossy().into_owned();
    let (ok, out, stderr) = charon_config(
        &sidecar,
        &[
            "apply",
            "--yes",
            "-f",
            &body_arg,
            "--namespace",
            "shop",
            "--resource",
            "api",
            "--domain",
            "vip",
        ],
    );
    assert!(ok, "{out}{stderr}");
    assert_eq!(granted(&sidecar, "shop", "vip").await, 5);
    let (ok, history, _) = charon_config(&sidecar, &["history"]);
    assert!(ok);
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 2, "{history}");
    assert!(
        lines[0].contains("cli-test") && lines[0].ends_with("namespaces/lab"),
        "{history}"
    );
    assert!(
        lines[1].ends_with("namespaces/shop/resources/api/domains/vip"),
        "{history}"
    );

    // Errors are the server's, said plainly.
    std::fs::write(&body, "tiers: [{limit: 1, window: never-ever}]").expect("write");
    let (ok, _, stderr) = charon_config(
        &sidecar,
        &[
            "diff",
            "-f",
            &body_arg,
            "--namespace",
            "shop",
            "--resource",
            "api",
            "--domain",
            "vip",
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("400") && stderr.contains("never-ever"),
        "{stderr}"
    );
}

/// A request racing changes sees the old limits or the new ones, never a
/// mix: a namespace of two limits that every change moves together (both
/// 10, then both 20, …) is asked for both at once, by clients running while
/// the changes stream in; every answer names two equal limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_racing_changes_sees_old_or_new_limits_never_a_mix() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let namespace = |limit: u64| {
        format!(
            "domain: race\ndescriptors:\n  - key: a\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n  - key: b\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
        )
    };
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    assert_eq!(
        put(&sidecar, "/v1/namespaces/race", &namespace(10), &[])
            .await
            .status,
        200
    );

    let stop = Arc::new(AtomicBool::new(false));
    let askers: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            let url = sidecar.grpc_url();
            tokio::spawn(async move {
                let mut client = RateLimitServiceClient::connect(url)
                    .await
                    .expect("connects");
                let descriptor = |key: &str| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: key.to_owned(),
                        value: "x".to_owned(),
                    }],
                    ..Default::default()
                };
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let answer = client
                        .should_rate_limit(RateLimitRequest {
                            domain: "race".to_owned(),
                            descriptors: vec![descriptor("a"), descriptor("b")],
                            hits_addend: 0,
                        })
                        .await
                        .expect("answered")
                        .into_inner();
                    let limits: Vec<u32> = answer
                        .statuses
                        .iter()
                        .map(|status| {
                            status
                                .current_limit
                                .as_ref()
                                .map_or(0, |limit| limit.requests_per_unit)
                        })
                        .collect();
                    seen.push(limits);
                }
                seen
            })
        })
        .collect();
    for change in 0..40u64 {
        let limit = if change % 2 == 0 { 20 } else { 10 };
        let reply = put(&sidecar, "/v1/namespaces/race", &namespace(limit), &[]).await;
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    stop.store(true, Ordering::SeqCst);
    let mut answers = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for asker in askers {
        for limits in asker.await.expect("an asker") {
            answers += 1;
            assert_eq!(limits.len(), 2, "{limits:?}");
            assert_eq!(
                limits[0], limits[1],
                "a mix of old and new limits: {limits:?}"
            );
            kinds.insert(limits[0]);
        }
    }
    assert!(answers > 40, "only {answers} answers raced the changes");
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [10, 20],
        "both sides were seen"
    );
}

/// A domain moved to another group through the configuration API while it
/// holds copies (docs/design.md#reserve-release-transfer-seize): its holds
/// stay counted in the group they were reserved in until released, and a
/// release names that group; new reserves count in the new group.
async fn a_group_move_under_holds(store: &str) {
    const ROOMS: &str = "
domain: rooms
resources:
  seats:
    copies:
      domain_limit: 5
      groups:
        - {name: east, limit: 4, domains: [acme]}
        - {name: west, limit: 2, domains: []}
";
    let dir = tempdir();
    let config = write_config(dir.path(), ROOMS);
    let sidecar = Sidecar::start(dir.path(), &config, store, &["--store-timeout", "2s"]);
    sidecar.wait_serving().await;
    let mut holder = sidecar.session().await;
    let east = vec!["east".to_owned()];
    assert_eq!(
        holder.hold("rooms", "seats", "acme", 3).await,
        (3, east.clone())
    );

    let moved = put(
        &sidecar,
        "/v1/namespaces/rooms/resources/seats/domains/acme",
        "{domain_limit: 5, groups: [west]}",
        &[],
    )
    .await;
    assert_eq!(moved.status, 200, "{moved:?}");
    let joined = put(
        &sidecar,
        "/v1/namespaces/rooms/resources/seats/domains/initech",
        "{domain_limit: 5, groups: [east]}",
        &[],
    )
    .await;
    assert_eq!(joined.status, 200, "{joined:?}");

    // New reserves of acme count in west: 2 of its limit of 2 (and 5 of
    // acme's own, with the 3 still held).
    let mut other = sidecar.session().await;
    let west = vec!["west".to_owned()];
    eventually("acme in west", Duration::from_secs(5), async || match other
        .hold("rooms", "seats", "acme", 5)
        .await
    {
        (2, groups) if groups == west => Ok(()),
        (granted, groups) => {
            if granted > 0 {
                other
                    .release("rooms", "seats", "acme", granted as i64, &groups)
                    .await;
            }
            Err(format!("{granted} in {groups:?}"))
        }
    })
    .await;
    // East still counts acme's 3 held from before the move: initech, now
    // in east, gets the 1 left of its 4.
    assert_eq!(
        other.hold("rooms", "seats", "initech", 4).await,
        (1, east.clone())
    );

    // The old hold is released from east, where it was counted; naming
    // west for it is refused (this session holds none there).
    match holder.release("rooms", "seats", "acme", 3, &west).await {
        charon::api::v1::session_response::Result::Error(error) => {
            assert_eq!(
                error.kind,
                charon::api::v1::error::Kind::NotHeld as i32,
                "{error:?}"
            );
        }
        answer => panic!("released from the wrong group: {answer:?}"),
    }
    match holder.release("rooms", "seats", "acme", 3, &east).await {
        charon::api::v1::session_response::Result::Release(answer) => {
            assert_eq!(answer.released, 3);
        }
        answer => panic!("{answer:?}"),
    }
    // East has room again for initech: 3 more (4 in all); west is still
    // full with acme's 2.
    assert_eq!(
        other.hold("rooms", "seats", "initech", 4).await,
        (3, east.clone())
    );
    match holder.reserve("rooms", "seats", "acme", 1, 1).await {
        charon::api::v1::session_response::Result::Reserve(answer) => {
            assert_eq!(answer.granted, 0, "west is full: {answer:?}");
        }
        answer => panic!("{answer:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_moved_between_groups_keeps_its_holds_where_they_were_counted() {
    a_group_move_under_holds("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_moved_between_groups_under_holds_on_redis() {
    let redis = RedisServer::start();
    a_group_move_under_holds(&redis.url()).await;
}
