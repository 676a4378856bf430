//! A deterministic simulator of processes that each hold several slots under one session.
//!
//! Every process runs the real [`Session`] machine and, per slot, the life of a holding as the
//! runtime drives it (`runtime/src/session/`): attached to the alive session (S29) before its
//! acquire is sent; the acquire sent again on an unknown outcome, up to [`ACQUIRE_SENDS_MAX`]
//! sends; its services started with the holding's revision as fencing token (**acting**); on
//! the session's one `Lost`, every holding's services told to stop — still acting until they
//! have — and only then detached (S31); a new session opened once nothing is attached. The
//! session's one store call at a time runs under the store-call timeout (no answer in time is
//! an unknown outcome), its one timer, and its one kill deadline, on which the killer ends the
//! process with everything it runs, even while it is paused.
//!
//! The store ([`store`]) keeps session records with a TTL judged by true time and, per slot, at
//! most one holding, live exactly while its session's record is; an acquire is one transaction.
//! Its keepalives keep the record's revision or give a new one ([`KeepAlives`], drawn per seed).
//!
//! The faults are the leadership simulator's ([`Params::random`]): store errors, unknown outcomes
//! (committed or not), latency, hung calls, store outages, pauses up to `3·L` (also right after
//! a call), crashes with restart, graceful stops, clock-rate error up to 10 %; and services slow
//! to stop, up to `2·L`: only the killer bounds them.
//!
//! The [`Oracle`] judges what a user sees: services acting on a slot. No two processes act on
//! one slot at the same instant, and fencing tokens strictly increase per slot; so once a
//! session is lost, no successor acts on any of its holdings before all their services stopped
//! or its killer fired.
//!
//! [`Params::random`]: crate::params::Params::random

mod holdings;
mod params;
pub mod store;

use std::collections::{HashSet, VecDeque};

use vvm_core::{
    FencingToken, Incarnation, Instant, LeaseConfig, OpId, Reply, Session, SessionEffect,
    SessionEffects, SessionEvent, SessionId, Slot, TimerId,
};

use crate::clock::LocalClock;
use crate::oracle::{Interval, Oracle, ProcessId, Violation};
use crate::params::{Fate, Outcome};
use crate::queue::{EventQueue, Ticket};
use crate::rng::Rng;
use crate::store::Writer;
use store::{Acquired, Answer, Call, SessionStoreModel};

pub use params::{Rule, SessionParams, SessionStats};
pub use store::KeepAlives;

/// Sends of one acquire before an unknown outcome counts as no holding: the runtime's
/// `ACQUIRE_SENDS_MAX`.
pub const ACQUIRE_SENDS_MAX: u8 = 3;

/// An input of a process, before it carries a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    /// Open a session (the runtime's `SessionHandle::open`).
    Open,
    /// Acquire `slot` under the session.
    Acquire(Slot),
    Timer(TimerId),
    Reply(OpId, Reply),
    Acquired(Slot, u64, Acquired),
    /// The services of `slot` stopped.
    Stopped(Slot),
    /// The host asks for a graceful stop.
    Stop,
}

