//! The disk queue: order, persistence across a reopen, the bound that
//! hands a record back, a torn or damaged tail cut and counted, a torn
//! cursor that re-reads rather than skips, one process per directory.

use std::fs::{self, OpenOptions};
use std::path::Path;
use std::time::Duration;

use guard_std::disk_queue::{AppendError, DiskQueue, QueueError, QueueSettings, SyncPolicy};

fn settings(max_bytes: u64) -> QueueSettings {
    QueueSettings::new(max_bytes, SyncPolicy::Every(Duration::from_millis(50))).unwrap()
}

fn record(i: u32) -> Vec<u8> {
    format!("record {i:05}").into_bytes()
}

/// Reads every record left, forwarding each.
fn drain(queue: &DiskQueue) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(r) = queue.peek().unwrap() {
        out.push(r);
        queue.advance().unwrap();
    }
    out
}

fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut s: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    s.sort();
    s
}

#[test]
fn records_come_back_in_order_across_segments_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20).with_segment_bytes(256).unwrap();
    {
        let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
        assert_eq!(recovery.pending, 0);
        for i in 0..100 {
            queue.append(&record(i)).unwrap();
        }
        assert!(segments(dir.path()).len() > 5, "small segments roll");
        for i in 0..40 {
            assert_eq!(queue.peek().unwrap(), Some(record(i)));
            // Peeking again gives the same record until it is forwarded.
            assert_eq!(queue.peek().unwrap(), Some(record(i)));
            queue.advance().unwrap();
        }
        assert_eq!(queue.stats().pending, 60);
    }
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.pending, 60);
    assert_eq!(recovery.lost_bytes, 0);
    assert!(!recovery.cursor_reset);
    let rest = drain(&queue);
    assert_eq!(rest, (40..100).map(record).collect::<Vec<_>>());
    // Forwarded segments are gone: the newest one is left.
    assert_eq!(segments(dir.path()).len(), 1);
}

#[test]
fn a_full_queue_hands_the_record_back_and_takes_it_once_forwarding_frees_room() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(4096).with_segment_bytes(512).unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
    let mut taken = 0u32;
    let refused = loop {
        match queue.append(&record(taken)) {
            Ok(()) => taken += 1,
            Err(e) => break e,
        }
    };
    assert!(
        matches!(refused, AppendError::Full { max: 4096, .. }),
        "{refused}"
    );
    assert!(refused.is_back_pressure());
    assert!(queue.stats().bytes <= 4096);
    // A record larger than the whole queue can never fit.
    let huge = vec![0u8; 5000];
    assert!(matches!(
        queue.append(&huge),
        Err(AppendError::TooLarge { len: 5000, .. })
    ));
    // Waiting for space ends once a segment is forwarded.
    let waiter = {
        let queue = queue.clone();
        std::thread::spawn(move || futures_lite::future::block_on(queue.space(14)))
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(!waiter.is_finished(), "no room yet");
    let mut forwarded = 0;
    while !waiter.is_finished() {
        queue.peek().unwrap().unwrap();
        queue.advance().unwrap();
        forwarded += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    waiter.join().unwrap();
    queue.append(&record(taken)).unwrap();
    let rest = drain(&queue);
    assert_eq!(
        rest,
        (forwarded..=taken).map(record).collect::<Vec<_>>(),
        "nothing lost, nothing out of order"
    );
}

#[test]
fn a_consumer_that_keeps_up_never_fills_the_queue_with_forwarded_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // One segment as large as the whole queue: only starting it afresh
    // gives its forwarded bytes back.
    let settings = settings(4096).with_segment_bytes(4096).unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
    for i in 0..2000 {
        queue.append(&record(i)).unwrap();
        assert_eq!(queue.peek().unwrap(), Some(record(i)));
        queue.advance().unwrap();
    }
    assert!(queue.stats().bytes <= 4096);
    assert_eq!(segments(dir.path()).len(), 1);
}

