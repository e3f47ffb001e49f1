//! From the file as written to a validated [`Config`]: every check that
//! parsing alone cannot make, each error naming its dotted key.

use std::collections::HashSet;
use std::time::Duration;

use guard_core::guard::{ActiveConfig, ActiveTiming, FailPolicy};
use guard_core::lock::{
    DEFAULT_PREFIX, KeyError, MAX_KEY_LEN, MAX_SCOPE_LEN, Scope, Ttl, once_key,
};
use guard_core::slot::{Every, Schedule as _, UnixMillis};
use guard_redis::Topology;
use guard_std::CronSchedule;

use super::check::{
    Env, MAX_LEASE_MS, MAX_TIMEOUT_MS, bounded, longest_endpoint_component, printable, redis_tls,
    redis_url, retry,
};
use super::ratelimit::{bytes_fit, limiter, rate_limits};
use super::raw;
use super::tls::{TlsFiles, TlsKeys};
use super::{
    Action, Backend, CommandAction, Config, ConfigError, Cost, Endpoint, EndpointLimit, Guards,
    LimitKey, Locker, Metrics, Policy, RedactedUrl, RedisLocker, Schedule, ScheduleLimit, Timing,
    WhenLimited, invalid,
};

/// How long a limited message waits by default before it is dead-lettered.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(5);

/// Upper bounds of durations, so that a typo (an extra digit, a value in
/// the wrong unit) is an error rather than a job that never runs or a
/// lease Redis cannot store.
const MAX_PERIOD_MS: u64 = 366 * 24 * 3600 * 1000; // a year
const MAX_ONCE_TTL_S: u64 = 366 * 24 * 3600; // a year
/// A Redis locker's request timeout unless `request_timeout_ms` is set
/// (the other kinds take their crate's own default).
const REDIS_LOCKER_TIMEOUT_MS: u64 = 500;
const MAX_WAIT_MS: u64 = 24 * 3600 * 1000; // a day
const MAX_PAYLOAD_BYTES: u64 = 512 << 20; // Redis's own limit for a value

/// Checks that `scope`, with a delivery key as long as a slot's, still
/// fits the guards' key limit, so a name that is too long is refused here
/// and not when the replica starts.
fn fits_key(key: &str, value: &str, scope: Result<Scope, KeyError>) -> Result<(), ConfigError> {
    let too_long = |_| {
        let shown: String = value.chars().take(40).collect();
        let more = if value.chars().count() > 40 {
            "…"
        } else {
            ""
        };
        invalid(
            key,
            format!("{shown:?}{more}"),
            format!(
                "a shorter value: the guard keys it is part of hold at most {MAX_KEY_LEN} bytes (scopes {MAX_SCOPE_LEN})"
            ),
        )
    };
    let scope = scope.map_err(too_long)?;
    once_key(DEFAULT_PREFIX, &scope, "18446744073709551615").map_err(too_long)?;
    Ok(())
}

