//! The wall clock of a device without one: Redis's `TIME` once at start,
//! then the monotonic embassy clock since. Slots are aligned to it, so a
//! device's slot boundaries differ from the server's by the one-way delay
//! of that first request (well below the slot lock's retention, which is
//! what keeps a slot once under skew).

use embassy_time::Instant;
use guard_core::slot::UnixMillis;
use guard_embassy::resp::{CommandWriter, Frame};
use guard_embassy::{RespError, exchange, server_message};

use crate::link::{Link, LinkError};

/// Wall time as `base` at `at`, advancing with the embassy clock.
#[derive(Clone, Copy, Debug)]
pub struct Wall {
    base: UnixMillis,
    at: Instant,
}

impl Wall {
    /// Asks Redis for its time over `link` (closed again on failure),
    /// authenticating first when the link has credentials.
    pub async fn from_server(link: &mut Link) -> Result<Wall, RespError<LinkError>> {
        link.authenticate().await?;
        let mut buf = [0u8; 64];
        let len = CommandWriter::new(&mut buf, 1)
            .and_then(|w| w.bytes(b"TIME"))
            .map_err(RespError::BufferFull)?
            .finish();
        let at = Instant::now();
        let reply = exchange(link, &mut buf, len).await;
        let base = match reply {
            Ok((Frame::Array(Some(array)), true)) if array.len() == 2 => {
                let mut parts = array.iter().map(|frame| match frame {
                    Frame::Bulk(Some(digits)) => core::str::from_utf8(digits)
                        .ok()
                        .and_then(|d| d.parse::<u64>().ok()),
                    _ => None,
                });
                match (parts.next().flatten(), parts.next().flatten()) {
                    (Some(seconds), Some(micros)) => Ok(UnixMillis::from_millis(
                        seconds.saturating_mul(1000).saturating_add(micros / 1000),
                    )),
                    _ => Err(RespError::UnexpectedReply),
                }
            }
            Ok((Frame::Error(message), true)) => Err(RespError::Server(server_message(message))),
            Ok(_) => Err(RespError::UnexpectedReply),
            Err(e) => Err(e),
        };
        if base.is_err() {
            link.close();
        }
        Ok(Wall { base: base?, at })
    }

    /// The wall time now.
    pub fn now(&self) -> UnixMillis {
        let elapsed = Instant::now()
            .saturating_duration_since(self.at)
            .as_millis();
        UnixMillis::from_millis(self.base.as_millis().saturating_add(elapsed))
    }
}
