//! A sink that appends each message to a Redis Stream (`XADD`), fenced
//! and deduplicated by one script.
//!
//! Each message is one entry with the fields `payload`, `origin`, `id`
//! and, from an elected source, `fence`. The script, atomically:
//!
//! 1. refuses a message whose fence is below the highest one the stream
//!    has taken ([`SinkError::StaleFence`]): a stale leader cannot append
//!    after a newer leader has, and the highest fence never goes back;
//! 2. appends nothing for an id it has seen within the duplicate window
//!    (two minutes unless set, as JetStream's), and answers as for an
//!    append: a retry after a lost reply, or a redelivery, is not
//!    appended twice;
//! 3. appends the entry.
//!
//! Keys: the stream `<stream>`, its highest fence
//! `<stream>:guard:fence` and one key per id seen,
//! `<stream>:guard:id:<id>`, that expires with the window. On a Redis
//! Cluster the three must share a slot: name the stream with a hash tag
//! (`{uplink}`).
//!
//! A connection found dropped is replaced within the call (the script
//! sent once more). A reply that is not the script's, a connection that
//! fails and a timeout are transient (the id makes the retry safe);
//! `WRONGTYPE` (the key holds something else) is permanent.

use std::time::Duration;

use guard_redis::{RedisConnection, RedisGuardError};
use guard_std::BoxFuture;
use redis::Script;

use super::{MessageSink, Outgoing, SinkError};
use crate::{InvalidInput, Parameter};

/// How long an id is remembered unless set: two minutes, JetStream's
/// default duplicate window.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The script: KEYS = stream, fence key, id key; ARGV = fence (empty
/// without one), id, window in ms, payload, origin. Fences are compared
/// as decimal strings (length, then text) so that a `u64` above 2^53
/// keeps its order, which a Lua number would not.
const APPEND: &str = r"
local fence = ARGV[1]
if fence ~= '' then
  local highest = redis.call('GET', KEYS[2])
  if highest then
    if #fence < #highest or (#fence == #highest and fence < highest) then
      return {'stale', highest}
    end
  end
  if not highest or fence ~= highest then
    redis.call('SET', KEYS[2], fence)
  end
end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[3]) then
  return {'duplicate', ''}
end
local fields = {'payload', ARGV[4], 'origin', ARGV[5], 'id', ARGV[2]}
if fence ~= '' then
  fields[#fields + 1] = 'fence'
  fields[#fields + 1] = fence
end
return {'added', redis.call('XADD', KEYS[1], '*', unpack(fields))}
";

/// Appends each message to one Redis Stream, refusing stale fences and
/// repeated ids.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_endpoints::sink::redis_stream::RedisStreamSink;
/// use guard_endpoints::sink::{MessageSink, Outgoing};
/// use guard_redis::{RedisConnection, Topology};
///
/// let conn = RedisConnection::connect(
///     Topology::Standalone { url: "redis://127.0.0.1/".into() },
///     std::time::Duration::from_millis(500),
/// )
/// .await?;
/// let sink = RedisStreamSink::new(conn, "uplink")?;
/// let message = Outgoing { id: "alerts:1", origin: "alerts.fire", fence: Some(7), payload: b"{}" };
/// sink.send(&message).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct RedisStreamSink {
    conn: RedisConnection,
    stream: String,
    window: Duration,
    script: Script,
}

impl std::fmt::Debug for RedisStreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreamSink")
            .field("stream", &self.stream)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl RedisStreamSink {
    /// A sink appending to `stream` on `conn`; refuses an empty name.
    pub fn new(conn: RedisConnection, stream: &str) -> Result<Self, InvalidInput> {
        if stream.is_empty() {
            return Err(InvalidInput::new(
                Parameter::Stream,
                stream,
                "a non-empty stream name",
            ));
        }
        Ok(RedisStreamSink {
            conn,
            stream: stream.to_owned(),
            window: DEFAULT_DUPLICATE_WINDOW,
            script: Script::new(APPEND),
        })
    }

    /// How long an id is remembered (at least a millisecond): a message
    /// sent again within it is not appended twice.
    pub fn with_duplicate_window(mut self, window: Duration) -> Result<Self, InvalidInput> {
        if window < Duration::from_millis(1) {
            return Err(InvalidInput::new(
                Parameter::DuplicateWindow,
                format!("{window:?}"),
                "at least 1 ms",
            ));
        }
        self.window = window;
        Ok(self)
    }

    /// The stream's key.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The key of the highest fence the stream has taken.
    pub fn fence_key(&self) -> String {
        format!("{}:guard:fence", self.stream)
    }

    fn id_key(&self, id: &str) -> String {
        format!("{}:guard:id:{id}", self.stream)
    }

    async fn append(&self, message: &Outgoing<'_>) -> Result<(), SinkError> {
        let fence = message.fence.map(|f| f.to_string()).unwrap_or_default();
        let window_ms = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(&self.stream)
            .key(self.fence_key())
            .key(self.id_key(message.id))
            .arg(&fence)
            .arg(message.id)
            .arg(window_ms)
            .arg(message.payload)
            .arg(message.origin);
        let reply: Vec<String> = match self.conn.invoke(&invocation).await {
            // A connection the server dropped (a restart) is found dead
            // on first use: once more, on the new one; the id makes the
            // second call safe if the first was applied after all.
            Err(RedisGuardError::Redis(e)) if e.is_io_error() || e.is_connection_dropped() => {
                self.conn.invoke(&invocation).await
            }
            first => first,
        }
        .map_err(failed)?;
        match reply.as_slice() {
            [outcome, _] if outcome == "added" || outcome == "duplicate" => Ok(()),
            [outcome, highest] if outcome == "stale" => {
                let highest = highest.parse().map_err(|_| SinkError::Transient {
                    reason: format!("the fence key holds {highest:?}, not a fence"),
                    retry_after: None,
                })?;
                Err(SinkError::StaleFence {
                    fence: message.fence.unwrap_or_default(),
                    highest,
                })
            }
            other => Err(SinkError::Transient {
                reason: format!("unexpected reply {other:?}"),
                retry_after: None,
            }),
        }
    }
}

/// A Redis error as a sink's: a key holding another type is permanent,
/// anything else may pass on a retry.
fn failed(e: RedisGuardError) -> SinkError {
    match &e {
        RedisGuardError::Redis(inner) if inner.code() == Some("WRONGTYPE") => {
            SinkError::Permanent {
                reason: e.to_string(),
            }
        }
        _ => SinkError::Transient {
            reason: e.to_string(),
            retry_after: None,
        },
    }
}

impl MessageSink for RedisStreamSink {
    fn send<'a>(&'a self, message: &'a Outgoing<'a>) -> BoxFuture<'a, Result<(), SinkError>> {
        Box::pin(self.append(message))
    }
}