enum Ev {
    Input(ProcessId, Input),
    /// A store call reaches the store; with the time and place of its caller's timeout when
    /// that is not queued yet (it is only when the answer does not come first).
    Arrive(ProcessId, Writer, Call, Fate, Option<(u64, Ticket)>),
    Kill(ProcessId, u64),
    Resume(ProcessId),
    Start(u32),
    RandomPause(ProcessId),
    RandomCrash(ProcessId),
    RandomStop(ProcessId),
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

/// One running process.
struct Live {
    id: ProcessId,
    session: Session,
    writer: Writer,
    clock: LocalClock,
    paused_until_ns: Option<u64>,
    inbox: VecDeque<Input>,
    timer: Option<TimerId>,
    /// The session's one call in flight.
    pending: Option<OpId>,
    /// Local kill deadline and the number of the arming that set it.
    killer: Option<(u64, u64)>,
    armings: u64,
    holds: Vec<Hold>,
    stopping: bool,
}

impl Live {
    fn acting(&self) -> bool {
        self.holds.iter().any(|h| h.token().is_some())
    }
}

/// One position: a process that restarts as new incarnations.
struct Place {
    generation: u32,
    live: Option<Live>,
}

/// The simulation of sessions.
pub struct SessionSim {
    params: SessionParams,
    lease: LeaseConfig,
    rng: Rng,
    now_ns: u64,
    queue: EventQueue<Ev>,
    store: SessionStoreModel,
    places: Vec<Place>,
    oracle: Oracle,
    trace: Option<Vec<String>>,
    outages: Vec<(u64, u64, Outcome)>,
    incarnations: HashSet<u64>,
    acquire_ops: u64,
    last_actor: Vec<Option<ProcessId>>,
    stats: SessionStats,
}

impl SessionSim {
    /// A simulation of `params` whose every random choice comes from `seed`.
    pub fn new(seed: u64, params: SessionParams) -> Self {
        let base = &params.base;
        let lease = LeaseConfig::new(base.lease).expect("simulation lease is valid");
        let mut store = SessionStoreModel::new(base.slots, params.keepalives);
        if params.rule == Rule::HoldingsExpireAlone {
            store.expire_holdings_alone(base.lease_ns());
        }
        let mut sim = SessionSim {
            lease,
            rng: Rng::new(seed),
            now_ns: 0,
            queue: EventQueue::default(),
            store,
            places: (0..base.processes)
                .map(|_| Place {
                    generation: 0,
                    live: None,
                })
                .collect(),
            oracle: Oracle::default(),
            trace: None,
            outages: Vec::new(),
            incarnations: HashSet::new(),
            acquire_ops: 0,
            last_actor: vec![None; base.slots as usize],
            stats: SessionStats::default(),
            params,
        };
        for index in 0..sim.params.base.processes {
            let at_ns = sim.rng.between(0, sim.params.base.start_spread_ns);
            sim.schedule(at_ns, Ev::Start(index));
        }
        let faults = sim.params.base.faults.clone();
        if faults.outage_gap_ns > 0 {
            let mut at_ns = sim.rng.between(0, 2 * faults.outage_gap_ns);
            while at_ns < sim.params.base.duration_ns {
                let until_ns = at_ns + sim.rng.between(0, faults.outage_max_ns);
                let outcome = if sim.rng.chance(500_000) {
                    Outcome::Fail
                } else {
                    Outcome::Hang { commit: false }
                };
                sim.outages.push((at_ns, until_ns, outcome));
                at_ns = until_ns + sim.rng.between(0, 2 * faults.outage_gap_ns);
            }
        }
        sim
    }

    /// Keeps a line of everything from now on.
    pub fn keep_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// What happened so far, one line per note, in true-time order (empty unless
    /// [`keep_trace`](Self::keep_trace) was called).
    pub fn trace(&self) -> &[String] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// The parameters of the run.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Counts so far.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Runs for the whole duration of the parameters.
    pub fn run(&mut self) {
        let until_ns = self.params.base.duration_ns;
        while self
            .queue
            .next_at_ns()
            .is_some_and(|at_ns| at_ns <= until_ns)
        {
            let (at_ns, ev) = self.queue.pop().expect("peeked");
            debug_assert!(at_ns >= self.now_ns, "time ran backwards");
            self.now_ns = at_ns;
            self.dispatch(ev);
        }
        self.now_ns = self.now_ns.max(until_ns);
    }

    /// Every violation so far, and every interval of acting recorded (open ones closed now).
    pub fn check(&self) -> (Vec<Violation>, Vec<Interval>) {
        let mut oracle = self.oracle.clone();
        let intervals = oracle.clone().finish(self.now_ns);
        (oracle.check(self.now_ns), intervals)
    }

    fn schedule(&mut self, at_ns: u64, ev: Ev) {
        let ticket = self.queue.reserve();
        self.schedule_reserved(at_ns, ticket, ev);
    }

    fn schedule_reserved(&mut self, at_ns: u64, ticket: Ticket, ev: Ev) {
        // Killers fire before anything else happening at the same instant.
        let rank = u8::from(!matches!(ev, Ev::Kill(..)));
        self.queue
            .push_reserved(at_ns.max(self.now_ns), rank, ticket, ev);
    }

    fn note(&mut self, id: ProcessId, text: impl FnOnce() -> String) {
        if let Some(trace) = self.trace.as_mut() {
            let at_ms = self.now_ns as f64 / 1e6;
            trace.push(format!("{at_ms:>12.3} ms {:>6} {}", id.to_string(), text()));
        }
    }

