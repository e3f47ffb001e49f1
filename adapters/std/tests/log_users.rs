//! A program that installs a `log` logger and no tracing subscriber
//! still gets guard's lines (tracing's `log` feature): their level,
//! their module as the target, their text. A binary of its own, so no
//! test in it sets a tracing subscriber.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use guard_core::limit::{FullPolicy, Rate, TokenBucket};
use guard_std::ratelimit::{MemoryLimiter, NamedRateLimiter, Quota};

/// Every record, as (level, target, text).
struct Logged(Mutex<Vec<(log::Level, String, String)>>);

impl log::Log for Logged {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push((
            record.level(),
            record.target().to_owned(),
            record.args().to_string(),
        ));
    }
    fn flush(&self) {}
}

static LOGGED: Logged = Logged(Mutex::new(Vec::new()));

#[test]
fn a_log_logger_gets_guards_lines_without_a_tracing_subscriber() {
    log::set_logger(&LOGGED).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let bucket = |n| TokenBucket::new(n, Rate::per(1, Duration::from_secs(1))).unwrap();
    let limiter = NamedRateLimiter::new(
        "uplink",
        Arc::new(MemoryLimiter::new(bucket(5), 16, FullPolicy::DenyNewKeys)),
    );
    limiter
        .reconfigure(Quota::TokenBucket {
            capacity: 10,
            rate: Rate::per(1, Duration::from_secs(1)),
        })
        .unwrap();
    let logged = LOGGED.0.lock().unwrap();
    assert!(
        logged
            .iter()
            .any(|(level, target, text)| *level == log::Level::Info
                && target == "guard_std::ratelimit::named"
                && text.starts_with("rate limiter uplink: quota")),
        "{logged:#?}"
    );
}
