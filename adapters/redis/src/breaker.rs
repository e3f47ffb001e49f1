//! A circuit breaker shared by replicas through Redis: guard-core's
//! breaker, its state in one key (layout and scripts in
//! [`guard_core::breaker::redis`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use guard_core::breaker::redis::{READ_SCRIPT, SWAP_SCRIPT};
use guard_core::breaker::{
    BreakerConfig, CircuitBreaker, Metrics, NotPermitted, Permit, State, Transition, WindowSnapshot,
};
use guard_core::lock::MAX_KEY_LEN;
use guard_core::time::Instant;
use redis::{Script, Value};

use crate::connection::RedisConnection;
use crate::error::{Parameter, RedisGuardError};

/// How many times a decision is made again while other replicas' writes
/// keep landing first, before it is an error. With `c` callers writing
/// one key at once, a call loses about `c - 1` times on average (each
/// loss costs one round trip), and this many only by a streak far beyond
/// any scheduling.
pub const MAX_SWAPS: usize = 1_000;

/// A circuit breaker whose state every replica shares: each call reads
/// the state from Redis, decides with guard-core's
/// [`CircuitBreaker`] exactly as in memory, and writes the new state back
/// only if no other replica wrote in between (else it decides again on
/// what that replica wrote). The replicas' decisions are therefore one
/// breaker's, in the order their writes landed, on the Redis server's
/// clock (or on the caller's, with the `_at` methods).
///
/// Every replica must pass the same configuration and window type (`W`:
/// [`CountWindow`](guard_core::breaker::CountWindow) or
/// [`TimeWindow`](guard_core::breaker::TimeWindow)); a key holding
/// another window's state is an error naming the key ([`reset`](Self::reset)
/// writes a fresh breaker over it). The configuration must bound the
/// half-open wait (`max_wait_in_half_open`): a trial whose replica died
/// before reporting never comes back, and without the bound its place
/// would stay taken on every replica for good.
///
/// Each call is two round trips (one more for each write that lost). A
/// refusal that moves the breaker nowhere (open and still waiting, forced
/// open, every trial out) is only read, never written, so an outage costs
/// one read a call: such refusals are counted by each replica
/// ([`refused`](Self::refused)), not in the shared metrics. One key's writes are
/// serialized, so its throughput is bounded by Redis round trips: share a
/// breaker that judges calls to a dependency, at the rate those calls
/// come, not one decision per request of a hot path.
///
/// ```no_run
/// # smol::block_on(async {
/// use guard_core::breaker::{BreakerConfig, CountWindow};
/// use guard_redis::{RedisBreaker, RedisConnection, Topology};
/// # let conn = RedisConnection::connect(Topology::Standalone { url: "redis://127.0.0.1".into() }, std::time::Duration::from_secs(1)).await?;
///
/// let config = BreakerConfig::new().with_max_wait_in_half_open(std::time::Duration::from_secs(60));
/// let payments = RedisBreaker::<CountWindow<100>>::new(conn, "guard:breaker:payments", config)?;
/// match payments.try_acquire().await? {
///     Ok(permit) => {
///         let failed = false; // ... the call to the payments service ...
///         payments.on_result(permit, failed).await?;
///     }
///     Err(refused) => println!("not calling: {refused}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
pub struct RedisBreaker<W> {
    conn: RedisConnection,
    key: String,
    config: BreakerConfig,
    read: Script,
    swap: Script,
    /// Refusals this replica answered without writing.
    refused: AtomicU64,
    window: PhantomData<fn() -> W>,
}

impl<W> fmt::Debug for RedisBreaker<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBreaker")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish()
    }
}

/// A snapshot as read, and the server's clock then.
struct Read {
    snapshot: Option<Vec<u8>>,
    now: Instant,
}

