//! [`Claims`]: a scope's deliveries, each done at most once and retried
//! until done.

use core::fmt;
use core::time::Duration;

use heapless::String;

use super::{Begin, ClaimStore, Settled, Start};
use crate::lock::{DEFAULT_PREFIX, KeyError, MAX_KEY_LEN, Renewal, Scope, Token, Ttl, claim_key};

/// The default lease of an attempt: 30 seconds. A worker that dies is
/// taken over this long after its last begin or extend.
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(30);

/// The default time a settled record is kept: one hour, as a
/// [`OnceGuard`](crate::guard::OnceGuard)'s claim. A redelivery later
/// than that runs again.
pub const DEFAULT_CLAIM_KEEP: Duration = Duration::from_secs(3600);

/// A lease and keep time that do not fit together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ClaimConfigError {
    /// The lease asked for.
    pub lease: Ttl,
    /// The keep time asked for.
    pub keep: Ttl,
}

impl fmt::Display for ClaimConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a claim's keep time ({} ms) must be at least its lease ({} ms): a done record forgotten before a lease could end would run the work again",
            self.keep.as_millis_ceil(),
            self.lease.as_millis_ceil()
        )
    }
}

impl core::error::Error for ClaimConfigError {}

/// The longest result [`Claims::complete`] stores, in bytes: every
/// redelivery reads it back, so its size is bounded where it is written.
pub const MAX_RESULT_LEN: usize = 64 * 1024;

/// Why a claim call gave no answer. Never "a duplicate".
///
/// [`is_permanent`](Self::is_permanent) tells the two kinds apart: a
/// failed store is transient (answer 503, so the delivery is sent again);
/// the others are the same at every try (an id no key can hold: 400; a
/// result over the bound: the handler's to shorten), and a sender told
/// to retry would retry for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ClaimError<E> {
    /// The delivery key does not make a record key.
    Key(KeyError),
    /// The store failed: nothing is known of the delivery.
    Backend(E),
    /// The work was done, and its stored result is longer than the buffer
    /// the caller gave.
    ResultTooLong {
        /// The stored result's length in bytes.
        len: usize,
        /// The buffer's length in bytes.
        buffer: usize,
    },
    /// [`Claims::complete`] was given a result longer than
    /// [`MAX_RESULT_LEN`]; nothing was recorded and the claim still runs.
    ResultOverLimit {
        /// The result's length in bytes.
        len: usize,
    },
}

impl<E> ClaimError<E> {
    /// Whether asking again can never succeed: everything but a failed
    /// store.
    pub const fn is_permanent(&self) -> bool {
        !matches!(self, ClaimError::Backend(_))
    }
}

impl<E: fmt::Display> fmt::Display for ClaimError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::Key(e) => write!(f, "claim key: {e}"),
            ClaimError::Backend(e) => write!(f, "claim store failed: {e}"),
            ClaimError::ResultTooLong { len, buffer } => write!(
                f,
                "the done delivery's stored result is {len} bytes, longer than the {buffer}-byte buffer given"
            ),
            ClaimError::ResultOverLimit { len } => write!(
                f,
                "a result of {len} bytes is longer than the {MAX_RESULT_LEN} bytes a claim stores"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display + core::error::Error + 'static> core::error::Error
    for ClaimError<E>
{
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            ClaimError::Key(e) => Some(e),
            ClaimError::Backend(e) => Some(e),
            ClaimError::ResultTooLong { .. } | ClaimError::ResultOverLimit { .. } => None,
        }
    }
}

/// A running attempt: proof of holding the delivery, to hand to
/// [`Claims::complete`], [`Claims::fail`] or [`Claims::extend`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Claim {
    key: String<MAX_KEY_LEN>,
    token: Token,
    attempt: u32,
    after: Start,
    lease: Ttl,
}

impl Claim {
    /// The attempt's fencing number: greater than every earlier attempt's
    /// of the key. Pass it with every write the work makes.
    pub const fn fence(&self) -> u64 {
        self.token.fence()
    }

    /// 1 for the first attempt, one more for each after it.
    pub const fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Why this attempt started.
    pub const fn after(&self) -> Start {
        self.after
    }

    /// The lease it started with: finish (or extend) well within it,
    /// measured from when the begin was sent.
    pub const fn lease(&self) -> Ttl {
        self.lease
    }

    /// The record's key in the store.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The store's token.
    pub const fn token(&self) -> &Token {
        &self.token
    }
}

