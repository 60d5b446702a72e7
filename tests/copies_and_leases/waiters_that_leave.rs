//! Reserves that wait, and sessions that end while they wait
//! (docs/design.md#waiting-for-a-copy): a session whose stream is
//! cancelled, or whose connection closes (what the sidecar sees when a
//! client process dies), leaves every queue at once; nothing is granted to
//! it, and the copy goes to the next live waiter. For plain waits and for
//! waits for anyone's result, on one memory sidecar and across two
//! sidecars of one Redis (the holder on one, the waiters on the other).
//!
//! And the stampede across sidecars (docs/design.md#waiting-for-anyones-result):
//! 20 sessions on two sidecars of one Redis wait for anyone's result on a
//! one-copy resource; the one granted works and releases as done; every
//! other is told done, in every round (`CHARON_STAMPEDE_ROUNDS`, 200 by
//! default).
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use charon::api::v1::session_request::Op;
use charon::api::v1::session_response::Result as Answer;
use charon::api::v1::{ReleaseOp, ReserveOp};
use support::proxy::closing_proxy;
use support::redis::RedisServer;
use support::sidecar::{Session, Sidecar, eventually, memory_sidecar, tempdir, write_config};

const NS: &str = "jobs";
const POOL: &str = "encoder";

const CONFIG: &str = "
domain: jobs
resources:
  encoder:
    copies:
      domain_limit: 1
";

/// How the first waiter leaves.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// Its client drops the session: the stream is closed and cancelled.
    Stream,
    /// Its connection closes with no HTTP/2 goodbye, as when the client's
    /// process is killed.
    Connection,
}

fn waiting_reserve(domain: &str, for_anyone: bool) -> Op {
    Op::Reserve(ReserveOp {
        namespace: NS.into(),
        resource: POOL.into(),
        domain: domain.into(),
        copies: Some(1),
        min_copies: Some(1),
        max_wait_ms: Some(10_000),
        for_anyone: Some(for_anyone),
        ..ReserveOp::default()
    })
}

/// The value of `name` with these labels (in any order) in Prometheus
/// text, 0 when absent.
fn sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            let (metric, rest) = key.split_once('{').unwrap_or((key, ""));
            let matches = metric == name
                && labels
                    .iter()
                    .all(|(label, want)| rest.contains(&format!("{label}=\"{want}\"")));
            matches.then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

async fn reserves(sidecar: &Sidecar, result: &str) -> f64 {
    let metrics = sidecar.metrics().await.unwrap_or_default();
    sample(
        &metrics,
        "charon_session_operations_total",
        &[("operation", "reserve"), ("result", result)],
    )
}

async fn sessions(sidecar: &Sidecar) -> f64 {
    sample(
        &sidecar.metrics().await.unwrap_or_default(),
        "charon_sessions",
        &[],
    )
}

fn granted(answer: &Answer) -> (u64, bool) {
    match answer {
        Answer::Reserve(answer) => (answer.granted, answer.done),
        other => panic!("reserve answered {other:?}"),
    }
}

/// A holder on `holders`, then two waiters on `waiters` (the first of
/// them in line leaves by `leave`); the holder releases: the second
/// waiter is granted the copy, and nothing is ever granted to the first.
async fn the_copy_goes_to_the_live_waiter(
    holders: &Sidecar,
    waiters: &Sidecar,
    leave: Leave,
    for_anyone: bool,
) {
    let domain = format!("{leave:?}-{for_anyone}").to_lowercase();
    let case = format!("{leave:?}, for_anyone {for_anyone}");
    let mut holder = holders.session().await;
    let (held, groups) = holder.hold(NS, POOL, &domain, 1).await;
    assert_eq!(held, 1, "{case}: the holder has the copy");

    let (close, closed) = tokio::sync::watch::channel(false);
    let mut leaver = match leave {
        Leave::Stream => waiters.session().await,
        Leave::Connection => {
            let port = closing_proxy(waiters.ports().0, closed).await;
            let client = charon::api::v1::charon_client::CharonClient::connect(format!(
                "http://127.0.0.1:{port}"
            ))
            .await
            .expect("a connection through the proxy");
            Session::open(client).await
        }
    };
    leaver.send(waiting_reserve(&domain, for_anyone)).await;
    let mut live = waiters.session().await;
    // The leaver is first in line, the live waiter behind it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    live.send(waiting_reserve(&domain, for_anyone)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let granted_before = reserves(waiters, "ok").await;
    let cancelled_before = reserves(waiters, "CANCELLED").await;
    let sessions_before = sessions(waiters).await;
    match leave {
        Leave::Stream => drop(leaver),
        Leave::Connection => {
            close.send_replace(true);
            // The session's own handles go with the closed connection.
            drop(leaver);
        }
    }
    // It leaves its queue at once: its reserve is counted as cancelled and
    // its session is gone, while the copy is still held.
    eventually(&format!("{case}: the leaver's session ends"), Duration::from_secs(3), async || {
        let (now, cancelled) = (sessions(waiters).await, reserves(waiters, "CANCELLED").await);
        if now <= sessions_before - 1.0 && cancelled >= cancelled_before + 1.0 {
            Ok(())
        } else {
            Err(format!("sessions {sessions_before} -> {now}, cancelled {cancelled_before} -> {cancelled}"))
        }
    })
    .await;

    let release = holder.release(NS, POOL, &domain, 1, &groups).await;
    assert!(matches!(release, Answer::Release(_)), "{case}: {release:?}");
    let (_, answer) = live
        .answer(Duration::from_secs(5))
        .await
        .unwrap_or_else(|status| panic!("{case}: the live waiter is answered: {status}"));
    assert_eq!(
        granted(&answer),
        (1, false),
        "{case}: the live waiter has the copy"
    );
    // One grant on the waiters' sidecar: the live waiter's, none to the
    // session that left.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        reserves(waiters, "ok").await - granted_before,
        1.0,
        "{case}: exactly one waiting reserve was granted"
    );
    // And it is the only holder: one copy, held once.
    let mut probe = holders.session().await;
    assert_eq!(
        probe.hold(NS, POOL, &domain, 1).await.0,
        0,
        "{case}: the copy is held"
    );
    let _ = live
        .call(Op::Release(ReleaseOp {
            namespace: NS.into(),
            resource: POOL.into(),
            domain: domain.clone(),
            copies: 1,
            groups: Vec::new(),
            done: None,
        }))
        .await;
}

