//! Starting the command straight into the tree's cgroup: `clone3` with `CLONE_INTO_CGROUP`.
//!
//! Moving a process between cgroups (a write to `cgroup.procs`) takes the kernel's
//! cgroup-threadgroup lock for writing, which waits for an RCU grace period when no move happened
//! just before: 6–14 ms measured here, on the path of every hand-off. A child created *into* the
//! cgroup takes that lock only for reading, as every fork does. The standard library's `Command`
//! cannot ask for it, so this is the one place that calls `clone3` itself; on a kernel without it
//! (before 5.7) the caller moves itself instead (see `cgroup.rs`).
//!
//! Only the supervisor calls it, and the supervisor is single-threaded: between `clone3` and
//! `execvp` the child runs nothing that another thread could have left locked, and it calls only
//! `setpgid`, `signal`, `sigprocmask`, `execvp`, `write` and `_exit`.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::pipe::PipeFlags;
use rustix::process::Pid;

/// `CLONE_INTO_CGROUP` (linux/sched.h): the child starts in the cgroup of `clone_args.cgroup`.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` as of Linux 5.7 (`CLONE_ARGS_SIZE_VER2`, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Why the command was not started into the cgroup.
#[derive(Debug)]
pub enum SpawnError {
    /// The kernel cannot do it (no `clone3`, or no `CLONE_INTO_CGROUP`): move instead.
    Unsupported,
    /// The program could not be executed (not found, not executable, …).
    Exec(std::io::Error),
    /// Anything else (no pipe, no process).
    Failed(std::io::Error),
}

/// Starts `program` with `args` as a child in the cgroup whose directory `cgroup` is open, in a
/// process group of its own, with this process's environment and descriptors (those not
/// close-on-exec). Returns once the program was executed, or why it was not.
pub fn spawn_into(
    cgroup: BorrowedFd<'_>,
    program: &OsStr,
    args: &[OsString],
) -> Result<Pid, SpawnError> {
    let failed = |e: std::io::Error| SpawnError::Failed(e);
    let nul = || SpawnError::Exec(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    let program = CString::new(program.as_bytes()).map_err(|_| nul())?;
    let mut argv = Vec::with_capacity(args.len() + 1);
    argv.push(program.clone());
    for arg in args {
        argv.push(CString::new(arg.as_bytes()).map_err(|_| nul())?);
    }
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // Written by the child only when its exec failed: the error number.
    let (report_read, report_write) =
        rustix::pipe::pipe_with(PipeFlags::CLOEXEC).map_err(|e| failed(e.into()))?;
    let report_fd = report_write.as_raw_fd();
    let cgroup = u64::try_from(cgroup.as_raw_fd()).map_err(|_| nul())?;
    let pid = clone3(CLONE_INTO_CGROUP, cgroup);
    if pid == 0 {
        // The child. SAFETY: every call below is async-signal-safe and uses only memory
        // prepared before the clone (this process has a single thread, so nothing is left
        // locked); the child never returns from this block.
        unsafe {
            libc::setpgid(0, 0);
            // Rust ignores SIGPIPE; a command starts with the default, as `Command` gives it.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::execvp(program.as_ptr(), pointers.as_ptr());
            let errno = *libc::__errno_location();
            let bytes = errno.to_le_bytes();
            libc::write(report_fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127);
        }
    }
    if pid < 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EOPNOTSUPP) => {
                SpawnError::Unsupported
            }
            _ => SpawnError::Failed(error),
        });
    }
    drop(report_write);
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| failed(std::io::Error::from(std::io::ErrorKind::InvalidData)))?;
    // Also from this side: the group exists before this process signals it.
    let _ = rustix::process::setpgid(Some(pid), Some(pid));
    let mut buf = [0_u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&report_read, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(failed(e.into())),
        }
    }
    if got == 0 {
        // End of file without a word: the exec closed the pipe. The program runs.
        return Ok(pid);
    }
    let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
    Err(SpawnError::Exec(std::io::Error::from_raw_os_error(
        i32::from_le_bytes(buf),
    )))
}

