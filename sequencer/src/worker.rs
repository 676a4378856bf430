//! The background task of a sequencer: first the actualizer (catch up with the PLog), then the
//! flusher (write batches when signalled). Exactly one such task works per sequencer; a new
//! actualization stops it (see [`task`](super::task)) and starts a fresh one that waits for
//! it to end, so two never write at the same time.
//!
//! A stopped task touches the backlog no more: every step takes the backlog through
//! [`Shared::backlog_unless`], which refuses once the task's stop is set, and the stop is set
//! under the backlog's lock. Only batch completions, whose tickets tell stale from current,
//! are recorded after a stop.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::engine::{Backlog, BacklogError, Phase, ReplayStep, SeqValue};
use tokio::sync::Notify;

use super::config::SeqConfig;
use super::errors::ActualizeError;
use super::storage::{SeqStorage, SeqStorageError};
use super::task::{Stop, Stopped, Worker};

/// Why a step of the background task did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Halt {
    /// Asked to stop: another task or the handle owns the backlog now.
    Stopped,
    /// The step failed.
    Failed(ActualizeError),
}

impl From<Stopped> for Halt {
    fn from(_: Stopped) -> Self {
        Halt::Stopped
    }
}

impl From<SeqStorageError> for Halt {
    fn from(e: SeqStorageError) -> Self {
        Halt::Failed(e.into())
    }
}

impl From<BacklogError> for Halt {
    fn from(e: BacklogError) -> Self {
        Halt::Failed(e.into())
    }
}

/// What the handle, the flusher and the actualizer share.
pub(crate) struct Shared<St> {
    pub(crate) storage: St,
    pub(crate) config: SeqConfig,
    backlog: Mutex<Backlog>,
    /// Wakes the flusher; a signal sent while it writes is kept (one permit) for its next round.
    pub(crate) flush_signal: Notify,
    /// Wakes those waiting for an actualization to end.
    pub(crate) phase_changed: Notify,
    last_error: Mutex<Option<String>>,
    /// Why the last actualization gave up; cleared when one succeeds.
    actualize_failure: Mutex<Option<ActualizeError>>,
    pub(crate) writes_ok: AtomicU64,
    pub(crate) writes_failed: AtomicU64,
}

impl<St: SeqStorage> Shared<St> {
    pub(crate) fn new(storage: St, config: SeqConfig, backlog: Backlog) -> Self {
        Shared {
            storage,
            config,
            backlog: Mutex::new(backlog),
            flush_signal: Notify::new(),
            phase_changed: Notify::new(),
            last_error: Mutex::new(None),
            actualize_failure: Mutex::new(None),
            writes_ok: AtomicU64::new(0),
            writes_failed: AtomicU64::new(0),
        }
    }

    /// The backlog. Never held across an await; the core never panics while it is held, so a
    /// poisoned lock still guards a consistent backlog.
    #[inline]
    pub(crate) fn backlog(&self) -> MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backlog for a step of the task that `stop` belongs to, unless it was asked to stop.
    /// Stops are set under this lock, so a step either completes before the stop or not at all.
    #[inline]
    pub(crate) fn backlog_unless(&self, stop: &Stop) -> Result<MutexGuard<'_, Backlog>, Stopped> {
        let backlog = self.backlog();
        if stop.is_stopped() {
            return Err(Stopped);
        }
        Ok(backlog)
    }

    /// Why the last actualization gave up, unless one succeeded since.
    pub(crate) fn actualize_failure(&self) -> Option<ActualizeError> {
        self.actualize_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_actualize_failure(&self, failure: Option<ActualizeError>) {
        *self
            .actualize_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = failure;
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_last_error(&self, error: Option<String>) {
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = error;
    }

    /// Runs one storage call under `timeout_ms`.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        timeout_ms: u64,
        fut: impl Future<Output = Result<T, SeqStorageError>>,
    ) -> Result<T, SeqStorageError> {
        match tokio::time::timeout(Duration::from_millis(timeout_ms), fut).await {
            Ok(result) => result,
            Err(_) => Err(SeqStorageError::Timeout { op, timeout_ms }),
        }
    }
}

