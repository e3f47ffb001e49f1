//! The elected-source contract, as a suite every elected source runs
//! against its real server, in the spirit of the Locker
//! [`contract`](crate::contract).
//!
//! An elected source (a broadcast read by the replica that holds a lease)
//! promises, whatever the lease does while a message is in its hands:
//!
//! 1. **No effect under a lease that has ended.** A message's effect is
//!    made only under the lease it was read under, while it is valid on
//!    the replica's clock; since a leader stops acting before its lease
//!    can expire on the lock service, no effect is made under a fence
//!    whose lease was cut off ([`PartitionableLocker::partition`]) later
//!    than one TTL after the cut ([`check_no_effect_after_the_lease_ended`]),
//!    and fences never go back at the resource ([`check_fences_never_go_back`]).
//! 2. **Nothing read is dropped silently.** Every message the leader read
//!    ends in one place: its effect, the handler's own refusal (a
//!    handler that found its lease gone after a wait and kept the
//!    message), the source's unhandled sink (with a reason), or the
//!    source's shared dead letters ([`check_every_message_accounted`]).
//! 3. **No shared dead letter under an ended lease**: a message whose
//!    retries outlast the lease is not dead-lettered
//!    ([`lease_ends_between_retries`]).
//!
//! The scenarios drive the cases: the lease ends while a message waits in
//! the handler (a limiter, a slow request:
//! [`lease_ends_while_the_handler_waits`]), between its retries
//! ([`lease_ends_between_retries`]), and while messages wait in the
//! source's queue behind a slow handler
//! ([`lease_ends_while_messages_are_queued`]). A source plugs in through
//! [`ElectedSource`]; the checks judge a [`Ledger`] of what happened, and
//! `adapters/testkit/tests/sources.rs` shows that each catches a source
//! breaking its rule.
//!
//! The suite's handler checks [`Delivery::valid`] immediately before each
//! effect, as the gateway does after a limiter's wait: what the source
//! owes is a `valid` bound to the lease the message was read under.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use guard_core::lock::{Renewal, Token, Ttl, UnlockError};
use guard_core::retry::RetryPolicy;
use guard_std::{BoxFuture, DynLocker, GuardConfig, LocalLocker, LockerError, SharedLocker};

/// One message as the suite's handler sees it.
pub struct Delivery {
    /// Its payload.
    pub payload: Vec<u8>,
    /// The fence of the lease it was read under.
    pub fence: Option<u64>,
    /// Whether an effect may be made now under that lease.
    pub valid: Box<dyn Fn() -> bool>,
}

/// The future of one handler call: `Err` fails the call (the source
/// retries it where it retries).
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;

/// The suite's handler: called with the replica's id and the message.
pub type Handler = Arc<dyn Fn(usize, Delivery) -> HandlerFuture + Send + Sync>;

/// Stops a replica and waits for it to end.
pub type Stop = Box<dyn FnOnce() + Send>;

/// Runs a replica on a thread of its own: `run` is given the control
/// that stops it; the [`Stop`] returned stops it and waits for the thread.
pub fn replica_thread(run: impl FnOnce(guard_std::run::Control) + Send + 'static) -> Stop {
    let (handle, control) = guard_std::run::control();
    let thread = std::thread::spawn(move || run(control));
    Box::new(move || {
        handle.stop();
        thread.join().expect("the replica's thread");
    })
}

/// A source under the contract: replicas elected through the suite's
/// locker, each calling the suite's handler.
pub trait ElectedSource {
    /// The source's name, in messages.
    fn name(&self) -> &str;

