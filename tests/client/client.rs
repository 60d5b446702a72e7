//! The Rust client (`charon::client`) end to end, against a real sidecar
//! (`charon serve` on loopback) and against the embedded engine, with the
//! same assertions for both where the backends must agree.
//!
//! What it proves: requests and holds are decided as the configuration says,
//! with the server's context; a dropped hold gives its copies back; transfer
//! and seize move copies between clients; retries wait what the server says
//! within `max_wait`; an unreachable sidecar fails open (flagged, counted)
//! or, when configured, is an error; the kill switch grants rejections and
//! still reports them; a restarted sidecar is reconnected to; `acquire`
//! takes the same number of every resource or nothing.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::client::{Client, ClientError, ClientOptions, ErrorKind, Sidecar, Target};
use support::sidecar::{eventually, sidecar_client, tempdir, write_config};

const CONFIG: &str = r#"
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 3, window: 10s, active: forever, cooldown: 0s}
  slow:
    rate:
      tiers:
        - {limit: 1, window: 1s, active: forever, cooldown: 0s}
  pool:
    copies: {domain_limit: 4}
  disks:
    copies: {domain_limit: 10}
"#;

/// Waits until a hold of all `copies` of `resource` is granted for acme
/// (releases of dropped holds run in the background).
async fn until_whole(client: &Client, resource: &str, copies: u64, what: &str) {
    eventually(what, Duration::from_secs(10), async || {
        let all = client
            .hold("shop", resource, "acme")
            .copies(copies)
            .await
            .map_err(|e| e.to_string())?;
        match all.copies() {
            granted if granted == copies => Ok(()),
            granted => Err(format!("{granted} granted")),
        }
    })
    .await;
}

fn config() -> charon::config::Config {
    charon::config::load_str(CONFIG, "shop.yaml")
        .expect("the test config loads")
        .config
}

