//! The TOML configuration: a valid file, and each kind of invalid value
//! with the message it gets.

use guard_core::guard::FailPolicy;
use guard_endpoints::config::{
    AlgorithmName, Backend, ConfigError, FileConfig, LockerKind, PolicyAlgorithm, RedisMode,
};

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
    FileConfig::from_toml(text).unwrap_err().to_string()
}

#[test]
fn a_valid_file_parses_with_every_section() {
    let c = FileConfig::from_toml(VALID).unwrap();
    assert!(c.ratelimit.enabled);
    assert_eq!(
        c.ratelimit.policies["api"].algorithm,
        AlgorithmName::TokenBucket
    );
    let policies = c.ratelimit.resolved().unwrap();
    let names: Vec<_> = policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        ["api", "uplink", "default"],
        "the default limiter is added"
    );
    assert_eq!(policies[0].backend, Backend::Redis);
    assert!(matches!(
        policies[1].algorithm,
        PolicyAlgorithm::LeakyBucket(_)
    ));
    assert!(matches!(policies[2].algorithm, PolicyAlgorithm::Sliding(w) if w.limit() == 100));
    assert_eq!(policies[2].key_prefix, "guard:rl");
    assert_eq!(
        (c.locker.kind, c.locker.mode),
        (LockerKind::Redis, RedisMode::Standalone)
    );
    assert_eq!(c.guards.fail_policy(), FailPolicy::FailOpen);
    assert_eq!(c.guards.active().unwrap().interval().as_millis(), 500);
    assert_eq!(c.schedules.len(), 2);
    assert_eq!(c.active[0].name, "sensors");
    assert_eq!(c.metrics.prometheus.as_deref(), Some("127.0.0.1:9000"));
}

#[test]
fn an_empty_file_is_a_single_process_with_defaults() {
    let c = FileConfig::from_toml("").unwrap();
    assert_eq!(c.locker.kind, LockerKind::None);
    assert!(!c.ratelimit.enabled);
    assert_eq!(c.guards.once_ttl().unwrap().as_duration().as_secs(), 3600);
}

#[test]
fn unknown_keys_are_named() {
    let e = error("[locker]\nkind = \"local\"\nurll = \"x\"\n");
    assert!(e.contains("unknown field `urll`"), "{e}");
    let e = error("[ratelimit]\nenabeld = true\n");
    assert!(e.contains("enabeld"), "{e}");
    let e = error("[nonsense]\n");
    assert!(e.contains("nonsense"), "{e}");
}

#[test]
fn bad_enumerations_name_the_allowed_values() {
    let e = error("[ratelimit.policies.x]\nalgorithm = \"fixed-window\"\n");
    assert!(
        e.contains("fixed-window") && e.contains("`sliding`, `token-bucket`, `leaky-bucket`"),
        "{e}"
    );
    let e = error("[ratelimit]\nbackend = \"postgres\"\n");
    assert!(
        e.contains("postgres") && e.contains("`memory` or `redis`"),
        "{e}"
    );
    let e = error("[locker]\nkind = \"etcd\"\n");
    assert!(
        e.contains("etcd") && e.contains("`none`, `local`, `redis`"),
        "{e}"
    );
    let e = error("[guards]\nfail_policy = \"maybe\"\n");
    assert!(
        e.contains("maybe") && e.contains("`closed` or `open`"),
        "{e}"
    );
}

