//! Connections to Redis, one per kind of deployment, each multiplexed (every
//! concurrent decision of the sidecar is pipelined on it) and each
//! reconnecting on its own:
//!
//! - one Redis: redis-rs's `ConnectionManager`, which reconnects in the
//!   background after a failure;
//! - Redis Cluster: redis-rs's cluster connection, which follows the slot map
//!   and reconnects to nodes;
//! - Sentinel: a `ConnectionManager` to the master Sentinel names, dropped on
//!   a failure that may mean a failover and looked up again.
//!
//! The first connection (and Sentinel's lookups) run in a background task
//! ([`Background`]): a TLS handshake or a cluster's slot map may take longer
//! than one decision's deadline, and an attempt cut short by every deadline
//! would never finish. Decisions wait for it within their own deadline.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, ScriptInvocation, Value};
use tokio::sync::{Mutex, Notify};

use super::RedisError;
use super::url::{MasterAuth, Target};
use crate::store::keys::STATE_FORMAT;

pub struct Connection {
    kind: Kind,
    /// Where this Redis records the state format (behind the key prefix):
    /// checked on every new connection.
    format_key: Arc<str>,
    /// The live connection, once made.
    live: Arc<Background>,
    /// For the `ConnectionManager`s of one Redis and of Sentinel's masters.
    config: ConnectionManagerConfig,
}

enum Kind {
    Single(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
    Sentinel(Arc<SentinelLookup>),
}

/// A multiplexed connection of either kind.
#[derive(Clone)]
enum Live {
    Manager(ConnectionManager),
    Cluster(ClusterConnection),
}

struct SentinelLookup {
    sentinel: Mutex<redis::sentinel::Sentinel>,
    service: String,
    node: redis::sentinel::SentinelNodeConnectionInfo,
}

/// `live`, once its Redis says its state is of a format this build reads
/// (docs/releases.md#the-redis-state): the first sidecar records
/// [`STATE_FORMAT`]; a newer one recorded is [`RedisError::NewerState`],
/// so nothing is decided on state this build might misread.
async fn readable(live: Live, format_key: &str) -> Result<Live, RedisError> {
    let mut record = redis::cmd("SET");
    record.arg(format_key).arg(STATE_FORMAT).arg("NX");
    let mut read = redis::cmd("GET");
    read.arg(format_key);
    let asked = match live.clone() {
        Live::Manager(mut manager) => match record.query_async::<Value>(&mut manager).await {
            Ok(_) => read.query_async::<Value>(&mut manager).await,
            Err(error) => Err(error),
        },
        Live::Cluster(mut cluster) => match record.query_async::<Value>(&mut cluster).await {
            Ok(_) => read.query_async::<Value>(&mut cluster).await,
            Err(error) => Err(error),
        },
    };
    let found = match asked {
        Ok(found) => found,
        // An ACL user that may run Charon's scripts and nothing else: the
        // check is skipped, never the decisions.
        Err(error) if error.code() == Some("NOPERM") => return Ok(live),
        Err(error) => return Err(error.into()),
    };
    let text = match &found {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Int(n) => n.to_string(),
        // Gone in between (a FLUSHALL): the next connection records it.
        Value::Nil => return Ok(live),
        other => format!("{other:?}"),
    };
    match text.parse::<u64>() {
        Ok(format) if format <= STATE_FORMAT => Ok(live),
        _ => Err(RedisError::NewerState {
            found: text,
            known: STATE_FORMAT,
        }),
    }
}

/// Reconnection: try again soon, a few times; the failover layer's probes
/// start a new round after that.
fn manager_config(timeout: Duration) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout(timeout)))
        .set_response_timeout(None)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
        .set_number_of_retries(3)
}

/// Connecting may take longer than one decision may.
/// Nagle's algorithm off: a decision is one small script call that must
/// leave at once (redis-rs leaves it on by default, which adds up to 40 ms
/// whenever a call follows another before its ACK).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

fn connect_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_secs(2))
}

