//! Another local user cannot stall or hijack an SQLite store, through the real binary: the
//! store's files are private, a name planted in a shared directory is refused, and `vvm status`
//! writes nothing. The parts played by another user run as `nobody` (uid 65534, via `setpriv`)
//! and need root; without root they print one line and are skipped (under CI, `CI=true`, where
//! the tests run as root, they fail instead).

mod cli_support;

use cli_support::{drain, vvm_within};

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{leading_child, signal_and_wait, temp_dir};
use rustix::process::Signal;

/// The other user.
const NOBODY: &str = "65534";

/// Whether this test may act as another user; prints the skip line when it may not.
fn other_user_available(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    assert!(
        !ci,
        "{test}: acting as another user needs root, which CI has"
    );
    eprintln!("{test}: skipped the other user's part: it needs root");
    false
}

/// Runs `sh -c script` as uid and gid 65534 without supplementary groups; `$1`... are `args`.
fn as_nobody(script: &str, args: &[&Path]) -> Output {
    Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .args(["sh", "-c", script, "sh"])
        .args(args)
        .output()
        .expect("setpriv runs (util-linux)")
}

/// A directory every user may create files in, with the sticky bit, as `/tmp` is.
fn shared_dir(prefix: &str) -> PathBuf {
    let dir = temp_dir(prefix);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// `vvm run` on `store` that must refuse to start: its exit code and standard error.
fn refused_run(store: &str) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", store])
        .args(["--lease", "2s", "--acquire", "2s", "--address", "victim"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vvm binary runs");
    let code = cli_support::exit_within(&mut child, Duration::from_secs(20));
    if code.is_none() {
        // Ended before its standard error is read to the end, which would wait for it.
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    match code {
        Some(code) => (code, stderr),
        None => panic!("vvm run on {store} did not refuse within 20 s:\n{stderr}"),
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The files of a running store: the database, its companions and the slot's lock file.
fn store_files(database: &Path) -> [PathBuf; 4] {
    [
        database.to_owned(),
        with_suffix(database, "-wal"),
        with_suffix(database, "-shm"),
        with_suffix(database, ".slot-1.lock"),
    ]
}

// covers: Sq.Trusted
#[test]
fn the_files_of_a_store_are_closed_to_other_users() {
    for (query, mode) in [("", 0o600), ("?shared-group=true", 0o660)] {
        let dir = temp_dir("vvm-private");
        let database = dir.join("vvm.sqlite");
        let store = format!("sqlite:{}{query}", database.display());
        let mut holder = leading_child(&store, "a", Stdio::null());
        for file in store_files(&database) {
            let meta = std::fs::symlink_metadata(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(
                meta.mode() & 0o777,
                mode,
                "{} has mode {:o} with {store}",
                file.display(),
                meta.mode() & 0o777
            );
        }
        if query.is_empty()
            && other_user_available("the_files_of_a_store_are_closed_to_other_users")
        {
            // Not even a read lock on `-shm` (which stalled every renewal) can be taken.
            for file in store_files(&database) {
                let opened = as_nobody("exec 3< \"$1\"", &[&file]);
                assert!(
                    !opened.status.success(),
                    "another user opened {}",
                    file.display()
                );
            }
        }
        assert_eq!(
            signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
            Some(0)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// covers: Sq.Trusted
#[test]
fn a_name_planted_by_another_user_is_refused() {
    if !other_user_available("a_name_planted_by_another_user_is_refused") {
        return;
    }
    let dir = shared_dir("vvm-planted");
    let elsewhere = dir.join("elsewhere.db");
    let empty = dir.join("empty.db");
    let cases: [(&str, &str, &str); 4] = [
        // A link to a missing file: the target must not be created.
        ("to-missing.sqlite", "ln -s \"$1\" \"$2\"", "symbolic link"),
        // A link to another user's empty file: that file must not become a database.
        (
            "to-empty.sqlite",
            ": > \"$3\"; ln -s \"$3\" \"$2\"",
            "symbolic link",
        ),
        // An empty file anyone may write: not adopted.
        (
            "adopted.sqlite",
            ": > \"$2\"; chmod 666 \"$2\"",
            "belongs to uid 65534",
        ),
        // A write-ahead log planted before the store exists.
        ("wal.sqlite", "ln -s \"$1\" \"$2-wal\"", "symbolic link"),
    ];
    for (name, plant, expected) in cases {
        let database = dir.join(name);
        let planted = as_nobody(plant, &[&elsewhere, &database, &empty]);
        assert!(
            planted.status.success(),
            "planting {name}: {}",
            String::from_utf8_lossy(&planted.stderr)
        );
        let (code, stderr) = refused_run(&format!("sqlite:{}", database.display()));
        assert_ne!(code, Some(0), "{name}: vvm run accepted it:\n{stderr}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{name}: one line: {stderr}"
        );
        assert!(!elsewhere.exists(), "{name}: the link's target was created");
        assert!(
            !with_suffix(&elsewhere, "-wal").exists(),
            "{name}: a log was made for the link's target"
        );
        if empty.exists() {
            assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "{name}");
        }
        for companion in ["-wal", "-shm"] {
            let file = with_suffix(&database, companion);
            match std::fs::symlink_metadata(&file) {
                // The planted link, left as it was and never followed (checked above).
                Ok(meta) if meta.file_type().is_symlink() => {}
                Ok(meta) => assert_ne!(meta.uid(), 65534, "{name}: {} handed over", file.display()),
                Err(_) => {}
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The names in `dir` and, for each file, its length and a hash of its bytes.
fn snapshot(dir: &Path) -> Vec<(String, usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<(String, usize, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut hasher);
            let name = entry.file_name().to_string_lossy().into_owned();
            // `-shm` is SQLite's shared-memory index, where every reader of a store in use
            // marks what it reads: no data, and not a file status creates.
            let hash = match name.ends_with("-shm") {
                true => 0,
                false => hasher.finish(),
            };
            (name, bytes.len(), hash)
        })
        .collect();
    files.sort();
    files
}

fn status(store: &str, slots: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args([
            "--log-level",
            "warn",
            "status",
            "--store",
            store,
            "--slots",
            slots,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

// covers: Sq.ReadOnly
#[test]
fn status_writes_nothing() {
    let dir = temp_dir("vvm-status-reads");
    // An empty file: no schema, no machine, no companions, no lock file.
    let empty = dir.join("empty.sqlite");
    std::fs::write(&empty, b"").unwrap();
    let before = snapshot(&dir);
    let output = status(&format!("sqlite:{}", empty.display()), "1");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is empty"), "{stderr}");
    assert_eq!(
        snapshot(&dir),
        before,
        "status changed the folder: {stderr}"
    );

    // A store nobody has open: read as it is, nothing changed, also when read-only.
    let database = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", database.display());
    let mut holder = leading_child(&store, "a", Stdio::null());
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    // The last connection to close folds the log into the file and removes `-wal` and `-shm`:
    // nobody has the store open now, the case where a reader could only create them.
    let last = rusqlite::Connection::open(&database).unwrap();
    let _: i64 = last
        .query_row("SELECT count(*) FROM vvm_leases", [], |row| row.get(0))
        .unwrap();
    last.close().unwrap();
    assert!(!with_suffix(&database, "-wal").exists());
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o400)).unwrap();
    let before = snapshot(&dir);
    let output = status(&store, "2");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("free"), "{stdout}");
    assert_eq!(snapshot(&dir), before, "status changed the folder");
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A store in use: read beside its holder; no lock file for the slot nobody holds.
    let mut holder = leading_child(&store, "b", Stdio::null());
    let output = status(&store, "2");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("b"), "{stdout}");
    assert!(
        !with_suffix(&database, ".slot-2.lock").exists(),
        "status made a lock file"
    );
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.Trusted
#[test]
fn a_fifo_planted_at_a_lock_path_stalls_nothing() {
    if !other_user_available("a_fifo_planted_at_a_lock_path_stalls_nothing") {
        return;
    }
    let dir = shared_dir("vvm-fifo");
    let database = dir.join("vvm.sqlite");
    let lock = with_suffix(&database, ".slot-1.lock");
    // Before the slot is first used: opening a FIFO for reading waits for a writer for ever.
    let planted = as_nobody("mkfifo \"$1\"", &[&lock]);
    assert!(planted.status.success(), "{planted:?}");
    let store = format!("sqlite:{}", database.display());
    let limit = Duration::from_secs(20);
    let (code, _, stderr) = vvm_within(
        &[
            "--log-level",
            "warn",
            "run",
            "--store",
            &store,
            "--lease",
            "2s",
            "--",
            "true",
        ],
        limit,
        "vvm run beside a FIFO lock file",
    );
    assert_eq!(code, Some(0), "{stderr}");
    // Refused in one line, once, naming the file.
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("not a regular file"))
        .collect();
    assert_eq!(refusals.len(), 1, "{stderr}");
    assert!(refusals[0].contains(&*lock.to_string_lossy()), "{stderr}");
    let (code, stdout, stderr) = vvm_within(
        &["status", "--store", &store],
        limit,
        "vvm status beside a FIFO lock file",
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("(free)"), "{stdout}");
    // A watch prints its table and ends at SIGTERM.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["status", "--watch", "--store", &store])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..2 {
            let _ = sender.send(lines.next());
        }
    });
    let header = receiver.recv_timeout(limit);
    let row = receiver.recv_timeout(limit);
    let code = signal_and_wait(&mut watch, Signal::TERM, limit);
    assert!(
        matches!(&row, Ok(Some(Ok(line))) if line.contains("(free)")),
        "the watch printed {header:?} {row:?}"
    );
    assert_eq!(code, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.Trusted
#[test]
fn a_directory_of_another_user_is_refused() {
    if !other_user_available("a_directory_of_another_user_is_refused") {
        return;
    }
    // The owner of a directory can rename the store and its lock files aside, so that a second
    // holder leads beside the first: refused before anything is created in it.
    let dir = temp_dir("vvm-their-dir");
    rustix::fs::chown(
        &dir,
        Some(rustix::process::Uid::from_raw(65534)),
        Some(rustix::process::Gid::from_raw(65534)),
    )
    .unwrap();
    let database = dir.join("vvm.sqlite");
    let (code, stderr) = refused_run(&format!("sqlite:{}", database.display()));
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("belongs to uid 65534"), "{stderr}");
    assert!(stderr.contains("sticky bit"), "how to allow it: {stderr}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "a file was created"
    );
    // A shared directory with the sticky bit is another matter: nobody can rename our files.
    let shared = shared_dir("vvm-sticky");
    let store = format!("sqlite:{}", shared.join("vvm.sqlite").display());
    let mut holder = leading_child(&store, "a", Stdio::null());
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&shared);
}

// covers: Sq.Trusted
#[test]
fn store_files_others_can_read_are_refused() {
    // A reader's `fcntl` read lock on `-shm` blocks every write: reading is enough to stall.
    let dir = temp_dir("vvm-readable");
    let database = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", database.display());
    let mut holder = leading_child(&store, "a", Stdio::null());
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    for (mode, query) in [(0o644, ""), (0o640, ""), (0o664, "?shared-group=true")] {
        std::fs::set_permissions(&database, std::fs::Permissions::from_mode(mode)).unwrap();
        let (code, stderr) = refused_run(&format!("{store}{query}"));
        assert_eq!(code, Some(1), "{mode:o}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("readable by other users"),
            "{mode:o}: {stderr}"
        );
        assert!(stderr.contains("chmod"), "{mode:o}: {stderr}");
    }
    // The group of a store shared on purpose may read it.
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o660)).unwrap();
    let mut holder = leading_child(&format!("{store}?shared-group=true"), "b", Stdio::null());
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.Trusted
#[test]
fn a_refusal_creates_nothing() {
    if !other_user_available("a_refusal_creates_nothing") {
        return;
    }
    let dir = shared_dir("vvm-nothing");
    let database = dir.join("vvm.sqlite");
    let shm = with_suffix(&database, "-shm");
    let planted = as_nobody(": > \"$1\"; chmod 600 \"$1\"", &[&shm]);
    assert!(planted.status.success(), "{planted:?}");
    let (code, stderr) = refused_run(&format!("sqlite:{}", database.display()));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("-shm"), "{stderr}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["vvm.sqlite-shm"], "left behind: {names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Sq.Trusted
#[test]
fn a_store_this_user_may_not_open_says_permission_denied() {
    if !other_user_available("a_store_this_user_may_not_open_says_permission_denied") {
        return;
    }
    // Root opens any file whatever its mode: the store's user here is `nobody`, in a directory
    // of its own, running a copy of the binary it may execute.
    let dir = temp_dir("vvm-mode-000");
    let binary = dir.join("vvm");
    std::fs::copy(env!("CARGO_BIN_EXE_vvm"), &binary).unwrap();
    rustix::fs::chown(
        &dir,
        Some(rustix::process::Uid::from_raw(65534)),
        Some(rustix::process::Gid::from_raw(65534)),
    )
    .unwrap();
    let database = dir.join("vvm.sqlite");
    let script = "\"$1\" --log-level warn run --store \"sqlite:$2\" -- true || exit 9; \
                  chmod 000 \"$2\"; \
                  \"$1\" run --store \"sqlite:$2\" -- true; echo \"run=$?\" >&2; \
                  \"$1\" status --store \"sqlite:$2\"; echo \"status=$?\" >&2";
    let output = as_nobody(script, &[&binary, &database]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("run=1") && stderr.contains("status=1"),
        "{stderr}"
    );
    let refusals: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vvm: ") && l.contains("SQLite store"))
        .collect();
    assert_eq!(refusals.len(), 2, "{stderr}");
    for line in refusals {
        assert!(line.contains("Permission denied"), "{line}");
        assert!(line.contains(&*database.to_string_lossy()), "{line}");
        assert!(!line.contains("unable to open database file"), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Cli.StatusCorrupt
#[test]
fn a_corrupt_slot_hides_no_other_slot() {
    let dir = temp_dir("vvm-corrupt-slot");
    let database = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", database.display());
    let mut holder = leading_child(&store, "healthy", Stdio::null());
    // Slot 2: a live record whose value vvm did not write.
    let conn = rusqlite::Connection::open(&database).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute(
        "INSERT INTO vvm_leases (slot, value, revision, boot_id, expires_ns) \
         SELECT 2, X'FF00', revision + 1, boot_id, expires_ns + 600000000000 \
         FROM vvm_leases WHERE slot = 1",
        [],
    )
    .unwrap();
    drop(conn);
    let (code, stdout, stderr) = vvm_within(
        &["status", "--store", &store, "--slots", "3"],
        Duration::from_secs(20),
        "vvm status",
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    let rows: Vec<&str> = stdout.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(
        rows[0].starts_with('1') && rows[0].contains("healthy"),
        "{stdout}"
    );
    assert!(
        rows[1].starts_with('2') && rows[1].contains("corrupt"),
        "{stdout}"
    );
    assert!(
        rows[2].starts_with('3') && rows[2].contains("(free)"),
        "{stdout}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("slot 2"), "{stderr}");
    assert_eq!(
        signal_and_wait(&mut holder, Signal::TERM, Duration::from_secs(15)),
        Some(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Cli.SemaphoreCorrupt
#[test]
fn a_forced_delete_removes_a_semaphore_state_that_cannot_be_read() {
    let dir = temp_dir("vvm-corrupt-semaphore");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());
    let semaphore = |args: &[&str]| {
        let mut all = vec!["--log-level", "warn", "semaphore"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--store", &store]);
        vvm_within(&all, Duration::from_secs(30), "vvm semaphore")
    };
    let (code, _, stderr) = semaphore(&["create", "jobs", "--limit", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    let conn = rusqlite::Connection::open(dir.join("vvm.sqlite")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute(
        "UPDATE vvm_semaphores SET state = X'00FFEE' WHERE name = 'jobs'",
        [],
    )
    .unwrap();
    drop(conn);
    // Without --force: refused, left as it is.
    let (code, _, stderr) = semaphore(&["delete", "jobs"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot be read"), "{stderr}");
    // With it: removed, after a line that says what.
    let (code, _, stderr) = semaphore(&["delete", "jobs", "--force"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("removing the stored state"), "{stderr}");
    assert!(stderr.contains("jobs"), "{stderr}");
    // The name is free again.
    let (code, _, stderr) = semaphore(&["create", "jobs", "--limit", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Cli.Messages
#[test]
fn a_holder_that_lost_its_slot_does_not_say_none_was_held() {
    let dir = temp_dir("vvm-lost-words");
    let database = dir.join("vvm.sqlite");
    let store = format!("sqlite:{}", database.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args([
            "run",
            "--store",
            &store,
            "--lease",
            "2s",
            "--address",
            "lost",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = drain(child.stderr.take().unwrap());
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("leading slot=1 "), "{first}");
    // Its record taken away under it: the next renewal finds it gone.
    let conn = rusqlite::Connection::open(&database).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute("DELETE FROM vvm_leases WHERE slot = 1", [])
        .unwrap();
    drop(conn);
    let code = cli_support::exit_within(&mut child, Duration::from_secs(30));
    if code.is_none() {
        let _ = child.kill();
    }
    let stderr = stderr.join().unwrap();
    assert_eq!(code, Some(Some(1)), "{stderr}");
    assert!(stderr.contains("leadership lost"), "{stderr}");
    assert!(!stderr.contains("no slot was held"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
