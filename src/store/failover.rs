//! What to answer when the shared store is away (docs/design.md#failover):
//! a circuit breaker in front of the Redis store, and a policy for the
//! answers it cannot get.
//!
//! - Closed: every decision goes to Redis, with its deadline. A failed call
//!   (error or deadline) is answered by the policy; [`OPEN_AFTER`] failures in
//!   a row, with no success between them, open the breaker: a sidecar
//!   answering thousands of requests a second cannot afford to add the
//!   deadline to each while Redis is down, but one slow call under load is
//!   not an outage.
//! - Open: decisions are answered by the policy without touching Redis, and
//!   one background task pings Redis every [`PROBE_INTERVAL`]; the first
//!   answer closes the breaker. Redis-backed answers are back within about
//!   one probe interval of Redis returning. While closed, the same task pings
//!   when no decision has succeeded for [`WATCH_INTERVAL`], so an idle
//!   sidecar notices an outage too (and a busy one is not slowed by pings).
//!
//! A refusal is not an outage: when Redis refuses Charon's credentials or
//! permissions (`WRONGPASS`, `NOAUTH`, `NOPERM`), no policy answers for
//! it. Decisions fail (the RLS answers `UNAVAILABLE`), `/readyz` says not
//! ready with the cause, and an ERROR line names it: a wrong password must
//! not quietly turn a shared limit into one per sidecar. The probe keeps
//! asking, so a fixed password (a restarted Redis, a corrected ACL) is
//! picked up without a restart.
//!
//! The breaker starts open, with the probe running: a sidecar starts and
//! answers (by its policy) before Redis is reachable, and `/readyz` says so.
//!
//! Policies (`--on-store-error`): `allow` grants, `deny` rejects, `local`
//! (the default) decides on an in-process memory store with the same limits:
//! each sidecar then limits on its own, which is exact per sidecar and
//! lenient by the number of sidecars overall. Every such answer is flagged
//! [`Decision::degraded`] and counted; errors are logged on state changes and
//! at most once per [`LOG_EVERY`] in between, so an outage does not flood the
//! log.

use crate::store::OnStoreError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::engine::{self, Decision, Outcome, Slot};

use super::redis::{RedisError, RedisStore};
use super::{Batch, MemoryStore, Store, StoreError};

/// How often an open breaker asks Redis whether it is back.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// Failed calls in a row that open the breaker.
pub const OPEN_AFTER: u64 = 3;
/// How often a closed breaker checks that an idle Redis still answers.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);
/// At most one log line per this long about a continuing outage.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// What a `deny` answer tells clients to wait.
const DENY_RETRY_AFTER_MS: u64 = 1_000;

/// Counters for metrics, since start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FailoverStats {
    /// Whether Redis is answering (the breaker is closed).
    pub reachable: bool,
    /// Decisions answered by the policy instead of Redis.
    pub degraded: u64,
    /// Redis calls that failed or missed their deadline.
    pub errors: u64,
    /// Times the breaker opened.
    pub opened: u64,
    /// Redis refuses Charon's credentials or permissions.
    pub refused: bool,
}

/// The Redis store behind a breaker and a policy.
pub struct Failover {
    inner: Arc<Inner>,
}

struct Inner {
    redis: RedisStore,
    policy: OnStoreError,
    local: MemoryStore,
    closed: AtomicBool,
    /// Why Redis refuses Charon, while it does (see the module doc).
    refused: Mutex<Option<String>>,
    refusing: AtomicBool,
    /// The refusal is a missing permission (NOPERM), not a failed login.
    forbidden: AtomicBool,
    /// Failed calls since the last success.
    failures_in_a_row: AtomicU64,
    /// When a Redis call last succeeded (ms, this machine's clock).
    last_success: AtomicU64,
    degraded: AtomicU64,
    errors: AtomicU64,
    opened: AtomicU64,
    /// Errors not logged since the last log line, and when that was (ms).
    unlogged: AtomicU64,
    logged_at: AtomicU64,
}

impl Failover {
    /// Starts probing Redis at once (needs a Tokio runtime).
    pub fn new(redis: RedisStore, policy: OnStoreError, local: MemoryStore) -> Self {
        let inner = Arc::new(Inner {
            redis,
            policy,
            local,
            closed: AtomicBool::new(false),
            refused: Mutex::new(None),
            refusing: AtomicBool::new(false),
            forbidden: AtomicBool::new(false),
            failures_in_a_row: AtomicU64::new(0),
            last_success: AtomicU64::new(0),
            degraded: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
        });
        Inner::watch(&inner);
        Self { inner }
    }

