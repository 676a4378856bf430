//! Per-slot elections on a plain [`LeaseStore`]: one [`Leadership`] machine driven by its own
//! task, for callers that want to acquire, hold and release a single slot directly on a store
//! that has no sessions.
//!
//! Each slot is its own TTL record, renewed every `L/4` by its own compare-and-swap, with its
//! own kill deadline: the protocol a [`Vvm`](crate::Vvm) runs. Use
//! [`Elections`](crate::Elections) instead wherever the store implements
//! [`SessionStore`](crate::SessionStore) (memory, SQLite, etcd, transactional stores,
//! FoundationDB): it holds any number of slots on one session, with one keepalive and one kill
//! deadline whatever their number. `LeaseElections` is for a store that implements
//! [`LeaseStore`] only (such as `AnyStore` of the adapters, or a store of one's own).
//!
//! It shares the store calls, timers and killer with the VVM driver; only the notifications are
//! handled here. A release that deleted our record removes the kill deadline, as a clean VVM
//! shutdown does; a loss keeps it. After [`LeaseElections::cleanup`] the handle acquires nothing
//! any more.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;
use vvm_core::{Effect, Effects, FencingToken, Leadership, LeaseConfig, LeaseEvent, Refusal, Slot};

use crate::elections::Tenure;
use crate::error::ElectionsError;
use crate::executor::{Executor, Wake};
use crate::killer::KillerThread;
use crate::store::{LeaseStore, LeaseValue};
use crate::vvm::new_incarnation;

/// Commands queued at most; callers wait for replies, so more never pile up.
const COMMANDS_MAX: usize = 8;

enum Command {
    Acquire(Slot, oneshot::Sender<Result<FencingToken, ElectionsError>>),
    Release(oneshot::Sender<()>),
    Cleanup(oneshot::Sender<()>),
    /// The caller of an acquire gave up after the reply was sent: release the slot, if it is
    /// still held.
    Abandoned(FencingToken),
}

/// Handle of a single-slot election on a [`LeaseStore`]: one slot at a time, renewed by its own
/// writes. Dropping it releases what it holds, in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use vvm_adapters::MemoryStore;
/// use vvm_core::{LeaseConfig, Slot};
/// use vvm_runtime::{ElectionsError, KillerThread, LeaseElections, Tenure};
///
/// let lease = LeaseConfig::new(Duration::from_secs(20))?;
/// // While the slot is held, the process-wide killer ends the process before the lease could
/// // pass to someone else.
/// let killer = KillerThread::global();
/// let elections = LeaseElections::start(MemoryStore::new(), "10.0.0.7:7000", lease, &killer)?;
/// let token = elections.acquire(Slot(1)).await?;
/// assert_eq!(elections.tenure(), Tenure::Held(token));
/// elections.release().await?; // deletes the record; renewals stop
/// assert_eq!(elections.tenure(), Tenure::Idle);
/// elections.cleanup().await;
/// assert_eq!(elections.acquire(Slot(1)).await, Err(ElectionsError::Closed));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct LeaseElections {
    commands: mpsc::Sender<Command>,
    tenure: watch::Receiver<Tenure>,
    value: LeaseValue,
}

