//! One handle over standalone, sentinel and cluster deployments.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_lite::future;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{FromRedisValue, ScriptInvocation};

use crate::direct::{DirectPool, Lease};
use crate::error::{Parameter, RedisGuardError};
use crate::sentinel::SentinelConn;
#[cfg(feature = "tls")]
use crate::tls::RedisTls;

/// Without the `tls` feature there are no TLS settings: a stand-in that
/// cannot exist, so that one code path serves both builds.
#[cfg(not(feature = "tls"))]
enum RedisTls {}

#[cfg(not(feature = "tls"))]
impl RedisTls {
    fn client(&self, _url: String) -> Result<redis::Client, RedisGuardError> {
        match *self {}
    }

    fn cluster(
        &self,
        _builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        match *self {}
    }

    fn sentinel(
        &self,
        _sentinels: &[String],
        _service: &str,
    ) -> redis::RedisResult<SentinelClient> {
        match *self {}
    }
}

/// Every URL of a topology.
fn urls(topology: &Topology) -> impl Iterator<Item = &str> {
    let list: &[String] = match topology {
        Topology::Standalone { url } => std::slice::from_ref(url),
        Topology::Sentinel { sentinels, .. } => sentinels,
        Topology::Cluster { nodes } => nodes,
    };
    list.iter().map(String::as_str)
}

/// Whether a topology's URLs are `rediss://` (TLS): all of them or none,
/// else an error naming the first that differs.
fn uses_tls(topology: &Topology) -> Result<bool, RedisGuardError> {
    let is_tls = |url: &str| {
        redis::parse_redis_url(url).is_some_and(|u| matches!(u.scheme(), "rediss" | "valkeys"))
    };
    let mut all = urls(topology);
    let Some(first) = all.next() else {
        return Ok(false);
    };
    let tls = is_tls(first);
    match all.find(|url| is_tls(url) != tls) {
        None => Ok(tls),
        Some(other) => Err(RedisGuardError::invalid(
            Parameter::Url,
            other,
            if tls {
                "must be rediss:// like the first URL of the deployment (all TLS or none)"
            } else {
                "must be redis:// like the first URL of the deployment (all TLS or none)"
            },
        )),
    }
}

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One server, e.g. `redis://127.0.0.1:6379/`.
    Standalone {
        /// Its URL.
        url: String,
    },
    /// A master found through sentinels; re-resolved when a sentinel
    /// announces a new master (`+switch-master`), after a `READONLY`
    /// reply and after a connection failure, so a failover is followed
    /// while the old master still answers: no write reaches it later than
    /// about a second after the promotion.
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

/// Connections a standalone server is reached over; requests take them
/// in turn. One multiplexed connection funnels every request through one
/// driver task, which tops out near 0.85 of `redis-benchmark` at 16
/// concurrent callers on two cores; two connections measured 1.2
/// (`cargo bench -p guard-benches --bench redis_throughput`).
pub const STANDALONE_CONNECTIONS: usize = 2;

/// A standalone server's connections: a direct one for a request that
/// finds it idle (see `direct`), else the multiplexed ones in turn.
struct Pool {
    direct: Option<Box<DirectPool>>,
    managers: Box<[ConnectionManager]>,
    next: AtomicUsize,
}

impl Pool {
    /// The direct connection, if it is idle (or can be opened now).
    ///
    /// When it had to be opened again because the server closed the last
    /// one, the multiplexed connections are refreshed first: taken only
    /// while the direct one is busy, they could otherwise keep a dead
    /// socket for minutes and fail the first request that falls back to
    /// them (a leader's renewal, long after a restart), where before the
    /// direct connection they failed at once.
    async fn lease(&self) -> Option<Lease<'_>> {
        let direct = self.direct.as_ref()?;
        let lease = direct.lease().await;
        if direct.take_reopened() {
            self.refresh_managers().await;
        }
        lease
    }

    /// A `PING` on each multiplexed connection in turn: one on a socket
    /// of a server that went fails, and redis-rs connects it again before
    /// its next request. The outcome is not needed.
    async fn refresh_managers(&self) {
        let pings = self.managers.iter().map(|manager| {
            let mut manager = manager.clone();
            async move {
                let _: redis::RedisResult<String> =
                    redis::cmd("PING").query_async(&mut manager).await;
            }
        });
        for ping in pings.collect::<Vec<_>>() {
            ping.await;
        }
    }

    /// The next multiplexed connection (a cheap clone of its manager).
    fn pick(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.managers.len().max(1);
        // `managers` is never empty: `open` makes STANDALONE_CONNECTIONS.
        self.managers[i].clone()
    }
}

