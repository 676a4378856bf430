//! Store URLs with options, through the `vvm` binary, against a real etcd with authentication
//! enabled: the user and the password file, the key prefix, and errors that never show the
//! password.

mod cli_support;
use vvm_test_support::etcd as etcd_support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cli_support::{exit_within, leading_child, signal_and_wait, temp_dir};
use etcd_support::single;
use rustix::process::Signal;

const PASSWORD: &str = "Vvm-pa55word-in-a-file";

fn vvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

// covers: Url.Secrets
// covers: Url.Open
// covers: Et.Options
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_prefixed_etcd_url_works_through_the_binary() {
    let Some(cluster) = single("an_authenticated_prefixed_etcd_url_works_through_the_binary").await
    else {
        return;
    };
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    raw.user_add("root", "root-secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.user_add("vvm", PASSWORD, None).await.unwrap();
    raw.role_add("team-a").await.unwrap();
    let permission = etcd_client::Permission::read_write("team-a/").with_prefix();
    raw.role_grant_permission("team-a", permission)
        .await
        .unwrap();
    raw.user_grant_role("vvm", "team-a").await.unwrap();
    raw.auth_enable().await.unwrap();

    let dir = temp_dir("vvm-url-etcd");
    let password_file = dir.join("etcd-password");
    // A trailing newline, as `echo` writes it, is not part of the password.
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let wrong_file = dir.join("wrong-password");
    std::fs::write(&wrong_file, "not-the-password").unwrap();
    let endpoints = cluster.endpoints().join(",");
    let url = |file: &std::path::Path| {
        format!(
            "etcd://{endpoints}/?prefix=team-a%2F&user=vvm&password-file={}&request-timeout-ms=3000",
            file.display()
        )
    };
    let store = url(&password_file);

    let mut child = leading_child(&store, "url-a", Stdio::piped());
    // The record is under the prefix, where only the authenticated user may write.
    let mut root = etcd_client::Client::connect(
        cluster.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_user("root", "root-secret")),
    )
    .await
    .unwrap();
    let record = root.get("team-a/1", None).await.unwrap();
    assert_eq!(record.kvs().len(), 1, "no record at team-a/1");
    assert!(record.kvs()[0].value_str().unwrap().contains("url-a"));
    assert!(root.get("vvm/slot/1", None).await.unwrap().kvs().is_empty());

    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(0), "{table}");
    assert!(table.contains("url-a"), "{table}");

    // Without the prefix the user may read nothing: the store fails (exit 1).
    let unprefixed = format!(
        "etcd://{endpoints}/?user=vvm&password-file={}",
        password_file.display()
    );
    let output = vvm(&["status", "--store", &unprefixed]);
    assert_eq!(output.status.code(), Some(1));

    // A wrong password: exit 1, a one-line error that names neither password.
    let output = vvm(&["status", "--store", &url(&wrong_file)]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    // `vvm run` waits for a store that is unavailable, never for one that refuses it: the
    // wrong password is exit 1 at once there too.
    let mut run = std::process::Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--lease", "2s", "--store", &url(&wrong_file)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let code = exit_within(&mut run, Duration::from_secs(20));
    if code.is_none() {
        let _ = run.kill();
        let _ = run.wait();
    }
    assert_eq!(code, Some(Some(1)), "vvm run with a wrong password");

    // A password in the URL itself: a usage error (exit 2) that does not echo it.
    for refused in [
        format!("etcd://{endpoints}/?user=vvm&password={PASSWORD}"),
        format!("etcd://vvm:{PASSWORD}@{endpoints}/"),
    ] {
        let output = vvm(&["status", "--store", &refused]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        assert!(stderr.contains("password-file"), "{stderr}");
    }

    // A missing password file: named by its parameter.
    let output = vvm(&["status", "--store", &url(&dir.join("nowhere"))]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("parameter password-file"), "{stderr}");

    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(20));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");
    // Released: the key under the prefix is gone.
    assert!(root.get("team-a/1", None).await.unwrap().kvs().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
