//! Failover between two real `vvm run` processes on one SQLite file (lease 2 s, renewals every
//! 0.5 s), timed from the outside:
//!
//! - `kill`: the holder is SIGKILLed at a random point of its renewal cycle; the figure is the
//!   time from the kill to the waiting candidate's `leading` line (printed when its services have
//!   started). The candidate learns of the death from the slot's lock (`~Sq.DeadHolder~`).
//! - `stop`: the holder is SIGSTOPped (it can neither release nor die, and keeps its lock); the
//!   figure is the time from the record's expiry — read from the file, on the store's clock
//!   (`CLOCK_BOOTTIME`) — to the candidate's `leading` line: how late after the expiry the
//!   candidate, which timed its next try by the record's time left, takes over.
//! - `fresh`: two processes start at once on a new file; whichever leads first is SIGKILLed the
//!   moment its `leading` line is read, right after its acquisition (the window in which a
//!   holder's lock could once be missed); the figure is the time from the kill to the other's
//!   `leading` line.
//!
//! - `tree-kill`, `tree-handoff`: both run a command (`vvm run -- sh -c …`) that starts a daemon
//!   (new session, double fork, every descriptor closed); the holder's `vvm` gets SIGKILL, or
//!   SIGTERM for a graceful hand-off; the figure is the time from the signal to the successor's
//!   command running (its first line in a log, stamped by the command itself on the wall clock).
//!
//! - `semaphore-tree-kill`: the same through `vvm run --semaphore work --limit 1` (the holder
//!   holds the semaphore's one unit on its session; the candidate's run is queued): the candidate
//!   learns of the death from the session's lock (`~Sq.SessionLock~`).
//!
//! - `etcd-tree-kill`, `etcd-tree-handoff`: the same on a single-member etcd it starts on
//!   loopback (each run under a prefix of its own); after a SIGKILL the successor leads once etcd
//!   removed the expired lease (≈ L + its 0.5 s expiry check).
//! - `pg-tree-kill`, `pg-tree-handoff`: the same on a PostgreSQL server it starts on loopback
//!   (`test-support/src/postgres.rs`; each run in a schema of its own); after a SIGKILL the
//!   successor leads once it has seen the holder's record unchanged for a whole TTL
//!   (`~Tx.Observation~`): L less the time since the holder's last renewal, give or take.
//! - `pg-mark-tree-kill`: `pg-tree-kill` with `death=advisory-lock` (`~Pg.Marks~`): the holder's
//!   session holds an advisory lock, which the server frees when the holder's supervisor, the
//!   last process with its connection, exits after reaping the tree; the successor, blocked on
//!   that lock, takes over then.
//!
//! `cargo bench --features cli --bench failover_sqlite -- [kill|stop|fresh|tree-kill|tree-handoff|
//! semaphore-tree-kill|etcd-tree-kill|etcd-tree-handoff|pg-tree-kill|pg-tree-handoff|
//! pg-mark-tree-kill|both] [RUNS]` (default: `both` = kill and stop, 20 runs).
//! Prints every run, then p50, p99 and the maximum per mode.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use vvm_adapters::etcd::cluster::{ClusterOptions, EtcdCluster};

use vvm_adapters::sqlite::{BootClock, StoreClock};
use vvm_test_support::postgres as postgres_support;

/// Longest wait for a `leading` line on a loaded machine.
const LEAD_WAIT: Duration = Duration::from_secs(30);

struct Runner {
    child: Child,
    lines: mpsc::Receiver<Instant>,
}

