//! systemd notifications of `vvm run`, read from a Unix datagram socket the test binds and hands
//! to the binary as `NOTIFY_SOCKET`: `READY=1` only once leading, `WATCHDOG=1` only after
//! confirmed renewals and only when `WATCHDOG_USEC` asks for it, `STOPPING=1` on shutdown.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::temp_dir;
use rustix::process::{kill_process, Pid, Signal};

/// Upper bound for anything the tests wait for; only a broken binary reaches it.
const WAIT_MAX: Duration = Duration::from_secs(30);

/// `vvm run` on the SQLite file in `dir` as `address`, lease `lease`, with `env` and no other
/// systemd variable.
fn vvm_run(dir: &Path, address: &str, lease: &str, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vvm"));
    command
        .args(["--log-level", "warn", "run", "--store"])
        .arg(format!("sqlite:{}", dir.join("vvm.sqlite").display()))
        .args(["--lease", lease, "--round", "100ms", "--address", address])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Binds the notification socket in `dir`.
fn notify_socket(dir: &Path) -> (UnixDatagram, String) {
    let path = dir.join("notify");
    let socket = UnixDatagram::bind(&path).unwrap();
    (socket, path.display().to_string())
}

/// The next datagram, or `None` when none came within `limit`.
fn receive(socket: &UnixDatagram, limit: Duration) -> Option<String> {
    socket.set_read_timeout(Some(limit)).unwrap();
    let mut buffer = [0u8; 4096];
    match socket.recv(&mut buffer) {
        Ok(n) => Some(String::from_utf8_lossy(&buffer[..n]).into_owned()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("receiving a notification: {e}"),
    }
}

/// The next datagram that carries a state (`READY=1`, `WATCHDOG=1`, `STOPPING=1`), skipping
/// the ones that carry only a `STATUS=` line; `None` when none came within `limit`.
fn receive_state(socket: &UnixDatagram, limit: Duration) -> Option<String> {
    let end = Instant::now() + limit;
    loop {
        let left = end.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        let message = receive(socket, left)?;
        if !message.starts_with("STATUS=") {
            return Some(message);
        }
    }
}

/// Every datagram that arrives within `window`, with when it came.
fn collect(socket: &UnixDatagram, window: Duration) -> Vec<(Instant, String)> {
    let end = Instant::now() + window;
    let mut messages = Vec::new();
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if left.is_zero() {
            break;
        }
        if let Some(message) = receive(socket, left) {
            messages.push((Instant::now(), message));
        }
    }
    messages
}

fn terminate_and_wait(child: &mut Child) -> Option<i32> {
    kill_process(Pid::from_raw(child.id() as i32).unwrap(), Signal::TERM).unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > WAIT_MAX {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("vvm did not end within {WAIT_MAX:?} of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// covers: Cli.Systemd
#[test]
fn ready_comes_only_once_leading_stopping_on_shutdown_and_no_watchdog_unasked() {
    let dir = temp_dir("vsd-ready");
    let (socket, path) = notify_socket(&dir);
    let mut holder = vvm_run(&dir, "holder", "2s", &[])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");

    let mut standby = vvm_run(&dir, "standby", "2s", &[("NOTIFY_SOCKET", &path)])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Campaigning is not ready, and says what it waits for.
    let waiting: Vec<String> = collect(&socket, Duration::from_millis(1500))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert!(
        waiting.iter().all(|m| m.starts_with("STATUS=")),
        "{waiting:?}"
    );
    assert!(
        waiting
            .iter()
            .any(|m| m.starts_with("STATUS=Waiting: slot 1 is held by holder (fencing token 1:")),
        "{waiting:?}"
    );

    assert_eq!(terminate_and_wait(&mut holder), Some(0));
    drop(lines);
    let ready = receive_state(&socket, WAIT_MAX).expect("no readiness after the holder left");
    assert!(
        ready.starts_with("READY=1\nSTATUS=Leading slot 1 since "),
        "{ready:?}"
    );
    let status = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["status", "--store"])
        .arg(format!("sqlite:{}", dir.join("vvm.sqlite").display()))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("standby"), "ready but not leading: {table}");

    // Renewals go on (every 500 ms), but no watchdog was asked for.
    let quiet = collect(&socket, Duration::from_millis(1500));
    assert!(quiet.is_empty(), "{quiet:?}");

    assert_eq!(terminate_and_wait(&mut standby), Some(0));
    let after: Vec<String> = collect(&socket, Duration::from_millis(200))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(after, ["STOPPING=1\nSTATUS=Shutting down\n"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Systemd
#[test]
fn watchdog_pings_follow_confirmed_renewals_and_stop_while_the_store_is_locked() {
    const LEASE: Duration = Duration::from_secs(4);
    let dir = temp_dir("vsd-dog");
    let (socket, path) = notify_socket(&dir);
    let mut vvm = vvm_run(
        &dir,
        "dog",
        "4s",
        &[("NOTIFY_SOCKET", &path), ("WATCHDOG_USEC", "20000000")],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    let ready = receive_state(&socket, WAIT_MAX).unwrap_or_default();
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");

    // Renewals every L/4 = 1 s: pings come at that pace.
    let pings = collect(&socket, Duration::from_millis(3500));
    assert!(pings.iter().all(|(_, m)| m == "WATCHDOG=1\n"), "{pings:?}");
    assert!((2..=5).contains(&pings.len()), "{pings:?}");

    // No renewal can be confirmed while the file is locked: no ping. The lock is released well
    // before the kill deadline (0.8·L after the last confirmed renewal).
    let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
    database.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // A renewal confirmed just before the lock may still be reported.
    let _ = collect(&socket, Duration::from_millis(300));
    let locked = collect(&socket, Duration::from_millis(1200));
    database.execute_batch("COMMIT").unwrap();
    assert!(
        locked.is_empty(),
        "pings without a confirmed renewal: {locked:?}"
    );

    // Renewals resume, and so do the pings.
    assert_eq!(
        receive(&socket, LEASE).as_deref(),
        Some("WATCHDOG=1\n"),
        "no ping after the store came back"
    );
    assert_eq!(terminate_and_wait(&mut vvm), Some(0));
    let rest: Vec<String> = collect(&socket, Duration::from_millis(200))
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    assert_eq!(
        rest.last().map(String::as_str),
        Some("STOPPING=1\nSTATUS=Shutting down\n"),
        "{rest:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
