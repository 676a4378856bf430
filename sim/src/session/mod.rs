//! A scenario of processes that each hold several slots under one session.
//!
//! Every process runs the real [`Session`](vvm_core::Session) machine ([`SessionTask`]) and,
//! per slot, the life of a holding as the runtime drives it (`runtime/src/session/`): attached
//! to the alive session (S29) before its acquire is sent; the acquire sent again on an unknown
//! outcome, up to [`ACQUIRE_SENDS_MAX`] sends; its services started with the holding's revision
//! as fencing token (**acting**); on the session's one `Lost`, every holding's services told to
//! stop — still acting until they have — and only then detached (S31); a new session opened
//! once nothing is attached.
//!
//! The store is the world's: session records with a TTL judged by true time and, per slot, at
//! most one holding, live exactly while its session's record is; an acquire is one transaction.
//! Its keepalives keep the record's revision or give a new one ([`KeepAlives`], drawn per seed).
//!
//! The faults are the world's ([`Params::random`]): store errors, unknown outcomes (committed or
//! not), latency, hung calls, store outages, pauses up to `3·L` (also right after a call),
//! crashes with restart, graceful stops, clock-rate error up to 10 %; and services slow to stop,
//! up to `2·L`: only the killer bounds them.
//!
//! The [`Oracle`](crate::oracle::Oracle) judges what a user sees: services acting on a slot. No
//! two processes act on one slot at the same instant, and fencing tokens strictly increase per
//! slot; so once a session is lost, no successor acts on any of its holdings before all their
//! services stopped or its killer fired.
//!
//! [`Params::random`]: crate::params::Params::random

mod params;

use vvm_core::{FencingToken, HoldingId, Incarnation, LeaseConfig, SessionEvent, SessionId, Slot};

use crate::oracle::{Interval, ProcessId, Violation};
use crate::params::Params;
use crate::session_task::{self as task, OnSession, SessionInput, SessionTask};
use crate::store::{Acquired, Answer, Call, StoreModel};
use crate::trace::Death;
use crate::world::{Scenario, World};

pub use crate::store::KeepAlives;
pub use params::{Rule, SessionParams, SessionStats};

/// Sends of one acquire before an unknown outcome counts as no holding: the runtime's
/// `ACQUIRE_SENDS_MAX`.
pub const ACQUIRE_SENDS_MAX: u8 = 3;

/// The simulation of sessions.
pub type SessionSim = World<Sessions>;

/// An input of a process, before it carries a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Of the session.
    Session(SessionInput),
    /// Acquire `slot` under the session.
    Acquire(Slot),
    /// The answer of the acquire `op` of a slot.
    Acquired(Slot, u64, Acquired),
    /// The services of `slot` stopped.
    Stopped(Slot),
    /// The host asks for a graceful stop.
    Stop,
}

/// The holding of one slot by one process, as the runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Nothing attached.
    Idle,
    /// Attached; the acquire `op` is in flight, sent `sends` times.
    Acquiring { op: u64, sends: u8, id: SessionId },
    /// Services run with `token`: acting.
    Running(FencingToken),
    /// Told to stop; acting until they have. `attached` while the session still counts it.
    Stopping(FencingToken, bool),
}

impl Hold {
    fn token(self) -> Option<FencingToken> {
        match self {
            Hold::Running(token) | Hold::Stopping(token, _) => Some(token),
            Hold::Idle | Hold::Acquiring { .. } => None,
        }
    }
}

/// What a process of this scenario is beside the world's part.
pub struct Proc {
    task: SessionTask,
    holds: Vec<Hold>,
    stopping: bool,
}

impl Proc {
    fn acting(&self) -> bool {
        self.holds.iter().any(|h| h.token().is_some())
    }
}

/// The scenario: its parameters, counts and the last actor of each slot.
pub struct Sessions {
    params: SessionParams,
    lease: LeaseConfig,
    acquire_ops: u64,
    last_actor: Vec<Option<ProcessId>>,
    stats: SessionStats,
}

impl World<Sessions> {
    /// A simulation of `params` whose every random choice comes from `seed`.
    pub fn new(seed: u64, params: SessionParams) -> Self {
        let base = &params.base;
        let mut store = StoreModel::new(base.slots, params.keepalives, 1);
        if params.rule == Rule::HoldingsExpireAlone {
            store.expire_holdings_alone(base.lease_ns());
        }
        let scenario = Sessions {
            lease: LeaseConfig::new(base.lease).expect("simulation lease is valid"),
            acquire_ops: 0,
            last_actor: vec![None; base.slots as usize],
            stats: SessionStats::default(),
            params,
        };
        World::of(seed, scenario, store)
    }

    /// The parameters of the run.
    pub fn params(&self) -> &SessionParams {
        &self.s.params
    }

