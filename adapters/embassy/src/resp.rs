//! A RESP2 codec without allocation: a command encoder into a caller's
//! buffer and an incremental reply parser over borrowed bytes.
//!
//! The parser takes whatever bytes have arrived and answers *incomplete*
//! (read more and call again), a frame with the bytes it used, or an error
//! naming what is malformed. Arrays are validated whole (to a nesting
//! depth of [`MAX_DEPTH`]) and their elements read lazily with
//! [`Array::iter`], so nothing is copied.
//!
//! ```
//! use guard_embassy::resp::{Frame, encode_command, parse};
//!
//! let mut buf = [0u8; 64];
//! let n = encode_command(&mut buf, &[b"GET", b"key"])?;
//! assert_eq!(&buf[..n], b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n");
//!
//! assert_eq!(parse(b":4")?, None); // incomplete: read more
//! assert_eq!(parse(b":42\r\n")?, Some((Frame::Integer(42), 5)));
//! # Ok::<(), Box<dyn core::error::Error>>(())
//! ```

use core::fmt::{self, Write as _};

/// How deeply arrays may nest in a reply.
pub const MAX_DEPTH: usize = 8;

/// The longest bulk string accepted (Redis's own `proto-max-bulk-len`).
pub const MAX_BULK: usize = 512 * 1024 * 1024;

/// A command that does not fit the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BufferFull {
    /// The buffer's size.
    pub capacity: usize,
}

impl fmt::Display for BufferFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command does not fit the {}-byte buffer", self.capacity)
    }
}

impl core::error::Error for BufferFull {}

/// Writes a command, an array of bulk strings, into a buffer.
///
/// The number of arguments is given first (RESP puts it in front); each
/// argument is raw bytes or anything `Display` (numbers, keys built from
/// parts), formatted straight into the buffer.
#[derive(Debug)]
pub struct CommandWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    expected: usize,
    written: usize,
}

/// `core::fmt::Write` into a byte slice, counting what does not fit.
struct SliceWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    overflow: bool,
}

impl fmt::Write for SliceWriter<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len.saturating_add(s.len());
        match self.buf.get_mut(self.len..end) {
            Some(dst) => {
                dst.copy_from_slice(s.as_bytes());
                self.len = end;
                Ok(())
            }
            None => {
                self.overflow = true;
                Err(fmt::Error)
            }
        }
    }
}

/// Counts the bytes a `Display` writes.
struct Counter(usize);

impl fmt::Write for Counter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 = self.0.saturating_add(s.len());
        Ok(())
    }
}

impl<'b> CommandWriter<'b> {
    /// Starts a command of `args` arguments.
    pub fn new(buf: &'b mut [u8], args: usize) -> Result<Self, BufferFull> {
        let mut w = CommandWriter {
            buf,
            len: 0,
            expected: args,
            written: 0,
        };
        w.format(format_args!("*{args}\r\n"))?;
        Ok(w)
    }

    fn format(&mut self, args: fmt::Arguments<'_>) -> Result<(), BufferFull> {
        let capacity = self.buf.len();
        let mut out = SliceWriter {
            buf: self.buf,
            len: self.len,
            overflow: false,
        };
        if out.write_fmt(args).is_err() || out.overflow {
            return Err(BufferFull { capacity });
        }
        self.len = out.len;
        Ok(())
    }

    /// Appends an argument of raw bytes.
    pub fn bytes(mut self, arg: &[u8]) -> Result<Self, BufferFull> {
        self.format(format_args!("${}\r\n", arg.len()))?;
        let end = self.len.saturating_add(arg.len());
        let capacity = self.buf.len();
        let dst = self
            .buf
            .get_mut(self.len..end)
            .ok_or(BufferFull { capacity })?;
        dst.copy_from_slice(arg);
        self.len = end;
        self.format(format_args!("\r\n"))?;
        self.written = self.written.saturating_add(1);
        Ok(self)
    }

    /// Appends an argument formatted from `arg`.
    pub fn display(mut self, arg: impl fmt::Display) -> Result<Self, BufferFull> {
        let mut count = Counter(0);
        // Counting never fails; a Display that fails is written as is.
        write!(count, "{arg}").ok();
        self.format(format_args!("${}\r\n{arg}\r\n", count.0))?;
        self.written = self.written.saturating_add(1);
        Ok(self)
    }

    /// The encoded length. Panics never: a wrong argument count is a bug
    /// of the caller reported as a debug assertion and by the server.
    pub fn finish(self) -> usize {
        debug_assert_eq!(self.written, self.expected, "argument count");
        self.len
    }
}

/// Encodes `args` as one command; returns the encoded length.
pub fn encode_command(buf: &mut [u8], args: &[&[u8]]) -> Result<usize, BufferFull> {
    let mut w = CommandWriter::new(buf, args.len())?;
    for arg in args {
        w = w.bytes(arg)?;
    }
    Ok(w.finish())
}

