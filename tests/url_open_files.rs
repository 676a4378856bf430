//! What opening a store URL answers for bad or secret files and odd paths: the paths of secret
//! files never appear in errors, an unknown parameter is not echoed, a certificate or key file
//! without its PEM block is refused when the store is opened, credentials over plain http are
//! warned about once, and a `sqlite:` path that is a device is refused with nothing created
//! beside it. Through the library and the `vvm` binary; no store is reached.

mod cli_support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use cli_support::temp_dir;
use vvm::adapters::open::{open, open_read_only, OpenError, PemKind};
use vvm::LeaseConfig;

/// A certificate block: the check at open is about the file's form, not the certificate's
/// validity, which TLS judges when connecting.
const CERT_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n";
const KEY_PEM: &str =
    "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n";

fn vvm_status(store: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "status", "--store", store])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("the vvm binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

// covers: Url.Unechoed
#[test]
fn secret_file_paths_and_stray_parameters_never_reach_the_output() {
    let dir = temp_dir("vvm-url-secret");
    let secret_dir = dir.join("hidden-secrets");
    std::fs::create_dir_all(&secret_dir).unwrap();
    let (ca, cert) = (dir.join("ca.pem"), dir.join("cert.pem"));
    std::fs::write(&ca, CERT_PEM).unwrap();
    std::fs::write(&cert, CERT_PEM).unwrap();
    let empty_key = secret_dir.join("client.key");
    std::fs::write(&empty_key, b"").unwrap();
    let endpoint = "etcd://127.0.0.1:1/?connect-timeout-ms=200";
    for (url, parameter) in [
        (
            format!(
                "{endpoint}&user=u&password-file={}",
                secret_dir.join("missing-pw").display()
            ),
            "password-file",
        ),
        (
            format!(
                "{endpoint}&ca={}&cert={}&key={}",
                ca.display(),
                cert.display(),
                secret_dir.join("missing.key").display()
            ),
            "key",
        ),
        (
            format!(
                "{endpoint}&ca={}&cert={}&key={}",
                ca.display(),
                cert.display(),
                empty_key.display()
            ),
            "key",
        ),
    ] {
        let output = vvm_status(&url);
        let shown = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{url}: {shown}");
        assert!(shown.contains(parameter), "{url}: {shown}");
        assert!(shown.contains("<redacted>"), "{url}: {shown}");
        assert!(!shown.contains("hidden-secrets"), "{url}: {shown}");
    }
    // The library's errors hide them in Debug too.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let refused = runtime
        .block_on(open(
            &format!(
                "{endpoint}&user=u&password-file={}",
                secret_dir.join("pw").display()
            ),
            &LeaseConfig::default(),
        ))
        .unwrap_err();
    assert!(
        !format!("{refused:?}").contains("hidden-secrets"),
        "{refused:?}"
    );
    // A secret pasted where a parameter goes is not repeated back; a typo is, with a hint.
    let output = vvm_status("etcd://127.0.0.1:1/?hunter2");
    assert_eq!(output.status.code(), Some(2));
    assert!(!stderr(&output).contains("hunter2"), "{}", stderr(&output));
    let output = vvm_status("etcd://127.0.0.1:1/?prefx=a/");
    assert!(
        stderr(&output).contains("did you mean prefix?"),
        "{}",
        stderr(&output)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Url.Pem
#[test]
fn certificate_and_key_files_without_their_pem_block_are_refused_at_open() {
    let dir = temp_dir("vvm-url-pem");
    let (good_cert, good_key, junk) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("junk.txt"),
    );
    std::fs::write(&good_cert, CERT_PEM).unwrap();
    std::fs::write(&good_key, KEY_PEM).unwrap();
    std::fs::write(&junk, "not a certificate at all\n").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = |ca: &Path, cert: &Path, key: &Path| {
        format!(
            "etcd://127.0.0.1:1/?connect-timeout-ms=200&ca={}&cert={}&key={}",
            ca.display(),
            cert.display(),
            key.display()
        )
    };
    for (url, parameter, expected) in [
        (
            url(&junk, &good_cert, &good_key),
            "ca",
            PemKind::Certificate,
        ),
        (
            url(&good_cert, &junk, &good_key),
            "cert",
            PemKind::Certificate,
        ),
        (
            url(&good_cert, &good_cert, &junk),
            "key",
            PemKind::PrivateKey,
        ),
        // A certificate where the key goes, and a key where the authority goes.
        (
            url(&good_cert, &good_cert, &good_cert),
            "key",
            PemKind::PrivateKey,
        ),
        (
            url(&good_key, &good_cert, &good_key),
            "ca",
            PemKind::Certificate,
        ),
    ] {
        let refused = runtime
            .block_on(open(&url, &LeaseConfig::default()))
            .unwrap_err();
        match &refused {
            OpenError::NotPem {
                parameter: got,
                expected: kind,
                ..
            } => {
                assert_eq!((*got, *kind), (parameter, expected), "{url}");
            }
            other => panic!("{url}: {other:?}"),
        }
        assert!(refused.is_usage());
        let shown = refused.to_string();
        assert!(shown.contains("does not hold a PEM"), "{shown}");
        // The key's path is a secret's; the others are shown.
        let dir_shown = shown.contains(dir.to_str().unwrap());
        assert_eq!(dir_shown, parameter != "key", "{shown}");
    }
    // Through the binary: a usage error, named.
    let output = vvm_status(&url(&junk, &good_cert, &good_key));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("parameter ca:"),
        "{}",
        stderr(&output)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Url.PlainCredentials
#[test]
fn credentials_over_plain_http_are_warned_about_once() {
    let dir = temp_dir("vvm-url-plain");
    let password = dir.join("pw");
    std::fs::write(&password, "secret\n").unwrap();
    let warning = "sent over plain http";
    let output = vvm_status(&format!(
        "etcd://127.0.0.1:1/?connect-timeout-ms=200&user=u&password-file={}",
        password.display()
    ));
    let shown = stderr(&output);
    assert_eq!(shown.matches(warning).count(), 1, "{shown}");
    // No credentials, no warning.
    let output = vvm_status("etcd://127.0.0.1:1/?connect-timeout-ms=200");
    assert!(!stderr(&output).contains(warning), "{}", stderr(&output));
    std::fs::remove_dir_all(&dir).unwrap();
}

// covers: Url.SqliteNotAFile
#[test]
fn a_sqlite_path_that_is_a_device_is_refused_and_nothing_is_created_beside_it() {
    let device = Path::new("/dev/zero");
    let beside = ["-journal", "-wal", "-shm", ".lock"].map(|suffix| format!("/dev/zero{suffix}"));
    let before: Vec<bool> = beside.iter().map(|p| Path::new(p).exists()).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("sqlite:{}", device.display());
    for refused in [
        runtime.block_on(open(&url, &LeaseConfig::default())),
        runtime.block_on(open_read_only(&url, &LeaseConfig::default())),
    ] {
        let refused = refused.unwrap_err();
        assert!(matches!(refused, OpenError::NotAFile { .. }), "{refused:?}");
        assert!(
            refused.to_string().contains("not a regular file"),
            "{refused}"
        );
    }
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["run", "--store", &url, "--address", "dev-zero"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let after: Vec<bool> = beside.iter().map(|p| Path::new(p).exists()).collect();
    assert_eq!(before, after, "files appeared beside /dev/zero: {beside:?}");
}