enum Conn {
    Standalone(Pool),
    Cluster(ClusterConnection),
    Sentinel(Box<SentinelConn>),
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

/// What a tokio application built without guard-redis's `tokio` feature
/// is told: its connections would run on async-io's reactor, a second one
/// beside tokio's, with timers of their own. `None` when nothing is wrong.
pub(crate) fn second_reactor(inside_tokio: bool, tokio_feature: bool) -> Option<&'static str> {
    (inside_tokio && !tokio_feature).then_some(
        "guard-redis: connecting from inside a tokio runtime, but guard-redis was built without its `tokio` feature: its connections run on async-io's reactor, a second one beside tokio's; enable `guard-redis/tokio` (guard-server's `redis` feature does)",
    )
}

/// Says [`second_reactor`]'s warning once per process, at a connect.
fn warn_of_a_second_reactor() {
    static TOLD: std::sync::Once = std::sync::Once::new();
    let inside_tokio = tokio::runtime::Handle::try_current().is_ok();
    if let Some(warning) = second_reactor(inside_tokio, cfg!(feature = "tokio")) {
        TOLD.call_once(|| tracing::warn!("{warning}"));
    }
}

pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, RedisGuardError>>,
) -> Result<T, RedisGuardError> {
    future::or(request, async {
        guard_std::run::CallerRuntime::sleep_for(timeout).await;
        Err(RedisGuardError::Timeout(timeout))
    })
    .await
}

impl RedisConnection {
    /// Connects, failing if the deployment cannot be reached now.
    ///
    /// `rediss://` URLs (with the `tls` feature) connect over TLS with the
    /// system's trusted roots; the URLs of one deployment are either all
    /// `rediss://` or none. `connect_with_tls` (same feature) takes a
    /// private CA or a client certificate.
    pub async fn connect(topology: Topology, timeout: Duration) -> Result<Self, RedisGuardError> {
        warn_of_a_second_reactor();
        #[cfg(feature = "tls")]
        if uses_tls(&topology)? {
            return Box::pin(Self::open(topology, timeout, Some(&RedisTls::new()))).await;
        }
        #[cfg(not(feature = "tls"))]
        uses_tls(&topology)?;
        Box::pin(Self::open(topology, timeout, None)).await
    }

    /// Connects over TLS with `tls`'s certificates, failing if the
    /// deployment cannot be reached now. Every URL must be `rediss://`:
    /// the standalone server's, the sentinels' (the masters they name are
    /// reached over TLS too), each cluster seed node's.
    #[cfg(feature = "tls")]
    pub async fn connect_with_tls(
        topology: Topology,
        timeout: Duration,
        tls: &RedisTls,
    ) -> Result<Self, RedisGuardError> {
        if !uses_tls(&topology)? {
            let url = urls(&topology).next().unwrap_or_default().to_owned();
            return Err(RedisGuardError::invalid(
                Parameter::Url,
                url,
                "must be rediss:// (TLS) when TLS settings are given",
            ));
        }
        Box::pin(Self::open(topology, timeout, Some(tls))).await
    }

