//! The ActiveGuard state machine on a fake clock: the original's callback
//! order, the renew deadline, the renew-less fallback, the mapping of lock
//! results to its inputs, and random event sequences checked against the
//! invariants.

use std::convert::Infallible;
use std::time::Duration;

use guard_core::guard::{
    Acquired, Action, ActiveConfig, ActiveConfigError, ActiveGuard, ActiveTiming, DemoteReason,
    Done, Phase, Renewed,
};
use guard_core::lock::{Renewal, Token, TokenId, Ttl, UnlockError};
use guard_core::time::Instant;
use proptest::prelude::*;

const T0: Instant = Instant::from_secs(100);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn token(fence: u64) -> Token {
    Token::new(TokenId([fence as u8; 16]), fence)
}

fn actions(g: &mut ActiveGuard) -> Vec<Action> {
    std::iter::from_fn(|| g.poll_action()).collect()
}

/// A standby at T0 with the default timing (validated: it cannot fail).
fn standby(renewable: bool) -> ActiveGuard {
    let Ok(g) = ActiveGuard::new(ActiveTiming::new(), renewable, T0);
    g
}

/// 15 s lease, 5 s interval, 1.5 s drift: the defaults.
fn leader(renewable: bool) -> ActiveGuard {
    let mut g = standby(renewable);
    assert_eq!(g.poll_timeout(), Some(T0), "the first attempt is immediate");
    g.handle_timeout(T0);
    assert_eq!(actions(&mut g), [Action::Acquire]);
    g.handle_acquired(T0 + ms(10), Acquired::Granted(token(7)));
    assert_eq!(actions(&mut g), [Action::Promote { fence: 7 }]);
    assert!(g.is_active());
    assert_eq!(g.phase(), Phase::Leader);
    g
}

#[test]
fn defaults_match_the_original() {
    let c = ActiveConfig::new();
    assert_eq!(c.ttl().as_duration(), Duration::from_secs(15));
    assert_eq!(c.interval(), Duration::from_secs(5));
    assert_eq!(c.drift(), ms(1500));
    assert_eq!(c.renew_deadline(), ms(13_500));
}

#[test]
fn interval_is_clamped_to_a_third_of_the_ttl_in_any_order() {
    let ttl = Ttl::from_millis(300).unwrap();
    let a = ActiveConfig::new()
        .with_ttl(ttl)
        .with_interval(Duration::from_secs(1));
    let b = ActiveConfig::new()
        .with_interval(Duration::from_secs(1))
        .with_ttl(ttl);
    assert_eq!(a.interval(), ms(100));
    assert_eq!(b.interval(), ms(100));
    let kept = ActiveConfig::new().with_ttl(ttl).with_interval(ms(50));
    assert_eq!(kept.interval(), ms(50));
    // A longer TTL does not raise the interval.
    let long = ActiveConfig::new().with_ttl(Ttl::from_secs(60).unwrap());
    assert_eq!(long.interval(), Duration::from_secs(5));
    assert_eq!(
        ActiveConfig::new().with_interval(Duration::ZERO).interval(),
        Duration::from_secs(5)
    );
}

#[test]
fn impossible_timing_is_refused() {
    let too_much_drift = ActiveConfig::new().with_drift(Duration::from_secs(15));
    assert_eq!(
        too_much_drift.validate(),
        Err(ActiveConfigError::DriftNotBelowTtl)
    );
    let late = ActiveConfig::new().with_drift(Duration::from_secs(11));
    assert_eq!(
        late.validate(),
        Err(ActiveConfigError::IntervalNotBelowDeadline)
    );
    assert!(ActiveGuard::new(late, true, T0).is_err());
    assert_eq!(
        ActiveTiming::try_from(late),
        Err(ActiveConfigError::IntervalNotBelowDeadline)
    );
}

