//! Model checking the real core [`Session`] machine with stateright: two processes, each with one
//! session and a holding per slot (two slots), on one atomic store of session records and
//! holdings.
//!
//! Each process runs a real [`Session`] and, per slot, the holding's life as the runtime drives it
//! (`runtime/src/session/`): idle → attached (the session accepts it, S29) → acquiring (the
//! store call in flight, sent again on an unknown outcome up to [`ACQUIRE_SENDS_MAX`] times) →
//! services running (**acting**) → on the session's one `Lost`, every holding's services told to
//! stop (still acting until they have) → stopped, and only then detached (S31). A process whose
//! local clock reaches its session's kill deadline (the last `ArmKiller`) dies at that instant
//! with everything it runs, and restarts as a new incarnation, which opens a session at once.
//! A closed session, or a lost one with nothing attached, may be opened again at any time.
//!
//! The store is the contract of `runtime/src/session_store.rs`: session records with a TTL
//! judged on true time (create if absent, keepalive and delete if ours at a revision, read), and
//! per slot at most one holding, live exactly while its session's record is. An acquire writes
//! only if, at that instant, the session is live and the slot has no live holding; it is
//! idempotent per session. A keepalive keeps the record's revision (memory, etcd) or gives a
//! higher one (the transactional store): [`KeepAlives`].
//!
//! Every step is one of:
//!
//! - deliver the oldest request of a process (the store applies it atomically at that instant
//!   and the process handles the answer), or a request whose caller gave up on it already;
//! - fail a request, or lose it or its answer (the caller hears `Unknown`; the request applied,
//!   not applied, or still on its way to be applied at any later step) — within a fault budget;
//! - fire a due timer — at any later instant: time may move on first (within a budget);
//! - attach a holding (and send its acquire); stop the services of a lost session's holding and
//!   detach it — as late as the scheduler likes; open a session; close it (budget); crash a
//!   process (budget);
//! - advance true time to the next instant where something is due (a timer, a kill deadline, a
//!   session record's expiry), only once every request has been answered (stragglers aside).
//!   Clocks run at 0.9 and 1.1 of true time, the extremes of the ±10 % the protocol is checked
//!   for; processes past their kill deadline die there.
//!
//! Because time only moves to instants where something is due, whether a holding acts can only
//! change at a state, so checking states checks every instant. A call's answer, `Unknown`
//! included, arrives at the instant it was sent; a late request is how a slow call appears.
//!
//! Properties, about what the user sees: **at most one process runs services on a slot at any
//! instant**, and services run only while their process is alive (its kill deadline armed and
//! not reached). Made unsound on purpose ([`Rule`]: the killer ignored, or holdings detached at
//! the loss while their services still run), the checker must find two processes acting on one
//! slot. `sometimes` properties (a slot acted on, both processes acting, a slot changing hands, a
//! session lost or a process killed while acting) show the runs are not vacuous.
//!
//! The state is kept canonical where order does not matter, which is what makes runs to the
//! horizon affordable: revisions count per session record (the machine compares only its own
//! record's), and the calls in flight are ordered by process (each process's own order kept).

#[path = "support/model.rs"]
mod model;

use model::{awaited_timer, env_usize, nanos, session_op};

use core::time::Duration;
use std::time::Instant as WallInstant;

use stateright::{Checker, HasDiscoveries, Model, Property, UniformChooser};
use vvm::ACQUIRE_SENDS_MAX;
use vvm_core::{
    HoldingId, Incarnation, Instant, LeaseConfig, OpId, Record, Reply, Revision, Session,
    SessionEffect, SessionEffects, SessionEvent, SessionId, TimerId,
};

const PROCESSES: usize = 2;
const SLOTS: usize = 2;
const SECOND_NS: u64 = 1_000_000_000;
const LEASE: Duration = Duration::from_secs(20);
const LEASE_NS: u64 = 20 * SECOND_NS;
/// Clock rates in parts per million of true time: slow and fast, the extremes checked for.
const RATES_PPM: [u64; PROCESSES] = [900_000, 1_100_000];
/// Runs end here: past two kill deadlines and record expiries of one process.
const HORIZON_NS: u64 = 3 * LEASE_NS;
/// Runs of the costlier exhaustive checks end here: past a holder's deadline and its record's
/// expiry after a keepalive at `L/4`, and the other process acting after them.
const SHORT_HORIZON_NS: u64 = 3 * LEASE_NS / 2;

/// What the adversary may do per run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Budget {
    /// Failed, lost or late store calls.
    faults: u8,
    /// Which faults.
    fault_kinds: &'static [Fault],
    /// Whether faults hit keepalives only (else any call).
    keepalives_only: bool,
    /// Crashes (SIGKILL, restart as a new incarnation).
    crashes: u8,
    /// Closes asked of a session.
    closes: u8,
    /// Due timers left unfired while time moves on (they fire at any later instant);
    /// [`ANY`]: as many as wished.
    late_timers: u8,
    /// Holdings attached (each then acquired) per process; [`ANY`]: as many as wished.
    attaches: u8,
    /// Whether a holding is attached while the store holds the slot for another live session.
    /// Its acquire is refused (`Held`) at the same instant and the holding detached: the same
    /// state again, unless a fault delays the acquire or a close frees the slot meanwhile, so
    /// checks without either skip it.
    futile_attaches: bool,
}

