//! The first process of the command's PID namespace: a fork of the supervisor that starts the
//! command, reaps whatever is re-parented to it, and, once the command has exited, ends the rest
//! of the namespace and tells the supervisor how the command ended.
//!
//! Why a namespace: the kernel ends every process of a PID namespace when its first process
//! ends. So one `SIGKILL` to this process — from the supervisor, from `vvm`'s killer (which reads
//! its pid from an atomic), or from the kernel itself as this process's parent-death signal when
//! the supervisor dies — ends the whole tree, whatever it did to its group, session or parent,
//! and however stopped the supervisor or `vvm` are. No walk of `/proc` is needed for it.
//!
//! This process never reads `/proc`: the file system shows the host's process ids, and the ids
//! it would act on are the namespace's.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Signal, WaitOptions};

use super::{clone, start, Ended, Spawn, Start};

/// Records on the status pipe from this process to the supervisor: a tag and a value (8 bytes,
/// little-endian), written whole (below `PIPE_BUF`).
pub(super) const STARTED: u32 = 1;
/// The command could not be executed; the value is the error number.
pub(super) const CANNOT_START: u32 = 2;
/// Something of the first process's own failed; no command runs.
pub(super) const FAILED: u32 = 3;
/// The command exited; the value is its exit code.
pub(super) const EXITED: u32 = 4;
/// The command was ended by a signal; the value is the signal's number.
pub(super) const SIGNALLED: u32 = 5;
/// The supervisor ended the tree itself; the value is why (see `Why`). Only the supervisor's
/// own last record to `vvm` carries it.
pub(super) const ENDED: u32 = 6;
/// Most looks for processes left after the command's end: each look signals all of them, so a
/// second one finds none.
const ROUNDS_MAX: usize = 1_000;

/// Writes one record to the supervisor.
pub(super) fn send(to: &OwnedFd, tag: u32, value: i32) {
    let mut record = [0_u8; 8];
    record[..4].copy_from_slice(&tag.to_le_bytes());
    record[4..].copy_from_slice(&value.to_le_bytes());
    let _ = rustix::io::write(to, &record);
}

/// Decodes a record read from the status pipe.
pub(super) fn decode(record: [u8; 8]) -> (u32, i32) {
    let tag = u32::from_le_bytes([record[0], record[1], record[2], record[3]]);
    let value = i32::from_le_bytes([record[4], record[5], record[6], record[7]]);
    (tag, value)
}

/// Runs the namespace's first process; never returns. `life` is the read end of a pipe whose
/// write end only the supervisor holds; `status` is where the records above go.
pub(super) fn run(life: OwnedFd, status: OwnedFd, program: &OsStr, rest: &[OsString]) -> ! {
    // Ends with the supervisor, also a stopped or killed one; and with this process, the kernel
    // ends the namespace.
    if rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_err()
        || supervisor_gone(&life)
    {
        clone::exit_now(super::EXIT_ENDED);
    }
    let command = match start(program, rest, None, Spawn::IntoCgroup) {
        Ok(command) => command,
        Err(Start::CannotStart(e)) => {
            send(&status, CANNOT_START, e.raw_os_error().unwrap_or(0));
            clone::exit_now(super::EXIT_CANNOT_START);
        }
        Err(Start::Failed(_)) => {
            send(&status, FAILED, 0);
            clone::exit_now(super::EXIT_ENDED);
        }
    };
    send(&status, STARTED, 0);
    let ended = loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, how))) if pid == command => break Ended::from_wait(how),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break None,
        }
    };
    // Nothing the command started may outlive it.
    for _ in 0..ROUNDS_MAX {
        clone::kill_rest_of_namespace();
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    match ended {
        Some(Ended::Code(code)) => send(&status, EXITED, code),
        Some(Ended::Signal(signal)) => send(&status, SIGNALLED, signal),
        None => send(&status, FAILED, 0),
    }
    clone::exit_now(0);
}

/// The supervisor's end of `life` is closed: it died before this process could ask the kernel
/// to follow it.
fn supervisor_gone(life: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(life, PollFlags::IN)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}