#[test]
fn a_guard_from_validated_timing_cannot_fail() {
    let config = ActiveConfig::new()
        .with_ttl(Ttl::from_secs(3).unwrap())
        .with_interval(Duration::from_secs(1))
        .with_drift(ms(300));
    // Validation happens once, where the settings are given...
    let timing: ActiveTiming = config.validate().unwrap();
    assert_eq!(ActiveTiming::try_from(config), Ok(timing));
    assert_eq!(ActiveConfig::from(timing), config);
    assert_eq!(*timing.config(), config);
    assert_eq!(timing.ttl(), config.ttl());
    assert_eq!(timing.interval(), Duration::from_secs(1));
    assert_eq!(timing.drift(), ms(300));
    assert_eq!(timing.renew_deadline(), ms(2_700));
    // ...and `ActiveGuard::new` takes the validated type: its error type is
    // `Infallible`, so no arm handles a failure.
    let built: Result<ActiveGuard, Infallible> = ActiveGuard::new(timing, true, T0);
    let Ok(mut g) = built;
    assert_eq!(g.timing(), &timing);
    assert_eq!(g.config(), &config);
    g.handle_timeout(T0);
    assert_eq!(actions(&mut g), [Action::Acquire]);
    g.handle(T0, Done::acquired(Ok::<_, Infallible>(Some(token(2)))));
    assert_eq!(actions(&mut g), [Action::Promote { fence: 2 }]);
    assert_eq!(g.lease().unwrap().until(), T0 + ms(2_700));
    // The defaults are valid without a check.
    assert_eq!(ActiveTiming::new(), ActiveConfig::new().validate().unwrap());
    assert_eq!(ActiveTiming::default(), ActiveTiming::new());
}

/// A backend error, for the mapping.
#[derive(Debug)]
struct Down;

#[test]
fn each_lock_result_maps_to_the_documented_machine_input() {
    // try_lock
    let granted: Result<Option<Token>, Down> = Ok(Some(token(7)));
    assert_eq!(
        Done::acquired(granted),
        Done::Acquired(Acquired::Granted(token(7)))
    );
    assert_eq!(
        Done::acquired(Ok::<_, Down>(None)),
        Done::Acquired(Acquired::Held)
    );
    assert_eq!(
        Done::acquired(Err::<Option<Token>, _>(Down)),
        Done::Acquired(Acquired::Failed)
    );
    assert_eq!(
        Acquired::from(Ok::<_, Down>(Some(token(7)))),
        Acquired::Granted(token(7))
    );
    assert_eq!(Acquired::from(Ok::<_, Down>(None)), Acquired::Held);
    assert_eq!(
        Acquired::from(Err::<Option<Token>, _>(Down)),
        Acquired::Failed
    );
    // renew
    assert_eq!(
        Done::renewed(Ok::<_, Down>(Renewal::Held)),
        Done::Renewed(Renewed::Held)
    );
    assert_eq!(
        Done::renewed(Ok::<_, Down>(Renewal::Lost)),
        Done::Renewed(Renewed::Lost)
    );
    assert_eq!(
        Done::renewed(Err::<Renewal, _>(Down)),
        Done::Renewed(Renewed::Failed)
    );
    assert_eq!(Renewed::from(Ok::<_, Down>(Renewal::Held)), Renewed::Held);
    assert_eq!(Renewed::from(Ok::<_, Down>(Renewal::Lost)), Renewed::Lost);
    assert_eq!(Renewed::from(Err::<Renewal, _>(Down)), Renewed::Failed);
    // unlock: only Ok released; not held and a backend failure did not.
    assert_eq!(
        Done::released(Ok::<(), UnlockError<Down>>(())),
        Done::Released(true)
    );
    assert_eq!(
        Done::released(Err::<(), _>(UnlockError::<Down>::NotHeld)),
        Done::Released(false)
    );
    assert_eq!(
        Done::released(Err::<(), _>(UnlockError::Backend(Down))),
        Done::Released(false)
    );
    // The machine's inputs convert too.
    assert_eq!(Done::from(Acquired::Held), Done::Acquired(Acquired::Held));
    assert_eq!(Done::from(Renewed::Lost), Done::Renewed(Renewed::Lost));
}

