//! `vvm run --metrics-addr` under slow and many clients: `/healthz` keeps answering while clients
//! dribble one byte a second and a crowd of idle connections keeps arriving; a head that is too
//! slow gets 408. Through the real binary.

mod cli_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cli_support::temp_dir;

/// Upper bound for anything the tests wait for; only a broken binary reaches it.
const WAIT_MAX: Duration = Duration::from_secs(30);
/// How long one probe may wait for its answer: a liveness probe's usual timeout, generous for a
/// loaded machine (the answer itself takes well under a millisecond).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients sending one byte a second.
const DRIBBLERS: usize = 20;
/// Idle connections the crowd keeps open at a time (more than the endpoint's cap).
const CROWD: usize = 100;
/// Probes sent while the clients are at it (as many as a probe every 300 ms for ~8 s).
const PROBES: usize = 27;

/// A `vvm run` with its metrics endpoint; killed on drop.
struct Node {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `vvm run` on a SQLite file in `dir` with `--metrics-addr :0` and reads the address it
/// listens on from its log.
fn start(dir: &Path) -> Node {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "info", "run", "--store"])
        .arg(format!("sqlite:{}", dir.join("vvm.sqlite").display()))
        .args([
            "--address",
            "crowd",
            "--lease",
            "20s",
            "--metrics-addr",
            ":0",
        ])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("no `metrics endpoint listening` line")
            .unwrap();
        if let Some(at) = line.find("addr=") {
            if line.contains("metrics endpoint listening") {
                break line[at + "addr=".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
            }
        }
    };
    // Keep draining the log so that the process never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Node { child, addr }
}

/// Sends `request` at once and returns the answer's status code, or why there was none.
fn probe(addr: SocketAddr, request: &[u8]) -> Result<u16, String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT)).unwrap();
    stream
        .write_all(request)
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))
}

/// A client that sends a request one byte a second, reconnecting whenever it is cut off.
fn dribbler(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let request = b"GET /healthz HTTP/1.1\r\nHost: vvm\r\n\r\n";
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut stream) = TcpStream::connect(addr) else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            for byte in request {
                if stop.load(Ordering::Relaxed) || stream.write_all(&[*byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    })
}

/// Keeps opening idle connections, holding the newest [`CROWD`] of them.
fn crowd(addr: SocketAddr, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut open = std::collections::VecDeque::new();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(stream) = TcpStream::connect(addr) {
                open.push_back(stream);
            }
            if open.len() > CROWD {
                open.pop_front();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

// covers: Cli.MetricsCrowd
#[test]
fn healthz_answers_every_probe_among_dribbling_clients_and_an_idle_crowd() {
    let dir = temp_dir("vvm-ops-crowd");
    let node = start(&dir);
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: vvm\r\n\r\n";
    assert_eq!(probe(node.addr, healthz), Ok(200));

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<JoinHandle<()>> = (0..DRIBBLERS)
        .map(|_| dribbler(node.addr, stop.clone()))
        .collect();
    clients.push(crowd(node.addr, stop.clone()));
    // Let every dribbler connect and the crowd pass the endpoint's cap.
    std::thread::sleep(Duration::from_secs(3));

    let mut failures = Vec::new();
    for n in 0..PROBES {
        match probe(node.addr, healthz) {
            Ok(200) => {}
            other => failures.push(format!("probe {n}: {other:?}")),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {PROBES} probes unanswered: {failures:?}",
        failures.len()
    );
    drop(node);
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.MetricsCrowd
#[test]
fn a_request_head_that_does_not_arrive_in_time_gets_408() {
    let dir = temp_dir("vvm-ops-408");
    let node = start(&dir);
    let mut stream = TcpStream::connect(node.addr).unwrap();
    stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHo").unwrap();
    let sent = Instant::now();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 408 "),
        "after {:?}: {answer:?}",
        sent.elapsed()
    );
    // The endpoint serves on.
    assert_eq!(
        probe(node.addr, b"GET /healthz HTTP/1.1\r\nHost: vvm\r\n\r\n"),
        Ok(200)
    );
    drop(node);
    std::fs::remove_dir_all(&dir).unwrap();
}
