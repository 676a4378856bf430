//! What `vvm run` sets up around its one service, whichever way it holds its right to run (a
//! slot's leadership, `run.rs`; a semaphore's grant, `run_semaphore.rs`): the killer and the
//! command's hooks, and the signals.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use vvm::services::STOP_TIMEOUT_DEFAULT;
use vvm::KillerThread;

use super::exec::CommandStatus;
use super::fail;
use super::ops::OpsState;

/// What differs between the demo and the exec mode around the one service.
pub(super) struct Host {
    /// The killer thread, when not the process-wide one.
    pub(super) killer: Option<KillerThread>,
    /// Time the service has to stop.
    pub(super) stop_timeout: Duration,
    /// Notified when the service finished its work by itself: shut down cleanly.
    pub(super) finished: Option<Arc<Notify>>,
    /// Notified by a second SIGINT or SIGTERM (the command's grace is skipped).
    pub(super) force: Option<Arc<Notify>>,
    /// The command's own failing status, which `vvm` exits with.
    pub(super) status: Option<CommandStatus>,
    /// The state `--metrics-addr` answers `/healthz` and `/leader` from.
    pub(super) ops: Option<Arc<OpsState>>,
    /// Exit code when the acquisition ended with everything held by others (`--busy-code`).
    pub(super) busy_code: u8,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            killer: None,
            stop_timeout: STOP_TIMEOUT_DEFAULT,
            finished: None,
            force: None,
            status: None,
            ops: None,
            busy_code: super::EXIT_BUSY,
        }
    }
}

/// A signal within this long of the first is the same request delivered twice (`timeout` signals
/// `vvm` and then its group; a unit's stop signals every process), not a person asking again.
const DUPLICATE_WINDOW: Duration = Duration::from_millis(500);

/// Listens for SIGINT, SIGTERM and SIGHUP (a closed terminal) from now on: the first one calls
/// `stop` and resolves the returned receiver; a later one — more than [`DUPLICATE_WINDOW`]
/// after the first — ends the command's tree at once through `force` (the grace is skipped), or
/// is only logged without a command.
pub(super) fn listen_for_signals(
    stop: impl Fn() + Send + 'static,
    force: Option<Arc<Notify>>,
) -> Result<
    (
        tokio::task::JoinHandle<()>,
        tokio::sync::oneshot::Receiver<()>,
    ),
    ExitCode,
> {
    let (mut terminate, mut interrupt, mut hangup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return Err(fail(&format!("cannot listen for signals: {e}")))
        }
    };
    let (first_signal, signalled) = tokio::sync::oneshot::channel::<()>();
    let signals = tokio::spawn(async move {
        let mut first_signal = Some(first_signal);
        let mut first_at = None;
        loop {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
                _ = hangup.recv() => "SIGHUP",
            };
            let now = tokio::time::Instant::now();
            match first_signal.take() {
                Some(first) => {
                    tracing::info!("{name}: shutting down (a second signal skips the grace)");
                    first_at = Some(now);
                    if name == "SIGINT" {
                        note_interrupt();
                    }
                    stop();
                    let _ = first.send(());
                }
                None if first_at.is_some_and(|at| now.duration_since(at) < DUPLICATE_WINDOW) => {
                    tracing::info!("{name} again at once: the same request, delivered twice");
                }
                None => match &force {
                    Some(force) => {
                        tracing::warn!("{name} again: ending the command's tree now");
                        force.notify_one();
                    }
                    None => tracing::info!("{name} again: already shutting down"),
                },
            }
        }
    });
    Ok((signals, signalled))
}

/// The first stop signal was SIGINT (Ctrl-C): a clean end is then an end by SIGINT.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// [`interrupted_or`] chose to end by SIGINT: [`end_by_interrupt`] raises it.
static RAISE_INTERRUPT: AtomicBool = AtomicBool::new(false);

/// Notes that the first stop signal was SIGINT.
pub(super) fn note_interrupt() {
    INTERRUPTED.store(true, Ordering::Release);
}

/// Exit status of a shell for a process that SIGINT ended (128 + 2).
pub const EXIT_INTERRUPTED: u8 = 130;

/// The exit code of a `vvm run` whose shutdown was clean: 0, unless Ctrl-C asked for it (see
/// [`interrupted_or`]).
pub(super) fn clean_exit() -> ExitCode {
    interrupted_or(ExitCode::SUCCESS)
}

/// `code`, unless Ctrl-C (SIGINT) asked for the stop: then `vvm` ends by SIGINT itself once
/// everything is stopped and released ([`end_by_interrupt`]), as `flock` or `sleep` would — the
/// shell reports 130, and a script that called it stops too (bash goes on after a child that
/// *exited*, even with 130, and stops only after one that SIGINT ended). Also after a second
/// Ctrl-C that cut the grace short. Not for a command's own failing status, which passes on;
/// SIGTERM and SIGHUP keep `code` (a service manager's stop is a clean stop).
pub(super) fn interrupted_or(code: ExitCode) -> ExitCode {
    if INTERRUPTED.load(Ordering::Acquire) {
        RAISE_INTERRUPT.store(true, Ordering::Release);
        return ExitCode::from(EXIT_INTERRUPTED);
    }
    code
}

/// Ends this process by SIGINT when [`interrupted_or`] chose to; returns otherwise (and if the
/// signal could not be raised: the caller then exits with the 130 it returned).
/// Called last, after the runtime and its signal handlers are gone and the log is flushed.
pub fn end_by_interrupt() {
    if !RAISE_INTERRUPT.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: `signal` with `SIG_DFL` installs no handler of ours, and `raise` only sends a
    // signal to this thread; no Rust state is touched. Tokio's handler must be replaced by the
    // default action, or the raised signal would only be recorded.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::raise(libc::SIGINT);
    }
}