#[test]
fn handle_feeds_each_result_to_its_handler() {
    // Every answer to every operation, through `handle` and through the
    // handler it names, from the same state: the same actions, the same
    // state after.
    let answers = [
        Done::Acquired(Acquired::Granted(token(8))),
        Done::Acquired(Acquired::Held),
        Done::Acquired(Acquired::Failed),
        Done::Renewed(Renewed::Held),
        Done::Renewed(Renewed::Lost),
        Done::Renewed(Renewed::Failed),
        Done::Released(true),
        Done::Released(false),
    ];
    let direct = |g: &mut ActiveGuard, now: Instant, done: Done| match done {
        Done::Acquired(r) => g.handle_acquired(now, r),
        Done::Renewed(r) => g.handle_renewed(now, r),
        Done::Released(r) => g.handle_released(now, r),
    };
    // In flight: an acquire (standby), a renew (leader), a release (stop).
    let starts: [fn() -> ActiveGuard; 3] = [
        || {
            let mut g = standby(true);
            g.handle_timeout(T0);
            actions(&mut g);
            g
        },
        || {
            let mut g = leader(true);
            g.handle_timeout(T0 + Duration::from_secs(5));
            actions(&mut g);
            g
        },
        || {
            let mut g = leader(true);
            g.stop(T0 + ms(100));
            actions(&mut g);
            g
        },
    ];
    let now = T0 + ms(5_100);
    for start in starts {
        for done in answers {
            let (mut a, mut b) = (start(), start());
            a.handle(now, done);
            direct(&mut b, now, done);
            assert_eq!(actions(&mut a), actions(&mut b), "{done:?}");
            assert_eq!(
                (a.phase(), a.lease(), a.fence(), a.poll_timeout()),
                (b.phase(), b.lease(), b.fence(), b.poll_timeout()),
                "{done:?}"
            );
        }
    }
    // And a failed renewal, as a locker reports it, demotes as documented.
    let mut g = leader(true);
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.handle(now, Done::renewed(Err::<Renewal, _>(Down)));
    assert_eq!(actions(&mut g), [Action::Demote(DemoteReason::RenewFailed)]);
}

#[test]
fn a_standby_retries_every_interval() {
    let mut g = standby(true);
    g.handle_timeout(T0);
    assert_eq!(actions(&mut g), [Action::Acquire]);
    g.handle_acquired(T0 + ms(3), Acquired::Held);
    assert!(actions(&mut g).is_empty());
    assert_eq!(g.poll_timeout(), Some(T0 + ms(3) + Duration::from_secs(5)));
    g.handle_timeout(T0 + Duration::from_secs(1));
    assert!(actions(&mut g).is_empty(), "a spurious timeout is a no-op");
    g.handle_timeout(T0 + ms(5_003));
    assert_eq!(actions(&mut g), [Action::Acquire]);
    g.handle_acquired(T0 + ms(5_010), Acquired::Failed);
    assert!(!g.is_active());
    assert_eq!(g.phase(), Phase::Standby);
}

#[test]
fn a_leader_renews_every_interval_from_the_send_time() {
    let mut g = leader(true);
    assert_eq!(g.poll_timeout(), Some(T0 + Duration::from_secs(5)));
    g.handle_timeout(T0 + Duration::from_secs(5));
    assert_eq!(actions(&mut g), [Action::Renew(token(7))]);
    g.handle_renewed(T0 + ms(5_200), Renewed::Held);
    assert!(actions(&mut g).is_empty());
    assert_eq!(g.poll_timeout(), Some(T0 + Duration::from_secs(10)));
    assert!(g.is_active());
}