/// A malformed reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum ParseError {
    /// The first byte is not a RESP2 type marker.
    UnknownType(u8),
    /// A length or integer is not a decimal number in range.
    BadNumber,
    /// A length below -1, or a bulk string over [`MAX_BULK`].
    BadLength,
    /// A line or bulk string does not end with CRLF.
    MissingCrlf,
    /// Arrays nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::UnknownType(b) => write!(f, "RESP: unknown type byte 0x{b:02x}"),
            ParseError::BadNumber => f.write_str("RESP: malformed number"),
            ParseError::BadLength => f.write_str("RESP: length below -1 or over 512 MiB"),
            ParseError::MissingCrlf => f.write_str("RESP: missing CRLF"),
            ParseError::TooDeep => write!(f, "RESP: arrays nested deeper than {MAX_DEPTH}"),
        }
    }
}

impl core::error::Error for ParseError {}

/// One reply, borrowing from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// `+OK`.
    Simple(&'a [u8]),
    /// `-ERR ...`: the server refused the command.
    Error(&'a [u8]),
    /// `:42`.
    Integer(i64),
    /// `$3\r\nfoo`, or `$-1` (None).
    Bulk(Option<&'a [u8]>),
    /// `*2\r\n...`, or `*-1` (None).
    Array(Option<Array<'a>>),
}

/// A validated array: its elements, parsed on demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Array<'a> {
    len: usize,
    body: &'a [u8],
}

impl<'a> Array<'a> {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements in order.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            left: self.len,
            rest: self.body,
        }
    }
}

/// The elements of an [`Array`].
#[derive(Clone, Debug)]
pub struct ArrayIter<'a> {
    left: usize,
    rest: &'a [u8],
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        if self.left == 0 {
            return None;
        }
        // The array was validated whole: each element parses.
        let (frame, used) = parse_at(self.rest, 1).ok().flatten()?;
        self.rest = self.rest.get(used..).unwrap_or_default();
        self.left -= 1;
        Some(frame)
    }
}

/// The line at the start of `input` (without CRLF) and the bytes used.
fn line(input: &[u8]) -> Result<Option<(&[u8], usize)>, ParseError> {
    match input.iter().position(|&b| b == b'\r') {
        None => Ok(None),
        Some(cr) => match input.get(cr.saturating_add(1)) {
            None => Ok(None),
            Some(b'\n') => Ok(Some((input.get(..cr).unwrap_or_default(), cr + 2))),
            Some(_) => Err(ParseError::MissingCrlf),
        },
    }
}

fn number(digits: &[u8]) -> Result<i64, ParseError> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(ParseError::BadNumber);
    }
    // Accumulated towards the sign it will have: i64::MIN has no positive
    // counterpart, so a positive accumulation would refuse it.
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(ParseError::BadNumber);
        }
        let digit = i64::from(d - b'0');
        n = n
            .checked_mul(10)
            .and_then(|n| {
                if negative {
                    n.checked_sub(digit)
                } else {
                    n.checked_add(digit)
                }
            })
            .ok_or(ParseError::BadNumber)?;
    }
    Ok(n)
}

/// A length field: `None` for -1.
fn length(digits: &[u8]) -> Result<Option<usize>, ParseError> {
    match number(digits)? {
        -1 => Ok(None),
        n if n < -1 => Err(ParseError::BadLength),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| ParseError::BadLength),
    }
}

/// Parses one frame at the start of `input`: `Ok(None)` if it has not
/// all arrived, else the frame and the number of bytes it used.
pub fn parse(input: &[u8]) -> Result<Option<(Frame<'_>, usize)>, ParseError> {
    parse_at(input, 1)
}

