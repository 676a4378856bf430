//! `vvm __exec-guard`: the supervisor between `vvm run` and its command.
//!
//! `vvm run -- CMD` does not start the command itself: it starts this binary in a hidden mode,
//! which starts the command and watches over it. The supervisor is a separate, single-threaded
//! process that outlives and out-watches `vvm`:
//!
//! - **Its own copy of the kill deadline.** `vvm` writes every new kill deadline to a pipe
//!   (8 bytes, little-endian, `CLOCK_BOOTTIME` nanoseconds, a clock every process of the host
//!   shares and which keeps running while the host is suspended). When the deadline passes
//!   unextended the supervisor ends the whole tree: a stopped `vvm` (SIGSTOP, a debugger, job
//!   control) cannot keep its command alive.
//! - **`vvm`'s death.** End of file on that pipe means `vvm` is gone (killed, crashed): the tree
//!   is ended at once.
//! - **The tree, not the group.** The supervisor is a child subreaper: whatever the command
//!   starts stays its descendant, also after `setsid`, a double fork or closing every
//!   descriptor, so it is found and ended (see [`tree`]). It reaps every descendant itself, so
//!   a hand-off never waits for the system's first process to reap an orphan.
//! - **The slot stays taken while any of the tree lives.** The SQLite slot locks `vvm` holds are
//!   inherited by the supervisor and kept from the command (close-on-exec): they are released
//!   when the supervisor exits, which is only after it reaped the last process of the tree. So
//!   are the sockets of PostgreSQL's session marks (`death=advisory-lock`): the server frees a
//!   session's advisory lock only when the last descriptor of its connection closes.
//!
//! A graceful stop is a record of `0` on the pipe: SIGTERM, then SIGCONT (so that a stopped
//! process sees it), to the command's group and to every other descendant; a record of `1` ends the tree at once (a second Ctrl-C). When the command exits, whatever it left is SIGKILLed and the supervisor
//! exits as the command did (same code, or 128 + N for signal N).
//!
//! - **A PID namespace of its own**, where the kernel allows one (root; see [`init`]): the
//!   command runs under a first process forked from the supervisor, and the end of that process
//!   is the end of every process of the tree, by the kernel. `vvm`'s killer sends it SIGKILL;
//!   the kernel sends it SIGKILL when the supervisor dies (its parent-death signal), and the
//!   supervisor when `vvm` dies — also when either of them is stopped.
//! - **Termination signals do not end it.** SIGTERM, SIGINT and SIGHUP do nothing to the
//!   supervisor (a stop of a whole systemd unit signals every process at once): the stop is
//!   `vvm`'s to drive, through the pipe.
//!
//! Without a PID namespace (an unprivileged user) the cgroup's `cgroup.kill` and `vvm`'s own
//! sweep as a subreaper take its place.

pub mod cgroup;
mod clone;
mod deadman;
mod init;
pub mod tree;

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use rustix::event::{PollFd, PollFlags};
use rustix::io::FdFlags;
use rustix::process::{Pid, Signal, WaitStatus};

use super::fail;

/// Exit code of the supervisor when the command cannot be started, as a shell's "command not
/// found".
pub const EXIT_CANNOT_START: u8 = 127;
/// Exit code of the supervisor when it ended the tree because the kill deadline passed or `vvm`
/// died (the code `vvm` itself exits with when its kill deadline passes).
pub const EXIT_ENDED: u8 = 75;
/// Exit code of the supervisor when `--containment strict` is asked and no cgroup can be made.
pub const EXIT_NO_CONTAINMENT: u8 = 78;
/// Bytes of the report: the command's pid (4, little-endian; 0 when it could not be found), its
/// [`Containment`] (1), and the pid of the namespace's first process (4; 0 without a namespace).
pub const REPORT_BYTES: usize = 9;
/// A record on the control pipe that asks for a graceful stop (no deadline is 0).
pub const STOP: u64 = 0;
/// A record on the control pipe that asks to end the tree at once (no deadline is 1 ns after
/// boot).
pub const KILL_NOW: u64 = 1;
/// Longest time the supervisor may take to end the tree and exit once it has begun: past it,
/// its own timer ends it (and so the namespace).
const ENDING_MAX_NS: u64 = 10_000_000_000;
/// How often orphans re-parented to the supervisor are reaped while the command runs.
const REAP_TICK_MS: i64 = 100;

