//! The harness the model checks (`tests/model_check*.rs`) share: the search and its report,
//! the adversary's faults, clocks that run at a fixed rate of true time, the numbering of
//! process starts, and — for the models of processes under a session — the session task, its
//! store records, the calls on their way and the faults that hit them.

#![allow(dead_code)] // each model check uses its part

use core::time::Duration;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::Instant as WallInstant;

use stateright::{Checker, HasDiscoveries, Model, UniformChooser};
use vvm_core::{
    Incarnation, Instant, LeaseConfig, OpId, Record, Reply, Revision, Session, SessionEffect,
    SessionEffects, SessionEvent, SessionId, SessionState, TimerId,
};

/// The local reading at true time `true_ns` of a clock running at `rate_ppm` (parts per million
/// of true time; both start at 0).
pub fn local(rate_ppm: u64, true_ns: u64) -> u64 {
    (u128::from(true_ns) * u128::from(rate_ppm) / 1_000_000) as u64
}

/// The first true instant at which a clock running at `rate_ppm` reads `local_ns`.
pub fn true_at(rate_ppm: u64, local_ns: u64) -> u64 {
    (u128::from(local_ns) * 1_000_000).div_ceil(u128::from(rate_ppm)) as u64
}

/// The incarnation of the `generation`-th start of process `p`, numbered from `first`.
pub fn incarnation(first: u64, p: usize, generation: u8) -> Incarnation {
    Incarnation(1000 * (p as u64 + first) + u64::from(generation))
}

/// `duration` in nanoseconds.
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).expect("fits")
}

/// The number in the environment variable `name`, if it is set.
pub fn env_usize(name: &str) -> Option<usize> {
    let text = std::env::var(name).ok()?;
    Some(text.parse().unwrap_or_else(|_| panic!("{name}={text}")))
}

/// How the state space is walked.
#[derive(Clone, Copy, Debug)]
pub enum Search {
    /// Every run up to this many steps (breadth first), or to the horizon.
    Exhaustive(Option<usize>),
    /// Random runs of up to `depth` steps from a fixed seed, until `states` states.
    Random { depth: usize, states: usize },
    /// Every run to the horizon, depth first: finds a deep counterexample before exploring
    /// every shallower run.
    DepthFirst,
}

/// What a search found: the `always` properties violated (with their runs), and the
/// `sometimes` properties never reached.
pub struct Found {
    pub violated: Vec<(&'static str, String)>,
    pub unreached: Vec<&'static str>,
}

impl Found {
    /// Fails with every counterexample, and when a `sometimes` property of `reach` was not
    /// reached (the search would be too shallow to mean anything).
    pub fn assert_sound(self, reach: &[&str]) {
        let mut failures: Vec<String> = self.violated.into_iter().map(|(_, text)| text).collect();
        failures.extend(
            self.unreached
                .iter()
                .filter(|name| reach.contains(name))
                .map(|name| format!("no run reached \"{name}\": the model explores too little")),
        );
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    }

    /// Fails unless a run violating `expected` was found (a model broken on purpose: `what`);
    /// prints that run.
    pub fn assert_caught(self, expected: &str, what: impl Debug) {
        let Some((_, text)) = self.violated.iter().find(|(name, _)| *name == expected) else {
            panic!(
                "\"{expected}\" not violated with {what:?}; violated: {:?}",
                self.violated.iter().map(|(n, _)| n).collect::<Vec<_>>()
            );
        };
        println!("{text}");
    }
}

/// Searches `model` as `search` says (random runs from `seed`), until the end or, with
/// `stop_at`, until that property is violated; prints what was explored after `label`.
pub fn explore<M>(
    model: M,
    search: Search,
    seed: u64,
    stop_at: Option<&'static str>,
    label: &str,
) -> Found
where
    M: Model + Send + Sync + 'static,
    M::State: Hash + Send + Sync + Clone + PartialEq + Debug + 'static,
    M::Action: Clone + PartialEq + Debug,
{
    let wall = WallInstant::now();
    let mut builder = model.checker();
    if let Some(name) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AllOf([name].into()));
    }
    match search {
        Search::DepthFirst => report(label, search, wall, builder.threads(1).spawn_dfs().join()),
        Search::Exhaustive(depth) => {
            let builder = builder.threads(2);
            let builder = match depth {
                Some(depth) => builder.target_max_depth(depth),
                None => builder,
            };
            report(label, search, wall, builder.spawn_bfs().join())
        }
        Search::Random { depth, states } => {
            let checker = builder
                .threads(1)
                .target_max_depth(depth)
                .target_state_count(states)
                .spawn_simulation(seed, UniformChooser)
                .join();
            report(label, search, wall, checker)
        }
    }
}

