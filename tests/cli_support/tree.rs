//! The process trees of `vvm run -- CMD` through the real binary: every process of a tree
//! appends `REVISION KIND WALL_NS` lines to one log while it runs — the command itself, and a
//! daemon it starts (new session, double fork, every descriptor closed). The oracle is what a
//! user would see in that log: the lines of two tenures never interleave in time, and revisions
//! only grow.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Upper bound for anything the tests wait for; only a broken binary reaches it.
pub const WAIT_MAX: Duration = Duration::from_secs(30);
pub const LEASE: Duration = Duration::from_secs(2);

/// The command: starts a daemon, then appends a line every 20 ms until it is ended.
pub const SCRIPT: &str = r#"log="$PWD/acts"
perl -e 'use POSIX; use Time::HiRes; POSIX::setsid(); exit 0 if fork; POSIX::close($_) for 0..1023;
  while (1) { open(my $f, ">>", $ARGV[0]) or exit 1;
    printf $f "%s d %.0f\n", $ENV{VVM_FENCING_TOKEN}, Time::HiRes::time() * 1e9; close($f);
    Time::HiRes::sleep(0.02) }' "$log"
while :; do echo "$VVM_FENCING_TOKEN c $(date +%s%N)" >> "$log"; sleep 0.02; done"#;

pub fn store_of(dir: &Path) -> String {
    format!("sqlite:{}", dir.join("vvm.sqlite").display())
}

pub fn spawn(dir: &Path, address: &str, grace: &str, script: &str) -> Child {
    spawn_on(&store_of(dir), dir, address, grace, script)
}

pub fn spawn_on(store: &str, dir: &Path, address: &str, grace: &str, script: &str) -> Child {
    spawn_with(store, dir, address, grace, script, &[])
}

/// [`spawn_on`] with `extra` flags of `vvm run`.
pub fn spawn_with(
    store: &str,
    dir: &Path,
    address: &str,
    grace: &str,
    script: &str,
    extra: &[&str],
) -> Child {
    spawn_through(&[], store, dir, address, grace, script, extra)
}

/// [`spawn_with`] through a program that runs `vvm` (`wrapper`, e.g. `unshare --time …`).
pub fn spawn_through(
    wrapper: &[&str],
    store: &str,
    dir: &Path,
    address: &str,
    grace: &str,
    script: &str,
    extra: &[&str],
) -> Child {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(env!("CARGO_BIN_EXE_vvm"));
            command
        }
        None => Command::new(env!("CARGO_BIN_EXE_vvm")),
    };
    command
        .current_dir(dir)
        .args(["--log-level", "info", "run", "--store", store])
        // [`LEASE`] unless `extra` gives its own.
        .args(if extra.contains(&"--lease") {
            &[][..]
        } else {
            &["--lease", "2s"][..]
        })
        .args(["--round", "100ms", "--acquire", "60s"])
        .args(["--address", address, "--grace", grace])
        .args(extra)
        // Debug builds only: SIGUSR1 makes the command's service panic (`Fault::PanicVvm`).
        .env("VVM_FAULTS", "panic-on-sigusr1")
        // A backtrace of that panic, resolved in a debug build on a loaded machine, can hold a
        // runtime worker past the kill deadline: the panic, not the backtrace, is under test.
        .env("RUST_BACKTRACE", "0")
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{address}.stderr"))).unwrap())
        .spawn()
        .unwrap()
}

/// Each revision's lines: kinds seen, first and last time.
#[derive(Debug, Default, Clone)]
pub struct Tenure {
    pub kinds: Vec<String>,
    pub first_ns: u128,
    pub last_ns: u128,
}

pub fn tenures(log: &Path) -> BTreeMap<u64, Tenure> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out: BTreeMap<u64, Tenure> = BTreeMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(token), Some(kind), Some(at), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue; // a line cut by a kill
        };
        let (Ok(token), Ok(at)) = (token.parse::<vvm::FencingToken>(), at.parse::<u128>()) else {
            continue;
        };
        let revision = token.revision.0;
        let tenure = out.entry(revision).or_insert(Tenure {
            first_ns: at,
            last_ns: at,
            ..Tenure::default()
        });
        tenure.first_ns = tenure.first_ns.min(at);
        tenure.last_ns = tenure.last_ns.max(at);
        if !tenure.kinds.iter().any(|k| k == kind) {
            tenure.kinds.push(kind.to_owned());
        }
    }
    out
}

/// Waits until `check` holds on the log's tenures; panics with the log after `WAIT_MAX`.
pub fn wait_until(
    log: &Path,
    what: &str,
    check: impl Fn(&BTreeMap<u64, Tenure>) -> bool,
) -> BTreeMap<u64, Tenure> {
    let start = Instant::now();
    loop {
        let seen = tenures(log);
        if check(&seen) {
            return seen;
        }
        assert!(
            start.elapsed() < WAIT_MAX,
            "{what}: never; tenures {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The oracle: tenures in revision order never overlap in time.
pub fn assert_no_overlap(seen: &BTreeMap<u64, Tenure>, dir: &Path) {
    let list: Vec<_> = seen.iter().collect();
    for pair in list.windows(2) {
        let ((r1, a), (r2, b)) = (pair[0], pair[1]);
        assert!(
            a.last_ns < b.first_ns,
            "tenure {r1} acted until {:.3} s after tenure {r2} began: {seen:?}\n{}",
            (a.last_ns - b.first_ns) as f64 / 1e9,
            logs(dir)
        );
    }
}

/// Every `vvm`'s standard error in `dir`, for a failure's message.
pub fn logs(dir: &Path) -> String {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "stderr"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| {
            format!(
                "--- {}:\n{}",
                p.display(),
                std::fs::read_to_string(p).unwrap_or_default()
            )
        })
        .collect()
}

/// Orphans reach this process and are never reaped by it (see the module documentation).
pub fn become_a_careless_reaper() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
}

/// Both processes of the first tenure are acting.
pub fn both_act(seen: &BTreeMap<u64, Tenure>) -> bool {
    seen.values().next().is_some_and(|t| t.kinds.len() == 2)
}

/// The supervisor of `vvm`'s command: its child running `vvm __exec-guard`.
pub fn supervisor_of(vvm: &Child) -> rustix::process::Pid {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if parent == Some(vvm.id()) && String::from_utf8_lossy(&cmdline).contains("__exec-guard") {
            return rustix::process::Pid::from_raw(pid).unwrap();
        }
    }
    panic!("vvm {} has no supervisor", vvm.id());
}