    /// Counts so far.
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            store_calls: self.counts.store_calls,
            starts: self.counts.starts,
            killed: self.counts.killed,
            crashed: self.counts.crashed,
            ..self.s.stats
        }
    }

    /// Every violation so far, and every interval of acting recorded (open ones closed now).
    pub fn check(&self) -> (Vec<Violation>, Vec<Interval>) {
        self.check_oracle()
    }
}

type W = World<Sessions>;

impl Scenario for Sessions {
    type Proc = Proc;
    type Input = Input;
    type Event = ();

    fn base(&self) -> &Params {
        &self.params.base
    }

    fn killer_works(&self) -> bool {
        self.params.rule != Rule::KillerIgnored
    }

    fn spawn(world: &mut W, _index: u32, incarnation: Incarnation) -> Proc {
        Proc {
            task: SessionTask::new(world.s.lease, incarnation),
            holds: vec![Hold::Idle; world.s.params.base.slots as usize],
            stopping: false,
        }
    }

    fn launch() -> Input {
        Input::Session(SessionInput::Open)
    }

    /// Runs one input through the process, as the runtime's session task and holdings do.
    fn handle(world: &mut W, id: ProcessId, input: Input) {
        world.s.stats.events += 1;
        match input {
            Input::Session(input) => task::handle(world, id, input),
            Input::Acquire(slot) => acquire(world, id, slot),
            Input::Acquired(slot, op, acquired) => self::acquired(world, id, slot, op, acquired),
            Input::Stopped(slot) => {
                let hold = &mut world.proc(id).holds[slot.0 as usize - 1];
                let Hold::Stopping(_, attached) = *hold else {
                    return;
                };
                *hold = Hold::Idle;
                set_acting(world, id, slot, None);
                if attached {
                    task::detach(world, id, HoldingId(slot.0 - 1));
                }
                after_detach(world, id);
            }
            Input::Stop => {
                let proc = world.proc(id);
                if proc.stopping {
                    return;
                }
                proc.stopping = true;
                world.line(id, || "graceful stop asked".to_owned());
                for index in 0..world.proc(id).holds.len() {
                    if let Hold::Running(token) = world.proc(id).holds[index] {
                        stop_services(world, id, token, true);
                    }
                }
                after_detach(world, id);
            }
        }
        task::check_killer(world, id);
    }

    fn stop(world: &mut W, id: ProcessId) {
        world.deliver(id, Input::Stop);
    }

    fn died(world: &mut W, _id: ProcessId, proc: Proc, death: Death) {
        if death == Death::Killer {
            world.s.stats.killed_while_acting += u64::from(proc.acting());
        }
    }

    fn answered(call: &Call, answer: Answer) -> Input {
        match (call, answer) {
            (Call::Session(effect), _) => task::answered::<Self>(effect, answer),
            (&Call::Acquire { op, slot, .. }, Answer::Acquired(acquired)) => {
                Input::Acquired(slot, op, acquired)
            }
            (call, answer) => panic!("{answer:?} does not answer {call:?}"),
        }
    }

    fn event(_world: &mut W, _event: ()) {}
}

impl OnSession for Sessions {
    fn task(proc: &mut Proc) -> &mut SessionTask {
        &mut proc.task
    }

    fn input(input: SessionInput) -> Input {
        Input::Session(input)
    }

    fn acting(proc: &Proc) -> bool {
        proc.acting()
    }

    fn may_open(proc: &Proc) -> bool {
        !proc.stopping
    }

    fn opened(world: &mut W, id: ProcessId) {
        world.s.stats.opened += 1;
        for slot in 1..=world.s.params.base.slots {
            schedule_acquire(world, id, Slot(slot), true);
        }
    }

    /// The session's one `Lost`, fanned out to every holding.
    fn lost(world: &mut W, id: ProcessId) {
        world.s.stats.losses += 1;
        let acting = world.proc(id).acting();
        world.s.stats.losses_while_acting += u64::from(acting);
        let detach_now = world.s.params.rule == Rule::DetachAtLoss;
        for index in 0..world.proc(id).holds.len() {
            match world.proc(id).holds[index] {
                Hold::Running(token) => {
                    stop_services(world, id, token, !detach_now);
                    if detach_now {
                        // Unsound: detached before the services stopped.
                        task::detach(world, id, HoldingId(index as u32));
                    }
                }
                // An acquire in flight ends with its answer.
                Hold::Acquiring { .. } | Hold::Stopping(..) | Hold::Idle => {}
            }
        }
        after_detach(world, id);
    }

    fn kept_alive(world: &mut W, _id: ProcessId) {
        world.s.stats.keepalives += 1;
    }

    fn closed(world: &mut W, id: ProcessId) {
        if world.proc(id).stopping {
            world.exit(id);
        }
    }
}

