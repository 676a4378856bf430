//! The `vvm` host binary: run a VVM with a demo service, show who leads, or watch a failover.
// Unsafe only where FoundationDB's network thread is started (`cli::store`, feature `foundationdb`)
// and where the supervisor starts the command into its cgroup (`cli::supervise::clone`).
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, CommandFactory, Parser, Subcommand};

mod cli;

use cli::duration::{parse_acquire, parse_duration};
use cli::ops::parse_metrics_addr;

/// The exit codes, shown at the end of the help of `vvm` and of each subcommand.
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0   clean shutdown (SIGTERM or SIGHUP, or the command of `run -- CMD` exited with status 0);
      after Ctrl-C (SIGINT) `run` ends by SIGINT once stopped (the shell says 130)
  1   a problem: no slot acquired for a reason other than busy (3), store refused (or
      unavailable past --acquire), leadership lost, a service failed, the command's supervisor
      ended by someone else
  2   usage error: bad flag or value, unknown store scheme, no subcommand (help on standard error)
  3   `run`: busy — --acquire ended with every slot (or the units) held by someone else, the
      command never ran (`--busy-code` chooses another)
  75  ended by the killer: the kill deadline passed without a confirmed renewal
  `run -- CMD`: the command's own status when it ends by itself (128+N when signal N ended
  it; its own 75 too: the last line says whose); 126 when CMD cannot be run, 127 when it is not
  found (checked before campaigning)

Every flag can also be set from the environment variable shown with it; a flag on the command
line wins.

A sqlite: store is private to its user (files 0600; a file another user owns, can write or can
read, and a directory another user owns without the sticky bit, are refused). With
`?shared-group=true` every member of the files' group is trusted as the owner is: it can hold,
release and read slots, stall the store by holding its locks, and end anyone's grant or remove
any semaphore (`vvm semaphore delete --force`).";

/// Run service work only while holding leadership of a slot in a shared store.
#[derive(Parser, Debug)]
#[command(
    name = "vvm",
    version,
    about,
    long_about = None,
    arg_required_else_help = true,
    max_term_width = 100,
    after_help = EXIT_CODES_HELP
)]
pub struct Cli {
    /// Log level on standard error: error, warn, info, debug or trace.
    #[arg(long, global = true, help_heading = "Logging", env = "VVM_LOG_LEVEL", default_value = "info", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,

    /// Layout of the log lines on standard error: `text` (coloured only on a terminal, never
    /// with `NO_COLOR` set) or `json` (one object per line). `RUST_LOG`, when set, filters the
    /// lines instead of `--log-level` (e.g. `RUST_LOG=warn,vvm_runtime=debug`).
    #[arg(
        long,
        global = true,
        help_heading = "Logging",
        env = "VVM_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: cli::log::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Launch a VVM that runs `CMD ARGS…` (after `--`) while it leads; with `--hold`, hold the
    /// slot and print its token; without either, a demo service that prints its fencing token
    /// every second. SIGINT or SIGTERM shut it down gracefully: services, monitor, release.
    #[command(after_help = EXIT_CODES_HELP)]
    Run(RunArgs),
    /// Show who holds each slot: holder, incarnation, fencing revision, time left.
    #[command(after_help = EXIT_CODES_HELP)]
    Status(StatusArgs),
    /// Create, list, describe (`--watch`, `--json`), update or delete a counted semaphore: service
    /// discovery and configuration from a shell (see the README's coordination recipes).
    #[command(after_help = EXIT_CODES_HELP)]
    Semaphore(SemaphoreArgs),
    /// Start 4 `vvm run` processes on a temporary SQLite file (or a 3-member etcd cluster it
    /// starts): SIGKILL the leader and measure the failover, SIGSTOP the next and check that
    /// nobody takes over before its lease expired, stop the third gracefully and measure the
    /// hand-off, and clean up.
    #[command(after_help = EXIT_CODES_HELP)]
    Demo(DemoArgs),
    /// Print a shell completion script: `vvm completions bash > /etc/bash_completion.d/vvm`,
    /// `vvm completions zsh > ~/.zfunc/_vvm`, `vvm completions fish > ~/.config/fish/completions/vvm.fish`.
    Completions(CompletionsArgs),
    /// Print the manual page (roff): `vvm man > /usr/local/share/man/man1/vvm.1`, or `vvm man | man -l -`.
    Man,
}

