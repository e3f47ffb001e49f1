//! A persistent dead-letter queue on Redis Streams, one stream per topic.
//!
//! Keys (the topic is the hash tag, so a topic's keys share a cluster
//! slot): entries `<prefix>:{<topic>}:dlq`, replayed ids
//! `<prefix>:{<topic>}:dlq:replayed`, replay claims
//! `<prefix>:{<topic>}:dlq:claim:<id>`. The default prefix is the
//! original's `stream:topic`.
//!
//! Replay back to the origin stream is idempotent, across cluster slots
//! too: the origin stream rarely shares the topic's hash tag, so the
//! replay is two atomic steps, each in one slot. First, in the origin's
//! slot, a script appends the entry to the origin stream and sets a
//! marker `<prefix>:replay:{<origin's hash tag>}:<topic>:<id>` in the
//! same step, or, if the marker exists, appends nothing; then the entry
//! is recorded as replayed in the topic's slot. A process that dies
//! between the two steps leaves the marker, so the next replay appends
//! nothing and only records: no entry is replayed twice and none is lost.
//! The limit: markers expire after the marker retention
//! ([`DEFAULT_REPLAY_MARKER_RETENTION`], a day), so two replays of one
//! entry could both append only if one of them stalls for longer than
//! that between its check and its append.
//!
//! Replay to a handler claims the entry with a lease (a token of its
//! own), calls the handler, then records it; a failed handler releases
//! its own claim only and leaves the entry replayable. It delivers once
//! **if the handler finishes within the replay lease** (30 s by default):
//! a handler that outlives its lease may run while another replay holds
//! a new claim, and its outcome then says so
//! ([`ReplayOutcome::ReplayedAfterLease`]).

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use guard_std::TokenIds;
use redis::Script;
use redis::streams::StreamRangeReply;

use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};

/// The original's stream prefix.
pub const DEFAULT_STREAM_PREFIX: &str = "stream:topic";

/// How long a replay to a handler may take before another replay may try.
pub const DEFAULT_REPLAY_LEASE: Duration = Duration::from_secs(30);

/// How long the marker of a replay to the origin stream is kept (see the
/// module notes).
pub const DEFAULT_REPLAY_MARKER_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// How much of a topic's dead letters are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Everything, until deleted or purged.
    Unbounded,
    /// The newest `n` entries (`XADD MAXLEN = n`).
    MaxLen(u64),
    /// Entries younger than this (`XADD MINID`, from the client's clock).
    MaxAge(Duration),
}

/// A failure to record.
#[derive(Clone, Copy, Debug)]
pub struct DeadLetter<'a> {
    /// The element, as bytes.
    pub payload: &'a [u8],
    /// Why it failed.
    pub error: &'a str,
    /// Attempts made.
    pub attempts: u32,
    /// The stream it came from, for replay back to it.
    pub origin_stream: Option<&'a str>,
    /// Its id in that stream.
    pub origin_id: Option<&'a str>,
    /// The fields of the stream entry it was, by name (empty for an
    /// element of another source): recorded as `field:<name>`, so the
    /// dead letter keeps the entry's whole content, and written back
    /// instead of `payload` by [`StreamDlq::replay_to_origin`].
    pub fields: &'a [(&'a str, &'a [u8])],
}

/// A recorded dead letter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterEntry {
    /// Its id in the dead-letter stream.
    pub id: String,
    /// The element.
    pub payload: Vec<u8>,
    /// Why it failed ("Unknown error" when none was recorded).
    pub error: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it was recorded, in Unix milliseconds.
    pub failed_at_ms: u64,
    /// The stream it came from.
    pub origin_stream: Option<String>,
    /// Its id there.
    pub origin_id: Option<String>,
    /// The fields of the stream entry it was, sorted by name (empty when
    /// none were recorded).
    pub fields: Vec<(String, Vec<u8>)>,
}