/// After a holding was detached: a lost session with nothing attached opens anew; a stopping
/// process closes its session once nothing is attached.
fn after_detach(world: &mut W, id: ProcessId) {
    let proc = world.proc(id);
    if proc.task.session.holdings() > 0 {
        return;
    }
    if proc.stopping {
        if proc.holds.iter().all(|&h| h == Hold::Idle) {
            task::event(world, id, |now| SessionEvent::Close { now });
        }
    } else if proc.task.session.is_lost() {
        task::schedule_open(world, id);
    }
}

fn schedule_acquire(world: &mut W, id: ProcessId, slot: Slot, soon: bool) {
    let round_ns = world.s.params.base.round_interval.as_nanos() as u64;
    let delay_ns = if soon {
        world.rng.between(0, round_ns / 4)
    } else {
        world.rng.between(round_ns / 2, round_ns)
    };
    let at_ns = world.now_ns() + delay_ns;
    world.schedule_input(at_ns, id, Input::Acquire(slot));
}

/// `SessionHandle::acquire`: attach, then send the acquire.
fn acquire(world: &mut W, id: ProcessId, slot: Slot) {
    let proc = world.proc(id);
    let index = slot.0 as usize - 1;
    if proc.stopping || proc.holds[index] != Hold::Idle {
        return;
    }
    let Some(session) = proc.task.session.liveness().map(|l| l.id) else {
        return; // the next open acquires again
    };
    if task::attach(world, id, HoldingId(index as u32)) {
        send_acquire(world, id, slot, session, 1);
    }
}

fn send_acquire(world: &mut W, id: ProcessId, slot: Slot, session: SessionId, sends: u8) {
    world.s.acquire_ops += 1;
    let op = world.s.acquire_ops;
    world.proc(id).holds[slot.0 as usize - 1] = Hold::Acquiring {
        op,
        sends,
        id: session,
    };
    let call = Call::Acquire {
        op,
        slot,
        id: session,
    };
    world.send(id, call);
}

/// What the runtime's acquire does with an answer.
fn acquired(world: &mut W, id: ProcessId, slot: Slot, op: u64, acquired: Acquired) {
    let index = slot.0 as usize - 1;
    let proc = world.proc(id);
    let Hold::Acquiring {
        op: waited,
        sends,
        id: session,
    } = proc.holds[index]
    else {
        return;
    };
    if waited != op {
        return;
    }
    match acquired {
        Acquired::Written(revision) => {
            let token = FencingToken { slot, revision };
            let alive = proc
                .task
                .session
                .liveness()
                .is_some_and(|l| l.id == session);
            proc.holds[index] = Hold::Running(token);
            world.s.stats.acquisitions += 1;
            world.check_fresh(id, || format!("{token:?}"));
            set_acting(world, id, slot, Some(token));
            if !alive || world.proc(id).stopping {
                // The session was lost meanwhile, or the host asked to stop: the services just
                // handed the holding are told to stop at once.
                stop_services(world, id, token, true);
            }
        }
        Acquired::Unknown if sends < ACQUIRE_SENDS_MAX => {
            // Idempotent per session: sent again.
            send_acquire(world, id, slot, session, sends + 1);
        }
        Acquired::Held | Acquired::SessionGone | Acquired::Failed | Acquired::Unknown => {
            proc.holds[index] = Hold::Idle;
            task::detach(world, id, HoldingId(index as u32));
            if world.proc(id).task.session.liveness().is_some() {
                schedule_acquire(world, id, slot, false);
            }
            after_detach(world, id);
        }
    }
}

/// Tells the services acting with `token` to stop; they act until they have.
fn stop_services(world: &mut W, id: ProcessId, token: FencingToken, attached: bool) {
    let index = token.slot.0 as usize - 1;
    world.proc(id).holds[index] = Hold::Stopping(token, attached);
    let slow = world.rng.chance(world.s.params.slow_stop_ppm);
    let delay_ns = if slow {
        world.rng.between(0, world.s.params.slow_stop_max_ns)
    } else {
        world
            .rng
            .between(0, world.s.params.base.service_delay_max_ns)
    };
    let at_ns = world.now_ns() + delay_ns;
    world.schedule_input(at_ns, id, Input::Stopped(token.slot));
}

fn set_acting(world: &mut W, id: ProcessId, slot: Slot, token: Option<FencingToken>) {
    let now_ns = world.now_ns();
    if let Some(token) = token {
        let index = slot.0 as usize - 1;
        if world.s.last_actor[index].is_some_and(|last| last != id) {
            world.s.stats.handovers += 1;
        }
        world.s.last_actor[index] = Some(id);
        world.line(id, || format!("acts on slot {} with {token:?}", slot.0));
    } else {
        world.line(id, || format!("stops acting on slot {}", slot.0));
    }
    world.oracle.observe_slot(id, slot, token, now_ns);
}
