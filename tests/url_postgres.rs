//! Two `vvm run` hosts hand off through a PostgreSQL URL (a real server started by the test),
//! with a password file and a prefix; passwords never echoed, TLS refused rather than weakened.
//! Without PostgreSQL installed the test prints one line saying it was skipped (under CI it
//! fails instead).

mod cli_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{leading_child, signal_and_wait, temp_dir, vvm_within};
use rustix::process::Signal;
use vvm_test_support::postgres::{PgServer, PASSWORD};

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
    // The record is in the URL's schema, under its prefix.
    let keys = server.admin("SELECT convert_from(key, 'UTF8') FROM team_a.vvm_kv ORDER BY key");
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

    // A password in the URL: a usage error that does not echo it; TLS that cannot be given:
    // refused, not weakened.
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
        (
            format!(
                "postgresql://vvm@127.0.0.1:{}/postgres?sslmode=require",
                server.port()
            ),
            "TLS",
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
