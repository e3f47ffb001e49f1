//! guard-gateway: an edge-gateway replica built on guard.
//!
//! - [`demo`]: N replicas in one process on an in-process locker, a
//!   scheduled job and a leader-only consumer, the leader stopped half-way;
//!   a report of slots, duplicates, misses and the takeover.
//! - [`replica`]: one real replica from a TOML configuration (Redis locker,
//!   schedules, leader-only consumers, rate limiters, Prometheus metrics);
//!   [`reload`]: what a reload of its file changes and keeps.

mod action;
pub mod admission;
mod built;
pub mod config;
pub mod dead_letters;
pub mod demo;
mod endpoint;
mod error;
mod event;
mod lockers;
pub mod logging;
pub mod prometheus;
mod queue;
pub mod readiness;
pub mod reload;
pub mod replica;
pub mod service;
mod sink;
pub mod status;
