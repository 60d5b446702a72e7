//! Recorded use on Redis (docs/design.md#learning-a-limit): every sidecar
//! on the store adds to one record, so a proposal made through any of them
//! is the fleet's.
//!
//! A decision never waits for it: hits are added up in this process
//! (per namespace, subject and domain, within the same bound as a window)
//! and written once a second, one `learn.lua` call per namespace, into the
//! window Redis's time is in at that moment. So a sidecar adds one call a
//! second to Redis however busy it is, and hits reach the record at most a
//! second late: near a window's end, into the next one (by Redis's clock,
//! the same for every sidecar). What a sidecar has not written when it
//! stops, or while Redis is away, is not recorded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::Value;

use crate::config::Learn;
use crate::config::learned::{Recorded, WindowUse};
use crate::store::keys;
use crate::store::learn::{LearnError, LearnLog, TopDomains, subject_record};
use crate::store::redis::{RedisError, RedisStore};

const SCRIPT: &str = include_str!("learn.lua");

/// How often what was added up here is written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What one namespace has added up since the last write.
struct Pending {
    learn: Learn,
    subjects: HashMap<String, TopDomains>,
}

struct Inner {
    redis: RedisStore,
    script: redis::Script,
    pending: Mutex<HashMap<String, Pending>>,
    /// One write at a time (the timer's, or a proposal's before it reads).
    writing: tokio::sync::Mutex<()>,
}

pub struct RedisLearn {
    inner: Arc<Inner>,
}

impl From<RedisError> for LearnError {
    fn from(error: RedisError) -> Self {
        LearnError::Unavailable(error.to_string())
    }
}

