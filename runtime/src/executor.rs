//! Executes the effects every machine shares: store calls (each under its own timeout),
//! timers and the kill deadline. Notifications are left to the driver that owns the machine.

use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{error::Elapsed, Sleep};
use vvm_core::{
    Effect, Incarnation, LeaseConfig, OpId, Record, Reply, Revision, Slot, TimerId, TimerKind,
};

use crate::clock::{Clock, TimeSource};
use crate::killer::KillerEntry;
use crate::on_session::{Acquire, Kept, SessionSide};
use crate::session::{SessionError, SessionStatus};
use crate::store::{Inserted, Lease, LeaseStore, LeaseValue, StoreError};

/// Most store calls in flight per machine. The machines keep one; the margin only absorbs a
/// bug without unbounded growth.
const STORE_CALLS_MAX: usize = 4;

type Call = Pin<Box<dyn Future<Output = (OpId, Reply)> + Send>>;

/// The last failure of an insert or read per slot, in words: what the machines' bare
/// [`Reply::Failed`] or [`Reply::Unknown`] leaves out, kept so that a failed acquisition can say
/// why each slot was not won (a corrupt or foreign record, a store error, a timeout). At most
/// one entry per slot, taken by the driver when the machine gives the slot up.
#[derive(Clone, Default)]
pub(crate) struct Failures(Arc<Mutex<BTreeMap<Slot, String>>>);

impl Failures {
    fn note(&self, slot: Slot, why: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(slot, why);
    }

    /// The last failure noted for `slot`, removed.
    pub(crate) fn take(&self, slot: Slot) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&slot)
    }
}

/// What woke the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A store call finished.
    Reply { op: OpId, reply: Reply },
    /// A timer fired.
    Timer(TimerId),
}

struct Timer {
    id: TimerId,
    sleep: Pin<Box<Sleep>>,
}

pub(crate) struct Executor<S> {
    store: Arc<S>,
    own: LeaseValue,
    /// The value our record holds in the store as far as we know: what the last confirmed write
    /// (or a read of our own record) found. A swap and a delete must name it exactly.
    written: Written,
    /// Whether the next lease timer (a renewal or its retry) fires at once: set once when the
    /// services are asked to stop, so that the mark reaches the store without waiting up to
    /// `L/4`; cleared by the first lease timer that fires, so a failing store is not retried
    /// faster than the machine's backoff.
    mark_now: bool,
    lease: LeaseConfig,
    killer: KillerEntry,
    calls: Vec<Call>,
    /// One pending timer per [`TimerKind`]: `[Lease, Round]`.
    timers: [Option<Timer>; 2],
    /// The longest time left a refused insert reports to the machine: the round interval for a
    /// store without a change feed, which could not tell of a release before the expiry.
    time_left_cap: Option<Duration>,
    /// Why inserts and reads failed, per slot.
    failures: Failures,
    /// A candidate's insert failed and none has been answered since: its failures are logged
    /// once per streak (see [`CandidateLog`]).
    candidate_failing: Arc<AtomicBool>,
    /// The session the slot is held on, for a VVM on a session: `Insert` is its acquire and
    /// `CompareAndDelete` the holding's release; the kill deadline is its.
    session: Option<Arc<dyn SessionSide>>,
    /// The holding between its acquire and its release.
    kept: Kept,
}

fn timer_index(kind: TimerKind) -> usize {
    match kind {
        TimerKind::Lease => 0,
        TimerKind::Round => 1,
    }
}

impl<S: LeaseStore> Executor<S> {
    pub(crate) fn new(
        store: Arc<S>,
        own: LeaseValue,
        lease: LeaseConfig,
        killer: KillerEntry,
    ) -> Self {
        Executor {
            store,
            written: Written(Arc::new(Mutex::new(own.clone()))),
            own,
            mark_now: false,
            lease,
            killer,
            calls: Vec::with_capacity(STORE_CALLS_MAX),
            timers: [None, None],
            time_left_cap: None,
            failures: Failures::default(),
            candidate_failing: Arc::default(),
            session: None,
            kept: Kept::default(),
        }
    }

