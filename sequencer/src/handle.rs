//! The typestate handle: `Sequencer<Idle>` → `start` → `Sequencer<InTx>` → `flush` (back to
//! idle) or `actualize` (`Sequencer<Actualizing>`). A call in the wrong state does not compile.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::engine::{
    Backlog, Issuer, Number, PLogOffset, Params, Phase, SeqError, SeqId, StartRefusal, WsId, WsKind,
};

use super::config::SeqConfig;
use super::errors::{NextError, SeqStatus, SetupError, ShutdownError};
use super::storage::{SeqStorage, SeqStorageError};
use super::task::{Stop, Worker};
use super::worker::{actualizing, flush_round, run, Shared};

mod sealed {
    pub trait Sealed {}
}

/// A state of a [`Sequencer`]. Sealed: only [`Idle`], [`InTx`] and [`Actualizing`] exist.
pub trait SeqState: sealed::Sealed {}

/// No transaction is open: [`start`](Sequencer::start) may open one.
#[derive(Debug)]
pub struct Idle {
    _private: (),
}

/// A transaction is open for the event at [`offset`](Sequencer::offset).
#[derive(Debug)]
pub struct InTx {
    offset: PLogOffset,
}

/// An actualization was asked for; `start` is refused until it ends.
#[derive(Debug)]
pub struct Actualizing {
    _private: (),
}

impl sealed::Sealed for Idle {}
impl sealed::Sealed for InTx {}
impl sealed::Sealed for Actualizing {}
impl SeqState for Idle {}
impl SeqState for InTx {}
impl SeqState for Actualizing {}

struct Inner<St: SeqStorage> {
    issuer: Issuer,
    shared: Arc<Shared<St>>,
    /// The background task; dropping it aborts it (so does dropping the sequencer: a crash).
    worker: Option<Worker>,
    runtime: tokio::runtime::Handle,
}

impl<St: SeqStorage> Inner<St> {
    /// Stops the background task and starts a new one that actualizes once the old one ended
    /// (after a write it may have in flight returned). The backlog refuses `start` from this
    /// instant on.
    fn restart(&mut self) {
        self.issuer.abort();
        let previous = self.worker.take();
        {
            let mut backlog = self.shared.backlog();
            // Under the lock: the old task's backlog steps happen before this, or not at all.
            if let Some(previous) = &previous {
                previous.stop();
            }
            // A write the old task has in flight is ignored when it completes (new epoch).
            backlog.begin_actualization();
        }
        let shared = Arc::clone(&self.shared);
        self.worker = Some(Worker::spawn(&self.runtime, move |stop| {
            run(shared, stop, previous)
        }));
    }

    /// Waits until no actualization is running (its task ended it, or the task is gone).
    async fn actualization_ended(&self) {
        const RECHECK: Duration = Duration::from_millis(100);
        loop {
            let notified = self.shared.phase_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !actualizing(self.shared.backlog().phase()) || self.task_gone() {
                return;
            }
            // The recheck covers a task that ended without a word (it cannot, short of a bug).
            let _ = tokio::time::timeout(RECHECK, notified).await;
        }
    }

    fn task_gone(&self) -> bool {
        match &self.worker {
            Some(worker) => worker.is_finished(),
            None => true,
        }
    }
}

/// A sequencer in state `S` over storage `St`. See the [module docs](super).
pub struct Sequencer<S: SeqState, St: SeqStorage> {
    inner: Box<Inner<St>>,
    state: S,
}

impl<S: SeqState, St: SeqStorage> fmt::Debug for Sequencer<S, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequencer")
            .field("state", &std::any::type_name::<S>())
            .field("status", &self.status())
            .finish()
    }
}

