//! A master found through sentinels, followed when Sentinel moves it.
//!
//! Sentinel promotes a replica while the old master still answers: it
//! turns the old master into a replica (closing its clients) only after
//! about ten seconds, and every write it takes meanwhile is wiped when it
//! resyncs. Waiting for a connection failure is therefore not enough to
//! follow a failover. Guarantees:
//! - A watch task subscribes to `+switch-master` on every sentinel; an
//!   announcement for the service makes the next request resolve the
//!   master again, so writes move within a sentinel's confirmation of the
//!   promotion (its once-a-second `INFO` of the promoted replica) plus one
//!   request (`tests/sentinel_failover.rs`).
//! - A subscription that ends, or leaves a `PING` (sent every
//!   [`PING_EVERY`]) unanswered within the request timeout, is opened
//!   again (every [`RESUBSCRIBE_AFTER`] while the sentinel is away), and
//!   opening one also re-resolves: announcements made while it was down
//!   are lost. A sentinel gone without closing the connection is thus
//!   noticed too (`tests/sentinel_failover.rs`).
//! - A `READONLY` reply, or a connection-level failure, re-resolves too:
//!   the server has become a replica, or may have gone.
//! - Requests never wait on the watch: it runs beside them, and a request
//!   only compares a counter. It stops when the connection is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use futures_lite::{Stream, future};
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::sentinel::SentinelClient;

use crate::connection::bounded;
use crate::error::RedisGuardError;

/// The watch's thread, outside a tokio runtime (15 bytes at most: the
/// kernel keeps no more of a thread's name).
pub(crate) const WATCH_THREAD: &str = "guard-sentinel";

/// While a sentinel cannot be subscribed to, a new attempt this often.
pub(crate) const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// How often each subscription is checked with a `PING`.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(1);

/// The channel on which a sentinel announces a new master address:
/// `<service> <old ip> <old port> <new ip> <new port>`. Sentinel's own
/// `SENTINEL MASTERS`, which resolution reads, names the new master from
/// the same moment (at the earlier `+promoted-slave` it still names the
/// old one, so that event would resolve the old master again).
const SWITCH_MASTER: &str = "+switch-master";

/// The master connection and the number of switches announced when it
/// was resolved: a later announcement makes it stale.
struct Resolved {
    conn: MultiplexedConnection,
    switches: u64,
}

pub(crate) struct SentinelConn {
    client: async_lock::Mutex<SentinelClient>,
    current: Mutex<Option<Resolved>>,
    /// Bumped by the watch for each announcement of a switch (and each
    /// subscription opened, which may have missed one).
    switches: Arc<AtomicU64>,
    timeout: Duration,
    /// Dropped with the connection, which ends the watch.
    _stop: async_channel::Sender<()>,
}

impl SentinelConn {
    /// Starts the watch on `sentinels` (each a client of one sentinel),
    /// then resolves the master.
    pub(crate) async fn open(
        client: SentinelClient,
        sentinels: Vec<redis::Client>,
        service: String,
        timeout: Duration,
    ) -> Result<Self, RedisGuardError> {
        let switches = Arc::new(AtomicU64::new(0));
        let (stop, stopped) = async_channel::bounded(1);
        let watch = watch(sentinels, service, timeout, switches.clone(), stopped);
        guard_std::run::CallerRuntime::spawn(WATCH_THREAD, watch)
            .map_err(redis::RedisError::from)?;
        let conn = SentinelConn {
            client: async_lock::Mutex::new(client),
            current: Mutex::new(None),
            switches,
            timeout,
            _stop: stop,
        };
        conn.connection().await?;
        Ok(conn)
    }

    /// The current master connection if no switch was announced since it
    /// was resolved, else a new one through the sentinels.
    pub(crate) async fn connection(&self) -> Result<MultiplexedConnection, RedisGuardError> {
        if let Some(conn) = self.fresh() {
            return Ok(conn);
        }
        let mut client = self.client.lock().await;
        // Another request may have resolved it while this one waited.
        if let Some(conn) = self.fresh() {
            return Ok(conn);
        }
        // Read before asking: an announcement during the lookup leaves the
        // result stale, and the next request asks again.
        let switches = self.switches.load(Ordering::Acquire);
        // Boxed: with TLS, redis-rs's sentinel lookup nests deep enough
        // that every request future embedding it would exceed the
        // compiler's query depth.
        let conn = bounded(self.timeout, async {
            Ok(Box::pin(client.get_async_connection()).await?)
        })
        .await?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(Resolved {
            conn: conn.clone(),
            switches,
        });
        Ok(conn)
    }

