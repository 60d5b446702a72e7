//! The Redis store: state in Redis, shared by every sidecar that points at it
//! (docs/design.md#one-script-per-decision: Redis is the sidecars' shared
//! memory).
//!
//! A decision is one script call (EVALSHA, loaded on first use and again
//! whenever Redis answers NOSCRIPT) over every key of the request, at Redis
//! `TIME`: atomic, one round trip, one clock for all sidecars. The batch
//! script ([`DECIDE_SCRIPT`], assembled from `decide/` and each kind's chunk
//! in `kinds/`, beside the Rust that writes that kind's arguments) decides
//! every kind of limit; a batch of fixed windows only, of GCRA buckets
//! only, of sliding windows only or of calendar windows only, goes to
//! `window.lua`, `gcra.lua`, `sliding.lua` or `calendar.lua`, the same
//! decision without
//! the rest of the machinery, which Redis would otherwise rebuild on every
//! call (docs/performance.md has the cost of each). The script
//! decides and records exactly as the Rust engine does, and returns the state
//! it decided on; the sidecar then runs the engine on that state to build the
//! detailed answer, so the answer's context is the engine's own.
//!
//! Concurrent decisions share one multiplexed connection (redis-rs pipelines
//! them), and a key that Redis said is over until a known instant is
//! rejected locally until then (`blocked`). With Redis Cluster, a batch is
//! split by hash tag ([`crate::store::keys`]): one script per tag, run
//! concurrently; each is atomic, the batch as a whole is not
//! (docs/redis.md#redis-cluster).
//!
//! Failures are errors here ([`RedisError`]); what to answer when Redis is
//! away is [`super::Failover`]'s business.
//!
//! The folder also holds the Redis half of the other families, on this
//! store's connection: `copies/`, `leases.rs`, `config_log.rs`, `learn.rs`.

mod blocked;
mod codec;
#[cfg(feature = "embedded")]
pub(crate) mod config_log;
mod connection;
#[cfg(feature = "embedded")]
pub(crate) mod copies;
mod error;
mod kinds;
#[cfg(feature = "embedded")]
pub(crate) mod learn;
#[cfg(feature = "embedded")]
pub(crate) mod leases;
mod options;
mod queue;
mod tags;
pub mod url;

use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::clock::{Clock, SystemClock};
use crate::engine::{self, Decision, Item, Slot};

use self::blocked::Blocked;
use self::connection::Connection;
pub use self::error::RedisError;
use self::kinds::OwnScript;
pub use self::options::{CallObserver, EventObserver, RedisOptions, StoreTls};
use self::tags::groups_by_tag;
use super::{Batch, SlotKey, Store, StoreError};

/// The script that decides a batch of any kinds, as Redis runs it:
/// assembled by `build.rs` from `decide/` and each kind's chunk in
/// `kinds/`.
pub const DECIDE_SCRIPT: &str = include_str!(concat!(env!("OUT_DIR"), "/decide.lua"));

/// The scripts, by the kinds of limit a batch holds.
struct Scripts {
    /// Every kind, mixed.
    any: redis::Script,
    /// Fixed windows only.
    windows: redis::Script,
    /// GCRA buckets only.
    buckets: redis::Script,
    /// Sliding windows only.
    slidings: redis::Script,
    /// Calendar windows only.
    calendars: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            any: redis::Script::new(DECIDE_SCRIPT),
            windows: redis::Script::new(include_str!("window.lua")),
            buckets: redis::Script::new(include_str!("gcra.lua")),
            slidings: redis::Script::new(include_str!("sliding.lua")),
            calendars: redis::Script::new(include_str!("calendar.lua")),
        }
    }

    /// The smallest script that decides `items`.
    fn for_items(&self, items: &[Item<'_>]) -> &redis::Script {
        let mut own = items.iter().map(kinds::own_script);
        let Some(first) = own.next() else {
            return &self.windows;
        };
        match first {
            Some(script) if own.all(|other| other == first) => match script {
                OwnScript::Windows => &self.windows,
                OwnScript::Buckets => &self.buckets,
                OwnScript::Slidings => &self.slidings,
                OwnScript::Calendars => &self.calendars,
            },
            _ => &self.any,
        }
    }
}

