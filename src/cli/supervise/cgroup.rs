//! A cgroup v2 directory for the command's tree: every process the command starts is in it,
//! whatever it does to its process group, session or parent, and one write to `cgroup.kill`
//! ends them all at once — no walk of `/proc`, no race with a process that forks meanwhile.
//!
//! The directory is `vvm-tree-<supervisor pid>-<its start time>` under the cgroup the supervisor
//! started in (the start time, in clock ticks since boot, tells a supervisor from a later process
//! that reused its pid), on
//! the cgroup2 mount of the host (`/sys/fs/cgroup` or, on hybrid hosts,
//! `/sys/fs/cgroup/unified`). The supervisor starts the command into it (`clone.rs`: created
//! there, atomically, so the command was never outside it), or, where the kernel cannot, moves
//! itself in for the spawn and back out; it is never killed with the tree. Making it needs write access to the
//! supervisor's own cgroup (root, or a cgroup delegated by systemd, `Delegate=yes`); without it
//! the subreaper alone contains the tree.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// Prefix of the directories made for command trees.
pub const DIR_PREFIX: &str = "vvm-tree-";
/// Most attempts at removing the directory while the kernel still counts a process in it.
const REMOVE_TRIES: u32 = 100;

/// The cgroup of a command's tree, while the supervisor runs.
#[derive(Debug)]
pub struct TreeCgroup {
    dir: PathBuf,
    origin: PathBuf,
    /// `cgroup.kill`, opened before it is needed: ending the tree is one write.
    kill: OwnedFd,
    /// The directory itself, for `clone3` (`CLONE_INTO_CGROUP`).
    dir_fd: OwnedFd,
}

/// The directory of this process's cgroup v2, under the cgroup2 mount.
pub fn own_dir() -> Result<PathBuf, String> {
    let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let path = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or("this process has no cgroup v2")?;
    Ok(mount.join(path.trim_start_matches('/')))
}

/// Where the cgroup2 file system is mounted, from `/proc/self/mountinfo`.
fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if after.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        // Field 5 is the mount point; spaces in it are written as `\040`.
        let point = before.split_whitespace().nth(4)?;
        Some(PathBuf::from(point.replace("\\040", " ")))
    })
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot), on
/// the host's boot clock: with the pid, an identity no later process can have. The kernel shows
/// it shifted by the reader's time namespace, so that offset is taken off: supervisors in
/// different time namespaces name and judge one another alike.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_time_in(&stat, boottime_offset_ticks())
}

/// The start time in a `/proc/PID/stat` line, less `offset_ticks`.
fn start_time_in(stat: &str, offset_ticks: i64) -> Option<u64> {
    // After the name: state is field 3, so the start time is the 20th field after the name.
    let ticks: i64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    u64::try_from(ticks.checked_sub(offset_ticks)?).ok()
}

/// Clock ticks per second of `/proc` times (`USER_HZ`: 100 on Linux, whatever `HZ` is).
const USER_HZ: i64 = 100;

/// This process's time namespace's boot-clock offset, in clock ticks (0 without one, or when it
/// cannot be read: then every supervisor reads the same, unshifted view).
fn boottime_offset_ticks() -> i64 {
    static OFFSET: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *OFFSET.get_or_init(|| {
        vvm_adapters::sqlite::boottime_offset_ns().map_or(0, |ns| ns / (1_000_000_000 / USER_HZ))
    })
}

/// The directory a supervisor with pid `supervisor`, started at `started` ([`start_time`]),
/// makes for its tree, under `origin`.
pub fn tree_dir(origin: &Path, supervisor: i32, started: u64) -> PathBuf {
    origin.join(format!("{DIR_PREFIX}{supervisor}-{started}"))
}

/// The supervisor's pid and start time in a tree directory's name.
fn owner_of(name: &str) -> Option<(i32, u64)> {
    let (pid, started) = name.strip_prefix(DIR_PREFIX)?.split_once('-')?;
    Some((pid.parse().ok()?, started.parse().ok()?))
}

/// Whether a cgroup can be made for a command's tree here, and ended at once: makes one, opens
/// its `cgroup.kill` (what ending the tree relies on; Linux 5.14), and removes it. Used by `vvm
/// run --containment strict` before it opens the store.
pub fn probe() -> Result<(), String> {
    let origin = own_dir()?;
    let dir = origin.join(format!("{DIR_PREFIX}probe-{}", std::process::id()));
    std::fs::create_dir(&dir)
        .map_err(|e| format!("cannot make a cgroup in {}: {e}", origin.display()))?;
    let kill = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.kill"));
    let _ = std::fs::remove_dir(&dir);
    kill.map(drop)
        .map_err(|e| format!("no cgroup.kill in {}: {e}", origin.display()))
}

/// Writes `text` to the cgroup file `path`.
fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Most time given to the kernel to empty an orphaned tree's cgroup after `cgroup.kill`.
const ORPHAN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether the supervisor that made a directory still runs: the process with its pid has its
/// start time (a later process reusing the pid has another) and is not a zombie (dead, not yet
/// reaped by a parent that may never reap it).
fn supervisor_lives(pid: i32, started: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = super::tree::state_of(&stat);
    !matches!(state, Some("Z" | "X"))
        && start_time_in(&stat, boottime_offset_ticks()) == Some(started)
}