/// What the supervisor is told on its command line by `vvm run`.
#[derive(Debug)]
pub struct Supervision {
    /// The `vvm run` process; the supervisor gives up if its parent is another one.
    pub parent: i32,
    /// Read end of the control pipe (deadlines, stop), inherited.
    pub control: i32,
    /// Write end of the report pipe: the command's pid (4 bytes), once it started.
    pub report: i32,
    /// The first kill deadline, `CLOCK_BOOTTIME` nanoseconds.
    pub deadline_ns: u64,
    /// Inherited descriptors to keep from the command and hold until the tree is gone.
    pub hold: Vec<i32>,
    /// Program and arguments.
    pub command: Vec<OsString>,
    /// Refuse to start the command without a cgroup for its tree.
    pub strict: bool,
    /// Make no cgroup for the tree.
    pub no_cgroup: bool,
    /// Start the command in no PID namespace of its own.
    pub no_namespace: bool,
    /// Arm no kernel watchdog (debug builds' fault hook, `VVM_FAULTS=no-kernel-watchdogs`).
    pub no_kernel_watchdogs: bool,
}

/// How the command's tree is contained, as reported to `vvm` after the command's pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Containment {
    /// A cgroup v2 directory of its own (`cgroup.kill`).
    pub cgroup: bool,
    /// A PID namespace of its own (see [`init`]).
    pub namespace: bool,
}

impl Containment {
    /// As the byte of the report.
    pub fn to_byte(self) -> u8 {
        u8::from(self.cgroup) | (u8::from(self.namespace) << 1)
    }

    /// From the byte of the report; unknown bits are ignored.
    pub fn from_byte(byte: u8) -> Containment {
        Containment {
            cgroup: byte & 1 != 0,
            namespace: byte & 2 != 0,
        }
    }

    /// The name logged.
    pub fn name(self) -> &'static str {
        match (self.namespace, self.cgroup) {
            (true, true) => "pid-namespace+cgroup",
            (true, false) => "pid-namespace",
            (false, true) => "cgroup",
            (false, false) => "subreaper",
        }
    }
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl Ended {
    fn from_wait(status: WaitStatus) -> Option<Ended> {
        status
            .exit_status()
            .map(Ended::Code)
            .or_else(|| status.terminating_signal().map(Ended::Signal))
    }
}

/// Why the supervisor ended the tree itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The kill deadline passed unextended.
    Deadline = 1,
    /// `vvm` is gone (end of the control pipe).
    VvmGone = 2,
    /// `vvm` asked for it (a second signal).
    Asked = 3,
    /// The supervisor could not go on watching (a failed wait or pipe).
    Failed = 4,
    /// The command's end could not be learnt.
    Unknown = 5,
}

impl Why {
    fn from_value(value: i32) -> Why {
        match value {
            1 => Why::Deadline,
            2 => Why::VvmGone,
            3 => Why::Asked,
            4 => Why::Failed,
            _ => Why::Unknown,
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Deadline => "the kill deadline passed unextended",
            Why::VvmGone => "vvm is gone",
            Why::Asked => "vvm asked for it (a second signal)",
            Why::Failed => "the supervisor could not go on watching",
            Why::Unknown => "the command's end could not be learnt",
        })
    }
}

/// How the command ended: the supervisor's last record on the report pipe (8 bytes: a tag and
/// a value, little-endian), written once nothing of the tree is left. A supervisor that ended
/// without it was killed itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited with this code.
    Exited(i32),
    /// A signal of this number ended the command.
    Signalled(i32),
    /// The supervisor ended the tree itself.
    Ended(Why),
}

impl Outcome {
    /// The record.
    pub fn encode(self) -> [u8; 8] {
        let (tag, value) = match self {
            Outcome::Exited(code) => (init::EXITED, code),
            Outcome::Signalled(signal) => (init::SIGNALLED, signal),
            Outcome::Ended(why) => (init::ENDED, why as i32),
        };
        let mut record = [0_u8; 8];
        record[..4].copy_from_slice(&tag.to_le_bytes());
        record[4..].copy_from_slice(&value.to_le_bytes());
        record
    }

