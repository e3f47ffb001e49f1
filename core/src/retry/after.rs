//! A server's `Retry-After`: how long it asks a client to wait.
//!
//! HTTP's `Retry-After` (RFC 9110, section 10.2.3) is either a number of
//! seconds or an HTTP date. A date is absolute, so turning it into a wait
//! needs the wall-clock time, which the caller passes in (core reads no
//! clock). The three date forms a recipient must accept are read:
//! IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form
//! (`Sunday, 06-Nov-94 08:49:37 GMT`) and asctime (`Sun Nov  6 08:49:37
//! 1994`). As in the `httpdate` crate, a two-digit year below 70 is in the
//! 2000s and the weekday name is not checked against the date; a day past
//! the end of its month is refused.
//!
//! ```
//! use core::time::Duration;
//! use guard_core::retry::RetryAfter;
//!
//! let wait = RetryAfter::parse("120").unwrap();
//! assert_eq!(wait.delay_from(0), Duration::from_secs(120));
//!
//! let date = RetryAfter::parse("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
//! assert_eq!(date, RetryAfter::At { unix_secs: 784_111_777 });
//! // Read 30 s before that date; a date already past asks for no wait.
//! assert_eq!(date.delay_from(784_111_747), Duration::from_secs(30));
//! assert_eq!(date.delay_from(784_111_800), Duration::ZERO);
//! ```

use core::fmt;
use core::time::Duration;

/// What a `Retry-After` value asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RetryAfter {
    /// Wait this long (delta-seconds).
    After(Duration),
    /// Wait until this wall-clock time, in seconds since the Unix epoch
    /// (an HTTP date).
    At {
        /// Seconds since 1970-01-01T00:00:00Z.
        unix_secs: u64,
    },
}

/// A `Retry-After` value that is neither delta-seconds nor an HTTP date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct InvalidRetryAfter;

impl fmt::Display for InvalidRetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Retry-After is neither a number of seconds nor an HTTP date")
    }
}

impl core::error::Error for InvalidRetryAfter {}

impl RetryAfter {
    /// Reads a header value; surrounding whitespace is ignored. A number of
    /// seconds too large for a `u64` saturates.
    pub fn parse(value: &str) -> Result<RetryAfter, InvalidRetryAfter> {
        let value = value.trim().as_bytes();
        if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
            let secs = value.iter().fold(0u64, |secs, digit| {
                secs.saturating_mul(10)
                    .saturating_add(u64::from(digit.wrapping_sub(b'0')))
            });
            return Ok(RetryAfter::After(Duration::from_secs(secs)));
        }
        let date = imf_fixdate(value)
            .or_else(|| rfc850_date(value))
            .or_else(|| asctime_date(value))
            .ok_or(InvalidRetryAfter)?;
        Ok(RetryAfter::At {
            unix_secs: date.unix_secs().ok_or(InvalidRetryAfter)?,
        })
    }

    /// The wait it asks for, read at wall-clock time `now_unix_secs`
    /// (seconds since the Unix epoch); zero for a date already past.
    pub const fn delay_from(self, now_unix_secs: u64) -> Duration {
        match self {
            RetryAfter::After(wait) => wait,
            RetryAfter::At { unix_secs } => {
                Duration::from_secs(unix_secs.saturating_sub(now_unix_secs))
            }
        }
    }
}

/// A calendar date and time of day, as read (not yet checked).
struct DateTime {
    year: u64,
    month: u64,
    day: u64,
    hour: u64,
    minute: u64,
    second: u64,
}

impl DateTime {
    /// A date from its year, three-letter month name, day and `hh:mm:ss`.
    fn read(year: u64, month_name: &[u8], day: u64, time: &[u8]) -> Option<DateTime> {
        let (hour, minute, second) = time_of_day(time)?;
        Some(DateTime {
            year,
            month: month(month_name)?,
            day,
            hour,
            minute,
            second,
        })
    }

    /// Seconds since the Unix epoch, if the fields name a real instant at
    /// or after it (a leap second 60 is taken as the next second).
    fn unix_secs(&self) -> Option<u64> {
        let in_month = days_in_month(self.year, self.month)?;
        let valid = self.year >= 1970
            && (1..=in_month).contains(&self.day)
            && self.hour < 24
            && self.minute < 60
            && self.second <= 60;
        if !valid {
            return None;
        }
        let days = days_since_epoch(self.year, self.month, self.day)?;
        // Each field is checked small above: nothing here can overflow.
        let secs_of_day = self
            .hour
            .saturating_mul(3600)
            .saturating_add(self.minute.saturating_mul(60))
            .saturating_add(self.second);
        days.checked_mul(86_400)?.checked_add(secs_of_day)
    }
}

const fn is_leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

const fn days_in_month(year: u64, month: u64) -> Option<u64> {
    Some(match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => return None,
    })
}

/// Days from 1970-01-01 to a valid date at or after it: whole years, then
/// whole months of the date's year, then its days.
fn days_since_epoch(year: u64, month: u64, day: u64) -> Option<u64> {
    let before = year.checked_sub(1)?;
    let leap_days_before = |y: u64| (y / 4).saturating_sub(y / 100).saturating_add(y / 400);
    let leap_days = leap_days_before(before).checked_sub(leap_days_before(1969))?;
    let years = year.checked_sub(1970)?;
    let months: u64 = (1..month).filter_map(|m| days_in_month(year, m)).sum();
    years
        .checked_mul(365)?
        .checked_add(leap_days)?
        .checked_add(months)?
        .checked_add(day.checked_sub(1)?)
}