#[test]
fn a_lost_lease_demotes_without_releasing() {
    for (lost, reason) in [
        (Renewed::Lost, DemoteReason::LeaseLost),
        // An unreachable backend is not someone else holding the lease:
        // the reason says which happened.
        (Renewed::Failed, DemoteReason::RenewFailed),
    ] {
        let mut g = leader(true);
        g.handle_timeout(T0 + Duration::from_secs(5));
        actions(&mut g);
        g.handle_renewed(T0 + ms(5_100), lost);
        assert_eq!(actions(&mut g), [Action::Demote(reason)]);
        assert!(!g.is_active());
        assert_eq!(g.fence(), None);
    }
}

#[test]
fn a_leader_whose_renewals_never_answer_demotes_before_the_ttl() {
    let mut g = leader(true);
    let renew_sent = T0 + Duration::from_secs(5);
    g.handle_timeout(renew_sent);
    assert_eq!(actions(&mut g), [Action::Renew(token(7))]);
    // No answer. The deadline comes from the last *successful* send (T0).
    let deadline = g.poll_timeout().unwrap();
    assert_eq!(deadline, T0 + ms(13_500));
    assert!(
        deadline < T0 + Duration::from_secs(15),
        "before the server can expire the lease"
    );
    g.handle_timeout(deadline - Duration::from_nanos(1));
    assert!(actions(&mut g).is_empty());
    g.handle_timeout(deadline);
    assert_eq!(
        actions(&mut g),
        [Action::Demote(DemoteReason::RenewDeadline)]
    );
    assert!(!g.is_active());
    // The renewal finally answers "held": the lease is given back.
    g.handle_renewed(deadline + ms(1), Renewed::Held);
    assert_eq!(actions(&mut g), [Action::Release(token(7))]);
    g.handle_released(deadline + ms(2), true);
    assert!(actions(&mut g).is_empty());
}

#[test]
fn the_deadline_runs_from_the_send_time_of_the_last_successful_renewal() {
    let mut g = leader(true);
    let good_send = T0 + Duration::from_secs(5);
    g.handle_timeout(good_send);
    actions(&mut g);
    // The answer comes back late but in time: the deadline counts from the
    // send, not from the answer.
    g.handle_renewed(good_send + ms(900), Renewed::Held);
    g.handle_timeout(T0 + Duration::from_secs(10));
    assert_eq!(actions(&mut g), [Action::Renew(token(7))]);
    // This renewal never answers.
    assert_eq!(g.poll_timeout(), Some(good_send + ms(13_500)));
    g.handle_timeout(good_send + ms(13_500));
    assert_eq!(
        actions(&mut g),
        [Action::Demote(DemoteReason::RenewDeadline)]
    );
    assert!(good_send + ms(13_500) < good_send + Duration::from_secs(15));
}

#[test]
fn a_grant_too_late_to_act_on_is_released_not_promoted() {
    let mut g = standby(true);
    g.handle_timeout(T0);
    actions(&mut g);
    // The answer to an acquire sent at T0 arrives after T0 + ttl - drift.
    g.handle_acquired(T0 + ms(13_500), Acquired::Granted(token(4)));
    assert_eq!(actions(&mut g), [Action::Release(token(4))]);
    assert!(!g.is_active());
}

#[test]
fn stop_demotes_first_then_releases() {
    let mut g = leader(true);
    g.stop(T0 + ms(100));
    assert_eq!(
        actions(&mut g),
        [
            Action::Demote(DemoteReason::Stopping),
            Action::Release(token(7))
        ]
    );
    assert_eq!(g.phase(), Phase::Stopping);
    g.handle_released(T0 + ms(110), true);
    assert_eq!(g.phase(), Phase::Stopped);
    assert_eq!(g.poll_timeout(), None);
    g.handle_timeout(T0 + Duration::from_secs(60));
    assert!(actions(&mut g).is_empty());
}

#[test]
fn stopping_a_standby_emits_no_demote() {
    let mut g = standby(true);
    g.stop(T0);
    assert!(actions(&mut g).is_empty());
    assert_eq!(g.phase(), Phase::Stopped);
}