fn report<M>(label: &str, search: Search, wall: WallInstant, checker: impl Checker<M>) -> Found
where
    M: Model,
    M::State: Clone + PartialEq + Debug,
    M::Action: Clone + PartialEq + Debug,
{
    println!(
        "{label} ({search:?}): {} states explored, {} unique, max depth {}, {:.2} s",
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
        } else if discovery.is_none() {
            found.unreached.push(property.name);
        }
    }
    found
}

/// What the adversary does to a store call on its way.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// The call fails; nothing written.
    Fail,
    /// The call is lost; the caller hears `Unknown`; nothing written.
    Lose,
    /// The call is applied; its answer is lost; the caller hears `Unknown`.
    LoseAnswer,
    /// The caller hears `Unknown` (timeout) but the request is still on its way and may be
    /// applied later.
    Late,
    /// The call is applied; its answer is slow (time may pass before it arrives).
    SlowAnswer,
}

/// The faults of the models of sessions (their answers are never slow: a late request is how a
/// slow call appears).
pub const SESSION_FAULTS: [Fault; 4] = [Fault::Fail, Fault::Lose, Fault::LoseAnswer, Fault::Late];

/// A session in the store: the process start that opened it and the id its machine minted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub p: u8,
    pub generation: u8,
    pub id: SessionId,
}

/// The numbering of process starts under a session.
pub const SESSION_FIRST: u64 = 1;

impl Key {
    /// The semaphore's name of the session.
    pub fn session_key(self) -> vvm_core::semaphore::SessionKey {
        vvm_core::semaphore::SessionKey {
            incarnation: incarnation(SESSION_FIRST, self.p as usize, self.generation),
            id: self.id,
        }
    }
}

/// A session record. Revisions count per record: the machine compares only its own record's,
/// and a global counter would tell apart states that differ only in the order two processes'
/// writes took at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionRecord {
    pub key: Key,
    pub revision: u64,
    pub expires_ns: u64,
}

/// The live record of the session `key` at `now_ns`, by position.
pub fn live_session(sessions: &[SessionRecord], now_ns: u64, key: Key) -> Option<usize> {
    sessions
        .iter()
        .position(|r| r.key == key && now_ns < r.expires_ns)
}

/// The store applies a call of the session machine of `(p, generation)` atomically at `now_ns`
/// (a keepalive gives a new revision when `bump`, else keeps it): its operation, the reply, and
/// the session that a delete ended (its holdings and parties end with it).
pub fn apply_session(
    sessions: &mut Vec<SessionRecord>,
    now_ns: u64,
    (p, generation): (u8, u8),
    effect: SessionEffect,
    bump: bool,
) -> (OpId, Reply, Option<Key>) {
    let key = |id| Key { p, generation, id };
    let ours = |sessions: &[SessionRecord], id, expected: Revision| {
        live_session(sessions, now_ns, key(id)).filter(|&i| sessions[i].revision == expected.0)
    };
    match effect {
        SessionEffect::Create { op, id, ttl } => {
            if live_session(sessions, now_ns, key(id)).is_some() {
                return (op, Reply::Rejected, None);
            }
            sessions.retain(|r| r.key != key(id));
            sessions.push(SessionRecord {
                key: key(id),
                revision: 1,
                expires_ns: now_ns + nanos(ttl),
            });
            sessions.sort_by_key(|r| r.key);
            (op, Reply::Written(Revision(1)), None)
        }
        SessionEffect::KeepAlive {
            op,
            id,
            expected,
            ttl,
        } => {
            let Some(i) = ours(sessions, id, expected) else {
                return (op, Reply::Rejected, None);
            };
            let revision = if bump { expected.0 + 1 } else { expected.0 };
            let record = &mut sessions[i];
            record.revision = revision;
            record.expires_ns = now_ns + nanos(ttl);
            (op, Reply::Written(Revision(revision)), None)
        }
        SessionEffect::Delete { op, id, expected } => {
            let Some(i) = ours(sessions, id, expected) else {
                return (op, Reply::Rejected, None);
            };
            sessions.remove(i);
            (op, Reply::Deleted, Some(key(id)))
        }
        SessionEffect::Get { op, id } => {
            let found = live_session(sessions, now_ns, key(id)).map(|i| Record {
                incarnation: incarnation(SESSION_FIRST, p as usize, generation),
                revision: Revision(sessions[i].revision),
            });
            (op, Reply::Found(found), None)
        }
        other => unreachable!("not a store call: {other:?}"),
    }
}

