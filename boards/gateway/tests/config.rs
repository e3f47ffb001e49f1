//! The TOML configuration: a valid file, and each kind of invalid value
//! with the message it gets.

use std::time::Duration;

use guard_core::guard::FailPolicy;
use guard_endpoints::queue::WhenFull;
use guard_gateway::config::{
    Backend, Config, ConfigError, Cost, EndpointLimit, LimitKey, Locker, MqttDelivery,
    PolicyAlgorithm, Source, Timing, WhenLimited,
};
use guard_redis::Topology;

const VALID: &str = r#"
[ratelimit]
enabled = true
backend = "memory"
window_ms = 1000
limit = 100
default_name = "default"

[ratelimit.policies.api]
algorithm = "token-bucket"
backend = "redis"
capacity = 20
rate_per_second = 5

[ratelimit.policies.uplink]
algorithm = "leaky-bucket"
capacity = 10
rate_per_second = 2

[locker]
kind = "redis"
mode = "standalone"
url = "redis://127.0.0.1:6379/"
request_timeout_ms = 300
prefix = "prod1"

[guards]
owner = "tenant1"
once_ttl_s = 600
fail_policy = "open"
active_ttl_ms = 3000
active_interval_ms = 500

[[schedules]]
router = "heartbeat"
chain = "gateway"
every_ms = 1000

[[schedules]]
router = "report"
cron = "0 */5 * * * *"

[[active]]
name = "sensors"

[metrics]
prometheus = "127.0.0.1:9000"
"#;

fn error(text: &str) -> String {
    Config::from_toml(text).unwrap_err().to_string()
}

/// A schedule, so that a section under test is not refused as a file
/// that does nothing.
const JOB: &str = "[[schedules]]\nrouter = \"r0\"\nevery_ms = 1000\n";

fn error_with_job(text: &str) -> String {
    error(&format!("{JOB}{text}"))
}

/// The lease timing's defaults are core's, derived from what is given:
/// a TTL alone gets an interval of at most a third of it; an interval
/// given beyond that is refused, naming the key that was written.
#[test]
fn a_lease_ttl_alone_gets_an_interval_derived_from_it() {
    let c = Config::from_toml(&format!("{JOB}[guards]\nactive_ttl_ms = 3000\n")).unwrap();
    assert_eq!(c.guards.active.ttl().as_duration(), Duration::from_secs(3));
    assert_eq!(c.guards.active.interval(), Duration::from_secs(1));
    let c = Config::from_toml(JOB).unwrap();
    assert_eq!(c.guards.active.ttl().as_duration(), Duration::from_secs(15));
    assert_eq!(c.guards.active.interval(), Duration::from_secs(5));
    let e = error_with_job("[guards]\nactive_ttl_ms = 3000\nactive_interval_ms = 1500\n");
    assert!(
        e.contains("`guards.active_interval_ms` = 1500: expected at most a third of guards.active_ttl_ms (1000 ms)"),
        "{e}"
    );
}

#[test]
fn a_valid_file_parses_into_validated_types() {
    let c = Config::from_toml(VALID).unwrap();
    let limits = c.ratelimit.as_ref().expect("enabled");
    let names: Vec<_> = limits.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["api", "uplink", "default"],
        "the default limiter is added"
    );
    assert_eq!(limits.policies[0].backend, Backend::Redis);
    assert!(matches!(
        limits.policies[0].algorithm,
        PolicyAlgorithm::TokenBucket(b) if b.capacity() == 20
    ));
    assert!(matches!(
        limits.policies[1].algorithm,
        PolicyAlgorithm::LeakyBucket(_)
    ));
    assert!(
        matches!(limits.policies[2].algorithm, PolicyAlgorithm::Sliding(w) if w.limit() == 100)
    );
    assert_eq!(limits.policies[2].key_prefix, "guard:rl");
    let Locker::Redis(redis) = &c.locker else {
        panic!("a Redis locker: {:?}", c.locker)
    };
    assert_eq!(
        redis.topology,
        Topology::Standalone {
            url: "redis://127.0.0.1:6379/".into()
        }
    );
    assert_eq!(redis.prefix, "prod1");
    assert_eq!(redis.request_timeout, Duration::from_millis(300));
    assert_eq!(c.guards.fail_policy, FailPolicy::FailOpen);
    assert_eq!(c.guards.active.interval(), Duration::from_millis(500));
    assert_eq!(c.guards.once_ttl.as_duration(), Duration::from_secs(600));
    assert_eq!(c.schedules.len(), 2);
    assert!(matches!(c.schedules[1].timing, Timing::Cron(_)));
    assert_eq!(c.active, ["sensors"]);
    assert_eq!(
        c.metrics.prometheus,
        Some("127.0.0.1:9000".parse().unwrap())
    );
}

#[test]
fn a_file_that_configures_nothing_is_refused() {
    for text in [
        "",
        "[locker]\nkind = \"local\"\n",
        "[ratelimit]\nenabled = true\n",
    ] {
        assert_eq!(
            Config::from_toml(text).unwrap_err(),
            ConfigError::Empty,
            "{text:?}"
        );
    }
    assert!(ConfigError::Empty.to_string().contains("[[schedules]]"));
}

#[test]
fn defaults_are_a_single_process() {
    let c = Config::from_toml(JOB).unwrap();
    assert_eq!(c.locker, Locker::None);
    assert!(c.ratelimit.is_none());
    assert_eq!(c.guards.once_ttl.as_duration().as_secs(), 3600);
    assert_eq!(c.guards.fail_policy, FailPolicy::FailClosed);
}

#[test]
fn unknown_keys_are_named() {
    let e = error("[locker]\nkind = \"local\"\nurll = \"x\"\n");
    assert!(
        e.contains("`locker.urll` = set: expected no such key here"),
        "{e}"
    );
    let e = error("[ratelimit]\nenabeld = true\n");
    assert!(e.contains("`ratelimit.enabeld`"), "{e}");
    let e = error("[nonsense]\n");
    assert!(e.contains("`nonsense`"), "{e}");
}

#[test]
fn bad_enumerations_name_the_allowed_values() {
    let e = error("[ratelimit.policies.x]\nalgorithm = \"gcra\"\n");
    assert!(
        e.contains("`ratelimit.policies.x.algorithm` = \"gcra\""),
        "{e}"
    );
    assert!(
        e.contains("`sliding`, `fixed-window`, `token-bucket`, `leaky-bucket`"),
        "{e}"
    );
    let e = error("[ratelimit]\nbackend = \"postgres\"\n");
    assert!(
        e.contains("postgres") && e.contains("`memory` or `redis`"),
        "{e}"
    );
    let e = error("[locker]\nkind = \"zookeeper\"\n");
    assert!(
        e.contains("zookeeper") && e.contains("`none`, `local`, `redis`, `postgres`, `etcd`"),
        "{e}"
    );
    let e = error("[guards]\nfail_policy = \"maybe\"\n");
    assert!(
        e.contains("maybe") && e.contains("`closed` or `open`"),
        "{e}"
    );
}

#[test]
fn a_postgres_locker_is_checked_with_its_own_rules() {
    let c = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"postgres\"\nurl = \"postgres://app:${{PG_PASSWORD}}@db:5432/app\"\ntable = \"Locks\"\nrequest_timeout_ms = 2000\n"
    ));
    // `${PG_PASSWORD}` is unset here: named, not sent to the server.
    let e = c.unwrap_err().to_string();
    assert!(
        e.contains("`locker.url`") && e.contains("PG_PASSWORD"),
        "{e}"
    );
    let c = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"postgres\"\nurl = \"postgres://app@db:5432/app\"\ntable = \"Locks\"\nrequest_timeout_ms = 2000\n"
    ))
    .unwrap();
    let Locker::Postgres(pg) = &c.locker else {
        panic!("a PostgreSQL locker: {:?}", c.locker)
    };
    assert_eq!(
        (pg.url.as_str(), pg.table.as_str(), pg.request_timeout),
        (
            "postgres://app@db:5432/app",
            "Locks",
            Duration::from_secs(2)
        )
    );
    let c = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"postgres\"\nurl = \"postgres://app@db/app\"\n"
    ))
    .unwrap();
    let Locker::Postgres(pg) = &c.locker else {
        panic!("a PostgreSQL locker: {:?}", c.locker)
    };
    assert_eq!(pg.table, "guard_locks", "the default table");
    for (text, expected) in [
        (
            "url = \"postgres://app@db/app\"\ntable = \"locks; drop table x\"\n",
            "`locker.table` = \"locks; drop table x\": expected a plain SQL identifier",
        ),
        ("", "`locker.url` = missing"),
        (
            "url = \"postgres://app:pw@db:port/app\"\n",
            "`locker.url` = \"postgres://app:***@db:port/app\"",
        ),
        (
            "url = \"postgres://app@db/app\"\nprefix = \"p:\"\n",
            "`locker.prefix` = set: expected no such key unless kind = \"redis\"",
        ),
        (
            "url = \"postgres://app@db/app\"\nmode = \"cluster\"\n",
            "`locker.mode` = set: expected no such key unless kind = \"redis\"",
        ),
        (
            "url = \"postgres://app@db/app\"\nquarantine = true\n",
            "`locker.quarantine` = set: expected no such key unless kind = \"redis\"",
        ),
        (
            "url = \"postgres://app@db/app\"\nreplica_acks = 1\n",
            "`locker.replica_acks` = set: expected no such key unless kind = \"redis\"",
        ),
        (
            "url = \"postgres://app@db/app\"\nrequest_timeout_ms = 0\n",
            "`locker.request_timeout_ms` = 0",
        ),
        (
            "url = \"postgres://app@db/app\"\nrequest_timeout_ms = 300001\n",
            "`locker.request_timeout_ms` = 300001: expected a positive number of milliseconds, at most 300000",
        ),
    ] {
        let e = error_with_job(&format!("[locker]\nkind = \"postgres\"\n{text}"));
        assert!(e.contains(expected), "{text:?}: {e}");
    }
    // A URL that does not parse is named as written, not as expanded.
    let text = format!("{JOB}[locker]\nkind = \"postgres\"\nurl = \"${{PG_URL}}\"\n");
    let env =
        |name: &str| (name == "PG_URL").then(|| "postgres://app:s3cret@db:port/app".to_owned());
    let e = Config::from_toml_with_env(&text, env)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`locker.url` = \"${PG_URL}\"")
            && !e.contains("s3cret")
            && !e.contains("db:port"),
        "{e}"
    );
    let c = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\nquarantine = true\n"
    ))
    .unwrap();
    assert!(c.redis_locker().is_some_and(|l| l.quarantine));
    // Grants acknowledged by replicas: how many, within how long.
    let redis =
        "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\nrequest_timeout_ms = 500\n";
    let c = Config::from_toml(&format!("{JOB}{redis}replica_acks = 1\n")).unwrap();
    assert_eq!(
        c.redis_locker().and_then(|l| l.replica_acks),
        Some((1, Duration::from_millis(100)))
    );
    for (text, expected) in [
        (
            "replica_acks = 0\n",
            "`locker.replica_acks` = 0: expected at least 1 replica",
        ),
        (
            "replica_acks = 1\nreplica_ack_ms = 500\n",
            "`locker.replica_ack_ms` = 500: expected at least 1 and less than locker.request_timeout_ms (500)",
        ),
        (
            "replica_ack_ms = 50\n",
            "`locker.replica_ack_ms` = set: expected replica_acks set too",
        ),
    ] {
        let e = error_with_job(&format!("{redis}{text}"));
        assert!(e.contains(expected), "{text:?}: {e}");
    }
    let e = error_with_job(
        "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\ntable = \"t\"\n",
    );
    assert!(
        e.contains("`locker.table` = set: expected no such key unless kind = \"postgres\""),
        "{e}"
    );
}

