//! A reload (`SIGHUP`): the file read again, compared with the running
//! configuration, and applied unit by unit.
//!
//! A unit is an endpoint (by `name`), a schedule (by `chain` and
//! `router`) or an `[[active]]` consumer (by name). Guarantees:
//!
//! - **A refused file changes nothing.** A file `check` refuses, or one
//!   that changes a section every unit is built on ([`SHARED`]), leaves
//!   the running configuration in place; the refusal is logged, printed
//!   (`reload-refused`) and counted in [`RELOADS`] with
//!   `outcome="refused"`. Those sections change with a restart.
//! - **What did not change keeps running.** A unit whose validated
//!   configuration is equal to the running one is not touched: its lease
//!   is never released, its fence stays, its connection stays open.
//! - **What changed restarts.** A changed unit is stopped (a leader
//!   demotes and releases, as at a stop) and waited for before it starts
//!   under the new configuration, so the old and the new never run
//!   together; a removed unit is stopped; a new one starts.

use crate::config::{Config, Endpoint, Schedule};

/// Reloads by outcome (`applied`, `refused`).
pub const RELOADS: &str = "guard_gateway_reloads_total";

/// The sections every unit is built on (the locker, the guards'
/// settings, the limiters, the sinks and their queues, the dead letters,
/// the metrics address): a reload may not change them.
pub const SHARED: [&str; 6] = [
    "[locker]",
    "[guards]",
    "[ratelimit]",
    "[[sinks]]",
    "[dead_letters]",
    "[metrics]",
];

/// One part of a replica that a reload starts, stops or keeps.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Unit {
    /// An `[[endpoints]]` entry, by name.
    Endpoint(String),
    /// A `[[schedules]]` entry, by chain and router (a router is unique
    /// within its chain).
    Schedule {
        /// The chain (may be empty).
        chain: String,
        /// The router.
        router: String,
    },
    /// An `[[active]]` consumer, by name.
    Active(String),
}

impl std::fmt::Display for Unit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unit::Endpoint(name) => write!(f, "endpoint:{name}"),
            Unit::Schedule { chain, router } if chain.is_empty() => write!(f, "schedule:{router}"),
            Unit::Schedule { chain, router } => write!(f, "schedule:{chain}/{router}"),
            Unit::Active(name) => write!(f, "active:{name}"),
        }
    }
}

/// A unit with what configures it.
pub(crate) enum Part<'a> {
    /// An endpoint.
    Endpoint(&'a Endpoint),
    /// A schedule.
    Schedule(&'a Schedule),
    /// An active consumer's name.
    Active(&'a str),
}

impl Part<'_> {
    /// Which unit this is.
    pub fn unit(&self) -> Unit {
        match self {
            Part::Endpoint(e) => Unit::Endpoint(e.name.clone()),
            Part::Schedule(s) => Unit::Schedule {
                chain: s.chain.clone(),
                router: s.router.clone(),
            },
            Part::Active(name) => Unit::Active((*name).to_owned()),
        }
    }
}

/// Every unit of `config`, in the file's order within each kind.
pub(crate) fn parts(config: &Config) -> Vec<Part<'_>> {
    let endpoints = config.endpoints.iter().map(Part::Endpoint);
    let schedules = config.schedules.iter().map(Part::Schedule);
    let active = config.active.iter().map(|name| Part::Active(name));
    endpoints.chain(schedules).chain(active).collect()
}

/// What a reload does: every unit is in exactly one list.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// New in the file: started.
    pub started: Vec<Unit>,
    /// Changed: stopped, then started again.
    pub restarted: Vec<Unit>,
    /// Gone from the file: stopped.
    pub stopped: Vec<Unit>,
    /// Equal: left running.
    pub kept: Vec<Unit>,
}

/// What reloading `running` with `next` does, or why it may not: the
/// first shared section `next` changes.
pub(crate) fn plan(running: &Config, next: &Config) -> Result<Plan, String> {
    let changed = [
        running.locker != next.locker,
        running.guards != next.guards,
        running.ratelimit != next.ratelimit,
        running.sinks != next.sinks,
        running.dead_letters != next.dead_letters,
        running.metrics != next.metrics,
    ];
    if let Some((section, _)) = SHARED.iter().zip(changed).find(|(_, c)| *c) {
        return Err(format!(
            "it changes {section}, which every endpoint and schedule is built on: restart the gateway to change it"
        ));
    }
    let mut plan = Plan::default();
    compare(
        &mut plan,
        &running.endpoints,
        &next.endpoints,
        Part::Endpoint,
    );
    compare(
        &mut plan,
        &running.schedules,
        &next.schedules,
        Part::Schedule,
    );
    // An active consumer is its name alone: it is kept or not.
    compare(&mut plan, &running.active, &next.active, |name| {
        Part::Active(name)
    });
    Ok(plan)
}

