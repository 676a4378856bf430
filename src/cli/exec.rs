//! `vvm run -- CMD ARGS…`: any program as a leader-only singleton.
//!
//! The command is the VVM's one service ([`ExecService`]). It starts once this process leads,
//! under a supervisor ([`supervise`](super::supervise): this binary in a hidden mode), in a
//! process group of its own, with `VVM_SLOT`, `VVM_FENCING_TOKEN` (the fencing token of the
//! write that confirmed the tenure it starts in, printed `<slot>:<revision>`) and `VVM_ADDRESS` in its environment. When the service
//! is asked to stop (a shutdown, or a loss of leadership, which stops services at once) the
//! supervisor sends SIGTERM to the command's group and to everything else the command started;
//! if the command has not exited after the grace period, the whole tree gets SIGKILL.
//!
//! Its own exit, before it was asked to stop, ends the VVM: status 0 is a clean stop (the VVM
//! shuts down, releases its slot, and `vvm` exits 0), anything else — a non-zero status or a
//! signal — is a service failure (`vvm` exits 1). Either way the supervisor has ended what the
//! command left behind before `vvm` hears of it: nothing it started may act once it no longer
//! does.
//!
//! # Two watchdogs
//!
//! The supervisor holds its own copy of the kill deadline: this service writes every new one to
//! it (see [`KillDeadlines`](vvm::services::KillDeadlines)), and the supervisor ends the tree when it
//! passes unextended, or at once when this process dies. [`GroupKiller`] replaces the production
//! killer of this process: when the deadline passes it sends SIGKILL to the command's process
//! group (one `kill` system call on a group id read from an atomic: no lock, no allocation, no
//! waiting) and then ends `vvm` as [`ExitKiller`] does, whose death the supervisor sees. Either
//! alone ends the command by the deadline; a stopped `vvm` cannot keep it alive.

use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::io::FdFlags;
use rustix::pipe::PipeFlags;
use rustix::process::{kill_process_group, Pid, Signal};
use tokio::process::Command;
use tokio::sync::Notify;
use vvm::{
    killer::{ExitKiller, KillReport, Killer},
    time::{Clock, TimeSource},
    Service, ServiceContext, ServiceError,
};

use super::supervise::{boot_ns, Containment, Outcome, Why, KILL_NOW, REPORT_BYTES, STOP};

/// How `vvm run -- CMD` contains its command's tree (`--containment`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContainmentMode {
    /// A cgroup of its own when one can be made, else the supervisor as a subreaper.
    #[default]
    Auto,
    /// A cgroup of its own, or the command does not start (checked before campaigning).
    Strict,
    /// As `strict`, without a PID namespace: for a command whose process ids must mean the same
    /// to tools outside (pid files). The tree then ends by `cgroup.kill` and sweeps, not by the
    /// kernel when the supervisor dies.
    Cgroup,
    /// No cgroup: the supervisor as a subreaper only (for hosts where another tool manages
    /// the cgroups below this process).
    Subreaper,
}

/// This binary, also after it was replaced on disk: the supervisor is the same program.
const SELF_EXE: &str = "/proc/self/exe";
/// The supervisor's name: its `argv[0]` (`ps`'s command line) and its `comm` (`ps -e`, `top`).
pub const SUPERVISOR_NAME: &std::ffi::CStr = c"vvm-supervisor";
/// The hidden subcommand that runs the supervisor (see [`super::supervise`]).
pub const GUARD_SUBCOMMAND: &str = "__exec-guard";

/// The process group of the running command (its pid), or 0 when none runs, and the first
/// process of its PID namespace, or 0 without one. Shared by the service, which sets and clears
/// them, and [`GroupKiller`], which only reads them.
#[derive(Clone, Debug, Default)]
pub struct CommandGroup {
    pgid: Arc<AtomicI32>,
    init: Arc<AtomicI32>,
}

impl CommandGroup {
    /// The group, if a command runs.
    fn pid(&self) -> Option<Pid> {
        Pid::from_raw(self.pgid.load(Ordering::Acquire))
    }