/// `digits` as a number, if they are all ASCII digits.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?
            .checked_add(u64::from(d.wrapping_sub(b'0')))
    })
}

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];
const DAYS: [&[u8; 3]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
const LONG_DAYS: [&[u8]; 7] = [
    b"Monday",
    b"Tuesday",
    b"Wednesday",
    b"Thursday",
    b"Friday",
    b"Saturday",
    b"Sunday",
];

/// The month numbered 1 to 12 whose three-letter name is `name`.
fn month(name: &[u8]) -> Option<u64> {
    let index = MONTHS.iter().position(|m| m.as_slice() == name)?;
    u64::try_from(index).ok()?.checked_add(1)
}

/// `hh:mm:ss`.
fn time_of_day(s: &[u8]) -> Option<(u64, u64, u64)> {
    match s {
        [h0, h1, b':', m0, m1, b':', s0, s1] => Some((
            number(&[*h0, *h1])?,
            number(&[*m0, *m1])?,
            number(&[*s0, *s1])?,
        )),
        _ => None,
    }
}

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(s: &[u8]) -> Option<DateTime> {
    let (weekday, rest) = s.split_at_checked(3)?;
    let rest = rest.strip_prefix(b", ")?.strip_suffix(b" GMT")?;
    if !DAYS.iter().any(|d| d.as_slice() == weekday) {
        return None;
    }
    match rest {
        [
            d0,
            d1,
            b' ',
            m0,
            m1,
            m2,
            b' ',
            y0,
            y1,
            y2,
            y3,
            b' ',
            time @ ..,
        ] => DateTime::read(
            number(&[*y0, *y1, *y2, *y3])?,
            &[*m0, *m1, *m2],
            number(&[*d0, *d1])?,
            time,
        ),
        _ => None,
    }
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`
fn rfc850_date(s: &[u8]) -> Option<DateTime> {
    let rest = LONG_DAYS
        .iter()
        .find_map(|d| s.strip_prefix(*d))?
        .strip_prefix(b", ")?
        .strip_suffix(b" GMT")?;
    match rest {
        [d0, d1, b'-', m0, m1, m2, b'-', y0, y1, b' ', time @ ..] => {
            let yy = number(&[*y0, *y1])?;
            let year = yy.saturating_add(if yy < 70 { 2000 } else { 1900 });
            DateTime::read(year, &[*m0, *m1, *m2], number(&[*d0, *d1])?, time)
        }
        _ => None,
    }
}

/// `Sun Nov  6 08:49:37 1994` (a day below 10 is padded with a space).
fn asctime_date(s: &[u8]) -> Option<DateTime> {
    match s {
        [w0, w1, w2, b' ', m0, m1, m2, b' ', d0, d1, b' ', rest @ ..] => {
            if !DAYS.iter().any(|d| d.as_slice() == [*w0, *w1, *w2]) {
                return None;
            }
            let (time, year) = rest.split_at_checked(8)?;
            let day = if *d0 == b' ' {
                number(&[*d1])?
            } else {
                number(&[*d0, *d1])?
            };
            match year {
                [b' ', y0, y1, y2, y3] => {
                    DateTime::read(number(&[*y0, *y1, *y2, *y3])?, &[*m0, *m1, *m2], day, time)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(value: &str) -> Option<u64> {
        match RetryAfter::parse(value) {
            Ok(RetryAfter::At { unix_secs }) => Some(unix_secs),
            _ => None,
        }
    }

    /// RFC 9110's example, in each of the three forms.
    #[test]
    fn the_three_date_forms_name_the_same_instant() {
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
            "  Sun, 06 Nov 1994 08:49:37 GMT\t",
        ] {
            assert_eq!(at(form), Some(784_111_777), "{form:?}");
        }
        assert_eq!(at("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(at("Thursday, 01-Jan-70 00:00:00 GMT"), Some(0));
        assert_eq!(at("Sunday, 06-Nov-22 08:49:37 GMT"), Some(1_667_724_577));
        assert_eq!(at("Tue, 29 Feb 2000 12:00:00 GMT"), Some(951_825_600));
        assert_eq!(at("Fri, 31 Dec 9999 23:59:59 GMT"), Some(253_402_300_799));
    }

    #[test]
    fn seconds_are_read_whole_and_saturate() {
        let secs = |v: &str| RetryAfter::parse(v).map(|r| r.delay_from(u64::MAX));
        assert_eq!(secs("0"), Ok(Duration::ZERO));
        assert_eq!(secs(" 17 "), Ok(Duration::from_secs(17)));
        assert_eq!(
            secs("99999999999999999999999"),
            Ok(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            " ",
            "-1",
            "1.5",
            "+3",
            "3s",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 29 Feb 1900 08:49:37 GMT",
            "Sun, 00 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Nov 1994 08:49:61 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 8:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov  6 08:49:37 94",
            "Sun, 06 Nov 1994 08:49:37 GMT trailing",
            "Sun, 06 Nov 1994 08:49:37 GMT\u{e9}",
        ] {
            assert_eq!(RetryAfter::parse(bad), Err(InvalidRetryAfter), "{bad:?}");
        }
    }

    /// Every date `httpdate` writes, over the whole range it writes, reads
    /// back as the same instant.
    #[test]
    fn dates_written_by_httpdate_read_back_as_the_same_instant() {
        use std::time::{Duration as StdDuration, UNIX_EPOCH};
        let mut secs: u64 = 0;
        while secs < 253_402_300_800 {
            let written = httpdate::fmt_http_date(UNIX_EPOCH + StdDuration::from_secs(secs));
            assert_eq!(at(&written), Some(secs), "{written}");
            // Steps that land on every day of the year and month ends over time.
            secs = secs.saturating_add(86_400 * 3 + 3_607);
        }
    }
}
