//! The task behind an [`Elections`](super::Elections) handle: it opens the session when the
//! first slot is wanted, keeps one [`Holding`] per slot, closes the session when nothing is
//! held, and turns a loss of the session into a loss of every slot. The keepalive and the kill
//! deadline are the session's own task's; this one only serves commands, one at a time.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tracing::Instrument;
use vvm_core::{FencingToken, LeaseConfig, LossReason, OpenRefusal, Slot};

use super::{Tenures, ELECTIONS_SLOTS_MAX};
use crate::driver::{record_vanished, Mine};
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
    /// The store says the record of this tenure is gone or another's.
    Vanished(FencingToken),
    Command(Option<Command>),
}

/// The watch of one held slot's record ([`record_vanished`]): a task that reports the tenure's
/// token once the store says its record is gone or another's. Ended with the holding.
struct RecordWatch(AbortHandle);

impl Drop for RecordWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
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
    /// One holding per slot of the session, with the watch of its record.
    holdings: HashMap<Slot, (Holding<S>, RecordWatch)>,
    /// Where the record watches report; the receiver is the task's.
    vanished: (
        mpsc::UnboundedSender<FencingToken>,
        mpsc::UnboundedReceiver<FencingToken>,
    ),
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
            // Each watch sends once at most, and only while its slot is held: bounded by the
            // slots held.
            vanished: mpsc::unbounded_channel(),
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
                    Some(token) = self.vanished.1.recv() => Wake::Vanished(token),
                    command = self.commands.recv() => Wake::Command(command),
                },
                None => Wake::Command(self.commands.recv().await),
            };
            let command = match wake {
                Wake::Ended(reason) => {
                    self.on_lost(reason);
                    continue;
                }
                Wake::Vanished(token) => {
                    self.on_vanished(token).await;
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

    /// The record of a held slot is gone or another's while the session lives (removed from
    /// outside): that slot alone is lost, at once, as the session would never report it
    /// (`Holding.Vanished`). A record that went with the session's (the session's record
    /// removed, or expired) is the session's loss: every slot at once, as its next keepalive
    /// would find. A report of a tenure that is no longer held changes nothing.
    async fn on_vanished(&mut self, token: FencingToken) {
        let held = self
            .holdings
            .get(&token.slot)
            .is_some_and(|(holding, _)| holding.token() == token);
        let Some(key) = self.session.as_ref().map(SessionHandle::key) else {
            return;
        };
        if !held || self.lost().is_some() {
            return;
        }
        let session = tokio::time::timeout(self.lease.store_timeout(), self.store.get_session(key));
        if let Ok(Ok(None)) = session.await {
            tracing::warn!(session = %key, "the session's record is gone: every slot is lost");
            self.on_lost(Some(LossReason::Overtaken));
            return;
        }
        tracing::warn!(
            slot = token.slot.0,
            fencing_token = %token,
            "the slot's record was removed from outside: the slot is lost"
        );
        self.tenures.send_modify(|tenures| {
            tenures.vanished.insert(token.slot);
        });
    }

    /// Watches the record of the tenure `token` until its holding ends.
    fn watch_record(&self, token: FencingToken) -> RecordWatch {
        let vanished = record_vanished(
            Arc::new(self.store.clone()),
            token.slot,
            Mine::Revision(token.revision),
            self.lease.store_timeout(),
        );
        let report = self.vanished.0.clone();
        let watch = tokio::spawn(
            async move {
                vanished.await;
                let _ = report.send(token);
            }
            .in_current_span(),
        );
        RecordWatch(watch.abort_handle())
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
                let watch = self.watch_record(token);
                self.holdings.insert(slot, (holding, watch));
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
            .is_some_and(|(holding, _)| holding.token() == token);
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
        let Some((holding, watch)) = self.holdings.remove(&slot) else {
            return Ok(());
        };
        // Ended first: the delete below is no removal from outside.
        drop(watch);
        let vanished = self.tenures.borrow().vanished.contains(&slot);
        self.tenures.send_modify(|tenures| {
            tenures.slots.remove(&slot);
            tenures.vanished.remove(&slot);
        });
        if self.holdings.is_empty() {
            // The last slot: deleting the session deletes its holding too, in one call.
            drop(holding);
            return self.close().await;
        }
        if self.lost().is_some() || vanished {
            // Its record went with the session, or expires with it, or was removed from
            // outside (what is there now is someone else's): nothing to delete.
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
        self.tenures.send_modify(|tenures| {
            tenures.slots.clear();
            tenures.vanished.clear();
        });
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
