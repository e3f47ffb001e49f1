//! `guard-gateway`: run an edge-gateway replica, or the multi-replica demo.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use guard_endpoints::config::FileConfig;
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
    /// execution and each leadership change is printed on stdout, one per
    /// line; logs go to stderr (RUST_LOG=info by default).
    Run {
        /// The TOML configuration.
        #[arg(long, short)]
        config: PathBuf,
        /// This replica's name among those running the same file: it
        /// names its stream consumer and MQTT clients (default
        /// `replica-<process id>`).
        #[arg(long)]
        replica: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match cli.command {
        Command::Demo { replicas, seconds } => run_demo(replicas, seconds),
        Command::Run { config, replica } => {
            let identity = replica.unwrap_or_else(|| format!("replica-{}", std::process::id()));
            run_replica(&config, &identity)
        }
    }
}

fn run_demo(replicas: u64, seconds: u64) -> ExitCode {
    let options = DemoOptions {
        replicas: usize::try_from(replicas).unwrap_or(3),
        duration: Duration::from_secs(seconds),
        ..DemoOptions::default()
    };
    let report = demo::run(&options, |p| {
        let leader = p
            .leader
            .map_or("none".to_owned(), |l| format!("replica {l}"));
        eprint!(
            "\r{:>5.1}s  slots run: {:<4} leader: {leader}   ",
            p.elapsed.as_secs_f32(),
            p.slots
        );
        let _ = std::io::stderr().flush();
    });
    eprintln!();
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

fn run_replica(path: &std::path::Path, identity: &str) -> ExitCode {
    let config = match FileConfig::from_path(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Some(address) = &config.metrics.prometheus {
        match address
            .parse()
            .map_err(|e: std::net::AddrParseError| e.to_string())
            .and_then(|a| prometheus::serve(a).map_err(|e| e.to_string()))
        {
            Ok(bound) => log::info!("metrics at http://{bound}/metrics"),
            Err(e) => {
                eprintln!("cannot serve metrics on {address}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let (handle, control) = guard_smol::control();
    if let Err(e) = ctrlc::set_handler(move || handle.stop()) {
        eprintln!("cannot install the signal handler: {e}");
        return ExitCode::from(2);
    }
    let emit: Arc<dyn Fn(replica::Event) + Send + Sync> = Arc::new(|event| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{event}");
        let _ = out.flush();
    });
    match smol::block_on(replica::run(&config, identity, control, emit)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
