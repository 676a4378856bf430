//! Partitions, pauses and lost replies across hosts, measured as Jepsen measures them: a
//! 3-member etcd cluster and several `vvm run` hosts, each in a Linux network namespace of its
//! own on a private bridge (`support/netns.rs`), and seeded random faults per round (see
//! [`Fault`]). `specs/partitions.md` states what is claimed and what it rests on.
//!
//! **The oracle observes what acts.** Every host runs `vvm run -- <this test binary>
//! holder_command`: the command appends `tick <host> <token> <ns>` to one log outside the
//! namespaces every 20 ms, stamped on `CLOCK_BOOTTIME` (one clock for every namespace), so that
//! each tenure is an interval `(host, token, first tick, last tick)`; and it writes to a fenced
//! register in etcd every 50 ms: a transaction that puts `jepsen/w/<token>/<host>/<n>` only if
//! the slot's key still exists and was created at or before its token (`VVM_FENCING_TOKEN`'s revision; a
//! successor's key is created after it). Checked after every round and at the end: no two
//! tenures overlap, tokens rise strictly with time, and no write of a deposed holder lands
//! (by etcd revision) after a write of its successor.
//!
//! Needs root, `ip netns` and etcd: otherwise one line says why it was skipped, and under CI
//! (`CI=true`) that is a failure. `VVM_PARTITION_ROUNDS` (default 30) and `VVM_PARTITION_SEED`
//! replay or run more; `VVM_PARTITION_REPORT=<file>` writes the figures of BENCHMARKS.md;
//! `VVM_PARTITION_VVM=<binary>` runs another build of `vvm` (to compare with an older one).

use vvm_test_support::etcd as etcd_support;
#[path = "support/netns.rs"]
mod netns;
#[path = "support/partition_lab.rs"]
mod partition_lab;
#[path = "support/partition_oracle.rs"]
mod partition_oracle;

use std::time::Duration;

use partition_lab::{Fault, FaultKind, Lab, LabOptions, RoundRecord, LEASE, ROUND};
use partition_oracle::{boottime_ns, command_main, library_main, register_violations, Oracle};
use vvm_sim::rng::Rng;

/// The rounds in the test command; `VVM_PARTITION_ROUNDS` for more.
const ROUNDS_DEFAULT: usize = 30;
/// How long a fault lasts: past the lease, so that a successor can take over during it.
const HOLD: Duration = Duration::from_millis(3_000);

/// The two tests use many processes each: one at a time.
static ONE_LAB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number"))
    })
}

/// The command every host runs while it leads (started by `vvm run`, never by hand).
#[test]
#[ignore = "the command of the partition tests' hosts; vvm run starts it"]
fn holder_command() {
    command_main();
}

/// A library host (started by the partition tests, never by hand).
#[test]
#[ignore = "a library host of the partition tests; they start it themselves"]
fn library_host() {
    library_main(LEASE, ROUND);
}

// covers: Net.Safety, Net.Fencing, Net.Liveness, Net.Faults
#[test]
fn partitions_pauses_and_lost_replies_never_make_two_holders() {
    let test = "partitions_pauses_and_lost_replies_never_make_two_holders";
    let _one = ONE_LAB
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(mut lab) = Lab::start(
        test,
        LabOptions {
            hosts: 3,
            library_hosts: 1,
            fenced: true,
            kernel_watchdogs: true,
        },
    ) else {
        return;
    };
    let rounds = env_number("VVM_PARTITION_ROUNDS").map_or(ROUNDS_DEFAULT, |n| n as usize);
    let seed = env_number("VVM_PARTITION_SEED")
        .unwrap_or_else(|| boottime_ns() ^ u64::from(std::process::id()));
    let mut rng = Rng::new(seed);
    let started = std::time::Instant::now();
    let mut records: Vec<RoundRecord> = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let context = format!("{test} (seed {seed}, round {round})");
        let (holder, token) = lab.wait_for_holder(&context);
        let fault = Fault::pick(&mut rng, &lab, holder);
        let record = lab.round(&context, holder, token, fault, HOLD);
        lab.check(&format!("{context} after {:?}", record.fault));
        records.push(record);
        if (round + 1) % 50 == 0 {
            etcd_support::skipped(&format!(
                "{test}: {} rounds in {:.0} s",
                round + 1,
                started.elapsed().as_secs_f64()
            ));
        }
    }
    lab.check_register_all(test);
    // No host stays a standby behind a healed partition: each takes its turn as holder.
    lab.rotate(test);
    let report = partition_lab::report(&records, seed, started.elapsed(), &lab);
    etcd_support::skipped(&report);
    if let Ok(path) = std::env::var("VVM_PARTITION_REPORT") {
        std::fs::write(&path, &report).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    }
    for kind in [FaultKind::IsolateHolder, FaultKind::PauseHolder] {
        let runs = records.iter().filter(|r| r.fault.kind() == kind).count();
        let handed = records
            .iter()
            .filter(|r| r.fault.kind() == kind && r.successor_ns.is_some())
            .count();
        assert_eq!(
            runs, handed,
            "{test} (seed {seed}): every {kind:?} round hands over"
        );
    }
}