    /// Sends `signal` to every process of the group. Does nothing when none runs. One system
    /// call; nothing allocated, nothing locked (the killer calls it).
    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            // ESRCH: the group is empty already, which is what we want.
            let _ = kill_process_group(pid, signal);
        }
    }

    /// Ends the whole tree where the kernel can: SIGKILL to the first process of its PID
    /// namespace (the kernel ends every other process of it), and to the group. At most two
    /// system calls; nothing allocated, nothing locked (the killer calls it).
    fn kill_tree(&self) {
        if let Some(init) = Pid::from_raw(self.init.load(Ordering::Acquire)) {
            let _ = rustix::process::kill_process(init, Signal::KILL);
        }
        self.signal(Signal::KILL);
    }

    /// No command runs any more.
    fn clear(&self) {
        self.pgid.store(0, Ordering::Release);
        self.init.store(0, Ordering::Release);
    }
}

/// The killer of `vvm run -- CMD`: SIGKILL to the command's tree (its PID namespace's first
/// process, whose end is the end of every process of the tree, and its group), then
/// [`ExitKiller`].
#[derive(Clone, Debug)]
pub struct GroupKiller {
    group: CommandGroup,
}

impl GroupKiller {
    /// A killer that ends `group` before the process.
    pub fn new(group: CommandGroup) -> Self {
        GroupKiller { group }
    }
}

impl Killer for GroupKiller {
    fn kill(&self, report: &KillReport) {
        self.group.kill_tree();
        ExitKiller.kill(report);
    }
}

/// Whether the variable `name` configures `vvm` itself (`VVM_…`), so that the command does not
/// inherit it. The ones the command is given (`VVM_SLOT`, `VVM_FENCING_TOKEN`, `VVM_ADDRESS`) are set
/// afresh after the inherited ones are removed.
fn is_own_variable(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().starts_with(b"VVM_")
}

/// The service that runs one command while the VVM leads.
pub struct ExecService {
    /// Program and arguments; never empty.
    command: Vec<OsString>,
    /// Time between SIGTERM and SIGKILL when the command is asked to stop.
    grace: Duration,
    /// This VVM's address, handed to the command as `VVM_ADDRESS`.
    address: String,
    /// Where the command's process group is published for the killer.
    group: CommandGroup,
    /// Notified when the command exited with status 0 by itself: the host shuts the VVM down.
    finished: Arc<Notify>,
    /// Notified by a second SIGINT or SIGTERM: the grace is skipped.
    force: Arc<Notify>,
    /// The command's own status when it ended by itself with another than 0, for `vvm`'s exit.
    status: CommandStatus,
    /// How its tree must be contained.
    containment: ContainmentMode,
}

/// The status the command ended with by itself (`vvm run` exits with it), shared between the
/// service and the host: the exit code, 128+N for signal N, or none; and whether the command
/// is stopped (job control) right now.
#[derive(Clone, Debug, Default)]
pub struct CommandStatus(Arc<AtomicI32>, Arc<AtomicBool>);

impl CommandStatus {
    /// The exit code to pass on, if the command ended by itself with a failure.
    pub fn code(&self) -> Option<u8> {
        u8::try_from(self.0.load(Ordering::Acquire))
            .ok()
            .filter(|code| *code != 0)
    }

    /// The command's process is stopped (SIGSTOP, or SIGTTIN/SIGTTOU for using the terminal
    /// from the background): it does no work until SIGCONT, though `vvm` goes on leading.
    pub fn stopped(&self) -> bool {
        self.1.load(Ordering::Acquire)
    }

    fn set(&self, status: std::process::ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .or_else(|| status.signal().map(|signal| 128 + signal))
            .unwrap_or(1);
        self.set_code(code);
    }

    /// The command's own failing status: its exit code, or 128 + the signal that ended it.
    fn set_code(&self, code: i32) {
        self.0.store(code.clamp(1, 255), Ordering::Release);
    }
}