#[test]
fn a_grant_that_arrives_after_stop_is_released() {
    let mut g = standby(true);
    g.handle_timeout(T0);
    actions(&mut g);
    g.stop(T0 + ms(1));
    assert_eq!(g.phase(), Phase::Stopping);
    g.handle_acquired(T0 + ms(5), Acquired::Granted(token(3)));
    assert_eq!(
        actions(&mut g),
        [Action::Release(token(3))],
        "never promoted"
    );
    g.handle_released(T0 + ms(6), true);
    assert_eq!(g.phase(), Phase::Stopped);
}

#[test]
fn stop_during_a_renewal_demotes_at_once_and_releases_after_it() {
    let mut g = leader(true);
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.stop(T0 + ms(5_001));
    assert_eq!(actions(&mut g), [Action::Demote(DemoteReason::Stopping)]);
    g.handle_renewed(T0 + ms(5_050), Renewed::Held);
    assert_eq!(actions(&mut g), [Action::Release(token(7))]);
    g.handle_released(T0 + ms(5_060), true);
    assert_eq!(g.phase(), Phase::Stopped);
}

#[test]
fn a_failed_promotion_demotes_then_releases_and_backs_off() {
    let mut g = leader(true);
    g.handle_promote_failed(T0 + ms(20));
    assert_eq!(
        actions(&mut g),
        [
            Action::Demote(DemoteReason::PromoteFailed),
            Action::Release(token(7))
        ]
    );
    g.handle_released(T0 + ms(30), true);
    assert_eq!(g.phase(), Phase::Standby);
    assert_eq!(g.poll_timeout(), Some(T0 + ms(30) + Duration::from_secs(5)));
}

#[test]
fn an_explicit_demote_steps_down_once_and_lets_a_standby_go_first() {
    let mut g = leader(true);
    g.demote(T0 + ms(50));
    assert_eq!(
        actions(&mut g),
        [
            Action::Demote(DemoteReason::Requested),
            Action::Release(token(7))
        ]
    );
    g.demote(T0 + ms(51));
    assert!(actions(&mut g).is_empty(), "a second demote is a no-op");
    g.handle_released(T0 + ms(60), true);
    assert_eq!(g.poll_timeout(), Some(T0 + ms(60) + Duration::from_secs(5)));
    let mut standby = standby(true);
    standby.demote(T0);
    assert!(actions(&mut standby).is_empty());
}

#[test]
fn the_renewless_fallback_replaces_its_token_without_a_second_promote() {
    let mut g = leader(false);
    g.handle_timeout(T0 + Duration::from_secs(5));
    assert_eq!(actions(&mut g), [Action::Release(token(7))]);
    g.handle_released(T0 + ms(5_010), true);
    assert_eq!(actions(&mut g), [Action::Acquire]);
    g.handle_acquired(T0 + ms(5_020), Acquired::Granted(token(8)));
    assert!(
        actions(&mut g).is_empty(),
        "still the leader: no new promote"
    );
    assert_eq!(g.fence(), Some(8));
    assert!(g.is_active());
    g.stop(T0 + ms(6_000));
    assert_eq!(
        actions(&mut g),
        [
            Action::Demote(DemoteReason::Stopping),
            Action::Release(token(8))
        ]
    );
}

#[test]
fn the_renewless_fallback_demotes_when_another_replica_wins_the_window() {
    let mut g = leader(false);
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.handle_released(T0 + ms(5_010), true);
    actions(&mut g);
    g.handle_acquired(T0 + ms(5_020), Acquired::Held);
    assert_eq!(actions(&mut g), [Action::Demote(DemoteReason::LeaseLost)]);
    assert!(!g.is_active());
}

#[test]
fn the_renewless_fallback_demotes_when_the_unlock_fails() {
    let mut g = leader(false);
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.handle_released(T0 + ms(5_010), false);
    assert_eq!(actions(&mut g), [Action::Demote(DemoteReason::LeaseLost)]);
}

