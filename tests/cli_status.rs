//! `vvm status` through the real binary: it never creates a store, `--json` is machine-readable,
//! and `--watch` prints one line per change of holder — taken, released — and none for renewals,
//! on a SQLite file shared by real processes, on a real 3-member etcd cluster and on a real
//! PostgreSQL server.

mod cli_support;
use vvm_test_support::etcd as etcd_support;
use vvm_test_support::postgres as postgres_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use cli_support::{exit_within, signal, signal_and_wait, temp_dir};
use rustix::process::Signal;

/// Longest wait for a line that must come (a generous correctness bound, not a speed bound).
const LINE_WAIT: Duration = Duration::from_secs(20);
/// The holder's lease: renewals every second; long enough that a loaded machine does not cost
/// the holder its lease (which the watcher would rightly report) in the middle of a case.
const LEASE: &str = "4s";
const LEASE_MS: u64 = 4000;
/// Renewals of the holder let pass while the watcher must stay quiet (at least one renewal).
const QUIET: Duration = Duration::from_millis(2200);

fn vvm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
}

fn spawn_holder(store: &str, address: &str) -> Child {
    vvm()
        .args([
            "run",
            "--store",
            store,
            "--lease",
            LEASE,
            "--address",
            address,
        ])
        .args(["--round", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the vvm binary runs")
}

/// How long the lingering holder's command takes to stop after SIGTERM.
const STOP_LINGER: Duration = Duration::from_secs(1);

/// A holder whose command takes [`STOP_LINGER`] to stop once asked; its first line is `up`.
fn spawn_lingering_holder(store: &str, address: &str) -> Child {
    vvm()
        .args([
            "run",
            "--store",
            store,
            "--lease",
            LEASE,
            "--address",
            address,
        ])
        .args(["--round", "200ms", "--", "sh", "-c"])
        .arg("trap 'sleep 1; exit 0' TERM; echo up; while :; do sleep 0.05; done")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the vvm binary runs")
}

/// Waits for the lingering holder's command to be up.
fn wait_up(holder: &mut Child) {
    let mut lines = BufReader::new(holder.stdout.take().expect("piped")).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert_eq!(first, "up");
    std::thread::spawn(move || for _ in lines {});
}

/// Waits for the holder's `leading` line.
fn wait_leading(holder: &mut Child) {
    let mut lines = BufReader::new(holder.stdout.take().expect("piped")).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    // Keep draining so that the holder never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
}

/// The lines of a running `vvm status --watch`, arriving on a channel.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn spawn(store: &str, json: bool) -> Watcher {
        let mut command = vvm();
        command.args(["status", "--watch", "--store", store]);
        if json {
            command.arg("--json");
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the vvm binary runs");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    fn line(&self, what: &str) -> String {
        self.lines
            .recv_timeout(LINE_WAIT)
            .unwrap_or_else(|e| panic!("no line for {what} within {LINE_WAIT:?}: {e}"))
    }

    fn json(&self, what: &str) -> serde_json::Value {
        let line = self.line(what);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {line}"))
    }

    fn quiet(&self, what: &str) {
        if let Ok(line) = self.lines.recv_timeout(QUIET) {
            panic!("{what}: unexpected line {line}");
        }
    }

    fn stop(mut self) {
        assert_eq!(
            signal_and_wait(&mut self.child, Signal::TERM, LINE_WAIT),
            Some(0),
            "the watch ends cleanly at SIGTERM"
        );
    }
}

/// A watcher left by a failing test does not outlive it (nor hold the test's output open).
impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A change line's time stamp: RFC 3339, UTC, milliseconds (`2026-11-26T17:17:18.419Z`).
fn assert_time(line: &serde_json::Value) {
    let time = line["time"].as_str().unwrap_or_default();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{line}"
    );
}