#[test]
fn an_etcd_locker_names_its_members_or_the_feature_it_needs() {
    let text = format!(
        "{JOB}[locker]\nkind = \"etcd\"\nurls = [\"http://10.0.0.1:2379\", \"http://${{ETCD_HOST}}:2379\"]\nrequest_timeout_ms = 1500\n"
    );
    let env = |name: &str| (name == "ETCD_HOST").then(|| "etcd-2".to_owned());
    let parsed = Config::from_toml_with_env(&text, env);
    if cfg!(feature = "etcd") {
        let c = parsed.unwrap();
        let Locker::Etcd(etcd) = &c.locker else {
            panic!("an etcd locker: {:?}", c.locker)
        };
        assert_eq!(
            (etcd.endpoints.clone(), etcd.request_timeout),
            (
                vec![
                    "http://10.0.0.1:2379".to_owned(),
                    "http://etcd-2:2379".to_owned()
                ],
                Duration::from_millis(1500)
            )
        );
    } else {
        let e = parsed.unwrap_err().to_string();
        assert!(
            e.contains("`locker.kind` = \"etcd\"") && e.contains("`etcd` feature"),
            "{e}"
        );
    }
    for (text, expected) in [
        ("", "`locker.urls` = []"),
        (
            "urls = [\"127.0.0.1:2379\"]\n",
            "`locker.urls[0]` = \"127.0.0.1:2379\": expected an etcd client URL http://host:port",
        ),
        (
            "urls = [\"http://a:2379\", \"https://b:2379\"]\n",
            "`locker.urls[1]` = \"https://b:2379\"",
        ),
        (
            "urls = [\"http://a:2379\"]\ntable = \"t\"\n",
            "`locker.table` = set",
        ),
        (
            "urls = [\"http://a:2379\"]\nrequest_timeout_ms = 0\n",
            "`locker.request_timeout_ms` = 0",
        ),
        (
            "urls = [\"http://u:s3cret@a:2379\"]\n",
            "`locker.urls[0]` = \"http://u:***@a:2379\"",
        ),
        (
            "urls = [\"http://a:2379\", \"http://a:2379\"]\n",
            "`locker.urls[1]` = \"http://a:2379\": expected each member once",
        ),
    ] {
        let e = error_with_job(&format!("[locker]\nkind = \"etcd\"\n{text}"));
        assert!(e.contains(expected), "{text:?}: {e}");
    }
}

#[test]
fn a_locker_prefix_with_a_brace_is_refused_before_it_reaches_redis() {
    let e = error_with_job(
        "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\nprefix = \"p{\"\n",
    );
    assert!(
        e.contains("`locker.prefix` = \"p{\"") && e.contains("without '{' or '}'"),
        "{e}"
    );
    assert!(
        guard_std::GuardConfig::new().with_prefix("}").is_err(),
        "a guard prefix with a brace"
    );
}

#[test]
fn out_of_range_values_name_the_key_value_and_range() {
    let cases = [
        (
            "[ratelimit]\nenabled = true\nwindow_ms = 0\n",
            "`ratelimit.window_ms` = 0: expected a positive number of milliseconds",
        ),
        (
            "[ratelimit]\nenabled = true\nlimit = 0\n",
            "`ratelimit.limit` = 0: expected between 1 and 4096",
        ),
        (
            "[ratelimit]\nenabled = true\n[ratelimit.policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 0\nrate_per_second = 5\n",
            "`ratelimit.policies.api.capacity` = 0: expected a positive number",
        ),
        (
            "[ratelimit]\nenabled = true\n[ratelimit.policies.api]\nalgorithm = \"leaky-bucket\"\ncapacity = 5\nrate_per_second = 0\n",
            "`ratelimit.policies.api.rate_per_second` = 0",
        ),
        ("[locker]\nkind = \"redis\"\n", "`locker.url` = missing"),
        (
            "[locker]\nkind = \"redis\"\nmode = \"sentinel\"\nurls = [\"redis://a:26379\"]\n",
            "`locker.service` = missing",
        ),
        (
            "[locker]\nkind = \"redis\"\nmode = \"cluster\"\n",
            "`locker.urls` = []",
        ),
        ("[guards]\nonce_ttl_s = 0\n", "`guards.once_ttl_s` = 0"),
        (
            "[guards]\nactive_ttl_ms = 0\n",
            "`guards.active_ttl_ms` = 0: expected a positive number of milliseconds",
        ),
        (
            "[guards]\nactive_interval_ms = 0\n",
            "`guards.active_interval_ms` = 0",
        ),
        (
            "[[schedules]]\nrouter = \"\"\nevery_ms = 1000\n",
            "`schedules[1].router` = \"\": expected a non-empty router id",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\n",
            "`schedules[1].every_ms` = missing: expected `every_ms` or `cron`",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\ncron = \"* * * * * *\"\n",
            "either `every_ms` or `cron`, not both",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\ncron = \"* * * * *\"\n",
            "`schedules[1].cron` = \"* * * * *\"",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\n[[schedules]]\nrouter = \"r\"\nevery_ms = 5000\n",
            "`schedules[2].router` = \"r\": expected a router id unique",
        ),
        (
            "[metrics]\nprometheus = \"localhost\"\n",
            "`metrics.prometheus` = \"localhost\"",
        ),
    ];
    for (text, expected) in cases {
        let e = error_with_job(text);
        assert!(
            e.contains(expected),
            "{text:?}\n gave: {e}\n wanted: {expected}"
        );
    }
}

#[test]
fn wrong_types_name_the_key_the_value_and_what_is_allowed() {
    let cases = [
        (
            "[ratelimit]\nwindow_ms = -5\n",
            "`ratelimit.window_ms` = -5: expected a whole number from 0 to 9223372036854775807",
        ),
        (
            "[ratelimit.policies.api]\nalgorithm = \"token-bucket\"\ncapacity = -1\n",
            "`ratelimit.policies.api.capacity` = -1: expected a whole number from 0 to 4294967295",
        ),
        (
            "[guards]\nowner = 7\n",
            "`guards.owner` = 7: expected a string",
        ),
        (
            "[ratelimit]\nenabled = \"yes\"\n",
            "`ratelimit.enabled` = \"yes\": expected true or false",
        ),
        (
            "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\nport = 70000\n",
            "`endpoints[0].port` = 70000: expected a whole number from 0 to 65535",
        ),
    ];
    for (text, expected) in cases {
        let e = error_with_job(text);
        assert!(
            e.contains(expected),
            "{text:?}\n gave: {e}\n wanted: {expected}"
        );
    }
    assert!(matches!(
        Config::from_toml("[guards"),
        Err(ConfigError::Syntax(_))
    ));
}

#[test]
fn redis_urls_are_checked_and_named() {
    for (text, key) in [
        (
            "[locker]\nkind = \"redis\"\nurl = \"http://127.0.0.1:6379/\"\n",
            "`locker.url` = \"http://127.0.0.1:6379/\"",
        ),
        (
            "[locker]\nkind = \"redis\"\nmode = \"cluster\"\nurls = [\"redis://a:7000\", \"tcp://b\"]\n",
            "`locker.urls[1]` = \"tcp://b\"",
        ),
        (
            "[[endpoints]]\nname = \"x\"\nkind = \"redis-pubsub\"\nurl = \"127.0.0.1:6379\"\npatterns = [\"p\"]\n",
            "`endpoints[0].url` = \"127.0.0.1:6379\"",
        ),
    ] {
        let e = error_with_job(text);
        assert!(
            e.contains(key) && e.contains("expected a Redis URL"),
            "{text}: {e}"
        );
    }
    let c = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"redis\"\nurl = \"redis://user:pw@host:6380/2\"\n"
    ))
    .unwrap();
    assert!(matches!(c.locker, Locker::Redis(_)));
}

#[test]
fn an_http_sink_s_headers_come_from_the_environment_and_are_never_shown() {
    let text = format!(
        "{STREAM_TO}to = \"uplink\"\n\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\nheaders = {{ Authorization = \"Bearer ${{UPLINK_TOKEN}}\", X-Tenant = \"site-7\" }}\n"
    );
    let env = |name: &str| (name == "UPLINK_TOKEN").then(|| "s3cret".to_owned());
    let config = Config::from_toml_with_env(&text, env).unwrap();
    let guard_gateway::config::SinkKind::Http(target) = &config.sinks[0].kind else {
        unreachable!()
    };
    let headers: Vec<(&str, &str)> = target
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value()))
        .collect();
    assert_eq!(
        headers,
        [("Authorization", "Bearer s3cret"), ("X-Tenant", "site-7")]
    );
    assert!(
        !format!("{config:?}").contains("s3cret"),
        "Debug hides them"
    );
}

#[test]
fn secrets_come_from_the_environment() {
    let text = format!(
        "{JOB}[locker]\nkind = \"redis\"\nurl = \"redis://:${{REDIS_PASSWORD}}@${{REDIS_HOST}}:6379/\"\n"
    );
    let env = |name: &str| match name {
        "REDIS_PASSWORD" => Some("s3cret".to_owned()),
        "REDIS_HOST" => Some("10.0.0.5".to_owned()),
        _ => None,
    };
    let c = Config::from_toml_with_env(&text, env).unwrap();
    let Locker::Redis(redis) = c.locker else {
        panic!("redis")
    };
    assert_eq!(
        redis.topology,
        Topology::Standalone {
            url: "redis://:s3cret@10.0.0.5:6379/".into()
        }
    );
    let e = Config::from_toml_with_env(&text, |_| None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`locker.url`")
            && e.contains("the environment variable REDIS_PASSWORD to be set"),
        "{e}"
    );
    assert!(!e.contains("s3cret"));
}