/// What the command reads. It runs in a process group of its own, in the background of the
/// terminal `vvm` was started from: a read from that terminal would stop it (SIGTTIN) and it
/// would hang unseen. So when standard input is a terminal the command gets `/dev/null` (a read
/// ends at once); a pipe or a file is passed on as it is (`producer | vvm run -- consumer`).
fn command_stdin() -> std::process::Stdio {
    if rustix::termios::isatty(std::io::stdin()) {
        tracing::info!("standard input is a terminal: the command reads /dev/null");
        std::process::Stdio::null()
    } else {
        std::process::Stdio::inherit()
    }
}

/// What an [`ExecService`] shares with its host: the group the killer ends, and the
/// notifications and status the host waits for.
#[derive(Clone, Debug, Default)]
pub struct ExecHooks {
    /// Where the command's process group is published for the killer.
    pub group: CommandGroup,
    /// Notified when the command exited with status 0 by itself.
    pub finished: Arc<Notify>,
    /// Notified by a second SIGINT or SIGTERM: the grace is skipped.
    pub force: Arc<Notify>,
    /// The command's own status, and whether it is stopped.
    pub status: CommandStatus,
}

impl ExecService {
    /// A service running `command` (program first; must not be empty).
    pub fn new(
        command: Vec<OsString>,
        grace: Duration,
        address: String,
        containment: ContainmentMode,
        hooks: ExecHooks,
    ) -> Self {
        debug_assert!(!command.is_empty());
        ExecService {
            command,
            grace,
            address,
            group: hooks.group,
            finished: hooks.finished,
            force: hooks.force,
            status: hooks.status,
            containment,
        }
    }
}

/// This process's end of the control pipe to the supervisor. Writes never wait: the pipe is
/// non-blocking, and a record that does not fit (a stopped supervisor let the pipe fill) is
/// dropped, which leaves the supervisor with an earlier deadline than the real one — the safe
/// side. Dropping it is the supervisor's signal that this process is gone.
struct Control {
    fd: OwnedFd,
}

impl Control {
    fn send(&self, record: u64) {
        // 8 bytes: below PIPE_BUF, so written whole or not at all.
        let _ = rustix::io::write(self.fd.as_fd(), &record.to_le_bytes());
    }

    /// Sends `deadline` (on the runtime's clock) as `CLOCK_BOOTTIME` nanoseconds.
    fn send_deadline(&self, deadline: vvm_core::Instant) {
        self.send(to_boot_ns(deadline));
    }
}

/// `deadline` on the runtime's clock as `CLOCK_BOOTTIME` nanoseconds: both clocks run on
/// through a suspend, so the time left is the same on each. Never 0 (the stop record).
fn to_boot_ns(deadline: vvm_core::Instant) -> u64 {
    let left = deadline.saturating_since(Clock.now());
    boot_ns()
        .saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX))
        // Never a control record (`STOP`, `KILL_NOW`).
        .max(KILL_NOW + 1)
}

/// A pipe for the supervisor: `(ours, its)`; its end is inheritable, ours is not.
fn pipe_for_child(child_reads: bool) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let (ours, its) = if child_reads {
        (write, read)
    } else {
        (read, write)
    };
    rustix::io::fcntl_setfd(&its, FdFlags::empty())?;
    Ok((ours, its))
}

/// Ends whatever the supervisor left: `vvm run` is a child subreaper (see [`become_subreaper`]),
/// so the tree of a supervisor that was killed before it could end it was re-parented here.
/// After a supervisor's own exit there is nothing to find (one look at `/proc`).
/// The tree's cgroup, if the supervisor `supervisor` made one and could not remove it, is
/// killed first and removed last.
async fn sweep(supervisor: i32, started: u64) {
    let swept = tokio::task::spawn_blocking(move || sweep_now(supervisor, started)).await;
    if !matches!(swept, Ok(true)) {
        tracing::error!("processes left by the command kept appearing");
    }
}

/// [`sweep`]'s work, blocking: `true` when nothing is left.
fn sweep_now(supervisor: i32, started: u64) -> bool {
    use super::supervise::cgroup;
    let leftover = cgroup::leftover_tree(supervisor, started);
    if let Some(dir) = &leftover {
        cgroup::kill_dir(dir);
    }
    let ended = super::supervise::tree::end_descendants_by_pid();
    if let Some(dir) = &leftover {
        cgroup::remove_dir(dir);
    }
    ended
}