pub(super) fn config(parsed: raw::Parsed, env: Env<'_>) -> Result<Config, ConfigError> {
    let raw::Parsed {
        file,
        endpoints: entries,
        sinks,
    } = parsed;
    if file.schedules.is_empty() && file.active.is_empty() && entries.is_empty() {
        return Err(ConfigError::Empty);
    }
    let locker = locker(&file.locker, env)?;
    let ratelimit = match &file.ratelimit {
        Some(r) if r.enabled => Some(rate_limits(r)?),
        Some(r) => {
            rate_limits(r)?; // checked even while disabled
            None
        }
        None => None,
    };
    let limiters: Vec<&Policy> = ratelimit.iter().flat_map(|r| &r.policies).collect();
    if let Some(r) = &ratelimit
        && !r.fallback_to_memory
        && !matches!(locker, Locker::Redis(_))
        && let Some(p) = r.policies.iter().find(|p| p.backend == Backend::Redis)
    {
        // Known without connecting: the Redis backend shares the locker's
        // connection.
        return Err(invalid(
            format!("ratelimit.policies.{}.backend", p.name),
            "\"redis\"",
            "\"memory\", unless [locker] kind = \"redis\" (or ratelimit.fallback_to_memory = true)",
        ));
    }
    let guards = guards(&file.guards)?;
    printable("guards.owner", &guards.owner)?;
    // An owner that leaves no room in a key is the owner's fault, not the
    // first name beside it.
    fits_key(
        "guards.owner",
        &guards.owner,
        Scope::new(guard_std::run::SCHEDULE_COMPONENT)
            .and_then(|s| s.segment("owner", &guards.owner))
            .and_then(|s| s.segment("router", "r")),
    )?;
    let endpoint_component = longest_endpoint_component();
    if !entries.is_empty() {
        fits_key(
            "guards.owner",
            &guards.owner,
            Scope::new(&endpoint_component)
                .and_then(|s| s.segment("owner", &guards.owner))
                .and_then(|s| s.segment("node", "n")),
        )?;
    }
    let has_redis = matches!(locker, Locker::Redis(_));
    let sinks = crate::sink::resolve(&sinks, env, has_redis, &limiters)?;
    let schedules = schedules(&file.schedules, &limiters, &guards.owner, &sinks)?;
    let mut active: Vec<String> = Vec::new();
    for (i, a) in file.active.iter().enumerate() {
        let key = format!("active[{i}].name");
        if a.name.is_empty() {
            return Err(invalid(key, "\"\"", "a non-empty name"));
        }
        printable(&key, &a.name)?;
        if active.contains(&a.name) {
            return Err(invalid(key, format!("{:?}", a.name), "a unique name"));
        }
        fits_key(
            &key,
            &a.name,
            Scope::new("consumer")
                .and_then(|s| s.segment("owner", &guards.owner))
                .and_then(|s| s.segment("name", &a.name)),
        )?;
        active.push(a.name.clone());
    }
    let locker_url = match &locker {
        Locker::Redis(RedisLocker {
            topology: Topology::Standalone { url },
            tls,
            ..
        }) => Some((
            RedactedUrl::new(url.clone(), file.locker.url.as_deref().unwrap_or_default()),
            tls.as_ref(),
        )),
        _ => None,
    };
    let mut names = HashSet::new();
    let mut endpoints = Vec::new();
    for (i, raw::Routed { endpoint: e, to }) in entries.iter().enumerate() {
        let key = |field: &str| format!("endpoints[{i}].{field}");
        if e.name().is_empty() {
            return Err(invalid(key("name"), "\"\"", "a non-empty name"));
        }
        if !names.insert(e.name()) {
            return Err(invalid(
                key("name"),
                format!("{:?}", e.name()),
                "a unique name",
            ));
        }
        printable(&key("name"), e.name())?;
        fits_key(
            &key("name"),
            e.name(),
            Scope::new(&endpoint_component)
                .and_then(|s| s.segment("owner", &guards.owner))
                .and_then(|s| s.segment("node", e.name())),
        )?;
        let mut endpoint = endpoint(e, &key, env, locker_url.as_ref(), has_redis, &limiters)?;
        if let Some(to) = to {
            let sink = crate::sink::named(&key("to"), to, &sinks)?;
            super::feedback::not_into_its_source(&key("to"), &endpoint.source, sink)?;
            endpoint.to = Some(sink.name.clone());
        }
        endpoints.push(endpoint);
    }
    let metrics = Metrics {
        prometheus: match &file.metrics.prometheus {
            None => None,
            Some(address) => Some(address.parse().map_err(|_| {
                invalid(
                    "metrics.prometheus",
                    format!("{address:?}"),
                    "an address such as \"127.0.0.1:9000\"",
                )
            })?),
        },
    };
    let dead_letters = match &file.dead_letters {
        Some(entry) => Some(crate::dead_letters::resolve(entry, env)?),
        None => None,
    };
    // What a queue's sink refuses for good was acknowledged at its source
    // long ago: it has nowhere to go but the dead letters on disk.
    if dead_letters.is_none()
        && let Some(i) = sinks.iter().position(|s| s.queue.is_some())
    {
        return Err(invalid(
            format!("sinks[{i}].queue"),
            "set without [dead_letters]",
            "a [dead_letters] directory too: what the sink refuses for good from its queue is kept there",
        ));
    }
    Ok(Config {
        locker,
        guards,
        schedules,
        active,
        ratelimit,
        endpoints,
        sinks,
        metrics,
        dead_letters,
    })
}

