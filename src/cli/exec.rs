//! `vvm run -- CMD ARGS…`: any program as a leader-only singleton.
//!
//! The command is the VVM's one service ([`ExecService`]). It starts once this process leads, in
//! a process group of its own, with `VVM_SLOT`, `VVM_REVISION` (the fencing token of the write
//! that confirmed the tenure it starts in) and `VVM_ADDRESS` in its environment. When the service
//! is asked to stop (a shutdown, or a loss of leadership, which stops services at once) the
//! whole group gets SIGTERM and, if the command has not exited after the grace period, SIGKILL.
//!
//! Its own exit, before it was asked to stop, ends the VVM: status 0 is a clean stop (the VVM
//! shuts down, releases its slot, and `vvm` exits 0), anything else — a non-zero status or a
//! signal — is a service failure (`vvm` exits 1). Either way what is left of its group gets
//! SIGKILL: nothing it started may act once it no longer does.
//!
//! # The kill deadline
//!
//! [`GroupKiller`] replaces the production killer: when the kill deadline passes it sends SIGKILL
//! to the command's process group (one `kill` system call on a group id read from an atomic: no
//! lock, no allocation, no waiting) and then ends `vvm` as [`ExitKiller`] does. So the group is
//! gone by the deadline at the latest, grandchildren included, as long as they stay in the group.
//!
//! `vvm` itself ended by SIGKILL or a crash cannot signal anything. For that case the command is
//! started through `vvm __exec-guard` ([`guard`]), which asks the kernel for SIGKILL when `vvm`
//! dies (`PR_SET_PDEATHSIG`, through `rustix`; no `unsafe` here, so no `pre_exec` hook) and then
//! execs the command in its place. What is not covered:
//! - after such a death, the command's own children: the kernel signals only the command. Run
//!   `vvm` under a supervisor that ends the whole cgroup (systemd's default
//!   `KillMode=control-group`) if that matters;
//! - a process that leaves the group (`setsid`, `setpgid`) escapes every signal sent here.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{kill_process_group, Pid, Signal};
use tokio::process::Command;
use tokio::sync::Notify;
use vvm::{ExitKiller, KillReport, Killer, Service, ServiceContext, ServiceError};

use super::{fail, GuardArgs};

/// This binary, also after it was replaced on disk: the guard is the same program.
const SELF_EXE: &str = "/proc/self/exe";
/// The hidden subcommand that starts the command (see [`guard`]).
const GUARD_SUBCOMMAND: &str = "__exec-guard";
/// Exit code of the guard when the command cannot be started, as a shell's "command not found".
const EXIT_CANNOT_START: u8 = 127;

/// How often the group is checked for stragglers after the command itself exited.
const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The process group of the running command (its pid), or 0 when none runs. Shared by the
/// service, which sets and clears it, and [`GroupKiller`], which only reads it.
#[derive(Clone, Debug, Default)]
pub struct CommandGroup {
    pgid: Arc<AtomicI32>,
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

    /// Whether any process of the group is still there (zombies included).
    fn is_alive(&self) -> bool {
        self.pid()
            .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok())
    }
}

/// The killer of `vvm run -- CMD`: SIGKILL to the command's process group, then [`ExitKiller`].
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
        self.group.signal(Signal::KILL);
        ExitKiller.kill(report);
    }
}

/// Whether the variable `name` configures `vvm` itself (`VVM_…`), so that the command does not
/// inherit it. The ones the command is given (`VVM_SLOT`, `VVM_REVISION`, `VVM_ADDRESS`) are set
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
}

impl ExecService {
    /// A service running `command` (program first; must not be empty).
    pub fn new(
        command: Vec<OsString>,
        grace: Duration,
        address: String,
        group: CommandGroup,
        finished: Arc<Notify>,
    ) -> Self {
        debug_assert!(!command.is_empty());
        ExecService {
            command,
            grace,
            address,
            group,
            finished,
        }
    }

