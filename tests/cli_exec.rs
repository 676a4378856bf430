//! `vvm run -- CMD ARGS…` through the real binary, with real child processes: the command runs
//! only while its VVM leads, sees its fencing token, is stopped with SIGTERM then SIGKILL, and
//! its whole process group is gone when `vvm` ends — by a shutdown, by its own exit, or by the
//! killer's deadline.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{signal, temp_dir};
use rustix::process::{kill_process, Pid, Signal};

/// Upper bound for anything the tests wait for; generous for a loaded machine. Only a broken
/// binary reaches it.
const WAIT_MAX: Duration = Duration::from_secs(30);

fn store_of(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("vvm.sqlite").display())
}

/// `vvm run` on `store` as `address` with `extra` flags, running `sh -c script` in `dir`.
/// Standard error goes to `dir/stderr` (a file: a pipe would be held open by stray children).
fn exec_child(dir: &Path, address: &str, extra: &[&str], script: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .current_dir(dir)
        .args(["--log-level", "info", "run", "--store", &store_of(dir)])
        .args(["--lease", "2s", "--round", "100ms", "--address", address])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{address}.stderr"))).unwrap())
        .spawn()
        .unwrap()
}

fn stderr_of(dir: &Path, address: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{address}.stderr"))).unwrap_or_default()
}

