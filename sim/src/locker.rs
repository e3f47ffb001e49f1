//! The replicas' view of the lock service: a `Locker` whose calls become
//! messages, so guard-core's own `OnceGuard` runs unchanged in the world.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::poll_fn;
use std::task::Poll;

use guard_core::lock::{LeaseRenewer, Locker, Renewal, Token, TokenId, Ttl, UnlockError};

use crate::server::{LockOp, LockReply};

/// A call that got no answer in time (lost, partitioned, service down).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut;

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lock service did not answer in time")
    }
}

/// A reply as the client sees it: an answer or a time-out.
pub type Answer = Result<LockReply, TimedOut>;

/// One replica's connection to the lock service. A call records its
/// request in the outbox and waits until the world hands in its answer.
#[derive(Debug, Default)]
pub struct SimLocker {
    /// Requests not yet sent: (request id, operation).
    pub outbox: RefCell<Vec<(u64, LockOp)>>,
    answers: RefCell<HashMap<u64, Answer>>,
    next_request: Cell<u64>,
    /// Distinguishes this incarnation's tokens from every other's.
    token_base: u128,
    next_token: Cell<u64>,
}

impl SimLocker {
    /// A connection for `replica` in its `epoch`-th life.
    pub fn new(replica: usize, epoch: u64) -> Self {
        SimLocker {
            token_base: ((replica as u128) << 96) | (u128::from(epoch) << 64),
            ..SimLocker::default()
        }
    }

    /// A fresh token id.
    pub fn new_token(&self) -> u128 {
        let n = self.next_token.get() + 1;
        self.next_token.set(n);
        self.token_base | u128::from(n)
    }

    /// A fresh request id.
    pub fn request_id(&self) -> u64 {
        let id = self.next_request.get() + 1;
        self.next_request.set(id);
        id
    }

    /// Queues `op`; returns its request id.
    pub fn send(&self, op: LockOp) -> u64 {
        let id = self.request_id();
        self.outbox.borrow_mut().push((id, op));
        id
    }

    /// The world hands in the answer to request `id`.
    pub fn answer(&self, id: u64, answer: Answer) {
        self.answers.borrow_mut().insert(id, answer);
    }

    async fn call(&self, op: LockOp) -> Answer {
        let id = self.send(op);
        poll_fn(|_| match self.answers.borrow_mut().remove(&id) {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        })
        .await
    }
}

/// The 16-byte id of a simulated token.
pub fn token_id(token: u128) -> TokenId {
    TokenId(token.to_be_bytes())
}

/// What `Locker::try_lock` returns for `answer` to an acquire with `token`.
pub fn lock_result(token: u128, answer: Answer) -> Result<Option<Token>, TimedOut> {
    match answer? {
        LockReply::Granted(fence) => Ok(Some(Token::new(token_id(token), fence))),
        _ => Ok(None),
    }
}

/// What `LeaseRenewer::renew` returns for `answer` to a renewal.
pub fn renew_result(answer: Answer) -> Result<Renewal, TimedOut> {
    match answer? {
        LockReply::Done => Ok(Renewal::Held),
        _ => Ok(Renewal::Lost),
    }
}

/// What `Locker::unlock` returns for `answer` to a release.
pub fn unlock_result(answer: Answer) -> Result<(), UnlockError<TimedOut>> {
    match answer.map_err(UnlockError::Backend)? {
        LockReply::Done => Ok(()),
        _ => Err(UnlockError::NotHeld),
    }
}

impl Locker for SimLocker {
    type Error = TimedOut;

    async fn try_lock(&self, key: &str, ttl: Ttl) -> Result<Option<Token>, TimedOut> {
        let token = self.new_token();
        let op = LockOp::Acquire {
            key: key.to_owned(),
            token,
            ttl_ns: ttl_nanos(ttl),
        };
        lock_result(token, self.call(op).await)
    }

    async fn unlock(&self, key: &str, token: &Token) -> Result<(), UnlockError<TimedOut>> {
        let op = LockOp::Release {
            key: key.to_owned(),
            token: u128::from_be_bytes(token.id().0),
        };
        unlock_result(self.call(op).await)
    }
}

impl LeaseRenewer for SimLocker {
    async fn renew(&self, key: &str, token: &Token, ttl: Ttl) -> Result<Renewal, TimedOut> {
        let op = LockOp::Renew {
            key: key.to_owned(),
            token: u128::from_be_bytes(token.id().0),
            ttl_ns: ttl_nanos(ttl),
        };
        renew_result(self.call(op).await)
    }
}

/// A TTL in nanoseconds.
pub fn ttl_nanos(ttl: Ttl) -> u64 {
    u64::try_from(ttl.as_duration().as_nanos()).unwrap_or(u64::MAX)
}