    /// Executes the store effects on `session` from now on (see the `session` field).
    pub(crate) fn on_session(&mut self, session: Arc<dyn SessionSide>) {
        self.session = Some(session);
    }

    /// The holding kept, if any, for the driver to drop (detach) once the services stopped.
    pub(crate) fn take_holding(&self) -> Option<()> {
        self.kept.take().map(drop)
    }

    /// Drops the holding kept, if any, as never used: the machine did not act on it (its
    /// session was lost while it was acquired).
    pub(crate) fn drop_unused_holding(&self) {
        self.kept.drop_unused();
    }

    /// Why inserts and reads of each slot failed last.
    pub(crate) fn failures(&self) -> &Failures {
        &self.failures
    }

    /// Reports at most `cap` as a refused insert's time left, so that a candidate waiting on a
    /// store without a change feed still tries every `cap` (its rounds), not only at the expiry.
    pub(crate) fn cap_time_left(&mut self, cap: Duration) {
        self.time_left_cap = Some(cap);
    }

    /// The store the effects go to.
    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    /// The store, shared, for a watch that outlives one call.
    pub(crate) fn shared_store(&self) -> Arc<S> {
        Arc::clone(&self.store)
    }

    /// Who this VVM's records name (its stopping mark aside).
    pub(crate) fn own(&self) -> &LeaseValue {
        &self.own
    }

    /// The current time, as the machines see it.
    pub(crate) fn now(&self) -> vvm_core::Instant {
        Clock.now()
    }

    /// The kill deadline this executor armed last, if it has not fired; on a session, the
    /// session's.
    pub(crate) fn deadline(&self) -> Option<vvm_core::Instant> {
        match &self.session {
            Some(session) => *session.kill_deadlines().borrow(),
            None => self.killer.deadline(),
        }
    }

    /// The services were asked to stop: every write from now on marks our record as
    /// [`stopping`](LeaseValue::stopping), so that observers stop sending work here, and the
    /// next renewal goes out at once instead of at its timer. Nothing else changes: the record
    /// stays ours and is renewed until the release, which only follows the services' stop.
    pub(crate) fn mark_stopping(&mut self) {
        if self.own.stopping {
            return;
        }
        self.own.stopping = true;
        self.mark_now = true;
        if let Some(timer) = self.timers[timer_index(TimerKind::Lease)].as_mut() {
            timer.sleep.as_mut().reset(tokio::time::Instant::now());
        }
    }

    /// Performs `effect` if it is a store call, a timer or a kill deadline; `false` otherwise.
    pub(crate) fn execute(&mut self, effect: &Effect) -> bool {
        match *effect {
            Effect::SetTimer { timer, at } => {
                let at = if timer.kind == TimerKind::Lease && self.mark_now {
                    tokio::time::Instant::now()
                } else {
                    Clock.to_tokio(at)
                };
                let sleep = Box::pin(tokio::time::sleep_until(at));
                self.timers[timer_index(timer.kind)] = Some(Timer { id: timer, sleep });
            }
            Effect::ArmKiller { at } => {
                self.killer.arm(at);
                #[cfg(feature = "metrics")]
                crate::metrics::kill_deadline(self.own.incarnation, Some(at));
            }
            Effect::DisarmKiller => {
                let removed = self.killer.disarm();
                #[cfg(feature = "metrics")]
                crate::metrics::kill_deadline(self.own.incarnation, None);
                tracing::debug!(removed, "kill deadline disarmed after a clean release");
            }
            Effect::Insert { .. }
            | Effect::CompareAndSwap { .. }
            | Effect::CompareAndDelete { .. }
            | Effect::Get { .. } => self.call(effect),
            _ => return false,
        }
        true
    }