fn parse_at(input: &[u8], depth: usize) -> Result<Option<(Frame<'_>, usize)>, ParseError> {
    let Some((&marker, rest)) = input.split_first() else {
        return Ok(None);
    };
    let Some((head, head_len)) = line(rest)? else {
        return Ok(None);
    };
    let after = head_len.saturating_add(1);
    match marker {
        b'+' => Ok(Some((Frame::Simple(head), after))),
        b'-' => Ok(Some((Frame::Error(head), after))),
        b':' => Ok(Some((Frame::Integer(number(head)?), after))),
        b'$' => {
            let Some(len) = length(head)? else {
                return Ok(Some((Frame::Bulk(None), after)));
            };
            if len > MAX_BULK {
                return Err(ParseError::BadLength);
            }
            let body = input.get(after..).unwrap_or_default();
            let end = len + 2;
            if body.len() < end {
                return Ok(None);
            }
            if body.get(len..end) != Some(b"\r\n".as_slice()) {
                return Err(ParseError::MissingCrlf);
            }
            Ok(Some((Frame::Bulk(body.get(..len)), after + end)))
        }
        b'*' => {
            let Some(len) = length(head)? else {
                return Ok(Some((Frame::Array(None), after)));
            };
            if depth > MAX_DEPTH {
                return Err(ParseError::TooDeep);
            }
            let body = input.get(after..).unwrap_or_default();
            let mut used = 0usize;
            for _ in 0..len {
                let rest = body.get(used..).unwrap_or_default();
                // Each element needs at least 3 bytes: an absurd count in
                // a short input is incomplete, found without looping long.
                if rest.is_empty() {
                    return Ok(None);
                }
                match parse_at(rest, depth + 1)? {
                    None => return Ok(None),
                    Some((_, n)) => used = used.saturating_add(n),
                }
            }
            let array = Array {
                len,
                body: body.get(..used).unwrap_or_default(),
            };
            Ok(Some((Frame::Array(Some(array)), after + used)))
        }
        other => Err(ParseError::UnknownType(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut buf = [0u8; 128];
        let n = CommandWriter::new(&mut buf, 3)
            .and_then(|w| w.bytes(b"SET"))
            .and_then(|w| w.display(format_args!("{}:{}", "a", 7)))
            .and_then(|w| w.display(1500u64))
            .unwrap()
            .finish();
        assert_eq!(&buf[..n], b"*3\r\n$3\r\nSET\r\n$3\r\na:7\r\n$4\r\n1500\r\n");
        let mut small = [0u8; 10];
        assert_eq!(
            encode_command(&mut small, &[b"GET", b"key"]),
            Err(BufferFull { capacity: 10 })
        );
    }

    #[test]
    fn every_prefix_of_a_reply_is_incomplete() {
        let reply = b"*3\r\n:1\r\n$5\r\nhello\r\n*2\r\n+OK\r\n$-1\r\n";
        for end in 0..reply.len() {
            assert_eq!(parse(&reply[..end]), Ok(None), "prefix of {end} bytes");
        }
        let (frame, used) = parse(reply).unwrap().unwrap();
        assert_eq!(used, reply.len());
        let Frame::Array(Some(array)) = frame else {
            panic!("{frame:?}")
        };
        let items: heapless::Vec<Frame<'_>, 4> = array.iter().collect();
        assert_eq!(items[0], Frame::Integer(1));
        assert_eq!(items[1], Frame::Bulk(Some(b"hello")));
        let Frame::Array(Some(inner)) = items[2] else {
            panic!()
        };
        let inner: heapless::Vec<Frame<'_>, 2> = inner.iter().collect();
        assert_eq!(inner.as_slice(), &[Frame::Simple(b"OK"), Frame::Bulk(None)]);
    }

    #[test]
    fn integers_cover_the_whole_i64_range() {
        assert_eq!(
            parse(b":-9223372036854775808\r\n"),
            Ok(Some((Frame::Integer(i64::MIN), 23)))
        );
        assert_eq!(
            parse(b":9223372036854775807\r\n"),
            Ok(Some((Frame::Integer(i64::MAX), 22)))
        );
        assert_eq!(parse(b":-0\r\n"), Ok(Some((Frame::Integer(0), 5))));
        assert_eq!(
            parse(b":9223372036854775808\r\n"),
            Err(ParseError::BadNumber)
        );
        assert_eq!(
            parse(b":-9223372036854775809\r\n"),
            Err(ParseError::BadNumber)
        );
    }

    #[test]
    fn malformed_replies_name_what_is_wrong() {
        assert_eq!(parse(b"?x\r\n"), Err(ParseError::UnknownType(b'?')));
        assert_eq!(parse(b":12a\r\n"), Err(ParseError::BadNumber));
        assert_eq!(
            parse(b":99999999999999999999\r\n"),
            Err(ParseError::BadNumber)
        );
        assert_eq!(parse(b"$-2\r\n"), Err(ParseError::BadLength));
        assert_eq!(parse(b"$3\r\nabcd\r\n"), Err(ParseError::MissingCrlf));
        assert_eq!(parse(b"+OK\rx"), Err(ParseError::MissingCrlf));
        let deep = b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
        assert_eq!(parse(deep), Err(ParseError::TooDeep));
        assert_eq!(
            parse(b"-ERR no\r\n"),
            Ok(Some((Frame::Error(b"ERR no"), 9)))
        );
    }

    #[test]
    fn a_huge_announced_length_waits_for_bytes_instead_of_failing() {
        assert_eq!(parse(b"$536870912\r\n"), Ok(None));
        assert_eq!(parse(b"*2147483647\r\n:1\r\n"), Ok(None));
        assert_eq!(parse(b"$536870913\r\n"), Err(ParseError::BadLength));
    }
}