    fn live_mut(&mut self, id: ProcessId) -> Option<&mut Live> {
        self.places[id.index as usize]
            .live
            .as_mut()
            .filter(|live| live.id == id)
    }

    fn live(&mut self, id: ProcessId) -> &mut Live {
        self.live_mut(id).expect("running")
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Input(id, input) => self.deliver(id, input),
            Ev::Arrive(id, writer, call, fate, timeout) => {
                self.arrive(id, writer, call, fate, timeout)
            }
            Ev::Kill(id, arming) => {
                let fires = self
                    .live_mut(id)
                    .is_some_and(|live| live.killer.is_some_and(|(_, n)| n == arming));
                if fires && self.params.rule != Rule::KillerIgnored {
                    self.die(id, true);
                }
            }
            Ev::Resume(id) => self.resume(id),
            Ev::Start(index) => self.start(index),
            Ev::RandomPause(id) => {
                if self
                    .live_mut(id)
                    .is_some_and(|l| l.paused_until_ns.is_none())
                {
                    let duration_ns = self.pause_duration();
                    self.pause(id, duration_ns);
                }
                let gap_ns = self.params.base.faults.pause_gap_ns;
                self.random_next(id, gap_ns, Ev::RandomPause(id));
            }
            Ev::RandomCrash(id) => {
                if self.live_mut(id).is_some() {
                    self.die(id, false);
                }
            }
            Ev::RandomStop(id) => self.deliver(id, Input::Stop),
        }
    }

    /// A pause length: mostly short, often near the kill threshold or the lease where the
    /// protocol's margins are thinnest, sometimes as long as allowed.
    fn pause_duration(&mut self) -> u64 {
        let l = self.params.base.lease_ns();
        let max = self.params.base.faults.pause_max_ns;
        let duration_ns = match self.rng.below(10) {
            0..=3 => self.rng.between(0, l / 20),
            4..=6 => self.rng.between(l * 13 / 20, l * 19 / 20),
            7 | 8 => self.rng.between(l * 9 / 10, l * 6 / 5),
            _ => self.rng.between(0, max),
        };
        duration_ns.min(max)
    }

    fn pause(&mut self, id: ProcessId, duration_ns: u64) {
        let now_ns = self.now_ns;
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let until_ns = now_ns + duration_ns;
        let until_ns = live.paused_until_ns.map_or(until_ns, |u| u.max(until_ns));
        live.paused_until_ns = Some(until_ns);
        self.note(id, || {
            format!("paused until {:.3} ms", until_ns as f64 / 1e6)
        });
        self.schedule(until_ns, Ev::Resume(id));
    }

    fn random_next(&mut self, id: ProcessId, gap_ns: u64, ev: Ev) {
        if gap_ns > 0 && self.live_mut(id).is_some() {
            let at_ns = self.now_ns + self.rng.between(1, 2 * gap_ns);
            self.schedule(at_ns, ev);
        }
    }

    fn start(&mut self, index: u32) {
        let place = &mut self.places[index as usize];
        if place.live.is_some() {
            return;
        }
        let id = ProcessId {
            index,
            generation: place.generation,
        };
        place.generation += 1;
        let skew = self.params.base.faults.skew_ppm_max;
        let rate_ppm = if self.rng.chance(100_000) {
            // The extremes are the interesting part: a tenth of the starts sit on them.
            if self.rng.chance(500_000) {
                skew as i32
            } else {
                -(skew as i32)
            }
        } else {
            self.rng.signed(skew) as i32
        };
        let mut incarnation = self.rng.next_u64();
        while !self.incarnations.insert(incarnation) {
            incarnation = self.rng.next_u64();
        }
        let incarnation = Incarnation(incarnation);
        let origin_local_ns = self.rng.between(0, 1 << 40);
        let slots = self.params.base.slots as usize;
        self.places[index as usize].live = Some(Live {
            id,
            session: Session::new(self.lease, incarnation),
            writer: Writer {
                address: index,
                incarnation,
            },
            clock: LocalClock::new(self.now_ns, origin_local_ns, rate_ppm),
            paused_until_ns: None,
            inbox: VecDeque::new(),
            timer: None,
            pending: None,
            killer: None,
            armings: 0,
            holds: vec![Hold::Idle; slots],
            stopping: false,
        });
        self.stats.starts += 1;
        self.note(id, || {
            format!("started {incarnation:?}, clock rate error {rate_ppm} ppm")
        });
        self.deliver(id, Input::Open);
        let faults = self.params.base.faults.clone();
        self.random_next(id, faults.pause_gap_ns, Ev::RandomPause(id));
        self.random_next(id, faults.crash_gap_ns, Ev::RandomCrash(id));
        self.random_next(id, faults.stop_gap_ns, Ev::RandomStop(id));
    }

