//! A broadcast source consumed only by the replica that holds the lease.
//!
//! Where a source gives every subscriber every message (a plain NATS
//! subject, a RabbitMQ fanout exchange), the seeds' rule is to elect one
//! consumer. [`serve_while_leading`] runs an [`ActiveRunner`] on the lease
//! task (see [`crate::lease_thread`]): each promotion opens the source's
//! subscription there, confirmed by the server before the promotion
//! counts; the subscription then crosses to the caller, which serves it
//! and checks the lease before every handler call. A demotion drops the
//! subscription (the source stops delivering to this replica); a
//! subscription that ends while leading demotes, releasing the lease for
//! a standby.
//!
//! Guarantees, for the caller's `serve`:
//! - it only ever serves a subscription opened under a lease;
//! - with the [`ElectedLease`] it is given, it hands a message over
//!   only while the lease the subscription was opened under is valid on
//!   this replica's clock, with its fence (a paused replica refuses what
//!   it finds buffered once its renew deadline has passed, and what it
//!   read under a lease it has since lost stays unhandled even if it
//!   leads again: the new lease reads with a subscription of its own);
//! - at most one subscription is open at a time.
//!
//! The source's [`Link`] follows the promotions: a failed `open` is a
//! failed connection (down, counted, logged once per interval), a
//! successful one is up, and a demotion other than that failure is up too
//! (a standby connects to nothing, so it is not failing).
//!
//! Messages published while no replica is subscribed (a takeover) reach
//! nobody: the guard removes duplicate consumption, it adds no
//! persistence.

use std::fmt;
use std::future::Future;

use futures_lite::future;
use guard_std::run::Control;

use guard_core::guard::DemoteReason;

use crate::delivery::ElectedLease;
use crate::lease_thread::{self, StopOnDrop};
use crate::link::Link;
use crate::runtime::ActiveRunner;

/// What woke the serving side.
enum Next<S> {
    /// The subscription being served ended (its connection closed).
    Ended,
    /// A new subscription and its lease's fence (promoted), `None`
    /// (demoted), or the lease task has ended (`Err`).
    Command(Result<Option<(S, u64)>, async_channel::RecvError>),
}

