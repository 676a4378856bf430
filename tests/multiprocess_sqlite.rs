//! Three real `vvm run` processes on one SQLite file; the current leader is SIGKILLed again and
//! again (restarted each time, so three always compete). Every leader's demo service appends
//! `<host monotonic ns> <pid> <slot> <revision>` to a shared acting log every 20 ms. The checker
//! proves from that log that no two processes acted on the slot at overlapping times and that
//! fencing tokens strictly increase from one tenure to the next.
//!
//! `VVM_MP_CYCLES` sets the number of kill cycles (default 100).
//!
//! The dead-holder tests below run pairs of `vvm run` processes and judge by relative facts only:
//! a SIGKILLed holder is succeeded long before its record could expire; a SIGSTOPped one, or one
//! whose command's child still holds the inherited lock, only after; a removed or replaced lock
//! file never lets a candidate in beside a live holder.

mod cli_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const PROCESSES: usize = 3;
const LEASE: &str = "2s";
const LEASE_MS: u64 = 2_000;
const ROUND: &str = "100ms";
const ROUND_MS: u64 = 100;
/// Insert, service start and the first output line of the new leader, on a loaded machine.
const STARTUP_SLACK_MS: u64 = 1_000;
/// Longest wait for a new leader after a kill: the lease, a round and generous start-up slack.
const LEADER_WAIT: Duration = Duration::from_secs(15);

struct Fleet {
    dir: PathBuf,
    store: String,
    children: Vec<Child>,
    lines: mpsc::Receiver<(usize, u64, String)>,
    sender: mpsc::Sender<(usize, u64, String)>,
    generation: u64,
}

impl Fleet {
    fn spawn(&mut self, index: usize) -> Child {
        self.generation += 1;
        let log = std::fs::File::create(
            self.dir
                .join(format!("child-{index}-{}.log", self.generation)),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args([
                "--log-level",
                "warn",
                "run",
                "--store",
                &self.store,
                "--slots",
                "1",
            ])
            .args(["--address", &format!("mp-{index}-{}", self.generation)])
            .args(["--lease", LEASE, "--round", ROUND, "--acquire", "600s"])
            .env("VVM_ACTING_LOG", self.dir.join("acting.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("the vvm binary starts");
        let stdout = child.stdout.take().unwrap();
        let sender = self.sender.clone();
        let generation = self.generation;
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send((index, generation, line)).is_err() {
                    return;
                }
            }
        });
        child
    }

    /// Waits for a leading line with a revision above `above`; returns (index, revision).
    fn next_leader(&self, above: u64) -> (usize, u64) {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (index, _, line) = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "no leader above revision {above} within {LEADER_WAIT:?}; logs in {}",
                    self.dir.display()
                )
            });
            let revision = line
                .strip_prefix("leading ")
                .and_then(|rest| {
                    rest.split_whitespace()
                        .find_map(|f| f.strip_prefix("fencing_token="))
                })
                .and_then(|token| token.parse::<vvm::FencingToken>().ok())
                .map(|token| token.revision.0);
            if let Some(revision) = revision.filter(|r| *r > above) {
                return (index, revision);
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One tenure as seen in the acting log.
#[derive(Debug)]
struct Tenure {
    #[allow(dead_code)] // shown in failure messages
    pid: u32,
    revision: u64,
    first_ns: u64,
    last_ns: u64,
}

/// Tenures per slot, ordered by their first action; panics on a malformed line.
fn tenures(log: &Path) -> BTreeMap<u32, Vec<Tenure>> {
    let text = std::fs::read_to_string(log).expect("the acting log exists");
    let mut by_key: BTreeMap<(u32, u32, u64), (u64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "malformed acting line {line:?}");
        let number = |f: &str| f.parse::<u64>().expect("numeric field");
        let token: vvm::FencingToken = fields[2].parse().expect("a fencing token");
        let (t, pid) = (number(fields[0]), number(fields[1]) as u32);
        let (slot, revision) = (token.slot.0, token.revision.0);
        let span = by_key.entry((slot, pid, revision)).or_insert((t, t));
        span.0 = span.0.min(t);
        span.1 = span.1.max(t);
    }
    let mut slots: BTreeMap<u32, Vec<Tenure>> = BTreeMap::new();
    for ((slot, pid, revision), (first_ns, last_ns)) in by_key {
        slots.entry(slot).or_default().push(Tenure {
            pid,
            revision,
            first_ns,
            last_ns,
        });
    }
    for list in slots.values_mut() {
        list.sort_by_key(|t| t.first_ns);
    }
    slots
}

