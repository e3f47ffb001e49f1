//! Scopes and the key layout of the guards.
//!
//! ```text
//! <prefix>once:<scope>:<delivery key>     OnceGuard, e.g. guard:once:endpoint/schedule:owner=t1:router=r1:1767225600000
//! <prefix>active:<scope>                  ActiveGuard
//! <prefix>claim:<scope>:<delivery key>    Claims (done at most once, retried until done)
//! <prefix>semaphore:<scope>               a semaphore's permits (N holders at once)
//! scope = <component>(:<label>=<value>)*  segments with an empty value are skipped
//! ```
//!
//! The original joined segments with `:` and skipped empty ones, so an
//! empty owner with chain `x` and owner `x` with an empty chain gave the
//! same scope, and a segment containing `:` could alias two others. Here
//! every segment is labelled, and the component, values and delivery key
//! pass the key codec ([`crate::key`]: `%` → `%25`, `:` → `%3A`, `{` →
//! `%7B`, `}` → `%7D`, control characters such as NUL → `%00`), so
//! distinct inputs never give the same key. No escaped part contains a
//! brace, which keeps Redis Cluster hash tags under the backend's control,
//! nor a NUL, which PostgreSQL and etcd lockers refuse: any text either
//! becomes a key every locker stores or is refused here for its length.

use core::fmt;

use heapless::String;

use crate::key::{Reserved, escaped};

/// The default prefix of every guard key.
pub const DEFAULT_PREFIX: &str = "guard:";

/// The longest key the guards build, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// The longest encoded scope, in bytes.
pub const MAX_SCOPE_LEN: usize = 128;

/// A key or scope that cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum KeyError {
    /// The result exceeds `limit` bytes.
    TooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// A segment label must be non-empty and use only `a-z`, `0-9`, `_`, `-`.
    InvalidLabel,
    /// A key prefix must not contain `{` or `}`: the Redis lockers put the
    /// hash tag that keeps a lock and its fence counter in one cluster
    /// slot, and a brace in the prefix would move it.
    BraceInPrefix,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::TooLong { limit } => write!(f, "key or scope longer than {limit} bytes"),
            KeyError::InvalidLabel => {
                f.write_str("segment label must be non-empty and use only a-z, 0-9, '_' and '-'")
            }
            KeyError::BraceInPrefix => f.write_str(
                "a key prefix must not contain '{' or '}' (they would move the Redis Cluster hash tag)",
            ),
        }
    }
}

impl core::error::Error for KeyError {}

/// Appends `value` to `out` through the key codec ([`crate::key`]): the
/// characters that carry structure, `%` and control characters escaped.
fn push_escaped<const N: usize>(out: &mut String<N>, value: &str) -> Result<(), KeyError> {
    use core::fmt::Write as _;
    write!(out, "{}", escaped(value, Reserved::Segment)).map_err(|_| KeyError::TooLong { limit: N })
}

fn push_raw<const N: usize>(out: &mut String<N>, s: &str) -> Result<(), KeyError> {
    out.push_str(s).map_err(|_| KeyError::TooLong { limit: N })
}

/// What a guard's keys are scoped to: a component (for example
/// `endpoint/schedule`) and labelled segments (owner, chain, router, ...).
///
/// ```
/// use guard_core::lock::Scope;
///
/// let scope = Scope::new("endpoint/schedule")?
///     .segment("owner", "tenantA")?
///     .segment("chain", "")? // empty: skipped
///     .segment("router", "r:1")?;
/// assert_eq!(scope.as_str(), "endpoint/schedule:owner=tenantA:router=r%3A1");
/// # Ok::<(), guard_core::lock::KeyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Scope {
    encoded: String<MAX_SCOPE_LEN>,
}

impl Scope {
    /// A scope for `component` (escaped; may be empty).
    pub fn new(component: &str) -> Result<Self, KeyError> {
        let mut encoded = String::new();
        push_escaped(&mut encoded, component)?;
        Ok(Scope { encoded })
    }

