//! Cron schedules with a seconds field, evaluated in UTC.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use guard_core::slot::{Schedule, UnixMillis};

/// A cron expression with a **mandatory seconds field**
/// (`sec min hour day-of-month month day-of-week [year]`), as the original
/// required, evaluated in **UTC** on every replica.
///
/// One time zone for all replicas is what makes their planned slots agree:
/// the original used each process's local zone, so replicas in different
/// zones computed different slots and different keys.
///
/// ```
/// use guard_core::slot::{Schedule, UnixMillis};
/// use guard_std::CronSchedule;
///
/// let every_ten_seconds: CronSchedule = "*/10 * * * * *".parse()?;
/// assert_eq!(every_ten_seconds.next_after(UnixMillis(1_000_001)), Some(UnixMillis(1_010_000)));
/// # Ok::<(), guard_std::CronError>(())
/// ```
#[derive(Clone, Debug)]
pub struct CronSchedule {
    expression: String,
    schedule: cron::Schedule,
}

/// Two schedules are the same when their expressions are: the parsed
/// schedule is made from it alone.
impl PartialEq for CronSchedule {
    fn eq(&self, other: &Self) -> bool {
        self.expression == other.expression
    }
}

impl Eq for CronSchedule {}

/// An expression that is not a valid cron schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CronError {
    expression: String,
    reason: String,
}

impl fmt::Display for CronError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid cron expression {:?}: {} (expected 6 or 7 fields: sec min hour day-of-month month day-of-week [year])",
            self.expression, self.reason
        )
    }
}

impl std::error::Error for CronError {}

impl CronError {
    /// The expression refused.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// Why, in the parser's words, on one line.
    pub fn reason(&self) -> &str {
        self.reason
            .lines()
            .map(str::trim)
            .rfind(|line| !line.is_empty() && *line != "^")
            .unwrap_or("not understood")
    }
}

impl FromStr for CronSchedule {
    type Err = CronError;

    fn from_str(expression: &str) -> Result<Self, CronError> {
        let error = |reason: String| CronError {
            expression: expression.to_owned(),
            reason,
        };
        let fields = expression.split_whitespace().count();
        if !(6..=7).contains(&fields) && !expression.trim_start().starts_with('@') {
            return Err(error(format!("{fields} fields")));
        }
        let schedule = cron::Schedule::from_str(expression).map_err(|e| error(e.to_string()))?;
        Ok(CronSchedule {
            expression: expression.to_owned(),
            schedule,
        })
    }
}

impl CronSchedule {
    /// The expression as given.
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

impl Schedule for CronSchedule {
    fn next_after(&self, t: UnixMillis) -> Option<UnixMillis> {
        let millis = i64::try_from(t.as_millis()).ok()?;
        let after = DateTime::<Utc>::from_timestamp_millis(millis)?;
        let next = self.schedule.after(&after).next()?;
        u64::try_from(next.timestamp_millis()).ok().map(UnixMillis)
    }
}