fn locker(l: &raw::Locker, env: Env<'_>) -> Result<Locker, ConfigError> {
    use raw::LockerKind::{Etcd, Postgres, Redis};
    // Each key belongs to the kinds listed; set under another kind it is
    // refused rather than ignored.
    let only = |set: bool, field: &str, kinds: &[raw::LockerKind], allowed: &str| {
        if set && !kinds.contains(&l.kind) {
            Err(invalid(
                format!("locker.{field}"),
                "set",
                format!("no such key unless kind = {allowed}"),
            ))
        } else {
            Ok(())
        }
    };
    let redis = "\"redis\"";
    only(
        l.url.is_some(),
        "url",
        &[Redis, Postgres],
        "\"redis\" or \"postgres\"",
    )?;
    only(
        !l.urls.is_empty(),
        "urls",
        &[Redis, Etcd],
        "\"redis\" or \"etcd\"",
    )?;
    only(
        l.mode != raw::RedisMode::Standalone,
        "mode",
        &[Redis],
        redis,
    )?;
    only(l.service.is_some(), "service", &[Redis], redis)?;
    only(!l.prefix.is_empty(), "prefix", &[Redis], redis)?;
    only(l.tls_ca.is_some(), "tls_ca", &[Redis], redis)?;
    only(l.tls_cert.is_some(), "tls_cert", &[Redis], redis)?;
    only(l.tls_key.is_some(), "tls_key", &[Redis], redis)?;
    only(l.table.is_some(), "table", &[Postgres], "\"postgres\"")?;
    only(l.quarantine, "quarantine", &[Redis], redis)?;
    only(l.replica_acks.is_some(), "replica_acks", &[Redis], redis)?;
    only(
        l.replica_ack_ms.is_some(),
        "replica_ack_ms",
        &[Redis],
        redis,
    )?;
    match l.kind {
        raw::LockerKind::None => return Ok(Locker::None),
        raw::LockerKind::Local => return Ok(Locker::Local),
        raw::LockerKind::Postgres => return super::postgres::locker(l, env),
        raw::LockerKind::Etcd => return super::etcd::locker(l, env),
        raw::LockerKind::Redis => {}
    }
    let prefix = l.prefix.trim();
    printable("locker.prefix", prefix)?;
    if guard_core::lock::redis::check_prefix(prefix).is_err() {
        // A brace would move the hash tag that keeps a lock and its fence
        // counter in one cluster slot: every acquisition would fail with
        // CROSSSLOT at run time.
        return Err(invalid(
            "locker.prefix",
            format!("{:?}", l.prefix),
            "a prefix without '{' or '}' (they would move the Redis Cluster hash tag)",
        ));
    }
    bounded(
        "locker.request_timeout_ms",
        l.request_timeout_ms.unwrap_or(REDIS_LOCKER_TIMEOUT_MS),
        MAX_TIMEOUT_MS,
        "milliseconds",
    )?;
    let urls = |field: &str| -> Result<Vec<String>, ConfigError> {
        if l.urls.is_empty() {
            return Err(invalid(
                format!("locker.{field}"),
                "[]",
                "at least one sentinel or cluster node URL",
            ));
        }
        l.urls
            .iter()
            .enumerate()
            .map(|(i, u)| redis_url(&format!("locker.urls[{i}]"), u, env))
            .collect()
    };
    let topology = match l.mode {
        raw::RedisMode::Standalone => {
            let url = l.url.as_deref().ok_or_else(|| {
                invalid(
                    "locker.url",
                    "missing",
                    "a Redis URL such as \"redis://127.0.0.1:6379/\"",
                )
            })?;
            Topology::Standalone {
                url: redis_url("locker.url", url, env)?,
            }
        }
        raw::RedisMode::Sentinel => Topology::Sentinel {
            sentinels: urls("urls")?,
            service: l.service.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                invalid("locker.service", "missing", "the monitored service name")
            })?,
        },
        raw::RedisMode::Cluster => Topology::Cluster {
            nodes: urls("urls")?,
        },
    };
    let checked: Vec<(String, &str, String)> = match &topology {
        Topology::Standalone { url } => vec![(
            "locker.url".to_owned(),
            l.url.as_deref().unwrap_or_default(),
            url.clone(),
        )],
        Topology::Sentinel {
            sentinels: urls, ..
        }
        | Topology::Cluster { nodes: urls } => urls
            .iter()
            .zip(&l.urls)
            .enumerate()
            .map(|(i, (url, as_written))| {
                (
                    format!("locker.urls[{i}]"),
                    as_written.as_str(),
                    url.clone(),
                )
            })
            .collect(),
    };
    let tls = redis_tls(
        &checked,
        &TlsKeys {
            ca: &l.tls_ca,
            cert: &l.tls_cert,
            key: &l.tls_key,
        },
        &|field| format!("locker.{field}"),
        env,
    )?;
    Ok(Locker::Redis(RedisLocker {
        topology,
        prefix: prefix.to_owned(),
        request_timeout: Duration::from_millis(
            l.request_timeout_ms.unwrap_or(REDIS_LOCKER_TIMEOUT_MS),
        ),
        tls,
        quarantine: l.quarantine,
        replica_acks: replica_acks(l)?,
    }))
}