/// A store call of a process on its way; `answered` when its caller already heard `Unknown`
/// (or is dead) and the store may still apply it later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Msg<C> {
    pub p: u8,
    pub generation: u8,
    pub call: C,
    pub answered: bool,
}

/// The request of `p` that moves next: calls of one process reach the store in order.
pub fn oldest<C>(msgs: &[Msg<C>], p: usize) -> Option<usize> {
    msgs.iter().position(|m| m.p as usize == p && !m.answered)
}

/// Whether a request still waits for the store.
pub fn waiting<C>(msgs: &[Msg<C>]) -> bool {
    msgs.iter().any(|m| !m.answered)
}

/// A store call of a model of sessions: a call of the session machine, or the model's own.
pub trait SessionCall: Copy {
    /// The session machine's call.
    fn session(effect: SessionEffect) -> Self;
    /// The session machine's call this is, if it is one.
    fn as_session(&self) -> Option<SessionEffect>;
}

/// A process's session as the runtime's session task drives it: the machine, its one timer at
/// a local instant, its kill deadline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    pub session: Session,
    pub generation: u8,
    /// The session's one timer, at a local instant.
    pub timer: Option<(TimerId, u64)>,
    /// The timer was left unfired when it was due (a late-timer fault).
    pub stalled: bool,
    /// The session's kill deadline, local.
    pub killer: Option<u64>,
}

/// What one event did to a session, beside its calls, timer and killer.
pub struct Handled {
    /// The session's one `Lost`.
    pub lost: bool,
}

impl Task {
    /// A closed session of the `generation`-th start of process `p`.
    pub fn new(lease: LeaseConfig, p: usize, generation: u8) -> Self {
        Task {
            session: Session::new(lease, incarnation(SESSION_FIRST, p, generation)),
            generation,
            timer: None,
            stalled: false,
            killer: None,
        }
    }

    /// Whether its timer is due at the local reading `local_ns`.
    pub fn timer_due(&self, local_ns: u64) -> bool {
        self.timer.is_some_and(|(_, at)| local_ns >= at)
    }

    /// Whether services may run at the local reading `local_ns`: the kill deadline armed and not
    /// reached.
    pub fn alive(&self, local_ns: u64) -> bool {
        self.killer.is_some_and(|at| local_ns < at)
    }

    /// Whether the process may open a session: closed, or lost with nothing attached.
    pub fn openable(&self) -> bool {
        let session = &self.session;
        session.is_closed() || (session.is_lost() && session.holdings() == 0)
    }

    /// Runs one event at the local instant `now` through the session of process `p`: its calls
    /// join `msgs`, its timer and killer are kept.
    pub fn handle<C: SessionCall>(
        &mut self,
        msgs: &mut Vec<Msg<C>>,
        p: usize,
        now: Instant,
        event: impl FnOnce(Instant) -> SessionEvent,
    ) -> Handled {
        let mut out = SessionEffects::new();
        self.session.handle(&event(now), &mut out);
        let generation = self.generation;
        let mut lost = false;
        for effect in out.as_slice().iter().copied() {
            match effect {
                SessionEffect::Create { .. }
                | SessionEffect::KeepAlive { .. }
                | SessionEffect::Delete { .. }
                | SessionEffect::Get { .. } => {
                    let in_flight = msgs.iter().any(|m| {
                        m.p as usize == p
                            && m.generation == generation
                            && !m.answered
                            && m.call.as_session().is_some()
                    });
                    assert!(!in_flight, "a second session call in flight: {effect:?}");
                    msgs.push(Msg {
                        p: p as u8,
                        generation,
                        call: C::session(effect),
                        answered: false,
                    });
                }
                SessionEffect::SetTimer { timer, at } => {
                    self.timer = Some((timer, at.as_nanos()));
                    self.stalled = false;
                }
                SessionEffect::ArmKiller { at } => self.killer = Some(at.as_nanos()),
                SessionEffect::DisarmKiller => self.killer = None,
                SessionEffect::Lost { .. } => lost = true,
                _ => {}
            }
        }
        // A firing the machine no longer waits for changes nothing: forget it.
        if self.timer.map(|(id, _)| id) != awaited_timer(&self.session) {
            self.timer = None;
            self.stalled = false;
        }
        Handled { lost }
    }