/// Writes batches until nothing is pending: each failed write is retried at most
/// `retries_max` times with backoff; then the round gives up with the last error.
///
/// A write call is never cut short by `stop` (see [`task`](super::task)): it returns, its
/// outcome is recorded (a stale ticket is ignored), and only then the round stops.
pub(crate) async fn flush_round<St: SeqStorage>(
    shared: &Shared<St>,
    stop: &Stop,
    buf: &mut Vec<SeqValue>,
) -> Result<(), Halt> {
    let mut retry = 0u32;
    let mut backoff = shared.config.backoff();
    loop {
        let Some(ticket) = shared.backlog_unless(stop)?.take_batch(buf) else {
            return Ok(());
        };
        let write = shared
            .storage
            .write_values_and_next_plog_offset(buf, ticket.next_offset());
        match shared
            .call(
                "write_values_and_next_plog_offset",
                shared.config.call_timeout_ms,
                write,
            )
            .await
        {
            Ok(()) => {
                shared.backlog().batch_written(ticket, buf);
                shared.writes_ok.fetch_add(1, Ordering::Relaxed);
                shared.set_last_error(None);
                retry = 0;
                backoff = shared.config.backoff();
            }
            Err(e) => {
                shared.backlog().batch_failed(ticket);
                shared.writes_failed.fetch_add(1, Ordering::Relaxed);
                shared.set_last_error(Some(vvm_runtime::ErrorChain(&e).to_string()));
                if retry >= shared.config.retries_max {
                    tracing::error!(error = %vvm_runtime::ErrorChain(&e), retries = retry, "sequencer flush gave up");
                    return Err(e.into());
                }
                tracing::warn!(error = %vvm_runtime::ErrorChain(&e), retry, "sequencer flush failed; retrying");
                stop.unless_stopped(tokio::time::sleep(next_wait(&mut backoff, shared)))
                    .await?;
                retry += 1;
            }
        }
    }
}

/// The next wait of a retry schedule (see [`SeqConfig::backoff`](super::SeqConfig::backoff)).
fn next_wait<St: SeqStorage>(
    backoff: &mut impl Iterator<Item = Duration>,
    shared: &Shared<St>,
) -> Duration {
    backoff
        .next()
        .unwrap_or(Duration::from_millis(shared.config.backoff_max_ms))
}

async fn retrying<St: SeqStorage, T, F, Fut>(
    shared: &Shared<St>,
    op: &'static str,
    timeout_ms: u64,
    mut attempt: F,
) -> Result<T, SeqStorageError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, SeqStorageError>>,
{
    let mut retry = 0u32;
    let mut backoff = shared.config.backoff();
    loop {
        match shared.call(op, timeout_ms, attempt()).await {
            Ok(v) => return Ok(v),
            Err(e) if retry >= shared.config.retries_max => return Err(e),
            Err(e) => {
                tracing::warn!(error = %vvm_runtime::ErrorChain(&e), retry, op, "sequencer storage call failed; retrying");
                shared.set_last_error(Some(vvm_runtime::ErrorChain(&e).to_string()));
                tokio::time::sleep(next_wait(&mut backoff, shared)).await;
                retry += 1;
            }
        }
    }
}