    /// From the record; `None` for an unknown tag.
    pub fn decode(record: [u8; 8]) -> Option<Outcome> {
        let (tag, value) = init::decode(record);
        match tag {
            init::EXITED => Some(Outcome::Exited(value)),
            init::SIGNALLED => Some(Outcome::Signalled(value)),
            init::ENDED => Some(Outcome::Ended(Why::from_value(value))),
            _ => None,
        }
    }
}

/// Nanoseconds of `CLOCK_BOOTTIME`: the clock both sides of the control pipe read.
pub fn boot_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    // Both fields are non-negative for this clock.
    (now.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec as u64)
}

/// Takes ownership of descriptor `fd`, inherited from `vvm run`, which made it for this process
/// and named it on the command line. Refuses the standard streams and numbers that are not open.
fn adopt(fd: i32) -> Result<OwnedFd, String> {
    if fd <= 2 || std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(format!("descriptor {fd} is not open"));
    }
    // SAFETY: `fd` is open (checked above) and owned by nothing else in this process: `vvm run`
    // passed it to this newly executed, single-threaded program for it alone, and it is adopted
    // once (the numbers come from one command line and are distinct per purpose).
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The supervisor's state while the command runs.
struct Watch {
    /// The command's process group (its pid, in this process's namespace).
    group: Option<Pid>,
    /// The child whose end is the command's: the command itself, or the namespace's first
    /// process.
    child: Pid,
    /// Without a namespace, the command's status comes from reaping it.
    reaps_command: bool,
    /// Where the namespace's first process reports the command's end.
    status_pipe: Option<OwnedFd>,
    status: Option<Ended>,
    /// The namespace's first process has told how the command ended (or cannot any more).
    done: bool,
}

impl Watch {
    fn note(&mut self, pid: Pid, status: WaitStatus) {
        if pid != self.child {
            return;
        }
        if self.reaps_command {
            self.status = Ended::from_wait(status);
        }
        self.done = true;
    }

    /// Processes never signalled one by one: the namespace's first process (its end is the
    /// tree's; a termination signal does nothing to it).
    fn spared(&self) -> Option<Pid> {
        (!self.reaps_command).then_some(self.child)
    }
}

