//! Hold guards (docs/design.md#hold-guards): the copies a reserve or seize
//! granted, held until released, transferred, or the guard is dropped — then
//! what is left goes back by itself. And the multi-resource pattern
//! (docs/design.md#multi-resource-acquire), which composes holds and one
//! final rate request.

use std::time::{Duration, Instant};

use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{CopyContext, ReleaseOp, ReserveAnswer, ReserveOp, SeizeAnswer, TransferOp};

use super::{Client, ClientError, RateAnswer};

/// Copies held by this client's session; what is left is released when it
/// is dropped (from a task on the current Tokio runtime).
#[must_use = "dropping a hold releases its copies at once"]
pub struct Hold {
    client: Client,
    namespace: String,
    resource: String,
    domain: String,
    groups: Vec<String>,
    /// Copies held now (as this guard sees it).
    held: u64,
    /// The session the copies belong to; `None` when the server holds
    /// nothing for this guard (degraded, overridden, rejected).
    session: Option<u64>,
    granted: u64,
    degraded: bool,
    unanswered: bool,
    overridden: bool,
    context: CopyContext,
    waited: Duration,
    /// Waiting for anyone's result, another holder released as done.
    done: bool,
    /// Reserved for anyone's result: the caller does the work others wait
    /// for.
    for_anyone: bool,
    /// Released as done when dropped (the work succeeded).
    done_on_drop: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("namespace", &self.namespace)
            .field("resource", &self.resource)
            .field("domain", &self.domain)
            .field("groups", &self.groups)
            .field("held", &self.held)
            .field("granted", &self.granted)
            .field("degraded", &self.degraded)
            .field("overridden", &self.overridden)
            .finish_non_exhaustive()
    }
}

impl Hold {
    pub(super) fn reserved(
        client: Client,
        op: ReserveOp,
        answer: ReserveAnswer,
        session: u64,
    ) -> Self {
        Self {
            client,
            namespace: op.namespace,
            resource: op.resource,
            domain: op.domain,
            groups: answer.groups,
            held: answer.granted,
            session: (answer.granted > 0).then_some(session),
            granted: answer.granted,
            degraded: answer.degraded,
            unanswered: false,
            overridden: false,
            context: answer.context.unwrap_or_default(),
            waited: Duration::ZERO,
            done: answer.done,
            for_anyone: op.for_anyone == Some(true),
            done_on_drop: false,
        }
    }

    pub(super) fn seized(client: Client, answer: SeizeAnswer, session: u64) -> Self {
        Self {
            client,
            namespace: answer.namespace,
            resource: answer.resource,
            domain: answer.domain,
            groups: answer.groups,
            held: answer.copies,
            session: (answer.copies > 0).then_some(session),
            granted: answer.copies,
            degraded: false,
            unanswered: false,
            overridden: false,
            context: answer.context.unwrap_or_default(),
            waited: Duration::ZERO,
            done: false,
            for_anyone: false,
            done_on_drop: false,
        }
    }

    /// Granted in the dark (fail-open): nothing is recorded anywhere.
    pub(super) fn in_the_dark(client: Client, op: ReserveOp, min_copies: u64) -> Self {
        Self {
            client,
            namespace: op.namespace,
            resource: op.resource,
            domain: op.domain,
            groups: Vec::new(),
            held: min_copies,
            session: None,
            granted: min_copies,
            degraded: true,
            unanswered: true,
            overridden: false,
            context: CopyContext::default(),
            waited: Duration::ZERO,
            done: false,
            for_anyone: false,
            done_on_drop: false,
        }
    }

    /// The kill switch granted what the server refused.
    pub(super) fn set_overridden(&mut self, min_copies: u64) {
        self.overridden = true;
        self.granted = min_copies;
        self.held = min_copies;
        self.session = None;
    }

    pub(super) fn set_waited(&mut self, waited: Duration) {
        self.waited = waited;
    }

    /// Whether copies were granted (by the server, or by fail-open or the
    /// kill switch).
    pub fn is_granted(&self) -> bool {
        self.granted > 0
    }

    /// Waiting [for anyone](crate::client::HoldCall::for_anyone), it was
    /// told that another holder finished the work and released as done:
    /// nothing is held, and the result is there to read.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The work this hold guarded succeeded: if it was reserved [for
    /// anyone](crate::client::HoldCall::for_anyone), dropping it releases
    /// as done (what `ConcurrencyLayer` does for a successful response).
    pub fn succeeded(&mut self) {
        if self.for_anyone {
            self.done_on_drop = true;
        }
    }

