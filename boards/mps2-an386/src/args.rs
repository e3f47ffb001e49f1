//! The firmware's settings from its semihosting command line (QEMU's
//! `-append "..."`): `--name r9 --ip 10.77.0.20/24 --redis 10.77.0.1:6379`
//! and optional `--ttl-ms`, `--interval-ms`, `--every-ms`, `--act-ms`.
//! Every value is checked here, before the network starts: a name of 1 to
//! [`MAX_NAME`] bytes (it goes into every resource write), a specified
//! address with a prefix of 1 to 32, a Redis address and port that are not
//! zero, durations of 1 ms to a day. The interval is then clamped to a
//! third of the TTL, as the host binary's is. The line QEMU gives counts
//! the image's path, which comes first.
//! A flash image for a real board would take them from its configuration
//! storage instead; the replica's code is the same.

use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};

use cortex_m_semihosting::{nr, syscall1};

/// The longest command line read, the image's path included.
pub const MAX_CMDLINE: usize = 512;
/// The longest replica name.
pub const MAX_NAME: usize = 32;
/// The longest duration setting: a day, in ms.
const MAX_MS: u64 = 86_400_000;

/// The settings given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args<'a> {
    /// The replica's name (`--name`).
    pub name: &'a str,
    /// Its address (`--ip a.b.c.d/len`).
    pub ip: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// Redis (`--redis a.b.c.d:port`).
    pub redis: SocketAddrV4,
    /// The lease (`--ttl-ms`, default 2000).
    pub ttl_ms: u64,
    /// Renewal and poll interval (`--interval-ms`, default 250).
    pub interval_ms: u64,
    /// The heartbeat's period (`--every-ms`, default 1000).
    pub every_ms: u64,
    /// How often the leader writes (`--act-ms`, default 100).
    pub act_ms: u64,
    /// The Redis ACL user (`--redis-user`; none: the default user).
    pub redis_user: Option<&'a str>,
    /// The password sent as `AUTH` (`--redis-password`, no spaces).
    pub redis_password: Option<&'a str>,
    /// An MQTT broker (`--mqtt a.b.c.d:port`): readings go there.
    pub mqtt: Option<SocketAddrV4>,
    /// How often a reading is made (`--produce-ms`, default 200).
    pub produce_ms: u64,
    /// The most MQTT publications a second (`--mqtt-per-second`, default
    /// 20).
    pub mqtt_per_second: u32,
    /// A CA certificate (DER) on the host, read through semihosting
    /// (`--tls-ca PATH`): Redis is reached over TLS 1.3 and its
    /// certificate checked against it. Only `tls-locker` speaks TLS.
    pub tls_ca: Option<&'a str>,
}

/// A command line that cannot be used, naming the option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgsError<'a> {
    /// An option this firmware does not know.
    Unknown(&'a str),
    /// An option without its value.
    Missing(&'static str),
    /// A value that does not parse, with what was expected.
    Invalid {
        /// The option.
        option: &'a str,
        /// Its value.
        value: &'a str,
        /// What it should look like.
        expected: &'static str,
    },
    /// The command line is longer than [`MAX_CMDLINE`] bytes.
    TooLong,
    /// The command line is not UTF-8.
    NotUtf8,
}

impl fmt::Display for ArgsError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgsError::Unknown(option) => write!(f, "unknown option {option:?}"),
            ArgsError::Missing(option) => write!(f, "{option} is required"),
            ArgsError::Invalid {
                option,
                value,
                expected,
            } => write!(f, "{option} {value:?}: expected {expected}"),
            ArgsError::TooLong => write!(
                f,
                "the command line is longer than {MAX_CMDLINE} bytes (the image's path, which QEMU puts first, counts)"
            ),
            ArgsError::NotUtf8 => f.write_str("the command line is not UTF-8"),
        }
    }
}

/// Reads the semihosting command line into `buf`.
pub fn cmdline(buf: &mut [u8; MAX_CMDLINE]) -> Result<&str, ArgsError<'static>> {
    let mut block = [buf.as_mut_ptr() as usize, buf.len()];
    // SAFETY: SYS_GET_CMDLINE writes at most `block[1]` bytes to
    // `block[0]` and the length it wrote back to `block[1]`; both point
    // into live, exclusively borrowed memory.
    let failed = unsafe { syscall1(nr::GET_CMDLINE, block.as_mut_ptr() as usize) } != 0;
    let len = block[1];
    // QEMU refuses a line that does not fit the buffer.
    if failed || len > buf.len() {
        return Err(ArgsError::TooLong);
    }
    core::str::from_utf8(&buf[..len]).map_err(|_| ArgsError::NotUtf8)
}