#[test]
fn a_torn_tail_is_cut_and_counted_and_appends_continue_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20);
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..10 {
            queue.append(&record(i)).unwrap();
        }
    }
    // A power loss tears the last frame: 5 of its bytes never written.
    let segment = segments(dir.path()).pop().unwrap();
    let len = fs::metadata(&segment).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.pending, 9);
    let frame = len / 10;
    assert_eq!(recovery.lost_bytes, frame - 5);
    assert_eq!(recovery.damaged_segments, 1);
    queue.append(&record(10)).unwrap();
    let mut expected: Vec<_> = (0..9).map(record).collect();
    expected.push(record(10));
    assert_eq!(drain(&queue), expected);
}

#[test]
fn a_damaged_record_ends_its_segment_at_open_and_nothing_after_it_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20);
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..10 {
            queue.append(&record(i)).unwrap();
        }
    }
    let segment = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    let frame = bytes.len() / 10;
    // A byte of the 7th record's payload flipped.
    bytes[6 * frame + 10] ^= 0x40;
    fs::write(&segment, &bytes).unwrap();
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.pending, 6);
    assert_eq!(recovery.lost_bytes, 4 * frame as u64);
    assert_eq!(drain(&queue), (0..6).map(record).collect::<Vec<_>>());
}

#[test]
fn a_segment_gone_or_emptied_before_it_was_forwarded_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20).with_segment_bytes(128).unwrap();
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..40 {
            queue.append(&record(i)).unwrap();
        }
    }
    let all = segments(dir.path());
    assert!(all.len() >= 4, "{all:?}");
    // One removed, one emptied, neither forwarded.
    fs::remove_file(&all[1]).unwrap();
    fs::write(&all[2], b"").unwrap();
    let (_, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.missing_segments, 1, "{recovery:?}");
    assert_eq!(recovery.damaged_segments, 1, "{recovery:?}");
    // The segment the cursor is in, removed.
    drop(fs::remove_file(&all[0]));
    let (_, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.missing_segments, 2, "{recovery:?}");
}

#[test]
fn a_torn_cursor_reads_again_rather_than_skips() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20);
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..5 {
            queue.append(&record(i)).unwrap();
        }
        for _ in 0..3 {
            queue.peek().unwrap();
            queue.advance().unwrap();
        }
    }
    let cursor = dir.path().join("cursor");
    let mut bytes = fs::read(&cursor).unwrap();
    bytes[3] ^= 1;
    fs::write(&cursor, &bytes).unwrap();
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert!(recovery.cursor_reset);
    assert_eq!(drain(&queue), (0..5).map(record).collect::<Vec<_>>());
}

#[test]
fn a_cursor_between_records_reads_from_its_segment_s_start() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20);
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..5 {
            queue.append(&record(i)).unwrap();
        }
    }
    // A whole cursor file, but 3 bytes into the first record.
    let segment = segments(dir.path()).pop().unwrap();
    let id: u64 = segment
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&3u64.to_le_bytes());
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    fs::write(dir.path().join("cursor"), &bytes).unwrap();
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert!(recovery.cursor_reset);
    assert_eq!(recovery.pending, 5);
    assert_eq!(drain(&queue), (0..5).map(record).collect::<Vec<_>>());
}

#[test]
fn every_write_sync_keeps_the_same_order_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let settings = QueueSettings::new(1 << 16, SyncPolicy::EveryWrite)
        .unwrap()
        .with_segment_bytes(300)
        .unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
    for i in 0..50 {
        queue.append(&record(i)).unwrap();
    }
    let stats = queue.stats();
    assert_eq!((stats.pending, stats.appended), (50, 50));
    assert_eq!(drain(&queue), (0..50).map(record).collect::<Vec<_>>());
    assert_eq!(queue.stats().forwarded, 50);
}

#[test]
fn one_process_holds_a_queue_directory() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings(1 << 20)).unwrap();
    let second = DiskQueue::open(dir.path(), settings(1 << 20));
    assert!(matches!(second, Err(QueueError::Locked(_))));
    drop(queue);
    DiskQueue::open(dir.path(), settings(1 << 20)).unwrap();
}