/// No bound on a budget.
const ANY: u8 = u8::MAX;

/// The full adversary.
const FULL: Budget = Budget {
    faults: 2,
    fault_kinds: &FAULTS,
    keepalives_only: false,
    crashes: 1,
    closes: 1,
    late_timers: ANY,
    attaches: ANY,
    futile_attaches: true,
};

/// One timer left unfired past its instant (it fires at any later instant, or never): enough
/// for a process to be killed at its deadline while acting. Services as slow to stop as the
/// scheduler likes.
const ONE_LATE_TIMER: Budget = Budget {
    faults: 0,
    fault_kinds: &[],
    keepalives_only: false,
    crashes: 0,
    closes: 0,
    late_timers: 1,
    attaches: ANY,
    futile_attaches: false,
};

/// One keepalive that lands late (its caller heard `Unknown`), timers on time: with
/// [`KeepAlives::Bump`], enough for the next keepalive to be refused and the session lost while
/// its holdings act, and for the other process to take their slots once the record expired.
const ONE_LATE_REQUEST: Budget = Budget {
    faults: 1,
    fault_kinds: &[Fault::Late],
    keepalives_only: true,
    crashes: 0,
    closes: 0,
    late_timers: 0,
    attaches: ANY,
    futile_attaches: false,
};

/// How the store answers a keepalive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum KeepAlives {
    /// The record's revision stays (memory store, etcd's lease keepalive).
    Keep,
    /// The record gets a new, higher revision (the transactional store): a keepalive that lands
    /// after a later one was sent makes that one refused.
    Bump,
}

/// The rules of the runtime and store; all but [`Rule::Sound`] are broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// As the runtime does it.
    Sound,
    /// Unsound: the killer never fires; a process runs on past its kill deadline.
    KillerIgnored,
    /// Unsound: at the loss every holding is detached at once, while its services still stop;
    /// the session may then open anew, and its later deadline replaces the one they run under.
    DetachAtLoss,
}

/// The holding of one slot by one process, as the runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Hold {
    /// Nothing attached.
    Idle,
    /// Attached; the acquire is in flight, sent `sends` times.
    Acquiring { sends: u8 },
    /// The holding is written and its services run: acting.
    Running,
    /// The session was lost and the services were told to stop; they still act until they have.
    Stopping,
}

impl Hold {
    fn acting(self) -> bool {
        matches!(self, Hold::Running | Hold::Stopping)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    session: Session,
    generation: u8,
    /// The session's one timer, at a local instant.
    timer: Option<(TimerId, u64)>,
    /// The timer was left unfired when it was due (a late-timer fault).
    stalled: bool,
    /// The session's kill deadline, local.
    killer: Option<u64>,
    holds: [Hold; SLOTS],
}

/// A session in the store: the incarnation that opened it and the id its machine minted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key {
    p: u8,
    generation: u8,
    id: SessionId,
}

/// A session record. Revisions count per record: the machine compares only its own record's,
/// and a global counter would tell apart states that differ only in the order two processes'
/// writes took at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct SessionRecord {
    key: Key,
    revision: u64,
    expires_ns: u64,
}

/// A slot's holding: no TTL of its own, live exactly while its session's record is. (Its
/// revision, the fencing token, is not modelled: acting is judged by services running.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct HoldingRecord {
    session: Key,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Call {
    /// `Create`, `KeepAlive`, `Delete` or `Get` of the session machine.
    Session(SessionEffect),
    /// The runtime's acquire of a slot for a session.
    Acquire { slot: u8, session: SessionId },
}

/// A store call on its way; `answered` when its caller already heard `Unknown` (or is dead) and
/// the store may still apply it later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Msg {
    p: u8,
    generation: u8,
    call: Call,
    answered: bool,
}

/// What an acquire did, as the runtime sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Acquired {
    Written,
    Held,
    SessionGone,
    Failed,
    Unknown,
}

enum Answer {
    Session(OpId, Reply),
    Acquire(usize, Acquired),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    now_ns: u64,
    procs: Vec<Proc>,
    /// Live session records (an expired one is removed with its holdings when time moves).
    sessions: Vec<SessionRecord>,
    holdings: [Option<HoldingRecord>; SLOTS],
    msgs: Vec<Msg>,
    faults: u8,
    crashes: u8,
    closes: u8,
    late_timers: u8,
    attaches: [u8; PROCESSES],
    /// The incarnation that acted on each slot last.
    last_actor: [Option<(u8, u8)>; SLOTS],
    /// A slot was acted on by one incarnation, then by another.
    handover: bool,
    /// A session was lost while services ran under its holdings.
    lost_while_acting: bool,
    /// A process was killed at its deadline while services ran under its holdings.
    killed_while_acting: bool,
}

