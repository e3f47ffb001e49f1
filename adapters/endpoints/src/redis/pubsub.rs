//! A Redis Pub/Sub endpoint with one active subscriber across replicas.
//!
//! Pub/Sub broadcasts: every subscribed replica gets every message. The
//! endpoint therefore subscribes only while its replica holds the
//! endpoint's lease (an [`ActiveRunner`]): promotion subscribes to every
//! pattern and waits for the confirmations; demotion closes the
//! subscription; a subscription that cannot be confirmed fails the
//! promotion, which releases the lease so another replica can take over;
//! a subscription that dies while the lease still renews demotes.
//!
//! Every message is checked against the lease immediately before the
//! handler is called ([`LeaseCheck`](guard_std::run::LeaseCheck)): after a pause, messages
//! buffered on the socket are refused (counted, logged) once the renew
//! deadline has passed on this replica's monotonic clock, even before the
//! runner has noticed and demoted. The standby that took over handles its
//! own copy of them.
//!
//! Pub/Sub keeps nothing: messages published while no replica is
//! subscribed (a failover, a restart) are lost. The guard removes
//! duplicate consumption; it does not make Pub/Sub at-least-once. Use a
//! stream and [`super::StreamConsumer`] where messages must not be lost.
//!
//! # Under a flood
//!
//! - **Renewals never wait behind handling.** The lease is kept on a
//!   thread of the endpoint's own, and the subscription is read on
//!   another, over a blocking connection of its own (so a flood never
//!   holds the executor that drives the locker's connection); the handler
//!   runs on the caller's executor. A handler that is slow, or even blocks
//!   its thread, delays only the messages behind it.
//! - **The handler queue is bounded** in messages
//!   ([`with_queue`](PubSubEndpoint::with_queue),
//!   [`DEFAULT_QUEUE`](crate::queue::DEFAULT_QUEUE) by default) and in
//!   bytes, channel names and payloads together
//!   ([`with_queue_bytes`](PubSubEndpoint::with_queue_bytes),
//!   [`DEFAULT_QUEUE_BYTES`](crate::queue::DEFAULT_QUEUE_BYTES)). The
//!   reader never waits for the handler, so Redis never has to buffer for
//!   this subscriber; when the queue is full its [`WhenFull`] policy leaves
//!   a message out.
//! - **Nothing is dropped silently.** Every message read is handled or
//!   handed, whole, with its channel and reason, to the endpoint's
//!   unhandled sink ([`with_unhandled`](PubSubEndpoint::with_unhandled);
//!   the gateway keeps them as dead letters), through the one elected
//!   delivery path ([`crate::delivery`]): counted by cause in
//!   [`PubSubStats`] and in `guard_endpoint_dropped_total{key, reason}`
//!   (`queue_full`; `demoted`: queued when leadership ended, by a demotion
//!   or a stop; `past_deadline`, also in
//!   `guard_active_refused_late_total{key}`), and logged: the first of a
//!   burst, then a count per interval. A subscription the server closes
//!   (its `client-output-buffer-limit`, a `CLIENT KILL`) is counted in
//!   `guard_endpoint_disconnects_total{key}` and logged; the messages Redis
//!   discarded with it are not visible to the subscriber and cannot be
//!   counted one by one.
//! - **Order**: messages are handled one at a time, in the order read.
//!   The handler loop yields to its executor every 32 messages (and
//!   whenever the handler waits), so a flood never starves the caller's
//!   other tasks.

use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_lite::future;
use guard_core::guard::{ActiveConfig, DemoteReason};
use guard_core::lock::Scope;
use guard_std::run::{Control, LeaseState, RunHandle};

use crate::runtime::ActiveRunner;
use guard_std::GuardConfig;

use guard_redis::RedisGuardError;

use super::EndpointError;
use crate::delivery::{ElectedLease, Unhandled, UnhandledFn, UnhandledReason, UnhandledSink};
use crate::lease_thread::{self, StopOnDrop};
use crate::link::Link;
use crate::observe;
use crate::parameter::Parameter;
use crate::queue::{DEFAULT_QUEUE, DEFAULT_QUEUE_BYTES, Drain, Feeder, WhenFull};

