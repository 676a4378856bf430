//! The task behind an [`Elections`](super::Elections) handle: it opens the session when the
//! first slot is wanted, keeps one [`Holding`] per slot, closes the session when nothing is
//! held, and turns a loss of the session into a loss of every slot. The keepalive and the kill
//! deadline are the session's own task's; this one only serves commands, one at a time.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot, watch};
use vvm_core::{FencingToken, LeaseConfig, LossReason, OpenRefusal, Slot};

use super::{Tenures, ELECTIONS_SLOTS_MAX};
use crate::error::ElectionsError;
use crate::killer::KillerThread;
use crate::session::{Holding, SessionError, SessionHandle, SessionStatus};
use crate::session_store::SessionStore;
use crate::store::LeaseValue;

/// A command of the handle to the task.
pub(super) enum Command {
    Acquire(Slot, oneshot::Sender<Result<FencingToken, ElectionsError>>),
    Release(Slot, oneshot::Sender<Result<(), ElectionsError>>),
    ReleaseAll(oneshot::Sender<Result<(), ElectionsError>>),
    Cleanup(oneshot::Sender<()>),
    /// The caller of an acquire gave up after the reply was sent: release this tenure, if it
    /// is still held.
    Abandoned(FencingToken),
}

/// What woke the task.
enum Wake {
    /// The session ended: lost (with why) or closed.
    Ended(Option<LossReason>),
    Command(Option<Command>),
}

/// What the task keeps.
pub(super) struct Task<S> {
    store: S,
    value: LeaseValue,
    lease: LeaseConfig,
    killer: KillerThread,
    commands: mpsc::Receiver<Command>,
    tenures: watch::Sender<Tenures>,
    /// The session, while something is held (or being acquired, or lost and not released).
    session: Option<SessionHandle<S>>,
    /// One holding per slot of the session.
    holdings: HashMap<Slot, Holding<S>>,
}

impl<S: SessionStore + Clone> Task<S> {
    pub(super) fn new(
        store: S,
        value: LeaseValue,
        lease: LeaseConfig,
        killer: KillerThread,
        commands: mpsc::Receiver<Command>,
        tenures: watch::Sender<Tenures>,
    ) -> Self {
        Task {
            store,
            value,
            lease,
            killer,
            commands,
            tenures,
            session: None,
            holdings: HashMap::new(),
        }
    }

    /// Serves commands until the handle is dropped or cleaned up; releases everything then.
    pub(super) async fn run(mut self) {
        loop {
            let watched = match self.lost() {
                None => self.session.as_ref(),
                Some(_) => None,
            };
            let wake = match watched {
                Some(session) => tokio::select! {
                    biased;
                    reason = session.lost() => Wake::Ended(reason),
                    command = self.commands.recv() => Wake::Command(command),
                },
                None => Wake::Command(self.commands.recv().await),
            };
            let command = match wake {
                Wake::Ended(reason) => {
                    self.on_lost(reason);
                    continue;
                }
                Wake::Command(command) => command,
            };
            match command {
                Some(Command::Acquire(slot, reply)) => {
                    if reply.is_closed() {
                        // Its caller gave up before it began: nothing is tried.
                        continue;
                    }
                    let result = self.acquire(slot).await;
                    if let Err(Ok(token)) = reply.send(result) {
                        // Its caller gave up while the store answered: nobody acts on the
                        // slot, so nobody may keep it.
                        self.abandoned(token).await;
                    }
                }
                Some(Command::Abandoned(token)) => self.abandoned(token).await,
                Some(Command::Release(slot, reply)) => {
                    let result = self.release(slot).await;
                    let _ = reply.send(result);
                }
                Some(Command::ReleaseAll(reply)) => {
                    let result = self.release_all().await;
                    let _ = reply.send(result);
                }
                Some(Command::Cleanup(reply)) => {
                    let _ = self.release_all().await;
                    tracing::debug!("elections cleaned up");
                    let _ = reply.send(());
                    return;
                }
                // The handle is gone: release what is held, then end.
                None => {
                    let _ = self.release_all().await;
                    tracing::debug!("elections ended with their handle");
                    return;
                }
            }
        }
    }

    fn lost(&self) -> Option<LossReason> {
        self.tenures.borrow().lost()
    }

    /// The session ended without a close: every slot is lost at once, in one change.
    fn on_lost(&mut self, reason: Option<LossReason>) {
        let Some(reason) = reason else {
            // Closed: only this task closes, and only with nothing held. Should it ever end
            // otherwise, its holdings ended with it; it is not watched again.
            tracing::error!(
                slots = self.holdings.len(),
                "session ended without a close; its slots are forgotten"
            );
            self.holdings.clear();
            self.session = None;
            self.tenures.send_replace(Tenures::default());
            return;
        };
        tracing::warn!(
            ?reason,
            slots = self.holdings.len(),
            "session lost: every slot is lost"
        );
        self.tenures
            .send_modify(|tenures| tenures.lost = Some(reason));
    }

    async fn acquire(&mut self, slot: Slot) -> Result<FencingToken, ElectionsError> {
        if slot.0 == 0 {
            return Err(ElectionsError::InvalidSlot(slot));
        }
        if let Some(reason) = self.lost() {
            return Err(ElectionsError::Lost(reason));
        }
        if self.holdings.contains_key(&slot) {
            return Err(ElectionsError::AlreadyHeld(slot));
        }
        if self.holdings.len() >= ELECTIONS_SLOTS_MAX {
            return Err(ElectionsError::TooManySlots {
                max: ELECTIONS_SLOTS_MAX,
            });
        }
        let result = self.acquire_on_session(slot).await;
        if self.holdings.is_empty() {
            // Won nothing: no record and no deadline while nothing is held.
            let _ = self.close().await;
        }
        result
    }

