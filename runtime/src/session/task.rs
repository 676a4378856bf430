//! The task that runs one [`Session`] machine: it executes the machine's store calls (each
//! under the store-call timeout), its one timer and its one kill deadline, and answers the
//! handles' commands. One task per session, whatever the number of holdings: a keepalive is
//! one store call and one timer, never one per holding.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::{mpsc, oneshot, watch};
use vvm_core::{
    AttachRefusal, HoldingId, Incarnation, LeaseConfig, OpId, Record, Reply, Session,
    SessionEffect, SessionEffects, SessionEvent, SessionKey, TimerId,
};

use super::{SessionError, SessionStatus};
use crate::clock::{Clock, TimeSource};
use crate::killer::KillerEntry;
use crate::session_store::{MarkLost, SessionRecord, SessionStore};
use crate::store::{LeaseValue, StoreError};

/// A command of a handle to the task.
pub(super) enum Command {
    /// Attach a new holding; answered with its id or why not.
    Attach {
        reply: oneshot::Sender<Result<HoldingId, AttachRefusal>>,
    },
    /// Attach `count` new holdings at once (a batch acquire); answered with their ids, or with
    /// why the first refused one was refused (then none is attached).
    AttachMany {
        count: usize,
        reply: oneshot::Sender<Result<Vec<HoldingId>, AttachRefusal>>,
    },
    /// A holding's services stopped and its record was released or is left to the session;
    /// `acted` unless it was never handed to anyone (an acquire that won nothing, or came too
    /// late).
    Detach { holding: HoldingId, acted: bool },
    /// Close the session once no holding is attached.
    Close {
        reply: oneshot::Sender<Result<bool, SessionError>>,
    },
    /// Give the session up: no more keepalives, the kill deadline left armed.
    Abandon,
}

type Call = Pin<Box<dyn Future<Output = (OpId, Reply)> + Send>>;

/// What the task keeps.
pub(super) struct Task<S> {
    pub(super) store: S,
    pub(super) value: LeaseValue,
    pub(super) lease: LeaseConfig,
    pub(super) killer: KillerEntry,
    pub(super) machine: Session,
    pub(super) commands: mpsc::UnboundedReceiver<Command>,
    pub(super) status: watch::Sender<SessionStatus>,
    /// The kill deadline armed now, published for what runs under the session's holdings (a
    /// supervisor keeping its own copy of it, a status page).
    pub(super) deadline: watch::Sender<Option<vvm_core::Instant>>,
    pub(super) call: Option<Call>,
    pub(super) timer: Option<(TimerId, Pin<Box<tokio::time::Sleep>>)>,
    pub(super) attaching: Option<oneshot::Sender<Result<HoldingId, AttachRefusal>>>,
    pub(super) closing: Vec<oneshot::Sender<Result<bool, SessionError>>>,
    /// Holding ids handed out and returned: ids stay dense, as the machine's bit set wants.
    pub(super) free_ids: Vec<u32>,
    pub(super) next_id: u32,
    /// Resolves when the store's liveness mark of the open session is lost
    /// ([`SessionStore::mark_lost`]); set when the session opens.
    pub(super) mark: Option<MarkLost>,
}

/// What woke the task.
enum Wake {
    Command(Option<Command>),
    Reply(OpId, Reply),
    Timer(TimerId),
    MarkLost,
}

impl<S: SessionStore + Clone> Task<S> {
    /// Opens the session, then runs until the machine is closed again: after a close (asked, or
    /// because every handle and holding is gone), or when the open did not succeed.
    pub(super) async fn run(mut self) {
        let mut out = SessionEffects::new();
        self.machine
            .handle(&SessionEvent::Open { now: Clock.now() }, &mut out);
        self.execute_all(&out);
        let mut handles_gone = false;
        while !(self.machine.is_closed() && self.call.is_none()) {
            let wake = self.next(handles_gone).await;
            let now = Clock.now();
            let event = match wake {
                Wake::Command(Some(Command::Attach { reply })) => {
                    let holding = self.take_id();
                    self.attaching = Some(reply);
                    SessionEvent::Attach { now, holding }
                }
                Wake::Command(Some(Command::AttachMany { count, reply })) => {
                    self.attach_many(count, reply);
                    continue;
                }
                Wake::Command(Some(Command::Detach { holding, acted })) => {
                    self.free_ids.push(holding.0);
                    if acted {
                        SessionEvent::Detach { now, holding }
                    } else {
                        SessionEvent::DetachUnused { now, holding }
                    }
                }
                Wake::Command(Some(Command::Abandon)) => {
                    self.abandon();
                    return;
                }
                Wake::MarkLost => {
                    self.mark_lost(now);
                    return;
                }
                Wake::Command(Some(Command::Close { reply })) => {
                    self.closing.push(reply);
                    SessionEvent::Close { now }
                }
                Wake::Command(None) => {
                    // Every handle and holding is gone: nothing can act under the session.
                    handles_gone = true;
                    SessionEvent::Close { now }
                }
                Wake::Reply(op, reply) => SessionEvent::Reply { now, op, reply },
                Wake::Timer(timer) => SessionEvent::Timer { now, timer },
            };
            out.clear();
            self.machine.handle(&event, &mut out);
            self.execute_all(&out);
        }
    }

