//! A consumer in a Redis Streams consumer group.
//!
//! A consumer group delivers each entry to one consumer of the group, so
//! replicas that share the group need no guard (the seeds' rule: use the
//! source's own single delivery where it has one). What this adds is the
//! part a group leaves to its consumers: acknowledge on success, retry a
//! failing entry under a [`RetryPolicy`], hand it to the stream
//! dead-letter queue when the retries are spent (every field of the
//! entry recorded, so the dead letter outlives the stream's trimming; see
//! [`guard_redis::StreamDlq`] for the format), and claim the entries a
//! dead consumer left pending (`XAUTOCLAIM`) once they have been idle for
//! longer than any handler may take.
//!
//! Delivery is at least once: an entry whose handler ran but whose `XACK`
//! was lost, or whose handler outlived the claim idle time, is handled
//! again. Choose the idle time above the longest handling time.
//!
//! # A restart
//!
//! A consumer started under the name of one that stopped without
//! acknowledging what it had read (killed mid-round) takes those entries
//! first, in stream order, before anything new (`XREADGROUP` from `0`, the
//! history the group keeps per consumer name): the stream's order holds
//! across the restart, and nothing waits for the claim idle time. Give a
//! replica the same name across its restarts for this; under a new name,
//! the old name's pending entries (the batch it had in hand, and any it
//! left pending after failures) are claimed once idle, behind whatever
//! newer entries were read meanwhile. An entry of that
//! history that the stream no longer holds (trimmed or deleted) is
//! acknowledged and logged: there is nothing left to hand on.
//!
//! # Batches, concurrency and order
//!
//! Each round reads up to a batch of entries (`XREADGROUP COUNT`; idle
//! ones are claimed with `XAUTOCLAIM` first, at most every half claim
//! idle time or second), handles them, and acknowledges the round in
//! one multi-id `XACK`. With the default concurrency of 1, entries are
//! handled one at a time in stream order (claimed ones first). With
//! [`with_concurrency`](StreamConsumer::with_concurrency) `n`, up to `n`
//! entries of a round are in the handler at once: they start in stream
//! order and may finish in any order; every entry of a round has finished
//! (its retries included) before the next round is read. Entries that
//! must be handled in order (one device's readings, say) need a
//! concurrency of 1, or one stream per key.

use guard_std::run::CallerRuntime;
use guard_std::run::Runtime as _;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use guard_core::retry::{Classifier, RetryPolicy};
use guard_std::run::Control;
use redis::Value;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

use guard_redis::{DeadLetter, RedisConnection, RedisGuardError, StreamDlq};

use super::EndpointError;
use crate::deliver;
use crate::link::Link;
use crate::parameter::Parameter;

/// Entries read per round, new or claimed.
pub const DEFAULT_BATCH: usize = 10;
/// How long to wait after a round that found nothing.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long an entry stays pending on a consumer before another claims it.
pub const DEFAULT_CLAIM_IDLE: Duration = Duration::from_secs(30);

/// Where a new group starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupStart {
    /// Every entry already in the stream (`0`): nothing written before the
    /// first consumer started is lost.
    Beginning,
    /// Only entries added after the group is created (`$`).
    NewEntries,
}

/// One entry of the stream, as the handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamMessage {
    /// The entry's id.
    pub id: String,
    /// Its fields, in no particular order.
    pub fields: HashMap<String, Vec<u8>>,
}

impl StreamMessage {
    /// The value of `name`, if the entry has that field.
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields.get(name).map(Vec::as_slice)
    }

    /// The `payload` field: a dead letter's `payload` (the dead letter
    /// also records every field, this one included).
    pub fn payload(&self) -> Option<&[u8]> {
        self.field("payload")
    }
}

/// What became of one entry.
enum Outcome {
    /// Handled: acknowledge.
    Acked(String),
    /// Recorded as a dead letter: acknowledge.
    DeadLettered(String),
    /// Failed and not recorded: stays pending, to be claimed again.
    LeftPending,
}

/// What one round reads.
enum Read<'a> {
    /// This consumer's own pending entries after the id in `after`,
    /// which the round moves past them (empty once none is left).
    Own { after: &'a mut String },
    /// Idle entries of other consumers, then new ones.
    ClaimedAndNew,
    /// New entries only.
    New,
}

