//! # vvm-sim: a deterministic simulator of many vvm processes sharing one store
//!
//! One simulated [`world`]: processes with their own clocks and killers, one store model
//! ([`store`]: slot records, sessions, holdings and a semaphore), one fault injector, one event
//! queue in virtual time, one seeded generator, one trace and one [`oracle`] of what a user
//! sees (services running). Three scenarios run in it, each on the real core machines driven
//! the way the runtime drives them, each replayed exactly from a seed:
//!
//! - [`Sim`]: VVMs, each the real [`Lifecycle`] machine, holding slots one at a time through
//!   the per-slot lease protocol.
//! - [`session::SessionSim`]: processes that each run the real [`Session`](vvm_core::Session)
//!   machine and hold several slots under one session, on holdings that live exactly as long
//!   as their session.
//! - [`semaphore::SemaphoreSim`]: processes that each run the real
//!   [`Session`](vvm_core::Session) machine and acquire and release units of one counted
//!   semaphore under it, every operation the real [`vvm_core::semaphore`] method in one
//!   transaction.
//!
//! Every VVM is driven as the runtime drives it: store calls under a timeout of
//! [`LeaseConfig::store_timeout`], one pending timer per kind, a killer that fires at the local
//! kill deadline even while the process is paused, services that start and stop after a delay, a
//! host that shuts down on a problem. Time is virtual; each process reads its own clock, which
//! runs at a rate within ±10 % of true time; the store judges expiry by true time. One seeded
//! generator draws every fault, so a seed replays a run exactly.
//!
//! The tests of this crate run the seeds (`tests/simulation.rs`, `tests/session_simulation.rs`,
//! `tests/semaphore_simulation.rs`) and the named adversarial scenarios (`tests/scenarios.rs`).
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
pub mod session_task;
pub mod store;
pub mod trace;
pub mod world;

use vvm_core::{
    Effect, Effects, FencingToken, Incarnation, Instant, Lifecycle, OpId, Reply, Slot, TimerId,
    VvmConfig, VvmEvent,
};

use oracle::{Interval, ProcessId, Violation};
use params::{DeadHolder, Params};
use store::{Answer, Call, KeepAlives, StoreModel, Writer};
use trace::Note;
use world::{Place, Scenario, World};

pub use world::{FateHook, Sent};

/// The simulation of VVMs on per-slot leases.
pub type Sim = World<Vvms>;

/// A scripted action run at a given true time.
pub type Script = Box<dyn FnOnce(&mut Sim)>;

/// An input of a VVM, before it carries a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// `launch`.
    Launch,
    /// The host asks for a graceful shutdown.
    Shutdown,
    /// A timer.
    Timer(TimerId),
    /// The answer of a store call.
    Reply(OpId, Reply),
    /// The services started.
    ServicesStarted,
    /// A service failed.
    ServiceFailed(u16),
    /// The services stopped.
    ServicesStopped,
}

/// What a VVM is beside the world's part.
pub struct Proc {
    machine: Lifecycle,
    timers: [Option<TimerId>; 2],
    pending: Vec<OpId>,
    /// The token the services act with, from `StartServices` until `ServicesStopped` was
    /// handled: what the oracle watches. Renewals while they run move it forward.
    services: Option<FencingToken>,
    shutdown_asked: bool,
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

impl runner::Totals for Stats {
    fn add(&mut self, more: &Stats) {
        self.events += more.events;
        self.store_calls += more.store_calls;
        self.acquisitions += more.acquisitions;
        self.renewals += more.renewals;
        self.losses += more.losses;
        self.killed += more.killed;
        self.crashed += more.crashed;
        self.starts += more.starts;
        self.dead_takeovers += more.dead_takeovers;
    }
}

/// The scenario of VVMs: their parameters, configurations and counts.
pub struct Vvms {
    params: Params,
    config: Vec<VvmConfig>,
    stats: Stats,
}

impl World<Vvms> {
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
        let store = StoreModel::new(params.slots, KeepAlives::Bump, 1);
        let scenario = Vvms {
            params,
            config,
            stats: Stats::default(),
        };
        World::of(seed, scenario, store)
    }

    /// Runs `script` at true time `at_ns`.
    pub fn at(&mut self, at_ns: u64, script: impl FnOnce(&mut Sim) + 'static) {
        self.schedule_own(at_ns, Box::new(script));
    }

    /// The parameters of the run.
    pub fn params(&self) -> &Params {
        &self.s.params
    }