/// Waits for `path` to exist (scripts write a temporary file and rename it) and returns it.
fn wait_for_file(path: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("vvm ended ({status}) before {} appeared", path.display());
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to end; its exit code and how long that took.
fn wait_exit(child: &mut Child) -> (Option<i32>, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status.code(), start.elapsed());
        }
        if start.elapsed() > WAIT_MAX {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("vvm did not end within {WAIT_MAX:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `pid` runs: it exists and is not a zombie (an orphan whose reaper is slow).
fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `pid` to stop running; whether it did.
fn ends_within(pid: i32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while is_running(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The pids a command of `vvm` wrote in `text`, as this process sees them (see
/// [`cli_support::tree::host_pid`]).
fn pids(vvm: &Child, text: &str) -> Vec<i32> {
    text.split_whitespace()
        .map(|p| cli_support::tree::host_pid(vvm.id(), p.parse().unwrap()))
        .collect()
}

/// Ends leftovers of a failed test so that they do not outlive it.
fn kill_all(pids: &[i32]) {
    for &pid in pids {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

// covers: Cli.Exec, Cli.ExecStop, Lease.TokenForm
#[test]
fn the_command_starts_only_while_leading_sees_its_token_and_gets_sigterm_on_shutdown() {
    let dir = temp_dir("vvm-exec-lead");
    let store = store_of(&dir);
    // A demo VVM holds the slot first.
    let mut holder = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", &store])
        .args(["--lease", "2s", "--address", "holder"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    let holder_token: vvm::FencingToken = first
        .split_whitespace()
        .find_map(|w| w.strip_prefix("fencing_token="))
        .expect("a fencing token")
        .parse()
        .unwrap();

    // The trap first: the test signals as soon as `env` appears.
    let script = r#"trap 'echo term > term.tmp && mv term.tmp term; exit 0' TERM
echo "$VVM_SLOT $VVM_FENCING_TOKEN $VVM_ADDRESS" > env.tmp && mv env.tmp env
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-a", &[], script);
    // While the holder leads, the command must not start.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !dir.join("env").exists(),
        "the command started while another process led"
    );
    assert!(exec.try_wait().unwrap().is_none(), "vvm run ended early");

    signal(&holder, Signal::TERM);
    assert_eq!(wait_exit(&mut holder).0, Some(0));
    drop(lines);

    let env = wait_for_file(&dir.join("env"), &mut exec);
    let fields: Vec<&str> = env.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{env:?}");
    assert_eq!(fields[0], "1", "VVM_SLOT in {env:?}");
    let token: vvm::FencingToken = fields[1]
        .parse()
        .expect("VVM_FENCING_TOKEN is <slot>:<revision>");
    assert_eq!(token.slot, vvm::Slot(1), "{env:?}");
    assert!(
        token > holder_token,
        "the fencing token {token} does not exceed the previous holder's {holder_token}"
    );
    assert_eq!(fields[2], "exec-a", "VVM_ADDRESS in {env:?}");

    signal(&exec, Signal::TERM);
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-a");
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.join("term")).expect("the command saw SIGTERM"),
        "term\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecStop
#[test]
fn a_command_ignoring_sigterm_is_killed_with_its_group_after_the_grace() {
    const GRACE: Duration = Duration::from_secs(1);
    let dir = temp_dir("vvm-exec-grace");
    let script = r#"trap '' TERM
sleep 1000 >/dev/null 2>&1 &
echo $$ $! > pids.tmp && mv pids.tmp pids
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-g", &["--grace", "1s"], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let pids = pids(&exec, &written);
    assert!(pids.iter().all(|&pid| is_running(pid)), "{pids:?}");

    signal(&exec, Signal::TERM);
    let (code, took) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-g");
    let ended = pids
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    kill_all(&pids);
    assert!(ended, "the command or its child outlived vvm: {pids:?}");
    assert!(
        took >= GRACE,
        "vvm ended after {took:?}, before the grace of {GRACE:?}"
    );
    // Not stopping when asked is the service's failure.
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("did not stop within 1s"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecExit
#[test]
fn the_commands_own_exit_ends_vvm_by_its_status_and_ends_its_group() {
    let dir = temp_dir("vvm-exec-exit");
    // Status 0: a clean stop; the slot is released and what it left behind is ended.
    // It exits once the test has read its child's pid (`go`).
    let script = r#"sleep 1000 >/dev/null 2>&1 &
echo $! > pids.tmp && mv pids.tmp pids
while [ ! -e go ]; do sleep 0.02; done
exit 0"#;
    let mut exec = exec_child(&dir, "exec-0", &[], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let stray = pids(&exec, &written);
    std::fs::write(dir.join("go"), "").unwrap();
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-0");
    let ended = stray
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    kill_all(&stray);
    assert!(ended, "a child of the command outlived it: {stray:?}");
    assert_eq!(code, Some(0), "{stderr}");
    let status = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["status", "--store", &store_of(&dir)])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("(free)") && !table.contains("exec-0"),
        "{table}"
    );

    // Any other status: a service failure, and `vvm` exits with the command's status.
    let mut exec = exec_child(&dir, "exec-3", &[], "exit 3");
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-3");
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("the command exited with status 3 before it was asked to stop"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecDeadline
#[test]
fn the_kill_deadline_ends_the_commands_group_and_vvm_with_75() {
    let dir = temp_dir("vvm-exec-deadline");
    // A grace far beyond the lease: only the killer can end the command in time.
    let script = r#"trap '' TERM
sleep 1000 >/dev/null 2>&1 &
echo $$ $! > pids.tmp && mv pids.tmp pids
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-k", &["--grace", "60s"], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let pids = pids(&exec, &written);
    assert!(pids.iter().all(|&pid| is_running(pid)), "{pids:?}");

    // Freeze vvm (not its command) past the lease: the deadline (0.8·L after the last
    // confirmed renewal) passes and the stored lease expires. The supervisor holds its own copy
    // of the deadline: the group ends while vvm is still frozen.
    signal(&exec, Signal::STOP);
    let ended = pids
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    signal(&exec, Signal::CONT);
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-k");
    kill_all(&pids);
    assert!(
        ended,
        "the command or its child outlived the deadline while vvm was frozen: {pids:?}"
    );
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("kill deadline passed"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Exec
#[test]
fn the_acting_log_is_refused_with_a_command() {
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", "memory:", "--", "true"])
        .env("VVM_ACTING_LOG", "x")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("VVM_ACTING_LOG"), "{stderr}");
}

// covers: Cli.ExecOrphan
#[test]
fn the_command_dies_with_vvm_killed_by_sigkill() {
    let dir = temp_dir("vvm-exec-orphan");
    let script = r#"trap '' TERM
echo $$ > pids.tmp && mv pids.tmp pids
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-o", &[], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let pids = pids(&exec, &written);
    assert!(pids.iter().all(|&pid| is_running(pid)), "{pids:?}");

    // No shutdown, no killer: only the kernel can tell the command.
    signal(&exec, Signal::KILL);
    exec.wait().unwrap();
    let ended = pids
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    kill_all(&pids);
    assert!(ended, "the command outlived vvm: {pids:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecStop
#[test]
fn a_loss_of_leadership_sends_sigterm_to_the_command() {
    let dir = temp_dir("vvm-exec-loss");
    let script = r#"trap 'echo term > term.tmp && mv term.tmp term; exit 0' TERM
echo $$ > pids.tmp && mv pids.tmp pids
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-l", &[], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let pids = pids(&exec, &written);

    // The record vanishes (as if another writer removed it): the next renewal finds no lease of
    // this process, which is a loss, well before the kill deadline.
    let database = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
    database.busy_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(
        database
            .execute("DELETE FROM vvm_leases WHERE slot = 1", [])
            .unwrap(),
        1
    );
    drop(database);

    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-l");
    let ended = pids
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    kill_all(&pids);
    assert!(ended, "the command outlived vvm: {pids:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("term")).ok().as_deref(),
        Some("term\n"),
        "the command did not get SIGTERM on the loss: {stderr}"
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("leadership of slot 1 was lost"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecEnvironment
#[test]
fn the_command_gets_only_the_documented_vvm_variables() {
    let dir = temp_dir("vvm-exec-env");
    let out = dir.join("env.out");
    // `vvm`'s settings come from the environment here, as in a unit file.
    let script = format!(
        "env | grep -E '^(VVM_|OTHER_SETTING=)' | sort > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        out.display()
    );
    let password = dir.join("password");
    std::fs::write(&password, "secret\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .current_dir(&dir)
        .args(["run", "--", "sh", "-c", &script])
        .env("VVM_STORE", store_of(&dir))
        .env("VVM_LEASE", "2s")
        .env("VVM_GRACE", "1s")
        .env("VVM_ROUND", "100ms")
        .env("VVM_ADDRESS", "env-a")
        .env("VVM_LOG_LEVEL", "info")
        .env(
            "VVM_SOMETHING_ELSE",
            format!("password-file={}", password.display()),
        )
        .env("OTHER_SETTING", "kept")
        // The name the fencing token had before: not passed on, like every `VVM_` variable.
        .env("VVM_REVISION", "7")
        .env_remove("VVM_METRICS_ADDR")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("env-a.stderr")).unwrap())
        .spawn()
        .unwrap();
    let seen = wait_for_file(&out, &mut child);
    let (code, _) = wait_exit(&mut child);
    assert_eq!(code, Some(0), "{}", stderr_of(&dir, "env-a"));
    let names: Vec<&str> = seen
        .lines()
        .map(|line| line.split('=').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "OTHER_SETTING",
            "VVM_ADDRESS",
            "VVM_FENCING_TOKEN",
            "VVM_SLOT"
        ],
        "{seen}"
    );
    assert!(seen.contains("VVM_ADDRESS=env-a\n"), "{seen}");
    assert!(seen.contains("VVM_SLOT=1\n"), "{seen}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecStatus
#[test]
fn the_commands_status_is_passed_on_and_a_signal_is_128_plus_its_number() {
    let dir = temp_dir("vvm-exec-status");
    let mut exec = exec_child(&dir, "exec-9", &[], "kill -KILL $$");
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-9");
    assert_eq!(code, Some(128 + 9), "{stderr}");
    assert!(
        stderr.contains("the command was ended by signal 9 before it was asked to stop"),
        "{stderr}"
    );
    let mut exec = exec_child(&dir, "exec-42", &[], "exit 42");
    let (code, _) = wait_exit(&mut exec);
    assert_eq!(code, Some(42), "{}", stderr_of(&dir, "exec-42"));
    // A command's own 75 is passed on too, and the last line says it was the command's, not
    // the kill deadline's.
    let mut exec = exec_child(&dir, "exec-75", &[], "exit 75");
    let (code, _) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-75");
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        stderr.contains("the command exited with status 75 before it was asked to stop")
            && !stderr.contains("kill deadline passed"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecStatus
#[test]
fn a_command_that_cannot_be_started_is_refused_before_campaigning() {
    let dir = temp_dir("vvm-exec-missing");
    let not_executable = dir.join("not-executable");
    std::fs::write(&not_executable, b"#!/bin/sh\n").unwrap();
    let cases: [(&str, i32, &str); 3] = [
        (
            "/no/such/cmd",
            127,
            "cannot start /no/such/cmd: command not found",
        ),
        ("no-such-program-of-vvm", 127, "command not found"),
        (not_executable.to_str().unwrap(), 126, "not executable"),
    ];
    for (program, expected, message) in cases {
        let started = Instant::now();
        let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
            .current_dir(&dir)
            .args(["run", "--store", &store_of(&dir), "--", program])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(expected), "{program}: {stderr}");
        assert!(stderr.contains(message), "{program}: {stderr}");
        assert!(
            !stderr.contains("campaigning"),
            "{program}: campaigned: {stderr}"
        );
        assert!(started.elapsed() < WAIT_MAX, "{program}");
    }
    // No slot was taken: the store was never even opened.
    assert!(!dir.join("vvm.sqlite").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecForce
#[test]
fn a_second_signal_skips_the_grace() {
    const GRACE: Duration = Duration::from_secs(30);
    let dir = temp_dir("vvm-exec-force");
    let script = r#"trap '' TERM INT
sleep 1000 >/dev/null 2>&1 &
echo $$ $! > pids.tmp && mv pids.tmp pids
while :; do sleep 0.05; done"#;
    let mut exec = exec_child(&dir, "exec-f", &["--grace", "30s"], script);
    let written = wait_for_file(&dir.join("pids"), &mut exec);
    let pids = pids(&exec, &written);
    // SIGTERM: after Ctrl-C (SIGINT) `vvm` would end by SIGINT, which hides the exit code this
    // test reads (`Cli.CtrlC`).
    signal(&exec, Signal::TERM);
    // Past the window in which a second delivery counts as the same request (500 ms, counted
    // from when `vvm` handled the first): at exactly 500 ms the second was taken for a duplicate.
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        exec.try_wait().unwrap().is_none(),
        "vvm did not wait for the grace"
    );
    signal(&exec, Signal::TERM);
    let (code, took) = wait_exit(&mut exec);
    let stderr = stderr_of(&dir, "exec-f");
    let ended = pids
        .iter()
        .all(|&pid| ends_within(pid, Duration::from_secs(5)));
    kill_all(&pids);
    assert!(ended, "the command's tree outlived vvm: {pids:?}");
    assert!(
        took < GRACE / 2,
        "the second signal was not heeded: {took:?}\n{stderr}"
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("skipped the grace"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.ExecStatus
#[test]
fn a_standby_waits_until_stopped_by_default() {
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--help"])
        .env_remove("VVM_ACQUIRE")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    let acquire = help
        .split("--acquire")
        .nth(1)
        .and_then(|rest| rest.split("\n  -").next())
        .unwrap_or_default();
    assert!(acquire.contains("[default: forever]"), "{help}");
}

// covers: Cli.ExecStopped
#[test]
fn a_command_started_from_a_terminal_reads_end_of_input_instead_of_stopping() {
    let dir = temp_dir("vvm-exec-tty");
    // `script` gives `vvm` a terminal of its own, in whose foreground it runs; the command runs
    // in the background of it. A read from that terminal would stop the command (SIGTTIN) and
    // hang the run; from /dev/null it ends at once.
    let line = format!(
        "{} run --store {} --lease 2s -- sh -c 'read line; echo read-ended:$?; exit 3'",
        env!("CARGO_BIN_EXE_vvm"),
        store_of(&dir)
    );
    let mut child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("terminal")).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("`script` (util-linux) runs");
    let (code, _) = wait_exit(&mut child);
    let terminal = std::fs::read_to_string(dir.join("terminal")).unwrap();
    assert!(terminal.contains("read-ended:1"), "{terminal}");
    assert!(
        terminal.contains("the command reads /dev/null"),
        "{terminal}"
    );
    assert_eq!(code, Some(3), "{terminal}");
    std::fs::remove_dir_all(&dir).unwrap();
}
