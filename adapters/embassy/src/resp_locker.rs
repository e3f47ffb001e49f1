//! A fenced `Locker` on Redis over any `embedded_io_async` connection.
//!
//! It sends guard-core's scripts ([`guard_core::lock::redis`]) with
//! `EVAL` over a RESP2 connection the caller opened (embassy-net TCP, a
//! UART bridge), so an MCU gateway and a server replica running
//! guard-redis's `RedisLocker` exclude each other on one Redis and draw
//! fences from the same counters.
//!
//! One request is in flight at a time (an async mutex). A request that
//! failed or was abandoned half-way (its future dropped by a time-out)
//! leaves the connection out of step, so that a late reply is never taken
//! for the answer to another request: the next request first resets the
//! connection with the hook given to [`RespLocker::with_reset`] (for a
//! connection that reconnects on next use), or, without one, fails with
//! [`RespError::Desynchronized`] until [`RespLocker::replace_connection`]
//! gives it a fresh one.
//!
//! A server that asks for a password (`requirepass`, or an ACL user) gets
//! `AUTH` first on every connection, with the credentials given to
//! [`RespLocker::with_auth`]: on the first request, and again on the first
//! request after a reset or a replaced connection. A server that refuses
//! them fails that request with [`RespError::AuthRefused`] and the
//! server's reason, and every later one until it accepts them: nothing is
//! sent unauthenticated. A request answered `-NOAUTH` (a connection that
//! reconnected on its own) authenticates again and is sent once more.
//! [`RespLocker::authenticate`] checks the credentials at start.

use core::fmt;

use embassy_sync::blocking_mutex::raw::RawMutex;
use embassy_sync::mutex::Mutex;
use embedded_io_async::{Read, Write};
use guard_core::lock::redis::{
    ACQUIRE_SCRIPT, InvalidRedisKey, RELEASE_SCRIPT, RENEW_SCRIPT, RedisKeys, check_prefix,
};
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, TokenId, Ttl, UnlockError};

use crate::resp::{BufferFull, CommandWriter, Frame, ParseError, parse};

/// The longest key prefix.
pub const MAX_PREFIX: usize = 32;

/// The server's error text, truncated to 64 bytes.
pub type ServerMessage = heapless::String<64>;

/// The longest ACL user name [`RespLocker::with_auth`] takes.
pub const MAX_USER: usize = 64;

/// The longest password [`RespLocker::with_auth`] takes.
pub const MAX_PASSWORD: usize = 128;

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespError<E> {
    /// The connection failed.
    Io(E),
    /// The connection was closed by the server.
    Closed,
    /// The reply is not valid RESP2.
    Protocol(ParseError),
    /// The server refused the command (`-ERR ...`).
    Server(ServerMessage),
    /// The reply is valid but not what the script returns.
    UnexpectedReply,
    /// The request or the reply does not fit the buffer.
    BufferFull(BufferFull),
    /// The lock key cannot be stored (empty, or its domain starts with
    /// `}`): see [`InvalidRedisKey`].
    InvalidKey(InvalidRedisKey),
    /// An earlier request was abandoned half-way; replace the connection.
    Desynchronized,
    /// The server refused the credentials (`-WRONGPASS ...`, or a server
    /// without a password that was sent one): nothing else was sent.
    AuthRefused(ServerMessage),
}

impl<E: fmt::Debug> fmt::Display for RespError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RespError::Io(e) => write!(f, "redis connection: {e:?}"),
            RespError::Closed => f.write_str("redis connection closed by the server"),
            RespError::Protocol(e) => write!(f, "{e}"),
            RespError::Server(m) => write!(f, "redis: {m}"),
            RespError::UnexpectedReply => f.write_str("redis: unexpected reply to a lock script"),
            RespError::BufferFull(e) => write!(f, "{e}"),
            RespError::InvalidKey(e) => write!(f, "{e}"),
            RespError::Desynchronized => f.write_str(
                "an earlier request was abandoned half-way; the connection must be replaced",
            ),
            RespError::AuthRefused(m) => {
                write!(f, "redis refused the locker's credentials (AUTH): {m}")
            }
        }
    }
}

