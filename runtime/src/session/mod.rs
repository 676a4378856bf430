//! Sessions at run time: one task, one keepalive and one kill deadline per session, and any
//! number of holdings on it.
//!
//! [`SessionHandle::open`] starts the task of a [`Session`] machine on a
//! [`SessionStore`] and waits until the session record is created. [`SessionHandle::acquire`]
//! then takes slots as [`Holding`]s of the session: the store writes each holding only while the
//! session is live, and the holding lives exactly as long as the session's record. The task
//! keeps the session alive every `L/4` with one store call whatever the number of holdings, and
//! keeps one kill deadline (`0.8·L` after the send time of the last confirmed keepalive) on the
//! [`KillerThread`]: if keepalives fail until then, the process ends before any holding could
//! pass to someone else.
//!
//! A lost session ends every holding at once: [`SessionHandle::lost`] resolves, the services of
//! each holding must stop, and each [`Holding`] is then dropped (or released), which detaches it.
//! Until every holding is detached the session neither closes nor opens anew, so the kill
//! deadline the services still run under is never replaced by a later one.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm_adapters::MemoryStore;
//! use vvm_core::{Incarnation, LeaseConfig, Slot};
//! use vvm_runtime::{KillerThread, LeaseValue, RecordingKiller, SessionHandle};
//!
//! let store = MemoryStore::new();
//! // A recording killer for the example; a service uses `KillerThread::global()`.
//! let killer = KillerThread::new(RecordingKiller::new());
//! let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
//! let session = SessionHandle::open(store, LeaseConfig::default(), value, &killer).await?;
//! let first = session.acquire(Slot(1)).await?.expect("slot 1 is free");
//! let second = session.acquire(Slot(2)).await?.expect("slot 2 is free");
//! assert!(second.token().revision > first.token().revision); // fencing tokens, one per slot
//! first.release().await?;
//! second.release().await?;
//! assert!(session.close().await?, "the session record was deleted");
//! # Ok(()) }
//! ```

mod task;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, oneshot, watch};
use vvm_core::semaphore::SemaphoreName;
use vvm_core::{
    AttachRefusal, FencingToken, HoldingId, Instant, LeaseConfig, LossReason, OpenRefusal,
    Revision, Session, SessionId, SessionKey, Slot,
};

use crate::killer::KillerThread;
use crate::session_store::{Acquired, SessionStore};
use crate::store::{Lease, LeaseValue, StoreError};
use task::{Command, Task};

/// Most sends of one acquire whose outcome stayed unknown (the acquire is idempotent).
pub const ACQUIRE_SENDS_MAX: u32 = 3;

/// Where a session stands, as its handles see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    /// The create is under way.
    Opening,
    /// The session record exists.
    Open {
        /// The session.
        key: SessionKey,
        /// The create's revision.
        revision: Revision,
    },
    /// The open did not succeed.
    NotOpened(OpenRefusal),
    /// The session ended without a close: every holding ended with it.
    Lost(LossReason),
    /// The session was closed.
    Closed,
}

/// Why a session operation did not succeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session was not opened.
    #[error("the session was not opened: {0:?}")]
    NotOpened(OpenRefusal),
    /// The session was lost: every holding ended with it.
    #[error("the session was lost: {0:?}")]
    Lost(LossReason),
    /// The session is closed or closing.
    #[error("the session is closed")]
    Closed,
    /// The session does not take this holding now.
    #[error("the session refused a holding: {0:?}")]
    AttachRefused(AttachRefusal),
    /// This session holds or is acquiring the slot already.
    #[error("slot {slot} is held or being acquired by this session already")]
    AlreadyHeld {
        /// The slot.
        slot: u32,
    },
    /// A close is refused while holdings are attached: their services may still act.
    #[error("{holdings} holdings are still attached")]
    HoldingsRemain {
        /// How many.
        holdings: u32,
    },
    /// A store call failed, or its outcome stayed unknown.
    #[error("store call failed")]
    Store(#[from] StoreError),
    /// A store call did not answer within the store-call timeout.
    #[error("store call did not answer within the store-call timeout")]
    TimedOut,
    /// A batch acquire's store answered for another number of slots than it was asked for
    /// (a store that breaks [`SessionStore::acquire_batch`]'s contract); what it may have
    /// written is the session's.
    #[error("the store answered {answers} acquires for {asked} slots")]
    BatchAnswers {
        /// The slots asked for in the call.
        asked: usize,
        /// The answers it gave.
        answers: usize,
    },
}