    /// Boxed by its callers: with redis-rs's TLS connectors, its future
    /// nests deep enough that a caller's own future type can exceed the
    /// compiler's query depth (a gateway's main future did).
    async fn open(
        topology: Topology,
        timeout: Duration,
        tls: Option<&RedisTls>,
    ) -> Result<Self, RedisGuardError> {
        let conn = bounded(timeout, async {
            Ok(match topology {
                Topology::Standalone { url } => {
                    let client = match tls {
                        Some(tls) => tls.client(url)?,
                        None => redis::Client::open(url)?,
                    };
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(timeout))
                        .set_response_timeout(Some(timeout))
                        .set_number_of_retries(1);
                    let mut managers = Vec::with_capacity(STANDALONE_CONNECTIONS);
                    for _ in 0..STANDALONE_CONNECTIONS {
                        managers.push(
                            ConnectionManager::new_with_config(client.clone(), config.clone())
                                .await?,
                        );
                    }
                    Conn::Standalone(Pool {
                        direct: DirectPool::new(client.get_connection_info()).map(Box::new),
                        managers: managers.into_boxed_slice(),
                        next: AtomicUsize::new(0),
                    })
                }
                Topology::Cluster { nodes } => {
                    let mut builder = ClusterClient::builder(nodes)
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(1);
                    if let Some(tls) = tls {
                        builder = tls.cluster(builder);
                    }
                    Conn::Cluster(builder.build()?.get_async_connection().await?)
                }
                Topology::Sentinel { sentinels, service } => {
                    let client = match tls {
                        Some(tls) => tls.sentinel(&sentinels, &service)?,
                        None => SentinelClient::build(
                            sentinels.clone(),
                            service.clone(),
                            None,
                            SentinelServerType::Master,
                        )?,
                    };
                    // Subscribed to with the same settings as the
                    // lookups: the URL's credentials, and TLS.
                    let watched = sentinels
                        .iter()
                        .map(|url| match tls {
                            Some(tls) => tls.client(url.clone()),
                            None => Ok(redis::Client::open(url.as_str())?),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    Conn::Sentinel(Box::new(
                        Box::pin(SentinelConn::open(client, watched, service, timeout)).await?,
                    ))
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
                Conn::Standalone(pool) => match pool.lease().await {
                    Some(mut direct) => Ok(script.invoke_async(direct.conn()).await?),
                    None => Ok(script.invoke_async(&mut pool.pick()).await?),
                },
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

    /// Runs `invocation` of `script`, then `WAIT replicas within_ms` on
    /// the same connection (one pipeline, the script loaded first, so
    /// `WAIT` waits for the script's writes; on a cluster, at the master of
    /// the script's keys' slot), all within the timeout: the script's reply
    /// and how many replicas acknowledged.
    pub async fn invoke_acknowledged<T: FromRedisValue>(
        &self,
        script: &redis::Script,
        invocation: &ScriptInvocation<'_>,
        replicas: u32,
        within_ms: u64,
    ) -> Result<(T, u32), RedisGuardError> {
        let mut pipe = redis::pipe();
        pipe.load_script(script)
            .ignore()
            .invoke_script(invocation)
            .cmd("WAIT")
            .arg(replicas)
            .arg(within_ms);
        let (reply, acked): (T, i64) = bounded(self.inner.timeout, async {
            match &self.inner.conn {
                Conn::Standalone(pool) => match pool.lease().await {
                    Some(mut direct) => Ok(pipe.query_async(direct.conn()).await?),
                    None => Ok(pipe.query_async(&mut pool.pick()).await?),
                },
                Conn::Cluster(c) => Ok(pipe.query_async(&mut c.clone()).await?),
                Conn::Sentinel(s) => {
                    let mut conn = s.connection().await?;
                    match pipe.query_async(&mut conn).await {
                        Ok(v) => Ok(v),
                        Err(e) => {
                            s.forget_on(&e);
                            Err(e.into())
                        }
                    }
                }
            }
        })
        .await?;
        Ok((reply, u32::try_from(acked.max(0)).unwrap_or(u32::MAX)))
    }

    /// Runs a command within the timeout.
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, RedisGuardError> {
        bounded(self.inner.timeout, async {
            match &self.inner.conn {
                Conn::Standalone(pool) => match pool.lease().await {
                    Some(mut direct) => Ok(cmd.query_async(direct.conn()).await?),
                    None => Ok(cmd.query_async(&mut pool.pick()).await?),
                },
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

impl RedisConnection {
    /// Every key matching `pattern` (of `kind`, e.g. `stream`), by `SCAN`:
    /// on every master of a cluster, never with `KEYS`.
    pub async fn scan_keys(
        &self,
        pattern: &str,
        kind: &str,
    ) -> Result<Vec<String>, RedisGuardError> {
        match &self.inner.conn {
            Conn::Cluster(c) => {
                let nodes: String = bounded(self.inner.timeout, async {
                    Ok(redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query_async(&mut c.clone())
                        .await?)
                })
                .await?;
                let mut keys = Vec::new();
                for (host, port) in masters(&nodes) {
                    let route =
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                    let mut cursor = 0u64;
                    loop {
                        let mut scan = redis::cmd("SCAN");
                        scan.arg(cursor)
                            .arg("MATCH")
                            .arg(pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .arg("TYPE")
                            .arg(kind);
                        let reply = bounded(self.inner.timeout, async {
                            Ok(c.clone().route_command(scan, route.clone()).await?)
                        })
                        .await?;
                        let (next, batch): (u64, Vec<String>) = redis::from_redis_value(reply)
                            .map_err(|e| RedisGuardError::UnexpectedReply(format!("SCAN: {e}")))?;
                        keys.extend(batch);
                        cursor = next;
                        if cursor == 0 {
                            break;
                        }
                    }
                }
                Ok(keys)
            }
            _ => {
                let mut keys = Vec::new();
                let mut cursor = 0u64;
                loop {
                    let (next, batch): (u64, Vec<String>) = self
                        .query(
                            redis::cmd("SCAN")
                                .arg(cursor)
                                .arg("MATCH")
                                .arg(pattern)
                                .arg("COUNT")
                                .arg(1000)
                                .arg("TYPE")
                                .arg(kind),
                        )
                        .await?;
                    keys.extend(batch);
                    cursor = next;
                    if cursor == 0 {
                        return Ok(keys);
                    }
                }
            }
        }
    }
}

/// The masters of a `CLUSTER NODES` reply, as (host, port).
fn masters(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags = fields.next()?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            // host:port@cport
            let (host, rest) = address.rsplit_once(':')?;
            let port = rest.split('@').next()?.parse().ok()?;
            Some((host.to_owned(), port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::second_reactor;

    #[test]
    fn a_tokio_caller_without_the_tokio_feature_is_told_how_to_fix_it() {
        let warning = second_reactor(true, false).expect("a warning");
        assert!(warning.contains("guard-redis/tokio"), "{warning}");
        assert_eq!(second_reactor(true, true), None);
        assert_eq!(second_reactor(false, false), None);
        assert_eq!(second_reactor(false, true), None);
    }
}