fn number<'a>(option: &'a str, value: &'a str) -> Result<u64, ArgsError<'a>> {
    value
        .parse()
        .ok()
        .filter(|ms| (1..=MAX_MS).contains(ms))
        .ok_or(ArgsError::Invalid {
            option,
            value,
            expected: "a whole number of milliseconds from 1 to 86400000 (a day)",
        })
}

/// An IPv4 address and port, neither zero.
fn endpoint<'a>(option: &'a str, value: &'a str) -> Result<SocketAddrV4, ArgsError<'a>> {
    value
        .parse()
        .ok()
        .filter(|a: &SocketAddrV4| !a.ip().is_unspecified() && a.port() != 0)
        .ok_or(ArgsError::Invalid {
            option,
            value,
            expected: "an IPv4 address and a port that are not zero, like 10.77.0.1:6379",
        })
}

impl<'a> Args<'a> {
    /// Parses `--option value` pairs; anything before the first option
    /// (QEMU puts the image's path first) is skipped.
    pub fn parse(line: &'a str) -> Result<Args<'a>, ArgsError<'a>> {
        let mut tokens = line
            .split_ascii_whitespace()
            .skip_while(|t| !t.starts_with("--"));
        let (mut name, mut ip, mut redis) = (None, None, None);
        let mut args = Args {
            name: "",
            ip: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
            redis: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            ttl_ms: 2_000,
            interval_ms: 250,
            every_ms: 1_000,
            act_ms: 100,
            redis_user: None,
            redis_password: None,
            mqtt: None,
            produce_ms: 200,
            mqtt_per_second: 20,
            tls_ca: None,
        };
        while let Some(option) = tokens.next() {
            const OPTIONS: [&str; 13] = [
                "--tls-ca",
                "--mqtt",
                "--produce-ms",
                "--mqtt-per-second",
                "--name",
                "--ip",
                "--redis",
                "--ttl-ms",
                "--interval-ms",
                "--every-ms",
                "--act-ms",
                "--redis-user",
                "--redis-password",
            ];
            if !OPTIONS.contains(&option) {
                return Err(ArgsError::Unknown(option));
            }
            // A value never starts with `--`: that is the next option.
            let value =
                tokens
                    .next()
                    .filter(|v| !v.starts_with("--"))
                    .ok_or(ArgsError::Invalid {
                        option,
                        value: "",
                        expected: "a value after the option",
                    })?;
            match option {
                "--name" => {
                    if value.len() > MAX_NAME {
                        return Err(ArgsError::Invalid {
                            option,
                            value,
                            expected: "a name of at most 32 bytes",
                        });
                    }
                    name = Some(value);
                }
                "--ip" => {
                    let bad = ArgsError::Invalid {
                        option,
                        value,
                        expected: "an IPv4 address with prefix, like 10.77.0.20/24",
                    };
                    let (address, prefix) = value.split_once('/').ok_or(bad)?;
                    let address: Ipv4Addr = address
                        .parse()
                        .ok()
                        .filter(|a: &Ipv4Addr| !a.is_unspecified() && !a.is_broadcast())
                        .ok_or(bad)?;
                    let prefix: u8 = prefix
                        .parse()
                        .ok()
                        .filter(|p| (1..=32).contains(p))
                        .ok_or(bad)?;
                    ip = Some((address, prefix));
                }
                "--redis" => redis = Some(endpoint(option, value)?),
                "--mqtt" => args.mqtt = Some(endpoint(option, value)?),
                "--produce-ms" => args.produce_ms = number(option, value)?,
                "--mqtt-per-second" => {
                    args.mqtt_per_second =
                        value
                            .parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or(ArgsError::Invalid {
                                option,
                                value,
                                expected: "a whole number of publications a second, at least 1",
                            })?;
                }
                "--ttl-ms" => args.ttl_ms = number(option, value)?,
                "--interval-ms" => args.interval_ms = number(option, value)?,
                "--every-ms" => args.every_ms = number(option, value)?,
                "--act-ms" => args.act_ms = number(option, value)?,
                "--redis-user" => args.redis_user = Some(value),
                "--redis-password" => args.redis_password = Some(value),
                "--tls-ca" => args.tls_ca = Some(value),
                _ => return Err(ArgsError::Unknown(option)),
            }
        }
        args.name = name.ok_or(ArgsError::Missing("--name"))?;
        (args.ip, args.prefix) = ip.ok_or(ArgsError::Missing("--ip"))?;
        args.redis = redis.ok_or(ArgsError::Missing("--redis"))?;
        if args.redis_user.is_some() && args.redis_password.is_none() {
            return Err(ArgsError::Missing("--redis-password"));
        }
        Ok(args)
    }
}
