//! The one import path for guard-std's locks and atomics: std's, or
//! loom's under `--cfg guard_loom`, so the loom models in `tests/loom.rs`
//! (and a user's own, see `boards/loom-example`) check the shared types
//! exactly as written.

#[cfg(guard_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(guard_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(guard_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(guard_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
