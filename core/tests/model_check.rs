//! Model checking the real core machines with stateright.
//!
//! The model holds three real [`Lifecycle`] values (each embedding the real `Leadership`), one
//! atomic store of two slots and the messages in flight. Every step is one of:
//!
//! - deliver a request (the store applies it atomically at that instant) or a reply;
//! - fail a request, or lose it or its answer (the caller hears `Unknown`, the write applied or
//!   not) — within a fault budget;
//! - fire a due timer of a process — at any later instant, which is how pauses and a slow
//!   runtime appear;
//! - advance true time to the next instant where something is due (a timer, a kill deadline, a
//!   record's expiry). Process clocks run at fixed rates of 0.9, 1.0 and 1.1 of true time (the
//!   extremes of the ±10 % the protocol is checked for); a process whose local clock reaches its
//!   kill deadline dies at that instant and restarts as a new incarnation;
//! - crash and restart a process with a new incarnation, or shut one down (the host's call).
//!
//! Because time only moves to instants where something is due, whether a process acts can only
//! change at a state, so checking states checks every instant.
//!
//! The store answers a refused insert with the record's time left (`Reply::Held`), so candidates
//! time their next try by the expiry. It also knows when a holder is dead, as the SQLite store
//! does through the slot's lock (`~Sq.DeadHolder~`): an insert over a live record whose writer
//! incarnation is gone — crashed, or killed at its deadline, and everything of it with it — takes
//! the slot at once ([`LockRule::Sound`]); every other process then hears `SlotChanged`, as the
//! feed reports a lock freed. Judged by services running, as everything here; made unsound
//! ([`LockRule::FreedAtLoss`]: the lock let go when leadership ends, while services may still run),
//! the checker must find two acting leaders.
//!
//! Someone outside the protocol may also remove a live record ([`Action::Remove`]: `etcdctl del`,
//! a revoked lease, a `DELETE` in the SQLite file). The store then keeps the removed record's
//! expiry for everyone but its writer, as the SQLite and etcd stores do (`~Sq.RecordDeleted~`,
//! `~Et.RecordRemoved~`: a successor waits until the holder's lease would have run out); the
//! holder, unless paused, hears `RecordVanished` from its watch of its own record at once and
//! must stop its services then (`~VVM.VanishedStops~`); the others hear `SlotChanged`.
//!
//! Properties: at most one acting leader per slot; fencing tokens never go back; shutdown effects
//! in the fixed order; and, under fair scheduling, every slot is taken.

#[path = "support/model.rs"]
mod model;

use model::{env_usize, explore, Fault, Search};

use core::time::Duration;

use stateright::{Model, Property};
use vvm_core::{
    Effect, Effects, FencingToken, Incarnation, Instant, Lifecycle, OpId, Phase, Reply, Slot,
    TimerId, VvmConfig, VvmEvent,
};

const PROCESSES: usize = 3;
const SLOTS: usize = 2;
const SECOND_NS: u64 = 1_000_000_000;
const LEASE: Duration = Duration::from_secs(20);
const LEASE_NS: u64 = 20 * SECOND_NS;
/// Clock rates in parts per million of true time: slow, exact, fast.
const RATES_PPM: [u64; PROCESSES] = [900_000, 1_000_000, 1_100_000];

/// How much the adversary may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    /// Safety: faults, crashes and a shutdown anywhere, any interleaving, timers as late as
    /// wished, messages as slow as wished; bounded by depth.
    Safety,
    /// Liveness: faults and crashes only before `FAULTS_UNTIL_NS`; after it the scheduler is fair
    /// and prompt (messages delivered and due timers fired before time moves on).
    Liveness,
}

/// When the store takes a live record's holder for dead (the SQLite lock of its slot is free).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum LockRule {
    /// The kernel's fact: the writer incarnation's process is gone (crashed or killed; its
    /// services with it).
    Sound,
    /// Unsound on purpose: also when the writer no longer leads (lost or released its lease),
    /// although its services may still be stopping — as if the lock were let go at the loss.
    FreedAtLoss,
}

/// What the adversary may do per run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Budget {
    /// Failed, lost, late or slow store calls.
    faults: u8,
    /// Crashes (SIGKILL, restart as a new incarnation).
    crashes: u8,
    /// Host shutdowns (safety only).
    shutdowns: u8,
    /// Process pauses.
    pauses: u8,
    /// Cut-offs: for [`CUT_NS`] every write of one process is applied but its answer lost (it
    /// hears `Unknown`) while its reads are answered, as when a holder's writes commit but time
    /// out.
    cutoffs: u8,
    /// Live records removed from outside (safety only).
    removals: u8,
}

/// The full adversary.
const FULL: Budget = Budget {
    faults: 2,
    crashes: 1,
    shutdowns: 1,
    pauses: 1,
    cutoffs: 1,
    removals: 1,
};

