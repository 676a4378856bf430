//! Certificates for the TLS tests, made with the `openssl` command: an authority per name and,
//! signed by it, a server certificate for 127.0.0.1 and a client certificate.
#![allow(dead_code)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether `openssl` runs; prints the skip line when it does not. Panics under CI (`CI=true`
/// or `1`), where it must be present, like the servers the tests start.
pub fn openssl_available(test: &str) -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
        assert!(
            !ci,
            "{test}: openssl is not installed, and under CI the TLS test must run (scripts/test.sh installs openssl)"
        );
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: openssl is not installed (apt-get install openssl, or run scripts/test.sh as root)"
        );
    }
    found
}

pub fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A certificate authority `<name>-ca.pem` and, signed by it, `<name>-server.pem` (for
/// 127.0.0.1) and `<name>-client.pem`, each with its `.key`.
pub fn certificates(dir: &Path, name: &str) {
    let file = |suffix: &str| format!("{name}-{suffix}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
            "-keyout",
            &file("ca.key"),
            "-out",
            &file("ca.pem"),
        ],
    );
    for (role, extensions) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let ext = file(&format!("{role}.ext"));
        std::fs::write(dir.join(&ext), extensions).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN=vvm-{role}"),
                "-keyout",
                &file(&format!("{role}.key")),
                "-out",
                &file(&format!("{role}.csr")),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-days",
                "2",
                "-in",
                &file(&format!("{role}.csr")),
                "-CA",
                &file("ca.pem"),
                "-CAkey",
                &file("ca.key"),
                "-CAcreateserial",
                "-extfile",
                &ext,
                "-out",
                &file(&format!("{role}.pem")),
            ],
        );
    }
}