    /// Attaches `holding` at `now`; false when the session refuses (past the deadline).
    pub fn attach(&mut self, now: Instant, holding: vvm_core::HoldingId) -> bool {
        let mut out = SessionEffects::new();
        self.session
            .handle(&SessionEvent::Attach { now, holding }, &mut out);
        out.as_slice() == [SessionEffect::Attached { holding }]
    }

    /// Detaches `holding` at `now`.
    pub fn detach(&mut self, now: Instant, holding: vvm_core::HoldingId) {
        let mut out = SessionEffects::new();
        self.session
            .handle(&SessionEvent::Detach { now, holding }, &mut out);
        assert!(out.is_empty(), "detach is silent: {out:?}");
    }
}

/// The timer the session machine waits for, if any: a firing of any other is ignored (stale).
pub fn awaited_timer(session: &Session) -> Option<TimerId> {
    match *session.state() {
        SessionState::Alive { timer, .. } | SessionState::RetryWait { timer, .. } => Some(timer),
        _ => None,
    }
}

/// The operation a store call of the session machine names its answer with.
pub fn session_op(effect: &SessionEffect) -> OpId {
    match *effect {
        SessionEffect::Create { op, .. }
        | SessionEffect::KeepAlive { op, .. }
        | SessionEffect::Delete { op, .. }
        | SessionEffect::Get { op, .. } => op,
        ref other => unreachable!("not a store call: {other:?}"),
    }
}

/// A model of a store that calls reach on their way, for the faults to hit them.
pub trait Calls {
    type World;
    type Call: SessionCall;
    type Answer;
    /// The calls on their way.
    fn msgs(world: &Self::World) -> &Vec<Msg<Self::Call>>;
    /// The calls on their way, to change.
    fn msgs_mut(world: &mut Self::World) -> &mut Vec<Msg<Self::Call>>;
    /// The store applies `msg` atomically now.
    fn apply(&self, world: &mut Self::World, msg: &Msg<Self::Call>) -> Self::Answer;
    /// The answer to `msg` reaches its caller, if it still waits for it.
    fn answer(&self, world: &mut Self::World, msg: &Msg<Self::Call>, answer: Self::Answer);
    /// What the caller hears when `call` failed and wrote nothing.
    fn failed(call: &Self::Call) -> Self::Answer;
    /// What the caller hears instead of `answer` when the outcome is unknown.
    fn unknown(answer: Self::Answer) -> Self::Answer;
}

/// The request `msgs[i]` arrives: applied, its answer handled at once.
pub fn deliver<S: Calls>(store: &S, world: &mut S::World, i: usize) {
    let msg = S::msgs_mut(world).remove(i);
    let answer = store.apply(world, &msg);
    store.answer(world, &msg, answer);
}

/// `fault` hits the request `msgs[i]` (not [`Fault::SlowAnswer`]: the models of sessions have
/// none).
pub fn inject<S: Calls>(store: &S, world: &mut S::World, i: usize, fault: Fault) {
    let msg = S::msgs_mut(world).remove(i);
    let nothing = S::failed(&msg.call);
    match fault {
        Fault::Fail => store.answer(world, &msg, nothing),
        Fault::Lose => store.answer(world, &msg, S::unknown(nothing)),
        Fault::LoseAnswer => {
            let answer = store.apply(world, &msg);
            store.answer(world, &msg, S::unknown(answer));
        }
        Fault::Late => {
            S::msgs_mut(world).push(Msg {
                answered: true,
                ..msg
            });
            store.answer(world, &msg, S::unknown(nothing));
        }
        Fault::SlowAnswer => unreachable!("no slow answers in this model"),
    }
}