/// What the adversary does to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Fault {
    /// The call fails; nothing written.
    Fail,
    /// The call is lost; the caller hears `Unknown`; nothing written.
    Lose,
    /// The call is applied; its answer is lost; the caller hears `Unknown`.
    LoseAnswer,
    /// The caller hears `Unknown` (timeout) but the request is still on its way and may be
    /// applied later.
    Late,
}

const FAULTS: [Fault; 4] = [Fault::Fail, Fault::Lose, Fault::LoseAnswer, Fault::Late];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Request `msgs[i]` arrives: applied by the store, its answer handled at once (unless its
    /// caller gave up on it).
    Deliver(usize),
    /// A fault hits the request `msgs[i]`.
    Fault(usize, Fault),
    /// The due timer of process `p` fires.
    FireTimer(usize),
    /// Process `p` attaches a holding of `slot` and sends its acquire.
    Attach(usize, usize),
    /// The services of process `p` on `slot`, told to stop, have stopped; the holding is
    /// detached.
    Stop(usize, usize),
    /// Process `p` opens a session (its machine closed, or lost with nothing attached).
    Open(usize),
    /// Process `p` asks its session to close.
    Close(usize),
    Crash(usize),
    /// True time moves to the next instant where something is due; processes past their kill
    /// deadline die and restart.
    Advance,
}

const AT_MOST_ONE: &str = "at most one process acts on a slot at any instant";
const ONLY_ALIVE: &str = "a holding acts only while its process is alive";
const ACTED_ON: &str = "a slot is acted on";
const BOTH_ACT: &str = "both processes act at once";
const HANDOVER: &str = "a slot changes hands";
const LOST_WHILE_ACTING: &str = "a session is lost while its holdings act";
const KILLED_WHILE_ACTING: &str = "a process is killed at its deadline while acting";

struct SessionModel {
    budget: Budget,
    horizon_ns: u64,
    keepalives: KeepAlives,
    rule: Rule,
    lease: LeaseConfig,
}

fn local(p: usize, true_ns: u64) -> u64 {
    model::local(RATES_PPM[p], true_ns)
}

fn true_at(p: usize, local_ns: u64) -> u64 {
    model::true_at(RATES_PPM[p], local_ns)
}

fn incarnation(p: usize, generation: u8) -> Incarnation {
    model::incarnation(1, p, generation)
}

impl World {
    fn live_session(&self, key: Key) -> Option<usize> {
        let now_ns = self.now_ns;
        self.sessions
            .iter()
            .position(|r| r.key == key && now_ns < r.expires_ns)
    }

    fn live_holding(&self, slot: usize) -> Option<HoldingRecord> {
        self.holdings[slot].filter(|h| self.live_session(h.session).is_some())
    }

    /// Processes acting on `slot`.
    fn actors(&self, slot: usize) -> impl Iterator<Item = usize> + '_ {
        (0..PROCESSES).filter(move |&p| self.procs[p].holds[slot].acting())
    }

    fn acts(&self, p: usize) -> bool {
        self.procs[p].holds.iter().any(|h| h.acting())
    }

    /// Whether `p` may run services now: its kill deadline armed and not reached.
    fn alive(&self, p: usize) -> bool {
        self.procs[p]
            .killer
            .is_some_and(|at| local(p, self.now_ns) < at)
    }

    /// The request of `p` that moves next: calls of one process reach the store in order.
    fn oldest(&self, p: usize) -> Option<usize> {
        self.msgs
            .iter()
            .position(|m| m.p as usize == p && !m.answered)
    }

    fn waiting(&self) -> bool {
        self.msgs.iter().any(|m| !m.answered)
    }

    fn timer_due(&self, p: usize) -> bool {
        self.procs[p]
            .timer
            .is_some_and(|(_, at)| local(p, self.now_ns) >= at)
    }

    /// Removes expired session records and the holdings that ended with them.
    fn prune(&mut self) {
        let now_ns = self.now_ns;
        self.sessions.retain(|r| now_ns < r.expires_ns);
        for slot in 0..SLOTS {
            if self.holdings[slot].is_some() && self.live_holding(slot).is_none() {
                self.holdings[slot] = None;
            }
        }
    }
}

impl SessionModel {
    fn new(budget: Budget, horizon_ns: u64, keepalives: KeepAlives, rule: Rule) -> Self {
        SessionModel {
            budget,
            horizon_ns,
            keepalives,
            rule,
            lease: LeaseConfig::new(LEASE).expect("valid lease"),
        }
    }

    fn fresh(&self, p: usize, generation: u8) -> Proc {
        Proc {
            session: Session::new(self.lease, incarnation(p, generation)),
            generation,
            timer: None,
            stalled: false,
            killer: None,
            holds: [Hold::Idle; SLOTS],
        }
    }

    /// Starts process `p` as a new incarnation, which opens its session at once. The old one is
    /// gone with everything it ran; its calls on their way may still reach the store.
    fn start(&self, world: &mut World, p: usize, generation: u8) {
        world.procs[p] = self.fresh(p, generation);
        for m in world.msgs.iter_mut().filter(|m| m.p as usize == p) {
            m.answered = true;
        }
        self.handle(world, p, |now| SessionEvent::Open { now });
    }