    pub fn redis(&self) -> &RedisStore {
        &self.inner.redis
    }

    /// The fallback memory store (for its sweeps and metrics).
    pub fn local(&self) -> &MemoryStore {
        &self.inner.local
    }

    pub fn policy(&self) -> OnStoreError {
        self.inner.policy
    }

    pub fn stats(&self) -> FailoverStats {
        let inner = &self.inner;
        FailoverStats {
            reachable: inner.closed.load(Ordering::SeqCst),
            degraded: inner.degraded.load(Ordering::Relaxed),
            errors: inner.errors.load(Ordering::Relaxed),
            opened: inner.opened.load(Ordering::Relaxed),
            refused: inner.refusing.load(Ordering::SeqCst),
        }
    }

    /// Why Redis refuses Charon's credentials or permissions, while it does.
    pub fn refusal(&self) -> Option<String> {
        self.inner.refusal()
    }

    /// Waits up to `limit` for Redis to answer a first time, so a sidecar
    /// starting next to a working Redis serves from Redis at once.
    pub async fn wait_reachable(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.inner.closed.load(Ordering::SeqCst) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// A decision from Redis, or by the policy when Redis is away; an
    /// error while Redis refuses Charon (no policy answers for that).
    pub async fn decide_batch(&self, batch: Batch<'_>) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            match inner.redis.decide_batch(&batch).await {
                Ok(decision) => {
                    inner.succeeded();
                    inner.accepted();
                    return Ok(decision);
                }
                Err(error) if error.is_refusal() => {
                    inner.refuse(&error);
                    Inner::failed(inner, &error.clone().into(), true);
                }
                Err(error) if error.is_outage() => Inner::failed(inner, &error.into(), false),
                Err(error) => {
                    // This request's keys, not Redis: answer it by policy
                    // and leave the breaker closed.
                    inner.errors.fetch_add(1, Ordering::Relaxed);
                    inner.log_quietly(&error.into());
                }
            }
        }
        if inner.refusing.load(Ordering::SeqCst) {
            let reason = inner.refusal().unwrap_or_default();
            return Err(StoreError::Unavailable(format!(
                "Redis refuses Charon's credentials: {reason}"
            )));
        }
        inner.degraded.fetch_add(1, Ordering::Relaxed);
        crate::spans::mark_degraded();
        let mut decision = match inner.policy {
            OnStoreError::Local => inner.local.decide_at(batch, SystemClock.now_ms()),
            OnStoreError::Allow => by_fiat(&batch, true),
            OnStoreError::Deny => by_fiat(&batch, false),
        };
        decision.degraded = true;
        Ok(decision)
    }
}

impl Inner {
    fn refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Redis refuses Charon: logged as an ERROR once per distinct reason.
    fn refuse(&self, error: &RedisError) {
        let reason = error.to_string();
        let mut refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if refused.as_deref() != Some(reason.as_str()) {
            tracing::error!(
                %error,
                "Redis refuses the sidecar's credentials or permissions: not ready, and no \
                 --on-store-error fallback for this; fix the store's password or ACL user"
            );
            *refused = Some(reason);
        }
        self.forbidden
            .store(matches!(error, RedisError::Forbidden(_)), Ordering::SeqCst);
        self.refusing.store(true, Ordering::SeqCst);
    }

    /// Redis accepts Charon again.
    fn accepted(&self) {
        // Read first: every decision passes here, and a write would bounce
        // the cache line between threads.
        if self.refusing.load(Ordering::Relaxed) && self.refusing.swap(false, Ordering::SeqCst) {
            *self
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
            tracing::info!("Redis accepts the sidecar's credentials again");
        }
    }

    fn succeeded(&self) {
        if self.failures_in_a_row.load(Ordering::Relaxed) != 0 {
            self.failures_in_a_row.store(0, Ordering::Relaxed);
        }
        self.last_success
            .store(SystemClock.now_ms(), Ordering::Relaxed);
    }