/// The original's limit on waiting for the subscription confirmations.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// One message, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PubSubMessage {
    /// The channel it was published on.
    pub channel: String,
    /// The pattern that matched it.
    pub pattern: Option<String>,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The fence of the lease, checked valid immediately before the
    /// handler was called (0 without a locker): pass it to a resource
    /// that refuses stale leaders.
    pub fence: u64,
    /// The lease the message was read under: a handler that waits before
    /// its side effect (a limiter, a slow request) checks
    /// [`ElectedLease::is_valid`] again immediately before it.
    pub lease: ElectedLease,
}

/// A Pub/Sub subscriber elected among replicas; see the module
/// documentation.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::redis::PubSubEndpoint;
/// use guard_std::GuardConfig;
///
/// # let config = GuardConfig::new();
/// let scope = config.scope("endpoint/redis")?.segment("node", "sensors-in")?;
/// let endpoint = PubSubEndpoint::new("redis://127.0.0.1:6379/", &config, &scope, &["sensors.*"])?;
/// let (_handle, control) = guard_smol::control();
/// endpoint
///     .run(control, |message| async move { println!("{}: {:?}", message.channel, message.payload) })
///     .await;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct PubSubEndpoint {
    client: redis::Client,
    patterns: Vec<String>,
    runner: ActiveRunner,
    confirm_timeout: Duration,
    queue: usize,
    queue_bytes: usize,
    when_full: WhenFull,
    counters: Arc<Counters>,
    unhandled: Option<UnhandledFn>,
    link: Option<Link>,
}

impl fmt::Debug for PubSubEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubEndpoint")
            .field("patterns", &self.patterns)
            .field("key", &self.runner.key())
            .field("queue", &self.queue)
            .field("queue_bytes", &self.queue_bytes)
            .field("when_full", &self.when_full)
            .finish()
    }
}

/// What an endpoint did, counted from its creation. Every message read
/// ends in exactly one of the last four fields (or is still queued):
/// `received = handled + dropped_full + dropped_demoted + refused_late`
/// once the queue is empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PubSubStats {
    /// Messages read from the subscription.
    pub received: u64,
    /// Messages the handler was called for (and returned).
    pub handled: u64,
    /// Messages the full queue left out under its [`WhenFull`] policy.
    pub dropped_full: u64,
    /// Messages queued when leadership ended (demotion or stop): no longer
    /// this replica's to handle.
    pub dropped_demoted: u64,
    /// Messages taken from the queue after the renew deadline had passed
    /// (a pause), before the runner had demoted.
    pub refused_late: u64,
    /// Subscriptions closed by the server (or the network) while leading.
    pub disconnects: u64,
}

/// The counters behind [`PubSubStats`], shared by the reader thread and
/// the handler loop.
#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    handled: AtomicU64,
    dropped_full: AtomicU64,
    dropped_demoted: AtomicU64,
    refused_late: AtomicU64,
    disconnects: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> PubSubStats {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PubSubStats {
            received: read(&self.received),
            handled: read(&self.handled),
            dropped_full: read(&self.dropped_full),
            dropped_demoted: read(&self.dropped_demoted),
            refused_late: read(&self.refused_late),
            disconnects: read(&self.disconnects),
        }
    }
}

/// The client of the server at `url`; a `rediss://` one (with the `tls`
/// feature) trusts the system's roots.
fn client(url: &str) -> Result<redis::Client, EndpointError> {
    #[cfg(feature = "tls")]
    if redis::parse_redis_url(url).is_some_and(|u| matches!(u.scheme(), "rediss" | "valkeys")) {
        return Ok(guard_redis::RedisTls::new().client(url)?);
    }
    Ok(redis::Client::open(url)?)
}

/// How often a subscription's reader, blocked on an idle connection,
/// looks whether its promotion has ended: bounds how long it stays
/// subscribed after a demotion (what it reads meanwhile is counted as
/// `dropped_demoted`, never handled).
const READ_POLL: Duration = Duration::from_millis(50);

