//! Tokens: proof of holding a lock, with a fencing number.

use core::fmt;

/// The random part of a token: 16 bytes, shown as 32 lowercase hex digits
/// (the original's format).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TokenId(pub [u8; 16]);

impl TokenId {
    /// The 32 hex digits, without allocating.
    pub fn to_hex(&self) -> [u8; 32] {
        // A nibble is 0..=15, always a hex digit.
        let digit = |nibble: u8| char::from_digit(u32::from(nibble), 16).map_or(b'0', |c| c as u8);
        let mut out = [0u8; 32];
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0) {
            if let [hi, lo] = pair {
                *hi = digit(byte >> 4);
                *lo = digit(byte & 0x0f);
            }
        }
        out
    }

    /// Parses 32 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<TokenId> {
        let bytes = hex.as_bytes();
        if bytes.len() != 32 {
            return None;
        }
        let mut id = [0u8; 16];
        for (byte, pair) in id.iter_mut().zip(bytes.chunks_exact(2)) {
            let digit = |c: u8| char::from(c).to_digit(16);
            let (hi, lo) = (digit(*pair.first()?)?, digit(*pair.get(1)?)?);
            *byte = u8::try_from(hi.checked_mul(16)?.checked_add(lo)?).ok()?;
        }
        Some(TokenId(id))
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.to_hex();
        // Hex digits are ASCII, so this never fails.
        f.write_str(core::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenId({self})")
    }
}

/// Proof of holding a lock: a random id (compared on unlock and renew) and
/// the grant's fencing number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Token {
    id: TokenId,
    fence: u64,
}

impl Token {
    /// A token with `id` for the grant numbered `fence`.
    pub const fn new(id: TokenId, fence: u64) -> Self {
        Token { id, fence }
    }

    /// The random id.
    pub const fn id(&self) -> &TokenId {
        &self.id
    }

    /// The fencing number: greater than that of every earlier grant of the
    /// same key. Pass it to the protected resource with each side effect.
    pub const fn fence(&self) -> u64 {
        self.fence
    }
}