/// No overlap between consecutive tenures of a slot, and strictly increasing tokens.
fn check(slots: &BTreeMap<u32, Vec<Tenure>>) -> Result<usize, String> {
    let mut count = 0;
    for (slot, list) in slots {
        for pair in list.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if a.last_ns >= b.first_ns {
                return Err(format!("slot {slot}: {a:?} still acted when {b:?} began"));
            }
            if a.revision >= b.revision {
                return Err(format!(
                    "slot {slot}: token did not increase from {a:?} to {b:?}"
                ));
            }
        }
        count += list.len();
    }
    Ok(count)
}

// covers: Mp.NoOverlap
#[test]
fn the_checker_rejects_overlapping_or_non_increasing_tenures() {
    let tenure = |pid, revision, first_ns, last_ns| Tenure {
        pid,
        revision,
        first_ns,
        last_ns,
    };
    let ok = BTreeMap::from([(1, vec![tenure(1, 5, 0, 10), tenure(2, 9, 11, 20)])]);
    assert_eq!(check(&ok), Ok(2));
    let overlap = BTreeMap::from([(1, vec![tenure(1, 5, 0, 11), tenure(2, 9, 11, 20)])]);
    assert!(check(&overlap).is_err());
    let stale = BTreeMap::from([(1, vec![tenure(1, 9, 0, 10), tenure(2, 9, 11, 20)])]);
    assert!(check(&stale).is_err());
}