impl LeaseElections {
    /// Starts the election task for `address` on `store`; its deadlines go to `killer`.
    /// An address that [`VvmConfig`](vvm_core::VvmConfig) would refuse is refused here too
    /// ([`ElectionsError::InvalidAddress`]).
    pub fn start<S: LeaseStore>(
        store: S,
        address: &str,
        lease: LeaseConfig,
        killer: &KillerThread,
    ) -> Result<LeaseElections, ElectionsError> {
        // Checked before anything is spawned: a record with such an address would read back
        // as corrupt for every reader.
        vvm_core::validate_address(address).map_err(ElectionsError::InvalidAddress)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ElectionsError::NoRuntime)?;
        let incarnation = new_incarnation();
        let value = LeaseValue {
            address: address.to_owned(),
            incarnation,
            stopping: false,
        };
        let (commands, rx) = mpsc::channel(COMMANDS_MAX);
        let (tenure_tx, tenure) = watch::channel(Tenure::Idle);
        let exec = Executor::new(
            Arc::new(store),
            value.clone(),
            lease,
            killer.register(address),
        );
        let task = Task {
            machine: Leadership::new(lease, incarnation),
            exec,
            commands: rx,
            tenure: tenure_tx,
            acquiring: None,
            releasing: Vec::new(),
            cleanup: None,
            closing: false,
            abandoned: false,
            out: Effects::new(),
        };
        let span = tracing::info_span!("elections", address);
        runtime.spawn(task.run().instrument(span));
        Ok(LeaseElections {
            commands,
            tenure,
            value,
        })
    }

    /// The value this handle writes (its address and incarnation).
    pub fn value(&self) -> &LeaseValue {
        &self.value
    }

    /// Tries to win `slot` once; returns the first fencing token.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a caller that gives up (a `timeout`, a `select!`) wins nothing. An acquire
    /// not yet begun is not made; one under way whose slot is won after the caller gave up is
    /// released by the handle's task at once.
    pub async fn acquire(&self, slot: Slot) -> Result<FencingToken, ElectionsError> {
        let ask = |reply| Command::Acquire(slot, reply);
        crate::elections::acquire_through(&self.commands, ask, Command::Abandoned).await
    }

    /// Stops renewing and deletes our record; does nothing when nothing is held. Once the
    /// delete is confirmed the kill deadline is removed: the process may go on working.
    ///
    /// # Cancel safety
    ///
    /// A release asked of the task is carried out whether or not its caller waits for the
    /// answer; dropping the future before it was asked (the task's queue full) asks nothing.
    pub async fn release(&self) -> Result<(), ElectionsError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Release(reply))
            .await
            .map_err(|_| ElectionsError::Closed)?;
        rx.await.map_err(|_| ElectionsError::Closed)
    }

    /// Releases what is held and ends the task; later calls fail with
    /// [`ElectionsError::Closed`]. Returns once the release is done. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): once asked, it is carried out; dropping the handle
    /// releases everything anyway.
    pub async fn cleanup(&self) {
        let (reply, rx) = oneshot::channel();
        if self.commands.send(Command::Cleanup(reply)).await.is_ok() {
            // An error means the task ended anyway.
            let _ = rx.await;
        }
    }

    /// What is held right now.
    pub fn tenure(&self) -> Tenure {
        *self.tenure.borrow()
    }

    /// A receiver that sees every change of [`Tenure`].
    pub fn watch(&self) -> watch::Receiver<Tenure> {
        self.tenure.clone()
    }
}

struct Task<S> {
    machine: Leadership,
    exec: Executor<S>,
    commands: mpsc::Receiver<Command>,
    tenure: watch::Sender<Tenure>,
    acquiring: Option<oneshot::Sender<Result<FencingToken, ElectionsError>>>,
    releasing: Vec<oneshot::Sender<()>>,
    cleanup: Option<oneshot::Sender<()>>,
    closing: bool,
    /// The slot just won was for a caller that gave up: release it after this event.
    abandoned: bool,
    out: Effects,
}

impl<S: LeaseStore> Task<S> {
    async fn run(mut self) {
        while !(self.closing && self.machine.is_idle() && !self.exec.busy()) {
            let event = tokio::select! {
                wake = self.exec.next() => match wake {
                    Wake::Reply { op, reply } => LeaseEvent::Reply { now: self.exec.now(), op, reply },
                    Wake::Timer(timer) => LeaseEvent::Timer { now: self.exec.now(), timer },
                },
                command = self.commands.recv(), if !self.closing => match self.command(command) {
                    Some(event) => event,
                    None => continue,
                },
            };
            self.feed(event);
            if std::mem::take(&mut self.abandoned) {
                // Nobody acts on the slot, so nobody may keep it.
                let now = self.exec.now();
                self.feed(LeaseEvent::Release { now });
            }
        }
        if let Some(reply) = self.cleanup.take() {
            let _ = reply.send(());
        }
        tracing::debug!("elections cleaned up");
    }

