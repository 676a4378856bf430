//! Three real `vvm run` processes on one SQLite file; the current leader is SIGKILLed again and
//! again (restarted each time, so three always compete). Every leader's demo service appends
//! `<host monotonic ns> <pid> <slot> <revision>` to a shared acting log every 20 ms. The checker
//! proves from that log that no two processes acted on the slot at overlapping times and that
//! fencing tokens strictly increase from one tenure to the next.
//!
//! `VVM_MP_CYCLES` sets the number of kill cycles (default 100).

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
            .arg("--acting-log")
            .arg(self.dir.join("acting.log"))
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
                        .find_map(|f| f.strip_prefix("revision="))
                })
                .and_then(|r| r.parse::<u64>().ok());
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
        let fields: Vec<u64> = line
            .split(' ')
            .map(|f| f.parse().expect("numeric field"))
            .collect();
        assert_eq!(fields.len(), 4, "malformed acting line {line:?}");
        let (t, pid, slot, revision) = (fields[0], fields[1] as u32, fields[2] as u32, fields[3]);
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
        // SIGKILL: no release, no shutdown; the others must wait out the lease.
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
    // The survivors were polling all along: after the lease runs out, one round and a start-up.
    let bound_ms = LEASE_MS + ROUND_MS + STARTUP_SLACK_MS;
    assert!(
        worst <= bound_ms,
        "a failover took {worst} ms, more than {bound_ms} ms"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