/// Watches one slot through a holder's life: free, taken (renewals say nothing), stopping (at
/// once after SIGTERM, while its command still stops), released (only after the command
/// stopped); with `expire`, then taken by a holder that is SIGKILLed, so that its record
/// expires.
fn watch_a_tenure(store: &str, expire: bool) {
    let watcher = Watcher::spawn(store, true);
    let table = watcher.json("the table");
    assert_eq!(
        table,
        serde_json::json!({ "slots": [{ "slot": 1, "holder": null }] })
    );

    let mut holder = spawn_lingering_holder(store, "holder-a");
    wait_up(&mut holder);
    let taken = watcher.json("the slot taken");
    assert_eq!(taken["slot"], 1);
    assert_eq!(taken["holder"]["address"], "holder-a", "{taken}");
    assert_eq!(
        taken["holder"]["incarnation"].as_str().map(str::len),
        Some(16)
    );
    let token: vvm::FencingToken = taken["holder"]["fencing_token"]
        .as_str()
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("no fencing token: {taken}"));
    assert_eq!(token.slot, vvm::Slot(1), "{taken}");
    assert_eq!(taken["event"], "taken", "{taken}");
    assert_time(&taken);
    assert_eq!(taken["holder"]["stopping"], false, "{taken}");
    watcher.quiet("renewals are not changes");

    let asked = std::time::Instant::now();
    signal(&holder, Signal::TERM);
    let stopping = watcher.json("the holder stopping");
    let stopping_after = asked.elapsed();
    assert_eq!(stopping["event"], "stopping", "{stopping}");
    assert_eq!(stopping["holder"]["address"], "holder-a", "{stopping}");
    assert_eq!(stopping["holder"]["stopping"], true, "{stopping}");
    assert!(
        stopping_after < STOP_LINGER,
        "the mark came {stopping_after:?} after SIGTERM, not before the command stopped"
    );
    assert_eq!(exit_within(&mut holder, LINE_WAIT), Some(Some(0)));
    let released = watcher.json("the slot released");
    assert!(
        asked.elapsed() >= STOP_LINGER,
        "released before the command stopped"
    );
    assert_time(&released);
    assert_eq!(released["event"], "released", "{released}");
    assert_eq!(released["holder"], serde_json::Value::Null, "{released}");
    if expire {
        let mut holder = spawn_holder(store, "holder-k");
        wait_leading(&mut holder);
        let taken = watcher.json("the slot taken again");
        assert_eq!(taken["event"], "taken", "{taken}");
        holder.kill().unwrap();
        holder.wait().unwrap();
        let expired = watcher.json("the record expired");
        assert_time(&expired);
        assert_eq!(expired["event"], "expired", "{expired}");
    }
    watcher.stop();
}