/// Messages handled between two yields of the handler loop to the
/// caller's executor.
const HANDLE_BURST: u32 = 32;

impl PubSubEndpoint {
    /// An endpoint on the server at `url` for `patterns` (`PSUBSCRIBE`
    /// syntax), elected under `scope` with `config`'s locker (no locker:
    /// it always subscribes). The default lease timing is the
    /// [`ActiveRunner`](guard_std::run::ActiveRunner)'s.
    pub fn new(
        url: &str,
        config: &GuardConfig,
        scope: &Scope,
        patterns: &[&str],
    ) -> Result<Self, EndpointError> {
        if patterns.is_empty() || patterns.iter().any(|p| p.is_empty()) {
            return Err(EndpointError::invalid(
                Parameter::Patterns,
                format!("{patterns:?}"),
                "must be at least one, none empty",
            ));
        }
        let client = client(url)?;
        let runner = ActiveRunner::new(config, scope)?;
        Ok(PubSubEndpoint {
            client,
            patterns: patterns.iter().map(|p| (*p).to_owned()).collect(),
            runner,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
            queue: DEFAULT_QUEUE,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            when_full: WhenFull::default(),
            counters: Arc::default(),
            unhandled: None,
            link: None,
        })
    }

    /// Reports the subscription to `link` (see [`crate::link`]): down
    /// from a promotion that cannot subscribe or a subscription closed
    /// while leading, up from one that subscribes or a demotion (a
    /// standby subscribes to nothing).
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// Subscribes over TLS with `tls`'s certificates (a private CA, a
    /// client certificate); the URL must be `rediss://`. A `rediss://`
    /// URL alone uses the system's trusted roots.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: &guard_redis::RedisTls) -> Result<Self, EndpointError> {
        let info = self.client.get_connection_info().clone();
        if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            return Err(EndpointError::invalid(
                Parameter::RedisUrl,
                info.addr().to_string(),
                "must be rediss:// (TLS) when TLS settings are given",
            ));
        }
        self.client = tls.client(info)?;
        Ok(self)
    }

    /// The handler queue: at most `capacity` messages wait for the
    /// handler; when full, `when_full` says which is dropped (counted).
    /// See the module documentation.
    pub fn with_queue(
        mut self,
        capacity: usize,
        when_full: WhenFull,
    ) -> Result<Self, EndpointError> {
        if capacity == 0 {
            return Err(EndpointError::invalid(
                Parameter::QueueCapacity,
                "0",
                "must be at least 1",
            ));
        }
        self.queue = capacity;
        self.when_full = when_full;
        Ok(self)
    }

    /// The handler queue's bound in bytes: the messages waiting weigh at
    /// most `max_bytes` together (channel and payload of each); a message
    /// that would pass it is left out by the queue's [`WhenFull`] policy,
    /// as when the queue is full of messages. [`DEFAULT_QUEUE_BYTES`] by
    /// default.
    pub fn with_queue_bytes(mut self, max_bytes: usize) -> Result<Self, EndpointError> {
        if max_bytes == 0 {
            return Err(EndpointError::invalid(
                Parameter::QueueCapacity,
                "0 bytes",
                "must be at least 1 byte",
            ));
        }
        self.queue_bytes = max_bytes;
        Ok(self)
    }

    /// Hands every message read and not handled (queued or read when
    /// leadership ended, refused past the renew deadline, left out of a
    /// full queue) to `to`, with its content, channel and reason; see
    /// [`crate::delivery`]. Without it they are counted and logged only.
    pub fn with_unhandled(mut self, to: impl Fn(Unhandled) + Send + Sync + 'static) -> Self {
        self.unhandled = Some(Arc::new(to));
        self
    }

    /// What the endpoint has done so far; see [`PubSubStats`].
    pub fn stats(&self) -> PubSubStats {
        self.counters.snapshot()
    }

    /// Lease timing; validated.
    pub fn with_settings(mut self, settings: ActiveConfig) -> Result<Self, EndpointError> {
        self.runner = self.runner.with_settings(settings)?;
        Ok(self)
    }

    /// How long connecting and confirming the subscriptions may take.
    pub fn with_confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The lease key.
    pub fn key(&self) -> &str {
        self.runner.key()
    }

    /// Runs until `control` stops it: subscribes while this replica leads
    /// and calls `handler` for each message, one at a time, in order; the
    /// lease and the subscription are kept on a thread of their own (see
    /// the module documentation). Returns what it did.
    ///
    /// Messages still queued when leadership ends (a demotion or the
    /// stop) are not handled: they are counted as `dropped_demoted` and
    /// handed to the unhandled sink ([`with_unhandled`](Self::with_unhandled)).
    pub async fn run<H, F>(&self, control: Control, mut handler: H) -> PubSubStats
    where
        H: FnMut(PubSubMessage) -> F,
        F: Future<Output = ()>,
    {
        // Our own handle demotes the runner when the subscription dies,
        // and stops it when this loop ends.
        let (own, linked) = control.linked();
        let _stop = StopOnDrop(own.clone());
        // A clone runs on the lease thread; its lease view is the one
        // checked here.
        let runner = self.runner.clone();
        let lease = runner.lease_check();
        let key = runner.key().to_owned();
        let (feeder, queue) =
            Feeder::bounded(self.queue, self.queue_bytes, Queued::weight, self.when_full);
        let unhandled = UnhandledSink::new(
            &format!("Pub/Sub {:?}", self.patterns),
            &key,
            self.unhandled.clone(),
        );
        unhandled.register();
        let link = self
            .link
            .clone()
            .unwrap_or_else(|| Link::new(&format!("Pub/Sub {:?}", self.patterns)));
        let keeper = LeaseKeeper {
            link: link.clone(),
            reader: Arc::new(Reader {
                client: self.client.clone(),
                patterns: self.patterns.clone(),
                confirm_timeout: self.confirm_timeout,
                counters: self.counters.clone(),
                unhandled: unhandled.clone(),
                key: key.clone(),
                feeder,
                own,
                link,
            }),
            queue: queue.clone(),
        };
        metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => key.clone())
            .increment(0);
        let thread = lease_thread::spawn("pubsub-lease", move || keeper.run(runner, linked));
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                tracing::error!(
                    "Pub/Sub {:?}: cannot start its lease thread: {e}",
                    self.patterns
                );
                return self.stats();
            }
        };
        let mut late = 0_u64;
        let mut burst = 0_u32;
        // The handling's label: the configured patterns, never a channel
        // (a pattern's channels are unbounded).
        let source = self.patterns.join(",");
        // Ends when the lease thread ends (stop) and the queue is empty.
        while let Ok(Queued { msg, fence, .. }) = queue.recv().await {
            // The lease is checked where the side effect happens, under
            // the fence the message was read under: nothing is handled
            // past the deadline, after leadership ended, or under a later
            // lease than the one it was read under.
            let read_under = ElectedLease::new(lease.clone(), fence, &key);
            let reason = match read_under.state() {
                LeaseState::Valid(fence) => {
                    late = 0;
                    let handling = handler(PubSubMessage {
                        channel: channel(&msg),
                        pattern: msg.get_pattern().ok(),
                        payload: msg.get_payload_bytes().to_vec(),
                        fence,
                        lease: read_under,
                    });
                    observe::handled(&source, Some(fence), handling, |()| "handled").await;
                    Counters::add(&self.counters.handled, 1);
                    None
                }
                LeaseState::PastDeadline => {
                    late += 1;
                    Counters::add(&self.counters.refused_late, 1);
                    guard_std::metrics::record_refused_late(&key);
                    if late == 1 {
                        tracing::warn!(
                            "Pub/Sub {:?}: lease {key} past its renew deadline; refusing messages until demoted",
                            self.patterns
                        );
                    }
                    Some(UnhandledReason::PastDeadline)
                }
                LeaseState::NotHeld => {
                    Counters::add(&self.counters.dropped_demoted, 1);
                    Some(UnhandledReason::Demoted)
                }
            };
            if let Some(reason) = reason {
                unhandled.hand(unhandled_message(&msg, Some(fence), reason));
            }
            // A flood never starves the caller's other tasks: a yield every
            // few messages (one per message costs a reactor poll each).
            burst += 1;
            if burst == HANDLE_BURST {
                burst = 0;
                future::yield_now().await;
            }
        }
        // The lease thread has finished its work once the queue closed.
        if !thread.join().await {
            tracing::error!("Pub/Sub {:?}: its lease thread panicked", self.patterns);
        }
        self.stats()
    }
}