#[test]
fn the_lease_is_the_fence_and_the_renew_deadline_while_promoted() {
    let mut g = standby(true);
    assert_eq!(g.lease(), None, "a standby has no lease");
    let mut g = {
        g.handle_timeout(T0);
        actions(&mut g);
        g.handle_acquired(T0 + ms(10), Acquired::Granted(token(7)));
        actions(&mut g);
        g
    };
    // Deadline from the send time of the acquire: T0 + ttl - drift.
    let lease = g.lease().unwrap();
    assert_eq!(lease.fence(), 7);
    assert_eq!(lease.until(), T0 + ms(13_500));
    assert_eq!(lease.valid_at(T0 + ms(13_499)), Some(7));
    assert_eq!(lease.valid_at(T0 + ms(13_500)), None);
    // A renewal sent at T0 + 5 s moves it to T0 + 18.5 s.
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.handle_renewed(T0 + ms(5_100), Renewed::Held);
    assert_eq!(g.lease().unwrap().until(), T0 + ms(18_500));
    // Demoted: no lease, whatever the clock says.
    g.demote(T0 + ms(6_000));
    assert_eq!(g.lease(), None);
}

#[test]
fn the_renewless_lease_carries_the_newest_fence() {
    let mut g = leader(false);
    g.handle_timeout(T0 + Duration::from_secs(5));
    actions(&mut g);
    g.handle_released(T0 + ms(5_010), true);
    actions(&mut g);
    // Between release and re-grant the leadership's deadline still holds.
    assert_eq!(g.lease().unwrap().fence(), 7);
    g.handle_acquired(T0 + ms(5_020), Acquired::Granted(token(8)));
    assert_eq!(g.lease().unwrap().fence(), 8);
}

#[test]
fn a_renewless_reacquire_that_outlives_its_leadership_waits_an_interval() {
    for step_down in [
        ActiveGuard::demote as fn(&mut ActiveGuard, Instant),
        ActiveGuard::handle_promote_failed,
    ] {
        let mut g = leader(false);
        g.handle_timeout(T0 + Duration::from_secs(5));
        actions(&mut g);
        g.handle_released(T0 + ms(5_010), true);
        assert_eq!(actions(&mut g), [Action::Acquire]);
        // Demoted while the re-acquire is in flight.
        step_down(&mut g, T0 + ms(5_015));
        assert!(matches!(actions(&mut g)[..], [Action::Demote(_)]));
        g.handle_acquired(T0 + ms(5_020), Acquired::Granted(token(8)));
        assert_eq!(actions(&mut g), [Action::Release(token(8))]);
        g.handle_released(T0 + ms(5_030), true);
        // A standby goes first: the next attempt is an interval away.
        let next = g.poll_timeout().unwrap();
        assert!(next >= T0 + ms(10_020), "competes again at {next:?}");
        g.handle_timeout(T0 + ms(5_030));
        assert!(actions(&mut g).is_empty(), "no acquire right away");
    }
}

mod models;
use models::active::{Checker, Event};

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0u16..8_000).prop_map(Event::Timeout),
        2 => Just(Event::Granted),
        1 => Just(Event::Held),
        1 => Just(Event::AcquireFailed),
        2 => Just(Event::RenewHeld),
        1 => Just(Event::RenewLost),
        2 => any::<bool>().prop_map(Event::Released),
        1 => Just(Event::PromoteFailed),
        1 => Just(Event::Demote),
        1 => Just(Event::Stop),
    ]
}

proptest! {
    /// Whatever the backend answers and whenever, in whatever order:
    /// promotes and demotes alternate, a leader's release always follows
    /// its demote, a leader never acts past its deadline, and at most one
    /// backend operation is outstanding (see `models::active::Checker`).
    #[test]
    fn callbacks_alternate_and_leaders_respect_the_deadline(
        renewable in any::<bool>(),
        events in prop::collection::vec(event(), 1..120),
    ) {
        let mut checker = Checker::new(renewable);
        for ev in events {
            if let Err(broken) = checker.apply(ev) {
                prop_assert!(false, "{} after {:?}", broken, ev);
            }
        }
    }
}