impl<E: fmt::Debug> core::error::Error for RespError<E> {}

/// A key prefix that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InvalidPrefix {
    /// Longer than [`MAX_PREFIX`] bytes.
    TooLong,
    /// Contains `{` or `}`, which would move the cluster hash tag.
    Brace,
}

impl fmt::Display for InvalidPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidPrefix::TooLong => write!(f, "key prefix longer than {MAX_PREFIX} bytes"),
            InvalidPrefix::Brace => write!(f, "{}", InvalidRedisKey::BraceInPrefix),
        }
    }
}

impl core::error::Error for InvalidPrefix {}

/// Credentials [`RespLocker::with_auth`] refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InvalidCredentials {
    /// The user name is empty or longer than [`MAX_USER`] bytes.
    User,
    /// The password is empty or longer than [`MAX_PASSWORD`] bytes.
    Password,
}

impl fmt::Display for InvalidCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidCredentials::User => {
                write!(f, "a Redis ACL user name is 1 to {MAX_USER} bytes")
            }
            InvalidCredentials::Password => {
                write!(f, "a Redis password is 1 to {MAX_PASSWORD} bytes")
            }
        }
    }
}

impl core::error::Error for InvalidCredentials {}

/// What `AUTH` sends: an ACL user (none for the default user of
/// `requirepass`) and a password, checked once when made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    user: Option<heapless::String<MAX_USER>>,
    password: heapless::String<MAX_PASSWORD>,
}

impl Credentials {
    /// Credentials for `AUTH [user] password`: `user` an ACL user, or
    /// `None` for the default user of `requirepass`. An empty or too long
    /// user or password is refused by name.
    pub fn new(user: Option<&str>, password: &str) -> Result<Self, InvalidCredentials> {
        let user = match user {
            Some("") => return Err(InvalidCredentials::User),
            Some(user) => {
                Some(heapless::String::try_from(user).map_err(|_| InvalidCredentials::User)?)
            }
            None => None,
        };
        if password.is_empty() {
            return Err(InvalidCredentials::Password);
        }
        let password =
            heapless::String::try_from(password).map_err(|_| InvalidCredentials::Password)?;
        Ok(Credentials { user, password })
    }

    /// The ACL user, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Writes `AUTH [user] password` into `buf` as a RESP command; its
    /// length.
    pub fn command(&self, buf: &mut [u8]) -> Result<usize, BufferFull> {
        let args = if self.user.is_some() { 3 } else { 2 };
        let mut w = CommandWriter::new(buf, args)?.bytes(b"AUTH")?;
        if let Some(user) = &self.user {
            w = w.bytes(user.as_bytes())?;
        }
        Ok(w.bytes(self.password.as_bytes())?.finish())
    }
}

struct Conn<C, const N: usize> {
    io: C,
    buf: [u8; N],
    /// Token ids minted so far.
    minted: u64,
    /// A request was started and its reply not read whole.
    out_of_step: bool,
    /// `AUTH` was accepted on this connection.
    authenticated: bool,
}

/// A `Locker` + `LeaseRenewer` on Redis over a RESP2 connection `C`, with
/// an `N`-byte buffer for a request and its reply (1,792 holds any lock
/// request with a key of up to 256 bytes under a prefix of up to
/// [`MAX_PREFIX`]: the script and the lock's three keys); see the module
/// documentation.
pub struct RespLocker<M: RawMutex, C, const N: usize = 1792> {
    conn: Mutex<M, Conn<C, N>>,
    prefix: heapless::String<MAX_PREFIX>,
    seed: u64,
    /// Puts an out-of-step connection back in step (closes it so that it
    /// reconnects on next use).
    reset: Option<fn(&mut C)>,
    /// Sent as `AUTH` first on every connection, when set.
    credentials: Option<Credentials>,
}

