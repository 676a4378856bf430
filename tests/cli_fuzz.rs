//! Hostile store URLs and random argument lists through the real binary, as property tests with
//! a fixed budget: whatever is given, `vvm` never panics and never hangs; it answers a usage
//! error with exit 2 and one line (or the help), a store that fails with exit 1 and one line,
//! passes on the status of a command it runs (`run -- CMD`), and a command that runs on stops at
//! SIGTERM.

mod cli_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use proptest::prelude::*;
use rustix::process::Signal;

/// Cases per property: a few seconds of the test command in all.
const CASES: u32 = 48;

/// How long a command may run before it is taken for one that runs on (a leader) and stopped.
const RUNNING_AFTER: Duration = Duration::from_secs(3);

/// How long a stopped command may take to end.
const STOP_LIMIT: Duration = Duration::from_secs(20);

/// Runs `vvm args` in `dir` (its home, state directory and working directory, with no `VVM_`
/// variable from outside) and checks the answer; `Err` says what was wrong.
fn check(dir: &Path, args: &[String]) -> Result<(), String> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vvm"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("VVM_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .env("XDG_STATE_HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
        text
    });
    let code = match cli_support::exit_within(&mut child, RUNNING_AFTER) {
        Some(code) => code,
        None => {
            // Running on (it leads, or waits for a slot): SIGTERM must end it cleanly.
            cli_support::signal(&child, Signal::TERM);
            match cli_support::exit_within(&mut child, STOP_LIMIT) {
                Some(code) => {
                    let stderr = reader.join().unwrap_or_default();
                    return match code {
                        Some(0 | 1) => Ok(()),
                        other => Err(format!("{args:?}: stopped with {other:?}:\n{stderr}")),
                    };
                }
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{args:?}: did not end at SIGTERM"));
                }
            }
        }
    };
    let stderr = reader.join().unwrap_or_default();
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
        return Err(format!("{args:?}: panicked:\n{stderr}"));
    }
    // Error lines start with `vvm: `; log lines (warnings) may come before one.
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("vvm: ")).collect();
    // `run … -- CMD`: the command's own status is passed on (126 and 127 when it cannot be run
    // or is not found, with one line saying so).
    let runs_command =
        args.first().is_some_and(|first| first == "run") && args.iter().any(|arg| arg == "--");
    match code {
        Some(0) => Ok(()),
        Some(2) if stderr.contains("Usage:") || errors.len() == 1 => Ok(()),
        Some(126 | 127) if runs_command && errors.len() == 1 => Ok(()),
        Some(_) if runs_command && errors.len() <= 1 => Ok(()),
        Some(1) if errors.len() == 1 => Ok(()),
        other => Err(format!("{args:?}: exit {other:?}, stderr:\n{stderr}")),
    }
}

/// Store URLs as someone might type them by mistake, or craft them: known and unknown schemes,
/// empty and odd paths, parameters of every store with random values, percent signs, ports
/// out of range. etcd endpoints are on loopback's closed port 9, so nothing waits on a network.
fn hostile_url() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "sqlite:",
        "sqlite://",
        "sqlite:///",
        "SQLITE:",
        "etcd://127.0.0.1:9/",
        "etcd://127.0.0.1:99999/",
        "etcd://[::1]:9/",
        "etcd://",
        "fdb:",
        "memory:",
        "memory:x",
        "postgres://",
        "",
        "://",
    ]);
    let path = prop::sample::select(vec![
        "",
        ".",
        "/",
        "x.db",
        "dir/x.db",
        "../x.db",
        "%00",
        "a b",
        "/dev/null",
        "/proc/self/mem",
        "\u{1F600}.db",
        "x.db#frag",
    ]);
    let parameter = prop::sample::select(vec![
        "busy-wait-ms",
        "shared-group",
        "prefix",
        "user",
        "password",
        "password-file",
        "ca",
        "cert",
        "key",
        "connect-timeout-ms",
        "request-timeout-ms",
        "domain",
        "unknown",
        "",
    ]);
    let value = prop::sample::select(vec![
        "",
        "0",
        "1",
        "true",
        "maybe",
        "-1",
        "99999999999999999999",
        "%",
        "%2F",
        "a/b",
        "/dev/zero",
        "x=y",
        "&",
    ]);
    (
        scheme,
        path,
        prop::collection::vec((parameter, value), 0..4),
        prop::option::of("[ -~]{0,12}"),
    )
        .prop_map(|(scheme, path, parameters, tail)| {
            let mut url = format!("{scheme}{path}");
            for (index, (name, value)) in parameters.iter().enumerate() {
                url.push(if index == 0 { '?' } else { '&' });
                url.push_str(&format!("{name}={value}"));
            }
            url.push_str(tail.as_deref().unwrap_or_default());
            url
        })
}

/// Argument lists: a subcommand (or none, or a wrong one) and flags and values of every kind,
/// in any order. `demo` is left out: it runs a whole scenario of its own.
fn argument_list() -> impl Strategy<Value = Vec<String>> {
    let first = prop::sample::select(vec![
        "run",
        "status",
        "semaphore",
        "completions",
        "man",
        "help",
        "--help",
        "--version",
        "bogus",
        "",
    ]);
    let token = prop::sample::select(vec![
        "--store",
        "etcd://127.0.0.1:9/",
        "sqlite:",
        "sqlite://",
        "sqlite:s.db",
        "bogus:",
        "--slots",
        "0",
        "1",
        "4294967296",
        "-n",
        "--lease",
        "1ms",
        "2s",
        "30days",
        "--acquire",
        "forever",
        "0s",
        "--address",
        "",
        "--json",
        "--watch",
        "--grace",
        "--round",
        "create",
        "describe",
        "delete",
        "--force",
        "--limit",
        "--data",
        "bash",
        "--log-level",
        "trace",
        "--log-format",
        "json",
        "--",
        "true",
        "false",
        "sh",
        "-c",
        "exit 3",
        "--metrics-addr",
        "127.0.0.1:0",
        "--containment",
        "\u{00e9}",
    ]);
    (first, prop::collection::vec(token, 0..7)).prop_map(|(first, rest)| {
        std::iter::once(first)
            .filter(|first| !first.is_empty())
            .chain(rest)
            .map(str::to_owned)
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    // covers: Cli.Fuzz
    #[test]
    fn hostile_store_urls_get_one_line_and_an_exit_code(url in hostile_url()) {
        let dir = cli_support::temp_dir("vvm-fuzz-url");
        let outcome = check(&dir, &["status".to_owned(), "--store".to_owned(), url]);
        let _ = std::fs::remove_dir_all(&dir);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }

    // covers: Cli.Fuzz
    #[test]
    fn random_argument_lists_get_one_line_and_an_exit_code(args in argument_list()) {
        let dir = cli_support::temp_dir("vvm-fuzz-args");
        let outcome = check(&dir, &args);
        let _ = std::fs::remove_dir_all(&dir);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    }
}

// covers: Cli.Fuzz
#[test]
fn a_sqlite_url_without_a_path_is_a_usage_error() {
    for url in ["sqlite:", "sqlite://", "sqlite://?busy-wait-ms=5"] {
        for command in ["status", "run"] {
            let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
                .args([command, "--store", url])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{command} {url}: {stderr}");
            assert!(
                stderr.contains("needs a file path"),
                "{command} {url}: {stderr}"
            );
            assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        }
    }
}