/// The cgroup v2 path of `pid` (`/proc/PID/cgroup`, line `0::PATH`), if it runs.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Every descendant of `pid`, from the parent links of `/proc/*/stat` (a process started by
/// any thread of a multi-threaded parent is found).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        if let Some(parent) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
        {
            children.entry(parent).or_default().push(child);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).map_or(&[][..], Vec::as_slice) {
            found.push(child);
            next.push(child);
        }
    }
    found
}

/// The pid, as this process sees it, of the process that calls itself `pid` below `under`: a
/// command of `vvm run` runs in a PID namespace of its own where the kernel allows one, so the
/// pids it writes down (`$$`, `$!`) are that namespace's. `pid` itself when no descendant of
/// `under` has it as its innermost pid (no namespace).
pub fn host_pid(under: u32, pid: i32) -> i32 {
    for host in descendants(under) {
        let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap_or_default();
        let Some(ids) = status.lines().find_map(|line| line.strip_prefix("NSpid:")) else {
            continue;
        };
        let ids: Vec<i32> = ids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if ids.len() > 1 && ids.last() == Some(&pid) {
            return host as i32;
        }
    }
    pid
}

/// How a holder's record is removed from etcd behind its back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// `etcdctl del KEY`: the key goes, its lease stays.
    Delete,
    /// `etcdctl lease revoke LEASE`: the lease goes, and the key with it.
    Revoke,
}

/// Removes every slot record under `vvm run`'s default prefix on the etcd at `endpoints`, the
/// way an operator "unsticks" a lock (see [`Removal`]); the slots' other keys stay. Returns how
/// many records it removed.
pub fn remove_etcd_records(endpoints: &[String], how: Removal) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut raw = etcd_client::Client::connect(endpoints, None).await.unwrap();
        let prefix = "vvm/slot/";
        let mut removed = 0;
        // A renewal that replaced (and revoked) the lease just read leaves nothing to revoke:
        // read again.
        for _ in 0..50 {
            if removed > 0 {
                break;
            }
            let options = etcd_client::GetOptions::new().with_prefix();
            let records = raw.get(prefix, Some(options)).await.unwrap();
            removed += remove_records(&mut raw, records.kvs(), how).await;
        }
        removed
    })
}

async fn remove_records(
    raw: &mut etcd_client::Client,
    records: &[etcd_client::KeyValue],
    how: Removal,
) -> usize {
    let mut removed = 0;
    for record in records {
        // A slot record's key is the prefix and its slot number; the slot's other keys hold a
        // NUL, and sessions' records (`<prefix>session/…`) are not a slot's.
        let slot = record.key().strip_prefix(b"vvm/slot/").unwrap_or_default();
        if slot.is_empty() || !slot.iter().all(u8::is_ascii_digit) {
            continue;
        }
        match how {
            Removal::Delete => {
                raw.delete(record.key(), None).await.unwrap();
            }
            Removal::Revoke => {
                // Gone already when a renewal replaced and revoked it: nothing was removed.
                if raw.lease_revoke(record.lease()).await.is_err() {
                    continue;
                }
            }
        }
        removed += 1;
    }
    removed
}

/// Removes everything under `vvm run`'s default prefix on the etcd at `endpoints`, as an operator
/// wiping "the locks" would: every key at once (`etcdctl del --prefix vvm/slot/`), or every lease
/// those keys are bound to (`etcdctl lease revoke`, a session's lease among them). Returns how many
/// keys or leases it removed.
pub fn remove_etcd_prefix(endpoints: &[String], how: Removal) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut raw = etcd_client::Client::connect(endpoints, None).await.unwrap();
        let prefix = "vvm/slot/";
        match how {
            Removal::Delete => {
                let options = etcd_client::DeleteOptions::new().with_prefix();
                let deleted = raw.delete(prefix, Some(options)).await.unwrap();
                deleted.deleted() as usize
            }
            Removal::Revoke => {
                let options = etcd_client::GetOptions::new().with_prefix();
                let records = raw.get(prefix, Some(options)).await.unwrap();
                let mut leases: Vec<i64> = records.kvs().iter().map(|kv| kv.lease()).collect();
                leases.retain(|lease| *lease != 0);
                leases.sort_unstable();
                leases.dedup();
                let mut revoked = 0;
                for lease in leases {
                    if raw.lease_revoke(lease).await.is_ok() {
                        revoked += 1;
                    }
                }
                revoked
            }
        }
    })
}
