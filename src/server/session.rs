//! One Charon API session: a stream of operations, each answered at once, and
//! the session's hold set (paper §4.3.1): what it holds, per (namespace,
//! resource, domain, groups). When the stream ends, for any reason, the hold
//! set is released, one release per entry; when the sidecar resigns, the
//! session ends without releasing (its holds belong to the reaper then).
//!
//! Operations of one session run concurrently (up to [`MAX_IN_FLIGHT`]), so a
//! client can multiplex one session; each answer goes out as soon as it is
//! decided. A release takes its copies out of the hold set before it reaches
//! the store, so two releases can never give back the same copy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use crate::api::v1::error::Kind;
use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{
    ReleaseAnswer, ReleaseOp, ReserveAnswer, ReserveOp, SeizeAnswer, SeizeOp, SessionRequest,
    SessionResponse, TransferAnswer, TransferOp,
};
use crate::engine::copies::{CopyLimits, canonical_groups};
use crate::store::copies::{CopyError, CopyRef, Membership};

use super::api::{
    ApiError, Core, MAX_GROUPS, MAX_TRANSFER_TTL_MS, Target, check_name, check_names, copies_range,
    copy_context, count,
};

/// Operations of one session decided at once; past it, the session stops
/// reading until one is answered.
pub const MAX_IN_FLIGHT: usize = 64;
/// Distinct (resource, domain, groups) one session may hold.
pub const MAX_HOLDS: usize = 10_000;
/// Between attempts to release a closed session's holds while the store is
/// unreachable.
const RELEASE_RETRY: Duration = Duration::from_millis(500);

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
    fn at(&self) -> CopyRef<'_> {
        CopyRef {
            namespace: &self.namespace,
            resource: &self.resource,
            domain: &self.domain,
        }
    }
}

#[derive(Default)]
struct Holds {
    held: HashMap<HoldKey, u64>,
    /// The membership generation the holds were made under.
    generation: Option<u64>,
}

pub struct Session {
    core: Arc<Core>,
    holds: Mutex<Holds>,
}

enum End {
    /// The client closed, went away, or broke the stream.
    Client,
    Resigned,
    Shutdown,
}

