//! Concurrent waiters started in a known order, for the tests of waiting
//! limiters: the order their waits end in and how long that took.

use std::cell::RefCell;
use std::future::Future;
use std::time::{Duration, Instant};

/// How a set of waiters finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// The waiters' indices in the order their waits ended.
    pub order: Vec<usize>,
    /// From the first wait's end to the last's.
    pub span: Duration,
}

/// Runs `waiters` tasks on one local executor, each awaiting `wait(i)`.
/// They are spawned in index order, and the executor makes their first
/// polls in that order, so a line they join at their first poll holds
/// them in index order.
pub fn finish_order<F, Fut>(waiters: usize, wait: F) -> Finished
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    let ended = RefCell::new(Vec::with_capacity(waiters));
    {
        let ex = async_executor::LocalExecutor::new();
        futures_lite::future::block_on(ex.run(async {
            let tasks: Vec<_> = (0..waiters)
                .map(|i| {
                    let (ended, wait) = (&ended, &wait);
                    ex.spawn(async move {
                        wait(i).await;
                        ended.borrow_mut().push((i, Instant::now()));
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
        }));
    }
    let ended = ended.into_inner();
    let span = match (ended.first(), ended.last()) {
        (Some((_, first)), Some((_, last))) => last.duration_since(*first),
        _ => Duration::ZERO,
    };
    Finished {
        order: ended.into_iter().map(|(i, _)| i).collect(),
        span,
    }
}
