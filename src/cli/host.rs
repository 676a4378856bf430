//! What `vvm run` sets up around its one service, whichever way it holds its right to run (a
//! slot's leadership, `run.rs`; a semaphore's grant, `run_semaphore.rs`): the killer and the
//! command's hooks, and the signals.

use std::process::ExitCode;
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