#[test]
fn a_missing_file_is_a_read_error() {
    let e = Config::from_path(std::path::Path::new("/nonexistent/gateway.toml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cannot read the configuration: /nonexistent/gateway.toml"),
        "{e}"
    );
}

const ENDPOINTS: &str = r#"
[locker]
kind = "redis"
url = "redis://127.0.0.1:6379/"

[[endpoints]]
name = "sensors-in"
kind = "redis-pubsub"
patterns = ["sensors.*"]

[[endpoints]]
name = "orders"
kind = "redis-stream"
stream = "orders"
group = "billing"
dead_letter_topic = "orders"

[[endpoints]]
name = "telemetry"
kind = "mqtt"
host = "127.0.0.1"
filter = "sensors/#"
share_group = "gateways"
"#;

#[test]
fn endpoints_of_each_kind_parse_into_their_own_type() {
    let c = Config::from_toml(ENDPOINTS).unwrap();
    let Source::RedisPubsub(pubsub) = &c.endpoints[0].source else {
        panic!("{:?}", c.endpoints[0])
    };
    assert_eq!(pubsub.url, "redis://127.0.0.1:6379/", "the locker's URL");
    let Source::RedisStream(stream) = &c.endpoints[1].source else {
        panic!("{:?}", c.endpoints[1])
    };
    assert_eq!(
        (stream.stream.as_str(), stream.group.as_str()),
        ("orders", "billing")
    );
    assert_eq!(stream.url, None, "shares the locker's connection");
    assert_eq!(stream.retry.max_attempts(), 3);
    let Source::Mqtt(mqtt) = &c.endpoints[2].source else {
        panic!("{:?}", c.endpoints[2])
    };
    assert_eq!(mqtt.port, 1883);
    assert_eq!(mqtt.delivery, MqttDelivery::Shared("gateways".into()));
}

#[test]
fn endpoints_name_a_limiter_that_exists() {
    let limited = format!(
        "{ENDPOINTS}\n[ratelimit]\nenabled = true\n[ratelimit.policies.uplink]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate_per_second = 5\n\n[[endpoints]]\nname = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"\nlimit = \"uplink\"\nlimit_key = \"field:device\"\nmax_wait_ms = 250\n"
    );
    let c = Config::from_toml(&limited).unwrap();
    assert_eq!(
        c.endpoints[3].limit,
        Some(EndpointLimit {
            limiter: "uplink".into(),
            key: LimitKey::Field("device".into()),
            cost: Cost::Messages,
            when_limited: WhenLimited::Wait(Duration::from_millis(250)),
        })
    );
    let e = error(&limited.replace("limit = \"uplink\"", "limit = \"downlink\""));
    assert!(
        e.contains(
            "`endpoints[3].limit` = \"downlink\": expected one of the limiters: uplink, default"
        ),
        "{e}"
    );
    let e = error(&format!(
        "{ENDPOINTS}[[endpoints]]\nname = \"x\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\nlimit = \"uplink\"\n"
    ));
    assert!(
        e.contains("none exists: set [ratelimit] enabled = true"),
        "{e}"
    );
    let e = error(&limited.replace("limit_key = \"field:device\"", "limit_key = \"everything\""));
    assert!(
        e.contains("`endpoints[3].limit_key` = \"everything\""),
        "{e}"
    );
    // A stream's entries all come on the stream: keyed by their ids, each
    // would have a budget of its own and the limit would never apply.
    let e = error(&limited.replace("limit_key = \"field:device\"", "limit_key = \"topic\""));
    assert!(
        e.contains("`endpoints[3].limit_key` = \"topic\": expected \"source\" or \"field:<name>\""),
        "{e}"
    );
    let e = error(&limited.replace(
        "max_wait_ms = 250",
        "when_limited = \"dead-letter\"\nmax_wait_ms = 250",
    ));
    assert!(e.contains("no `max_wait_ms` with when_limited"), "{e}");
}

#[test]
fn endpoint_mistakes_name_the_key_and_what_is_expected() {
    let with = |extra: &str| format!("{ENDPOINTS}\n[[endpoints]]\n{extra}\n");
    let cases = [
        (
            "name = \"x\"\nkind = \"redis-pubsub\"",
            "`endpoints[3].patterns` = []: expected at least one channel pattern",
        ),
        (
            "name = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"",
            "`endpoints[3].group` = missing: expected a value",
        ),
        (
            "name = \"x\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\npatterns = [\"p\"]",
            "`endpoints[3].patterns` = set: expected no such key here",
        ),
        (
            "name = \"x\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\nshare_group = \"g\"\nguard = true",
            "no guard with `share_group`",
        ),
        (
            "name = \"orders\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"",
            "`endpoints[3].name` = \"orders\": expected a unique name",
        ),
        (
            "name = \"x\"\nkind = \"kafka\"",
            "`endpoints[3].kind` = \"kafka\": expected one of `redis-pubsub`, `redis-stream`, `mqtt`",
        ),
    ];
    for (extra, expected) in cases {
        let message = error(&with(extra));
        assert!(message.contains(expected), "{extra}: {message}");
    }
    // A Redis endpoint needs a URL when there is no Redis locker.
    let message = error(
        "[[endpoints]]\nname = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"",
    );
    assert!(
        message.contains("`endpoints[0].url` = missing"),
        "{message}"
    );
}

#[test]
fn the_readme_configuration_parses() {
    let readme = include_str!("../README.md");
    let section = readme
        .split("## The configuration")
        .nth(1)
        .expect("the gateway's README has a configuration section");
    let block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a TOML block");
    let env = |name: &str| (name == "MQTT_HOST").then(|| "127.0.0.1".to_owned());
    let config = Config::from_toml_with_env(block, env).expect("the README's example");
    assert_eq!(config.endpoints[0].name, "telemetry");
    assert!(config.endpoints[0].limit.is_some());
}

#[test]
fn what_a_replica_would_refuse_at_start_is_refused_by_the_check() {
    let long = "r".repeat(300);
    let cases = [
        (
            format!("[[schedules]]\nrouter = \"{long}\"\nevery_ms = 1000\n"),
            "`schedules[1].router`",
            "the guard keys it is part of hold at most",
        ),
        (
            "[[active]]\nname = \"a\"\n[[active]]\nname = \"a\"\n".to_owned(),
            "`active[1].name` = \"a\"",
            "a unique name",
        ),
        (
            "[locker]\nkind = \"local\"\n[ratelimit]\nenabled = true\nbackend = \"redis\"\n"
                .to_owned(),
            "`ratelimit.policies.default.backend` = \"redis\"",
            "unless [locker] kind = \"redis\"",
        ),
        (
            "[[schedules]]\nrouter = \"feb\"\ncron = \"0 0 0 31 2 *\"\n".to_owned(),
            "`schedules[1].cron` = \"0 0 0 31 2 *\"",
            "this one never does",
        ),
        (
            "[[schedules]]\nrouter = \"bad\"\ncron = \"61 * * * * *\"\n".to_owned(),
            "`schedules[1].cron` = \"61 * * * * *\": expected a cron expression with seconds",
            "the parser says",
        ),
        (
            "[guards]\nactive_ttl_ms = 1000\nactive_interval_ms = 5000\n".to_owned(),
            "`guards.active_interval_ms` = 5000",
            "at most a third of guards.active_ttl_ms (333 ms)",
        ),
        (
            "[[schedules]]\nrouter = \"big\"\nevery_ms = 18446744073709551615\n".to_owned(),
            "`schedules[1].every_ms` = 18446744073709551615",
            "at most 31622400000",
        ),
        (
            "[[schedules]]\nrouter = \"big\"\nevery_ms = 9000000000000\n".to_owned(),
            "`schedules[1].every_ms` = 9000000000000",
            "at most 31622400000",
        ),
        (
            "[guards]\nowner = \"a\\nb\"\n".to_owned(),
            "`guards.owner` = \"a\\nb\"",
            "no control characters",
        ),
        (
            "[ratelimit]\nenabled = true\n[ratelimit.policies.\"\"]\nalgorithm = \"sliding\"\n"
                .to_owned(),
            "`ratelimit.policies.` = \"\"",
            "a non-empty policy name",
        ),
        (
            "[locker]\nkind = \"redis\"\nurl = \"${}\"\n".to_owned(),
            "`locker.url`",
            "a variable name inside `${}`",
        ),
    ];
    for (text, key, expected) in cases {
        let e = error_with_job(&text);
        assert!(
            e.contains(key) && e.contains(expected),
            "{text:?}\n gave: {e}\n wanted: {key} … {expected}"
        );
    }
    // A section given as a plain value names the section, not a Rust type.
    let e = error(&format!("locker = \"local\"\n{JOB}"));
    assert!(
        e.contains("`locker` = \"local\": expected a table of keys ([locker])"),
        "{e}"
    );
}

#[test]
fn mqtt_endpoints_refuse_what_a_broker_would() {
    let mqtt = |extra: &str| {
        error_with_job(&format!(
            "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"sensors/#\"\n{extra}"
        ))
    };
    let e = error_with_job(
        "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"mqtt://h:1883\"\nfilter = \"t\"\n",
    );
    assert!(e.contains("`endpoints[0].host` = \"mqtt://h:1883\""), "{e}");
    assert!(mqtt("port = 0\n").contains("`endpoints[0].port` = 0"));
    let e = error_with_job(
        "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"a/#/b\"\n",
    );
    assert!(
        e.contains("`endpoints[0].filter` = \"a/#/b\": expected a valid MQTT topic filter"),
        "{e}"
    );
    let e = mqtt("share_group = \"a/b\"\n");
    assert!(e.contains("`endpoints[0].share_group` = \"a/b\""), "{e}");
    // A NUL makes a broker drop the connection (and the gateway reconnect
    // in a loop); a CR/LF in a share name splits log lines.
    let e = error_with_job(
        "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"a/\\u0000\"\n",
    );
    assert!(e.contains("`endpoints[0].filter` = \"a/\\0\""), "{e}");
    let e = mqtt("share_group = \"g\\r\\nx\"\n");
    assert!(
        e.contains("`endpoints[0].share_group` = \"g\\r\\nx\""),
        "{e}"
    );
    let e = mqtt("max_wait_ms = 9223372036854775807\nlimit = \"x\"\n");
    assert!(
        e.contains("`endpoints[0].limit`") || e.contains("max_wait_ms"),
        "{e}"
    );
}