#[test]
fn settings_out_of_range_are_errors_that_say_so() {
    let small = QueueSettings::new(100, SyncPolicy::EveryWrite).unwrap_err();
    assert!(small.to_string().contains("at least 4096"), "{small}");
    let zero = QueueSettings::new(1 << 20, SyncPolicy::Every(Duration::ZERO)).unwrap_err();
    assert!(zero.to_string().contains("every write"), "{zero}");
    let segment = settings(4096).with_segment_bytes(5000).unwrap_err();
    assert!(segment.to_string().contains("segment_bytes"), "{segment}");
}

#[test]
fn a_waiting_reader_wakes_at_an_append() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings(1 << 20)).unwrap();
    let reader = {
        let queue = queue.clone();
        std::thread::spawn(move || {
            futures_lite::future::block_on(queue.appended());
            queue.peek().unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    queue.append(b"hello").unwrap();
    assert_eq!(reader.join().unwrap(), Some(b"hello".to_vec()));
}

#[test]
fn records_read_ahead_of_the_head_are_advanced_past_in_order_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(1 << 20).with_segment_bytes(256).unwrap();
    {
        let (queue, _) = DiskQueue::open(dir.path(), settings).unwrap();
        for i in 0..100 {
            queue.append(&record(i)).unwrap();
        }
        for i in 0..7 {
            assert_eq!(queue.read_next().unwrap(), Some(record(i)));
        }
        assert_eq!(queue.handed_out(), 7);
        for _ in 0..3 {
            queue.advance().unwrap();
        }
        assert_eq!(queue.stats().forwarded, 3);
        assert_eq!(
            queue.read_next().unwrap(),
            Some(record(7)),
            "after the window"
        );
        queue.rewind();
        assert_eq!(
            queue.read_next().unwrap(),
            Some(record(3)),
            "the head again"
        );
        assert_eq!(
            queue.peek().unwrap(),
            Some(record(3)),
            "peek starts again too"
        );
        // A window of five, its oldest advanced past each time: through
        // every segment, in order.
        let mut advanced = (0..3).map(record).collect::<Vec<_>>();
        let mut handed = vec![record(3)];
        while advanced.len() < 50 {
            while handed.len() < 5 {
                handed.push(queue.read_next().unwrap().unwrap());
            }
            queue.advance().unwrap();
            advanced.push(handed.remove(0));
        }
        assert_eq!(advanced, (0..50).map(record).collect::<Vec<_>>());
        assert_eq!(
            queue.handed_out(),
            handed.len(),
            "read ahead, not forwarded"
        );
        assert_eq!(handed.len(), 4);
    }
    // Reopened: what was handed out and not advanced past is still there.
    let (queue, recovery) = DiskQueue::open(dir.path(), settings).unwrap();
    assert_eq!(recovery.pending, 50);
    let mut rest = Vec::new();
    while let Some(r) = queue.read_next().unwrap() {
        rest.push(r);
        queue.advance().unwrap();
    }
    assert_eq!(rest, (50..100).map(record).collect::<Vec<_>>());
    assert_eq!(segments(dir.path()).len(), 1, "forwarded segments are gone");
}

#[test]
fn a_record_damaged_ahead_of_the_head_ends_the_window_until_it_is_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let (queue, _) = DiskQueue::open(dir.path(), settings(1 << 20)).unwrap();
    for i in 0..10 {
        queue.append(&record(i)).unwrap();
    }
    // The 7th record's payload damaged on disk while the queue is open.
    let segment = segments(dir.path()).pop().unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&segment)
        .unwrap();
    let frame = fs::metadata(&segment).unwrap().len() / 10;
    let mut byte = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, 6 * frame + 10).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[byte[0] ^ 0x40], 6 * frame + 10).unwrap();
    let mut window = Vec::new();
    while let Some(r) = queue.read_next().unwrap() {
        window.push(r);
    }
    assert_eq!(window, (0..6).map(record).collect::<Vec<_>>());
    assert_eq!(
        queue.stats().damaged_bytes,
        0,
        "nothing skipped ahead of the head"
    );
    for _ in 0..6 {
        queue.advance().unwrap();
    }
    // At the head now: skipped, counted, as a peek would.
    assert_eq!(queue.read_next().unwrap(), None);
    assert_eq!(queue.stats().damaged_bytes, 4 * frame);
}