/// The answer to [`Claims::begin`].
#[derive(Debug, PartialEq, Eq)]
#[allow(
    clippy::large_enum_variant,
    reason = "no heap here: the attempt carries its record key, and an outcome is moved once per delivery"
)]
pub enum ClaimOutcome<'b> {
    /// Run the work, then [`Claims::complete`] or [`Claims::fail`].
    Run(Claim),
    /// Another attempt runs: have the delivery sent again after
    /// `retry_after` (HTTP 409 or 503 with `Retry-After`); it is taken
    /// over if that attempt's worker died.
    Running {
        /// The time left on the running attempt's lease (zero when the
        /// store cannot tell).
        retry_after: Duration,
    },
    /// The work was done: answer as it did, with its stored result.
    Done {
        /// The result [`Claims::complete`] stored (empty for none).
        result: &'b [u8],
    },
}

impl ClaimOutcome<'_> {
    /// The attempt to run, if this is one.
    pub fn claim(&self) -> Option<&Claim> {
        match self {
            ClaimOutcome::Run(claim) => Some(claim),
            _ => None,
        }
    }
}

/// What a [`Claims`] call came to, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ClaimStep {
    /// An attempt started.
    Started {
        /// Why.
        after: Start,
        /// Its number.
        attempt: u32,
    },
    /// A begin found another attempt running.
    Running,
    /// A begin found the work done.
    Done,
    /// An attempt was recorded done.
    Completed,
    /// An attempt was recorded failed.
    Failed,
    /// A complete, fail or extend found that another attempt had begun
    /// (or the lease had ended, for an extend).
    Superseded,
    /// An extend reset the lease.
    Extended,
    /// The store failed.
    Error,
}

impl ClaimStep {
    /// A short name for logs and metric labels.
    pub const fn name(&self) -> &'static str {
        match self {
            ClaimStep::Started { after, .. } => after.name(),
            ClaimStep::Running => "running",
            ClaimStep::Done => "done",
            ClaimStep::Completed => "completed",
            ClaimStep::Failed => "failed",
            ClaimStep::Superseded => "superseded",
            ClaimStep::Extended => "extended",
            ClaimStep::Error => "error",
        }
    }
}

/// One [`Claims`] call, for metrics and logs.
#[derive(Clone, Copy)]
pub struct ClaimEvent<'a> {
    /// The scope.
    pub scope: &'a str,
    /// The delivery key (for a begin) or the record's key.
    pub key: &'a str,
    /// What it came to.
    pub step: ClaimStep,
    /// The store's error behind [`ClaimStep::Error`].
    pub error: Option<&'a dyn fmt::Display>,
}

impl fmt::Debug for ClaimEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ClaimEvent");
        d.field("scope", &self.scope)
            .field("key", &self.key)
            .field("step", &self.step);
        if let Some(error) = self.error {
            d.field("error", &format_args!("{error}"));
        }
        d.finish()
    }
}

