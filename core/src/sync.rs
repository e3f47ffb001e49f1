//! The one import path for synchronisation primitives.
//!
//! Shared types in guard-core take their atomics from here, never from
//! `core::sync::atomic` directly, so the same code can be model-checked.
//! `portable-atomic` uses native instructions where the target has them.
//! Where it has 32-bit but not 64-bit compare-and-swap (Cortex-M3/M4/M7),
//! 64-bit atomics fall back to a global spin lock: correct between threads,
//! but an interrupt handler that preempts a holder of that lock on the same
//! core would spin forever. Enable this crate's `critical-section` feature
//! when an atomic type is shared with interrupt handlers there; it is
//! required where the target has no compare-and-swap at all (Cortex-M0).

//!
//! Under `--cfg guard_loom` (a project-specific name: a global `loom` cfg
//! would also change third-party crates), the atomics are loom's, so the
//! loom models in `core/tests/loom.rs` explore every interleaving of the
//! code exactly as written.

#[cfg(all(
    not(guard_loom),
    any(target_has_atomic = "ptr", feature = "critical-section")
))]
pub use portable_atomic::AtomicU64;
#[cfg(not(guard_loom))]
pub use portable_atomic::Ordering;

#[cfg(guard_loom)]
pub use loom::sync::atomic::{AtomicU64, Ordering};