/// The environment variable that arms [`injected_panic`] in debug builds.
const FAULTS_VARIABLE: &str = "VVM_FAULTS";

/// Debug builds only, a fault for tests: with `VVM_FAULTS=panic-on-sigusr1`, SIGUSR1 makes the
/// command's service panic — an unwinding panic in a task, after which the process lives on —
/// so that a test can check that the tree still ends before the slot is released. Pending
/// forever otherwise, and always in release builds, which have no such hook.
async fn injected_panic() {
    #[cfg(debug_assertions)]
    if std::env::var(FAULTS_VARIABLE).is_ok_and(|faults| faults.contains("panic-on-sigusr1")) {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut usr1) = signal(SignalKind::user_defined1()) {
            usr1.recv().await;
            return;
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = FAULTS_VARIABLE;
    std::future::pending().await
}

/// Debug builds only, a fault for tests: with `VVM_FAULTS=no-kernel-watchdogs` the supervisor
/// arms neither its SIGKILL timer at the deadline nor its parent-death signal, so that a test
/// can show what a whole paused host does without them (`tests/partitions.rs`). Always false in
/// release builds.
fn no_kernel_watchdogs() -> bool {
    cfg!(debug_assertions)
        && std::env::var(FAULTS_VARIABLE).is_ok_and(|faults| faults.contains("no-kernel-watchdogs"))
}

/// Longest wait, on an unwinding or cancelled service, for the supervisor to end the tree and
/// exit after the end of its control pipe; it only has to kill and reap, so this is far more
/// than it takes. After it, the supervisor is killed and its tree swept from here.
const SUPERVISOR_EXIT_WAIT: Duration = Duration::from_secs(2);

/// The command's tree, owned by the service's `run`: whichever way `run` ends — returned,
/// unwound by a panic, or dropped by a cancellation — the tree is gone before the service counts
/// as stopped, so the slot is never released while a process of it lives. The normal paths wait
/// for the supervisor and sweep, then [`settle`](Self::settle); otherwise `Drop` closes the
/// control pipe (the supervisor ends the tree at once), waits for the supervisor to exit, and
/// sweeps what is left, blocking the thread it runs on for those few milliseconds.
struct Tree {
    control: Option<Control>,
    supervisor: i32,
    settled: bool,
    /// Ends what the supervisor left: [`sweep_now`] (a test passes one that touches nothing
    /// else of the test process).
    sweep: fn(i32, u64) -> bool,
    /// The supervisor's start time ([`cgroup::start_time`](super::supervise::cgroup::start_time)),
    /// which names its tree's cgroup.
    started: u64,
}

impl Tree {
    fn control(&self) -> Option<&Control> {
        self.control.as_ref()
    }

    fn send(&self, record: u64) {
        if let Some(control) = self.control() {
            control.send(record);
            self.resume();
        }
    }

    fn send_deadline(&self, deadline: vvm_core::Instant) {
        if let Some(control) = self.control() {
            control.send_deadline(deadline);
            self.resume();
        }
    }

    /// SIGCONT to the supervisor: a stopped one (SIGSTOP) acts on what it was just sent.
    fn resume(&self) {
        if let Some(pid) = Pid::from_raw(self.supervisor) {
            let _ = rustix::process::kill_process(pid, Signal::CONT);
        }
    }

    /// The end of the control pipe: the supervisor ends the rest of the tree and exits.
    fn close(&mut self) {
        self.control = None;
    }

    /// The supervisor was waited for and the tree swept: nothing is left to do on drop.
    fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.close();
        let exited = supervisor_exited_within(self.supervisor, SUPERVISOR_EXIT_WAIT);
        if !exited {
            if let Some(pid) = Pid::from_raw(self.supervisor) {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            let _ = supervisor_exited_within(self.supervisor, SUPERVISOR_EXIT_WAIT);
        }
        let swept = (self.sweep)(self.supervisor, self.started);
        tracing::error!(
            supervisor = self.supervisor,
            exited,
            swept,
            "the command's service ended without stopping it (a panic or a cancellation): its \
             tree was ended before the slot can be released"
        );
    }
}

/// Whether the supervisor (a child of this process) has exited — reaped already, or a zombie,
/// which it only becomes after reaping its whole tree — waiting at most `limit`. It is not
/// reaped here: the runtime's child handle does that.
fn supervisor_exited_within(supervisor: i32, limit: Duration) -> bool {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let Some(pid) = Pid::from_raw(supervisor) else {
        return true;
    };
    let deadline = std::time::Instant::now() + limit;
    loop {
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        match waitid(WaitId::Pid(pid), options) {
            Ok(Some(_)) | Err(rustix::io::Errno::CHILD) => return true,
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return false,
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Makes `vvm run` a child subreaper: descendants of its command that lose their parent —
/// also when the supervisor itself is killed — come to it, not to the system's first process,
/// and are ended by [`sweep`] before the slot is released.
///
/// # Errors
/// When the kernel refuses (it does not on Linux ≥ 3.4).
pub fn become_subreaper() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

/// Fills `buf` from the pipe `from`; `None` at its end (or on an error) before it is full.
/// Blocking.
fn read_whole(from: &OwnedFd, buf: &mut [u8]) -> Option<()> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(from.as_fd(), &mut buf[got..]) {
            Ok(0) => return None,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// What the supervisor reports once the command started.
struct Report {
    /// The command's pid, 0 when it could not be found (it ended at once).
    pid: i32,
    containment: Containment,
    /// The first process of the command's PID namespace, 0 without one.
    init: i32,
}

/// Reads the command's pid and how its tree is contained from the report pipe; `None` when the
/// supervisor exited first. The pipe is kept for the last record ([`read_outcome`]).
async fn read_report(report: Arc<OwnedFd>) -> Option<Report> {
    tokio::task::spawn_blocking(move || {
        let mut buf = [0_u8; REPORT_BYTES];
        read_whole(&report, &mut buf)?;
        Some(Report {
            pid: i32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]),
            containment: Containment::from_byte(buf[4]),
            init: i32::from_le_bytes([buf[5], buf[6], buf[7], buf[8]]),
        })
    })
    .await
    .ok()
    .flatten()
}

/// The supervisor's last record, once it has exited: how the command ended. `None` when the
/// supervisor wrote none — it was killed itself.
async fn read_outcome(report: Arc<OwnedFd>) -> Option<Outcome> {
    tokio::task::spawn_blocking(move || {
        let mut record = [0_u8; 8];
        // The supervisor has exited: the pipe ends after what it wrote, so this cannot wait.
        read_whole(&report, &mut record)?;
        Outcome::decode(record)
    })
    .await
    .ok()
    .flatten()
}

/// How often `vvm` looks whether its command is stopped.
const STOPPED_CHECK: Duration = Duration::from_millis(500);

/// Process `pid` is stopped: state `T` (stopped by a signal) or `t` (stopped by a tracer) in
/// `/proc/PID/stat`. False when it cannot be read (it has ended).
fn is_stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| matches!(super::supervise::tree::state_of(&stat), Some("T" | "t")))
}

impl ExecService {
    /// Records whether the command is stopped, and says so in the log when that changes.
    fn note_stopped(&self, pid: i32, stopped: bool) {
        if self.status.1.swap(stopped, Ordering::AcqRel) == stopped {
            return;
        }
        if stopped {
            tracing::warn!(
                pid,
                "the command is stopped (SIGSTOP, or SIGTTIN/SIGTTOU: it used the terminal from \
                 the background): it does no work until SIGCONT, while this process still leads"
            );
        } else {
            tracing::info!(pid, "the command is no longer stopped");
        }
    }
}

impl Service for ExecService {
    fn name(&self) -> std::borrow::Cow<'static, str> {
        format!("exec {}", self.command[0].to_string_lossy()).into()
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let Some(token) = context.token() else {
            return Err(ServiceError::new("no valid fencing token at start"));
        };
        let Some(deadline) = context.kill_deadline() else {
            return Err(ServiceError::new("no kill deadline at start"));
        };
        // The supervisor inherits the SQLite slot locks this process holds and keeps them until
        // the last process of the command's tree is gone, also after this process died.
        #[allow(unused_mut)]
        let mut hold = vvm_adapters::sqlite::let_children_inherit_slot_locks().map_err(|e| {
            ServiceError::with_source("cannot pass the slot locks to the supervisor", e)
        })?;
        // And the sockets of the PostgreSQL session marks (`death=advisory-lock`): the server
        // frees a mark only when the last of them closes, so only after the tree is gone.
        #[cfg(feature = "postgres")]
        hold.extend(
            vvm_adapters::postgres::let_children_inherit_session_marks().map_err(|e| {
                ServiceError::with_source("cannot pass the session marks to the supervisor", e)
            })?,
        );
        let pipes = pipe_for_child(true).and_then(|c| Ok((c, pipe_for_child(false)?)));
        let ((control, control_its), (report, report_its)) = pipes
            .map_err(|e| ServiceError::with_source("cannot make the supervisor's pipes", e))?;
        let report = Arc::new(report);
        rustix::fs::fcntl_setfl(&control, rustix::fs::OFlags::NONBLOCK).map_err(|e| {
            ServiceError::with_source("cannot make the control pipe non-blocking", e)
        })?;
        let control = Control { fd: control };
        let mut supervisor = Command::new(SELF_EXE);
        supervisor.arg0(SUPERVISOR_NAME.to_string_lossy().as_ref());
        // Only the documented variables reach the command: `vvm`'s own settings (the store URL
        // with its credential file, the lease, the metrics address, ...) are not its business,
        // and a nested `vvm` must not pick them up as its own.
        for (name, _) in std::env::vars_os() {
            if is_own_variable(&name) {
                supervisor.env_remove(name);
            }
        }
        supervisor
            .arg(GUARD_SUBCOMMAND)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--control")
            .arg(control_its.as_raw_fd().to_string())
            .arg("--report")
            .arg(report_its.as_raw_fd().to_string())
            .arg("--deadline-ns")
            .arg(to_boot_ns(deadline).to_string());
        for fd in &hold {
            supervisor.arg("--hold").arg(fd.to_string());
        }
        if no_kernel_watchdogs() {
            supervisor.arg("--no-kernel-watchdogs");
        }
        if super::log::json_lines() {
            supervisor.arg("--json-log");
        }
        match self.containment {
            ContainmentMode::Auto => {}
            ContainmentMode::Strict => {
                supervisor.arg("--strict");
            }
            ContainmentMode::Cgroup => {
                supervisor.arg("--strict").arg("--no-namespace");
            }
            ContainmentMode::Subreaper => {
                supervisor.arg("--no-cgroup");
            }
        }
        // Started from this task's thread, a worker of the runtime, which lives as long as the
        // runtime: the supervisor's parent-death signal follows the thread that started it, so
        // it must not be a thread that could end first (a blocking-pool thread would).
        let mut child = supervisor
            .arg("--")
            .args(&self.command)
            .env("VVM_SLOT", token.slot.0.to_string())
            .env("VVM_FENCING_TOKEN", token.to_string())
            .env("VVM_ADDRESS", &self.address)
            // systemd's notifications are this process's to send (`NotifyAccess=main`).
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(command_stdin())
            // Its own group, away from the terminal's signals to this process's group. Not
            // killed on drop: the end of the control pipe tells it to end the tree instead.
            .process_group(0)
            .spawn()
            .map_err(|e| ServiceError::with_source("cannot start the supervisor", e))?;
        drop((control_its, report_its));
        let supervisor_pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or(0);
        // Read while it is alive (it cannot be reaped before this process waits for it).
        let supervisor_started = super::supervise::cgroup::start_time(supervisor_pid).unwrap_or(0);
        let mut tree = Tree {
            control: Some(control),
            supervisor: supervisor_pid,
            settled: false,
            sweep: sweep_now,
            started: supervisor_started,
        };
        let Some(Report {
            pid,
            containment,
            init,
        }) = read_report(report.clone()).await
        else {
            let status = child.wait().await.ok();
            // Nothing was started, and the supervisor is gone.
            tree.settle();
            return Err(ServiceError::new(
                match status.and_then(|s| Some((s, s.code()?))) {
                    Some((status, code))
                        if code == i32::from(super::supervise::EXIT_CANNOT_START) =>
                    {
                        self.status.set(status);
                        format!("cannot start {}", self.command[0].to_string_lossy())
                    }
                    Some((_, code)) if code == i32::from(super::supervise::EXIT_NO_CONTAINMENT) => {
                        "--containment strict: no cgroup could be made for the command's tree"
                            .to_owned()
                    }
                    _ => format!("the supervisor ended before the command started: {status:?}"),
                },
            ));
        };
        // The group id is the command's pid (it leads its own group). While the group has a
        // member no other process or group can take that id; once the supervisor has reaped
        // the command, it is cleared within a few system calls.
        self.group.pgid.store(pid, Ordering::Release);
        self.group.init.store(init, Ordering::Release);
        tracing::info!(
            pid,
            slot = token.slot.0,
            fencing_token = %token,
            containment = containment.name(),
            "command started"
        );
        context.ready();

        let mut deadlines = context.kill_deadlines();
        let mut shutdown = context.shutdown();
        let lost = context.lost();
        let mut stopped_check = tokio::time::interval(STOPPED_CHECK);
        stopped_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fault = std::pin::pin!(injected_panic());
        loop {
            tokio::select! {
                () = &mut fault => panic!("injected fault ({FAULTS_VARIABLE}): SIGUSR1"),
                _ = stopped_check.tick() => self.note_stopped(pid, is_stopped(pid)),
                status = child.wait() => {
                    // The supervisor has ended whatever the command left before exiting; if it
                    // was killed first, what it left is ours now.
                    sweep(supervisor_pid, supervisor_started).await;
                    tree.settle();
                    self.group.clear();
                    let status = status
                        .map_err(|e| ServiceError::with_source("waiting for the command failed", e))?;
                    return match read_outcome(report).await {
                        Some(Outcome::Exited(0)) => {
                            tracing::info!("the command exited with status 0: shutting down");
                            self.finished.notify_one();
                            shutdown.requested().await;
                            Ok(())
                        }
                        Some(Outcome::Exited(code)) => {
                            self.status.set_code(code);
                            Err(ServiceError::new(format!(
                                "the command exited with status {code} before it was asked to stop"
                            )))
                        }
                        Some(Outcome::Signalled(signal)) => {
                            self.status.set_code(128 + signal);
                            Err(ServiceError::new(format!(
                                "the command was ended by signal {signal} before it was asked to stop"
                            )))
                        }
                        Some(Outcome::Ended(Why::Deadline)) => {
                            // The supervisor saw the kill deadline pass: this process's killer
                            // ends it too, with the deadline's own report.
                            shutdown.requested().await;
                            Err(ServiceError::new("the kill deadline passed: the command's tree was ended"))
                        }
                        Some(Outcome::Ended(why)) => Err(ServiceError::new(format!(
                            "the supervisor ended the command's tree: {why}"
                        ))),
                        // Not the command's status: the supervisor itself was killed, and
                        // whatever it left was swept from here.
                        None => Err(ServiceError::new(format!(
                            "the supervisor was ended ({status}) and the command's tree with it"
                        ))),
                    };
                }
                Some(deadline) = deadlines.changed() => tree.send_deadline(deadline),
                _ = shutdown.requested() => break,
            }
        }
        let why = if lost.is_lost() {
            "leadership lost"
        } else {
            "shutdown"
        };
        tracing::info!(pid, grace = ?self.grace, "{why}: sending SIGTERM to the command's tree");
        let limit = tokio::time::Instant::now() + self.grace;
        // The supervisor sends SIGCONT after SIGTERM: a stopped command gets the signal too.
        tree.send(STOP);
        self.note_stopped(pid, false);
        // Renewals go on while the services stop: keep the supervisor's deadline moving. A
        // second SIGINT or SIGTERM to `vvm` skips what is left of the grace.
        let mut forced = false;
        let outcome = loop {
            tokio::select! {
                status = tokio::time::timeout_at(limit, child.wait()) => break status,
                Some(deadline) = deadlines.changed() => tree.send_deadline(deadline),
                _ = self.force.notified(), if !forced => {
                    tracing::warn!(pid, "a second signal: SIGKILL to the command's tree, the grace skipped");
                    forced = true;
                    self.group.kill_tree();
                    // The end of the pipe: the supervisor ends the rest of the tree and exits.
                    tree.send(KILL_NOW);
                }
            }
        };
        if matches!(outcome, Ok(Ok(_))) {
            sweep(supervisor_pid, supervisor_started).await;
            tree.settle();
        }
        let outcome = match outcome {
            Ok(Ok(_)) if forced => Err(ServiceError::new(
                "the command was killed: a second signal skipped the grace",
            )),
            Ok(Ok(status)) => {
                tracing::info!(%status, "the command stopped");
                Ok(())
            }
            Ok(Err(e)) => {
                self.group.kill_tree();
                // Not settled: dropping `tree` waits for the supervisor to end it.
                tree.close();
                Err(ServiceError::with_source(
                    "waiting for the command failed",
                    e,
                ))
            }
            Err(_) => {
                tracing::warn!(
                    pid,
                    "the command did not stop within the grace period: SIGKILL"
                );
                self.group.kill_tree();
                tree.send(KILL_NOW);
                // A supervisor that cannot end the tree (stopped, and stopped again) is ended
                // itself: what it leaves comes to this process, a subreaper, and is swept.
                if tokio::time::timeout(SUPERVISOR_EXIT_WAIT, child.wait())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        supervisor = supervisor_pid,
                        "the supervisor did not end the tree: SIGKILL to it"
                    );
                    let _ = child.start_kill();
                    let _ = tokio::time::timeout(SUPERVISOR_EXIT_WAIT, child.wait()).await;
                }
                tree.close();
                sweep(supervisor_pid, supervisor_started).await;
                tree.settle();
                Err(ServiceError::new(format!(
                    "the command did not stop within {:?} of SIGTERM and was killed",
                    self.grace
                )))
            }
        };
        self.group.clear();
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in supervisor: it reads its control pipe until the end, then takes `linger`
    /// to end its tree and exit, as the real one does (in microseconds) after `vvm` is gone.
    fn stand_in(linger: &str) -> (std::process::Child, Control) {
        let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC).unwrap();
        let child = std::process::Command::new("sh")
            .args(["-c", &format!("cat >/dev/null; sleep {linger}")])
            .stdin(std::process::Stdio::from(read))
            .spawn()
            .unwrap();
        (child, Control { fd: write })
    }

    // covers: Cli.ExecUnwind
    #[test]
    fn an_unsettled_tree_is_gone_when_its_guard_is_dropped() {
        let (mut child, control) = stand_in("0.3");
        let tree = Tree {
            control: Some(control),
            supervisor: i32::try_from(child.id()).unwrap(),
            settled: false,
            sweep: |_, _| true,
            started: 0,
        };
        let dropped = std::time::Instant::now();
        drop(tree);
        let took = dropped.elapsed();
        assert!(
            child.try_wait().unwrap().is_some(),
            "the supervisor still runs after the guard of an unwound service was dropped"
        );
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }

    #[test]
    fn a_settled_tree_is_left_alone() {
        let (mut child, control) = stand_in("0");
        let mut tree = Tree {
            control: Some(control),
            supervisor: i32::try_from(child.id()).unwrap(),
            settled: false,
            sweep: |_, _| panic!("a settled tree is not swept again"),
            started: 0,
        };
        tree.settle();
        drop(tree);
        // The pipe is closed with the guard either way; only the wait is skipped.
        child.wait().unwrap();
    }
}