    /// Runs one event through process `p`'s session and performs the effects.
    fn handle(&self, world: &mut World, p: usize, event: impl FnOnce(Instant) -> SessionEvent) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let mut out = SessionEffects::new();
        let proc = &mut world.procs[p];
        proc.session.handle(&event(now), &mut out);
        let generation = proc.generation;
        let mut lost = false;
        for effect in out.as_slice().iter().copied() {
            let proc = &mut world.procs[p];
            match effect {
                SessionEffect::Create { .. }
                | SessionEffect::KeepAlive { .. }
                | SessionEffect::Delete { .. }
                | SessionEffect::Get { .. } => {
                    let in_flight = world.msgs.iter().any(|m| {
                        m.p as usize == p
                            && m.generation == generation
                            && !m.answered
                            && matches!(m.call, Call::Session(_))
                    });
                    assert!(!in_flight, "a second session call in flight: {effect:?}");
                    world.msgs.push(Msg {
                        p: p as u8,
                        generation,
                        call: Call::Session(effect),
                        answered: false,
                    });
                }
                SessionEffect::SetTimer { timer, at } => {
                    proc.timer = Some((timer, at.as_nanos()));
                    proc.stalled = false;
                }
                SessionEffect::ArmKiller { at } => proc.killer = Some(at.as_nanos()),
                SessionEffect::DisarmKiller => proc.killer = None,
                SessionEffect::Lost { .. } => lost = true,
                _ => {}
            }
        }
        let proc = &mut world.procs[p];
        // A firing the machine no longer waits for changes nothing: forget it.
        if proc.timer.map(|(id, _)| id) != awaited_timer(&proc.session) {
            proc.timer = None;
            proc.stalled = false;
        }
        if lost {
            // Every holding ends at once: the runtime tells each one's services to stop.
            world.lost_while_acting |= world.acts(p);
            for slot in 0..SLOTS {
                let hold = &mut world.procs[p].holds[slot];
                if *hold == Hold::Running {
                    *hold = Hold::Stopping;
                }
                if self.rule == Rule::DetachAtLoss && *hold != Hold::Idle {
                    // Unsound: detached before the services stopped.
                    Self::detach(world, p, slot);
                }
            }
        }
    }

    fn detach(world: &mut World, p: usize, slot: usize) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let mut out = SessionEffects::new();
        let holding = HoldingId(slot as u32);
        world.procs[p]
            .session
            .handle(&SessionEvent::Detach { now, holding }, &mut out);
        assert!(out.is_empty(), "detach is silent: {out:?}");
    }

    /// The store applies `msg` atomically now.
    fn apply(&self, world: &mut World, msg: &Msg) -> Answer {
        let now_ns = world.now_ns;
        let key = |id| Key {
            p: msg.p,
            generation: msg.generation,
            id,
        };
        match msg.call {
            Call::Session(SessionEffect::Create { op, id, ttl }) => {
                if world.live_session(key(id)).is_some() {
                    return Answer::Session(op, Reply::Rejected);
                }
                let revision = 1;
                world.sessions.retain(|r| r.key != key(id));
                world.sessions.push(SessionRecord {
                    key: key(id),
                    revision,
                    expires_ns: now_ns + nanos(ttl),
                });
                world.sessions.sort_by_key(|r| r.key);
                Answer::Session(op, Reply::Written(Revision(revision)))
            }
            Call::Session(SessionEffect::KeepAlive {
                op,
                id,
                expected,
                ttl,
            }) => {
                let found = world
                    .live_session(key(id))
                    .filter(|&i| world.sessions[i].revision == expected.0);
                let Some(i) = found else {
                    return Answer::Session(op, Reply::Rejected);
                };
                let revision = match self.keepalives {
                    KeepAlives::Keep => expected.0,
                    KeepAlives::Bump => expected.0 + 1,
                };
                let record = &mut world.sessions[i];
                record.revision = revision;
                record.expires_ns = now_ns + nanos(ttl);
                Answer::Session(op, Reply::Written(Revision(revision)))
            }
            Call::Session(SessionEffect::Delete { op, id, expected }) => {
                let found = world
                    .live_session(key(id))
                    .filter(|&i| world.sessions[i].revision == expected.0);
                let Some(i) = found else {
                    return Answer::Session(op, Reply::Rejected);
                };
                // The session ends, and every holding of it in the same instant.
                world.sessions.remove(i);
                for holding in &mut world.holdings {
                    if holding.is_some_and(|h| h.session == key(id)) {
                        *holding = None;
                    }
                }
                Answer::Session(op, Reply::Deleted)
            }
            Call::Session(SessionEffect::Get { op, id }) => {
                let found = world.live_session(key(id)).map(|i| Record {
                    incarnation: incarnation(msg.p as usize, msg.generation),
                    revision: Revision(world.sessions[i].revision),
                });
                Answer::Session(op, Reply::Found(found))
            }
            Call::Session(other) => unreachable!("not a store call: {other:?}"),
            Call::Acquire { slot, session } => {
                let slot = slot as usize;
                // One transaction: the session live, the slot free (or ours already).
                if world.live_session(key(session)).is_none() {
                    return Answer::Acquire(slot, Acquired::SessionGone);
                }
                match world.live_holding(slot) {
                    Some(h) if h.session == key(session) => {
                        Answer::Acquire(slot, Acquired::Written)
                    }
                    Some(_) => Answer::Acquire(slot, Acquired::Held),
                    None => {
                        world.holdings[slot] = Some(HoldingRecord {
                            session: key(session),
                        });
                        Answer::Acquire(slot, Acquired::Written)
                    }
                }
            }
        }
    }

    /// The answer to `msg` reaches its caller, if it still waits for it.
    fn answer(&self, world: &mut World, msg: &Msg, answer: Answer) {
        let p = msg.p as usize;
        if msg.answered || world.procs[p].generation != msg.generation {
            return;
        }
        match (answer, msg.call) {
            (Answer::Session(op, reply), _) => {
                self.handle(world, p, |now| SessionEvent::Reply { now, op, reply })
            }
            (Answer::Acquire(slot, acquired), Call::Acquire { session, .. }) => {
                self.acquired(world, p, slot, session, acquired)
            }
            (Answer::Acquire(..), Call::Session(_)) => unreachable!("an acquire's answer"),
        }
    }

    /// What the runtime's acquire does with an answer (`SessionHandle::acquire`).
    fn acquired(
        &self,
        world: &mut World,
        p: usize,
        slot: usize,
        session: SessionId,
        acquired: Acquired,
    ) {
        let proc = &mut world.procs[p];
        let Hold::Acquiring { sends } = proc.holds[slot] else {
            unreachable!(
                "an acquire answered outside acquiring: {:?}",
                proc.holds[slot]
            );
        };
        match acquired {
            Acquired::Written => {
                // The holding is handed out and its services start; if the session was lost
                // meanwhile, its loss is known already and they are told to stop at once.
                let alive = proc.session.liveness().is_some_and(|l| l.id == session);
                proc.holds[slot] = if alive { Hold::Running } else { Hold::Stopping };
            }
            Acquired::Unknown if u32::from(sends) < ACQUIRE_SENDS_MAX => {
                // Idempotent per session: sent again.
                proc.holds[slot] = Hold::Acquiring { sends: sends + 1 };
                world.msgs.push(Msg {
                    p: p as u8,
                    generation: proc.generation,
                    call: Call::Acquire {
                        slot: slot as u8,
                        session,
                    },
                    answered: false,
                });
            }
            Acquired::Held | Acquired::SessionGone | Acquired::Failed | Acquired::Unknown => {
                // No holding: nothing acts under it; a record written after all is left to the
                // session.
                proc.holds[slot] = Hold::Idle;
                Self::detach(world, p, slot);
            }
        }
    }

    /// The next instant after now at which something is due.
    fn next_instant(&self, world: &World) -> Option<u64> {
        let now_ns = world.now_ns;
        let due = world.procs.iter().enumerate().flat_map(|(p, proc)| {
            let killer = proc.killer.filter(|_| self.rule != Rule::KillerIgnored);
            proc.timer
                .map(|(_, at)| at)
                .into_iter()
                .chain(killer)
                .map(move |at| true_at(p, at))
        });
        let expiries = world.sessions.iter().map(|r| r.expires_ns);
        due.chain(expiries).filter(|&at| at > now_ns).min()
    }

    /// After any step: which incarnation acts on each slot, so that a handover is seen.
    fn observe(world: &mut World) {
        for slot in 0..SLOTS {
            let actors: Vec<usize> = world.actors(slot).collect();
            for p in actors {
                let actor = (p as u8, world.procs[p].generation);
                world.handover |= world.last_actor[slot].is_some_and(|last| last != actor);
                world.last_actor[slot] = Some(actor);
            }
        }
    }
}

