//! A limiter's parameters whatever its backend, and replacing them.

use std::fmt;
use std::time::Duration;

use guard_core::limit::{
    Algorithm, Bucket, FixedWindow, LimiterError, Rate, SlidingWindow, TokenBucket, Tokens, Water,
};

use crate::shared::BackendError;

/// The parameters of a limiter, as a value any backend understands: what
/// [`super::RateLimiter::quota`] reports and
/// [`super::RateLimiter::reconfigure`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    /// A token bucket: `capacity` tokens refilled at `rate`.
    TokenBucket {
        /// The burst size.
        capacity: u32,
        /// The refill rate.
        rate: Rate,
    },
    /// A meter-style leaky bucket: up to `capacity` units of water,
    /// drained at `rate`.
    LeakyBucket {
        /// The most water held.
        capacity: u32,
        /// The drain rate.
        rate: Rate,
    },
    /// At most `limit` admissions in any `window`.
    SlidingWindow {
        /// Admissions per window.
        limit: u32,
        /// The window's width.
        window: Duration,
    },
    /// At most `limit` units in each aligned window of `period`, given
    /// back all at once at its end.
    FixedWindow {
        /// Units per window.
        limit: u32,
        /// The window's length.
        period: Duration,
        /// Where windows start past each multiple of `period` from the
        /// clock's origin (the Unix epoch on an [`crate::EpochClock`]).
        offset: Duration,
    },
}

impl Quota {
    /// The quota of every key: the capacity or the limit.
    pub const fn limit(&self) -> u32 {
        match self {
            Quota::TokenBucket { capacity, .. } | Quota::LeakyBucket { capacity, .. } => *capacity,
            Quota::SlidingWindow { limit, .. } | Quota::FixedWindow { limit, .. } => *limit,
        }
    }

    /// The algorithm's name, as in messages.
    pub const fn kind(&self) -> &'static str {
        match self {
            Quota::TokenBucket { .. } => "token bucket",
            Quota::LeakyBucket { .. } => "leaky bucket",
            Quota::SlidingWindow { .. } => "sliding window",
            Quota::FixedWindow { .. } => "fixed window",
        }
    }
}

/// Why a limiter refused new parameters; it kept the old ones.
#[derive(Debug)]
pub enum ReconfigureError {
    /// The quota is of another algorithm than the limiter's: a limiter
    /// changes its parameters, never its algorithm (the keys' states would
    /// mean nothing to another one).
    OtherAlgorithm {
        /// The limiter's algorithm.
        limiter: &'static str,
        /// The quota's.
        quota: &'static str,
    },
    /// The limiter decides by several bandwidths: one quota cannot say
    /// which of them to change. Its own call takes the whole policy
    /// (`MemoryLimiter::reconfigure_with`, `RedisBandwidths::reconfigure`).
    SeveralBandwidths {
        /// How many bandwidths the limiter has.
        bandwidths: usize,
    },
    /// The parameters are impossible (guard-core's check).
    Invalid(LimiterError),
    /// The backend cannot represent them (for example a Redis interval
    /// that is not a whole number of microseconds).
    Backend(BackendError),
}

impl fmt::Display for ReconfigureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconfigureError::OtherAlgorithm { limiter, quota } => write!(
                f,
                "a {limiter} limiter cannot take a {quota} quota: a limiter changes its \
                 parameters, not its algorithm"
            ),
            ReconfigureError::SeveralBandwidths { bandwidths } => write!(
                f,
                "a limiter of {bandwidths} bandwidths cannot take one quota: replace its \
                 whole policy"
            ),
            ReconfigureError::Invalid(e) => write!(f, "invalid quota: {e}"),
            ReconfigureError::Backend(e) => write!(f, "quota refused by the backend: {e}"),
        }
    }
}

impl std::error::Error for ReconfigureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReconfigureError::OtherAlgorithm { .. }
            | ReconfigureError::SeveralBandwidths { .. } => None,
            ReconfigureError::Invalid(e) => Some(e),
            ReconfigureError::Backend(e) => Some(e),
        }
    }
}

/// An algorithm a [`Quota`] describes: what a limiter over it needs to
/// report and replace its parameters.
pub trait FromQuota: Algorithm + Sized {
    /// These parameters as a quota.
    fn quota(&self) -> Quota;

    /// The algorithm `quota` describes; refused when it describes another
    /// algorithm or impossible parameters.
    fn from_quota(quota: Quota) -> Result<Self, ReconfigureError>;
}

fn other(limiter: &'static str, quota: Quota) -> ReconfigureError {
    ReconfigureError::OtherAlgorithm {
        limiter,
        quota: quota.kind(),
    }
}

impl FromQuota for TokenBucket {
    fn quota(&self) -> Quota {
        Quota::TokenBucket {
            capacity: self.capacity(),
            rate: self.rate(),
        }
    }

    fn from_quota(quota: Quota) -> Result<Self, ReconfigureError> {
        match quota {
            Quota::TokenBucket { capacity, rate } => {
                Bucket::<Tokens>::new(capacity, rate).map_err(ReconfigureError::Invalid)
            }
            _ => Err(other("token bucket", quota)),
        }
    }
}

impl FromQuota for Bucket<Water> {
    fn quota(&self) -> Quota {
        Quota::LeakyBucket {
            capacity: self.capacity(),
            rate: self.rate(),
        }
    }

    fn from_quota(quota: Quota) -> Result<Self, ReconfigureError> {
        match quota {
            Quota::LeakyBucket { capacity, rate } => {
                Bucket::<Water>::new(capacity, rate).map_err(ReconfigureError::Invalid)
            }
            _ => Err(other("leaky bucket", quota)),
        }
    }
}

impl<const N: usize> FromQuota for SlidingWindow<N> {
    fn quota(&self) -> Quota {
        Quota::SlidingWindow {
            limit: self.limit(),
            window: self.window(),
        }
    }

    fn from_quota(quota: Quota) -> Result<Self, ReconfigureError> {
        match quota {
            Quota::SlidingWindow { limit, window } => {
                SlidingWindow::new(window, limit).map_err(ReconfigureError::Invalid)
            }
            _ => Err(other("sliding window", quota)),
        }
    }
}

impl FromQuota for FixedWindow {
    fn quota(&self) -> Quota {
        Quota::FixedWindow {
            limit: self.limit(),
            period: self.period(),
            offset: self.offset(),
        }
    }

    fn from_quota(quota: Quota) -> Result<Self, ReconfigureError> {
        match quota {
            Quota::FixedWindow {
                limit,
                period,
                offset,
            } => FixedWindow::new(period, limit)
                .map(|w| w.with_offset(offset))
                .map_err(ReconfigureError::Invalid),
            _ => Err(other("fixed window", quota)),
        }
    }
}
