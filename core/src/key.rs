//! The key codec: how text from outside becomes part of a backend key.
//!
//! Every key guard writes embeds text that a client, a producer or a
//! co-tenant chose: a scope's values and a delivery key (locks, once
//! guards, claims, semaphores), a rate limiter's key (an address, a
//! header, a channel). That text passes through this one encoding, never
//! into a key as it is:
//!
//! - `%` and every ASCII control character (NUL, line breaks, DEL
//!   included) are written `%XX` (two upper-case hex digits);
//! - so are the characters that carry structure where the text is put:
//!   `{` and `}` always (a Redis Cluster hash tag stays the backend's),
//!   and `:` in a key's segments ([`Reserved::Segment`]), where it
//!   separates them.
//!
//! The encoding is injective: `%` is itself escaped, so two distinct texts
//! never give one key (tested with a decoder in `core/tests/key_codec.rs`).
//! What it writes holds no NUL (which PostgreSQL's text and guard's etcd
//! keys refuse), no brace and no line break, so a key built from any text
//! is either stored as it is or refused for its length, and a key in a log
//! line stays one line.
//!
//! ```
//! use guard_core::key::{Reserved, escaped};
//!
//! assert_eq!(escaped("a}b:c", Reserved::HashTag).to_string(), "a%7Db:c");
//! assert_eq!(escaped("a}b:c", Reserved::Segment).to_string(), "a%7Db%3Ac");
//! assert_eq!(escaped("evil\0\n", Reserved::Segment).to_string(), "evil%00%0A");
//! assert_eq!(escaped("100%", Reserved::HashTag).len(), 6);
//! ```

use core::fmt;

/// Which structural characters the encoded text must not contain, besides
/// `%`, the control characters and the braces (always escaped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Reserved {
    /// A segment of a `:`-separated key (scopes, delivery keys): `:` is
    /// escaped too.
    Segment,
    /// The inside of a hash tag (`<prefix>:{<text>}:...`, the rate
    /// limiters' keys): the closing brace ends it, so `:` may stay.
    HashTag,
}

/// `text` as the codec writes it into a key; see the module documentation.
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a> {
    text: &'a str,
    reserved: Reserved,
}

/// `text` encoded for a key part of kind `reserved`.
pub const fn escaped(text: &str, reserved: Reserved) -> Escaped<'_> {
    Escaped { text, reserved }
}

impl Escaped<'_> {
    /// Whether `c` is written as `%XX`.
    fn escapes(&self, c: char) -> bool {
        match c {
            '%' | '{' | '}' => true,
            ':' => self.reserved == Reserved::Segment,
            c => c.is_ascii_control(),
        }
    }

    /// The encoded length in bytes.
    pub fn len(&self) -> usize {
        self.text
            .chars()
            .map(|c| if self.escapes(c) { 3 } else { c.len_utf8() })
            .fold(0usize, usize::saturating_add)
    }

    /// Whether the encoded text is empty (exactly when the text is).
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let mut rest = self.text;
        // Runs of characters written as they are go out in one call.
        while let Some((i, c)) = rest.char_indices().find(|&(_, c)| self.escapes(c)) {
            let (plain, tail) = rest.split_at(i);
            f.write_str(plain)?;
            // Only ASCII characters are escaped: `c` is one byte.
            let byte = u32::from(c);
            let hi = HEX.get((byte >> 4) as usize & 0xf).copied().unwrap_or(b'0');
            let lo = HEX.get(byte as usize & 0xf).copied().unwrap_or(b'0');
            f.write_str("%")?;
            f.write_str(core::str::from_utf8(&[hi, lo]).unwrap_or("00"))?;
            rest = tail.get(c.len_utf8()..).unwrap_or("");
        }
        f.write_str(rest)
    }
}