/// `replica_acks` and `replica_ack_ms`: how many replicas must acknowledge
/// a grant, within how long (default 100 ms), shorter than the request
/// timeout that bounds the whole request.
fn replica_acks(l: &raw::Locker) -> Result<Option<(u32, Duration)>, ConfigError> {
    let Some(replicas) = l.replica_acks else {
        if l.replica_ack_ms.is_some() {
            return Err(invalid(
                "locker.replica_ack_ms",
                "set",
                "replica_acks set too (how many replicas must acknowledge)",
            ));
        }
        return Ok(None);
    };
    if replicas == 0 {
        return Err(invalid("locker.replica_acks", 0, "at least 1 replica"));
    }
    let timeout = l.request_timeout_ms.unwrap_or(REDIS_LOCKER_TIMEOUT_MS);
    let ms = l.replica_ack_ms.unwrap_or(DEFAULT_REPLICA_ACK_MS);
    if ms == 0 || ms >= timeout {
        return Err(invalid(
            "locker.replica_ack_ms",
            ms,
            format!("at least 1 and less than locker.request_timeout_ms ({timeout})"),
        ));
    }
    Ok(Some((replicas, Duration::from_millis(ms))))
}

/// How long a grant waits for its replicas unless configured.
const DEFAULT_REPLICA_ACK_MS: u64 = 100;

fn guards(g: &raw::Guards) -> Result<Guards, ConfigError> {
    bounded("guards.once_ttl_s", g.once_ttl_s, MAX_ONCE_TTL_S, "seconds")?;
    let once_ttl = Ttl::from_secs(g.once_ttl_s).map_err(|_| {
        invalid(
            "guards.once_ttl_s",
            g.once_ttl_s,
            "a positive number of seconds",
        )
    })?;
    Ok(Guards {
        owner: g.owner.clone(),
        once_ttl,
        fail_policy: match g.fail_policy {
            raw::FailPolicy::Closed => FailPolicy::FailClosed,
            raw::FailPolicy::Open => FailPolicy::FailOpen,
        },
        active: active_timing(g)?,
    })
}

/// The lease timing: what is given, core's defaults for the rest (a TTL
/// alone gets core's interval for it, at most a third of it), validated
/// once and kept validated. Nothing given is adjusted silently: an
/// interval the lease cannot renew within is an error, not clamped.
fn active_timing(g: &raw::Guards) -> Result<ActiveTiming, ConfigError> {
    let mut active = ActiveConfig::new();
    if let Some(ms) = g.active_ttl_ms {
        bounded("guards.active_ttl_ms", ms, MAX_LEASE_MS, "milliseconds")?;
        let ttl = Ttl::from_millis(ms).map_err(|_| {
            invalid(
                "guards.active_ttl_ms",
                ms,
                "a positive number of milliseconds",
            )
        })?;
        active = active.with_ttl(ttl);
    }
    if let Some(ms) = g.active_interval_ms {
        let most = active.ttl().as_duration() / 3;
        if ms == 0 {
            return Err(invalid(
                "guards.active_interval_ms",
                0,
                "a positive number of milliseconds",
            ));
        }
        if Duration::from_millis(ms) > most {
            return Err(invalid(
                "guards.active_interval_ms",
                ms,
                format!(
                    "at most a third of guards.active_ttl_ms ({} ms), so a leader renews at least twice before its lease could expire",
                    most.as_millis()
                ),
            ));
        }
        active = active.with_interval(Duration::from_millis(ms));
    }
    active.validate().map_err(|e| {
        let ttl = active.ttl().as_duration().as_millis();
        invalid("guards.active_ttl_ms", ttl, e.to_string())
    })
}