/// Adds to `plan` what becomes of each of `old` given `new`, units told
/// apart by [`Part::unit`] (unique within a kind: the configuration
/// refuses a repeat).
fn compare<'a, T: PartialEq>(
    plan: &mut Plan,
    old: &'a [T],
    new: &'a [T],
    part: impl Fn(&'a T) -> Part<'a>,
) {
    let unit = |t| part(t).unit();
    for was in old {
        let named = unit(was);
        match new.iter().find(|is| unit(is) == named) {
            None => plan.stopped.push(named),
            Some(is) if is == was => plan.kept.push(named),
            Some(_) => plan.restarted.push(named),
        }
    }
    for is in new {
        let named = unit(is);
        if !old.iter().any(|was| unit(was) == named) {
            plan.started.push(named);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[locker]
kind = "local"

[[schedules]]
router = "heartbeat"
every_ms = 1000

[[schedules]]
router = "heartbeat"
chain = "night"
every_ms = 60000

[[active]]
name = "sensors"

[[endpoints]]
name = "alerts"
kind = "redis-pubsub"
url = "redis://127.0.0.1:6379"
patterns = ["alerts.*"]
"#;

    fn config(text: &str) -> Config {
        Config::from_toml(text).unwrap()
    }

    fn units(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn shown(units: &[Unit]) -> Vec<String> {
        units.iter().map(Unit::to_string).collect()
    }

    #[test]
    fn the_same_file_keeps_every_unit() {
        let plan = plan(&config(BASE), &config(BASE)).unwrap();
        assert!(plan.started.is_empty() && plan.restarted.is_empty() && plan.stopped.is_empty());
        assert_eq!(
            shown(&plan.kept),
            units(&[
                "endpoint:alerts",
                "schedule:heartbeat",
                "schedule:night/heartbeat",
                "active:sensors"
            ])
        );
    }

    #[test]
    fn a_unit_added_starts_a_changed_one_restarts_a_removed_one_stops() {
        let next = BASE
            .replace(r#"patterns = ["alerts.*"]"#, r#"patterns = ["alarms.*"]"#)
            .replace("every_ms = 60000", "cron = \"0 0 * * * *\"")
            .replace("name = \"sensors\"", "name = \"meters\"")
            + "\n[[endpoints]]\nname = \"orders\"\nkind = \"redis-stream\"\nurl = \"redis://127.0.0.1:6379\"\nstream = \"orders\"\ngroup = \"billing\"\n";
        let plan = plan(&config(BASE), &config(&next)).unwrap();
        assert_eq!(
            shown(&plan.restarted),
            units(&["endpoint:alerts", "schedule:night/heartbeat"])
        );
        assert_eq!(
            shown(&plan.started),
            units(&["endpoint:orders", "active:meters"])
        );
        assert_eq!(shown(&plan.stopped), units(&["active:sensors"]));
        assert_eq!(shown(&plan.kept), units(&["schedule:heartbeat"]));
    }

    #[test]
    fn a_change_to_a_shared_section_is_refused_naming_it() {
        let cases = [
            (
                BASE.replace("kind = \"local\"", "kind = \"none\""),
                "[locker]",
            ),
            (
                BASE.to_owned() + "\n[guards]\nowner = \"acme\"\n",
                "[guards]",
            ),
            (
                BASE.to_owned() + "\n[metrics]\nprometheus = \"127.0.0.1:9000\"\n",
                "[metrics]",
            ),
            (
                BASE.to_owned()
                    + "\n[[sinks]]\nname = \"up\"\nkind = \"redis-stream\"\nurl = \"redis://127.0.0.1:6379\"\nstream = \"up\"\n",
                "[[sinks]]",
            ),
        ];
        for (next, section) in cases {
            let refused = plan(&config(BASE), &config(&next)).unwrap_err();
            assert!(
                refused.contains(section) && refused.contains("restart"),
                "{section}: {refused}"
            );
        }
    }
}
