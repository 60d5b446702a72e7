//! One request charged against three token budgets at once (a user's, an
//! organisation's and a model's, `cost: after_response`), through the
//! Charon API's reserve and commit on three sidecars sharing one
//! `redis-server`: one reservation holds every budget, a commit settles
//! each at the actual cost, a cancel gives each back; one budget that
//! cannot pay refuses the request and holds nothing of the others; and 64
//! streams at once never take any budget past its limit, while each
//! budget's count is exact afterwards.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use charon::client::{Client, ReserveCost};
use charon::limiter::Descriptor;
use support::redis::RedisServer;
use support::sidecar::{Sidecar, tempdir, write_config};

use super::cost_reservations::client_of;

const CONFIG: &str = "domain: ai
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3000, cost: after_response, initial_cost: 100, max_charge: 5000}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 5000, cost: after_response, initial_cost: 100, max_charge: 5000}
  - key: model
    rate_limit: {unit: hour, requests_per_unit: 4000, cost: after_response, initial_cost: 100, max_charge: 5000}
";

/// Three sidecars on one `redis-server`, and a client of each.
struct Fleet {
    clients: Vec<Client>,
    _sidecars: Vec<Sidecar>,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Fleet {
    async fn start() -> Fleet {
        let redis = RedisServer::start();
        let dir = tempdir();
        let config = write_config(dir.path(), CONFIG);
        let sidecars: Vec<Sidecar> = (0..3)
            .map(|_| {
                Sidecar::start(
                    dir.path(),
                    &config,
                    &redis.url(),
                    &["--store-timeout", "2s"],
                )
            })
            .collect();
        let mut clients = Vec::new();
        for sidecar in &sidecars {
            clients.push(client_of(sidecar).await);
        }
        Fleet {
            clients,
            _sidecars: sidecars,
            _redis: redis,
            _dir: dir,
        }
    }
}

/// The three budgets of one request.
fn three(user: &str, org: &str, model: &str) -> Vec<Descriptor> {
    vec![
        Descriptor::new([("user", user)]),
        Descriptor::new([("org", org)]),
        Descriptor::new([("model", model)]),
    ]
}

/// What one budget has left: the most a reservation of it alone may hold
/// (found by holding exactly that, and then one more, and giving both
/// back).
async fn left(client: &Client, budget: (&str, &str)) -> u64 {
    let alone = || vec![Descriptor::new([budget])];
    let probe = client
        .reserve_cost(ReserveCost::new("ai", alone(), 1))
        .await
        .expect("answered");
    let left = if probe.granted {
        probe.remaining + 1
    } else {
        0
    };
    if probe.granted {
        probe.cancel().await.expect("cancelled");
    }
    if left > 0 {
        let exact = client
            .reserve_cost(ReserveCost::new("ai", alone(), left))
            .await
            .expect("answered");
        assert!(exact.granted, "{budget:?}: {left} should fit exactly");
        exact.cancel().await.expect("cancelled");
    }
    let over = client
        .reserve_cost(ReserveCost::new("ai", alone(), left + 1))
        .await
        .expect("answered");
    assert!(!over.granted, "{budget:?}: {} should not fit", left + 1);
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_budget_is_settled_on_its_own_and_one_that_cannot_pay_holds_none() {
    let fleet = Fleet::start().await;
    let clients = &fleet.clients;
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);

    // Held on one sidecar, committed on another: each budget pays 700.
    let held = a
        .reserve_cost(ReserveCost::new("ai", three("ann", "acme", "big"), 1_000))
        .await
        .expect("answered");
    assert!(held.granted, "{held:?}");
    assert_eq!(
        held.remaining, 2_000,
        "the user's 3 000 less 1 000 is the least"
    );
    let id = held.id().to_owned();
    charon::client::CostReservation::resume(b, "ai", three("ann", "acme", "big"), id)
        .commit(700)
        .await
        .expect("committed");
    assert_eq!(left(c, ("user", "ann")).await, 2_300);
    assert_eq!(left(c, ("org", "acme")).await, 4_300);
    assert_eq!(left(c, ("model", "big")).await, 3_300);

    // A cancelled one gives each back whole.
    let cancelled = b
        .reserve_cost(ReserveCost::new("ai", three("ann", "acme", "big"), 2_000))
        .await
        .expect("answered");
    assert!(cancelled.granted, "{cancelled:?}");
    cancelled.cancel().await.expect("cancelled");
    assert_eq!(left(a, ("user", "ann")).await, 2_300);
    assert_eq!(left(a, ("org", "acme")).await, 4_300);
    assert_eq!(left(a, ("model", "big")).await, 3_300);

    // Another user of the same organisation and model asks for more than
    // the model has left: refused, and neither its user's budget nor the
    // organisation's holds anything of it.
    let refused = c
        .reserve_cost(ReserveCost::new("ai", three("bob", "acme", "big"), 3_301))
        .await
        .expect("answered");
    assert!(!refused.granted, "the model has 3 300 left: {refused:?}");
    assert_eq!(left(b, ("user", "bob")).await, 3_000);
    assert_eq!(left(b, ("org", "acme")).await, 4_300);
    assert_eq!(left(b, ("model", "big")).await, 3_300);
}

/// 64 streams on three sidecars, each reserving a random estimate of four
/// users' budgets, one organisation's and two models', and committing a
/// random actual cost no larger: every budget's committed total stays
/// within its limit, and what each has left afterwards is exactly its
/// limit less what was committed to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_streams_on_three_sidecars_never_pass_any_budget() {
    let fleet = Fleet::start().await;
    let clients = &fleet.clients;
    const USERS: [&str; 4] = ["u0", "u1", "u2", "u3"];
    const MODELS: [&str; 2] = ["m0", "m1"];
    // What was committed to each budget, and how many were refused.
    let users: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let models: Arc<[AtomicU64; 2]> = Arc::new(Default::default());
    let org = Arc::new(AtomicU64::new(0));
    let refusals = Arc::new(AtomicU64::new(0));
    let mut streams = Vec::new();
    for stream in 0..64_u64 {
        let client = fleet.clients[stream as usize % 3].clone();
        let (users, models, org, refusals) =
            (users.clone(), models.clone(), org.clone(), refusals.clone());
        streams.push(tokio::spawn(async move {
            // A small deterministic generator per stream.
            let mut seed = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move |below: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % below
            };
            for _ in 0..12 {
                let (user, model) = (next(4) as usize, next(2) as usize);
                let estimate = 50 + next(400);
                let held = client
                    .reserve_cost(ReserveCost::new(
                        "ai",
                        three(USERS[user], "acme", MODELS[model]),
                        estimate,
                    ))
                    .await
                    .expect("answered");
                if !held.granted {
                    refusals.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                let actual = next(estimate + 1);
                held.commit(actual).await.expect("committed");
                users[user].fetch_add(actual, Ordering::SeqCst);
                models[model].fetch_add(actual, Ordering::SeqCst);
                org.fetch_add(actual, Ordering::SeqCst);
            }
        }));
    }
    for stream in streams {
        stream.await.expect("a stream");
    }
    let committed_users: Vec<u64> = users.iter().map(|u| u.load(Ordering::SeqCst)).collect();
    let committed_models: Vec<u64> = models.iter().map(|m| m.load(Ordering::SeqCst)).collect();
    let committed_org = org.load(Ordering::SeqCst);
    eprintln!(
        "committed: users {committed_users:?}, models {committed_models:?}, org {committed_org}; {} refused",
        refusals.load(Ordering::SeqCst)
    );
    // 768 requests of 250 on average against an organisation of 5 000:
    // most are refused, and the organisation is nearly spent.
    assert!(refusals.load(Ordering::SeqCst) > 0);
    assert!(
        committed_org <= 5_000 && committed_org > 2_500,
        "{committed_org}"
    );
    let client = &clients[0];
    for (user, committed) in USERS.iter().zip(&committed_users) {
        assert!(*committed <= 3_000, "{user}: {committed}");
        assert_eq!(
            left(client, ("user", user)).await,
            3_000 - committed,
            "{user}"
        );
    }
    for (model, committed) in MODELS.iter().zip(&committed_models) {
        assert!(*committed <= 4_000, "{model}: {committed}");
        assert_eq!(
            left(client, ("model", model)).await,
            4_000 - committed,
            "{model}"
        );
    }
    assert_eq!(left(client, ("org", "acme")).await, 5_000 - committed_org);
}