fn schedules(
    list: &[raw::Schedule],
    limiters: &[&Policy],
    owner: &str,
    sinks: &[crate::sink::Sink],
) -> Result<Vec<Schedule>, ConfigError> {
    let mut routers = HashSet::new();
    let mut out = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let key = |field: &str| format!("schedules[{i}].{field}");
        if s.router.is_empty() {
            return Err(invalid(
                key("router"),
                "\"\"",
                "a non-empty router id (it is part of the dedup key)",
            ));
        }
        printable(&key("router"), &s.router)?;
        printable(&key("chain"), &s.chain)?;
        fits_key(
            &key("router"),
            &s.router,
            Scope::new("endpoint/schedule")
                .and_then(|sc| sc.segment("owner", owner))
                .and_then(|sc| sc.segment("chain", &s.chain))
                .and_then(|sc| sc.segment("router", &s.router)),
        )?;
        if !routers.insert((s.chain.as_str(), s.router.as_str())) {
            return Err(invalid(
                key("router"),
                format!("{:?}", s.router),
                "a router id unique within its chain",
            ));
        }
        let timing = match (s.every_ms, &s.cron) {
            (Some(ms), None) => {
                let ms = bounded(&key("every_ms"), ms, MAX_PERIOD_MS, "milliseconds")?;
                Timing::Every(Every::new(Duration::from_millis(ms)).map_err(|_| {
                    invalid(key("every_ms"), ms, "a positive number of milliseconds")
                })?)
            }
            (None, Some(cron)) => {
                let parsed = cron.parse::<CronSchedule>().map_err(|e| {
                    invalid(
                        key("cron"),
                        format!("{cron:?}"),
                        format!(
                            "a cron expression with seconds: sec min hour day-of-month month day-of-week [year] (the parser says: {})",
                            e.reason()
                        ),
                    )
                })?;
                // One that never fires would run nothing, silently.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                if parsed.next_after(UnixMillis(now)).is_none() {
                    return Err(invalid(
                        key("cron"),
                        format!("{cron:?}"),
                        "an expression that fires at some time from now on (this one never does)",
                    ));
                }
                Timing::Cron(Box::new(parsed))
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    key("cron"),
                    "set",
                    "either `every_ms` or `cron`, not both",
                ));
            }
            (None, None) => {
                return Err(invalid(key("every_ms"), "missing", "`every_ms` or `cron`"));
            }
        };
        let limit = match &s.limit {
            None => {
                if s.max_wait_ms.is_some() {
                    return Err(invalid(
                        key("max_wait_ms"),
                        "set",
                        "no `max_wait_ms` without `limit`",
                    ));
                }
                None
            }
            Some(name) => Some(ScheduleLimit {
                limiter: {
                    let policy = limiter(&key("limit"), name, limiters)?;
                    if policy.cost == Cost::Bytes {
                        return Err(invalid(
                            key("limit"),
                            format!("{name:?}"),
                            "a limiter that counts runs: a schedule's run has no bytes to count",
                        ));
                    }
                    policy.name.clone()
                },
                max_wait: match s.max_wait_ms {
                    None => DEFAULT_MAX_WAIT,
                    Some(ms) => Duration::from_millis(bounded(
                        &key("max_wait_ms"),
                        ms,
                        MAX_WAIT_MS,
                        "milliseconds",
                    )?),
                },
            }),
        };
        out.push(Schedule {
            router: s.router.clone(),
            chain: s.chain.clone(),
            timing,
            limit,
            action: action(s, &key, sinks)?,
            exclusive: s.exclusive.unwrap_or(false),
        });
    }
    Ok(out)
}