    /// The event a command asks for, if any.
    fn command(&mut self, command: Option<Command>) -> Option<LeaseEvent> {
        let now = self.exec.now();
        match command {
            Some(Command::Acquire(slot, reply)) => {
                if reply.is_closed() {
                    // Its caller gave up before it began: nothing is tried.
                    return None;
                }
                if self.acquiring.is_some() || !self.machine.is_idle() {
                    let _ = reply.send(Err(ElectionsError::Busy));
                    return None;
                }
                self.acquiring = Some(reply);
                Some(LeaseEvent::Acquire { now, slot })
            }
            Some(Command::Release(reply)) => {
                self.releasing.push(reply);
                Some(LeaseEvent::Release { now })
            }
            Some(Command::Abandoned(token)) => {
                let held = matches!(*self.tenure.borrow(), Tenure::Held(t) if t.slot == token.slot);
                if !held {
                    return None;
                }
                tracing::debug!(
                    slot = token.slot.0,
                    "slot won for a caller that gave up: released"
                );
                Some(LeaseEvent::Release { now })
            }
            Some(Command::Cleanup(reply)) => {
                self.cleanup = Some(reply);
                self.closing = true;
                Some(LeaseEvent::Release { now })
            }
            // The handle is gone: release what is held, then end.
            None => {
                self.closing = true;
                Some(LeaseEvent::Release { now })
            }
        }
    }

    fn feed(&mut self, event: LeaseEvent) {
        self.out.clear();
        self.machine.handle(&event, &mut self.out);
        tracing::debug!(?event, state = ?self.machine.state(), effects = ?self.out.as_slice(), "transition");
        let effects = self.out.clone();
        for effect in &effects {
            if !self.exec.execute(effect) {
                self.notify(effect);
            }
        }
    }

    fn notify(&mut self, effect: &Effect) {
        match *effect {
            Effect::Acquired { token } => {
                tracing::info!(
                    slot = token.slot.0,
                    revision = token.revision.0,
                    "leadership acquired"
                );
                self.tenure.send_replace(Tenure::Held(token));
                if let Some(reply) = self.acquiring.take() {
                    if reply.send(Ok(token)).is_err() {
                        // Its caller gave up while the store answered.
                        tracing::debug!(
                            slot = token.slot.0,
                            "slot won for a caller that gave up: released"
                        );
                        self.abandoned = true;
                    }
                }
            }
            Effect::Renewed { token } => {
                self.tenure.send_replace(Tenure::Held(token));
            }
            Effect::NotAcquired { slot, refusal } => {
                tracing::debug!(slot = slot.0, ?refusal, "slot not acquired");
                let error = match refusal {
                    Refusal::Held => ElectionsError::Held(slot),
                    Refusal::StoreFailed => ElectionsError::StoreFailed(slot),
                    Refusal::DeadlinePassed => ElectionsError::TooLate(slot),
                };
                if let Some(reply) = self.acquiring.take() {
                    let _ = reply.send(Err(error));
                }
            }
            Effect::Lost { slot, reason } => {
                tracing::warn!(slot = slot.0, ?reason, "leadership lost");
                self.tenure.send_replace(Tenure::Lost { slot, reason });
            }
            Effect::Released { slot, deleted } => {
                let held = match *self.tenure.borrow() {
                    Tenure::Idle => None,
                    Tenure::Held(token) => Some(token.slot),
                    Tenure::Lost { slot, .. } => Some(slot),
                };
                crate::status::log_released(slot, deleted, held);
                if deleted {
                    // Our record is gone and no service of ours runs: nothing can act on the
                    // released lease any more, so its deadline must not end the process (as
                    // after a clean VVM shutdown). A loss deletes nothing and keeps it.
                    self.exec.execute(&Effect::DisarmKiller);
                }
                self.tenure.send_if_modified(|tenure| {
                    let held = matches!(tenure, Tenure::Held(_));
                    if held {
                        *tenure = Tenure::Idle;
                    }
                    held
                });
                if let Some(reply) = self.acquiring.take() {
                    let _ = reply.send(Err(ElectionsError::Closed));
                }
                for reply in self.releasing.drain(..) {
                    let _ = reply.send(());
                }
            }
            _ => tracing::error!(?effect, "effect not executed by the elections driver"),
        }
    }
}