struct Shared<S> {
    store: S,
    value: LeaseValue,
    lease: LeaseConfig,
    commands: mpsc::UnboundedSender<Command>,
    status: watch::Receiver<SessionStatus>,
    deadline: watch::Receiver<Option<Instant>>,
    /// The slots held or being acquired: at most one holding per slot and session.
    slots: Mutex<HashSet<Slot>>,
    /// Holdings dropped without a release: their records stay with the session until it ends,
    /// or until an acquire of the slot deletes them first, so that every tenure of the slot
    /// gets a new, higher revision.
    left: Mutex<HashMap<Slot, Revision>>,
    /// The semaphores held or being acquired: the store keeps one party per semaphore and
    /// session, so every `Coordination` handle of the session shares this one view of them.
    semaphores: Mutex<HashSet<SemaphoreName>>,
}

/// An open session. Dropping every handle and holding closes it.
pub struct SessionHandle<S> {
    shared: Arc<Shared<S>>,
    key: SessionKey,
}

/// Another handle of the same session: the session lives while any handle or holding does.
impl<S> Clone for SessionHandle<S> {
    fn clone(&self) -> Self {
        SessionHandle {
            shared: self.shared.clone(),
            key: self.key,
        }
    }
}

impl<S> std::fmt::Debug for SessionHandle<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore + Clone> SessionHandle<S> {
    /// Opens a session of the process `value` names on `store`, with the lease, store-call
    /// timeout and keepalive timing of `lease`, and its kill deadline on `killer`. Returns once
    /// the session record is created.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the only handle of the session being opened; its task
    /// closes the session (deleting the record it may have created) and removes its kill deadline.
    pub async fn open(
        store: S,
        lease: LeaseConfig,
        value: LeaseValue,
        killer: &KillerThread,
    ) -> Result<Self, SessionError> {
        let (commands, receiver) = mpsc::unbounded_channel();
        let (status_tx, mut status) = watch::channel(SessionStatus::Opening);
        let (deadline_tx, deadline) = watch::channel(None);
        let task = Task {
            store: store.clone(),
            value: value.clone(),
            lease,
            killer: killer.register(&format!("session of {}", value.address)),
            machine: Session::after(lease, value.incarnation, last_session_id()),
            commands: receiver,
            status: status_tx,
            deadline: deadline_tx,
            call: None,
            timer: None,
            attaching: None,
            closing: Vec::new(),
            free_ids: Vec::new(),
            next_id: 0,
            mark: None,
        };
        tokio::spawn(task.run());
        let opened = status
            .wait_for(|status| !matches!(status, SessionStatus::Opening))
            .await
            .map(|status| *status);
        let key = match opened {
            Ok(SessionStatus::Open { key, .. }) => key,
            Ok(SessionStatus::NotOpened(refusal)) => return Err(SessionError::NotOpened(refusal)),
            Ok(SessionStatus::Lost(reason)) => return Err(SessionError::Lost(reason)),
            Ok(_) | Err(_) => return Err(SessionError::Closed),
        };
        Ok(SessionHandle {
            shared: Arc::new(Shared {
                store,
                value,
                lease,
                commands,
                status,
                deadline,
                slots: Mutex::default(),
                left: Mutex::default(),
                semaphores: Mutex::default(),
            }),
            key,
        })
    }

