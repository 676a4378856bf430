//! # vvm-sim: a deterministic simulator of many vvm processes sharing one store
//!
//! Two simulations, each on the real core machines driven the way the runtime drives them, each
//! judged by an [`oracle`] of what a user sees (services running), each replayed exactly from a
//! seed:
//!
//! - [`Sim`]: VVMs, each the real [`Lifecycle`] machine, holding slots one at a time through
//!   the per-slot lease protocol.
//! - [`session::SessionSim`]: processes that each run the real [`Session`](vvm_core::Session)
//!   machine and hold several slots under one session, on a store of session records and
//!   holdings that live exactly as long as their session.
//! - [`semaphore::SemaphoreSim`]: processes that each run the real [`Session`](vvm_core::Session)
//!   machine and acquire and release units of one counted semaphore under it, on a store that
//!   runs every operation as the real [`vvm_core::semaphore`] method in one transaction.
//!
//! Every VVM is driven as the runtime drives it: store calls under a timeout of
//! [`LeaseConfig::store_timeout`], one pending timer per kind, a killer that fires at the local
//! kill deadline even while the process is paused, services that start and stop after a delay, a
//! host that shuts down on a problem. Time is virtual; each process reads its own clock, which
//! runs at a rate within ±10 % of true time; the store judges expiry by true time. One seeded
//! generator draws every fault, so a seed replays a run exactly.
//!
//! The tests of this crate run the seeds (`tests/simulation.rs`,
//! `tests/session_simulation.rs`) and the named adversarial scenarios (`tests/scenarios.rs`).
//! The crate is built with `opt-level = 3` in the dev profile (debug assertions and overflow
//! checks on), which is what makes 100 000 seeds of each affordable inside `cargo test`.
//!
//! [`LeaseConfig::store_timeout`]: vvm_core::LeaseConfig::store_timeout
#![forbid(unsafe_code)]

pub mod clock;
pub mod oracle;
pub mod params;
pub mod queue;
pub mod rng;
pub mod runner;
pub mod semaphore;
pub mod session;
pub mod store;
pub mod trace;

use std::collections::{HashSet, VecDeque};

use vvm_core::{
    Effect, Effects, FencingToken, Incarnation, Instant, Lifecycle, OpId, Reply, Slot, TimerId,
    VvmConfig, VvmEvent,
};

use clock::LocalClock;
use oracle::{Oracle, ProcessId, Violation};
use params::{DeadHolder, Fate, Outcome, Params};
use queue::{EventQueue, Ticket};
use rng::Rng;
use store::{StoreModel, Writer};
use trace::{Death, Note};

/// Decides the fate of chosen store calls instead of the fault model (scenarios aim faults).
pub type FateHook = Box<dyn FnMut(&Call) -> Option<Fate>>;

/// A store call as the fate hook sees it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// Who sends it.
    pub process: ProcessId,
    /// When (true time).
    pub at_ns: u64,
    /// The call.
    pub effect: Effect,
}

/// A scripted action run at a given true time.
type Script = Box<dyn FnOnce(&mut Sim)>;

/// An input of a process, before it carries a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    Launch,
    Shutdown,
    Timer(TimerId),
    Reply(OpId, Reply),
    ServicesStarted,
    ServiceFailed(u16),
    ServicesStopped,
}

enum Ev {
    Input(ProcessId, Input),
    /// A store call reaches the store; with the time and place of its caller's timeout when
    /// that is not queued yet (it is only when the answer does not come first).
    Arrive(ProcessId, Writer, Effect, Fate, Option<(u64, Ticket)>),
    Kill(ProcessId, u64),
    Resume(ProcessId),
    Start(u32),
    RandomPause(ProcessId),
    RandomCrash(ProcessId),
    RandomStop(ProcessId),
    Script(Script),
}

