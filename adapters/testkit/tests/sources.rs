//! The source contracts judge a source, not themselves: an in-memory
//! source built right (elected, or delivering once) passes every
//! scenario, and the same source with one rule broken fails the scenario
//! of that rule, naming it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use guard_core::guard::ActiveConfig;
use guard_core::lock::Ttl;
use guard_core::retry::RetryPolicy;
use guard_smol::{ActiveRunner, LeaseCheck};
use guard_std::GuardConfig;
use guard_testkit::sources::{self, Delivery, ElectedSource, Handler, Ledger, Stop};

/// The rule a [`Fake`] breaks, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Hands the handler a lease check that always says valid.
    ValidAlwaysTrue,
    /// Calls the handler for a queued message without checking the lease.
    NoCheckBeforeCall,
    /// Retries, then dead-letters, without checking the lease.
    RetriesWithoutCheck,
    /// Forgets what is queued when the lease ends.
    DropsQueued,
}

/// A broadcast in memory, read by the replica that holds the lease.
#[derive(Default)]
struct Fake {
    fault: Option<Fault>,
    subscribers: Mutex<Vec<async_channel::Sender<Vec<u8>>>>,
    dead: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Fake {
    fn new(fault: Option<Fault>) -> Self {
        Fake {
            fault,
            ..Fake::default()
        }
    }
}

/// The fence, if `lease` still holds the one `fence` names.
fn holds(lease: &LeaseCheck, fence: u64) -> bool {
    lease.fence() == Some(fence)
}

impl ElectedSource for Fake {
    fn name(&self) -> &str {
        "fake"
    }