    /// [`open`](Self::open), tried again while the store is in trouble — a call that failed or
    /// stayed unknown, an id someone else's live record holds, a create confirmed only after the
    /// deadline it set — until `window` has passed (`Duration::MAX`: for ever), after jittered
    /// pauses growing from `L/20` to `L/4`, as a candidate's acquisition rides out a store
    /// blip. Each try has a session id of its own. Answers the last try's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`open`](Self::open): the try under way is closed.
    pub async fn open_within(
        store: S,
        lease: LeaseConfig,
        value: LeaseValue,
        killer: &KillerThread,
        window: std::time::Duration,
    ) -> Result<Self, SessionError> {
        let deadline = tokio::time::Instant::now().checked_add(window);
        let mut pauses = crate::jittered_backoff(lease.retry_interval(), lease.renew_interval());
        loop {
            let error = match Self::open(store.clone(), lease, value.clone(), killer).await {
                Err(
                    error @ SessionError::NotOpened(
                        OpenRefusal::StoreFailed | OpenRefusal::Taken | OpenRefusal::DeadlinePassed,
                    ),
                ) => error,
                opened => return opened,
            };
            let pause = pauses.next().unwrap_or(lease.renew_interval());
            let again = tokio::time::Instant::now().checked_add(pause);
            match (again, deadline) {
                (Some(again), Some(deadline)) if again >= deadline => return Err(error),
                (None, _) => return Err(error),
                _ => {}
            }
            tracing::debug!(error = %crate::ErrorChain(&error), ?pause, "the session was not opened; trying again");
            tokio::time::sleep(pause).await;
        }
    }

    /// The session's key in the store.
    pub fn key(&self) -> SessionKey {
        self.key
    }

    /// Where the session stands now.
    pub fn status(&self) -> SessionStatus {
        *self.shared.status.borrow()
    }

    /// The session's kill deadline now: `0.8·L` after the send time of its last confirmed
    /// keepalive (earlier while keepalives fail), `None` once a clean close removed it.
    /// Everything acting under the session's holdings must have stopped by then.
    pub fn kill_deadline(&self) -> Option<Instant> {
        *self.shared.deadline.borrow()
    }

    /// Every later kill deadline of the session, as it moves: for a process that keeps its own
    /// copy of it (a supervisor of a command's processes that must end them by then even if
    /// this process is stopped).
    pub fn kill_deadlines(&self) -> watch::Receiver<Option<Instant>> {
        self.shared.deadline.clone()
    }

    /// Resolves when the session is lost (with why) or closed (`None`): from then on no
    /// service may act under any of its holdings.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches the session's status; an end stays an end.
    pub async fn lost(&self) -> Option<LossReason> {
        let mut status = self.shared.status.clone();
        let ended = status
            .wait_for(|status| {
                matches!(
                    status,
                    SessionStatus::Lost(_) | SessionStatus::Closed | SessionStatus::NotOpened(_)
                )
            })
            .await
            .map(|status| *status);
        match ended {
            Ok(SessionStatus::Lost(reason)) => Some(reason),
            _ => None,
        }
    }