    /// Starts replica `id`, elected under `config`'s locker with a lease
    /// of `ttl` (renewed every `ttl / 3`), calling `handler` for each
    /// message and, where the source retries a failing handler, retrying
    /// under `retry`; what it reads and does not handle it hands to
    /// [`Ledger::unhandled`]. Returns what stops it.
    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        retry: RetryPolicy,
        handler: Handler,
        ledger: &Ledger,
    ) -> Stop;

    /// Publishes one message (to every subscriber of the broadcast).
    fn publish(&self, payload: &[u8]);

    /// Publishes `payloads` in order; by default one [`publish`](Self::publish) each.
    fn publish_all(&self, payloads: &[Vec<u8>]) {
        for payload in payloads {
            self.publish(payload);
        }
    }

    /// Whether the source retries a failing handler.
    fn retries(&self) -> bool;

    /// The most messages the server hands a subscriber ahead of its
    /// acknowledgements (an MQTT broker's in-flight window), if it holds
    /// the rest back: those wait at the server, unread, and a broadcast
    /// drops them with the subscription (the source's stated limit). The
    /// queued scenario publishes no more than this.
    fn in_flight(&self) -> Option<usize> {
        None
    }

    /// The payloads in the source's shared dead-letter place (none where
    /// it has none).
    fn dead_letters(&self) -> Vec<Vec<u8>>;
}

/// What happened to a message, as the suite saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The handler was called with it.
    Entered {
        /// The replica.
        replica: usize,
        /// The payload.
        payload: Vec<u8>,
        /// The fence it was read under.
        fence: Option<u64>,
    },
    /// The handler made its effect (the lease was valid just before).
    Effect {
        /// The replica.
        replica: usize,
        /// The payload.
        payload: Vec<u8>,
        /// The fence it was made under.
        fence: Option<u64>,
    },
    /// The handler found the lease gone before its effect and kept the
    /// message itself (as the gateway keeps it in its dead letters).
    Refused {
        /// The replica.
        replica: usize,
        /// The payload.
        payload: Vec<u8>,
    },
    /// The source handed it to its unhandled sink.
    Unhandled {
        /// The replica.
        replica: usize,
        /// The payload.
        payload: Vec<u8>,
        /// Why, as the source said.
        reason: String,
    },
}

/// The events of a run, each with the instant it happened.
#[derive(Clone, Default)]
pub struct Ledger(Arc<Mutex<Vec<(Instant, Event)>>>);

impl Ledger {
    /// Records `event` now.
    pub fn record(&self, event: Event) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((Instant::now(), event));
    }

    /// Records that replica `replica`'s source handed `payload` to its
    /// unhandled sink for `reason`.
    pub fn unhandled(&self, replica: usize, payload: Vec<u8>, reason: impl fmt::Display) {
        self.record(Event::Unhandled {
            replica,
            payload,
            reason: reason.to_string(),
        });
    }

    /// Every event so far, in order.
    pub fn events(&self) -> Vec<(Instant, Event)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first effect on `payload`: its replica and fence.
    fn effect_of(&self, payload: &[u8]) -> Option<(usize, Option<u64>)> {
        self.events().into_iter().find_map(|(_, e)| match e {
            Event::Effect {
                replica,
                payload: p,
                fence,
            } if p == payload => Some((replica, fence)),
            _ => None,
        })
    }

    fn entered(&self, payload: &[u8]) -> bool {
        self.events()
            .iter()
            .any(|(_, e)| matches!(e, Event::Entered { payload: p, .. } if p == payload))
    }
}

/// A broken promise: which rule, and what the run showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule, as its check names it.
    pub rule: &'static str,
    /// What broke it.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// Rule: no effect at the resource under a fence lower than one it
/// already took.
pub fn check_fences_never_go_back(events: &[(Instant, Event)]) -> Result<(), Violation> {
    let mut highest: Option<u64> = None;
    for (_, event) in events {
        if let Event::Effect {
            replica,
            payload,
            fence: Some(fence),
        } = event
        {
            if let Some(high) = highest
                && *fence < high
            {
                return Err(Violation {
                    rule: "fences never go back",
                    detail: format!(
                        "replica {replica} made the effect of {} under fence {fence} after one under {high}",
                        String::from_utf8_lossy(payload)
                    ),
                });
            }
            highest = highest.max(Some(*fence));
        }
    }
    Ok(())
}

/// What a late event did, for a violation's message.
#[derive(Clone, Copy)]
enum Late {
    /// An effect ([`Event::Effect`]).
    Effect,
    /// A handler call ([`Event::Entered`]).
    Call,
}