/// The supervisor's command line, `vvm __exec-guard …`: parsed apart from [`Cli`], so that no
/// help, completion or manual page shows it.
#[derive(Parser, Debug)]
#[command(name = "vvm __exec-guard")]
struct GuardCli {
    #[command(flatten)]
    args: GuardArgs,
}

/// Arguments of `vvm completions`.
#[derive(Args, Debug, Clone)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Arguments of the internal `vvm __exec-guard` (see `cli::supervise`).
#[derive(Args, Debug, Clone)]
pub struct GuardArgs {
    /// The `vvm run` process whose death must end the command.
    #[arg(long)]
    parent: i32,
    /// Read end of the control pipe: kill deadlines and the stop request.
    #[arg(long)]
    control: i32,
    /// Write end of the report pipe: the command's process id.
    #[arg(long)]
    report: i32,
    /// The first kill deadline, `CLOCK_BOOTTIME` nanoseconds.
    #[arg(long)]
    deadline_ns: u64,
    /// A slot lock descriptor to hold until the command's tree is gone (repeatable).
    #[arg(long)]
    hold: Vec<i32>,
    /// Refuse to start the command without a cgroup for its tree.
    #[arg(long, conflicts_with = "no_cgroup")]
    strict: bool,
    /// Make no cgroup: the subreaper alone contains the tree.
    #[arg(long)]
    no_cgroup: bool,
    /// Start the command in no PID namespace of its own.
    #[arg(long)]
    no_namespace: bool,
    /// Arm no kernel watchdog (a debug build's fault hook for tests only).
    #[arg(long)]
    no_kernel_watchdogs: bool,
    /// Write its own lines as JSON objects (`vvm run --log-format json`).
    #[arg(long)]
    json_log: bool,
    /// The command to start.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

impl From<GuardArgs> for cli::supervise::Supervision {
    fn from(args: GuardArgs) -> Self {
        cli::supervise::Supervision {
            parent: args.parent,
            control: args.control,
            report: args.report,
            deadline_ns: args.deadline_ns,
            hold: args.hold,
            command: args.command,
            strict: args.strict,
            no_cgroup: args.no_cgroup,
            no_namespace: args.no_namespace,
            no_kernel_watchdogs: args.no_kernel_watchdogs,
        }
    }
}

/// Arguments of `vvm run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Where the leases live: `sqlite:PATH`, `etcd://HOST:PORT[,…][/?PARAMETERS]`,
    /// `postgres://USER@HOST[:PORT][/DB][?PARAMETERS]`, `fdb:[FILE]` or `memory:` [default:
    /// sqlite:$XDG_STATE_HOME/vvm/vvm.sqlite, else sqlite:~/.local/state/vvm/vvm.sqlite].
    #[arg(short, long, env = "VVM_STORE", value_name = "URL")]
    store: Option<String>,
    /// Number of slots; this VVM tries slots 1..=N.
    #[arg(short = 'n', long, env = "VVM_SLOTS", default_value_t = 1)]
    slots: u32,
    /// This VVM's address, stored in the lease it holds [default: <hostname>/pid-<pid>].
    #[arg(short, long, env = "VVM_ADDRESS")]
    address: Option<String>,
    /// Lease duration L: renewal every L/4; the process ends 0.8·L after the last confirmed
    /// write.
    #[arg(short, long, env = "VVM_LEASE", default_value = "20s", value_parser = parse_duration)]
    lease: Duration,
    /// How long to keep trying to acquire a slot (or the units) before giving up: `0` tries once
    /// (`flock -n`, `consul lock -try`); `forever` (the default) for a standby that waits as long
    /// as it runs (SIGINT or SIGTERM still stop it at once).
    #[arg(long, env = "VVM_ACQUIRE", default_value = "forever", value_parser = parse_acquire)]
    acquire: Duration,
    /// Exit status when `--acquire` ends because every slot (or the units) is held by someone
    /// else: the command never ran (`flock -E`; e.g. `--busy-code 0` for a cron job that may
    /// skip a turn quietly). A store that fails is still 1.
    #[arg(long, env = "VVM_BUSY_CODE", value_name = "CODE", default_value_t = cli::EXIT_BUSY)]
    busy_code: u8,
    /// Pause between two acquisition rounds over all slots.
    #[arg(long, env = "VVM_ROUND", default_value = "1s", value_parser = parse_duration)]
    round: Duration,
    /// When the store cannot serve at start (an etcd cluster out of reach or without a
    /// quorum): `wait` for it, trying again after pauses of up to `--round` within `--acquire`,
    /// and say so once; `fail` exits 1 at once. A wrong URL, credentials or certificates
    /// always fail at once.
    #[arg(
        long,
        env = "VVM_STORE_UNAVAILABLE",
        value_enum,
        default_value = "wait"
    )]
    store_unavailable: cli::store::Unavailable,
    /// Hold the slot (or the units) without a command, as `etcdctl lock NAME` does: print
    /// `VVM_SLOT=N VVM_FENCING_TOKEN=N:R` on one line of standard output once held,
    /// and keep holding until SIGINT, SIGTERM or SIGHUP — a script's lock around several
    /// commands (see the README).
    #[arg(long, env = "VVM_HOLD", conflicts_with = "command", value_parser = BoolishValueParser::new())]
    hold: bool,
    /// Time the command has to exit after SIGTERM before its process tree gets SIGKILL.
    #[arg(short, long, env = "VVM_GRACE", default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// The command to run while this VVM leads, with `VVM_SLOT`, `VVM_FENCING_TOKEN` (its
    /// fencing token, `<slot>:<revision>`) and `VVM_ADDRESS` set. Its tree gets SIGTERM on shutdown or loss of leadership,
    /// SIGKILL after `--grace` or when the kill deadline passes. `vvm` exits with its status.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
    /// How the command's process tree is contained: `auto` starts it in a PID namespace of its
    /// own (whose end, by the kernel, is every process's) and a cgroup v2 directory of its own
    /// where they can be made (root, or systemd's `Delegate=yes` for the cgroup), else under the
    /// supervisor as a subreaper; `strict` refuses to start without the cgroup; `cgroup` is
    /// `strict` without the namespace (for commands whose pids must mean the same outside:
    /// in a namespace `$$` is 2); `subreaper` makes no cgroup.
    #[arg(long, env = "VVM_CONTAINMENT", value_enum, default_value = "auto")]
    containment: cli::exec::ContainmentMode,
    /// Run under a grant of `--count` units of this semaphore instead of a slot: at most its
    /// limit in units run at once across every `vvm` on the store, granted in order of arrival.
    /// It must exist (`vvm semaphore create NAME --limit N`) unless `--limit` or `--ephemeral`
    /// makes it; the command gets `VVM_SLOT=0` and `VVM_FENCING_TOKEN=0:<the grant's number>`. Not with
    /// `--metrics-addr`, whose `/leader` and slot metrics describe a slot.
    #[arg(long, env = "VVM_SEMAPHORE", value_name = "NAME", conflicts_with_all = ["slots", "metrics_addr"])]
    semaphore: Option<String>,
    /// Units of `--semaphore` this run takes (1 to the semaphore's limit).
    #[arg(long, env = "VVM_COUNT", default_value_t = 1, requires = "semaphore")]
    count: u64,
    /// Create `--semaphore` with this limit when it does not exist (`consul lock -n N`), and
    /// say so; an existing one keeps its own limit (a different one is warned about: change a
    /// limit with `vvm semaphore delete` and `create` while nobody holds or waits).
    #[arg(
        long,
        env = "VVM_LIMIT",
        requires = "semaphore",
        conflicts_with = "ephemeral"
    )]
    limit: Option<u64>,
    /// Make `--semaphore`, when it does not exist, an ephemeral one: no limit, deleted when its
    /// last holder or waiter leaves (service discovery: `vvm semaphore describe` lists who runs).
    #[arg(long, env = "VVM_EPHEMERAL", requires = "semaphore", value_parser = BoolishValueParser::new())]
    ephemeral: bool,
    /// Serve `/metrics` (Prometheus), `/healthz` and `/leader` over HTTP on this address:
    /// `PORT` or `:PORT` listen on loopback (127.0.0.1), `IP:PORT` as given (`0.0.0.0:PORT`
    /// exposes them on every interface, without authentication). Off when not set.
    #[arg(long, env = "VVM_METRICS_ADDR", value_name = "ADDR", value_parser = parse_metrics_addr)]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Arguments of `vvm status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Where the leases live (see `vvm run --help`) [default: as `vvm run`].
    #[arg(short, long, env = "VVM_STORE", value_name = "URL")]
    store: Option<String>,
    /// Number of slots to show.
    #[arg(short = 'n', long, env = "VVM_SLOTS", default_value_t = 1)]
    slots: u32,
    /// Keep watching: after the table, one time-stamped line per change of a slot's holder
    /// (taken, released, expired, passed on; renewals are not changes), until SIGINT or SIGTERM.
    #[arg(short, long, env = "VVM_STATUS_WATCH", value_parser = BoolishValueParser::new())]
    watch: bool,
    /// Machine-readable output: `{"slots": [...]}`, then (with --watch) one JSON object per
    /// change and line (see the README).
    #[arg(long, env = "VVM_STATUS_JSON", value_parser = BoolishValueParser::new())]
    json: bool,
}