/// The same checks on any backend.
async fn decides_as_configured(client: &Client) {
    for expected_remaining in [2, 1, 0] {
        let answer = client.request("shop", "api", "acme").await.unwrap();
        assert_eq!(answer.granted, 1);
        assert!(!answer.degraded && !answer.unanswered);
        assert_eq!(answer.context.tier_limit, 3);
        assert_eq!(answer.context.tier_window_ms, 10_000);
        assert_eq!(answer.context.remaining, expected_remaining);
    }
    let rejected = client.request("shop", "api", "acme").await.unwrap();
    assert!(!rejected.is_granted());
    let retry_after = rejected.retry_after.expect("a retry-after");
    assert!(retry_after > Duration::from_secs(8) && retry_after <= Duration::from_millis(10_001));
    assert!(
        client
            .request("shop", "api", "other")
            .await
            .unwrap()
            .is_granted()
    );

    let mut first = client.hold("shop", "pool", "acme").copies(3).await.unwrap();
    assert_eq!((first.granted(), first.copies()), (3, 3));
    assert_eq!(first.context().domain_holds, 3);
    let second = client
        .hold("shop", "pool", "acme")
        .copies(3)
        .min_copies(1)
        .await
        .unwrap();
    assert_eq!(second.copies(), 1, "only one copy was left");
    let none = client.hold("shop", "pool", "acme").await.unwrap();
    assert!(!none.is_granted());
    assert_eq!(first.release(2).await.unwrap(), 2);
    assert_eq!(first.copies(), 1);
    drop(second);
    drop(first);
    // Both drops release in the background: all 4 come back.
    until_whole(client, "pool", 4, "dropped holds released").await;

    let unknown = client.request("shop", "nope", "acme").await.unwrap_err();
    assert!(
        matches!(
            unknown,
            ClientError::Refused {
                kind: ErrorKind::UnknownResource,
                ..
            }
        ),
        "{unknown:?}"
    );
    let wrong = client.request("shop", "pool", "acme").await.unwrap_err();
    assert!(
        matches!(
            wrong,
            ClientError::Refused {
                kind: ErrorKind::WrongKind,
                ..
            }
        ),
        "{wrong:?}"
    );
    let zero = client
        .hold("shop", "pool", "acme")
        .copies(0)
        .await
        .unwrap_err();
    assert!(matches!(zero, ClientError::Invalid(_)), "{zero:?}");
    let inverted = client
        .hold("shop", "pool", "acme")
        .copies(1)
        .min_copies(2)
        .await
        .unwrap_err();
    assert!(matches!(inverted, ClientError::Invalid(_)), "{inverted:?}");
    let empty = client.request("shop", "api", "").await.unwrap_err();
    assert!(
        matches!(
            empty,
            ClientError::Refused {
                kind: ErrorKind::Malformed,
                ..
            }
        ),
        "{empty:?}"
    );
    assert_eq!(client.stats().degraded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_client_decides_as_configured() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), CONFIG).await;
    let client = sidecar_client(&sidecar).await;
    decides_as_configured(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_client_decides_as_configured() {
    decides_as_configured(&Client::embedded(config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_client_on_redis_shares_its_holds_with_a_sidecar() {
    let redis = support::redis::RedisServer::start();
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    let sidecar = support::sidecar::Sidecar::start(dir.path(), &path, &redis.url(), &[]);
    sidecar.wait_serving().await;
    let embedded = charon::client::Embedded::open(
        config(),
        &charon::store::open::StoreOptions {
            url: redis.url(),
            ..Default::default()
        },
        charon::store::copies::CopyTimings::default(),
    )
    .await
    .unwrap();
    let embedded = Client::new(embedded);
    let remote = sidecar_client(&sidecar).await;
    let ours = eventually(
        "the embedded engine registered",
        Duration::from_secs(10),
        async || {
            let hold = embedded
                .hold("shop", "pool", "acme")
                .copies(3)
                .await
                .map_err(|e| e.to_string())?;
            if hold.is_granted() && !hold.unanswered() {
                Ok(hold)
            } else {
                Err(format!("{hold:?}"))
            }
        },
    )
    .await;
    let theirs = remote
        .hold("shop", "pool", "acme")
        .copies(3)
        .min_copies(1)
        .await
        .unwrap();
    assert_eq!(
        theirs.copies(),
        1,
        "the sidecar sees the embedded engine's holds"
    );
    assert_eq!(theirs.context().domain_holds, 4);
    drop(ours);
    eventually(
        "the embedded hold released in Redis",
        Duration::from_secs(10),
        async || {
            let more = remote
                .hold("shop", "pool", "acme")
                .copies(3)
                .await
                .map_err(|e| e.to_string())?;
            if more.is_granted() {
                Ok(())
            } else {
                Err(format!("{:?}", more.context()))
            }
        },
    )
    .await;
    // Rate limits are shared too.
    for _ in 0..3 {
        assert!(
            embedded
                .request("shop", "api", "acme")
                .await
                .unwrap()
                .is_granted()
        );
    }
    assert!(
        !remote
            .request("shop", "api", "acme")
            .await
            .unwrap()
            .is_granted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_move_copies_between_clients() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), CONFIG).await;
    let giver = sidecar_client(&sidecar).await;
    let taker = sidecar_client(&sidecar).await;
    let mut hold = giver
        .hold("shop", "disks", "acme")
        .copies(10)
        .await
        .unwrap();
    let id = hold.transfer(6, Duration::from_secs(30)).await.unwrap();
    assert_eq!(hold.copies(), 4);
    let mut seized = taker.seize(&id).await.unwrap();
    assert_eq!((seized.copies(), seized.context().domain_holds), (6, 10));
    assert!(matches!(
        taker.seize(&id).await.unwrap_err(),
        ClientError::Refused {
            kind: ErrorKind::UnknownTransfer,
            ..
        }
    ));
    assert_eq!(seized.release(6).await.unwrap(), 6);
    drop(hold);
    until_whole(&taker, "disks", 10, "everything released").await;
    assert!(matches!(
        hold_transfer_too_many(&giver).await,
        ClientError::Invalid(_)
    ));
}

async fn hold_transfer_too_many(client: &Client) -> ClientError {
    let mut hold = client.hold("shop", "disks", "bob").copies(2).await.unwrap();
    hold.transfer(3, Duration::from_secs(1)).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_for_the_server_within_max_wait() {
    let client = Client::embedded(config());
    assert!(
        client
            .request("shop", "slow", "acme")
            .await
            .unwrap()
            .is_granted()
    );
    let at_once = client.request("shop", "slow", "acme").await.unwrap();
    assert!(!at_once.is_granted());
    assert!(at_once.waited < Duration::from_millis(100));
    // retry_after is about 1 s: granted on a retry after about that long.
    let patient = client
        .request("shop", "slow", "acme")
        .max_wait(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(patient.is_granted(), "{patient:?}");
    assert!(
        patient.waited >= Duration::from_millis(500),
        "{:?}",
        patient.waited
    );
    // Too short a max_wait gives up with the last rejection, in time.
    let hasty = client
        .request("shop", "slow", "acme")
        .max_wait(Duration::from_millis(200))
        .await
        .unwrap();
    assert!(!hasty.is_granted());
    assert!(hasty.waited >= Duration::from_millis(200) && hasty.waited < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_sidecar_fails_open_or_is_an_error() {
    let port = support::redis::free_port();
    let open = Client::sidecar(&format!("http://127.0.0.1:{port}")).unwrap();
    let answer = open
        .request("shop", "api", "acme")
        .copies(5)
        .min_copies(2)
        .await
        .unwrap();
    assert_eq!(answer.granted, 2, "fail-open grants min_copies");
    assert!(answer.degraded && answer.unanswered);
    let hold = open.hold("shop", "pool", "acme").copies(3).await.unwrap();
    assert!(hold.is_granted() && hold.unanswered());
    assert_eq!(open.stats().degraded, 2);
    assert!(matches!(
        open.seize("whatever").await.unwrap_err(),
        ClientError::Unavailable(_)
    ));

    let closed = Client::with_options(
        Sidecar::connect(&format!("http://127.0.0.1:{port}")).unwrap(),
        ClientOptions {
            fail_open: false,
            ..ClientOptions::default()
        },
    );
    assert!(matches!(
        closed.request("shop", "api", "acme").await.unwrap_err(),
        ClientError::Unavailable(_)
    ));
    assert!(matches!(
        Client::sidecar("not a url").err(),
        Some(ClientError::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_switch_grants_rejections_and_reports_them() {
    let client = Client::embedded(config());
    for _ in 0..3 {
        client.request("shop", "api", "acme").await.unwrap();
    }
    client.set_kill_switch(true);
    let answer = client.request("shop", "api", "acme").await.unwrap();
    assert!(answer.is_granted() && answer.overridden);
    assert!(
        answer.retry_after.is_some(),
        "the server's answer is still reported"
    );
    let _full = client.hold("shop", "pool", "acme").copies(4).await.unwrap();
    let extra = client.hold("shop", "pool", "acme").await.unwrap();
    assert!(extra.is_granted() && extra.overridden());
    assert_eq!(client.stats().overridden, 2);
    client.set_kill_switch(false);
    assert!(
        !client
            .request("shop", "api", "acme")
            .await
            .unwrap()
            .is_granted()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sidecar_is_reconnected_to() {
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    let mut sidecar = support::sidecar::Sidecar::start(dir.path(), &path, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let (grpc, admin) = (sidecar.grpc, sidecar.admin);
    let client = sidecar_client(&sidecar).await;
    let hold = client.hold("shop", "pool", "acme").copies(2).await.unwrap();
    assert!(!hold.unanswered());
    sidecar.kill();
    let answer = client.request("shop", "api", "acme").await.unwrap();
    assert!(answer.unanswered, "{answer:?}");
    let sidecar =
        support::sidecar::Sidecar::start_at(dir.path(), &path, "memory", (grpc, admin), &[]);
    sidecar.wait_readyz(200, "ready").await;
    eventually(
        "the client reconnected",
        Duration::from_secs(20),
        async || {
            let answer = client
                .request("shop", "api", "acme")
                .await
                .map_err(|e| e.to_string())?;
            if answer.unanswered {
                Err("still failing open".into())
            } else {
                Ok(())
            }
        },
    )
    .await;
    // The old session's hold died with it: dropping it sends nothing, and
    // the new session can hold the whole limit.
    drop(hold);
    let all = client.hold("shop", "pool", "acme").copies(4).await.unwrap();
    assert_eq!(all.copies(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_takes_the_same_number_of_everything_or_nothing() {
    let client = Client::embedded(config());
    let targets = [
        Target::copies("shop", "disks", "acme"),
        Target::copies("shop", "pool", "acme"),
        Target::rate("shop", "api", "acme"),
    ];
    let got = client
        .acquire(&targets, 6, 1, Duration::ZERO)
        .await
        .unwrap();
    // disks grants 6, pool only 4, api only 3: 3 of each are kept.
    assert_eq!(got.copies, 3);
    assert_eq!(
        got.holds
            .iter()
            .map(|hold| hold.copies())
            .collect::<Vec<_>>(),
        [3, 3]
    );
    assert_eq!(got.rate.as_ref().map(|rate| rate.granted), Some(3));
    let disks = client
        .hold("shop", "disks", "acme")
        .copies(7)
        .await
        .unwrap();
    assert_eq!(disks.copies(), 7, "the surplus of disks was released");
    drop(disks);

    // api is spent now: nothing is kept of the holds before it.
    let none = client
        .acquire(&targets, 2, 1, Duration::ZERO)
        .await
        .unwrap();
    assert!(!none.is_granted() && none.holds.is_empty());
    drop(got);
    until_whole(&client, "pool", 4, "everything released").await;

    let misplaced = [
        Target::rate("shop", "api", "acme"),
        Target::copies("shop", "pool", "acme"),
    ];
    assert!(matches!(
        client
            .acquire(&misplaced, 1, 1, Duration::ZERO)
            .await
            .unwrap_err(),
        ClientError::Invalid(_)
    ));
}

/// Blocks Redis for `seconds` (`DEBUG SLEEP`) on a thread; returns at once.
fn stall(port: u16, seconds: &'static str) -> std::thread::JoinHandle<()> {
    let handle = std::thread::spawn(move || {
        support::redis::command(port, &["DEBUG", "SLEEP", seconds]);
    });
    // Give the command a head start so the next call queues behind it.
    std::thread::sleep(Duration::from_millis(100));
    handle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_answered_after_its_deadline_is_given_back() {
    let redis = support::redis::RedisServer::start();
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    // The sidecar waits for Redis longer than the client waits for it.
    let sidecar = support::sidecar::Sidecar::start(
        dir.path(),
        &path,
        &redis.url(),
        &["--store-timeout", "3s", "--heartbeat-ttl", "60s"],
    );
    sidecar.wait_serving().await;
    let hasty = Client::with_options(
        Sidecar::connect(&sidecar.grpc_url()).unwrap(),
        ClientOptions {
            call_timeout: Duration::from_millis(100),
            ..ClientOptions::default()
        },
    );
    assert!(hasty.ready(Duration::from_secs(20)).await);
    let stalled = stall(redis.port, "0.5");
    let hold = hasty.hold("shop", "pool", "acme").copies(2).await.unwrap();
    assert!(hold.unanswered(), "the deadline passed: {hold:?}");
    stalled.join().expect("DEBUG SLEEP returns");
    // The sidecar granted the reserve after all; nobody received it, so the
    // client gave it back: the whole limit is free again.
    let patient = sidecar_client(&sidecar).await;
    until_whole(&patient, "pool", 4, "the late grant given back").await;
    drop(hold);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_engine_recovers_after_resigning() {
    let mut redis = support::redis::RedisServer::start();
    let embedded = charon::client::Embedded::open(
        config(),
        &charon::store::open::StoreOptions {
            url: redis.url(),
            ..Default::default()
        },
        charon::store::copies::CopyTimings {
            heartbeat: Duration::from_millis(100),
            ttl: Duration::from_millis(600),
            reap_interval: Duration::from_millis(100),
        },
    )
    .await
    .unwrap();
    let client = Client::new(embedded);
    let hold = eventually("registered", Duration::from_secs(10), async || {
        let hold = client
            .hold("shop", "pool", "acme")
            .copies(3)
            .await
            .map_err(|e| e.to_string())?;
        if hold.unanswered() {
            Err("not registered yet".into())
        } else {
            Ok(hold)
        }
    })
    .await;
    // Redis loses everything: the engine resigns (its holds are gone) ...
    redis.restart();
    // ... and serves copies again from a new session, with the whole limit.
    eventually(
        "serving copies again",
        Duration::from_secs(20),
        async || {
            let all = client
                .hold("shop", "pool", "acme")
                .copies(4)
                .await
                .map_err(|e| e.to_string())?;
            if !all.unanswered() && all.copies() == 4 {
                Ok(())
            } else {
                Err(format!("{all:?}"))
            }
        },
    )
    .await;
    drop(hold);
}
