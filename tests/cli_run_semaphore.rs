//! `vvm run --semaphore NAME -- CMD` through the real binary, on SQLite, on a real etcd and on a
//! real PostgreSQL server: three commands for a semaphore of limit 2. What a user sees is
//! judged — the lines the commands themselves append when they start and when they stop: at no
//! instant do more than two run,
//! the third starts only after one of the first two stopped, and every `vvm` exits 0 after
//! SIGTERM. Then the typed refusals: an unknown semaphore, a count above the limit.

mod cli_support;
use vvm_test_support::etcd as etcd_support;
use vvm_test_support::postgres as postgres_support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cli_support::{exit_within, signal_and_wait, temp_dir};
use rustix::process::Signal;

/// Longest wait for something that must happen (a correctness bound, not a speed bound).
const WAIT: Duration = Duration::from_secs(20);
/// How long the third command must stay queued while both units are taken.
const QUEUED_FOR: Duration = Duration::from_millis(500);

/// A child that a failing test does not leave behind.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn semaphore(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["semaphore", "--store", store])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

/// `vvm run --semaphore work` of a command that appends `start N <ns>` and, on SIGTERM,
/// `stop N <ns>` to `log` (wall-clock nanoseconds: one host, one clock for all three). The tree
/// may get SIGTERM more than once (the group, then each process of its cgroup): the handler
/// ignores it from its start, so that the stop line is written once and its `date` not ended.
fn runner(store: &str, log: &Path, n: u32) -> KillOnDrop {
    // A lease long enough that a loaded machine's slow store calls do not end the session.
    runner_with_lease(store, log, n, "10s")
}

/// [`runner`] with the lease `lease`.
fn runner_with_lease(store: &str, log: &Path, n: u32, lease: &str) -> KillOnDrop {
    let errors = std::fs::File::create(log.with_extension(format!("vvm{n}"))).expect("a log file");
    let log = log.display();
    let script = format!(
        "echo start {n} $(date +%s%N) >> {log}; \
         trap 'trap \"\" TERM; echo stop {n} $(date +%s%N) >> {log}; exit 0' TERM; \
         sleep 60 & wait"
    );
    let child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", store, "--lease", lease, "--grace", "5s"])
        .args(["--semaphore", "work", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(errors)
        .spawn()
        .expect("the vvm binary runs");
    KillOnDrop(child)
}

/// The commands' lines: (ns, started?, command).
fn lines(log: &Path) -> Vec<(u128, bool, u32)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let kind = words.next()?;
            let n = words.next()?.parse().ok()?;
            let ns = words.next()?.parse().ok()?;
            Some((ns, kind == "start", n))
        })
        .collect()
}

fn starts(log: &Path) -> usize {
    lines(log).iter().filter(|(_, start, _)| *start).count()
}

