//! `vvm run` watches SIGTERM and SIGINT from its first instant: a process that is still
//! campaigning for a slot held elsewhere ends within a second of the signal, cleanly, without
//! ever starting its service.

mod cli_support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cli_support::{exit_within, signal, temp_dir};
use rustix::process::Signal;

/// How soon a campaigning process must end after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(1);

fn spawn_run(store: &str, address: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "info", "run", "--store", store])
        .args(["--lease", "2s", "--address", address, "--round", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the vvm binary runs")
}

// covers: Cli.SignalsDuringCampaign, Rt.StopDuringLaunch
#[test]
fn sigterm_during_a_campaign_exits_within_a_second_and_starts_nothing() {
    let dir = temp_dir("vvm-cli-signals");
    let store = format!("sqlite:{}", dir.join("vvm.sqlite").display());

    let mut holder = spawn_run(&store, "holder");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");

    let mut campaigner = spawn_run(&store, "campaigner");
    // Its log says when it has begun to campaign.
    let mut log = BufReader::new(campaigner.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("campaigning for a slot") {
        let mut line = String::new();
        assert!(log.read_line(&mut line).unwrap() > 0, "no launch: {seen}");
        seen.push_str(&line);
    }
    std::thread::sleep(Duration::from_millis(300));
    signal(&campaigner, Signal::TERM);
    let code = exit_within(&mut campaigner, STOP_WITHIN);
    if code.is_none() {
        let _ = campaigner.kill();
        let _ = campaigner.wait();
    }
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        code,
        Some(Some(0)),
        "a campaigning process did not end cleanly within {STOP_WITHIN:?} of SIGTERM"
    );
    let mut out = String::new();
    campaigner
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(!out.contains("leading"), "the service started: {out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
