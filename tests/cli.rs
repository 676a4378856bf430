//! The host binary's contract: one-line usage errors with exit code 2, exit 0 after a clean
//! shutdown, a printed problem and exit 1 otherwise; a closed standard error neither panics nor
//! wedges it.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{leading_child, signal_and_wait, temp_dir};
use rustix::process::Signal;

fn vvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

// covers: Cli.Errors
#[test]
fn bad_flags_and_values_are_one_line_errors_with_exit_code_2() {
    let cases: &[&[&str]] = &[
        &["run", "--bogus"],
        &["run", "--store", "nosuch:thing"],
        &["run", "--store", "memory:", "--lease", "1s"],
        &["run", "--store", "memory:", "--lease", "3x"],
        &["run", "--store", "memory:", "--slots", "0"],
        &["run", "--store", "memory:", "--address", ""],
        &["status", "--store", "sqlite:"],
        &["nosuchcommand"],
    ];
    for args in cases {
        let output = vvm(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("vvm: "), "{args:?}: {stderr}");
    }
}

// covers: Cli.Errors
#[test]
fn help_describes_every_flag() {
    for (command, flags) in [
        (
            "run",
            &[
                "--store",
                "--slots",
                "--address",
                "--lease",
                "--acquire",
                "--round",
                "--log-level",
            ][..],
        ),
        ("status", &["--store", "--slots"][..]),
        ("demo", &["--lease", "--round"][..]),
    ] {
        let output = vvm(&[command, "--help"]);
        assert_eq!(output.status.code(), Some(0));
        let help = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<&str> = help.lines().collect();
        for flag in flags {
            // `--flag`, or `-f, --flag` with its short form.
            let at = lines.iter().position(|l| {
                let l = l.trim_start();
                l.starts_with(flag)
                    || (l.starts_with('-') && l.get(4..).is_some_and(|rest| rest.starts_with(flag)))
            });
            let at = at.unwrap_or_else(|| panic!("`vvm {command} --help` lacks {flag}"));
            // The description follows the flag on its line, or on the next when clap wraps.
            let inline = lines[at].trim_start().len() > flag.len() + 34;
            let below = lines.get(at + 1).is_some_and(|l| {
                let l = l.trim_start();
                !l.starts_with('-') && l.len() > 10
            });
            assert!(inline || below, "{flag} has no description in:\n{help}");
        }
    }
}

// covers: Cli.Errors
#[test]
fn sigterm_shuts_down_cleanly_with_exit_code_0_and_releases_the_slot() {
    let dir = temp_dir("vvm-cli-term");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut child = leading_child(&store, "cli-a", Stdio::null());

    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("cli-a"), "{table}");

    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(10));
    assert_eq!(code, Some(0));

    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("(free)") && !table.contains("cli-a"),
        "{table}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Errors, Rt.AcquisitionWhy
#[test]
fn a_failed_acquisition_is_printed_and_exits_with_the_busy_code() {
    let dir = temp_dir("vvm-cli-busy");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut holder = leading_child(&store, "holder", Stdio::null());

    let output = vvm(&[
        "--log-level",
        "error",
        "run",
        "--store",
        &store,
        "--lease",
        "2s",
        "--acquire",
        "500ms",
        "--round",
        "100ms",
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Held by someone else: busy (3), not a problem (1).
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("no slot out of 1 was acquired"), "{stderr}");
    // Which slot, and why: who holds it.
    assert!(stderr.contains("slot 1: held by holder"), "{stderr}");

    holder.kill().unwrap();
    holder.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.BrokenStderr
/// `vvm run … 2>&1 >/dev/null | head -2`, then SIGTERM. The reader of
/// standard error goes away after two lines; every later log line meets a closed pipe. The
/// process must neither panic nor wedge: it shuts down on SIGTERM with the clean exit code.
#[test]
fn a_closed_stderr_neither_panics_nor_wedges_vvm_run() {
    const RUNS: usize = 3;
    for run in 0..RUNS {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["--log-level", "debug", "run", "--store", "memory:"])
            .args(["--lease", "2s", "--address", "cli-stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        for _ in 0..2 {
            lines.next().expect("a log line").expect("readable");
        }
        // `head -2` exits: the pipe's only reader is gone.
        drop(lines);
        // Let the launch go on logging into the closed pipe for a while.
        std::thread::sleep(Duration::from_millis(300));
        let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(10));
        assert_eq!(code, Some(0), "run {run}: exit code after SIGTERM");
    }
}

// covers: Cli.BrokenStderr
/// The other half of finding 4: standard error is a pipe that is full before `vvm run` starts
/// and that nobody reads (a stalled log collector). Log lines must be dropped, not waited for:
/// the VVM leads, and SIGTERM ends it cleanly within the bounded wait for the last lines.
#[test]
fn a_stalled_stderr_does_not_block_vvm_run() {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

    let (reader, writer) = rustix::pipe::pipe().unwrap();
    let flags = fcntl_getfl(&writer).unwrap();
    fcntl_setfl(&writer, flags | OFlags::NONBLOCK).unwrap();
    while rustix::io::write(&writer, &[b'x'; 4096]).is_ok() {}
    fcntl_setfl(&writer, flags).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "debug", "run", "--store", "memory:"])
        .args(["--lease", "2s", "--address", "cli-stalled"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(writer))
        .spawn()
        .unwrap();
    // Read on a thread: a binary blocked on its log writer never prints, and must not hang
    // the test.
    let stdout = child.stdout.take().unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let first = BufReader::new(stdout).lines().next();
        let _ = sender.send(first);
    });
    let first = match receiver.recv_timeout(Duration::from_secs(10)) {
        Ok(first) => first.expect("a line").expect("readable"),
        Err(_) => {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("vvm run did not lead within 10 s: blocked on its standard error");
        }
    };
    assert!(first.starts_with("leading slot=1 "), "{first}");
    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(5));
    assert_eq!(code, Some(0));
    drop(reader);
}