#[test]
fn endpoints_bound_their_messages() {
    let c = Config::from_toml(ENDPOINTS).unwrap();
    assert!(c.endpoints.iter().all(|e| e.max_payload_bytes == 1 << 20));
    let Source::RedisStream(stream) = &c.endpoints[1].source else {
        panic!("a stream")
    };
    assert_eq!(
        stream.fields,
        ["payload"],
        "entries need a payload unless told"
    );
    let with = |extra: &str| {
        format!(
            "{ENDPOINTS}[[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"\n{extra}\n"
        )
    };
    let c = Config::from_toml(&with("fields = []\nmax_payload_bytes = 10")).unwrap();
    assert_eq!(c.endpoints[3].max_payload_bytes, 10);
    assert!(matches!(&c.endpoints[3].source, Source::RedisStream(s) if s.fields.is_empty()));
    let e = error(&with("max_payload_bytes = 0"));
    assert!(e.contains("`endpoints[3].max_payload_bytes` = 0"), "{e}");
    let e = error(&with("fields = [\"\"]"));
    assert!(e.contains("`endpoints[3].fields`"), "{e}");
}

#[test]
fn a_pubsub_endpoint_bounds_its_handler_queue_with_a_stated_policy() {
    let c = Config::from_toml(ENDPOINTS).unwrap();
    let Source::RedisPubsub(pubsub) = &c.endpoints[0].source else {
        panic!("a Pub/Sub endpoint")
    };
    assert_eq!(
        (pubsub.queue, pubsub.when_full),
        (guard_endpoints::queue::DEFAULT_QUEUE, WhenFull::DropNewest)
    );
    let with = |extra: &str| {
        format!(
            "{ENDPOINTS}[[endpoints]]\nname = \"p\"\nkind = \"redis-pubsub\"\npatterns = [\"p\"]\n{extra}\n"
        )
    };
    let c = Config::from_toml(&with("queue = 10\nwhen_full = \"drop-oldest\"")).unwrap();
    assert!(matches!(
        &c.endpoints[3].source,
        Source::RedisPubsub(p) if (p.queue, p.when_full) == (10, WhenFull::DropOldest)
    ));
    let e = error(&with("queue = 0"));
    assert!(
        e.contains("`endpoints[3].queue` = 0: expected a positive number of messages"),
        "{e}"
    );
    let e = error(&with("when_full = \"block\""));
    assert!(
        e.contains("endpoints[3].when_full") && e.contains("drop-newest"),
        "{e}"
    );
}

#[test]
fn a_stream_endpoint_reads_in_batches_with_bounded_concurrency() {
    let c = Config::from_toml(ENDPOINTS).unwrap();
    let Source::RedisStream(stream) = &c.endpoints[1].source else {
        panic!("a stream")
    };
    assert_eq!((stream.batch, stream.concurrency), (10, 1));
    let with = |extra: &str| {
        format!(
            "{ENDPOINTS}[[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"\n{extra}\n"
        )
    };
    let c = Config::from_toml(&with("batch = 100\nconcurrency = 16")).unwrap();
    assert!(matches!(
        &c.endpoints[3].source,
        Source::RedisStream(s) if (s.batch, s.concurrency) == (100, 16)
    ));
    let e = error(&with("batch = 0"));
    assert!(e.contains("`endpoints[3].batch` = 0"), "{e}");
    let e = error(&with("concurrency = 11"));
    assert!(
        e.contains("`endpoints[3].concurrency` = 11: expected from 1 to the batch (10)"),
        "{e}"
    );
}

#[test]
fn an_empty_key_is_named_as_such() {
    // Found by the fuzzer: `'' = ''` named no key at all.
    let e = Config::from_toml("'' = ''\n").unwrap_err();
    let ConfigError::Invalid { key, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(key, "\"\"");
    let e = Config::from_toml("[locker]\n'' = 1\n").unwrap_err();
    assert!(e.to_string().contains("`locker.\"\"` = set"), "{e}");
}

#[test]
fn nats_endpoints_parse_into_their_delivery_and_refuse_what_cannot_work() {
    use guard_gateway::config::{NatsDelivery, Source};
    let config = Config::from_toml(
        r#"
        [[endpoints]]
        name = "orders"
        kind = "nats"
        url = "nats://127.0.0.1:4222"
        subject = "orders.*"
        queue_group = "billing"
        dead_letter_subject = "orders-dlq"

        [[endpoints]]
        name = "alerts"
        kind = "nats"
        url = "127.0.0.1:4222"
        subject = "alerts.>"
        guard = true

        [[endpoints]]
        name = "jobs"
        kind = "nats-jetstream"
        url = "nats://127.0.0.1:4222"
        stream = "JOBS"
        subjects = ["jobs.>"]
        durable = "gateways"
        ack_wait_ms = 5000
        max_deliver = 3
        "#,
    )
    .unwrap();
    let Source::Nats(orders) = &config.endpoints[0].source else {
        panic!()
    };
    assert_eq!(orders.delivery, NatsDelivery::QueueGroup("billing".into()));
    assert_eq!(orders.dead_letter_subject.as_deref(), Some("orders-dlq"));
    let Source::Nats(alerts) = &config.endpoints[1].source else {
        panic!()
    };
    assert_eq!(alerts.delivery, NatsDelivery::Elected);
    let Source::NatsJetStream(jobs) = &config.endpoints[2].source else {
        panic!()
    };
    assert_eq!((jobs.max_deliver, jobs.ack_wait.as_millis()), (3, 5000));
    assert_eq!(jobs.subjects, vec!["jobs.>".to_owned()]);

    let nats = |extra: &str| {
        format!(
            "[[endpoints]]\nname = \"n\"\nkind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\n{extra}"
        )
    };
    let err = error(&nats("subject = \"a..b\""));
    assert!(err.contains("`endpoints[0].subject` = \"a..b\""), "{err}");
    let err = error(&nats("subject = \"a\"\nqueue_group = \"g\"\nguard = true"));
    assert!(
        err.contains("`endpoints[0].guard` = true") && err.contains("one member already"),
        "{err}"
    );
    let err = error(&nats("subject = \"a\"\ndead_letter_subject = \"dlq.*\""));
    assert!(
        err.contains("`endpoints[0].dead_letter_subject` = \"dlq.*\""),
        "{err}"
    );
    let err = error(&nats("subject = \"a\"\nshare_group = \"g\""));
    assert!(err.contains("share_group"), "{err}");
    let err = error(
        "[[endpoints]]\nname = \"j\"\nkind = \"nats-jetstream\"\nurl = \"nats://h:1\"\nstream = \"A.B\"\ndurable = \"d\"",
    );
    assert!(err.contains("`endpoints[0].stream` = \"A.B\""), "{err}");
    let err = error(
        "[[endpoints]]\nname = \"j\"\nkind = \"nats-jetstream\"\nurl = \"nats://h:1\"\nstream = \"A\"\ndurable = \"d\"\nmax_deliver = 0",
    );
    assert!(err.contains("`endpoints[0].max_deliver` = 0"), "{err}");
}

#[test]
fn rabbitmq_postgres_and_binlog_endpoints_parse_and_refuse_what_cannot_work() {
    use guard_gateway::config::{AmqpDelivery, BinlogStart, Source};
    let config = Config::from_toml(
        r#"
        [[endpoints]]
        name = "orders"
        kind = "rabbitmq"
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        queue = "orders"
        single_active = true
        prefetch = 32

        [[endpoints]]
        name = "alerts"
        kind = "rabbitmq"
        url = "amqp://guest:guest@127.0.0.1:5672/%2f"
        exchange = "alerts"
        guard = true

        [[endpoints]]
        name = "jobs"
        kind = "postgres-queue"
        url = "postgres://postgres@127.0.0.1:5432/app"
        table = "jobs"
        claim_lease_ms = 10000
        max_deliveries = 3

        [[endpoints]]
        name = "cdc"
        kind = "mysql-binlog"
        url = "mysql://root@127.0.0.1:3306/app"
        start = "beginning"
        checkpoint_every = 10
        "#,
    )
    .unwrap();
    let Source::Rabbitmq(orders) = &config.endpoints[0].source else {
        panic!()
    };
    assert_eq!(
        (&orders.delivery, orders.prefetch),
        (
            &AmqpDelivery::WorkQueue {
                queue: "orders".into(),
                single_active: true
            },
            32
        )
    );
    let Source::Rabbitmq(alerts) = &config.endpoints[1].source else {
        panic!()
    };
    assert_eq!(
        alerts.delivery,
        AmqpDelivery::Fanout {
            exchange: "alerts".into(),
            elected: true
        }
    );
    let Source::PostgresQueue(jobs) = &config.endpoints[2].source else {
        panic!()
    };
    assert_eq!(
        (jobs.claim_lease.as_millis(), jobs.max_deliveries),
        (10_000, 3)
    );
    let Source::MysqlBinlog(cdc) = &config.endpoints[3].source else {
        panic!()
    };
    assert_eq!(
        (cdc.start, cdc.checkpoint_every),
        (BinlogStart::Beginning, 10)
    );

    let endpoint =
        |kind: &str, keys: &str| format!("[[endpoints]]\nname = \"e\"\nkind = \"{kind}\"\n{keys}");
    let amqp = "url = \"amqp://guest:guest@h:5672/v\"\n";
    let err = error(&endpoint(
        "rabbitmq",
        &format!("{amqp}queue = \"q\"\nguard = true"),
    ));
    assert!(
        err.contains("`endpoints[0].guard` = true") && err.contains("single_active"),
        "{err}"
    );
    let err = error(&endpoint(
        "rabbitmq",
        &format!("{amqp}queue = \"q\"\nexchange = \"x\""),
    ));
    assert!(err.contains("not both"), "{err}");
    let err = error(&endpoint("rabbitmq", amqp));
    assert!(err.contains("`endpoints[0].queue` = missing"), "{err}");
    let err = error(&endpoint("rabbitmq", &format!("{amqp}queue = \"\"")));
    assert!(err.contains("`endpoints[0].queue` = \"\""), "{err}");
    let err = error(&endpoint(
        "rabbitmq",
        &format!("{amqp}queue = \"q\"\nprefetch = 0"),
    ));
    assert!(err.contains("`endpoints[0].prefetch` = 0"), "{err}");
    let err = error(&endpoint("rabbitmq", "url = \"http://h\"\nqueue = \"q\""));
    assert!(err.contains("`endpoints[0].url`"), "{err}");
    let pg = "url = \"postgres://postgres@h:5432/app\"\n";
    let err = error(&endpoint(
        "postgres-queue",
        &format!("{pg}table = \"a; drop table x\""),
    ));
    assert!(err.contains("\"a; drop table x\""), "{err}");
    let err = error(&endpoint(
        "postgres-queue",
        &format!("{pg}table = \"t\"\nclaim_lease_ms = 0"),
    ));
    assert!(err.contains("`endpoints[0].claim_lease_ms`"), "{err}");
    let err = error(&endpoint("mysql-binlog", "url = \"mysql://root@h:3306\""));
    assert!(
        err.contains("`endpoints[0].url`") && err.contains("must name a database"),
        "{err}"
    );
    let err = error(&endpoint(
        "mysql-binlog",
        "url = \"mysql://root@h:3306/app\"\ncheckpoint_table = \"x`y\"",
    ));
    assert!(
        err.contains("`endpoints[0].checkpoint_table` = \"x`y\""),
        "{err}"
    );
    let err = error(&endpoint(
        "mysql-binlog",
        "url = \"mysql://root@h:3306/app\"\nstart = \"end\"",
    ));
    assert!(err.contains("start"), "{err}");
}

/// An endpoint of `kind` at `url` with `keys`, `${DB_PASSWORD}` set to
/// `TopSecret42`.
fn with_secret(kind: &str, url: &str, keys: &str) -> Result<Config, ConfigError> {
    Config::from_toml_with_env(
        &format!("[[endpoints]]\nname = \"e\"\nkind = \"{kind}\"\nurl = \"{url}\"\n{keys}"),
        |name| (name == "DB_PASSWORD").then(|| "TopSecret42".to_owned()),
    )
}

#[test]
fn a_binlog_url_is_shown_as_written_with_its_password_hidden() {
    for url in [
        "mysql://root:${DB_PASSWORD}@db.example:3306",
        "mysql://root:TopSecret42@db.example:3306",
    ] {
        let e = with_secret("mysql-binlog", url, "")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("TopSecret42"), "{e}");
        assert!(
            e.contains("`endpoints[0].url` = \"mysql://root:***@db.example:3306\"")
                && e.contains("must name a database"),
            "{e}"
        );
    }
    let config = with_secret(
        "mysql-binlog",
        "mysql://root:${DB_PASSWORD}@db.example:3306/app",
        "",
    )
    .unwrap();
    let Source::MysqlBinlog(binlog) = &config.endpoints[0].source else {
        panic!("{config:?}")
    };
    assert_eq!(
        &*binlog.url, "mysql://root:TopSecret42@db.example:3306/app",
        "the reader connects with the expanded URL"
    );
    let debug = format!("{config:?}");
    assert!(!debug.contains("TopSecret42"), "{debug}");
    assert!(
        debug.contains("\"mysql://root:***@db.example:3306/app\""),
        "{debug}"
    );
}

