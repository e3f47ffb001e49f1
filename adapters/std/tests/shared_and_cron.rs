//! The shared locker handle, the guard configuration and cron schedules.

use std::time::Duration;

use futures_lite::future::block_on;
use guard_core::lock::{Locker, Renewal, Token, Ttl, UnlockError};
use guard_core::slot::{Schedule, SlotTimer, UnixMillis};
use guard_std::{
    BoxFuture, CronSchedule, DynLocker, GuardConfig, LocalLocker, LockerError, SharedLocker,
};

#[test]
fn a_shared_local_locker_locks_and_renews() {
    let shared = SharedLocker::new(LocalLocker::new());
    assert!(shared.can_renew());
    let ttl = Ttl::from_secs(10).unwrap();
    let t = block_on(shared.try_lock("k", ttl)).unwrap().unwrap();
    assert!(
        block_on(shared.clone().try_lock("k", ttl))
            .unwrap()
            .is_none(),
        "clones share one locker"
    );
    assert_eq!(block_on(shared.renew("k", &t, ttl)).unwrap(), Renewal::Held);
    block_on(shared.unlock("k", &t)).unwrap();
}

/// A backend that can lock but not renew.
struct NoRenew(LocalLocker);

impl DynLocker for NoRenew {
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Option<Token>, LockerError>> {
        DynLocker::try_lock(&self.0, key, ttl)
    }
    fn unlock<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), UnlockError<LockerError>>> {
        DynLocker::unlock(&self.0, key, token)
    }
    fn can_renew(&self) -> bool {
        false
    }
    fn renew<'a>(
        &'a self,
        _: &'a str,
        _: &'a Token,
        _: Ttl,
    ) -> BoxFuture<'a, Result<Renewal, LockerError>> {
        unreachable!("renew is never called on a locker that cannot renew")
    }
}

#[test]
fn a_renewless_backend_never_looks_renewable() {
    let shared = SharedLocker::new(NoRenew(LocalLocker::new()));
    assert!(!shared.can_renew());
    let ttl = Ttl::from_secs(10).unwrap();
    let t = block_on(shared.try_lock("k", ttl)).unwrap().unwrap();
    let err = block_on(shared.renew("k", &t, ttl)).unwrap_err();
    assert_eq!(err.to_string(), "this locker cannot renew a lease in place");
}

#[test]
fn guard_config_carries_locker_owner_and_prefix() {
    let none = GuardConfig::new();
    assert!(none.locker().is_none());
    assert_eq!(none.prefix(), "guard:");
    assert_eq!(
        none.scope("endpoint/schedule").unwrap().as_str(),
        "endpoint/schedule"
    );
    let config = GuardConfig::new()
        .with_locker(SharedLocker::new(LocalLocker::new()))
        .with_owner("tenant1")
        .with_prefix("prod1:guard:")
        .unwrap();
    assert!(config.locker().is_some_and(SharedLocker::can_renew));
    assert_eq!(
        config
            .scope("endpoint/schedule")
            .unwrap()
            .segment("router", "r1")
            .unwrap()
            .as_str(),
        "endpoint/schedule:owner=tenant1:router=r1"
    );
    assert_eq!(config.prefix(), "prod1:guard:");
}

#[test]
fn cron_requires_a_seconds_field_and_names_the_bad_expression() {
    let err = "* * * * *".parse::<CronSchedule>().unwrap_err();
    assert!(err.to_string().contains("\"* * * * *\""), "{err}");
    assert!(err.to_string().contains("5 fields"), "{err}");
    assert!("*".parse::<CronSchedule>().is_err(), "a bare * is invalid");
    assert!("61 * * * * *".parse::<CronSchedule>().is_err());
    assert!("0 30 9 * * Mon-Fri".parse::<CronSchedule>().is_ok());
    assert!("@daily".parse::<CronSchedule>().is_ok());
}

#[test]
fn cron_slots_are_computed_in_utc() {
    // 2026-01-01T00:00:00Z is 1767225600 s.
    let midnight = UnixMillis(1_767_225_600_000);
    let daily: CronSchedule = "0 0 0 * * *".parse().unwrap();
    assert_eq!(daily.next_after(UnixMillis(midnight.0 - 1)), Some(midnight));
    assert_eq!(
        daily.next_after(midnight),
        Some(UnixMillis(midnight.0 + 86_400_000))
    );
    let every_second: CronSchedule = "* * * * * *".parse().unwrap();
    let mut timer = SlotTimer::new(every_second, UnixMillis(midnight.0 + 400));
    assert_eq!(timer.next_fire(), Some(UnixMillis(midnight.0 + 1_000)));
    // Late by 3.5 s: stale slots are skipped.
    assert_eq!(
        timer.fire(UnixMillis(midnight.0 + 4_500)),
        Some(UnixMillis(midnight.0 + 4_000))
    );
    assert_eq!(
        Duration::from_millis(timer.next_fire().unwrap().0 - midnight.0),
        Duration::from_secs(5)
    );
}