/// What a schedule's run does: a command (`run`, with `timeout_ms`,
/// `retries`, `retry_delay_ms`), a message to a sink (`to`), or neither.
fn action(
    s: &raw::Schedule,
    key: &dyn Fn(&str) -> String,
    sinks: &[crate::sink::Sink],
) -> Result<Action, ConfigError> {
    let command_keys = [
        (s.timeout_ms.is_some(), "timeout_ms"),
        (s.retries.is_some(), "retries"),
        (s.retry_delay_ms.is_some(), "retry_delay_ms"),
    ];
    match (&s.run, &s.to) {
        (Some(_), Some(_)) => Err(invalid(
            key("to"),
            "set",
            "either `run` (a command) or `to` (a sink), not both",
        )),
        (None, Some(to)) => {
            if let Some((_, field)) = command_keys.iter().find(|(set, _)| *set) {
                return Err(invalid(
                    key(field),
                    "set",
                    "no such key without `run` (a sink retries under its own policy)",
                ));
            }
            Ok(Action::Send {
                sink: crate::sink::named(&key("to"), to, sinks)?.name.clone(),
            })
        }
        (Some(argv), None) => {
            if argv.first().is_none_or(String::is_empty) {
                return Err(invalid(
                    key("run"),
                    format!("{argv:?}"),
                    "the program and its arguments, the program not empty (no shell: [\"sh\", \"-c\", \"...\"] for one)",
                ));
            }
            for arg in argv {
                if arg.contains('\0') {
                    return Err(invalid(
                        key("run"),
                        format!("{argv:?}"),
                        "arguments without NUL",
                    ));
                }
            }
            let timeout = match s.timeout_ms {
                None => crate::action::DEFAULT_COMMAND_TIMEOUT,
                Some(0) => return Err(invalid(key("timeout_ms"), 0, "at least 1 ms")),
                Some(ms) => Duration::from_millis(bounded(
                    &key("timeout_ms"),
                    ms,
                    crate::action::MAX_COMMAND_TIMEOUT_MS,
                    "milliseconds",
                )?),
            };
            Ok(Action::Command(CommandAction {
                argv: argv.clone(),
                timeout,
                // No retry unless asked: a command's effect may not bear
                // running twice.
                retry: retry(Some(s.retries.unwrap_or(0)), s.retry_delay_ms, key)?,
            }))
        }
        (None, None) => {
            if let Some((_, field)) = command_keys.iter().find(|(set, _)| *set) {
                return Err(invalid(key(field), "set", "no such key without `run`"));
            }
            Ok(Action::Report)
        }
    }
}

/// A limiter a schedule or endpoint names: one that exists.
/// The limit keys of a raw endpoint `$e` (every kind has them).
macro_rules! limit_keys {
    ($e:expr) => {
        LimitKeys {
            limit: &$e.limit,
            limit_key: &$e.limit_key,
            when_limited: $e.when_limited,
            max_wait_ms: $e.max_wait_ms,
        }
    };
}

/// The limit keys every endpoint kind accepts.
struct LimitKeys<'a> {
    limit: &'a Option<String>,
    limit_key: &'a Option<String>,
    when_limited: Option<raw::WhenLimited>,
    max_wait_ms: Option<u64>,
}

fn endpoint_limit(
    keys: LimitKeys<'_>,
    key: &dyn Fn(&str) -> String,
    fields_allowed: bool,
    limiters: &[&Policy],
    max_payload_bytes: usize,
) -> Result<Option<EndpointLimit>, ConfigError> {
    let Some(name) = keys.limit else {
        for (set, field) in [
            (keys.limit_key.is_some(), "limit_key"),
            (keys.when_limited.is_some(), "when_limited"),
            (keys.max_wait_ms.is_some(), "max_wait_ms"),
        ] {
            if set {
                return Err(invalid(key(field), "set", "no such key without `limit`"));
            }
        }
        return Ok(None);
    };
    let limit_key = match keys.limit_key.as_deref() {
        None | Some("source") => LimitKey::Source,
        // A stream's entries all come on the stream: keyed by their ids,
        // each would have a budget of its own.
        Some("topic") if !fields_allowed => LimitKey::Topic,
        Some(other) => match other.strip_prefix("field:") {
            Some(field) if fields_allowed && !field.is_empty() => LimitKey::Field(field.to_owned()),
            _ => {
                let allowed = if fields_allowed {
                    "\"source\" or \"field:<name>\" (a stream's entries have no topic of their own)"
                } else {
                    "\"source\" or \"topic\""
                };
                return Err(invalid(key("limit_key"), format!("{other:?}"), allowed));
            }
        },
    };
    let when_limited = match (keys.when_limited, keys.max_wait_ms) {
        (Some(raw::WhenLimited::DeadLetter), Some(_)) => {
            return Err(invalid(
                key("max_wait_ms"),
                "set",
                "no `max_wait_ms` with when_limited = \"dead-letter\" (nothing waits)",
            ));
        }
        (Some(raw::WhenLimited::DeadLetter), None) => WhenLimited::DeadLetter,
        (_, None) => WhenLimited::Wait(DEFAULT_MAX_WAIT),
        (_, Some(ms)) => WhenLimited::Wait(Duration::from_millis(bounded(
            &key("max_wait_ms"),
            ms,
            MAX_WAIT_MS,
            "milliseconds",
        )?)),
    };
    let policy = limiter(&key("limit"), name, limiters)?;
    bytes_fit(&key("limit"), policy, max_payload_bytes)?;
    Ok(Some(EndpointLimit {
        limiter: policy.name.clone(),
        key: limit_key,
        cost: policy.cost,
        when_limited,
    }))
}

