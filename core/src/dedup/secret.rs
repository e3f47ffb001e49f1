//! Hashing an outsider cannot aim: SipHash-1-3 under a secret key.

use core::fmt;
use core::hash::BuildHasher;

use siphasher::sip::SipHasher13;

/// A [`BuildHasher`] keyed by a 128-bit secret: SipHash-1-3, a keyed
/// pseudo-random function, so whoever does not know the key cannot choose
/// items that collide (fill a Bloom filter's bits for an item never sent,
/// or crowd a table's slots). Replicas that share a filter share its key;
/// `Debug` never shows it.
///
/// ```
/// use core::hash::BuildHasher;
/// use guard_core::dedup::SecretHashState;
///
/// let a = SecretHashState::new([7; 16]);
/// assert_eq!(a.hash_one("order-1"), SecretHashState::new([7; 16]).hash_one("order-1"));
/// assert_ne!(a.hash_one("order-1"), SecretHashState::new([8; 16]).hash_one("order-1"));
/// assert_eq!(format!("{a:?}"), "SecretHashState { key: \"(secret)\" }");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SecretHashState {
    k0: u64,
    k1: u64,
}

impl SecretHashState {
    /// The hasher of `key`.
    pub const fn new(key: [u8; 16]) -> Self {
        let [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p] = key;
        SecretHashState {
            k0: u64::from_le_bytes([a, b, c, d, e, f, g, h]),
            k1: u64::from_le_bytes([i, j, k, l, m, n, o, p]),
        }
    }

    /// SipHash-1-3 of `bytes` under the key, the same on every platform
    /// and version (what a filter shared over time and processes needs).
    pub fn hash_bytes(&self, bytes: &[u8]) -> u64 {
        use core::hash::Hasher as _;
        let mut hasher = self.build_hasher();
        hasher.write(bytes);
        hasher.finish()
    }
}

impl BuildHasher for SecretHashState {
    type Hasher = SipHasher13;

    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.k0, self.k1)
    }
}

impl fmt::Debug for SecretHashState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretHashState")
            .field("key", &"(secret)")
            .finish()
    }
}
