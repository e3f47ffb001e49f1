//! How elements, errors and failed elements become flash records.

use core::fmt;

use guard_core::dlq::FailedElement;
use guard_core::time::Instant;

/// A value that can be written to flash as bytes and read back.
///
/// `decode(encode(x)) == x` for every value; `decode` of anything else
/// returns an error, never a value made up from it.
///
/// ```
/// use guard_embassy::flash::FlashRecord;
///
/// let mut buf = [0u8; 8];
/// let len = 7u32.encode(&mut buf).unwrap();
/// assert_eq!(u32::decode(&buf[..len]).unwrap(), 7);
/// ```
pub trait FlashRecord: Sized {
    /// Writes the value at the start of `buf`; returns the bytes written,
    /// or [`RecordError::TooLong`] if they do not fit.
    fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError>;

    /// Reads back a value that [`encode`](Self::encode) wrote: all of
    /// `bytes`, no more, no less.
    fn decode(bytes: &[u8]) -> Result<Self, RecordError>;
}

/// Why a record could not be written or read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum RecordError {
    /// The value needs more bytes than the record has room for.
    TooLong,
    /// The bytes end before the value does.
    Truncated,
    /// The bytes are not a value of this type (wrong length, version or
    /// content); the `&str` names what is wrong.
    Invalid(&'static str),
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::TooLong => f.write_str("the value does not fit the record"),
            RecordError::Truncated => f.write_str("the record ends before its value does"),
            RecordError::Invalid(what) => write!(f, "the record is not a valid value: {what}"),
        }
    }
}

impl core::error::Error for RecordError {}

/// Copies `bytes` to the start of `buf`.
fn put(buf: &mut [u8], bytes: &[u8]) -> Result<usize, RecordError> {
    buf.get_mut(..bytes.len())
        .ok_or(RecordError::TooLong)?
        .copy_from_slice(bytes);
    Ok(bytes.len())
}

macro_rules! int_record {
    ($($t:ty),*) => {$(
        impl FlashRecord for $t {
            fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
                put(buf, &self.to_le_bytes())
            }

            fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
                let bytes = bytes
                    .try_into()
                    .map_err(|_| RecordError::Invalid("not the integer's length"))?;
                Ok(<$t>::from_le_bytes(bytes))
            }
        }
    )*};
}

int_record!(u8, u16, u32, u64, i32, i64);

impl FlashRecord for () {
    fn encode(&self, _buf: &mut [u8]) -> Result<usize, RecordError> {
        Ok(0)
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err(RecordError::Invalid("bytes where none belong"))
        }
    }
}

impl<const N: usize> FlashRecord for heapless::Vec<u8, N> {
    fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
        put(buf, self)
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        heapless::Vec::from_slice(bytes).map_err(|_| RecordError::Invalid("longer than the Vec"))
    }
}

impl<const N: usize> FlashRecord for heapless::String<N> {
    fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
        put(buf, self.as_bytes())
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let text = core::str::from_utf8(bytes).map_err(|_| RecordError::Invalid("not UTF-8"))?;
        heapless::String::try_from(text).map_err(|_| RecordError::Invalid("longer than the String"))
    }
}

/// The layout's version: the first byte of every failed element's record,
/// so a later layout can tell old records apart.
const FAILED_V1: u8 = 1;
/// The header: version, flags, attempts (u32), failed at (u64 ns), the
/// element's length and the error's (u16 each), little-endian. Both
/// lengths are written, so a record cut short never reads as another.
const HEADER: usize = 1 + 1 + 4 + 8 + 2 + 2;
/// The flag of a record that holds an error after its element.
const HAS_ERROR: u8 = 1;

impl<T: FlashRecord, E: FlashRecord> FlashRecord for FailedElement<T, E> {
    fn encode(&self, buf: &mut [u8]) -> Result<usize, RecordError> {
        let (header, rest) = buf
            .split_at_mut_checked(HEADER)
            .ok_or(RecordError::TooLong)?;
        let element_len = self.element().encode(rest)?;
        let error_len = match self.error() {
            Some(error) => error.encode(&mut rest[element_len..])?,
            None => 0,
        };
        let element_len16 = u16::try_from(element_len).map_err(|_| RecordError::TooLong)?;
        let error_len16 = u16::try_from(error_len).map_err(|_| RecordError::TooLong)?;
        header[0] = FAILED_V1;
        header[1] = if self.error().is_some() { HAS_ERROR } else { 0 };
        header[2..6].copy_from_slice(&self.attempts().to_le_bytes());
        header[6..14].copy_from_slice(&self.failed_at().as_nanos().to_le_bytes());
        header[14..16].copy_from_slice(&element_len16.to_le_bytes());
        header[16..18].copy_from_slice(&error_len16.to_le_bytes());
        Ok(HEADER + element_len + error_len)
    }

    fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let (header, rest) = bytes
            .split_at_checked(HEADER)
            .ok_or(RecordError::Truncated)?;
        if header[0] != FAILED_V1 {
            return Err(RecordError::Invalid("not a failed element of layout 1"));
        }
        let has_error = match header[1] {
            0 => false,
            HAS_ERROR => true,
            _ => return Err(RecordError::Invalid("unknown flags")),
        };
        let attempts = u32::from_le_bytes([header[2], header[3], header[4], header[5]]);
        let mut nanos = [0; 8];
        nanos.copy_from_slice(&header[6..14]);
        let nanos = u64::from_le_bytes(nanos);
        let len_at = |at: usize| usize::from(u16::from_le_bytes([header[at], header[at + 1]]));
        let (element_len, error_len) = (len_at(14), len_at(16));
        if rest.len() < element_len + error_len {
            return Err(RecordError::Truncated);
        }
        if rest.len() > element_len + error_len {
            return Err(RecordError::Invalid("bytes past the element and the error"));
        }
        let (element, error) = rest.split_at(element_len);
        let error = match (has_error, error_len) {
            (true, _) => Some(E::decode(error)?),
            (false, 0) => None,
            (false, _) => return Err(RecordError::Invalid("an error's bytes without its flag")),
        };
        Ok(FailedElement::new(
            T::decode(element)?,
            error,
            attempts,
            Instant::from_nanos(nanos),
        ))
    }
}