impl<St: SeqStorage> Sequencer<Actualizing, St> {
    /// A sequencer over `storage`, already actualizing (its background task is spawned on the
    /// current tokio runtime, which must have time enabled).
    ///
    /// Refuses an invalid `config`, and one whose call timeouts are not longer than the
    /// storage's own lock wait ([`SeqConfig::validate_for`]).
    pub fn new(params: Params, storage: St, config: SeqConfig) -> Result<Self, SetupError> {
        config.validate_for(storage.lock_wait_ms())?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| SetupError::NoRuntime)?;
        let backlog = Backlog::new(&params);
        let shared = Arc::new(Shared::new(storage, config, backlog));
        let mut inner = Box::new(Inner {
            issuer: Issuer::new(params),
            shared,
            worker: None,
            runtime,
        });
        inner.restart();
        Ok(Sequencer {
            inner,
            state: Actualizing { _private: () },
        })
    }

    /// Waits until the actualization ended (successfully or not; `start` tells which).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the sequencer it owns: its background task is stopped (an
    /// unfinished actualization is simply redone by the next sequencer).
    pub async fn ready(self) -> Sequencer<Idle, St> {
        self.inner.actualization_ended().await;
        self.idle()
    }

    /// Goes idle without waiting; `start` is refused until the actualization ended.
    pub fn idle(self) -> Sequencer<Idle, St> {
        Sequencer {
            inner: self.inner,
            state: Idle { _private: () },
        }
    }
}

impl<St: SeqStorage> Sequencer<Idle, St> {
    /// Waits until `start` can tell how the sequencer stands with the PLog: after a failed
    /// actualization (or a lost task) starts a new one, as a refused `start` would, and waits
    /// until it ended; while one runs, waits for it; otherwise returns at once. A sequencer
    /// that found the PLog corrupt stays so (`start` refuses with
    /// [`StartRefusal::CorruptPLog`], which is not transient): reading the same log again
    /// cannot help.
    ///
    /// What a caller refused with [`StartRefusal::ActualizationFailed`] or
    /// [`StartRefusal::Actualizing`] awaits before it tries again, instead of polling `start`:
    /// `busy.into_idle().ready().await`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the sequencer it owns: its background task is stopped (an
    /// unfinished actualization is simply redone by the next sequencer).
    pub async fn ready(mut self) -> Sequencer<Idle, St> {
        let phase = self.inner.shared.backlog().phase();
        let failed = phase == Phase::Failed || (actualizing(phase) && self.inner.task_gone());
        if failed {
            self.inner.restart();
        }
        self.inner.actualization_ended().await;
        self
    }

    /// Opens a sequencing transaction for workspace `ws_id` of kind `ws_kind`.
    ///
    /// Refused while actualizing, when the unflushed backlog (keys or events) is over its
    /// limit, or for an unknown kind; the sequencer comes back inside [`Busy`]. A refusal for
    /// the backlog wakes the flusher; one after a failed actualization starts a new one.
    pub fn start(mut self, ws_kind: WsKind, ws_id: WsId) -> Result<Sequencer<InTx, St>, Busy<St>> {
        let admitted = self.inner.shared.backlog().admit();
        let reason = match admitted {
            Ok(offset) => match self.inner.issuer.begin(ws_kind, ws_id) {
                Ok(()) => {
                    return Ok(Sequencer {
                        inner: self.inner,
                        state: InTx { offset },
                    })
                }
                Err(SeqError::UnknownWsKind(kind)) => StartRefusal::UnknownWsKind(kind),
                Err(e) => {
                    // An idle handle has an idle issuer by construction; recover, don't trust.
                    tracing::error!(error = %vvm_runtime::ErrorChain(&e), "sequencer issuer out of step; actualizing");
                    self.inner.restart();
                    StartRefusal::Actualizing
                }
            },
            Err(reason @ StartRefusal::Backlog { .. }) => {
                self.inner.shared.flush_signal.notify_one();
                reason
            }
            Err(StartRefusal::ActualizationFailed) => {
                self.inner.restart();
                StartRefusal::ActualizationFailed
            }
            Err(StartRefusal::Actualizing) if self.inner.task_gone() => {
                self.inner.restart();
                StartRefusal::Actualizing
            }
            Err(reason) => reason,
        };
        Err(Busy {
            reason,
            sequencer: self,
        })
    }
}

impl<St: SeqStorage> Sequencer<InTx, St> {
    /// The PLog offset the transaction's event is to be written at.
    pub fn offset(&self) -> PLogOffset {
        self.state.offset
    }