/// A message read, with the fence of the lease it was read under.
struct Queued {
    msg: redis::Msg,
    fence: u64,
    /// What it weighs in the queue ([`Queued::new`]), measured once so
    /// that adding and taking it count the same.
    weight: usize,
}

impl Queued {
    /// `msg` read under `fence`, weighed: its channel's bytes (not
    /// `get_channel_name`, which reads a channel that is not UTF-8 as
    /// `"?"`) and payload, which a producer chooses, and the message's own
    /// size (its pattern is one of the endpoint's own).
    fn new(msg: redis::Msg, fence: u64) -> Self {
        let weight =
            std::mem::size_of::<Queued>() + channel_len(&msg) + msg.get_payload_bytes().len();
        Queued { msg, fence, weight }
    }

    fn weight(&self) -> usize {
        self.weight
    }
}

/// The length in bytes of `msg`'s channel, copying nothing unless its
/// name is not UTF-8 (redis-rs then reads it as `"?"`).
fn channel_len(msg: &redis::Msg) -> usize {
    match msg.get_channel_name() {
        "?" => msg.get_channel::<Vec<u8>>().map_or(1, |bytes| bytes.len()),
        name => name.len(),
    }
}

/// `msg`'s channel as text, every byte kept (one that is not UTF-8 as
/// U+FFFD), where redis-rs's `get_channel_name` gives `"?"` for the whole.
/// A UTF-8 name is copied once, from redis-rs's reading; only `"?"` (a
/// real one-byte name, or a name that is not UTF-8) is read again as bytes.
fn channel(msg: &redis::Msg) -> String {
    let name = msg.get_channel_name();
    if name != "?" {
        return name.to_owned();
    }
    match msg.get_channel::<Vec<u8>>() {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        },
        Err(_) => msg.get_channel_name().to_owned(),
    }
}

