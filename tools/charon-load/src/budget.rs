//! `--budget`: a token budget under concurrent streams, as Envoy asks for
//! it (docs/performance.md#token-budgets-under-concurrency). Each of
//! `--concurrency` streams loops: a check (`hits_addend` 0) before its
//! request; if admitted, the request runs for a duration drawn uniformly
//! from 0.2 to 3 s, then its cost (log-normal, median 500, p95 ≈ 2 500) is
//! charged with `hits_addend` = cost; if refused, the stream waits 100 ms
//! and checks again. The run starts on a window boundary and lasts
//! `--windows` whole windows of `--budget-period`.
//!
//! With `--budget-reserve` each stream reserves its request's `max_tokens`
//! through the Charon API's `Cost` call instead of checking, and commits the
//! cost at the end; `max_tokens` is what a caller would ask for: the
//! smallest power of two (at least 256) the cost turns out to fit in. With
//! `--budget-refund` it charges `max_tokens` through Envoy's call when the
//! request starts and gives back `max_tokens − cost` (`is_negative_hits`)
//! when it ends, as examples/envoy/token-budget-exact.yaml has Envoy do.
//!
//! Per window it reports the cost charged into it against the budget
//! (overshoot), and the checks refused although the window ended with room
//! for that request's cost (undershoot). A cost counts in the window it was
//! charged in: when it ends for a check and a charge or a reservation, when
//! it starts for a charge of `max_tokens` (its refund changes only that
//! window, or nothing once it has ended).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use charon::api::v1::charon_client::CharonClient;
use charon::api::v1::{
    CostCommit, CostDescriptor, CostEntry, CostRequest, CostReserve, cost_request::Op,
};
use charon::simulate::costs::{CostDraws, max_tokens};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

/// What the streams saw, by window index.
#[derive(Default)]
struct Seen {
    /// (window, cost) of every charge, by the time it was sent.
    charges: Vec<(u64, u64)>,
    /// (window, cost the refused request would have had).
    refusals: Vec<(u64, u64)>,
    calls: u64,
    errors: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn request(domain: &str, hits: u64, refund: bool) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "generic_key".into(),
                value: "tokens".into(),
            }],
            hits_addend: Some(UInt64Value { value: hits }),
            is_negative_hits: refund,
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

fn cost_request(domain: &str, op: Op) -> CostRequest {
    CostRequest {
        namespace: domain.to_owned(),
        descriptors: vec![CostDescriptor {
            entries: vec![CostEntry {
                key: "generic_key".into(),
                value: "tokens".into(),
            }],
        }],
        op: Some(op),
    }
}

/// How the streams ask for their requests and settle them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Envoy's two calls: a check, then a charge.
    CheckThenCharge,
    /// The Charon API: reserve max_tokens, commit the cost.
    Reserve,
    /// Envoy's two calls: a charge of max_tokens, then a refund of the rest.
    Refund,
}

/// How a stream asks for its request and settles it.
enum Asker {
    /// Envoy's two calls: a check, then a charge.
    Envoy(RateLimitServiceClient<Channel>),
    /// The Charon API: reserve max_tokens, commit the cost.
    Reserve(CharonClient<Channel>),
    /// Envoy's two calls: a charge of max_tokens, then a refund of the rest.
    Refund(RateLimitServiceClient<Channel>),
}