/// Catches the backlog up with the PLog. The backlog is in [`Phase::Loading`] already (set by
/// whoever asked for the actualization, so that `start` is refused from that instant).
async fn actualize<St: SeqStorage>(shared: &Shared<St>, stop: &Stop) -> Result<(), Halt> {
    // Reads leave no trace: a stop drops them at once.
    let stored = stop
        .unless_stopped(retrying(
            shared,
            "read_next_plog_offset",
            shared.config.call_timeout_ms,
            || shared.storage.read_next_plog_offset(),
        ))
        .await??;
    shared.backlog_unless(stop)?.loaded(stored)?;
    tracing::debug!(offset = stored.0, "sequencer replaying the PLog");
    let mut buf = Vec::new();
    let mut retry = 0u32;
    let mut backoff = shared.config.backoff();
    let page = shared.config.replay_page_events;
    loop {
        let from = {
            let backlog = shared.backlog_unless(stop)?;
            backlog.replay_from().ok_or(BacklogError::WrongPhase {
                phase: backlog.phase(),
                call: "replay_from",
                needs: "Replaying",
            })?
        };
        let mut fed = 0usize;
        let mut full = false;
        let mut halted = None;
        let mut sink = |offset, values: &[SeqValue]| {
            fed += 1;
            let step = match shared.backlog_unless(stop) {
                Ok(mut backlog) => backlog.replay(offset, values).map_err(Halt::from),
                Err(stopped) => Err(stopped.into()),
            };
            match step {
                Ok(ReplayStep::Continue) if fed < page => ControlFlow::Continue(()),
                Ok(ReplayStep::Continue) => ControlFlow::Break(()),
                Ok(ReplayStep::Full) => {
                    full = true;
                    ControlFlow::Break(())
                }
                Err(halt) => {
                    halted = Some(halt);
                    ControlFlow::Break(())
                }
            }
        };
        let replay = shared.storage.actualize_from_plog(from, &mut sink);
        let result = stop
            .unless_stopped(shared.call(
                "actualize_from_plog",
                shared.config.replay_call_timeout_ms,
                replay,
            ))
            .await;
        // A corrupt log or a stop is final: reading the same log again cannot help.
        if let Some(halt) = halted {
            return Err(halt);
        }
        match result? {
            Err(e) if retry >= shared.config.retries_max => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %vvm_runtime::ErrorChain(&e), retry, "sequencer replay failed; retrying");
                shared.set_last_error(Some(vvm_runtime::ErrorChain(&e).to_string()));
                // Events fed before the failure stay merged; the retry resumes after them.
                stop.unless_stopped(tokio::time::sleep(next_wait(&mut backoff, shared)))
                    .await?;
                retry += 1;
            }
            Ok(()) if full => {
                flush_round(shared, stop, &mut buf).await?;
                retry = 0;
                backoff = shared.config.backoff();
            }
            Ok(()) if fed >= page => {
                retry = 0;
                backoff = shared.config.backoff();
            }
            Ok(()) => break,
        }
    }
    let mut backlog = shared.backlog_unless(stop)?;
    backlog.actualized()?;
    shared.set_actualize_failure(None);
    Ok(())
}

/// Waits for flush signals and writes until stopped.
async fn flusher<St: SeqStorage>(shared: &Shared<St>, stop: &Stop) {
    let mut buf = Vec::new();
    loop {
        if stop
            .unless_stopped(shared.flush_signal.notified())
            .await
            .is_err()
        {
            return;
        }
        // A failed round is recorded; the next flush or refused `start` signals a new one.
        if flush_round(shared, stop, &mut buf).await == Err(Halt::Stopped) {
            return;
        }
    }
}

/// The whole life of a background task: wait for the `previous` task to end (it finishes a
/// write in flight; bounded by twice the call timeout, then it is aborted), actualize, then
/// flush until stopped.
pub(crate) async fn run<St: SeqStorage>(
    shared: Arc<Shared<St>>,
    stop: Stop,
    previous: Option<Worker>,
) {
    if let Some(previous) = previous {
        // Not cut short by our own stop: whoever comes after us must not overlap that write
        // either. The predecessor was stopped before we were spawned.
        let limit = Duration::from_millis(shared.config.call_timeout_ms.saturating_mul(2));
        if !previous.join_within(limit).await {
            tracing::warn!(
                ?limit,
                "previous sequencer task did not end in time; aborted"
            );
        }
    }
    match actualize(&shared, &stop).await {
        Ok(()) => {
            tracing::info!("sequencer actualized");
            shared.phase_changed.notify_waiters();
            // Persist what the replay merged, so that the next recovery starts later.
            shared.flush_signal.notify_one();
            flusher(&shared, &stop).await;
        }
        Err(Halt::Stopped) => tracing::debug!("sequencer task stopped"),
        Err(Halt::Failed(e)) => {
            tracing::error!(error = %vvm_runtime::ErrorChain(&e), "sequencer actualization gave up");
            let Ok(mut backlog) = shared.backlog_unless(&stop) else {
                return;
            };
            backlog.actualization_failed();
            shared.set_last_error(Some(vvm_runtime::ErrorChain(&e).to_string()));
            shared.set_actualize_failure(Some(e));
            drop(backlog);
            shared.phase_changed.notify_waiters();
        }
    }
}

/// Whether the backlog waits for an actualizer.
pub(crate) fn actualizing(phase: Phase) -> bool {
    matches!(phase, Phase::Loading | Phase::Replaying(_))
}
