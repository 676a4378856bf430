//! The background task of a sequencer: first the actualizer (catch up with the PLog), then the
//! flusher (write batches when signalled). Exactly one such task runs per sequencer; a new
//! actualization aborts it and starts a fresh one, so the two never write at the same time.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use vvm_core::sequencer::{Backlog, BacklogError, Phase, ReplayStep, SeqValue};

use super::config::SeqConfig;
use super::storage::{SeqStorage, SeqStorageError};

/// Why the actualizer gave up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ActualizeError {
    #[error(transparent)]
    Storage(#[from] SeqStorageError),
    #[error("actualization out of step: {0}")]
    Backlog(#[from] BacklogError),
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
pub(crate) async fn flush_round<St: SeqStorage>(
    shared: &Shared<St>,
    buf: &mut Vec<SeqValue>,
) -> Result<(), SeqStorageError> {
    let mut retry = 0u32;
    loop {
        let Some(ticket) = shared.backlog().take_batch(buf) else {
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
            }
            Err(e) => {
                shared.backlog().batch_failed(ticket);
                shared.writes_failed.fetch_add(1, Ordering::Relaxed);
                shared.set_last_error(Some(e.to_string()));
                if retry >= shared.config.retries_max {
                    tracing::error!(error = %e, retries = retry, "sequencer flush gave up");
                    return Err(e);
                }
                tracing::warn!(error = %e, retry, "sequencer flush failed; retrying");
                tokio::time::sleep(shared.config.backoff(retry)).await;
                retry += 1;
            }
        }
    }
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
    loop {
        match shared.call(op, timeout_ms, attempt()).await {
            Ok(v) => return Ok(v),
            Err(e) if retry >= shared.config.retries_max => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, retry, op, "sequencer storage call failed; retrying");
                shared.set_last_error(Some(e.to_string()));
                tokio::time::sleep(shared.config.backoff(retry)).await;
                retry += 1;
            }
        }
    }
}

/// Catches the backlog up with the PLog. The backlog is in [`Phase::Loading`] already (set by
/// whoever asked for the actualization, so that `start` is refused from that instant).
async fn actualize<St: SeqStorage>(shared: &Shared<St>) -> Result<(), ActualizeError> {
    let stored = retrying(
        shared,
        "read_next_plog_offset",
        shared.config.call_timeout_ms,
        || shared.storage.read_next_plog_offset(),
    )
    .await?;
    shared.backlog().loaded(stored)?;
    tracing::debug!(offset = stored.0, "sequencer replaying the PLog");
    let mut buf = Vec::new();
    let mut retry = 0u32;
    let page = shared.config.replay_page_events;
    loop {
        let from = {
            let backlog = shared.backlog();
            backlog.replay_from().ok_or(BacklogError::WrongPhase {
                phase: backlog.phase(),
                call: "replay_from",
                needs: "Replaying",
            })?
        };
        let mut fed = 0usize;
        let mut full = false;
        let mut out_of_step = None;
        let mut sink = |offset, values: &[SeqValue]| {
            fed += 1;
            match shared.backlog().replay(offset, values) {
                Ok(ReplayStep::Continue) if fed < page => ControlFlow::Continue(()),
                Ok(ReplayStep::Continue) => ControlFlow::Break(()),
                Ok(ReplayStep::Full) => {
                    full = true;
                    ControlFlow::Break(())
                }
                Err(e) => {
                    out_of_step = Some(e);
                    ControlFlow::Break(())
                }
            }
        };
        let replay = shared.storage.actualize_from_plog(from, &mut sink);
        let result = shared
            .call(
                "actualize_from_plog",
                shared.config.replay_call_timeout_ms,
                replay,
            )
            .await;
        if let Some(e) = out_of_step {
            return Err(e.into());
        }
        match result {
            Err(e) if retry >= shared.config.retries_max => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, retry, "sequencer replay failed; retrying");
                shared.set_last_error(Some(e.to_string()));
                // Events fed before the failure stay merged; the retry resumes after them.
                tokio::time::sleep(shared.config.backoff(retry)).await;
                retry += 1;
            }
            Ok(()) if full => {
                flush_round(shared, &mut buf).await?;
                retry = 0;
            }
            Ok(()) if fed >= page => retry = 0,
            Ok(()) => break,
        }
    }
    shared.backlog().actualized()?;
    Ok(())
}

/// Waits for flush signals and writes; never ends by itself.
async fn flusher<St: SeqStorage>(shared: &Shared<St>) {
    let mut buf = Vec::new();
    loop {
        shared.flush_signal.notified().await;
        // A failed round is recorded; the next flush or refused `start` signals a new one.
        let _ = flush_round(shared, &mut buf).await;
    }
}

/// The whole life of the background task: actualize, then flush until aborted.
pub(crate) async fn run<St: SeqStorage>(shared: Arc<Shared<St>>) {
    match actualize(&shared).await {
        Ok(()) => {
            tracing::info!("sequencer actualized");
            shared.phase_changed.notify_waiters();
            // Persist what the replay merged, so that the next recovery starts later.
            shared.flush_signal.notify_one();
            flusher(&shared).await;
        }
        Err(e) => {
            tracing::error!(error = %e, "sequencer actualization gave up");
            shared.set_last_error(Some(e.to_string()));
            shared.backlog().actualization_failed();
            shared.phase_changed.notify_waiters();
        }
    }
}

/// Whether the backlog waits for an actualizer.
pub(crate) fn actualizing(phase: Phase) -> bool {
    matches!(phase, Phase::Loading | Phase::Replaying(_))
}