impl Connection {
    pub fn new(
        target: Target,
        timeout: Duration,
        tls: Option<&super::StoreTls>,
        sentinel_password: Option<&str>,
        format_key: String,
    ) -> Result<Self, RedisError> {
        let certificates = tls.map(super::StoreTls::certificates);
        let kind = match target {
            Target::Single(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()?
                    .set_tcp_settings(tcp_settings());
                Kind::Single(Box::new(match certificates {
                    Some(certificates) => redis::Client::build_with_tls(info, certificates)?,
                    None => redis::Client::open(info)?,
                }))
            }
            Target::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClient::builder(nodes)
                    .tcp_settings(tcp_settings())
                    .connection_timeout(connect_timeout(timeout))
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(100);
                if let Some(certificates) = certificates {
                    builder = builder.certs(certificates);
                }
                Kind::Cluster(Box::new(builder.build()?))
            }
            Target::Sentinel { .. } if certificates.is_some() => {
                return Err(RedisError::Url(
                    "--store-ca and client certificates are not supported with Sentinel yet \
                     (use the system's roots or SSL_CERT_FILE)"
                        .into(),
                ));
            }
            Target::Sentinel {
                sentinels,
                service,
                master,
            } => Kind::Sentinel(Arc::new(SentinelLookup {
                sentinel: Mutex::new(redis::sentinel::Sentinel::build(match sentinel_password {
                    Some(password) => sentinels
                        .iter()
                        .map(|url| super::url::with_credentials(url, None, password))
                        .collect::<Result<Vec<_>, _>>()?,
                    None => sentinels,
                })?),
                service,
                node: node_info(&master)?,
            })),
        };
        Ok(Self {
            kind,
            format_key: format_key.into(),
            live: Arc::new(Background::new()),
            config: manager_config(timeout),
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }

    async fn live(&self) -> Result<Live, RedisError> {
        let config = self.config.clone();
        let format_key = self.format_key.clone();
        match &self.kind {
            Kind::Single(client) => {
                let client = (**client).clone();
                self.live
                    .get(async move {
                        let live = Live::Manager(
                            ConnectionManager::new_with_config(client, config).await?,
                        );
                        readable(live, &format_key).await
                    })
                    .await
            }
            Kind::Cluster(client) => {
                let client = (**client).clone();
                self.live
                    .get(async move {
                        let live = Live::Cluster(client.get_async_connection().await?);
                        readable(live, &format_key).await
                    })
                    .await
            }
            Kind::Sentinel(lookup) => {
                let lookup = lookup.clone();
                self.live
                    .get(async move {
                        let client = {
                            let mut sentinel = lookup.sentinel.lock().await;
                            sentinel
                                .async_master_for(&lookup.service, Some(&lookup.node))
                                .await?
                        };
                        let live = Live::Manager(
                            ConnectionManager::new_with_config(client, config).await?,
                        );
                        readable(live, &format_key).await
                    })
                    .await
            }
        }
    }

    /// After a failure that may mean a failover, Sentinel is asked again.
    fn after<T>(&self, result: &redis::RedisResult<T>) {
        if let (Kind::Sentinel(_), Err(error)) = (&self.kind, result)
            && (error.is_io_error()
                || error.is_connection_dropped()
                || error.is_connection_refusal()
                || error.code() == Some("READONLY"))
        {
            self.live.forget();
        }
    }

    pub async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, RedisError> {
        let result = match self.live().await? {
            Live::Manager(mut manager) => invocation.invoke_async(&mut manager).await,
            Live::Cluster(mut cluster) => invocation.invoke_async(&mut cluster).await,
        };
        self.after(&result);
        Ok(result?)
    }

    /// Why the last attempt to connect failed, if it did.
    pub fn last_connect_error(&self) -> Option<RedisError> {
        self.live
            .last_error
            .lock()
            .ok()
            .and_then(|last| last.clone())
    }

    pub async fn query(&self, command: &redis::Cmd) -> Result<Value, RedisError> {
        let result = match self.live().await? {
            Live::Manager(mut manager) => command.query_async::<Value>(&mut manager).await,
            Live::Cluster(mut cluster) => command.query_async::<Value>(&mut cluster).await,
        };
        self.after(&result);
        Ok(result?)
    }

    pub async fn ping(&self) -> Result<(), RedisError> {
        let ping = redis::cmd("PING");
        let result = match self.live().await? {
            Live::Manager(mut manager) => ping.query_async::<()>(&mut manager).await,
            Live::Cluster(mut cluster) => ping.query_async::<()>(&mut cluster).await,
        };
        self.after(&result);
        Ok(result?)
    }
}

/// The master's credentials, db and TLS, for connections Sentinel names.
fn node_info(
    master: &MasterAuth,
) -> Result<redis::sentinel::SentinelNodeConnectionInfo, RedisError> {
    let info = master.url("127.0.0.1", 6379).into_connection_info()?;
    let mut node = redis::sentinel::SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(info.redis_settings().clone())
        .set_tcp_settings(tcp_settings());
    if master.tls {
        node = node.set_tls_mode(redis::TlsMode::Secure);
    }
    Ok(node)
}

/// A connection made by one background task at a time; callers wait for it
/// as long as they like (their deadline), the attempt goes on regardless.
struct Background {
    live: ArcSwapOption<Live>,
    connecting: AtomicBool,
    done: Notify,
    last_error: std::sync::Mutex<Option<RedisError>>,
}

impl Background {
    fn new() -> Self {
        Self {
            live: ArcSwapOption::empty(),
            connecting: AtomicBool::new(false),
            done: Notify::new(),
            last_error: std::sync::Mutex::new(None),
        }
    }

    fn forget(&self) {
        self.live.store(None);
    }

    async fn get(
        self: &Arc<Self>,
        connect: impl Future<Output = Result<Live, RedisError>> + Send + 'static,
    ) -> Result<Live, RedisError> {
        if let Some(live) = self.live.load_full() {
            return Ok((*live).clone());
        }
        let done = self.done.notified();
        tokio::pin!(done);
        // Registered before the check below, so a task finishing in between
        // still wakes this caller.
        done.as_mut().enable();
        if !self.connecting.swap(true, Ordering::SeqCst) {
            let background = self.clone();
            tokio::spawn(async move {
                match connect.await {
                    Ok(live) => {
                        background.live.store(Some(Arc::new(live)));
                        if let Ok(mut last) = background.last_error.lock() {
                            *last = None;
                        }
                    }
                    Err(error) => {
                        if let Ok(mut last) = background.last_error.lock() {
                            *last = Some(error);
                        }
                    }
                }
                background.connecting.store(false, Ordering::SeqCst);
                background.done.notify_waiters();
            });
        }
        done.await;
        match self.live.load_full() {
            Some(live) => Ok((*live).clone()),
            None => Err(self
                .last_error
                .lock()
                .ok()
                .and_then(|last| last.clone())
                .unwrap_or_else(|| RedisError::Unreachable("not connected".into()))),
        }
    }
}
