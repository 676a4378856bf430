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

/// The cgroup v2 directory this test process is in (the supervisors of the `vvm` it starts
/// sweep leftovers there): `None` when there is no cgroup2 file system.
fn own_cgroup() -> Option<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        after
            .starts_with("cgroup2 ")
            .then(|| before.split_whitespace().nth(4).map(str::to_owned))?
    })?;
    let path = cli_support::tree::cgroup_of(std::process::id())?;
    Some(std::path::Path::new(&mount).join(path.trim_start_matches('/')))
}

/// A pid no process has now (a child that has been reaped).
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    child.id()
}

// covers: Cli.SupervisorLines
/// The supervisor as a person and a log collector meet it: `ps` shows it as `vvm-supervisor`
/// (was: `exe`, `/proc/self/exe __exec-guard`); under `--log-format json` its lines are JSON
/// (was: plain `vvm: supervisor: …`); an orphaned tree it ends is named with its processes
/// (was: "ended 1 process tree(s)"), and an empty leftover directory is removed without a word.
#[test]
fn the_supervisor_has_a_name_speaks_json_and_names_what_it_ends() {
    let test = "the_supervisor_has_a_name_speaks_json_and_names_what_it_ends";
    let origin = own_cgroup();
    let (empty, orphan) = (dead_pid(), dead_pid());
    let empty_dir = origin
        .as_ref()
        .map(|origin| origin.join(format!("vvm-tree-{empty}-1")));
    let made = empty_dir
        .as_ref()
        .is_some_and(|dir| std::fs::create_dir(dir).is_ok());
    if !made {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: no cgroup can be made here under CI"
        );
        eprintln!("{test}: skipped: no cgroup can be made here");
        return;
    }
    let origin = origin.unwrap();
    let orphan_dir = origin.join(format!("vvm-tree-{orphan}-1"));
    std::fs::create_dir(&orphan_dir).unwrap();
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    std::fs::write(orphan_dir.join("cgroup.procs"), sleeper.id().to_string()).unwrap();

    let dir = cli_support::temp_dir("vvm-sup-log");
    let started = dir.join("started");
    let mut vvm = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-format", "json", "--log-level", "warn"])
        .args(["run", "--store", "memory:", "--lease", "2s", "--"])
        .args([
            "sh",
            "-c",
            &format!("touch {}; exec sleep 30", started.display()),
        ])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = cli_support::drain(vvm.stderr.take().unwrap());
    let until = std::time::Instant::now() + WAIT_MAX;
    while !started.exists() {
        assert!(
            std::time::Instant::now() < until,
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let supervisor = cli_support::tree::supervisor_of(&vvm).as_raw_pid();
    let comm = std::fs::read_to_string(format!("/proc/{supervisor}/comm")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{supervisor}/cmdline")).unwrap();
    assert_eq!(signal_and_wait(&mut vvm, Signal::TERM, WAIT_MAX), Some(0));
    let stderr = stderr.join().unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let _ = std::fs::remove_dir(&orphan_dir);
    let _ = std::fs::remove_dir(empty_dir.as_ref().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();

    assert_eq!(comm.trim(), "vvm-supervisor");
    assert!(
        cmdline.starts_with(b"vvm-supervisor\0"),
        "{}",
        String::from_utf8_lossy(&cmdline)
    );
    for line in stderr.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(line).is_ok(),
            "not JSON: {line}"
        );
    }
    let named = format!("vvm-tree-{orphan}-1 (sleep {})", sleeper.id());
    assert!(
        stderr
            .lines()
            .any(|line| line.contains(&named) && line.contains("\"WARN\"")),
        "no line names the orphaned tree {named}:\n{stderr}"
    );
    assert!(
        !stderr.contains(&format!("vvm-tree-{empty}-1")),
        "the empty leftover was reported:\n{stderr}"
    );
    assert!(
        !stderr.contains("process tree(s)"),
        "an unnamed count of trees:\n{stderr}"
    );
}

// covers: Cli.ExampleColour
/// The `embed` example writes plain text into a pipe (was: ANSI colour codes).
#[test]
fn the_embed_example_writes_no_colour_into_a_pipe() {
    // `target/debug/deps/<this test>` → `target/debug/examples/embed`, which `cargo test` builds.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(std::path::Path::parent)
        .unwrap()
        .join("examples")
        .join("embed");
    assert!(
        example.exists(),
        "{} is not built: `cargo test` builds the examples, or `cargo build --example embed`",
        example.display()
    );
    let mut child = Command::new(&example)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").unwrap();
    let _ = signal_and_wait(&mut child, Signal::INT, WAIT_MAX);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    for line in std::iter::once(&first).chain(&rest) {
        assert!(
            !line.contains('\u{1b}'),
            "a colour code in a pipe: {line:?}"
        );
    }
}
