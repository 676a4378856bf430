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

use model::{
    advance_steps, deliveries, env_usize, explore, live_session, session_steps, take, timer_steps,
    Allowance, Calls, Fault, Key, Msg, Search, SessionCall, SessionRecord, Sessions, Spent, Step,
    Task, ANY, SESSION_FAULTS,
};

use core::time::Duration;

use stateright::{Model, Property};
use vvm_core::{
    HoldingId, Instant, LeaseConfig, OpId, Reply, SessionEffect, SessionEvent, SessionId,
};
use vvm_runtime::ACQUIRE_SENDS_MAX;

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

/// The full adversary.
const FULL: Budget = Budget {
    faults: 2,
    fault_kinds: &SESSION_FAULTS,
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
    task: Task,
    holds: [Hold; SLOTS],
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

impl SessionCall for Call {
    fn session(effect: SessionEffect) -> Self {
        Call::Session(effect)
    }

    fn as_session(&self) -> Option<SessionEffect> {
        match *self {
            Call::Session(effect) => Some(effect),
            Call::Acquire { .. } => None,
        }
    }
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
    msgs: Vec<Msg<Call>>,
    /// What the adversary spent.
    spent: Spent,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A step every model of sessions has.
    Step(Step),
    /// Process `p` attaches a holding of `slot` and sends its acquire.
    Attach(usize, usize),
    /// The services of process `p` on `slot`, told to stop, have stopped; the holding is
    /// detached.
    Stop(usize, usize),
}

impl From<Step> for Action {
    fn from(step: Step) -> Self {
        Action::Step(step)
    }
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

impl World {
    fn live_session(&self, key: Key) -> Option<usize> {
        live_session(&self.sessions, self.now_ns, key)
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
        self.procs[p].task.alive(local(p, self.now_ns))
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
            task: Task::new(self.lease, p, generation),
            holds: [Hold::Idle; SLOTS],
        }
    }

    fn detach(world: &mut World, p: usize, slot: usize) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        world.procs[p].task.detach(now, HoldingId(slot as u32));
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
                let alive = proc
                    .task
                    .session
                    .liveness()
                    .is_some_and(|l| l.id == session);
                proc.holds[slot] = if alive { Hold::Running } else { Hold::Stopping };
            }
            Acquired::Unknown if u32::from(sends) < ACQUIRE_SENDS_MAX => {
                // Idempotent per session: sent again.
                proc.holds[slot] = Hold::Acquiring { sends: sends + 1 };
                world.msgs.push(Msg {
                    p: p as u8,
                    generation: proc.task.generation,
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

    /// After any step: which incarnation acts on each slot, so that a handover is seen.
    fn observe(world: &mut World) {
        for slot in 0..SLOTS {
            let actors: Vec<usize> = world.actors(slot).collect();
            for p in actors {
                let actor = (p as u8, world.procs[p].task.generation);
                world.handover |= world.last_actor[slot].is_some_and(|last| last != actor);
                world.last_actor[slot] = Some(actor);
            }
        }
    }
}

impl Calls for SessionModel {
    type World = World;
    type Call = Call;
    type Answer = Answer;

    fn msgs(world: &World) -> &Vec<Msg<Call>> {
        &world.msgs
    }

    fn msgs_mut(world: &mut World) -> &mut Vec<Msg<Call>> {
        &mut world.msgs
    }

    /// The store applies `msg` atomically now.
    fn apply(&self, world: &mut World, msg: &Msg<Call>) -> Answer {
        let key = |id| Key {
            p: msg.p,
            generation: msg.generation,
            id,
        };
        match msg.call {
            Call::Session(effect) => {
                let bump = self.keepalives == KeepAlives::Bump;
                let writer = (msg.p, msg.generation);
                let (op, reply, ended) =
                    model::apply_session(&mut world.sessions, world.now_ns, writer, effect, bump);
                if let Some(ended) = ended {
                    // The session ends, and every holding of it in the same instant.
                    for holding in &mut world.holdings {
                        if holding.is_some_and(|h| h.session == ended) {
                            *holding = None;
                        }
                    }
                }
                Answer::Session(op, reply)
            }
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
    fn answer(&self, world: &mut World, msg: &Msg<Call>, answer: Answer) {
        let p = msg.p as usize;
        if msg.answered || world.procs[p].task.generation != msg.generation {
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

    fn failed(call: &Call) -> Answer {
        match *call {
            Call::Session(effect) => Answer::Session(model::session_op(&effect), Reply::Failed),
            Call::Acquire { slot, .. } => Answer::Acquire(slot as usize, Acquired::Failed),
        }
    }

    fn unknown(answer: Answer) -> Answer {
        match answer {
            Answer::Session(op, _) => Answer::Session(op, Reply::Unknown),
            Answer::Acquire(slot, _) => Answer::Acquire(slot, Acquired::Unknown),
        }
    }
}

impl Sessions for SessionModel {
    fn processes(&self) -> usize {
        PROCESSES
    }

    fn allowance(&self) -> Allowance {
        let budget = self.budget;
        Allowance {
            faults: budget.faults,
            fault_kinds: budget.fault_kinds,
            keepalives_only: budget.keepalives_only,
            crashes: budget.crashes,
            closes: budget.closes,
            late_timers: budget.late_timers,
        }
    }

    fn spent(world: &World) -> Spent {
        world.spent
    }

    fn spend(world: &mut World) -> &mut Spent {
        &mut world.spent
    }

    fn task(world: &World, p: usize) -> &Task {
        &world.procs[p].task
    }

    fn task_mut(world: &mut World, p: usize) -> &mut Task {
        &mut world.procs[p].task
    }

    fn now_ns(world: &World) -> u64 {
        world.now_ns
    }

    fn set_now_ns(world: &mut World, now_ns: u64) {
        world.now_ns = now_ns;
    }

    fn local(p: usize, true_ns: u64) -> u64 {
        local(p, true_ns)
    }

    fn killer_works(&self) -> bool {
        self.rule != Rule::KillerIgnored
    }

    /// Starts process `p` as a new incarnation, which opens its session at once. The old one is
    /// gone with everything it ran; its calls on their way may still reach the store.
    fn start(&self, world: &mut World, p: usize, generation: u8) {
        world.procs[p] = self.fresh(p, generation);
        model::orphan(&mut world.msgs, p);
        self.handle(world, p, |now| SessionEvent::Open { now });
    }

    /// Runs one event through process `p`'s session and performs the effects.
    fn handle(&self, world: &mut World, p: usize, event: impl FnOnce(Instant) -> SessionEvent) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let handled = world.procs[p].task.handle(&mut world.msgs, p, now, event);
        if handled.lost {
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

    /// The next instant after now at which something is due.
    fn next_instant(&self, world: &World) -> Option<u64> {
        let now_ns = world.now_ns;
        let due = world.procs.iter().enumerate().flat_map(|(p, proc)| {
            let killer = proc
                .task
                .killer
                .filter(|_| self.rule != Rule::KillerIgnored);
            proc.task
                .timer
                .map(|(_, at)| at)
                .into_iter()
                .chain(killer)
                .map(move |at| true_at(p, at))
        });
        let expiries = world.sessions.iter().map(|r| r.expires_ns);
        due.chain(expiries).filter(|&at| at > now_ns).min()
    }

    fn killed(world: &mut World, p: usize) {
        world.killed_while_acting |= world.acts(p);
    }

    fn prune(world: &mut World) {
        world.prune();
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
            spent: Spent::default(),
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
        deliveries(self, world, actions);
        for p in 0..PROCESSES {
            let proc = &world.procs[p];
            timer_steps::<Self>(world, p, actions);
            let alive = proc.task.session.liveness().is_some()
                && (self.budget.attaches == ANY || world.attaches[p] < self.budget.attaches);
            for (slot, hold) in proc.holds.iter().enumerate() {
                let futile = || {
                    let own = proc.task.session.id().map(|id| Key {
                        p: p as u8,
                        generation: proc.task.generation,
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
            session_steps(self, world, p, actions);
        }
        advance_steps(self, world, actions);
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Step(step) => take(self, &mut world, step)?,
            Action::Attach(p, slot) => {
                let now = Instant::from_nanos(local(p, world.now_ns));
                let proc = &mut world.procs[p];
                if !proc.task.attach(now, HoldingId(slot as u32)) {
                    // Refused (past the deadline): nothing changes.
                    return None;
                }
                let session = proc.task.session.id()?;
                proc.holds[slot] = Hold::Acquiring { sends: 1 };
                if self.budget.attaches != ANY {
                    world.attaches[p] += 1;
                }
                world.msgs.push(Msg {
                    p: p as u8,
                    generation: proc.task.generation,
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

/// One check: the model, how it is searched, and the `sometimes` properties it must reach.
struct Check {
    budget: Budget,
    horizon_ns: u64,
    keepalives: KeepAlives,
    rule: Rule,
    search: Search,
    reach: &'static [&'static str],
}

fn run(check: &Check) -> model::Found {
    let model = SessionModel::new(check.budget, check.horizon_ns, check.keepalives, check.rule);
    // A broken rule is judged by the overlap it must lead to.
    let stop_at = (check.rule != Rule::Sound).then_some(AT_MOST_ONE);
    let label = format!(
        "session model check ({:?}, {:?}, {:?})",
        check.rule, check.budget, check.keepalives
    );
    explore(model, check.search, 0x5E55, stop_at, &label)
}

/// Runs a check of the sound model: fails with every counterexample, and when a `sometimes`
/// property it must reach was not reached (the search would be too shallow to mean anything).
fn check_sound(check: Check) {
    run(&check).assert_sound(check.reach);
}

/// Runs a check of an unsound model: it must find two processes acting on one slot.
fn check_caught(check: Check) {
    run(&check).assert_caught(AT_MOST_ONE, check.rule);
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
        search: Search::Random {
            depth: 1_000,
            states,
        },
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
