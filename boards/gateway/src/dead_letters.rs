//! `[dead_letters]`: what the gateway could not deliver, kept on disk
//! (guard-std's [`DeadLetterLog`]) with its content, origin, last error
//! and attempts, and `guard-gateway dlq list|show|replay|purge`, which
//! work on a stopped or a running gateway's letters.
//!
//! Two places write here: a broadcast endpoint (Pub/Sub, MQTT, core NATS,
//! a RabbitMQ fanout: sources that keep nothing themselves) for what its
//! limiter, its bounds, its lease or its sink did not take, and a sink's
//! queue for what the sink refused for good or as stale. Sources that
//! keep their messages keep their dead letters too (a stream's
//! dead-letter stream, a JetStream subject, a RabbitMQ dead-letter queue,
//! a PostgreSQL table).
//!
//! ```toml
//! [dead_letters]
//! dir = "/var/lib/guard/dead-letters"
//! max_bytes = 67108864     # 64 MiB, the default
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use guard_core::retry::WithoutRandom;
use guard_endpoints::sink::{Outgoing, deliver};
use guard_std::dead_letter_log::{DeadLetterLog, Letter};
use guard_std::disk_queue::{AppendError, MIN_MAX_BYTES};
use serde::{Deserialize, Serialize};

use crate::config::check::{Env, bounded, expand};
use crate::config::{Config, ConfigError, invalid};
use crate::error::GatewayError;
use crate::event::{field_value, one_line};

/// The dead letters' bound unless configured: 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;

/// `[dead_letters]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeadLettersEntry {
    pub dir: String,
    pub max_bytes: Option<u64>,
}

/// Letters kept on disk since the start, by `place` (`endpoint`: refused
/// or failed at an endpoint; `sink`: given up by a sink's queue).
pub const KEPT: &str = "guard_dead_letters_kept_total";
/// Bytes the dead letters on disk take (after each letter kept, and at
/// start; a `dlq purge` shows at the next).
pub const BYTES: &str = "guard_dead_letters_bytes";
/// The dead letters' bound in bytes (`[dead_letters] max_bytes`).
pub const MAX_BYTES: &str = "guard_dead_letters_max_bytes";
/// The places a letter is kept from.
const PLACES: [&str; 2] = ["endpoint", "sink"];

/// Where dead letters are kept, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetters {
    /// The directory.
    pub dir: PathBuf,
    /// The bound in bytes.
    pub max_bytes: u64,
}

/// Checks `[dead_letters]`.
pub(crate) fn resolve(entry: &DeadLettersEntry, env: Env<'_>) -> Result<DeadLetters, ConfigError> {
    let dir = expand("dead_letters.dir", &entry.dir, env)?;
    if !std::path::Path::new(&dir).is_absolute() {
        return Err(invalid(
            "dead_letters.dir",
            format!("{dir:?}"),
            "an absolute path for the dead letters (`guard-gateway dlq` may run from another directory than the gateway)",
        ));
    }
    let max_bytes = match entry.max_bytes {
        None => DEFAULT_MAX_BYTES,
        Some(n) if n < MIN_MAX_BYTES => {
            return Err(invalid(
                "dead_letters.max_bytes",
                n,
                format!("at least {MIN_MAX_BYTES} bytes"),
            ));
        }
        Some(n) => bounded(
            "dead_letters.max_bytes",
            n,
            crate::queue::MAX_MAX_BYTES,
            "bytes",
        )?,
    };
    Ok(DeadLetters {
        dir: PathBuf::from(dir),
        max_bytes,
    })
}

/// A dead letter as the gateway keeps it: what it was and why it is
/// here; its payload is kept beside this, byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// `endpoint` or `sink`: which kind of place gave it up.
    pub place: String,
    /// That endpoint's or sink's name.
    pub name: String,
    /// The sink a replay sends it to, if any.
    pub sink: Option<String>,
    /// The message's id (its idempotency key), if it had one.
    pub id: Option<String>,
    /// Where it came from (a channel, topic, subject).
    pub from: String,
    /// The fence it was read under, if elected.
    pub fence: Option<u64>,
    /// The last error.
    pub reason: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it was given up, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The payload.
    #[serde(skip)]
    pub payload: Vec<u8>,
}

impl DeadLetter {
    /// The letter's body: its description's length, the description as
    /// JSON, then the payload.
    fn encode(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(self).unwrap_or_default();
        let len = u32::try_from(meta.len()).unwrap_or(u32::MAX);
        let mut body = Vec::with_capacity(4 + meta.len() + self.payload.len());
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(&meta);
        body.extend_from_slice(&self.payload);
        body
    }