impl<M: RawMutex, C, const N: usize> fmt::Debug for RespLocker<M, C, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password is never shown.
        let user = self.credentials.as_ref().map(|c| match &c.user {
            Some(user) => user.as_str(),
            None => "default",
        });
        f.debug_struct("RespLocker")
            .field("prefix", &self.prefix.as_str())
            .field("buffer", &N)
            .field("auth_user", &user)
            .finish()
    }
}

/// SplitMix64's finaliser: a bijection that spreads every input bit.
const fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `n`th token id of a locker seeded with `seed`: distinct for every
/// `n` of one seed (the first half is a bijection of `n`).
fn token_id(seed: u64, n: u64) -> TokenId {
    let hi = mix(seed.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let lo = mix(hi ^ seed.rotate_left(32));
    let mut id = [0u8; 16];
    let (a, b) = id.split_at_mut(8);
    a.copy_from_slice(&hi.to_le_bytes());
    b.copy_from_slice(&lo.to_le_bytes());
    TokenId(id)
}

impl<M: RawMutex, C: Read + Write, const N: usize> RespLocker<M, C, N> {
    /// A locker on `io`, minting token ids from `seed`.
    ///
    /// The seed must differ between devices and between boots (a hardware
    /// random number, or a unique id mixed with a boot counter): two
    /// lockers with one seed mint the same ids, and one could then release
    /// the other's lock.
    pub fn new(io: C, seed: u64) -> Self {
        RespLocker {
            conn: Mutex::new(Conn {
                io,
                buf: [0; N],
                minted: 0,
                out_of_step: false,
                authenticated: false,
            }),
            prefix: heapless::String::new(),
            seed,
            reset: None,
            credentials: None,
        }
    }

    /// Sends `AUTH [user] password` first on every connection (see the
    /// module documentation): `user` an ACL user, or `None` for the
    /// default user of `requirepass`.
    pub fn with_auth(self, user: Option<&str>, password: &str) -> Result<Self, InvalidCredentials> {
        Ok(self.with_credentials(Credentials::new(user, password)?))
    }

    /// [`with_auth`](Self::with_auth) with credentials made beforehand.
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// How to put the connection back in step after a request failed or
    /// was abandoned half-way: `reset` must leave no reply of an earlier
    /// request to read (close a connection that reconnects on next use).
    /// The next request calls it instead of failing with
    /// [`RespError::Desynchronized`].
    pub fn with_reset(mut self, reset: fn(&mut C)) -> Self {
        self.reset = Some(reset);
        self
    }

    /// Prefixes every Redis key with `prefix` (a `:` is appended if
    /// missing, as guard-redis does); blank means none.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, InvalidPrefix> {
        let prefix = prefix.trim();
        check_prefix(prefix).map_err(|_| InvalidPrefix::Brace)?;
        self.prefix.clear();
        if !prefix.is_empty() {
            self.prefix
                .push_str(prefix)
                .map_err(|_| InvalidPrefix::TooLong)?;
            if !prefix.ends_with(':') {
                self.prefix.push(':').map_err(|_| InvalidPrefix::TooLong)?;
            }
        }
        Ok(self)
    }

    /// Replaces the connection (after a failure or an abandoned request).
    pub async fn replace_connection(&self, io: C) {
        let mut conn = self.conn.lock().await;
        conn.io = io;
        conn.out_of_step = false;
        conn.authenticated = false;
    }

    /// Sends the credentials now, unless this connection has had them
    /// accepted: a password the server refuses is found at start rather
    /// than at the first grant. Without credentials it sends nothing (it
    /// still resets an out-of-step connection first, or fails with
    /// [`RespError::Desynchronized`] as any request would).
    pub async fn authenticate(&self) -> Result<(), RespError<C::Error>> {
        let mut guard = self.conn.lock().await;
        self.ready(&mut guard).await
    }

    /// Puts the connection in step and authenticated, before a request.
    async fn ready(&self, conn: &mut Conn<C, N>) -> Result<(), RespError<C::Error>> {
        if conn.out_of_step {
            let Some(reset) = self.reset else {
                return Err(RespError::Desynchronized);
            };
            reset(&mut conn.io);
            conn.out_of_step = false;
            // A reset connection is a new one: it authenticates again.
            conn.authenticated = false;
        }
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        if conn.authenticated {
            return Ok(());
        }
        let len = credentials
            .command(&mut conn.buf)
            .map_err(RespError::BufferFull)?;
        conn.out_of_step = true;
        let (frame, in_step) = exchange(&mut conn.io, &mut conn.buf, len).await?;
        let accepted = match frame {
            Frame::Simple(b"OK") => Ok(()),
            Frame::Error(message) => Err(RespError::AuthRefused(server_message(message))),
            _ => Err(RespError::UnexpectedReply),
        };
        conn.out_of_step = !in_step;
        conn.authenticated = accepted.is_ok();
        accepted
    }

    async fn next_id(&self) -> TokenId {
        let mut conn = self.conn.lock().await;
        let n = conn.minted;
        conn.minted = n.wrapping_add(1);
        token_id(self.seed, n)
    }

    /// Runs `EVAL script 3|2 keys... args...` (the lock, the fence counter
    /// when `with_fence`, the grant record) and returns its integer.
    async fn eval(
        &self,
        script: &str,
        key: &str,
        with_fence: bool,
        token: &TokenId,
        ttl: Option<Ttl>,
    ) -> Result<i64, RespError<C::Error>> {
        let keys = RedisKeys::new(&self.prefix, key).map_err(RespError::InvalidKey)?;
        let mut guard = self.conn.lock().await;
        let conn = &mut *guard;
        let mut retried = false;
        loop {
            self.ready(conn).await?;
            // The lock, the fence counter for an acquisition, and the
            // grant record.
            let key_count = if with_fence { 3 } else { 2 };
            let args = 3 + key_count + 1 + usize::from(ttl.is_some());
            let mut w = CommandWriter::new(&mut conn.buf, args)
                .and_then(|w| w.bytes(b"EVAL"))
                .and_then(|w| w.bytes(script.as_bytes()))
                .and_then(|w| w.display(key_count))
                .and_then(|w| w.display(keys.lock()))
                .map_err(RespError::BufferFull)?;
            if with_fence {
                w = w.display(keys.fence()).map_err(RespError::BufferFull)?;
            }
            w = w.display(keys.grant()).map_err(RespError::BufferFull)?;
            w = w.display(token).map_err(RespError::BufferFull)?;
            if let Some(ttl) = ttl {
                w = w
                    .display(ttl.as_millis_ceil())
                    .map_err(RespError::BufferFull)?;
            }
            let len = w.finish();
            // Out of step until the whole reply is read: dropping this future
            // anywhere below must not let a later request read this reply.
            conn.out_of_step = true;
            let (frame, in_step) = exchange(&mut conn.io, &mut conn.buf, len).await?;
            let result = match frame {
                Frame::Integer(n) => Ok(n),
                Frame::Error(message) => Err(RespError::Server(server_message(message))),
                _ => Err(RespError::UnexpectedReply),
            };
            conn.out_of_step = !in_step;
            // A server that lost this connection's authentication (a
            // connection that reconnected on its own) ran nothing: AUTH
            // again, then the request once more.
            if let Err(RespError::Server(message)) = &result
                && message.starts_with("NOAUTH")
                && self.credentials.is_some()
                && !retried
            {
                conn.authenticated = false;
                retried = true;
                continue;
            }
            return result;
        }
    }
}

