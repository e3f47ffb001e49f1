//! Dead letters on disk: kept until removed, bounded, a torn tail cut and
//! counted, shared by a process that appends and one that removes.

use std::fs::{self, OpenOptions};

use guard_std::dead_letter_log::DeadLetterLog;
use guard_std::disk_queue::AppendError;

#[test]
fn letters_are_kept_in_order_until_removed_or_purged() {
    let dir = tempfile::tempdir().unwrap();
    let (log, lost) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(lost, 0);
    let ids: Vec<u64> = (0..5)
        .map(|i| log.append(format!("letter {i}").as_bytes()).unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    assert_eq!(log.remove(&[ids[1], ids[3], 12345]).unwrap(), 2);
    let left: Vec<(u64, Vec<u8>)> = log
        .list()
        .unwrap()
        .into_iter()
        .map(|l| (l.id, l.body))
        .collect();
    assert_eq!(
        left,
        [0, 2, 4]
            .map(|i| (ids[i], format!("letter {i}").into_bytes()))
            .to_vec()
    );
    // Reopened (a restart): the same letters.
    drop(log);
    let (log, _) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(log.list().unwrap().len(), 3);
    assert_eq!(log.purge().unwrap(), 3);
    assert!(log.list().unwrap().is_empty());
}

#[test]
fn a_full_log_hands_the_letter_back_and_takes_it_after_a_removal() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = DeadLetterLog::open(dir.path(), 4096).unwrap();
    let body = [7u8; 1000];
    let mut ids = Vec::new();
    let full = loop {
        match log.append(&body) {
            Ok(id) => ids.push(id),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(full, AppendError::Full { max: 4096, .. }),
        "{full}"
    );
    assert_eq!(ids.len(), 4);
    assert!(fs::metadata(dir.path().join("letters")).unwrap().len() <= 4096);
    log.remove(&ids[..1]).unwrap();
    log.append(&body).unwrap();
}

#[test]
fn a_torn_last_letter_is_cut_at_open_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, _) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
        log.append(b"whole").unwrap();
        log.append(b"torn by a crash").unwrap();
    }
    let path = dir.path().join("letters");
    let len = fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let (log, lost) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(lost, 8 + 8 + 15 - 4);
    log.append(b"after").unwrap();
    let bodies: Vec<Vec<u8>> = log.list().unwrap().into_iter().map(|l| l.body).collect();
    assert_eq!(bodies, [b"whole".to_vec(), b"after".to_vec()]);
}

#[test]
fn a_tool_leaves_a_torn_tail_for_the_writer_to_cut_and_count() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (log, _) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
        log.append(b"one").unwrap();
        log.append(b"two").unwrap();
        log.append(b"torn by a crash").unwrap();
    }
    let path = dir.path().join("letters");
    let len = fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let (tool, unreadable) = DeadLetterLog::inspect(dir.path(), 1 << 20).unwrap();
    assert_eq!(unreadable, 27);
    let first = tool.list().unwrap()[0].id;
    assert_eq!(tool.remove(&[first]).unwrap(), 1);
    // The writer, opened next, still finds the torn bytes, and counts them.
    let (log, lost) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(lost, 27);
    let bodies: Vec<Vec<u8>> = log.list().unwrap().into_iter().map(|l| l.body).collect();
    assert_eq!(bodies, [b"two".to_vec()]);
    // A tool never makes a log that is not there.
    assert!(DeadLetterLog::inspect(dir.path().join("typo"), 1 << 20).is_err());
    assert!(!dir.path().join("typo").exists());
}

#[test]
fn one_handle_removes_while_another_appends() {
    let dir = tempfile::tempdir().unwrap();
    let (writer, _) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    let (tool, _) = DeadLetterLog::open(dir.path(), 1 << 20).unwrap();
    let appending = std::thread::spawn(move || {
        (0..200)
            .map(|i| writer.append(format!("{i}").as_bytes()).unwrap())
            .collect::<Vec<u64>>()
    });
    let mut removed = Vec::new();
    while !appending.is_finished() {
        let letters = tool.list().unwrap();
        let ids: Vec<u64> = letters.iter().map(|l| l.id).take(3).collect();
        tool.remove(&ids).unwrap();
        removed.extend(ids);
    }
    let appended = appending.join().unwrap();
    let mut seen: Vec<u64> = removed;
    seen.extend(tool.list().unwrap().iter().map(|l| l.id));
    seen.sort_unstable();
    assert_eq!(seen, appended, "every letter removed once or still there");
}