    async fn acquire_on_session(&mut self, slot: Slot) -> Result<FencingToken, ElectionsError> {
        if self.session.is_none() {
            // A live record of someone else makes a session not worth opening: a candidate
            // trying again and again costs one read per try. Only a hint: the acquire decides.
            let read = tokio::time::timeout(self.lease.store_timeout(), self.store.get(slot));
            if let Ok(Ok(Some(_))) = read.await {
                return Err(ElectionsError::Held(slot));
            }
            let opened = SessionHandle::open(
                self.store.clone(),
                self.lease,
                self.value.clone(),
                &self.killer,
            )
            .await;
            match opened {
                Ok(session) => {
                    tracing::debug!(session = %session.key(), "session opened");
                    let key = session.key();
                    self.tenures
                        .send_modify(|tenures| tenures.session = Some(key));
                    self.session = Some(session);
                }
                Err(error) => return Err(self.refusal(slot, error)),
            }
        }
        let Some(session) = self.session.as_ref() else {
            return Err(ElectionsError::Closed);
        };
        match session.acquire(slot).await {
            Ok(Some(holding)) => {
                let token = holding.token();
                tracing::info!(slot = slot.0, fencing_token = %token, "slot acquired");
                self.holdings.insert(slot, holding);
                self.tenures.send_modify(|tenures| {
                    tenures.slots.insert(slot, token.revision);
                });
                Ok(token)
            }
            Ok(None) => Err(ElectionsError::Held(slot)),
            Err(error) => Err(self.refusal(slot, error)),
        }
    }

    /// What a failed open or acquire of `slot` tells the caller; a loss of the session is noted.
    fn refusal(&mut self, slot: Slot, error: SessionError) -> ElectionsError {
        tracing::debug!(slot = slot.0, error = %crate::ErrorChain(&error), "slot not acquired");
        let status = self.session.as_ref().map(SessionHandle::status);
        if let Some(SessionStatus::Lost(reason)) = status {
            self.on_lost(Some(reason));
            return ElectionsError::Lost(reason);
        }
        match error {
            SessionError::Lost(reason) => {
                self.on_lost(Some(reason));
                ElectionsError::Lost(reason)
            }
            SessionError::NotOpened(OpenRefusal::DeadlinePassed) => ElectionsError::TooLate(slot),
            SessionError::AlreadyHeld { .. } => ElectionsError::AlreadyHeld(slot),
            _ => ElectionsError::StoreFailed(slot),
        }
    }

    /// Releases the tenure `token` of an acquire whose caller gave up, if it is still held.
    async fn abandoned(&mut self, token: FencingToken) {
        let held = self
            .holdings
            .get(&token.slot)
            .is_some_and(|holding| holding.token() == token);
        if !held {
            return;
        }
        tracing::debug!(
            slot = token.slot.0,
            "slot won for a caller that gave up: released"
        );
        if let Err(error) = self.release(token.slot).await {
            tracing::warn!(slot = token.slot.0, error = %crate::ErrorChain(&error), "slot won for a caller that gave up not released");
        }
    }

    async fn release(&mut self, slot: Slot) -> Result<(), ElectionsError> {
        let Some(holding) = self.holdings.remove(&slot) else {
            return Ok(());
        };
        self.tenures.send_modify(|tenures| {
            tenures.slots.remove(&slot);
        });
        if self.holdings.is_empty() {
            // The last slot: deleting the session deletes its holding too, in one call.
            drop(holding);
            return self.close().await;
        }
        if self.lost().is_some() {
            // Its record went with the session, or expires with it: nothing to delete.
            drop(holding);
            return Ok(());
        }
        match holding.release().await {
            Ok(deleted) => {
                tracing::debug!(slot = slot.0, deleted, "slot released");
                Ok(())
            }
            Err(error) => {
                tracing::warn!(slot = slot.0, error = %crate::ErrorChain(&error), "slot release not confirmed; its record stays with the session");
                Err(ElectionsError::ReleaseUnconfirmed)
            }
        }
    }

    async fn release_all(&mut self) -> Result<(), ElectionsError> {
        if self.holdings.is_empty() && self.session.is_none() {
            return Ok(());
        }
        // Detached first (their records stay with the session), then deleted with it.
        self.holdings.clear();
        self.tenures.send_modify(|tenures| tenures.slots.clear());
        self.close().await
    }

    /// Closes the session, with nothing held any more: a live session's record is deleted
    /// (and with it every holding on it), which removes the kill deadline once confirmed; a
    /// lost session deletes nothing and keeps its deadline.
    async fn close(&mut self) -> Result<(), ElectionsError> {
        debug_assert!(self.holdings.is_empty(), "closed with slots held");
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let lost = self.tenures.borrow().lost();
        self.tenures.send_if_modified(|tenures| {
            let modified = *tenures != Tenures::default();
            *tenures = Tenures::default();
            modified
        });
        let closed = session.close().await;
        match (lost, closed) {
            (None, Ok(true)) => {
                tracing::debug!(session = %session.key(), "session closed; kill deadline removed");
                Ok(())
            }
            (Some(reason), _) => {
                tracing::debug!(session = %session.key(), ?reason, "lost session closed; its kill deadline stays");
                Ok(())
            }
            (None, Ok(false)) => {
                tracing::warn!(session = %session.key(), "session record not deleted; its kill deadline stays");
                Err(ElectionsError::ReleaseUnconfirmed)
            }
            (None, Err(error)) => {
                tracing::warn!(session = %session.key(), error = %crate::ErrorChain(&error), "session not closed; its kill deadline stays");
                Err(ElectionsError::ReleaseUnconfirmed)
            }
        }
    }
}
