//! The one import path for synchronisation primitives.
//!
//! Shared types in guard-core take their atomics and their blocking mutex
//! from here, never from `core::sync::atomic` or `embassy_sync` directly,
//! so the same code can be model-checked.
//! `portable-atomic` uses native instructions where the target has them.
//! Where it has 32-bit but not 64-bit compare-and-swap (Cortex-M3/M4/M7),
//! 64-bit atomics fall back to a global spin lock: correct between threads,
//! but an interrupt handler that preempts a holder of that lock on the same
//! core would spin forever. Enable this crate's `critical-section` feature
//! when an atomic type is shared with interrupt handlers there; it is
//! required where the target has no compare-and-swap at all (Cortex-M0).

//!
//! Under `--cfg guard_loom` (a project-specific name: a global `loom` cfg
//! would also change third-party crates), the atomics and the blocking
//! mutex are loom's, so the loom models in `core/tests/loom.rs` explore
//! every interleaving of the code exactly as written, including a thread
//! preempted while it holds a shared queue's or table's lock. The raw mutex
//! a caller picks (a critical section, a thread mutex) is then only a type
//! parameter: its own correctness is `embassy_sync`'s, not modelled here.

#[cfg(all(
    not(guard_loom),
    any(target_has_atomic = "ptr", feature = "critical-section")
))]
pub use portable_atomic::AtomicU64;
#[cfg(not(guard_loom))]
pub use portable_atomic::Ordering;

#[cfg(guard_loom)]
pub use loom::sync::atomic::{AtomicU64, Ordering};

/// The blocking mutex of the shared types
/// ([`crate::dlq::SharedDeadLetterQueue`], [`crate::limit::SharedKeyed`]):
/// `embassy_sync`'s, over the raw mutex `M` the caller picks.
#[cfg(not(guard_loom))]
pub(crate) use embassy_sync::blocking_mutex::Mutex as BlockingMutex;

/// The blocking mutex of the shared types under loom: loom's mutex, with
/// the interface of `embassy_sync::blocking_mutex::Mutex`. `M` is kept so
/// that the shared types have the same parameters and the same `Send` and
/// `Sync` bounds as without loom.
#[cfg(guard_loom)]
pub(crate) struct BlockingMutex<M, T> {
    raw: core::marker::PhantomData<M>,
    inner: loom::sync::Mutex<T>,
}

#[cfg(guard_loom)]
impl<M, T> BlockingMutex<M, T> {
    /// A mutex holding `value` (loom's mutex has no `const` constructor).
    pub(crate) fn new(value: T) -> Self {
        BlockingMutex {
            raw: core::marker::PhantomData,
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// Runs `f` on the value with the lock held, as `embassy_sync` does.
    pub(crate) fn lock<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        // A panic under the lock fails the model anyway; the value is still
        // whole, so a poisoned lock hands it on.
        let guard = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&guard)
    }
}
