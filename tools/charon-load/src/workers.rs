//! The workers: which tenant each request names, and the loops that keep
//! requests in flight against the Envoy service or the Charon API.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{Args, Pick};
use crate::tally::Tally;

/// splitmix64: a small, fast, well-mixed generator; quality is plenty for
/// picking tenants.
pub(crate) struct SplitMix(u64);

impl SplitMix {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: bias is at most n / 2^64, nothing at these sizes.
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

pub(crate) struct Plan {
    pub(crate) args: Args,
    /// Precomputed descriptor values, so the client spends its time sending.
    pub(crate) values: Vec<String>,
    pub(crate) round_robin: AtomicU64,
}

impl Plan {
    pub(crate) fn tenant(&self, rng: &mut SplitMix) -> usize {
        if self.args.hot {
            return 0;
        }
        let n = self.values.len() as u64;
        let index = match self.args.pick {
            Pick::Uniform => rng.below(n),
            Pick::RoundRobin => self.round_robin.fetch_add(1, Ordering::Relaxed) % n,
        };
        // index < values.len(), which is a usize.
        index as usize
    }

    pub(crate) fn request(&self, tenant: usize) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.args.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: self.args.key.clone(),
                    value: self.values[tenant].clone(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        }
    }
}

pub(crate) async fn worker(
    plan: Arc<Plan>,
    channel: Channel,
    seed: u64,
    deadline: tokio::time::Instant,
) -> Tally {
    let mut client = RateLimitServiceClient::new(channel);
    let mut rng = SplitMix(seed);
    let mut tally = Tally::default();
    let timeout = plan.args.timeout;
    while tokio::time::Instant::now() < deadline {
        let request = plan.request(plan.tenant(&mut rng));
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, client.should_rate_limit(request)).await;
        tally
            .latencies
            .push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        match answer {
            Ok(Ok(response)) => match Code::try_from(response.get_ref().overall_code) {
                Ok(Code::Ok) => tally.ok += 1,
                Ok(Code::OverLimit) => tally.over_limit += 1,
                _ => tally.other += 1,
            },
            Ok(Err(status)) => tally.error(format!("{:?}", status.code())),
            Err(_) => tally.error("Timeout".to_owned()),
        }
    }
    tally
}

/// Sends `per_second` requests a second on schedule until `deadline`, each
/// in its own task, however many are still unanswered; latency runs from
/// each request's scheduled instant. Then waits for the stragglers (each
/// bounded by --timeout).
pub(crate) async fn paced_worker(
    plan: Arc<Plan>,
    channel: Channel,
    seed: u64,
    deadline: tokio::time::Instant,
    per_second: f64,
) -> Tally {
    let client = RateLimitServiceClient::new(channel);
    let mut rng = SplitMix(seed);
    let timeout = plan.args.timeout;
    let period = std::time::Duration::from_secs_f64(1.0 / per_second.max(1e-3));
    let mut ticks = tokio::time::interval(period);
    // Ticks missed while the runtime was busy are sent at once: the rate
    // holds on average, as an open-loop load must.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut in_flight = tokio::task::JoinSet::new();
    let mut tally = Tally::default();
    loop {
        let scheduled = ticks.tick().await;
        if scheduled >= deadline {
            break;
        }
        while let Some(done) = in_flight.try_join_next() {
            record(&mut tally, done);
        }
        let request = plan.request(plan.tenant(&mut rng));
        let mut client = client.clone();
        in_flight.spawn(async move {
            let answer = tokio::time::timeout(timeout, client.should_rate_limit(request)).await;
            let took = u64::try_from(scheduled.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let code = match answer {
                Ok(Ok(response)) => Ok(response.get_ref().overall_code),
                Ok(Err(status)) => Err(format!("{:?}", status.code())),
                Err(_) => Err("Timeout".to_owned()),
            };
            (took, code)
        });
    }
    while let Some(done) = in_flight.join_next().await {
        record(&mut tally, done);
    }
    tally
}

type Sent = (u64, Result<i32, String>);

fn record(tally: &mut Tally, done: Result<Sent, tokio::task::JoinError>) {
    match done {
        Ok((took, code)) => {
            tally.latencies.push(took);
            match code {
                Ok(code) => match Code::try_from(code) {
                    Ok(Code::Ok) => tally.ok += 1,
                    Ok(Code::OverLimit) => tally.over_limit += 1,
                    _ => tally.other += 1,
                },
                Err(what) => tally.error(what),
            }
        }
        Err(error) => tally.error(format!("task: {error}")),
    }
}

/// One session looping on reserve + release of one copy.
pub(crate) async fn copies_worker(
    plan: Arc<Plan>,
    channel: Channel,
    seed: u64,
    deadline: tokio::time::Instant,
) -> Tally {
    use charon::api::v1::charon_client::CharonClient;
    use charon::api::v1::session_request::Op;
    use charon::api::v1::session_response::Result as Answer;
    use charon::api::v1::{ReleaseOp, ReserveOp, SessionRequest};

    let mut tally = Tally::default();
    let resource = plan.args.copies.clone().unwrap_or_default();
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    let mut client = CharonClient::new(channel);
    let mut answers = match client
        .session(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
    {
        Ok(stream) => stream.into_inner(),
        Err(status) => {
            tally.error(format!("session: {:?}", status.code()));
            return tally;
        }
    };
    let mut rng = SplitMix(seed);
    let mut id = 0u64;
    let timeout = plan.args.timeout;
    let mut call = async |op: Op| -> Result<Answer, String> {
        id += 1;
        sender
            .send(SessionRequest { id, op: Some(op) })
            .await
            .map_err(|_| "SessionClosed".to_owned())?;
        match tokio::time::timeout(timeout, answers.message()).await {
            Ok(Ok(Some(response))) => response.result.ok_or_else(|| "Empty".to_owned()),
            Ok(Ok(None)) => Err("SessionEnded".to_owned()),
            Ok(Err(status)) => Err(format!("{:?}", status.code())),
            Err(_) => Err("Timeout".to_owned()),
        }
    };
    while tokio::time::Instant::now() < deadline {
        let domain = plan.values[plan.tenant(&mut rng)].clone();
        let started = Instant::now();
        let reserved = call(Op::Reserve(ReserveOp {
            namespace: plan.args.domain.clone(),
            resource: resource.clone(),
            domain: domain.clone(),
            copies: Some(1),
            min_copies: Some(1),
            ..ReserveOp::default()
        }))
        .await;
        let outcome = match reserved {
            Ok(Answer::Reserve(answer)) if answer.granted == 1 => {
                match call(Op::Release(ReleaseOp {
                    namespace: plan.args.domain.clone(),
                    resource: resource.clone(),
                    domain,
                    copies: 1,
                    groups: answer.groups,
                    done: None,
                }))
                .await
                {
                    Ok(Answer::Release(_)) => Ok(true),
                    Ok(other) => Err(format!("release: {other:?}")),
                    Err(error) => Err(error),
                }
            }
            Ok(Answer::Reserve(_)) => Ok(false),
            Ok(Answer::Error(error)) => Err(format!("reserve: {}", error.message)),
            Ok(other) => Err(format!("reserve: {other:?}")),
            Err(error) => Err(error),
        };
        tally
            .latencies
            .push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
        match outcome {
            Ok(true) => tally.ok += 1,
            Ok(false) => tally.over_limit += 1,
            Err(error) => {
                tally.error(error);
                if tally.error_count() > 100 {
                    break;
                }
            }
        }
    }
    tally
}
