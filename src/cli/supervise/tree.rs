//! The supervisor's descendants, found from `/proc`, and the way they are ended.
//!
//! The supervisor is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant whose parent
//! dies — a daemon's double fork, a `setsid` and exit — is re-parented to it, never to the
//! system's first process. So every process the command started is, at any moment, a
//! descendant of the supervisor: reachable by following parent links down from it. Ending the
//! tree is then: signal every descendant found, reap, look again, until none is left. A process
//! forked during a look is a child of one being killed; once that parent is gone it is the
//! supervisor's child, found by the next look.

use std::collections::HashMap;

use rustix::process::{kill_process, kill_process_group, Pid, Signal, WaitOptions};

/// Most looks at `/proc` while ending the tree: a bound for a tree that forks faster than it
/// can be killed (which SIGKILL does not allow for long).
const ROUNDS_MAX: usize = 1_000;
/// Most processes one look collects; the rest are found by the next look.
const FOUND_MAX: usize = 65_536;

/// The processes below `root` now (not `root` itself), with each one's parent: one read of
/// `/proc`, then a walk down a map of children, so the cost is linear in the processes of the
/// host. Processes that end during the look are simply missing from it.
fn descendants_with_parents(root: Pid) -> Vec<(Pid, i32)> {
    descendants_with(root)
        .into_iter()
        .map(|(pid, parent, _)| (pid, parent))
        .collect()
}

/// The children of `parent` now, from `/proc`: from the kernel's list of each of its threads'
/// children (a few small reads), or, where the kernel keeps none, from a look at every process.
pub fn children_of(parent: Pid) -> Vec<Pid> {
    if let Some(children) = listed_children(parent) {
        return children;
    }
    descendants_with(parent)
        .into_iter()
        .filter(|&(_, of, _)| of == parent.as_raw_pid())
        .map(|(pid, _, _)| pid)
        .collect()
}

/// The children of `parent` from `/proc/PID/task/TID/children` of each of its threads; `None`
/// when a list cannot be read (a kernel without them, or `parent` gone).
fn listed_children(parent: Pid) -> Option<Vec<Pid>> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", parent.as_raw_pid())).ok()?;
    let mut children = Vec::new();
    for task in tasks {
        let list = std::fs::read_to_string(task.ok()?.path().join("children")).ok()?;
        children.extend(
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .filter_map(Pid::from_raw),
        );
        if children.len() >= FOUND_MAX {
            break;
        }
    }
    Some(children)
}

/// Every process below `root`, with its parent and its process group.
fn descendants_with(root: Pid) -> Vec<(Pid, i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<(i32, i32)>> = HashMap::new();
    let mut seen = 0;
    for entry in entries.flatten() {
        if seen >= FOUND_MAX {
            break;
        }
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            if let (Some(parent), Some(group)) = (parent_of(&stat), group_of(&stat)) {
                children.entry(parent).or_default().push((pid, group));
                seen += 1;
            }
        }
    }
    let mut found = Vec::new();
    let mut parents = vec![root.as_raw_pid()];
    while let Some(parent) = parents.pop() {
        for &(pid, group) in children.get(&parent).map_or(&[][..], Vec::as_slice) {
            parents.push(pid);
            if let Some(pid) = Pid::from_raw(pid) {
                found.push((pid, parent, group));
            }
        }
    }
    found
}

/// The fields of a `/proc/PID/stat` line after the command name, which is in parentheses and
/// may itself hold spaces and parentheses: the state first, then the parent pid, ….
fn fields_after_name(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace())
}

/// The parent pid in a `/proc/PID/stat` line.
pub fn parent_of(stat: &str) -> Option<i32> {
    fields_after_name(stat)?.nth(1)?.parse().ok()
}

/// The process group in a `/proc/PID/stat` line.
pub fn group_of(stat: &str) -> Option<i32> {
    fields_after_name(stat)?.nth(2)?.parse().ok()
}

/// The state letter in a `/proc/PID/stat` line (`R`, `S`, `T` stopped, `Z` zombie, …).
pub fn state_of(stat: &str) -> Option<&str> {
    fields_after_name(stat)?.next()
}

