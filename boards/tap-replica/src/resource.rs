//! The protected resource: a write accepted only with a fence at least as
//! high as every fence accepted before, kept in Redis by one script, so a
//! stale leader's write is refused and counted, never applied.

use guard_embassy::resp::{CommandWriter, Frame};
use guard_embassy::{RespError, exchange, server_message};

use crate::link::{Link, LinkError};

/// The resource's keys (one hash tag: one cluster slot).
pub const HIGHEST_KEY: &str = "{guard:resource}:highest";
/// Accepted writes, `"<fence> <replica>"` in order.
pub const LOG_KEY: &str = "{guard:resource}:log";
/// Refused (stale) writes.
pub const REFUSED_KEY: &str = "{guard:resource}:refused";

/// KEYS: highest, log, refused; ARGV: fence, replica. Returns 1 if
/// accepted, 0 if refused as stale.
const WRITE: &str = r"
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < highest then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2])
return 1
";

/// A client of the resource on a connection of its own.
pub struct Resource {
    link: Link,
    buf: [u8; 512],
}

impl Resource {
    /// A client over `link`.
    pub fn new(link: Link) -> Self {
        Resource {
            link,
            buf: [0; 512],
        }
    }

    /// Writes as `replica` with `fence`; whether the resource accepted it.
    pub async fn write(&mut self, fence: u64, replica: &str) -> Result<bool, RespError<LinkError>> {
        self.link.authenticate().await?;
        let len = CommandWriter::new(&mut self.buf, 8)
            .and_then(|w| w.bytes(b"EVAL"))
            .and_then(|w| w.bytes(WRITE.as_bytes()))
            .and_then(|w| w.display(3))
            .and_then(|w| w.display(HIGHEST_KEY))
            .and_then(|w| w.display(LOG_KEY))
            .and_then(|w| w.display(REFUSED_KEY))
            .and_then(|w| w.display(fence))
            .and_then(|w| w.display(replica))
            .map_err(RespError::BufferFull)?
            .finish();
        let result = match exchange(&mut self.link, &mut self.buf, len).await {
            Ok((Frame::Integer(accepted), true)) => Ok(accepted == 1),
            Ok((Frame::Error(message), true)) => Err(RespError::Server(server_message(message))),
            Ok(_) => Err(RespError::UnexpectedReply),
            Err(e) => Err(e),
        };
        if result.is_err() {
            // Whatever was half-read, the next write starts afresh.
            self.link.close();
        }
        result
    }
}
