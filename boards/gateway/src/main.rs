//! `guard-gateway`: run an edge-gateway replica, check its configuration,
//! or run the multi-replica demo.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use guard_gateway::config::Config;
use guard_gateway::demo::{self, DemoOptions};
use guard_gateway::{prometheus, replica};

/// An edge-gateway replica built on guard: scheduled jobs run once per
/// planned slot across replicas, leader-only consumers run on one replica
/// at a time with automatic takeover, rate limits and metrics.
#[derive(Parser, Debug)]
#[command(name = "guard-gateway", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run several replicas in this process on an in-process locker: an
    /// every-second job and a leader-only consumer. The leader is stopped
    /// half-way. Prints a report; exits with status 1 if a slot ran twice,
    /// a slot was missed, or none ran.
    Demo {
        /// Replicas to run.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=64))]
        replicas: u64,
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=3600))]
        seconds: u64,
    },
    /// Run one replica from a configuration file (see gateway.toml). Each
    /// execution, leadership change and handled message is printed on
    /// stdout, one per line; logs go to stderr (RUST_LOG=info by default).
    /// SIGHUP reads the file again: what did not change keeps running.
    Run {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
        /// This replica's name among those running the same file: it
        /// names its stream consumer and MQTT clients (default
        /// `replica-<process id>`).
        #[arg(long)]
        replica: Option<String>,
        /// Serve /metrics, /healthz and /readyz here instead of the
        /// file's `metrics.prometheus` (a second replica on the same
        /// host needs a port of its own).
        #[arg(long)]
        metrics: Option<SocketAddr>,
    },
    /// Validate a configuration file without connecting to anything;
    /// prints what it configures, or the first mistake (exit 2).
    Check {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// The dead letters on disk (`[dead_letters]`), of a stopped or a
    /// running gateway: list, show, replay to their sink, purge.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
}

