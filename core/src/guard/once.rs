//! Message-level deduplication: one winner per delivery key.

use core::fmt;
use core::time::Duration;

use crate::lock::{DEFAULT_PREFIX, KeyError, Locker, Scope, Ttl, once_key};

/// What a guard does when the lock backend fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum FailPolicy {
    /// Skip the action (the default): a missed run of a periodic job heals
    /// on the next period, a duplicate cannot be undone.
    #[default]
    FailClosed,
    /// Run the action: for claim-style actions where a retry downstream is
    /// the safety net. Only a store that failed: a key the store refuses
    /// as invalid input ([`Locker::is_invalid_input`]) is skipped.
    FailOpen,
}

/// The result of [`OnceGuard::allow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum OnceOutcome {
    /// This replica claimed the key: run the action, passing `fence` to
    /// the resource it touches.
    Won {
        /// The fencing number of the claim.
        fence: u64,
    },
    /// Another holder claimed the key: skip.
    AlreadyClaimed,
    /// The backend failed and the policy is fail-closed, or the backend
    /// refused the key as invalid input (whatever the policy): skip.
    SkippedOnError,
    /// The backend failed and the policy is fail-open: run (unfenced).
    AllowedOnError,
    /// No locker is configured: a single process, always run.
    Unguarded,
}

impl OnceOutcome {
    /// Whether the action should run.
    pub const fn is_allowed(&self) -> bool {
        matches!(
            self,
            OnceOutcome::Won { .. } | OnceOutcome::AllowedOnError | OnceOutcome::Unguarded
        )
    }

    /// The fence of a won claim.
    pub const fn fence(&self) -> Option<u64> {
        match self {
            OnceOutcome::Won { fence } => Some(*fence),
            _ => None,
        }
    }

    /// A short name for logs and metric labels.
    pub const fn name(&self) -> &'static str {
        match self {
            OnceOutcome::Won { .. } => "won",
            OnceOutcome::AlreadyClaimed => "lost",
            OnceOutcome::SkippedOnError => "skipped_on_error",
            OnceOutcome::AllowedOnError => "allowed_on_error",
            OnceOutcome::Unguarded => "unguarded",
        }
    }
}

/// One decision of a [`OnceGuard`], for metrics and logs.
#[derive(Clone, Copy)]
pub struct OnceEvent<'a> {
    /// The guard's scope.
    pub scope: &'a str,
    /// The delivery key.
    pub key: &'a str,
    /// The outcome.
    pub outcome: OnceOutcome,
    /// The backend error behind `SkippedOnError` / `AllowedOnError`.
    pub error: Option<&'a dyn fmt::Display>,
}

impl fmt::Debug for OnceEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("OnceEvent");
        d.field("scope", &self.scope)
            .field("key", &self.key)
            .field("outcome", &self.outcome);
        if let Some(error) = self.error {
            d.field("error", &format_args!("{error}"));
        }
        d.finish()
    }
}