fn endpoint(
    e: &raw::Endpoint,
    key: &dyn Fn(&str) -> String,
    env: Env<'_>,
    locker_url: Option<&(RedactedUrl, Option<&TlsFiles>)>,
    has_redis: bool,
    limiters: &[&Policy],
) -> Result<Endpoint, ConfigError> {
    let max_payload = match e {
        raw::Endpoint::RedisPubsub(p) => p.max_payload_bytes,
        raw::Endpoint::RedisStream(s) => s.max_payload_bytes,
        raw::Endpoint::Mqtt(m) => m.max_payload_bytes,
        raw::Endpoint::Nats(n) => n.max_payload_bytes,
        raw::Endpoint::NatsJetStream(j) => j.max_payload_bytes,
        raw::Endpoint::Rabbitmq(r) => r.max_payload_bytes,
        raw::Endpoint::PostgresQueue(p) => p.max_payload_bytes,
        raw::Endpoint::MysqlBinlog(m) => m.max_payload_bytes,
    };
    let max_payload_bytes = match max_payload {
        None => super::DEFAULT_MAX_PAYLOAD_BYTES,
        Some(n) => usize::try_from(bounded(
            &key("max_payload_bytes"),
            n,
            MAX_PAYLOAD_BYTES,
            "bytes",
        )?)
        .unwrap_or(usize::MAX),
    };
    let (name, source, limit) = match e {
        raw::Endpoint::RedisPubsub(p) => {
            let limit = endpoint_limit(limit_keys!(p), key, false, limiters, max_payload_bytes)?;
            let source = crate::endpoint::redis::resolve_pubsub(p, key, env, locker_url)?;
            (&p.name, source, limit)
        }
        raw::Endpoint::RedisStream(s) => {
            let limit = endpoint_limit(limit_keys!(s), key, true, limiters, max_payload_bytes)?;
            let source = crate::endpoint::redis::resolve_stream(s, key, env, has_redis)?;
            (&s.name, source, limit)
        }
        raw::Endpoint::Mqtt(m) => {
            let limit = endpoint_limit(limit_keys!(m), key, false, limiters, max_payload_bytes)?;
            (&m.name, crate::endpoint::mqtt::resolve(m, key, env)?, limit)
        }
        raw::Endpoint::Nats(n) => {
            let limit = endpoint_limit(limit_keys!(n), key, false, limiters, max_payload_bytes)?;
            (
                &n.name,
                crate::endpoint::nats::resolve_subject(n, key, env)?,
                limit,
            )
        }
        raw::Endpoint::NatsJetStream(j) => {
            let limit = endpoint_limit(limit_keys!(j), key, false, limiters, max_payload_bytes)?;
            (
                &j.name,
                crate::endpoint::nats::resolve_jetstream(j, key, env)?,
                limit,
            )
        }
        raw::Endpoint::Rabbitmq(r) => {
            let limit = endpoint_limit(limit_keys!(r), key, false, limiters, max_payload_bytes)?;
            (&r.name, crate::endpoint::amqp::resolve(r, key, env)?, limit)
        }
        raw::Endpoint::PostgresQueue(p) => {
            let limit = endpoint_limit(limit_keys!(p), key, false, limiters, max_payload_bytes)?;
            (
                &p.name,
                crate::endpoint::postgres::resolve(p, key, env)?,
                limit,
            )
        }
        raw::Endpoint::MysqlBinlog(m) => {
            let limit = endpoint_limit(limit_keys!(m), key, false, limiters, max_payload_bytes)?;
            (
                &m.name,
                crate::endpoint::mysql::resolve(m, &key, env)?,
                limit,
            )
        }
    };
    Ok(Endpoint {
        name: name.clone(),
        source,
        limit,
        max_payload_bytes,
        to: None,
    })
}