/// Arguments of `vvm semaphore`.
#[derive(Args, Debug, Clone)]
pub struct SemaphoreArgs {
    /// Where the semaphores live (see `vvm run --help`) [default: as `vvm run`].
    #[arg(short, long, global = true, env = "VVM_STORE", value_name = "URL")]
    store: Option<String>,
    #[command(subcommand)]
    action: SemaphoreAction,
}

/// What `vvm semaphore` does.
#[derive(Subcommand, Debug, Clone)]
pub enum SemaphoreAction {
    /// Print the names of the semaphores the store holds, one per line, sorted by their bytes
    /// (nothing when there are none).
    List {
        /// One JSON object per semaphore and line: `{"name": …}`.
        #[arg(long)]
        json: bool,
    },
    /// Create a semaphore of `--limit` units (refused when the name exists, unless
    /// `--if-missing`).
    Create {
        /// Its name: 1 to 255 bytes of UTF-8, no control characters.
        name: String,
        /// Units it has: 1 for a lock or a leader, the number of instances for discovery.
        #[arg(long)]
        limit: u64,
        /// Its own data (a configuration, a version), at most 16 KiB.
        #[arg(long, default_value = "")]
        data: String,
        /// An existing semaphore of that name is success, left as it is (a different limit is
        /// warned about): for scripts that run again.
        #[arg(long)]
        if_missing: bool,
    },
    /// Print a semaphore: data, count and limit, the last token, its owners and waiters;
    /// `--watch` prints it again at every change of its data or owners, until SIGINT or SIGTERM.
    Describe {
        /// Its name.
        name: String,
        /// Keep printing at every change (a slow reader skips to the latest state).
        #[arg(short, long)]
        watch: bool,
        /// One JSON object per snapshot and line.
        #[arg(long)]
        json: bool,
    },
    /// Replace a semaphore's data (no ownership needed); watchers see the change.
    Update {
        /// Its name.
        name: String,
        /// The new data, at most 16 KiB.
        #[arg(long)]
        data: String,
    },
    /// Change a semaphore's limit in place, under its holders: a raise grants waiters at once;
    /// a limit below the units in use (or below a queued request) is refused.
    SetLimit {
        /// Its name.
        name: String,
        /// The new limit, at least 1 and at least the units in use.
        limit: u64,
    },
    /// Delete a semaphore; refused while it has owners or waiters unless `--force`.
    Delete {
        /// Its name.
        name: String,
        /// Delete it even with owners or waiters: their grants and requests end.
        #[arg(long)]
        force: bool,
    },
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
    #[arg(long, env = "VVM_DEMO_STORE", value_enum, default_value = "sqlite")]
    store: DemoStore,
    /// Lease duration of the demo processes (etcd needs whole seconds, at least 2).
    #[arg(long, env = "VVM_DEMO_LEASE", default_value = "3s", value_parser = parse_duration)]
    lease: Duration,
    /// Pause between acquisition rounds of the demo processes (the "poll").
    #[arg(long, env = "VVM_DEMO_ROUND", default_value = "200ms", value_parser = parse_duration)]
    round: Duration,
}

