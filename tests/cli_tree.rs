//! `vvm run -- CMD`: the holder is the whole process tree the command starts, through the real
//! binary. Every process of a tree appends `REVISION KIND WALL_NS` lines to one log while it
//! runs — the command itself, and a daemon it starts (new session, double fork, every
//! descriptor closed). The oracle is what a user would see in that log: the lines of two tenures
//! never interleave in time, and revisions only grow.
//!
//! This test process makes itself a child subreaper, as a container's first process that never
//! reaps would be: an orphan that reaches it stays a zombie.

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::tree::*;
use cli_support::{exit_within, signal, temp_dir};
use rustix::process::Signal;

/// Runs one case: `one` leads with a daemonizing command, `two` waits; `hit` is sent to `one`
/// (or to its supervisor); the second tenure must begin only after every process of the first
/// ended.
fn tree_case(prefix: &str, hit: Signal, at_supervisor: bool) -> (PathBuf, Child, Child) {
    become_a_careless_reaper();
    let dir = temp_dir(prefix);
    let log = dir.join("acts");
    let mut one = spawn(&dir, "one", "1s", SCRIPT);
    wait_until(&log, "the first tree acts", both_act);
    let two = spawn(&dir, "two", "1s", SCRIPT);
    // The candidate has opened the store and is waiting.
    std::thread::sleep(Duration::from_millis(500));
    if at_supervisor {
        rustix::process::kill_process(supervisor_of(&one), hit).unwrap();
    } else {
        signal(&one, hit);
    }
    if hit == Signal::KILL && !at_supervisor {
        let _ = one.wait();
    }
    let seen = wait_until(&log, "a second tenure acts", |seen| {
        seen.len() >= 2 && seen.values().nth(1).is_some_and(|t| t.kinds.len() == 2)
    });
    assert_eq!(seen.len(), 2, "{seen:?}");
    // Long enough for a survivor of the first tree to show.
    std::thread::sleep(LEASE);
    assert_no_overlap(&tenures(&log), &dir);
    (dir, one, two)
}

