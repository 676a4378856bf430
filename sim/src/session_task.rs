//! A process's session, driven as the runtime's session task drives it: the real [`Session`]
//! machine, its one store call at a time under the store-call timeout, its one timer, its kill
//! deadline on the process's killer. Shared by every scenario whose processes hold under a
//! session ([`crate::session::Sessions`], [`crate::semaphore::Semaphores`]); what is held under
//! it is the scenario's.
//!
//! After every input the oracle is shown: while the session is alive, the killer is armed at the
//! machine's deadline; services act only under an armed killer (nor is it disarmed while they
//! act); a killer whose deadline has passed fires at once.

use vvm_core::{
    HoldingId, Instant, LeaseConfig, OpId, Reply, Session, SessionEffect, SessionEffects,
    SessionEvent, TimerId,
};

use crate::oracle::ProcessId;
use crate::store::{Answer, Call};
use crate::world::{Scenario, World};

/// An input of a process's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionInput {
    /// Open a session (the runtime's `SessionHandle::open`).
    Open,
    /// The session's timer.
    Timer(TimerId),
    /// The answer of the session's store call.
    Reply(OpId, Reply),
}

/// A process's session and what the runtime keeps beside it.
#[derive(Debug)]
pub struct SessionTask {
    /// The machine.
    pub session: Session,
    timer: Option<TimerId>,
    /// The session's one call in flight.
    pending: Option<OpId>,
}

impl SessionTask {
    /// A closed session of the process start `incarnation`.
    pub fn new(lease: LeaseConfig, incarnation: vvm_core::Incarnation) -> Self {
        SessionTask {
            session: Session::new(lease, incarnation),
            timer: None,
            pending: None,
        }
    }
}

/// A scenario whose processes each run a [`SessionTask`].
pub trait OnSession: Scenario {
    /// The session task of a process.
    fn task(proc: &mut Self::Proc) -> &mut SessionTask;
    /// The input that carries a session input.
    fn input(input: SessionInput) -> Self::Input;
    /// Whether services of the process act.
    fn acting(proc: &Self::Proc) -> bool;
    /// Whether the process may open a session now (beside the session's own state).
    fn may_open(proc: &Self::Proc) -> bool {
        let _ = proc;
        true
    }
    /// The session opened.
    fn opened(world: &mut World<Self>, id: ProcessId);
    /// The session was lost: its one `Lost`, to fan out to what it holds.
    fn lost(world: &mut World<Self>, id: ProcessId);
    /// A keepalive was confirmed.
    fn kept_alive(world: &mut World<Self>, id: ProcessId) {
        let _ = (world, id);
    }
    /// The session closed.
    fn closed(world: &mut World<Self>, id: ProcessId) {
        let _ = (world, id);
    }
}

/// Handles one session input of `id`.
pub fn handle<S: OnSession>(world: &mut World<S>, id: ProcessId, input: SessionInput) {
    let proc = world.proc(id);
    let may_open = S::may_open(proc);
    let task = S::task(proc);
    match input {
        SessionInput::Open => {
            let session = &task.session;
            let openable = session.is_closed() || (session.is_lost() && session.holdings() == 0);
            if openable && may_open {
                event(world, id, |now| SessionEvent::Open { now });
            }
        }
        SessionInput::Timer(timer) => {
            if task.timer == Some(timer) {
                task.timer = None;
                event(world, id, |now| SessionEvent::Timer { now, timer });
            }
        }
        SessionInput::Reply(op, reply) => {
            // The first of the reply and the timeout wins; the other is dropped.
            if task.pending == Some(op) {
                task.pending = None;
                event(world, id, |now| SessionEvent::Reply { now, op, reply });
            }
        }
    }
}

/// The input the answer to a session call is.
pub fn answered<S: OnSession>(effect: &SessionEffect, answer: Answer) -> S::Input {
    let Answer::Reply(reply) = answer else {
        panic!("{answer:?} does not answer {effect:?}");
    };
    S::input(SessionInput::Reply(op(effect), reply))
}

fn op(effect: &SessionEffect) -> OpId {
    match *effect {
        SessionEffect::Create { op, .. }
        | SessionEffect::KeepAlive { op, .. }
        | SessionEffect::Delete { op, .. }
        | SessionEffect::Get { op, .. } => op,
        other => panic!("not a store call: {other:?}"),
    }
}

/// The local instant of `id` now.
pub fn now<S: Scenario>(world: &mut World<S>, id: ProcessId) -> Instant {
    Instant::from_nanos(world.local_ns(id))
}