/// Receives every [`Claims`] event. `()` ignores them; any
/// `Fn(&ClaimEvent)` is an observer.
pub trait ClaimObserver {
    /// Called once per call that reached the store.
    fn observe(&self, event: &ClaimEvent<'_>);
}

impl ClaimObserver for () {
    fn observe(&self, _event: &ClaimEvent<'_>) {}
}

impl<F: Fn(&ClaimEvent<'_>)> ClaimObserver for F {
    fn observe(&self, event: &ClaimEvent<'_>) {
        self(event)
    }
}

/// Deliveries of one scope, each done at most once and retried until
/// done (see the [module](super) for the record's life).
///
/// [`begin`](Self::begin) answers [`ClaimOutcome::Run`] with an attempt,
/// [`ClaimOutcome::Running`] while another attempt's lease runs, or
/// [`ClaimOutcome::Done`] with the stored result; a store failure is an
/// error, never a duplicate. The attempt ends with
/// [`complete`](Self::complete) (kept `keep`, one hour by default) or
/// [`fail`](Self::fail) (the next delivery runs at once); a worker that
/// does neither is taken over when its lease ends (30 s by default).
///
/// ```
/// # futures_lite::future::block_on(async {
/// use guard_core::claim::{Claims, ClaimOutcome, ClaimStore};
/// use guard_core::lock::Scope;
/// # use guard_core::claim::{Begin, Settled, Start};
/// # use guard_core::lock::{Renewal, Token, TokenId, Ttl};
/// # use core::cell::Cell;
/// # // A one-key store, enough for the example.
/// # struct OneKey(Cell<u8>);
/// # impl ClaimStore for OneKey {
/// #     type Error = core::convert::Infallible;
/// #     async fn try_begin(&self, _: &str, _: Ttl, _: Ttl, r: &mut [u8]) -> Result<Begin, Self::Error> {
/// #         Ok(match self.0.get() {
/// #             0 => { self.0.set(1); Begin::Started { token: Token::new(TokenId([1; 16]), 1), attempt: 1, after: Start::Fresh } }
/// #             _ => { r[..2].copy_from_slice(b"ok"); Begin::Done { result_len: 2 } }
/// #         })
/// #     }
/// #     async fn extend(&self, _: &str, _: &Token, _: Ttl) -> Result<Renewal, Self::Error> { Ok(Renewal::Held) }
/// #     async fn complete(&self, _: &str, _: &Token, _: Ttl, _: &[u8]) -> Result<Settled, Self::Error> { Ok(Settled::Recorded) }
/// #     async fn fail(&self, _: &str, _: &Token, _: Ttl) -> Result<Settled, Self::Error> { Ok(Settled::Recorded) }
/// # }
/// # let store = OneKey(Cell::new(0));
/// let claims = Claims::new(&store, Scope::new("webhooks")?);
/// let mut buffer = [0u8; 64];
/// match claims.begin("evt_42", &mut buffer).await? {
///     ClaimOutcome::Run(claim) => {
///         // The work, under `claim.fence()`; on an error `claims.fail(&claim)`.
///         claims.complete(&claim, b"ok").await?;
///     }
///     ClaimOutcome::Running { retry_after } => { /* 409, Retry-After */ }
///     ClaimOutcome::Done { result } => { /* answer as before: `result` */ }
/// }
/// // The same delivery again: done, with the stored result.
/// let mut buffer = [0u8; 64];
/// assert_eq!(claims.begin("evt_42", &mut buffer).await?, ClaimOutcome::Done { result: b"ok" });
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Claims<'s, S: ?Sized, O = ()> {
    store: &'s S,
    prefix: &'s str,
    scope: Scope,
    lease: Ttl,
    keep: Ttl,
    observer: O,
}

impl<'s, S: ClaimStore + ?Sized> Claims<'s, S, ()> {
    /// The deliveries of `scope` in `store`, with the defaults: lease 30
    /// s, kept one hour, prefix [`DEFAULT_PREFIX`].
    pub fn new(store: &'s S, scope: Scope) -> Self {
        Claims {
            store,
            prefix: DEFAULT_PREFIX,
            scope,
            lease: Ttl::from_valid(DEFAULT_CLAIM_LEASE),
            keep: Ttl::from_valid(DEFAULT_CLAIM_KEEP),
            observer: (),
        }
    }
}

impl<'s, S: ClaimStore + ?Sized, O: ClaimObserver> Claims<'s, S, O> {
    /// The lease of each attempt (at most the keep time).
    pub fn with_lease(mut self, lease: Ttl) -> Result<Self, ClaimConfigError> {
        check_times(lease, self.keep)?;
        self.lease = lease;
        Ok(self)
    }

    /// How long a done or failed record is kept (at least the lease).
    pub fn with_keep(mut self, keep: Ttl) -> Result<Self, ClaimConfigError> {
        check_times(self.lease, keep)?;
        self.keep = keep;
        Ok(self)
    }

    /// The key prefix (an environment namespace such as `prod1:guard:`),
    /// checked on each call as a once-guard's is.
    pub fn with_prefix(mut self, prefix: &'s str) -> Self {
        self.prefix = prefix;
        self
    }

    /// Reports every event to `observer`.
    pub fn with_observer<P: ClaimObserver>(self, observer: P) -> Claims<'s, S, P> {
        Claims {
            store: self.store,
            prefix: self.prefix,
            scope: self.scope,
            lease: self.lease,
            keep: self.keep,
            observer,
        }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The lease of each attempt.
    pub fn lease(&self) -> Ttl {
        self.lease
    }

    /// How long a settled record is kept.
    pub fn keep(&self) -> Ttl {
        self.keep
    }