    fn call(&mut self, effect: &Effect) {
        if let Some(session) = &self.session {
            let call = session_call(
                session.clone(),
                self.kept.clone(),
                self.failures.clone(),
                effect,
            );
            if let Some(call) = call {
                self.calls.push(call);
            }
            return;
        }
        let call = store_call(
            self.store.clone(),
            Ours {
                value: self.own.clone(),
                written: self.written.clone(),
            },
            self.lease,
            self.time_left_cap,
            self.failures.clone(),
            CandidateLog(self.candidate_failing.clone()),
            effect,
        );
        #[cfg(feature = "metrics")]
        let call = call.map(|call| crate::metrics::timed(effect, call));
        match call {
            Some(call) if self.calls.len() < STORE_CALLS_MAX => self.calls.push(call),
            Some(_) => {
                // More calls in flight than any machine issues: a machine bug. Answering with a
                // failure keeps the machine moving instead of losing its reply.
                tracing::error!(?effect, "too many store calls in flight; failing this one");
                let op = op_of(effect);
                self.calls
                    .push(Box::pin(async move { (op, Reply::Failed) }));
            }
            None => {}
        }
    }

    /// The next store reply or timer firing; pending while there is none. Cancel-safe: nothing
    /// is consumed unless it is returned.
    pub(crate) async fn next(&mut self) -> Wake {
        poll_fn(|cx| {
            for index in 0..self.calls.len() {
                if let Poll::Ready((op, reply)) = self.calls[index].as_mut().poll(cx) {
                    drop(self.calls.swap_remove(index));
                    return Poll::Ready(Wake::Reply { op, reply });
                }
            }
            for slot in self.timers.iter_mut() {
                let fired = match slot {
                    Some(timer) => timer.sleep.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                if fired {
                    if let Some(timer) = slot.take() {
                        if timer.id.kind == TimerKind::Lease {
                            self.mark_now = false;
                        }
                        return Poll::Ready(Wake::Timer(timer.id));
                    }
                }
            }
            Poll::Pending
        })
        .await
    }
}

fn op_of(effect: &Effect) -> OpId {
    match *effect {
        Effect::Insert { op, .. }
        | Effect::CompareAndSwap { op, .. }
        | Effect::CompareAndDelete { op, .. }
        | Effect::Get { op, .. } => op,
        _ => OpId(0),
    }
}

/// What a store call writes (`value`, marked once the services are asked to stop) and what it
/// expects to find (`written`).
struct Ours {
    value: LeaseValue,
    written: Written,
}

/// The value our record holds in the store, shared by the store calls of one machine (it has
/// one in flight at a time).
#[derive(Clone)]
struct Written(Arc<Mutex<LeaseValue>>);

impl Written {
    fn get(&self) -> LeaseValue {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, value: LeaseValue) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = value;
    }
}

/// Logs a candidate's failing store calls as a state change: a WARN when its inserts begin
/// to fail, an INFO when one is answered again, and only DEBUG lines in between — a store that
/// fails for minutes must not write a WARN per try. Renewals and releases always log theirs.
#[derive(Clone)]
struct CandidateLog(Arc<AtomicBool>);

impl CandidateLog {
    /// An insert was answered (written or refused).
    fn answered(&self, slot: Slot) {
        if self.0.swap(false, Ordering::AcqRel) {
            tracing::info!(
                slot = slot.0,
                "the store answers a candidate's insert again"
            );
        }
    }

    /// An insert, or the read that resolves one (`read`), failed (`error`) or timed out
    /// (`None`).
    fn failed(&self, slot: Slot, error: Option<&StoreError>, read: bool) -> Reply {
        let began = !read && !self.0.swap(true, Ordering::AcqRel);
        if !began && !self.0.load(Ordering::Acquire) {
            // A read outside a candidate's streak: a leader resolving an unknown renewal.
            return error.map_or_else(|| timed_out(slot), |error| failure(slot, error));
        }
        match (began, error) {
            (true, Some(error)) => tracing::warn!(
                slot = slot.0,
                error = %crate::ErrorChain(error),
                "a candidate's store call failed; it retries with backoff and says when the store answers again"
            ),
            (true, None) => tracing::warn!(
                slot = slot.0,
                "a candidate's store call timed out; it retries with backoff and says when the store answers again"
            ),
            (false, Some(error)) => tracing::debug!(
                slot = slot.0,
                error = %crate::ErrorChain(error),
                "a candidate's store call failed again"
            ),
            (false, None) => tracing::debug!(slot = slot.0, "a candidate's store call timed out again"),
        }
        match error {
            Some(StoreError::Failed { .. } | StoreError::Corrupt { .. }) => Reply::Failed,
            Some(StoreError::Unknown { .. }) | None => Reply::Unknown,
        }
    }
}

