//! The disk queue and the dead-letter log keep what producers sent: their
//! directories are 0700 and files 0600, a symlinked directory is refused,
//! and a link planted in place of any of their files is never followed
//! (its target is neither truncated, overwritten nor read).

use std::fs;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;
use std::time::Duration;

use guard_std::dead_letter_log::DeadLetterLog;
use guard_std::disk_queue::{DiskQueue, QueueSettings, SyncPolicy};

fn settings() -> QueueSettings {
    QueueSettings::new(1 << 20, SyncPolicy::Every(Duration::from_millis(50))).unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn directories_are_0700_and_files_0600() {
    let root = tempfile::tempdir().unwrap();
    let queue_dir = root.path().join("state/queue");
    let (queue, _) = DiskQueue::open(&queue_dir, settings()).unwrap();
    queue.append(b"secret payload").unwrap();
    queue.sync().unwrap();
    let letters_dir = root.path().join("state/letters");
    let (log, _) = DeadLetterLog::open(&letters_dir, 1 << 20).unwrap();
    log.append(b"secret letter").unwrap();
    for dir in [
        root.path().join("state"),
        queue_dir.clone(),
        letters_dir.clone(),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    for dir in [&queue_dir, &letters_dir] {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(mode(&path), 0o600, "{}", path.display());
        }
    }
}

#[test]
fn a_symlinked_directory_is_refused_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = root.path().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let link = root.path().join("queue");
    symlink(&elsewhere, &link).unwrap();
    let err = DiskQueue::open(&link, settings()).err().expect("refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(err.to_string().contains("queue"), "{err}");
    let err = DeadLetterLog::open(&link, 1 << 20).err().expect("refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(
        fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing written there"
    );
}

/// A victim file an attacker wants truncated or overwritten.
fn victim(root: &Path) -> std::path::PathBuf {
    let victim = root.join("victim");
    fs::write(&victim, b"precious").unwrap();
    victim
}

#[test]
fn a_link_in_place_of_a_queue_file_is_never_followed() {
    for name in ["cursor", "lock", "00000000000000000000.seg"] {
        let root = tempfile::tempdir().unwrap();
        let victim = victim(root.path());
        let dir = root.path().join("queue");
        fs::create_dir(&dir).unwrap();
        symlink(&victim, dir.join(name)).unwrap();
        let opened = DiskQueue::open(&dir, settings());
        if let Ok((queue, _)) = &opened {
            let _ = queue.append(b"x");
            let _ = queue.sync();
        }
        assert_eq!(fs::read(&victim).unwrap(), b"precious", "through {name}");
        assert!(opened.is_err(), "a link at {name} is refused");
    }
}

#[test]
fn a_link_in_place_of_a_dead_letter_file_is_never_followed() {
    let root = tempfile::tempdir().unwrap();
    let victim = victim(root.path());
    let dir = root.path().join("letters");
    fs::create_dir(&dir).unwrap();
    symlink(&victim, dir.join("letters")).unwrap();
    assert!(DeadLetterLog::open(&dir, 1 << 20).is_err());
    assert_eq!(fs::read(&victim).unwrap(), b"precious");

    // `letters.new`, written when letters are removed.
    let dir = root.path().join("letters2");
    let (log, _) = DeadLetterLog::open(&dir, 1 << 20).unwrap();
    let id = log.append(b"one").unwrap();
    symlink(&victim, dir.join("letters.new")).unwrap();
    assert!(log.remove(&[id]).is_err());
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn an_existing_directory_and_files_open_to_others_are_made_private() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("queue");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(dir.join("cursor"), b"").unwrap();
    fs::set_permissions(dir.join("cursor"), fs::Permissions::from_mode(0o666)).unwrap();
    let (queue, _) = DiskQueue::open(&dir, settings()).unwrap();
    queue.append(b"secret payload").unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("cursor")), 0o600);
}

#[test]
fn a_fifo_or_a_hard_link_in_place_of_a_file_is_refused_without_waiting() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("queue");
    fs::create_dir(&dir).unwrap();
    let fifo = dir.join("cursor");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let started = std::time::Instant::now();
    let err = DiskQueue::open(&dir, settings()).err().expect("refused");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the open waited"
    );
    assert!(err.to_string().contains("cursor"), "{err}");

    let victim = victim(root.path());
    let dir = root.path().join("letters");
    fs::create_dir(&dir).unwrap();
    fs::hard_link(&victim, dir.join("letters")).unwrap();
    let err = DeadLetterLog::open(&dir, 1 << 20).err().expect("refused");
    assert!(err.to_string().contains("hard link"), "{err}");
    assert_eq!(fs::read(&victim).unwrap(), b"precious");
}

#[test]
fn a_tool_inspecting_dead_letters_refuses_a_link_too() {
    let root = tempfile::tempdir().unwrap();
    let real = root.path().join("real");
    DeadLetterLog::open(&real, 1 << 20).unwrap();
    let link = root.path().join("letters");
    symlink(&real, &link).unwrap();
    let err = DeadLetterLog::inspect(&link, 1 << 20)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
}

#[test]
fn another_user_s_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("queue");
    fs::create_dir(&dir).unwrap();
    // Only root can give a directory away; as another user, nothing to show.
    let given = std::process::Command::new("chown")
        .arg("65534")
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !given {
        eprintln!("not root: another user's directory cannot be made here");
        return;
    }
    let err = DiskQueue::open(&dir, settings()).err().expect("refused");
    assert!(err.to_string().contains("belongs to user 65534"), "{err}");
}