    /// The process ends with everything it runs: its killer fired, or it crashed.
    fn die(&mut self, id: ProcessId, killer: bool) {
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let acting = live.acting();
        self.places[id.index as usize].live = None;
        self.oracle.stop(id, self.now_ns);
        if killer {
            self.stats.killed += 1;
            self.stats.killed_while_acting += u64::from(acting);
        } else {
            self.stats.crashed += 1;
        }
        self.note(id, || {
            format!("died: {}", if killer { "killer" } else { "crash" })
        });
        self.restart_later(id.index);
    }

    fn restart_later(&mut self, index: u32) {
        let at_ns = self.now_ns + self.rng.between(0, self.params.base.restart_delay_max_ns);
        self.schedule(at_ns, Ev::Start(index));
    }

    /// An input reaches a process: handled now, or queued while it is paused.
    fn deliver(&mut self, id: ProcessId, input: Input) {
        let Some(live) = self.live_mut(id) else {
            return;
        };
        if live.paused_until_ns.is_some() {
            live.inbox.push_back(input);
            return;
        }
        self.handle(id, input);
    }

    fn resume(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        let Some(live) = self.live_mut(id) else {
            return;
        };
        if live.paused_until_ns.is_some_and(|until| until > now_ns) {
            return; // a longer pause was asked meanwhile
        }
        live.paused_until_ns = None;
        while let Some(input) = self.live_mut(id).and_then(|live| live.inbox.pop_front()) {
            self.handle(id, input);
        }
    }

    fn local_now(&mut self, id: ProcessId) -> Instant {
        let now_ns = self.now_ns;
        Instant::from_nanos(self.live(id).clock.local(now_ns))
    }

    /// Runs one input through the process, as the runtime's session task and holdings do.
    fn handle(&mut self, id: ProcessId, input: Input) {
        if self.live_mut(id).is_none() {
            return;
        }
        self.stats.events += 1;
        match input {
            Input::Open => {
                let live = self.live(id);
                let session = &live.session;
                let openable =
                    session.is_closed() || (session.is_lost() && session.holdings() == 0);
                if openable && !live.stopping {
                    self.session_event(id, |now| SessionEvent::Open { now });
                }
            }
            Input::Timer(timer) => {
                let live = self.live(id);
                if live.timer == Some(timer) {
                    live.timer = None;
                    self.session_event(id, |now| SessionEvent::Timer { now, timer });
                }
            }
            Input::Reply(op, reply) => {
                // The first of the reply and the timeout wins; the other is dropped.
                let live = self.live(id);
                if live.pending == Some(op) {
                    live.pending = None;
                    self.session_event(id, |now| SessionEvent::Reply { now, op, reply });
                }
            }
            Input::Acquire(slot) => self.acquire(id, slot),
            Input::Acquired(slot, op, acquired) => self.acquired(id, slot, op, acquired),
            Input::Stopped(slot) => {
                let live = self.live(id);
                let hold = &mut live.holds[slot.0 as usize - 1];
                let Hold::Stopping(_, attached) = *hold else {
                    return;
                };
                *hold = Hold::Idle;
                self.set_acting(id, slot, None);
                if attached {
                    self.detach(id, slot);
                }
                self.after_detach(id);
            }
            Input::Stop => {
                let live = self.live(id);
                if live.stopping {
                    return;
                }
                live.stopping = true;
                self.note(id, || "graceful stop asked".to_owned());
                for index in 0..self.live(id).holds.len() {
                    if let Hold::Running(token) = self.live(id).holds[index] {
                        self.stop_services(id, token, true);
                    }
                }
                self.after_detach(id);
            }
        }
        self.check_killer(id);
    }