    /// Copies granted by the reserve or seize.
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// Copies still held by this guard.
    pub fn copies(&self) -> u64 {
        self.held
    }

    pub fn degraded(&self) -> bool {
        self.degraded
    }

    /// Granted by the client itself: Charon did not answer (fail-open).
    pub fn unanswered(&self) -> bool {
        self.unanswered
    }

    pub fn overridden(&self) -> bool {
        self.overridden
    }

    /// The limits and holds when the server answered
    /// (docs/design.md#reserve-release-transfer-seize).
    pub fn context(&self) -> &CopyContext {
        &self.context
    }

    /// The groups the hold counts in.
    pub fn groups(&self) -> &[String] {
        &self.groups
    }

    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Whether the copies are recorded in the live session (so a release
    /// must reach the server).
    fn recorded(&self) -> bool {
        self.session
            .is_some_and(|session| session == self.client.session())
    }

    /// Gives back `copies` (at most what is held) before the guard drops;
    /// returns how many were released.
    pub async fn release(&mut self, copies: u64) -> Result<u64, ClientError> {
        self.release_as(copies, false).await
    }

    /// Gives back every copy held and says the work they guarded is done
    /// (its result cached): every reserve waiting [for
    /// anyone](crate::client::HoldCall::for_anyone) on this resource and
    /// domain, on every sidecar of the store, is answered
    /// [`is_done`](Hold::is_done) at once (PoolCounter's ACQ4ANY).
    pub async fn release_done(&mut self) -> Result<u64, ClientError> {
        self.release_as(self.held, true).await
    }

    async fn release_as(&mut self, copies: u64, done: bool) -> Result<u64, ClientError> {
        let copies = copies.min(self.held);
        if copies == 0 {
            return Ok(0);
        }
        // Counted as given back before the call: a release whose answer is
        // lost (past the deadline, or cancelled) may have happened, and must
        // never be sent twice; if it did not, the session's end frees them.
        self.held -= copies;
        if !self.recorded() {
            // Granted in the dark, or the session that held them has ended
            // (the server released them then).
            return Ok(copies);
        }
        let mut op = self.release_op(copies);
        if let Op::Release(release) = &mut op {
            release.done = done.then_some(true);
        }
        let reply = match self.client.call_quietly(op).await {
            Ok(reply) => reply,
            Err(error) => {
                if matches!(error, ClientError::Refused { .. }) {
                    // Refused: certainly not released.
                    self.held += copies;
                }
                return Err(error);
            }
        };
        if let Answer::Release(answer) = reply.answer
            && let Some(context) = answer.context
        {
            self.context = context;
        }
        Ok(copies)
    }

    /// Stages `copies` for another session (any process, any sidecar) to
    /// [`seize`](Client::seize) within `ttl`; returns the transfer id to
    /// send it. They stop being this guard's at once.
    pub async fn transfer(&mut self, copies: u64, ttl: Duration) -> Result<String, ClientError> {
        if copies == 0 || copies > self.held {
            return Err(ClientError::Invalid(format!(
                "cannot transfer {copies} copies of a hold of {}",
                self.held
            )));
        }
        if !self.recorded() {
            return Err(ClientError::Unavailable(
                "these copies are not recorded by the server (degraded, overridden, or their session ended): nothing to transfer".into(),
            ));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        let op = Op::Transfer(TransferOp {
            namespace: self.namespace.clone(),
            resource: self.resource.clone(),
            domain: self.domain.clone(),
            copies: i64::try_from(copies).unwrap_or(i64::MAX),
            groups: self.groups.clone(),
            ttl_ms,
        });
        // As for a release: no longer this guard's once sent.
        self.held -= copies;
        let reply = match self.client.call_quietly(op).await {
            Ok(reply) => reply,
            Err(error) => {
                if matches!(error, ClientError::Refused { .. }) {
                    self.held += copies;
                }
                return Err(error);
            }
        };
        match reply.answer {
            Answer::Transfer(answer) => Ok(answer.transfer_id),
            _ => Err(ClientError::Unavailable(
                "the server answered another operation".into(),
            )),
        }
    }

    fn release_op(&self, copies: u64) -> Op {
        Op::Release(ReleaseOp {
            namespace: self.namespace.clone(),
            resource: self.resource.clone(),
            domain: self.domain.clone(),
            copies: i64::try_from(copies).unwrap_or(i64::MAX),
            groups: self.groups.clone(),
            done: None,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.held == 0 || !self.recorded() {
            return;
        }
        let mut op = self.release_op(self.held);
        if let Op::Release(release) = &mut op {
            release.done = self.done_on_drop.then_some(true);
        }
        self.held = 0;
        let client = self.client.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    // No deadline: a backend answers or ends the session
                    // (which releases everything), and a release given up
                    // on would stay held for the session's life.
                    match client.release_unbounded(op).await {
                        Ok(()) => {}
                        Err(reason) => tracing::debug!(%reason, "a dropped hold's release got no answer: its session released it"),
                    }
                });
            }
            Err(_) => tracing::warn!(
                "a hold dropped outside a Tokio runtime: its copies go back when the session ends"
            ),
        }
    }
}