/// Sends each of `signals`, in order, once to every process of the tree: to the command's group
/// (one call per signal), then to every other descendant of this process — not to the group's
/// members again (a program may read a second SIGTERM as "quit now"), nor to `spared`. One look
/// at `/proc` for all of them.
pub fn signal_all(group: Option<Pid>, spared: Option<Pid>, signals: &[Signal]) {
    if let Some(group) = group {
        for &signal in signals {
            let _ = kill_process_group(group, signal);
        }
    }
    let group = group.map(Pid::as_raw_pid);
    for (pid, _, of) in descendants_with(rustix::process::getpid()) {
        if Some(of) != group && Some(pid) != spared {
            for &signal in signals {
                let _ = kill_process(pid, signal);
            }
        }
    }
}

/// Whether this process has a child, ended or not (one system call; an error counts as "yes",
/// so that the caller looks).
fn has_children() -> bool {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    // Not reaped here (`NOWAIT`): whoever waits for its children still finds them.
    let options = WaitIdOptions::EXITED
        | WaitIdOptions::STOPPED
        | WaitIdOptions::CONTINUED
        | WaitIdOptions::NOHANG
        | WaitIdOptions::NOWAIT;
    !matches!(waitid(WaitId::All, options), Err(rustix::io::Errno::CHILD))
}

/// Reaps every child that has ended, without waiting. Returns the ones reaped with their status.
pub fn reap(mut each: impl FnMut(Pid, rustix::process::WaitStatus)) {
    while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
        each(pid, status);
    }
}

/// Ends the whole tree: SIGKILL to the command's group (one call, first), then to every
/// descendant found, reaping, until this process has no child left. Returns whether it got
/// there within [`ROUNDS_MAX`] looks.
pub fn end_all(group: Option<Pid>, mut each: impl FnMut(Pid, rustix::process::WaitStatus)) -> bool {
    for _ in 0..ROUNDS_MAX {
        if !has_children() {
            // A subreaper without a child has no descendant (an orphan comes to it): nothing
            // to look for in `/proc` — the common end, once a namespace's first process is
            // reaped (the kernel ended the namespace with it).
            return true;
        }
        signal_all(group, None, &[Signal::KILL]);
        // Every child got SIGKILL, so this wait returns promptly. ECHILD: no child is left, and
        // none can appear (only our children could fork, and they are gone).
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) => each(pid, status),
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
        // Whatever else has ended; the children these leave behind are re-parented to us and
        // signalled by the next look.
        reap(&mut each);
    }
    false
}

/// Ends every descendant of this process, reaping each one it killed by its pid only: for a
/// process whose other children are reaped elsewhere (the async runtime reaps the ones it
/// started). Used by `vvm run`, itself a subreaper, after its supervisor is gone: whatever the
/// supervisor left (killed before it could end the tree) was re-parented to `vvm`. Returns
/// whether none was left within [`ROUNDS_MAX`] looks.
pub fn end_descendants_by_pid() -> bool {
    let me = rustix::process::getpid();
    for _ in 0..ROUNDS_MAX {
        if !has_children() {
            return true;
        }
        let found = descendants_with_parents(me);
        if found.is_empty() {
            return true;
        }
        for &(pid, _) in &found {
            let _ = kill_process(pid, Signal::KILL);
        }
        // Only our own children can be reaped here; their children are ours next round.
        for (pid, parent) in found {
            if parent == me.as_raw_pid() {
                let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_is_read_after_the_last_parenthesis() {
        assert_eq!(parent_of("12 (sh) S 7 12 12 0 -1"), Some(7));
        assert_eq!(parent_of("12 (a) b) (c) R 99 12 12"), Some(99));
        assert_eq!(parent_of("12 (x)"), None);
        assert_eq!(parent_of("garbage"), None);
        assert_eq!(group_of("12 (a) b) (c) R 99 12 7"), Some(12));
        assert_eq!(group_of("12 (x) R 1"), None);
    }

    #[test]
    fn a_child_is_found_among_the_descendants() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let me = rustix::process::getpid();
        let found = children_of(me);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            found
                .iter()
                .any(|pid| pid.as_raw_pid() == child.id() as i32),
            "{found:?}"
        );
    }
}