    /// Starts an attempt on delivery `key` unless one runs or the work is
    /// done; a done delivery's result is read into `result` (give room
    /// for the longest result [`complete`](Self::complete) stores).
    pub async fn begin<'b>(
        &self,
        key: &str,
        result: &'b mut [u8],
    ) -> Result<ClaimOutcome<'b>, ClaimError<S::Error>> {
        let record = claim_key(self.prefix, &self.scope, key).map_err(ClaimError::Key)?;
        let begun = self
            .store
            .try_begin(&record, self.lease, self.keep, result)
            .await;
        let result: &'b [u8] = result;
        let (step, outcome) = match begun {
            Ok(Begin::Started {
                token,
                attempt,
                after,
            }) => (
                ClaimStep::Started { after, attempt },
                Ok(ClaimOutcome::Run(Claim {
                    key: record.clone(),
                    token,
                    attempt,
                    after,
                    lease: self.lease,
                })),
            ),
            Ok(Begin::Running { lease_left }) => (
                ClaimStep::Running,
                Ok(ClaimOutcome::Running {
                    retry_after: lease_left,
                }),
            ),
            Ok(Begin::Done { result_len }) => {
                let buffer = result.len();
                let outcome = match result.get(..result_len) {
                    Some(stored) => Ok(ClaimOutcome::Done { result: stored }),
                    None => Err(ClaimError::ResultTooLong {
                        len: result_len,
                        buffer,
                    }),
                };
                (ClaimStep::Done, outcome)
            }
            Err(e) => {
                self.report(key, ClaimStep::Error, Some(&e));
                return Err(ClaimError::Backend(e));
            }
        };
        self.report(key, step, None);
        outcome
    }

    /// Resets the lease of `claim` to the guard's lease from now:
    /// [`Renewal::Lost`] once the lease has ended (stop the work; another
    /// replica may be taking over).
    pub async fn extend(&self, claim: &Claim) -> Result<Renewal, ClaimError<S::Error>> {
        let extended = self
            .store
            .extend(&claim.key, &claim.token, self.lease)
            .await;
        match extended {
            Ok(renewal) => {
                let step = match renewal {
                    Renewal::Held => ClaimStep::Extended,
                    Renewal::Lost => ClaimStep::Superseded,
                };
                self.report(&claim.key, step, None);
                Ok(renewal)
            }
            Err(e) => {
                self.report(&claim.key, ClaimStep::Error, Some(&e));
                Err(ClaimError::Backend(e))
            }
        }
    }

    /// Records `claim` done with `result` (empty for none, at most
    /// [`MAX_RESULT_LEN`] bytes), answered to every redelivery for the keep
    /// time.
    pub async fn complete(
        &self,
        claim: &Claim,
        result: &[u8],
    ) -> Result<Settled, ClaimError<S::Error>> {
        if result.len() > MAX_RESULT_LEN {
            return Err(ClaimError::ResultOverLimit { len: result.len() });
        }
        let settled = self
            .store
            .complete(&claim.key, &claim.token, self.keep, result)
            .await;
        self.settle(claim, settled, ClaimStep::Completed)
    }

    /// Gives `claim`'s delivery back: the next begin of it starts another
    /// attempt at once.
    pub async fn fail(&self, claim: &Claim) -> Result<Settled, ClaimError<S::Error>> {
        let settled = self.store.fail(&claim.key, &claim.token, self.keep).await;
        self.settle(claim, settled, ClaimStep::Failed)
    }

    fn settle(
        &self,
        claim: &Claim,
        settled: Result<Settled, S::Error>,
        recorded: ClaimStep,
    ) -> Result<Settled, ClaimError<S::Error>> {
        match settled {
            Ok(settled) => {
                let step = match settled {
                    Settled::Recorded => recorded,
                    Settled::Superseded => ClaimStep::Superseded,
                };
                self.report(&claim.key, step, None);
                Ok(settled)
            }
            Err(e) => {
                self.report(&claim.key, ClaimStep::Error, Some(&e));
                Err(ClaimError::Backend(e))
            }
        }
    }

    fn report(&self, key: &str, step: ClaimStep, error: Option<&S::Error>) {
        self.observer.observe(&ClaimEvent {
            scope: self.scope.as_str(),
            key,
            step,
            error: error.map(|e| e as &dyn fmt::Display),
        });
    }
}

fn check_times(lease: Ttl, keep: Ttl) -> Result<(), ClaimConfigError> {
    if keep < lease {
        return Err(ClaimConfigError { lease, keep });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