    /// Acquires `slot` as a holding of this session: `Ok(None)` when someone else holds it.
    /// The holding is attached to the session before the store is asked, so the session cannot
    /// close under it; a store call with an unknown outcome is sent again (the acquire is
    /// idempotent), at most [`ACQUIRE_SENDS_MAX`] times. The record of an earlier holding of
    /// the slot that was dropped without a release is deleted first, so that the new holding's
    /// revision (its fencing token) is above it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the store answered detaches the holding being made and gives the
    /// slot back to the handle; a record the store may still write for it is left to the session
    /// (deleted with it), as a dropped [`Holding`]'s is. [`Elections`](crate::Elections) releases such
    /// a slot at once; use it unless the session's lifetime bounds the leftover.
    pub async fn acquire(&self, slot: Slot) -> Result<Option<Holding<S>>, SessionError> {
        if !self.lock_slots().insert(slot) {
            return Err(SessionError::AlreadyHeld { slot: slot.0 });
        }
        let mut claim = SlotClaim {
            shared: &self.shared,
            slot,
            kept: false,
        };
        self.delete_left(slot).await?;
        let (reply, answer) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Attach { reply })
            .map_err(|_| SessionError::Closed)?;
        let holding = answer
            .await
            .map_err(|_| SessionError::Closed)?
            .map_err(SessionError::AttachRefused)?;
        let mut attached = Attached {
            shared: &self.shared,
            holding,
            kept: false,
        };
        let timeout = self.shared.lease.store_timeout();
        let acquired =
            send_idempotent(timeout, || self.shared.store.acquire(slot, self.key)).await?;
        match acquired {
            Acquired::Written(revision) => {
                attached.kept = true;
                claim.kept = true;
                Ok(Some(Holding {
                    shared: self.shared.clone(),
                    slot,
                    revision,
                    holding,
                    detached: false,
                }))
            }
            Acquired::Held => Ok(None),
            Acquired::SessionGone => Err(self.gone()),
        }
    }

    /// [`acquire`](Self::acquire) of every slot of `slots` (no slot twice), in as few store calls
    /// as the store allows: [`SessionStore::acquire_batch`] of up to
    /// [`ACQUIRE_BATCH_MAX`](crate::ACQUIRE_BATCH_MAX) slots each (one SQLite transaction each),
    /// each call within the store-call timeout per slot and sent again when its outcome is
    /// unknown, as a single acquire is. The answer for `slots[i]` is at `i`: the holding, or
    /// `None` when someone else holds the slot. A slot this handle holds or acquires already,
    /// or one named twice, refuses the whole call before anything is claimed.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire), for every slot at once: dropping the future gives every
    /// slot not yet handed out back to the handle and detaches its holding; records the store may
    /// still write for them are left to the session.
    pub async fn acquire_many(
        &self,
        slots: &[Slot],
    ) -> Result<Vec<Option<Holding<S>>>, SessionError> {
        {
            let mut claimed = self.lock_slots();
            let mut named = HashSet::with_capacity(slots.len());
            if let Some(&slot) = slots
                .iter()
                .find(|slot| claimed.contains(slot) || !named.insert(**slot))
            {
                return Err(SessionError::AlreadyHeld { slot: slot.0 });
            }
            claimed.extend(slots.iter().copied());
        }
        let mut claims: Vec<SlotClaim<'_, S>> = slots
            .iter()
            .map(|&slot| SlotClaim {
                shared: &self.shared,
                slot,
                kept: false,
            })
            .collect();
        for &slot in slots {
            self.delete_left(slot).await?;
        }
        // One round trip to the session's task for every holding.
        let (reply, answer) = oneshot::channel();
        self.shared
            .commands
            .send(Command::AttachMany {
                count: slots.len(),
                reply,
            })
            .map_err(|_| SessionError::Closed)?;
        let ids = answer
            .await
            .map_err(|_| SessionError::Closed)?
            .map_err(SessionError::AttachRefused)?;
        let mut attached: Vec<Attached<'_, S>> = ids
            .into_iter()
            .map(|holding| Attached {
                shared: &self.shared,
                holding,
                kept: false,
            })
            .collect();
        let mut answers = Vec::with_capacity(slots.len());
        for chunk in slots.chunks(crate::session_store::ACQUIRE_BATCH_MAX) {
            let per_slot = self.shared.lease.store_timeout();
            let timeout = per_slot.saturating_mul(u32::try_from(chunk.len()).unwrap_or(u32::MAX));
            let got = send_idempotent(timeout, || {
                self.shared.store.acquire_batch(chunk.to_vec(), self.key)
            })
            .await?;
            if got.len() != chunk.len() {
                return Err(SessionError::BatchAnswers {
                    asked: chunk.len(),
                    answers: got.len(),
                });
            }
            answers.extend(got);
        }
        if answers.contains(&Acquired::SessionGone) {
            return Err(self.gone());
        }
        let mut holdings = Vec::with_capacity(slots.len());
        for ((acquired, claim), attach) in answers.into_iter().zip(&mut claims).zip(&mut attached) {
            holdings.push(match acquired {
                Acquired::Written(revision) => {
                    attach.kept = true;
                    claim.kept = true;
                    Some(Holding {
                        shared: self.shared.clone(),
                        slot: claim.slot,
                        revision,
                        holding: attach.holding,
                        detached: false,
                    })
                }
                Acquired::Held | Acquired::SessionGone => None,
            });
        }
        Ok(holdings)
    }

    /// Why an acquire found the session gone: lost (with why), or closed.
    fn gone(&self) -> SessionError {
        match self.status() {
            SessionStatus::Lost(reason) => SessionError::Lost(reason),
            _ => SessionError::Closed,
        }
    }

    /// Deletes the record of a holding of `slot` dropped without a release, if there is one.
    async fn delete_left(&self, slot: Slot) -> Result<(), SessionError> {
        let left = lock(&self.shared.left).remove(&slot);
        let Some(revision) = left else {
            return Ok(());
        };
        let expected = Lease {
            value: self.shared.value.clone(),
            revision,
        };
        let timeout = self.shared.lease.store_timeout();
        let call = self.shared.store.compare_and_delete(slot, &expected);
        match tokio::time::timeout(timeout, call).await {
            // Deleted, or gone already (with a session that ended, or taken after it).
            Ok(Ok(_)) => Ok(()),
            failed => {
                lock(&self.shared.left).insert(slot, revision);
                Err(match failed {
                    Ok(Err(error)) => SessionError::Store(error),
                    _ => SessionError::TimedOut,
                })
            }
        }
    }

    /// Closes the session: deletes its record (and every holding left to it) once no holding
    /// is attached. `Ok(true)` when our record was deleted; refused with
    /// [`SessionError::HoldingsRemain`] while holdings are attached, and then the session goes
    /// on as before.
    ///
    /// # Cancel safety
    ///
    /// A close asked of the session's task is carried out whether or not the caller waits for the
    /// answer.
    pub async fn close(&self) -> Result<bool, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Close { reply })
            .map_err(|_| SessionError::Closed)?;
        answer.await.map_err(|_| SessionError::Closed)?
    }

    /// Attaches a holding that is not a slot (a semaphore's grant or queued acquire): the
    /// session neither closes nor opens anew until it is detached.
    pub(crate) async fn attach(&self) -> Result<HoldingId, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.shared
            .commands
            .send(Command::Attach { reply })
            .map_err(|_| SessionError::Closed)?;
        answer
            .await
            .map_err(|_| SessionError::Closed)?
            .map_err(SessionError::AttachRefused)
    }

    /// The store the session lives in.
    pub(crate) fn store(&self) -> &S {
        &self.shared.store
    }

    /// The session's lease configuration (its store-call timeout).
    pub(crate) fn lease(&self) -> LeaseConfig {
        self.shared.lease
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashSet<Slot>> {
        lock(&self.shared.slots)
    }
}