impl Asker {
    /// For a charge of `max_tokens`: the window the charge landed in, from
    /// the answer's whole seconds to its window's end and the local times
    /// around the call (the store decided between them): only one window
    /// end fits, since the call takes far less than a window. `None` for
    /// the other ways, or an answer without a reset.
    async fn admit_in_window(
        &mut self,
        domain: &str,
        cost: u64,
        period_ms: u64,
    ) -> Result<(Option<String>, Option<u64>), ()> {
        let Asker::Refund(client) = self else {
            return Ok((self.admit(domain, cost).await?, None));
        };
        let before = unix_ms();
        let charge = request(domain, max_tokens(cost), false);
        let answer = client.should_rate_limit(charge).await.map_err(drop)?;
        let after = unix_ms();
        let answer = answer.into_inner();
        let admitted = (answer.overall_code != Code::OverLimit as i32).then(String::new);
        let window = answer
            .statuses
            .first()
            .and_then(|status| status.duration_until_reset.as_ref())
            .and_then(|reset| u64::try_from(reset.seconds).ok())
            .and_then(|reset| {
                // The window's end is in (before + (reset - 1) s, after + reset s].
                let earliest = before + reset.saturating_sub(1) * 1_000 + 1;
                let end = earliest.div_ceil(period_ms) * period_ms;
                (end <= after + reset * 1_000).then(|| end / period_ms - 1)
            });
        Ok((admitted, window))
    }

    /// Admitted (and the reservation's id), refused, or no answer.
    async fn admit(&mut self, domain: &str, cost: u64) -> Result<Option<String>, ()> {
        match self {
            Asker::Envoy(client) => {
                let answer = client.should_rate_limit(request(domain, 0, false)).await;
                let answer = answer.map_err(drop)?.into_inner();
                Ok((answer.overall_code != Code::OverLimit as i32).then(String::new))
            }
            Asker::Refund(client) => {
                let charge = request(domain, max_tokens(cost), false);
                let answer = client.should_rate_limit(charge).await;
                let answer = answer.map_err(drop)?.into_inner();
                Ok((answer.overall_code != Code::OverLimit as i32).then(String::new))
            }
            Asker::Reserve(client) => {
                let reserve = Op::Reserve(CostReserve {
                    amount: max_tokens(cost),
                    ttl_ms: 10_000,
                    release_on_expiry: false,
                });
                let answer = client.cost(cost_request(domain, reserve)).await;
                let answer = answer.map_err(drop)?.into_inner();
                Ok(answer.applied.then_some(answer.reservation_id))
            }
        }
    }

    async fn settle(&mut self, domain: &str, reservation: String, cost: u64) -> Result<(), ()> {
        match self {
            Asker::Envoy(client) => client
                .should_rate_limit(request(domain, cost, false))
                .await
                .map(drop)
                .map_err(drop),
            Asker::Refund(client) => client
                .should_rate_limit(request(domain, max_tokens(cost) - cost, true))
                .await
                .map(drop)
                .map_err(drop),
            Asker::Reserve(client) => {
                let commit = Op::Commit(CostCommit {
                    reservation_id: reservation,
                    actual: cost,
                });
                client
                    .cost(cost_request(domain, commit))
                    .await
                    .map(drop)
                    .map_err(drop)
            }
        }
    }
}

/// How the run went.
pub struct Report {
    pub lines: Vec<String>,
    pub worst_overshoot: f64,
}

/// What to run.
pub struct Run {
    pub domain: String,
    pub streams: u64,
    /// The budget per window, to report against.
    pub budget: u64,
    pub period: Duration,
    pub windows: u64,
    pub seed: u64,
    /// A request's time from admission to charge, drawn uniformly (ms).
    pub durations: (u64, u64),
    /// How long a refused stream waits before it asks again.
    pub retry: Duration,
    pub way: Way,
}