impl Model for SessionModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let mut world = World {
            now_ns: 0,
            procs: (0..PROCESSES).map(|p| self.fresh(p, 0)).collect(),
            sessions: Vec::new(),
            holdings: [None; SLOTS],
            msgs: Vec::new(),
            faults: 0,
            crashes: 0,
            closes: 0,
            late_timers: 0,
            attaches: [0; PROCESSES],
            last_actor: [None; SLOTS],
            handover: false,
            lost_while_acting: false,
            killed_while_acting: false,
        };
        for p in 0..PROCESSES {
            self.start(&mut world, p, 0);
        }
        vec![world]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        for p in 0..PROCESSES {
            if let Some(i) = world.oldest(p) {
                actions.push(Action::Deliver(i));
                let keepalive = matches!(
                    world.msgs[i].call,
                    Call::Session(SessionEffect::KeepAlive { .. })
                );
                if world.faults < self.budget.faults && (keepalive || !self.budget.keepalives_only)
                {
                    let kinds = self.budget.fault_kinds.iter();
                    actions.extend(kinds.map(|&fault| Action::Fault(i, fault)));
                }
            }
        }
        for (i, m) in world.msgs.iter().enumerate() {
            if m.answered {
                actions.push(Action::Deliver(i));
            }
        }
        for p in 0..PROCESSES {
            let proc = &world.procs[p];
            if world.timer_due(p) {
                actions.push(Action::FireTimer(p));
            }
            let alive = proc.session.liveness().is_some()
                && (self.budget.attaches == ANY || world.attaches[p] < self.budget.attaches);
            for (slot, hold) in proc.holds.iter().enumerate() {
                let futile = || {
                    let own = proc.session.id().map(|id| Key {
                        p: p as u8,
                        generation: proc.generation,
                        id,
                    });
                    world
                        .live_holding(slot)
                        .is_some_and(|h| Some(h.session) != own)
                };
                match hold {
                    Hold::Idle if alive && (self.budget.futile_attaches || !futile()) => {
                        actions.push(Action::Attach(p, slot))
                    }
                    Hold::Stopping => actions.push(Action::Stop(p, slot)),
                    _ => {}
                }
            }
            let session = &proc.session;
            if session.is_closed() || (session.is_lost() && session.holdings() == 0) {
                actions.push(Action::Open(p));
            }
            if world.closes < self.budget.closes && !session.is_closed() && session.holdings() == 0
            {
                actions.push(Action::Close(p));
            }
            if world.crashes < self.budget.crashes {
                actions.push(Action::Crash(p));
            }
        }
        if !world.waiting() && self.next_instant(world).is_some() {
            // Due timers fire before time moves on, unless the budget lets them slip.
            let slipping = (0..PROCESSES)
                .filter(|&p| world.timer_due(p) && !world.procs[p].stalled)
                .count();
            let allowed = self.budget.late_timers == ANY
                || usize::from(world.late_timers) + slipping
                    <= usize::from(self.budget.late_timers);
            if allowed {
                actions.push(Action::Advance);
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Deliver(i) => {
                let msg = world.msgs.remove(i);
                let answer = self.apply(&mut world, &msg);
                self.answer(&mut world, &msg, answer);
            }
            Action::Fault(i, fault) => {
                let msg = world.msgs.remove(i);
                world.faults += 1;
                let unknown = |answer: Answer| match answer {
                    Answer::Session(op, _) => Answer::Session(op, Reply::Unknown),
                    Answer::Acquire(slot, _) => Answer::Acquire(slot, Acquired::Unknown),
                };
                let nothing = match msg.call {
                    Call::Session(effect) => Answer::Session(session_op(&effect), Reply::Failed),
                    Call::Acquire { slot, .. } => Answer::Acquire(slot as usize, Acquired::Failed),
                };
                match fault {
                    Fault::Fail => self.answer(&mut world, &msg, nothing),
                    Fault::Lose => self.answer(&mut world, &msg, unknown(nothing)),
                    Fault::LoseAnswer => {
                        let answer = self.apply(&mut world, &msg);
                        self.answer(&mut world, &msg, unknown(answer));
                    }
                    Fault::Late => {
                        world.msgs.push(Msg {
                            answered: true,
                            ..msg
                        });
                        self.answer(&mut world, &msg, unknown(nothing));
                    }
                }
            }
            Action::FireTimer(p) => {
                let (timer, _) = world.procs[p].timer.take()?;
                world.procs[p].stalled = false;
                self.handle(&mut world, p, |now| SessionEvent::Timer { now, timer });
            }
            Action::Attach(p, slot) => {
                let now = Instant::from_nanos(local(p, world.now_ns));
                let proc = &mut world.procs[p];
                let holding = HoldingId(slot as u32);
                let mut out = SessionEffects::new();
                proc.session
                    .handle(&SessionEvent::Attach { now, holding }, &mut out);
                if out.as_slice() != [SessionEffect::Attached { holding }] {
                    // Refused (past the deadline): nothing changes.
                    return None;
                }
                let session = proc.session.id()?;
                proc.holds[slot] = Hold::Acquiring { sends: 1 };
                if self.budget.attaches != ANY {
                    world.attaches[p] += 1;
                }
                world.msgs.push(Msg {
                    p: p as u8,
                    generation: proc.generation,
                    call: Call::Acquire {
                        slot: slot as u8,
                        session,
                    },
                    answered: false,
                });
            }
            Action::Stop(p, slot) => {
                world.procs[p].holds[slot] = Hold::Idle;
                Self::detach(&mut world, p, slot);
            }
            Action::Open(p) => self.handle(&mut world, p, |now| SessionEvent::Open { now }),
            Action::Close(p) => {
                world.closes += 1;
                self.handle(&mut world, p, |now| SessionEvent::Close { now });
            }
            Action::Crash(p) => {
                world.crashes += 1;
                let generation = world.procs[p].generation + 1;
                self.start(&mut world, p, generation);
            }
            Action::Advance => {
                if self.budget.late_timers != ANY {
                    for p in 0..PROCESSES {
                        if world.timer_due(p) && !world.procs[p].stalled {
                            world.procs[p].stalled = true;
                            world.late_timers += 1;
                        }
                    }
                }
                world.now_ns = self.next_instant(&world)?;
                for p in 0..PROCESSES {
                    let killed = self.rule != Rule::KillerIgnored
                        && world.procs[p]
                            .killer
                            .is_some_and(|at| local(p, world.now_ns) >= at);
                    if killed {
                        // Killed at its deadline with everything it runs; restarted.
                        world.killed_while_acting |= world.acts(p);
                        let generation = world.procs[p].generation + 1;
                        self.start(&mut world, p, generation);
                    }
                }
                world.prune();
            }
        }
        Self::observe(&mut world);
        // One order for the calls of different processes: only each one's own order matters.
        world.msgs.sort_by_key(|m| m.p);
        Some(world)
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now_ns <= self.horizon_ns
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(AT_MOST_ONE, |_, world: &World| {
                (0..SLOTS).all(|slot| world.actors(slot).count() <= 1)
            }),
            Property::always(ONLY_ALIVE, |_, world: &World| {
                (0..PROCESSES).all(|p| !world.acts(p) || world.alive(p))
            }),
            Property::sometimes(ACTED_ON, |_, world: &World| {
                (0..SLOTS).any(|slot| world.actors(slot).next().is_some())
            }),
            Property::sometimes(BOTH_ACT, |_, world: &World| {
                (0..PROCESSES).all(|p| world.acts(p))
            }),
            Property::sometimes(HANDOVER, |_, world: &World| world.handover),
            Property::sometimes(LOST_WHILE_ACTING, |_, world: &World| {
                world.lost_while_acting
            }),
            Property::sometimes(KILLED_WHILE_ACTING, |_, world: &World| {
                world.killed_while_acting
            }),
        ]
    }
}

