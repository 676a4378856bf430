//! The host binary's contract: one-line usage errors with exit code 2, exit 0 after a clean
//! shutdown, a printed problem and exit 1 otherwise.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn vvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("vvm-cli-{name}-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
                "--acting-log",
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
            let at = lines.iter().position(|l| l.trim_start().starts_with(flag));
            let at = at.unwrap_or_else(|| panic!("`vvm {command} --help` lacks {flag}"));
            // The description follows the flag on its line, or on the next when clap wraps.
            let inline = lines[at].trim_start().len() > flag.len() + 30;
            let below = lines.get(at + 1).is_some_and(|l| {
                let l = l.trim_start();
                !l.starts_with('-') && l.len() > 10
            });
            assert!(inline || below, "{flag} has no description in:\n{help}");
        }
    }
}

/// Starts `vvm run` on `store` as `address` and waits for its first line, which must say it leads.
fn leading_child(store: &str, address: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", store])
        .args(["--lease", "2s", "--address", address])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    child
}

// covers: Cli.Errors
#[test]
fn sigterm_shuts_down_cleanly_with_exit_code_0_and_releases_the_slot() {
    let dir = temp_dir("term");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut child = leading_child(&store, "cli-a");

    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("cli-a"), "{table}");

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        assert!(Instant::now() < deadline, "no exit within 10 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0));

    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("(free)") && !table.contains("cli-a"),
        "{table}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Errors
#[test]
fn a_failed_acquisition_is_printed_and_exits_1() {
    let dir = temp_dir("busy");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut holder = leading_child(&store, "holder");

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
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no slot out of 1 was acquired"), "{stderr}");

    holder.kill().unwrap();
    holder.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
