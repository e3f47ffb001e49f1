//! The firmware's settings from its semihosting command line (QEMU's
//! `-append "..."`): `--name r9 --ip 10.77.0.20/24 --redis 10.77.0.1:6379`
//! and optional `--ttl-ms`, `--interval-ms`, `--every-ms`, `--act-ms`.
//! A flash image for a real board would take them from its configuration
//! storage instead; the replica's code is the same.

use core::fmt;
use core::net::{Ipv4Addr, SocketAddrV4};

use cortex_m_semihosting::{nr, syscall1};

/// The longest command line read.
pub const MAX_CMDLINE: usize = 256;

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
    /// The command line is not UTF-8 or longer than [`MAX_CMDLINE`].
    Unreadable,
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
            ArgsError::Unreadable => write!(
                f,
                "the command line is not UTF-8 or longer than {MAX_CMDLINE} bytes"
            ),
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
    if failed || len > buf.len() {
        return Err(ArgsError::Unreadable);
    }
    core::str::from_utf8(&buf[..len]).map_err(|_| ArgsError::Unreadable)
}

fn number<'a>(option: &'a str, value: &'a str) -> Result<u64, ArgsError<'a>> {
    value.parse().map_err(|_| ArgsError::Invalid {
        option,
        value,
        expected: "a whole number of milliseconds",
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
        };
        while let Some(option) = tokens.next() {
            let value = tokens.next().ok_or(ArgsError::Invalid {
                option,
                value: "",
                expected: "a value after the option",
            })?;
            match option {
                "--name" => name = Some(value),
                "--ip" => {
                    let bad = ArgsError::Invalid {
                        option,
                        value,
                        expected: "an IPv4 address with prefix, like 10.77.0.20/24",
                    };
                    let (address, prefix) = value.split_once('/').ok_or(bad)?;
                    let address: Ipv4Addr = address.parse().map_err(|_| bad)?;
                    let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or(bad)?;
                    ip = Some((address, prefix));
                }
                "--redis" => {
                    redis = Some(value.parse().map_err(|_| ArgsError::Invalid {
                        option,
                        value,
                        expected: "an IPv4 address and port, like 10.77.0.1:6379",
                    })?);
                }
                "--ttl-ms" => args.ttl_ms = number(option, value)?,
                "--interval-ms" => args.interval_ms = number(option, value)?,
                "--every-ms" => args.every_ms = number(option, value)?,
                "--act-ms" => args.act_ms = number(option, value)?,
                _ => return Err(ArgsError::Unknown(option)),
            }
        }
        args.name = name.ok_or(ArgsError::Missing("--name"))?;
        (args.ip, args.prefix) = ip.ok_or(ArgsError::Missing("--ip"))?;
        args.redis = redis.ok_or(ArgsError::Missing("--redis"))?;
        Ok(args)
    }
}
