//! Command-line conventions of the host binary: every flag also from an environment variable,
//! bare `vvm` prints the help as a usage error, and `--help` carries the exit-code table.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{signal_and_wait, temp_dir};
use rustix::process::{Pid, Signal};

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
        format!("{}  ended by the killer", vvm::killer::KILL_EXIT_CODE),
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

/// `vvm args…` with `HOME` set to `home` and no `XDG_STATE_HOME` (see [`vvm_with_env`]).
fn vvm_at_home(args: &[&str], home: &std::path::Path, env: &[(&str, &str)]) -> Command {
    let mut command = vvm_with_env(args, env);
    command.env("HOME", home).env_remove("XDG_STATE_HOME");
    command
}

/// The lines of a child's standard error, read on a thread of their own.
fn stderr_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
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

/// Waits for a line containing `text`; all lines read so far, joined.
fn wait_line(lines: &std::sync::mpsc::Receiver<String>, text: &str) -> String {
    wait_line_any(lines, &[text])
}

/// Waits for a line containing one of `texts`; all lines read so far, joined.
fn wait_line_any(lines: &std::sync::mpsc::Receiver<String>, texts: &[&str]) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    loop {
        match lines.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if texts.iter().any(|text| line.contains(text)) {
                    return seen;
                }
            }
            Err(_) => panic!("no line with {texts:?} in:\n{seen}"),
        }
    }
}

// covers: Cli.DefaultStore, Cli.WaitingLog
#[test]
fn two_runs_from_two_directories_meet_on_the_users_store_and_the_standby_says_what_it_waits_for() {
    let home = temp_dir("vvm-cli-home");
    let (here, there) = (home.join("here"), home.join("there"));
    std::fs::create_dir_all(&here).unwrap();
    std::fs::create_dir_all(&there).unwrap();
    let store = home.join(".local/state/vvm/vvm.sqlite");
    let env = [("VVM_LEASE", "2s"), ("VVM_ROUND", "100ms")];

    let mut first = vvm_at_home(&["run", "--address", "first"], &home, &env)
        .current_dir(&here)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first_lines = stderr_lines(&mut first);
    let head = wait_line(&first_lines, "leadership acquired");
    // The first line says where.
    let opening = head.lines().next().unwrap_or_default();
    assert!(
        opening.contains(&format!("store=sqlite:{}", store.display())),
        "{head}"
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(store.parent().unwrap())
            .unwrap()
            .permissions(),
    );
    assert_eq!(
        mode & 0o777,
        0o700,
        "the store's directory is open to others"
    );

    let mut second = vvm_at_home(&["run", "--address", "second"], &home, &env)
        .current_dir(&there)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let second_lines = stderr_lines(&mut second);
    let waiting = wait_line(&second_lines, "waiting: the slot is held");
    let line = waiting.lines().last().unwrap_or_default();
    for part in ["slot=1", "holder=first", "fencing_token=1:", "left="] {
        assert!(line.contains(part), "{part} missing: {line}");
    }
    assert!(!waiting.contains("leadership acquired"), "{waiting}");
    assert!(!here.join("vvm.sqlite").exists() && !there.join("vvm.sqlite").exists());

    // A candidate that never held a slot does not speak of a release.
    assert_eq!(
        signal_and_wait(&mut second, Signal::TERM, Duration::from_secs(30)),
        Some(0)
    );
    // Every line, up to the end of the stream (the reader thread may lag behind the exit).
    let mut rest = String::new();
    while let Ok(line) = second_lines.recv_timeout(Duration::from_secs(30)) {
        rest.push_str(&line);
        rest.push('\n');
    }
    assert!(
        rest.contains("stopped campaigning: no slot was held"),
        "{rest}"
    );
    assert!(!rest.contains("released"), "{rest}");
    assert_eq!(
        signal_and_wait(&mut first, Signal::TERM, Duration::from_secs(30)),
        Some(0)
    );

    // XDG_STATE_HOME, when absolute, is where the default store lives.
    let state = home.join("state");
    let status = vvm_with_env(&["status"], &[])
        .env("HOME", &home)
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(
        stderr.contains(&state.join("vvm/vvm.sqlite").display().to_string()),
        "{stderr}"
    );
    // Neither set: no default, one line.
    let none = vvm_with_env(&["status"], &[])
        .env_remove("HOME")
        .env_remove("XDG_STATE_HOME")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&none.stderr);
    assert_eq!(none.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("give --store"), "{stderr}");
    std::fs::remove_dir_all(&home).unwrap();
}

/// Arguments, environment, and the parts the one-line error must contain.
type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);

