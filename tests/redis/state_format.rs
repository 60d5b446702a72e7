//! The Redis state is versioned (docs/releases.md#the-redis-state).
//!
//! - **The layout a release writes is on file.** Decisions of every kind a
//!   rate limit keeps state for (fixed, sliding and hybrid windows, sliding
//!   logs, GCRA buckets, burst tiers), made at a fixed virtual instant, leave
//!   exactly the keys and values of `tests/fixtures/redis-state/format-1.json`,
//!   recorded by release 0.9.0 (`STATE_FORMAT` 1). A change to them fails
//!   here: record the fixture anew only if the previous release reads the
//!   new state; otherwise raise `STATE_FORMAT`, with the migration or
//!   mixed-fleet rule the change needs, and keep the old fixture's test.
//! - **The state of the previous release is read with the same decisions.**
//!   The fixture's keys, written into a fresh Redis as that release left
//!   them, are decided on by this build: every later request is answered as
//!   the fixture recorded.
//! - **State of a newer format is not decided on.** A Redis whose format
//!   key names a newer format makes the sidecar not ready, naming the
//!   cause, and every decision fail (Envoy's failure mode answers), rather
//!   than a decision on state it may misread; once the key is right again
//!   it serves. A fresh Redis is given this build's format.
//!
//! `CHARON_RECORD_STATE=1 cargo test --test redis state_format` writes the
//! fixture instead of checking it.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use charon::clock::ManualClock;
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::keys;
use charon::store::{RedisOptions, RedisStore};
use serde_json::{Value, json};
use support::redis::RedisServer;
use support::sidecar::{Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "
domain: state
descriptors:
  - key: window
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_log}
  - key: hybrid
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: hybrid}
  - key: bucket
    rate_limit: {algorithm: gcra, unit: hour, requests_per_unit: 5, burst: 5}
  - key: tenant
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 10m, active: forever, cooldown: 0s}
        - {limit: 3, window: 10m, active: 10m, cooldown: 60m}
";

/// The virtual instant the fixture's state was written at: 2026-12-02
/// 00:10:00 UTC, ten minutes into an hour.
const T0: u64 = 1_764_634_200_000;

const KEYS: [&str; 6] = ["window", "sliding", "log", "hybrid", "bucket", "tenant"];

fn fixture_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/redis-state")
        .join(format!("format-{}.json", keys::STATE_FORMAT))
}

fn limiter(url: &str, clock: &ManualClock) -> Limiter<RedisStore> {
    let config = charon::config::load_str(CONFIG, "state.yaml")
        .map(|loaded| loaded.config)
        .unwrap_or_else(|errors| panic!("{errors}"));
    let store = RedisStore::open(
        url,
        RedisOptions {
            timeout: Duration::from_secs(5),
            local_rejections: false,
            injected_clock: Some(Arc::new(clock.clone())),
            ..RedisOptions::default()
        },
    )
    .expect("a valid URL");
    Limiter::new(config, store)
}

fn request(key: &str) -> RateLimitRequest {
    RateLimitRequest::new("state", vec![Descriptor::new([(key, "a")])])
}

/// The state the fixture holds: three hits a second apart on each key from
/// T0 (four on the tiers: two past the first tier's limit).
async fn write_state(limiter: &Limiter<RedisStore>, clock: &ManualClock) {
    for key in KEYS {
        clock.set(T0);
        let hits = if key == "tenant" { 4 } else { 3 };
        for _ in 0..hits {
            let answer = limiter
                .should_rate_limit(request(key))
                .await
                .expect("Redis answers");
            assert!(!answer.over_limit, "{key}: within its limit");
            clock.advance(1_000);
        }
    }
}

/// A minute later, four more requests on each key: what each was answered.
async fn later_answers(limiter: &Limiter<RedisStore>, clock: &ManualClock) -> Value {
    let mut answers = Vec::new();
    for key in KEYS {
        clock.set(T0 + 60_000);
        for _ in 0..4 {
            let answer = limiter
                .should_rate_limit(request(key))
                .await
                .expect("Redis answers");
            let status = &answer.statuses[0];
            answers.push(json!({
                "key": key,
                "over_limit": answer.over_limit,
                "remaining": status.remaining,
                "reset_after_ms": status.reset_after_ms,
            }));
            clock.advance(1_000);
        }
    }
    Value::Array(answers)
}

/// Every key of `redis` but the format's: its type, its value (sorted where
/// Redis does not order it) and whether it expires.
fn dump(redis: &RedisServer) -> Value {
    let mut connection = redis::Client::open(redis.url())
        .and_then(|client| client.get_connection())
        .expect("a connection");
    let names: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut connection)
        .expect("KEYS");
    let format_key = keys::state_format_key();
    let mut out = BTreeMap::new();
    for name in names.into_iter().filter(|name| *name != format_key) {
        let kind: String = redis::cmd("TYPE")
            .arg(&name)
            .query(&mut connection)
            .expect("TYPE");
        let value = match kind.as_str() {
            "string" => json!(
                redis::cmd("GET")
                    .arg(&name)
                    .query::<String>(&mut connection)
                    .expect("GET")
            ),
            "hash" => json!(
                redis::cmd("HGETALL")
                    .arg(&name)
                    .query::<BTreeMap<String, String>>(&mut connection)
                    .expect("HGETALL")
            ),
            "zset" => json!(
                redis::cmd("ZRANGE")
                    .arg(&name)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query::<Vec<(String, String)>>(&mut connection)
                    .expect("ZRANGE")
            ),
            "list" => json!(
                redis::cmd("LRANGE")
                    .arg(&name)
                    .arg(0)
                    .arg(-1)
                    .query::<Vec<String>>(&mut connection)
                    .expect("LRANGE")
            ),
            other => panic!("{name}: a {other}, which the fixture does not know"),
        };
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&name)
            .query(&mut connection)
            .expect("PTTL");
        out.insert(
            name,
            json!({"type": kind, "value": value, "expires": ttl >= 0}),
        );
    }
    json!(out)
}