    fn start(
        &self,
        id: usize,
        config: &GuardConfig,
        ttl: Duration,
        retry: RetryPolicy,
        handler: Handler,
        ledger: &Ledger,
    ) -> Stop {
        let (tx, rx) = async_channel::unbounded::<Vec<u8>>();
        self.subscribers.lock().unwrap().push(tx);
        let runner = ActiveRunner::new(config, &config.scope("fake").unwrap())
            .unwrap()
            .with_settings(
                ActiveConfig::new()
                    .with_ttl(Ttl::new(ttl).unwrap())
                    .with_interval(ttl / 3),
            )
            .unwrap();
        let lease = runner.lease_check();
        let (handle, control) = guard_smol::control();
        let elect = thread::spawn(move || {
            smol::block_on(runner.run(
                control,
                |_fence| async { Ok::<(), String>(()) },
                |_reason| async {},
            ))
        });
        let stopped = Arc::new(AtomicBool::new(false));
        let (fault, dead, ledger) = (self.fault, self.dead.clone(), ledger.clone());
        let serve = {
            let stopped = stopped.clone();
            thread::spawn(move || {
                let mut queue: VecDeque<(Vec<u8>, u64)> = VecDeque::new();
                while !stopped.load(Ordering::Relaxed) {
                    // Read while leading (subscribed), under that fence.
                    while let Ok(payload) = rx.try_recv() {
                        if let Some(fence) = lease.fence() {
                            queue.push_back((payload, fence));
                        }
                    }
                    let Some((payload, fence)) = queue.pop_front() else {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    if !holds(&lease, fence) {
                        match fault {
                            Some(Fault::DropsQueued) => continue,
                            Some(Fault::NoCheckBeforeCall) => {}
                            _ => {
                                ledger.unhandled(id, payload, "demoted");
                                continue;
                            }
                        }
                    }
                    serve_one(
                        id, &lease, fence, payload, fault, retry, &handler, &ledger, &dead,
                    );
                }
            })
        };
        Box::new(move || {
            handle.stop();
            stopped.store(true, Ordering::Relaxed);
            elect.join().unwrap();
            serve.join().unwrap();
        })
    }

    fn publish(&self, payload: &[u8]) {
        for subscriber in self.subscribers.lock().unwrap().iter() {
            subscriber.try_send(payload.to_vec()).ok();
        }
    }

    fn retries(&self) -> bool {
        true
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.dead.lock().unwrap().clone()
    }
}

/// One message through the handler, its retries and its dead letter.
#[allow(clippy::too_many_arguments)]
fn serve_one(
    id: usize,
    lease: &LeaseCheck,
    fence: u64,
    payload: Vec<u8>,
    fault: Option<Fault>,
    retry: RetryPolicy,
    handler: &Handler,
    ledger: &Ledger,
    dead: &Mutex<Vec<Vec<u8>>>,
) {
    let checked = fault != Some(Fault::RetriesWithoutCheck);
    for attempt in 0..=retry.max_attempts() {
        if attempt > 0 {
            thread::sleep(retry.delay_for_attempt(attempt));
            if checked && !holds(lease, fence) {
                ledger.unhandled(id, payload, "lease lost between retries");
                return;
            }
        }
        let valid: Box<dyn Fn() -> bool> = match fault {
            Some(Fault::ValidAlwaysTrue) => Box::new(|| true),
            _ => {
                let lease = lease.clone();
                Box::new(move || holds(&lease, fence))
            }
        };
        let delivery = Delivery {
            payload: payload.clone(),
            fence: Some(fence),
            valid,
        };
        if smol::block_on(handler(id, delivery)).is_ok() {
            return;
        }
    }
    if checked && !holds(lease, fence) {
        ledger.unhandled(id, payload, "lease lost before the dead letter");
        return;
    }
    dead.lock().unwrap().push(payload);
}

#[test]
fn a_source_built_right_passes_every_scenario() {
    sources::run_all(&Fake::new(None));
}

/// Runs `scenario` on `fake` (which breaks a rule); what its failure
/// says.
fn failure_of<S>(fake: S, scenario: fn(&S)) -> String {
    guard_testkit::broken_rule("a broken source", || scenario(&fake))
}

/// Runs `scenario` on a fake with `fault`; the rule its failure names.
fn broken(fault: Fault, scenario: fn(&Fake)) -> String {
    failure_of(Fake::new(Some(fault)), scenario)
}

#[test]
fn a_lease_check_that_never_ends_is_caught_while_the_handler_waits() {
    let message = broken(Fault::ValidAlwaysTrue, |f| {
        sources::lease_ends_while_the_handler_waits(f)
    });
    assert!(
        message.contains("no effect after the lease ended")
            || message.contains("fences never go back"),
        "{message}"
    );
}

#[test]
fn a_call_without_a_lease_check_is_caught_while_messages_are_queued() {
    let message = broken(Fault::NoCheckBeforeCall, |f| {
        sources::lease_ends_while_messages_are_queued(f)
    });
    assert!(
        message.contains("no call after the lease ended"),
        "{message}"
    );
}

#[test]
fn retries_and_a_dead_letter_without_a_lease_check_are_caught() {
    let message = broken(Fault::RetriesWithoutCheck, |f| {
        sources::lease_ends_between_retries(f)
    });
    assert!(
        message.contains("no dead letter under an ended lease")
            || message.contains("no call after the lease ended"),
        "{message}"
    );
}

#[test]
fn messages_forgotten_at_the_lease_s_end_are_caught() {
    let message = broken(Fault::DropsQueued, |f| {
        sources::lease_ends_while_messages_are_queued(f)
    });
    assert!(
        message.contains("nothing read is dropped silently"),
        "{message}"
    );
}

// A source that delivers once, in memory: a queue consumers take from.

/// The rule a [`SharedFake`] breaks, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SharedFault {
    /// Acknowledges a given-up message without dead-lettering it.
    ForgetsGivenUp,
    /// Keeps nothing across a restart.
    ForgetsOnRestart,
}

#[derive(Default)]
struct SharedFake {
    fault: Option<SharedFault>,
    queue: Arc<Mutex<VecDeque<Vec<u8>>>>,
    dead: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl guard_testkit::sources::SharedSource for SharedFake {
    fn name(&self) -> &str {
        "shared fake"
    }

    fn start(&self, id: usize, retry: RetryPolicy, handler: Handler) -> Stop {
        let (queue, dead, fault) = (self.queue.clone(), self.dead.clone(), self.fault);
        let stopped = Arc::new(AtomicBool::new(false));
        let serve = {
            let stopped = stopped.clone();
            thread::spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let Some(payload) = queue.lock().unwrap().pop_front() else {
                        thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let handled = (0..=retry.max_attempts()).any(|_| {
                        let delivery = Delivery {
                            payload: payload.clone(),
                            fence: None,
                            valid: Box::new(|| true),
                        };
                        smol::block_on(handler(id, delivery)).is_ok()
                    });
                    if !handled && fault != Some(SharedFault::ForgetsGivenUp) {
                        dead.lock().unwrap().push(payload);
                    }
                }
            })
        };
        Box::new(move || {
            stopped.store(true, Ordering::Relaxed);
            serve.join().unwrap();
        })
    }

    fn publish_all(&self, payloads: &[Vec<u8>]) {
        self.queue.lock().unwrap().extend(payloads.iter().cloned());
    }

    fn dead_letters(&self) -> Vec<Vec<u8>> {
        self.dead.lock().unwrap().clone()
    }

    fn restart_server(&self) {
        if self.fault == Some(SharedFault::ForgetsOnRestart) {
            self.queue.lock().unwrap().clear();
        }
    }
}

fn shared_broken(fault: SharedFault, scenario: fn(&SharedFake)) -> String {
    failure_of(
        SharedFake {
            fault: Some(fault),
            ..SharedFake::default()
        },
        scenario,
    )
}

#[test]
fn a_shared_source_built_right_passes_every_scenario() {
    sources::run_all_shared(&SharedFake::default());
}

#[test]
fn a_given_up_message_left_out_of_the_dead_letters_is_caught() {
    let message = shared_broken(SharedFault::ForgetsGivenUp, |f| {
        sources::a_failing_message_is_dead_lettered_whole_and_the_rest_handled(f)
    });
    assert!(
        message.contains("a given-up message is dead-lettered whole"),
        "{message}"
    );
}

#[test]
fn a_restart_that_loses_what_was_stored_is_caught() {
    let message = shared_broken(SharedFault::ForgetsOnRestart, |f| {
        sources::a_server_restart_loses_nothing_the_source_kept(f)
    });
    assert!(message.contains("every message is handled"), "{message}");
}
