//! Connections to Redis, one per kind of deployment, each multiplexed (every
//! concurrent decision of the sidecar is pipelined on it) and each
//! reconnecting on its own:
//!
//! - one Redis: redis-rs's `ConnectionManager`, which reconnects in the
//!   background after a failure;
//! - Redis Cluster: redis-rs's cluster connection, which follows the slot map
//!   and reconnects to nodes; it is opened on first use, so a sidecar can start
//!   before the cluster;
//! - Sentinel: a `ConnectionManager` to the master Sentinel names, dropped on
//!   a failure and looked up again, so a failover is followed.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{IntoConnectionInfo, ScriptInvocation, Value};
use tokio::sync::{Mutex, OnceCell};

use super::RedisError;
use super::url::{MasterAuth, Target};

pub enum Connection {
    Single(ConnectionManager),
    Cluster(Box<ClusterConnector>),
    Sentinel(Box<SentinelConnection>),
}

/// Redis Cluster, connected on first use.
pub struct ClusterConnector {
    client: redis::cluster::ClusterClient,
    connection: OnceCell<ClusterConnection>,
}

impl ClusterConnector {
    async fn connection(&self) -> Result<ClusterConnection, RedisError> {
        Ok(self
            .connection
            .get_or_try_init(|| self.client.get_async_connection())
            .await?
            .clone())
    }
}

pub struct SentinelConnection {
    sentinel: Mutex<redis::sentinel::Sentinel>,
    service: String,
    node: redis::sentinel::SentinelNodeConnectionInfo,
    manager: ArcSwapOption<ConnectionManager>,
    config: redis::aio::ConnectionManagerConfig,
}

/// Reconnection: try again soon, a few times; the failover layer's probes
/// start a new round after that.
fn manager_config(timeout: Duration) -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout(timeout)))
        .set_response_timeout(None)
        .set_min_delay(Duration::from_millis(10))
        .set_max_delay(Duration::from_millis(200))
        .set_number_of_retries(3)
}

/// Connecting may take longer than one decision may (TLS, a slow network):
/// the attempt goes on in the background past a decision's deadline.
fn connect_timeout(timeout: Duration) -> Duration {
    timeout.max(Duration::from_millis(500))
}

impl Connection {
    pub fn new(target: Target, timeout: Duration) -> Result<Self, RedisError> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                Ok(Connection::Single(ConnectionManager::new_lazy_with_config(
                    client,
                    manager_config(timeout),
                )?))
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClient::builder(nodes)
                    .connection_timeout(connect_timeout(timeout))
                    .retries(2)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .build()?;
                Ok(Connection::Cluster(Box::new(ClusterConnector {
                    client,
                    connection: OnceCell::new(),
                })))
            }
            Target::Sentinel {
                sentinels,
                service,
                master,
            } => Ok(Connection::Sentinel(Box::new(SentinelConnection {
                sentinel: Mutex::new(redis::sentinel::Sentinel::build(sentinels)?),
                service,
                node: node_info(&master)?,
                manager: ArcSwapOption::empty(),
                config: manager_config(timeout),
            }))),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    pub async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, RedisError> {
        match self {
            Connection::Single(manager) => {
                let mut manager = manager.clone();
                Ok(invocation.invoke_async(&mut manager).await?)
            }
            Connection::Cluster(cluster) => {
                let mut connection = cluster.connection().await?;
                Ok(invocation.invoke_async(&mut connection).await?)
            }
            Connection::Sentinel(sentinel) => {
                let mut manager = sentinel.master().await?;
                let result = invocation.invoke_async(&mut manager).await;
                sentinel.after(&result);
                Ok(result?)
            }
        }
    }

    pub async fn ping(&self) -> Result<(), RedisError> {
        let ping = redis::cmd("PING");
        match self {
            Connection::Single(manager) => {
                let mut manager = manager.clone();
                ping.query_async::<()>(&mut manager).await?;
            }
            Connection::Cluster(cluster) => {
                let mut connection = cluster.connection().await?;
                ping.query_async::<()>(&mut connection).await?;
            }
            Connection::Sentinel(sentinel) => {
                let mut manager = sentinel.master().await?;
                let result = ping.query_async::<()>(&mut manager).await;
                sentinel.after(&result);
                result?;
            }
        }
        Ok(())
    }
}

/// The master's credentials, db and TLS, for connections Sentinel names.
fn node_info(
    master: &MasterAuth,
) -> Result<redis::sentinel::SentinelNodeConnectionInfo, RedisError> {
    let info = master.url("127.0.0.1", 6379).into_connection_info()?;
    let mut node = redis::sentinel::SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(info.redis_settings().clone());
    if master.tls {
        node = node.set_tls_mode(redis::TlsMode::Secure);
    }
    Ok(node)
}

impl SentinelConnection {
    /// The current master's connection, asking Sentinel if there is none.
    async fn master(&self) -> Result<ConnectionManager, RedisError> {
        if let Some(manager) = self.manager.load_full() {
            return Ok((*manager).clone());
        }
        let mut sentinel = self.sentinel.lock().await;
        // Another decision may have looked it up while this one waited.
        if let Some(manager) = self.manager.load_full() {
            return Ok((*manager).clone());
        }
        let client = sentinel
            .async_master_for(&self.service, Some(&self.node))
            .await?;
        let manager = ConnectionManager::new_lazy_with_config(client, self.config.clone())?;
        self.manager.store(Some(Arc::new(manager.clone())));
        Ok(manager)
    }

    /// After a failure that may mean a failover, forget the master.
    fn after<T>(&self, result: &redis::RedisResult<T>) {
        if let Err(error) = result
            && (error.is_io_error()
                || error.is_connection_dropped()
                || error.is_connection_refusal()
                || error.to_string().contains("READONLY"))
        {
            self.manager.store(None);
        }
    }
}