/// Runs the supervisor; see the module documentation. Exits as the command did, or with
/// [`EXIT_ENDED`] when it ended the tree itself, or [`EXIT_CANNOT_START`].
pub fn supervise(args: Supervision) -> ExitCode {
    let control = match adopt(args.control) {
        Ok(fd) => fd,
        Err(e) => return fail(&format!("supervisor: control pipe: {e}")),
    };
    let report = match adopt(args.report) {
        Ok(fd) => fd,
        Err(e) => return fail(&format!("supervisor: report pipe: {e}")),
    };
    let mut held = Vec::with_capacity(args.hold.len());
    for fd in &args.hold {
        match adopt(*fd) {
            Ok(fd) => held.push(fd),
            Err(e) => return fail(&format!("supervisor: slot lock: {e}")),
        }
    }
    // Nothing of ours reaches the command: it must not hold the slot locks (they mark the tree
    // alive only through this process) nor see the pipes.
    for fd in held.iter().chain([&control, &report]) {
        if let Err(e) = rustix::io::fcntl_setfd(fd, FdFlags::CLOEXEC) {
            return fail(&format!(
                "supervisor: cannot keep a descriptor to itself: {e}"
            ));
        }
    }
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        return fail(&format!("supervisor: cannot become a subreaper: {e}"));
    }
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(args.parent) {
        return fail("supervisor: vvm ended before the command started");
    }
    if let Err(e) = clone::survive_termination_signals() {
        return fail(&format!("supervisor: cannot handle signals: {e}"));
    }
    let Some((program, rest)) = args.command.split_first() else {
        return fail("supervisor: no command");
    };
    // The command is born in the tree's cgroup, when one can be made.
    let made = if args.no_cgroup {
        Err("not asked for".to_owned())
    } else {
        cgroup::TreeCgroup::make()
    };
    let cgroup = match made {
        Ok(cgroup) => Some(cgroup),
        Err(e) if args.strict => {
            super::log::line(&format!("--containment strict: {e}"));
            return ExitCode::from(EXIT_NO_CONTAINMENT);
        }
        Err(_) => None,
    };
    let in_namespace = match args.no_namespace {
        true => None,
        false => start_in_namespace(program, rest, cgroup.as_ref(), &[&control, &report]),
    };
    let started = match in_namespace {
        Some(started) => started,
        None => start(program, rest, cgroup.as_ref(), Spawn::IntoCgroup).map(|pid| Started {
            command: Some(pid),
            init: None,
        }),
    };
    let started = match started {
        Ok(started) => started,
        Err(Start::CannotStart(e)) => {
            if let Some(cgroup) = cgroup {
                cgroup.remove();
            }
            super::log::line(&format!("cannot start {}: {e}", program.to_string_lossy()));
            return ExitCode::from(EXIT_CANNOT_START);
        }
        Err(Start::Failed(e)) => {
            if let Some(cgroup) = cgroup {
                cgroup.remove();
            }
            return fail(&format!("supervisor: {e}"));
        }
    };
    let containment = Containment {
        cgroup: cgroup.is_some(),
        namespace: started.init.is_some(),
    };
    // In a namespace, this process's end is the tree's (its first process follows it), so the
    // kernel may end it: when `vvm` dies (the parent-death signal; a `vvm` that died before is
    // seen as the end of the control pipe), and at the deadline when it cannot act itself (a
    // SIGKILL timer). Without a namespace its end would leave the tree running: it ends the tree
    // itself, as long as it runs.
    let deadman = match containment.namespace && !args.no_kernel_watchdogs {
        true => match arm_kernel_watchdogs(args.deadline_ns) {
            Ok(deadman) => Some(deadman),
            Err(e) => return fail(&format!("supervisor: {e}")),
        },
        false => None,
    };
    let mut report = std::fs::File::from(report);
    // `vvm` reads this to signal the group itself; if it is gone the pipe says so below. The
    // pipe stays open for the last record: how the command ended.
    let mut record = [0_u8; REPORT_BYTES];
    let command_pid = started.command.map_or(0, Pid::as_raw_pid);
    record[..4].copy_from_slice(&command_pid.to_le_bytes());
    record[4] = containment.to_byte();
    let init_pid = started.init.as_ref().map_or(0, |(pid, _)| pid.as_raw_pid());
    record[5..].copy_from_slice(&init_pid.to_le_bytes());
    let _ = report.write_all(&record);
    let mut watch = match started.init {
        Some((init, status_pipe)) => Watch {
            group: started.command,
            child: init,
            reaps_command: false,
            status_pipe: Some(status_pipe),
            status: None,
            done: false,
        },
        None => Watch {
            group: started.command,
            child: started.command.unwrap_or(rustix::process::getpid()),
            reaps_command: true,
            status_pipe: None,
            status: None,
            done: false,
        },
    };
    let ended = run(&control, args.deadline_ns, deadman.as_ref(), &mut watch);
    // This process runs, so the timer's work is its own now; the timer stays a bound on it.
    if let Some(deadman) = &deadman {
        let _ = deadman.arm(boot_ns().saturating_add(ENDING_MAX_NS));
    }
    // Whatever is left of the tree, also after the command's own exit: all at once through the
    // namespace and the cgroup, then every descendant found and reaped.
    if let Some(init) = watch.spared() {
        let _ = rustix::process::kill_process(init, Signal::KILL);
    }
    if let Some(cgroup) = &cgroup {
        cgroup.kill();
    }
    let group = watch.group;
    if !tree::end_all(group, |pid, status| watch.note(pid, status)) {
        super::log::line("supervisor: the command's processes kept appearing; giving up");
    }
    if let Some(cgroup) = cgroup {
        cgroup.remove();
    }
    drop(held);
    let outcome = match (ended, watch.status) {
        (None, Some(Ended::Code(code))) => Outcome::Exited(code),
        (None, Some(Ended::Signal(signal))) => Outcome::Signalled(signal),
        (Some(why), _) => Outcome::Ended(why),
        (None, None) => Outcome::Ended(Why::Unknown),
    };
    let _ = report.write_all(&outcome.encode());
    drop(report);
    match (ended, watch.status) {
        (None, Some(status)) => exit_as(status),
        (Some(why), _) => {
            super::log::line(&format!(
                "supervisor: {why}: the command's processes were ended"
            ));
            ExitCode::from(EXIT_ENDED)
        }
        (None, None) => ExitCode::from(EXIT_ENDED),
    }
}