/// `msg`, read under `fence` and not handled for `reason`.
fn unhandled_message(msg: &redis::Msg, fence: Option<u64>, reason: UnhandledReason) -> Unhandled {
    Unhandled {
        origin: channel(msg),
        payload: msg.get_payload_bytes().to_vec(),
        fence,
        reason,
    }
}

/// The endpoint's lease thread: runs the election; each promotion
/// starts a [`Reader`] on a thread of its own, and the demotion stops it.
struct LeaseKeeper {
    reader: Arc<Reader>,
    /// Takes each promotion's subscription.
    link: Link,
    /// The queue's receiving side, to empty it at a demotion.
    queue: Drain<Queued>,
}

impl LeaseKeeper {
    async fn run(self, runner: ActiveRunner, control: Control) {
        // A mutex, not a cell: on tokio this future is a task, which may
        // move between workers.
        let current: Mutex<Option<Subscription>> = Mutex::new(None);
        let (this, current) = (&self, &current);
        runner
            .run(
                control,
                move |fence| async move {
                    let subscription = this.reader.subscribe(fence).await.inspect_err(|e| {
                        this.link
                            .down(e, "the promotion fails, the lease is released");
                    })?;
                    this.link.up();
                    tracing::info!("Pub/Sub {:?} subscribed", this.reader.patterns);
                    *current.lock().unwrap_or_else(PoisonError::into_inner) = Some(subscription);
                    Ok::<(), RedisGuardError>(())
                },
                move |reason| async move {
                    // A standby subscribes to nothing: not failing, unless
                    // its last attempt (this promotion) failed.
                    if reason != DemoteReason::PromoteFailed {
                        this.link.up();
                    }
                    // Stops the reader, which unsubscribes.
                    drop(
                        current
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .take(),
                    );
                    // What waits in the queue is no longer ours to handle
                    // (the lease is already withdrawn from the handler
                    // loop, which accounts for what it takes).
                    while let Ok(Queued { msg, fence, .. }) = this.queue.try_recv() {
                        Counters::add(&this.reader.counters.dropped_demoted, 1);
                        this.reader.unhandled.hand(unhandled_message(
                            &msg,
                            Some(fence),
                            UnhandledReason::Demoted,
                        ));
                    }
                },
            )
            .await;
        // The readers have been told to stop: once they have, the queue
        // closes and the handler loop ends.
    }
}

