//! Scope and key encoding: distinct inputs never give the same key, and
//! no key holds a hash tag, a NUL or another control character.
#![no_main]

use arbitrary::Arbitrary;
use guard_core::lock::{DEFAULT_PREFIX, Scope, once_key};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone)]
struct KeyInput {
    component: String,
    segments: Vec<(u8, String)>,
    key: String,
}

const LABELS: [&str; 4] = ["owner", "chain", "router", "instance"];

/// The key, and the input as the encoding sees it (empty segments absent).
fn encode(input: &KeyInput) -> Option<(String, (String, Vec<(usize, String)>, String))> {
    let mut scope = Scope::new(&input.component).ok()?;
    for (label, value) in &input.segments {
        scope = scope.segment(LABELS[usize::from(*label) % 4], value).ok()?;
    }
    let key = once_key(DEFAULT_PREFIX, &scope, &input.key).ok()?;
    let canonical = input
        .segments
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(l, v)| (usize::from(*l) % 4, v.clone()))
        .collect();
    Some((
        key.to_string(),
        (input.component.clone(), canonical, input.key.clone()),
    ))
}

fuzz_target!(|pair: (KeyInput, KeyInput)| {
    if let (Some((ka, ia)), Some((kb, ib))) = (encode(&pair.0), encode(&pair.1)) {
        if ka == kb {
            assert_eq!(ia, ib, "two inputs share the key {ka}");
        }
        assert!(
            !ka.contains('{') && !ka.contains('}'),
            "no hash tag in {ka}"
        );
        assert!(
            !ka.chars().any(|c| c.is_ascii_control()),
            "no NUL or control character in {ka:?}"
        );
    }
});
