//! The binary's log lines: `RUST_LOG` filters, `--log-format json`, no colour on a pipe.

mod cli_support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use cli_support::signal_and_wait;
use rustix::process::Signal;

/// Upper bound for anything the tests wait for; only a broken binary reaches it.
const WAIT_MAX: Duration = Duration::from_secs(30);

/// Runs `vvm <global> run --store memory:` with `env` until it leads (its demo service's first
/// line on standard output), stops it with SIGTERM and returns its standard error.
fn lead_and_stop(global: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(global)
        .args(["run", "--store", "memory:", "--lease", "2s"])
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("VVM_LOG_FORMAT")
        .env_remove("VVM_LOG_LEVEL")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let collected = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("leading slot=1"), "{first:?}");
    drop(stdout);
    assert_eq!(
        signal_and_wait(&mut child, Signal::TERM, WAIT_MAX),
        Some(0),
        "{}",
        collected.join().unwrap()
    );
    collected.join().unwrap()
}

// covers: Cli.Logging
#[test]
fn json_lines_parse_with_level_and_fields() {
    let stderr = lead_and_stop(&["--log-format", "json"], &[]);
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    let acquired = lines
        .iter()
        .find(|line| line["fields"]["message"] == "leadership acquired")
        .unwrap_or_else(|| panic!("no acquisition line: {stderr}"));
    assert_eq!(acquired["level"], "INFO", "{acquired}");
    assert_eq!(acquired["fields"]["slot"], 1, "{acquired}");
    assert!(acquired["timestamp"].is_string(), "{acquired}");
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["message"] == "shut down cleanly"),
        "{stderr}"
    );
    // The same through the environment.
    let stderr = lead_and_stop(&[], &[("VVM_LOG_FORMAT", "json")]);
    assert!(stderr.lines().all(|line| line.starts_with('{')), "{stderr}");
}

// covers: Cli.Logging
#[test]
fn the_final_problem_is_a_json_line_too() {
    let dir = cli_support::temp_dir("vvm-log-json");
    // A file that is not a database: the store cannot be opened, a problem (exit 1).
    std::fs::write(dir.join("vvm.sqlite"), [0x5a_u8; 4096]).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-format", "json", "run", "--store"])
        .arg(format!("sqlite:{}", dir.join("vvm.sqlite").display()))
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    let last = lines.last().unwrap_or_else(|| panic!("no line: {stderr}"));
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["target"], "vvm", "{stderr}");
    assert!(last["fields"]["message"].is_string(), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Logging
#[test]
fn rust_log_replaces_the_log_level() {
    // Without RUST_LOG, --log-level (here the default, info) shows info lines…
    let stderr = lead_and_stop(&[], &[]);
    assert!(stderr.contains("leadership acquired"), "{stderr}");
    // …which RUST_LOG=warn hides, also over an explicit --log-level.
    let stderr = lead_and_stop(&["--log-level", "debug"], &[("RUST_LOG", "warn")]);
    assert!(!stderr.contains("INFO"), "{stderr}");
    assert!(!stderr.contains("DEBUG"), "{stderr}");
    assert!(!stderr.contains("leadership acquired"), "{stderr}");
    // Directives per target: only the runtime's debug lines.
    let stderr = lead_and_stop(&[], &[("RUST_LOG", "off,vvm_runtime=debug")]);
    assert!(
        stderr.contains("lease renewed") || stderr.contains("transition"),
        "{stderr}"
    );
    assert!(!stderr.contains("campaigning for a slot"), "{stderr}");
    // A filter that does not parse is a usage error.
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", "memory:"])
        .env("RUST_LOG", "vvm=loud")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("RUST_LOG"));
}

// covers: Cli.Logging
#[test]
fn no_colour_on_a_pipe() {
    let stderr = lead_and_stop(&[], &[]);
    assert!(stderr.contains("leadership acquired"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "escape sequences on a pipe: {stderr:?}"
    );
}