/// The kernel's watchdogs over this process: SIGKILL when `vvm` ends, and at `deadline_ns`
/// ([`deadman`]).
fn arm_kernel_watchdogs(deadline_ns: u64) -> Result<deadman::Deadman, String> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("cannot follow vvm's end: {e}"))?;
    deadman::Deadman::new()
        .and_then(|deadman| deadman.arm(deadline_ns).map(|()| deadman))
        .map_err(|e| format!("cannot arm the kill deadline: {e}"))
}

/// The command, started.
struct Started {
    /// Its pid, when known (in a namespace it is found among the first process's children; a
    /// command that ended at once is not).
    command: Option<Pid>,
    /// The namespace's first process and the pipe it reports on, when there is a namespace.
    init: Option<(Pid, OwnedFd)>,
}

/// Starts the command under the first process of a new PID namespace ([`init`]); `None` where
/// the kernel or the privileges allow none. `close` are the supervisor's own descriptors, which
/// the first process must not keep (the slot locks it keeps: they are released only with it).
fn start_in_namespace(
    program: &std::ffi::OsStr,
    rest: &[OsString],
    cgroup: Option<&cgroup::TreeCgroup>,
    close: &[&OwnedFd],
) -> Option<Result<Started, Start>> {
    let failed = |e: rustix::io::Errno| Start::Failed(format!("cannot make a pipe: {e}"));
    let pipes = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).and_then(|life| {
        Ok((
            life,
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?,
        ))
    });
    let ((life_read, life_write), (status_read, status_write)) = match pipes {
        Ok(pipes) => pipes,
        Err(e) => return Some(Err(failed(e))),
    };
    match clone::fork_init(cgroup.map(cgroup::TreeCgroup::dir_fd)) {
        Ok(clone::Forked::Init) => {
            drop((life_write, status_read));
            for fd in close {
                clone::close_in_child(fd.as_fd());
            }
            init::run(life_read, status_write, program, rest)
        }
        Ok(clone::Forked::Parent(init)) => {
            drop((life_read, status_write));
            // Kept until this process ends: its end tells the first process to stop waiting.
            std::mem::forget(life_write);
            Some(first_report(init, status_read))
        }
        Err(clone::SpawnError::Unsupported) => None,
        Err(clone::SpawnError::Exec(e)) => Some(Err(Start::CannotStart(e))),
        Err(clone::SpawnError::Failed(e)) => {
            Some(Err(Start::Failed(format!("cannot start the command: {e}"))))
        }
    }
}

/// Reads the first process's first record: the command started, or why not.
fn first_report(init: Pid, status: OwnedFd) -> Result<Started, Start> {
    let mut record = [0_u8; 8];
    let mut got = 0;
    while got < record.len() {
        match rustix::io::read(&status, &mut record[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(Start::Failed(format!(
                    "cannot read the namespace's report: {e}"
                )))
            }
        }
    }
    let (tag, value) = init::decode(record);
    if got < record.len() || tag != init::STARTED {
        let _ = rustix::process::waitpid(Some(init), rustix::process::WaitOptions::empty());
        return Err(if tag == init::CANNOT_START && got == record.len() {
            Start::CannotStart(std::io::Error::from_raw_os_error(value))
        } else {
            Start::Failed("the namespace's first process could not start the command".to_owned())
        });
    }
    // From now on read only when ready, and never waited on (see `run`).
    if let Err(e) = rustix::fs::fcntl_setfl(&status, rustix::fs::OFlags::NONBLOCK) {
        let _ = rustix::process::kill_process(init, Signal::KILL);
        let _ = rustix::process::waitpid(Some(init), rustix::process::WaitOptions::empty());
        return Err(Start::Failed(format!(
            "cannot set up the namespace's report: {e}"
        )));
    }
    // The command is the first process's child; the ids it knows are the namespace's, so the
    // command's id here is found from this side.
    let command = tree::children_of(init).into_iter().next();
    Ok(Started {
        command,
        init: Some((init, status)),
    })
}

/// Why the command did not start.
enum Start {
    /// The program could not be run (exit [`EXIT_CANNOT_START`]).
    CannotStart(std::io::Error),
    /// Something of the supervisor's own failed.
    Failed(String),
}