/// Ends the trees in `origin` whose supervisor is gone — `vvm` and its supervisor killed
/// together (an OOM kill of both) leave the tree running in its cgroup, with nothing to end
/// it — and removes their directories. Returns one description per tree that held a process
/// (its directory and processes; an empty leftover directory, or one whose last process was
/// already exiting, is removed without a word); an error when one is still populated after
/// [`ORPHAN_WAIT`]: the command must not start beside it. Run by every supervisor before it
/// starts its command, so a successor on this host never runs beside such a tree.
pub fn end_orphaned_trees(origin: &Path) -> Result<Vec<String>, String> {
    let Ok(entries) = std::fs::read_dir(origin) else {
        return Ok(Vec::new());
    };
    let mut ended = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, started)) = name.to_str().and_then(owner_of) else {
            continue;
        };
        if supervisor_lives(pid, started) {
            continue;
        }
        let dir = entry.path();
        if is_populated(&dir) {
            let processes = processes_in(&dir);
            kill_dir(&dir);
            if !processes.is_empty() {
                ended.push(format!(
                    "{} ({})",
                    name.to_string_lossy(),
                    processes.join(", ")
                ));
            }
        }
        let until = std::time::Instant::now() + ORPHAN_WAIT;
        while is_populated(&dir) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if is_populated(&dir) {
            return Err(format!(
                "an earlier command's tree in {} could not be ended",
                dir.display()
            ));
        }
        remove_dir(&dir);
    }
    Ok(ended)
}

/// The processes `cgroup.procs` lists in `dir`, as `name pid`, at most [`NAMED_MAX`] of them
/// named and the rest counted.
fn processes_in(dir: &Path) -> Vec<String> {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let pids: Vec<&str> = procs.split_whitespace().collect();
    let mut named: Vec<String> = pids
        .iter()
        .take(NAMED_MAX)
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{} {pid}", comm.trim())
        })
        .collect();
    if pids.len() > NAMED_MAX {
        named.push(format!("{} more", pids.len() - NAMED_MAX));
    }
    named
}

/// Processes named in the line about an orphaned tree.
const NAMED_MAX: usize = 4;

/// `populated 1` in the cgroup's `cgroup.events`: a process (or a zombie) is still counted.
fn is_populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|events| events.lines().any(|line| line == "populated 1"))
}

impl TreeCgroup {
    /// Makes the tree's cgroup, for a child to be started into it (see `clone.rs`). Trees left
    /// by supervisors that are gone are ended first ([`end_orphaned_trees`]).
    pub fn make() -> Result<TreeCgroup, String> {
        let origin = own_dir()?;
        for tree in end_orphaned_trees(&origin)? {
            super::super::log::line_at(
                &format!(
                    "supervisor: ended the process tree {tree} of an earlier vvm run whose vvm \
                     and supervisor were gone"
                ),
                "WARN",
            );
        }
        let me = std::process::id().try_into().unwrap_or(i32::MAX);
        let started = start_time(me).ok_or("cannot read this process's start time")?;
        let dir = tree_dir(&origin, me, started);
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot make the cgroup {}: {e}", dir.display()))?;
        let kill = match std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.kill"))
        {
            Ok(file) => OwnedFd::from(file),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                // Before Linux 5.14 there is no `cgroup.kill`.
                return Err(format!("no cgroup.kill in {}: {e}", dir.display()));
            }
        };
        let dir_fd = match std::fs::File::open(&dir) {
            Ok(file) => OwnedFd::from(file),
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(format!("cannot open the cgroup {}: {e}", dir.display()));
            }
        };
        Ok(TreeCgroup {
            dir,
            origin,
            kill,
            dir_fd,
        })
    }

    /// The directory, open: what `CLONE_INTO_CGROUP` names.
    pub fn dir_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.dir_fd.as_fd()
    }

    /// Moves this process into the cgroup, so that the next child is born there: where the
    /// kernel cannot start a child into it directly. [`leave`](Self::leave) after the spawn.
    pub fn enter(&self) -> Result<(), String> {
        write_file(&self.dir.join("cgroup.procs"), "0")
    }

    /// Moves this process back to the cgroup it came from, leaving the command in the tree's.
    pub fn leave(&self) -> Result<(), String> {
        write_file(&self.origin.join("cgroup.procs"), "0")
    }

    /// SIGKILL to every process in the cgroup, at once. One write to a file opened beforehand:
    /// it cannot block on anything the tree does.
    pub fn kill(&self) {
        let _ = rustix::io::write(&self.kill, b"1");
    }

    /// Removes the directory once the kernel no longer counts a process in it (right after the
    /// last one was reaped it may still, briefly). Best effort: a directory left behind is
    /// empty and harmless, and `vvm` removes it too.
    pub fn remove(self) {
        remove_dir(&self.dir);
    }
}

/// The tree's cgroup of the supervisor `supervisor` (started at `started`) when it is still
/// there: for `vvm`, after its supervisor is gone (killed before it could end the tree and
/// remove the directory itself).
pub fn leftover_tree(supervisor: i32, started: u64) -> Option<PathBuf> {
    let dir = tree_dir(&own_dir().ok()?, supervisor, started);
    dir.exists().then_some(dir)
}

/// SIGKILL to every process in the cgroup `dir`.
pub fn kill_dir(dir: &Path) {
    let _ = write_file(&dir.join("cgroup.kill"), "1");
}

/// Removes an empty cgroup directory, waiting briefly while the kernel still counts a process
/// that was just reaped.
pub fn remove_dir(dir: &Path) {
    for _ in 0..REMOVE_TRIES {
        match std::fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_are_read_after_the_name_and_taken_to_the_hosts_clock() {
        let stat = "12 (a) b) (c) S 1 12 12 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 5000 0";
        assert_eq!(start_time_in(stat, 0), Some(5000));
        // A reader 300 s behind the host (offset -300 s) sees 30 000 ticks less.
        assert_eq!(start_time_in(stat, -30_000), Some(35_000));
        assert_eq!(start_time_in(stat, 6_000), None);
        assert_eq!(start_time_in("12 (x) S 1", 0), None);
    }
}
