//! Death detection by PostgreSQL advisory locks (`death=advisory-lock`, `Pg.Marks`), through the
//! real binary on one real server (`vvm_test_support::postgres`), each case in a schema of its own:
//! `vvm run` trees as in `cli_tree.rs`, whose every process appends `REVISION KIND WALL_NS`
//! lines to one log; the oracle is that the lines of two tenures never interleave.
//!
//! - a SIGKILLed holder is followed well before its TTL (lease 10 s);
//! - a holder whose mark's connection is ended by the server (`pg_terminate_backend`) while it
//!   lives ends its tree — one that ignores SIGTERM — before its successor's begins;
//! - without the option nobody takes a mark, and a SIGKILLed holder is followed only after its
//!   TTL, as before.
//!
//! Without PostgreSQL installed every test prints one line saying it was skipped (under CI it
//! fails instead).

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use cli_support::tree::*;
use cli_support::{exit_within, signal, temp_dir};
use rustix::process::Signal;
use vvm_adapters::postgres::session_lock_key;
use vvm_test_support::postgres::PgServer;

/// The lease of the cases with marks: long, so that a take-over by the TTL cannot pass for one
/// by the mark.
const LONG_LEASE: &str = "10s";

fn url(server: &PgServer, schema: &str, marks: bool) -> String {
    let death = if marks { "&death=advisory-lock" } else { "" };
    format!(
        "postgres://vvm@127.0.0.1:{}/postgres?schema={schema}{death}",
        server.port()
    )
}

fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos())
}

/// `one` leads with a daemonizing command on `store`; `two` waits. Returns the directory, both,
/// and the backends that held advisory locks while `one` alone ran.
fn start_pair(prefix: &str, store: &str, lease_and_more: &[&str]) -> (PathBuf, Child, Child) {
    become_a_careless_reaper();
    let dir = temp_dir(prefix);
    let log = dir.join("acts");
    let extra: Vec<&str> = ["--lease"]
        .into_iter()
        .chain(lease_and_more.iter().copied())
        .collect();
    let one = spawn_with(store, &dir, "one", "1s", SCRIPT, &extra);
    wait_until(&log, "the first tree acts", both_act);
    let two = spawn_with(store, &dir, "two", "1s", SCRIPT, &extra);
    // The candidate has opened the store and is waiting.
    std::thread::sleep(Duration::from_millis(1500));
    (dir, one, two)
}

/// Waits for the second tenure, checks the oracle, and answers how long after `since_ns` (wall
/// clock) its first line came.
fn second_tenure_after(dir: &Path, since_ns: u128) -> Duration {
    let log = dir.join("acts");
    let seen = wait_until(&log, "a second tenure acts", |seen| {
        seen.len() >= 2 && seen.values().nth(1).is_some_and(|t| t.kinds.len() == 2)
    });
    assert_eq!(seen.len(), 2, "{seen:?}");
    let first_ns = seen.values().nth(1).map_or(0, |tenure| tenure.first_ns);
    // Long enough for a survivor of the first tree to show.
    std::thread::sleep(Duration::from_millis(500));
    assert_no_overlap(&tenures(&log), dir);
    Duration::from_nanos(u64::try_from(first_ns.saturating_sub(since_ns)).unwrap_or(u64::MAX))
}