    /// The next number of sequence `seq_id` for this transaction's workspace.
    ///
    /// Looked up in the transaction (when it used the sequence already), then the cache; when
    /// neither knows the sequence, the number follows the maximum of the unflushed backlog and
    /// storage (one read for all sequences of the kind, which warms the cache), never one of
    /// them alone. Nothing happens until the future is polled.
    ///
    /// The future is small and its cached path a plain function of the issuer; the path that
    /// reads storage is boxed (it allocates anyway), so that callers embedding this future in
    /// their own do not carry the storage read's state along.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a number is taken only when the future returns it; dropping it during its storage
    /// read issues nothing, and the next call reads again.
    #[inline]
    pub fn next(&mut self, seq_id: SeqId) -> impl Future<Output = Result<Number, NextError>> + '_ {
        let mut this = Some(self);
        let mut uncached = None;
        std::future::poll_fn(move |cx| {
            if let Some(this) = this.take() {
                match this.inner.issuer.next_cached(seq_id) {
                    Ok(Some(n)) => return Poll::Ready(Ok(n)),
                    Err(e) => return Poll::Ready(Err(e.into())),
                    Ok(None) => uncached = Some(this.next_uncached_boxed(seq_id)),
                }
            }
            match uncached.as_mut() {
                Some(fut) => fut.as_mut().poll(cx),
                None => panic!("`Sequencer::next` polled after it completed"),
            }
        })
    }

    /// Kept out of line so that the cached path of [`next`](Self::next) stays small.
    #[cold]
    #[inline(never)]
    fn next_uncached_boxed(
        &mut self,
        seq_id: SeqId,
    ) -> Pin<Box<impl Future<Output = Result<Number, NextError>> + '_>> {
        Box::pin(self.next_uncached(seq_id))
    }

    async fn next_uncached(&mut self, seq_id: SeqId) -> Result<Number, NextError> {
        let inner = &mut *self.inner;
        let key = inner.issuer.key(seq_id)?;
        let seqs: Vec<SeqId> = inner.issuer.kind_seqs()?.iter().map(|&(s, _)| s).collect();
        // The backlog's numbers of every sequence of the kind, taken *before* reading storage:
        // an entry leaves the backlog only after it was written, so whatever the read misses
        // is in this snapshot. Storage is read even when the backlog has the key: a replayed
        // number there may be below what storage holds (the core takes the maximum).
        let mut pending = Vec::with_capacity(seqs.len());
        inner
            .shared
            .backlog()
            .snapshot(key.ws_id, inner.issuer.kind_seqs()?, &mut pending);
        let shared = &inner.shared;
        let read = shared.storage.read_numbers(key.ws_id, &seqs);
        let stored = shared
            .call("read_numbers", shared.config.call_timeout_ms, read)
            .await?;
        if stored.len() != seqs.len() {
            return Err(SeqStorageError::Corrupt {
                what: format!(
                    "read_numbers returned {} numbers for {} sequences",
                    stored.len(),
                    seqs.len()
                ),
            }
            .into());
        }
        Ok(inner.issuer.next_from(seq_id, &pending, &stored)?)
    }

    /// Ends the transaction: its event is in the PLog. Its numbers join the backlog and the
    /// flusher is woken.
    pub fn flush(mut self) -> Sequencer<Idle, St> {
        let offset = self.state.offset;
        let committed = match self.inner.issuer.issued() {
            Ok((ws_id, issued)) => self
                .inner
                .shared
                .backlog()
                .commit(offset, ws_id, issued)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match committed.and_then(|()| self.inner.issuer.end().map_err(|e| e.to_string())) {
            Ok(()) => self.inner.shared.flush_signal.notify_one(),
            Err(e) => {
                // Cannot happen while the types hold; the PLog decides, so actualize.
                tracing::error!(error = %e, "sequencer commit out of step; actualizing");
                self.inner.restart();
            }
        }
        Sequencer {
            inner: self.inner,
            state: Idle { _private: () },
        }
    }

    /// Gives the transaction up (its event was not written, or it is unknown whether it was):
    /// forgets the cache and unflushed numbers and catches up with the PLog again. Numbers the
    /// event did not commit are handed out again.
    pub fn actualize(mut self) -> Sequencer<Actualizing, St> {
        self.inner.restart();
        Sequencer {
            inner: self.inner,
            state: Actualizing { _private: () },
        }
    }
}

