//! One Charon API session: a stream of operations, each answered at once, and
//! the session's hold set (docs/design.md#hold-sets): what it holds, per
//! (namespace, resource, domain, groups). When the stream ends, for any
//! reason, the hold set is released, one release per entry; when the sidecar
//! resigns, the session ends without releasing (its holds belong to the
//! reaper then).
//!
//! Operations of one session may run concurrently, so a client can
//! multiplex one session; each answer goes out as soon as it is decided. A
//! release takes its copies out of the hold set before it reaches the store,
//! so two releases can never give back the same copy.

mod release;
mod reserve;
mod seize;
mod transfer;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;

use crate::engine::copies::CopyLimits;
use crate::state_view::Recent;
use crate::store::ResourceRef;
use crate::store::copies::{Contributor, CopyError, Membership};

use super::Service;
use super::core::Target;
use super::error::{Error, Kind};
use super::ops::{Answer, Held, Operation};

/// Distinct (resource, domain, groups) one session may hold.
pub const MAX_HOLDS: usize = 10_000;
/// Between attempts to release a closed session's holds while the store is
/// unreachable.
const RELEASE_RETRY: Duration = Duration::from_millis(500);

/// Numbers sessions within the process: with the sidecar's id, the name of
/// a session's contribution in the copy log.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

#[derive(Default)]
struct Holds {
    /// Copies held per (resource, domain, sorted groups).
    held: HashMap<Held, u64>,
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
    /// Set when the session's client is gone: its waits end at once.
    ended: watch::Sender<bool>,
}

