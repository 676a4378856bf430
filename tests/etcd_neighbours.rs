//! No file or key another party planted can hang or fool `vvm` on etcd, through the real binary
//! against a real etcd: a FIFO named by a URL parameter, credentials without write rights, a key
//! without a lease, a semaphore state that cannot be decoded, and the words of its errors.

mod cli_support;
use vvm_test_support::etcd as etcd_support;

use std::process::{Command, Stdio};
use std::time::Duration;

use cli_support::{signal_and_wait, temp_dir};
use etcd_support::single;
use rustix::process::Signal;

/// How long any one `vvm` here may take: far more than each needs, far less than "for ever".
const LIMIT: Duration = Duration::from_secs(30);

/// `vvm` with `args` within [`LIMIT`] (see [`cli_support::vvm_within`]).
fn vvm(args: &[&str], what: &str) -> (Option<i32>, String, String) {
    cli_support::vvm_within(args, LIMIT, what)
}

// covers: Url.Open
#[test]
fn a_fifo_named_by_a_parameter_is_refused_without_waiting() {
    let dir = temp_dir("vvm-param-fifo");
    let fifo = dir.join("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // Nothing listens on the endpoint: the files are read before anything is sent.
    for (parameter, url) in [
        (
            "password-file",
            format!(
                "etcd://127.0.0.1:9/?user=vvm&password-file={}",
                fifo.display()
            ),
        ),
        ("ca", format!("etcd://127.0.0.1:9/?ca={}", fifo.display())),
    ] {
        let (code, _, stderr) = vvm(
            &["--log-level", "error", "status", "--store", &url],
            parameter,
        );
        assert_eq!(code, Some(2), "{parameter}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("parameter {parameter}"))
                && stderr.contains("not a regular file"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Et.Permission
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_that_may_not_write_are_refused_at_once() {
    let Some(cluster) = single("credentials_that_may_not_write_are_refused_at_once").await else {
        return;
    };
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    raw.user_add("root", "root-secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    for (user, role, permission) in [
        (
            "reader",
            "app-read",
            etcd_client::Permission::read("app/").with_prefix(),
        ),
        (
            "elsewhere",
            "other-write",
            etcd_client::Permission::read_write("other/").with_prefix(),
        ),
    ] {
        raw.user_add(user, "secret", None).await.unwrap();
        raw.role_add(role).await.unwrap();
        raw.role_grant_permission(role, permission).await.unwrap();
        raw.user_grant_role(user, role).await.unwrap();
    }
    raw.auth_enable().await.unwrap();
    let dir = temp_dir("vvm-etcd-rights");
    let password = dir.join("password");
    std::fs::write(&password, "secret\n").unwrap();
    let endpoints = cluster.endpoints().join(",");
    for user in ["reader", "elsewhere"] {
        let store = format!(
            "etcd://{endpoints}/?prefix=app%2F&user={user}&password-file={}",
            password.display()
        );
        // A standby that would wait for ever: ended at once instead.
        let (code, _, stderr) = vvm(
            &[
                "--log-level",
                "error",
                "run",
                "--store",
                &store,
                "--acquire",
                "forever",
                "--",
                "true",
            ],
            user,
        );
        assert_eq!(code, Some(1), "{user}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{user}: {stderr}");
        assert!(
            stderr.contains("permission denied") && stderr.contains("app/"),
            "{user}: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// covers: Et.Corrupt
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_a_lease_is_foreign() {
    let Some(cluster) = single("a_key_without_a_lease_is_foreign").await else {
        return;
    };
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    // vvm never writes a key without a lease: this one would hold slot 1 for ever.
    raw.put("app/1", "vvm1 00000000000000ff planted", None)
        .await
        .unwrap();
    let store = format!("etcd://{}/?prefix=app%2F", cluster.endpoints().join(","));
    let (code, stdout, stderr) = vvm(&["status", "--store", &store, "--slots", "2"], "status");
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(!stdout.contains("planted"), "taken for a holder: {stdout}");
    assert!(stdout.contains("(corrupt record)"), "{stdout}");
    assert!(stdout.contains("(free)"), "slot 2 is shown: {stdout}");
    assert!(
        stderr.contains("slot 1") && stderr.contains("app/1"),
        "{stderr}"
    );
    let (code, _, stderr) = vvm(
        &[
            "--log-level",
            "error",
            "run",
            "--store",
            &store,
            "--acquire",
            "3s",
            "--",
            "true",
        ],
        "run",
    );
    assert_eq!(code, Some(1), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("slot 1") && last.contains("app/1") && last.contains("no lease"),
        "{stderr}"
    );
    // A standby says what it waits on, naming the key.
    let mut standby = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", &store, "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufRead::lines(std::io::BufReader::new(standby.stderr.take().unwrap()));
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + LIMIT;
    let mut seen = String::new();
    let named = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) if line.contains("WARN") && line.contains("app/1") => break true,
            Ok(line) => seen.push_str(&line),
            Err(_) => break false,
        }
    };
    assert_eq!(signal_and_wait(&mut standby, Signal::TERM, LIMIT), Some(0));
    assert!(named, "the standby never named the key:\n{seen}");
}

// covers: Cli.SemaphoreCorrupt
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_delete_removes_an_etcd_semaphore_state_that_cannot_be_read() {
    let Some(cluster) =
        single("a_forced_delete_removes_an_etcd_semaphore_state_that_cannot_be_read").await
    else {
        return;
    };
    let store = format!("etcd://{}/?prefix=app%2F", cluster.endpoints().join(","));
    let semaphore = |args: &[&str]| {
        let mut all = vec!["--log-level", "warn", "semaphore"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--store", &store]);
        vvm(&all, "vvm semaphore")
    };
    let (code, _, stderr) = semaphore(&["create", "jobs", "--limit", "2"]);
    assert_eq!(code, Some(0), "{stderr}");
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    raw.put(&b"app/\0semaphore/jobs"[..], &b"\x01S\xff\xfe"[..], None)
        .await
        .unwrap();
    let (code, _, stderr) = semaphore(&["delete", "jobs"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot be read"), "{stderr}");
    let (code, _, stderr) = semaphore(&["delete", "jobs", "--force"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("removing the stored state") && stderr.contains("jobs"),
        "{stderr}"
    );
    let (code, _, stderr) = semaphore(&["create", "jobs", "--limit", "1"]);
    assert_eq!(code, Some(0), "{stderr}");
}

// covers: Et.Permission
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_errors_are_one_line_in_words() {
    // Nothing listens on port 9 of loopback: refused at once.
    let (code, _, stderr) = vvm(
        &["status", "--store", "etcd://127.0.0.1:9/"],
        "status of a closed port",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("Connection refused"), "{stderr}");
    for debug in ["tonic::", "Os {", "ConnectError(", "code: '"] {
        assert!(
            !stderr.contains(debug),
            "Rust Debug text {debug:?}: {stderr}"
        );
    }

    let Some(cluster) = single("etcd_errors_are_one_line_in_words").await else {
        return;
    };
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    raw.user_add("root", "root-secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();
    let dir = temp_dir("vvm-etcd-words");
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not-the-secret").unwrap();
    let store = format!(
        "etcd://{}/?user=root&password-file={}",
        cluster.endpoints().join(","),
        wrong.display()
    );
    let (code, _, stderr) = vvm(
        &["--log-level", "error", "status", "--store", &store],
        "status with a wrong password",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("authentication failed"), "{stderr}");
    assert!(!stderr.contains("could not reach"), "{stderr}");
    assert!(!stderr.contains("not-the-secret"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
