use core::cell::{Cell, RefCell};
use core::convert::Infallible;
use std::vec::Vec;

use super::*;
use crate::lock::TokenId;

/// A store that answers what it is told and records the calls.
#[derive(Default)]
struct Scripted {
    begin: Cell<Option<Begin>>,
    stored: RefCell<Vec<u8>>,
    keys: RefCell<Vec<std::string::String>>,
    settled: Cell<Option<Settled>>,
}

impl ClaimStore for Scripted {
    type Error = Infallible;

    async fn try_begin(
        &self,
        key: &str,
        _lease: Ttl,
        _keep: Ttl,
        result: &mut [u8],
    ) -> Result<Begin, Infallible> {
        self.keys.borrow_mut().push(key.into());
        let stored = self.stored.borrow();
        let n = stored.len().min(result.len());
        result[..n].copy_from_slice(&stored[..n]);
        Ok(self.begin.get().expect("a scripted answer"))
    }

    async fn extend(&self, _: &str, _: &Token, _: Ttl) -> Result<Renewal, Infallible> {
        Ok(Renewal::Held)
    }

    async fn complete(
        &self,
        key: &str,
        _: &Token,
        _: Ttl,
        _: &[u8],
    ) -> Result<Settled, Infallible> {
        self.keys.borrow_mut().push(key.into());
        Ok(self.settled.get().unwrap_or(Settled::Recorded))
    }

    async fn fail(&self, key: &str, _: &Token, _: Ttl) -> Result<Settled, Infallible> {
        self.keys.borrow_mut().push(key.into());
        Ok(self.settled.get().unwrap_or(Settled::Recorded))
    }
}

fn block_on<F: core::future::Future>(f: F) -> F::Output {
    futures_lite::future::block_on(f)
}

const TOKEN: Token = Token::new(TokenId([7; 16]), 41);

#[test]
fn a_begin_uses_the_claim_key_and_a_started_attempt_carries_its_fence_number_and_cause() {
    let store = Scripted::default();
    store.begin.set(Some(Begin::Started {
        token: TOKEN,
        attempt: 3,
        after: Start::AfterExpiry,
    }));
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    let mut buffer = [0u8; 8];
    let outcome = block_on(claims.begin("evt:1", &mut buffer)).unwrap();
    let claim = outcome.claim().expect("an attempt").clone();
    assert_eq!(
        (claim.fence(), claim.attempt(), claim.after()),
        (41, 3, Start::AfterExpiry)
    );
    assert_eq!(claim.key(), "guard:claim:hooks:evt%3A1");
    assert_eq!(
        block_on(claims.complete(&claim, b"ok")),
        Ok(Settled::Recorded)
    );
    assert_eq!(
        store.keys.borrow().as_slice(),
        ["guard:claim:hooks:evt%3A1", "guard:claim:hooks:evt%3A1"]
    );
}

#[test]
fn a_done_delivery_answers_its_stored_result_and_a_too_small_buffer_is_an_error_not_a_cut() {
    let store = Scripted::default();
    store.stored.replace(b"200 accepted".to_vec());
    store.begin.set(Some(Begin::Done { result_len: 12 }));
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    let mut buffer = [0u8; 32];
    assert_eq!(
        block_on(claims.begin("e", &mut buffer)),
        Ok(ClaimOutcome::Done {
            result: b"200 accepted"
        })
    );
    let mut small = [0u8; 4];
    assert_eq!(
        block_on(claims.begin("e", &mut small)),
        Err(ClaimError::ResultTooLong { len: 12, buffer: 4 })
    );
}

#[test]
fn a_result_over_the_bound_is_refused_at_complete_and_nothing_reaches_the_store() {
    let store = Scripted::default();
    store.begin.set(Some(Begin::Started {
        token: TOKEN,
        attempt: 1,
        after: Start::Fresh,
    }));
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    let claim = block_on(claims.begin("e", &mut []))
        .unwrap()
        .claim()
        .expect("an attempt")
        .clone();
    let big = [0u8; MAX_RESULT_LEN + 1];
    let refused = block_on(claims.complete(&claim, &big)).unwrap_err();
    assert_eq!(
        refused,
        ClaimError::ResultOverLimit {
            len: MAX_RESULT_LEN + 1
        }
    );
    assert!(refused.is_permanent());
    assert_eq!(
        store.keys.borrow().len(),
        1,
        "only the begin reached the store"
    );
    assert_eq!(
        block_on(claims.complete(&claim, &big[..MAX_RESULT_LEN])),
        Ok(Settled::Recorded)
    );
}

#[test]
fn only_a_failed_store_is_worth_asking_again() {
    let transient: ClaimError<&str> = ClaimError::Backend("down");
    assert!(!transient.is_permanent());
    let permanent: [ClaimError<&str>; 3] = [
        ClaimError::Key(KeyError::TooLong { limit: 256 }),
        ClaimError::ResultTooLong { len: 12, buffer: 4 },
        ClaimError::ResultOverLimit { len: 1 << 22 },
    ];
    for permanent in permanent {
        assert!(permanent.is_permanent(), "{permanent:?}");
    }
}

#[test]
fn a_running_attempt_says_when_to_come_back() {
    let store = Scripted::default();
    store.begin.set(Some(Begin::Running {
        lease_left: Duration::from_millis(1_500),
    }));
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    assert_eq!(
        block_on(claims.begin("e", &mut [])),
        Ok(ClaimOutcome::Running {
            retry_after: Duration::from_millis(1_500)
        })
    );
}

#[test]
fn a_keep_time_shorter_than_the_lease_is_refused_naming_both() {
    let store = Scripted::default();
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    let short = Ttl::from_secs(10).unwrap();
    let error = claims.with_keep(short).err().expect("refused");
    assert_eq!(error.keep, short);
    assert_eq!(error.lease, Ttl::from_secs(30).unwrap());
    let claims = Claims::new(&store, Scope::new("hooks").unwrap());
    let claims = claims.with_lease(short).unwrap().with_keep(short).unwrap();
    assert_eq!((claims.lease(), claims.keep()), (short, short));
    assert!(claims.with_lease(Ttl::from_secs(11).unwrap()).is_err());
}

#[test]
fn a_brace_in_the_prefix_is_a_key_error_and_reaches_no_store() {
    let store = Scripted::default();
    let claims = Claims::new(&store, Scope::new("hooks").unwrap()).with_prefix("p{");
    assert_eq!(
        block_on(claims.begin("e", &mut [])),
        Err(ClaimError::Key(KeyError::BraceInPrefix))
    );
    assert!(store.keys.borrow().is_empty());
}

#[test]
fn every_call_is_observed_with_what_it_came_to() {
    let store = Scripted::default();
    let steps = RefCell::new(Vec::new());
    let claims = Claims::new(&store, Scope::new("hooks").unwrap())
        .with_observer(|e: &ClaimEvent<'_>| steps.borrow_mut().push(e.step.name()));
    store.begin.set(Some(Begin::Started {
        token: TOKEN,
        attempt: 2,
        after: Start::AfterFailure,
    }));
    let outcome = block_on(claims.begin("e", &mut [])).unwrap();
    let claim = outcome.claim().unwrap();
    block_on(claims.fail(claim)).unwrap();
    store.settled.set(Some(Settled::Superseded));
    block_on(claims.complete(claim, b"")).unwrap();
    store.begin.set(Some(Begin::Done { result_len: 0 }));
    block_on(claims.begin("e", &mut [])).unwrap();
    assert_eq!(
        steps.borrow().as_slice(),
        ["after_failure", "failed", "superseded", "done"]
    );
}