/// The store call for a store effect, already mapped to the machines' [`Reply`].
fn store_call<S: LeaseStore>(
    store: Arc<S>,
    ours: Ours,
    lease: LeaseConfig,
    time_left_cap: Option<Duration>,
    failures: Failures,
    log: CandidateLog,
    effect: &Effect,
) -> Option<Call> {
    let timeout = lease.store_timeout();
    let Ours {
        value: own,
        written,
    } = ours;
    let call: Call = match *effect {
        Effect::Insert { op, slot, ttl } => Box::pin(async move {
            let result =
                tokio::time::timeout(timeout, store.insert_or_time_left(slot, &own, ttl)).await;
            if let Ok(Ok(_)) = result {
                log.answered(slot);
            }
            let reply = match result {
                Ok(Ok(Inserted::Written(revision))) => {
                    written.set(own);
                    Reply::Written(revision)
                }
                Ok(Ok(Inserted::Held { left: Some(left) })) => {
                    Reply::Held(time_left_cap.map_or(left, |cap| left.min(cap)))
                }
                Ok(Ok(Inserted::Held { left: None })) => Reply::Rejected,
                Ok(Err(error)) => {
                    failures.note(slot, crate::ErrorChain(&error).to_string());
                    log.failed(slot, Some(&error), false)
                }
                Err(_) => {
                    failures.note(slot, no_answer(timeout));
                    log.failed(slot, None, false)
                }
            };
            (op, reply)
        }),
        Effect::CompareAndSwap {
            op,
            slot,
            expected,
            ttl,
        } => Box::pin(async move {
            let expected = Lease {
                value: written.get(),
                revision: expected,
            };
            let call = store.compare_and_swap(slot, &expected, &own, ttl);
            let reply = swapped(slot, tokio::time::timeout(timeout, call).await);
            if let Reply::Written(_) = reply {
                written.set(own);
            }
            (op, reply)
        }),
        Effect::CompareAndDelete { op, slot, expected } => Box::pin(async move {
            let expected = Lease {
                value: written.get(),
                revision: expected,
            };
            let result =
                tokio::time::timeout(timeout, store.compare_and_delete(slot, &expected)).await;
            let reply = match result {
                Ok(Ok(true)) => Reply::Deleted,
                Ok(Ok(false)) => Reply::Rejected,
                Ok(Err(error)) => failure(slot, &error),
                Err(_) => timed_out(slot),
            };
            (op, reply)
        }),
        Effect::Get { op, slot } => Box::pin(async move {
            let reply = match tokio::time::timeout(timeout, store.get(slot)).await {
                Ok(Ok(lease)) => Reply::Found(lease.map(|lease| {
                    let record = record(&own, &lease);
                    if record.incarnation == own.incarnation {
                        // Ours: a write whose outcome was unknown may have marked it or not;
                        // the next swap or delete must name what is there.
                        written.set(lease.value);
                    }
                    record
                })),
                Ok(Err(error)) => {
                    failures.note(slot, crate::ErrorChain(&error).to_string());
                    log.failed(slot, Some(&error), true)
                }
                Err(_) => {
                    failures.note(slot, no_answer(timeout));
                    log.failed(slot, None, true)
                }
            };
            (op, reply)
        }),
        _ => return None,
    };
    Some(call)
}