    /// Counts a failed call; opens the breaker after [`OPEN_AFTER`] in a row
    /// (`at_once` for the watcher's own probe of an idle Redis).
    fn failed(inner: &Arc<Inner>, error: &StoreError, at_once: bool) {
        inner.errors.fetch_add(1, Ordering::Relaxed);
        let in_a_row = inner.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if (at_once || in_a_row >= OPEN_AFTER) && inner.closed.swap(false, Ordering::SeqCst) {
            inner.opened.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                %error,
                policy = inner.policy.as_str(),
                "store unreachable: answering by policy until it is back"
            );
            inner
                .logged_at
                .store(SystemClock.now_ms(), Ordering::Relaxed);
        } else {
            inner.log_quietly(error);
        }
    }

    /// One line per [`LOG_EVERY`] at most while errors go on.
    fn log_quietly(&self, error: &StoreError) {
        let now = SystemClock.now_ms();
        let last = self.logged_at.load(Ordering::Relaxed);
        let every = u64::try_from(LOG_EVERY.as_millis()).unwrap_or(u64::MAX);
        if now.saturating_sub(last) >= every
            && self
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.unlogged.swap(0, Ordering::Relaxed);
            tracing::warn!(%error, suppressed, "store still failing");
        } else {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The one watcher task: while the breaker is closed it pings Redis every
    /// [`WATCH_INTERVAL`] (so an idle sidecar notices an outage too, and
    /// `/readyz` tells); while open, every [`PROBE_INTERVAL`], and the first
    /// answer closes it. It ends when the store is dropped.
    fn watch(inner: &Arc<Inner>) {
        let weak = Arc::downgrade(inner);
        tokio::spawn(async move {
            let mut failed_probes: u64 = 0;
            let mut last_reason: Option<String> = None;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let closed = inner.closed.load(Ordering::SeqCst);
                let idle_for = SystemClock
                    .now_ms()
                    .saturating_sub(inner.last_success.load(Ordering::Relaxed));
                if closed && u128::from(idle_for) < WATCH_INTERVAL.as_millis() {
                    // Decisions are succeeding: they are the health check.
                    drop(inner);
                    tokio::time::sleep(WATCH_INTERVAL).await;
                    continue;
                }
                let pinged = inner.redis.ping().await;
                match &pinged {
                    // A ping proves a login, not the permission to run the
                    // scripts (NOPERM): only a decision clears that.
                    Ok(()) if !inner.forbidden.load(Ordering::SeqCst) => inner.accepted(),
                    Ok(()) => {}
                    Err(error) if error.is_refusal() => inner.refuse(error),
                    Err(_) => {}
                }
                match pinged {
                    Ok(()) if !closed => {
                        inner.succeeded();
                        inner.closed.store(true, Ordering::SeqCst);
                        tracing::info!(failed_probes, "store reachable");
                        failed_probes = 0;
                        last_reason = None;
                    }
                    Ok(()) => inner.succeeded(),
                    Err(error) if closed => Inner::failed(&inner, &error.into(), true),
                    Err(error) => {
                        failed_probes += 1;
                        // Say why, once per distinct reason (a refused
                        // connection, a TLS or authentication failure).
                        let reason = error.to_string();
                        if last_reason.as_deref() != Some(reason.as_str()) {
                            tracing::warn!(%error, "store not reachable");
                            last_reason = Some(reason);
                        }
                    }
                }
                let pause = if inner.closed.load(Ordering::SeqCst) {
                    WATCH_INTERVAL
                } else {
                    PROBE_INTERVAL
                };
                drop(inner);
                tokio::time::sleep(pause).await;
            }
        });
    }
}

/// An answer by policy: every item as for a fresh domain, then all granted
/// (`allow`) or all rejected (`deny`).
fn by_fiat(batch: &Batch<'_>, grant: bool) -> Decision {
    let now = SystemClock.now_ms();
    let mut slots: Vec<Slot> = batch.slots.iter().map(|s| Slot::new(s.kind)).collect();
    let mut decision = engine::decide(&batch.items, &mut slots, now);
    decision.granted = grant;
    for outcome in &mut decision.outcomes {
        match outcome {
            Outcome::Window(w) => {
                w.over = !grant;
                if !grant {
                    w.remaining = 0;
                    w.retry_after = Some(DENY_RETRY_AFTER_MS);
                }
            }
            Outcome::Tiers(t) => {
                t.over = !grant;
                if !grant {
                    t.granted = 0;
                    t.snapshot.remaining = 0;
                    t.retry_after = Some(DENY_RETRY_AFTER_MS);
                }
            }
            Outcome::Gcra(g) => {
                g.over = !grant;
                if !grant {
                    g.remaining = 0;
                    g.retry_after = Some(DENY_RETRY_AFTER_MS);
                }
            }
        }
    }
    decision
}

impl Store for Failover {
    async fn decide(&self, batch: Batch<'_>) -> Result<Decision, StoreError> {
        self.decide_batch(batch).await
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn local_now_ms(&self) -> u64 {
        self.inner.redis.local_now_ms()
    }
}
