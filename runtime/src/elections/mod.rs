//! Elections without a VVM around them: any number of slots held on one session of a
//! [`SessionStore`], for callers (and tests) that acquire, hold and release slots directly.
//!
//! One [`Elections`] handle owns at most one session at a time ([`SessionHandle`]): one
//! keepalive every `L/4` and one kill deadline, whatever the number of slots it holds. Each slot
//! is a holding of that session: its record lives exactly as long as the session's, so a
//! keepalive costs one store call for all of them, and a lost session loses every slot at once.
//!
//! - **The session lives while something is held.** It is opened by the first
//!   [`acquire`](Elections::acquire) (not by [`start`](Elections::start), which writes nothing
//!   and needs no `await`) and closed as soon as nothing is held any more: by the release of the
//!   last slot, by [`release_all`](Elections::release_all), or by an acquire that won nothing. A
//!   handle that holds nothing therefore has no record in the store and no kill deadline: a
//!   process that released everything may go on working, or stall, without being killed.
//! - **Release disarms as a clean shutdown does.** Closing deletes the session record, and with
//!   it every holding still on it, in one store call; once that delete is confirmed the kill
//!   deadline is removed. A delete that is not confirmed keeps the deadline
//!   ([`ElectionsError::ReleaseUnconfirmed`]).
//! - **A loss is the session's.** When the session is lost (its record refused, gone, or its
//!   keepalives failing until the deadline), every slot turns [`Tenure::Lost`] in one change of
//!   [`Tenures`], and the session's kill deadline stays armed until it fires: whatever acted
//!   under the slots must stop before then. The lost slots stay listed until they are released
//!   (which deletes nothing); until then nothing new is acquired ([`ElectionsError::Lost`]), so
//!   no new session's deadline stands in for the lost one's.
//! - **A record removed from outside loses its slot alone.** Each held slot's record is watched
//!   through the store's change feed (read once at each change): when the store says it is gone
//!   or another's while the session lives (`etcdctl del` of its key, a `DELETE` in the file), that
//!   slot turns [`Tenure::Lost`] with [`LossReason::Overtaken`] at once — the session would never
//!   report it, and someone else may hold the slot already. The other slots stay held; the lost
//!   one stays listed until it is released (which deletes nothing).
//! - **Fencing tokens.** Each acquire returns the revision of the slot's holding record, above
//!   every earlier tenure of the slot; keepalives do not change it.
//!
//! Commands are served one at a time, in order, by one task per handle; the session has its own
//! task (the keepalive and the kill deadline).

mod task;

use std::collections::{BTreeMap, BTreeSet};

use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;
use vvm_core::{FencingToken, LeaseConfig, LossReason, Revision, SessionKey, Slot};

use crate::error::ElectionsError;
use crate::killer::KillerThread;
use crate::session_store::SessionStore;
use crate::store::LeaseValue;
use crate::vvm::new_incarnation;
#[cfg(doc)]
use crate::SessionHandle;
use task::{Command, Task};

/// Slots one handle holds at most: the 100 000 holdings a process's session is sized for (the
/// session itself takes ten times more, `HOLDINGS_MAX`). Each slot costs the handle a map entry
/// and a holding; the bound keeps a runaway caller from growing them without end.
pub const ELECTIONS_SLOTS_MAX: usize = 100_000;

/// Commands queued at most; callers wait for replies, so more never pile up.
const COMMANDS_MAX: usize = 8;

/// Where one slot stands for a handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tenure {
    /// Not held by this handle.
    Idle,
    /// Held; the fencing token of this tenure.
    Held(FencingToken),
    /// Leadership of `slot` was lost (not released).
    Lost {
        /// The slot.
        slot: Slot,
        /// Why.
        reason: LossReason,
    },
}

/// Every slot of an [`Elections`] handle, as [`Elections::watch`] sends it: the slots held and,
/// once the session is lost, why every one of them is lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenures {
    /// The slots of the current session (held, or lost with it), with their revisions.
    slots: BTreeMap<Slot, Revision>,
    /// Set when the session was lost: every slot in `slots` is lost.
    lost: Option<LossReason>,
    /// Slots of `slots` whose record was removed from outside while the session lives: lost
    /// (`Overtaken`) one by one, until released.
    vanished: BTreeSet<Slot>,
    /// The session, while one is open (or lost and not yet closed).
    session: Option<SessionKey>,
}