    /// Runs one event through the session machine and executes its effects.
    fn session_event(&mut self, id: ProcessId, event: impl FnOnce(Instant) -> SessionEvent) {
        let now = self.local_now(id);
        let event = event(now);
        let mut out = SessionEffects::new();
        self.live(id).session.handle(&event, &mut out);
        self.note(id, || format!("{event:?} -> {:?}", out.as_slice()));
        for effect in out.iter().copied() {
            self.execute(id, effect);
            if self.live_mut(id).is_none() {
                return;
            }
        }
    }

    fn execute(&mut self, id: ProcessId, effect: SessionEffect) {
        let now_ns = self.now_ns;
        match effect {
            SessionEffect::Create { op, .. }
            | SessionEffect::KeepAlive { op, .. }
            | SessionEffect::Delete { op, .. }
            | SessionEffect::Get { op, .. } => {
                let live = self.live(id);
                assert!(live.pending.is_none(), "a second session call in flight");
                live.pending = Some(op);
                self.send(id, Call::Session(effect));
            }
            SessionEffect::SetTimer { timer, at } => {
                let live = self.live(id);
                live.timer = Some(timer);
                let at_ns = live.clock.true_at(at.as_nanos());
                self.schedule(at_ns, Ev::Input(id, Input::Timer(timer)));
            }
            SessionEffect::ArmKiller { at } => {
                let live = self.live(id);
                live.armings += 1;
                let arming = live.armings;
                live.killer = Some((at.as_nanos(), arming));
                let at_ns = live.clock.true_at(at.as_nanos());
                self.schedule(at_ns, Ev::Kill(id, arming));
            }
            SessionEffect::DisarmKiller => {
                let live = self.live(id);
                live.killer = None;
                if live.acting() {
                    let text = format!("{id} disarmed its killer while services act");
                    self.oracle.flag(id, now_ns, text);
                }
            }
            SessionEffect::Opened { .. } => {
                self.stats.opened += 1;
                for slot in 1..=self.params.base.slots {
                    self.schedule_acquire(id, Slot(slot), true);
                }
            }
            SessionEffect::NotOpened { .. } => self.schedule_open(id),
            SessionEffect::KeptAlive { .. } => self.stats.keepalives += 1,
            SessionEffect::Lost { .. } => self.lost(id),
            SessionEffect::Closed { .. } => {
                if self.live(id).stopping {
                    self.places[id.index as usize].live = None;
                    self.oracle.stop(id, now_ns);
                    self.note(id, || "exited".to_owned());
                    self.restart_later(id.index);
                }
            }
            SessionEffect::CloseRefused { .. }
            | SessionEffect::Attached { .. }
            | SessionEffect::AttachRefused { .. } => {}
        }
    }

    /// Checks after every input: while the session is alive its killer is armed at the
    /// machine's deadline; services act only under an armed killer; a killer whose deadline
    /// has passed fires at once.
    fn check_killer(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let killer = live.killer;
        if let Some(alive) = live.session.liveness() {
            if killer.map(|(at, _)| at) != Some(alive.deadline.as_nanos()) {
                let text = format!(
                    "{id}'s session is alive with deadline {:?} but its killer is armed at \
                     {killer:?}",
                    alive.deadline
                );
                self.oracle.flag(id, now_ns, text);
            }
        }
        let live = self.live(id);
        if live.acting() && killer.is_none() {
            let text = format!("{id}'s services act with no killer armed");
            self.oracle.flag(id, now_ns, text);
        }
        let live = self.live(id);
        let overdue = live
            .killer
            .is_some_and(|(at, _)| live.clock.local(now_ns) >= at);
        if overdue && self.params.rule != Rule::KillerIgnored {
            self.die(id, true);
        }
    }

    /// A holding handed to services must come before the kill deadline.
    fn check_token_fresh(&mut self, id: ProcessId, token: FencingToken) {
        let now_ns = self.now_ns;
        let live = self.live(id);
        let now_local = live.clock.local(now_ns);
        let killer = live.killer;
        if killer.is_none_or(|(deadline, _)| now_local >= deadline)
            && self.params.rule != Rule::KillerIgnored
        {
            let text = format!(
                "{id} handed {token:?} to services at local {now_local} ns, at or after its \
                 kill deadline {killer:?}"
            );
            self.oracle.flag_late_token(id, now_ns, text);
        }
    }