#[test]
fn a_locker_prefix_with_a_brace_is_refused_before_it_reaches_redis() {
    let e =
        error("[locker]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379/\"\nprefix = \"p{\"\n");
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
            "`ratelimit.policies.default.window_ms` = 0: expected a positive number of milliseconds",
        ),
        (
            "[ratelimit]\nenabled = true\nlimit = 0\n",
            "`ratelimit.policies.default.limit` = 0: expected between 1 and 4096",
        ),
        (
            "[ratelimit]\nenabled = true\n[ratelimit.policies.api]\nalgorithm = \"token-bucket\"\ncapacity = 0\n",
            "`ratelimit.policies.api.capacity` = 0: expected a positive number",
        ),
        (
            "[ratelimit]\nenabled = true\n[ratelimit.policies.api]\nalgorithm = \"leaky-bucket\"\nrate_per_second = 0\n",
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
            "`schedules[0].router` = \"\": expected a non-empty router id",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\n",
            "`schedules[0].every_ms` = missing: expected `every_ms` or `cron`",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\ncron = \"* * * * * *\"\n",
            "either `every_ms` or `cron`, not both",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\ncron = \"* * * * *\"\n",
            "`schedules[0].cron` = \"* * * * *\"",
        ),
        (
            "[[schedules]]\nrouter = \"r\"\nevery_ms = 1000\n[[schedules]]\nrouter = \"r\"\nevery_ms = 5000\n",
            "`schedules[1].router` = \"r\": expected a router id unique",
        ),
        (
            "[metrics]\nprometheus = \"localhost\"\n",
            "`metrics.prometheus` = \"localhost\"",
        ),
    ];
    for (text, expected) in cases {
        let e = error(text);
        assert!(
            e.contains(expected),
            "{text:?}\n gave: {e}\n wanted: {expected}"
        );
    }
}

#[test]
fn wrong_types_are_parse_errors_naming_the_key() {
    let e = error("[ratelimit]\nwindow_ms = -5\n");
    assert!(e.contains("window_ms"), "{e}");
    let e = error("[guards]\nowner = 7\n");
    assert!(e.contains("owner"), "{e}");
    assert!(matches!(
        FileConfig::from_toml("[guards"),
        Err(ConfigError::Parse(_))
    ));
}

#[test]
fn a_missing_file_is_a_read_error() {
    let e = FileConfig::from_path(std::path::Path::new("/nonexistent/gateway.toml")).unwrap_err();
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
fn endpoints_of_each_kind_parse() {
    use guard_endpoints::config::EndpointKind;
    let c = FileConfig::from_toml(ENDPOINTS).unwrap();
    let kinds: Vec<EndpointKind> = c.endpoints.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EndpointKind::RedisPubsub,
            EndpointKind::RedisStream,
            EndpointKind::Mqtt
        ]
    );
    assert_eq!(c.endpoints[2].share_group.as_deref(), Some("gateways"));
}

#[test]
fn endpoint_mistakes_name_the_key_and_what_is_expected() {
    let with = |extra: &str| format!("{ENDPOINTS}\n[[endpoints]]\n{extra}\n");
    let cases = [
        (
            "name = \"x\"\nkind = \"redis-pubsub\"",
            "`endpoints[3].patterns` = missing: expected at least one channel pattern",
        ),
        (
            "name = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"",
            "`endpoints[3].group` = missing",
        ),
        (
            "name = \"x\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\npatterns = [\"p\"]",
            "`endpoints[3].patterns` = set: expected no `patterns` for kind Mqtt",
        ),
        (
            "name = \"x\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"\nshare_group = \"g\"\nguard = true",
            "no guard with `share_group`",
        ),
        (
            "name = \"orders\"\nkind = \"mqtt\"\nhost = \"h\"\nfilter = \"t\"",
            "`endpoints[3].name` = \"orders\": expected a unique name",
        ),
        ("name = \"x\"\nkind = \"kafka\"", "unknown variant `kafka`"),
    ];
    for (extra, expected) in cases {
        let message = error(&with(extra));
        assert!(message.contains(expected), "{extra}: {message}");
    }
    // A Redis endpoint needs a URL when there is no standalone Redis locker.
    let message = error(
        "[[endpoints]]\nname = \"x\"\nkind = \"redis-stream\"\nstream = \"s\"\ngroup = \"g\"",
    );
    assert!(
        message.contains("`endpoints[0].url` = missing"),
        "{message}"
    );
}
