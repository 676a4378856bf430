//! `vvm run` the way a shell script uses `flock`, `etcdctl lock` or `consul lock`: try once and
//! say "busy" with a code of the script's choosing, stop the calling script on Ctrl-C, hold a
//! slot around several commands. Every check is an exit status or a line, as a script sees it.

mod cli_support;

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cli_support::{exit_within, leading_child, signal_and_wait, temp_dir, vvm_within};
use rustix::process::{kill_process_group, Pid, Signal};

/// A child that is killed when the test ends, also by a failed assertion: a holder must not
/// outlive its test.
struct Killed(Child);

impl std::ops::Deref for Killed {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Killed {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Longest any one `vvm` of these tests may take.
const WAIT: Duration = Duration::from_secs(20);

/// `vvm` with `args` on `store`, lease 2 s, warnings only: exit code and standard error.
fn vvm(store: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec![
        "--log-level",
        "warn",
        "run",
        "--store",
        store,
        "--lease",
        "2s",
    ];
    all.extend_from_slice(args);
    vvm_within(&all, WAIT, "vvm run")
}

/// A `sh -c` command line that writes `ran` into `dir`.
fn mark(dir: &Path) -> String {
    format!("echo ran > {}/ran", dir.display())
}

/// A `vvm run --semaphore NAME` holder (the demo service), once it holds.
fn semaphore_holder(store: &str, name: &str) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", store])
        .args(["--lease", "2s", "--semaphore", name])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the vvm binary runs");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=0 "), "{first}");
    child
}

