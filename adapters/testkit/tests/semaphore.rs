//! LocalLocker passes the Semaphore contract that every backend runs, on
//! the system clock and on a manual clock. And the suite fails a
//! semaphore that breaks a rule, with a message naming the rule; a
//! check-then-act race is caught on one thread.

use std::cell::RefCell;
use std::convert::Infallible;
use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::lock::{Renewal, Token, Ttl, UnlockError};
use guard_core::semaphore::{MAX_PERMITS, Permits, Semaphore};
use guard_core::slot::UnixMillis;
use guard_std::{LocalLocker, ManualClock};
use guard_testkit::semaphore;

#[test]
fn local_locker_passes_the_semaphore_contract() {
    let locker = LocalLocker::new();
    block_on(semaphore::run_all(
        &locker,
        "sem",
        20,
        1,
        async_io::Timer::after,
    ));
}

#[test]
fn local_locker_on_a_manual_clock_passes_the_semaphore_contract() {
    let clock = ManualClock::new(UnixMillis(0));
    let locker = LocalLocker::with_clock(clock.clone());
    block_on(semaphore::run_all(
        &locker,
        "manual",
        20,
        1,
        |d: Duration| {
            clock.advance(d);
            std::future::ready(())
        },
    ));
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Grants one permit more than asked.
    GrantsBeyondThePermits,
    /// Counts, yields, then grants: two callers both see room for one.
    ChecksThenActs,
    /// Releases some live permit of the key, whatever the token.
    ReleasesForAnyToken,
    /// Takes every lease as an hour.
    NeverExpires,
    /// Answers Held for a live permit without extending its lease (it
    /// renews it to 1 ms).
    RenewsWithoutExtending,
    /// Every permit has fence 1.
    RepeatsFences,
    /// Counts ended permits as holders.
    CountsEndedPermits,
}

/// LocalLocker on a manual clock, with one rule broken.
struct Broken {
    inner: LocalLocker<ManualClock>,
    fault: Fault,
    /// Every permit granted and not released.
    granted: RefCell<Vec<(String, Token)>>,
}

impl Semaphore for Broken {
    type Error = Infallible;

    async fn try_acquire(
        &self,
        key: &str,
        permits: Permits,
        lease: Ttl,
    ) -> Result<Option<Token>, Infallible> {
        let granted = match self.fault {
            Fault::GrantsBeyondThePermits => {
                let more = Permits::new(permits.get() + 1).unwrap();
                self.inner.try_acquire(key, more, lease).await?
            }
            Fault::ChecksThenActs => {
                let room = self.inner.holders(key).await? < permits.get();
                futures_lite::future::yield_now().await;
                if !room {
                    return Ok(None);
                }
                let any = Permits::new(MAX_PERMITS).unwrap();
                self.inner.try_acquire(key, any, lease).await?
            }
            Fault::NeverExpires => {
                let hour = Ttl::from_secs(3_600).unwrap();
                self.inner.try_acquire(key, permits, hour).await?
            }
            Fault::RepeatsFences => self
                .inner
                .try_acquire(key, permits, lease)
                .await?
                .map(|t| Token::new(*t.id(), 1)),
            _ => self.inner.try_acquire(key, permits, lease).await?,
        };
        if let Some(token) = granted {
            self.granted.borrow_mut().push((key.to_owned(), token));
        }
        Ok(granted)
    }

    async fn renew(&self, key: &str, token: &Token, lease: Ttl) -> Result<Renewal, Infallible> {
        match self.fault {
            Fault::RenewsWithoutExtending => self.inner.renew(key, token, Ttl::MIN).await,
            Fault::RepeatsFences => {
                let real = self.real(key, token);
                self.inner.renew(key, &real, lease).await
            }
            _ => self.inner.renew(key, token, lease).await,
        }
    }

    async fn release(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        let released = self.release_inner(key, token).await;
        if released.is_ok() {
            self.granted
                .borrow_mut()
                .retain(|(k, t)| !(k == key && t.id() == token.id()));
        }
        released
    }

    async fn holders(&self, key: &str) -> Result<u32, Infallible> {
        Ok(match self.fault {
            // Every permit granted and not released, ended or not.
            Fault::CountsEndedPermits => {
                let granted = self.granted.borrow();
                granted.iter().filter(|(k, _)| k == key).count() as u32
            }
            _ => self.inner.holders(key).await?,
        })
    }
}

impl Broken {
    async fn release_inner(&self, key: &str, token: &Token) -> Result<(), UnlockError<Infallible>> {
        match self.fault {
            Fault::ReleasesForAnyToken => {
                let mine: Vec<Token> = self
                    .granted
                    .borrow()
                    .iter()
                    .filter(|(k, _)| k == key)
                    .map(|(_, t)| *t)
                    .collect();
                for held in mine {
                    if self.inner.release(key, &held).await.is_ok() {
                        return Ok(());
                    }
                }
                Err(UnlockError::NotHeld)
            }
            Fault::RepeatsFences => {
                let real = self.real(key, token);
                self.inner.release(key, &real).await
            }
            _ => self.inner.release(key, token).await,
        }
    }

    /// The token as granted (the fence the inner semaphore gave it).
    fn real(&self, key: &str, token: &Token) -> Token {
        self.granted
            .borrow()
            .iter()
            .find(|(k, t)| k == key && t.id() == token.id())
            .map_or(*token, |(_, t)| *t)
    }
}

#[test]
fn a_semaphore_that_breaks_a_rule_fails_the_check_that_names_it() {
    for (fault, rule) in [
        (
            Fault::GrantsBeyondThePermits,
            "sem:race: exactly 3 of 8 concurrent contenders for 3 permits win",
        ),
        (
            Fault::ChecksThenActs,
            "sem:race: exactly 3 of 8 concurrent contenders for 3 permits win",
        ),
        (
            Fault::ReleasesForAnyToken,
            "sem:release: a stranger's token releases nothing",
        ),
        (
            Fault::NeverExpires,
            "sem:expiry: permits whose leases ended count no more",
        ),
        (
            Fault::RenewsWithoutExtending,
            "sem:renew: a renewed permit outlives its first lease",
        ),
        (
            Fault::RepeatsFences,
            "sem:race: permits held together have distinct tokens and fences",
        ),
        (
            Fault::CountsEndedPermits,
            "sem:expiry: permits whose leases ended count no more",
        ),
    ] {
        let clock = ManualClock::new(UnixMillis(0));
        let broken = Broken {
            inner: LocalLocker::with_clock(clock.clone()),
            fault,
            granted: Default::default(),
        };
        let message = guard_testkit::broken_rule("a broken semaphore", || {
            block_on(semaphore::run_all(&broken, "sem", 8, 1, |d: Duration| {
                clock.advance(d);
                std::future::ready(())
            }))
        });
        assert!(message.contains(rule), "{fault:?}: {message}");
    }
}