    /// Counts so far.
    pub fn stats(&self) -> Stats {
        Stats {
            store_calls: self.counts.store_calls,
            starts: self.counts.starts,
            killed: self.counts.killed,
            crashed: self.counts.crashed,
            dead_takeovers: self.store.dead_takeovers,
            ..self.s.stats
        }
    }

    /// The running process at position `index`, if any.
    pub fn process(&self, index: u32) -> Option<(ProcessId, &Lifecycle)> {
        let live = self.places[index as usize].live.as_ref()?;
        Some((live.id, &live.proc.machine))
    }

    /// Who acts as leader of `slot` now, with which token.
    pub fn acting(&self, slot: Slot) -> Vec<(ProcessId, FencingToken)> {
        self.lives()
            .filter_map(|live| Some((live.id, live.proc.services?)))
            .filter(|(_, token)| token.slot == slot)
            .collect()
    }

    /// Every violation of the safety invariant or of the token order so far, and every interval
    /// of acting recorded (open ones closed now).
    pub fn check(&mut self) -> (Vec<Violation>, Vec<Interval>) {
        self.check_oracle()
    }

    /// The host of process `index` asks for a graceful shutdown now.
    pub fn shutdown(&mut self, index: u32) {
        if let Some(live) = self.places[index as usize].live.as_mut() {
            live.proc.shutdown_asked = true;
            let id = live.id;
            self.deliver(id, Input::Shutdown);
        }
    }
}

type W = World<Vvms>;

impl Scenario for Vvms {
    type Proc = Proc;
    type Input = Input;
    type Event = Script;

    fn base(&self) -> &Params {
        &self.params
    }

    /// The writer's process is gone when no running process carries its incarnation.
    fn holder_dead(&self, places: &[Place<Self>], holder: Writer) -> bool {
        let live = places
            .iter()
            .filter_map(|place| place.live.as_ref())
            .find(|live| live.writer == holder);
        match (self.params.dead_holder, live) {
            (DeadHolder::Unknown, _) => false,
            (DeadHolder::Known | DeadHolder::FreedAtLoss, None) => true,
            (DeadHolder::Known, Some(_)) => false,
            (DeadHolder::FreedAtLoss, Some(live)) => {
                live.proc.machine.leadership().held().is_none()
            }
        }
    }

    fn spawn(world: &mut W, index: u32, incarnation: Incarnation) -> Proc {
        Proc {
            machine: Lifecycle::new(&world.s.config[index as usize], incarnation),
            timers: [None; 2],
            pending: Vec::new(),
            services: None,
            shutdown_asked: false,
        }
    }

    fn launch() -> Input {
        Input::Launch
    }

    /// Runs one input through the machine and executes the effects, as the runtime's driver.
    fn handle(world: &mut W, id: ProcessId, input: Input) {
        let now_ns = world.now_ns();
        let now = Instant::from_nanos(world.local_ns(id));
        let proc = world.proc(id);
        let event = match input {
            Input::Launch => VvmEvent::Launch { now },
            Input::Shutdown => VvmEvent::Shutdown { now },
            Input::Timer(timer) => {
                // One pending timer per kind: a replaced timer never fires.
                let kind = timer.kind as usize;
                if proc.timers[kind] != Some(timer) {
                    return;
                }
                proc.timers[kind] = None;
                VvmEvent::Timer { now, timer }
            }
            Input::Reply(op, reply) => {
                // The first of the reply and the timeout wins; the other is dropped.
                let Some(at) = proc.pending.iter().position(|&p| p == op) else {
                    return;
                };
                proc.pending.swap_remove(at);
                VvmEvent::Reply { now, op, reply }
            }
            Input::ServicesStarted => VvmEvent::ServicesStarted { now },
            Input::ServiceFailed(index) => VvmEvent::ServiceFailed { now, index },
            Input::ServicesStopped => {
                // The services are down from here on (the pipeline's report is handled).
                proc.services = None;
                VvmEvent::ServicesStopped { now, clean: true }
            }
        };
        let mut out = Effects::new();
        proc.machine.handle(&event, &mut out);
        world.s.stats.events += 1;
        world.note(|| Note::Handled {
            at_ns: now_ns,
            process: id,
            event,
            effects: out.as_slice().to_vec(),
        });
        let mut exit = false;
        for effect in out.iter().copied() {
            exit |= execute(world, id, effect);
        }
        let Some(live) = world.live_mut(id) else {
            return;
        };
        if let Some(held) = live.proc.machine.leadership().held() {
            if live.killer.map(|(at, _)| at) != Some(held.deadline.as_nanos()) {
                let text = format!(
                    "{id} holds slot {} with deadline {:?} but its killer is armed at {:?}",
                    held.slot.0, held.deadline, live.killer
                );
                world.oracle.flag(id, now_ns, text);
            }
        }
        // The token it acts with: its services were started and have not all stopped (the
        // process is alive: a fired killer or a crash removed it). Whether the machine still
        // holds the slot does not matter — services run on after a loss until they stop.
        let token = world.proc(id).services;
        world.oracle.observe(id, token, now_ns);
        if exit {
            world.exit(id);
        } else {
            world.kill_if_overdue(id);
        }
    }