/// Waits until `done`; on a timeout, fails with what every `vvm` of `dir` logged.
fn wait_until(dir: &Path, what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + WAIT;
    while !done() {
        if Instant::now() >= give_up {
            let logs: String = (1..=3)
                .map(|n| {
                    let path = dir.join(format!("commands.vvm{n}"));
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    format!("--- vvm {n}:\n{text}")
                })
                .collect();
            panic!("timed out waiting until {what}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn waiters(store: &str) -> usize {
    let described = semaphore(store, &["describe", "work", "--json"]);
    let text = String::from_utf8_lossy(&described.stdout);
    serde_json::from_str::<serde_json::Value>(text.trim())
        .ok()
        .and_then(|v| v["waiters"].as_array().map(Vec::len))
        .unwrap_or(0)
}

fn at_most_two_commands_run(store: &str, dir: &Path) {
    let log = dir.join("commands.log");
    let created = semaphore(store, &["create", "work", "--limit", "2"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let mut first = runner(store, &log, 1);
    wait_until(dir, "the first command started", || starts(&log) == 1);
    let mut second = runner(store, &log, 2);
    wait_until(dir, "the second command started", || starts(&log) == 2);
    let mut third = runner(store, &log, 3);
    wait_until(dir, "the third run queued", || waiters(store) == 1);
    std::thread::sleep(QUEUED_FOR);
    assert_eq!(
        starts(&log),
        2,
        "a third command ran beside two: {:?}",
        lines(&log)
    );

    let code = signal_and_wait(&mut first.0, Signal::TERM, WAIT);
    assert_eq!(code, Some(0), "the first vvm exits 0 after SIGTERM");
    wait_until(dir, "the third command started", || starts(&log) == 3);
    for runner in [&mut second, &mut third] {
        assert_eq!(signal_and_wait(&mut runner.0, Signal::TERM, WAIT), Some(0));
    }

    // The oracle: the commands' own lines, in time order.
    let mut events = lines(&log);
    events.sort();
    assert_eq!(events.len(), 6, "three starts and three stops: {events:?}");
    let mut running = 0;
    for (_, start, _) in &events {
        running = if *start { running + 1 } else { running - 1 };
        assert!(running <= 2, "three commands ran at once: {events:?}");
    }
    let at = |kind: bool, n: u32| events.iter().find(|e| e.1 == kind && e.2 == n).map(|e| e.0);
    assert!(
        at(false, 1) < at(true, 3),
        "the third started before the first stopped"
    );
    let described = semaphore(store, &["describe", "work", "--json"]);
    let text = String::from_utf8_lossy(&described.stdout);
    let snapshot: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(
        snapshot["owners"].as_array().map(Vec::len),
        Some(0),
        "{snapshot}"
    );
    assert_eq!(
        snapshot["waiters"].as_array().map(Vec::len),
        Some(0),
        "{snapshot}"
    );
}

/// Bad input gets a clear refusal before any command starts.
fn refusals(store: &str, dir: &Path) {
    let marker = dir.join("ran");
    let script = format!("touch {}", marker.display());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["run", "--store", store, "--acquire", "5s"])
            .args(args)
            .args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .expect("the vvm binary runs")
    };
    let unknown = run(&["--semaphore", "nowhere"]);
    assert_eq!(unknown.status.code(), Some(1));
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("semaphore nowhere does not exist"), "{said}");
    let too_many = run(&["--semaphore", "work", "--count", "3"]);
    assert_eq!(too_many.status.code(), Some(1));
    let said = String::from_utf8_lossy(&too_many.stderr);
    assert!(said.contains("cannot acquire semaphore work"), "{said}");
    assert!(!marker.exists(), "no command ran");
}

/// `vvm semaphore set-limit` under a running holder of limit 1 and a queued run: raised to 2,
/// the queued command starts at once, beside the first; lowered to 1 while both run, it is
/// refused with the units in use named, exit 1, and the limit stays 2.
// covers: Cli.SemaphoreSetLimit, Sem.SetLimit
#[test]
fn a_raised_limit_starts_a_queued_command_and_a_limit_below_use_is_refused_on_sqlite() {
    let dir = temp_dir("vvm-set-limit");
    let store = format!("sqlite:{}", dir.join("s.sqlite").display());
    let log = dir.join("commands.log");
    let created = semaphore(&store, &["create", "work", "--limit", "1"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let mut first = runner(&store, &log, 1);
    wait_until(&dir, "the first command started", || starts(&log) == 1);
    let mut second = runner(&store, &log, 2);
    wait_until(&dir, "the second run queued", || waiters(&store) == 1);
    assert_eq!(starts(&log), 1, "a second command ran under limit 1");

    let raised = semaphore(&store, &["set-limit", "work", "2"]);
    let said = String::from_utf8_lossy(&raised.stderr);
    assert_eq!(raised.status.code(), Some(0), "{said}");
    assert!(said.contains("the limit changed"), "{said}");
    assert!(
        said.contains("previous=1") && said.contains("granted=1"),
        "{said}"
    );
    wait_until(&dir, "the second command started", || starts(&log) == 2);

    let lowered = semaphore(&store, &["set-limit", "work", "1"]);
    let said = String::from_utf8_lossy(&lowered.stderr);
    assert_eq!(lowered.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot set the limit to 1: 2 units are in use now"),
        "{said}"
    );
    let described = semaphore(&store, &["describe", "work", "--json"]);
    let text = String::from_utf8_lossy(&described.stdout);
    let snapshot: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(
        (&snapshot["limit"], &snapshot["count"]),
        (&2.into(), &2.into())
    );

    let zero = semaphore(&store, &["set-limit", "work", "0"]);
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");
    for runner in [&mut first, &mut second] {
        assert_eq!(signal_and_wait(&mut runner.0, Signal::TERM, WAIT), Some(0));
    }
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.RunSemaphore
#[test]
fn at_most_the_limit_of_commands_run_under_a_semaphore_on_sqlite() {
    let dir = temp_dir("vvm-run-semaphore");
    let store = format!("sqlite:{}", dir.join("s.sqlite").display());
    at_most_two_commands_run(&store, &dir);
    refusals(&store, &dir);
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.RunSemaphore
#[test]
fn at_most_the_limit_of_commands_run_under_a_semaphore_on_etcd() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(cluster) = runtime.block_on(etcd_support::start("cli_run_semaphore", 1)) else {
        return;
    };
    let dir = temp_dir("vvm-run-semaphore-etcd");
    at_most_two_commands_run(&cluster.store_url(), &dir);
    refusals(&cluster.store_url(), &dir);
    let _ = std::fs::remove_dir_all(dir);
    drop(cluster);
}

// covers: Cli.RunSemaphore
// covers: Pg.Run
#[test]
fn at_most_the_limit_of_commands_run_under_a_semaphore_on_postgres() {
    let test = "at_most_the_limit_of_commands_run_under_a_semaphore_on_postgres";
    let Some(server) = postgres_support::PgServer::start(test) else {
        return;
    };
    let dir = temp_dir("vvm-run-semaphore-postgres");
    let store = server.url("vvm", "runs");
    at_most_two_commands_run(&store, &dir);
    refusals(&store, &dir);
    let _ = std::fs::remove_dir_all(dir);
    drop(server);
}

/// `vvm run --semaphore gate` of a command that ignores SIGTERM and appends `<tag> <ns>` to
/// `log` every 20 ms until it is killed.
fn stubborn(store: &str, log: &Path, tag: &str, grace: &str) -> KillOnDrop {
    let errors = std::fs::File::create(log.with_extension(tag)).expect("a log file");
    let log = log.display();
    let script =
        format!("trap '' TERM; while :; do echo {tag} $(date +%s%N) >> {log}; sleep 0.02; done");
    let child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", store, "--lease", "10s", "--grace", grace])
        .args(["--semaphore", "gate", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(errors)
        .spawn()
        .expect("the vvm binary runs");
    KillOnDrop(child)
}

/// The timestamps of `tag`'s lines in `log`, in order.
fn stamps(log: &Path, tag: &str) -> Vec<u128> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.strip_prefix(tag)?.trim().parse().ok())
        .collect()
}

/// With limit 1, a holder whose command ignores SIGTERM, and a forced delete: the semaphore is
/// being deleted until the old command is gone (its grace passed and it was killed), so a
/// re-creation and a new `vvm run` are refused meanwhile, and the next command's first line
/// comes after the old one's last: never two at once across a delete and re-creation.
// covers: Sem.ForcedDelete
#[test]
fn a_forced_delete_never_lets_a_new_command_run_beside_the_old_one_on_sqlite() {
    let dir = temp_dir("vvm-run-semaphore-delete");
    let store = format!("sqlite:{}", dir.join("s.sqlite").display());
    let store = store.as_str();
    let log = dir.join("commands.log");
    let created = semaphore(store, &["create", "gate", "--limit", "1"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let mut old = stubborn(store, &log, "old", "3s");
    wait_until(&dir, "the old command wrote", || {
        !stamps(&log, "old").is_empty()
    });

    let deleted = semaphore(store, &["delete", "gate", "--force"]);
    assert_eq!(deleted.status.code(), Some(0), "{deleted:?}");
    let refused = semaphore(store, &["create", "gate", "--limit", "1"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "created again: {said}");
    assert!(
        said.contains("being deleted: 1 former owners still hold units"),
        "{said}"
    );
    let described = semaphore(store, &["describe", "gate"]);
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(text.contains(" being-deleted "), "{text}");
    let described = semaphore(store, &["describe", "gate", "--json"]);
    let snapshot: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&described.stdout).trim()).expect("JSON");
    assert_eq!(snapshot["deleting"], true, "{snapshot}");
    assert_eq!(snapshot["count"], 1, "{snapshot}");
    let mut early = stubborn(store, &log, "early", "1s");
    let code = exit_within(&mut early.0, WAIT);
    assert_eq!(
        code,
        Some(Some(1)),
        "a run while the old command still runs"
    );
    let said = std::fs::read_to_string(log.with_extension("early")).unwrap_or_default();
    assert!(said.contains("being deleted"), "{said}");

    // The name is free once the old command was killed after its grace and its units left.
    let give_up = Instant::now() + WAIT;
    loop {
        let created = semaphore(store, &["create", "gate", "--limit", "1"]);
        if created.status.code() == Some(0) {
            break;
        }
        let said = String::from_utf8_lossy(&created.stderr);
        assert!(said.contains("being deleted"), "{said}");
        assert!(Instant::now() < give_up, "never free: {said}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut new = stubborn(store, &log, "new", "1s");
    wait_until(&dir, "the new command wrote", || {
        !stamps(&log, "new").is_empty()
    });
    assert!(
        exit_within(&mut old.0, WAIT).is_some(),
        "the old vvm exited"
    );
    let said = std::fs::read_to_string(log.with_extension("old")).unwrap_or_default();
    assert!(
        said.contains("the grant ended: stopping the services"),
        "the old holder did not see its grant end: {said}"
    );
    let last_old = stamps(&log, "old").last().copied().expect("old lines");
    let first_new = stamps(&log, "new")[0];
    assert!(
        first_new > last_old,
        "the new command ran beside the old one: {} old lines after its first",
        stamps(&log, "old")
            .iter()
            .filter(|&&ns| ns >= first_new)
            .count()
    );
    assert!(
        stamps(&log, "early").is_empty(),
        "the refused run ran nothing"
    );
    // The new command ignores SIGTERM too: its vvm kills it after its grace of 1 s.
    assert!(signal_and_wait(&mut new.0, Signal::TERM, WAIT).is_some());
    let _ = std::fs::remove_dir_all(dir);
}

/// The wall-clock nanoseconds now, as the commands' `date +%s%N` writes them.
fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// SIGKILL of the holder of a semaphore of limit 1 — its `vvm` process alone, then a whole
/// tree (`vvm`, its supervisor and the command) — lets the queued run's command start within a
/// small part of the lease (L = 4 s; the bound, L/4, is for a loaded machine: it takes
/// milliseconds), not at the session's expiry (0.75–1·L): the kernel frees the session's lock
/// once the last process holding it is gone (the supervisor, which inherited it, after it ended
/// the command's tree), and the waiter, blocked on that lock, ends the dead session.
// covers: Sq.SessionLock, Cli.RunSemaphore
#[test]
fn a_killed_semaphore_holder_lets_the_queued_command_start_at_once_on_sqlite() {
    const LEASE: &str = "4s";
    const BOUND: Duration = Duration::from_secs(1);
    let dir = temp_dir("vvm-semaphore-kill");
    let store = format!("sqlite:{}", dir.join("s.sqlite").display());
    let log = dir.join("commands.log");
    let created = semaphore(&store, &["create", "work", "--limit", "1"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let start_of = |n: u32| {
        lines(&log)
            .iter()
            .find(|(_, start, m)| *start && *m == n)
            .map(|(ns, _, _)| *ns)
    };
    let mut first = runner_with_lease(&store, &log, 1, LEASE);
    wait_until(&dir, "the first command started", || starts(&log) == 1);
    let mut second = runner_with_lease(&store, &log, 2, LEASE);
    wait_until(&dir, "the second run queued", || waiters(&store) == 1);

    // The first `vvm` alone: its supervisor ends the command's tree, then lets go of the lock.
    let killed_ns = wall_ns();
    first.0.kill().expect("SIGKILL");
    let _ = first.0.wait();
    wait_until(&dir, "the second command started", || starts(&log) == 2);
    let waited = Duration::from_nanos((start_of(2).unwrap() - killed_ns) as u64);
    eprintln!("SIGKILL of vvm -> the queued command started after {waited:?}");
    assert!(
        waited < BOUND,
        "the queued command started {waited:?} after the SIGKILL of vvm"
    );

    let mut third = runner_with_lease(&store, &log, 3, LEASE);
    wait_until(&dir, "the third run queued", || waiters(&store) == 1);
    // The whole tree of the second at once: `vvm`, its supervisor, the command and its child.
    let mut tree = cli_support::tree::descendants(second.0.id());
    tree.push(second.0.id());
    let killed_ns = wall_ns();
    for pid in tree {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
    let _ = second.0.wait();
    wait_until(&dir, "the third command started", || starts(&log) == 3);
    let waited = Duration::from_nanos((start_of(3).unwrap() - killed_ns) as u64);
    eprintln!("SIGKILL of the whole tree -> the queued command started after {waited:?}");
    assert!(
        waited < BOUND,
        "the queued command started {waited:?} after the SIGKILL of the tree"
    );
    assert_eq!(signal_and_wait(&mut third.0, Signal::TERM, WAIT), Some(0));
    let _ = std::fs::remove_dir_all(dir);
}

/// How soon a holder's command must have ended after its units were removed from outside: a
/// twelfth of the lease (12 s, keepalives `L/4` = 3 s apart), many times the feed's delay plus a
/// read and the command's SIGTERM, even on a loaded machine.
const REMOVED_STOPPED_WITHIN: Duration = Duration::from_secs(1);

/// `vvm run --semaphore gate` (limit 1) of a command that appends `held <ns>` every 20 ms and
/// ends at SIGTERM; right after its first line `remove` takes its units away from outside. The
/// command must have ended within [`REMOVED_STOPPED_WITHIN`], and `vvm` reports the end of its grant.
fn holder_of_units_stops_at_once(store: &str, dir: &Path, remove: impl FnOnce()) {
    let log = dir.join("commands.log");
    let created = semaphore(store, &["create", "gate", "--limit", "1"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let errors = std::fs::File::create(log.with_extension("held")).expect("a log file");
    let script = format!(
        "while :; do echo held $(date +%s%N) >> {}; sleep 0.02; done",
        log.display()
    );
    let mut holder = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["run", "--store", store, "--lease", "12s", "--grace", "5s"])
            .args(["--semaphore", "gate", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errors)
            .spawn()
            .expect("the vvm binary runs"),
    );
    wait_until(dir, "the holder's command wrote", || {
        !stamps(&log, "held").is_empty()
    });
    let removed_ns = wall_ns();
    remove();
    let code = exit_within(&mut holder.0, WAIT);
    let said = std::fs::read_to_string(log.with_extension("held")).unwrap_or_default();
    assert!(matches!(code, Some(Some(c)) if c != 0), "{code:?}: {said}");
    let last = stamps(&log, "held").last().copied().expect("lines");
    let acted_after_ms = last.saturating_sub(removed_ns) / 1_000_000;
    println!("the holder's command acted {acted_after_ms} ms after its units were removed");
    assert!(
        acted_after_ms < REMOVED_STOPPED_WITHIN.as_millis(),
        "the holder's command acted {:.3} s after its units were removed: {said}",
        acted_after_ms as f64 / 1000.0
    );
    assert!(
        said.contains("the grant ended: stopping the services"),
        "{said}"
    );
}

// covers: Cli.RunSemaphoreRemoved
#[test]
fn a_holder_of_units_whose_semaphore_is_deleted_from_outside_stops_at_once_on_sqlite() {
    let dir = temp_dir("vvm-run-semaphore-removed");
    let file = dir.join("s.sqlite");
    let store = format!("sqlite:{}", file.display());
    holder_of_units_stops_at_once(&store, &dir, || {
        let database = rusqlite::Connection::open(&file).unwrap();
        database.busy_timeout(Duration::from_secs(5)).unwrap();
        database
            .execute_batch("DELETE FROM vvm_semaphores WHERE name = 'gate'")
            .unwrap();
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// The holder's session row deleted alone (`DELETE FROM vvm_sessions`): nothing of the
/// semaphore's row changes, yet the store's feed wakes the grant's watch and the grant ends at
/// once, not at the session's next keepalive.
// covers: Sq.SemaphoreUnreleased, Sem.Store.Unreleased, Cli.RunSemaphoreRemoved
#[test]
fn a_holder_of_units_whose_session_row_is_deleted_from_outside_stops_at_once_on_sqlite() {
    let dir = temp_dir("vvm-run-semaphore-session-removed");
    let file = dir.join("s.sqlite");
    let store = format!("sqlite:{}", file.display());
    holder_of_units_stops_at_once(&store, &dir, || {
        let database = rusqlite::Connection::open(&file).unwrap();
        database.busy_timeout(Duration::from_secs(5)).unwrap();
        let deleted = database.execute("DELETE FROM vvm_sessions", []).unwrap();
        assert_eq!(deleted, 1, "the holder's session row");
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// [`holder_of_units_stops_at_once`] on a real etcd, everything under the prefix removed as
/// `how` says.
fn etcd_holder_of_units_stops_at_once(test: &str, how: cli_support::tree::Removal) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(cluster) = runtime.block_on(etcd_support::start(test, 1)) else {
        return;
    };
    let dir = temp_dir("vvm-run-semaphore-removed-etcd");
    holder_of_units_stops_at_once(&cluster.store_url(), &dir, || {
        let removed = cli_support::tree::remove_etcd_prefix(&cluster.endpoints(), how);
        assert!(removed > 0, "nothing to remove");
    });
    let _ = std::fs::remove_dir_all(dir);
    drop(cluster);
}

// covers: Cli.RunSemaphoreRemoved
#[test]
fn a_holder_of_units_whose_session_lease_is_revoked_from_outside_stops_at_once_on_etcd() {
    etcd_holder_of_units_stops_at_once(
        "a_holder_of_units_whose_session_lease_is_revoked_from_outside_stops_at_once_on_etcd",
        cli_support::tree::Removal::Revoke,
    );
}

// covers: Cli.RunSemaphoreRemoved
#[test]
fn a_holder_of_units_whose_keys_are_deleted_from_outside_stops_at_once_on_etcd() {
    etcd_holder_of_units_stops_at_once(
        "a_holder_of_units_whose_keys_are_deleted_from_outside_stops_at_once_on_etcd",
        cli_support::tree::Removal::Delete,
    );
}

/// The lease of the runs of [`successor_of_removed_units_waits`]: their sessions' TTL too.
const SUCCESSOR_LEASE: Duration = Duration::from_secs(4);

/// A semaphore of limit 1, its holder and a queued successor (`vvm run --semaphore work`, lease
/// [`SUCCESSOR_LEASE`]); `remove` takes the holder's units away from outside without a release.
/// The holder did not release them and may act until its session would have run out — its last
/// keepalive came at most `L/4` before the removal — so the successor's command must not start
/// before `3L/4` after the removal (the safety bound; it waits a whole TTL from its first sight).
/// Then a unit released by its holder (SIGTERM of the successor's `vvm`) still passes to the
/// next run at once: within `L/4`, on a loaded machine.
fn successor_of_removed_units_waits(store: &str, dir: &Path, remove: impl FnOnce()) {
    let lease = format!("{}s", SUCCESSOR_LEASE.as_secs());
    let log = dir.join("commands.log");
    let created = semaphore(store, &["create", "work", "--limit", "1"]);
    assert_eq!(created.status.code(), Some(0), "{created:?}");
    let start_of = |n: u32| {
        lines(&log)
            .iter()
            .find(|(_, start, m)| *start && *m == n)
            .map(|(ns, _, _)| *ns)
    };
    let mut holder = runner_with_lease(store, &log, 1, &lease);
    wait_until(dir, "the holder's command started", || starts(&log) == 1);
    let mut successor = runner_with_lease(store, &log, 2, &lease);
    wait_until(dir, "the successor queued", || waiters(store) == 1);

    let removed_ns = wall_ns();
    remove();
    wait_until(dir, "the successor's command started", || starts(&log) == 2);
    let waited = Duration::from_nanos((start_of(2).unwrap() - removed_ns) as u64);
    println!("the successor's command started {waited:?} after the holder's units were removed");
    let safe = SUCCESSOR_LEASE * 3 / 4;
    assert!(
        waited >= safe,
        "the successor's command started {waited:?} after the holder's units were removed, \
         before the holder's session could have run out ({safe:?})"
    );
    let _ = exit_within(&mut holder.0, WAIT);

    let mut next = runner_with_lease(store, &log, 3, &lease);
    wait_until(dir, "the next run queued", || waiters(store) == 1);
    let released_ns = wall_ns();
    assert_eq!(
        signal_and_wait(&mut successor.0, Signal::TERM, WAIT),
        Some(0)
    );
    wait_until(dir, "the next command started", || starts(&log) == 3);
    let passed = Duration::from_nanos((start_of(3).unwrap() - released_ns) as u64);
    println!("a released unit passed on after {passed:?}");
    assert!(
        passed < SUCCESSOR_LEASE / 4,
        "a released unit passed on {passed:?} after its release"
    );
    assert_eq!(signal_and_wait(&mut next.0, Signal::TERM, WAIT), Some(0));
}

/// The holder's session row deleted by hand (`DELETE FROM vvm_sessions`, the first session
/// made): its units pass no sooner than its session would have run out.
// covers: Sq.SemaphoreUnreleased, Sem.Store.Unreleased, Cli.RunSemaphoreRemoved
#[test]
fn the_successor_of_units_whose_session_row_is_deleted_from_outside_waits_on_sqlite() {
    let dir = temp_dir("vvm-run-semaphore-successor");
    let file = dir.join("s.sqlite");
    let store = format!("sqlite:{}", file.display());
    successor_of_removed_units_waits(&store, &dir, || {
        let database = rusqlite::Connection::open(&file).unwrap();
        database.busy_timeout(Duration::from_secs(5)).unwrap();
        let deleted = database
            .execute(
                "DELETE FROM vvm_sessions WHERE revision = (SELECT min(revision) FROM vvm_sessions)",
                [],
            )
            .unwrap();
        assert_eq!(deleted, 1, "the holder's session row");
    });
    let _ = std::fs::remove_dir_all(dir);
}

/// Takes the units of the first party of semaphore `work` (the holder: its key was created
/// first) away on the etcd at `endpoints`, under `vvm run`'s default prefix, as `how` says:
/// `etcdctl del` of its party key (its session's lease lives on), or `etcdctl lease revoke` of
/// its session's lease (the session's every key goes, the party key among them).
fn remove_first_party(endpoints: &[String], how: cli_support::tree::Removal) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut raw = etcd_client::Client::connect(endpoints, None).await.unwrap();
        let parties = "vvm/slot/\0semaphore/work\0";
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        let found = raw.get(parties, Some(options)).await.unwrap();
        let first = found
            .kvs()
            .iter()
            .min_by_key(|kv| kv.create_revision())
            .expect("the holder's party key");
        match how {
            cli_support::tree::Removal::Delete => {
                let deleted = raw.delete(first.key(), None).await.unwrap();
                assert_eq!(deleted.deleted(), 1);
            }
            cli_support::tree::Removal::Revoke => {
                raw.lease_revoke(first.lease()).await.unwrap();
            }
        }
    });
}

/// [`successor_of_removed_units_waits`] on a real etcd, the holder's units removed as `how` says.
fn etcd_successor_of_removed_units_waits(test: &str, how: cli_support::tree::Removal) {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(cluster) = runtime.block_on(etcd_support::start(test, 1)) else {
        return;
    };
    let dir = temp_dir("vvm-run-semaphore-successor-etcd");
    successor_of_removed_units_waits(&cluster.store_url(), &dir, || {
        remove_first_party(&cluster.endpoints(), how);
    });
    let _ = std::fs::remove_dir_all(dir);
    drop(cluster);
}

// covers: Et.SemaphoreUnreleased, Sem.Store.Unreleased, Cli.RunSemaphoreRemoved
#[test]
fn the_successor_of_units_whose_session_lease_is_revoked_from_outside_waits_on_etcd() {
    etcd_successor_of_removed_units_waits(
        "the_successor_of_units_whose_session_lease_is_revoked_from_outside_waits_on_etcd",
        cli_support::tree::Removal::Revoke,
    );
}

// covers: Et.SemaphoreUnreleased, Sem.Store.Unreleased, Cli.RunSemaphoreRemoved
#[test]
fn the_successor_of_units_whose_party_key_is_deleted_from_outside_waits_on_etcd() {
    etcd_successor_of_removed_units_waits(
        "the_successor_of_units_whose_party_key_is_deleted_from_outside_waits_on_etcd",
        cli_support::tree::Removal::Delete,
    );
}