#[test]
fn a_nats_url_is_shown_as_written_with_its_password_hidden() {
    for (kind, keys) in [
        ("nats", "subject = \"a\""),
        ("nats-jetstream", "stream = \"S\"\ndurable = \"d\""),
    ] {
        for (url, shown) in [
            (
                "http://app:${DB_PASSWORD}@nats.example:4222",
                "\"http://app:***@nats.example:4222\"",
            ),
            (
                "http://${DB_PASSWORD}@nats.example:4222",
                "\"http://***@nats.example:4222\"",
            ),
        ] {
            let e = with_secret(kind, url, keys).unwrap_err().to_string();
            assert!(!e.contains("TopSecret42"), "{e}");
            assert!(e.contains(&format!("`endpoints[0].url` = {shown}")), "{e}");
        }
        let config = with_secret(kind, "nats://${DB_PASSWORD}@nats.example:4222", keys).unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("TopSecret42"), "{debug}");
        assert!(
            debug.contains("\"nats://***@nats.example:4222\""),
            "{debug}"
        );
    }
}

#[test]
fn a_configuration_s_debug_and_a_refused_redis_url_show_no_password() {
    let env = |name: &str| (name == "PW").then(|| "TopSecret42".to_owned());
    let config = Config::from_toml_with_env(
        "[locker]\nkind = \"redis\"\nurl = \"redis://:${PW}@10.0.0.5:6379/\"\n\n\
         [[endpoints]]\nname = \"p\"\nkind = \"redis-pubsub\"\npatterns = [\"a\"]\n\n\
         [[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nurl = \"redis://app:TopSecret42@10.0.0.6:6379/\"\nstream = \"s\"\ngroup = \"g\"\n",
        env,
    )
    .unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("TopSecret42"), "{debug}");
    assert!(debug.contains("redis://:***@10.0.0.5:6379/"), "{debug}");
    assert!(debug.contains("redis://app:***@10.0.0.6:6379/"), "{debug}");
    let e = error_with_job("[locker]\nkind = \"redis\"\nurl = \"http://:TopSecret42@h:6379/\"\n");
    assert!(
        !e.contains("TopSecret42") && e.contains("`locker.url` = \"http://:***@h:6379/\""),
        "{e}"
    );
}

/// A secret in a query string, behind a percent-encoded key or inside a
/// quoted key/value string is never shown, in errors or in `Debug`.
#[test]
fn secrets_in_query_strings_and_key_value_strings_are_never_shown() {
    let config = Config::from_toml(&format!(
        "{JOB}[locker]\nkind = \"redis\"\nurl = \"unix:///run/redis.sock?db=1&pass=TopSecret42\"\n"
    ));
    if let Ok(config) = &config {
        let debug = format!("{config:?}");
        assert!(!debug.contains("TopSecret42"), "{debug}");
    }
    if let Err(e) = &config {
        assert!(!e.to_string().contains("TopSecret42"), "{e}");
    }
    for (url, shown) in [
        (
            "postgres://app@db:port/app?passwor%64=TopSecret42",
            "passwor%64=***",
        ),
        (
            "host=db port=x password='a\\\\'TopSecret42'",
            "password=***",
        ),
    ] {
        let e = error_with_job(&format!("[locker]\nkind = \"postgres\"\nurl = \"{url}\"\n"));
        assert!(!e.contains("TopSecret42") && e.contains(shown), "{e}");
    }
}

#[test]
fn a_locker_names_the_lock_service_its_fences_come_from() {
    for (locker, name) in [
        ("kind = \"none\"", "none"),
        ("kind = \"local\"", "local"),
        ("kind = \"redis\"\nurl = \"redis://h:6379/\"", "redis"),
    ] {
        let c = Config::from_toml(&format!("{JOB}[locker]\n{locker}\n")).unwrap();
        assert_eq!(c.locker.lock_service(), name, "{locker}");
    }
    {
        let c = Config::from_toml(&format!(
            "{JOB}[locker]\nkind = \"postgres\"\nurl = \"postgres://app@db/app\"\ntable = \"Locks\"\n"
        ))
        .unwrap();
        assert_eq!(c.locker.lock_service(), "postgres:Locks");
    }
}