/// The first event of kind `late` under a fence in `cut` (leases cut off
/// at `at`) more than `ttl` after the cut: the lease has expired on the
/// lock service by then, and a leader stops acting before that.
fn after_the_lease_ended(
    events: &[(Instant, Event)],
    cut: &HashSet<u64>,
    at: Instant,
    ttl: Duration,
    late: Late,
) -> Result<(), Violation> {
    let ended = at + ttl;
    for (when, event) in events {
        let (replica, payload, fence) = match (late, event) {
            (
                Late::Effect,
                Event::Effect {
                    replica,
                    payload,
                    fence: Some(fence),
                },
            )
            | (
                Late::Call,
                Event::Entered {
                    replica,
                    payload,
                    fence: Some(fence),
                },
            ) => (replica, payload, fence),
            _ => continue,
        };
        if cut.contains(fence) && *when > ended {
            let (rule, did) = match late {
                Late::Effect => ("no effect after the lease ended", "made the effect of"),
                Late::Call => ("no call after the lease ended", "called its handler with"),
            };
            return Err(Violation {
                rule,
                detail: format!(
                    "replica {replica} {did} {} under fence {fence} {:?} after its lease was cut off (ttl {ttl:?})",
                    String::from_utf8_lossy(payload),
                    when.duration_since(at)
                ),
            });
        }
    }
    Ok(())
}

/// Rule: no effect under a fence in `cut` (leases cut off at `at`) once
/// one TTL has passed since: the lease has expired on the lock service
/// by then, and a leader stops acting before that.
pub fn check_no_effect_after_the_lease_ended(
    events: &[(Instant, Event)],
    cut: &HashSet<u64>,
    at: Instant,
    ttl: Duration,
) -> Result<(), Violation> {
    after_the_lease_ended(events, cut, at, ttl, Late::Effect)
}

/// Rule: no handler call under a fence in `cut` (leases cut off at
/// `at`) once one TTL has passed since.
pub fn check_no_call_after_the_lease_ended(
    events: &[(Instant, Event)],
    cut: &HashSet<u64>,
    at: Instant,
    ttl: Duration,
) -> Result<(), Violation> {
    after_the_lease_ended(events, cut, at, ttl, Late::Call)
}

/// Rule: every one of `payloads` (all read by the leader) ends in one
/// place: its effect, the handler's refusal, the unhandled sink, or
/// `dead_letters`.
pub fn check_every_message_accounted(
    events: &[(Instant, Event)],
    payloads: &[Vec<u8>],
    dead_letters: &[Vec<u8>],
) -> Result<(), Violation> {
    for payload in payloads {
        let ended = events.iter().any(|(_, e)| match e {
            Event::Effect { payload: p, .. }
            | Event::Refused { payload: p, .. }
            | Event::Unhandled { payload: p, .. } => p == payload,
            Event::Entered { .. } => false,
        }) || dead_letters.contains(payload);
        if !ended {
            return Err(Violation {
                rule: "nothing read is dropped silently",
                detail: format!(
                    "{} was read by the leader and ended nowhere (no effect, refusal, unhandled record or dead letter)",
                    String::from_utf8_lossy(payload)
                ),
            });
        }
    }
    Ok(())
}

/// Rule: a password given in a source's URL never shows in what the
/// source prints about itself (its errors, their sources, its `Debug`).
pub fn check_secret_hidden(texts: &[String], secret: &str) -> Result<(), Violation> {
    match texts.iter().find(|text| text.contains(secret)) {
        Some(text) => Err(Violation {
            rule: "no secret printed",
            detail: format!("the password shows in: {text}"),
        }),
        None => Ok(()),
    }
}

/// What an error prints: its `Display`, its `Debug` and its sources'.
pub fn error_texts(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut texts = vec![error.to_string(), format!("{error:?}")];
    let mut source = error.source();
    while let Some(cause) = source {
        texts.push(cause.to_string());
        source = cause.source();
    }
    texts
}

/// A [`LocalLocker`] whose current leases can be cut off: after
/// [`partition`](Self::partition), renewing any lease granted before it
/// never answers (a leader cut off from its lock service), while new
/// grants, once those leases have expired, work as before.
#[derive(Debug, Default)]
pub struct PartitionableLocker {
    inner: LocalLocker,
    granted: Mutex<HashSet<(String, u64)>>,
    cut: Mutex<HashSet<(String, u64)>>,
}