// covers: Cli.TryOnce
/// `--acquire 0` tries once (was: "must be above zero", exit 2); a slot or units held by someone
/// else end it with the busy code, 3 by default or `--busy-code N` (was: exit 1, as for a store
/// that fails), and the command never runs.
#[test]
fn try_once_exits_with_the_busy_code_the_script_chose() {
    let dir = temp_dir("vvm-try");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mark = mark(&dir);
    let mut holder = Killed(leading_child(&store, "holder", Stdio::null()));

    let (code, _, stderr) = vvm(&store, &["--acquire", "0", "--", "sh", "-c", &mark]);
    assert_eq!(code, Some(3), "try once, slot held: {stderr}");
    assert!(stderr.contains("held by holder"), "{stderr}");
    let (code, _, stderr) = vvm(
        &store,
        &[
            "--acquire",
            "0",
            "--busy-code",
            "75",
            "--",
            "sh",
            "-c",
            &mark,
        ],
    );
    assert_eq!(code, Some(75), "--busy-code 75: {stderr}");
    let (code, _, stderr) = vvm(&store, &["--acquire", "300ms", "--", "sh", "-c", &mark]);
    assert_eq!(code, Some(3), "a window that ends while held: {stderr}");
    assert!(!dir.join("ran").exists(), "the command ran while busy");

    assert_eq!(signal_and_wait(&mut holder, Signal::TERM, WAIT), Some(0));
    let (code, _, stderr) = vvm(&store, &["--acquire", "0", "--", "sh", "-c", &mark]);
    assert_eq!(code, Some(0), "try once, slot free: {stderr}");
    assert!(dir.join("ran").exists(), "the command did not run");

    // The same for units of a semaphore.
    let (code, _, stderr) = vvm_within(
        &[
            "semaphore",
            "--store",
            &store,
            "create",
            "one",
            "--limit",
            "1",
        ],
        WAIT,
        "create",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let mut holder = Killed(semaphore_holder(&store, "one"));
    let (code, _, stderr) = vvm(
        &store,
        &["--semaphore", "one", "--acquire", "0", "--", "true"],
    );
    assert_eq!(code, Some(3), "try once, units held: {stderr}");
    assert!(
        stderr.contains("1 unit of semaphore one was not granted"),
        "{stderr}"
    );
    assert_eq!(signal_and_wait(&mut holder, Signal::TERM, WAIT), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bash -c LINE` in a process group of its own, as a terminal's job: Ctrl-C is SIGINT to the
/// whole group. With SIGINT's default action, as in a terminal: a test run started in the
/// background of a non-interactive shell inherits SIGINT ignored, and a bash that cannot be
/// interrupted itself goes on after a child that Ctrl-C ended.
fn script(line: &str) -> Child {
    Command::new("env")
        .args(["--default-signal=INT", "bash", "-c", line])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("bash runs")
}

/// Ctrl-C on `child`'s group; the script's status and standard output.
fn ctrl_c(mut child: Child) -> (std::process::ExitStatus, String) {
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    kill_process_group(pid, Signal::INT).unwrap();
    if exit_within(&mut child, WAIT).is_none() {
        let _ = child.kill();
        panic!("the script did not end within {WAIT:?} of Ctrl-C");
    }
    let status = child.wait().unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    (status, out)
}

/// The script ended by SIGINT, as bash does when Ctrl-C ended its child, and went no further.
fn assert_script_stopped(what: &str, status: std::process::ExitStatus, out: &str) {
    assert_eq!(
        status.signal(),
        Some(2),
        "{what}: {status:?}, stdout {out:?}"
    );
    assert!(
        !out.contains("CONTINUED"),
        "{what}: the script went on: {out}"
    );
}

/// Waits up to [`WAIT`] for `path` to exist.
fn wait_for(path: &Path) {
    let until = std::time::Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            std::time::Instant::now() < until,
            "{} never came",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// covers: Cli.CtrlC
/// Ctrl-C on a script that waits in `vvm run`, and on one whose command runs: `vvm` ends by
/// SIGINT, so bash stops the script (was: `vvm` exited 0 and the script went on, printing
/// CONTINUED, although the waiting command never ran).
#[test]
fn ctrl_c_stops_the_calling_script() {
    let dir = temp_dir("vvm-ctrlc");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let vvm = env!("CARGO_BIN_EXE_vvm");
    let mut holder = Killed(leading_child(&store, "holder", Stdio::null()));

    // Waiting: the command never runs.
    let waiting = script(&format!(
        "{vvm} --log-level warn run --store {store} --lease 2s -- true; echo CONTINUED $?"
    ));
    std::thread::sleep(Duration::from_millis(800));
    let (status, out) = ctrl_c(waiting);
    assert_script_stopped("waiting", status, &out);

    // Holding: the command runs, and is stopped gracefully.
    assert_eq!(signal_and_wait(&mut holder, Signal::TERM, WAIT), Some(0));
    let started = dir.join("started");
    let holding = script(&format!(
        "{vvm} --log-level warn run --store {store} --lease 2s -- sh -c 'touch {}; exec sleep 30'; echo CONTINUED $?",
        started.display()
    ));
    wait_for(&started);
    let (status, out) = ctrl_c(holding);
    assert_script_stopped("holding", status, &out);

    // Ctrl-C twice on a command that ignores SIGTERM: the grace is cut short, and the script
    // stops all the same (was: exit 1, and the script went on).
    let stubborn = script(&format!(
        "{vvm} --log-level warn run --store {store} --lease 2s --grace 30s -- sh -c \"trap '' TERM; touch {}; while :; do sleep 0.05; done\"; echo CONTINUED $?",
        dir.join("stubborn").display()
    ));
    wait_for(&dir.join("stubborn"));
    let pid = Pid::from_raw(i32::try_from(stubborn.id()).unwrap()).unwrap();
    kill_process_group(pid, Signal::INT).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let (status, out) = ctrl_c(stubborn);
    assert_script_stopped("twice", status, &out);

    // SIGTERM (a service manager's stop) is still a clean stop.
    let mut waiting = Killed(
        Command::new(vvm)
            .args([
                "--log-level",
                "warn",
                "run",
                "--store",
                &store,
                "--lease",
                "2s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(signal_and_wait(&mut waiting, Signal::TERM, WAIT), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.Hold
/// `vvm run --hold`: no command; one line `VVM_SLOT=1 VVM_FENCING_TOKEN=1:R` once held, then the slot
/// stays held (a try-once elsewhere is busy) until a signal, which releases it at once (was:
/// no such flag, exit 2).
#[test]
fn hold_prints_the_token_and_holds_until_a_signal() {
    let dir = temp_dir("vvm-hold");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut hold = Killed(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["--log-level", "warn", "run", "--store", &store])
            .args(["--lease", "2s", "--hold"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = cli_support::drain(hold.stderr.take().unwrap());
    let mut lines = BufReader::new(hold.stdout.take().unwrap()).lines();
    let first = match lines.next() {
        Some(Ok(line)) => line,
        other => {
            let _ = hold.kill();
            let _ = hold.wait();
            panic!("no token line: {other:?}; {}", stderr.join().unwrap());
        }
    };
    let token = first
        .strip_prefix("VVM_SLOT=1 VVM_FENCING_TOKEN=")
        .unwrap_or_else(|| panic!("{first}"));
    let token: vvm::FencingToken = token.parse().unwrap_or_else(|e| panic!("{e}: {first}"));
    assert_eq!(token.slot, vvm::Slot(1), "{first}");
    std::thread::sleep(Duration::from_millis(300));
    let (code, _, err) = vvm(&store, &["--acquire", "0", "--", "true"]);
    assert_eq!(code, Some(3), "held: {err}");
    assert_eq!(signal_and_wait(&mut hold, Signal::TERM, WAIT), Some(0));
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.is_empty(), "more than the token line: {rest:?}");
    let (code, _, err) = vvm(&store, &["--acquire", "0", "--", "true"]);
    assert_eq!(code, Some(0), "released: {err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.SemaphoreOneStep
/// `vvm run --semaphore NAME --limit N` makes the semaphore when it is missing and says so (was:
/// "does not exist: create it first", exit 1; `--limit` unknown, exit 2); an existing one keeps
/// its limit, with a warning when another was asked. `--ephemeral` makes one that goes with its
/// last holder.
#[test]
fn a_semaphore_is_made_in_one_step() {
    let dir = temp_dir("vvm-sem1");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let info = |args: &[&str]| {
        let mut all = vec!["run", "--store", &store, "--lease", "2s"];
        all.extend_from_slice(args);
        vvm_within(&all, WAIT, "vvm run")
    };
    let (code, _, stderr) = info(&["--semaphore", "pool", "--limit", "2", "--", "true"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("created the semaphore"), "{stderr}");
    let (code, _, stderr) = info(&["--semaphore", "pool", "--limit", "3", "--", "true"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("created the semaphore"), "{stderr}");
    assert!(stderr.contains("exists with another limit"), "{stderr}");
    let describe = |name: &str| {
        vvm_within(
            &["semaphore", "--store", &store, "describe", name],
            WAIT,
            "describe",
        )
    };
    let (code, out, stderr) = describe("pool");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.starts_with("semaphore pool count=0/2 "), "{out}");
    // `vvm semaphore create` again: refused, unless `--if-missing`.
    let create = |extra: &[&str]| {
        let mut all = vec![
            "semaphore",
            "--store",
            &store,
            "create",
            "pool",
            "--limit",
            "2",
        ];
        all.extend_from_slice(extra);
        vvm_within(&all, WAIT, "create").0
    };
    assert_eq!(create(&[]), Some(1));
    assert_eq!(create(&["--if-missing"]), Some(0));

    let mut hold = Killed(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args([
                "--log-level",
                "warn",
                "run",
                "--store",
                &store,
                "--lease",
                "2s",
            ])
            .args(["--semaphore", "web", "--ephemeral", "--hold"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let first = BufReader::new(hold.stdout.take().unwrap())
        .lines()
        .next()
        .expect("a token line")
        .unwrap();
    assert!(
        first.starts_with("VVM_SLOT=0 VVM_FENCING_TOKEN=0:"),
        "{first}"
    );
    let (code, out, stderr) = describe("web");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.contains(" ephemeral "), "{out}");
    assert!(out.contains("count=1/unlimited"), "{out}");
    assert_eq!(signal_and_wait(&mut hold, Signal::TERM, WAIT), Some(0));
    let (code, _, stderr) = describe("web");
    assert_eq!(
        code,
        Some(1),
        "the ephemeral semaphore outlived its holder: {stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Reads `child`'s standard error until a line contains every one of `words`; that line.
fn stderr_line(child: &mut Child, words: &[&str]) -> String {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if words.iter().all(|w| line.contains(w)) => {
                // Keep draining, so that the child never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines.by_ref() {});
                return line;
            }
            Some(Ok(line)) => seen.push_str(&(line + "\n")),
            _ => panic!("no line with {words:?}:\n{seen}"),
        }
    }
}

// covers: Cli.WaitingQueue
/// A `vvm run --semaphore` that waits says its place in the queue and who holds the units (was:
/// only "waiting for units"); `describe` says `timeout_ms=forever` for a waiter that waits as
/// long as it lives (was: 18446744073709551615), and `describe --watch` stamps each snapshot with
/// the time (was: no stamp).
#[test]
fn a_waiting_run_says_where_it_stands() {
    let dir = temp_dir("vvm-queue");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let mut hold = Killed(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args([
                "--log-level",
                "warn",
                "run",
                "--store",
                &store,
                "--lease",
                "2s",
            ])
            .args([
                "--semaphore",
                "q",
                "--limit",
                "1",
                "--hold",
                "--address",
                "first",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(hold.stdout.take().unwrap()).lines();
    let first = out.next().expect("a token line").unwrap();
    assert!(first.starts_with("VVM_SLOT=0 "), "{first}");
    let mut waiter = Killed(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["run", "--store", &store, "--lease", "2s"])
            .args(["--semaphore", "q", "--address", "second", "--", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let line = stderr_line(&mut waiter, &["place=1", "queued=1"]);
    assert!(line.contains("holders=first (1 unit)"), "{line}");

    let (code, text, stderr) = vvm_within(
        &["semaphore", "--store", &store, "describe", "q"],
        WAIT,
        "describe",
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(text.contains("timeout_ms=forever"), "{text}");
    let mut watch = Killed(
        Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["semaphore", "--store", &store, "describe", "q", "--watch"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stamped = BufReader::new(watch.stdout.take().unwrap())
        .lines()
        .next()
        .expect("a snapshot")
        .unwrap();
    let _ = signal_and_wait(&mut watch, Signal::TERM, WAIT);
    let stamp = stamped.split(' ').next().unwrap_or_default();
    assert!(
        humantime::parse_rfc3339(stamp).is_ok() && stamped.contains(" semaphore q "),
        "{stamped}"
    );

    assert_eq!(signal_and_wait(&mut hold, Signal::TERM, WAIT), Some(0));
    assert_eq!(exit_within(&mut waiter, WAIT), Some(Some(0)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `vvm` column of the README's table of shell jobs, in its order.
fn readme_vvm_column() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table: Vec<&str> = readme
        .lines()
        .skip_while(|line| !line.starts_with("| job | flock | etcdctl lock | consul lock | vvm |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .collect();
    table
        .iter()
        .map(|row| {
            let cell = row.trim_end_matches('|').rsplit('|').next().unwrap().trim();
            cell.trim_matches('`').to_owned()
        })
        .collect()
}