/// Receives every [`OnceGuard`] decision (won, lost, skipped or allowed on
/// error). `()` ignores them; any `Fn(&OnceEvent)` is an observer.
pub trait OnceObserver {
    /// Called once per [`OnceGuard::allow`] that reached a decision.
    fn observe(&self, event: &OnceEvent<'_>);
}

impl OnceObserver for () {
    fn observe(&self, _event: &OnceEvent<'_>) {}
}

impl<F: Fn(&OnceEvent<'_>)> OnceObserver for F {
    fn observe(&self, event: &OnceEvent<'_>) {
        self(event)
    }
}

/// The default time a claimed key is kept: one hour. It must exceed the
/// longest run of the guarded action.
pub const DEFAULT_ONCE_TTL: Duration = Duration::from_secs(3600);

/// At most one execution per delivery key across replicas sharing a
/// locker.
///
/// [`allow`](Self::allow) makes one `try_lock` on
/// `<prefix>once:<scope>:<key>` with the guard's TTL: the winner runs, the
/// others skip, with no retry and no wait. The claim is never unlocked: it
/// marks the key as done for the whole TTL. With no locker, every call is
/// allowed without touching anything.
///
/// The key must be derived from the delivery itself (message id, planned
/// slot), never from a local clock reading, or each replica builds its own
/// key and nothing is deduplicated.
///
/// ```
/// # futures_lite::future::block_on(async {
/// use guard_core::guard::{OnceGuard, OnceOutcome};
/// use guard_core::lock::{Locker, Scope};
///
/// // A single process: no locker, always allowed.
/// # struct NoLocker;
/// # impl Locker for NoLocker {
/// #     type Error = core::convert::Infallible;
/// #     async fn try_lock(&self, _: &str, _: guard_core::lock::Ttl) -> Result<Option<guard_core::lock::Token>, Self::Error> { Ok(None) }
/// #     async fn unlock(&self, _: &str, _: &guard_core::lock::Token) -> Result<(), guard_core::lock::UnlockError<Self::Error>> { Ok(()) }
/// # }
/// let scope = Scope::new("consumer")?.segment("owner", "tenant1")?;
/// let guard: OnceGuard<'_, NoLocker> = OnceGuard::new(None, scope);
/// assert_eq!(guard.allow("msg-42").await?, OnceOutcome::Unguarded);
/// # Ok::<(), guard_core::lock::KeyError>(())
/// # }).unwrap();
/// ```
pub struct OnceGuard<'l, L: ?Sized, O = ()> {
    locker: Option<&'l L>,
    prefix: &'l str,
    scope: Scope,
    ttl: Ttl,
    policy: FailPolicy,
    observer: O,
}

impl<'l, L: Locker + ?Sized> OnceGuard<'l, L, ()> {
    /// A guard over `locker` (none: always allowed) for `scope`, with the
    /// defaults: TTL one hour, fail-closed, prefix [`DEFAULT_PREFIX`].
    pub fn new(locker: Option<&'l L>, scope: Scope) -> Self {
        OnceGuard {
            locker,
            prefix: DEFAULT_PREFIX,
            scope,
            ttl: Ttl::from_valid(DEFAULT_ONCE_TTL),
            policy: FailPolicy::FailClosed,
            observer: (),
        }
    }
}

impl<'l, L: Locker + ?Sized, O: OnceObserver> OnceGuard<'l, L, O> {
    /// How long a claimed key is kept.
    pub fn with_ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self
    }

    /// What to do when the backend fails.
    pub fn with_fail_policy(mut self, policy: FailPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The key prefix (an environment namespace such as `prod1:guard:`).
    /// A prefix with `{` or `}` makes every `allow` fail with
    /// [`KeyError::BraceInPrefix`] (never a silent skip); check it where it
    /// enters with [`check_prefix`](crate::lock::check_prefix), as
    /// guard-std's `GuardConfig::with_prefix` does.
    pub fn with_prefix(mut self, prefix: &'l str) -> Self {
        self.prefix = prefix;
        self
    }

    /// Reports every decision to `observer`.
    pub fn with_observer<P: OnceObserver>(self, observer: P) -> OnceGuard<'l, L, P> {
        OnceGuard {
            locker: self.locker,
            prefix: self.prefix,
            scope: self.scope,
            ttl: self.ttl,
            policy: self.policy,
            observer,
        }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The TTL of a claim.
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// Claims `key`: see the type's documentation. Errors only if the key
    /// cannot be built (longer than [`crate::lock::MAX_KEY_LEN`]).
    pub async fn allow(&self, key: &str) -> Result<OnceOutcome, KeyError> {
        let Some(locker) = self.locker else {
            return Ok(OnceOutcome::Unguarded);
        };
        let lock_key = once_key(self.prefix, &self.scope, key)?;
        let (outcome, error) = match locker.try_lock(&lock_key, self.ttl).await {
            Ok(Some(token)) => (
                OnceOutcome::Won {
                    fence: token.fence(),
                },
                None,
            ),
            Ok(None) => (OnceOutcome::AlreadyClaimed, None),
            // Input the store refuses is never run unguarded: fail-open
            // is for a store that failed, not for a key crafted to fail.
            Err(e) if L::is_invalid_input(&e) => (OnceOutcome::SkippedOnError, Some(e)),
            Err(e) => (
                match self.policy {
                    FailPolicy::FailClosed => OnceOutcome::SkippedOnError,
                    FailPolicy::FailOpen => OnceOutcome::AllowedOnError,
                },
                Some(e),
            ),
        };
        self.observer.observe(&OnceEvent {
            scope: self.scope.as_str(),
            key,
            outcome,
            error: error.as_ref().map(|e| e as &dyn fmt::Display),
        });
        Ok(outcome)
    }
}