// covers: Cli.ExecTree
#[test]
fn a_stopped_vvm_cannot_keep_its_tree_acting() {
    let (dir, mut one, mut two) = tree_case("vvm-tree-stop", Signal::STOP, false);
    signal(&one, Signal::CONT);
    // Past its deadline: its own killer ends it.
    assert_eq!(
        exit_within(&mut one, WAIT_MAX),
        Some(Some(75)),
        "{}",
        logs(&dir)
    );
    signal(&two, Signal::TERM);
    assert_eq!(
        exit_within(&mut two, WAIT_MAX),
        Some(Some(0)),
        "{}",
        logs(&dir)
    );
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.ExecTree, Cli.ExecOrphan
#[test]
fn a_killed_vvm_leaves_nothing_of_its_tree_acting() {
    let (dir, _one, mut two) = tree_case("vvm-tree-kill", Signal::KILL, false);
    signal(&two, Signal::TERM);
    assert_eq!(
        exit_within(&mut two, WAIT_MAX),
        Some(Some(0)),
        "{}",
        logs(&dir)
    );
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.ExecTree
#[test]
fn a_killed_supervisor_leaves_nothing_of_its_tree_acting() {
    let (dir, mut one, mut two) = tree_case("vvm-tree-supervisor", Signal::KILL, true);
    // The supervisor's end is not the command's status: `one` says what happened and fails
    // with 1, not 128 + SIGKILL as if the command had been killed by someone else.
    assert_eq!(
        exit_within(&mut one, WAIT_MAX),
        Some(Some(1)),
        "{}",
        logs(&dir)
    );
    let stderr = std::fs::read_to_string(dir.join("one.stderr")).unwrap();
    assert!(stderr.contains("the supervisor was ended"), "{stderr}");
    signal(&two, Signal::TERM);
    assert_eq!(
        exit_within(&mut two, WAIT_MAX),
        Some(Some(0)),
        "{}",
        logs(&dir)
    );
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.ExecReap
#[test]
fn a_graceful_stop_does_not_wait_for_an_orphan_to_be_reaped_elsewhere() {
    become_a_careless_reaper();
    let dir = temp_dir("vvm-tree-reap");
    // On SIGTERM the shell exits at once; its background child, which takes a moment to stop,
    // is left an orphan, then a zombie that nobody reaps unless the supervisor does.
    let script = r#"(trap 'sleep 0.3; exit 0' TERM; while :; do sleep 0.05; done) &
trap 'exit 0' TERM
echo started > started.tmp && mv started.tmp started
while :; do sleep 0.05; done"#;
    let grace = Duration::from_secs(10);
    let mut one = spawn(&dir, "one", "10s", script);
    let start = Instant::now();
    while !dir.join("started").exists() {
        assert!(start.elapsed() < WAIT_MAX, "{}", logs(&dir));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    signal(&one, Signal::TERM);
    let stopped = Instant::now();
    let code = exit_within(&mut one, WAIT_MAX);
    let took = stopped.elapsed();
    assert_eq!(code, Some(Some(0)), "{}", logs(&dir));
    assert!(
        took < grace / 2,
        "the shutdown took {took:?}: it waited for an orphan that nobody reaped\n{}",
        logs(&dir)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// What the chaos test does to the leader in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    StopVvm,
    KillVvm,
    KillSupervisor,
    Terminate,
    /// SIGABRT: how `vvm` ends when it panics with `panic = "abort"`, or any abort (a failed
    /// allocation, a double panic) — the process ends with no code of its own running.
    AbortVvm,
    /// An unwinding panic in the task that runs the command (SIGUSR1 with the debug build's
    /// fault hook): the process lives on, the task's drops run, the service ends as failed.
    PanicVvm,
    /// SIGSTOP of the supervisor, then SIGTERM to `vvm`: a graceful stop with the one that
    /// signals the tree stopped.
    StopSupervisorThenTerminate,
    /// SIGSTOP of the supervisor and of `vvm`: neither watchdog runs; the kernel's do.
    StopBoth,
    /// SIGTERM and SIGCONT to every process of the unit at once (systemd's default stop).
    UnitTerminate,
    /// SIGTERM twice, 2 ms apart (`timeout`'s signal to `vvm`, then to its group).
    TerminateTwice,
    /// SIGHUP: the terminal closed.
    Hangup,
    /// The store's write lock held past the kill deadline (SQLite only): renewals fail.
    StallStore,
    /// The holder's record deleted from outside (a `DELETE` in the SQLite file, `etcdctl del`
    /// of its key): the usual way to "unstick" it.
    DeleteRecord,
    /// The lease of the holder's record revoked from outside (`etcdctl lease revoke`; etcd
    /// only): the other usual way.
    RevokeLease,
}

/// Every fault, in the order of their counts in the final line.
const FAULTS: [Fault; 14] = [
    Fault::StopVvm,
    Fault::KillVvm,
    Fault::KillSupervisor,
    Fault::Terminate,
    Fault::AbortVvm,
    Fault::PanicVvm,
    Fault::StopSupervisorThenTerminate,
    Fault::StopBoth,
    Fault::UnitTerminate,
    Fault::TerminateTwice,
    Fault::Hangup,
    Fault::StallStore,
    Fault::DeleteRecord,
    Fault::RevokeLease,
];

/// Whether `fault` can be done to a store named `store`, to a leader contained by
/// `containment`. Stopping both `vvm` and the supervisor leaves the tree to the kernel, which
/// ends it only through a PID namespace: not with `--containment cgroup`.
fn applies(fault: Fault, store: &str, containment: &str) -> bool {
    match fault {
        Fault::StallStore => store == "sqlite",
        Fault::RevokeLease => store == "etcd",
        Fault::StopBoth => containment != "cgroup",
        _ => true,
    }
}

/// Every process of `vvm`'s unit: itself, its supervisor and the whole tree.
fn unit_of(vvm: &Child) -> Vec<rustix::process::Pid> {
    std::iter::once(vvm.id())
        .chain(descendants(vvm.id()))
        .filter_map(|pid| rustix::process::Pid::from_raw(pid as i32))
        .collect()
}

/// Does `fault` to `leader`, on the SQLite file in `dir` or the etcd at `endpoints` (none for
/// SQLite) where the fault needs it.
fn hit(fault: Fault, leader: &Child, dir: &Path, endpoints: &[String]) {
    let kill = rustix::process::kill_process;
    match fault {
        Fault::StopVvm => signal(leader, Signal::STOP),
        Fault::KillVvm => signal(leader, Signal::KILL),
        Fault::KillSupervisor => kill(supervisor_of(leader), Signal::KILL).unwrap(),
        Fault::Terminate => signal(leader, Signal::TERM),
        Fault::AbortVvm => signal(leader, Signal::ABORT),
        Fault::PanicVvm => signal(leader, Signal::USR1),
        Fault::StopSupervisorThenTerminate => {
            kill(supervisor_of(leader), Signal::STOP).unwrap();
            signal(leader, Signal::TERM);
        }
        Fault::StopBoth => {
            kill(supervisor_of(leader), Signal::STOP).unwrap();
            signal(leader, Signal::STOP);
        }
        Fault::UnitTerminate => {
            let unit = unit_of(leader);
            for pid in &unit {
                let _ = kill(*pid, Signal::TERM);
            }
            for pid in &unit {
                let _ = kill(*pid, Signal::CONT);
            }
        }
        Fault::TerminateTwice => {
            signal(leader, Signal::TERM);
            std::thread::sleep(Duration::from_millis(2));
            signal(leader, Signal::TERM);
        }
        Fault::Hangup => signal(leader, Signal::HUP),
        Fault::StallStore => {
            let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
            database.busy_timeout(Duration::from_secs(5)).unwrap();
            database.execute_batch("BEGIN EXCLUSIVE").unwrap();
            // Past the kill deadline (0.8 · 2 s after the last confirmed renewal).
            std::thread::sleep(LEASE + LEASE / 4);
            database.execute_batch("ROLLBACK").unwrap();
        }
        Fault::DeleteRecord if !endpoints.is_empty() => {
            assert!(remove_etcd_records(endpoints, Removal::Delete) > 0);
        }
        Fault::RevokeLease => {
            assert!(remove_etcd_records(endpoints, Removal::Revoke) > 0);
        }
        Fault::DeleteRecord => {
            let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
            database.busy_timeout(Duration::from_secs(5)).unwrap();
            database.execute_batch("DELETE FROM vvm_leases").unwrap();
        }
    }
}

/// The command of a chaos round: it daemonizes, ignores SIGTERM, or both.
fn chaos_script(daemon: bool, ignore_term: bool) -> String {
    let mut script = String::new();
    if ignore_term {
        script.push_str("trap '' TERM\n");
    }
    if daemon {
        script.push_str(SCRIPT);
    } else {
        script.push_str(
            r#"while :; do echo "$VVM_FENCING_TOKEN c $(date +%s%N)" >> "$PWD/acts"; sleep 0.02; done"#,
        );
    }
    script
}

/// A small deterministic generator (the seed is printed, and `VVM_CHAOS_SEED` replays it).
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *state >> 33
}

/// Rounds and seed of a chaos test: `VVM_CHAOS_ROUNDS` (default `rounds`), `VVM_CHAOS_SEED`.
fn chaos_settings(rounds: usize) -> (usize, u64) {
    let rounds: usize = std::env::var("VVM_CHAOS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(rounds);
    let seed: u64 = std::env::var("VVM_CHAOS_SEED")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()));
    (rounds, seed)
}

// covers: Cli.ExecTree, Cli.ExecChaos, Cli.ExecUnwind
#[test]
fn chaos_never_lets_two_trees_act_at_once() {
    let dir = temp_dir("vvm-tree-chaos");
    let (rounds, seed) = chaos_settings(50);
    chaos("sqlite", &store_of(&dir), &[], &dir, rounds, seed);
}

use vvm_test_support::etcd;

// covers: Cli.ExecTree, Cli.ExecChaos, Cli.ExecUnwind, Et.RecordRemoved
#[test]
fn chaos_on_etcd_never_lets_two_trees_act_at_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(cluster) = runtime.block_on(etcd::start("chaos_on_etcd", 1)) else {
        return;
    };
    let dir = temp_dir("vvm-tree-chaos-etcd");
    // Fewer by default: a killed or stopped holder's record leaves etcd only at its expiry
    // (about 2.5 s a round), where SQLite's lock tells at once.
    let (rounds, seed) = chaos_settings(25);
    chaos(
        "etcd",
        &cluster.store_url(),
        &cluster.endpoints(),
        &dir,
        rounds,
        seed,
    );
    drop(cluster);
}

/// Random rounds on `store` (see `Cli.ExecChaos`), an etcd one at `endpoints`.
fn chaos(name: &str, store: &str, endpoints: &[String], dir: &Path, rounds: usize, seed: u64) {
    become_a_careless_reaper();
    eprintln!("chaos on {name}: {rounds} rounds, VVM_CHAOS_SEED={seed}");
    let mut state = seed;
    let log = dir.join("acts");
    let spawn_one = |n: usize, state: &mut u64| {
        let daemon = next(state).is_multiple_of(2);
        let ignore_term = next(state).is_multiple_of(3);
        // Every way of containing the tree: a PID namespace and a cgroup where they can be
        // made, the namespace without a cgroup, a cgroup without a namespace.
        let containment = match next(state) % 3 {
            0 => "auto",
            1 => "subreaper",
            _ => "cgroup",
        };
        let child = spawn_with(
            store,
            dir,
            &format!("n{n:04}"),
            "500ms",
            &chaos_script(daemon, ignore_term),
            &["--containment", containment],
        );
        (child, (daemon, containment))
    };
    let (mut leader, (mut daemon, mut containment)) = spawn_one(0, &mut state);
    // The first leads before the second starts: the rounds know who leads.
    wait_until(&log, "the first tree acts", |seen| seen.len() == 1);
    let (mut candidate, mut candidate_kind) = spawn_one(1, &mut state);
    let mut counts = [0_usize; FAULTS.len()];
    let started = Instant::now();
    for round in 0..rounds {
        // The leader's whole tree is acting before it is hit.
        let kinds = if daemon { 2 } else { 1 };
        wait_until(&log, "the leader's tree acts", |seen| {
            seen.len() == round + 1 && seen.values().last().is_some_and(|t| t.kinds.len() == kinds)
        });
        std::thread::sleep(Duration::from_millis(next(&mut state) % 150));
        let fault = loop {
            let fault = FAULTS[(next(&mut state) % FAULTS.len() as u64) as usize];
            if applies(fault, name, containment) {
                break fault;
            }
        };
        counts[fault as usize] += 1;
        eprintln!("chaos on {name}: round {round}: {fault:?}");
        hit(fault, &leader, dir, endpoints);
        wait_until(&log, "the successor acts", |seen| seen.len() == round + 2);
        if matches!(fault, Fault::StopVvm | Fault::StopBoth) {
            signal(&leader, Signal::CONT);
        }
        let code = exit_within(&mut leader, WAIT_MAX);
        assert!(
            code.is_some(),
            "round {round}: {fault:?}: the old leader did not exit"
        );
        let seen = tenures(&log);
        assert_no_overlap(&seen, dir);
        if matches!(fault, Fault::PanicVvm) {
            // The round hit what it meant to: the task unwound and its guard ended the tree —
            // or, on a loaded machine, the kill deadline passed first and the killer did.
            let stderr = std::fs::read_to_string(dir.join(format!("n{round:04}.stderr")))
                .unwrap_or_default();
            assert!(
                stderr.contains("injected fault")
                    && (stderr.contains("ended without stopping it")
                        || stderr.contains("kill deadline passed")),
                "round {round}: no unwinding panic in the log:\n{stderr}"
            );
        }
        leader = candidate;
        (daemon, containment) = candidate_kind;
        (candidate, candidate_kind) = spawn_one(round + 2, &mut state);
    }
    // Long enough for a survivor of the last hit tree to show.
    std::thread::sleep(Duration::from_millis(500));
    let seen = tenures(&log);
    assert_eq!(seen.len(), rounds + 1, "{seen:?}");
    assert_no_overlap(&seen, dir);
    let counted: Vec<String> = FAULTS
        .iter()
        .zip(counts)
        .filter(|(fault, _)| applies(**fault, name, "auto"))
        .map(|(fault, count)| format!("{fault:?} {count}"))
        .collect();
    eprintln!(
        "chaos on {name}: {rounds} rounds in {:?} ({}): no overlap",
        started.elapsed(),
        counted.join(", ")
    );
    for mut child in [leader, candidate] {
        signal(&child, Signal::KILL);
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether this machine lets `vvm` make a cgroup for a tree; under `CI=true` it must.
fn cgroups_available(test: &str) -> bool {
    let probe = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args([
            "run",
            "--store",
            "memory:",
            "--containment",
            "strict",
            "--acquire",
            "1s",
        ])
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if probe.status.code() == Some(0) {
        return true;
    }
    let why = String::from_utf8_lossy(&probe.stderr);
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: no cgroup can be made here under CI: {why}"
    );
    eprintln!("{test}: skipped, no cgroup can be made here: {why}");
    false
}

// covers: Cli.ExecCgroup
#[test]
fn the_tree_is_born_in_a_cgroup_of_its_own_that_goes_with_it() {
    let test = "the_tree_is_born_in_a_cgroup_of_its_own_that_goes_with_it";
    if !cgroups_available(test) {
        return;
    }
    become_a_careless_reaper();
    let dir = temp_dir("vvm-tree-cgroup");
    let log = dir.join("acts");
    let mut one = spawn_with(
        &store_of(&dir),
        &dir,
        "one",
        "1s",
        SCRIPT,
        &["--containment", "strict"],
    );
    wait_until(&log, "the tree acts", both_act);
    let supervisor = supervisor_of(&one).as_raw_pid() as u32;
    let outside = cgroup_of(supervisor).unwrap();
    // The command and the daemon it started (new session, double fork): all in the tree's
    // cgroup; the supervisor is not.
    let tree = descendants(supervisor);
    assert!(tree.len() >= 2, "{tree:?}");
    let started = std::fs::read_to_string(format!("/proc/{supervisor}/stat"))
        .unwrap()
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_owned();
    let inside = format!(
        "{}/vvm-tree-{supervisor}-{started}",
        outside.trim_end_matches('/')
    );
    for pid in &tree {
        if let Some(cgroup) = cgroup_of(*pid) {
            assert_eq!(cgroup, inside, "process {pid} of the tree");
        }
    }
    let stderr = std::fs::read_to_string(dir.join("one.stderr")).unwrap();
    assert!(stderr.contains("cgroup\""), "{stderr}");
    signal(&one, Signal::TERM);
    let _ = exit_within(&mut one, WAIT_MAX).expect("vvm exits");
    let mount = cgroup2_mount();
    let path = format!("{mount}{inside}");
    assert!(!Path::new(&path).exists(), "{path} was left behind");
    let before = tenures(&log);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        tenures(&log).values().map(|t| t.last_ns).max(),
        before.values().map(|t| t.last_ns).max(),
        "the tree acts on"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Cli.ExecCgroup
#[test]
fn strict_containment_is_refused_before_campaigning_where_no_cgroup_can_be_made() {
    let dir = temp_dir("vvm-tree-strict");
    // An unprivileged user, which may not make a cgroup under this test's.
    let output = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_vvm"))
        .args([
            "run",
            "--store",
            &store_of(&dir),
            "--containment",
            "strict",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("setpriv:") {
        // Not root: setpriv cannot change the user; this process may not make cgroups either.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "setpriv failed under CI: {stderr}"
        );
        eprintln!("skipped: setpriv needs root: {stderr}");
        return;
    }
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--containment strict: cannot make a cgroup"),
        "{stderr}"
    );
    assert!(!dir.join("vvm.sqlite").exists(), "the store was opened");
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Cli.ExecCgroup
#[test]
fn a_tree_whose_vvm_and_supervisor_were_killed_together_is_ended_before_the_successor_acts() {
    let test =
        "a_tree_whose_vvm_and_supervisor_were_killed_together_is_ended_before_the_successor_acts";
    if !cgroups_available(test) {
        return;
    }
    become_a_careless_reaper();
    let dir = temp_dir("vvm-tree-orphan");
    let log = dir.join("acts");
    let extra = ["--containment", "cgroup"];
    let mut one = spawn_with(&store_of(&dir), &dir, "one", "1s", SCRIPT, &extra);
    wait_until(&log, "the first tree acts", both_act);
    let two = spawn(&dir, "two", "1s", SCRIPT);
    std::thread::sleep(Duration::from_millis(500));
    // As an OOM kill of both: neither can end the tree, which runs on in its cgroup (no PID
    // namespace, whose end would be the tree's).
    let supervisor = supervisor_of(&one);
    rustix::process::kill_process(supervisor, Signal::KILL).unwrap();
    signal(&one, Signal::KILL);
    let _ = one.wait();
    let seen = wait_until(&log, "a second tenure acts", |seen| {
        seen.len() >= 2 && seen.values().nth(1).is_some_and(|t| t.kinds.len() == 2)
    });
    assert_eq!(seen.len(), 2, "{seen:?}");
    std::thread::sleep(LEASE);
    assert_no_overlap(&tenures(&log), &dir);
    let stderr = std::fs::read_to_string(dir.join("two.stderr")).unwrap();
    assert!(
        stderr.contains("whose vvm and supervisor were gone"),
        "{stderr}"
    );
    let mut two = two;
    signal(&two, Signal::KILL);
    let _ = two.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cgroup2 mount point, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> String {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            after
                .starts_with("cgroup2 ")
                .then(|| before.split_whitespace().nth(4).map(str::to_owned))?
        })
        .unwrap()
}

// covers: Cli.ExecCgroup
#[test]
fn a_tree_whose_supervisors_pid_was_reused_is_still_ended_before_the_successor_acts() {
    let test = "a_tree_whose_supervisors_pid_was_reused_is_still_ended_before_the_successor_acts";
    if !cgroups_available(test) {
        return;
    }
    become_a_careless_reaper();
    let dir = temp_dir("vvm-tree-reused");
    let other = temp_dir("vvm-tree-reused-other");
    // A live supervisor, whose pid a dead one's orphaned tree names (the pid was reused).
    let mut keeper = spawn(&other, "keeper", "1s", SCRIPT);
    wait_until(&other.join("acts"), "the keeper acts", both_act);
    let live = supervisor_of(&keeper).as_raw_pid();
    let origin = format!(
        "{}{}",
        cgroup2_mount(),
        cgroup_of(std::process::id()).unwrap().trim_end_matches('/')
    );
    let orphan_dir = format!("{origin}/vvm-tree-{live}-1");
    std::fs::create_dir(&orphan_dir).unwrap();
    let orphan_log = dir.join("orphan");
    let mut orphan = Command::new("sh")
        .args([
            "-c",
            &format!(
                "while :; do date +%s%N >> {}; sleep 0.02; done",
                orphan_log.display()
            ),
        ])
        .spawn()
        .unwrap();
    std::fs::write(
        format!("{orphan_dir}/cgroup.procs"),
        orphan.id().to_string(),
    )
    .unwrap();
    let mut two = spawn(&dir, "two", "1s", SCRIPT);
    wait_until(&dir.join("acts"), "the successor acts", both_act);
    std::thread::sleep(Duration::from_millis(300));
    let last_orphan: u128 = std::fs::read_to_string(&orphan_log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0);
    let first_two = tenures(&dir.join("acts"))
        .values()
        .map(|t| t.first_ns)
        .min()
        .unwrap();
    let ended = exit_within_child(&mut orphan, Duration::from_secs(1));
    let _ = orphan.kill();
    let _ = orphan.wait();
    let _ = std::fs::remove_dir(&orphan_dir);
    for child in [&mut keeper, &mut two] {
        signal(child, Signal::KILL);
        let _ = child.wait();
    }
    assert!(ended, "the orphaned tree was not ended\n{}", logs(&dir));
    assert!(
        last_orphan < first_two,
        "the orphaned tree acted after the successor began\n{}",
        logs(&dir)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

/// Whether `child` has ended within `limit`.
fn exit_within_child(child: &mut Child, limit: Duration) -> bool {
    exit_within(child, limit).is_some()
}