impl Session {
    pub fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            number: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            holds: Mutex::new(Holds::default()),
            ended: watch::Sender::new(false),
        }
    }

    /// The session's client is gone (its stream was cancelled, its
    /// connection closed) or the sidecar ends it: every reserve still
    /// waiting leaves its queue now, granted nothing, so the copies go to
    /// the next live waiter. Operations already at the store finish; what
    /// they grant is released with the rest of the hold set.
    pub fn end(&self) {
        self.ended.send_replace(true);
    }

    fn has_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Until [`Self::end`].
    async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        // The sender lives as long as the session, so this only returns
        // once the session ended.
        let _ = ended.wait_for(|ended| *ended).await;
    }

    fn ended_error(&self) -> Error {
        Error::new(
            Kind::Cancelled,
            "the session ended while this reserve waited: nothing was granted",
        )
    }

    fn holds(&self) -> MutexGuard<'_, Holds> {
        self.holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The copy log's membership, which a session's holds are bound to.
    pub fn membership(&self) -> watch::Receiver<Membership> {
        self.service.copies.membership()
    }

    /// Whether the sidecar resigned since this session's holds were made
    /// (then they are the reaper's, and the session must end).
    pub fn lost_holds(&self, membership: &Membership) -> bool {
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
    pub async fn release_everything(&self) {
        let (held, touched, bound) = {
            let mut holds = self.holds();
            let held: Vec<(Held, u64)> = holds.held.drain().collect();
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
                .map(|(key, copies)| (key.at.at(), key.groups.as_slice(), *copies))
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
                Ok(()) => {
                    for (namespace, resource) in &touched {
                        self.service.waiting.released(namespace, resource);
                    }
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot release a closed session's holds yet; retrying");
                    tokio::time::sleep(RELEASE_RETRY).await;
                }
            }
        }
    }

    /// Answers one operation, counts it, and records it for the state view.
    pub async fn handle(&self, op: Operation) -> Result<Answer, Error> {
        let operation = op.name();
        let result = match &op {
            Operation::Request(request) => self.service.request(request).await.map(Answer::Request),
            // Copy operations are boxed so that the future of a `request`
            // (the hot path) stays small.
            Operation::Reserve(reserve) => {
                Box::pin(self.reserve(reserve)).await.map(Answer::Reserve)
            }
            Operation::Release(release) => {
                Box::pin(self.release(release)).await.map(Answer::Release)
            }
            Operation::Transfer(transfer) => Box::pin(self.transfer(transfer))
                .await
                .map(Answer::Transfer),
            Operation::Seize(seize) => Box::pin(self.seize(seize)).await.map(Answer::Seize),
        };
        let outcome = outcome_label(&result);
        self.service.observer.copy_operation(operation, outcome);
        self.service
            .observer
            .operation(&operation_event(operation, &op, &result, outcome));
        if let Ok(answer) = &result {
            self.record_copy_operation(&op, answer);
        }
        if let Err(error) = &result
            && error.kind == Kind::Internal
        {
            tracing::error!(message = error.message, "a Charon API operation failed");
        }
        result
    }

    /// Counts an operation the face could not even parse (`operation` is
    /// its name, `none` when the message names none), as [`Self::handle`]
    /// counts the others; returns the error to answer with.
    pub fn refused(&self, operation: &'static str, error: Error) -> Error {
        self.service
            .observer
            .copy_operation(operation, error.kind.as_str());
        error
    }

    /// Copy operations, for the state view's watches.
    fn record_copy_operation(&self, op: &Operation, answer: &Answer) {
        let watch = self.service.limiter.watch();
        let recent = |op: &'static str, granted: bool, copies: u64| {
            move || Recent {
                at_ms: self.service.clock.now_ms(),
                op,
                granted,
                copies,
                tier: 0,
            }
        };
        let (at, decision) = match (op, answer) {
            (Operation::Reserve(op), Answer::Reserve(answer)) => {
                let copies = if answer.granted > 0 {
                    answer.granted
                } else {
                    op.copies
                };
                (&op.at, recent("reserve", answer.granted > 0, copies))
            }
            (Operation::Release(op), Answer::Release(answer)) => {
                (&op.held.at, recent("release", true, answer.released))
            }
            (Operation::Transfer(op), Answer::Transfer(answer)) => {
                (&op.held.at, recent("transfer", true, answer.copies))
            }
            (Operation::Seize(_), Answer::Seize(answer)) => {
                (&answer.at, recent("seize", true, answer.copies))
            }
            _ => return,
        };
        watch.record(&at.namespace, &at.resource, &at.domain, decision);
    }

    /// The membership to change `namespace`/`resource` under, if the sidecar
    /// serves copies now: the session's first copy operation binds it to the
    /// membership of the moment; later ones must find the same.
    fn serving(&self, namespace: &str, resource: &str) -> Result<Membership, Error> {
        let current = self.service.copies.membership().borrow().clone();
        if !current.serving {
            return Err(Error::new(
                Kind::Resigned,
                "this sidecar is not registered in the copy log (yet): try another or retry shortly",
            ));
        }
        let mut holds = self.holds();
        let bound = holds.bound.get_or_insert_with(|| current.clone());
        if bound.generation != current.generation {
            return Err(Error::new(
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

    fn copy_error(&self, membership: &Membership, error: CopyError) -> Error {
        if let CopyError::Resigned(reason) = &error {
            self.service.copies.resign(&membership.server_id, reason);
        }
        error.into()
    }

    /// Adds granted copies to the hold set.
    fn hold(&self, key: Held, copies: u64) {
        *self.holds().held.entry(key).or_default() += copies;
    }

    /// A clearer error than NOT_HELD when nothing could ever be held there.
    fn not_holdable(&self, namespace: &str, resource: &str) -> Option<Error> {
        match self.service.target(namespace, resource) {
            Ok(Target::Rate(..)) => Some(Error::new(
                Kind::WrongKind,
                format!("resource `{resource}` is rate-limited: nothing to release or transfer"),
            )),
            Err(error) => Some(error),
            Ok(_) => None,
        }
    }

    /// Takes `copies` out of the hold set, or says what is held.
    fn take(&self, key: &Held, copies: u64) -> Result<(), Error> {
        let mut holds = self.holds();
        let held = holds.held.get(key).copied().unwrap_or(0);
        if held < copies {
            if held == 0
                && let Some(error) = self.not_holdable(&key.at.namespace, &key.at.resource)
            {
                return Err(error);
            }
            return Err(Error::new(
                Kind::NotHeld,
                format!(
                    "this session holds {held} copies of `{}` for domain `{}` in groups {:?}, not {copies}",
                    key.at.resource, key.at.domain, key.groups
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

    fn untake(&self, key: Held, copies: u64) {
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
}

/// How an operation ended, as the metrics label it.
/// What [`Observer::operation`](crate::service::Observer::operation) is
/// told of an answered operation.
fn operation_event<'a>(
    operation: &'static str,
    op: &'a Operation,
    result: &'a Result<Answer, Error>,
    outcome: &'static str,
) -> crate::service::OperationEvent<'a> {
    let at = match (op, result) {
        (Operation::Request(op), _) => Some(&op.at),
        (Operation::Reserve(op), _) => Some(&op.at),
        (Operation::Release(op), _) => Some(&op.held.at),
        (Operation::Transfer(op), _) => Some(&op.held.at),
        (Operation::Seize(_), Ok(Answer::Seize(answer))) => Some(&answer.at),
        (Operation::Seize(_), _) => None,
    };
    let amount = match result {
        Ok(Answer::Request(answer)) => answer.granted,
        Ok(Answer::Reserve(answer)) => answer.granted,
        Ok(Answer::Release(answer)) => answer.released,
        Ok(Answer::Transfer(answer)) => answer.copies,
        Ok(Answer::Seize(answer)) => answer.copies,
        Err(_) => 0,
    };
    crate::service::OperationEvent {
        operation,
        namespace: at.map_or("", |at| at.namespace.as_str()),
        resource: at.map_or("", |at| at.resource.as_str()),
        domain: at.map_or("", |at| at.domain.as_str()),
        outcome,
        amount,
    }
}

fn outcome_label(result: &Result<Answer, Error>) -> &'static str {
    match result {
        Ok(Answer::Request(answer)) if answer.granted == 0 => "rejected",
        Ok(Answer::Reserve(answer)) if answer.done => "done",
        Ok(Answer::Reserve(answer)) if answer.granted == 0 => "rejected",
        Ok(_) => "ok",
        Err(error) => error.kind.as_str(),
    }
}