impl Tenures {
    /// Where `slot` stands.
    pub fn get(&self, slot: Slot) -> Tenure {
        match (self.slots.get(&slot), self.lost) {
            (None, _) => Tenure::Idle,
            (Some(_), None) if self.vanished.contains(&slot) => Tenure::Lost {
                slot,
                reason: LossReason::Overtaken,
            },
            (Some(&revision), None) => Tenure::Held(FencingToken { slot, revision }),
            (Some(_), Some(reason)) => Tenure::Lost { slot, reason },
        }
    }

    /// The fencing tokens of the slots held, in slot order (none once the session is lost; not
    /// those whose record was removed from outside).
    pub fn held(&self) -> impl Iterator<Item = FencingToken> + '_ {
        let live = self.lost.is_none();
        self.slots
            .iter()
            .filter(move |(slot, _)| live && !self.vanished.contains(slot))
            .map(|(&slot, &revision)| FencingToken { slot, revision })
    }

    /// Why the session was lost, while its lost slots are not all released. A slot lost alone
    /// (its record removed from outside) does not show here: see [`get`](Self::get).
    pub fn lost(&self) -> Option<LossReason> {
        self.lost
    }

    /// The key of the session the slots are held on, while one is open (or lost, until every
    /// lost slot is released).
    pub fn session(&self) -> Option<SessionKey> {
        self.session
    }

    /// How many slots are listed: held, or lost and not yet released.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is listed.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

/// Asks the handle's task to acquire `slot` and waits for its answer, watching it until it is
/// read: a caller that gives up (drops the future) refuses the answer, so that the task releases
/// what it wins afterwards, and a token already sent is handed back to the task
/// ([`Command::Abandoned`]) to release.
async fn acquire_through(
    commands: &mpsc::Sender<Command>,
    slot: Slot,
) -> Result<FencingToken, ElectionsError> {
    let (reply, receiver) = oneshot::channel();
    commands
        .send(Command::Acquire(slot, reply))
        .await
        .map_err(|_| ElectionsError::Closed)?;
    let mut answer = AcquireAnswer {
        receiver,
        commands,
        read: false,
    };
    let result = (&mut answer.receiver)
        .await
        .map_err(|_| ElectionsError::Closed);
    answer.read = true;
    result?
}

/// The answer to one acquire, watched until it is read: dropped unread (its caller gave up),
/// it refuses the answer, and a slot already won is given back to the task to release.
struct AcquireAnswer<'a> {
    receiver: oneshot::Receiver<Result<FencingToken, ElectionsError>>,
    commands: &'a mpsc::Sender<Command>,
    read: bool,
}

impl Drop for AcquireAnswer<'_> {
    fn drop(&mut self) {
        if self.read {
            return;
        }
        // From now on the task's reply fails, and the task releases what it won; a reply
        // sent before is taken back here.
        self.receiver.close();
        let Ok(Ok(token)) = self.receiver.try_recv() else {
            return;
        };
        match self.commands.try_send(Command::Abandoned(token)) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(command)) => {
                // The queue is full of callers waiting for their answers: wait for room, in
                // the background (the task ended, if there is no runtime, with its handle's).
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let commands = self.commands.clone();
                    runtime.spawn(async move {
                        let _ = commands.send(command).await;
                    });
                }
            }
        }
    }
}

/// Handle of the elections of one process (or one part of it): any number of slots on one
/// session. Dropping it releases what it holds, in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use vvm_adapters::MemoryStore;
/// use vvm_core::{LeaseConfig, Slot};
/// use vvm_runtime::{Elections, ElectionsError, KillerThread, Tenure};
///
/// let lease = LeaseConfig::new(Duration::from_secs(20))?;
/// // While a slot is held, the process-wide killer ends the process before the session could
/// // pass its slots to someone else.
/// let killer = KillerThread::global();
/// let elections = Elections::start(MemoryStore::new(), "10.0.0.7:7000", lease, &killer)?;
/// let first = elections.acquire(Slot(1)).await?; // opens the session
/// let second = elections.acquire(Slot(2)).await?; // one more holding of it
/// assert_eq!(elections.held(), [first, second]); // fencing tokens, in slot order
/// assert_eq!(elections.tenure(Slot(1)), Tenure::Held(first));
/// elections.release(Slot(1)).await?; // deletes slot 1's record
/// elections.release_all().await?; // deletes the session and slot 2; the deadline is removed
/// assert_eq!(elections.tenure(Slot(2)), Tenure::Idle);
/// elections.cleanup().await;
/// assert_eq!(elections.acquire(Slot(1)).await, Err(ElectionsError::Closed));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Elections {
    commands: mpsc::Sender<Command>,
    tenures: watch::Receiver<Tenures>,
    value: LeaseValue,
}

