//! What `check` accepts, `run` accepts: the shipped configuration,
//! mutated at random (a value replaced by an edge case of another type or
//! of its own, a key removed, an unknown key added, an endpoint doubled),
//! is never a panic in the configuration; the mutations it accepts start
//! a replica (in this process) against a Redis and a Mosquitto of the
//! test's own, and a few start the binary, each failing only where a
//! server cannot be reached.
//!
//! Bounded for the test command: 10,000 mutations checked, 400 of those
//! accepted started in process (spread over the run), 6 as the binary.
//! `GUARD_MUTATIONS`, `GUARD_MUTATION_STARTS` and `GUARD_MUTATION_RUNS`
//! ask for more; `GUARD_MUTATION_SEED` replays a run (each failure
//! prints its seed).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use guard_gateway::config::Config;
use guard_gateway::readiness::Readiness;
use guard_gateway::replica::{self, Event};
use guard_testkit::{KillOnDrop, Mosquitto, RedisServer};
use toml::{Table, Value};

/// SplitMix64: a seeded sequence of choices, replayable from its seed.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Where a value sits: keys of tables and indexes of arrays.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every value's path, tables and arrays included.
fn paths(value: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        Value::Table(table) => {
            for (key, v) in table {
                at.push(Step::Key(key.clone()));
                out.push(at.clone());
                paths(v, at, out);
                at.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                at.push(Step::Index(i));
                out.push(at.clone());
                paths(v, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn parent<'a>(root: &'a mut Value, path: &[Step]) -> &'a mut Value {
    let mut here = root;
    for step in &path[..path.len() - 1] {
        here = match (here, step) {
            (Value::Table(t), Step::Key(k)) => t.get_mut(k).unwrap(),
            (Value::Array(a), Step::Index(i)) => &mut a[*i],
            _ => unreachable!("a path follows the value"),
        };
    }
    here
}

/// An edge case: mostly of the type `like` has (a value the file could
/// hold), sometimes of another.
fn edge_value(like: Option<&Value>, choices: &mut Choices) -> Value {
    let integers: [i64; 14] = [
        0,
        1,
        -1,
        3,
        7,
        999_999,
        65_535,
        65_536,
        4_294_967_296,
        i32::MAX as i64 + 1,
        i64::MAX,
        i64::MIN,
        86_400_001,
        1_000_000_000_000,
    ];
    let long = "k".repeat(300);
    let strings = [
        "",
        " ",
        "\n",
        "a\rb",
        "\u{0}",
        "\u{200b}",
        long.as_str(),
        "${GUARD_MUTATION_UNSET}",
        "${",
        "x",
        "é",
        "{braced}",
        "*",
        "#",
        "/",
        "sensors/+/x",
        "$share/g/t",
        "redis://127.0.0.1:1/",
        "memory",
        "redis",
        "wait",
        "sliding",
        "token-bucket",
    ];
    let kind = match (like, choices.below(10)) {
        (Some(Value::Integer(_)), 0..7) => 0,
        (Some(Value::String(_)), 0..7) => 2,
        (Some(Value::Boolean(_)), 0..7) => 4,
        _ => choices.below(6),
    };
    match kind {
        0 | 1 => Value::Integer(*choices.pick(&integers)),
        2 | 3 => Value::String((*choices.pick(&strings)).to_owned()),
        4 => Value::Boolean(choices.below(2) == 0),
        _ => match choices.below(3) {
            0 => Value::Float(0.5),
            1 => Value::Array(Vec::new()),
            _ => Value::Array(vec![Value::String("a".into())]),
        },
    }
}

/// One mutation of `root`, described.
fn mutate(root: &mut Value, choices: &mut Choices) -> String {
    let mut all = Vec::new();
    paths(root, &mut Vec::new(), &mut all);
    let path = choices.pick(&all).clone();
    let last = path.last().unwrap().clone();
    let described = format!("{path:?}");
    match (choices.below(10), parent(root, &path), &last) {
        // Remove a key.
        (0 | 1, Value::Table(t), Step::Key(k)) => {
            t.remove(k);
            format!("removed {described}")
        }
        // An unknown key beside it.
        (2, Value::Table(t), _) => {
            t.insert("unknown_key".into(), Value::Integer(1));
            format!("unknown key beside {described}")
        }
        // An array entry doubled (two endpoints of one name, say).
        (3, Value::Array(a), Step::Index(i)) => {
            let copy = a[*i].clone();
            a.push(copy);
            format!("doubled {described}")
        }
        (_, Value::Table(t), Step::Key(k)) => {
            let v = edge_value(t.get(k), choices);
            let shown = v.to_string();
            t.insert(k.clone(), v);
            format!("{described} = {shown}")
        }
        (_, Value::Array(a), Step::Index(i)) => {
            let v = edge_value(a.get(*i), choices);
            let shown = v.to_string();
            a[*i] = v;
            format!("{described} = {shown}")
        }
        _ => "nothing".to_owned(),
    }
}

fn from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The shipped file, its servers ours and its metrics off.
fn shipped(redis: &str, mqtt_port: u16) -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml"))
        .expect("the shipped configuration");
    let mut root: Value = Value::Table(text.parse::<Table>().expect("the shipped file is TOML"));
    let table = root.as_table_mut().unwrap();
    table.remove("metrics");
    table["locker"]
        .as_table_mut()
        .unwrap()
        .insert("url".into(), Value::String(redis.to_owned()));
    for endpoint in table["endpoints"].as_array_mut().unwrap() {
        let endpoint = endpoint.as_table_mut().unwrap();
        if endpoint.get("kind").and_then(Value::as_str) == Some("mqtt") {
            endpoint.insert("port".into(), Value::Integer(i64::from(mqtt_port)));
        }
    }
    root
}

/// What a replica may fail on at start without the check having missed
/// anything: a server it cannot reach (a mutated URL, host or port).
/// Only these words: a looser "connect" would excuse a refusal whose rule
/// names a connection string.
fn unreachable_server(stderr: &str) -> bool {
    [
        "cannot reach",
        "Connection refused",
        "timed out",
        "failed to lookup",
    ]
    .iter()
    .any(|s| stderr.contains(s))
}

/// Runs a replica of `config` until it has started (or ended), then
/// stops it: what it ended with.
fn start_then_stop(config: &Config) -> Result<(), replica::GatewayError> {
    let ready = Arc::new(Readiness::new());
    let (handle, control) = guard_smol::control();
    let ended = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (ready, ended) = (ready.clone(), ended.clone());
        thread::spawn(move || {
            // Started once past "connecting" (ready or naming a source).
            while !ended.load(Ordering::Acquire)
                && ready.check().is_err_and(|waits| waits == "connecting")
            {
                thread::sleep(Duration::from_millis(2));
            }
            handle.stop();
        })
    };
    let emit: Arc<dyn Fn(Event) + Send + Sync> = Arc::new(|_| {});
    let result = smol::block_on(replica::run(config, "mutated", control, emit, ready));
    ended.store(true, Ordering::Release);
    watcher.join().unwrap();
    result
}