/// No bound on a budget.
pub const ANY: u8 = u8::MAX;

/// What the adversary may spend per run on a model of sessions.
#[derive(Clone, Copy, Debug)]
pub struct Allowance {
    /// Failed, lost or late store calls.
    pub faults: u8,
    /// Which faults.
    pub fault_kinds: &'static [Fault],
    /// Whether faults hit keepalives only (else any call).
    pub keepalives_only: bool,
    /// Crashes (SIGKILL, restart as a new incarnation).
    pub crashes: u8,
    /// Closes asked of a session.
    pub closes: u8,
    /// Due timers left unfired while time moves on (they fire at any later instant); [`ANY`]:
    /// as many as wished.
    pub late_timers: u8,
}

/// What the adversary spent so far in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Spent {
    pub faults: u8,
    pub crashes: u8,
    pub closes: u8,
    pub late_timers: u8,
}

/// A step every model of processes under a session has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Request `msgs[i]` arrives: applied by the store, its answer handled at once (unless its
    /// caller gave up on it).
    Deliver(usize),
    /// A fault hits the request `msgs[i]`.
    Fault(usize, Fault),
    /// The due timer of process `p` fires.
    FireTimer(usize),
    /// Process `p` opens a session (its machine closed, or lost with nothing attached).
    Open(usize),
    /// Process `p` asks its session to close.
    Close(usize),
    Crash(usize),
    /// True time moves to the next instant where something is due; processes past their kill
    /// deadline die and restart.
    Advance,
}

/// A model of processes that each run a [`Task`], on a store of session records and more.
pub trait Sessions: Calls + Sized {
    /// How many processes.
    fn processes(&self) -> usize;
    /// What the adversary may spend.
    fn allowance(&self) -> Allowance;
    /// What it spent.
    fn spent(world: &Self::World) -> Spent;
    /// What it spent, to spend more.
    fn spend(world: &mut Self::World) -> &mut Spent;
    /// The session task of process `p`.
    fn task(world: &Self::World, p: usize) -> &Task;
    /// The session task of process `p`, to change.
    fn task_mut(world: &mut Self::World, p: usize) -> &mut Task;
    /// True time now.
    fn now_ns(world: &Self::World) -> u64;
    /// Moves true time.
    fn set_now_ns(world: &mut Self::World, now_ns: u64);
    /// The local reading of `p`'s clock at true time `true_ns`.
    fn local(p: usize, true_ns: u64) -> u64;
    /// Whether killers fire (`false` only in a model broken on purpose).
    fn killer_works(&self) -> bool;
    /// Starts process `p` as its `generation`-th incarnation, which opens a session at once.
    fn start(&self, world: &mut Self::World, p: usize, generation: u8);
    /// Runs one event through process `p`'s session and performs the effects.
    fn handle(
        &self,
        world: &mut Self::World,
        p: usize,
        event: impl FnOnce(Instant) -> SessionEvent,
    );
    /// The next instant after now at which something is due.
    fn next_instant(&self, world: &Self::World) -> Option<u64>;
    /// Process `p` is about to be killed at its deadline (for what the model observes).
    fn killed(world: &mut Self::World, p: usize);
    /// Removes what expired by now.
    fn prune(world: &mut Self::World);
}

/// The deliveries and faults the adversary may choose among: the oldest request of each
/// process, hit by a fault while the budget lasts (keepalives only, if so limited); and any
/// request whose caller gave up on it.
pub fn deliveries<M: Sessions>(model: &M, world: &M::World, actions: &mut Vec<impl From<Step>>) {
    let allowance = model.allowance();
    let msgs = M::msgs(world);
    let faults_left = M::spent(world).faults < allowance.faults;
    for p in 0..model.processes() {
        if let Some(i) = oldest(msgs, p) {
            actions.push(Step::Deliver(i).into());
            let keepalive = matches!(
                msgs[i].call.as_session(),
                Some(SessionEffect::KeepAlive { .. })
            );
            if faults_left && (keepalive || !allowance.keepalives_only) {
                let kinds = allowance.fault_kinds.iter();
                actions.extend(kinds.map(|&kind| Step::Fault(i, kind).into()));
            }
        }
    }
    for (i, m) in msgs.iter().enumerate() {
        if m.answered {
            actions.push(Step::Deliver(i).into());
        }
    }
}

