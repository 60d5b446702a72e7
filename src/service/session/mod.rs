//! One Charon API session: a stream of operations, each answered at once, and
//! the session's hold set (docs/design.md#hold-sets): what it holds, per
//! (namespace, resource, domain, groups). When the stream ends, for any
//! reason, the hold set is released, one release per entry; when the sidecar
//! resigns, the session ends without releasing (its holds belong to the
//! reaper then).
//!
//! Operations of one session run concurrently (up to [`MAX_IN_FLIGHT`]), so a
//! client can multiplex one session; each answer goes out as soon as it is
//! decided. A release takes its copies out of the hold set before it reaches
//! the store, so two releases can never give back the same copy.

mod release;
mod reserve;
mod seize;
mod transfer;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use crate::api::v1::error::Kind;
use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{SessionRequest, SessionResponse};
use crate::clock::{Clock, SystemClock};
use crate::engine::copies::{CopyLimits, canonical_groups};
use crate::store::ResourceRef;
use crate::store::copies::{Contributor, CopyError, Membership};
use crate::watch::Recent;

use crate::service::Service;
use crate::service::core::{ApiError, MAX_GROUPS, Target, check_name, check_names};

/// Operations of one session decided at once; past it, the session stops
/// reading until one is answered.
pub const MAX_IN_FLIGHT: usize = 64;
/// Distinct (resource, domain, groups) one session may hold.
pub const MAX_HOLDS: usize = 10_000;
/// Between attempts to release a closed session's holds while the store is
/// unreachable.
const RELEASE_RETRY: Duration = Duration::from_millis(500);

/// Numbers sessions within the process: with the sidecar's id, the name of
/// a session's contribution in the copy log.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// What a hold is counted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct HoldKey {
    namespace: String,
    resource: String,
    domain: String,
    /// Sorted: a release may name them in any order.
    groups: Vec<String>,
}

impl HoldKey {
    fn at(&self) -> ResourceRef<'_> {
        ResourceRef {
            namespace: &self.namespace,
            resource: &self.resource,
            domain: &self.domain,
        }
    }
}

#[derive(Default)]
struct Holds {
    held: HashMap<HoldKey, u64>,
    /// The membership of the session's first copy operation: all of them
    /// are made under it, and it under one sidecar id.
    bound: Option<Membership>,
    /// Every (namespace, resource) a copy operation was sent for: at the
    /// end, the session's contribution to each is dropped whole.
    touched: HashSet<(String, String)>,
}

pub struct Session {
    service: Arc<Service>,
    number: u64,
    holds: Mutex<Holds>,
}

enum End {
    /// The client closed, went away, or broke the stream.
    Client,
    Resigned,
    Shutdown,
}