/// Runs one line of the table in `bash`, in `dir`, with `vvm` and `cmd` first on the `PATH`:
/// its exit code.
fn run_row(line: &str, dir: &Path, store: &str) -> Option<i32> {
    let path = format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-c", line])
        .current_dir(dir)
        .env("PATH", path)
        .env("VVM_STORE", store)
        .env("VVM_LEASE", "2s")
        .env("VVM_LOG_LEVEL", "error")
        // `cmd` reaches the store through a variable of its own: no `VVM_` one reaches a command.
        .env("STORE", store)
        .env("LOG", dir.join("log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    match exit_within(&mut child, WAIT) {
        Some(code) => code,
        None => {
            let _ = child.kill();
            panic!("`{line}` still runs after {WAIT:?}");
        }
    }
}

/// The lines `cmd` wrote since the last call, emptied.
fn cmd_log(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
    let _ = std::fs::remove_file(dir.join("log"));
    text.lines().map(str::to_owned).collect()
}

/// Waits until slot 1 of `store` is free (a try-once takes it and exits 0).
fn wait_free(store: &str) {
    let until = std::time::Instant::now() + WAIT;
    while vvm(store, &["--acquire", "0", "--", "true"]).0 != Some(0) {
        assert!(std::time::Instant::now() < until, "slot 1 stays held");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// covers: Cli.ScriptTable
/// Every line of the README's `vvm` column runs as written, and does the job its row names:
/// `cmd` writes whether slot 1 was held while it ran (a try-once of its own says busy, 3).
#[test]
fn the_readme_table_of_shell_jobs_runs_as_written() {
    let rows = readme_vvm_column();
    assert_eq!(rows.len(), 5, "{rows:?}");
    let dir = temp_dir("vvm-table");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vvm"), bin.join("vvm")).unwrap();
    let cmd = bin.join("cmd");
    std::fs::write(
        &cmd,
        "#!/bin/sh\nvvm --log-level error run --store \"$STORE\" --lease 2s --acquire 0 -- true\necho \"held=$?\" >> \"$LOG\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&cmd, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());

    // Run `cmd` alone: it ran, holding the slot.
    assert_eq!(run_row(&rows[0], &dir, &store), Some(0), "{}", rows[0]);
    assert_eq!(cmd_log(&dir), ["held=3"], "{}", rows[0]);

    // Try once: busy (75, `cmd` never ran) while another holds the slot, runs once it is free.
    let mut holder = Killed(leading_child(&store, "holder", Stdio::null()));
    assert_eq!(run_row(&rows[1], &dir, &store), Some(75), "{}", rows[1]);
    assert!(cmd_log(&dir).is_empty(), "{}: cmd ran while busy", rows[1]);
    assert_eq!(signal_and_wait(&mut holder, Signal::TERM, WAIT), Some(0));
    assert_eq!(run_row(&rows[1], &dir, &store), Some(0), "{}", rows[1]);
    assert_eq!(cmd_log(&dir), ["held=3"], "{}", rows[1]);

    // Give up after a while: free here, so it runs.
    assert_eq!(run_row(&rows[2], &dir, &store), Some(0), "{}", rows[2]);
    assert_eq!(cmd_log(&dir), ["held=3"], "{}", rows[2]);

    // At most 3 at once: the semaphore is made, with limit 3.
    assert_eq!(run_row(&rows[3], &dir, &store), Some(0), "{}", rows[3]);
    assert_eq!(cmd_log(&dir).len(), 1, "{}", rows[3]);
    let (code, out, err) = vvm_within(
        &["semaphore", "--store", &store, "describe", "L"],
        WAIT,
        "describe",
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("semaphore L count=0/3 "), "{out}");

    // Hold around several commands: both ran while the slot was held, and it is free after.
    assert_eq!(run_row(&rows[4], &dir, &store), Some(0), "{}", rows[4]);
    assert_eq!(cmd_log(&dir), ["held=3", "held=3"], "{}", rows[4]);
    wait_free(&store);
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Cli.HelpTruth
/// What the help, the manual page and the completions say is so: the demo starts 4 processes
/// (was: "3"); the page has EXAMPLES and ENVIRONMENT with every flag's variable and points to
/// no `vvm-run(1)` page that is never installed (was: no such sections, six dangling pages); no
/// completion offers the test-only acting log (was: `--acting-log` in all five); `run --help`
/// says why `--semaphore` and `--metrics-addr` do not go together; the README's singleton
/// paragraph agrees with the exit-code table (was: "anything else a failure (exit 1)").
#[test]
fn help_manual_and_completions_tell_the_truth() {
    let (code, help, _) = vvm_within(&["demo", "--help"], WAIT, "demo --help");
    assert_eq!(code, Some(0));
    assert!(help.contains("Start 4 `vvm run` processes"), "{help}");

    let (code, page, err) = vvm_within(&["man"], WAIT, "man");
    assert_eq!(code, Some(0), "{err}");
    assert!(page.contains("\n.SH EXAMPLES\n"), "no EXAMPLES");
    assert!(page.contains("\n.SH ENVIRONMENT\n"), "no ENVIRONMENT");
    assert!(!page.contains("(1)"), "a reference to a page of its own");
    let environment = page.split("\n.SH ENVIRONMENT\n").nth(1).unwrap();
    let (_, run_help, _) = vvm_within(&["run", "--help"], WAIT, "run --help");
    for variable in run_help
        .split("[env: ")
        .skip(1)
        .map(|rest| rest.split('=').next().unwrap())
    {
        assert!(
            environment.contains(&format!("\\fB{variable}\\fR")),
            "{variable} is not in ENVIRONMENT"
        );
    }
    let words = run_help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("Not with `--metrics-addr`"), "{run_help}");

    for shell in ["bash", "zsh", "fish", "powershell", "elvish"] {
        let (code, script, _) = vvm_within(&["completions", shell], WAIT, "completions");
        assert_eq!(code, Some(0));
        assert!(
            script.contains("--hold"),
            "{shell}: not a completion script"
        );
        assert!(
            !script.contains("acting"),
            "{shell} completes the acting log"
        );
    }

    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    assert!(
        !readme.contains("anything else a failure (exit 1)"),
        "the singleton paragraph contradicts the exit-code table"
    );
}