    /// Waits for the members of the group other than the command (already reaped) to leave, at
    /// most until `limit`, then sends SIGKILL to whatever is left.
    async fn end_stragglers(&self, limit: tokio::time::Instant) {
        while self.group.is_alive() && tokio::time::Instant::now() < limit {
            tokio::time::sleep(GROUP_POLL_INTERVAL).await;
        }
        self.group.signal(Signal::KILL);
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
        // The command inherits the SQLite slot locks this process holds: while it lives, the
        // slot's holder is not taken for dead, also after this process died.
        if let Err(e) = vvm_adapters::sqlite::let_children_inherit_slot_locks() {
            return Err(ServiceError::with_source(
                "cannot pass the slot lock to the command",
                e,
            ));
        }
        // Started through `vvm __exec-guard` (see [`guard`]): SIGKILL when this process dies.
        let mut command = Command::new(SELF_EXE);
        // Only the documented variables reach the command: `vvm`'s own settings (the store URL
        // with its credential file, the lease, the metrics address, ...) are not its business,
        // and a nested `vvm` must not pick them up as its own.
        for (name, _) in std::env::vars_os() {
            if is_own_variable(&name) {
                command.env_remove(name);
            }
        }
        let mut child = command
            .arg(GUARD_SUBCOMMAND)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--")
            .args(&self.command)
            .env("VVM_SLOT", token.slot.0.to_string())
            .env("VVM_REVISION", token.revision.0.to_string())
            .env("VVM_ADDRESS", &self.address)
            // systemd's notifications are this process's to send (`NotifyAccess=main`).
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            // Its own group, so that one signal reaches everything it starts.
            .process_group(0)
            // If this task is aborted (the stop timeout), the command does not outlive it.
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                let what = format!("cannot start {}", self.command[0].to_string_lossy());
                ServiceError::with_source(what, e)
            })?;
        // The group id is the child's pid (`process_group(0)`). While the group has a member no
        // other process or group can take that id; once the command is reaped and the group is
        // empty, it is cleared within a few system calls, so a reused id is at worst signalled
        // in that window.
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .ok_or_else(|| ServiceError::new("the command has no process id"))?;
        self.group.pgid.store(pid, Ordering::Release);
        tracing::info!(
            pid,
            slot = token.slot.0,
            revision = token.revision.0,
            "command started"
        );
        context.ready();

        let mut shutdown = context.shutdown();
        let lost = context.lost();
        tokio::select! {
            status = child.wait() => {
                let status = status.map_err(|e| ServiceError::with_source("waiting for the command failed", e));
                // Nothing it started may go on acting once it is gone.
                self.group.signal(Signal::KILL);
                self.group.pgid.store(0, Ordering::Release);
                let status = status?;
                if status.success() {
                    tracing::info!("the command exited with status 0: shutting down");
                    self.finished.notify_one();
                    shutdown.requested().await;
                    Ok(())
                } else {
                    Err(ServiceError::new(format!("the command ended before it was asked to stop: {status}")))
                }
            }
            _ = shutdown.requested() => {
                let why = if lost.is_lost() { "leadership lost" } else { "shutdown" };
                tracing::info!(pid, grace = ?self.grace, "{why}: sending SIGTERM to the command's group");
                let limit = tokio::time::Instant::now() + self.grace;
                self.group.signal(Signal::TERM);
                let outcome = match tokio::time::timeout_at(limit, child.wait()).await {
                    Ok(Ok(status)) => {
                        tracing::info!(%status, "the command stopped");
                        self.end_stragglers(limit).await;
                        Ok(())
                    }
                    Ok(Err(e)) => {
                        self.group.signal(Signal::KILL);
                        Err(ServiceError::with_source("waiting for the command failed", e))
                    }
                    Err(_) => {
                        tracing::warn!(pid, "the command did not stop within the grace period: SIGKILL");
                        self.group.signal(Signal::KILL);
                        let _ = child.wait().await;
                        Err(ServiceError::new(format!(
                            "the command did not stop within {:?} of SIGTERM and was killed",
                            self.grace
                        )))
                    }
                };
                self.group.pgid.store(0, Ordering::Release);
                outcome
            }
        }
    }
}

/// `vvm __exec-guard --parent PID -- CMD ARGS…`: runs in the command's process, between the
/// fork and the command. It asks the kernel to send it SIGKILL when its parent thread ends
/// (`PR_SET_PDEATHSIG`; kept across `exec` except for set-user-ID or set-group-ID programs and
/// programs with file capabilities), checks that the parent is still `PID` (it could have died
/// before the request), and replaces itself with the command. So `vvm` ended by SIGKILL or a
/// crash takes the command with it — the command only: its own children are not signalled.
/// The parent thread is a runtime worker of `vvm run`, which lives as long as the runtime.
///
/// Exits 127 when the command cannot be started, 1 when the parent is gone.
pub fn guard(args: GuardArgs) -> ExitCode {
    use std::os::unix::process::CommandExt;

    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::KILL)) {
        return fail(&format!("cannot tie the command to vvm's life: {e}"));
    }
    if rustix::process::getppid().map(Pid::as_raw_pid) != Some(args.parent) {
        return fail("vvm ended before the command started");
    }
    let Some((program, rest)) = args.command.split_first() else {
        return fail("no command");
    };
    // Returns only when the command could not be started.
    let e = std::process::Command::new(program).args(rest).exec();
    super::log::line(&format!("cannot start {}: {e}", program.to_string_lossy()));
    ExitCode::from(EXIT_CANNOT_START)
}
