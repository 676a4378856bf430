//! `vvm run --metrics-addr`: `/metrics`, `/healthz` and `/leader` of real `vvm run` processes
//! sharing a SQLite file; and the release counter, which a process can only be seen to record
//! in-process (its endpoint ends with it, right after the release).

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use cli_support::{signal, signal_and_wait, temp_dir};
use rustix::process::Signal;

/// Upper bound for anything the tests wait for; only a broken binary reaches it.
const WAIT_MAX: Duration = Duration::from_secs(30);

/// A `vvm run` with its metrics endpoint and its standard error lines.
struct Node {
    child: Child,
    addr: SocketAddr,
    lines: Receiver<String>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `vvm run` on the SQLite file of `dir` with `--metrics-addr :0` and `extra` arguments,
/// and reads the address it listens on from its log.
fn start(dir: &Path, address: &str, extra: &[&str]) -> Node {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "info", "run", "--store"])
        .arg(format!("sqlite:{}", dir.join("vvm.sqlite").display()))
        .args(["--round", "100ms", "--address", address])
        .args(["--metrics-addr", ":0"])
        .args(extra)
        // The flag wins; the variable is there to see that a command does not inherit it.
        .env("VVM_METRICS_ADDR", "127.0.0.1:1")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = read_lines(child.stderr.take().unwrap());
    let until = Instant::now() + WAIT_MAX;
    let addr = loop {
        let line = lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("no `metrics endpoint listening` line");
        if line.contains("metrics endpoint listening") {
            let at = line.find("addr=").expect("no addr= field") + "addr=".len();
            break line[at..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
        }
    };
    Node { child, addr, lines }
}

/// The lines of `stderr`, read on a thread of their own (the pipe never fills).
fn read_lines(stderr: ChildStderr) -> Receiver<String> {
    let (sender, receiver) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Sends `request` as is and returns the status code and the body of the answer.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
    stream.write_all(request).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: vvm\r\n\r\n").as_bytes(),
    )
}