/// The shared store.
pub struct RedisStore {
    /// Shared by every family of state on this Redis ([`Self::sharing`]).
    connection: Arc<Connection>,
    scripts: Scripts,
    options: RedisOptions,
    blocked: Blocked,
    /// Single fixed-window decisions waiting for their key's call in flight.
    queues: Arc<queue::Queues>,
}

impl RedisStore {
    /// `key` as it is stored: behind the key prefix.
    pub fn key<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        self.options.key_prefix.apply(key)
    }

    /// A copy log's keys as they are stored.
    pub fn copy_keys(&self, namespace: &str, resource: &str) -> crate::store::keys::CopyKeys {
        self.options
            .key_prefix
            .copy_keys(crate::store::keys::copy_keys(namespace, resource))
    }

    /// A store for `url` (see [`url`]). Connects lazily: a Redis that is not
    /// there yet is an error per decision, not at start. Call it inside a
    /// Tokio runtime: the connection's reconnecting task lives there.
    pub fn open(url: &str, options: RedisOptions) -> Result<Self, RedisError> {
        let target = url::parse(url)?;
        tokio::runtime::Handle::try_current().map_err(|_| RedisError::NoRuntime)?;
        Ok(Self {
            connection: Arc::new(Connection::new(
                target,
                options.timeout,
                options.tls.as_ref(),
                options.sentinel_password.as_deref(),
                options
                    .key_prefix
                    .apply(&crate::store::keys::state_format_key())
                    .into_owned(),
            )?),
            scripts: Scripts::new(),
            options,
            blocked: Blocked::default(),
            queues: Arc::default(),
        })
    }

    /// Another family of state on this store's Redis (the copy log, the
    /// leases, the configuration log): the same multiplexed connection, so
    /// one sidecar holds one connection whatever it serves
    /// (docs/redis.md#what-each-family-keeps), with its own scripts and
    /// its own `options` for the deadline and what is reported. Where to
    /// connect (URL, TLS, Sentinel's password) is this store's.
    pub fn sharing(&self, options: RedisOptions) -> Self {
        Self {
            connection: self.connection.clone(),
            scripts: Scripts::new(),
            options: RedisOptions {
                tls: self.options.tls.clone(),
                sentinel_password: self.options.sentinel_password.clone(),
                ..options
            },
            blocked: Blocked::default(),
            queues: Arc::default(),
        }
    }

    /// Whether Redis answers now (readiness and circuit-breaker probes).
    pub async fn ping(&self) -> Result<(), RedisError> {
        // On a deadline, a connection attempt that failed says more than the
        // deadline does (a refused password, a TLS error).
        self.within_deadline("ping", self.connection.ping()).await
    }

    /// Runs a script (the copy log's) within the store's deadline;
    /// `operation` names it to the call observer.
    #[cfg(feature = "embedded")]
    pub(crate) async fn invoke(
        &self,
        operation: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<redis::Value, RedisError> {
        self.within_deadline(operation, self.connection.invoke(invocation))
            .await
    }

    /// Runs one command within the store's deadline.
    pub(crate) async fn query(
        &self,
        operation: &'static str,
        command: &redis::Cmd,
    ) -> Result<redis::Value, RedisError> {
        self.within_deadline(operation, self.connection.query(command))
            .await
    }

    async fn within_deadline<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, RedisError> {
        let deadline = self.options.timeout;
        let started = self.options.observer.as_ref().map(|_| Instant::now());
        let result = match tokio::time::timeout(deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(self
                .connection
                .last_connect_error()
                .unwrap_or(RedisError::Timeout(millis(deadline)))),
        };
        self.observe(operation, started, result.is_ok());
        result
    }

    /// Tells the event observer (if any) that `event` happened `count` times.
    #[cfg(feature = "embedded")]
    pub(crate) fn event(&self, event: &'static str, count: u64) {
        if let Some(events) = &self.options.events {
            events(event, count);
        }
    }

    fn observe(&self, operation: &'static str, started: Option<Instant>, ok: bool) {
        if let (Some(observer), Some(started)) = (&self.options.observer, started) {
            observer(operation, started.elapsed(), ok);
        }
    }

    /// The state of `keys` now, read without changing it, and Redis' "now"
    /// (`TIME`, or the injected clock): one `GET` per key, so keys in
    /// different cluster slots are fine. For the state view, not decisions.
    pub async fn peek(&self, keys: &[SlotKey]) -> Result<(Vec<Slot>, u64), RedisError> {
        let now = self.store_now_ms().await?;
        let mut slots = Vec::with_capacity(keys.len());
        for key in keys {
            let value = self
                .query("peek", redis::cmd("GET").arg(self.key(&key.key).as_ref()))
                .await?;
            let raw = match value {
                redis::Value::Nil => None,
                redis::Value::BulkString(bytes) => Some(bytes),
                other => {
                    return Err(RedisError::State(format!(
                        "`{}` holds {other:?}, not a string",
                        key.key
                    )));
                }
            };
            slots.push(codec::slot(key.kind, raw.as_deref(), now)?);
        }
        Ok((slots, now))
    }

    /// Redis's "now" (`TIME`, or the injected clock), for what is kept by
    /// the store's time without a decision.
    pub(crate) async fn store_now_ms(&self) -> Result<u64, RedisError> {
        match &self.options.injected_clock {
            Some(clock) => Ok(clock.now_ms()),
            None => {
                let time = self.query("time", &redis::cmd("TIME")).await?;
                codec::redis_time_ms(&time)
            }
        }
    }

    /// Decides `batch` in Redis (or locally, for a key known to be over).
    pub async fn decide_batch(&self, batch: &Batch<'_>) -> Result<Decision, RedisError> {
        let sent = self.local_now_ms();
        if let Some(decision) = self.locally_rejected(batch, sent) {
            return Ok(decision);
        }
        let deadline = self.options.timeout;
        let started = self.options.observer.as_ref().map(|_| Instant::now());
        let span = crate::spans::store_call("decide");
        let call = tokio::time::timeout(deadline, self.decide_remote(batch));
        let decision = match tracing::Instrument::instrument(call, span.clone()).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::Timeout(millis(deadline))),
        };
        if !span.is_none() {
            span.record("result", if decision.is_ok() { "ok" } else { "error" });
        }
        self.observe("decide", started, decision.is_ok());
        let decision = decision?;
        if self.options.local_rejections {
            self.blocked.forget_refunded(batch);
        }
        if self.options.local_rejections
            && let Some((key, item)) = single_item(batch)
            && let Some(outcome) = decision.outcomes.first()
        {
            self.blocked.remember(key, item, outcome, sent);
        }
        Ok(decision)
    }

    fn locally_rejected(&self, batch: &Batch<'_>, now: u64) -> Option<Decision> {
        if !self.options.local_rejections {
            return None;
        }
        let (key, item) = single_item(batch)?;
        let outcome = self.blocked.check(key, item, now)?;
        Some(Decision {
            granted: false,
            outcomes: SmallVec::from_elem(outcome, 1),
            now,
            degraded: false,
        })
    }

    async fn decide_remote(&self, batch: &Batch<'_>) -> Result<Decision, RedisError> {
        if batch.slots.is_empty() {
            return Ok(engine::decide(&batch.items, &mut [], self.local_now_ms()));
        }
        if let Some((key, window)) = queue::queueable(&batch.slots, &batch.items) {
            return self.decide_queued(key, window).await;
        }
        if !self.connection.is_cluster() {
            let slots: SmallVec<[&SlotKey; 2]> = batch.slots.iter().collect();
            return self.run_script(&slots, &batch.items).await;
        }
        let groups = groups_by_tag(batch);
        // Different cluster slots: one script per tag, concurrently; each is
        // atomic, together they are not (docs/redis.md#redis-cluster).
        let mut decisions = futures_util::future::try_join_all(groups.iter().map(|group| {
            let slots: SmallVec<[&SlotKey; 2]> =
                group.slots.iter().map(|&s| &batch.slots[s]).collect();
            let items: SmallVec<[Item<'_>; 2]> = group
                .items
                .iter()
                .map(|&i| batch.items[i].map_slots(|s| group.local(s)))
                .collect();
            async move { self.run_script(&slots, &items).await }
        }))
        .await?;
        if decisions.len() == 1
            && let Some(decision) = decisions.pop()
        {
            return Ok(decision);
        }
        let mut outcomes: SmallVec<[Option<engine::Outcome>; 2]> =
            SmallVec::from_elem(None, batch.items.len());
        let mut granted = true;
        let mut now = 0;
        for (group, decision) in groups.iter().zip(decisions) {
            granted &= decision.granted;
            now = now.max(decision.now);
            for (index, outcome) in group.items.iter().zip(decision.outcomes) {
                outcomes[*index] = Some(outcome);
            }
        }
        Ok(Decision {
            granted,
            outcomes: outcomes.into_iter().flatten().collect(),
            now,
            degraded: false,
        })
    }

    /// The time the scripts decide at: 0 for Redis `TIME`, or the injected
    /// clock's (tests), never 0 then.
    fn injected_now_ms(&self) -> u64 {
        self.options
            .injected_clock
            .as_ref()
            .map_or(0, |clock| clock.now_ms().max(1))
    }

    /// One script call: `items` over `slots` (indexes into `slots`).
    async fn run_script(
        &self,
        slots: &[&SlotKey],
        items: &[Item<'_>],
    ) -> Result<Decision, RedisError> {
        let injected = self.injected_now_ms();
        let mut invocation = self.scripts.for_items(items).prepare_invoke();
        for slot in slots {
            invocation.key(self.key(&slot.key).as_ref());
        }
        let one_item = match (slots, items) {
            ([_], [item]) if item.slot() == 0 => {
                codec::one_item_arguments(&mut invocation, injected, item)
            }
            _ => false,
        };
        if !one_item {
            codec::arguments(
                &mut invocation,
                injected,
                slots.iter().map(|s| s.kind),
                items,
            );
        }
        let value = self.connection.invoke(&invocation).await?;
        let reply = codec::reply(value, slots.len())?;
        let mut state: SmallVec<[Slot; 2]> = slots
            .iter()
            .zip(&reply.before)
            .map(|(slot, raw)| codec::slot(slot.kind, raw.as_deref(), reply.now))
            .collect::<Result<_, _>>()?;
        let decision = engine::decide(items, &mut state, reply.now);
        if decision.granted != reply.granted {
            // The script and the engine disagree: a bug, and the script's
            // verdict is what was recorded.
            tracing::error!(
                script = reply.granted,
                engine = decision.granted,
                "the Redis script and the engine decided differently"
            );
            return Err(RedisError::Reply("script and engine disagree".into()));
        }
        Ok(decision)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The one key and item of a single-item batch that may be rejected
/// locally: not shadow, and not a window whose rejected hits must reach
/// Redis too. With a global log the domain's key names a rejection: the
/// global log only tightens it.
fn single_item<'b, 'a>(batch: &'b Batch<'a>) -> Option<(&'b str, &'b Item<'a>)> {
    let [item] = batch.items.as_slice() else {
        return None;
    };
    if item.shadow() || !kinds::blockable(item) {
        return None;
    }
    Some((batch.slots.get(item.slot())?.key.as_str(), item))
}

impl Store for RedisStore {
    async fn decide(&self, batch: Batch<'_>) -> Result<Decision, StoreError> {
        self.decide_batch(&batch).await.map_err(StoreError::from)
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn local_now_ms(&self) -> u64 {
        match (&self.options.local_clock, &self.options.injected_clock) {
            (Some(clock), _) | (None, Some(clock)) => clock.now_ms(),
            (None, None) => SystemClock.now_ms(),
        }
    }
}