/// Runs the streams and reports per window.
pub async fn run(channels: Vec<Channel>, run: Run) -> Report {
    let Run {
        domain,
        streams,
        budget,
        period,
        windows,
        seed,
        durations,
        retry,
        way,
    } = run;
    let period_ms = period.as_millis() as u64;
    // Start on a window boundary (plus a little, clear of the edge).
    let now = unix_ms();
    let first = now / period_ms + 1;
    tokio::time::sleep(Duration::from_millis(first * period_ms - now + 20)).await;
    let last = first + windows;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for stream in 0..streams {
        let channel = channels[stream as usize % channels.len()].clone();
        let mut asker = match way {
            Way::Reserve => Asker::Reserve(CharonClient::new(channel)),
            Way::CheckThenCharge => Asker::Envoy(RateLimitServiceClient::new(channel)),
            Way::Refund => Asker::Refund(RateLimitServiceClient::new(channel)),
        };
        let (seen, domain) = (seen.clone(), domain.clone());
        let mut draws = CostDraws::new(seed ^ (stream + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        tasks.push(tokio::spawn(async move {
            while unix_ms() / period_ms < last {
                let cost = draws.cost();
                let mut window = unix_ms() / period_ms;
                let admitted = match asker.admit_in_window(&domain, cost, period_ms).await {
                    Ok((admitted, landed)) => {
                        if let Some(landed) = landed {
                            window = landed;
                        }
                        admitted
                    }
                    Err(()) => {
                        lock(&seen).errors += 1;
                        tokio::time::sleep(retry).await;
                        continue;
                    }
                };
                lock(&seen).calls += 1;
                let Some(reservation) = admitted else {
                    lock(&seen).refusals.push((window, cost));
                    tokio::time::sleep(retry).await;
                    continue;
                };
                let took = if durations == (200, 3_000) {
                    // The benchmark's draws, as its published figures were made.
                    draws.duration_ms()
                } else {
                    durations.0 + (draws.unit() * (durations.1 - durations.0) as f64) as u64
                };
                tokio::time::sleep(Duration::from_millis(took)).await;
                // A charge of max_tokens stays in the window it was made in.
                let window = if way == Way::Refund {
                    window
                } else {
                    unix_ms() / period_ms
                };
                let charged = asker.settle(&domain, reservation, cost).await;
                let mut seen = lock(&seen);
                seen.calls += 1;
                match charged {
                    Ok(_) => seen.charges.push((window, cost)),
                    Err(_) => seen.errors += 1,
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let seen = lock(&seen);
    let mut lines = Vec::new();
    let mut worst_overshoot = f64::MIN;
    for window in first..last {
        let charged: u64 = seen
            .charges
            .iter()
            .filter(|(w, _)| *w == window)
            .map(|(_, cost)| cost)
            .sum();
        let requests = seen.charges.iter().filter(|(w, _)| *w == window).count();
        let refused = seen.refusals.iter().filter(|(w, _)| *w == window).count();
        let refused_with_room = seen
            .refusals
            .iter()
            .filter(|(w, cost)| *w == window && charged + cost <= budget)
            .count();
        let overshoot = (charged as f64 - budget as f64) / budget as f64 * 100.0;
        worst_overshoot = worst_overshoot.max(overshoot);
        lines.push(format!(
            "window {}: charged {charged} of {budget} ({overshoot:+.1}%), {requests} requests charged, {refused} checks refused, {refused_with_room} of them with room left",
            window - first + 1
        ));
    }
    let mut overshoots: Vec<f64> = (first..last)
        .map(|window| {
            let charged: u64 = seen
                .charges
                .iter()
                .filter(|(w, _)| *w == window)
                .map(|(_, cost)| cost)
                .sum();
            (charged as f64 - budget as f64) / budget as f64 * 100.0
        })
        .collect();
    overshoots.sort_by(f64::total_cmp);
    if let Some(&worst) = overshoots.last() {
        let p90 = overshoots[(overshoots.len() * 9 / 10).min(overshoots.len() - 1)];
        let mean = overshoots.iter().sum::<f64>() / overshoots.len() as f64;
        lines.push(format!(
            "{} windows: overshoot mean {mean:+.1}%, p90 {p90:+.1}%, worst {worst:+.1}%",
            overshoots.len()
        ));
    }
    lines.push(format!(
        "calls {} in {elapsed:.1} s ({:.0} decisions/s), errors {}",
        seen.calls,
        seen.calls as f64 / elapsed,
        seen.errors
    ));
    Report {
        lines,
        worst_overshoot,
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