/// Sends the request in `buf[..len]` and reads one reply frame into
/// `buf`. Also says whether the connection is still in step: `false` when
/// bytes followed the reply (they answer nothing that was asked).
///
/// For requests beyond the lock scripts (a fenced write to a resource, a
/// `PING`) on a connection of one's own.
pub async fn exchange<'b, C: Read + Write>(
    io: &mut C,
    buf: &'b mut [u8],
    len: usize,
) -> Result<(Frame<'b>, bool), RespError<C::Error>> {
    let request = buf.get(..len).unwrap_or_default();
    io.write_all(request).await.map_err(RespError::Io)?;
    io.flush().await.map_err(RespError::Io)?;
    let capacity = buf.len();
    let mut filled = 0usize;
    loop {
        let Some(free) = buf.get_mut(filled..).filter(|b| !b.is_empty()) else {
            return Err(RespError::BufferFull(BufferFull { capacity }));
        };
        let read = io.read(free).await.map_err(RespError::Io)?;
        if read == 0 {
            return Err(RespError::Closed);
        }
        filled = filled.saturating_add(read);
        // Parsed twice on the final read only: once to find the end, once
        // to hand out the frame with the buffer's lifetime.
        if parse(buf.get(..filled).unwrap_or_default())
            .map_err(RespError::Protocol)?
            .is_some()
        {
            break;
        }
    }
    let reply: &'b [u8] = buf.get(..filled).unwrap_or_default();
    match parse(reply).map_err(RespError::Protocol)? {
        Some((frame, used)) => Ok((frame, used == filled)),
        None => Err(RespError::UnexpectedReply),
    }
}