/// Mistakes `check` let through (found by mutating the shipped file),
/// each now refused naming its key: what `check` accepts, `run` accepts.
#[test]
fn mistakes_that_once_passed_check_are_refused_with_their_key() {
    let policy = |body: &str| {
        error_with_job(&format!(
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n[ratelimit]\nenabled = true\n[ratelimit.policies.api]\n{body}"
        ))
    };
    // A bucket without its numbers is not silently 100 and 100/s.
    let e = policy("algorithm = \"token-bucket\"\nrate_per_second = 5\n");
    assert!(e.contains("`ratelimit.policies.api.capacity`"), "{e}");
    let e = policy("algorithm = \"leaky-bucket\"\ncapacity = 5\n");
    assert!(
        e.contains("`ratelimit.policies.api.rate_per_second`"),
        "{e}"
    );
    // A rate Redis cannot count (333.333… µs) is refused here, by its key,
    // not at start.
    let e = policy(
        "algorithm = \"token-bucket\"\nbackend = \"redis\"\ncapacity = 5\nrate_per_second = 3\n",
    );
    assert!(
        e.contains("`ratelimit.policies.api.rate_per_second` = 3"),
        "{e}"
    );
    assert!(
        Config::from_toml(&format!(
            "{JOB}[ratelimit]\nenabled = true\n[ratelimit.policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate_per_second = 3\n"
        ))
        .is_ok(),
        "in memory, 3 a second is fine"
    );
    // Durations have upper bounds.
    let e = policy("window_ms = 9223372036854775807\n");
    assert!(
        e.contains("`ratelimit.policies.api.window_ms` = 9223372036854775807"),
        "{e}"
    );
    // Control characters in names that reach keys and log lines.
    for (text, key) in [
        (
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\nprefix = \"a\\nb\"\n",
            "locker.prefix",
        ),
        (
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\\r\\n\"\n",
            "locker.url",
        ),
        (
            "[ratelimit]\ndefault_name = \"d\\u0000\"\n",
            "ratelimit.default_name",
        ),
        (
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n[[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"a\\nb\"\ngroup = \"g\"\n",
            "endpoints[0].stream",
        ),
        (
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n[[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"a\"\ngroup = \"g\\r\"\n",
            "endpoints[0].group",
        ),
        (
            "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1/\"\n[[endpoints]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"a\"\ngroup = \"g\"\ndead_letter_topic = \"d\\t\"\n",
            "endpoints[0].dead_letter_topic",
        ),
        (
            "[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"\\u200b\"\nfilter = \"t\"\n",
            "endpoints[0].host",
        ),
    ] {
        let e = error_with_job(text);
        assert!(e.contains(&format!("`{key}`")), "{text:?}\n gave: {e}");
    }
    // A container's name is a host name all the same.
    assert!(
        Config::from_toml(&format!(
            "{JOB}[[endpoints]]\nname = \"m\"\nkind = \"mqtt\"\nhost = \"mqtt_broker\"\nfilter = \"t\"\n"
        ))
        .is_ok()
    );
    // A long owner is blamed on the owner, not on the first schedule.
    let e = error_with_job(&format!("[guards]\nowner = \"{}\"\n", "o".repeat(5_000)));
    assert!(e.contains("`guards.owner`"), "{e}");
    // A bad policy shows its value.
    let e = error_with_job("[guards]\nfail_policy = \"sometimes\"\n");
    assert!(e.contains("sometimes"), "{e}");
    // A file that is not UTF-8 gets the position of its first bad byte.
    let e = Config::from_bytes(b"[guards]\nowner = \"t\xff\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2"), "{e}");
}

/// `check` prints every value in force, those from defaults included: a
/// file without an owner shows that its keys carry no tenant.
#[test]
fn check_shows_the_values_that_came_from_defaults() {
    let shown = guard_gateway::replica::summary(&Config::from_toml(JOB).unwrap());
    assert!(
        shown.contains(
            "guards     owner none (keys carry no tenant), lease 15s renewed every 5s, slots kept 3600s, fail closed"
        ),
        "{shown}"
    );
    let shown = guard_gateway::replica::summary(
        &Config::from_toml(&format!(
            "{JOB}[ratelimit]\nenabled = true\n[guards]\nowner = \"t1\"\nactive_ttl_ms = 3000\n"
        ))
        .unwrap(),
    );
    assert!(
        shown.contains("owner \"t1\", lease 3s renewed every 1s"),
        "{shown}"
    );
    assert!(
        shown.contains("default (sliding, 100 per 1s, memory, 65536 keys in at most "),
        "{shown}"
    );
}

/// An owner too long for any key the replica will build is refused as
/// `guards.owner`, never blamed on the endpoint beside it; an owner the
/// check lets through fits every elected endpoint's lease key (the
/// longest kind, the binlog's, with a one-letter name).
#[test]
fn an_owner_that_fits_the_schedules_but_not_an_endpoint_is_refused_as_the_owner() {
    use guard_core::lock::{DEFAULT_PREFIX, Scope, once_key};
    for len in 60..140 {
        let owner = "o".repeat(len);
        let text = format!(
            "[guards]\nowner = \"{owner}\"\n\n[[endpoints]]\nname = \"n\"\nkind = \"mysql-binlog\"\nurl = \"mysql://root@127.0.0.1:3306/app\"\n"
        );
        match Config::from_toml(&text) {
            Ok(_) => {
                let scope = Scope::new("endpoint/binlog")
                    .and_then(|s| s.segment("owner", &owner))
                    .and_then(|s| s.segment("node", "n"));
                assert!(
                    scope.is_ok_and(|s| once_key(DEFAULT_PREFIX, &s, "18446744073709551615").is_ok()),
                    "an owner of {len} bytes passes the check and cannot make the binlog's lease key"
                );
            }
            Err(e) => assert!(
                e.to_string().contains("guards.owner"),
                "an owner of {len} bytes blamed elsewhere: {e}"
            ),
        }
    }
}

/// A fully qualified MQTT host (a trailing dot) is a host name.
#[test]
fn an_mqtt_host_with_a_trailing_dot_is_accepted() {
    let config = Config::from_toml(&format!(
        "{JOB}[[endpoints]]\nname = \"t\"\nkind = \"mqtt\"\nhost = \"broker.example.com.\"\nfilter = \"a/#\"\n"
    ));
    assert!(config.is_ok(), "{config:?}");
    // An address with a trailing dot is neither an address nor a name.
    let err = error(&format!(
        "{JOB}[[endpoints]]\nname = \"t\"\nkind = \"mqtt\"\nhost = \"127.0.0.1.\"\nfilter = \"a/#\"\n"
    ));
    assert!(err.contains("endpoints[0].host"), "{err}");
}

/// A syntax error names its line and column, and never echoes the line:
/// it may hold a password (an unclosed quote after a URL) or a control
/// byte a terminal would act on.
#[test]
fn a_syntax_error_names_its_place_and_echoes_no_line() {
    let text =
        "[locker]\nkind = \"redis\"\nurl = \"redis://:HunterPW2@127.0.0.1:6379/ prefix=\"p\"\n";
    let err = Config::from_toml(text).unwrap_err().to_string();
    assert!(err.contains("line 3"), "{err}");
    assert!(!err.contains("HunterPW2"), "the line was echoed: {err}");
    let text = "[locker]\nkind = \"redis\" \u{1b}[31m oops\n";
    let err = Config::from_toml(text).unwrap_err().to_string();
    assert!(err.contains("line 2"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "a raw escape byte was printed: {err:?}"
    );
}

/// A fixed-window policy: an uplink's quota of messages or bytes per
/// aligned window, at a fixed offset from UTC.
#[test]
fn a_fixed_window_policy_states_its_quota_and_counts_bytes_when_asked() {
    let policies = |body: &str| {
        format!(
            "{JOB}[ratelimit]\nenabled = true\n[ratelimit.policies.uplink]\nalgorithm = \"fixed-window\"\n{body}"
        )
    };
    let c = Config::from_toml(&policies(
        "window_ms = 86400000\nlimit = 50000000\nutc_offset = \"+02:00\"\ncost = \"bytes\"\n",
    ))
    .unwrap();
    let uplink = &c.ratelimit.as_ref().unwrap().policies[0];
    assert_eq!(uplink.cost, Cost::Bytes);
    let PolicyAlgorithm::FixedWindow(w) = uplink.algorithm else {
        panic!("{:?}", uplink.algorithm)
    };
    assert_eq!(w.limit(), 50_000_000);
    assert_eq!(w.period(), Duration::from_secs(86_400));
    assert_eq!(
        w.offset(),
        Duration::from_secs(22 * 3_600),
        "local midnight at +02:00 is 22:00 UTC"
    );
    let c = Config::from_toml(&policies("window_ms = 3600000\nlimit = 10\n")).unwrap();
    let hourly = &c.ratelimit.as_ref().unwrap().policies[0];
    assert_eq!(
        hourly.cost,
        Cost::Messages,
        "a message costs one by default"
    );

    // A quota states its numbers.
    let e = error(&policies("limit = 10\n"));
    assert!(
        e.contains("`ratelimit.policies.uplink.window_ms` = missing")
            && e.contains("states its window_ms and limit"),
        "{e}"
    );
    let e = error(&policies("window_ms = 1000\n"));
    assert!(
        e.contains("`ratelimit.policies.uplink.limit` = missing"),
        "{e}"
    );
    let e = error(&policies("window_ms = 1000\nlimit = 0\n"));
    assert!(e.contains("`ratelimit.policies.uplink.limit` = 0"), "{e}");
    let e = error(&policies("window_ms = 604800001\nlimit = 1\n"));
    assert!(e.contains("`ratelimit.policies.uplink.window_ms`"), "{e}");
    // Offsets are written one way, and a zone that moves is no offset.
    for bad in ["Europe/Berlin", "+2:00", "+24:00", "UTC", ""] {
        let e = error(&policies(&format!(
            "window_ms = 1000\nlimit = 1\nutc_offset = {bad:?}\n"
        )));
        assert!(
            e.contains(&format!("`ratelimit.policies.uplink.utc_offset` = {bad:?}"))
                && e.contains("daylight saving"),
            "{bad}: {e}"
        );
    }
    // Keys of other algorithms are refused, not ignored.
    let e = error(&policies("window_ms = 1000\nlimit = 1\ncapacity = 5\n"));
    assert!(
        e.contains("`ratelimit.policies.uplink.capacity`")
            && e.contains("no `capacity` for algorithm fixed-window"),
        "{e}"
    );
    let e = error(&format!(
        "{JOB}[ratelimit]\nenabled = true\n[ratelimit.policies.b]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate_per_second = 5\nutc_offset = \"Z\"\n"
    ));
    assert!(
        e.contains("no `utc_offset` for algorithm token-bucket"),
        "{e}"
    );
    // A sliding window keeps an instant per unit: no bytes.
    let e = error(&format!(
        "{JOB}[ratelimit]\nenabled = true\n[ratelimit.policies.s]\ncost = \"bytes\"\n"
    ));
    assert!(
        e.contains("`ratelimit.policies.s.cost` = \"bytes\"")
            && e.contains("count bytes with fixed-window or a bucket"),
        "{e}"
    );
    // On Redis too.
    let c = Config::from_toml(&format!(
        "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{}",
        policies("backend = \"redis\"\nwindow_ms = 1000\nlimit = 1\nutc_offset = \"-09:30\"\n")
    ))
    .unwrap();
    let on_redis = &c.ratelimit.as_ref().unwrap().policies[0];
    assert_eq!(on_redis.backend, Backend::Redis);
}

/// A policy that counts bytes must be able to pass the largest message of
/// the endpoints it limits, and limits no schedule.
#[test]
fn a_bytes_quota_covers_one_message_and_limits_no_schedule() {
    let file = |quota: u32, max_payload: u32| {
        format!(
            "{ENDPOINTS}\n[ratelimit]\nenabled = true\n[ratelimit.policies.uplink]\nalgorithm = \"fixed-window\"\nwindow_ms = 60000\nlimit = {quota}\ncost = \"bytes\"\n\n[[endpoints]]\nname = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"\nlimit = \"uplink\"\nwhen_limited = \"dead-letter\"\nmax_payload_bytes = {max_payload}\n"
        )
    };
    let c = Config::from_toml(&file(4096, 4096)).unwrap();
    assert_eq!(c.endpoints[3].limit.as_ref().unwrap().cost, Cost::Bytes);
    let e = error(&file(4095, 4096));
    assert!(
        e.contains("`endpoints[3].limit` = \"uplink\"")
            && e.contains("quota of 4095, below this endpoint's max_payload_bytes = 4096"),
        "{e}"
    );
    let e = error(
        "[ratelimit]\nenabled = true\n[ratelimit.policies.uplink]\nalgorithm = \"fixed-window\"\nwindow_ms = 60000\nlimit = 10\ncost = \"bytes\"\n\n[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\nlimit = \"uplink\"\n",
    );
    assert!(
        e.contains("`schedules[0].limit` = \"uplink\"") && e.contains("counts runs"),
        "{e}"
    );
}

/// The README's quota example is a policy `check` accepts, as written.
#[test]
fn the_readme_quota_example_parses() {
    let readme = include_str!("../../../README.md");
    let block: String = readme
        .split("[ratelimit.policies.cellular]")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README's quota example")
        .lines()
        .map(|l| format!("{}\n", l.trim()))
        .collect();
    let file =
        format!("{ENDPOINTS}\n[ratelimit]\nenabled = true\n[ratelimit.policies.cellular]\n{block}");
    let c = Config::from_toml(&file).expect("the README's quota");
    let cellular = &c.ratelimit.as_ref().unwrap().policies[0];
    assert_eq!(
        (cellular.backend, cellular.cost),
        (Backend::Redis, Cost::Bytes)
    );
    assert!(
        matches!(cellular.algorithm, PolicyAlgorithm::FixedWindow(w) if w.limit() == 50_000_000)
    );
}

const STREAM_TO: &str = "[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"g\"\n";

/// A sink is named by an endpoint's `to`, read with its defaults; the
/// retry policy doubles from its first delay to its longest.
#[test]
fn a_sink_is_read_with_its_defaults_and_named_by_an_endpoint() {
    use guard_gateway::config::SinkKind;
    let config = Config::from_toml(&format!(
        "{STREAM_TO}to = \"uplink\"\n\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"http://127.0.0.1:8080/in\"\n"
    ))
    .unwrap();
    assert_eq!(config.endpoints[0].to.as_deref(), Some("uplink"));
    let sink = &config.sinks[0];
    let SinkKind::Http(target) = &sink.kind else {
        unreachable!()
    };
    assert_eq!(target.url.as_str(), "http://127.0.0.1:8080/in");
    assert_eq!(target.timeout, Duration::from_secs(10));
    assert_eq!(target.content_type, "application/octet-stream");
    assert_eq!(target.in_flight, 1, "one request at a time, in order");
    assert_eq!(sink.in_flight().get(), 1);
    assert_eq!(sink.retry.max_attempts(), 10);
    assert_eq!(sink.retry.initial_delay(), Duration::from_millis(500));
    assert_eq!(sink.retry.max_delay(), Duration::from_secs(30));
    assert!(sink.retry.is_exponential());
    let config = Config::from_toml(&format!(
        "{STREAM_TO}\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"https://cloud.example/in\"\ntimeout_ms = 2500\ncontent_type = \"application/json\"\nin_flight = 8\nretries = 3\nretry_delay_ms = 50\nmax_retry_delay_ms = 400\n"
    ))
    .unwrap();
    assert_eq!(config.endpoints[0].to, None, "no `to`: only reported");
    assert_eq!(config.sinks[0].limit, None);
    let no_retry = Config::from_toml(&format!(
        "{STREAM_TO}\n[[sinks]]\nname = \"u\"\nkind = \"http\"\nurl = \"http://h/\"\nretries = 0\n"
    ))
    .unwrap();
    assert_eq!(
        no_retry.sinks[0].retry.max_attempts(),
        0,
        "retries can be turned off"
    );
    let limited = Config::from_toml(&format!(
        "{STREAM_TO}to = \"uplink\"\n\n[ratelimit]\nenabled = true\n[ratelimit.policies.daily]\nalgorithm = \"fixed-window\"\nwindow_ms = 86400000\nlimit = 1000000\ncost = \"bytes\"\n\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"http://h/\"\nlimit = \"daily\"\n"
    ))
    .unwrap();
    assert_eq!(
        limited.sinks[0].limit,
        Some(guard_gateway::config::SinkLimit {
            limiter: "daily".into(),
            cost: Cost::Bytes
        })
    );
    let js = Config::from_toml(&format!(
        "{STREAM_TO}to = \"cloud\"\n\n[[sinks]]\nname = \"cloud\"\nkind = \"nats-jetstream\"\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"uplink.orders\"\ntimeout_ms = 3000\n"
    ))
    .unwrap();
    let SinkKind::JetStream(target) = &js.sinks[0].kind else {
        unreachable!()
    };
    assert_eq!(
        (target.subject.as_str(), target.timeout),
        ("uplink.orders", Duration::from_secs(3))
    );
    let sink = &config.sinks[0];
    let SinkKind::Http(target) = &sink.kind else {
        unreachable!()
    };
    assert_eq!(target.timeout, Duration::from_millis(2500));
    assert_eq!(target.content_type, "application/json");
    assert_eq!((target.in_flight, sink.in_flight().get()), (8, 8));
    assert_eq!(sink.retry.max_attempts(), 3);
    assert_eq!(
        (sink.retry.initial_delay(), sink.retry.max_delay()),
        (Duration::from_millis(50), Duration::from_millis(400))
    );
}

/// Each wrong sink setting is refused naming its key: an unknown sink, a
/// kind, a URL, a media type, a timeout, delays out of order, TLS files
/// on a plain URL, a repeated name, an unknown key.
#[test]
fn a_bad_sink_or_a_to_naming_none_is_refused_with_its_key() {
    let sink = |extra: &str| {
        error(&format!(
            "{STREAM_TO}to = \"uplink\"\n\n[[sinks]]\nname = \"uplink\"\n{extra}"
        ))
    };
    let http = |extra: &str| {
        sink(&format!(
            "kind = \"http\"\nurl = \"http://127.0.0.1:1/\"\n{extra}"
        ))
    };
    let cases: Vec<(String, &str)> = vec![
        (
            error(&format!("{STREAM_TO}to = \"nowhere\"\n")),
            "endpoints[0].to",
        ),
        (error(&format!("{STREAM_TO}to = 3\n")), "endpoints[0].to"),
        (sink("kind = \"kafka\"\nurl = \"x\"\n"), "sinks[0].kind"),
        (sink("url = \"http://h/\"\n"), "sinks[0].kind"),
        (
            sink("kind = \"http\"\nurl = \"ftp://h/\"\n"),
            "sinks[0].url",
        ),
        (
            sink("kind = \"http\"\nurl = \"http://user:secret@h/\"\n"),
            "sinks[0].url",
        ),
        (sink("kind = \"http\"\n"), "sinks[0]"),
        (http("content_type = \"\"\n"), "sinks[0].content_type"),
        (http("content_type = \"json\"\n"), "sinks[0].content_type"),
        (http("timeout_ms = 0\n"), "sinks[0].timeout_ms"),
        (http("in_flight = 0\n"), "sinks[0].in_flight"),
        (
            http("headers = { Host = \"x\" }\n"),
            "sinks[0].headers.Host",
        ),
        (
            http("headers = { \"Bad Name\" = \"x\" }\n"),
            "sinks[0].headers.Bad Name",
        ),
        (
            http("headers = { Authorization = \"${GUARD_NO_SUCH_VARIABLE}\" }\n"),
            "sinks[0].headers.Authorization",
        ),
        (http("in_flight = 257\n"), "sinks[0].in_flight"),
        (
            http("in_flight = 9223372036854775807\n"),
            "sinks[0].in_flight",
        ),
        (
            http("retry_delay_ms = 500\nmax_retry_delay_ms = 100\n"),
            "sinks[0].max_retry_delay_ms",
        ),
        (http("retries = 100000\n"), "sinks[0].retries"),
        (http("tls_ca = \"ca.pem\"\n"), "sinks[0].tls_ca"),
        (http("proxy = \"x\"\n"), "sinks[0].proxy"),
        (http("limit = \"nowhere\"\n"), "sinks[0].limit"),
        (
            error(&format!(
                "{STREAM_TO}\n[[sinks]]\nname = \"{}\"\nkind = \"http\"\nurl = \"http://h/\"\n",
                "n".repeat(5000)
            )),
            "sinks[0].name",
        ),
        (
            sink("kind = \"http\"\nurl = \"http://127.0.0.1:99999/in\"\n"),
            "sinks[0].url",
        ),
        (
            sink("kind = \"nats-jetstream\"\nurl = \"nats://h:4222\"\nsubject = \"uplink.>\"\n"),
            "sinks[0].subject",
        ),
        (
            sink("kind = \"nats-jetstream\"\nurl = \"http://h\"\nsubject = \"u\"\n"),
            "sinks[0].url",
        ),
        (
            sink("kind = \"redis-stream\"\nstream = \"\"\n"),
            "sinks[0].stream",
        ),
        (
            sink("kind = \"redis-stream\"\nstream = \"s\"\nduplicate_window_ms = 0\n"),
            "sinks[0].duplicate_window_ms",
        ),
        (
            sink("kind = \"redis-stream\"\nstream = \"s\"\nurl = \"http://h\"\n"),
            "sinks[0].url",
        ),
        (
            error_with_job("[[sinks]]\nname = \"s\"\nkind = \"redis-stream\"\nstream = \"s\"\n"),
            "sinks[0].url",
        ),
        (
            http("\n[[sinks]]\nname = \"uplink\"\nkind = \"http\"\nurl = \"http://h/\"\n"),
            "sinks[1].name",
        ),
        (http("[sinks.queue]\n"), "sinks[0].queue"),
        (http("[sinks.queue]\ndir = \"\"\n"), "sinks[0].queue.dir"),
        (
            http("[sinks.queue]\ndir = \"queue\"\n"),
            "sinks[0].queue.dir",
        ),
        (
            error(&format!("{STREAM_TO}\n[dead_letters]\ndir = \"letters\"\n")),
            "dead_letters.dir",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nmax_bytes = 100\n"),
            "sinks[0].queue.max_bytes",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nsync = \"sometimes\"\n"),
            "sinks[0].queue.sync",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nsync = \"every-write\"\nsync_ms = 5\n"),
            "sinks[0].queue.sync_ms",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nsync_ms = 0\n"),
            "sinks[0].queue.sync_ms",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nwhen_full = \"drop\"\n"),
            "sinks[0].queue.when_full",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nwhen_full = \"refuse\"\nfull_wait_ms = 10\n"),
            "sinks[0].queue.full_wait_ms",
        ),
        (
            http("[sinks.queue]\ndir = \"/q\"\nsegment = 1\n"),
            "sinks[0].queue.segment",
        ),
        (
            sink("kind = \"mqtt\"\nhost = \"h\"\ntopic = \"up/#\"\n"),
            "sinks[0].topic",
        ),
        (sink("kind = \"mqtt\"\nhost = \"h\"\n"), "sinks[0]"),
        (
            sink("kind = \"mqtt\"\nhost = \"mqtt://h\"\ntopic = \"t\"\n"),
            "sinks[0].host",
        ),
        (
            sink("kind = \"mqtt\"\nhost = \"h\"\nport = 0\ntopic = \"t\"\n"),
            "sinks[0].port",
        ),
        (
            sink(
                "kind = \"mqtt\"\nhost = \"h\"\ntopic = \"t\"\ntls = false\ntls_ca = \"ca.pem\"\n",
            ),
            "sinks[0].tls_ca",
        ),
        (
            sink("kind = \"mqtt\"\nhost = \"h\"\ntopic = \"t\"\nclient_id = \"\"\n"),
            "sinks[0].client_id",
        ),
        // A queue's refusals have nowhere to go without dead letters.
        (http("[sinks.queue]\ndir = \"/q\"\n"), "[dead_letters]"),
        (
            error(&format!("{STREAM_TO}\n[dead_letters]\n")),
            "dead_letters",
        ),
        (
            error(&format!("{STREAM_TO}\n[dead_letters]\ndir = \"\"\n")),
            "dead_letters.dir",
        ),
        (
            error(&format!(
                "{STREAM_TO}\n[dead_letters]\ndir = \"/d\"\nmax_bytes = 10\n"
            )),
            "dead_letters.max_bytes",
        ),
        (
            http(
                "[sinks.queue]\ndir = \"/q\"\n\n[[sinks]]\nname = \"b\"\nkind = \"http\"\nurl = \"http://h/\"\n[sinks.queue]\ndir = \"/q\"\n",
            ),
            "sinks[1].queue.dir",
        ),
    ];
    for (message, key) in cases {
        assert!(message.contains(key), "{key}: {message}");
        assert!(!message.contains("secret"), "a password shown: {message}");
    }
}