/// One running process.
struct Live {
    id: ProcessId,
    machine: Lifecycle,
    writer: Writer,
    clock: LocalClock,
    paused_until_ns: Option<u64>,
    inbox: VecDeque<Input>,
    timers: [Option<TimerId>; 2],
    pending: Vec<OpId>,
    /// Local kill deadline and the number of the arming that set it.
    killer: Option<(u64, u64)>,
    /// The token the services act with, from `StartServices` until `ServicesStopped` was
    /// handled: what the oracle watches. Renewals while they run move it forward.
    services: Option<FencingToken>,
    armings: u64,
    shutdown_asked: bool,
}

/// One position: a process that restarts as new incarnations.
struct Place {
    generation: u32,
    live: Option<Live>,
    rate_override: Option<i32>,
}

/// Counts of what happened in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events handled by machines.
    pub events: u64,
    /// Store calls sent.
    pub store_calls: u64,
    /// Slots won.
    pub acquisitions: u64,
    /// Renewals confirmed.
    pub renewals: u64,
    /// Leaderships lost.
    pub losses: u64,
    /// Processes ended by their killer.
    pub killed: u64,
    /// Processes crashed.
    pub crashed: u64,
    /// Processes started.
    pub starts: u64,
    /// Slots taken at once from a holder the store knew dead.
    pub dead_takeovers: u64,
}

/// The simulation.
pub struct Sim {
    params: Params,
    config: Vec<VvmConfig>,
    rng: Rng,
    now_ns: u64,
    queue: EventQueue<Ev>,
    store: StoreModel,
    places: Vec<Place>,
    oracle: Oracle,
    trace: Option<Vec<Note>>,
    fate_hook: Option<FateHook>,
    outages: Vec<(u64, u64, Outcome)>,
    cut_off: Vec<(u32, u64, u64)>,
    incarnations: HashSet<u64>,
    stats: Stats,
}

