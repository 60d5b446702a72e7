//! The simulator page's backend (`/ui/simulator`): one [`Simulation`] per
//! open page, on its own virtual clock, fed by the page's clicks and rates.
//!
//! Why an endpoint and not the engine in WebAssembly: the page then runs the
//! very engine build that decides for the sidecar (no second target to keep
//! equal, no bundler), and `charon simulate` and the page share one code
//! path, so the page's timeline is the CLI's. The price is a round trip per
//! batch of clicks, on the admin port of a local sidecar.
//!
//! Capacity leases (`/ui/simulator/leases`) need no session: the page sends
//! the clients' whole demand over time and gets the whole timeline back.
//!
//! Everything is bounded: at most [`MAX_OPEN`] simulations (opening one more
//! ends the idlest), each ended after [`IDLE`] without a call, at most
//! [`MAX_REQUESTS_PER_CALL`] requests and [`MAX_TICKS_PER_CALL`] ticks per
//! call (run off the async runtime), at most [`MAX_REQUESTS`] requests and a
//! week of virtual time per simulation (its memory is the engine state of one
//! domain, bounded by the requests it kept).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::simulate::{self, Closed, MAX_REQUESTS, Simulation, Source, Tick, Timeline, Totals};

/// Open simulations at most; one more ends the idlest.
pub const MAX_OPEN: usize = 16;
/// A simulation no page has called for this long is ended.
pub const IDLE: Duration = Duration::from_secs(600);
/// Requests in one call at most.
pub const MAX_REQUESTS_PER_CALL: u64 = 10_000;
/// Ticks returned by one call at most (the earlier ones had no requests).
pub const MAX_TICKS_PER_CALL: u64 = 1_000;
/// The tick when the page does not choose one.
const DEFAULT_TICK_MS: u64 = 100;
/// The longest tick (a minute: a chart of longer ones says little).
const MAX_TICK_MS: u64 = 60_000;
/// The longest domain name simulated (as the sidecar accepts).
const MAX_DOMAIN_BYTES: usize = 4_096;

/// The open simulations.
#[derive(Default)]
pub struct Simulations {
    open: Mutex<HashMap<String, Open>>,
}