/// `clone3` with `flags` (and the cgroup directory `cgroup` when `CLONE_INTO_CGROUP` is among
/// them), as `fork` does otherwise: 0 in the child, the child's pid in the parent, or -1.
fn clone3(flags: u64, cgroup: u64) -> libc::c_long {
    let mut clone_args = CloneArgs {
        flags,
        exit_signal: libc::SIGCHLD as u64,
        cgroup,
        ..CloneArgs::default()
    };
    // SAFETY: `clone_args` is a valid `struct clone_args` of the size given, alive across the
    // call; no stack is given, so the child runs on a copy of this one, as after `fork`.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(clone_args),
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// `CLONE_NEWPID` (linux/sched.h): the child is the first process of a new PID namespace.
const CLONE_NEWPID: u64 = 0x2000_0000;

/// Where [`fork_init`] returns.
pub enum Forked {
    /// In the parent: the child's pid (in this process's namespace).
    Parent(Pid),
    /// In the child: the first process (pid 1) of a new PID namespace.
    Init,
}

/// Forks this process into the first process of a new PID namespace (and, with `cgroup`, into
/// that cgroup). Only the single-threaded supervisor calls it, so the child may run any code:
/// no other thread left a lock held. [`SpawnError::Unsupported`] where the kernel or the
/// privileges do not allow a PID namespace.
pub fn fork_init(cgroup: Option<BorrowedFd<'_>>) -> Result<Forked, SpawnError> {
    let (flags, dir) = match cgroup {
        Some(fd) => (
            CLONE_NEWPID | CLONE_INTO_CGROUP,
            u64::try_from(fd.as_raw_fd()).map_err(|_| SpawnError::Unsupported)?,
        ),
        None => (CLONE_NEWPID, 0),
    };
    let pid = clone3(flags, dir);
    if pid == 0 {
        return Ok(Forked::Init);
    }
    if pid < 0 {
        let error = std::io::Error::last_os_error();
        return Err(match error.raw_os_error() {
            Some(
                libc::ENOSYS
                | libc::EINVAL
                | libc::E2BIG
                | libc::EOPNOTSUPP
                | libc::EPERM
                | libc::ENOSPC
                | libc::EUSERS,
            ) => SpawnError::Unsupported,
            _ => SpawnError::Failed(error),
        });
    }
    i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .map(Forked::Parent)
        .ok_or_else(|| SpawnError::Failed(std::io::Error::from(std::io::ErrorKind::InvalidData)))
}

/// Sends SIGKILL to every process of this PID namespace but the caller: for its first process,
/// when the command has ended and nothing it started may outlive it.
pub fn kill_rest_of_namespace() {
    // Outside a namespace of its own, -1 would be every process this one may signal.
    if rustix::process::getpid().as_raw_pid() != 1 {
        return;
    }
    // SAFETY: `kill` with pid -1 only sends a signal; it touches no memory of this process.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
    }
}

/// Ends this process at once with `code`: no exit handlers, no buffers flushed (for the forked
/// first process of the namespace, whose buffers are the supervisor's copies).
pub fn exit_now(code: u8) -> ! {
    // SAFETY: `_exit` ends the process; it touches no memory of it.
    unsafe { libc::_exit(i32::from(code)) }
}

/// Does nothing: the handler of the termination signals in the supervisor.
extern "C" fn on_termination_signal(_: libc::c_int) {}

/// Makes SIGTERM, SIGINT and SIGHUP do nothing to the supervisor: a stop of the whole unit
/// (systemd's `KillMode=control-group` signals every process at once) or a closed terminal
/// must not end it before `vvm` has stopped the command gracefully. Handled, not ignored: `exec`
/// resets handled signals to their default, so the command still gets the usual ones.
pub fn survive_termination_signals() -> std::io::Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed `sigaction` is valid; the handler is an `extern "C"` function that
        // does nothing, so it is async-signal-safe.
        let failed = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_termination_signal as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut()) != 0
        };
        if failed {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Closes `fd` in the forked first process of the namespace, which never returns to the code
/// that owns it (so it is never closed twice).
pub fn close_in_child(fd: BorrowedFd<'_>) {
    // SAFETY: closing a descriptor touches no memory; its owner never runs again in this process.
    unsafe {
        libc::close(fd.as_raw_fd());
    }
}