impl Sim {
    /// A simulation of `params` whose every random choice comes from `seed`. Processes start
    /// within `params.start_spread_ns`; random store outages are laid out in advance.
    pub fn new(seed: u64, params: Params) -> Self {
        let config = (0..params.processes)
            .map(|index| {
                VvmConfig::builder(format!("10.0.0.{index}:7000"))
                    .slots(params.slots)
                    .lease(params.lease)
                    .acquisition(params.acquisition)
                    .round_interval(params.round_interval)
                    .build()
                    .expect("simulation parameters are a valid configuration")
            })
            .collect();
        let mut sim = Sim {
            store: StoreModel::new(params.slots),
            places: (0..params.processes)
                .map(|_| Place {
                    generation: 0,
                    live: None,
                    rate_override: None,
                })
                .collect(),
            config,
            rng: Rng::new(seed),
            now_ns: 0,
            queue: EventQueue::default(),
            oracle: Oracle::default(),
            trace: None,
            fate_hook: None,
            outages: Vec::new(),
            cut_off: Vec::new(),
            incarnations: HashSet::new(),
            stats: Stats::default(),
            params,
        };
        for index in 0..sim.params.processes {
            let at_ns = sim.rng.between(0, sim.params.start_spread_ns);
            sim.schedule(at_ns, Ev::Start(index));
        }
        let faults = sim.params.faults.clone();
        if faults.outage_gap_ns > 0 {
            let mut at_ns = sim.rng.between(0, 2 * faults.outage_gap_ns);
            while at_ns < sim.params.duration_ns {
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

    /// Keeps a [`Note`] of everything from now on.
    pub fn keep_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// What happened so far (empty unless [`keep_trace`](Self::keep_trace) was called).
    pub fn trace(&self) -> &[Note] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Lets `hook` choose the fate of store calls; `None` from it falls back to the fault model.
    pub fn set_fate_hook(&mut self, hook: FateHook) {
        self.fate_hook = Some(hook);
    }

    /// Runs `script` at true time `at_ns`.
    pub fn at(&mut self, at_ns: u64, script: impl FnOnce(&mut Sim) + 'static) {
        self.schedule(at_ns, Ev::Script(Box::new(script)));
    }

    /// Every store call arriving in `[from_ns, until_ns)` gets `outcome` (the store is down).
    pub fn outage(&mut self, from_ns: u64, until_ns: u64, outcome: Outcome) {
        self.outages.push((from_ns, until_ns, outcome));
    }

    /// Calls of process `index` arriving in `[from_ns, until_ns)` are lost on the way: not
    /// applied, never answered (the process is cut off from the store).
    pub fn cut_off(&mut self, index: u32, from_ns: u64, until_ns: u64) {
        self.cut_off.push((index, from_ns, until_ns));
    }

    /// The next start of process `index` runs its clock at this rate error.
    pub fn set_rate(&mut self, index: u32, rate_ppm: i32) {
        self.places[index as usize].rate_override = Some(rate_ppm);
    }

    /// True time now.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The parameters of the run.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Counts so far.
    pub fn stats(&self) -> Stats {
        Stats {
            dead_takeovers: self.store.dead_takeovers,
            ..self.stats
        }
    }

    /// The store.
    pub fn store(&self) -> &StoreModel {
        &self.store
    }

    /// The store, to change records underneath the VVMs.
    pub fn store_mut(&mut self) -> &mut StoreModel {
        &mut self.store
    }

    /// The running process at position `index`, if any.
    pub fn process(&self, index: u32) -> Option<(ProcessId, &Lifecycle)> {
        let live = self.places[index as usize].live.as_ref()?;
        Some((live.id, &live.machine))
    }

    /// The store writer (address and incarnation) of the running process at `index`.
    pub fn writer(&self, index: u32) -> Option<Writer> {
        Some(self.places[index as usize].live.as_ref()?.writer)
    }

    /// Whether the process at `index` is paused now.
    pub fn is_paused(&self, index: u32) -> bool {
        self.places[index as usize]
            .live
            .as_ref()
            .is_some_and(|live| live.paused_until_ns.is_some())
    }

    /// Who acts as leader of `slot` now, with which token.
    pub fn acting(&self, slot: Slot) -> Vec<(ProcessId, FencingToken)> {
        self.places
            .iter()
            .filter_map(|place| place.live.as_ref())
            .filter_map(|live| Some((live.id, acting_token(live, self.now_ns)?)))
            .filter(|(_, token)| token.slot == slot)
            .collect()
    }

    /// Runs until true time `until_ns` (events at exactly `until_ns` included).
    pub fn run_until(&mut self, until_ns: u64) {
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

    /// Runs for the whole duration of the parameters.
    pub fn run(&mut self) {
        self.run_until(self.params.duration_ns);
    }

    /// Every violation of the safety invariant or of the token order so far, and every interval
    /// of acting recorded (open ones closed now).
    pub fn check(&mut self) -> (Vec<Violation>, Vec<oracle::Interval>) {
        let now_ns = self.now_ns;
        let mut oracle = self.oracle.clone();
        let intervals = oracle.clone().finish(now_ns);
        (oracle.check(now_ns), intervals)
    }

    /// Crashes process `index` now (SIGKILL: no release, in-flight calls still land).
    pub fn crash(&mut self, index: u32) {
        if let Some(id) = self.places[index as usize].live.as_ref().map(|l| l.id) {
            self.die(id, Death::Crash);
        }
    }

    /// Pauses process `index` now for `duration_ns`: it handles nothing meanwhile, its killer
    /// still fires.
    pub fn pause(&mut self, index: u32, duration_ns: u64) {
        let now_ns = self.now_ns;
        let Some(live) = self.places[index as usize].live.as_mut() else {
            return;
        };
        let until_ns = now_ns + duration_ns;
        let until_ns = live.paused_until_ns.map_or(until_ns, |u| u.max(until_ns));
        live.paused_until_ns = Some(until_ns);
        let id = live.id;
        self.note(Note::Paused {
            at_ns: now_ns,
            process: id,
            until_ns,
        });
        self.schedule(until_ns, Ev::Resume(id));
    }

    /// The host of process `index` asks for a graceful shutdown now.
    pub fn shutdown(&mut self, index: u32) {
        if let Some(live) = self.places[index as usize].live.as_mut() {
            live.shutdown_asked = true;
            let id = live.id;
            self.deliver(id, Input::Shutdown);
        }
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

    fn note(&mut self, note: Note) {
        if let Some(trace) = self.trace.as_mut() {
            trace.push(note);
        }
    }

    fn live_mut(&mut self, id: ProcessId) -> Option<&mut Live> {
        self.places[id.index as usize]
            .live
            .as_mut()
            .filter(|live| live.id == id)
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Input(id, input) => self.deliver(id, input),
            Ev::Arrive(id, writer, effect, fate, timeout) => {
                self.arrive(id, writer, effect, fate, timeout)
            }
            Ev::Kill(id, arming) => {
                let fires = self
                    .live_mut(id)
                    .is_some_and(|live| live.killer.is_some_and(|(_, n)| n == arming));
                if fires {
                    self.die(id, Death::Killer);
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
                    self.pause(id.index, duration_ns);
                }
                self.random_next(id, self.params.faults.pause_gap_ns, Ev::RandomPause(id));
            }
            Ev::RandomCrash(id) => {
                if self.live_mut(id).is_some() {
                    self.die(id, Death::Crash);
                }
            }
            Ev::RandomStop(id) => {
                if self.live_mut(id).is_some() {
                    self.shutdown(id.index);
                }
            }
            Ev::Script(script) => script(self),
        }
    }

    /// A pause length: mostly short, often near the kill threshold or the lease where the
    /// protocol's margins are thinnest, sometimes as long as allowed.
    fn pause_duration(&mut self) -> u64 {
        let l = self.params.lease_ns();
        let max = self.params.faults.pause_max_ns;
        let duration_ns = match self.rng.below(10) {
            0..=3 => self.rng.between(0, l / 20),
            4..=6 => self.rng.between(l * 13 / 20, l * 19 / 20),
            7 | 8 => self.rng.between(l * 9 / 10, l * 6 / 5),
            _ => self.rng.between(0, max),
        };
        duration_ns.min(max)
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
        let skew = self.params.faults.skew_ppm_max;
        let rate_ppm = match place.rate_override {
            Some(rate) => rate,
            // The extremes are the interesting part: a tenth of the starts sit on them.
            None if self.rng.chance(100_000) => {
                if self.rng.chance(500_000) {
                    skew as i32
                } else {
                    -(skew as i32)
                }
            }
            None => self.rng.signed(skew) as i32,
        };
        let mut incarnation = self.rng.next_u64();
        while !self.incarnations.insert(incarnation) {
            incarnation = self.rng.next_u64();
        }
        let incarnation = Incarnation(incarnation);
        let origin_local_ns = self.rng.between(0, 1 << 40);
        let live = Live {
            id,
            machine: Lifecycle::new(&self.config[index as usize], incarnation),
            writer: Writer {
                address: index,
                incarnation,
            },
            clock: LocalClock::new(self.now_ns, origin_local_ns, rate_ppm),
            paused_until_ns: None,
            inbox: VecDeque::new(),
            timers: [None; 2],
            pending: Vec::new(),
            killer: None,
            services: None,
            armings: 0,
            shutdown_asked: false,
        };
        self.places[index as usize].live = Some(live);
        self.stats.starts += 1;
        self.note(Note::Started {
            at_ns: self.now_ns,
            process: id,
            incarnation,
            rate_ppm,
        });
        self.deliver(id, Input::Launch);
        let faults = self.params.faults.clone();
        self.random_next(id, faults.pause_gap_ns, Ev::RandomPause(id));
        self.random_next(id, faults.crash_gap_ns, Ev::RandomCrash(id));
        self.random_next(id, faults.stop_gap_ns, Ev::RandomStop(id));
    }

    fn die(&mut self, id: ProcessId, death: Death) {
        if self.live_mut(id).is_none() {
            return;
        }
        self.places[id.index as usize].live = None;
        self.oracle.stop(id, self.now_ns);
        match death {
            Death::Killer => self.stats.killed += 1,
            Death::Crash => self.stats.crashed += 1,
        }
        self.note(Note::Died {
            at_ns: self.now_ns,
            process: id,
            death,
        });
        self.restart_later(id.index);
    }

    fn restart_later(&mut self, index: u32) {
        if self.params.restart {
            let at_ns = self.now_ns + self.rng.between(0, self.params.restart_delay_max_ns);
            self.schedule(at_ns, Ev::Start(index));
        }
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
        // Everything that arrived during the pause is handled now, in arrival order, unless the
        // process dies on the way.
        while let Some(input) = self.live_mut(id).and_then(|live| live.inbox.pop_front()) {
            self.handle(id, input);
        }
    }

    /// Runs one input through the machine and executes the effects, as the runtime's driver.
    fn handle(&mut self, id: ProcessId, input: Input) {
        let now_ns = self.now_ns;
        let lease = *self.config[id.index as usize].lease();
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let now = Instant::from_nanos(live.clock.local(now_ns));
        let event = match input {
            Input::Launch => VvmEvent::Launch { now },
            Input::Shutdown => VvmEvent::Shutdown { now },
            Input::Timer(timer) => {
                // One pending timer per kind: a replaced timer never fires.
                let kind = timer.kind as usize;
                if live.timers[kind] != Some(timer) {
                    return;
                }
                live.timers[kind] = None;
                VvmEvent::Timer { now, timer }
            }
            Input::Reply(op, reply) => {
                // The first of the reply and the timeout wins; the other is dropped.
                let Some(at) = live.pending.iter().position(|&p| p == op) else {
                    return;
                };
                live.pending.swap_remove(at);
                VvmEvent::Reply { now, op, reply }
            }
            Input::ServicesStarted => VvmEvent::ServicesStarted { now },
            Input::ServiceFailed(index) => VvmEvent::ServiceFailed { now, index },
            Input::ServicesStopped => {
                // The services are down from here on (the pipeline's report is handled).
                live.services = None;
                VvmEvent::ServicesStopped { now, clean: true }
            }
        };
        let mut out = Effects::new();
        live.machine.handle(&event, &mut out);
        self.stats.events += 1;
        if self.trace.is_some() {
            self.note(Note::Handled {
                at_ns: now_ns,
                process: id,
                event,
                effects: out.as_slice().to_vec(),
            });
        }
        let mut exit = false;
        for effect in out.iter().copied() {
            exit |= self.execute(id, effect, now.as_nanos(), lease.store_timeout());
        }
        let Some(live) = self.live_mut(id) else {
            return;
        };
        if let Some(held) = live.machine.leadership().held() {
            if live.killer.map(|(at, _)| at) != Some(held.deadline.as_nanos()) {
                let text = format!(
                    "{id} holds slot {} with deadline {:?} but its killer is armed at {:?}",
                    held.slot.0, held.deadline, live.killer
                );
                self.oracle.flag(id, now_ns, text);
            }
        }
        let live = self.live_mut(id).expect("still running");
        let token = acting_token(live, now_ns);
        // A deadline armed in the past (a confirmation that came too late) fires at once.
        let overdue = live
            .killer
            .is_some_and(|(at, _)| live.clock.local(now_ns) >= at);
        self.oracle.observe(id, token, now_ns);
        if overdue && !exit {
            self.die(id, Death::Killer);
            return;
        }
        if exit {
            self.places[id.index as usize].live = None;
            self.oracle.stop(id, now_ns);
            self.note(Note::Exited {
                at_ns: now_ns,
                process: id,
            });
            self.restart_later(id.index);
        }
    }

    /// Executes one effect of `id` at local time `now_local_ns`; true when the process exits.
    fn execute(
        &mut self,
        id: ProcessId,
        effect: Effect,
        now_local_ns: u64,
        store_timeout: core::time::Duration,
    ) -> bool {
        let now_ns = self.now_ns;
        let service_delay_max_ns = self.params.service_delay_max_ns;
        match effect {
            Effect::Insert { op, .. }
            | Effect::CompareAndSwap { op, .. }
            | Effect::CompareAndDelete { op, .. }
            | Effect::Get { op, .. } => {
                self.stats.store_calls += 1;
                let call = Call {
                    process: id,
                    at_ns: now_ns,
                    effect,
                };
                let hooked = self.fate_hook.as_mut().and_then(|hook| hook(&call));
                let fate = hooked.unwrap_or_else(|| Fate::draw(&self.params.faults, &mut self.rng));
                let live = self.live_mut(id).expect("running");
                live.pending.push(op);
                let writer = live.writer;
                let timeout_local_ns = now_local_ns + store_timeout.as_nanos() as u64;
                let timeout_ns = live.clock.true_at(timeout_local_ns);
                // The timeout waits in the call until the call reaches the store, and is queued
                // only if the answer does not come first: a third fewer events, the same run.
                let arrive_ns = now_ns + fate.to_store_ns;
                let arrival = self.queue.reserve();
                let timeout = self.queue.reserve();
                let deferred = (arrive_ns <= timeout_ns).then_some((timeout_ns, timeout));
                let arrive = Ev::Arrive(id, writer, effect, fate, deferred);
                self.schedule_reserved(arrive_ns, arrival, arrive);
                if deferred.is_none() {
                    let unknown = Ev::Input(id, Input::Reply(op, Reply::Unknown));
                    self.schedule_reserved(timeout_ns, timeout, unknown);
                }
                if self.rng.chance(self.params.faults.pause_on_call_ppm) {
                    let duration_ns = self.pause_duration();
                    self.pause(id.index, duration_ns);
                }
            }
            Effect::SetTimer { timer, at } => {
                let live = self.live_mut(id).expect("running");
                live.timers[timer.kind as usize] = Some(timer);
                let at_ns = live.clock.true_at(at.as_nanos());
                self.schedule(at_ns, Ev::Input(id, Input::Timer(timer)));
            }
            Effect::DisarmKiller => {
                let live = self.live_mut(id).expect("running");
                live.killer = None;
                if live.services.is_some() {
                    let text = format!("{id} disarmed its killer while its services run");
                    self.oracle.flag(id, now_ns, text);
                }
            }
            Effect::ArmKiller { at } => {
                let live = self.live_mut(id).expect("running");
                live.armings += 1;
                let arming = live.armings;
                live.killer = Some((at.as_nanos(), arming));
                let at_ns = live.clock.true_at(at.as_nanos());
                self.schedule(at_ns, Ev::Kill(id, arming));
            }
            Effect::Acquired { token } | Effect::Renewed { token } => {
                if matches!(effect, Effect::Acquired { .. }) {
                    self.stats.acquisitions += 1;
                } else {
                    self.stats.renewals += 1;
                    let live = self.live_mut(id).expect("running");
                    if let Some(services) = live.services.as_mut() {
                        *services = token;
                    }
                }
                self.check_token_fresh(id, token, now_local_ns, effect);
            }
            Effect::StartServices { token } => {
                self.check_token_fresh(id, token, now_local_ns, effect);
                self.live_mut(id).expect("running").services = Some(token);
                let delay_ns = self.rng.between(0, service_delay_max_ns);
                let input = if self.rng.chance(self.params.faults.service_fail_ppm) {
                    Input::ServiceFailed(self.rng.below(3) as u16)
                } else {
                    Input::ServicesStarted
                };
                self.schedule(now_ns + delay_ns, Ev::Input(id, input));
                if self.rng.chance(self.params.faults.service_fail_ppm) {
                    let later_ns = now_ns + self.rng.between(0, 10 * self.params.lease_ns());
                    self.schedule(later_ns, Ev::Input(id, Input::ServiceFailed(0)));
                }
            }
            Effect::StopServices => {
                let delay_ns = self.rng.between(0, service_delay_max_ns);
                self.schedule(now_ns + delay_ns, Ev::Input(id, Input::ServicesStopped));
            }
            Effect::ProblemRaised { .. } => {
                let reacts = self.params.shutdown_on_problem;
                let live = self.live_mut(id).expect("running");
                if reacts && !live.shutdown_asked {
                    live.shutdown_asked = true;
                    let delay_ns = self.rng.between(0, self.params.host_delay_max_ns);
                    self.schedule(now_ns + delay_ns, Ev::Input(id, Input::Shutdown));
                }
            }
            Effect::Lost { .. } => self.stats.losses += 1,
            Effect::Finished { .. } => return true,
            Effect::NotAcquired { .. }
            | Effect::Released { .. }
            | Effect::Running { .. }
            | Effect::MonitorStopped => {}
        }
        false
    }

    /// A token handed to services must come before the kill deadline: once it has passed, the
    /// process may no longer act, and services that saw the token would act on it.
    fn check_token_fresh(&mut self, id: ProcessId, token: FencingToken, now_local: u64, e: Effect) {
        let now_ns = self.now_ns;
        let killer = self.live_mut(id).and_then(|live| live.killer);
        if killer.is_none_or(|(deadline, _)| now_local >= deadline) {
            let text = format!(
                "{id} emitted {e:?} at local {now_local} ns, at or after its kill deadline \
                 {killer:?} (token {token:?})"
            );
            self.oracle.flag_late_token(id, now_ns, text);
        }
    }

    /// A store call reaches the store.
    fn arrive(
        &mut self,
        id: ProcessId,
        writer: Writer,
        effect: Effect,
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
        if self
            .cut_off
            .iter()
            .any(|&(index, from, until)| index == id.index && (from..until).contains(&now_ns))
        {
            outcome = Outcome::Hang { commit: false };
        }
        let apply = matches!(
            outcome,
            Outcome::Apply | Outcome::UnknownCommitted | Outcome::Hang { commit: true }
        );
        let rule = self.params.dead_holder;
        let places = &self.places;
        // The writer's process is gone when no running process carries its incarnation.
        let dead = |holder: Writer| {
            let live = places
                .iter()
                .filter_map(|place| place.live.as_ref())
                .find(|live| live.writer == holder);
            match (rule, live) {
                (DeadHolder::Unknown, _) => false,
                (DeadHolder::Known | DeadHolder::FreedAtLoss, None) => true,
                (DeadHolder::Known, Some(_)) => false,
                (DeadHolder::FreedAtLoss, Some(live)) => live.machine.leadership().held().is_none(),
            }
        };
        let applied = apply.then(|| self.store.apply(&effect, writer, now_ns, &dead).reply);
        self.note(Note::Store {
            at_ns: now_ns,
            process: id,
            effect,
            outcome,
            reply: applied,
        });
        let answer = match outcome {
            Outcome::Apply => applied,
            Outcome::Fail => Some(Reply::Failed),
            Outcome::UnknownLost | Outcome::UnknownCommitted => Some(Reply::Unknown),
            Outcome::Hang { .. } => None,
        };
        let op = store_op(&effect);
        if let Some((timeout_ns, ticket)) = timeout {
            if answer.is_none() || now_ns + fate.back_ns >= timeout_ns {
                let unknown = Ev::Input(id, Input::Reply(op, Reply::Unknown));
                self.schedule_reserved(timeout_ns, ticket, unknown);
            }
        }
        if let Some(reply) = answer {
            self.schedule(
                now_ns + fate.back_ns,
                Ev::Input(id, Input::Reply(op, reply)),
            );
        }
    }
}

/// The token `live` acts with at true time `now_ns`: its services were started and have not
/// all stopped (the process is alive: a fired killer or a crash removed it). Whether the
/// machine still holds the slot does not matter — services run on after a loss until they stop.
fn acting_token(live: &Live, now_ns: u64) -> Option<FencingToken> {
    let _ = now_ns;
    live.services
}

fn store_op(effect: &Effect) -> OpId {
    match *effect {
        Effect::Insert { op, .. }
        | Effect::CompareAndSwap { op, .. }
        | Effect::CompareAndDelete { op, .. }
        | Effect::Get { op, .. } => op,
        other => panic!("not a store operation: {other:?}"),
    }
}