impl Runner {
    fn spawn(store: &str, address: &str) -> Runner {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args([
                "--log-level",
                "warn",
                "run",
                "--store",
                store,
                "--slots",
                "1",
            ])
            .args(["--address", address, "--lease", "2s", "--acquire", "600s"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the vvm binary starts");
        let stdout = child.stdout.take().expect("piped");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Stamped as soon as it is read.
                let at = Instant::now();
                if line.starts_with("leading ") && sender.send(at).is_err() {
                    return;
                }
            }
        });
        Runner { child, lines }
    }

    /// A `leading` line read by now, if any.
    fn led(&self) -> Option<Instant> {
        self.lines.try_recv().ok()
    }

    fn leading(&self) -> Instant {
        self.lines
            .recv_timeout(LEAD_WAIT)
            .expect("a leading line within the wait")
    }

    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.child.id() as i32).expect("a pid");
        kill_process(pid, signal).expect("the signal is sent");
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fresh directory per run: no lock file, record or feed of an earlier run.
fn scratch(run: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "vvm-failover-bench-{}-{run}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// A pseudo-random delay in `0.1..1.1 s`: spread over two renewal cycles.
fn delay(state: &mut u64) -> Duration {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    Duration::from_millis(100 + (*state >> 33) % 1_000)
}

/// The record's expiry of slot 1 as an `Instant` of this process: read on the store's clock.
fn expiry(database: &Path) -> Instant {
    let conn =
        rusqlite::Connection::open_with_flags(database, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("the database opens");
    let expires_ns: i64 = conn
        .query_row(
            "SELECT expires_ns FROM vvm_leases WHERE slot = 1",
            [],
            |r| r.get(0),
        )
        .expect("the holder's record");
    let clock = BootClock::new().expect("the boot clock");
    let now = Instant::now();
    let since_boot = clock.since_boot().expect("the boot clock reads");
    let left_ns = u64::try_from(expires_ns)
        .unwrap_or(0)
        .saturating_sub(since_boot.as_nanos() as u64);
    now + Duration::from_nanos(left_ns)
}

/// Two processes start on a new file; the first to lead is killed at once (see `fresh`).
fn fresh(index: usize) -> Duration {
    let dir = scratch(index);
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut runners = vec![Runner::spawn(&store, "one"), Runner::spawn(&store, "two")];
    let started = Instant::now();
    let first = loop {
        if let Some(first) = runners.iter().position(|runner| runner.led().is_some()) {
            break first;
        }
        assert!(started.elapsed() < LEAD_WAIT, "nobody led within the wait");
        std::thread::sleep(Duration::from_micros(200));
    };
    let mut holder = runners.remove(first);
    holder.child.kill().expect("SIGKILL");
    let killed = Instant::now();
    holder.child.wait().expect("reaped");
    let figure = runners[0].leading().saturating_duration_since(killed);
    drop(runners);
    let _ = std::fs::remove_dir_all(&dir);
    figure
}

/// The command of the tree modes: a daemon, then a line per 20 ms, the first at once.
const TREE_SCRIPT: &str = r#"log="$PWD/acts"
perl -e 'use POSIX; POSIX::setsid(); exit 0 if fork; POSIX::close($_) for 0..1023;
  while (1) { sleep 1 }' &
while :; do echo "${VVM_FENCING_TOKEN#*:} $(date +%s%N)" >> "$log"; sleep 0.02; done"#;

fn spawn_tree(dir: &Path, address: &str, store: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .current_dir(dir)
        .args(["--log-level", "warn", "run", "--store", store])
        .args(extra)
        .args(["--address", address, "--lease", "2s"])
        .args([
            "--acquire",
            "600s",
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            TREE_SCRIPT,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the vvm binary starts")
}

/// The first line's wall-clock time (ns) of each revision in the log so far.
fn first_lines(log: &Path) -> Vec<(u64, u128)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut firsts: Vec<(u64, u128)> = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(Ok(revision)), Some(Ok(at))) = (
            parts.next().map(str::parse::<u64>),
            parts.next().map(str::parse::<u128>),
        ) else {
            continue;
        };
        if !firsts.iter().any(|(r, _)| *r == revision) {
            firsts.push((revision, at));
        }
    }
    firsts
}

fn wait_revisions(log: &Path, count: usize) -> Vec<(u64, u128)> {
    let started = Instant::now();
    loop {
        let firsts = first_lines(log);
        if firsts.len() >= count {
            return firsts;
        }
        assert!(
            started.elapsed() < LEAD_WAIT,
            "no command ran within the wait"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A server the remote modes run on.
enum Remote {
    /// An etcd cluster's endpoints, `HOST:PORT,…`.
    Etcd(String),
    /// A PostgreSQL server's loopback port.
    Postgres(u16),
}

/// A tree mode (see the module documentation): on the SQLite file of a fresh directory, or, given
/// a `remote` server, on it under a prefix (etcd) or in a schema (PostgreSQL) of this run's own.
fn tree(mode: &str, index: usize, remote: Option<&Remote>) -> Duration {
    let dir = scratch(index);
    let log = dir.join("acts");
    let store = match remote {
        Some(Remote::Etcd(endpoints)) => format!("etcd://{endpoints}/?prefix=run-{index}/"),
        Some(Remote::Postgres(port)) => {
            let death = if mode.starts_with("pg-mark-") {
                "&death=advisory-lock"
            } else {
                ""
            };
            format!("postgres://vvm@127.0.0.1:{port}/postgres?schema=run{index}{death}")
        }
        None => format!("sqlite:{}", dir.join("vvm.sqlite").display()),
    };
    let extra: &[&str] = match mode {
        "semaphore-tree-kill" => &["--semaphore", "work", "--limit", "1"],
        _ => &["--slots", "1"],
    };
    let mut holder = spawn_tree(&dir, "holder", &store, extra);
    wait_revisions(&log, 1);
    let mut candidate = spawn_tree(&dir, "candidate", &store, extra);
    std::thread::sleep(Duration::from_millis(300));
    let pid = Pid::from_raw(holder.id() as i32).expect("a pid");
    let signal = if mode.ends_with("tree-kill") {
        Signal::KILL
    } else {
        Signal::TERM
    };
    let sent_ns = wall_ns();
    kill_process(pid, signal).expect("the signal is sent");
    let firsts = wait_revisions(&log, 2);
    let _ = holder.wait();
    let _ = candidate.kill();
    let _ = candidate.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Duration::from_nanos(u64::try_from(firsts[1].1.saturating_sub(sent_ns)).unwrap_or(u64::MAX))
}

fn run(mode: &str, index: usize, state: &mut u64, remote: Option<&Remote>) -> Duration {
    if mode == "fresh" {
        return fresh(index);
    }
    if mode.starts_with("tree-")
        || mode.starts_with("etcd-tree-")
        || mode.starts_with("pg-tree-")
        || mode.starts_with("pg-mark-tree-")
        || mode.starts_with("semaphore-")
    {
        return tree(mode, index, remote);
    }
    let dir = scratch(index);
    let database = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", database.display());
    let holder = Runner::spawn(&store, "holder");
    holder.leading();
    let candidate = Runner::spawn(&store, "candidate");
    std::thread::sleep(delay(state));
    let figure = match mode {
        "kill" => {
            let mut holder = holder;
            holder.child.kill().expect("SIGKILL");
            let killed = Instant::now();
            holder.child.wait().expect("reaped");
            candidate.leading().saturating_duration_since(killed)
        }
        _ => {
            holder.signal(Signal::STOP);
            let expires = expiry(&database);
            let led = candidate.leading();
            holder.signal(Signal::CONT);
            led.saturating_duration_since(expires)
        }
    };
    drop(candidate);
    let _ = std::fs::remove_dir_all(&dir);
    figure
}

fn report(mode: &str, mut figures: Vec<Duration>) {
    figures.sort_unstable();
    let pick = |q: f64| figures[((figures.len() as f64 - 1.0) * q).round() as usize];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{mode}: {} runs: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        figures.len(),
        ms(pick(0.5)),
        ms(pick(0.99)),
        ms(figures[figures.len() - 1])
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode = args.first().map_or("both", String::as_str);
    let runs: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(20);
    let modes: &[&str] = match mode {
        "kill" => &["kill"],
        "stop" => &["stop"],
        "fresh" => &["fresh"],
        "tree-kill" => &["tree-kill"],
        "tree-handoff" => &["tree-handoff"],
        "semaphore-tree-kill" => &["semaphore-tree-kill"],
        "etcd-tree-kill" => &["etcd-tree-kill"],
        "etcd-tree-handoff" => &["etcd-tree-handoff"],
        "pg-tree-kill" => &["pg-tree-kill"],
        "pg-tree-handoff" => &["pg-tree-handoff"],
        "pg-mark-tree-kill" => &["pg-mark-tree-kill"],
        _ => &["kill", "stop"],
    };
    // The etcd modes: one single-member cluster on loopback for all their runs.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let cluster = if mode.starts_with("etcd-") {
        let options = ClusterOptions::new(1).expect("cluster options are valid");
        Some(
            runtime
                .block_on(EtcdCluster::start(options))
                .expect("etcd starts (apt-get install etcd-server)"),
        )
    } else {
        None
    };
    // The PostgreSQL modes: one server on loopback for all their runs.
    let server = if mode.starts_with("pg-") {
        Some(postgres_support::PgServer::start("failover_sqlite").expect("PostgreSQL is installed"))
    } else {
        None
    };
    // `HOST:PORT,…`, for URLs with a prefix of their own.
    let remote = cluster
        .as_ref()
        .map(|cluster| {
            Remote::Etcd(
                cluster
                    .endpoints()
                    .iter()
                    .map(|endpoint| endpoint.trim_start_matches("http://").to_owned())
                    .collect::<Vec<_>>()
                    .join(","),
            )
        })
        .or_else(|| {
            server
                .as_ref()
                .map(|server| Remote::Postgres(server.port()))
        });
    let mut state = 0x5EED;
    for mode in modes {
        let figures: Vec<Duration> = (0..runs)
            .map(|index| {
                let figure = run(mode, index, &mut state, remote.as_ref());
                println!("{mode} run {index:2}: {:.1} ms", figure.as_secs_f64() * 1e3);
                figure
            })
            .collect();
        report(mode, figures);
    }
}