/// A subscription read on a thread of its own; dropping it tells the
/// reader to stop (within [`READ_POLL`]), which closes the connection and
/// so ends the subscription.
struct Subscription(Arc<AtomicBool>);

impl Drop for Subscription {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Reads a subscription on a blocking connection into the handler queue.
///
/// A blocking connection on a thread of its own, not the async client:
/// the async client's connection task runs on the executor that also
/// drives the locker's connection, and a flood on the subscription would
/// hold that executor and delay the renewals.
struct Reader {
    client: redis::Client,
    patterns: Vec<String>,
    confirm_timeout: Duration,
    counters: Arc<Counters>,
    /// Takes what is read and not handled: a full queue's, what is read
    /// after leadership ended.
    unhandled: UnhandledSink,
    /// The lease key.
    key: String,
    feeder: Feeder<Queued>,
    /// Demotes the runner when the subscription dies while leading.
    own: RunHandle,
    /// Takes a subscription closed while leading.
    link: Link,
}

impl Reader {
    /// Starts a reader thread that connects and subscribes to every
    /// pattern, each confirmed, within the confirm timeout, and queues
    /// what it reads under the lease of `fence`.
    async fn subscribe(self: &Arc<Self>, fence: u64) -> Result<Subscription, RedisGuardError> {
        let subscription = Subscription(Arc::default());
        let (confirm, confirmed) = async_channel::bounded(1);
        let (reader, stop) = (self.clone(), subscription.0.clone());
        std::thread::Builder::new()
            .name("pubsub-reader".to_owned())
            .spawn(move || reader.read(fence, &stop, &confirm))
            .map_err(|e| RedisGuardError::Redis(e.into()))?;
        let timeout = self.confirm_timeout;
        future::or(
            async {
                confirmed
                    .recv()
                    .await
                    .unwrap_or(Err(RedisGuardError::Timeout(timeout)))
            },
            async {
                CallerRuntime.sleep(timeout).await;
                Err(RedisGuardError::Timeout(timeout))
            },
        )
        .await?;
        Ok(subscription)
    }