/// Sends an idempotent store call made by `call`, each send within `timeout`, again while its
/// outcome stays unknown (an unknown error or no answer), at most [`ACQUIRE_SENDS_MAX`] times.
async fn send_idempotent<T, F>(
    timeout: std::time::Duration,
    mut call: impl FnMut() -> F,
) -> Result<T, SessionError>
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut sends = 0;
    loop {
        sends += 1;
        match tokio::time::timeout(timeout, call()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(error)) if error.is_unknown() && sends < ACQUIRE_SENDS_MAX => {}
            Ok(Err(error)) => return Err(SessionError::Store(error)),
            Err(_) if sends < ACQUIRE_SENDS_MAX => {}
            Err(_) => return Err(SessionError::TimedOut),
        }
    }
}

/// A slot being acquired; given back when the acquire does not end in a holding.
struct SlotClaim<'a, S> {
    shared: &'a Shared<S>,
    slot: Slot,
    kept: bool,
}

impl<S> Drop for SlotClaim<'_, S> {
    fn drop(&mut self) {
        if !self.kept {
            lock(&self.shared.slots).remove(&self.slot);
        }
    }
}

/// A holding attached to the session; detached when dropped unless kept. An acquire that ends
/// without a holding (refused, failed, or unknown after every send) detaches it: nothing acts
/// under it, and a record the store may still have written is left to the session.
struct Attached<'a, S> {
    shared: &'a Shared<S>,
    holding: HoldingId,
    kept: bool,
}

impl<S> Drop for Attached<'_, S> {
    fn drop(&mut self) {
        if !self.kept {
            // Never handed to anyone: nothing acted under it.
            let _ = self.shared.commands.send(Command::Detach {
                holding: self.holding,
                acted: false,
            });
        }
    }
}

/// A slot held by a session: its record lives as long as the session's. Dropping it detaches
/// it from the session and leaves the record to the session (deleted with it, or by the
/// session's next acquire of the slot); [`release`](Self::release) deletes the record first. Drop or release it only once the
/// services acting under it have stopped.
pub struct Holding<S> {
    shared: Arc<Shared<S>>,
    slot: Slot,
    revision: Revision,
    holding: HoldingId,
    detached: bool,
}