    /// Sends a store call of `id` under the store-call timeout.
    fn send(&mut self, id: ProcessId, call: Call) {
        self.stats.store_calls += 1;
        let now_ns = self.now_ns;
        let fate = Fate::draw(&self.params.base.faults, &mut self.rng);
        let timeout_ns = self.lease.store_timeout().as_nanos() as u64;
        let live = self.live(id);
        let writer = live.writer;
        let timeout_at_ns = live.clock.true_at(live.clock.local(now_ns) + timeout_ns);
        // The timeout waits in the call until the call reaches the store, and is queued only if
        // the answer does not come first.
        let arrive_ns = now_ns + fate.to_store_ns;
        let arrival = self.queue.reserve();
        let timeout = self.queue.reserve();
        let deferred = (arrive_ns <= timeout_at_ns).then_some((timeout_at_ns, timeout));
        self.schedule_reserved(
            arrive_ns,
            arrival,
            Ev::Arrive(id, writer, call, fate, deferred),
        );
        if deferred.is_none() {
            self.schedule_reserved(timeout_at_ns, timeout, Ev::Input(id, unknown(call)));
        }
        if self.rng.chance(self.params.base.faults.pause_on_call_ppm) {
            let duration_ns = self.pause_duration();
            self.pause(id, duration_ns);
        }
    }

    /// A store call reaches the store.
    fn arrive(
        &mut self,
        id: ProcessId,
        writer: Writer,
        call: Call,
        fate: Fate,
        timeout: Option<(u64, Ticket)>,
    ) {
        let now_ns = self.now_ns;
        let mut outcome = fate.outcome;
        if let Some(&(_, _, down)) = self
            .outages
            .iter()
            .find(|&&(from, until, _)| (from..until).contains(&now_ns))
        {
            outcome = down;
        }
        let apply = matches!(
            outcome,
            Outcome::Apply | Outcome::UnknownCommitted | Outcome::Hang { commit: true }
        );
        let applied = apply.then(|| self.store.apply(&call, writer, now_ns));
        self.note(id, || {
            format!("store got {call:?}: {outcome:?}, answer {applied:?}")
        });
        let answer = match outcome {
            Outcome::Apply => applied,
            Outcome::Fail => Some(match call {
                Call::Session(_) => Answer::Session(Reply::Failed),
                Call::Acquire { .. } => Answer::Acquire(Acquired::Failed),
            }),
            Outcome::UnknownLost | Outcome::UnknownCommitted => Some(match call {
                Call::Session(_) => Answer::Session(Reply::Unknown),
                Call::Acquire { .. } => Answer::Acquire(Acquired::Unknown),
            }),
            Outcome::Hang { .. } => None,
        };
        if let Some((timeout_ns, ticket)) = timeout {
            if answer.is_none() || now_ns + fate.back_ns >= timeout_ns {
                self.schedule_reserved(timeout_ns, ticket, Ev::Input(id, unknown(call)));
            }
        }
        let input = match (call, answer) {
            (_, None) => return,
            (Call::Session(effect), Some(Answer::Session(reply))) => {
                Input::Reply(session_op(&effect), reply)
            }
            (Call::Acquire { op, slot, .. }, Some(Answer::Acquire(acquired))) => {
                Input::Acquired(slot, op, acquired)
            }
            (call, Some(answer)) => panic!("{answer:?} does not answer {call:?}"),
        };
        self.schedule(now_ns + fate.back_ns, Ev::Input(id, input));
    }
}

/// What the caller of `call` hears when its timeout comes first.
fn unknown(call: Call) -> Input {
    match call {
        Call::Session(effect) => Input::Reply(session_op(&effect), Reply::Unknown),
        Call::Acquire { op, slot, .. } => Input::Acquired(slot, op, Acquired::Unknown),
    }
}

fn session_op(effect: &SessionEffect) -> OpId {
    match *effect {
        SessionEffect::Create { op, .. }
        | SessionEffect::KeepAlive { op, .. }
        | SessionEffect::Delete { op, .. }
        | SessionEffect::Get { op, .. } => op,
        other => panic!("not a store call: {other:?}"),
    }
}
