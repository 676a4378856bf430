//! Helpers shared by the tests of the `vvm` binary: scratch folders, signals and waiting for a
//! child process to end.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

pub mod tree;

/// A fresh folder `<prefix>-<pid>-<ns>` under the system's temporary folder. Keep `prefix` short
/// where a Unix socket will live inside (a socket path has at most 107 bytes).
pub fn temp_dir(prefix: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: Signal) {
    let pid = Pid::from_raw(child.id() as i32).unwrap();
    kill_process(pid, signal).unwrap();
}

/// Waits for `child` to end: `Some(exit code)`, or `None` if it still runs after `limit`.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<Option<i32>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Sends `signal` to `child` and waits for it to end: its exit code, or a failure (the child
/// killed) after `limit`.
pub fn signal_and_wait(child: &mut Child, signal_sent: Signal, limit: Duration) -> Option<i32> {
    signal(child, signal_sent);
    match exit_within(child, limit) {
        Some(code) => code,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("no exit within {limit:?} of {signal_sent:?}");
        }
    }
}

/// Starts `vvm run` on `store` as `address` (lease 2 s, warnings only on `stderr`) and waits for
/// its first line, which must say it leads.
pub fn leading_child(store: &str, address: &str, stderr: Stdio) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", store])
        .args(["--lease", "2s", "--address", address])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("the vvm binary runs");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    child
}

/// `vvm` with `args`, standard input closed, within `limit`: its exit code, standard output and
/// standard error; a panic naming `what` when it is still running then (it is killed).
pub fn vvm_within(args: &[&str], limit: Duration, what: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vvm binary runs");
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let code = exit_within(&mut child, limit);
    if code.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    match code {
        Some(code) => (code, stdout, stderr),
        None => panic!("{what}: still running after {limit:?}:\n{stdout}{stderr}"),
    }
}

/// Reads `stream` to its end on a thread of its own (a full pipe must not stall the child).
pub fn drain(mut stream: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stream.read_to_string(&mut text);
        text
    })
}
