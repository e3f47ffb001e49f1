//! The key codec: any text from outside is encoded injectively, and what it
//! writes holds nothing a backend refuses or that carries structure.

use guard_core::key::{Reserved, escaped};
use guard_core::lock::{DEFAULT_PREFIX, Scope, claim_key, once_key};
use proptest::prelude::*;

/// The codec's inverse: `%XX` back to its byte. `None` for text the codec
/// cannot have written.
fn decode(encoded: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut bytes = encoded.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// Text an attacker would send: structure, controls, NUL, non-ASCII.
fn hostile_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just('%'),
            Just(':'),
            Just('{'),
            Just('}'),
            Just('\0'),
            Just('\n'),
            Just('\r'),
            Just('\u{7f}'),
            Just('é'),
            Just('\u{1F600}'),
            any::<char>(),
            prop::char::range('a', 'c'),
        ],
        0..24,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn reserved() -> impl Strategy<Value = Reserved> {
    prop_oneof![Just(Reserved::Segment), Just(Reserved::HashTag)]
}

proptest! {
    #[test]
    fn decoding_gives_the_text_back(text in hostile_text(), reserved in reserved()) {
        let encoded = escaped(&text, reserved).to_string();
        prop_assert_eq!(decode(&encoded), Some(text.clone()));
        prop_assert_eq!(escaped(&text, reserved).len(), encoded.len());
    }

    #[test]
    fn the_encoding_holds_no_structure_nul_or_control(text in hostile_text(), reserved in reserved()) {
        let encoded = escaped(&text, reserved).to_string();
        prop_assert!(!encoded.contains(['{', '}']), "{encoded:?}");
        prop_assert!(!encoded.chars().any(|c| c.is_ascii_control()), "{encoded:?}");
        if reserved == Reserved::Segment {
            prop_assert!(!encoded.contains(':'), "{encoded:?}");
        }
    }

    #[test]
    fn distinct_delivery_keys_never_meet(a in hostile_text(), b in hostile_text()) {
        prop_assume!(a != b);
        let scope = Scope::new("hooks").unwrap();
        let (ka, kb) = (once_key(DEFAULT_PREFIX, &scope, &a), once_key(DEFAULT_PREFIX, &scope, &b));
        if let (Ok(ka), Ok(kb)) = (ka, kb) {
            prop_assert_ne!(ka, kb);
        }
    }

    #[test]
    fn a_delivery_key_never_reaches_another_scope(
        owner_a in hostile_text(), key_a in hostile_text(),
        owner_b in hostile_text(), key_b in hostile_text(),
    ) {
        prop_assume!((&owner_a, &key_a) != (&owner_b, &key_b));
        let scope = |owner: &str| Scope::new("hooks").unwrap().segment("owner", owner).unwrap();
        if let (Ok(a), Ok(b)) = (
            claim_key(DEFAULT_PREFIX, &scope(&owner_a), &key_a),
            claim_key(DEFAULT_PREFIX, &scope(&owner_b), &key_b),
        ) {
            prop_assert_ne!(a, b);
        }
    }
}

#[test]
fn nul_and_line_breaks_become_escapes_every_locker_stores() {
    let scope = Scope::new("hooks").unwrap();
    let key = once_key(DEFAULT_PREFIX, &scope, "evt\0\r\n1").unwrap();
    assert_eq!(key.as_str(), "guard:once:hooks:evt%00%0D%0A1");
}