    /// Ends the task without a close: the call in flight and the timer are dropped, so no
    /// keepalive is sent or confirmed any more, and the killer entry is dropped armed, which
    /// leaves the deadline where it is. The record and its holdings expire in the store.
    fn abandon(&mut self) {
        let open = matches!(*self.status.borrow(), SessionStatus::Open { .. });
        if open {
            let deadline = *self.deadline.borrow();
            tracing::warn!(
                deadline_ns = deadline.map(|at| at.as_nanos()),
                "session abandoned: no more keepalives, the process ends at the kill deadline"
            );
            self.status
                .send_replace(SessionStatus::Lost(vvm_core::LossReason::Abandoned));
        }
        self.call = None;
        self.timer = None;
        for reply in self.closing.drain(..) {
            let _ = reply.send(Err(SessionError::Closed));
        }
    }

    /// The session's liveness mark was lost while the process lives: others may judge the
    /// session ended at once (`SessionStore::mark_lost`), so nothing may act under it from now:
    /// the kill deadline moves to `now` (the killer never moves a passed deadline later again),
    /// every handle sees the session lost, and no keepalive is sent any more.
    fn mark_lost(&mut self, now: vvm_core::Instant) {
        self.killer.arm(now);
        self.deadline.send_replace(Some(now));
        tracing::error!("the session's liveness mark was lost: the process ends now");
        self.status
            .send_replace(SessionStatus::Lost(vvm_core::LossReason::MarkLost));
        self.call = None;
        self.timer = None;
        self.mark = None;
        for reply in self.closing.drain(..) {
            let _ = reply.send(Err(SessionError::Closed));
        }
    }

    fn execute_all(&mut self, out: &SessionEffects) {
        for effect in out.as_slice() {
            self.execute(effect);
        }
    }

    fn take_id(&mut self) -> HoldingId {
        HoldingId(self.free_ids.pop().unwrap_or_else(|| {
            let id = self.next_id;
            self.next_id = self.next_id.saturating_add(1);
            id
        }))
    }

