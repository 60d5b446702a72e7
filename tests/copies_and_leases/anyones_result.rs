//! Waiting for anyone's result (PoolCounter's ACQ4ANY,
//! docs/design.md#waiting-for-anyones-result), in PoolCounter's terms: 20
//! callers want the same page rendered; one renders it, the 19 others
//! wait *for anyone* and, when the renderer releases as done, read what it
//! cached. Total time about one rendering, not twenty. On one sidecar on
//! the memory store, and on two sidecars sharing one Redis (half the
//! callers on each).
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::redis::RedisServer;
use support::sidecar::{Sidecar, memory_sidecar, sidecar_client, tempdir, write_config};

const CONFIG: &str = "
domain: pages
resources:
  render:
    copies:
      domain_limit: 1
";

/// How long one rendering takes.
const RENDER: Duration = Duration::from_millis(600);

/// 20 callers of `clients` (round robin) want page `home`: what each got
/// (rendered, read the cache, or neither) and the time until all were done.
async fn twenty_callers(clients: &[charon::client::Client]) -> (usize, usize, Duration) {
    let rendered = Arc::new(AtomicUsize::new(0));
    let read = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let callers = (0..20).map(|caller| {
        let client = clients[caller % clients.len()].clone();
        let (rendered, read) = (rendered.clone(), read.clone());
        tokio::spawn(async move {
            let mut hold = client
                .hold("pages", "render", "home")
                .max_wait(Duration::from_secs(10))
                .for_anyone()
                .await
                .expect("an answer");
            if hold.is_done() {
                read.fetch_add(1, Ordering::SeqCst);
                assert_eq!(hold.copies(), 0, "a done answer holds nothing");
            } else if hold.is_granted() {
                tokio::time::sleep(RENDER).await;
                rendered.fetch_add(1, Ordering::SeqCst);
                hold.release_done().await.expect("released as done");
            }
        })
    });
    for caller in futures_util::future::join_all(callers).await {
        caller.expect("the caller finished");
    }
    (
        rendered.load(Ordering::SeqCst),
        read.load(Ordering::SeqCst),
        started.elapsed(),
    )
}

fn assert_one_rendering(outcome: (usize, usize, Duration)) {
    eprintln!("rendered, read the cache, took: {outcome:?}");
    let (rendered, read, took) = outcome;
    assert_eq!(rendered, 1, "{outcome:?}");
    assert_eq!(read, 19, "{outcome:?}");
    // One rendering and the waiters' wake-ups, not twenty renderings
    // (12 s): a generous bound.
    assert!(took < RENDER * 4, "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_callers_one_renders_nineteen_read_on_one_sidecar() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let client = sidecar_client(&sidecar).await;
    assert_one_rendering(twenty_callers(std::slice::from_ref(&client)).await);

    // Released without `done` (the renderer failed): the next waiter gets
    // the copy and renders; nobody is told a result exists.
    let first = client
        .hold("pages", "render", "home")
        .await
        .expect("the copy");
    assert!(first.is_granted());
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .hold("pages", "render", "home")
                .max_wait(Duration::from_secs(10))
                .for_anyone()
                .await
                .expect("an answer")
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(first);
    let second = waiter.await.expect("joined");
    assert!(second.is_granted() && !second.is_done(), "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_callers_on_two_sidecars_of_one_redis_one_renders() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let a = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    let b = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    a.wait_serving().await;
    b.wait_serving().await;
    let clients = [sidecar_client(&a).await, sidecar_client(&b).await];
    assert_one_rendering(twenty_callers(&clients).await);
}