    /// The reader thread: subscribes, says so on `confirm`, then reads
    /// until `stop` or the connection fails.
    fn read(
        &self,
        fence: u64,
        stop: &AtomicBool,
        confirm: &async_channel::Sender<Result<(), RedisGuardError>>,
    ) {
        let connected = self
            .client
            .get_connection_with_timeout(self.confirm_timeout)
            .and_then(|con| {
                con.set_read_timeout(Some(self.confirm_timeout))?;
                con.set_write_timeout(Some(self.confirm_timeout))?;
                Ok(con)
            });
        let mut con = match connected {
            Ok(con) => con,
            Err(e) => {
                confirm.try_send(Err(e.into())).ok();
                return;
            }
        };
        let mut pubsub = con.as_pubsub();
        // One at a time: each call waits for its pattern's confirmation.
        let subscribed = self
            .patterns
            .iter()
            .try_for_each(|pattern| pubsub.psubscribe(pattern))
            .and_then(|()| pubsub.set_read_timeout(Some(READ_POLL)));
        if let Err(e) = subscribed {
            confirm.try_send(Err(e.into())).ok();
            return;
        }
        if confirm.try_send(Ok(())).is_err() {
            // The promotion gave up waiting: not ours to read.
            return;
        }
        while !stop.load(Ordering::Relaxed) {
            match pubsub.get_message() {
                Ok(msg) => {
                    Counters::add(&self.counters.received, 1);
                    self.feeder
                        .push(Queued::new(msg, fence), |Queued { msg, fence, .. }| {
                            Counters::add(&self.counters.dropped_full, 1);
                            self.unhandled.hand(unhandled_message(
                                &msg,
                                Some(fence),
                                UnhandledReason::QueueFull,
                            ));
                        });
                }
                Err(e) if e.is_timeout() => {}
                // A signal interrupted the read: after SIGSTOP and SIGCONT,
                // Linux never restarts a socket read that has a timeout
                // (signal(7)). Nothing was lost and the connection is
                // intact (redis-rs closes it only on end of file): read on.
                Err(e)
                    if e.is_io_error()
                        && matches!(e.retry_method(), redis::RetryMethod::RetryImmediately) => {}
                // Demoted meanwhile: the end was ours.
                Err(_) if stop.load(Ordering::Relaxed) => return,
                Err(e) => {
                    Counters::add(&self.counters.disconnects, 1);
                    metrics::counter!(guard_std::metrics::ENDPOINT_DISCONNECTS, "key" => self.key.clone())
                        .increment(1);
                    self.link.down(
                        &format!("subscription closed while leading ({e}; the server's client-output-buffer-limit, a CLIENT KILL, the network); what it held is lost"),
                        "stepping down",
                    );
                    self.own.demote();
                    return;
                }
            }
        }
        self.drain(fence, &mut pubsub);
    }

    /// Told to stop (a demotion, the stop) with the subscription alive:
    /// unsubscribes, and hands what Redis sent before the confirmation
    /// to the unhandled sink (no longer this replica's to handle). Left to redis-rs,
    /// the PubSub's drop would read and discard it, uncounted.
    fn drain(&self, fence: u64, pubsub: &mut redis::PubSub<'_>) {
        let unsubscribed = pubsub
            .set_read_timeout(Some(self.confirm_timeout))
            .and_then(|()| pubsub.punsubscribe(&self.patterns))
            .and_then(|()| pubsub.set_read_timeout(Some(READ_POLL)));
        if unsubscribed.is_err() {
            return;
        }
        // The messages read before the confirmation, then a read that
        // times out: nothing comes after it.
        while let Ok(msg) = pubsub.get_message() {
            Counters::add(&self.counters.received, 1);
            Counters::add(&self.counters.dropped_demoted, 1);
            self.unhandled.hand(unhandled_message(
                &msg,
                Some(fence),
                UnhandledReason::Demoted,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    /// A `pmessage` on `channel` with `payload`, as the server sends it.
    fn message(channel: &[u8], payload: &[u8]) -> redis::Msg {
        redis::Msg::from_owned_value(Value::Array(vec![
            Value::BulkString(b"pmessage".to_vec()),
            Value::BulkString(b"alerts.*".to_vec()),
            Value::BulkString(channel.to_vec()),
            Value::BulkString(payload.to_vec()),
        ]))
        .expect("a pmessage")
    }

    #[test]
    fn a_channel_that_is_not_utf8_weighs_and_reads_as_all_its_bytes() {
        // One byte that is not UTF-8 must not make 256 KiB of name weigh
        // nothing (redis-rs names such a channel "?").
        let mut name = vec![b'c'; 256 * 1024];
        name[7] = 0xff;
        let queued = Queued::new(message(&name, b"x"), 1);
        assert!(queued.weight() > 256 * 1024, "{}", queued.weight());
        let read = channel(&queued.msg);
        assert_eq!(read.chars().count(), 256 * 1024, "every byte kept");
        assert!(read.contains('\u{fffd}'));
        assert_eq!(channel(&message(b"alerts.fire", b"x")), "alerts.fire");
        // A channel really named "?" reads and weighs as itself.
        assert_eq!(channel(&message(b"?", b"x")), "?");
        assert_eq!(channel_len(&message(b"?", b"x")), 1);
        assert_eq!(channel_len(&message(b"alerts.fire", b"x")), 11);
    }
}
