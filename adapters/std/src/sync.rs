//! The one import path for guard-std's locks: std's, or loom's under
//! `--cfg guard_loom`, so the loom models in `tests/loom.rs` check the
//! shared types exactly as written.

#[cfg(guard_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(guard_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