impl<S: SeqState, St: SeqStorage> Sequencer<S, St> {
    /// Where the sequencer stands.
    pub fn status(&self) -> SeqStatus {
        let shared = &self.inner.shared;
        let (phase, unflushed_keys, unflushed_events) = {
            let b = shared.backlog();
            (b.phase(), b.unflushed_keys(), b.unflushed_events())
        };
        SeqStatus {
            phase,
            unflushed_keys,
            unflushed_events,
            writes_ok: shared.writes_ok.load(std::sync::atomic::Ordering::Relaxed),
            writes_failed: shared
                .writes_failed
                .load(std::sync::atomic::Ordering::Relaxed),
            last_error: shared.last_error(),
        }
    }

    /// The storage.
    pub fn storage(&self) -> &St {
        &self.inner.shared.storage
    }

    /// Stops the background task and makes one last attempt to persist the backlog, all within
    /// `shutdown_timeout_ms` (and the last write's own call timeout), however storage behaves.
    /// An open transaction is given up: the PLog decides about its event.
    ///
    /// The task is stopped as on [`actualize`](Sequencer::actualize): a write in flight returns
    /// first (and counts), unless the budget runs out; then it is aborted. Reports
    /// [`ShutdownError::NotActualized`] when the sequencer had not caught up with the PLog
    /// (unfinished or failed actualization), [`ShutdownError::Unflushed`] when committed
    /// numbers stay unstored.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future aborts the background task and gives up the last write: numbers committed
    /// and not yet stored are not persisted (what [`ShutdownError::Unflushed`] reports when awaited);
    /// they are recovered from the PLog by the next sequencer's actualization.
    pub async fn shutdown(mut self) -> Result<(), ShutdownError> {
        let inner = &mut *self.inner;
        inner.issuer.abort();
        let shared = Arc::clone(&inner.shared);
        let budget = Duration::from_millis(shared.config.shutdown_timeout_ms);
        let deadline = tokio::time::Instant::now() + budget;
        if let Some(worker) = inner.worker.take() {
            worker.stop();
            if !worker.join_until(deadline).await {
                tracing::warn!("sequencer shutdown: background task aborted at the deadline");
            }
        }
        // A batch of an aborted write may be taken again; harmless when it was recorded.
        shared.backlog().abandon_batch();
        let mut buf = Vec::new();
        // The handle's own round: nobody stops it but the deadline.
        let never = Stop::default();
        let last_round = flush_round(&shared, &never, &mut buf);
        if let Err(elapsed) = tokio::time::timeout_at(deadline, last_round).await {
            tracing::warn!(%elapsed, "sequencer shutdown: last flush cut short");
        }
        let (phase, unflushed_keys, unflushed_events) = {
            let b = shared.backlog();
            (b.phase(), b.unflushed_keys(), b.unflushed_events())
        };
        match phase {
            Phase::Ready(_) if unflushed_keys == 0 && unflushed_events == 0 => Ok(()),
            Phase::Ready(_) => Err(ShutdownError::Unflushed {
                unflushed_keys,
                unflushed_events,
            }),
            Phase::Loading | Phase::Replaying(_) | Phase::Failed | Phase::Corrupt { .. } => {
                Err(ShutdownError::NotActualized {
                    phase,
                    cause: shared.actualize_failure(),
                })
            }
        }
    }
}

/// `start` refused: the reason and the idle sequencer, handed back.
pub struct Busy<St: SeqStorage> {
    /// Why. [`StartRefusal::is_transient`] tells whether trying again later can help.
    pub reason: StartRefusal,
    pub(crate) sequencer: Sequencer<Idle, St>,
}

impl<St: SeqStorage> Busy<St> {
    /// The sequencer, still idle.
    pub fn into_idle(self) -> Sequencer<Idle, St> {
        self.sequencer
    }
}

impl<St: SeqStorage> fmt::Debug for Busy<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Busy")
            .field("reason", &self.reason)
            .finish()
    }
}

impl<St: SeqStorage> fmt::Display for Busy<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequencer busy: {}", self.reason)
    }
}

impl<St: SeqStorage> std::error::Error for Busy<St> {}