/// What a consumer did, counted from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumeStats {
    /// Entries handled successfully and acknowledged.
    pub acked: u64,
    /// Entries whose retries were spent, recorded in the dead-letter queue
    /// and acknowledged.
    pub dead_lettered: u64,
    /// Entries that failed and stay pending (no dead-letter queue, or it
    /// could not record them): claimed and tried again after the idle time.
    pub left_pending: u64,
    /// Entries taken over from other consumers.
    pub claimed: u64,
    /// Entries this consumer's name had read before a restart without
    /// acknowledging them, taken first at its start.
    pub resumed: u64,
}

/// One consumer of a group on one stream; see the module documentation.
///
/// ```no_run
/// # smol::block_on(async {
/// use std::time::Duration;
/// use guard_core::retry::{Classifier, RetryPolicy};
/// use guard_endpoints::redis::StreamConsumer;
/// use guard_redis::{RedisConnection, StreamDlq, Topology};
///
/// let conn = RedisConnection::connect(
///     Topology::Standalone { url: "redis://127.0.0.1:6379/".into() },
///     Duration::from_millis(500),
/// ).await?;
/// let consumer = StreamConsumer::new(conn.clone(), "orders", "billing", "replica-1")?
///     .with_retry(RetryPolicy::fixed_delay(2, Duration::from_millis(50)))?
///     .with_dead_letters(StreamDlq::new(conn), "orders")?;
/// let (_handle, control) = guard_smol::control();
/// consumer
///     .run(control, Classifier::retry_all(), |message| async move {
///         println!("{} {:?}", message.id, message.payload());
///         Ok::<(), String>(())
///     })
///     .await;
/// # Ok::<(), guard_endpoints::redis::EndpointError>(())
/// # });
/// ```
pub struct StreamConsumer {
    conn: RedisConnection,
    stream: String,
    group: String,
    consumer: String,
    batch: usize,
    concurrency: usize,
    poll_interval: Duration,
    claim_idle: Duration,
    start: GroupStart,
    retry: RetryPolicy,
    dead_letters: Option<(StreamDlq, String)>,
    link: Option<Link>,
}

impl fmt::Debug for StreamConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamConsumer")
            .field("stream", &self.stream)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .field("claim_idle", &self.claim_idle)
            .finish()
    }
}

