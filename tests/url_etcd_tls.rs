//! TLS towards etcd named by the store URL (`ca=`, `cert=`, `key=`), through the `vvm` binary,
//! against a real etcd that serves TLS only and demands client certificates. The certificates
//! are made for the test with `openssl`.

#[path = "support/certs.rs"]
mod certs;
mod cli_support;
use vvm_test_support::etcd as etcd_support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use certs::{certificates, openssl_available};
use cli_support::{exit_within, signal_and_wait, temp_dir};
use etcd_support::{available, START_LIMIT};
use rustix::process::Signal;
use vvm_adapters::etcd::cluster::find_etcd;

fn vvm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd member serving clients over TLS only, with client certificates required.
struct TlsEtcd {
    child: Child,
    port: u16,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_etcd(etcd: &Path, dir: &Path) -> TlsEtcd {
    let (port, peer) = (free_port(), free_port());
    let path = |file: &str| dir.join(file).display().to_string();
    let child = Command::new(etcd)
        .args(["--name", "tls", "--data-dir", &path("data")])
        .args(["--listen-client-urls", &format!("https://127.0.0.1:{port}")])
        .args([
            "--advertise-client-urls",
            &format!("https://127.0.0.1:{port}"),
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args(["--initial-cluster", &format!("tls=http://127.0.0.1:{peer}")])
        .args(["--cert-file", &path("etcd-server.pem")])
        .args(["--key-file", &path("etcd-server.key")])
        .args(["--trusted-ca-file", &path("etcd-ca.pem")])
        .arg("--client-cert-auth")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd starts");
    TlsEtcd { child, port }
}

// covers: Url.Options
// covers: Url.Open
// covers: Et.Options
#[test]
fn a_tls_etcd_url_with_a_client_certificate_works_through_the_binary() {
    let test = "a_tls_etcd_url_with_a_client_certificate_works_through_the_binary";
    if !available(test) || !openssl_available(test) {
        return;
    }
    let dir = temp_dir("vvm-url-tls");
    certificates(&dir, "etcd");
    // A second authority that signed nothing the server trusts or presents.
    certificates(&dir, "other");
    let etcd = start_etcd(&find_etcd().expect("etcd is available"), &dir);
    let file = |name: &str| -> PathBuf { dir.join(name) };
    let url = |ca: &str, client: Option<&str>| {
        let mut url = format!(
            "etcd://127.0.0.1:{}/?ca={}",
            etcd.port,
            file(&format!("{ca}-ca.pem")).display()
        );
        if let Some(client) = client {
            url.push_str(&format!(
                "&cert={}&key={}",
                file(&format!("{client}-client.pem")).display(),
                file(&format!("{client}-client.key")).display()
            ));
        }
        url
    };
    let store = url("etcd", Some("etcd"));

    // Until the member serves: `status` fails (exit 1) while it starts.
    let deadline = Instant::now() + START_LIMIT;
    loop {
        let output = vvm(&["status", "--store", &store]);
        if output.status.code() == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "etcd with TLS did not serve within {START_LIMIT:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let mut child = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", &store])
        .args(["--lease", "2s", "--address", "tls-a"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    let status = vvm(&["status", "--store", &store]);
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.contains("tls-a"), "{table}");

    // Without a client certificate, or trusting another authority: refused, exit 1.
    for refused in [url("etcd", None), url("other", Some("etcd"))] {
        let output = vvm(&["status", "--store", &refused]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{refused}: {stderr}");
        // `vvm run` waits for a store that is unavailable, never for one that refuses its
        // certificates: exit 1 at once there too.
        let mut run = Command::new(env!("CARGO_BIN_EXE_vvm"))
            .args(["run", "--lease", "2s", "--store", &refused])
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
        assert_eq!(code, Some(Some(1)), "vvm run with {refused}");
    }
    // A client certificate of another authority: refused by the server.
    let output = vvm(&["status", "--store", &url("etcd", Some("other"))]);
    assert_eq!(output.status.code(), Some(1));
    // A missing key file: named by its parameter.
    let missing = store.replace("etcd-client.key", "nowhere.key");
    let output = vvm(&["status", "--store", &missing]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("parameter key"), "{stderr}");

    let code = signal_and_wait(&mut child, Signal::TERM, Duration::from_secs(20));
    assert_eq!(code, Some(0));
    drop(etcd);
    std::fs::remove_dir_all(&dir).unwrap();
}