/// Whether the timer of process `p` is due now.
pub fn timer_due<M: Sessions>(world: &M::World, p: usize) -> bool {
    M::task(world, p).timer_due(M::local(p, M::now_ns(world)))
}

/// The step of process `p`'s timer, if it is due.
pub fn timer_steps<M: Sessions>(world: &M::World, p: usize, actions: &mut Vec<impl From<Step>>) {
    if timer_due::<M>(world, p) {
        actions.push(Step::FireTimer(p).into());
    }
}

/// The steps of process `p`'s session as a whole: opened, closed (while the budget lasts and
/// nothing is attached), crashed (while the budget lasts).
pub fn session_steps<M: Sessions>(
    model: &M,
    world: &M::World,
    p: usize,
    actions: &mut Vec<impl From<Step>>,
) {
    let (allowance, spent) = (model.allowance(), M::spent(world));
    let task = M::task(world, p);
    if task.openable() {
        actions.push(Step::Open(p).into());
    }
    let session = &task.session;
    if spent.closes < allowance.closes && !session.is_closed() && session.holdings() == 0 {
        actions.push(Step::Close(p).into());
    }
    if spent.crashes < allowance.crashes {
        actions.push(Step::Crash(p).into());
    }
}

/// Time may move on once every request has been answered (stragglers aside) and something is
/// due; due timers fire before, unless the budget lets them slip.
pub fn advance_steps<M: Sessions>(model: &M, world: &M::World, actions: &mut Vec<impl From<Step>>) {
    if waiting(M::msgs(world)) || model.next_instant(world).is_none() {
        return;
    }
    let slipping = (0..model.processes())
        .filter(|&p| timer_due::<M>(world, p) && !M::task(world, p).stalled)
        .count();
    let late_timers = model.allowance().late_timers;
    let allowed = late_timers == ANY
        || usize::from(M::spent(world).late_timers) + slipping <= usize::from(late_timers);
    if allowed {
        actions.push(Step::Advance.into());
    }
}

/// Takes `step`; `None` when it leads nowhere.
pub fn take<M: Sessions>(model: &M, world: &mut M::World, step: Step) -> Option<()> {
    match step {
        Step::Deliver(i) => deliver(model, world, i),
        Step::Fault(i, fault) => {
            M::spend(world).faults += 1;
            inject(model, world, i, fault);
        }
        Step::FireTimer(p) => {
            let task = M::task_mut(world, p);
            let (timer, _) = task.timer.take()?;
            task.stalled = false;
            model.handle(world, p, |now| SessionEvent::Timer { now, timer });
        }
        Step::Open(p) => model.handle(world, p, |now| SessionEvent::Open { now }),
        Step::Close(p) => {
            M::spend(world).closes += 1;
            model.handle(world, p, |now| SessionEvent::Close { now });
        }
        Step::Crash(p) => {
            M::spend(world).crashes += 1;
            let generation = M::task(world, p).generation + 1;
            model.start(world, p, generation);
        }
        Step::Advance => {
            if model.allowance().late_timers != ANY {
                for p in 0..model.processes() {
                    if timer_due::<M>(world, p) && !M::task(world, p).stalled {
                        M::task_mut(world, p).stalled = true;
                        M::spend(world).late_timers += 1;
                    }
                }
            }
            let now_ns = model.next_instant(world)?;
            M::set_now_ns(world, now_ns);
            for p in 0..model.processes() {
                let local_ns = M::local(p, now_ns);
                let deadline = M::task(world, p).killer;
                if model.killer_works() && deadline.is_some_and(|at| local_ns >= at) {
                    // Killed at its deadline with everything it runs; restarted.
                    M::killed(world, p);
                    let generation = M::task(world, p).generation + 1;
                    model.start(world, p, generation);
                }
            }
            M::prune(world);
        }
    }
    Some(())
}

/// A process's calls on their way outlive it: its new incarnation waits for none of them.
pub fn orphan<C>(msgs: &mut [Msg<C>], p: usize) {
    for m in msgs.iter_mut().filter(|m| m.p as usize == p) {
        m.answered = true;
    }
}