fn named(parameter: Parameter, value: &str) -> Result<String, EndpointError> {
    if value.is_empty() {
        return Err(EndpointError::invalid(
            parameter,
            value,
            "must not be empty",
        ));
    }
    Ok(value.to_owned())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn message(entry: StreamId) -> StreamMessage {
    let fields = entry
        .map
        .into_iter()
        .map(|(name, value)| {
            let bytes = match value {
                Value::BulkString(bytes) => bytes,
                Value::SimpleString(s) => s.into_bytes(),
                Value::Int(i) => i.to_string().into_bytes(),
                other => format!("{other:?}").into_bytes(),
            };
            (name, bytes)
        })
        .collect();
    StreamMessage {
        id: entry.id,
        fields,
    }
}

impl StreamConsumer {
    /// Consumer `consumer` of `group` on `stream`, with the defaults: 10
    /// entries a round, 100 ms between empty rounds, claims after 30 s
    /// idle, the original's retry policy, no dead-letter queue.
    ///
    /// Each replica needs its own consumer name; the group is created on
    /// first use ([`GroupStart::Beginning`] unless set).
    pub fn new(
        conn: RedisConnection,
        stream: &str,
        group: &str,
        consumer: &str,
    ) -> Result<Self, EndpointError> {
        Ok(StreamConsumer {
            conn,
            stream: named(Parameter::Stream, stream)?,
            group: named(Parameter::ConsumerGroup, group)?,
            consumer: named(Parameter::ConsumerName, consumer)?,
            batch: DEFAULT_BATCH,
            concurrency: 1,
            poll_interval: DEFAULT_POLL_INTERVAL,
            claim_idle: DEFAULT_CLAIM_IDLE,
            start: GroupStart::Beginning,
            retry: RetryPolicy::new(),
            dead_letters: None,
            link: None,
        })
    }

    /// Entries read per round (at least 1).
    pub fn with_batch(mut self, batch: usize) -> Result<Self, EndpointError> {
        if batch == 0 {
            return Err(EndpointError::invalid(
                Parameter::Batch,
                batch.to_string(),
                "must be at least 1",
            ));
        }
        self.batch = batch;
        Ok(self)
    }

    /// How many entries of a round may be in the handler at once (at
    /// least 1, at most the batch); see the module documentation for the
    /// order this gives.
    pub fn with_concurrency(mut self, concurrency: usize) -> Result<Self, EndpointError> {
        if concurrency == 0 || concurrency > self.batch {
            return Err(EndpointError::invalid(
                Parameter::Concurrency,
                concurrency.to_string(),
                format!(
                    "must be from 1 to the batch ({}): a round holds at most a batch",
                    self.batch
                ),
            ));
        }
        self.concurrency = concurrency;
        Ok(self)
    }

    /// Reports the connection to `link` (see [`crate::link`]): down from
    /// a round that failed at Redis, up again at the next that did not.
    pub fn with_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// The wait after a round that found nothing.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long an entry must have been pending on another consumer before
    /// this one claims it (at least 1 ms); longer than any handler runs.
    pub fn with_claim_idle(mut self, idle: Duration) -> Result<Self, EndpointError> {
        if idle < Duration::from_millis(1) {
            return Err(EndpointError::invalid(
                Parameter::ClaimIdle,
                format!("{idle:?}"),
                "must be at least 1 ms",
            ));
        }
        self.claim_idle = idle;
        Ok(self)
    }

    /// Where the group starts if this consumer creates it.
    pub fn with_group_start(mut self, start: GroupStart) -> Self {
        self.start = start;
        self
    }

    /// How a failing entry is retried before it is given up. The
    /// consumer draws no random bits, so a policy with jitter is refused.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Result<Self, EndpointError> {
        self.retry = deliver::checked(policy).map_err(EndpointError::InvalidInput)?;
        Ok(self)
    }

    /// Records given-up entries in `dlq` under `topic`, with this stream
    /// and the entry id as their origin (so a replay writes them back).
    /// Without one, a given-up entry stays pending and is tried again
    /// once it is claimed.
    pub fn with_dead_letters(mut self, dlq: StreamDlq, topic: &str) -> Result<Self, EndpointError> {
        dlq.stream_key(topic)?;
        self.dead_letters = Some((dlq, topic.to_owned()));
        Ok(self)
    }

    /// The stream's key.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Creates the group (and the stream) unless it exists; true if it
    /// was created now.
    pub async fn create_group(&self) -> Result<bool, RedisGuardError> {
        let start = match self.start {
            GroupStart::Beginning => "0",
            GroupStart::NewEntries => "$",
        };
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(start)
            .arg("MKSTREAM");
        match self.conn.query::<()>(&cmd).await {
            Ok(()) => Ok(true),
            Err(RedisGuardError::Redis(e)) if e.code() == Some("BUSYGROUP") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Claims entries idle on other consumers for longer than the claim
    /// idle time, up to one batch.
    pub async fn claim_idle(&self) -> Result<Vec<StreamMessage>, RedisGuardError> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(millis(self.claim_idle))
            .arg("0-0")
            .arg("COUNT")
            .arg(self.batch);
        let reply: StreamAutoClaimReply = self.conn.query(&cmd).await?;
        Ok(reply.claimed.into_iter().map(message).collect())
    }

    /// Reads up to one batch of entries never delivered to the group.
    pub async fn read_new(&self) -> Result<Vec<StreamMessage>, RedisGuardError> {
        self.read_group(">").await
    }

    /// Reads up to one batch of this consumer's own pending entries with
    /// ids after `after` (its history: read before, never acknowledged).
    /// An entry the stream no longer holds comes back without fields.
    async fn read_own(&self, after: &str) -> Result<Vec<StreamMessage>, RedisGuardError> {
        self.read_group(after).await
    }

    /// `XREADGROUP` of up to one batch from `id`: `>` for new entries, an
    /// id for this consumer's pending entries after it.
    async fn read_group(&self, id: &str) -> Result<Vec<StreamMessage>, RedisGuardError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(id);
        let reply: Option<StreamReadReply> = self.conn.query(&cmd).await?;
        Ok(reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .map(message)
            .collect())
    }

    /// Acknowledges `ids` in one `XACK`.
    async fn ack(&self, ids: &[String]) -> Result<(), RedisGuardError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group).arg(ids);
        self.conn.query::<u64>(&cmd).await.map(drop)
    }

    /// Handles one entry: retries, then says whether to acknowledge it
    /// (handled, or recorded as a dead letter) or leave it pending.
    async fn handle<F, Fut, E>(
        &self,
        entry: StreamMessage,
        classifier: Classifier<E>,
        handler: &RefCell<&mut F>,
    ) -> Result<Outcome, EndpointError>
    where
        F: FnMut(StreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let handled = deliver::handle(self.retry, classifier, &self.stream, &entry, |entry| {
            // Borrowed only to make the call's future, never across an
            // await: concurrent entries share the handler.
            (handler.borrow_mut())(entry)
        })
        .await;
        let failure = match handled {
            Ok(()) => return Ok(Outcome::Acked(entry.id)),
            Err(failure) => failure,
        };
        let error = failure.to_string();
        let Some((dlq, topic)) = &self.dead_letters else {
            tracing::error!(
                "stream {} entry {}: {error}; no dead-letter queue, left pending",
                self.stream,
                entry.id
            );
            return Ok(Outcome::LeftPending);
        };
        // Every field, not only `payload`: the dead letter must hold the
        // entry's whole content once the origin stream is trimmed.
        let mut fields: Vec<(&str, &[u8])> = entry
            .fields
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_slice()))
            .collect();
        fields.sort_unstable();
        let letter = DeadLetter {
            payload: entry.payload().unwrap_or_default(),
            error: &error,
            attempts: failure.attempts,
            origin_stream: Some(&self.stream),
            origin_id: Some(&entry.id),
            fields: &fields,
        };
        match dlq.send(topic, &letter).await {
            Ok(id) => {
                tracing::warn!(
                    "stream {} entry {}: {error}; dead letter {id}",
                    self.stream,
                    entry.id
                );
                Ok(Outcome::DeadLettered(entry.id))
            }
            Err(e) => {
                // Not acknowledged: the entry stays pending and is claimed
                // again later rather than lost.
                tracing::error!(
                    "stream {} entry {}: {error}; dead-letter queue failed ({e}), left pending",
                    self.stream,
                    entry.id
                );
                Ok(Outcome::LeftPending)
            }
        }
    }

    /// One round: claim idle entries, read new ones, handle each. Returns
    /// how many entries the round handled.
    pub async fn poll<F, Fut, E>(
        &self,
        classifier: Classifier<E>,
        handler: &mut F,
        stats: &mut ConsumeStats,
    ) -> Result<usize, EndpointError>
    where
        F: FnMut(StreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        // Boxed: the nested handler, retry and request futures are deep.
        Box::pin(self.round(Read::ClaimedAndNew, classifier, handler, stats)).await
    }

    /// How often [`run`](Self::run) looks for idle entries to claim: half
    /// the claim idle time, at most a second. An entry is claimed at most
    /// this long after it became claimable, and a busy consumer spends one
    /// `XAUTOCLAIM` per interval instead of one per round.
    fn claim_every(&self) -> Duration {
        (self.claim_idle / 2).min(Duration::from_secs(1))
    }

    /// One round, reading what `read` says.
    async fn round<F, Fut, E>(
        &self,
        read: Read<'_>,
        classifier: Classifier<E>,
        handler: &mut F,
        stats: &mut ConsumeStats,
    ) -> Result<usize, EndpointError>
    where
        F: FnMut(StreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        // Where this name's history goes on after this round: moved only
        // once the round succeeded, so a round that fails at Redis reads
        // the same entries again (still first) rather than leaving them
        // to the claim, behind newer ones.
        let mut next_history = None;
        let (claimed, fresh) = match read {
            Read::Own { after } => {
                let own = self.read_own(after.as_str()).await?;
                // Past what was read, whatever each entry's outcome: one
                // left pending again is not read again in a loop; the
                // claim takes it once idle.
                let next = own.last().map(|last| last.id.clone()).unwrap_or_default();
                next_history = Some((after, next));
                let (gone, own): (Vec<_>, Vec<_>) =
                    own.into_iter().partition(|e| e.fields.is_empty());
                if !gone.is_empty() {
                    let ids: Vec<String> = gone.into_iter().map(|e| e.id).collect();
                    tracing::warn!(
                        "stream {}: entries {ids:?} pending on {} are no longer in the stream (trimmed or deleted); acknowledged",
                        self.stream,
                        self.consumer
                    );
                    self.ack(&ids).await?;
                }
                stats.resumed += own.len() as u64;
                (own, Vec::new())
            }
            Read::ClaimedAndNew => {
                let claimed = self.claim_idle().await?;
                stats.claimed += claimed.len() as u64;
                (claimed, self.read_new().await?)
            }
            Read::New => (Vec::new(), self.read_new().await?),
        };
        let count = claimed.len() + fresh.len();
        // One XACK for the round: every entry in it was handled (or
        // dead-lettered) before. Should the process die first, they stay
        // pending and are delivered again (stream delivery is at least
        // once), never lost.
        let mut acks = Vec::with_capacity(count);
        let mut handled = Ok(());
        let handler = RefCell::new(handler);
        let mut entries = claimed.into_iter().chain(fresh);
        // At most `concurrency` entries in the handler at once, started in
        // stream order.
        let mut in_flight = FuturesUnordered::new();
        loop {
            while handled.is_ok() && in_flight.len() < self.concurrency {
                let Some(entry) = entries.next() else { break };
                in_flight.push(self.handle(entry, classifier, &handler));
            }
            let Some(outcome) = in_flight.next().await else {
                break;
            };
            match outcome {
                Ok(Outcome::Acked(id)) => {
                    acks.push(id);
                    stats.acked += 1;
                }
                Ok(Outcome::DeadLettered(id)) => {
                    acks.push(id);
                    stats.dead_lettered += 1;
                }
                Ok(Outcome::LeftPending) => stats.left_pending += 1,
                // Starts nothing more; what is in flight finishes and is
                // acknowledged.
                Err(e) => handled = Err(e),
            }
        }
        self.ack(&acks).await?;
        let count = handled.map(|()| count)?;
        if let Some((after, next)) = next_history {
            *after = next;
        }
        Ok(count)
    }

    /// Consumes until `control` stops it, then returns what it did. Redis
    /// failures are logged and the round is tried again after the poll
    /// interval; an entry being handled when stop comes is finished first.
    pub async fn run<F, Fut, E>(
        &self,
        control: Control,
        classifier: Classifier<E>,
        mut handler: F,
    ) -> ConsumeStats
    where
        F: FnMut(StreamMessage) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: fmt::Display,
    {
        let mut stats = ConsumeStats::default();
        let mut group_ready = false;
        let link = self
            .link
            .clone()
            .unwrap_or_else(|| Link::new(&format!("stream {} group {}", self.stream, self.group)));
        let mut next_claim = std::time::Instant::now();
        // This name's history first (see the module documentation): from
        // `0`, then after the last id read, until a read comes back
        // empty (the cursor is then empty).
        let mut history = String::from("0-0");
        while !control.is_stopped() {
            let read = if !history.is_empty() {
                Read::Own {
                    after: &mut history,
                }
            } else if std::time::Instant::now() >= next_claim {
                next_claim = std::time::Instant::now() + self.claim_every();
                Read::ClaimedAndNew
            } else {
                Read::New
            };
            let resuming = matches!(read, Read::Own { .. });
            let round = async {
                if !group_ready {
                    self.create_group().await?;
                    group_ready = true;
                }
                self.round(read, classifier, &mut handler, &mut stats).await
            };
            // Boxed: the nested handler, retry and request futures are
            // deep, and a caller's future would carry all of them inline.
            let idle = match Box::pin(round).await {
                Ok(handled) => {
                    link.up();
                    // The end of the history is not the end of the work.
                    handled == 0 && !resuming
                }
                Err(e) => {
                    // The group is gone (Redis lost its data: a restart
                    // without persistence, a failover to a replica that
                    // missed it, FLUSHALL): create it again next round.
                    if let EndpointError::Redis(RedisGuardError::Redis(redis)) = &e
                        && redis.code() == Some("NOGROUP")
                    {
                        group_ready = false;
                    }
                    // A Redis that is down fails every poll interval.
                    let then = format!("trying again every {:?}", self.poll_interval);
                    link.down(&e, &then);
                    true
                }
            };
            if idle {
                futures_lite::future::or(control.stopped(), async {
                    CallerRuntime.sleep(self.poll_interval).await;
                })
                .await;
            }
        }
        stats
    }
}