impl Session {
    pub fn new(core: Arc<Core>) -> Self {
        Self {
            core,
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
        let mut membership = self.core.copies.membership();
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
        // set) before the hold set is released.
        while in_flight.next().await.is_some() {}
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
            .generation
            .is_some_and(|generation| generation != membership.generation)
    }

    /// Releases every hold, retrying while the store is unreachable, until it
    /// is done or the sidecar resigns (then the reaper does it).
    async fn release_everything(&self) {
        let (mut left, generation): (Vec<(HoldKey, u64)>, _) = {
            let mut holds = self.holds();
            (holds.held.drain().collect(), holds.generation)
        };
        let membership = self.core.copies.membership();
        while !left.is_empty() {
            let current = membership.borrow().clone();
            if generation.is_some_and(|g| g != current.generation) {
                return;
            }
            let mut failed = Vec::new();
            for (key, copies) in left {
                let result = self
                    .core
                    .copies
                    .release(&current.server_id, key.at(), &key.groups, copies, &[])
                    .await;
                if let Err(error) = result {
                    tracing::warn!(%error, namespace = key.namespace, resource = key.resource, "cannot release a closed session's hold yet");
                    failed.push((key, copies));
                }
            }
            left = failed;
            if !left.is_empty() {
                tokio::time::sleep(RELEASE_RETRY).await;
            }
        }
    }

    async fn handle(&self, request: SessionRequest) -> SessionResponse {
        let (operation, result) = match &request.op {
            None => (
                "none",
                Err(ApiError::malformed("the message names no operation")),
            ),
            Some(Op::Request(op)) => ("request", self.core.request(op).await.map(Answer::Request)),
            Some(Op::Reserve(op)) => ("reserve", self.reserve(op).await.map(Answer::Reserve)),
            Some(Op::Release(op)) => ("release", self.release(op).await.map(Answer::Release)),
            Some(Op::Transfer(op)) => ("transfer", self.transfer(op).await.map(Answer::Transfer)),
            Some(Op::Seize(op)) => ("seize", self.seize(op).await.map(Answer::Seize)),
        };
        let label = match &result {
            Ok(Answer::Request(answer)) if answer.granted == 0 => "rejected",
            Ok(Answer::Reserve(answer)) if answer.granted == 0 => "rejected",
            Ok(_) => "ok",
            Err(error) => error.kind.as_str_name(),
        };
        self.core.metrics.session_operation(operation, label);
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

    /// The membership to act under, if the sidecar serves copies now.
    fn serving(&self) -> Result<Membership, ApiError> {
        let membership = self.core.copies.membership().borrow().clone();
        if !membership.serving {
            return Err(ApiError::new(
                Kind::Resigned,
                "this sidecar is not registered in the copy log (yet): try another or retry shortly",
            ));
        }
        if self
            .holds()
            .generation
            .is_some_and(|generation| generation != membership.generation)
        {
            return Err(ApiError::new(
                Kind::Resigned,
                "this session's holds were lost when the sidecar resigned; reconnect",
            ));
        }
        Ok(membership)
    }

    fn copy_error(&self, error: CopyError) -> ApiError {
        if let CopyError::Resigned(reason) = &error {
            self.core.copies.resign(reason);
        }
        error.into()
    }

    /// Adds granted copies to the hold set.
    fn hold(&self, key: HoldKey, copies: u64, generation: u64) {
        let mut holds = self.holds();
        holds.generation.get_or_insert(generation);
        *holds.held.entry(key).or_default() += copies;
    }

    /// Takes `copies` out of the hold set, or says what is held.
    fn take(&self, key: &HoldKey, copies: u64) -> Result<(), ApiError> {
        let mut holds = self.holds();
        let held = holds.held.get(key).copied().unwrap_or(0);
        if held < copies {
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
        match self.core.target(namespace, resource) {
            Ok(Target::Copies(_, copies)) => Some(CopyLimits::for_domain(&copies, domain)),
            _ => None,
        }
    }

    async fn reserve(&self, op: &ReserveOp) -> Result<ReserveAnswer, ApiError> {
        check_names(&op.namespace, &op.resource, &op.domain)?;
        let (copies, min_copies) = copies_range(op.copies, op.min_copies)?;
        let (limits, decide_with) = match self.core.target(&op.namespace, &op.resource)? {
            Target::Copies(namespace, resource) => {
                let limits = CopyLimits::for_domain(&resource, &op.domain);
                let decide_with = if namespace.settings.ignore_configured {
                    CopyLimits::unlimited(limits.groups.clone())
                } else {
                    limits.clone()
                };
                (Some(limits), decide_with)
            }
            Target::Rate(..) => {
                return Err(ApiError::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is rate-limited: use request, not reserve",
                        op.resource
                    ),
                ));
            }
            Target::Unconfigured(_) => (None, CopyLimits::unlimited(Vec::new())),
        };
        let key = HoldKey {
            namespace: op.namespace.clone(),
            resource: op.resource.clone(),
            domain: op.domain.clone(),
            groups: canonical_groups(decide_with.group_names()),
        };
        {
            let holds = self.holds();
            if holds.held.len() >= MAX_HOLDS && !holds.held.contains_key(&key) {
                return Err(ApiError::new(
                    Kind::TooMany,
                    format!(
                        "this session already holds {MAX_HOLDS} distinct (resource, domain, groups)"
                    ),
                ));
            }
        }
        let membership = self.serving()?;
        let changed = self
            .core
            .copies
            .reserve(
                &membership.server_id,
                key.at(),
                &decide_with,
                copies,
                min_copies,
            )
            .await
            .map_err(|error| self.copy_error(error))?;
        let groups: Vec<String> = decide_with.group_names().map(str::to_owned).collect();
        if changed.copies > 0 {
            self.hold(key, changed.copies, membership.generation);
        }
        Ok(ReserveAnswer {
            granted: changed.copies,
            groups,
            retry_after_ms: (changed.copies > 0).then_some(0),
            degraded: false,
            context: Some(copy_context(limits.as_ref(), &changed.counts)),
        })
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

    async fn release(&self, op: &ReleaseOp) -> Result<ReleaseAnswer, ApiError> {
        let key = self.hold_key(&op.namespace, &op.resource, &op.domain, &op.groups)?;
        let copies = count("copies", op.copies)?;
        let membership = self.serving()?;
        self.take(&key, copies)?;
        let limits = self.limits_now(&op.namespace, &op.resource, &op.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        match self
            .core
            .copies
            .release(
                &membership.server_id,
                key.at(),
                &key.groups,
                copies,
                &now_groups,
            )
            .await
        {
            Ok(changed) => Ok(ReleaseAnswer {
                released: copies,
                context: Some(copy_context(limits.as_ref(), &changed.counts)),
            }),
            Err(error) => {
                self.untake(key, copies);
                Err(self.copy_error(error))
            }
        }
    }

    async fn transfer(&self, op: &TransferOp) -> Result<TransferAnswer, ApiError> {
        let key = self.hold_key(&op.namespace, &op.resource, &op.domain, &op.groups)?;
        let copies = count("copies", op.copies)?;
        if !(1..=MAX_TRANSFER_TTL_MS).contains(&op.ttl_ms) {
            return Err(ApiError::malformed(format!(
                "ttl_ms must be between 1 and {MAX_TRANSFER_TTL_MS}, not {}",
                op.ttl_ms
            )));
        }
        let membership = self.serving()?;
        self.take(&key, copies)?;
        match self
            .core
            .copies
            .transfer(
                &membership.server_id,
                key.at(),
                &key.groups,
                copies,
                op.ttl_ms,
            )
            .await
        {
            Ok(staged) => Ok(TransferAnswer {
                transfer_id: staged.transfer_id,
                copies: staged.changed.copies,
            }),
            Err(error) => {
                self.untake(key, copies);
                Err(self.copy_error(error))
            }
        }
    }

    async fn seize(&self, op: &SeizeOp) -> Result<SeizeAnswer, ApiError> {
        if op.transfer_id.is_empty() || op.transfer_id.len() > 2 * (32 + 2 * 4_096) {
            return Err(ApiError::new(
                Kind::UnknownTransfer,
                "no such transfer, or it has expired",
            ));
        }
        let membership = self.serving()?;
        let seized = self
            .core
            .copies
            .seize(&membership.server_id, &op.transfer_id)
            .await
            .map_err(|error| self.copy_error(error))?;
        let key = HoldKey {
            namespace: seized.namespace.clone(),
            resource: seized.resource.clone(),
            domain: seized.domain.clone(),
            groups: canonical_groups(seized.groups.iter().map(String::as_str)),
        };
        self.hold(key.clone(), seized.copies, membership.generation);
        let limits = self.limits_now(&seized.namespace, &seized.resource, &seized.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        // The context is a second read: the seize itself is already done.
        let context = match self.core.copies.counts(key.at(), &now_groups).await {
            Ok(counts) => Some(copy_context(limits.as_ref(), &counts)),
            Err(_) => None,
        };
        Ok(SeizeAnswer {
            namespace: seized.namespace,
            resource: seized.resource,
            domain: seized.domain,
            groups: seized.groups,
            copies: seized.copies,
            context,
        })
    }
}