/// How the state space is walked.
#[derive(Clone, Copy, Debug)]
enum Search {
    /// Every run up to this many steps (breadth first), or to the horizon.
    Exhaustive(Option<usize>),
    /// Random runs to the horizon from a fixed seed, until this many states.
    Random { states: usize },
    /// Every run to the horizon, depth first: finds a deep counterexample before exploring
    /// every shallower run.
    DepthFirst,
}

/// One check: the model, how it is searched, and the `sometimes` properties it must reach.
struct Check {
    budget: Budget,
    horizon_ns: u64,
    keepalives: KeepAlives,
    rule: Rule,
    search: Search,
    reach: &'static [&'static str],
}

/// What a run found: the `always` properties violated (with their runs), and the `sometimes`
/// properties of [`Check::reach`] never reached.
struct Found {
    violated: Vec<(&'static str, String)>,
    unreached: Vec<&'static str>,
}

fn run(check: &Check) -> Found {
    let wall = WallInstant::now();
    let model = SessionModel::new(check.budget, check.horizon_ns, check.keepalives, check.rule);
    let mut builder = model.checker();
    if check.rule != Rule::Sound {
        // A broken rule is judged by the overlap it must lead to.
        builder = builder.finish_when(HasDiscoveries::AllOf([AT_MOST_ONE].into()));
    }
    match check.search {
        Search::DepthFirst => report(check, wall, builder.threads(1).spawn_dfs().join()),
        Search::Exhaustive(depth) => {
            let builder = builder.threads(2);
            let builder = match depth {
                Some(depth) => builder.target_max_depth(depth),
                None => builder,
            };
            report(check, wall, builder.spawn_bfs().join())
        }
        Search::Random { states } => {
            let checker = builder
                .threads(1)
                .target_max_depth(1_000)
                .target_state_count(states)
                .spawn_simulation(0x5E55, UniformChooser)
                .join();
            report(check, wall, checker)
        }
    }
}

fn report(check: &Check, wall: WallInstant, checker: impl Checker<SessionModel>) -> Found {
    println!(
        "session model check ({:?}, {:?}, {:?}, {:?}): {} states explored, {} unique, max depth {}, {:.2} s",
        check.rule,
        check.budget,
        check.keepalives,
        check.search,
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        wall.elapsed().as_secs_f64()
    );
    let mut found = Found {
        violated: Vec::new(),
        unreached: Vec::new(),
    };
    for property in checker.model().properties() {
        let discovery = checker.discovery(property.name);
        if property.expectation.discovery_is_failure() {
            if let Some(path) = discovery {
                let mut text = format!("property \"{}\" violated by:\n", property.name);
                for action in path.clone().into_actions() {
                    text.push_str(&format!("  {action:?}\n"));
                }
                text.push_str(&format!("final state: {:#?}", path.last_state()));
                found.violated.push((property.name, text));
            }
        } else if discovery.is_none() && check.reach.contains(&property.name) {
            found.unreached.push(property.name);
        }
    }
    found
}

/// Runs a check of the sound model: fails with every counterexample, and when a `sometimes`
/// property it must reach was not reached (the search would be too shallow to mean anything).
fn check_sound(check: Check) {
    let found = run(&check);
    let mut failures: Vec<String> = found.violated.into_iter().map(|(_, text)| text).collect();
    failures.extend(
        found
            .unreached
            .iter()
            .map(|name| format!("no run reached \"{name}\": the model explores too little")),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Runs a check of an unsound model: it must find two processes acting on one slot.
fn check_caught(check: Check) {
    let found = run(&check);
    let overlap = found.violated.iter().find(|(name, _)| *name == AT_MOST_ONE);
    let Some((_, text)) = overlap else {
        panic!(
            "no overlap found with {:?}; violated: {:?}",
            check.rule,
            found.violated.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
    };
    println!("{text}");
}

/// Depth of the exhaustive check: every run of this many steps is explored.
const DEPTH: usize = 10;

/// States visited by the random check.
const RANDOM_STATES: usize = 300_000;

// covers: Session.Attach, Session.OneInFlight, Session.UnknownOutcome, Session.Invariants
// covers: Session.Open, Session.Close, Session.CloseDuringOp, Session.AttachBeforeAcquire
/// Every run of [`DEPTH`] steps (`VVM_SESSION_MODEL_DEPTH`): two faults (failed, lost, answer
/// lost, late) on any call, a crash, a close, timers as late as wished, holdings attached at
/// any moment. (The model asserts that a session has one call in flight at most.)
#[test]
fn sessions_safety_every_run_to_a_depth() {
    let depth = env_usize("VVM_SESSION_MODEL_DEPTH").unwrap_or(DEPTH);
    check_sound(Check {
        budget: FULL,
        horizon_ns: HORIZON_NS,
        keepalives: KeepAlives::Bump,
        rule: Rule::Sound,
        search: Search::Exhaustive(Some(depth)),
        reach: &[ACTED_ON, BOTH_ACT],
    });
}

// covers: Session.KillDeadline, Session.PreKeepAliveGuard
/// Every run to the horizon (`3·L`) without faults, one keepalive timer firing late (at any
/// later instant, or never): a process killed at its deadline while acting, and its slots taken
/// by the other once its session record expired.
#[test]
fn sessions_safety_every_run_of_late_timers() {
    check_sound(Check {
        budget: ONE_LATE_TIMER,
        horizon_ns: HORIZON_NS,
        keepalives: KeepAlives::Keep,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[ACTED_ON, BOTH_ACT, HANDOVER, KILLED_WHILE_ACTING],
    });
}

// covers: Session.LossOfAllHoldings, Session.Retry, Session.RetryUntilDeadline
// covers: Session.KillDeadline, Session.DeadlineOnlyLaterOnConfirm
/// Random runs to the horizon (`3·L`) with the full adversary (`VVM_SESSION_MODEL_STATES`
/// states): processes killed while acting, slots changing hands, sessions lost.
#[test]
fn sessions_safety_random_long_runs() {
    let states = env_usize("VVM_SESSION_MODEL_STATES").unwrap_or(RANDOM_STATES);
    check_sound(Check {
        // A random run ends at the first state it revisits, which a futile attach leads back to.
        budget: Budget {
            futile_attaches: false,
            ..FULL
        },
        horizon_ns: HORIZON_NS,
        keepalives: KeepAlives::Bump,
        rule: Rule::Sound,
        search: Search::Random { states },
        reach: &[ACTED_ON, BOTH_ACT, HANDOVER, KILLED_WHILE_ACTING],
    });
}

// covers: Session.LossOfAllHoldings, Session.UnknownOutcome, Session.DetachAfterServices
/// Every run to the horizon (`1.5·L`) with one keepalive that lands late (the store gives it a
/// new revision, so the next keepalive is refused and the session lost while its holdings act):
/// services stopping at any instant, or not before the killer; the session opened again once
/// they stopped.
#[test]
fn sessions_safety_every_run_of_a_late_keepalive() {
    check_sound(Check {
        budget: ONE_LATE_REQUEST,
        horizon_ns: SHORT_HORIZON_NS,
        keepalives: KeepAlives::Bump,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[
            ACTED_ON,
            BOTH_ACT,
            HANDOVER,
            LOST_WHILE_ACTING,
            KILLED_WHILE_ACTING,
        ],
    });
}

// covers: Session.KillDeadline
/// The same exploration finds two processes acting on one slot when the killer is ignored: a
/// process whose keepalives stopped acts past its deadline, until its record expired and the
/// other took the slot.
#[test]
fn sessions_an_ignored_killer_is_caught() {
    check_caught(Check {
        budget: ONE_LATE_TIMER,
        horizon_ns: SHORT_HORIZON_NS,
        keepalives: KeepAlives::Keep,
        rule: Rule::KillerIgnored,
        search: Search::Exhaustive(None),
        reach: &[],
    });
}

// covers: Session.LossOfAllHoldings, Session.DetachAfterServices
/// Detaching holdings at the loss, before their services stopped, lets the session open anew:
/// its later deadline replaces the one those services run under, and they act on after their
/// record expired and the other process took the slot.
#[test]
fn sessions_detaching_before_services_stop_is_caught() {
    check_caught(Check {
        budget: ONE_LATE_REQUEST,
        horizon_ns: SHORT_HORIZON_NS,
        keepalives: KeepAlives::Bump,
        rule: Rule::DetachAtLoss,
        search: Search::DepthFirst,
        reach: &[],
    });
}