/// The server's error text, truncated to fit.
pub fn server_message(message: &[u8]) -> ServerMessage {
    let mut text = ServerMessage::new();
    for c in lossy_chars(message) {
        if text.push(c).is_err() {
            break;
        }
    }
    text
}

/// The `char`s of possibly invalid UTF-8 (invalid bytes as U+FFFD),
/// without allocating.
fn lossy_chars(bytes: &[u8]) -> impl Iterator<Item = char> + '_ {
    bytes.utf8_chunks().flat_map(|chunk| {
        let bad = (!chunk.invalid().is_empty()).then_some(char::REPLACEMENT_CHARACTER);
        chunk.valid().chars().chain(bad)
    })
}

impl<M: RawMutex, C: Read + Write, const N: usize> Locker for RespLocker<M, C, N> {
    type Error = RespError<C::Error>;

    fn is_invalid_input(error: &Self::Error) -> bool {
        matches!(error, RespError::InvalidKey(_))
    }

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, Self::Error> {
        let id = self.next_id().await;
        let fence = self.eval(ACQUIRE_SCRIPT, key, true, &id, Some(ttl)).await?;
        match fence {
            // Held, or its last grant may still be believed (the lock key
            // gone before the grant's end): refused all the same.
            ..=0 => Ok(None),
            fence => Ok(Some(Token::new(id, fence.unsigned_abs()))),
        }
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<Self::Error>> {
        match self
            .eval(RELEASE_SCRIPT, key, false, token.id(), None)
            .await
        {
            Ok(1) => Ok(()),
            Ok(_) => Err(UnlockError::NotHeld),
            Err(e) => Err(UnlockError::Backend(e)),
        }
    }
}

impl<M: RawMutex, C: Read + Write, const N: usize> LeaseRenewer for RespLocker<M, C, N> {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, Self::Error> {
        let renewed = self
            .eval(RENEW_SCRIPT, key, false, token.id(), Some(ttl))
            .await?;
        Ok(if renewed == 1 {
            Renewal::Held
        } else {
            Renewal::Lost
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_of_one_seed_never_repeat_and_seeds_differ() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..10_000 {
            assert!(seen.insert(token_id(7, n).0), "repeat at {n}");
        }
        assert_ne!(token_id(7, 0), token_id(8, 0));
    }
}