/// How a command is put into its tree's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spawn {
    /// Created into it with `clone3`, falling back to [`Spawn::Move`] where the kernel cannot.
    IntoCgroup,
    /// This process moves in for the spawn and back out: the fallback, which only tests choose
    /// directly (the supervisor reaches it through [`Spawn::IntoCgroup`] on an older kernel).
    #[cfg_attr(not(test), allow(dead_code))]
    Move,
}

/// Starts the command in a process group of its own and, with `cgroup`, inside it: created into
/// it where the kernel can (`clone3`), else by moving this process in for the spawn and out again.
fn start(
    program: &std::ffi::OsStr,
    rest: &[OsString],
    cgroup: Option<&cgroup::TreeCgroup>,
    how: Spawn,
) -> Result<Pid, Start> {
    if let Some(cgroup) = cgroup {
        let cloned = match how {
            Spawn::IntoCgroup => clone::spawn_into(cgroup.dir_fd(), program, rest),
            Spawn::Move => Err(clone::SpawnError::Unsupported),
        };
        match cloned {
            Ok(pid) => return Ok(pid),
            Err(clone::SpawnError::Exec(e)) => return Err(Start::CannotStart(e)),
            Err(clone::SpawnError::Failed(e)) => {
                return Err(Start::Failed(format!("cannot start the command: {e}")))
            }
            // Before Linux 5.7: move this process in for the spawn below.
            Err(clone::SpawnError::Unsupported) => cgroup.enter().map_err(Start::Failed)?,
        }
    }
    let spawned = std::process::Command::new(program)
        .args(rest)
        // Its own group: one signal reaches everything that stays in it.
        .process_group(0)
        .spawn();
    let left = cgroup.map_or(Ok(()), cgroup::TreeCgroup::leave);
    let child = spawned.map_err(Start::CannotStart)?;
    let Some(command) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) else {
        return Err(Start::Failed("the command has no process id".to_owned()));
    };
    // Reaped by the supervisor's `wait`, not through the handle.
    drop(child);
    if let Err(e) = left {
        // Still inside: a kill of the cgroup would end this process too. End the command
        // before it does anything.
        let _ = rustix::process::kill_process(command, Signal::KILL);
        let _ = rustix::process::waitpid(Some(command), rustix::process::WaitOptions::empty());
        return Err(Start::Failed(format!(
            "cannot leave the command's cgroup: {e}"
        )));
    }
    Ok(command)
}

/// Watches until the command exits (`None`) or the tree must be ended ([`Why`]).
fn run(
    control: &OwnedFd,
    first_deadline_ns: u64,
    deadman: Option<&deadman::Deadman>,
    watch: &mut Watch,
) -> Option<Why> {
    // What says the command ended: the namespace's first process's report, or the command's
    // pidfd (without a namespace).
    let pidfd = match &watch.status_pipe {
        Some(_) => None,
        None => rustix::process::pidfd_open(watch.child, rustix::process::PidfdFlags::empty()).ok(),
    };
    let mut deadline_ns = first_deadline_ns;
    let mut pending = Vec::with_capacity(8);
    loop {
        let now_ns = boot_ns();
        if now_ns >= deadline_ns {
            return Some(Why::Deadline);
        }
        let left_ms = i64::try_from((deadline_ns - now_ns).div_ceil(1_000_000)).unwrap_or(i64::MAX);
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: left_ms.min(REAP_TICK_MS) * 1_000_000,
        };
        // No allocation per wake: the control pipe, and what tells the command's end.
        let mut both;
        let mut one;
        let ending = watch.status_pipe.as_ref().or(pidfd.as_ref());
        let fds: &mut [PollFd<'_>] = match ending {
            Some(fd) => {
                both = [
                    PollFd::new(control, PollFlags::IN),
                    PollFd::new(fd, PollFlags::IN),
                ];
                &mut both
            }
            None => {
                one = [PollFd::new(control, PollFlags::IN)];
                &mut one
            }
        };
        match rustix::event::poll(fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Some(Why::Failed),
        }
        let control_ready = !fds[0].revents().is_empty();
        let status_ready =
            watch.status_pipe.is_some() && fds.len() > 1 && !fds[1].revents().is_empty();
        if status_ready {
            read_status(watch);
        }
        tree::reap(|pid, status| watch.note(pid, status));
        if watch.done && watch.status.is_none() && !status_ready {
            // The first process was reaped before its report was read (it writes the report,
            // then exits): the report is in the pipe, whose writer is gone, so this cannot wait.
            read_status(watch);
        }
        if watch.done {
            return None;
        }
        if control_ready {
            match read_records(control, &mut pending) {
                Ok(true) => {}
                Ok(false) => return Some(Why::VvmGone),
                Err(()) => return Some(Why::Failed),
            }
            for record in pending.drain(..) {
                if record == STOP {
                    let spared = watch.spared();
                    // A stopped process (Ctrl-Z, a read from the terminal) acts on SIGTERM only
                    // once continued.
                    tree::signal_all(watch.group, spared, &[Signal::TERM, Signal::CONT]);
                } else if record == KILL_NOW {
                    return Some(Why::Asked);
                } else {
                    deadline_ns = record;
                    if deadman.is_some_and(|d| d.arm(deadline_ns).is_err()) {
                        return Some(Why::Failed);
                    }
                }
            }
        }
    }
}