    fn decode(body: &[u8]) -> Result<DeadLetter, String> {
        let (len, rest) = body
            .split_first_chunk::<4>()
            .ok_or("a letter cut short before its description")?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err("a letter cut short in its description".to_owned());
        }
        let (meta, payload) = rest.split_at(len);
        let mut letter: DeadLetter =
            serde_json::from_slice(meta).map_err(|e| format!("a letter's description: {e}"))?;
        letter.payload = payload.to_vec();
        Ok(letter)
    }

    /// The id a replay sends: the message's own, else one made of the
    /// letter's, the same on every replay.
    fn replay_id(&self, letter: u64) -> String {
        self.id
            .clone()
            .unwrap_or_else(|| format!("{}:dead-letter:{letter}", self.name))
    }
}

/// A letter read back: its id, and the letter or why it cannot be read.
type ReadBack = (u64, Result<DeadLetter, String>);

/// The gateway's dead letters on disk.
pub struct DeadLetterStore {
    log: DeadLetterLog,
}

impl DeadLetterStore {
    /// Opens the store `config` names: the torn bytes its recovery cut
    /// (a crash in the middle of a write).
    pub(crate) fn open(config: &DeadLetters) -> Result<(Self, u64), GatewayError> {
        let (log, lost) = DeadLetterLog::open(&config.dir, config.max_bytes).map_err(|e| {
            GatewayError::DeadLetters {
                source: Box::new(e),
            }
        })?;
        let store = DeadLetterStore { log };
        // Exported from the start: a dashboard and an alert see the
        // series before the first letter.
        for place in PLACES {
            metrics::counter!(KEPT, "place" => place).increment(0);
        }
        metrics::gauge!(MAX_BYTES).set(config.max_bytes as f64);
        store.measure();
        Ok((store, lost))
    }

    /// Sets [`BYTES`] to what the letters take on disk now.
    fn measure(&self) {
        if let Ok((bytes, _)) = self.bytes() {
            metrics::gauge!(BYTES).set(bytes as f64);
        }
    }

    /// The directory.
    pub fn dir(&self) -> &std::path::Path {
        self.log.dir()
    }

    /// The bytes the letters take on disk now, and their bound.
    pub fn bytes(&self) -> Result<(u64, u64), GatewayError> {
        let bytes = self.log.bytes().map_err(|e| GatewayError::DeadLetters {
            source: Box::new(e),
        })?;
        Ok((bytes, self.log.max_bytes()))
    }

    /// Opens the store `config` names for a tool: nothing created, a torn
    /// tail left for the gateway to cut; the bytes that cannot be read.
    fn inspect(config: &DeadLetters) -> Result<(Self, u64), GatewayError> {
        let (log, unreadable) =
            DeadLetterLog::inspect(&config.dir, config.max_bytes).map_err(|e| {
                GatewayError::DeadLetters {
                    source: Box::new(e),
                }
            })?;
        Ok((DeadLetterStore { log }, unreadable))
    }

    /// Keeps `letter`, synced: its id, or why not (a full store).
    pub(crate) fn keep(&self, letter: &DeadLetter) -> Result<u64, AppendError> {
        let id = self.log.append(&letter.encode())?;
        metrics::counter!(KEPT, "place" => letter.place.clone()).increment(1);
        self.measure();
        Ok(id)
    }

    /// Every letter, oldest first, each with its id (one that cannot be
    /// read back is shown with why).
    fn letters(&self) -> Result<Vec<ReadBack>, GatewayError> {
        let letters = self.log.list().map_err(|e| GatewayError::DeadLetters {
            source: Box::new(e),
        })?;
        Ok(letters
            .into_iter()
            .map(|Letter { id, body }| (id, DeadLetter::decode(&body)))
            .collect())
    }
}

/// Milliseconds since the Unix epoch now.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What `dlq` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DlqCommand {
    /// One line per letter.
    List,
    /// One letter whole.
    Show(u64),
    /// Send letters to their sink again; those it takes are removed. A
    /// letter read under a fence below its endpoint's last one is kept
    /// unless `force` (a later leader may have handled the message).
    Replay {
        /// Which letters.
        selection: Selection,
        /// Replay letters of an earlier leadership too.
        force: bool,
    },
    /// Remove letters.
    Purge(Selection),
}

/// Which letters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Every one.
    All,
    /// These ids.
    Ids(Vec<u64>),
}

impl Selection {
    fn picks(&self, id: u64) -> bool {
        match self {
            Selection::All => true,
            Selection::Ids(ids) => ids.contains(&id),
        }
    }
}

