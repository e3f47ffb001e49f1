//! `frame`: a log reads back as the records appended, in order, up to the
//! first frame a crash tore or a bad write damaged, and never as a record
//! that was not appended.

use guard_core::frame::{self, HEADER_LEN, Header, Next, Tail};
use proptest::prelude::*;

fn framed(records: &[Vec<u8>]) -> (Vec<u8>, Vec<usize>) {
    let mut log = Vec::new();
    let mut starts = Vec::new();
    for r in records {
        starts.push(log.len());
        log.extend_from_slice(&Header::of(r).unwrap().to_bytes());
        log.extend_from_slice(r);
    }
    (log, starts)
}

fn read_all(log: &[u8]) -> (Vec<Vec<u8>>, Tail, usize) {
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        match frame::next(log, at) {
            Next::Record { record, next } => {
                out.push(record.to_vec());
                at = next;
            }
            Next::End(tail) => return (out, tail, at),
        }
    }
}

fn records() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..12)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    /// A whole log reads back as appended, its tail clean.
    #[test]
    fn a_whole_log_reads_back_as_appended(records in records()) {
        let (log, _) = framed(&records);
        let (read, tail, at) = read_all(&log);
        prop_assert_eq!(&read, &records);
        prop_assert_eq!(tail, Tail::Clean);
        prop_assert_eq!(at, log.len());
        let scan = frame::scan(&log);
        prop_assert_eq!(scan.records, records.len() as u64);
        prop_assert_eq!(scan.lost(log.len()), 0);
    }

    /// Cut anywhere (a torn write): the records whose frames end before
    /// the cut, and the cut counted from the last whole frame.
    #[test]
    fn a_torn_log_keeps_every_whole_frame_before_the_tear(records in records(), cut in any::<prop::sample::Index>()) {
        let (log, starts) = framed(&records);
        let cut = cut.index(log.len() + 1);
        let whole = starts
            .iter()
            .zip(&records)
            .take_while(|(start, r)| *start + HEADER_LEN + r.len() <= cut)
            .count();
        let (read, tail, _) = read_all(&log[..cut]);
        prop_assert_eq!(&read[..], &records[..whole]);
        let scan = frame::scan(&log[..cut]);
        let valid = starts.get(whole).copied().unwrap_or(log.len()).min(cut);
        prop_assert_eq!(scan.valid, valid);
        prop_assert_eq!(scan.lost(cut), cut - valid);
        prop_assert_eq!(tail, if cut == valid { Tail::Clean } else { Tail::Truncated });
    }

    /// A byte damaged anywhere: the records before the damaged frame, then
    /// the end, never a record that was not appended.
    #[test]
    fn a_damaged_frame_ends_the_log_before_it(records in records(), at in any::<prop::sample::Index>(), flip in 1u8..) {
        let (mut log, starts) = framed(&records);
        prop_assume!(!log.is_empty());
        let at = at.index(log.len());
        log[at] ^= flip;
        let damaged = starts.iter().rposition(|s| *s <= at).unwrap();
        let (read, tail, end) = read_all(&log);
        prop_assert_eq!(&read[..], &records[..damaged]);
        prop_assert_eq!(end, starts[damaged]);
        prop_assert_ne!(tail, Tail::Clean);
    }

    /// Any bytes at all: the scan ends, inside the log, without a panic.
    #[test]
    fn any_bytes_scan_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let scan = frame::scan(&bytes);
        prop_assert!(scan.valid <= bytes.len());
    }
}