    /// Adds `label=value`; an empty `value` is skipped.
    pub fn segment(mut self, label: &str, value: &str) -> Result<Self, KeyError> {
        let valid_label = !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !valid_label {
            return Err(KeyError::InvalidLabel);
        }
        if value.is_empty() {
            return Ok(self);
        }
        push_raw(&mut self.encoded, ":")?;
        push_raw(&mut self.encoded, label)?;
        push_raw(&mut self.encoded, "=")?;
        push_escaped(&mut self.encoded, value)?;
        Ok(self)
    }

    /// The encoded scope.
    pub fn as_str(&self) -> &str {
        self.encoded.as_str()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks a guard key prefix: anything but `{` and `}`, which would move
/// the hash tag the Redis lockers add (a lock and its fence counter would
/// land in different cluster slots, and every acquisition would fail).
///
/// ```
/// use guard_core::lock::{KeyError, check_prefix};
///
/// assert_eq!(check_prefix("prod1:guard:"), Ok(()));
/// assert_eq!(check_prefix("p{"), Err(KeyError::BraceInPrefix));
/// ```
pub fn check_prefix(prefix: &str) -> Result<(), KeyError> {
    if prefix.contains(['{', '}']) {
        return Err(KeyError::BraceInPrefix);
    }
    Ok(())
}

/// `<prefix>once:<scope>:<delivery key>`, the delivery key escaped. The
/// prefix is used as given (by convention it ends with `:`) and checked
/// with [`check_prefix`].
pub fn once_key(
    prefix: &str,
    scope: &Scope,
    delivery_key: &str,
) -> Result<String<MAX_KEY_LEN>, KeyError> {
    delivery_scoped_key(prefix, "once:", scope, delivery_key)
}

/// `<prefix><kind><scope>:<delivery key>`, the delivery key escaped.
fn delivery_scoped_key(
    prefix: &str,
    kind: &str,
    scope: &Scope,
    delivery_key: &str,
) -> Result<String<MAX_KEY_LEN>, KeyError> {
    check_prefix(prefix)?;
    let mut key = String::new();
    push_raw(&mut key, prefix)?;
    push_raw(&mut key, kind)?;
    push_raw(&mut key, scope.as_str())?;
    push_raw(&mut key, ":")?;
    push_escaped(&mut key, delivery_key)?;
    Ok(key)
}

/// `<prefix>claim:<scope>:<delivery key>`, the key of a
/// [`Claims`](crate::claim::Claims) record, escaped and checked as
/// [`once_key`]'s: a claim and a once-guard on one scope never share a key.
pub fn claim_key(
    prefix: &str,
    scope: &Scope,
    delivery_key: &str,
) -> Result<String<MAX_KEY_LEN>, KeyError> {
    delivery_scoped_key(prefix, "claim:", scope, delivery_key)
}

/// `<prefix>active:<scope>`; the prefix is checked with [`check_prefix`].
pub fn active_key(prefix: &str, scope: &Scope) -> Result<String<MAX_KEY_LEN>, KeyError> {
    scope_key(prefix, "active:", scope)
}

/// `<prefix><kind><scope>`.
fn scope_key(prefix: &str, kind: &str, scope: &Scope) -> Result<String<MAX_KEY_LEN>, KeyError> {
    check_prefix(prefix)?;
    let mut key = String::new();
    push_raw(&mut key, prefix)?;
    push_raw(&mut key, kind)?;
    push_raw(&mut key, scope.as_str())?;
    Ok(key)
}

/// `<prefix>semaphore:<scope>`, the key of a
/// [`Semaphore`](crate::semaphore::Semaphore)'s permits; the prefix is
/// checked with [`check_prefix`].
///
/// ```
/// use guard_core::lock::{Scope, semaphore_key};
///
/// let key = semaphore_key("guard:", &Scope::new("exports")?)?;
/// assert_eq!(key.as_str(), "guard:semaphore:exports");
/// # Ok::<(), guard_core::lock::KeyError>(())
/// ```
pub fn semaphore_key(prefix: &str, scope: &Scope) -> Result<String<MAX_KEY_LEN>, KeyError> {
    scope_key(prefix, "semaphore:", scope)
}