/// Runs `command` on the dead letters `config` names, writing what it
/// has to say to `out`: `Ok(true)` when everything asked was done.
pub fn dlq(
    config: &Config,
    command: &DlqCommand,
    out: &mut dyn std::io::Write,
) -> Result<bool, GatewayError> {
    let Some(place) = &config.dead_letters else {
        return Err(GatewayError::DeadLetters {
            source: "the configuration has no [dead_letters] table".into(),
        });
    };
    let (store, unreadable) = DeadLetterStore::inspect(place)?;
    let letters = store.letters()?;
    let write = |out: &mut dyn std::io::Write, text: String| {
        let _ = writeln!(out, "{text}");
    };
    match command {
        DlqCommand::List => {
            for (id, letter) in &letters {
                write(out, summary(*id, letter));
            }
            write(out, format!("{} dead letter(s)", letters.len()));
            if unreadable > 0 {
                write(
                    out,
                    format!(
                        "{unreadable} byte(s) at the end cannot be read (a letter torn by a crash, or damaged): the gateway cuts and counts them when it starts"
                    ),
                );
            }
            Ok(true)
        }
        DlqCommand::Show(id) => match letters.iter().find(|(i, _)| i == id) {
            None => {
                write(out, format!("no dead letter {id}"));
                Ok(false)
            }
            Some((id, Err(why))) => {
                write(out, format!("id={id} unreadable: {why}"));
                Ok(false)
            }
            Some((id, Ok(letter))) => {
                write(out, format!("id         {id}"));
                write(out, format!("from       {} {}", letter.place, letter.name));
                write(
                    out,
                    format!("sink       {}", letter.sink.as_deref().unwrap_or("-")),
                );
                write(
                    out,
                    format!("message    {}", letter.id.as_deref().unwrap_or("-")),
                );
                write(out, format!("origin     {}", one_line(&letter.from)));
                write(
                    out,
                    format!(
                        "fence      {}",
                        letter.fence.map_or("-".to_owned(), |f| f.to_string())
                    ),
                );
                write(out, format!("attempts   {}", letter.attempts));
                write(out, format!("at_ms      {}", letter.at_ms));
                write(out, format!("reason     {}", one_line(&letter.reason)));
                write(out, format!("payload    {} bytes", letter.payload.len()));
                write(
                    out,
                    one_line(&String::from_utf8_lossy(&letter.payload)).into_owned(),
                );
                Ok(true)
            }
        },
        DlqCommand::Purge(selection) => {
            let ids: Vec<u64> = letters
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| selection.picks(*id))
                .collect();
            let removed = store
                .log
                .remove(&ids)
                .map_err(|e| GatewayError::DeadLetters {
                    source: Box::new(e),
                })?;
            if let Selection::Ids(asked) = selection {
                for id in asked.iter().filter(|id| !ids.contains(id)) {
                    write(out, format!("no dead letter {id}"));
                }
            }
            write(out, format!("purged {removed} dead letter(s)"));
            Ok(match selection {
                Selection::All => true,
                Selection::Ids(asked) => removed == asked.len(),
            })
        }
        DlqCommand::Replay { selection, force } => {
            replay(config, &store, &letters, selection, *force, out)
        }
    }
}

/// A letter on one line.
fn summary(id: u64, letter: &Result<DeadLetter, String>) -> String {
    match letter {
        Err(why) => format!("id={id} unreadable: {why}"),
        Ok(l) => format!(
            "id={id} {}={} to={} from={} fence={} attempts={} at_ms={} bytes={} reason={}",
            l.place,
            l.name,
            l.sink.as_deref().unwrap_or("-"),
            field_value(&l.from),
            l.fence.map_or("-".to_owned(), |f| f.to_string()),
            l.attempts,
            l.at_ms,
            l.payload.len(),
            one_line(&l.reason)
        ),
    }
}

