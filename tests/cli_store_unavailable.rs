//! `vvm run` started while its etcd cluster cannot serve (2 of 3 members stopped: no quorum)
//! waits for it, says so once, and leads when the cluster returns; `--store-unavailable fail`
//! exits 1 at once instead. A store set up wrongly (credentials, TLS) still fails at once: see
//! `tests/url_etcd.rs` and `tests/url_etcd_tls.rs`.

mod cli_support;
use vvm_test_support::etcd as etcd_support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cli_support::{exit_within, signal_and_wait};
use etcd_support::{three_steady, START_LIMIT};
use rustix::process::Signal;

/// Longer than the 5 s request timeout after which `vvm run` used to give up, and than the
/// 2 s connect timeout: the wait must outlast both.
const OUTAGE: Duration = Duration::from_secs(7);

fn run(store: &str, address: &str, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", store, "--lease", "2s", "--round", "200ms"])
        .args(["--address", address])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vvm binary runs")
}

// covers: Cli.StoreUnavailable
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_without_a_quorum_waits_and_leads_when_it_returns() {
    let test = "a_run_started_without_a_quorum_waits_and_leads_when_it_returns";
    let Some(mut cluster) = three_steady(test).await else {
        return;
    };
    let store = cluster.store_url();
    cluster.kill(1).unwrap();
    cluster.kill(2).unwrap();

    // Fail-fast for scripts: exit 1 at once, naming the cause.
    let started = Instant::now();
    let mut fast = run(&store, "fast", &["--store-unavailable", "fail"]);
    let code = exit_within(&mut fast, Duration::from_secs(20));
    let mut stderr = String::new();
    fast.stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(code, Some(Some(1)), "{stderr}");
    assert!(stderr.contains("unavailable"), "{stderr}");
    let fast_elapsed = started.elapsed();

    // The default waits: still running past the old 5 s give-up, one line saying it waits.
    let mut child = run(&store, "patient", &[]);
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let outage_end = Instant::now() + OUTAGE;
    while Instant::now() < outage_end {
        if let Some(status) = child.try_wait().unwrap() {
            let said: Vec<String> = lines.try_iter().collect();
            panic!(
                "vvm run gave up while the cluster had no quorum ({status}): {}",
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let said: Vec<String> = lines.try_iter().collect();
    let waiting = said
        .iter()
        .filter(|line| line.contains("the store is unavailable; waiting"))
        .count();
    assert_eq!(waiting, 1, "one line says it waits: {said:#?}");

    // The quorum returns: it leads.
    cluster.restart(1).unwrap();
    cluster.restart(2).unwrap();
    let returned = Instant::now();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (first_tx, first) = mpsc::channel();
    std::thread::spawn(move || {
        let line = stdout.lines().next().and_then(Result::ok);
        let _ = first_tx.send(line);
    });
    let line = first
        .recv_timeout(START_LIMIT)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no leader within {START_LIMIT:?} of the quorum's return"));
    assert!(line.starts_with("leading slot=1 "), "{line}");
    eprintln!(
        "{test}: fail-fast exit after {fast_elapsed:?}; led {:?} after the quorum returned",
        returned.elapsed()
    );
    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(20));
    assert_eq!(code, Some(0));
}

// covers: Cli.StoreUnavailable
#[test]
fn a_signal_ends_the_wait_for_the_store_with_exit_0() {
    // A port nobody listens on: every connection is refused at once.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let store = format!("etcd://127.0.0.1:{port}");
    let mut child = run(&store, "waiting", &[]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "vvm run gave up on a store that refused the connection"
    );
    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(10));
    assert_eq!(code, Some(0));
    // With a window (`--acquire`), the wait ends with it: exit 1.
    let mut bounded = run(&store, "bounded", &["--acquire", "1s"]);
    assert_eq!(
        exit_within(&mut bounded, Duration::from_secs(20)),
        Some(Some(1))
    );
}

// covers: Cli.StoreUnavailable
#[test]
fn a_signal_ends_an_attempt_in_flight_while_waiting() {
    // A member that accepts connections and never answers: each attempt lasts the request
    // timeout (5 s), the first one before `vvm run` says it waits.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for connection in listener.incoming().take(64) {
            held.push(connection);
        }
    });
    let mut child = run(&format!("etcd://127.0.0.1:{port}"), "silent", &[]);
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (said_tx, said) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if line.contains("the store is unavailable; waiting") {
                let _ = said_tx.send(());
            }
        }
    });
    said.recv_timeout(Duration::from_secs(30))
        .expect("vvm run says it waits once the first attempt timed out");
    // The second attempt has begun (after a pause of at most 100 ms) and lasts 5 s: the
    // signal must not wait for it.
    std::thread::sleep(Duration::from_millis(500));
    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(3));
    assert_eq!(code, Some(0));
}