struct Open {
    simulation: Arc<Mutex<Simulation>>,
    last_call: Instant,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// A `rate:` block in YAML flow style, as `charon simulate --rate`.
    rate: String,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    tick_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Started {
    id: String,
    #[serde(flatten)]
    timeline: Timeline,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Feed {
    #[serde(default)]
    requests: Vec<Requests>,
    #[serde(default)]
    until_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Requests {
    at_ms: u64,
    count: u64,
}

#[derive(Debug, Serialize)]
struct Fed {
    clock_ms: u64,
    granted: u64,
    rejected: u64,
    warned: u64,
    totals: Totals,
    ticks: Vec<Tick>,
    skipped_ticks: u64,
}

/// A refusal, as `{"error": "..."}` (the simulator's and the state view's).
pub(super) struct Refusal(pub StatusCode, pub String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

fn bad_request(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message.into())
}

impl Simulations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a simulation, ending idle ones and, at the cap, the idlest.
    fn start(&self, simulation: Simulation) -> String {
        let id = new_id();
        let now = Instant::now();
        let mut open = self.lock();
        open.retain(|_, entry| now.duration_since(entry.last_call) < IDLE);
        while open.len() >= MAX_OPEN {
            let idlest = open
                .iter()
                .min_by_key(|(_, entry)| entry.last_call)
                .map(|(id, _)| id.clone());
            match idlest {
                Some(idlest) => open.remove(&idlest),
                None => break,
            };
        }
        open.insert(
            id.clone(),
            Open {
                simulation: Arc::new(Mutex::new(simulation)),
                last_call: now,
            },
        );
        id
    }

    /// The simulation `id`, if it is still open.
    fn take(&self, id: &str) -> Result<Arc<Mutex<Simulation>>, Refusal> {
        let now = Instant::now();
        let mut open = self.lock();
        open.retain(|_, entry| now.duration_since(entry.last_call) < IDLE);
        let Some(entry) = open.get_mut(id) else {
            return Err(Refusal(
                StatusCode::NOT_FOUND,
                format!(
                    "no simulation `{id}`: it ended (after {} minutes without a call, or when more than {MAX_OPEN} were open); start a new one",
                    IDLE.as_secs() / 60
                ),
            ));
        };
        entry.last_call = now;
        Ok(entry.simulation.clone())
    }

    fn end(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        // Ids only tell pages apart; a clock-based one does as well.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos() as u64);
        bytes = nanos.to_le_bytes();
    }
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `POST /ui/simulator/sessions`.
pub async fn start(
    State(simulations): State<Arc<Simulations>>,
    body: Result<Json<Start>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(start) = match body {
        Ok(body) => body,
        Err(rejection) => return bad_request(rejection.body_text()).into_response(),
    };
    let domain = start.domain.unwrap_or_else(|| "simulated".into());
    if domain.is_empty() || domain.len() > MAX_DOMAIN_BYTES {
        return bad_request(format!(
            "the domain must be 1 to {MAX_DOMAIN_BYTES} bytes long"
        ))
        .into_response();
    }
    let tick_ms = start.tick_ms.unwrap_or(DEFAULT_TICK_MS);
    if tick_ms > MAX_TICK_MS {
        return bad_request(format!("the tick must be at most {MAX_TICK_MS} ms")).into_response();
    }
    let opened = simulate::resolve(Source::Inline(&start.rate))
        .and_then(|rate| Simulation::new(rate, &domain, tick_ms));
    match opened {
        Ok(simulation) => {
            let timeline = simulation.describe();
            let id = simulations.start(simulation);
            Json(Started { id, timeline }).into_response()
        }
        Err(message) => bad_request(message).into_response(),
    }
}

/// `POST /ui/simulator/sessions/{id}/requests`.
pub async fn feed(
    State(simulations): State<Arc<Simulations>>,
    Path(id): Path<String>,
    body: Result<Json<Feed>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(feed) = match body {
        Ok(body) => body,
        Err(rejection) => return bad_request(rejection.body_text()).into_response(),
    };
    // Up to 10 000 decisions and 11 000 read-backs: off the runtime that
    // serves the sidecar's decisions.
    let fed = tokio::task::spawn_blocking(move || run_feed(&simulations, &id, feed)).await;
    match fed {
        Ok(Ok(fed)) => Json(fed).into_response(),
        Ok(Err(refusal)) => refusal.into_response(),
        Err(_) => Refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the simulation failed; start a new one".into(),
        )
        .into_response(),
    }
}

fn run_feed(simulations: &Simulations, id: &str, feed: Feed) -> Result<Fed, Refusal> {
    if feed.requests.len() as u64 > MAX_REQUESTS_PER_CALL {
        return Err(bad_request(format!(
            "at most {MAX_REQUESTS_PER_CALL} requests per call; send them in smaller batches"
        )));
    }
    let requested = feed
        .requests
        .iter()
        .try_fold(0u64, |sum, requests| sum.checked_add(requests.count))
        .filter(|&sum| sum <= MAX_REQUESTS_PER_CALL)
        .ok_or_else(|| {
            bad_request(format!(
                "at most {MAX_REQUESTS_PER_CALL} requests per call; send them in smaller batches"
            ))
        })?;
    let simulation = simulations.take(id)?;
    let mut simulation = simulation.lock().unwrap_or_else(PoisonError::into_inner);
    // Checked before deciding anything, so a refused call changes nothing.
    let decided = simulation.totals();
    let before = decided.granted + decided.rejected;
    if before.saturating_add(requested) > MAX_REQUESTS {
        return Err(bad_request(format!(
            "a simulation decides at most {MAX_REQUESTS} requests and this one has decided {before}; start a new one"
        )));
    }
    let mut clock = simulation.clock_ms();
    for at in feed.requests.iter().map(|r| r.at_ms).chain(feed.until_ms) {
        if at < clock {
            return Err(bad_request(format!(
                "time only goes forward: {at} ms is before the simulation's clock, {clock} ms"
            )));
        }
        if at > simulate::MAX_SPAN_MS {
            return Err(bad_request(format!(
                "a simulation lasts at most {} ms of virtual time; start a new one",
                simulate::MAX_SPAN_MS
            )));
        }
        clock = at;
    }
    let mut closed = Closed::at_most(MAX_TICKS_PER_CALL);
    let mut decided = Totals::default();
    for requests in &feed.requests {
        let more = simulation
            .request(requests.at_ms, requests.count, &mut closed)
            .map_err(bad_request)?;
        decided.add(more);
    }
    if let Some(until) = feed.until_ms {
        simulation
            .advance(until, &mut closed)
            .map_err(bad_request)?;
    }
    Ok(Fed {
        clock_ms: simulation.clock_ms(),
        granted: decided.granted,
        rejected: decided.rejected,
        warned: decided.warned,
        totals: simulation.totals(),
        ticks: closed.ticks.into(),
        skipped_ticks: closed.skipped,
    })
}

/// `DELETE /ui/simulator/sessions/{id}`.
pub async fn end(
    State(simulations): State<Arc<Simulations>>,
    Path(id): Path<String>,
) -> StatusCode {
    if simulations.end(&id) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

/// Ticks the page's lease chart takes at most: a chart of more says little.
pub const MAX_LEASE_TICKS: u64 = 2_000;

/// The body of `POST /ui/simulator/leases`: the arguments of
/// `charon simulate --capacity C --clients L --duration D --tick T`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRun {
    capacity: String,
    clients: String,
    #[serde(default = "default_lease_duration")]
    duration: String,
    #[serde(default = "default_lease_tick")]
    tick: String,
}

fn default_lease_duration() -> String {
    "30s".into()
}

fn default_lease_tick() -> String {
    "1s".into()
}

/// `POST /ui/simulator/leases`: a whole capacity-lease simulation in one
/// call (it has no clicks to wait for), as `charon simulate --capacity
/// --json` prints it.
pub async fn leases(
    body: Result<Json<LeaseRun>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(run) = match body {
        Ok(body) => body,
        Err(rejection) => return bad_request(rejection.body_text()).into_response(),
    };
    // Up to 2 000 ticks of 64 clients: off the runtime that decides.
    let simulated = tokio::task::spawn_blocking(move || {
        simulate::leases::run(
            &run.capacity,
            &run.clients,
            &run.duration,
            &run.tick,
            MAX_LEASE_TICKS,
        )
    })
    .await;
    match simulated {
        Ok(Ok(timeline)) => Json(timeline).into_response(),
        Ok(Err(message)) => bad_request(message).into_response(),
        Err(_) => Refusal(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the simulation failed".into(),
        )
        .into_response(),
    }
}