/// Runs `runner` until `control` stops it. On each promotion, `open`
/// subscribes (on the lease task; an error fails the promotion, which
/// releases the lease); `serve` then serves that subscription on the
/// caller's task until it ends or a demotion drops it. `open` is given
/// the new lease's fence (the [`LeaseCheck`] shows it only once the
/// promotion succeeded). `what` names the source in logs and the lease
/// thread, and `link` takes each promotion's connection.
pub(crate) async fn serve_while_leading<S, E, Open, OpenFut, Serve, ServeFut>(
    runner: &ActiveRunner,
    control: Control,
    what: &str,
    link: &Link,
    open: Open,
    mut serve: Serve,
) where
    S: Send + 'static,
    E: fmt::Display + Send + 'static,
    Open: Fn(u64) -> OpenFut + Send + Sync + 'static,
    OpenFut: Future<Output = Result<S, E>> + Send,
    Serve: FnMut(S, ElectedLease) -> ServeFut,
    ServeFut: Future<Output = ()>,
{
    // Our own handle demotes the runner when a subscription ends, and
    // stops it when this function returns or is dropped.
    let (own, linked) = control.linked();
    let _stop = StopOnDrop(own.clone());
    // A clone runs on the lease task; its lease view is the one checked.
    let runner = runner.clone();
    let lease = runner.lease_check();
    let key = runner.key().to_owned();
    let (tx, rx) = async_channel::unbounded::<Option<(S, u64)>>();
    let link = link.clone();
    let elect = move || async move {
        let (promoted, demoted) = (tx.clone(), tx);
        let (open, link) = (&open, &link);
        runner
            .run(
                linked,
                move |fence| {
                    let tx = promoted.clone();
                    async move {
                        let subscription = open(fence).await.inspect_err(|e| {
                            link.down(e, "the promotion fails, the lease is released");
                        })?;
                        link.up();
                        // The receiver lives until this runner returns.
                        tx.send(Some((subscription, fence))).await.ok();
                        Ok::<(), E>(())
                    }
                },
                move |reason| {
                    let tx = demoted.clone();
                    // A standby connects to nothing: not failing, unless
                    // its last attempt (this promotion) failed.
                    if reason != DemoteReason::PromoteFailed {
                        link.up();
                    }
                    async move {
                        tx.send(None).await.ok();
                    }
                },
            )
            .await;
        // Both senders drop with the callbacks: serving ends.
    };
    let task = match lease_thread::spawn(&format!("{what}-lease"), elect) {
        Ok(task) => task,
        Err(e) => {
            tracing::error!("{what}: cannot start its lease thread: {e}");
            return;
        }
    };
    let mut next: Option<(S, u64)> = None;
    loop {
        let (subscription, fence) = match next.take() {
            Some(subscription) => subscription,
            None => match rx.recv().await {
                Ok(Some(subscription)) => subscription,
                Ok(None) => continue,
                Err(_) => break,
            },
        };
        let woke = future::or(
            async {
                serve(subscription, ElectedLease::new(lease.clone(), fence, &key)).await;
                Next::Ended
            },
            async { Next::Command(rx.recv().await) },
        )
        .await;
        match woke {
            // Ended because its lease ended (the runner has demoted, and
            // may already have promoted again with a subscription of its
            // own): nothing to step down from.
            Next::Ended if !rx.is_empty() => {}
            Next::Ended => {
                tracing::warn!("{what}: the subscription ended while leading; stepping down");
                own.demote();
            }
            Next::Command(Ok(subscription)) => next = subscription,
            Next::Command(Err(_)) => break,
        }
    }
    // The runner has returned once the channel closed.
    if !task.join().await {
        tracing::error!("{what}: its lease thread panicked");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use guard_core::guard::ActiveConfig;
    use guard_core::lock::Ttl;
    use guard_std::{GuardConfig, LocalLocker, SharedLocker};

    use super::*;

    /// Polls `done` every 10 ms for up to `limit`.
    fn within(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        done()
    }

    #[test]
    fn failed_promotions_take_the_link_down_and_the_first_that_opens_brings_it_up() {
        let config = GuardConfig::new().with_locker(SharedLocker::new(LocalLocker::new()));
        let scope = config.scope("endpoint/test").unwrap();
        let ttl = Duration::from_millis(300);
        let runner = ActiveRunner::new(&config, &scope)
            .unwrap()
            .with_settings(
                ActiveConfig::new()
                    .with_ttl(Ttl::new(ttl).unwrap())
                    .with_interval(ttl / 3),
            )
            .unwrap();
        let link = Link::new("elected-test");
        // Promotions cannot subscribe until the test lets them.
        let attempts = Arc::new(AtomicU32::new(0));
        let refusing = Arc::new(AtomicBool::new(true));
        let open = {
            let (attempts, refusing) = (attempts.clone(), refusing.clone());
            move |_fence| {
                attempts.fetch_add(1, Ordering::SeqCst);
                let refused = refusing.load(Ordering::SeqCst);
                async move {
                    if refused {
                        Err("subscription refused")
                    } else {
                        Ok(())
                    }
                }
            }
        };
        let (handle, control) = guard_smol::control();
        let serving = {
            let link = link.clone();
            std::thread::spawn(move || {
                smol::block_on(serve_while_leading(
                    &runner,
                    control,
                    "elected-test",
                    &link,
                    open,
                    |(), _lease| future::pending::<()>(),
                ))
            })
        };
        // Two failed promotions: the demotion after the first did not
        // set the link up again.
        assert!(
            within(Duration::from_secs(10), || attempts.load(Ordering::SeqCst)
                >= 2),
            "promoted again"
        );
        assert_eq!(
            link.failure().as_deref(),
            Some("subscription refused"),
            "a failed promotion is a failed connection"
        );
        refusing.store(false, Ordering::SeqCst);
        assert!(
            within(Duration::from_secs(10), || link.is_up()),
            "the promotion that opened brings the link up: {link:?}"
        );
        handle.stop();
        serving.join().unwrap();
    }
}