/// The session call for a holding's effect: the acquire for `Insert`, the release for
/// `CompareAndDelete` (a `Lifecycle::on_session` writes no other store effect).
fn session_call(
    session: Arc<dyn SessionSide>,
    kept: Kept,
    failures: Failures,
    effect: &Effect,
) -> Option<Call> {
    let call: Call = match *effect {
        Effect::Insert { op, slot, .. } => {
            Box::pin(async move {
                let reply = match session.acquire(slot).await {
                    // Services start only while the session is live and before its deadline: an
                    // acquire answered after the session was lost or its deadline passed wins
                    // nothing (the holding, dropped, stays with the session).
                    Ok(Acquire::Held(held)) if !usable(&*session) => {
                        tracing::warn!(slot = slot.0, "holding acquired after its session ended or its deadline passed; not used");
                        failures.note(slot, "the session ended while acquiring".into());
                        held.drop_unused();
                        Reply::Failed
                    }
                    Ok(Acquire::Held(held)) => {
                        let revision = held.revision();
                        kept.put(held);
                        Reply::Written(revision)
                    }
                    // Held by someone else, or by a sibling VVM on the same shared session.
                    Ok(Acquire::Refused) | Err(SessionError::AlreadyHeld { .. }) => Reply::Rejected,
                    Err(error) => {
                        failures.note(slot, crate::ErrorChain(&error).to_string());
                        tracing::warn!(slot = slot.0, error = %crate::ErrorChain(&error), "acquire through the session failed");
                        match error {
                            SessionError::Store(StoreError::Unknown { .. })
                            | SessionError::TimedOut => Reply::Unknown,
                            _ => Reply::Failed,
                        }
                    }
                };
                (op, reply)
            })
        }
        Effect::CompareAndDelete { op, slot, expected } => Box::pin(async move {
            let reply = match kept.take() {
                Some(held) if held.revision() == expected => match held.release().await {
                    Ok(true) => Reply::Deleted,
                    Ok(false) => Reply::Rejected,
                    Err(error) => {
                        // The record is left to the session, as by a drop.
                        tracing::warn!(slot = slot.0, error = %crate::ErrorChain(&error), "holding not released; left to the session");
                        Reply::Failed
                    }
                },
                other => {
                    drop(other);
                    Reply::Rejected
                }
            };
            (op, reply)
        }),
        _ => return None,
    };
    Some(call)
}

/// Whether the session is live and before its kill deadline now.
fn usable(session: &dyn SessionSide) -> bool {
    let open = matches!(session.status(), SessionStatus::Open { .. });
    let deadline = *session.kill_deadlines().borrow();
    open && deadline.is_some_and(|at| Clock.now() < at)
}

fn swapped(slot: Slot, result: Result<Result<Option<Revision>, StoreError>, Elapsed>) -> Reply {
    match result {
        Ok(Ok(Some(revision))) => Reply::Written(revision),
        Ok(Ok(None)) => Reply::Rejected,
        Ok(Err(error)) => failure(slot, &error),
        Err(_) => timed_out(slot),
    }
}

fn failure(slot: Slot, error: &StoreError) -> Reply {
    tracing::warn!(slot = slot.0, error = %crate::ErrorChain(&error), "store call failed");
    match error {
        StoreError::Unknown { .. } => Reply::Unknown,
        StoreError::Failed { .. } | StoreError::Corrupt { .. } => Reply::Failed,
    }
}

fn no_answer(timeout: Duration) -> String {
    format!("the store did not answer within {timeout:?} (outcome unknown)")
}

fn timed_out(slot: Slot) -> Reply {
    tracing::warn!(slot = slot.0, "store call timed out; outcome unknown");
    Reply::Unknown
}

/// A live record reduced to what the core compares. Only our address may carry our
/// incarnation: a foreign record that happens to share it is reported with a different one, so
/// it can never be mistaken for ours.
pub(crate) fn record(own: &LeaseValue, lease: &Lease) -> Record {
    let mut incarnation = lease.value.incarnation;
    if lease.value.address != own.address && incarnation == own.incarnation {
        incarnation = Incarnation(!own.incarnation.0);
    }
    Record {
        incarnation,
        revision: lease.revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(address: &str, incarnation: u64) -> LeaseValue {
        LeaseValue {
            address: address.into(),
            incarnation: Incarnation(incarnation),
            stopping: false,
        }
    }

    // covers: Rt.ReplyMapping
    #[test]
    fn a_foreign_record_never_carries_our_incarnation() {
        let own = value("a", 7);
        let foreign = Lease {
            value: value("b", 7),
            revision: Revision(3),
        };
        assert_ne!(record(&own, &foreign).incarnation, Incarnation(7));
        let ours = Lease {
            value: value("a", 7),
            revision: Revision(3),
        };
        assert_eq!(record(&own, &ours).incarnation, Incarnation(7));
        let other = Lease {
            value: value("b", 9),
            revision: Revision(3),
        };
        assert_eq!(record(&own, &other).incarnation, Incarnation(9));
    }
}