impl<W: WindowSnapshot + Default> RedisBreaker<W> {
    /// The breaker at `key` (used as given, 1 to 256 bytes) on `conn`,
    /// deciding with `config` (checked as guard-core checks it, and with a
    /// `max_wait_in_half_open` above zero: see the type's documentation).
    pub fn new(
        conn: RedisConnection,
        key: &str,
        config: BreakerConfig,
    ) -> Result<Self, RedisGuardError> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(RedisGuardError::invalid(
                Parameter::BreakerKey,
                key,
                format!("must be 1 to {MAX_KEY_LEN} bytes"),
            ));
        }
        config.validate().map_err(|e| {
            RedisGuardError::refused_by(Parameter::BreakerConfig, format!("{config:?}"), e)
        })?;
        if config.max_wait_in_half_open().is_zero() {
            return Err(RedisGuardError::invalid(
                Parameter::BreakerConfig,
                format!("{config:?}"),
                "a shared breaker needs max_wait_in_half_open above zero: a trial whose replica died before reporting would otherwise hold its place on every replica for good",
            ));
        }
        Ok(RedisBreaker {
            conn,
            key: key.to_owned(),
            config,
            read: Script::new(READ_SCRIPT),
            swap: Script::new(SWAP_SCRIPT),
            refused: AtomicU64::new(0),
            window: PhantomData,
        })
    }

    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// A permit for one call, or why not, on the server's clock.
    pub async fn try_acquire(&self) -> Result<Result<Permit, NotPermitted>, RedisGuardError> {
        self.acquire(None).await
    }

    /// Refusals this replica answered without writing (see the type's
    /// documentation); the shared metrics count the others.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// A refusal that leaves the state where it was is answered from the
    /// read alone; anything else is decided and written as any call.
    async fn acquire(
        &self,
        now: Option<Instant>,
    ) -> Result<Result<Permit, NotPermitted>, RedisGuardError> {
        let read = self.read().await?;
        let mut breaker = self.decode(read.snapshot.as_deref())?;
        let before = breaker.state();
        if let Err(refused) = breaker.try_acquire(now.unwrap_or(read.now))
            && breaker.state() == before
        {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Ok(Err(refused));
        }
        self.update_from(read, now, |b, now| b.try_acquire(now))
            .await
    }

    /// [`try_acquire`](Self::try_acquire) at `now` on the caller's clock
    /// (every replica's on one clock).
    pub async fn try_acquire_at(
        &self,
        now: Instant,
    ) -> Result<Result<Permit, NotPermitted>, RedisGuardError> {
        self.acquire(Some(now)).await
    }

    /// Reports the outcome of `permit`'s call, on the server's clock (a
    /// slow call is timed from the permit's start).
    pub async fn on_result(
        &self,
        permit: Permit,
        failed: bool,
    ) -> Result<Option<Transition>, RedisGuardError> {
        self.report(None, permit, failed).await
    }

    /// [`on_result`](Self::on_result) at `now` on the caller's clock.
    pub async fn on_result_at(
        &self,
        permit: Permit,
        now: Instant,
        failed: bool,
    ) -> Result<Option<Transition>, RedisGuardError> {
        self.report(Some(now), permit, failed).await
    }

    async fn report(
        &self,
        now: Option<Instant>,
        permit: Permit,
        failed: bool,
    ) -> Result<Option<Transition>, RedisGuardError> {
        // Decided again if another write lands first: the permit crosses
        // as its parts.
        let (started, epoch) = permit.into_parts();
        self.update(now, |b, now| {
            b.on_result(Permit::from_parts(started, epoch), now, failed)
        })
        .await
    }

    /// Reports that `permit`'s call is not judged (an ignored error): a
    /// half-open breaker's trial passes on.
    pub async fn on_ignored(&self, permit: Permit) -> Result<(), RedisGuardError> {
        let (started, epoch) = permit.into_parts();
        self.update(None, |b, _| {
            b.on_ignored(Permit::from_parts(started, epoch))
        })
        .await
    }

    /// The state now.
    pub async fn state(&self) -> Result<State, RedisGuardError> {
        let read = self.read().await?;
        Ok(self.decode(read.snapshot.as_deref())?.state())
    }

    /// The metrics now, on the server's clock.
    pub async fn metrics(&self) -> Result<Metrics, RedisGuardError> {
        let read = self.read().await?;
        Ok(self.decode(read.snapshot.as_deref())?.metrics(read.now))
    }

    /// Moves every replica's breaker to closed, with an empty window.
    pub async fn close(&self) -> Result<Transition, RedisGuardError> {
        self.update(None, |b, _| b.close()).await
    }

    /// Moves it to open, from the server's clock now.
    pub async fn open(&self) -> Result<Transition, RedisGuardError> {
        self.update(None, |b, now| b.open(now)).await
    }

    /// Moves it to forced open: nothing is permitted until the next move.
    pub async fn force_open(&self) -> Result<Transition, RedisGuardError> {
        self.update(None, |b, _| b.force_open()).await
    }

    /// Moves it to disabled: everything is permitted and nothing judged.
    pub async fn disable(&self) -> Result<Transition, RedisGuardError> {
        self.update(None, |b, _| b.disable()).await
    }

    /// Writes a new closed breaker over whatever the key holds, without
    /// reading it: the way out when the key holds what this replica
    /// cannot read (another window's state after a change of
    /// configuration, or a foreign value).
    pub async fn reset(&self) -> Result<(), RedisGuardError> {
        let fresh = self.decode(None)?;
        let mut bytes = vec![0u8; CircuitBreaker::<W>::ENCODED_LEN];
        fresh.encode(&mut bytes).map_err(|e| self.bad_snapshot(e))?;
        let mut set = redis::cmd("SET");
        set.arg(&self.key).arg(&bytes[..]);
        self.conn.query::<()>(&set).await
    }

    /// Reads, decides with `decide`, and writes back if the state
    /// changed, deciding again on another replica's write until one lands.
    async fn update<T>(
        &self,
        now: Option<Instant>,
        decide: impl FnMut(&mut CircuitBreaker<W>, Instant) -> T,
    ) -> Result<T, RedisGuardError> {
        let read = self.read().await?;
        self.update_from(read, now, decide).await
    }

    /// [`update`](Self::update) from a snapshot already read.
    async fn update_from<T>(
        &self,
        mut read: Read,
        now: Option<Instant>,
        mut decide: impl FnMut(&mut CircuitBreaker<W>, Instant) -> T,
    ) -> Result<T, RedisGuardError> {
        let mut bytes = vec![0u8; CircuitBreaker::<W>::ENCODED_LEN];
        for _ in 0..MAX_SWAPS {
            let mut breaker = self.decode(read.snapshot.as_deref())?;
            let out = decide(&mut breaker, now.unwrap_or(read.now));
            breaker
                .encode(&mut bytes)
                .map_err(|e| self.bad_snapshot(e))?;
            if read.snapshot.as_deref() == Some(&bytes[..]) {
                return Ok(out);
            }
            let mut invocation = self.swap.prepare_invoke();
            invocation
                .key(&self.key)
                .arg(read.snapshot.as_deref().unwrap_or_default())
                .arg(&bytes[..]);
            let reply: Vec<Value> = self.conn.invoke(&invocation).await?;
            match reply.first() {
                Some(Value::Int(1)) => return Ok(out),
                Some(Value::Int(0)) => {
                    read = Self::parse_read("swap", reply.get(1..).unwrap_or_default())?;
                }
                _ => {
                    return Err(RedisGuardError::UnexpectedReply(format!(
                        "breaker swap: {reply:?}"
                    )));
                }
            }
        }
        Err(RedisGuardError::UnexpectedReply(format!(
            "breaker {}: other replicas' writes landed first {MAX_SWAPS} times in a row",
            self.key
        )))
    }

    async fn read(&self) -> Result<Read, RedisGuardError> {
        let mut invocation = self.read.prepare_invoke();
        invocation.key(&self.key);
        let reply: Vec<Value> = self.conn.invoke(&invocation).await?;
        Self::parse_read("read", &reply)
    }

    /// `{snapshot or nil, seconds, microseconds}`, the reply to `what`.
    fn parse_read(what: &str, reply: &[Value]) -> Result<Read, RedisGuardError> {
        let bad = || RedisGuardError::UnexpectedReply(format!("breaker {what}: {reply:?}"));
        let snapshot = match reply.first() {
            Some(Value::BulkString(bytes)) => Some(bytes.clone()),
            Some(Value::Nil) | None => None,
            Some(_) => return Err(bad()),
        };
        let number = |v: Option<&Value>| -> Option<u64> {
            match v? {
                Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
                Value::Int(n) => u64::try_from(*n).ok(),
                _ => None,
            }
        };
        let (secs, micros) = (number(reply.get(1)), number(reply.get(2)));
        let nanos = secs
            .zip(micros)
            .and_then(|(s, us)| {
                s.checked_mul(1_000_000_000)?
                    .checked_add(us.checked_mul(1_000)?)
            })
            .ok_or_else(bad)?;
        Ok(Read {
            snapshot,
            now: Instant::from_nanos(nanos),
        })
    }

    fn decode(&self, snapshot: Option<&[u8]>) -> Result<CircuitBreaker<W>, RedisGuardError> {
        match snapshot {
            None => CircuitBreaker::new(self.config, W::default()).map_err(|e| {
                RedisGuardError::refused_by(
                    Parameter::BreakerConfig,
                    format!("{:?}", self.config),
                    e,
                )
            }),
            Some(bytes) => {
                CircuitBreaker::decode(self.config, bytes).map_err(|e| self.bad_snapshot(e))
            }
        }
    }

    fn bad_snapshot(&self, e: impl fmt::Display) -> RedisGuardError {
        RedisGuardError::UnexpectedReply(format!("breaker {}: {e}", self.key))
    }
}
