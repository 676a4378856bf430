//! Two `vvm run` hosts hand off through a PostgreSQL URL (a real server started by the test),
//! with a password file and a prefix; passwords never echoed; TLS verified as `sslmode` says, on
//! every connection of the store and through the binary. Without PostgreSQL installed each test
//! prints one line saying it was skipped (under CI it fails instead).

#[path = "support/certs.rs"]
mod certs;
mod cli_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{leading_child, signal_and_wait, temp_dir, vvm_within};
use rustix::process::Signal;
use vvm::{lifecycle::Incarnation, session::LeaseValue, store::LeaseStore, Slot};
use vvm_test_support::postgres::{PgServer, ServerTls, PASSWORD};

// covers: Pg.Url
// covers: Pg.Run
#[test]
fn two_vvm_run_hosts_hand_off_on_postgres_with_a_password_file() {
    let Some(server) =
        PgServer::start("two_vvm_run_hosts_hand_off_on_postgres_with_a_password_file")
    else {
        return;
    };
    let dir = temp_dir("vvm-pg-run");
    let password_file = dir.join("pg-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let store = format!(
        "postgres://vvm_pw@127.0.0.1:{}/postgres?schema=team_a&prefix=jobs%2F&password-file={}",
        server.port(),
        password_file.display()
    );
    let mut first = leading_child(&store, "pg-a", Stdio::piped());
    // The record is in the URL's schema, under its prefix (keys with a NUL byte, the store's
    // own bookkeeping such as a slot's tenure, are not text).
    let keys = server.admin(
        "SELECT convert_from(key, 'UTF8') FROM team_a.vvm_kv \
         WHERE position('\\x00'::bytea IN key) = 0 ORDER BY key",
    );
    assert!(keys.lines().any(|key| key == "jobs/1"), "{keys}");

    let (code, table, stderr) = vvm_within(
        &["status", "--store", &store],
        Duration::from_secs(30),
        "vvm status",
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(table.contains("pg-a"), "{table}");

    let mut second = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--store", &store])
        .args(["--lease", "2s", "--address", "pg-b"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vvm binary runs");
    let lines = BufReader::new(second.stdout.take().unwrap()).lines();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = sender.send(line);
        }
    });
    assert!(
        received.recv_timeout(Duration::from_secs(3)).is_err(),
        "the second host must wait while the first holds"
    );
    let handed = Instant::now();
    let code = signal_and_wait(&mut first, Signal::TERM, Duration::from_secs(20));
    let mut first_stderr = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut first_stderr).unwrap();
    assert_eq!(code, Some(0), "{first_stderr}");
    let line = received
        .recv_timeout(Duration::from_secs(20))
        .expect("the second host leads after the first released");
    assert!(line.starts_with("leading slot=1 "), "{line}");
    // Released and taken through the change feed, not by waiting out a lease.
    assert!(handed.elapsed() < Duration::from_secs(20));
    let code = signal_and_wait(&mut second, Signal::TERM, Duration::from_secs(20));
    let mut second_stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut second_stderr).unwrap();
    assert_eq!(code, Some(0), "{second_stderr}");
    for text in [&first_stderr, &second_stderr, &table, &stderr] {
        assert!(!text.contains(PASSWORD), "{text}");
    }

    // A password in the URL: a usage error that does not echo it.
    for (refused, says) in [
        (
            format!(
                "postgres://vvm_pw:{PASSWORD}@127.0.0.1:{}/postgres",
                server.port()
            ),
            "password-file",
        ),
        (
            format!(
                "postgres://vvm_pw@127.0.0.1:{}/postgres?password={PASSWORD}",
                server.port()
            ),
            "password-file",
        ),
    ] {
        let (code, _, stderr) = vvm_within(
            &["status", "--store", &refused],
            Duration::from_secs(30),
            "vvm status",
        );
        assert_eq!(code, Some(2), "{stderr}");
        assert!(!stderr.contains(PASSWORD), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    // TLS required of a server without it: refused when connecting (exit 1, at once), not
    // weakened to plain.
    let (code, _, stderr) = vvm_within(
        &[
            "status",
            "--store",
            &format!(
                "postgresql://vvm@127.0.0.1:{}/postgres?sslmode=require",
                server.port()
            ),
        ],
        Duration::from_secs(30),
        "vvm status",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("server does not support TLS"), "{stderr}");
    // A wrong password: exit 1, and the message names neither password.
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not-the-password").unwrap();
    let (code, _, stderr) = vvm_within(
        &[
            "status",
            "--store",
            &format!(
                "postgres://vvm_pw@127.0.0.1:{}/postgres?schema=team_a&password-file={}",
                server.port(),
                wrong.display()
            ),
        ],
        Duration::from_secs(30),
        "vvm status",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(!stderr.contains("not-the-password") && !stderr.contains(PASSWORD));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The chain of `error`'s messages, as the binary prints it.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

// covers: Pg.Tls
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_as_sslmode_says_on_every_connection_of_the_store() {
    let test = "tls_is_verified_as_sslmode_says_on_every_connection_of_the_store";
    if !certs::openssl_available(test) {
        return;
    }
    let dir = temp_dir("vvm-pg-tls");
    certs::certificates(&dir, "pg");
    // A second authority that signed nothing the server presents.
    certs::certificates(&dir, "other");
    let file = |name: &str| dir.join(name).display().to_string();
    // TLS only over TCP; role vvm-client logs in with its certificate alone.
    let Some(server) = PgServer::start_tls(
        test,
        &ServerTls {
            cert: &dir.join("pg-server.pem"),
            key: &dir.join("pg-server.key"),
            client_ca: &dir.join("pg-ca.pem"),
            hba: "local all all trust\n\
                  hostssl all vvm-client 127.0.0.1/32 cert\n\
                  hostssl all all 127.0.0.1/32 trust\n\
                  hostnossl all all 127.0.0.1/32 reject\n",
        },
    ) else {
        return;
    };
    server.admin(
        "CREATE ROLE \"vvm-client\" LOGIN; GRANT CREATE ON DATABASE postgres TO \"vvm-client\"",
    );
    // Each role in a schema of its own (one it can create).
    let url = |host: &str, user: &str, query: &str| {
        format!(
            "postgres://{user}@{host}:{}/postgres?schema={}&{query}",
            server.port(),
            if user == "vvm" { "tls" } else { "tls_client" }
        )
    };
    let lease_config = vvm::LeaseConfig::default();
    let verified = url(
        "127.0.0.1",
        "vvm",
        &format!("sslmode=verify-full&ca={}", file("pg-ca.pem")),
    );

    // verify-full with the server's CA: the schema is made, a lease written and read, and a
    // watch's listening connection is up, every connection over TLS (the server refuses any
    // other on TCP).
    let store = vvm_adapters::open::open(&verified, &lease_config)
        .await
        .expect("verify-full with the right CA opens");
    let mine = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    let ttl = Duration::from_secs(3600);
    let revision = store
        .insert_if_not_exists(Slot(1), &mine, ttl)
        .await
        .unwrap()
        .expect("the slot was free");
    let lease = vvm::store::Lease {
        value: mine.clone(),
        revision,
    };
    assert_eq!(store.get(Slot(1)).await.unwrap(), Some(lease.clone()));
    let changed = tokio::spawn(store.changed(&[Slot(1)]));
    let started = Instant::now();
    loop {
        let listening = server.admin(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = 'vvm' AND a.query LIKE 'LISTEN%' AND s.ssl",
        );
        if listening.trim() == "1" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no listening connection over TLS"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plain = server.admin(
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'vvm' AND NOT s.ssl",
    );
    assert_eq!(plain.trim(), "0");
    assert!(store.compare_and_delete(Slot(1), &lease).await.unwrap());
    tokio::time::timeout(Duration::from_secs(8), changed)
        .await
        .expect("the feed reports the release")
        .unwrap();

    // Through the binary, the same URL: `vvm status` reads the store.
    let (code, _, stderr) = vvm_within(
        &["status", "--store", &verified],
        Duration::from_secs(30),
        "vvm status",
    );
    assert_eq!(code, Some(0), "{stderr}");

    // verify-ca checks the chain, not the name: `localhost` is not in the certificate (its
    // only name is 127.0.0.1), which verify-full refuses.
    let ca = format!("ca={}", file("pg-ca.pem"));
    vvm_adapters::open::open(
        &url("localhost", "vvm", &format!("sslmode=verify-ca&{ca}")),
        &lease_config,
    )
    .await
    .expect("verify-ca does not check the host name");
    // No sslmode: libpq's default, prefer, takes the TLS the server offers (unverified).
    vvm_adapters::open::open(&url("127.0.0.1", "vvm", "connections=2"), &lease_config)
        .await
        .expect("prefer speaks TLS to a server that offers it");
    // A client certificate, for a role that logs in by it alone.
    vvm_adapters::open::open(
        &url(
            "127.0.0.1",
            "vvm-client",
            &format!(
                "sslmode=verify-full&{ca}&cert={}&key={}",
                file("pg-client.pem"),
                file("pg-client.key")
            ),
        ),
        &lease_config,
    )
    .await
    .expect("the client certificate is presented");

    // Refused, each in one clear error that is not an outage to wait for.
    for (refused, says) in [
        (
            url("localhost", "vvm", &format!("sslmode=verify-full&{ca}")),
            "not valid for name",
        ),
        (
            url(
                "127.0.0.1",
                "vvm",
                &format!("sslmode=verify-full&ca={}", file("other-ca.pem")),
            ),
            "UnknownIssuer",
        ),
        (
            url(
                "127.0.0.1",
                "vvm",
                &format!("sslmode=require&ca={}", file("other-ca.pem")),
            ),
            "UnknownIssuer",
        ),
        // No certificate: the role's `cert` line refuses it.
        (
            url("127.0.0.1", "vvm-client", "sslmode=require"),
            "certificate",
        ),
        // Plain TCP: the server takes TLS only, so every success above was over TLS.
        (url("127.0.0.1", "vvm", "sslmode=disable"), "no encryption"),
    ] {
        let error = vvm_adapters::open::open(&refused, &lease_config)
            .await
            .err()
            .unwrap_or_else(|| panic!("{refused} opened"));
        let text = chain(&error);
        assert!(text.contains(says), "{refused}: {text}");
        assert!(!error.is_unavailable(), "{refused}: {text}");
    }
    // `vvm run` does not wait for a store whose certificate it refuses: exit 1 at once.
    let wrong = url(
        "127.0.0.1",
        "vvm",
        &format!("sslmode=verify-full&ca={}", file("other-ca.pem")),
    );
    let (code, _, stderr) = vvm_within(
        &["run", "--lease", "2s", "--store", &wrong, "--", "true"],
        Duration::from_secs(30),
        "vvm run",
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}