/// Reads the namespace's first process's report of the command's end.
fn read_status(watch: &mut Watch) {
    let Some(pipe) = &watch.status_pipe else {
        return;
    };
    let mut record = [0_u8; 8];
    match rustix::io::read(pipe, &mut record) {
        Ok(8) => {
            let (tag, value) = init::decode(record);
            watch.status = match tag {
                init::EXITED => Some(Ended::Code(value)),
                init::SIGNALLED => Some(Ended::Signal(value)),
                _ => None,
            };
            watch.done = true;
        }
        // The end of the pipe without a record: the first process is gone (killed).
        Ok(_) => watch.done = true,
        Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
        Err(_) => watch.done = true,
    }
}

/// Reads the records waiting on the pipe into `into`; `Ok(false)` at end of file.
fn read_records(control: &OwnedFd, into: &mut Vec<u64>) -> Result<bool, ()> {
    let mut buf = [0_u8; 8 * 64];
    let n = match rustix::io::read(control.as_fd(), &mut buf) {
        Ok(0) => return Ok(false),
        Ok(n) => n,
        Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => return Ok(true),
        Err(_) => return Err(()),
    };
    // Writes of 8 bytes to a pipe are atomic, so reads see whole records.
    for record in buf[..n].chunks_exact(8) {
        let mut bytes = [0_u8; 8];
        bytes.copy_from_slice(record);
        into.push(u64::from_le_bytes(bytes));
    }
    Ok(true)
}

/// Exits as the command did: with its code, or 128 + the number of the signal that ended it
/// (the shell's convention). Not by raising that signal: this process handles the termination
/// signals (they would not end it), and `vvm` learns the command's end from the [`Outcome`]
/// record anyway.
fn exit_as(status: Ended) -> ExitCode {
    match status {
        Ended::Code(code) => ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX)),
        Ended::Signal(number) => ExitCode::from(u8::try_from(128 + number).unwrap_or(u8::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup v2 path of process `pid`.
    fn cgroup_of(pid: i32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("0::").map(str::to_owned))
            .unwrap_or_default()
    }

    // Both ways into the cgroup: the command is inside, this process is where it was, and the
    // directory goes once the command is reaped.
    #[test]
    fn the_command_starts_inside_the_trees_cgroup_either_way() {
        if cgroup::probe().is_err() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no cgroup can be made here under CI"
            );
            eprintln!("skipped: no cgroup can be made here");
            return;
        }
        let me = std::process::id() as i32;
        let outside = cgroup_of(me);
        for how in [Spawn::IntoCgroup, Spawn::Move] {
            let tree = cgroup::TreeCgroup::make().expect("a cgroup");
            let sleep = [OsString::from("5")];
            let pid = start(std::ffi::OsStr::new("sleep"), &sleep, Some(&tree), how)
                .unwrap_or_else(|_| panic!("{how:?}: the command starts"));
            let inside = cgroup_of(pid.as_raw_pid());
            let started = cgroup::start_time(me).unwrap();
            assert!(
                inside.ends_with(&format!("/vvm-tree-{me}-{started}")),
                "{how:?}: the command is in {inside}"
            );
            assert_eq!(cgroup_of(me), outside, "{how:?}: this process moved");
            tree.kill();
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            tree.remove();
        }
    }
}