/// Writes a dump's keys into `redis` as they were (expiring in a day where
/// they expired: the decisions here are at virtual instants).
fn restore(redis: &RedisServer, keys: &Value) {
    let mut connection = redis::Client::open(redis.url())
        .and_then(|client| client.get_connection())
        .expect("a connection");
    for (name, entry) in keys.as_object().expect("keys") {
        let value = &entry["value"];
        let command = match entry["type"].as_str() {
            Some("string") => {
                let mut set = redis::cmd("SET");
                set.arg(name).arg(value.as_str().expect("a string"));
                set
            }
            Some("hash") => {
                let mut set = redis::cmd("HSET");
                set.arg(name);
                for (field, value) in value.as_object().expect("fields") {
                    set.arg(field).arg(value.as_str().expect("a string"));
                }
                set
            }
            Some("zset") => {
                let mut add = redis::cmd("ZADD");
                add.arg(name);
                for pair in value.as_array().expect("members") {
                    add.arg(pair[1].as_str().expect("a score"))
                        .arg(pair[0].as_str().expect("a member"));
                }
                add
            }
            Some("list") => {
                let mut push = redis::cmd("RPUSH");
                push.arg(name);
                for item in value.as_array().expect("items") {
                    push.arg(item.as_str().expect("a string"));
                }
                push
            }
            other => panic!("{name}: {other:?}"),
        };
        command.exec(&mut connection).expect("written");
        if entry["expires"] == json!(true) {
            redis::cmd("PEXPIRE")
                .arg(name)
                .arg(86_400_000)
                .exec(&mut connection)
                .expect("PEXPIRE");
        }
    }
}

#[test]
fn the_previous_releases_state_is_read_with_the_same_decisions() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();

    // What this build writes, and answers on it.
    let written = RedisServer::start();
    let clock = ManualClock::new(T0);
    let here = limiter(&written.url(), &clock);
    runtime.block_on(write_state(&here, &clock));
    let state = dump(&written);
    let answers = runtime.block_on(later_answers(&here, &clock));

    let path = fixture_path();
    if std::env::var_os("CHARON_RECORD_STATE").is_some() {
        let fixture = json!({
            "format": keys::STATE_FORMAT,
            "written_by": env!("CARGO_PKG_VERSION"),
            "written_at_ms": T0,
            "config": CONFIG,
            "keys": state,
            "later_answers": answers,
        });
        let text = serde_json::to_string_pretty(&fixture).expect("JSON");
        std::fs::write(&path, text + "\n").expect("the fixture written");
        return;
    }
    let fixture: Value = serde_json::from_str(
        &std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display())),
    )
    .expect("the fixture is JSON");
    assert_eq!(
        state,
        fixture["keys"],
        "this build writes other state than format {}'s fixture ({}): if release {} reads it, \
         record the fixture anew (CHARON_RECORD_STATE=1); if not, raise STATE_FORMAT with a \
         migration or a mixed-fleet rule (docs/releases.md#the-redis-state)",
        keys::STATE_FORMAT,
        path.display(),
        fixture["written_by"],
    );
    assert_eq!(
        answers, fixture["later_answers"],
        "this build decides otherwise on its own state"
    );

    // The fixture's state, as the recorded release left it, read by this build.
    let restored = RedisServer::start();
    restore(&restored, &fixture["keys"]);
    let clock = ManualClock::new(T0);
    let reader = limiter(&restored.url(), &clock);
    let read = runtime.block_on(later_answers(&reader, &clock));
    assert_eq!(
        read, fixture["later_answers"],
        "release {}'s state is decided otherwise by this build",
        fixture["written_by"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_of_a_newer_state_format_is_not_decided_on() {
    let redis = RedisServer::start();
    let format_key = keys::state_format_key();
    assert_eq!(redis.command(&["SET", &format_key, "999"]), "OK");
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    eventually(
        "not ready, naming the newer format",
        Duration::from_secs(30),
        async || match sidecar.readyz().await? {
            (503, body) if body.contains("newer Charon") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let mut session = sidecar.session().await;
    let answer = session
        .call(charon::api::v1::session_request::Op::Request(
            charon::api::v1::RequestOp {
                namespace: "state".into(),
                resource: "api".into(),
                domain: "a".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("answered in the stream");
    assert!(
        matches!(answer, charon::api::v1::session_response::Result::Error(_)),
        "no decision on a newer state: {answer:?}"
    );
    assert_eq!(
        redis.command(&["GET", &format_key]),
        "999",
        "left as it was"
    );

    // Set right (the newer sidecars rolled back): served again.
    assert_eq!(redis.command(&["SET", &format_key, "1"]), "OK");
    eventually(
        "ready once the format is one it reads",
        Duration::from_secs(30),
        async || match sidecar.readyz().await? {
            (200, body) => Ok(body),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
}

#[test]
fn a_fresh_redis_is_given_this_builds_state_format() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let clock = ManualClock::new(T0);
    let limiter = limiter(&redis.url(), &clock);
    runtime
        .block_on(limiter.should_rate_limit(request("window")))
        .expect("Redis answers");
    assert_eq!(
        redis.command(&["GET", &keys::state_format_key()]),
        keys::STATE_FORMAT.to_string()
    );
}
