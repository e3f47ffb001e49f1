//! One handle over standalone, sentinel and cluster deployments.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_lite::future;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{FromRedisValue, ScriptInvocation};

use crate::error::RedisGuardError;

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server, e.g. `redis://127.0.0.1:6379/`.
    Standalone {
        /// Its URL.
        url: String,
    },
    /// A master found through sentinels; re-resolved after a connection
    /// failure, so a failover is followed.
    Sentinel {
        /// The sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored service name.
        service: String,
    },
    /// A Redis Cluster, from any of its nodes.
    Cluster {
        /// Seed nodes' URLs.
        nodes: Vec<String>,
    },
}

enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Box<SentinelConn>),
}

struct SentinelConn {
    client: async_lock::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

struct Inner {
    conn: Conn,
    timeout: Duration,
}

/// A cheaply cloned connection to a deployment; requests run
/// concurrently over multiplexed connections.
///
/// Every request is bounded by the request timeout: a hung server gives
/// [`RedisGuardError::Timeout`], never a call that waits forever.
#[derive(Clone)]
pub struct RedisConnection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.inner.conn {
            Conn::Standalone(_) => "standalone",
            Conn::Cluster(_) => "cluster",
            Conn::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisConnection")
            .field("topology", &kind)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, RedisGuardError>>,
) -> Result<T, RedisGuardError> {
    future::or(request, async {
        async_io::Timer::after(timeout).await;
        Err(RedisGuardError::Timeout(timeout))
    })
    .await
}

impl RedisConnection {
    /// Connects, failing if the deployment cannot be reached now.
    pub async fn connect(topology: Topology, timeout: Duration) -> Result<Self, RedisGuardError> {
        let conn = bounded(timeout, async {
            Ok(match topology {
                Topology::Standalone { url } => {
                    let client = redis::Client::open(url)?;
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout))
                        .set_number_of_retries(1);
                    Conn::Standalone(ConnectionManager::new_with_config(client, config).await?)
                }
                Topology::Cluster { nodes } => {
                    let client = ClusterClient::builder(nodes)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(1)
                        .build()?;
                    Conn::Cluster(client.get_async_connection().await?)
                }
                Topology::Sentinel { sentinels, service } => {
                    let mut client = SentinelClient::build(
                        sentinels,
                        service,
                        None,
                        SentinelServerType::Master,
                    )?;
                    let first = client.get_async_connection().await?;
                    Conn::Sentinel(Box::new(SentinelConn {
                        client: async_lock::Mutex::new(client),
                        current: Mutex::new(Some(first)),
                        timeout,
                    }))
                }
            })
        })
        .await?;
        Ok(RedisConnection {
            inner: Arc::new(Inner { conn, timeout }),
        })
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Runs a script (EVALSHA, loading it on NOSCRIPT) within the timeout.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, RedisGuardError> {
        bounded(self.inner.timeout, async {
            match &self.inner.conn {
                Conn::Standalone(c) => Ok(script.invoke_async(&mut c.clone()).await?),
                Conn::Cluster(c) => Ok(script.invoke_async(&mut c.clone()).await?),
                Conn::Sentinel(s) => {
                    let mut conn = s.connection().await?;
                    match script.invoke_async(&mut conn).await {
                        Ok(v) => Ok(v),
                        Err(e) => {
                            s.forget_on(&e);
                            Err(e.into())
                        }
                    }
                }
            }
        })
        .await
    }

    /// Runs a command within the timeout.
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, RedisGuardError> {
        bounded(self.inner.timeout, async {
            match &self.inner.conn {
                Conn::Standalone(c) => Ok(cmd.query_async(&mut c.clone()).await?),
                Conn::Cluster(c) => Ok(cmd.query_async(&mut c.clone()).await?),
                Conn::Sentinel(s) => {
                    let mut conn = s.connection().await?;
                    match cmd.query_async(&mut conn).await {
                        Ok(v) => Ok(v),
                        Err(e) => {
                            s.forget_on(&e);
                            Err(e.into())
                        }
                    }
                }
            }
        })
        .await
    }
}

impl SentinelConn {
    /// The current master connection, resolving it through the sentinels
    /// if it was dropped after a failure.
    async fn connection(&self) -> Result<MultiplexedConnection, RedisGuardError> {
        if let Some(conn) = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(conn);
        }
        let mut client = self.client.lock().await;
        let conn = bounded(self.timeout, async {
            Ok(client.get_async_connection().await?)
        })
        .await?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(conn)
    }

    /// After a connection-level failure, the next request asks the
    /// sentinels again (the master may have moved).
    fn forget_on(&self, e: &redis::RedisError) {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
        {
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}
