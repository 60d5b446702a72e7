//! Three worker processes sharing one leased capacity
//! (docs/design.md#capacity-leases). Each worker keeps a lease on
//! `jobs/backend` for domain `acme` through a sidecar, spends it locally
//! (`LeaseLimiter::try_acquire`, no network per request) and prints, every
//! second, its leased rate and what it did. Their demand shifts on a
//! schedule: worker 1 is busy throughout, worker 2 from the 5th second,
//! worker 3 only between the 10th and the 20th; watch the shares follow.
//!
//! ```text
//! charon serve --config examples/lease_workers.yaml &   # capacity 100, fair share
//! cargo run --example lease_workers                    # starts the three workers
//! ```
//!
//! With an argument (`lease_workers 2`) it runs one worker: how the parent
//! starts its children. `CHARON_URL` names the sidecar (default
//! `http://127.0.0.1:8081`), `SECONDS` the run's length (default 30).

use std::process::{Command, ExitCode};
use std::time::Duration;

use charon::client::Client;
use charon::client::lease::{FailureMode, LeaseOptions, LeaseRenewer};

/// Requests per second worker `n` would make at second `t`.
fn demand(worker: u32, t: u64) -> u64 {
    match worker {
        1 => 80,
        2 if t >= 5 => 60,
        3 if (10..20).contains(&t) => 100,
        _ => 0,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let seconds: u64 = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let Some(worker) = std::env::args().nth(1) else {
        return parent();
    };
    let Ok(worker) = worker.parse::<u32>() else {
        eprintln!("usage: lease_workers [1|2|3]");
        return ExitCode::FAILURE;
    };
    let url = std::env::var("CHARON_URL").unwrap_or_else(|_| "http://127.0.0.1:8081".into());
    let client = match Client::sidecar(&url) {
        Ok(client) => client,
        Err(error) => {
            eprintln!("CHARON_URL: {error}");
            return ExitCode::FAILURE;
        }
    };
    let limiter = LeaseRenewer::spawn(
        client,
        LeaseOptions {
            failure_mode: FailureMode::Safe,
            initial_wants: demand(worker, 0) as f64,
            ..LeaseOptions::new(format!("worker-{worker}"), "jobs", "backend", "acme")
        },
    );
    for t in 0..seconds {
        let wanted = demand(worker, t);
        let (mut done, mut refused) = (0, 0);
        let started = tokio::time::Instant::now();
        for i in 0..wanted {
            // Spread the second's requests evenly.
            tokio::time::sleep_until(started + Duration::from_secs(1) * i as u32 / wanted as u32)
                .await;
            match limiter.try_acquire(1) {
                Ok(()) => done += 1,
                Err(_) => refused += 1,
            }
        }
        tokio::time::sleep_until(started + Duration::from_secs(1)).await;
        println!(
            "t={t:>2}s worker {worker}: lease {:>6.1}/s, wanted {wanted:>3}, done {done:>3}, refused {refused:>3}",
            limiter.rate()
        );
    }
    ExitCode::SUCCESS
}

/// Starts workers 1, 2 and 3 as processes of this same program, and waits.
fn parent() -> ExitCode {
    let Ok(program) = std::env::current_exe() else {
        eprintln!("cannot find this program to start its workers");
        return ExitCode::FAILURE;
    };
    let mut children = Vec::new();
    for worker in 1..=3 {
        match Command::new(&program).arg(worker.to_string()).spawn() {
            Ok(child) => children.push(child),
            Err(error) => {
                eprintln!("cannot start worker {worker}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut ok = true;
    for mut child in children {
        ok &= child.wait().is_ok_and(|status| status.success());
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