// covers: Net.PausedHost, Net.Fencing
#[test]
fn a_paused_host_acts_late_and_only_the_fence_stops_its_writes() {
    let test = "a_paused_host_acts_late_and_only_the_fence_stops_its_writes";
    let _one = ONE_LAB
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for fenced in [true, false] {
        let Some(mut lab) = Lab::start(
            test,
            LabOptions {
                hosts: 2,
                library_hosts: 0,
                fenced,
                // A whole host paused: the kernel's SIGKILL timer would end its tree at the
                // deadline (`Cli.ExecTree`); the broken variant is the host without it.
                kernel_watchdogs: false,
            },
        ) else {
            return;
        };
        let context = format!("{test} (fenced: {fenced})");
        let (holder, token) = lab.wait_for_holder(&context);
        let seen = lab.pause_whole_host(&context, holder, token, LEASE + Duration::from_secs(1));
        // The paused host's command acted after its successor began: what a whole-host pause
        // does, whatever the lease — the assumption `Net.PausedHost` names is broken.
        assert!(
            seen.overlaps > 0,
            "{context}: the oracle saw no overlap after the resumed command acted: {seen:?}"
        );
        if fenced {
            assert!(
                seen.refused > 0,
                "{context}: no late write met the fence: {seen:?}"
            );
            assert_eq!(
                seen.stale_landed, 0,
                "{context}: a late write landed through the fence: {seen:?}"
            );
        } else {
            // The guard removed: the deposed holder's write lands after its successor's, and
            // the register's oracle says so.
            assert!(
                seen.stale_landed > 0,
                "{context}: without the fence no late write landed, so the oracle was not shown to catch one: {seen:?}"
            );
        }
        etcd_support::skipped(&format!("{context}: {seen:?}"));
    }
}

// covers: Net.Safety, Net.Fencing
#[test]
fn the_oracle_names_overlaps_reversed_tokens_and_stale_writes() {
    let dir = std::env::temp_dir().join(format!("vvm-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oracle.log");
    let mut oracle = Oracle::new(path.clone());
    let lines = |text: &str| {
        use std::io::Write;
        let mut log = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        log.write_all(text.as_bytes()).unwrap();
    };
    // Two tenures one after the other: nothing to say.
    lines("tick a 10 1000\ntick a 10 2000\nwrite a 10 ok 2000\ntick b 20 3000\n");
    oracle.poll();
    assert_eq!(oracle.violations(), Vec::<String>::new());
    // a acts again after b began (an overlap), and c starts with a lower token (reversed).
    lines("tick a 10 3500\ntick c 15 4000\n");
    // A line cut in two by a read in between is read whole.
    lines("tick c 15 ");
    oracle.poll();
    lines("4100\n");
    oracle.poll();
    let found = oracle.violations();
    assert!(
        found.iter().any(|f| f.starts_with("overlap: b (token 20)")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|f| f.starts_with("token order: c began with token 15")),
        "{found:#?}"
    );
    assert_eq!(oracle.tenures[&(15, "c".to_owned())].end_ns, 4100);
    // In etcd's order: token 10 lands after 20 wrote, which the fence exists to prevent.
    let landed = [
        (5, 10, "a".to_owned()),
        (6, 20, "b".to_owned()),
        (7, 10, "a".to_owned()),
        (8, 20, "b".to_owned()),
    ];
    let found = register_violations(&landed);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].contains("a (token 10) landed at revision 7"),
        "{found:#?}"
    );
    assert!(register_violations(&landed[..2]).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
