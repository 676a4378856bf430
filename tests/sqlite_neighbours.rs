//! Another local user cannot stall or hijack an SQLite store, through the real binary: the
//! store's files are private, a name planted in a shared directory is refused, and `vvm status`
//! writes nothing. The parts played by another user run as `nobody` (uid 65534, via `setpriv`)
//! and need root; without root they print one line and are skipped (under CI, `CI=true`, where
//! the tests run as root, they fail instead).

mod cli_support;

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
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    match code {
        Some(code) => (code, stderr),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("vvm run on {store} did not refuse within 20 s:\n{stderr}");
        }
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