// covers: Cli.Messages
#[test]
fn errors_name_the_flag_or_the_variable_and_booleans_take_the_usual_spellings() {
    // Booleans from the environment.
    for (value, json) in [
        ("1", true),
        ("yes", true),
        ("on", true),
        ("true", true),
        ("0", false),
        ("no", false),
        ("off", false),
    ] {
        let out = output(
            &["status", "--store", "memory:"],
            &[("VVM_STATUS_JSON", value)],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "VVM_STATUS_JSON={value}");
        assert_eq!(
            stdout.starts_with('{'),
            json,
            "VVM_STATUS_JSON={value}: {stdout}"
        );
    }
    let cases: [Case<'_>; 5] = [
        (
            &["status", "--store", "memory:"],
            &[("VVM_STATUS_JSON", "maybe")],
            &[
                "VVM_STATUS_JSON",
                "--json",
                "1/0",
                "fix or unset VVM_STATUS_JSON",
            ],
        ),
        (
            &["run", "--store", "memory:"],
            &[("VVM_LEASE", "3x")],
            &["VVM_LEASE", "--lease", "not a duration"],
        ),
        (
            &["run", "--store", "memory:"],
            &[("VVM_LEASE", "30d")],
            &["VVM_LEASE (for --lease): 30days is longer than the maximum of 1day"],
        ),
        (
            &["run", "--store", "memory:", "--lease", "30d"],
            &[("VVM_LEASE", "30d")],
            &[
                "--lease: 30days is longer than the maximum of 1day",
                "give a lease between",
            ],
        ),
        (
            &["run", "--store", "sqlite:/no/such/dir/vvm.sqlite"],
            &[],
            &["/no/such/dir does not exist; create the directory"],
        ),
    ];
    for (args, env, parts) in cases {
        let out = output(args, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        for part in parts {
            assert!(stderr.contains(part), "{part:?} missing: {stderr}");
        }
    }
    // Help: at most 100 columns, logging flags apart, no test-only flag.
    for command in ["run", "status", "demo"] {
        for flag in ["-h", "--help"] {
            let help = output(&[command, flag], &[]);
            let help = String::from_utf8_lossy(&help.stdout);
            for line in help.lines() {
                assert!(
                    line.chars().count() <= 100,
                    "`vvm {command} {flag}`: {line}"
                );
            }
            assert!(help.contains("Logging:"), "{help}");
            assert!(!help.contains("--acting-log"), "{help}");
        }
    }
}

// covers: Cli.Messages
#[test]
fn a_failing_command_is_logged_without_debug_text() {
    let dir = temp_dir("vvm-cli-debug");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let out = output(
        &[
            "run", "--store", &store, "--lease", "2s", "--", "sh", "-c", "exit 3",
        ],
        &[("VVM_LOG_LEVEL", "info")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    for debug in ["Err(", "Ok(", " { ", "ServiceFailed"] {
        assert!(!stderr.contains(debug), "{debug:?} in:\n{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Completions
#[test]
fn completions_and_the_manual_page_cover_the_visible_commands_only() {
    for shell in ["bash", "zsh", "fish"] {
        let out = output(&["completions", shell], &[]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        // fish names long flags without their dashes (`-l store`).
        for part in ["store", "lease", "status", "run"] {
            assert!(script.contains(part), "{shell}: {part} missing");
        }
        assert!(
            !script.contains("exec-guard"),
            "{shell}: the hidden mode is listed"
        );
    }
    let out = output(&["man"], &[]);
    let page = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(page.contains(".TH vvm 1"), "{page}");
    for part in [
        "vvm\\-run",
        "vvm\\-status",
        "\\-\\-store",
        "\\-\\-grace",
        "Exit codes",
    ] {
        assert!(page.contains(part), "{part} missing from the manual page");
    }
    assert!(!page.contains("exec-guard") && !page.contains("exec\\-guard"));
    // Short flags of the common options.
    let out = output(&["status", "-s", "memory:", "-n", "2"], &[]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert_eq!(table.lines().count(), 3, "{table}");
}

/// The lines of the first `sh` block after `heading` in README.md.
fn readme_block(heading: &str) -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let after = readme
        .split_once(heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a sh block")
        .0;
    block.lines().map(str::to_owned).collect()
}

/// `line` run by `sh` exactly as written, with this build's `vvm` first on `PATH`, in a process
/// group of its own (a terminal's Ctrl-C reaches the whole group).
fn run_line(line: &str, dir: &std::path::Path, home: &std::path::Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_vvm"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("sh");
    for (name, _) in std::env::vars() {
        if name.starts_with("VVM_") {
            command.env_remove(name);
        }
    }
    command
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .env("VVM_LOG_LEVEL", "info")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Ctrl-C on the line `child` runs: SIGINT to its `vvm`, as a terminal sends it to the job an
/// interactive shell started (here `sh -c` stands between, which a terminal's job has not).
fn interrupt(child: &std::process::Child) {
    let pid = child.id();
    let comm = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let target = if comm(&pid.to_string()).trim() == "vvm" {
        pid.to_string()
    } else {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
        children
            .split_whitespace()
            .find(|child| comm(child).trim() == "vvm")
            .unwrap_or_else(|| panic!("no vvm under sh {pid}: {children}"))
            .to_owned()
    };
    let target = Pid::from_raw(target.parse().unwrap()).unwrap();
    rustix::process::kill_process(target, Signal::INT).unwrap();
}

/// Waits up to 30 s for `path` and returns its text.
fn wait_file(path: &std::path::Path) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if !text.is_empty() {
                return text;
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "{} never came",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// covers: Cli.Readme
#[test]
fn the_readme_use_block_runs_as_written() {
    let lines = readme_block("## Use it");
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].starts_with("cargo install --path . --features cli"),
        "{lines:?}"
    );
    // The first screen: the block comes before line 30.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let at = readme.lines().position(|l| l == "## Use it").unwrap();
    assert!(at < 30, "the use block starts at line {at}");

    let home = temp_dir("vvm-readme");
    let (one, two) = (home.join("one"), home.join("two"));
    for dir in [&one, &two] {
        std::fs::create_dir_all(dir).unwrap();
        // `./worker --flag`: writes its token, then works until SIGTERM.
        let worker = dir.join("worker");
        std::fs::write(
            &worker,
            "#!/bin/sh\n[ \"$1\" = --flag ] || exit 9\necho \"$VVM_FENCING_TOKEN\" > token.tmp && mv token.tmp token\nwhile :; do sleep 0.05; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&worker, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let mut first = run_line(&lines[1], &one, &home);
    let first_token: vvm::FencingToken = wait_file(&one.join("token")).trim().parse().unwrap();
    let mut second = run_line(&lines[2], &two, &home);
    let mut watch = run_line(&lines[3], &home, &home);
    let watch_lines = {
        let (sender, receiver) = std::sync::mpsc::channel();
        let stdout = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        receiver
    };
    let table = wait_line(&watch_lines, "slot");
    assert!(table.contains("holder"), "{table}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !two.join("token").exists(),
        "terminal 2 started its worker while 1 led"
    );

    // Ctrl-C in terminal 1: terminal 2 takes over.
    interrupt(&first);
    assert_interrupted(&mut first);
    let second_token: vvm::FencingToken = wait_file(&two.join("token")).trim().parse().unwrap();
    assert!(second_token > first_token);
    // A release and the take that follows within milliseconds, or both between two looks.
    let changes = wait_line_any(&watch_lines, &[" taken ", " passed-on "]);
    assert!(
        changes.contains(" released ") || changes.contains(" passed-on "),
        "{changes}"
    );

    interrupt(&second);
    assert_interrupted(&mut second);
    interrupt(&watch);
    assert_eq!(exit_of(&mut watch), Some(0));
    std::fs::remove_dir_all(&home).unwrap();
}

/// Waits up to 30 s for `child` to exit; its code.
fn exit_of(child: &mut std::process::Child) -> Option<i32> {
    status_of(child).code()
}

/// A `vvm run` that Ctrl-C stopped ended by SIGINT, as any program would (or `sh -c`, between,
/// said so with 130).
fn assert_interrupted(child: &mut std::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    let status = status_of(child);
    assert!(
        status.signal() == Some(2) || status.code() == Some(130),
        "not ended by SIGINT: {status:?}"
    );
}

/// Waits up to 30 s for `child` to exit; its status.
fn status_of(child: &mut std::process::Child) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            panic!("no exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The lines of `child`'s standard output, read on a thread of their own.
fn stdout_lines(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

// covers: Cli.Readme
#[test]
fn the_readme_try_it_by_hand_block_runs_as_written() {
    let lines = readme_block("## Try it by hand");
    assert_eq!(lines.len(), 4, "{lines:?}");
    let home = temp_dir("vvm-readme-hand");
    let mut one = run_line(&lines[0], &home, &home);
    let one_out = stdout_lines(&mut one);
    let first = wait_line(&one_out, "leading slot=1");
    assert!(first.contains("address=a"), "{first}");
    let mut two = run_line(&lines[1], &home, &home);
    let two_out = stdout_lines(&mut two);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        two_out.try_recv().is_err(),
        "terminal 2 leads beside terminal 1"
    );

    // `vvm status`: who holds slot 1, its revision, time left.
    let mut status = run_line(&lines[2], &home, &home);
    let table = wait_line(&stdout_lines(&mut status), "1 ");
    assert!(table.contains(" a "), "{table}");
    assert_eq!(exit_of(&mut status), Some(0));

    // `vvm status --watch --json`: the table, then one JSON line per change.
    let mut watch = run_line(&lines[3], &home, &home);
    let watch_out = stdout_lines(&mut watch);
    let table = wait_line(&watch_out, "slots");
    assert!(table.contains("\"address\":\"a\""), "{table}");

    interrupt(&one);
    assert_interrupted(&mut one);
    let second = wait_line(&two_out, "leading slot=1");
    assert!(second.contains("address=b"), "{second}");
    let changes = wait_line_any(&watch_out, &["\"taken\"", "\"passed-on\""]);
    assert!(
        changes.contains("\"released\"") || changes.contains("\"passed-on\""),
        "{changes}"
    );
    assert!(changes.contains("\"address\":\"b\""), "{changes}");
    interrupt(&two);
    assert_interrupted(&mut two);
    interrupt(&watch);
    assert_eq!(exit_of(&mut watch), Some(0));
    std::fs::remove_dir_all(&home).unwrap();
}