impl PartitionableLocker {
    /// A locker with no lease cut off.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// A configuration whose locker is this one.
    pub fn config(self: &Arc<Self>) -> GuardConfig {
        GuardConfig::new().with_locker(SharedLocker::from_dyn(self.clone()))
    }

    /// Cuts off every lease granted so far; returns their fences.
    pub fn partition(&self) -> HashSet<u64> {
        let granted = self
            .granted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let fences = granted.iter().map(|(_, fence)| *fence).collect();
        self.cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(granted);
        fences
    }
}

impl DynLocker for PartitionableLocker {
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Option<Token>, LockerError>> {
        Box::pin(async move {
            let granted = DynLocker::try_lock(&self.inner, key, ttl).await?;
            if let Some(token) = &granted {
                self.granted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert((key.to_owned(), token.fence()));
            }
            Ok(granted)
        })
    }

    fn unlock<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
    ) -> BoxFuture<'a, Result<(), UnlockError<LockerError>>> {
        DynLocker::unlock(&self.inner, key, token)
    }

    fn can_renew(&self) -> bool {
        true
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        token: &'a Token,
        ttl: Ttl,
    ) -> BoxFuture<'a, Result<Renewal, LockerError>> {
        let cut = self
            .cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(key.to_owned(), token.fence()));
        if cut {
            return Box::pin(std::future::pending());
        }
        DynLocker::renew(&self.inner, key, token, ttl)
    }
}

/// The suite's lease: long enough for a loaded machine to renew in time.
pub const TTL: Duration = Duration::from_millis(900);

/// How long the scenarios wait for what a correct source does at once.
const PATIENCE: Duration = Duration::from_secs(20);

/// Sleeps on async-io's timer (the handler runs on the replica's
/// executor).
async fn sleep(d: Duration) {
    async_io::Timer::after(d).await;
}

/// The suite's handler: messages whose payload starts with `wait` wait
/// for `gate` before their effect, those starting with `fail` always
/// fail, the rest make their effect at once; every effect only while
/// the delivery's lease is valid, else the message is refused (kept by
/// the handler, counted as its refusal) and the call fails.
fn handler(ledger: &Ledger, gate: &Arc<AtomicBool>) -> Handler {
    let (ledger, gate) = (ledger.clone(), gate.clone());
    Arc::new(move |replica, delivery| {
        let (ledger, gate) = (ledger.clone(), gate.clone());
        Box::pin(async move {
            ledger.record(Event::Entered {
                replica,
                payload: delivery.payload.clone(),
                fence: delivery.fence,
            });
            if delivery.payload.starts_with(b"fail") {
                return Err("always fails".to_owned());
            }
            if delivery.payload.starts_with(b"wait") {
                while !gate.load(Ordering::Relaxed) {
                    sleep(Duration::from_millis(10)).await;
                }
            }
            if delivery.payload.starts_with(b"slow") {
                sleep(Duration::from_millis(50)).await;
            }
            // Immediately before the effect, with no wait between.
            if !(delivery.valid)() {
                ledger.record(Event::Refused {
                    replica,
                    payload: delivery.payload,
                });
                return Err("the lease ended before the effect".to_owned());
            }
            ledger.record(Event::Effect {
                replica,
                payload: delivery.payload,
                fence: delivery.fence,
            });
            Ok(())
        })
    })
}