    fn fresh(&self) -> Option<MultiplexedConnection> {
        let switches = self.switches.load(Ordering::Acquire);
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|r| r.switches == switches)
            .map(|r| r.conn.clone())
    }

    /// After a connection-level failure, or a `READONLY` reply (the
    /// server is a replica now), the next request asks the sentinels
    /// again.
    pub(crate) fn forget_on(&self, e: &redis::RedisError) {
        if e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        {
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}

/// A subscription to [`SWITCH_MASTER`] on one sentinel: the sink pings
/// it, the stream brings its messages.
struct Subscription {
    sink: PubSubSink,
    stream: PubSubStream,
}

impl Subscription {
    /// Subscribes on `sentinel` within `timeout`.
    async fn open(sentinel: &redis::Client, timeout: Duration) -> Result<Self, RedisGuardError> {
        bounded(timeout, async {
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub.subscribe(SWITCH_MASTER).await?;
            let (sink, stream) = pubsub.split();
            Ok(Subscription { sink, stream })
        })
        .await
    }

    /// Whether the sentinel answers a `PING` within `timeout`.
    async fn answers(&mut self, timeout: Duration) -> bool {
        bounded(timeout, async {
            Ok(self.sink.ping::<redis::Value>().await?)
        })
        .await
        .is_ok()
    }
}

/// Whether `msg` announces a new master for `service`.
fn announces_switch(msg: &redis::Msg, service: &str) -> bool {
    msg.get_channel_name() == SWITCH_MASTER
        && msg
            .get_payload::<String>()
            .is_ok_and(|p| p.split_whitespace().next() == Some(service))
}

enum Woke {
    Stop,
    /// A message from sentinel `i`, or `None`: its subscription ended.
    Message(usize, Option<redis::Msg>),
    /// Time to open missing subscriptions, or to ping the open ones.
    Timer,
}

/// The next message of any open subscription.
async fn next_message(subscriptions: &mut [Option<Subscription>]) -> Woke {
    future::poll_fn(|cx| {
        for (i, sub) in subscriptions.iter_mut().enumerate() {
            if let Some(sub) = sub
                && let Poll::Ready(msg) = std::pin::Pin::new(&mut sub.stream).poll_next(cx)
            {
                return Poll::Ready(Woke::Message(i, msg));
            }
        }
        Poll::Pending
    })
    .await
}

/// Keeps a subscription on every sentinel and bumps `switches` for each
/// announcement for `service` and each subscription opened; returns when
/// `stop`'s sender is dropped.
async fn watch(
    sentinels: Vec<redis::Client>,
    service: String,
    timeout: Duration,
    switches: Arc<AtomicU64>,
    stop: async_channel::Receiver<()>,
) {
    let stopped = || async {
        // Nothing is ever sent: this completes when the sender is dropped.
        let _ = stop.recv().await;
        Woke::Stop
    };
    let mut subscriptions: Vec<Option<Subscription>> = sentinels.iter().map(|_| None).collect();
    loop {
        for (sentinel, sub) in sentinels.iter().zip(subscriptions.iter_mut()) {
            if sub.is_some() {
                continue;
            }
            let opened = future::or(
                async { Some(Subscription::open(sentinel, timeout).await) },
                async {
                    stopped().await;
                    None
                },
            )
            .await;
            match opened {
                None => return,
                Some(Ok(opened)) => {
                    *sub = Some(opened);
                    switches.fetch_add(1, Ordering::AcqRel);
                }
                Some(Err(e)) => tracing::debug!("redis: no {SWITCH_MASTER} subscription: {e}"),
            }
        }
        let missing = subscriptions.iter().any(Option::is_none);
        let woke = future::or(
            stopped(),
            future::or(next_message(&mut subscriptions), async {
                guard_std::run::CallerRuntime::sleep_for(if missing {
                    RESUBSCRIBE_AFTER
                } else {
                    PING_EVERY
                })
                .await;
                Woke::Timer
            }),
        )
        .await;
        match woke {
            Woke::Stop => return,
            Woke::Timer => {
                for sub in &mut subscriptions {
                    if let Some(open) = sub
                        && !open.answers(timeout).await
                    {
                        tracing::debug!(
                            "redis: a sentinel left a PING unanswered; subscribing again"
                        );
                        *sub = None;
                    }
                }
            }
            Woke::Message(_, Some(msg)) => {
                if announces_switch(&msg, &service) {
                    switches.fetch_add(1, Ordering::AcqRel);
                }
            }
            Woke::Message(i, None) => {
                tracing::debug!("redis: the {SWITCH_MASTER} subscription to a sentinel ended");
                subscriptions[i] = None;
            }
        }
    }
}