// covers: Mp.NoOverlap, Mp.SqliteFailover
#[test]
fn sigkilled_leaders_never_overlap_and_tokens_increase() {
    let cycles: usize = std::env::var("VVM_MP_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("vvm-mp-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (sender, lines) = mpsc::channel();
    let mut fleet = Fleet {
        store: format!("sqlite:{}", dir.join("vvm.sqlite").display()),
        dir: dir.clone(),
        children: Vec::new(),
        lines,
        sender,
        generation: 0,
    };
    for index in 0..PROCESSES {
        let child = fleet.spawn(index);
        fleet.children.push(child);
    }

    let started = Instant::now();
    let mut revision = 0;
    let mut failover_ms = Vec::with_capacity(cycles);
    let mut killed_at: Option<Instant> = None;
    // Kill at varying points of the renewal cycle (L/4 = 500 ms): a fixed-seed LCG picks the delay.
    let mut lcg: u64 = 0x5EED;
    for _ in 0..cycles {
        let (leader, next) = fleet.next_leader(revision);
        if let Some(at) = killed_at {
            failover_ms.push(at.elapsed().as_millis() as u64);
        }
        revision = next;
        lcg = lcg
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        std::thread::sleep(Duration::from_millis((lcg >> 33) % 600));
        // SIGKILL: no release, no shutdown; the others learn of the death from the slot's lock
        // (or, should the leader have named no lock file, wait out the lease).
        fleet.children[leader].kill().unwrap();
        fleet.children[leader].wait().unwrap();
        killed_at = Some(Instant::now());
        let replacement = fleet.spawn(leader);
        fleet.children[leader] = replacement;
    }
    fleet.next_leader(revision);
    drop(fleet);

    let slots = tenures(&dir.join("acting.log"));
    let count = check(&slots).unwrap_or_else(|e| panic!("{e}; acting log in {}", dir.display()));
    assert!(count > cycles, "{count} tenures for {cycles} kills");
    failover_ms.sort_unstable();
    let median = failover_ms[failover_ms.len() / 2];
    let worst = failover_ms[failover_ms.len() - 1];
    println!(
        "{cycles} SIGKILL cycles in {:.0?}: {count} tenures, no overlap; failover median {median} ms, worst {worst} ms (lease {LEASE_MS} ms)",
        started.elapsed()
    );
    // At worst (a leader that could not lock the file) the lease runs out, then a start-up.
    let bound_ms = LEASE_MS + ROUND_MS + STARTUP_SLACK_MS;
    assert!(
        worst <= bound_ms,
        "a failover took {worst} ms, more than {bound_ms} ms"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One `vvm run` on an SQLite file, for the dead-holder tests: its stdout lines arrive on a
/// channel with the time each was read.
struct Runner {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

impl Runner {
    fn spawn(store: &str, address: &str, lease: &str, command: &[&str]) -> Runner {
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
            .args(["--address", address, "--lease", lease, "--acquire", "600s"])
            .args(if command.is_empty() {
                &[][..]
            } else {
                &["--"][..]
            })
            .args(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the vvm binary starts");
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        Runner { child, lines }
    }

    /// When it printed that it leads (and the revision), waiting at most `within`.
    fn leading(&self, within: Duration) -> Option<(Instant, u64)> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, line) = self.lines.recv_timeout(left).ok()?;
            let revision = line
                .strip_prefix("leading ")
                .and_then(|rest| {
                    rest.split_whitespace()
                        .find_map(|f| f.strip_prefix("fencing_token="))
                })
                .and_then(|token| token.parse::<vvm::FencingToken>().ok())
                .map(|token| token.revision.0);
            if let Some(revision) = revision {
                return Some((at, revision));
            }
        }
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
    }

    fn kill(&mut self) -> Instant {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        Instant::now()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scratch directory and the store URL of a file in it.
fn scratch(name: &str) -> (PathBuf, String) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("vvm-{name}-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    (dir, store)
}

/// Long enough for any loaded machine to start a leader.
const START_WAIT: Duration = Duration::from_secs(30);

// covers: Sq.DeadHolder
#[test]
fn a_sigkilled_holder_is_succeeded_at_once_not_at_its_expiry() {
    // Renewals every 5 s: the holder's record has at least 15 s left when it is killed.
    let (dir, store) = scratch("dead-holder");
    let mut holder = Runner::spawn(&store, "holder", "20s", &[]);
    let (_, first) = holder.leading(START_WAIT).expect("the holder leads");
    let candidate = Runner::spawn(&store, "candidate", "20s", &[]);
    // The candidate is refused and waits (for a change, or the expiry).
    std::thread::sleep(Duration::from_secs(1));
    assert!(candidate.leading(Duration::ZERO).is_none());
    let killed = holder.kill();
    let (led, revision) = candidate.leading(START_WAIT).expect("the candidate leads");
    let after = led.saturating_duration_since(killed);
    assert!(
        revision > first,
        "the token increases: {first} then {revision}"
    );
    // Well before the record's expiry (≥ 15 s after the kill): the kernel told of the death.
    assert!(
        after < Duration::from_secs(10),
        "the successor led {after:?} after the kill, not before the expiry"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stops `holder` (SIGSTOP) where it holds no write transaction, and tells when. A holder stopped
/// inside one keeps SQLite's write lock, so nobody can write until it resumes: a documented
/// limit of SQLite (specs/stores.md), not what the tests of stopped holders are about. So the stop
/// is undone and tried again while the database's write lock is taken (by the stopped holder, or
/// for a moment by the candidate).
fn stop_outside_a_transaction(holder: &Runner, database: &Path) -> Instant {
    for _ in 0..50 {
        holder.signal(rustix::process::Signal::STOP);
        let stopped = Instant::now();
        // The signal is delivered asynchronously: probe only once the kernel says it stopped.
        let stat = format!("/proc/{}/stat", holder.child.id());
        let is_stopped = || {
            std::fs::read_to_string(&stat).is_ok_and(|text| {
                text.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
            })
        };
        let limit = Instant::now() + Duration::from_secs(5);
        while !is_stopped() && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(is_stopped(), "the holder did not stop");
        if !vvm_adapters::sqlite::write_locked(database).expect("the probe runs") {
            return stopped;
        }
        eprintln!("stopped while the write lock was taken; again");
        holder.signal(rustix::process::Signal::CONT);
        std::thread::sleep(Duration::from_millis(37));
    }
    panic!("the write lock was taken at each of 50 stops");
}

// covers: Sq.DeadHolder
#[test]
fn a_stopped_holder_keeps_its_lock_and_is_succeeded_only_at_its_expiry() {
    // Renewals every 0.5 s: the record expires at least 1.5 s after the holder stops.
    let (dir, store) = scratch("stopped-holder");
    let holder = Runner::spawn(&store, "holder", "2s", &[]);
    holder.leading(START_WAIT).expect("the holder leads");
    let candidate = Runner::spawn(&store, "candidate", "2s", &[]);
    std::thread::sleep(Duration::from_secs(1));
    let stopped = stop_outside_a_transaction(&holder, &dir.join("vvm.sqlite"));
    let (led, _) = candidate
        .leading(START_WAIT)
        .expect("the candidate leads after the expiry");
    let after = led.saturating_duration_since(stopped);
    assert!(
        after >= Duration::from_millis(1_400),
        "the successor led {after:?} after the holder stopped, before its record could expire"
    );
    holder.signal(rustix::process::Signal::CONT);
    drop(holder);
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.DeadHolder
#[test]
fn a_removed_or_replaced_lock_file_never_looks_like_a_dead_holder() {
    let (dir, store) = scratch("lock-file-gone");
    let lock = dir.join("vvm.sqlite.slot-1.lock");
    let holder = Runner::spawn(&store, "holder", "2s", &[]);
    holder.leading(START_WAIT).expect("the holder leads");
    assert!(
        lock.exists(),
        "the holder's lock file is next to the database"
    );
    std::fs::remove_file(&lock).unwrap();
    let candidate = Runner::spawn(&store, "candidate", "2s", &[]);
    // Three lease periods: the candidate tries at each expiry it learns, and may create and lock
    // a new file at the path; the record names the old one.
    assert!(
        candidate.leading(Duration::from_secs(6)).is_none(),
        "the candidate took the slot of a live holder whose lock file was removed"
    );
    // Replaced: another file renamed over the path.
    let other = dir.join("other.lock");
    std::fs::write(&other, b"").unwrap();
    std::fs::rename(&other, &lock).unwrap();
    assert!(
        candidate.leading(Duration::from_secs(6)).is_none(),
        "the candidate took the slot of a live holder whose lock file was replaced"
    );
    let mut holder = holder;
    assert!(
        holder.child.try_wait().unwrap().is_none(),
        "the holder still runs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.DeadHolder, Cli.ExecOrphan
#[test]
fn a_commands_tree_is_gone_before_a_successor_leads_after_vvm_died() {
    // `vvm` is killed while its command's child runs: the supervisor, which holds the slot's
    // lock, ends the whole tree and only then exits, freeing the lock. The successor may lead
    // at once — but never while any process of the old tree lives.
    let (dir, store) = scratch("inherited-lock");
    let pid_file = dir.join("sleep.pid");
    let script = format!(
        "echo leading fencing_token=$VVM_FENCING_TOKEN; sleep 60 & echo $! > {}; wait",
        pid_file.display()
    );
    let mut holder = Runner::spawn(&store, "holder", "2s", &["sh", "-c", &script]);
    holder.leading(START_WAIT).expect("the holder leads");
    let candidate = Runner::spawn(&store, "candidate", "2s", &[]);
    let started = Instant::now();
    while !pid_file.exists()
        || std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .is_empty()
    {
        assert!(started.elapsed() < START_WAIT, "the command did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    let holder_pid = holder.child.id();
    // Its pid in the command's PID namespace, as this process sees it.
    let sleep = cli_support::tree::host_pid(
        holder_pid,
        std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap(),
    );
    let killed = holder.kill();
    let (led, _) = candidate
        .leading(START_WAIT)
        .expect("the candidate leads once the old tree is gone");
    // The `sleep` was reaped by the supervisor before the lock was freed: no such process now
    // (or another one that reused the pid, which is not a child of the old tree).
    let alive = std::fs::read_to_string(format!("/proc/{sleep}/stat"))
        .ok()
        .filter(|stat| stat.contains("(sleep)"));
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(sleep).unwrap(),
        rustix::process::Signal::KILL,
    );
    assert!(
        alive.is_none(),
        "the old command's child still ran when the successor led {:?} after vvm {holder_pid} died: {alive:?}",
        led.saturating_duration_since(killed)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.DeadHolder
#[tokio::test]
async fn a_dead_holder_wakes_every_waiter_of_one_store_not_only_the_first() {
    use vvm::store::LeaseStore;
    let dir = vvm_conformance::ScratchDir::new("vvm-sqlite-two-waiters");
    let path = dir.path().join("vvm.sqlite");
    // The holder is another process: a lock is the process's, and only its death frees it.
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--lease", "20s", "--store"])
        .arg(format!("sqlite:{}", path.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the vvm binary runs");
    let mut lines = std::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    let waiter = vvm_adapters::SqliteStore::open(&path).expect("the store opens");
    // Two waits on one store (a VVM and the observer that logs who holds the slot, or two VVMs
    // of one process): both begin while the holder lives.
    let first = waiter.changed(&[vvm::Slot(1)]);
    let second = waiter.changed(&[vvm::Slot(1)]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The holder dies: its lock goes, its record stays until the expiry (15 s or more away).
    holder.kill().unwrap();
    holder.wait().unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), async {
        first.await;
        second.await;
    })
    .await;
    assert!(both.is_ok(), "one of the waits never learnt of the death");
    // A wait begun after is not woken again by the same record (a refused insert would spin).
    let later =
        tokio::time::timeout(Duration::from_millis(300), waiter.changed(&[vvm::Slot(1)])).await;
    assert!(
        later.is_err(),
        "a later wait was woken by the same dead record"
    );
}