/// A smaller adversary, for checking liveness over every run.
const SMALL: Budget = Budget {
    faults: 1,
    crashes: 1,
    shutdowns: 0,
    pauses: 1,
    cutoffs: 0,
    removals: 0,
};
/// Liveness: faults only before this instant.
const FAULTS_UNTIL_NS: u64 = 6 * SECOND_NS;
/// Liveness: by then every slot must have had a leader after the faults (`L` for a crashed
/// holder's record to expire, plus rounds).
const LIVENESS_HORIZON_NS: u64 = FAULTS_UNTIL_NS + LEASE_NS + 12 * SECOND_NS;
/// Safety: runs end here (depth bounds them earlier in practice).
const SAFETY_HORIZON_NS: u64 = 3 * LEASE_NS;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Msg {
    /// A store call on its way; `answered` when its caller already heard `Unknown` (the call
    /// timed out) and the store may still apply it later.
    Request {
        p: u8,
        generation: u8,
        effect: Effect,
        answered: bool,
    },
    /// A slow answer, or one waiting for its paused process.
    Answer {
        p: u8,
        generation: u8,
        op: OpId,
        reply: Reply,
    },
}

impl Msg {
    fn process(&self) -> usize {
        match *self {
            Msg::Request { p, .. } | Msg::Answer { p, .. } => p as usize,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    machine: Lifecycle,
    generation: u8,
    timers: [Option<(TimerId, u64)>; 2],
    /// Local kill deadline.
    killer: Option<u64>,
    /// Paused (handles nothing, fires no timer) until this true instant.
    paused_until_ns: Option<u64>,
    /// The token the services act with: from `StartServices` until `ServicesStopped` reached
    /// the machine (renewals while they run move it forward). This, not the machine's holding
    /// state, is what "acting" means.
    services: Option<FencingToken>,
    /// `StopServices` was executed and the services have not reported stopped yet: they stop
    /// whenever the adversary lets them ([`Action::ServicesStop`]).
    stopping: bool,
    /// Shutdown-order bookkeeping of this incarnation.
    stop_services: bool,
    services_stopped: bool,
    monitor_stopped: bool,
    released: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Record {
    writer: (u8, u8),
    revision: u64,
    expires_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    now_ns: u64,
    procs: Vec<Proc>,
    store: [Option<Record>; SLOTS],
    revision: u64,
    msgs: Vec<Msg>,
    faults: u8,
    crashes: u8,
    shutdowns: u8,
    pauses: u8,
    cutoffs: u8,
    removals: u8,
    /// A record removed from outside, per slot, while it would still have been live: inserts of
    /// anyone but its writer are refused until its expiry.
    removed: [Option<Record>; SLOTS],
    /// A holder told that its record vanished went on starting or running its services.
    vanish_ignored: bool,
    /// Holders that stopped their services at once when told their record vanished.
    vanish_stops: u8,
    /// Until when each process is cut off (its writes applied, their answers lost).
    cut_until_ns: [Option<u64>; PROCESSES],
    /// Highest revision any acting leader used, per slot.
    highest: [u64; SLOTS],
    /// Slots that changed hands (a new incarnation acted on a slot someone else acted on).
    handovers: u8,
    last_actor: [Option<(u8, u8)>; SLOTS],
    token_went_back: bool,
    order_broken: bool,
    /// Inserts that took a live record from a holder taken for dead.
    dead_takeovers: u8,
}

/// The example the removal check must find.
const VANISH_STOPS: &str = "a holder stops at once when its record is removed from outside";

/// The example the dead-holder check must find.
const DEAD_TAKEOVER: &str = "a dead holder's slot is taken before its record expires";

/// What the adversary may do to the oldest message of a process.
const FAULTS: [Fault; 5] = [
    Fault::Fail,
    Fault::Lose,
    Fault::LoseAnswer,
    Fault::Late,
    Fault::SlowAnswer,
];

/// How long a cut-off lasts: long enough for a holder to give up renewing (about `0.6·L` after
/// its last confirmed write), short enough for the store to answer again before its deadline.
const CUT_NS: u64 = LEASE_NS * 13 / 20;

/// Pause lengths: inside the margin, just past the kill threshold, longer than the lease.
const PAUSES_NS: [u64; 3] = [LEASE_NS / 2, LEASE_NS * 17 / 20, LEASE_NS * 3 / 2];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The oldest message of process `p` arrives (a request is applied by the store and, unless
    /// the process is paused, its answer handled at once).
    Deliver(usize),
    /// A fault hits the oldest message of process `p`, a request.
    Fault(usize, Fault),
    /// True time moves to the next instant where something is due; due timers fire; processes
    /// past their kill deadline die and restart.
    Advance,
    Crash(usize),
    Shutdown(usize),
    Pause(usize, u64),
    /// Process `p` is cut off for [`CUT_NS`]: its writes are applied, their answers lost.
    CutOff(usize),
    /// The live record of slot index `s` is removed from outside the protocol.
    Remove(usize),
    /// The services of process `p`, asked to stop, have stopped; their report reaches the
    /// machine. Any time after the stop was asked (services may take long), unless `p` is paused.
    ServicesStop(usize),
}

struct LeaseModel {
    mode: Mode,
    budget: Budget,
    config: VvmConfig,
    lock: LockRule,
}

fn local(p: usize, true_ns: u64) -> u64 {
    model::local(RATES_PPM[p], true_ns)
}

fn true_at(p: usize, local_ns: u64) -> u64 {
    model::true_at(RATES_PPM[p], local_ns)
}

fn incarnation(p: usize, generation: u8) -> Incarnation {
    model::incarnation(0, p, generation)
}

impl LeaseModel {
    fn new(mode: Mode, budget: Budget, lock: LockRule) -> Self {
        // Rounds of `L/2` keep the general checks small; the cut-off check needs contenders
        // that try often enough to land inside a holder's last margin.
        let round_interval = if budget.cutoffs > 0 && budget.faults == 0 {
            LEASE / 10
        } else {
            LEASE / 2
        };
        let config = VvmConfig::builder("10.0.0.1:7000")
            .slots(SLOTS as u32)
            .lease(LEASE)
            .round_interval(round_interval)
            .acquisition(Duration::from_secs(600))
            .build()
            .expect("valid");
        LeaseModel {
            mode,
            budget,
            config,
            lock,
        }
    }

    fn horizon_ns(&self) -> u64 {
        match self.mode {
            Mode::Safety => SAFETY_HORIZON_NS,
            Mode::Liveness => LIVENESS_HORIZON_NS,
        }
    }

    fn fresh(&self, p: usize, generation: u8) -> Proc {
        Proc {
            machine: Lifecycle::new(&self.config, incarnation(p, generation)),
            generation,
            timers: [None; 2],
            killer: None,
            paused_until_ns: None,
            services: None,
            stopping: false,
            stop_services: false,
            services_stopped: false,
            monitor_stopped: false,
            released: false,
        }
    }

    /// Starts process `p` as a new incarnation and launches it. The old one is gone: if it
    /// wrote a record, its lock is free now, which the others' feeds report (`SlotChanged`).
    fn start(&self, world: &mut World, p: usize, generation: u8) {
        let old = (p as u8, world.procs[p].generation);
        world.procs[p] = self.fresh(p, generation);
        world
            .msgs
            .retain(|m| m.process() != p || matches!(m, Msg::Request { .. }));
        self.handle(world, p, |now| VvmEvent::Launch { now });
        if world.store.iter().flatten().any(|r| r.writer == old) {
            self.lock_freed(world, p);
        }
    }

    /// The feeds of every other running process report a slot change.
    fn lock_freed(&self, world: &mut World, except: usize) {
        for q in (0..PROCESSES).filter(|&q| q != except) {
            if world.procs[q].paused_until_ns.is_none() {
                self.handle(world, q, |now| VvmEvent::SlotChanged { now });
            }
        }
    }

    /// Whether the store takes the writer of `record` for dead: its slot's lock is free.
    fn holder_dead(&self, world: &World, record: &Record) -> bool {
        let (p, generation) = (record.writer.0 as usize, record.writer.1);
        let proc = &world.procs[p];
        let gone = proc.generation != generation;
        match self.lock {
            LockRule::Sound => gone,
            LockRule::FreedAtLoss => gone || proc.machine.leadership().held().is_none(),
        }
    }

    fn faults_allowed(&self, world: &World) -> bool {
        match self.mode {
            Mode::Safety => true,
            Mode::Liveness => world.now_ns < FAULTS_UNTIL_NS,
        }
    }

    /// Runs one event through process `p`'s machine and performs the effects; the host's
    /// answers (services started or stopped, shutdown on a problem) follow at once.
    fn handle(&self, world: &mut World, p: usize, event: impl FnOnce(Instant) -> VvmEvent) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let mut queue = vec![event(now)];
        while let Some(event) = queue.pop() {
            let proc = &mut world.procs[p];
            if matches!(event, VvmEvent::ServicesStopped { .. }) {
                proc.services_stopped = true;
            }
            let mut out = Effects::new();
            proc.machine.handle(&event, &mut out);
            let generation = proc.generation;
            let mut finished = false;
            // Under the unsound rule the lock goes with the lease; the feeds see it go.
            let ended = out
                .iter()
                .any(|e| matches!(e, Effect::Lost { .. } | Effect::Released { .. }));
            if ended && self.lock == LockRule::FreedAtLoss {
                self.lock_freed(world, p);
            }
            for effect in out.iter().copied() {
                let proc = &mut world.procs[p];
                match effect {
                    Effect::Insert { .. }
                    | Effect::CompareAndSwap { .. }
                    | Effect::CompareAndDelete { .. }
                    | Effect::Get { .. } => {
                        let write = matches!(
                            effect,
                            Effect::Insert { .. } | Effect::CompareAndSwap { .. }
                        );
                        world.order_broken |= write && proc.monitor_stopped;
                        world.msgs.push(Msg::Request {
                            p: p as u8,
                            generation,
                            effect,
                            answered: false,
                        });
                    }
                    Effect::SetTimer { timer, at } => {
                        proc.timers[timer.kind as usize] = Some((timer, at.as_nanos()))
                    }
                    Effect::ArmKiller { at } => proc.killer = Some(at.as_nanos()),
                    Effect::DisarmKiller => {
                        world.order_broken |= proc.services.is_some();
                        proc.killer = None;
                    }
                    Effect::StartServices { token } => {
                        proc.services = Some(token);
                        queue.insert(0, VvmEvent::ServicesStarted { now })
                    }
                    Effect::Renewed { token } => {
                        if let Some(services) = proc.services.as_mut() {
                            *services = token;
                        }
                    }
                    Effect::StopServices => {
                        proc.stop_services = true;
                        if proc.services.is_some() {
                            proc.stopping = true;
                        } else {
                            queue.insert(0, VvmEvent::ServicesStopped { now, clean: true });
                        }
                    }
                    Effect::MonitorStopped => {
                        world.order_broken |= proc.stop_services && !proc.services_stopped;
                        proc.monitor_stopped = true;
                    }
                    Effect::Released { .. } => {
                        world.order_broken |= !proc.monitor_stopped;
                        proc.released = true;
                    }
                    Effect::Finished { .. } => {
                        world.order_broken |= !(proc.monitor_stopped && proc.released);
                        finished = true;
                    }
                    Effect::ProblemRaised { .. } => queue.insert(0, VvmEvent::Shutdown { now }),
                    _ => {}
                }
            }
            if finished {
                // The process exits; its supervisor starts it again.
                let generation = world.procs[p].generation + 1;
                self.start(world, p, generation);
                return;
            }
        }
    }

    /// The store applies `effect` of process `p` atomically now.
    fn apply(&self, world: &mut World, p: usize, generation: u8, effect: &Effect) -> (OpId, Reply) {
        let now_ns = world.now_ns;
        let who = (p as u8, generation);
        let index = |slot: Slot| slot.0 as usize - 1;
        let live = |world: &World, slot: Slot| {
            world.store[index(slot)]
                .clone()
                .filter(|r| now_ns < r.expires_ns)
        };
        let write = |world: &mut World, slot: Slot| {
            world.revision += 1;
            world.store[index(slot)] = Some(Record {
                writer: who,
                revision: world.revision,
                expires_ns: now_ns + LEASE_NS,
            });
            Reply::Written(vvm_core::Revision(world.revision))
        };
        match *effect {
            Effect::Insert { op, slot, .. } => match live(world, slot) {
                // Another holder's record, whose holder is gone: taken at once.
                Some(r) if r.writer != who && self.holder_dead(world, &r) => {
                    world.dead_takeovers = world.dead_takeovers.saturating_add(1);
                    (op, write(world, slot))
                }
                Some(r) => {
                    let left = Duration::from_nanos(r.expires_ns - now_ns);
                    (op, Reply::Held(left))
                }
                None => match world.removed[index(slot)].clone() {
                    // Removed from outside without a release: nobody but its writer may take
                    // the slot before the removed record would have expired.
                    Some(r) if r.writer != who && now_ns < r.expires_ns => {
                        let left = Duration::from_nanos(r.expires_ns - now_ns);
                        (op, Reply::Held(left))
                    }
                    _ => {
                        world.removed[index(slot)] = None;
                        (op, write(world, slot))
                    }
                },
            },
            Effect::CompareAndSwap {
                op, slot, expected, ..
            } => match live(world, slot) {
                Some(r) if r.writer == who && r.revision == expected.0 => (op, write(world, slot)),
                _ => (op, Reply::Rejected),
            },
            Effect::CompareAndDelete { op, slot, expected } => match live(world, slot) {
                Some(r) if r.writer == who && r.revision == expected.0 => {
                    world.store[index(slot)] = None;
                    (op, Reply::Deleted)
                }
                _ => (op, Reply::Rejected),
            },
            Effect::Get { op, slot } => {
                let found = live(world, slot).map(|r| vvm_core::Record {
                    incarnation: incarnation(r.writer.0 as usize, r.writer.1),
                    revision: vvm_core::Revision(r.revision),
                });
                (op, Reply::Found(found))
            }
            ref other => unreachable!("not a store call: {other:?}"),
        }
    }

    /// An answer reaches process `p`: handled now, or kept while `p` is paused.
    fn answer(&self, world: &mut World, p: usize, generation: u8, op: OpId, reply: Reply) {
        if world.procs[p].generation != generation {
            return;
        }
        if world.procs[p].paused_until_ns.is_some() {
            world.msgs.push(Msg::Answer {
                p: p as u8,
                generation,
                op,
                reply,
            });
            return;
        }
        self.handle(world, p, |now| VvmEvent::Reply { now, op, reply });
    }

    /// Acting leaders: processes whose services were started and have not all stopped. A
    /// process killed at its deadline restarts without services, so its killer ends acting too.
    fn acting(world: &World) -> impl Iterator<Item = (usize, FencingToken)> + '_ {
        world
            .procs
            .iter()
            .enumerate()
            .filter_map(|(p, proc)| Some((p, proc.services?)))
    }

    /// Processes whose services may report stopped now.
    fn may_stop(world: &World, p: usize) -> bool {
        let proc = &world.procs[p];
        proc.stopping && proc.paused_until_ns.is_none()
    }

    /// The next instant after now at which something is due.
    fn next_instant(world: &World) -> Option<u64> {
        let now_ns = world.now_ns;
        let due = world.procs.iter().enumerate().flat_map(|(p, proc)| {
            proc.timers
                .iter()
                .flatten()
                .map(move |&(_, at)| true_at(p, at))
                .chain(proc.killer.map(|at| true_at(p, at)))
                .chain(proc.paused_until_ns)
        });
        let expiries = world.store.iter().flatten().map(|r| r.expires_ns);
        let cuts = world.cut_until_ns.iter().flatten().copied();
        due.chain(expiries)
            .chain(cuts)
            .chain([FAULTS_UNTIL_NS])
            .filter(|&at| at > now_ns)
            .min()
    }

    /// The oldest message of process `p` that may move now.
    fn oldest(world: &World, p: usize) -> Option<usize> {
        let paused = world.procs[p].paused_until_ns.is_some();
        world
            .msgs
            .iter()
            .position(|m| m.process() == p && (matches!(m, Msg::Request { .. }) || !paused))
    }

    /// After any step: record the tokens acting leaders use, so that going back is seen.
    fn observe(world: &mut World) {
        let acting: Vec<(usize, FencingToken)> = Self::acting(world).collect();
        for (p, token) in acting {
            let slot = token.slot.0 as usize - 1;
            world.token_went_back |= token.revision.0 < world.highest[slot];
            world.highest[slot] = world.highest[slot].max(token.revision.0);
            let actor = (p as u8, world.procs[p].generation);
            if world.last_actor[slot].is_some_and(|last| last != actor) {
                world.handovers = world.handovers.saturating_add(1);
            }
            world.last_actor[slot] = Some(actor);
        }
    }
}

impl Model for LeaseModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let mut world = World {
            now_ns: 0,
            procs: (0..PROCESSES).map(|p| self.fresh(p, 0)).collect(),
            store: [None, None],
            revision: 0,
            msgs: Vec::new(),
            faults: 0,
            crashes: 0,
            shutdowns: 0,
            pauses: 0,
            cutoffs: 0,
            removals: 0,
            removed: [None, None],
            vanish_ignored: false,
            vanish_stops: 0,
            cut_until_ns: [None; PROCESSES],
            highest: [0; SLOTS],
            handovers: 0,
            last_actor: [None; SLOTS],
            token_went_back: false,
            order_broken: false,
            dead_takeovers: 0,
        };
        for p in 0..PROCESSES {
            self.start(&mut world, p, 0);
        }
        vec![world]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        let adversary = self.faults_allowed(world);
        if !adversary {
            // Fair and prompt: services asked to stop stop before anything else happens.
            if let Some(p) = (0..PROCESSES).find(|&p| Self::may_stop(world, p)) {
                actions.push(Action::ServicesStop(p));
                return;
            }
        }
        for p in 0..PROCESSES {
            if adversary && Self::may_stop(world, p) {
                actions.push(Action::ServicesStop(p));
            }
            let Some(i) = Self::oldest(world, p) else {
                continue;
            };
            actions.push(Action::Deliver(p));
            if !adversary {
                // Fair and prompt: one process at a time, in order.
                return;
            }
            let fresh_request = matches!(
                world.msgs[i],
                Msg::Request {
                    answered: false,
                    ..
                }
            );
            if fresh_request && world.faults < self.budget.faults {
                actions.extend(FAULTS.iter().map(|&fault| Action::Fault(p, fault)));
            }
        }
        // Time moves on only once every request has been answered (stragglers aside).
        let waiting = world.msgs.iter().any(|m| {
            let p = m.process();
            let paused = world.procs[p].paused_until_ns.is_some();
            matches!(
                m,
                Msg::Request {
                    answered: false,
                    ..
                }
            ) || (matches!(m, Msg::Answer { .. }) && !paused && !adversary)
        });
        if !waiting && Self::next_instant(world).is_some() {
            actions.push(Action::Advance);
        }
        if !adversary {
            return;
        }
        for p in 0..PROCESSES {
            if world.crashes < self.budget.crashes {
                actions.push(Action::Crash(p));
            }
            if self.mode == Mode::Safety && world.shutdowns < self.budget.shutdowns {
                actions.push(Action::Shutdown(p));
            }
            if self.mode == Mode::Safety && world.cutoffs < self.budget.cutoffs {
                actions.push(Action::CutOff(p));
            }
            if self.mode == Mode::Safety
                && p < SLOTS
                && world.removals < self.budget.removals
                && world.store[p]
                    .as_ref()
                    .is_some_and(|r| world.now_ns < r.expires_ns)
            {
                actions.push(Action::Remove(p));
            }
            if world.pauses < self.budget.pauses && world.procs[p].paused_until_ns.is_none() {
                actions.extend(PAUSES_NS.iter().map(|&d| Action::Pause(p, d)));
            }
        }
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Deliver(p) => {
                let i = Self::oldest(&world, p)?;
                match world.msgs.remove(i) {
                    Msg::Request {
                        generation,
                        effect,
                        answered,
                        ..
                    } => {
                        let (op, reply) = self.apply(&mut world, p, generation, &effect);
                        let cut = world.cut_until_ns[p].is_some_and(|u| world.now_ns < u)
                            && !matches!(effect, Effect::Get { .. });
                        let reply = if cut { Reply::Unknown } else { reply };
                        if !answered {
                            self.answer(&mut world, p, generation, op, reply);
                        }
                    }
                    Msg::Answer {
                        generation,
                        op,
                        reply,
                        ..
                    } => self.answer(&mut world, p, generation, op, reply),
                }
            }
            Action::Fault(p, fault) => {
                let i = Self::oldest(&world, p)?;
                let Msg::Request {
                    generation, effect, ..
                } = world.msgs.remove(i)
                else {
                    return None;
                };
                world.faults += 1;
                let op = store_op(&effect);
                match fault {
                    Fault::Fail => self.answer(&mut world, p, generation, op, Reply::Failed),
                    Fault::Lose => self.answer(&mut world, p, generation, op, Reply::Unknown),
                    Fault::LoseAnswer => {
                        self.apply(&mut world, p, generation, &effect);
                        self.answer(&mut world, p, generation, op, Reply::Unknown);
                    }
                    Fault::Late => {
                        world.msgs.push(Msg::Request {
                            p: p as u8,
                            generation,
                            effect,
                            answered: true,
                        });
                        self.answer(&mut world, p, generation, op, Reply::Unknown);
                    }
                    Fault::SlowAnswer => {
                        let (op, reply) = self.apply(&mut world, p, generation, &effect);
                        world.msgs.push(Msg::Answer {
                            p: p as u8,
                            generation,
                            op,
                            reply,
                        });
                    }
                }
            }
            Action::Advance => {
                world.now_ns = Self::next_instant(&world)?;
                for p in 0..PROCESSES {
                    let proc = &world.procs[p];
                    if proc.killer.is_some_and(|at| local(p, world.now_ns) >= at) {
                        // Killed at its deadline, paused or not; its supervisor restarts it.
                        let generation = proc.generation + 1;
                        self.start(&mut world, p, generation);
                        continue;
                    }
                    if proc
                        .paused_until_ns
                        .is_some_and(|until| until <= world.now_ns)
                    {
                        world.procs[p].paused_until_ns = None;
                    }
                    if world.procs[p].paused_until_ns.is_some() {
                        continue;
                    }
                    for kind in 0..2 {
                        let due = world.procs[p].timers[kind]
                            .filter(|&(_, at)| local(p, world.now_ns) >= at);
                        if let Some((timer, _)) = due {
                            world.procs[p].timers[kind] = None;
                            self.handle(&mut world, p, |now| VvmEvent::Timer { now, timer });
                        }
                    }
                }
            }
            Action::Crash(p) => {
                world.crashes += 1;
                let generation = world.procs[p].generation + 1;
                self.start(&mut world, p, generation);
            }
            Action::Shutdown(p) => {
                world.shutdowns += 1;
                self.handle(&mut world, p, |now| VvmEvent::Shutdown { now });
            }
            Action::CutOff(p) => {
                world.cutoffs += 1;
                world.cut_until_ns[p] = Some(world.now_ns + CUT_NS);
            }
            Action::Remove(s) => {
                let record = world.store[s].take()?;
                world.removals += 1;
                world.removed[s] = Some(record.clone());
                let (p, generation) = (record.writer.0 as usize, record.writer.1);
                let holder = &world.procs[p];
                if holder.generation == generation && holder.paused_until_ns.is_none() {
                    let slot = Slot(s as u32 + 1);
                    let leading = holder.machine.watches_own_record() == Some(slot);
                    let serving = matches!(
                        holder.machine.phase(),
                        Phase::StartingServices | Phase::Running
                    );
                    if leading {
                        self.handle(&mut world, p, |now| VvmEvent::RecordVanished { now });
                        let phase = world.procs[p].machine.phase();
                        let went_on = matches!(phase, Phase::StartingServices | Phase::Running);
                        world.vanish_ignored |= serving && went_on;
                        if serving && !went_on {
                            world.vanish_stops = world.vanish_stops.saturating_add(1);
                        }
                    }
                }
                self.lock_freed(&mut world, p);
            }
            Action::Pause(p, duration_ns) => {
                world.pauses += 1;
                world.procs[p].paused_until_ns = Some(world.now_ns + duration_ns);
            }
            Action::ServicesStop(p) => {
                if !Self::may_stop(&world, p) {
                    return None;
                }
                let proc = &mut world.procs[p];
                proc.stopping = false;
                proc.services = None;
                self.handle(&mut world, p, |now| VvmEvent::ServicesStopped {
                    now,
                    clean: true,
                });
            }
        }
        Self::observe(&mut world);
        Some(world)
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now_ns <= self.horizon_ns()
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("at most one acting leader per slot", |_, world: &World| {
                (1..=SLOTS as u32).all(|slot| {
                    LeaseModel::acting(world)
                        .filter(|(_, token)| token.slot == Slot(slot))
                        .count()
                        <= 1
                })
            }),
            Property::always("fencing tokens never go back", |_, world: &World| {
                !world.token_went_back
            }),
            Property::always("shutdown effects in order", |_, world: &World| {
                !world.order_broken
            }),
            Property::always(
                "a holder told that its record vanished stops its services",
                |_, world: &World| !world.vanish_ignored,
            ),
        ];
        if self.mode == Mode::Safety && self.budget.removals > 0 {
            properties.push(Property::sometimes(VANISH_STOPS, |_, world: &World| {
                world.vanish_stops > 0
            }));
        }
        if self.mode == Mode::Safety && self.budget.crashes > 0 && self.budget.faults == 0 {
            properties.push(Property::sometimes(DEAD_TAKEOVER, |_, world: &World| {
                world.dead_takeovers > 0
            }));
        }
        match self.mode {
            Mode::Safety => properties.extend([
                Property::sometimes("a slot changes hands", |_, world: &World| {
                    world.handovers > 0
                }),
                Property::sometimes("a process is shut down and replaced", |_, world: &World| {
                    world.shutdowns > 0 && world.procs.iter().any(|p| p.generation > 0)
                }),
            ]),
            Mode::Liveness => properties.push(Property::eventually(
                "every slot is taken after the faults",
                |_, world: &World| {
                    world.now_ns >= FAULTS_UNTIL_NS
                        && (1..=SLOTS as u32).all(|slot| {
                            LeaseModel::acting(world).any(|(_, t)| t.slot == Slot(slot))
                        })
                },
            )),
        }
        properties
    }
}

