//! The RESP2 codec: the parser never panics on any input, answers a
//! frame only when all of it has arrived (every shorter prefix is
//! incomplete), reports the bytes it used, and reads back every command
//! the encoder writes.
#![no_main]

use guard_embassy::resp::{CommandWriter, Frame, parse};
use libfuzzer_sys::fuzz_target;

/// Checks a parsed frame's invariants; returns how many frames it holds.
fn walk(frame: Frame<'_>) -> usize {
    match frame {
        Frame::Array(Some(array)) => {
            let mut count = 0;
            let mut inner = 0;
            for element in array.iter() {
                count += 1;
                inner += walk(element);
            }
            assert_eq!(count, array.len(), "array yields its announced length");
            1 + inner
        }
        _ => 1,
    }
}

fuzz_target!(|data: &[u8]| {
    // Any input: a frame, incomplete, or an error; never a panic.
    if let Ok(Some((frame, used))) = parse(data) {
        assert!(used <= data.len() && used > 0);
        assert_eq!(parse(&data[..used]), Ok(Some((frame, used))));
        for end in [0, used / 2, used - 1] {
            assert_eq!(
                parse(&data[..end]),
                Ok(None),
                "prefix of {end} of {used} bytes"
            );
        }
        walk(frame);
    }

    // The input split at zero bytes as a command's arguments: encoded,
    // then parsed back as an array of bulk strings.
    let args: Vec<&[u8]> = data.split(|&b| b == 0).take(16).collect();
    let mut buf = vec![0u8; data.len() * 2 + 128];
    let mut w = CommandWriter::new(&mut buf, args.len()).unwrap();
    for arg in &args {
        w = w.bytes(arg).unwrap();
    }
    let len = w.finish();
    let Ok(Some((Frame::Array(Some(array)), used))) = parse(&buf[..len]) else {
        panic!("encoded command does not parse back");
    };
    assert_eq!(used, len);
    let back: Vec<&[u8]> = array
        .iter()
        .map(|f| match f {
            Frame::Bulk(Some(bytes)) => bytes,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(back, args);
});
