//! The `vvm` host binary: run a VVM with a demo service, show who leads, or watch a failover.
// Unsafe only where FoundationDB's network thread is started (`cli::store`, feature `foundationdb`).
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod cli;

use cli::duration::parse_duration;

/// Run service work only while holding leadership of a slot in a shared store.
#[derive(Parser, Debug)]
#[command(name = "vvm", version, about, long_about = None)]
struct Cli {
    /// Log level on standard error: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Launch a VVM whose demo service prints its fencing token every second while it leads.
    /// SIGINT or SIGTERM shut it down gracefully: services, monitor, release.
    Run(RunArgs),
    /// Show who holds each slot: holder, incarnation, fencing revision, time left.
    Status(StatusArgs),
    /// Start 3 `vvm run` processes on a temporary SQLite file (or a 3-member etcd cluster it starts),
    /// SIGKILL the leader, measure the
    /// failover, stop the next leader gracefully, measure the hand-off, and clean up.
    Demo(DemoArgs),
}

/// Arguments of `vvm run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Where the leases live: `memory:`, `sqlite:PATH`, `etcd:HOST:PORT[,HOST:PORT…]` or `fdb:[CLUSTER-FILE]`.
    #[arg(long, default_value = "sqlite:vvm.sqlite")]
    store: String,
    /// Number of slots; this VVM tries slots 1..=N.
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// This VVM's address, stored in the lease it holds [default: <hostname>/pid-<pid>].
    #[arg(long)]
    address: Option<String>,
    /// Lease duration L (renewal every L/4; the process ends 0.8·L after the last confirmed write).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    lease: Duration,
    /// How long to keep trying to acquire a slot before giving up.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    acquire: Duration,
    /// Pause between two acquisition rounds over all slots.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    round: Duration,
    /// Append `<host monotonic ns> <pid> <slot> <revision>` to this file every 20 ms while the
    /// demo service runs, so that a checker can verify that no two processes acted at once.
    #[arg(long)]
    acting_log: Option<PathBuf>,
}

/// Arguments of `vvm status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Where the leases live (see `vvm run --help`).
    #[arg(long, default_value = "sqlite:vvm.sqlite")]
    store: String,
    /// Number of slots to show.
    #[arg(long, default_value_t = 1)]
    slots: u32,
}

/// Which store the demo runs on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoStore {
    /// A temporary SQLite file shared by the processes.
    Sqlite,
    /// A 3-member etcd cluster on loopback that the demo starts and stops (needs `etcd`).
    Etcd,
}

/// Arguments of `vvm demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// The store the demo processes share.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: DemoStore,
    /// Lease duration of the demo processes (etcd needs whole seconds, at least 2).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    lease: Duration,
    /// Pause between acquisition rounds of the demo processes (the "poll").
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    round: Duration,
}

fn init_logging(level: &str) {
    let level = match level {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return ExitCode::SUCCESS;
            }
            // One line: the first line of clap's message, without the usage block.
            let text = e.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            return cli::usage_error(first);
        }
    };
    init_logging(&cli.log_level);
    match cli.command {
        Command::Demo(args) => cli::demo::demo(args),
        Command::Run(args) => cli::block_on(cli::run::run(args)),
        Command::Status(args) => cli::block_on(cli::status::status(args)),
    }
}