/// The value of the sample `series` (name and labels as rendered) in the Prometheus text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// Polls `path` of `node` until it answers `status`; panics after [`WAIT_MAX`].
fn wait_status(node: &Node, path: &str, status: u16) {
    let until = Instant::now() + WAIT_MAX;
    loop {
        if get(node.addr, path).0 == status {
            return;
        }
        assert!(Instant::now() < until, "{path} never answered {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `/metrics` of `node` until `series` has `value`; returns that scrape.
fn wait_sample(node: &Node, series: &str, value: f64) -> String {
    let until = Instant::now() + WAIT_MAX;
    loop {
        let (status, metrics) = get(node.addr, "/metrics");
        assert_eq!(status, 200);
        if sample(&metrics, series) == Some(value) {
            return metrics;
        }
        assert!(
            Instant::now() < until,
            "{series} never reached {value}:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// covers: Cli.Metrics
// covers: Rt.Metrics
#[test]
fn leader_and_standby_answer_and_the_leader_gauge_follows_the_hand_off() {
    let dir = temp_dir("vvm-ops");
    let mut leader = start(&dir, "ops-a", &["--lease", "2s"]);
    wait_status(&leader, "/leader", 200);
    let metrics = wait_sample(&leader, "vvm_leader{slot=\"1\"}", 1.0);
    assert_eq!(
        sample(&metrics, "vvm_acquisitions_total{slot=\"1\"}"),
        Some(1.0),
        "{metrics}"
    );
    let margin = sample(&metrics, "vvm_lease_margin_seconds").unwrap();
    assert!(margin > 0.0 && margin <= 1.6, "{metrics}");
    assert!(
        sample(
            &metrics,
            "vvm_store_call_duration_seconds_count{operation=\"insert\",outcome=\"written\"}"
        ) >= Some(1.0),
        "{metrics}"
    );
    assert_eq!(get(leader.addr, "/healthz").0, 200);

    // A client that sends half a request and stalls holds only its own connection.
    let mut stalled = TcpStream::connect(leader.addr).unwrap();
    stalled
        .write_all(b"GET /metrics HTTP/1.1\r\nHost:")
        .unwrap();
    let idle = TcpStream::connect(leader.addr).unwrap();
    assert_eq!(get(leader.addr, "/healthz").0, 200);

    // A junk request gets 400; the endpoint keeps serving.
    assert_eq!(raw(leader.addr, b"\x16\x03\x01 hello\r\n\r\n").0, 400);
    assert_eq!(raw(leader.addr, b"GET /leader\r\n\r\n").0, 400);
    assert_eq!(get(leader.addr, "/nothing-here").0, 404);
    assert_eq!(get(leader.addr, "/leader").0, 200);

    // A standby: not leader, healthy, its slot shown as not led.
    let standby = start(&dir, "ops-b", &["--lease", "2s", "--acquire", "forever"]);
    assert_eq!(get(standby.addr, "/leader").0, 503);
    assert_eq!(get(standby.addr, "/healthz").0, 200);
    let metrics = get(standby.addr, "/metrics").1;
    assert_eq!(
        sample(&metrics, "vvm_leader{slot=\"1\"}"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "vvm_acquisitions_total{slot=\"1\"}"),
        None,
        "{metrics}"
    );

    // Hand-off: the leader releases on SIGTERM, the standby acquires.
    assert_eq!(
        signal_and_wait(&mut leader.child, Signal::TERM, WAIT_MAX),
        Some(0)
    );
    wait_status(&standby, "/leader", 200);
    let metrics = wait_sample(&standby, "vvm_leader{slot=\"1\"}", 1.0);
    assert_eq!(
        sample(&metrics, "vvm_acquisitions_total{slot=\"1\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(get(standby.addr, "/healthz").0, 200);
    drop(standby);
    drop((stalled, idle));
    let _ = leader.lines.try_recv();
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Metrics
#[test]
fn a_loss_sets_the_leader_gauge_to_zero_and_counts_it() {
    let dir = temp_dir("vvm-ops-loss");
    // The command ignores SIGTERM: after the loss the process stays up for the grace, serving.
    let inherited = dir.join("inherited");
    let script = format!(
        "echo \"${{VVM_METRICS_ADDR-unset}}\" > '{}'; trap '' TERM; while :; do sleep 0.1; done",
        inherited.display()
    );
    let node = start(
        &dir,
        "ops-l",
        &[
            "--lease", "20s", "--grace", "10s", "--", "sh", "-c", &script,
        ],
    );
    wait_status(&node, "/leader", 200);
    // The command does not get the address, which is taken.
    let until = Instant::now() + WAIT_MAX;
    while !matches!(std::fs::read_to_string(&inherited), Ok(text) if text.ends_with('\n')) {
        assert!(Instant::now() < until, "the command wrote nothing");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(std::fs::read_to_string(&inherited).unwrap(), "unset\n");
    wait_sample(&node, "vvm_leader{slot=\"1\"}", 1.0);

    // The record vanishes: the next renewal (within L/4) is refused, a loss.
    let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
    database.busy_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        database
            .execute("DELETE FROM vvm_leases WHERE slot = 1", [])
            .unwrap(),
        1
    );
    drop(database);

    let metrics = wait_sample(&node, "vvm_leader{slot=\"1\"}", 0.0);
    assert_eq!(
        sample(
            &metrics,
            "vvm_losses_total{slot=\"1\",reason=\"overtaken\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(get(node.addr, "/leader").0, 503);
    assert_eq!(get(node.addr, "/healthz").0, 200);
    signal(&node.child, Signal::KILL);
    drop(node);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sum of every sample of `name` (all label sets) in the Prometheus text.
fn total(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// covers: Rt.Metrics
#[test]
fn renewals_that_fail_while_the_store_is_locked_are_counted() {
    let dir = temp_dir("vvm-ops-lock");
    let node = start(&dir, "ops-r", &["--lease", "4s"]);
    wait_status(&node, "/leader", 200);
    let before = get(node.addr, "/metrics").1;
    assert_eq!(
        total(&before, "vvm_renewal_failures_total"),
        0.0,
        "{before}"
    );

    // No renewal can be written while the file is locked; the lock goes as soon as a failure is
    // counted, well before the kill deadline (0.8·L after the last confirmed renewal) on an idle
    // machine. On a loaded one the VVM may lose the slot: the counter has moved all the same.
    let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
    database.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let until = Instant::now() + WAIT_MAX;
    let counted = loop {
        let metrics = get(node.addr, "/metrics").1;
        if total(&metrics, "vvm_renewal_failures_total") >= 1.0 {
            break metrics;
        }
        assert!(
            Instant::now() < until,
            "no renewal failure counted:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    database.execute_batch("COMMIT").unwrap();
    assert!(
        counted.contains("vvm_store_call_duration_seconds_count{operation=\"compare_and_swap\",outcome=\"failed\"}")
            || counted.contains("vvm_store_call_duration_seconds_count{operation=\"compare_and_swap\",outcome=\"unknown\"}"),
        "{counted}"
    );
    drop(node);
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Rt.Metrics
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_at_shutdown_is_counted_once_and_the_leader_gauge_drops_to_zero() {
    // `vvm run` releases on SIGTERM and exits right after, with nothing left to scrape: the
    // counter is read from the same Prometheus recorder the binary installs, here in-process.
    // It is the only recorder of this test binary (the other tests record in child processes).
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    vvm::metrics::describe();
    let store = vvm::adapters::MemoryStore::new();
    // A lease far longer than the test: the process-wide killer never comes near its deadline.
    let config = vvm::VvmConfig::builder("ops-release")
        .slots(1)
        .lease(Duration::from_secs(60));
    let vvm = vvm::Vvm::provide(config, store.clone(), vvm::Services::new()).unwrap();
    let stop = vvm.stop_handle();
    let vvm = vvm.launch().await;
    assert_eq!(vvm.token().map(|token| token.slot), Some(vvm::Slot(1)));
    let leading = handle.render();
    assert_eq!(
        sample(&leading, "vvm_leader{slot=\"1\"}"),
        Some(1.0),
        "{leading}"
    );
    assert_eq!(total(&leading, "vvm_releases_total"), 0.0, "{leading}");

    // What SIGTERM does in the binary: stop through the handle, then the ordered shutdown.
    stop.stop();
    assert_eq!(vvm.shutdown().await, Ok(()));
    let table = vvm::discovery::leaders(&store, 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(table[0].holder.is_none(), "the record is still there");
    let released = handle.render();
    assert_eq!(
        sample(&released, "vvm_releases_total{slot=\"1\",deleted=\"true\"}"),
        Some(1.0),
        "{released}"
    );
    assert_eq!(total(&released, "vvm_releases_total"), 1.0, "{released}");
    assert_eq!(
        sample(&released, "vvm_leader{slot=\"1\"}"),
        Some(0.0),
        "{released}"
    );
}

// covers: Cli.ExecStopped
#[test]
fn a_stopped_command_is_reported_and_a_shutdown_continues_it() {
    const GRACE: Duration = Duration::from_secs(30);
    let dir = temp_dir("vvm-ops-stopped");
    // The command stops itself, as a read from the terminal in the background would
    // (SIGTTIN); its SIGTERM trap writes a file, which only a continued process can.
    let got_term = dir.join("got-term");
    let script = format!(
        "trap 'echo term > {}; exit 0' TERM; kill -STOP $$; while :; do sleep 0.05; done",
        got_term.display()
    );
    let mut node = start(
        &dir,
        "ops-stopped",
        &["--lease", "2s", "--grace", "30s", "--", "sh", "-c", &script],
    );
    wait_status(&node, "/healthz", 503);
    let (_, body) = get(node.addr, "/healthz");
    assert!(body.contains("the command is stopped"), "{body}");
    wait_sample(&node, "vvm_command_stopped", 1.0);
    let until = Instant::now() + WAIT_MAX;
    loop {
        let line = node
            .lines
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("no log line says the command is stopped");
        if line.contains("the command is stopped") {
            break;
        }
    }
    // SIGTERM to `vvm`: SIGTERM and SIGCONT to the tree; the command's trap runs at once, not
    // after the grace.
    let started = Instant::now();
    let code = signal_and_wait(&mut node.child, Signal::TERM, WAIT_MAX);
    assert!(
        started.elapsed() < GRACE / 3,
        "the stopped command waited out the grace: {:?}",
        started.elapsed()
    );
    assert_eq!(code, Some(0));
    assert!(got_term.exists(), "the command never saw SIGTERM");
    std::fs::remove_dir_all(&dir).unwrap();
}