/// Sends the `selection`'s letters to their sinks (made from `config`,
/// straight to the receiver: a sink's queue belongs to its running
/// gateway), each under its sink's retries; what a sink took is removed.
/// Unless `force`, a letter an elected endpoint read under a fence below
/// the last one its lease was granted since is kept, and so is one whose
/// endpoint's last fence cannot be told (see [`stale`]).
fn replay(
    config: &Config,
    store: &DeadLetterStore,
    letters: &[ReadBack],
    selection: &Selection,
    force: bool,
    out: &mut dyn std::io::Write,
) -> Result<bool, GatewayError> {
    let picked: Vec<&ReadBack> = letters
        .iter()
        .filter(|(id, _)| selection.picks(*id))
        .collect();
    if let Selection::Ids(ids) = selection {
        for id in ids {
            if !letters.iter().any(|(i, _)| i == id) {
                let _ = writeln!(out, "no dead letter {id}");
            }
        }
    }
    let everything = matches!(selection, Selection::Ids(ids) if picked.len() == ids.len())
        || matches!(selection, Selection::All);
    let sinks = smol::block_on(async {
        let redis = match (
            config.redis_locker(),
            config.sinks.iter().any(
                |s| matches!(&s.kind, crate::sink::SinkKind::RedisStream(t) if t.url.is_none()),
            ),
        ) {
            (Some(locker), true) => Some(
                locker
                    .connect()
                    .await
                    .map_err(GatewayError::LockerUnreachable)?,
            ),
            _ => None,
        };
        crate::sink::build(&config.sinks, redis.as_ref(), Duration::from_secs(5)).await
    })?;
    // The lock service, asked only for letters read under a lease.
    let fenced = |letter: &&ReadBack| matches!(&letter.1, Ok(l) if l.place == "endpoint" && l.fence.is_some());
    let fences = (!force && picked.iter().any(fenced))
        .then(|| smol::block_on(crate::lockers::Fences::of(config)));
    let mut replayed = Vec::new();
    let mut failed = 0usize;
    for (id, letter) in picked {
        let letter = match letter {
            Ok(letter) => letter,
            Err(why) => {
                let _ = writeln!(out, "id={id} not replayed: unreadable: {why}");
                failed += 1;
                continue;
            }
        };
        if let Some(fences) = &fences
            && let Some(why) = stale(config, fences, letter)
        {
            let _ = writeln!(
                out,
                "id={id} not replayed: {why}; `--force` sends it anyway"
            );
            failed += 1;
            continue;
        }
        let Some((name, sink)) = letter
            .sink
            .as_ref()
            .and_then(|name| sinks.get(name).map(|s| (name, s)))
        else {
            let _ = writeln!(
                out,
                "id={id} not replayed: {} {} names no sink this configuration has",
                letter.place, letter.name
            );
            failed += 1;
            continue;
        };
        let retry = config
            .sinks
            .iter()
            .find(|s| &s.name == name)
            .map(|s| s.retry)
            .unwrap_or_default();
        let message_id = letter.replay_id(*id);
        let message = Outgoing {
            id: &message_id,
            origin: &letter.from,
            fence: letter.fence,
            payload: &letter.payload,
        };
        let delivery = smol::block_on(deliver(&**sink, &message, &retry, &mut WithoutRandom, None));
        match delivery.outcome {
            Ok(()) => {
                let _ = writeln!(out, "id={id} replayed to {name}");
                replayed.push(*id);
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "id={id} not replayed to {name} after {} attempt(s): {}",
                    delivery.attempts,
                    one_line(&e.to_string())
                );
                failed += 1;
            }
        }
    }
    store
        .log
        .remove(&replayed)
        .map_err(|e| GatewayError::DeadLetters {
            source: Box::new(e),
        })?;
    let _ = writeln!(
        out,
        "replayed {} dead letter(s), {failed} kept",
        replayed.len()
    );
    Ok(failed == 0 && everything)
}

/// Why `letter` must not be replayed without `--force`, if it must not:
/// an elected endpoint read it under a fence below the last one its lease
/// was granted since (a later leader may have handled the same message),
/// or that last fence cannot be told. `fences` is the lock service, or
/// why it could not be reached.
fn stale(
    config: &Config,
    fences: &Result<crate::lockers::Fences, GatewayError>,
    letter: &DeadLetter,
) -> Option<String> {
    let fence = letter.fence.filter(|_| letter.place == "endpoint")?;
    let key = config
        .endpoints
        .iter()
        .find(|e| e.name == letter.name)
        .and_then(|e| e.lease_key(&config.guard_settings()));
    let Some(key) = key else {
        return Some(format!(
            "read under fence {fence} by endpoint {}, which this configuration does not elect: its last fence is unknown",
            field_value(&letter.name)
        ));
    };
    let fences = match fences {
        Ok(fences) => fences,
        Err(e) => return Some(format!("the lock service could not be asked: {e}")),
    };
    match smol::block_on(fences.last(&key)) {
        Ok(Some(last)) if last > fence => Some(format!(
            "read under fence {fence}, below the last fence {last} granted for the endpoint's lease {key} (a later leader may have handled it)"
        )),
        Ok(_) => None,
        Err(e) => Some(format!(
            "the last fence of lease {key} could not be read: {}",
            one_line(&e)
        )),
    }
}

/// Keeps `letter` in `store`, or says why not: a caller with nowhere else
/// to put it counts it dropped.
pub(crate) fn kept(store: &Arc<DeadLetterStore>, letter: &DeadLetter) -> Result<u64, String> {
    store.keep(letter).map_err(|e| e.to_string())
}