fn stop(dir: &Path, mut two: Child) {
    signal(&two, Signal::TERM);
    assert_eq!(
        exit_within(&mut two, WAIT_MAX),
        Some(Some(0)),
        "{}",
        logs(dir)
    );
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Pg.Marks
// covers: Tx.Marks
#[test]
fn a_killed_holder_is_followed_well_before_its_ttl_with_advisory_lock_marks() {
    let Some(server) = PgServer::shared(
        "a_killed_holder_is_followed_well_before_its_ttl_with_advisory_lock_marks",
    ) else {
        return;
    };
    let store = url(server, "marks_kill", true);
    let (dir, mut one, two) = start_pair("vvm-pg-mark-kill", &store, &[LONG_LEASE]);
    let killed_ns = wall_ns();
    signal(&one, Signal::KILL);
    let _ = one.wait();
    let took = second_tenure_after(&dir, killed_ns);
    eprintln!(
        "with death=advisory-lock the successor acted {:.1} ms after the holder's SIGKILL (lease {LONG_LEASE})",
        took.as_secs_f64() * 1e3
    );
    // The TTL would take about the lease; the mark, the time to end the tree and start another.
    assert!(
        took < Duration::from_secs(5),
        "the successor waited {took:?}, as for the TTL: {}",
        logs(&dir)
    );
    stop(&dir, two);
}

/// The same through `vvm run --semaphore`: the queued run's feed waits on the owner's mark too,
/// so the owner's units return when the server frees it, not at its TTL.
// covers: Pg.Marks
// covers: Tx.Marks
#[test]
fn a_killed_semaphore_owner_is_followed_well_before_its_ttl_with_advisory_lock_marks() {
    let Some(server) = PgServer::shared(
        "a_killed_semaphore_owner_is_followed_well_before_its_ttl_with_advisory_lock_marks",
    ) else {
        return;
    };
    let store = url(server, "marks_semaphore_kill", true);
    let created = std::process::Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args([
            "semaphore",
            "--store",
            &store,
            "create",
            "gate",
            "--limit",
            "1",
        ])
        .output()
        .expect("the vvm binary runs");
    assert!(created.status.success(), "{created:?}");
    let (dir, mut one, two) = start_pair(
        "vvm-pg-mark-semaphore",
        &store,
        &[LONG_LEASE, "--semaphore", "gate"],
    );
    let killed_ns = wall_ns();
    signal(&one, Signal::KILL);
    let _ = one.wait();
    let took = second_tenure_after(&dir, killed_ns);
    eprintln!(
        "with death=advisory-lock the queued run acted {:.1} ms after the owner's SIGKILL (lease {LONG_LEASE})",
        took.as_secs_f64() * 1e3
    );
    assert!(
        took < Duration::from_secs(5),
        "the queued run waited {took:?}, as for the TTL: {}",
        logs(&dir)
    );
    stop(&dir, two);
}

// covers: Pg.Marks
#[test]
fn a_holder_whose_mark_connection_is_ended_stops_before_its_successor_acts() {
    let Some(server) =
        PgServer::shared("a_holder_whose_mark_connection_is_ended_stops_before_its_successor_acts")
    else {
        return;
    };
    let store = url(server, "marks_cut", true);
    become_a_careless_reaper();
    let dir = temp_dir("vvm-pg-mark-cut");
    let log = dir.join("acts");
    let extra = ["--lease", LONG_LEASE];
    // A tree that ignores SIGTERM, with a long grace: a holder that merely stopped its services
    // on learning of the take-over would leave it acting for seconds beside the successor's.
    let stubborn = format!("trap '' TERM\n{SCRIPT}");
    let mut one = spawn_with(&store, &dir, "one", "5s", &stubborn, &extra);
    wait_until(&log, "the first tree acts", both_act);
    // The holder's mark: the advisory lock of the one session of this schema (the cases run
    // in parallel on one server).
    let holders = marks_of(server, "marks_cut");
    assert_eq!(holders.len(), 1, "one mark, the holder's: {holders:?}");
    let two = spawn_with(&store, &dir, "two", "1s", SCRIPT, &extra);
    std::thread::sleep(Duration::from_millis(1500));
    let cut_ns = wall_ns();
    server.admin(&format!("SELECT pg_terminate_backend({})", holders[0]));
    // Its process lives on, but whatever it runs must be gone before anyone else acts.
    let code = exit_within(&mut one, WAIT_MAX);
    let took = second_tenure_after(&dir, cut_ns);
    eprintln!(
        "the holder's mark connection ended: it exited {code:?}, the successor acted {:.1} ms later (lease {LONG_LEASE})",
        took.as_secs_f64() * 1e3
    );
    let stderr = std::fs::read_to_string(dir.join("one.stderr")).unwrap_or_default();
    // Ended by its killer (75) at once, not after its grace. (What it logs races its end: the
    // log is not asked for.)
    assert_eq!(code, Some(Some(75)), "{stderr}");
    stop(&dir, two);
}

// covers: Pg.Marks
#[test]
fn without_the_option_no_mark_is_taken_and_a_killed_holder_is_followed_after_its_ttl() {
    let Some(server) = PgServer::shared(
        "without_the_option_no_mark_is_taken_and_a_killed_holder_is_followed_after_its_ttl",
    ) else {
        return;
    };
    let store = url(server, "marks_off", false);
    let (dir, mut one, two) = start_pair("vvm-pg-mark-off", &store, &["2s"]);
    assert_eq!(
        marks_of(server, "marks_off"),
        Vec::<String>::new(),
        "no mark without death=advisory-lock"
    );
    let killed_ns = wall_ns();
    signal(&one, Signal::KILL);
    let _ = one.wait();
    let took = second_tenure_after(&dir, killed_ns);
    eprintln!(
        "with death=ttl the successor acted {:.1} ms after the holder's SIGKILL (lease 2 s)",
        took.as_secs_f64() * 1e3
    );
    // Judged by observation: a whole TTL from the candidate's sighting of the last renewal,
    // at most a quarter of the lease before the kill.
    assert!(
        took >= Duration::from_secs(1),
        "the successor came after {took:?}, before the TTL: {}",
        logs(&dir)
    );
    stop(&dir, two);
}

/// The backends holding the advisory locks of the sessions whose marks `schema` records (the
/// default prefix `vvm/slot/`), by `pid`.
fn marks_of(server: &PgServer, schema: &str) -> Vec<String> {
    let sessions = server.admin(&format!(
        "SELECT convert_from(substr(key, position('\\x006d61726b2f'::bytea IN key) + 6), 'UTF8') \
         FROM {schema}.vvm_kv WHERE position('\\x006d61726b2f'::bytea IN key) > 0"
    ));
    let mut pids = Vec::new();
    for session in sessions.lines().map(str::trim).filter(|s| !s.is_empty()) {
        let record_key = format!("vvm/slot/session/{session}");
        let key = session_lock_key(schema, record_key.as_bytes());
        let held = server.admin(&format!(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
             AND classid::bigint = ({key}::bigint >> 32) & 4294967295 \
             AND objid::bigint = {key}::bigint & 4294967295"
        ));
        pids.extend(
            held.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .map(str::to_owned),
        );
    }
    pids
}