/// Runs one event through the session machine of `id` and executes its effects.
pub fn event<S: OnSession>(
    world: &mut World<S>,
    id: ProcessId,
    event: impl FnOnce(Instant) -> SessionEvent,
) {
    let event = event(now(world, id));
    let mut out = SessionEffects::new();
    S::task(world.proc(id)).session.handle(&event, &mut out);
    world.line(id, || format!("{event:?} -> {:?}", out.as_slice()));
    for effect in out.iter().copied() {
        execute(world, id, effect);
        if world.live_mut(id).is_none() {
            return;
        }
    }
}

fn execute<S: OnSession>(world: &mut World<S>, id: ProcessId, effect: SessionEffect) {
    match effect {
        SessionEffect::Create { .. }
        | SessionEffect::KeepAlive { .. }
        | SessionEffect::Delete { .. }
        | SessionEffect::Get { .. } => {
            let task = S::task(world.proc(id));
            assert!(task.pending.is_none(), "a second session call in flight");
            task.pending = Some(op(&effect));
            world.send(id, Call::Session(effect));
        }
        SessionEffect::SetTimer { timer, at } => {
            S::task(world.proc(id)).timer = Some(timer);
            world.at_local(id, at.as_nanos(), S::input(SessionInput::Timer(timer)));
        }
        SessionEffect::ArmKiller { at } => world.arm_killer(id, at.as_nanos()),
        SessionEffect::DisarmKiller => {
            let now_ns = world.now_ns();
            let live = world.live(id);
            live.killer = None;
            if S::acting(&live.proc) {
                let text = format!("{id} disarmed its killer while services act");
                world.oracle.flag(id, now_ns, text);
            }
        }
        SessionEffect::Opened { .. } => S::opened(world, id),
        SessionEffect::NotOpened { .. } => schedule_open(world, id),
        SessionEffect::KeptAlive { .. } => S::kept_alive(world, id),
        SessionEffect::Lost { .. } => S::lost(world, id),
        SessionEffect::Closed { .. } => S::closed(world, id),
        SessionEffect::CloseRefused { .. }
        | SessionEffect::Attached { .. }
        | SessionEffect::AttachRefused { .. } => {}
    }
}

/// Opens a session again after up to a round interval.
pub fn schedule_open<S: OnSession>(world: &mut World<S>, id: ProcessId) {
    let round_ns = world.s.base().round_interval.as_nanos() as u64;
    let at_ns = world.now_ns() + world.rng.between(0, round_ns);
    world.schedule_input(at_ns, id, S::input(SessionInput::Open));
}

/// Attaches `holding` to the alive session of `id` (S29); false when the session refuses.
pub fn attach<S: OnSession>(world: &mut World<S>, id: ProcessId, holding: HoldingId) -> bool {
    let now = now(world, id);
    let mut out = SessionEffects::new();
    S::task(world.proc(id))
        .session
        .handle(&SessionEvent::Attach { now, holding }, &mut out);
    let attached = out.as_slice() == [SessionEffect::Attached { holding }];
    if !attached {
        world.line(id, || format!("attach of {holding:?} refused: {out:?}"));
    }
    attached
}

/// Detaches `holding` from the session of `id`.
pub fn detach<S: OnSession>(world: &mut World<S>, id: ProcessId, holding: HoldingId) {
    let now = now(world, id);
    let mut out = SessionEffects::new();
    S::task(world.proc(id))
        .session
        .handle(&SessionEvent::Detach { now, holding }, &mut out);
    assert!(out.is_empty(), "detach is silent: {out:?}");
}

/// Checks after every input of `id`: while its session is alive its killer is armed at the
/// machine's deadline; services act only under an armed killer; a killer whose deadline has
/// passed fires at once.
pub fn check_killer<S: OnSession>(world: &mut World<S>, id: ProcessId) {
    let now_ns = world.now_ns();
    let Some(live) = world.live_mut(id) else {
        return;
    };
    let killer = live.killer;
    let acting = S::acting(&live.proc);
    if let Some(alive) = S::task(&mut live.proc).session.liveness() {
        if killer.map(|(at, _)| at) != Some(alive.deadline.as_nanos()) {
            let text = format!(
                "{id}'s session is alive with deadline {:?} but its killer is armed at \
                 {killer:?}",
                alive.deadline
            );
            world.oracle.flag(id, now_ns, text);
        }
    }
    if acting && killer.is_none() {
        let text = format!("{id}'s services act with no killer armed");
        world.oracle.flag(id, now_ns, text);
    }
    world.kill_if_overdue(id);
}