/// What a replay did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplayOutcome {
    /// Delivered now; for a stream replay, the new entry's id.
    Replayed(Option<String>),
    /// Delivered before: not delivered again.
    AlreadyReplayed,
    /// No such entry.
    Missing,
    /// Another replay holds the entry's claim.
    InProgress,
    /// Delivered to the handler, but the handler finished after its
    /// replay lease had expired: another replay may have delivered the
    /// entry too.
    ReplayedAfterLease,
    /// The entry names no origin stream to go back to.
    NoOrigin,
}

/// Records a dead letter and trims the stream (and the replayed ids of
/// trimmed entries) in one step. KEYS: dlq, replayed. ARGV: mode, limit,
/// then field/value pairs.
const SEND: &str = r"
local xadd = {'XADD', KEYS[1]}
if ARGV[1] == 'maxlen' then
  xadd[#xadd + 1] = 'MAXLEN'; xadd[#xadd + 1] = '='; xadd[#xadd + 1] = ARGV[2]
elseif ARGV[1] == 'minid' then
  xadd[#xadd + 1] = 'MINID'; xadd[#xadd + 1] = '='; xadd[#xadd + 1] = ARGV[2]
end
xadd[#xadd + 1] = '*'
for i = 3, #ARGV do xadd[#xadd + 1] = ARGV[i] end
local id = redis.call(unpack(xadd))
if ARGV[1] ~= 'none' then
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #oldest > 0 then
    local ms = tonumber(string.match(oldest[1][1], '^(%d+)'))
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. ms)
  end
end
return id
";

/// Appends a dead letter to its origin stream unless its marker says it
/// was appended already; sets the marker in the same step. KEYS: origin,
/// marker (one slot: the marker carries the origin's hash tag). ARGV:
/// marker retention ms, dead letter id, then the entry's field/value
/// pairs. Returns the id appended now, or the one appended before.
const APPEND_TO_ORIGIN: &str = r"
local before = redis.call('GET', KEYS[2])
if before then return {'already', before} end
local xadd = {'XADD', KEYS[1], '*'}
for i = 3, #ARGV do xadd[#xadd + 1] = ARGV[i] end
xadd[#xadd + 1] = 'replayed_from'; xadd[#xadd + 1] = ARGV[2]
local id = redis.call(unpack(xadd))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {'replayed', id}
";

/// Claims an entry for a handler replay. KEYS: dlq, replayed, claim.
/// ARGV: id, lease ms, claim token.
const CLAIM: &str = r"
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 'already' end
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 'missing' end
if redis.call('SET', KEYS[3], ARGV[3], 'NX', 'PX', ARGV[2]) then return 'claimed' end
return 'busy'
";

/// Records a replay. KEYS: replayed, claim (for a handler replay). ARGV:
/// id, claim token. Drops the claim only if it is still this replay's;
/// returns 1 if it was (or there is none), 0 if the lease had expired.
const RECORD: &str = r"
redis.call('ZADD', KEYS[1], tonumber(string.match(ARGV[1], '^(%d+)')), ARGV[1])
if not KEYS[2] then return 1 end
if redis.call('GET', KEYS[2]) == ARGV[2] then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
";

/// Drops a claim if it is still this replay's. KEYS: claim; ARGV: token.
const UNCLAIM: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// A topic's dead letters in a Redis stream, with admin operations.
///
/// A dead letter is one entry of the topic's stream, with the fields
/// `payload` (bytes), `error`, `attempts`, `failed_at` (Unix
/// milliseconds), `origin_stream` and `origin_id` (each only when known)
/// and, for a dead letter of a stream entry, each field `<name>` of that
/// entry as `field:<name>` with its value unchanged (binary and empty
/// values included). The entry's content is kept whole in the dead
/// letter: trimming or deleting the origin stream loses nothing, and
/// [`replay_to_origin`](Self::replay_to_origin) writes the fields back.
pub struct StreamDlq {
    conn: RedisConnection,
    prefix: String,
    retention: Retention,
    lease: Duration,
    marker_retention: Duration,
    send: Script,
    append: Script,
    claim: Script,
    record: Script,
    unclaim: Script,
    ids: TokenIds,
}

impl fmt::Debug for StreamDlq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDlq")
            .field("prefix", &self.prefix)
            .field("retention", &self.retention)
            .finish()
    }
}

fn checked_topic(topic: &str) -> Result<&str, RedisGuardError> {
    if topic.is_empty() || topic.contains(['{', '}', '*', '?', '[', ']']) {
        return Err(RedisGuardError::invalid(
            Parameter::DeadLetterTopic,
            topic,
            "must be non-empty and contain no braces or glob characters",
        ));
    }
    Ok(topic)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl StreamDlq {
    /// A dead-letter queue under the default prefix, keeping everything.
    pub fn new(conn: RedisConnection) -> Self {
        StreamDlq {
            conn,
            prefix: DEFAULT_STREAM_PREFIX.to_owned(),
            retention: Retention::Unbounded,
            lease: DEFAULT_REPLAY_LEASE,
            marker_retention: DEFAULT_REPLAY_MARKER_RETENTION,
            send: Script::new(SEND),
            append: Script::new(APPEND_TO_ORIGIN),
            claim: Script::new(CLAIM),
            record: Script::new(RECORD),
            unclaim: Script::new(UNCLAIM),
            ids: TokenIds::new(),
        }
    }

    /// Keys under `prefix` (non-empty, no braces or glob characters).
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, RedisGuardError> {
        if prefix.is_empty() || prefix.contains(['{', '}', '*', '?', '[', ']']) {
            return Err(RedisGuardError::invalid(
                Parameter::DeadLetterPrefix,
                prefix,
                "must be non-empty and contain no braces or glob characters",
            ));
        }
        self.prefix = prefix.to_owned();
        Ok(self)
    }

    /// How much to keep per topic.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// How long a handler replay may take before another replay may try.
    pub fn with_replay_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long the marker of a replay to the origin stream is kept (at
    /// least 1 ms); see the module notes.
    pub fn with_replay_marker_retention(mut self, retention: Duration) -> Self {
        self.marker_retention = retention;
        self
    }

    /// The marker of entry `id` of `topic` replayed to `origin`: in the
    /// origin's cluster slot (its hash tag, as Redis computes it).
    fn marker_key(&self, topic: &str, origin: &str, id: &str) -> Result<String, RedisGuardError> {
        Ok(format!(
            "{}:replay:{{{}}}:{}:{id}",
            self.prefix,
            hash_tag(origin),
            checked_topic(topic)?
        ))
    }

    /// The stream of `topic`: `<prefix>:{<topic>}:dlq`.
    pub fn stream_key(&self, topic: &str) -> Result<String, RedisGuardError> {
        Ok(format!("{}:{{{}}}:dlq", self.prefix, checked_topic(topic)?))
    }

    fn replayed_key(&self, topic: &str) -> Result<String, RedisGuardError> {
        Ok(format!("{}:replayed", self.stream_key(topic)?))
    }

    /// Records a dead letter; returns its id.
    pub async fn send(
        &self,
        topic: &str,
        letter: &DeadLetter<'_>,
    ) -> Result<String, RedisGuardError> {
        let (mode, limit) = match self.retention {
            Retention::Unbounded => ("none", String::new()),
            Retention::MaxLen(n) => ("maxlen", n.to_string()),
            Retention::MaxAge(age) => {
                let age_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
                ("minid", format!("{}-0", now_ms().saturating_sub(age_ms)))
            }
        };
        let mut invocation = self.send.prepare_invoke();
        invocation
            .key(self.stream_key(topic)?)
            .key(self.replayed_key(topic)?)
            .arg(mode)
            .arg(limit)
            .arg("payload")
            .arg(letter.payload)
            .arg("error")
            .arg(letter.error)
            .arg("attempts")
            .arg(letter.attempts)
            .arg("failed_at")
            .arg(now_ms());
        // No empty or absent values are written (the original's XADD
        // regression): optional fields are left out.
        if let Some(origin) = letter.origin_stream {
            invocation.arg("origin_stream").arg(origin);
        }
        if let Some(id) = letter.origin_id {
            invocation.arg("origin_id").arg(id);
        }
        // The entry's own fields, empty values included: they are its
        // content, not optional metadata.
        for (name, value) in letter.fields {
            invocation.arg(format!("{FIELD_PREFIX}{name}")).arg(*value);
        }
        self.conn.invoke(&invocation).await
    }

    /// Up to `count` entries from `start` (an id, or `-` for the oldest).
    pub async fn range(
        &self,
        topic: &str,
        start: &str,
        count: usize,
    ) -> Result<Vec<DeadLetterEntry>, RedisGuardError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let reply: StreamRangeReply = self
            .conn
            .query(
                redis::cmd("XRANGE")
                    .arg(self.stream_key(topic)?)
                    .arg(start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(count),
            )
            .await?;
        Ok(reply.ids.into_iter().map(parse_entry).collect())
    }

    /// Entries held for `topic`.
    pub async fn size(&self, topic: &str) -> Result<u64, RedisGuardError> {
        self.conn
            .query(redis::cmd("XLEN").arg(self.stream_key(topic)?))
            .await
    }

    /// Deletes one entry; returns whether it existed.
    pub async fn delete(&self, topic: &str, id: &str) -> Result<bool, RedisGuardError> {
        let removed: u64 = self
            .conn
            .query(redis::cmd("XDEL").arg(self.stream_key(topic)?).arg(id))
            .await?;
        let _: u64 = self
            .conn
            .query(redis::cmd("ZREM").arg(self.replayed_key(topic)?).arg(id))
            .await?;
        Ok(removed == 1)
    }

    /// Deletes a topic's dead letters; returns how many there were.
    pub async fn purge(&self, topic: &str) -> Result<u64, RedisGuardError> {
        let size = self.size(topic).await?;
        let _: u64 = self
            .conn
            .query(
                redis::cmd("DEL")
                    .arg(self.stream_key(topic)?)
                    .arg(self.replayed_key(topic)?),
            )
            .await?;
        Ok(size)
    }

    /// The topics with a dead-letter stream, found by a `SCAN` scoped to
    /// this prefix's pattern (never the whole keyspace by `KEYS`).
    pub async fn list_topics(&self) -> Result<Vec<String>, RedisGuardError> {
        let pattern = format!("{}:{{*}}:dlq", self.prefix);
        let head = format!("{}:{{", self.prefix);
        let mut topics: Vec<String> = self
            .conn
            .scan_keys(&pattern, "stream")
            .await?
            .into_iter()
            .filter_map(|key| Some(key.strip_prefix(&head)?.strip_suffix("}:dlq")?.to_owned()))
            .collect();
        topics.sort();
        topics.dedup();
        Ok(topics)
    }

    /// Replays entry `id` back to the stream it came from, once (see the
    /// module notes: two steps, each atomic in its own slot). The new
    /// entry has the recorded entry's fields, or `payload` when none were
    /// recorded, and `replayed_from` naming the dead letter (in place of
    /// a `replayed_from` of an entry replayed before).
    pub async fn replay_to_origin(
        &self,
        topic: &str,
        id: &str,
    ) -> Result<ReplayOutcome, RedisGuardError> {
        if self.is_replayed(topic, id).await? {
            return Ok(ReplayOutcome::AlreadyReplayed);
        }
        let Some(entry) = self
            .range(topic, id, 1)
            .await?
            .into_iter()
            .find(|e| e.id == id)
        else {
            return Ok(ReplayOutcome::Missing);
        };
        let Some(origin) = entry.origin_stream else {
            return Ok(ReplayOutcome::NoOrigin);
        };
        let mut append = self.append.prepare_invoke();
        append
            .key(&origin)
            .key(self.marker_key(topic, &origin, id)?)
            .arg(millis(self.marker_retention))
            .arg(id);
        if entry.fields.is_empty() {
            append.arg("payload").arg(&entry.payload);
        }
        for (name, value) in entry.fields.iter().filter(|(n, _)| n != "replayed_from") {
            append.arg(name).arg(value);
        }
        let appended: Vec<String> = self.conn.invoke(&append).await?;
        let outcome = match appended.first().map(String::as_str) {
            Some("replayed") => ReplayOutcome::Replayed(appended.get(1).cloned()),
            // Appended by a replay that died before it recorded.
            Some("already") => ReplayOutcome::AlreadyReplayed,
            _ => return Err(RedisGuardError::UnexpectedReply(format!("{appended:?}"))),
        };
        let mut record = self.record.prepare_invoke();
        record.key(self.replayed_key(topic)?).arg(id);
        let _: i64 = self.conn.invoke(&record).await?;
        Ok(outcome)
    }

    /// Replays entry `id` to `handler`, once: an `Err` from the handler
    /// leaves the entry replayable and is returned.
    pub async fn replay_with<F, Fut, E>(
        &self,
        topic: &str,
        id: &str,
        handler: F,
    ) -> Result<Result<ReplayOutcome, E>, RedisGuardError>
    where
        F: FnOnce(DeadLetterEntry) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let claim_key = format!("{}:claim:{id}", self.stream_key(topic)?);
        // This replay's own token: only it may drop its claim.
        let token = self.ids.next_id().to_string();
        let mut claim = self.claim.prepare_invoke();
        claim
            .key(self.stream_key(topic)?)
            .key(self.replayed_key(topic)?)
            .key(&claim_key)
            .arg(id)
            .arg(millis(self.lease))
            .arg(&token);
        let claimed: String = self.conn.invoke(&claim).await?;
        match claimed.as_str() {
            "claimed" => {}
            "already" => return Ok(Ok(ReplayOutcome::AlreadyReplayed)),
            "missing" => return Ok(Ok(ReplayOutcome::Missing)),
            _ => return Ok(Ok(ReplayOutcome::InProgress)),
        }
        let entry = self
            .range(topic, id, 1)
            .await?
            .into_iter()
            .find(|e| e.id == id);
        let Some(entry) = entry else {
            return Ok(Ok(ReplayOutcome::Missing));
        };
        match handler(entry).await {
            Ok(()) => {
                let mut record = self.record.prepare_invoke();
                record
                    .key(self.replayed_key(topic)?)
                    .key(&claim_key)
                    .arg(id)
                    .arg(&token);
                let in_time: i64 = self.conn.invoke(&record).await?;
                Ok(Ok(if in_time == 1 {
                    ReplayOutcome::Replayed(None)
                } else {
                    ReplayOutcome::ReplayedAfterLease
                }))
            }
            Err(e) => {
                let mut unclaim = self.unclaim.prepare_invoke();
                unclaim.key(&claim_key).arg(&token);
                let _: i64 = self.conn.invoke(&unclaim).await?;
                Ok(Err(e))
            }
        }
    }

    /// Whether entry `id` has been replayed.
    pub async fn is_replayed(&self, topic: &str, id: &str) -> Result<bool, RedisGuardError> {
        let score: Option<f64> = self
            .conn
            .query(redis::cmd("ZSCORE").arg(self.replayed_key(topic)?).arg(id))
            .await?;
        Ok(score.is_some())
    }
}

/// What a recorded stream entry's field names start with in its dead
/// letter (see the module notes).
const FIELD_PREFIX: &str = "field:";

/// Whole milliseconds, at least 1 (a zero PX is an error in Redis).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The part of `key` Redis hashes for its cluster slot: the text between
/// the first `{` and the first `}` after it, if not empty; else the key.
fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

fn parse_entry(id: redis::streams::StreamId) -> DeadLetterEntry {
    let text = |field: &str| id.get::<String>(field);
    let error = text("error")
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "Unknown error".to_owned());
    let mut fields: Vec<(String, Vec<u8>)> = id
        .map
        .iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix(FIELD_PREFIX)?;
            // A stream's values are bulk strings: always bytes.
            let value = redis::from_redis_value_ref::<Vec<u8>>(value).ok()?;
            Some((name.to_owned(), value))
        })
        .collect();
    fields.sort();
    DeadLetterEntry {
        fields,
        payload: id.get::<Vec<u8>>("payload").unwrap_or_default(),
        error,
        attempts: id.get("attempts").unwrap_or(0),
        failed_at_ms: id.get("failed_at").unwrap_or(0),
        origin_stream: text("origin_stream"),
        origin_id: text("origin_id"),
        id: id.id,
    }
}