    async fn next(&mut self, handles_gone: bool) -> Wake {
        std::future::poll_fn(|cx| {
            if let Some(call) = self.call.as_mut() {
                if let std::task::Poll::Ready((op, reply)) = call.as_mut().poll(cx) {
                    self.call = None;
                    return std::task::Poll::Ready(Wake::Reply(op, reply));
                }
            }
            if let Some((id, sleep)) = self.timer.as_mut() {
                if sleep.as_mut().poll(cx).is_ready() {
                    let id = *id;
                    self.timer = None;
                    return std::task::Poll::Ready(Wake::Timer(id));
                }
            }
            if let Some(mark) = self.mark.as_mut() {
                if mark.as_mut().poll(cx).is_ready() {
                    self.mark = None;
                    return std::task::Poll::Ready(Wake::MarkLost);
                }
            }
            if !handles_gone {
                if let std::task::Poll::Ready(command) = self.commands.poll_recv(cx) {
                    return std::task::Poll::Ready(Wake::Command(command));
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    fn key(&self, id: vvm_core::SessionId) -> SessionKey {
        SessionKey {
            incarnation: self.value.incarnation,
            id,
        }
    }

    fn execute(&mut self, effect: &SessionEffect) {
        match *effect {
            SessionEffect::Create { op, id, ttl } => {
                let (store, value, key) = (self.store.clone(), self.value.clone(), self.key(id));
                self.start(op, async move {
                    written(store.create_session(key, &value, ttl).await)
                });
            }
            SessionEffect::KeepAlive {
                op,
                id,
                expected,
                ttl,
            } => {
                let (store, key) = (self.store.clone(), self.key(id));
                self.start(op, async move {
                    written(store.keep_alive(key, expected, ttl).await)
                });
            }
            SessionEffect::Delete { op, id, expected } => {
                let (store, key) = (self.store.clone(), self.key(id));
                self.start(op, async move {
                    match store.delete_session(key, expected).await {
                        Ok(true) => Reply::Deleted,
                        Ok(false) => Reply::Rejected,
                        Err(error) => failed(&error),
                    }
                });
            }
            SessionEffect::Get { op, id } => {
                let (store, key, own) = (self.store.clone(), self.key(id), self.value.clone());
                self.start(op, async move {
                    match store.get_session(key).await {
                        Ok(record) => Reply::Found(record.map(|record| reduced(&own, &record))),
                        Err(error) => failed(&error),
                    }
                });
            }
            SessionEffect::SetTimer { timer, at } => {
                let sleep = Box::pin(tokio::time::sleep_until(Clock.to_tokio(at)));
                self.timer = Some((timer, sleep));
            }
            SessionEffect::ArmKiller { at } => {
                self.killer.arm(at);
                self.deadline.send_replace(Some(at));
            }
            SessionEffect::DisarmKiller => {
                self.killer.disarm();
                self.deadline.send_replace(None);
            }
            SessionEffect::Opened { id, revision } => {
                tracing::debug!(session = %self.key(id), revision = revision.0, "session opened");
                self.mark = Some(self.store.mark_lost(self.key(id)));
                self.status.send_replace(SessionStatus::Open {
                    key: self.key(id),
                    revision,
                });
            }
            SessionEffect::NotOpened { id, refusal } => {
                tracing::warn!(session = %self.key(id), ?refusal, "session not opened");
                self.status.send_replace(SessionStatus::NotOpened(refusal));
            }
            SessionEffect::KeptAlive { id, revision } => {
                tracing::trace!(session = %self.key(id), revision = revision.0, "session kept alive");
            }
            SessionEffect::Lost {
                id,
                reason,
                holdings,
            } => {
                tracing::warn!(session = %self.key(id), ?reason, holdings, "session lost: every holding ends");
                self.status.send_replace(SessionStatus::Lost(reason));
            }
            SessionEffect::Closed { id, deleted } => {
                if let Some(id) = id {
                    tracing::debug!(session = %self.key(id), deleted, "session closed");
                }
                self.status.send_replace(SessionStatus::Closed);
                for reply in self.closing.drain(..) {
                    let _ = reply.send(Ok(deleted));
                }
            }
            SessionEffect::CloseRefused { holdings, .. } => {
                for reply in self.closing.drain(..) {
                    let _ = reply.send(Err(SessionError::HoldingsRemain { holdings }));
                }
            }
            SessionEffect::Attached { holding } => {
                if let Some(reply) = self.attaching.take() {
                    if reply.send(Ok(holding)).is_err() {
                        // The caller gave up: nothing will act under the holding.
                        self.detach_now(holding);
                    }
                }
            }
            SessionEffect::AttachRefused { holding, refusal } => {
                self.free_ids.push(holding.0);
                if let Some(reply) = self.attaching.take() {
                    let _ = reply.send(Err(refusal));
                }
            }
        }
    }

    /// Attaches `count` holdings, one machine event each, in one wake of the task: a batch
    /// acquire costs one round trip to the task, not one per slot. All or none: after a refusal
    /// the ones attached already are detached again.
    fn attach_many(
        &mut self,
        count: usize,
        reply: oneshot::Sender<Result<Vec<HoldingId>, AttachRefusal>>,
    ) {
        let mut out = SessionEffects::new();
        let mut ids = Vec::with_capacity(count);
        let mut refused = None;
        for _ in 0..count {
            let (sender, mut answer) = oneshot::channel();
            self.attaching = Some(sender);
            let holding = self.take_id();
            out.clear();
            self.machine.handle(
                &SessionEvent::Attach {
                    now: Clock.now(),
                    holding,
                },
                &mut out,
            );
            self.execute_all(&out);
            self.attaching = None;
            match answer.try_recv() {
                Ok(Ok(id)) => ids.push(id),
                Ok(Err(refusal)) => {
                    refused = Some(refusal);
                    break;
                }
                // The machine answered neither way: the session is not there to attach to.
                Err(_) => {
                    refused = Some(AttachRefusal::NotAlive);
                    break;
                }
            }
        }
        let answer = match refused {
            Some(refusal) => Err(refusal),
            None => Ok(ids.clone()),
        };
        if reply.send(answer).is_err() || refused.is_some() {
            // The caller gave up, or not all could be attached: nothing acts under them.
            for id in ids {
                self.detach_now(id);
            }
        }
    }

    /// Detaches a holding whose attach nobody received: nothing acted under it.
    fn detach_now(&mut self, holding: HoldingId) {
        self.free_ids.push(holding.0);
        let mut out = SessionEffects::new();
        self.machine.handle(
            &SessionEvent::DetachUnused {
                now: Clock.now(),
                holding,
            },
            &mut out,
        );
        self.execute_all(&out);
    }

    /// Starts the machine's one store call, under the store-call timeout: no answer in time is
    /// an unknown outcome.
    fn start(&mut self, op: OpId, call: impl Future<Output = Reply> + Send + 'static) {
        let timeout = self.lease.store_timeout();
        self.call = Some(Box::pin(async move {
            match tokio::time::timeout(timeout, call).await {
                Ok(reply) => (op, reply),
                Err(_) => {
                    tracing::warn!(?timeout, "session store call timed out; outcome unknown");
                    (op, Reply::Unknown)
                }
            }
        }));
    }
}

fn written(result: Result<Option<vvm_core::Revision>, StoreError>) -> Reply {
    match result {
        Ok(Some(revision)) => Reply::Written(revision),
        Ok(None) => Reply::Rejected,
        Err(error) => failed(&error),
    }
}

fn failed(error: &StoreError) -> Reply {
    tracing::warn!(error = %crate::ErrorChain(error), "session store call failed");
    if error.is_unknown() {
        Reply::Unknown
    } else {
        Reply::Failed
    }
}

/// A session record reduced to what the core compares; only our own value carries our
/// incarnation.
fn reduced(own: &LeaseValue, record: &SessionRecord) -> Record {
    let incarnation = if record.value == *own {
        own.incarnation
    } else {
        Incarnation(!own.incarnation.0)
    };
    Record {
        incarnation,
        revision: record.revision,
    }
}