/// A sink that writes where its endpoint reads is refused naming the
/// endpoint's `to`: the same stream on the same server, an MQTT topic the
/// endpoint's filter matches on the same broker, a NATS subject the
/// endpoint's subject or stream takes in; elsewhere it is taken.
#[test]
fn a_sink_writing_where_its_endpoint_reads_is_refused() {
    let routed = |endpoint: &str, sink: &str| {
        Config::from_toml(&format!(
            "{ENDPOINTS}[[endpoints]]\nname = \"e\"\n{endpoint}\nto = \"up\"\n\n[[sinks]]\nname = \"up\"\n{sink}\n"
        ))
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    let stream = "kind = \"redis-stream\"\nstream = \"orders\"\ngroup = \"g\"";
    let mqtt = "kind = \"mqtt\"\nhost = \"broker\"\nfilter = \"plant/#\"";
    let nats = "kind = \"nats\"\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"up.*\"";
    let jetstream = "kind = \"nats-jetstream\"\nurl = \"nats://127.0.0.1:4222\"\nstream = \"UP\"\nsubjects = [\"up.>\"]\ndurable = \"d\"";
    for (endpoint, sink, place) in [
        (
            stream,
            "kind = \"redis-stream\"\nstream = \"orders\"",
            "the stream \"orders\"",
        ),
        (
            mqtt,
            "kind = \"mqtt\"\nhost = \"broker\"\ntopic = \"plant/line1\"",
            "the topic \"plant/line1\"",
        ),
        (
            mqtt,
            "kind = \"mqtt\"\nhost = \"broker\"\ntopic = \"plant\"",
            "the topic \"plant\"",
        ),
        (
            nats,
            "kind = \"nats-jetstream\"\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"up.orders\"",
            "the subject \"up.orders\"",
        ),
        (
            jetstream,
            "kind = \"nats-jetstream\"\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"up.a.b\"",
            "the subject \"up.a.b\"",
        ),
    ] {
        let err = routed(endpoint, sink).unwrap_err();
        assert!(
            err.contains("`endpoints[3].to` = \"up\"") && err.contains(place),
            "{endpoint} -> {sink}: {err}"
        );
    }
    for (endpoint, sink) in [
        (stream, "kind = \"redis-stream\"\nstream = \"uplink\""),
        (
            stream,
            "kind = \"redis-stream\"\nurl = \"redis://cloud.example:6379\"\nstream = \"orders\"",
        ),
        (
            mqtt,
            "kind = \"mqtt\"\nhost = \"cloud\"\ntopic = \"plant/line1\"",
        ),
        (
            mqtt,
            "kind = \"mqtt\"\nhost = \"broker\"\ntopic = \"cloud/line1\"",
        ),
        (
            nats,
            "kind = \"nats-jetstream\"\nurl = \"nats://127.0.0.1:4222\"\nsubject = \"up.a.b\"",
        ),
        (stream, "kind = \"http\"\nurl = \"http://127.0.0.1:8080/\""),
    ] {
        routed(endpoint, sink).unwrap_or_else(|e| panic!("{endpoint} -> {sink}: {e}"));
    }
}

/// A schedule runs a command or sends to a sink, never both; each key of
/// a command needs `run`, a `to` names a sink, an empty program is
/// refused.
#[test]
fn a_schedule_action_is_a_command_or_a_sink_and_each_key_is_checked() {
    use guard_gateway::config::Action;
    let config = Config::from_toml(
        "[[schedules]]\nrouter = \"backup\"\nevery_ms = 60000\nrun = [\"/usr/bin/backup\", \"--fast\"]\ntimeout_ms = 5000\nretries = 2\nexclusive = true\n",
    )
    .unwrap();
    let schedule = &config.schedules[0];
    assert!(schedule.exclusive);
    let Action::Command(command) = &schedule.action else {
        panic!("{:?}", schedule.action)
    };
    assert_eq!(command.argv, ["/usr/bin/backup", "--fast"]);
    assert_eq!(command.timeout, Duration::from_secs(5));
    assert_eq!(command.retry.max_attempts(), 2);
    let config =
        Config::from_toml("[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\nrun = [\"true\"]\n")
            .unwrap();
    let Action::Command(command) = &config.schedules[0].action else {
        unreachable!()
    };
    assert_eq!(command.retry.max_attempts(), 0, "no retry unless asked");
    assert_eq!(command.timeout, Duration::from_secs(600));
    let schedule = |extra: &str| {
        error(&format!(
            "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\n{extra}"
        ))
    };
    for (message, key) in [
        (schedule("run = []\n"), "schedules[0].run"),
        (schedule("run = [\"\"]\n"), "schedules[0].run"),
        (schedule("timeout_ms = 5\n"), "schedules[0].timeout_ms"),
        (
            schedule("run = [\"true\"]\ntimeout_ms = 0\n"),
            "schedules[0].timeout_ms",
        ),
        (schedule("to = \"nowhere\"\n"), "schedules[0].to"),
        (
            schedule("run = [\"true\"]\nto = \"x\"\n"),
            "schedules[0].to",
        ),
        (schedule("exclusive = \"yes\"\n"), "schedules[0].exclusive"),
    ] {
        assert!(message.contains(key), "{key}: {message}");
    }
}

/// The gateway README's first TOML block after `marker`.
fn readme_block(marker: &str) -> &'static str {
    let readme = include_str!("../README.md");
    readme
        .split(marker)
        .nth(1)
        .and_then(|rest| rest.split("```toml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .unwrap_or_else(|| panic!("a TOML block after {marker:?} in the README"))
}

/// The README's sinks (all four kinds), its queue and its dead letters
/// are configurations `check` accepts, as written.
#[test]
fn the_readme_sink_queue_and_dead_letter_examples_parse() {
    let env = |name: &str| match name {
        "NATS_URL" => Some("nats://127.0.0.1:4222".to_owned()),
        "UPLINK_URL" => Some("https://cloud.example/ingest".to_owned()),
        "UPLINK_TOKEN" => Some("s3cret".to_owned()),
        _ => None,
    };
    let sinks = readme_block("**Sinks: the gateway forwards.**");
    let c = Config::from_toml_with_env(&format!("{STREAM_TO}to = \"bridge\"\n\n{sinks}"), env)
        .expect("the README's sinks");
    let kinds: Vec<&str> = c.sinks.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(kinds, ["uplink", "archive", "cloud", "bridge"]);
    let queue = readme_block("**Store-and-forward: a queue on disk.**");
    let letters = readme_block("**Dead letters on disk.**");
    let c = Config::from_toml_with_env(
        &format!("{STREAM_TO}to = \"uplink\"\n\n{queue}\n{letters}"),
        env,
    )
    .expect("the README's queue and dead letters");
    let queue = c.sinks[0].queue.as_ref().expect("a queue");
    assert_eq!(queue.settings.max_bytes(), 64 << 20);
    assert!(c.dead_letters.is_some());
}

/// `[ratelimit] memory_bytes` sizes every in-memory table in bytes, the
/// keys' text included: each limiter built from it holds as many whole
/// shards as fit, and says so in its byte budget; a size that holds no
/// shard, or one given beside `memory_keys`, is refused by name.
#[test]
fn in_memory_limiter_tables_are_sized_in_bytes() {
    let text = |memory: &str| {
        format!(
            "{JOB}[ratelimit]\nenabled = true\n{memory}\n\
             [ratelimit.policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 5\nrate_per_second = 5\n\
             [ratelimit.policies.wide]\nalgorithm = \"sliding\"\nwindow_ms = 60000\nlimit = 4000\n"
        )
    };
    let budget = 48 << 20;
    let config = Config::from_toml(&text(&format!("memory_bytes = {budget}"))).unwrap();
    let built = smol::block_on(guard_gateway::replica::build(&config)).unwrap();
    let mut sizes = Vec::new();
    for limiter in built.limiters.iter() {
        let held = limiter.keys_held().expect("an in-memory table");
        assert!(held.max_bytes <= budget, "{}: {held:?}", limiter.name());
        assert!(held.capacity >= 1024, "{}: {held:?}", limiter.name());
        sizes.push((limiter.name().to_owned(), held.capacity));
    }
    // A bucket's key costs far less than a window of 4,000 instants.
    let capacity = |name: &str| sizes.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(capacity("api") > 50 * capacity("wide"), "{sizes:?}");
    // The log of 4,096 instants is 32 KiB a key: its table needs 32 MiB
    // at least, the least it names.
    let small = error(&text("memory_bytes = 1000000"));
    assert!(
        small.contains("`ratelimit.memory_bytes` = 1000000: expected at least 33")
            && small.contains(
                "bytes: the table of ratelimit.policies.wide holds whole shards of 1024 keys at \
                 up to 32"
            ),
        "{small}"
    );
    assert!(
        error(&text("memory_keys = 1024\nmemory_bytes = 50000000")).contains(
            "`ratelimit.memory_bytes` = 50000000: expected unset while ratelimit.memory_keys is set"
        ),
        "{}",
        error(&text("memory_keys = 1024\nmemory_bytes = 50000000"))
    );
    let huge = error(&text("memory_bytes = 9000000000000000000"));
    assert!(
        huge.contains("`ratelimit.memory_bytes` = 9000000000000000000: expected at most"),
        "{huge}"
    );
    assert!(
        error(&text("memory_keys = 0")).contains("`ratelimit.memory_keys` = 0"),
        "{}",
        error(&text("memory_keys = 0"))
    );
}