fn store_op(effect: &Effect) -> OpId {
    match *effect {
        Effect::Insert { op, .. }
        | Effect::CompareAndSwap { op, .. }
        | Effect::CompareAndDelete { op, .. }
        | Effect::Get { op, .. } => op,
        ref other => unreachable!("not a store call: {other:?}"),
    }
}

/// Runs the checker; fails with the steps of every counterexample, and when a `sometimes`
/// property has no example (the search would be too shallow to mean anything).
fn check(mode: Mode, budget: Budget, search: Search) {
    let failures = check_with(mode, budget, search, LockRule::Sound);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Runs the checker with the store's dead-holder fact `lock`; returns every counterexample and
/// every `sometimes` property without an example.
fn check_with(mode: Mode, budget: Budget, search: Search, lock: LockRule) -> Vec<String> {
    let label = format!("model check ({mode:?}, {budget:?}, {lock:?})");
    let found = explore(
        LeaseModel::new(mode, budget, lock),
        search,
        0x5EED,
        None,
        &label,
    );
    let mut failures: Vec<String> = found.violated.into_iter().map(|(_, text)| text).collect();
    // Without an example the dead-holder check would check nothing new: required also of an
    // exhaustive search.
    let random = matches!(search, Search::Random { .. });
    failures.extend(
        found
            .unreached
            .into_iter()
            .filter(|&name| random || name == DEAD_TAKEOVER || name == VANISH_STOPS)
            .map(|name| format!("no run reached \"{name}\": the model explores too little")),
    );
    failures
}

// covers: Verify.Safety, Verify.TokenOrder, Verify.ShutdownOrder
// covers: Lease.Invariants, processKillThreshold, Lease.DeadlineOnlyLaterOnConfirm
// covers: Lease.FencingToken, Lease.UnknownOutcome, Lease.Incarnation, VVM.Shutdown
/// Safety over every interleaving up to the depth bound (`VVM_MODEL_DEPTH`): faults, a crash, a
/// shutdown, a pause, slow and late messages, clocks 10 % slow and fast.
#[test]
fn safety_every_run_to_a_depth() {
    let depth = env_usize("VVM_MODEL_DEPTH").unwrap_or(SAFETY_DEPTH);
    // A cut-off needs dozens of steps to matter; within the depth bound it only multiplies the
    // runs. `safety_of_a_cut_off_holder_every_run` explores it to the horizon instead. So does
    // `safety_of_a_record_removed_from_outside_every_run` a removal: with it at depth 7 the check
    // holds too (3 047 009 unique states instead of 2 043 324: ≈ 50 % more time in every test run).
    let budget = Budget {
        cutoffs: 0,
        removals: 0,
        ..FULL
    };
    check(Mode::Safety, budget, Search::Exhaustive(Some(depth)));
}

/// Depth of the exhaustive safety check: every run of this many steps is explored.
const SAFETY_DEPTH: usize = 7;

// covers: Lease.Invariants, LeadershipMonitor
/// Safety over long random runs (past kill deadlines and expiries, which the exhaustive check
/// does not reach): the same adversary, seeded, `VVM_MODEL_STATES` states.
#[test]
fn safety_random_long_runs() {
    let states = env_usize("VVM_MODEL_STATES").unwrap_or(SAFETY_RANDOM_STATES);
    check(Mode::Safety, FULL, Search::Random { depth: 400, states });
}

/// The adversary of the cut-off check: one holder's answers lost for [`CUT_NS`], its services
/// as slow to stop as the scheduler likes; nothing else.
const CUT: Budget = Budget {
    faults: 0,
    crashes: 0,
    shutdowns: 0,
    pauses: 0,
    cutoffs: 1,
    removals: 0,
};

// covers: Verify.Safety, VVM.LossKeepsRecord, Lease.RetryUntilDeadline
/// A holder whose writes commit but whose answers are all lost gives up renewing while its
/// services may still run: every run to the horizon, every moment of the cut-off and of the
/// services' stop. Acting is judged by what runs, so a record deleted on the loss path (a
/// successor starting beside services that have not stopped) is a violation here.
#[test]
fn safety_of_a_cut_off_holder_every_run() {
    check(Mode::Safety, CUT, Search::Exhaustive(None));
}

/// States visited by the random safety check.
const SAFETY_RANDOM_STATES: usize = 300_000;

// covers: Verify.Liveness, VVM.tryToAcquireLeadership
/// Liveness under fair scheduling: whatever one fault and one crash do before
/// `FAULTS_UNTIL_NS`, once the store and the processes are prompt again every slot gets an
/// acting leader. Every run to the horizon is explored.
#[test]
fn liveness_every_run() {
    check(Mode::Liveness, SMALL, Search::Exhaustive(None));
}

// covers: Verify.Liveness, VVM.tryToAcquireLeadership
/// Liveness against the full adversary (two faults, a crash, a pause) over random runs; each run
/// ends at the horizon, where the property is judged.
#[test]
fn liveness_random_runs() {
    let states = env_usize("VVM_MODEL_STATES").unwrap_or(LIVENESS_RANDOM_STATES);
    check(Mode::Liveness, FULL, Search::Random { depth: 400, states });
}

/// The adversary of the dead-holder check: one crash of anyone at any moment, services as slow
/// to stop as the scheduler likes; nothing else.
const CRASH: Budget = Budget {
    faults: 0,
    crashes: 1,
    shutdowns: 0,
    pauses: 0,
    cutoffs: 0,
    removals: 0,
};

// covers: Verify.DeadHolder, Sq.DeadHolder
/// A holder taken for dead by the store (its lock free: its process and services gone) is
/// succeeded at once, with the record still live: every run to the horizon with one crash, and
/// the successor does take a slot early in some run.
#[test]
fn safety_of_taking_a_dead_holders_slot_every_run() {
    check(Mode::Safety, CRASH, Search::Exhaustive(None));
}

// covers: Verify.DeadHolder
/// The same checks find two acting leaders when the fact is unsound: a lock let go when the
/// holder's leadership ends (a loss while its writes' answers are lost), while its services may
/// still be stopping.
#[test]
fn an_unsound_dead_holder_fact_is_caught() {
    let failures = check_with(
        Mode::Safety,
        CUT,
        Search::Exhaustive(None),
        LockRule::FreedAtLoss,
    );
    assert!(
        failures
            .iter()
            .any(|f| f.contains("at most one acting leader per slot")),
        "no overlap found with an unsound dead-holder fact: {failures:#?}"
    );
}

/// States visited by the random liveness check.
const LIVENESS_RANDOM_STATES: usize = 200_000;

/// The adversary of the removal check: one live record removed from outside at any moment,
/// services as slow to stop as the scheduler likes; nothing else.
const REMOVE: Budget = Budget {
    faults: 0,
    crashes: 0,
    shutdowns: 0,
    pauses: 0,
    cutoffs: 0,
    removals: 1,
};

// covers: Verify.Safety, VVM.VanishedStops, Lease.VanishedLoses, Sq.RecordDeleted, Et.RecordRemoved
/// A live record removed from outside (its holder told at once by its watch, the others by the
/// feed): every run to the horizon. The holder stops its services at once and loses without a
/// delete; a successor takes the slot only once the removed record would have expired, so two
/// leaders never act — and some run does see a holder stop at once.
#[test]
fn safety_of_a_record_removed_from_outside_every_run() {
    check(Mode::Safety, REMOVE, Search::Exhaustive(None));
}