/// One resource of [`Client::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A copy-limited resource: held.
    Copies {
        namespace: String,
        resource: String,
        domain: String,
    },
    /// A rate-limited resource: hits, which cannot be given back — so at
    /// most one, and last.
    Rate {
        namespace: String,
        resource: String,
        domain: String,
    },
}

impl Target {
    pub fn copies(
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> Self {
        Target::Copies {
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
        }
    }

    pub fn rate(
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> Self {
        Target::Rate {
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
        }
    }
}

/// What [`Client::acquire`] got: the same number of copies of every
/// resource, or nothing.
#[derive(Debug)]
pub struct Acquired {
    /// Copies of each resource (0: nothing is held).
    pub copies: u64,
    /// One per copy-limited target, in order.
    pub holds: Vec<Hold>,
    /// The rate-limited target's answer, if there was one.
    pub rate: Option<RateAnswer>,
    pub waited: Duration,
}

impl Acquired {
    pub fn is_granted(&self) -> bool {
        self.copies > 0
    }
}

impl Client {
    /// Takes between `min_copies` and `copies` of every target, the same
    /// number of each, within `max_wait` in total
    /// (docs/design.md#multi-resource-acquire):
    /// each target is asked for what the one before granted; a smaller grant
    /// gives the surplus of the earlier holds back; a rejection gives
    /// everything back. At most one rate-limited target, and last (hits
    /// cannot be given back).
    pub async fn acquire(
        &self,
        targets: &[Target],
        copies: u64,
        min_copies: u64,
        max_wait: Duration,
    ) -> Result<Acquired, ClientError> {
        let rates = targets
            .iter()
            .filter(|target| matches!(target, Target::Rate { .. }))
            .count();
        if rates > 1 || (rates == 1 && !matches!(targets.last(), Some(Target::Rate { .. }))) {
            return Err(ClientError::Invalid(
                "at most one rate-limited target, and it must be the last".into(),
            ));
        }
        if targets.is_empty() {
            return Err(ClientError::Invalid("no targets".into()));
        }
        let started = Instant::now();
        let mut want = copies;
        let mut holds: Vec<Hold> = Vec::with_capacity(targets.len());
        let mut rate = None;
        for target in targets {
            let left = max_wait.saturating_sub(started.elapsed());
            let got = match target {
                Target::Copies {
                    namespace,
                    resource,
                    domain,
                } => {
                    let hold = self
                        .hold(namespace, resource, domain)
                        .copies(want)
                        .min_copies(min_copies.min(want))
                        .max_wait(left)
                        .await?;
                    let got = hold.copies();
                    holds.push(hold);
                    got
                }
                Target::Rate {
                    namespace,
                    resource,
                    domain,
                } => {
                    let answer = self
                        .request(namespace, resource, domain)
                        .copies(want)
                        .min_copies(min_copies.min(want))
                        .max_wait(left)
                        .await?;
                    let got = answer.granted;
                    rate = Some(answer);
                    got
                }
            };
            if got == 0 {
                // Dropping the holds gives everything back.
                return Ok(Acquired {
                    copies: 0,
                    holds: Vec::new(),
                    rate,
                    waited: started.elapsed(),
                });
            }
            if got < want {
                for hold in &mut holds {
                    let extra = hold.copies().saturating_sub(got);
                    hold.release(extra).await?;
                }
            }
            want = got;
        }
        Ok(Acquired {
            copies: want,
            holds,
            rate,
            waited: started.elapsed(),
        })
    }
}
