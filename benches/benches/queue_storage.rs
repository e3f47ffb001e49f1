//! The disk queue's storage, chosen by measuring: guard-std's segment
//! log (`DiskQueue`) beside two well-kept embedded databases used as a
//! FIFO, each appending 100-byte records under an increasing key and then
//! taking the oldest and removing it, until empty:
//!
//! - `redb` (a copy-on-write B-tree): a write transaction per record,
//!   `pop_first` to take one;
//! - `fjall` (an LSM tree with a journal): `insert` under a big-endian
//!   key, `get` + `remove` of the head (a counter in memory, so that the
//!   head is not searched past the removed keys' tombstones).
//!
//! Each under both sync policies the queue offers: *every 100 ms* (the
//! segment log's sync thread; redb's `Durability::None` with an empty
//! `Immediate` commit every 100 ms, which makes the earlier ones durable;
//! fjall's journal buffered, `persist(SyncData)` every 100 ms) and *every
//! write* (`fdatasync` before the append returns; redb `Immediate`; fjall
//! `persist(SyncData)` after each insert). Reported: appends and takes
//! per second, and the bytes on disk after the appends per byte of
//! record, with the ratio to the segment log.
//!
//! `cargo bench -p guard-benches --features storage-candidates --bench
//! queue_storage [-- RECORDS]` (default 50,000; every write: a tenth).
//! `--test` runs a short smoke pass. Works in temporary directories on
//! the machine's disk.

use std::path::Path;
use std::time::{Duration, Instant};

use guard_std::disk_queue::{DiskQueue, QueueSettings, SyncPolicy};

/// The sync period of the interval policy.
const PERIOD: Duration = Duration::from_millis(100);
/// Bytes of a record.
const RECORD: usize = 100;

/// A FIFO on disk.
trait Fifo {
    fn push(&mut self, record: &[u8]);
    fn pop(&mut self) -> Option<Vec<u8>>;
    /// Makes what was written durable (the interval policy's tick).
    fn sync(&mut self);
}

struct SegmentLog(DiskQueue);

impl Fifo for SegmentLog {
    fn push(&mut self, record: &[u8]) {
        self.0.append(record).expect("append");
    }
    fn pop(&mut self) -> Option<Vec<u8>> {
        let record = self.0.peek().expect("peek")?;
        self.0.advance().expect("advance");
        Some(record)
    }
    fn sync(&mut self) {
        // Its own thread syncs every period.
    }
}

const TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("queue");

struct Redb {
    db: redb::Database,
    every_write: bool,
    next: u64,
}

impl Redb {
    fn write(&self) -> redb::WriteTransaction {
        let mut txn = self.db.begin_write().expect("begin");
        if !self.every_write {
            txn.set_durability(redb::Durability::None)
                .expect("durability");
        }
        txn
    }
}

impl Fifo for Redb {
    fn push(&mut self, record: &[u8]) {
        let txn = self.write();
        {
            let mut table = txn.open_table(TABLE).expect("table");
            table.insert(self.next, record).expect("insert");
        }
        txn.commit().expect("commit");
        self.next += 1;
    }
    fn pop(&mut self) -> Option<Vec<u8>> {
        let txn = self.write();
        let record = {
            let mut table = txn.open_table(TABLE).expect("table");
            table
                .pop_first()
                .expect("pop")
                .map(|(_, v)| v.value().to_vec())
        };
        txn.commit().expect("commit");
        record
    }
    fn sync(&mut self) {
        // An empty durable commit makes every earlier one durable.
        self.db
            .begin_write()
            .expect("begin")
            .commit()
            .expect("commit");
    }
}

struct Fjall {
    keyspace: fjall::Keyspace,
    queue: fjall::PartitionHandle,
    every_write: bool,
    head: u64,
    next: u64,
}

impl Fifo for Fjall {
    fn push(&mut self, record: &[u8]) {
        self.queue
            .insert(self.next.to_be_bytes(), record)
            .expect("insert");
        self.next += 1;
        if self.every_write {
            self.keyspace
                .persist(fjall::PersistMode::SyncData)
                .expect("persist");
        }
    }
    fn pop(&mut self) -> Option<Vec<u8>> {
        let key = self.head.to_be_bytes();
        let record = self.queue.get(key).expect("get")?.to_vec();
        self.queue.remove(key).expect("remove");
        self.head += 1;
        Some(record)
    }
    fn sync(&mut self) {
        self.keyspace
            .persist(fjall::PersistMode::SyncData)
            .expect("persist");
    }
}

fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| {
            let e = e.expect("entry");
            let meta = e.metadata().expect("metadata");
            if meta.is_dir() {
                bytes_in(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

/// Appends and takes `n` records: (appends/s, takes/s, bytes on disk per
/// record byte after the appends).
fn measure(fifo: &mut dyn Fifo, dir: &Path, n: u64, interval: bool) -> (f64, f64, f64) {
    let record = vec![0x5a; RECORD];
    let mut synced = Instant::now();
    let mut tick = |fifo: &mut dyn Fifo| {
        if interval && synced.elapsed() >= PERIOD {
            fifo.sync();
            synced = Instant::now();
        }
    };
    let started = Instant::now();
    for _ in 0..n {
        fifo.push(&record);
        tick(fifo);
    }
    let appends = n as f64 / started.elapsed().as_secs_f64();
    if interval {
        fifo.sync();
    }
    let size = bytes_in(dir) as f64 / (n as f64 * RECORD as f64);
    let started = Instant::now();
    for _ in 0..n {
        assert!(fifo.pop().is_some(), "a record appended is taken");
        tick(fifo);
    }
    let takes = n as f64 / started.elapsed().as_secs_f64();
    (appends, takes, size)
}

fn run(name: &str, n: u64, every_write: bool) -> (f64, f64, f64) {
    let dir = tempfile::tempdir().expect("dir");
    let interval = !every_write;
    match name {
        "segment log" => {
            let sync = if every_write {
                SyncPolicy::EveryWrite
            } else {
                SyncPolicy::Every(PERIOD)
            };
            let settings = QueueSettings::new(1 << 32, sync).expect("settings");
            let (queue, _) = DiskQueue::open(dir.path(), settings).expect("queue");
            measure(&mut SegmentLog(queue), dir.path(), n, interval)
        }
        "redb" => {
            let db = redb::Database::create(dir.path().join("queue.redb")).expect("redb");
            let mut fifo = Redb {
                db,
                every_write,
                next: 0,
            };
            measure(&mut fifo, dir.path(), n, interval)
        }
        _ => {
            let keyspace = fjall::Config::new(dir.path()).open().expect("fjall");
            let queue = keyspace
                .open_partition("queue", fjall::PartitionCreateOptions::default())
                .expect("partition");
            let mut fifo = Fjall {
                keyspace,
                queue,
                every_write,
                head: 0,
                next: 0,
            };
            measure(&mut fifo, dir.path(), n, interval)
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let smoke = args.iter().any(|a| a == "--test");
    let n: u64 = if smoke {
        500
    } else {
        args.iter().find_map(|a| a.parse().ok()).unwrap_or(50_000)
    };
    let rounds = if smoke { 1 } else { 3 };
    let stores = ["segment log", "redb", "fjall"];
    for every_write in [false, true] {
        let count = if every_write { (n / 10).max(50) } else { n };
        // Each store in turn, each keeping its best of the rounds.
        let mut best = [(0.0f64, 0.0f64, f64::MAX); 3];
        for _ in 0..rounds {
            for (i, store) in stores.iter().enumerate() {
                let (a, t, s) = run(store, count, every_write);
                best[i] = (best[i].0.max(a), best[i].1.max(t), best[i].2.min(s));
            }
        }
        println!(
            "{count} records of {RECORD} bytes, sync {}:",
            if every_write {
                "every write"
            } else {
                "every 100 ms"
            }
        );
        println!(
            "{:<12} {:>12} {:>8} {:>12} {:>8} {:>14}",
            "store", "appends/s", "ratio", "takes/s", "ratio", "disk/record"
        );
        let (a0, t0, _) = best[0];
        for (store, (a, t, s)) in stores.iter().zip(best) {
            println!(
                "{store:<12} {a:>12.0} {:>8.2} {t:>12.0} {:>8.2} {s:>14.2}",
                a / a0,
                t / t0
            );
        }
    }
}