#[test]
fn what_check_accepts_from_ten_thousand_mutations_run_accepts() {
    let redis = RedisServer::start().expect("redis-server");
    let mosquitto = Mosquitto::start().expect("mosquitto");
    let base = shipped(&redis.url(), mosquitto.port());
    Config::from_toml(&toml::to_string(&base).unwrap()).expect("the shipped file, on our servers");
    let seed = from_env("GUARD_MUTATION_SEED", 0x005e_ed0f_c0ff);
    let (mutations, starts, runs) = (
        from_env("GUARD_MUTATIONS", 10_000),
        from_env("GUARD_MUTATION_STARTS", 400),
        from_env("GUARD_MUTATION_RUNS", 6),
    );
    let mut choices = Choices(seed);
    let mut accepted: Vec<(String, String)> = Vec::new();
    let mut refused = 0;
    for n in 0..mutations {
        let mut root = base.clone();
        let mut what = Vec::new();
        // One to three changes at once.
        for _ in 0..=choices.below(3) {
            what.push(mutate(&mut root, &mut choices));
        }
        let what = format!("mutation {n} of seed {seed:#x}: {}", what.join("; "));
        let Ok(text) = toml::to_string(&root) else {
            continue; // not representable as a file (a table after a value)
        };
        let checked = catch_unwind(AssertUnwindSafe(|| Config::from_toml(&text)));
        match checked {
            Err(_) => panic!("the check panicked on {what}:\n{text}"),
            Ok(Err(e)) => {
                refused += 1;
                assert!(!e.to_string().is_empty(), "a refusal says nothing: {what}");
            }
            Ok(Ok(_)) => accepted.push((what, text)),
        }
    }
    assert!(
        refused > 0 && !accepted.is_empty(),
        "mutations that test both sides: {refused} refused, {} accepted",
        accepted.len()
    );
    // Every accepted mutation starts in this process: connected, its
    // limiters, guards, schedules and endpoints built and running, then
    // stopped.
    let mut failures = Vec::new();
    let clock = Instant::now();
    let spread = |of: &[(String, String)], n: u64| -> Vec<(String, String)> {
        let step = (of.len() / n.max(1) as usize).max(1);
        of.iter().step_by(step).take(n as usize).cloned().collect()
    };
    let starts = spread(&accepted, starts);
    for (what, text) in &starts {
        let config = Config::from_toml(text).unwrap();
        let started = start_then_stop(&config);
        if let Err(e) = started {
            let shown = format!("{e}: {:?}", std::error::Error::source(&e));
            if !unreachable_server(&shown) {
                failures.push(format!("{what}: {shown}\n{text}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "`check` accepted, the replica's start refused:\n{}",
        failures.join("\n---\n")
    );
    let in_process = clock.elapsed();
    // A sample of what was accepted, spread over the run, started as the
    // binary (its logger and metrics included).
    let dir = tempfile::tempdir().unwrap();
    let sample = spread(&accepted, runs);
    for (i, (what, text)) in sample.iter().enumerate() {
        let path = dir.path().join(format!("mutated-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let log = dir.path().join(format!("mutated-{i}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_guard-gateway"))
            .args(["run", "--replica", &format!("mutated-{i}"), "--config"])
            .arg(&path)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        // Still running after two seconds, or ended on a server it cannot
        // reach: a start-up refusal is what the check should have said.
        let start = Instant::now();
        let exited = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break Some(status);
            }
            if start.elapsed() > Duration::from_secs(2) {
                break None;
            }
            thread::sleep(Duration::from_millis(50));
        };
        if let Some(status) = exited {
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            if !unreachable_server(&stderr) {
                failures.push(format!("{what}: {status}\n{stderr}\n{text}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "`check` accepted, `run` refused:\n{}",
        failures.join("\n---\n")
    );
    eprintln!(
        "{mutations} mutations: {refused} refused, {} accepted, {} of them started in {in_process:?}, {} as the binary",
        accepted.len(),
        starts.len(),
        sample.len()
    );
}