/// Logging on standard error that never panics and never blocks the runtime (see `cli::log`);
/// a `RUST_LOG` that is not a valid filter is a usage error.
fn init_logging(level: &str, format: cli::log::LogFormat) -> Result<(), ExitCode> {
    let level = match level {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = cli::log::filter(level, rust_log.as_deref()).map_err(|e| cli::usage_error(&e))?;
    cli::log::init(filter, format);
    Ok(())
}

/// `text` ending with a newline (clap's help ends without one after `after_help`).
fn with_newline(mut text: String) -> String {
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// Writes the completion script for `shell` to standard output.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "vvm", &mut script);
    write_out(&script)
}

/// Writes the manual page (roff) to standard output (see `cli::manual`).
fn man_page() -> ExitCode {
    match cli::manual::render(&Cli::command()) {
        Ok(page) => write_out(&page),
        Err(e) => cli::fail(&format!("cannot render the manual page: {e}")),
    }
}

/// `bytes` to standard output; a closed pipe is not a panic.
fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => cli::fail(&format!("cannot write to standard output: {e}")),
    }
}

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    if argv
        .nth(1)
        .is_some_and(|first| first == cli::exec::GUARD_SUBCOMMAND)
    {
        // Before anything else starts: this process is about to become the command.
        let words = std::iter::once(OsString::from("vvm")).chain(argv);
        // A name a person recognises in `ps -e`, `top` and `/proc/PID/comm` (its program is
        // `/proc/self/exe`, which would show as `exe`); the command gets its own at exec.
        let _ = rustix::thread::set_name(cli::exec::SUPERVISOR_NAME);
        return match GuardCli::try_parse_from(words) {
            Ok(guard) => {
                if guard.args.json_log {
                    cli::log::use_json_lines();
                }
                cli::supervise::supervise(guard.args.into())
            }
            Err(e) => cli::usage_error(&format!("supervisor: {}", e.kind())),
        };
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                // Not `print!`: it panics when standard output is a closed pipe (`| head -1`).
                let _ = write!(std::io::stdout(), "{}", with_newline(e.to_string()));
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // Bare `vvm`: the help, as a usage error (a script that forgot the subcommand
                // must not read success).
                let _ = write!(std::io::stderr(), "{}", with_newline(e.to_string()));
                return ExitCode::from(cli::EXIT_USAGE);
            }
            // One line naming the flag, or the environment variable the value came from.
            let argv: Vec<OsString> = std::env::args_os().collect();
            return cli::usage_error(&cli::args::explain(&e, &Cli::command(), &argv));
        }
    };
    let command = cli.command;
    if let Err(code) = init_logging(&cli.log_level, cli.log_format) {
        return code;
    }
    let code = match command {
        Command::Completions(args) => completions(args.shell),
        Command::Man => man_page(),
        Command::Demo(args) => cli::demo::demo(args),
        Command::Run(args) => cli::block_on(cli::run::run(args)),
        Command::Status(args) => cli::block_on(cli::status::status(args)),
        Command::Semaphore(args) => cli::block_on(cli::semaphore::semaphore(args)),
    };
    // The last lines (e.g. "shut down cleanly") are still queued; wait a bounded time for them.
    cli::log::flush();
    // Ctrl-C ends `vvm run` the way it ends other programs: by SIGINT (see `clean_exit`).
    cli::host::end_by_interrupt();
    code
}