#[derive(Subcommand, Debug)]
enum DlqAction {
    /// One line per letter: id, where it was given up, origin, attempts,
    /// size and the last error.
    List {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// One letter whole, its payload as text (control characters
    /// escaped).
    Show {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
        /// The letter's id (from `list`).
        id: u64,
    },
    /// Send letters to their sink again, under its retries, with their
    /// message id; those it takes are removed. Exit 1 if any was not.
    #[command(group(clap::ArgGroup::new("which").required(true)))]
    Replay {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
        /// Every letter.
        #[arg(long, group = "which")]
        all: bool,
        /// The letters' ids.
        #[arg(group = "which")]
        ids: Vec<u64>,
        /// Send letters an earlier leader read too: by default a letter
        /// read under a fence below its endpoint's last one is kept (a
        /// later leader may have handled the message).
        #[arg(long)]
        force: bool,
    },
    /// Remove letters for good.
    #[command(group(clap::ArgGroup::new("which").required(true)))]
    Purge {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
        /// Every letter.
        #[arg(long, group = "which")]
        all: bool,
        /// The letters' ids.
        #[arg(group = "which")]
        ids: Vec<u64>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // On a terminal the demo keeps a status line at the bottom: each log
    // line first clears it, so the two never glue together.
    let status_line = std::io::stderr().is_terminal();
    let _logging = match guard_gateway::logging::install(status_line) {
        Ok(installed) => installed,
        Err(e) => {
            eprintln!("cannot set up logging: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Demo { replicas, seconds } => run_demo(replicas, seconds, status_line),
        Command::Run {
            config,
            replica,
            metrics,
        } => {
            let identity = replica.unwrap_or_else(|| format!("replica-{}", std::process::id()));
            run_replica(&config, &identity, metrics)
        }
        Command::Check { config } => check(&config),
        Command::Dlq { action } => dlq(action),
    }
}

fn dlq(action: DlqAction) -> ExitCode {
    use guard_gateway::dead_letters::{DlqCommand, Selection};
    let selection = |all: bool, ids: Vec<u64>| {
        if all {
            Selection::All
        } else {
            Selection::Ids(ids)
        }
    };
    let (path, command) = match action {
        DlqAction::List { config } => (config, DlqCommand::List),
        DlqAction::Show { config, id } => (config, DlqCommand::Show(id)),
        DlqAction::Replay {
            config,
            all,
            ids,
            force,
        } => (
            config,
            DlqCommand::Replay {
                selection: selection(all, ids),
                force,
            },
        ),
        DlqAction::Purge { config, all, ids } => (config, DlqCommand::Purge(selection(all, ids))),
    };
    let config = match Config::from_path(&path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match guard_gateway::dead_letters::dlq(&config, &command, &mut std::io::stdout().lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

fn run_demo(replicas: u64, seconds: u64, status_line: bool) -> ExitCode {
    let options = DemoOptions {
        replicas: usize::try_from(replicas).unwrap_or(3),
        duration: Duration::from_secs(seconds),
        ..DemoOptions::default()
    };
    let report = demo::run(&options, |p| {
        if !status_line {
            return; // a log file gets the report only
        }
        let leader = p
            .leader
            .map_or("none".to_owned(), |l| format!("replica {l}"));
        eprint!(
            "\r\x1b[2K{:>5.1}s  slots run: {:<4} leader: {leader}",
            p.elapsed.as_secs_f32(),
            p.slots
        );
        let _ = std::io::stderr().flush();
    });
    if status_line {
        eprintln!();
    }
    match report {
        Ok(report) => {
            print!("{report}");
            if !report.kept_promises() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::from(2)
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::from_path(path) {
        Ok(config) => {
            print!("{}", replica::summary(&config));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

fn run_replica(path: &Path, identity: &str, metrics: Option<SocketAddr>) -> ExitCode {
    let config = match Config::from_path(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let ready = match guard_gateway::service::Notifier::from_env() {
        Ok(None) => guard_gateway::readiness::Readiness::new(),
        Ok(Some(notifier)) => guard_gateway::readiness::Readiness::reporting_to(notifier),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let ready = Arc::new(ready);
    if let Some(address) = metrics.or(config.metrics.prometheus) {
        match prometheus::serve(address, ready.clone()) {
            Ok(bound) => tracing::info!("metrics at http://{bound}/metrics"),
            Err(e) => {
                eprintln!("cannot serve metrics on {address}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let (handle, control) = guard_smol::control();
    let (reload, reloads) = smol::channel::unbounded();
    if let Err(e) = signals(path.to_owned(), handle, reload) {
        eprintln!("cannot install the signal handlers: {e}");
        return ExitCode::from(2);
    }
    let emit: Arc<dyn Fn(replica::Event) + Send + Sync> = Arc::new(|event| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{event}");
        let _ = out.flush();
    });
    match smol::block_on(replica::run_reloading(
        &config, identity, control, emit, ready, reloads,
    )) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// SIGTERM and SIGINT stop the replica; SIGHUP reads `path` again and
/// hands the replica the configuration, or why it was refused. The file
/// is read on a thread of its own, so a read that blocks (a FIFO, a hung
/// mount) never delays a stop; SIGHUPs that arrive while a read is under
/// way are one more read, of the file as it is then.
fn signals(
    path: PathBuf,
    stop: guard_smol::RunHandle,
    reload: smol::channel::Sender<replica::Reload>,
) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM])?;
    // One read pending at most: a burst of SIGHUPs is one more read.
    let (wake, woken) = smol::channel::bounded::<()>(1);
    std::thread::Builder::new()
        .name("reload".to_owned())
        .spawn(move || {
            while woken.recv_blocking().is_ok() {
                tracing::info!("SIGHUP: reading {} again", path.display());
                if reload.send_blocking(Config::from_path(&path)).is_err() {
                    return; // the replica has ended
                }
            }
        })?;
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || {
            for signal in signals.forever() {
                if signal == SIGHUP {
                    // Full: a read is pending already, and will see the
                    // file as it is now.
                    let _ = wake.try_send(());
                } else {
                    stop.stop();
                }
            }
        })?;
    Ok(())
}