const CASES: [(Leave, bool); 4] = [
    (Leave::Stream, false),
    (Leave::Stream, true),
    (Leave::Connection, false),
    (Leave::Connection, true),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_is_granted_nothing_on_the_memory_store() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    for (leave, for_anyone) in CASES {
        the_copy_goes_to_the_live_waiter(&sidecar, &sidecar, leave, for_anyone).await;
    }
}

const FAST: [&str; 6] = [
    "--heartbeat",
    "100ms",
    "--heartbeat-ttl",
    "600ms",
    "--reap-interval",
    "100ms",
];

async fn two_sidecars(dir: &std::path::Path, redis: &RedisServer) -> (Sidecar, Sidecar) {
    let config = write_config(dir, CONFIG);
    let a = Sidecar::start(dir, &config, &redis.url(), &FAST);
    let b = Sidecar::start(dir, &config, &redis.url(), &FAST);
    a.wait_serving().await;
    b.wait_serving().await;
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_is_granted_nothing_across_two_sidecars_of_one_redis() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let (a, b) = two_sidecars(dir.path(), &redis).await;
    for (leave, for_anyone) in CASES {
        the_copy_goes_to_the_live_waiter(&a, &b, leave, for_anyone).await;
    }
}

/// How long the one granted works before it releases as done.
const WORK: Duration = Duration::from_millis(100);

/// One round: 20 clients (alternating sidecars) wait for anyone's result
/// on `domain`; (granted, told done).
async fn stampede(clients: &[charon::client::Client], domain: &str) -> (usize, usize) {
    let granted = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let callers = clients.iter().cloned().map(|client| {
        let (granted, done, domain) = (granted.clone(), done.clone(), domain.to_owned());
        tokio::spawn(async move {
            let mut hold = client
                .hold(NS, POOL, &domain)
                .max_wait(Duration::from_secs(10))
                .for_anyone()
                .await
                .expect("an answer");
            if hold.is_done() {
                done.fetch_add(1, Ordering::SeqCst);
            } else if hold.is_granted() {
                granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(WORK).await;
                hold.release_done().await.expect("released as done");
            }
        })
    });
    for caller in futures_util::future::join_all(callers).await {
        caller.expect("the caller finished");
    }
    (granted.load(Ordering::SeqCst), done.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_across_two_sidecars_does_the_work_once_in_every_round() {
    let rounds: usize = std::env::var("CHARON_STAMPEDE_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(200);
    let redis = RedisServer::start();
    let dir = tempdir();
    let (a, b) = two_sidecars(dir.path(), &redis).await;
    let mut clients = Vec::new();
    for caller in 0..20 {
        let sidecar = if caller % 2 == 0 { &a } else { &b };
        clients.push(support::sidecar::sidecar_client(sidecar).await);
    }
    let mut leaks = Vec::new();
    for round in 0..rounds {
        let outcome = stampede(&clients, &format!("page-{round}")).await;
        if outcome != (1, 19) {
            leaks.push((round, outcome));
        }
    }
    assert!(
        leaks.is_empty(),
        "rounds where the work ran more than once, or a caller got neither (round, (granted, done)): {leaks:?} of {rounds}"
    );
}
