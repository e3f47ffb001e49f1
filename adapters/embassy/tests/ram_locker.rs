//! `RamLocker` keeps the locking contract: one holder per key, expiry,
//! compare-and-delete, renewal by the holder only, increasing fences, and
//! a full table refuses instead of evicting.

use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use futures_lite::future::block_on;
use guard_core::lock::{LeaseRenewer, Locker, Renewal, Ttl, UnlockError};
use guard_embassy::{RamLocker, RamLockerError};

type Small = RamLocker<CriticalSectionRawMutex, 2, 16>;

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).unwrap()
}

#[test]
fn one_holder_per_key_until_unlock_or_expiry() {
    static LOCKER: Small = Small::new();
    block_on(async {
        let a = LOCKER.try_lock("k", ttl(100)).await.unwrap().expect("free");
        assert!(LOCKER.try_lock("k", ttl(100)).await.unwrap().is_none());
        LOCKER.unlock("k", &a).await.unwrap();
        let b = LOCKER
            .try_lock("k", ttl(100))
            .await
            .unwrap()
            .expect("released");
        assert!(b.fence() > a.fence());
        assert_eq!(LOCKER.unlock("k", &a).await, Err(UnlockError::NotHeld));
        assert_eq!(LOCKER.renew("k", &a, ttl(100)).await, Ok(Renewal::Lost));
        assert_eq!(LOCKER.renew("k", &b, ttl(300)).await, Ok(Renewal::Held));
        std::thread::sleep(Duration::from_millis(150));
        assert!(
            LOCKER.try_lock("k", ttl(100)).await.unwrap().is_none(),
            "renewed"
        );
        std::thread::sleep(Duration::from_millis(200));
        let c = LOCKER
            .try_lock("k", ttl(100))
            .await
            .unwrap()
            .expect("expired");
        assert!(c.fence() > b.fence());
    });
}

#[test]
fn a_full_table_refuses_and_bad_keys_are_named() {
    let locker = Small::new();
    block_on(async {
        locker.try_lock("a", ttl(60_000)).await.unwrap().unwrap();
        locker.try_lock("b", ttl(60_000)).await.unwrap().unwrap();
        assert_eq!(
            locker.try_lock("c", ttl(60_000)).await,
            Err(RamLockerError::TableFull)
        );
        assert_eq!(
            locker.try_lock("", ttl(1)).await,
            Err(RamLockerError::BadKey)
        );
        assert_eq!(
            locker.try_lock("a-key-longer-than-16", ttl(1)).await,
            Err(RamLockerError::BadKey)
        );
    });
}
