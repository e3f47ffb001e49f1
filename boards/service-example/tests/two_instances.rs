//! Two instances of the example service on one Redis, as the README's
//! server section runs them, and what it says they show.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use guard_testkit::http::{Reply, request};
use guard_testkit::{KillOnDrop, RedisServer, free_port, holds_within};

/// The leader's lease in the test: a takeover within about two seconds.
const LEASE_MS: u64 = 1_500;

type Lines = Arc<Mutex<Vec<String>>>;

struct Instance {
    port: u16,
    lines: Lines,
    child: KillOnDrop,
}

impl Instance {
    fn start(redis: &str, replica: &str) -> Instance {
        let port = free_port().unwrap();
        let mut child: Child = Command::new(env!("CARGO_BIN_EXE_guard-example-service"))
            .args(["--redis", redis, "--replica", replica])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--lease-ms", &LEASE_MS.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("guard-example-service");
        let lines: Lines = Arc::default();
        let stdout = child.stdout.take().unwrap();
        let collected = Arc::clone(&lines);
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        let instance = Instance {
            port,
            lines,
            child: KillOnDrop(child),
        };
        assert!(
            holds_within(Duration::from_secs(30), || instance.saw("listening on")),
            "{replica} did not start: {:?}",
            instance.lines.lock().unwrap()
        );
        instance
    }

    fn saw(&self, text: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(text))
    }

    fn call(&self, method: &str, path: &str, body: &str) -> Reply {
        request(self.port, method, path, body).expect("an HTTP answer")
    }

    fn leads(&self) -> bool {
        self.call("GET", "/leader", "").body.contains("leads")
    }
}

fn heartbeat(server: &RedisServer, field: &str) -> String {
    server
        .command(&format!("HGET example:heartbeat {field}"))
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn two_instances_share_limits_a_leader_and_each_webhook_delivery() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let a = Instance::start(&url, "a");
    let b = Instance::start(&url, "b");

    // Per client IP across both instances: five, then 429 with its fields.
    let statuses: Vec<u16> = (0..6)
        .map(|i| [&a, &b][i % 2].call("GET", "/hello", "").status())
        .collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429],
        "one quota for both"
    );
    let refused = b.call("GET", "/hello", "");
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""default";q=5;w=5"#)
    );
    assert!(refused.header("ratelimit").is_some());

    // One leader, writing under its fence.
    assert!(
        holds_within(Duration::from_secs(10), || a.leads() != b.leads()),
        "exactly one leader"
    );
    let (leader, standby) = if a.leads() { (a, b) } else { (b, a) };
    assert!(holds_within(Duration::from_secs(5), || !heartbeat(
        &server, "fence"
    )
    .is_empty()));
    let first_fence: u64 = heartbeat(&server, "fence").parse().unwrap();

    // A delivery sent to both at once runs once; a redelivery answers the
    // stored result.
    let (one, other) = thread::scope(|s| {
        let one = s.spawn(|| leader.call("POST", "/webhooks/evt_1", "ok"));
        let other = s.spawn(|| standby.call("POST", "/webhooks/evt_1", "ok"));
        (one.join().unwrap(), other.join().unwrap())
    });
    let mut codes = [one.status(), other.status()];
    codes.sort_unstable();
    assert!(
        codes == [200, 202] || codes == [202, 409],
        "one runs, the other is a duplicate or in progress: {codes:?}"
    );
    let again = standby.call("POST", "/webhooks/evt_1", "ok");
    assert_eq!(again.status(), 200);
    assert!(
        again.body.starts_with("accepted evt_1 by "),
        "{}",
        again.body
    );
    let processed = server.command("LLEN example:processed").unwrap();
    assert_eq!(processed.trim(), ":1", "the work ran once");

    // A failed delivery is given back: the next one runs it.
    assert_eq!(leader.call("POST", "/webhooks/evt_2", "fail").status(), 500);
    let retried = standby.call("POST", "/webhooks/evt_2", "ok");
    assert_eq!(retried.status(), 202, "{}", retried.body);

    // The leader dies: the standby takes over under a greater fence, and
    // its writes are the ones the heartbeat keeps.
    let killed_at = Instant::now();
    drop(leader);
    assert!(
        holds_within(Duration::from_secs(10), || standby.leads()),
        "the standby takes over: {:?}",
        standby.lines.lock().unwrap()
    );
    let took = killed_at.elapsed();
    // The lease plus a renew interval, and room for a busy machine.
    assert!(
        took < Duration::from_millis(LEASE_MS * 4),
        "took over in {took:?}"
    );
    assert!(holds_within(Duration::from_secs(5), || {
        heartbeat(&server, "fence").parse::<u64>().unwrap_or(0) > first_fence
    }));
    assert_eq!(heartbeat(&server, "refused"), "", "no write was refused");

    // Redis gone: a delivery is 503 with Retry-After, never a duplicate.
    drop(server);
    let down = standby.call("POST", "/webhooks/evt_3", "ok");
    assert_eq!(down.status(), 503, "{}", down.body);
    assert_eq!(down.header("retry-after"), Some("1"));
    drop(standby.child);
}