impl Elections {
    /// Starts the elections task for `address` on `store`; the session's deadline goes to
    /// `killer`. Nothing is written until the first [`acquire`](Self::acquire). An address that
    /// [`VvmConfig`](vvm_core::VvmConfig) would refuse is refused here too
    /// ([`ElectionsError::InvalidAddress`]).
    pub fn start<S: SessionStore + Clone>(
        store: S,
        address: &str,
        lease: LeaseConfig,
        killer: &KillerThread,
    ) -> Result<Elections, ElectionsError> {
        // Checked before anything is spawned: a record with such an address would read back
        // as corrupt for every reader.
        vvm_core::validate_address(address).map_err(ElectionsError::InvalidAddress)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ElectionsError::NoRuntime)?;
        let value = LeaseValue::new(address, new_incarnation());
        let (commands, receiver) = mpsc::channel(COMMANDS_MAX);
        let (tenures_tx, tenures) = watch::channel(Tenures::default());
        let task = Task::new(
            store,
            value.clone(),
            lease,
            killer.clone(),
            receiver,
            tenures_tx,
        );
        let span = tracing::info_span!("elections", address);
        runtime.spawn(task.run().instrument(span));
        Ok(Elections {
            commands,
            tenures,
            value,
        })
    }

    /// The value this handle's session and holdings carry (its address and incarnation).
    pub fn value(&self) -> &LeaseValue {
        &self.value
    }

    /// Tries to win `slot` once, as one more holding of the session (opened first when nothing
    /// is held); returns the tenure's fencing token. Refused without a store call for slot 0,
    /// a slot this handle holds already, more than [`ELECTIONS_SLOTS_MAX`] slots, or after a
    /// loss whose slots are not all released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a caller that gives up (a `timeout`, a `select!`) wins nothing. An acquire
    /// not yet begun is not made; one under way whose slot is won after the caller gave up is
    /// released by the handle's task as soon as the store answers.
    pub async fn acquire(&self, slot: Slot) -> Result<FencingToken, ElectionsError> {
        acquire_through(&self.commands, slot).await
    }

    /// Releases `slot`: its record is deleted (with the session itself when it was the last
    /// slot held, which removes the kill deadline once confirmed). Does nothing when the slot
    /// is not held; a lost slot is only forgotten (nothing of it is left to delete).
    ///
    /// # Cancel safety
    ///
    /// A release asked of the task is carried out whether or not its caller waits for the
    /// answer; dropping the future before it was asked (the task's queue full) asks nothing.
    pub async fn release(&self, slot: Slot) -> Result<(), ElectionsError> {
        self.ask(|reply| Command::Release(slot, reply)).await?
    }

    /// Releases every slot: one store call deletes the session and every holding of it; once
    /// that is confirmed the kill deadline is removed and the process may go on working. Does
    /// nothing when nothing is held. After a loss it forgets the lost slots and leaves the
    /// deadline armed.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): once asked, it is carried out.
    pub async fn release_all(&self) -> Result<(), ElectionsError> {
        self.ask(Command::ReleaseAll).await?
    }

    /// Releases every slot and ends the task; later calls fail with
    /// [`ElectionsError::Closed`]. Returns once the release is done. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): once asked, it is carried out; dropping the handle
    /// releases everything anyway.
    pub async fn cleanup(&self) {
        // An error means the task ended anyway.
        let _ = self.ask(Command::Cleanup).await;
    }

    /// Where `slot` stands now.
    pub fn tenure(&self, slot: Slot) -> Tenure {
        self.tenures.borrow().get(slot)
    }

    /// The key of the session the slots are held on, while one is open.
    pub fn session(&self) -> Option<SessionKey> {
        self.tenures.borrow().session()
    }

    /// The fencing tokens of every slot held now, in slot order.
    pub fn held(&self) -> Vec<FencingToken> {
        self.tenures.borrow().held().collect()
    }

    /// A receiver that sees every change of the slots: each acquire and release, and a loss of
    /// the session as one change of every slot.
    pub fn watch(&self) -> watch::Receiver<Tenures> {
        self.tenures.clone()
    }

    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ElectionsError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(command(reply))
            .await
            .map_err(|_| ElectionsError::Closed)?;
        answer.await.map_err(|_| ElectionsError::Closed)
    }
}