impl RedisLearn {
    /// On `redis` (a store sharing another's connection, see
    /// [`RedisStore::sharing`]); writes once a second from a task that
    /// ends with this value. Call inside a Tokio runtime.
    pub fn on(redis: RedisStore) -> Self {
        let inner = Arc::new(Inner {
            redis,
            script: redis::Script::new(SCRIPT),
            pending: Mutex::new(HashMap::new()),
            writing: tokio::sync::Mutex::new(()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(flush_every_second(Arc::downgrade(&inner)));
        }
        Self { inner }
    }
}

async fn flush_every_second(inner: Weak<Inner>) {
    let mut ticks = tokio::time::interval(FLUSH_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if let Err(error) = inner.flush().await {
            tracing::debug!(%error, "recorded use not written");
        }
    }
}

impl Inner {
    /// Writes what was added up, each namespace in one call.
    async fn flush(&self) -> Result<(), LearnError> {
        let _turn = self.writing.lock().await;
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if pending.is_empty() {
            return Ok(());
        }
        let now = self.redis.store_now_ms().await?;
        for (namespace, Pending { learn, subjects }) in pending {
            let start = learn.window_start(now);
            let mut invocation = self.script.prepare_invoke();
            invocation
                .key(
                    self.redis
                        .key(&keys::learn_subjects_key(&namespace))
                        .as_ref(),
                )
                .arg("record")
                .arg(start)
                .arg(learn.retention_ms())
                .arg(learn.domains)
                .arg(Learn::SUBJECTS);
            for (subject, top) in subjects {
                invocation
                    .key(
                        self.redis
                            .key(&keys::learn_window_key(
                                &namespace,
                                &subject,
                                learn.window_ms,
                                start,
                            ))
                            .as_ref(),
                    )
                    .arg(subject.as_str())
                    .arg(top.len());
                for (domain, hits) in top.drain() {
                    invocation.arg(domain).arg(hits);
                }
            }
            match self.redis.invoke("learn_record", &invocation).await? {
                Value::Int(0) => {}
                Value::Int(refused) => tracing::debug!(
                    namespace,
                    refused,
                    "subjects past the learning bound not recorded"
                ),
                other => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    /// The subjects `namespace` has recorded.
    async fn subjects(&self, namespace: &str) -> Result<Vec<String>, LearnError> {
        let key = self
            .redis
            .key(&keys::learn_subjects_key(namespace))
            .into_owned();
        let listed = self
            .redis
            .query("learn_read", redis::cmd("ZRANGE").arg(key).arg(0).arg(-1))
            .await?;
        match listed {
            Value::Array(items) => items.iter().map(text).collect(),
            other => Err(unexpected(&other)),
        }
    }
}

#[async_trait::async_trait]
impl LearnLog for RedisLearn {
    fn record(&self, namespace: &str, subject: &str, domain: &str, hits: u64, learn: &Learn) {
        if hits == 0 {
            // A check: no use to record, and a domain kept for nothing.
            return;
        }
        let mut pending = self.inner.pending.lock().unwrap_or_else(|e| e.into_inner());
        let namespace = match pending.get_mut(namespace) {
            Some(namespace) => namespace,
            None => pending.entry(namespace.to_owned()).or_insert(Pending {
                learn: *learn,
                subjects: HashMap::new(),
            }),
        };
        namespace.learn = *learn;
        if let Some(top) = subject_record(&mut namespace.subjects, subject) {
            top.add(domain, hits, learn.domains as usize);
        }
    }

    async fn recorded(
        &self,
        namespace: &str,
        learn: &Learn,
    ) -> Result<(Vec<Recorded>, u64), LearnError> {
        self.inner.flush().await?;
        let now = self.inner.redis.store_now_ms().await?;
        let period = crate::config::learned::period(learn, now);
        let starts: Vec<u64> = period.step_by(learn.window_ms as usize).collect();
        let mut recorded = Vec::new();
        for subject in self.inner.subjects(namespace).await? {
            let mut invocation = self.inner.script.prepare_invoke();
            invocation.arg("read");
            for start in &starts {
                invocation.key(
                    self.inner
                        .redis
                        .key(&keys::learn_window_key(
                            namespace,
                            &subject,
                            learn.window_ms,
                            *start,
                        ))
                        .as_ref(),
                );
            }
            let windows = match self.inner.redis.invoke("learn_read", &invocation).await? {
                Value::Array(windows) => windows,
                other => return Err(unexpected(&other)),
            };
            let windows = starts
                .iter()
                .zip(windows)
                .map(|(&start_ms, domains)| window_use(start_ms, &domains))
                .filter(|window| !matches!(window, Ok(window) if window.domains.is_empty()))
                .collect::<Result<Vec<_>, _>>()?;
            recorded.push(Recorded { subject, windows });
        }
        Ok((recorded, now))
    }
}

/// A window key's `ZRANGE … WITHSCORES`, as the script returns it: member,
/// score, member, score.
fn window_use(start_ms: u64, reply: &Value) -> Result<WindowUse, LearnError> {
    let Value::Array(items) = reply else {
        return Err(unexpected(reply));
    };
    let domains = items
        .chunks(2)
        .map(|pair| match pair {
            [domain, hits] => {
                let hits = text(hits)?;
                let hits = hits.parse::<f64>().map_err(|_| {
                    LearnError::Unavailable(format!("unreadable recorded hits `{hits}`"))
                })?;
                // Counts are whole numbers well below 2^53.
                Ok((text(domain)?, hits as u64))
            }
            _ => Err(unexpected(reply)),
        })
        .collect::<Result<_, _>>()?;
    Ok(WindowUse { start_ms, domains })
}

fn text(value: &Value) -> Result<String, LearnError> {
    match value {
        Value::BulkString(bytes) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Ok(text.clone()),
        Value::Int(number) => Ok(number.to_string()),
        Value::Double(number) => Ok(number.to_string()),
        other => Err(unexpected(other)),
    }
}

fn unexpected(value: &Value) -> LearnError {
    LearnError::Unavailable(format!("unexpected reply from learn.lua: {value:?}"))
}