impl<S> std::fmt::Debug for Holding<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holding")
            .field("slot", &self.slot)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

impl<S: SessionStore> Holding<S> {
    /// The slot.
    pub fn slot(&self) -> Slot {
        self.slot
    }

    /// The fencing token of this tenure: the slot and the revision of the holding's record,
    /// above every earlier one of the slot.
    pub fn token(&self) -> FencingToken {
        FencingToken {
            slot: self.slot,
            revision: self.revision,
        }
    }

    /// Deletes the holding's record, then detaches it. `Ok(true)` when the record was ours and
    /// deleted; `Ok(false)` when it had gone already (with its session). On an error the record
    /// is left to the session, as by a drop.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the store answered detaches the holding as a drop does: its record
    /// is left to the session (deleted with it, or by the session's next acquire of the slot).
    pub async fn release(mut self) -> Result<bool, SessionError> {
        let expected = Lease {
            value: self.shared.value.clone(),
            revision: self.revision,
        };
        let timeout = self.shared.lease.store_timeout();
        let deleted = tokio::time::timeout(
            timeout,
            self.shared.store.compare_and_delete(self.slot, &expected),
        )
        .await;
        // A release whose outcome is not known leaves the record to the session, as a drop.
        self.detach(!matches!(deleted, Ok(Ok(_))));
        match deleted {
            Ok(result) => Ok(result?),
            Err(_) => Err(SessionError::TimedOut),
        }
    }
}

impl<S> SessionHandle<S> {
    /// Gives the session up without closing it: no keepalive is sent any more, nothing is
    /// deleted, and the kill deadline stays armed where it is, so the process ends at it. For
    /// services that stopped without being vouched for (aborted after their stop timeout,
    /// vanished): the session must neither go on being kept alive for them nor be closed
    /// cleanly. Every handle then sees the session lost with [`LossReason::Abandoned`]; a lost
    /// or closed session is left as it is.
    pub(crate) fn abandon(&self) {
        let _ = self.shared.commands.send(Command::Abandon);
    }

    /// Detaches a holding of [`attach`](Self::attach).
    pub(crate) fn detach(&self, holding: HoldingId) {
        let _ = self.shared.commands.send(Command::Detach {
            holding,
            acted: true,
        });
    }

    /// Claims `name` for one acquire of the session, through whichever handle: `false` when
    /// the session holds it or is acquiring it already.
    pub(crate) fn claim_semaphore(&self, name: &SemaphoreName) -> bool {
        lock(&self.shared.semaphores).insert(name.clone())
    }

    /// Gives back a claim of [`claim_semaphore`](Self::claim_semaphore): the request is over.
    pub(crate) fn unclaim_semaphore(&self, name: &SemaphoreName) {
        lock(&self.shared.semaphores).remove(name);
    }
}

impl<S> Holding<S> {
    /// Drops a holding that was never handed to anyone — acquired after its session ended,
    /// so nothing acted under it: after a loss, the session's kill deadline may go with it
    /// (`Session.NothingActingNoDeadline`). Its record is left to the session, as by a drop.
    pub(crate) fn drop_unused(mut self) {
        self.detach_as(true, false);
    }

    /// Detaches the holding; `left` when its record stays in the store (a drop).
    fn detach(&mut self, left: bool) {
        self.detach_as(left, true);
    }

    /// Detaches the holding; `acted` unless it was never handed to anyone.
    fn detach_as(&mut self, left: bool, acted: bool) {
        if !self.detached {
            self.detached = true;
            if left {
                lock(&self.shared.left).insert(self.slot, self.revision);
            }
            let _ = self.shared.commands.send(Command::Detach {
                holding: self.holding,
                acted,
            });
            lock(&self.shared.slots).remove(&self.slot);
        }
    }
}

impl<S> Drop for Holding<S> {
    fn drop(&mut self) {
        self.detach(true);
    }
}

/// The id before the one the next session of this process opens under: every handle's machine
/// opens once, and no two of a process share an id, whatever their incarnations
/// (`Session.FreshId`: a create read back after an unknown outcome must be that create's).
fn last_session_id() -> SessionId {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    SessionId(OPENED.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section leaves the set or map consistent; a poisoned lock is usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