impl Session {
    pub fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            number: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            holds: Mutex::new(Holds::default()),
        }
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        self.holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn run(
        self,
        mut inbound: Streaming<SessionRequest>,
        outbound: mpsc::Sender<Result<SessionResponse, Status>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut membership = self.service.copies.membership();
        let mut membership_open = true;
        let mut in_flight = FuturesUnordered::new();
        let mut reading = true;
        let end = loop {
            tokio::select! {
                message = inbound.message(), if reading && in_flight.len() < MAX_IN_FLIGHT => match message {
                    Ok(Some(request)) => in_flight.push(self.handle(request)),
                    // Half-closed: answer what is in flight, then end.
                    Ok(None) | Err(_) => {
                        reading = false;
                        if in_flight.is_empty() {
                            break End::Client;
                        }
                    }
                },
                Some(response) = in_flight.next() => {
                    if outbound.send(Ok(response)).await.is_err() {
                        break End::Client;
                    }
                    if !reading && in_flight.is_empty() {
                        break End::Client;
                    }
                    if self.lost_holds(&membership.borrow()) {
                        break End::Resigned;
                    }
                }
                changed = membership.changed(), if membership_open => {
                    membership_open = changed.is_ok();
                    if self.lost_holds(&membership.borrow_and_update()) {
                        break End::Resigned;
                    }
                }
                _ = shutdown.changed() => break End::Shutdown,
                () = outbound.closed() => break End::Client,
            }
        };
        // Operations already sent to the store finish (and land in the hold
        // set) before the hold set is released; their answers still go out
        // if the client listens (one answer per message).
        while let Some(response) = in_flight.next().await {
            let _ = outbound.send(Ok(response)).await;
        }
        drop(in_flight);
        match end {
            End::Resigned => {
                let _ = outbound
                    .send(Err(Status::unavailable(
                        "this sidecar resigned from the copy log: its holds are released by the others; reconnect",
                    )))
                    .await;
            }
            End::Shutdown => {
                let _ = outbound
                    .send(Err(Status::unavailable(
                        "this sidecar is shutting down: reconnect",
                    )))
                    .await;
                self.release_everything().await;
            }
            End::Client => self.release_everything().await,
        }
    }

    /// Whether the sidecar resigned since this session's holds were made.
    fn lost_holds(&self, membership: &Membership) -> bool {
        self.holds()
            .bound
            .as_ref()
            .is_some_and(|bound| bound.generation != membership.generation)
    }

    fn contributor<'m>(&self, membership: &'m Membership) -> Contributor<'m> {
        Contributor {
            server: &membership.server_id,
            session: self.number,
        }
    }

    /// Gives back everything the session holds, retrying while the store is
    /// unreachable, until it is done or the sidecar resigns (then the reaper
    /// does it).
    pub(crate) async fn release_everything(&self) {
        let (held, touched, bound) = {
            let mut holds = self.holds();
            let held: Vec<(HoldKey, u64)> = holds.held.drain().collect();
            let touched: Vec<(String, String)> = holds.touched.drain().collect();
            (held, touched, holds.bound.clone())
        };
        let Some(bound) = bound else {
            return;
        };
        let membership = self.service.copies.membership();
        loop {
            if membership.borrow().generation != bound.generation {
                return;
            }
            let held: Vec<(ResourceRef<'_>, &[String], u64)> = held
                .iter()
                .map(|(key, copies)| (key.at(), key.groups.as_slice(), *copies))
                .collect();
            let touched: Vec<(&str, &str)> = touched
                .iter()
                .map(|(namespace, resource)| (namespace.as_str(), resource.as_str()))
                .collect();
            match self
                .service
                .copies
                .end_session(self.contributor(&bound), &held, &touched)
                .await
            {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(%error, "cannot release a closed session's holds yet; retrying");
                    tokio::time::sleep(RELEASE_RETRY).await;
                }
            }
        }
    }

    pub(crate) async fn handle(&self, request: SessionRequest) -> SessionResponse {
        let (operation, result) = match &request.op {
            None => (
                "none",
                Err(ApiError::malformed("the message names no operation")),
            ),
            Some(Op::Request(op)) => (
                "request",
                self.service.request(op).await.map(Answer::Request),
            ),
            // Copy operations are boxed so that the future of a `request`
            // (the hot path) stays small.
            Some(Op::Reserve(op)) => (
                "reserve",
                Box::pin(self.reserve(op)).await.map(Answer::Reserve),
            ),
            Some(Op::Release(op)) => (
                "release",
                Box::pin(self.release(op)).await.map(Answer::Release),
            ),
            Some(Op::Transfer(op)) => (
                "transfer",
                Box::pin(self.transfer(op)).await.map(Answer::Transfer),
            ),
            Some(Op::Seize(op)) => ("seize", Box::pin(self.seize(op)).await.map(Answer::Seize)),
        };
        let label = match &result {
            Ok(Answer::Request(answer)) if answer.granted == 0 => "rejected",
            Ok(Answer::Reserve(answer)) if answer.granted == 0 => "rejected",
            Ok(_) => "ok",
            Err(error) => error.kind.as_str_name(),
        };
        self.service.observer.copy_operation(operation, label);
        if let (Some(op), Ok(answer)) = (&request.op, &result) {
            self.record_copy_operation(op, answer);
        }
        if let Err(error) = &result
            && error.kind == Kind::Internal
        {
            tracing::error!(message = error.message, "a Charon API operation failed");
        }
        SessionResponse {
            id: request.id,
            result: Some(result.unwrap_or_else(|error| Answer::Error(error.into_wire()))),
        }
    }

    /// Copy operations, for the state view's watches.
    fn record_copy_operation(&self, op: &Op, answer: &Answer) {
        let watch = self.service.limiter.watch();
        let recent = |op: &'static str, granted: bool, copies: u64| {
            move || Recent {
                at_ms: SystemClock.now_ms(),
                op,
                granted,
                copies,
                tier: 0,
            }
        };
        match (op, answer) {
            (Op::Reserve(op), Answer::Reserve(answer)) => {
                let asked = op.copies.map_or(1, |copies| copies.max(1).unsigned_abs());
                let copies = if answer.granted > 0 {
                    answer.granted
                } else {
                    asked
                };
                let decision = recent("reserve", answer.granted > 0, copies);
                watch.record(&op.namespace, &op.resource, &op.domain, decision);
            }
            (Op::Release(op), Answer::Release(answer)) => {
                let decision = recent("release", true, answer.released);
                watch.record(&op.namespace, &op.resource, &op.domain, decision);
            }
            (Op::Transfer(op), Answer::Transfer(answer)) => {
                let decision = recent("transfer", true, answer.copies);
                watch.record(&op.namespace, &op.resource, &op.domain, decision);
            }
            (Op::Seize(_), Answer::Seize(answer)) => {
                let decision = recent("seize", true, answer.copies);
                watch.record(
                    &answer.namespace,
                    &answer.resource,
                    &answer.domain,
                    decision,
                );
            }
            _ => {}
        }
    }

    /// The membership to change `namespace`/`resource` under, if the sidecar
    /// serves copies now: the session's first copy operation binds it to the
    /// membership of the moment; later ones must find the same.
    fn serving(&self, namespace: &str, resource: &str) -> Result<Membership, ApiError> {
        let current = self.service.copies.membership().borrow().clone();
        if !current.serving {
            return Err(ApiError::new(
                Kind::Resigned,
                "this sidecar is not registered in the copy log (yet): try another or retry shortly",
            ));
        }
        let mut holds = self.holds();
        let bound = holds.bound.get_or_insert_with(|| current.clone());
        if bound.generation != current.generation {
            return Err(ApiError::new(
                Kind::Resigned,
                "this session's holds were lost when the sidecar resigned; reconnect",
            ));
        }
        let bound = bound.clone();
        let touched = (namespace.to_owned(), resource.to_owned());
        if !holds.touched.contains(&touched) {
            holds.touched.insert(touched);
        }
        Ok(bound)
    }

    fn copy_error(&self, membership: &Membership, error: CopyError) -> ApiError {
        if let CopyError::Resigned(reason) = &error {
            self.service.copies.resign(&membership.server_id, reason);
        }
        error.into()
    }

    /// Adds granted copies to the hold set.
    fn hold(&self, key: HoldKey, copies: u64) {
        *self.holds().held.entry(key).or_default() += copies;
    }

    /// A clearer error than NOT_HELD when nothing could ever be held there.
    fn not_holdable(&self, namespace: &str, resource: &str) -> Option<ApiError> {
        match self.service.target(namespace, resource) {
            Ok(Target::Rate(..)) => Some(ApiError::new(
                Kind::WrongKind,
                format!("resource `{resource}` is rate-limited: nothing to release or transfer"),
            )),
            Err(error) => Some(error),
            Ok(_) => None,
        }
    }

    /// Takes `copies` out of the hold set, or says what is held.
    fn take(&self, key: &HoldKey, copies: u64) -> Result<(), ApiError> {
        let mut holds = self.holds();
        let held = holds.held.get(key).copied().unwrap_or(0);
        if held < copies {
            if held == 0
                && let Some(error) = self.not_holdable(&key.namespace, &key.resource)
            {
                return Err(error);
            }
            return Err(ApiError::new(
                Kind::NotHeld,
                format!(
                    "this session holds {held} copies of `{}` for domain `{}` in groups {:?}, not {copies}",
                    key.resource, key.domain, key.groups
                ),
            ));
        }
        if held == copies {
            holds.held.remove(key);
        } else {
            holds.held.insert(key.clone(), held - copies);
        }
        Ok(())
    }

    fn untake(&self, key: HoldKey, copies: u64) {
        *self.holds().held.entry(key).or_default() += copies;
    }

    /// The configured limits of a copy-limited resource for a domain, if it
    /// still is one.
    fn limits_now(&self, namespace: &str, resource: &str, domain: &str) -> Option<CopyLimits> {
        match self.service.target(namespace, resource) {
            Ok(Target::Copies(_, copies)) => Some(CopyLimits::for_domain(&copies, domain)),
            _ => None,
        }
    }

    fn hold_key(
        &self,
        namespace: &str,
        resource: &str,
        domain: &str,
        groups: &[String],
    ) -> Result<HoldKey, ApiError> {
        check_names(namespace, resource, domain)?;
        if groups.len() > MAX_GROUPS {
            return Err(ApiError::malformed(format!(
                "more than {MAX_GROUPS} groups"
            )));
        }
        for group in groups {
            check_name("a group name", group)?;
        }
        let sorted = canonical_groups(groups.iter().map(String::as_str));
        if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(ApiError::malformed("a group is named twice"));
        }
        Ok(HoldKey {
            namespace: namespace.to_owned(),
            resource: resource.to_owned(),
            domain: domain.to_owned(),
            groups: sorted,
        })
    }
}