/// Publishes probes until one has an effect under a fence above `above`;
/// returns its replica and fence.
fn leader(source: &impl ElectedSource, ledger: &Ledger, above: Option<u64>) -> (usize, u64) {
    let started = Instant::now();
    let mut n = 0_u32;
    while started.elapsed() < PATIENCE {
        n += 1;
        let probe = format!("probe-{n}-{}", above.unwrap_or(0));
        source.publish(probe.as_bytes());
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_millis(200) {
            if let Some((replica, Some(fence))) = ledger.effect_of(probe.as_bytes())
                && above.is_none_or(|above| fence > above)
            {
                return (replica, fence);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    panic!(
        "{}: no leader above fence {above:?} within {PATIENCE:?}: {:?}",
        source.name(),
        ledger.events()
    );
}

/// Waits until `done`, up to the suite's patience; whether it came
/// (the check that follows names the rule when it did not).
fn settles(mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > PATIENCE {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Waits until `done`, a precondition of the scenario: panics if it
/// does not come.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "{what} within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Two replicas of `source` on a partitionable locker, with the suite's
/// handler.
struct Run {
    locker: Arc<PartitionableLocker>,
    ledger: Ledger,
    gate: Arc<AtomicBool>,
    stops: Vec<Stop>,
}

impl Run {
    fn start(source: &impl ElectedSource, retry: RetryPolicy) -> Self {
        let locker = PartitionableLocker::new();
        let config = locker.config();
        let ledger = Ledger::default();
        let gate = Arc::new(AtomicBool::new(false));
        let stops = (0..2)
            .map(|id| source.start(id, &config, TTL, retry, handler(&ledger, &gate), &ledger))
            .collect();
        Run {
            locker,
            ledger,
            gate,
            stops,
        }
    }

    fn stop(self) -> Vec<(Instant, Event)> {
        self.gate.store(true, Ordering::Relaxed);
        for stop in self.stops {
            stop();
        }
        self.ledger.events()
    }
}

/// Panics with the violation, naming the source.
fn judge(source: &impl ElectedSource, checked: Result<(), Violation>, events: &[(Instant, Event)]) {
    if let Err(violation) = checked {
        panic!("{}: {violation}\nevents: {events:?}", source.name());
    }
}

/// The lease ends while the handler waits before its effect (a limiter,
/// a slow request): the handler, checking the lease the source handed
/// it, makes no effect under it once it has ended, and the message ends
/// somewhere.
pub fn lease_ends_while_the_handler_waits(source: &impl ElectedSource) {
    let run = Run::start(
        source,
        RetryPolicy::fixed_delay(0, Duration::from_millis(10)),
    );
    let (_, first) = leader(source, &run.ledger, None);
    source.publish(b"wait-0");
    wait_for("the handler entered with wait-0", || {
        run.ledger.entered(b"wait-0")
    });
    let cut = run.locker.partition();
    let at = Instant::now();
    // A new leader acts, unless the waiting replica is the only one that
    // could and its handler holds the messages behind it: then the gate
    // opens once the old lease has surely ended.
    let started = Instant::now();
    while started.elapsed() < TTL * 3 {
        if run
            .ledger
            .events()
            .iter()
            .any(|(_, e)| matches!(e, Event::Effect { fence: Some(f), .. } if *f > first))
        {
            break;
        }
        let _ = leader_once(source, &run.ledger, first);
    }
    run.gate.store(true, Ordering::Relaxed);
    settles(|| {
        check_every_message_accounted(&run.ledger.events(), &[b"wait-0".to_vec()], &[]).is_ok()
    });
    let events = run.stop();
    judge(source, check_fences_never_go_back(&events), &events);
    judge(
        source,
        check_no_effect_after_the_lease_ended(&events, &cut, at, TTL),
        &events,
    );
    judge(
        source,
        check_every_message_accounted(&events, &[b"wait-0".to_vec()], &[]),
        &events,
    );
}

/// One probe, answered within 200 ms by a fence above `above` or not.
fn leader_once(source: &impl ElectedSource, ledger: &Ledger, above: u64) -> bool {
    let probe = format!("probe-once-{}", ledger.events().len());
    source.publish(probe.as_bytes());
    let asked = Instant::now();
    while asked.elapsed() < Duration::from_millis(200) {
        if matches!(ledger.effect_of(probe.as_bytes()), Some((_, Some(f))) if f > above) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// The lease ends between the retries of a message that always fails,
/// retried for longer than the lease: no call is made and no dead letter
/// written under the ended lease, and the message goes to the unhandled
/// sink. Skipped (returns) for a source that does not retry.
pub fn lease_ends_between_retries(source: &impl ElectedSource) {
    if !source.retries() {
        return;
    }
    // Fifty retries 100 ms apart: five seconds, several leases.
    let run = Run::start(
        source,
        RetryPolicy::fixed_delay(50, Duration::from_millis(100)),
    );
    let (_, _first) = leader(source, &run.ledger, None);
    source.publish(b"fail-0");
    wait_for("the handler entered with fail-0", || {
        run.ledger.entered(b"fail-0")
    });
    let cut = run.locker.partition();
    let at = Instant::now();
    settles(|| {
        check_every_message_accounted(
            &run.ledger.events(),
            &[b"fail-0".to_vec()],
            &source.dead_letters(),
        )
        .is_ok()
    });
    // A late dead letter would land within this wait.
    std::thread::sleep(Duration::from_millis(300));
    let dead = source.dead_letters();
    let events = run.stop();
    // A source that keeps its messages hands fail-0 to the next leader,
    // which may dead-letter it under its own lease; without such calls,
    // a dead letter can only have been written under the ended one.
    let called_by_a_later_lease = events.iter().any(|(_, e)| {
        matches!(e, Event::Entered { payload, fence: Some(f), .. }
            if payload == b"fail-0" && !cut.contains(f))
    });
    judge(
        source,
        if dead.iter().any(|d| d == b"fail-0") && !called_by_a_later_lease {
            Err(Violation {
                rule: "no dead letter under an ended lease",
                detail: "fail-0, whose retries outlast its lease, was dead-lettered".to_owned(),
            })
        } else {
            Ok(())
        },
        &events,
    );
    judge(
        source,
        check_no_call_after_the_lease_ended(&events, &cut, at, TTL),
        &events,
    );
    judge(
        source,
        check_every_message_accounted(&events, &[b"fail-0".to_vec()], &dead),
        &events,
    );
}

/// The lease ends while messages wait behind a slow handler: none has
/// its effect under the ended lease, and every one ends somewhere.
pub fn lease_ends_while_messages_are_queued(source: &impl ElectedSource) {
    let run = Run::start(
        source,
        RetryPolicy::fixed_delay(0, Duration::from_millis(10)),
    );
    let (_, first) = leader(source, &run.ledger, None);
    let count = source.in_flight().unwrap_or(100).min(100);
    let queued: Vec<Vec<u8>> = (0..count)
        .map(|i| format!("slow-{i}").into_bytes())
        .collect();
    source.publish_all(&queued);
    wait_for("the handler entered with slow-0", || {
        run.ledger.entered(b"slow-0")
    });
    let cut = run.locker.partition();
    let at = Instant::now();
    leader(source, &run.ledger, Some(first));
    settles(|| {
        check_every_message_accounted(&run.ledger.events(), &queued, &source.dead_letters()).is_ok()
    });
    let dead = source.dead_letters();
    let events = run.stop();
    judge(source, check_fences_never_go_back(&events), &events);
    judge(
        source,
        check_no_effect_after_the_lease_ended(&events, &cut, at, TTL),
        &events,
    );
    judge(
        source,
        check_no_call_after_the_lease_ended(&events, &cut, at, TTL),
        &events,
    );
    judge(
        source,
        check_every_message_accounted(&events, &queued, &dead),
        &events,
    );
}

/// Every scenario, in turn.
pub fn run_all(source: &impl ElectedSource) {
    lease_ends_while_the_handler_waits(source);
    lease_ends_between_retries(source);
    lease_ends_while_messages_are_queued(source);
}

/// A source that delivers each message to one consumer (a consumer
/// group, a JetStream durable consumer, a work queue, a table of work):
/// no lease, the source's own acknowledgement and redelivery.
///
/// Its contract: every message ends handled or, once its handler's
/// retries are spent, in the source's dead-letter place with its whole
/// content ([`a_failing_message_is_dead_lettered_whole_and_the_rest_handled`]);
/// a restart of the server loses nothing the source stored, whether it
/// was published before the restart with no consumer running or after
/// it ([`a_server_restart_loses_nothing_the_source_kept`]).
pub trait SharedSource {
    /// The source's name, in messages.
    fn name(&self) -> &str;

    /// Starts consumer `id`, calling `handler` for each message and
    /// retrying a failing one under `retry` before dead-lettering it.
    /// Returns what stops it.
    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop;

    /// Publishes `payloads` in order, each stored by the source when
    /// this returns.
    fn publish_all(&self, payloads: &[Vec<u8>]);

    /// The payloads in the source's dead-letter place.
    fn dead_letters(&self) -> Vec<Vec<u8>>;

    /// Stops the server and starts it again, keeping what it stored.
    fn restart_server(&self);

    /// Whether the source stores messages for a consumer that is not
    /// running (core NATS does not: the restart scenario does not apply).
    fn keeps_messages(&self) -> bool {
        true
    }
}

fn numbered(prefix: &str, count: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|i| format!("{prefix}-{i}").into_bytes())
        .collect()
}

/// Panics with the violation, naming the shared source.
fn judge_shared(
    source: &impl SharedSource,
    checked: Result<(), Violation>,
    events: &[(Instant, Event)],
) {
    if let Err(violation) = checked {
        panic!("{}: {violation}\nevents: {events:?}", source.name());
    }
}

/// Rule: every one of `payloads` has its effect.
fn check_every_message_handled(
    events: &[(Instant, Event)],
    payloads: &[Vec<u8>],
) -> Result<(), Violation> {
    for payload in payloads {
        let handled = events
            .iter()
            .any(|(_, e)| matches!(e, Event::Effect { payload: p, .. } if p == payload));
        if !handled {
            return Err(Violation {
                rule: "every message is handled",
                detail: format!("{} was never handled", String::from_utf8_lossy(payload)),
            });
        }
    }
    Ok(())
}

/// Two consumers; 30 messages their handler takes and 2 it never does:
/// the 30 are handled, the 2 dead-lettered whole.
pub fn a_failing_message_is_dead_lettered_whole_and_the_rest_handled(source: &impl SharedSource) {
    let ledger = Ledger::default();
    let gate = Arc::new(AtomicBool::new(true));
    let retry = RetryPolicy::fixed_delay(1, Duration::from_millis(10));
    let stops: Vec<Stop> = (0..2)
        .map(|id| source.start(id, retry, handler(&ledger, &gate)))
        .collect();
    let good = numbered("m", 30);
    let failing = numbered("fail", 2);
    source.publish_all(&good);
    source.publish_all(&failing);
    settles(|| {
        check_every_message_handled(&ledger.events(), &good).is_ok()
            && failing.iter().all(|f| source.dead_letters().contains(f))
    });
    for stop in stops {
        stop();
    }
    let (events, dead) = (ledger.events(), source.dead_letters());
    judge_shared(source, check_every_message_handled(&events, &good), &events);
    let missing: Vec<_> = failing.iter().filter(|f| !dead.contains(f)).collect();
    judge_shared(
        source,
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Violation {
                rule: "a given-up message is dead-lettered whole",
                detail: format!(
                    "{:?} not among the dead letters {:?}",
                    missing
                        .iter()
                        .map(|m| String::from_utf8_lossy(m))
                        .collect::<Vec<_>>(),
                    dead.iter()
                        .map(|d| String::from_utf8_lossy(d))
                        .collect::<Vec<_>>()
                ),
            })
        },
        &events,
    );
}

/// Messages published with no consumer running, then a server restart,
/// then a consumer, then more messages: every one is handled. Skipped
/// (returns) for a source that keeps nothing.
pub fn a_server_restart_loses_nothing_the_source_kept(source: &impl SharedSource) {
    if !source.keeps_messages() {
        return;
    }
    let ledger = Ledger::default();
    let gate = Arc::new(AtomicBool::new(true));
    let retry = RetryPolicy::fixed_delay(1, Duration::from_millis(10));
    // A first consumer creates what the source needs (a group, a
    // durable consumer, a queue, a table), handles a first batch, stops.
    let first = source.start(0, retry, handler(&ledger, &gate));
    let before = numbered("before", 10);
    source.publish_all(&before);
    settles(|| check_every_message_handled(&ledger.events(), &before).is_ok());
    first();
    let kept = numbered("kept", 20);
    source.publish_all(&kept);
    source.restart_server();
    let second = source.start(1, retry, handler(&ledger, &gate));
    let after = numbered("after", 10);
    source.publish_all(&after);
    let all: Vec<Vec<u8>> = [before, kept, after].concat();
    settles(|| check_every_message_handled(&ledger.events(), &all).is_ok());
    second();
    let events = ledger.events();
    judge_shared(source, check_every_message_handled(&events, &all), &events);
}

/// Every scenario of a shared source, in turn.
pub fn run_all_shared(source: &impl SharedSource) {
    a_failing_message_is_dead_lettered_whole_and_the_rest_handled(source);
    a_server_restart_loses_nothing_the_source_kept(source);
}
