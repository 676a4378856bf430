//! `vvm semaphore …` through the real binary on a SQLite file (and the round trip on a real etcd
//! and a real PostgreSQL server): create, describe, update and delete from a shell, typed
//! refusals with their exit codes, and a watch that prints every change of the data until
//! SIGTERM.

mod cli_support;
use vvm_test_support::etcd as etcd_support;
use vvm_test_support::postgres as postgres_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cli_support::{signal_and_wait, temp_dir};
use rustix::process::Signal;

/// Longest wait for a line that must come (a correctness bound, not a speed bound).
const LINE_WAIT: Duration = Duration::from_secs(20);

/// A child that a failing test does not leave behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vvm(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["semaphore", "--store", store])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

// covers: Cli.Semaphore
#[test]
fn a_semaphore_is_created_described_updated_and_deleted_from_a_shell() {
    let dir = temp_dir("vvm-cli-semaphore");
    round_trip(&format!("sqlite:{}", dir.join("s.sqlite").display()));
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.Semaphore
#[test]
fn a_semaphore_is_created_described_updated_and_deleted_on_etcd() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(cluster) = runtime.block_on(etcd_support::start("cli_semaphore", 1)) else {
        return;
    };
    round_trip(&cluster.store_url());
    drop(cluster);
}

// covers: Cli.Semaphore, Cli.SemaphoreList, Cli.SemaphoreWatch
// covers: Pg.Run
#[test]
fn a_semaphore_is_created_described_updated_watched_listed_and_deleted_on_postgres() {
    let test = "a_semaphore_is_created_described_updated_watched_listed_and_deleted_on_postgres";
    let Some(server) = postgres_support::PgServer::start(test) else {
        return;
    };
    let store = server.url("vvm", "sems");
    round_trip(&store);
    watch_the_data(&store);
    let listed = vvm(&store, &["list"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert_eq!(String::from_utf8_lossy(&listed.stdout), "config\n");
    let deleted = vvm(&store, &["delete", "config"]);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));
    let listed = vvm(&store, &["list"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout), "");
    drop(server);
}

/// Create, describe, update, a refused create, delete and a refused describe on `store`.
fn round_trip(store: &str) {
    let store = store.to_owned();

    let created = vvm(
        &store,
        &["create", "config", "--limit", "3", "--data", "v1"],
    );
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    let described = vvm(&store, &["describe", "config", "--json"]);
    assert_eq!(described.status.code(), Some(0), "{}", stderr(&described));
    let snapshot = json(&described);
    assert_eq!(snapshot["name"], "config");
    assert_eq!(snapshot["data"], "v1");
    assert_eq!(snapshot["limit"], 3);
    assert_eq!(snapshot["count"], 0);
    assert_eq!(snapshot["owners"], serde_json::json!([]));

    let text = vvm(&store, &["describe", "config"]);
    let line = String::from_utf8_lossy(&text.stdout);
    assert!(
        line.starts_with("semaphore config count=0/3 fencing_token=0:0"),
        "{line}"
    );

    let updated = vvm(&store, &["update", "config", "--data", "v2"]);
    assert_eq!(updated.status.code(), Some(0), "{}", stderr(&updated));
    assert_eq!(
        json(&vvm(&store, &["describe", "config", "--json"]))["data"],
        "v2"
    );

    let again = vvm(&store, &["create", "config", "--limit", "1"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );

    let deleted = vvm(&store, &["delete", "config"]);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));
    let gone = vvm(&store, &["describe", "config"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        stderr(&gone).contains("does not exist"),
        "{}",
        stderr(&gone)
    );
}

// covers: Cli.Semaphore
#[test]
fn bad_input_is_refused_before_a_session_is_opened() {
    let dir = temp_dir("vvm-cli-semaphore-bad");
    let path = dir.join("never.sqlite");
    let store = format!("sqlite:{}", path.display());
    let big = "x".repeat(16 * 1024 + 1);
    for (args, says) in [
        (vec!["create", "", "--limit", "1"], "name is empty"),
        (vec!["create", "a\nb", "--limit", "1"], "control"),
        (vec!["create", "a", "--limit", "0"], "at least 1"),
        (vec!["update", "a", "--data", big.as_str()], "at most 16384"),
    ] {
        let output = vvm(&store, &args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    assert!(!path.exists(), "a refused command opened the store");
    let _ = std::fs::remove_dir_all(dir);
}

// covers: Cli.SemaphoreWatch
#[test]
fn a_watch_prints_every_change_of_the_data_until_sigterm() {
    let dir = temp_dir("vvm-cli-semaphore-watch");
    watch_the_data(&format!("sqlite:{}", dir.join("s.sqlite").display()));
    let _ = std::fs::remove_dir_all(dir);
}

/// Creates semaphore `config` (data v1) on `store`; a `describe --watch --json` prints it, then
/// each of two updates, and ends with exit 0 at SIGTERM.
fn watch_the_data(store: &str) {
    let created = vvm(store, &["create", "config", "--limit", "1", "--data", "v1"]);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));

    let mut watcher = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args([
                "semaphore",
                "--store",
                store,
                "describe",
                "config",
                "--watch",
                "--json",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the vvm binary runs"),
    );
    let stdout = watcher.0.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> serde_json::Value {
        let line = lines
            .recv_timeout(LINE_WAIT)
            .unwrap_or_else(|e| panic!("no line for {what}: {e}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"))
    };
    assert_eq!(next("the first snapshot")["data"], "v1");
    for data in ["v2", "v3"] {
        let updated = vvm(store, &["update", "config", "--data", data]);
        assert_eq!(updated.status.code(), Some(0), "{}", stderr(&updated));
        assert_eq!(next("the update")["data"], data);
    }
    assert_eq!(
        signal_and_wait(&mut watcher.0, Signal::TERM, LINE_WAIT),
        Some(0),
        "the watch ends cleanly at SIGTERM"
    );
}

// covers: Cli.SemaphoreList
#[test]
fn the_semaphores_of_a_store_are_listed_from_a_shell() {
    let dir = temp_dir("vvm-cli-semaphore-list");
    let store = format!("sqlite:{}", dir.join("s.sqlite").display());
    let stdout = |output: &Output| String::from_utf8_lossy(&output.stdout).into_owned();

    let empty = vvm(&store, &["list"]);
    assert_eq!(empty.status.code(), Some(0), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "");
    for name in ["web", "batch", "cron jobs", "old"] {
        let created = vvm(&store, &["create", name, "--limit", "2"]);
        assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    }
    let deleted = vvm(&store, &["delete", "old"]);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));

    let listed = vvm(&store, &["list"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert_eq!(stdout(&listed), "batch\ncron jobs\nweb\n");
    let listed = vvm(&store, &["list", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let objects: Vec<serde_json::Value> = stdout(&listed)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    assert_eq!(
        objects,
        ["batch", "cron jobs", "web"].map(|name| serde_json::json!({ "name": name }))
    );
    let _ = std::fs::remove_dir_all(dir);
}
