//! Command-line conventions of the host binary: every flag also from an environment variable,
//! bare `vvm` prints the help as a usage error, and `--help` carries the exit-code table.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{signal_and_wait, temp_dir};
use rustix::process::Signal;

/// `vvm args…` with only `env` among the `VVM_*` variables (none inherited from the test's
/// environment).
fn vvm_with_env(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vvm"));
    for (name, _) in std::env::vars() {
        if name.starts_with("VVM_") {
            command.env_remove(name);
        }
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

fn output(args: &[&str], env: &[(&str, &str)]) -> Output {
    vvm_with_env(args, env)
        .output()
        .expect("the vvm binary runs")
}

/// The options listed by `vvm <command> -h`: each line that starts with `--name` or `-x,`.
fn option_lines(help: &str) -> Vec<(String, String)> {
    let mut options = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('-') {
            options.extend(current.take());
            let flag = trimmed
                .split_whitespace()
                .find(|w| w.starts_with("--"))
                .unwrap_or_default()
                .trim_end_matches(',')
                .to_owned();
            current = Some((flag, trimmed.to_owned()));
        } else if let Some((_, text)) = current.as_mut() {
            if trimmed.is_empty() {
                options.extend(current.take());
            } else {
                // A wrapped description.
                text.push(' ');
                text.push_str(trimmed);
            }
        }
    }
    options.extend(current);
    options
}

// covers: Cli.Env
#[test]
fn every_flag_names_its_environment_variable() {
    for command in ["run", "status", "demo"] {
        // The summary (`-h`): one block per option, no blank lines inside.
        let help = output(&[command, "-h"], &[]);
        assert_eq!(help.status.code(), Some(0));
        let help = String::from_utf8_lossy(&help.stdout);
        let options = option_lines(&help);
        assert!(options.len() > 2, "no options found in:\n{help}");
        for (flag, text) in options {
            if flag == "--help" || flag == "--version" {
                continue;
            }
            assert!(
                text.contains("[env: VVM_"),
                "`vvm {command}`: {flag} has no environment variable: {text}"
            );
        }
    }
}

// covers: Cli.Env
#[test]
fn flags_come_from_the_environment_and_the_command_line_wins() {
    let dir = temp_dir("vvm-cli-env");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    // `VVM_LEASE=1s` alone is refused (shorter than the minimum); the flag overrides it.
    let env = [
        ("VVM_STORE", store.as_str()),
        ("VVM_ADDRESS", "from-env"),
        ("VVM_LEASE", "1s"),
        ("VVM_LOG_LEVEL", "warn"),
    ];
    let refused = output(&["run"], &env);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let mut child = vvm_with_env(&["run", "--lease", "2s"], &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.contains("address=from-env"), "{first}");

    // `status` reads the same store from the environment.
    let status = output(&["status"], &[("VVM_STORE", &store)]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("from-env"), "{table}");

    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(30));
    assert_eq!(code, Some(0));

    // A bad value from the environment is a usage error like a bad flag.
    let bad = output(&["status"], &[("VVM_SLOTS", "many")]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Help
#[test]
fn bare_vvm_prints_the_help_on_stderr_with_exit_code_2() {
    let bare = output(&[], &[]);
    let stderr = String::from_utf8_lossy(&bare.stderr);
    assert_eq!(bare.status.code(), Some(2), "{stderr}");
    assert!(bare.stdout.is_empty());
    for part in ["Usage: vvm", "Commands:", "run", "status", "Exit codes:"] {
        assert!(stderr.contains(part), "{part} missing from:\n{stderr}");
    }
}

// covers: Cli.Help
#[test]
fn help_lists_the_exit_codes() {
    let codes = [
        "0   clean shutdown".to_owned(),
        "1   a problem".to_owned(),
        "2   usage error".to_owned(),
        format!("{}  ended by the killer", vvm::KILL_EXIT_CODE),
    ];
    for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
        let help = output(args, &[]);
        assert_eq!(help.status.code(), Some(0));
        let help = String::from_utf8_lossy(&help.stdout);
        let table = help
            .split_once("Exit codes:")
            .unwrap_or_else(|| panic!("`vvm {args:?}` has no exit codes:\n{help}"))
            .1;
        for code in &codes {
            assert!(
                table
                    .lines()
                    .any(|l| l.trim_start().starts_with(code.as_str())),
                "`vvm {args:?}` lacks `{code}`:\n{help}"
            );
        }
    }
}
