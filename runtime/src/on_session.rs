//! A VVM's side of the session it holds its slot on: the session's acquire and release of the
//! slot, its loss, its kill deadline and its end, with the store's type erased so that the
//! driver and the executor (generic only over a [`LeaseStore`](crate::LeaseStore)) can run a
//! VVM on any [`SessionStore`].

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;
use vvm_core::{Instant, LossReason, Revision, Slot};

use crate::session::{Holding, SessionError, SessionHandle, SessionStatus};
use crate::session_store::SessionStore;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What an acquire through the session found.
pub(crate) enum Acquire {
    /// The holding, written at its revision.
    Held(Box<dyn HeldSlot>),
    /// Someone else holds the slot.
    Refused,
}

/// A holding of the session, type-erased.
pub(crate) trait HeldSlot: Send {
    /// Its revision: the fencing token.
    fn revision(&self) -> Revision;
    /// Deletes its record, then detaches it.
    fn release(self: Box<Self>) -> BoxFuture<Result<bool, SessionError>>;
    /// Detaches it as never used: no service started under it. Its record is left to the
    /// session.
    fn drop_unused(self: Box<Self>);
}

impl<S: SessionStore + Send + Sync + 'static> HeldSlot for Holding<S> {
    fn revision(&self) -> Revision {
        Holding::token(self).revision
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<bool, SessionError>> {
        Box::pin(Holding::release(*self))
    }

    fn drop_unused(self: Box<Self>) {
        Holding::drop_unused(*self);
    }
}

/// The session a VVM runs on, type-erased.
pub(crate) trait SessionSide: Send + Sync {
    /// Acquires `slot` as a holding of the session.
    fn acquire(&self, slot: Slot) -> BoxFuture<Result<Acquire, SessionError>>;
    /// Resolves when the session is lost (with why) or ended otherwise (`None`).
    fn lost(&self) -> BoxFuture<Option<LossReason>>;
    /// Where the session stands now.
    fn status(&self) -> SessionStatus;
    /// The session's kill deadline, as it moves.
    fn kill_deadlines(&self) -> watch::Receiver<Option<Instant>>;
    /// Gives the session up at once (see [`SessionHandle::abandon`]): services stopped without
    /// being vouched for.
    fn abandon(&self);
    /// The VVM is done with the session; `clean` when it vouches that nothing of it acts any
    /// more (every service stopped by itself, nothing lost). Its own session is closed then,
    /// and abandoned otherwise; a shared one is left to its owner when clean, and abandoned
    /// otherwise (every VVM on it then stops: see `Vvm::provide_on_shared_session`).
    fn finish(&self, clean: bool) -> BoxFuture<()>;
}

/// A [`SessionHandle`] as a VVM's session: its own (closed after the release) or shared.
pub(crate) struct OnSession<S> {
    pub(crate) handle: SessionHandle<S>,
    pub(crate) own: bool,
}

impl<S> SessionSide for OnSession<S>
where
    S: SessionStore + Clone + Send + Sync + 'static,
{
    fn acquire(&self, slot: Slot) -> BoxFuture<Result<Acquire, SessionError>> {
        let handle = self.handle.clone();
        Box::pin(async move {
            Ok(match handle.acquire(slot).await? {
                Some(holding) => Acquire::Held(Box::new(holding)),
                None => Acquire::Refused,
            })
        })
    }

    fn lost(&self) -> BoxFuture<Option<LossReason>> {
        let handle = self.handle.clone();
        Box::pin(async move { handle.lost().await })
    }

    fn status(&self) -> SessionStatus {
        self.handle.status()
    }

    fn kill_deadlines(&self) -> watch::Receiver<Option<Instant>> {
        self.handle.kill_deadlines()
    }

    fn abandon(&self) {
        self.handle.abandon();
    }

    fn finish(&self, clean: bool) -> BoxFuture<()> {
        let handle = self.handle.clone();
        let own = self.own;
        Box::pin(async move {
            if !clean {
                // Nobody vouches for what ran under the holding: the session must neither be
                // kept alive for it nor closed cleanly; its deadline stays (a lost session's
                // too). For a shared session this stops every VVM on it.
                handle.abandon();
            } else if own {
                match handle.close().await {
                    Ok(deleted) => tracing::debug!(deleted, "own session closed"),
                    Err(error) => tracing::warn!(
                        error = %crate::ErrorChain(&error),
                        "own session not closed; its kill deadline stays armed"
                    ),
                }
            }
        })
    }
}

/// The holding the executor keeps between the acquire and the release (or the end).
#[derive(Clone, Default)]
pub(crate) struct Kept(Arc<Mutex<Option<Box<dyn HeldSlot>>>>);

impl Kept {
    pub(crate) fn put(&self, held: Box<dyn HeldSlot>) {
        // A holding kept before (an acquire whose answer came too late) detaches when dropped.
        *self.lock() = Some(held);
    }

    pub(crate) fn take(&self) -> Option<Box<dyn HeldSlot>> {
        self.lock().take()
    }

    /// Drops the holding kept, if any, as never used (see [`HeldSlot::drop_unused`]).
    pub(crate) fn drop_unused(&self) {
        if let Some(held) = self.take() {
            held.drop_unused();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Box<dyn HeldSlot>>> {
        // Every critical section leaves the option consistent; a poisoned lock is usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