    fn stop(world: &mut W, id: ProcessId) {
        world.shutdown(id.index);
    }

    fn answered(call: &Call, answer: Answer) -> Input {
        match (call, answer) {
            (Call::Slot(effect), Answer::Reply(reply)) => Input::Reply(store_op(effect), reply),
            (call, answer) => panic!("{answer:?} does not answer {call:?}"),
        }
    }

    fn event(world: &mut W, script: Script) {
        script(world);
    }
}

/// Executes one effect of `id`; true when the process exits.
fn execute(world: &mut W, id: ProcessId, effect: Effect) -> bool {
    let now_ns = world.now_ns();
    let service_delay_max_ns = world.s.params.service_delay_max_ns;
    match effect {
        Effect::Insert { op, .. }
        | Effect::CompareAndSwap { op, .. }
        | Effect::CompareAndDelete { op, .. }
        | Effect::Get { op, .. } => {
            world.proc(id).pending.push(op);
            world.send(id, Call::Slot(effect));
        }
        Effect::SetTimer { timer, at } => {
            world.proc(id).timers[timer.kind as usize] = Some(timer);
            world.at_local(id, at.as_nanos(), Input::Timer(timer));
        }
        Effect::DisarmKiller => {
            let live = world.live(id);
            live.killer = None;
            if live.proc.services.is_some() {
                let text = format!("{id} disarmed its killer while its services run");
                world.oracle.flag(id, now_ns, text);
            }
        }
        Effect::ArmKiller { at } => world.arm_killer(id, at.as_nanos()),
        Effect::Acquired { token } | Effect::Renewed { token } => {
            if matches!(effect, Effect::Acquired { .. }) {
                world.s.stats.acquisitions += 1;
            } else {
                world.s.stats.renewals += 1;
                if let Some(services) = world.proc(id).services.as_mut() {
                    *services = token;
                }
            }
            check_token_fresh(world, id, token, effect);
        }
        Effect::StartServices { token } => {
            check_token_fresh(world, id, token, effect);
            world.proc(id).services = Some(token);
            let delay_ns = world.rng.between(0, service_delay_max_ns);
            let fail_ppm = world.s.params.faults.service_fail_ppm;
            let input = if world.rng.chance(fail_ppm) {
                Input::ServiceFailed(world.rng.below(3) as u16)
            } else {
                Input::ServicesStarted
            };
            world.schedule_input(now_ns + delay_ns, id, input);
            if world.rng.chance(fail_ppm) {
                let later_ns = now_ns + world.rng.between(0, 10 * world.s.params.lease_ns());
                world.schedule_input(later_ns, id, Input::ServiceFailed(0));
            }
        }
        Effect::StopServices => {
            let delay_ns = world.rng.between(0, service_delay_max_ns);
            world.schedule_input(now_ns + delay_ns, id, Input::ServicesStopped);
        }
        Effect::ProblemRaised { .. } => {
            let reacts = world.s.params.shutdown_on_problem;
            let proc = world.proc(id);
            if reacts && !proc.shutdown_asked {
                proc.shutdown_asked = true;
                let delay_ns = world.rng.between(0, world.s.params.host_delay_max_ns);
                world.schedule_input(now_ns + delay_ns, id, Input::Shutdown);
            }
        }
        Effect::Lost { .. } => world.s.stats.losses += 1,
        Effect::Finished { .. } => return true,
        Effect::NotAcquired { .. }
        | Effect::Released { .. }
        | Effect::Running { .. }
        | Effect::MonitorStopped
        // Only a lifecycle on its own session asks for one; the simulated VVMs hold leases.
        | Effect::OpenSession { .. } => {}
    }
    false
}

/// A token handed to services must come before the kill deadline: once it has passed, the
/// process may no longer act, and services that saw the token would act on it.
fn check_token_fresh(world: &mut W, id: ProcessId, token: FencingToken, effect: Effect) {
    world.check_fresh(id, || format!("{effect:?} (token {token:?})"));
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