// covers: Cli.StatusReadOnly
#[test]
fn status_never_creates_a_store() {
    let dir = temp_dir("vvm-cli-status");
    let path = dir.join("absent.sqlite");
    let output = vvm()
        .args(["status", "--store", &format!("sqlite:{}", path.display())])
        .output()
        .expect("the vvm binary runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("never creates"), "{stderr}");
    assert!(!path.exists(), "status created {}", path.display());
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.StatusJson
#[test]
fn status_json_names_the_holder_of_each_slot() {
    let dir = temp_dir("vvm-cli-status");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut holder = spawn_holder(&store, "holder-json");
    wait_leading(&mut holder);

    let output = vvm()
        .args(["status", "--json", "--slots", "2", "--store", &store])
        .output()
        .expect("the vvm binary runs");
    assert_eq!(output.status.code(), Some(0));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one JSON document: {stdout}");
    let table: serde_json::Value = serde_json::from_str(lines[0]).expect("JSON");
    let slots = table["slots"].as_array().expect("a list of slots");
    assert_eq!(slots.len(), 2);
    assert_eq!(slots[0]["slot"], 1);
    assert_eq!(slots[0]["holder"]["address"], "holder-json");
    let left = slots[0]["holder"]["time_left_ms"]
        .as_u64()
        .expect("time left");
    assert!(left <= LEASE_MS, "{left} ms left of a {LEASE} lease");
    assert_eq!(slots[1], serde_json::json!({ "slot": 2, "holder": null }));

    let text = vvm()
        .args(["status", "--store", &store])
        .output()
        .expect("the vvm binary runs");
    assert!(String::from_utf8_lossy(&text.stdout).contains("holder-json"));

    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, LINE_WAIT),
        Some(0)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.StatusWatch
#[test]
fn status_watch_follows_a_tenure_on_sqlite() {
    let dir = temp_dir("vvm-cli-status");
    let path = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", path.display());
    // The store exists before the watch starts: status never creates one.
    let output = vvm()
        .args(["run", "--store", &store, "--address", "creator"])
        .args(["--lease", LEASE, "--", "true"])
        .output()
        .expect("the vvm binary runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    watch_a_tenure(&store, true);
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.StatusWatch
#[test]
fn status_watch_follows_a_tenure_on_a_3_member_etcd() {
    let test = "status_watch_follows_a_tenure_on_a_3_member_etcd";
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let Some(cluster) = runtime.block_on(etcd_support::three_steady(test)) else {
        return;
    };
    watch_a_tenure(&cluster.store_url(), false);
    drop(cluster);
}

// covers: Cli.StatusWatch, Cli.StatusReadOnly
// covers: Pg.Run
#[test]
fn status_watch_follows_a_tenure_on_postgres() {
    let test = "status_watch_follows_a_tenure_on_postgres";
    let Some(server) = postgres_support::PgServer::start(test) else {
        return;
    };
    let store = server.url("vvm", "watched");
    // Nothing there yet: a one-shot status says so and creates nothing; a watch waits for the
    // store without creating it either.
    let schemas = || server.admin("SELECT count(*) FROM pg_namespace WHERE nspname = 'watched'");
    let output = vvm()
        .args(["status", "--store", &store])
        .output()
        .expect("the vvm binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nothing to show"), "{stderr}");
    assert_eq!(schemas().trim(), "0", "vvm status created the schema");
    let early = Watcher::spawn(&store, true);
    // A second of looks (one per 200 ms after each), shorter than `quiet`'s wait.
    if let Ok(line) = early.lines.recv_timeout(Duration::from_secs(1)) {
        panic!("no store yet, nothing to show: unexpected line {line}");
    }
    assert_eq!(
        schemas().trim(),
        "0",
        "vvm status --watch created the schema"
    );
    // The schema is made by a first run, so that the watch's first table is the free slot.
    let output = vvm()
        .args(["run", "--store", &store, "--address", "creator"])
        .args(["--lease", LEASE, "--", "true"])
        .output()
        .expect("the vvm binary runs");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    // The early watch shows the store once it exists: free, or still held by the first run
    // and then released.
    let table = early.json("the table once the store exists");
    let first = &table["slots"][0]["holder"];
    if !first.is_null() {
        assert_eq!(first["address"], "creator", "{table}");
        let released = early.json("the first run's release");
        // `true` ends at once: a tenure that ends between the look that saw it and that look's
        // time-left call leaves the watch without its expiry, so its end is `gone`, not judged.
        let event = released["event"].as_str().unwrap_or_default();
        assert!(["released", "gone"].contains(&event), "{released}");
    }
    early.stop();
    // With `expire`: a SIGKILLed holder's record is reported expired, judged by observation.
    watch_a_tenure(&store, true);
    drop(server);
}

// covers: Cli.StatusWatch, Cli.StatusReadOnly
#[test]
fn a_watch_started_before_the_store_exists_waits_for_it() {
    let dir = temp_dir("vvm-cli-status-early");
    let path = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", path.display());
    let watcher = Watcher::spawn(&store, true);
    watcher.quiet("no store yet, nothing to show");
    assert!(!path.exists(), "the watcher created the store");
    let mut holder = spawn_holder(&store, "holder-e");
    wait_leading(&mut holder);
    // The first table comes once the store exists: the slot is free or already taken.
    let table = watcher.json("the table");
    let first = &table["slots"][0]["holder"];
    if first.is_null() {
        let taken = watcher.json("the slot taken");
        assert_eq!(taken["holder"]["address"], "holder-e", "{taken}");
    } else {
        assert_eq!(first["address"], "holder-e", "{table}");
    }
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, LINE_WAIT),
        Some(0)
    );
    watcher.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}
