//! A deterministic simulator of processes that acquire and release units of one counted
//! semaphore under their sessions.
//!
//! Every process runs the real [`Session`] machine and, for its one acquire at a time, the life
//! the runtime gives it (`runtime/src/semaphore/grant.rs`): the holding attached to the alive
//! session (S29) before the acquire is sent, with a random count (1 to the limit) and a random
//! timeout (0: try once; short; long); granted → services start (**acting** with the count);
//! queued → the process waits, subscribed to the semaphore's feed, and looks (one transaction,
//! a describe) when the feed wakes it or when the soonest expiry of another party's session (as
//! the last answer reported) comes, on its own clock; when its timeout passes it cancels the
//! request (`cancel_waiter_timeout`), keeping a grant that came first. A failed look ends the
//! wait and withdraws the request with a release. An owner holds for a random time, stops its
//! services, then releases. On the session's one `Lost`, services are told to stop (acting
//! until they have, slow stops up to `2·L`) and the holding is detached only then; a waiter's
//! wait ends at once. A new session is opened once nothing is attached. The session's calls run
//! under the store-call timeout; its killer ends the process at its kill deadline, even while it
//! is paused.
//!
//! The store ([`store`]) runs every semaphore operation as the real core method in one
//! transaction (session checked live, dead parties removed first, a write wakes the feed);
//! the feed reaches each subscriber after a random push delay up to
//! [`SemaphoreParams::feed_delay_max_ns`].
//!
//! A semaphore call that reaches the store after its caller's timeout gave up on it is dropped
//! unless [`SemaphoreParams::stale_calls`]; then it lands late, and its request id keeps it from
//! acting on the session's later requests (a late release would otherwise end a later grant
//! while its services run). Session calls may always arrive late.
//!
//! The faults are the leadership simulator's ([`Params::random`]): store errors, unknown outcomes
//! (committed or not), latency, hung calls, store outages, pauses up to `3·L` (also right after
//! a call), crashes with restart, clock-rate error up to 10 %; and services slow to stop.
//!
//! The oracle judges what users see:
//!
//! - the owners whose services run hold at most the limit together, at every instant;
//! - grants go in queue order (the store's [`store::Ledger`]);
//! - a waiter the store grants is woken by the feed within the push delay (the notification
//!   reaches the process, paused or not), and no process still waits, at the end of a run, on a
//!   grant the store made long before.
//!
//! [`Params::random`]: crate::params::Params::random

mod params;
pub mod store;

use std::collections::{BTreeMap, HashSet, VecDeque};

use vvm_core::semaphore::{RequestId, SessionKey};
use vvm_core::{
    HoldingId, Incarnation, Instant, LeaseConfig, OpId, Reply, Session, SessionEffect,
    SessionEffects, SessionEvent, TimerId,
};

use crate::clock::LocalClock;
use crate::oracle::{ProcessId, Violation};
use crate::params::{Fate, Outcome};
use crate::queue::{EventQueue, Ticket};
use crate::rng::Rng;
use crate::store::Writer;
use store::{Answer, Call, Effects, Request, SemAnswer, SemaphoreStoreModel};

pub use params::{Rule, SemaphoreParams, SemaphoreStats};

/// The least pause before a look at a party's expiry (the runtime's `EXPIRY_LOOK_MIN`).
const EXPIRY_LOOK_MIN_NS: u64 = 1_000_000;

/// An input of a process, before it carries a time. Inputs of an acquire carry its episode:
/// one that arrives after the acquire ended is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Input {
    /// Open a session.
    Open,
    /// Acquire (after thinking).
    Acquire,
    Timer(TimerId),
    Reply(OpId, Reply),
    /// The answer of the semaphore call `op`.
    Sem(u64, SemAnswer),
    /// The feed woke the process.
    Wake(u64),
    /// The look at another party's expiry is due.
    ExpiryLook(u64),
    /// The waiter's timeout passed.
    WaitTimeout(u64),
    /// The owner is done: it stops its services.
    HoldEnd(u64),
    /// The services stopped.
    Stopped(u64),
}

enum Ev {
    Input(ProcessId, Input),
    /// A store call reaches the store; with its caller's timeout when not queued yet.
    Arrive(ProcessId, Writer, Call, Fate, Option<(u64, Ticket)>),
    /// The feed's notification reaches a process.
    Wake(ProcessId, u64),
    /// The oracle checks that the waiter granted at `.2` was woken.
    CheckWoken(ProcessId, u64, u64),
    Kill(ProcessId, u64),
    Resume(ProcessId),
    Start(u32),
    RandomPause(ProcessId),
    RandomCrash(ProcessId),
}

/// The acquire of one process, as the runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acq {
    /// Nothing attached.
    Idle,
    /// Attached; the acquire `op` is in flight, sent at local `sent_ns`.
    Acquiring {
        op: u64,
        count: u64,
        timeout_ms: u64,
        sent_ns: u64,
    },
    /// Queued; waiting for the feed, an expiry look or the timeout.
    Waiting { count: u64 },
    /// Queued; the look `op` is in flight (a cancel when `cancel`).
    Looking { op: u64, count: u64, cancel: bool },
    /// Granted and seen: services run with `count` units.
    Running { count: u64 },
    /// Services told to stop; acting until they have; then released if `release`.
    Stopping { count: u64, release: bool },
    /// The release `op` is in flight (after the services stopped, or withdrawing a request).
    Releasing { op: u64 },
}

impl Acq {
    fn subscribed(self) -> bool {
        matches!(
            self,
            Acq::Acquiring { .. } | Acq::Waiting { .. } | Acq::Looking { .. }
        )
    }

    fn acting(self) -> Option<u64> {
        match self {
            Acq::Running { count } | Acq::Stopping { count, .. } => Some(count),
            _ => None,
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
    acq: Acq,
    /// Numbers the acquires: inputs of an ended one are ignored.
    episode: u64,
    /// The feed fired while a look was in flight: look again.
    woken_in_look: bool,
    /// The waiter's timeout passed while a look was in flight: cancel next.
    timed_out: bool,
    /// The units this process start asks for, unless counts vary per acquire.
    count: u64,
    /// The request id of the last acquire sent: a timeout cancels that one.
    acquire_request: RequestId,
}

/// One position: a process that restarts as new incarnations.
struct Place {
    generation: u32,
    live: Option<Live>,
}

/// The simulation of one semaphore.
pub struct SemaphoreSim {
    params: SemaphoreParams,
    lease: LeaseConfig,
    rng: Rng,
    now_ns: u64,
    queue: EventQueue<Ev>,
    store: SemaphoreStoreModel,
    places: Vec<Place>,
    trace: Option<Vec<String>>,
    outages: Vec<(u64, u64, Outcome)>,
    incarnations: HashSet<u64>,
    sem_ops: u64,
    /// Units each process acts with now.
    acting: BTreeMap<ProcessId, u64>,
    /// Waiters the store granted whose notification has not reached them: who, which
    /// acquire, when granted.
    unwoken: Vec<(ProcessId, u64, u64)>,
    violations: Vec<Violation>,
    stats: SemaphoreStats,
}

impl SemaphoreSim {
    /// A simulation of `params` whose every random choice comes from `seed`.
    pub fn new(seed: u64, params: SemaphoreParams) -> Self {
        let base = &params.base;
        let lease = LeaseConfig::new(base.lease).expect("simulation lease is valid");
        let mut sim = SemaphoreSim {
            lease,
            rng: Rng::new(seed),
            now_ns: 0,
            queue: EventQueue::default(),
            store: SemaphoreStoreModel::new(params.limit, params.rule),
            places: (0..base.processes)
                .map(|_| Place {
                    generation: 0,
                    live: None,
                })
                .collect(),
            trace: None,
            outages: Vec::new(),
            incarnations: HashSet::new(),
            sem_ops: 0,
            acting: BTreeMap::new(),
            unwoken: Vec::new(),
            violations: Vec::new(),
            stats: SemaphoreStats::default(),
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
    pub fn params(&self) -> &SemaphoreParams {
        &self.params
    }

    /// Counts so far.
    pub fn stats(&self) -> SemaphoreStats {
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

    /// Every violation so far, with those judged at the end: a process still waiting on a
    /// grant the store made more than a lease ago (plus the feed's delay) never learnt of it.
    pub fn check(&self) -> Vec<Violation> {
        let mut violations = self.violations.clone();
        let late_ns = self.params.base.lease_ns() + self.params.feed_delay_max_ns;
        for &(id, episode, granted_ns) in &self.unwoken {
            let waits = self.places[id.index as usize]
                .live
                .as_ref()
                .is_some_and(|l| l.id == id && l.episode == episode && l.acq.subscribed());
            if waits && granted_ns + late_ns < self.now_ns {
                violations.push(Violation::Other {
                    process: id,
                    at_ns: granted_ns,
                    text: format!("{id} was granted at {granted_ns} ns and still waits"),
                });
            }
        }
        violations
    }

    fn flag(&mut self, process: ProcessId, text: String) {
        self.note(process, || format!("VIOLATION: {text}"));
        self.violations.push(Violation::Other {
            process,
            at_ns: self.now_ns,
            text,
        });
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
            Ev::Wake(id, episode) => {
                // The notification reached the process (handled now, or once it resumes).
                self.unwoken.retain(|&(p, e, _)| (p, e) != (id, episode));
                self.deliver(id, Input::Wake(episode));
            }
            Ev::CheckWoken(id, episode, granted_ns) => {
                let at = self
                    .unwoken
                    .iter()
                    .position(|&entry| entry == (id, episode, granted_ns));
                if at.is_some() {
                    let text = format!(
                        "{id} was granted at {granted_ns} ns and not woken within the feed's \
                         delay"
                    );
                    self.flag(id, text);
                }
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
        }
    }

    /// A pause length: mostly short, often near the kill threshold or the lease.
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
        let count = self.rng.between(1, self.params.limit);
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
            acq: Acq::Idle,
            episode: 0,
            woken_in_look: false,
            acquire_request: RequestId(0),
            timed_out: false,
            count,
        });
        self.stats.starts += 1;
        self.note(id, || {
            format!("started {incarnation:?}, clock rate error {rate_ppm} ppm")
        });
        self.deliver(id, Input::Open);
        let faults = self.params.base.faults.clone();
        self.random_next(id, faults.pause_gap_ns, Ev::RandomPause(id));
        self.random_next(id, faults.crash_gap_ns, Ev::RandomCrash(id));
    }

    /// The process ends with everything it runs: its killer fired, or it crashed.
    fn die(&mut self, id: ProcessId, killer: bool) {
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let acting = live.acq.acting().is_some();
        self.places[id.index as usize].live = None;
        self.set_acting(id, None);
        self.unwoken.retain(|&(p, _, _)| p != id);
        if killer {
            self.stats.killed_while_owning += u64::from(acting);
        } else {
            self.stats.crashed += 1;
        }
        self.note(id, || {
            format!("died: {}", if killer { "killer" } else { "crash" })
        });
        let at_ns = self.now_ns + self.rng.between(0, self.params.base.restart_delay_max_ns);
        self.schedule(at_ns, Ev::Start(id.index));
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

    fn local_ns(&mut self, id: ProcessId) -> u64 {
        let now_ns = self.now_ns;
        self.live(id).clock.local(now_ns)
    }

    /// Schedules `input` for `id` when its local clock reads `local_ns`.
    fn at_local(&mut self, id: ProcessId, local_ns: u64, input: Input) {
        let at_ns = self.live(id).clock.true_at(local_ns);
        self.schedule(at_ns, Ev::Input(id, input));
    }

    /// Runs one input through the process, as the runtime's session task and acquire do.
    fn handle(&mut self, id: ProcessId, input: Input) {
        if self.live_mut(id).is_none() {
            return;
        }
        self.stats.events += 1;
        let live = self.live(id);
        let episode = live.episode;
        match input {
            Input::Open => {
                let session = &live.session;
                if session.is_closed() || (session.is_lost() && session.holdings() == 0) {
                    self.session_event(id, |now| SessionEvent::Open { now });
                }
            }
            Input::Timer(timer) => {
                if live.timer == Some(timer) {
                    live.timer = None;
                    self.session_event(id, |now| SessionEvent::Timer { now, timer });
                }
            }
            Input::Reply(op, reply) => {
                // The first of the reply and the timeout wins; the other is dropped.
                if live.pending == Some(op) {
                    live.pending = None;
                    self.session_event(id, |now| SessionEvent::Reply { now, op, reply });
                }
            }
            Input::Acquire => self.acquire(id),
            Input::Sem(op, answer) => self.answered(id, op, answer),
            Input::Wake(e) if e == episode => match live.acq {
                Acq::Waiting { count } => self.look(id, count, false),
                Acq::Looking { .. } => live.woken_in_look = true,
                _ => {}
            },
            Input::ExpiryLook(e) if e == episode => {
                if let Acq::Waiting { count } = live.acq {
                    self.look(id, count, false);
                }
            }
            Input::WaitTimeout(e) if e == episode => match live.acq {
                Acq::Waiting { count } => self.look(id, count, true),
                Acq::Looking { .. } => live.timed_out = true,
                _ => {}
            },
            Input::HoldEnd(e) if e == episode => {
                if let Acq::Running { count } = live.acq {
                    self.note(id, || "done: stops its services".to_owned());
                    self.stop_services(id, count, true);
                }
            }
            Input::Stopped(e) if e == episode => {
                if let Acq::Stopping { release, .. } = live.acq {
                    self.set_acting(id, None);
                    if release && self.live(id).session.liveness().is_some() {
                        self.send_sem(id, |request| Request::Release { request });
                    } else {
                        self.give_back(id);
                    }
                }
            }
            Input::Wake(_)
            | Input::ExpiryLook(_)
            | Input::WaitTimeout(_)
            | Input::HoldEnd(_)
            | Input::Stopped(_) => {}
        }
        self.check_killer(id);
    }

    /// `Coordination::acquire`: attach, then send the acquire with a random count and timeout.
    fn acquire(&mut self, id: ProcessId) {
        let live = self.live(id);
        if live.acq != Acq::Idle || live.session.liveness().is_none() {
            return; // the next open acquires again
        }
        let now = Instant::from_nanos(self.local_ns(id));
        let holding = HoldingId(0);
        let mut out = SessionEffects::new();
        self.live(id)
            .session
            .handle(&SessionEvent::Attach { now, holding }, &mut out);
        if out.as_slice() != [SessionEffect::Attached { holding }] {
            self.note(id, || format!("attach refused: {out:?}"));
            return;
        }
        let count = if self.params.counts_vary {
            self.rng.between(1, self.params.limit)
        } else {
            self.live(id).count
        };
        let l_ms = self.params.base.lease_ns() / 1_000_000;
        let timeout_ms = match self.rng.below(5) {
            0 => 0,
            1 | 2 => self.rng.between(1, l_ms / 2),
            _ => self.rng.between(l_ms, 5 * l_ms),
        };
        self.stats.acquires += 1;
        let live = self.live(id);
        live.episode += 1;
        live.woken_in_look = false;
        live.timed_out = false;
        self.note(id, || {
            format!("acquires {count} units, timeout {timeout_ms} ms")
        });
        self.send_sem(id, |request| Request::Acquire {
            count,
            timeout_ms,
            request,
        });
    }

    /// A look of a waiter: a describe, or a cancel once its timeout passed.
    fn look(&mut self, id: ProcessId, count: u64, cancel: bool) {
        let live = self.live(id);
        live.woken_in_look = false;
        live.timed_out = false;
        let acquired = live.acquire_request;
        let op = self.send_sem(id, |_| {
            if cancel {
                Request::Cancel { request: acquired }
            } else {
                Request::Look
            }
        });
        self.live(id).acq = Acq::Looking { op, count, cancel };
    }

    /// Sends a semaphore call, made by `call` from the call's request id (its op number, which
    /// increases in the order calls are made, as the runtime's ids do); sets the acquire's state
    /// for an acquire or a release.
    fn send_sem(&mut self, id: ProcessId, call: impl FnOnce(RequestId) -> Request) -> u64 {
        self.sem_ops += 1;
        let op = self.sem_ops;
        let request = call(RequestId(op));
        let sent_ns = self.local_ns(id);
        let live = self.live(id);
        let session = live.session.id().expect("a session");
        match request {
            Request::Acquire {
                count, timeout_ms, ..
            } => {
                live.acquire_request = RequestId(op);
                live.acq = Acq::Acquiring {
                    op,
                    count,
                    timeout_ms,
                    sent_ns,
                }
            }
            Request::Release { .. } => live.acq = Acq::Releasing { op },
            Request::Look | Request::Cancel { .. } => {}
        }
        self.send(
            id,
            Call::Sem {
                op,
                id: session,
                request,
            },
        );
        op
    }

    /// What the runtime does with a semaphore answer (`grant::acquire`, `wait`, `release`).
    fn answered(&mut self, id: ProcessId, op: u64, answer: SemAnswer) {
        let live = self.live(id);
        let alive = live.session.liveness().is_some();
        let acq = live.acq;
        self.note(id, || format!("answer {answer:?} while {acq:?}"));
        match acq {
            Acq::Acquiring {
                op: sent,
                count,
                timeout_ms,
                sent_ns,
            } if sent == op => match answer {
                SemAnswer::Applied {
                    owns: Some(true), ..
                } => self.granted(id, count, alive),
                SemAnswer::Applied {
                    owns: Some(false),
                    expire_in_ns,
                } if alive => {
                    self.stats.queued += 1;
                    let episode = self.live(id).episode;
                    let deadline_ns = sent_ns.saturating_add(timeout_ms.saturating_mul(1_000_000));
                    self.at_local(id, deadline_ns, Input::WaitTimeout(episode));
                    self.wait(id, count, expire_in_ns);
                }
                // Not granted (a try), refused, failed, unknown, or queued under a session now
                // over: nothing held; what was written after all ends with the session.
                _ => self.give_back(id),
            },
            Acq::Looking {
                op: sent,
                count,
                cancel,
            } if sent == op => match answer {
                SemAnswer::Applied {
                    owns: Some(true), ..
                } => self.granted(id, count, alive),
                SemAnswer::Applied {
                    owns: Some(false),
                    expire_in_ns,
                } if alive && !cancel => {
                    self.wait(id, count, expire_in_ns);
                    let live = self.live(id);
                    if live.timed_out {
                        self.look(id, count, true);
                    } else if live.woken_in_look {
                        self.look(id, count, false);
                    }
                }
                SemAnswer::Applied { owns: None, .. } if cancel => {
                    self.stats.timed_out += 1;
                    self.give_back(id);
                }
                // The wait failed, or the request is gone: withdrawn with a release while the
                // session allows a call.
                _ if alive => {
                    self.send_sem(id, |request| Request::Release { request });
                }
                _ => self.give_back(id),
            },
            Acq::Releasing { op: sent } if sent == op => self.give_back(id),
            _ => {}
        }
    }

    /// Queued: wait, with a look armed at the soonest expiry of another party.
    fn wait(&mut self, id: ProcessId, count: u64, expire_in_ns: Option<u64>) {
        let local_ns = self.local_ns(id);
        let live = self.live(id);
        live.acq = Acq::Waiting { count };
        let episode = live.episode;
        if let Some(in_ns) = expire_in_ns {
            let at_ns = local_ns + in_ns.max(EXPIRY_LOOK_MIN_NS);
            self.at_local(id, at_ns, Input::ExpiryLook(episode));
        }
    }

    /// The grant is seen: services start; if the session was lost meanwhile, they are told to
    /// stop at once.
    fn granted(&mut self, id: ProcessId, count: u64, alive: bool) {
        let episode = self.live(id).episode;
        self.unwoken.retain(|&(p, e, _)| (p, e) != (id, episode));
        self.stats.grants += 1;
        self.live(id).acq = Acq::Running { count };
        self.check_not_late(id);
        self.set_acting(id, Some(count));
        if alive {
            let hold_ns = self.rng.between(0, self.params.hold_max_ns);
            let local_ns = self.local_ns(id);
            self.at_local(id, local_ns + hold_ns, Input::HoldEnd(episode));
        } else {
            self.stop_services(id, count, false);
        }
    }

    /// Tells the services acting with `count` units to stop; they act until they have.
    fn stop_services(&mut self, id: ProcessId, count: u64, release: bool) {
        let episode = self.live(id).episode;
        self.live(id).acq = Acq::Stopping { count, release };
        let slow = self.rng.chance(self.params.slow_stop_ppm);
        let delay_ns = if slow {
            self.rng.between(0, self.params.slow_stop_max_ns)
        } else {
            self.rng.between(0, self.params.base.service_delay_max_ns)
        };
        self.schedule(
            self.now_ns + delay_ns,
            Ev::Input(id, Input::Stopped(episode)),
        );
    }

    /// Detaches the holding (nothing acts under it); then acquires again after thinking, or
    /// opens a new session if the old one is lost.
    fn give_back(&mut self, id: ProcessId) {
        let now = Instant::from_nanos(self.local_ns(id));
        let live = self.live(id);
        live.acq = Acq::Idle;
        live.episode += 1;
        let mut out = SessionEffects::new();
        live.session.handle(
            &SessionEvent::Detach {
                now,
                holding: HoldingId(0),
            },
            &mut out,
        );
        assert!(out.is_empty(), "detach is silent: {out:?}");
        self.unwoken.retain(|&(p, _, _)| p != id);
        let session = &self.live(id).session;
        if session.liveness().is_some() {
            self.schedule_acquire(id);
        } else if session.is_lost() && session.holdings() == 0 {
            self.schedule_open(id);
        }
    }

    fn schedule_open(&mut self, id: ProcessId) {
        let round_ns = self.params.base.round_interval.as_nanos() as u64;
        let at_ns = self.now_ns + self.rng.between(0, round_ns);
        self.schedule(at_ns, Ev::Input(id, Input::Open));
    }

    fn schedule_acquire(&mut self, id: ProcessId) {
        let at_ns = self.now_ns + self.rng.between(0, self.params.think_max_ns);
        self.schedule(at_ns, Ev::Input(id, Input::Acquire));
    }

    /// `id` acts with `units` from now on (or stops acting, with `None`): the oracle checks the
    /// limit at every start (a stop only lowers the sum).
    fn set_acting(&mut self, id: ProcessId, units: Option<u64>) {
        let changed = match units {
            Some(units) => self.acting.insert(id, units) != Some(units),
            None => self.acting.remove(&id).is_some(),
        };
        if !changed {
            return;
        }
        self.note(id, || format!("acting with {units:?} units"));
        if units.is_some() {
            let sum: u64 = self.acting.values().sum();
            self.stats.units_max = self.stats.units_max.max(sum);
            self.stats.shared += u64::from(self.acting.len() >= 2);
            if sum > self.params.limit {
                let text = format!(
                    "owners act with {sum} units on a semaphore of {}: {:?}",
                    self.params.limit, self.acting
                );
                self.flag(id, text);
            }
        }
    }

    /// A grant handed to services must come before the kill deadline.
    fn check_not_late(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        let live = self.live(id);
        let now_local = live.clock.local(now_ns);
        let killer = live.killer;
        let late = killer.is_none_or(|(deadline, _)| now_local >= deadline);
        if late && self.params.rule != Rule::KillerIgnored {
            let text = format!("{id} started services at or after its kill deadline {killer:?}");
            self.flag(id, text);
        }
    }

    /// The session's one `Lost`: running services told to stop; a wait ends at once.
    fn lost(&mut self, id: ProcessId) {
        let acq = self.live(id).acq;
        self.stats.losses_while_owning += u64::from(acq.acting().is_some());
        match acq {
            Acq::Running { count } => self.stop_services(id, count, false),
            Acq::Waiting { .. } => self.give_back(id),
            // A call in flight ends with its answer; stopping services keep stopping.
            Acq::Idle => self.schedule_open(id),
            Acq::Acquiring { .. }
            | Acq::Looking { .. }
            | Acq::Stopping { .. }
            | Acq::Releasing { .. } => {}
        }
    }

    /// Runs one event through the session machine and executes its effects.
    fn session_event(&mut self, id: ProcessId, event: impl FnOnce(Instant) -> SessionEvent) {
        let now = Instant::from_nanos(self.local_ns(id));
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
        match effect {
            SessionEffect::Create { .. }
            | SessionEffect::KeepAlive { .. }
            | SessionEffect::Delete { .. }
            | SessionEffect::Get { .. } => {
                let live = self.live(id);
                assert!(live.pending.is_none(), "a second session call in flight");
                live.pending = Some(session_op(&effect));
                self.send(id, Call::Session(effect));
            }
            SessionEffect::SetTimer { timer, at } => {
                self.live(id).timer = Some(timer);
                self.at_local(id, at.as_nanos(), Input::Timer(timer));
            }
            SessionEffect::ArmKiller { at } => {
                let live = self.live(id);
                live.armings += 1;
                let arming = live.armings;
                live.killer = Some((at.as_nanos(), arming));
                let at_ns = live.clock.true_at(at.as_nanos());
                self.schedule(at_ns, Ev::Kill(id, arming));
            }
            SessionEffect::DisarmKiller => self.live(id).killer = None,
            SessionEffect::Opened { .. } => self.schedule_acquire(id),
            SessionEffect::NotOpened { .. } => self.schedule_open(id),
            SessionEffect::Lost { .. } => self.lost(id),
            SessionEffect::KeptAlive { .. }
            | SessionEffect::Closed { .. }
            | SessionEffect::CloseRefused { .. }
            | SessionEffect::Attached { .. }
            | SessionEffect::AttachRefused { .. } => {}
        }
    }

    /// Checks after every input: services act only under an armed killer; a killer whose
    /// deadline has passed fires at once.
    fn check_killer(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        let Some(live) = self.live_mut(id) else {
            return;
        };
        let acting = live.acq.acting().is_some();
        let overdue = live
            .killer
            .is_some_and(|(at, _)| live.clock.local(now_ns) >= at);
        if acting && live.killer.is_none() {
            self.flag(id, format!("{id}'s services act with no killer armed"));
        }
        if overdue && self.params.rule != Rule::KillerIgnored {
            self.die(id, true);
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
        // A call whose caller's timeout already passed (its timeout is queued) is stale.
        let stale = timeout.is_none() && matches!(call, Call::Sem { .. });
        let apply = apply && (self.params.stale_calls || !stale);
        let applied = apply.then(|| self.store.apply(&call, writer, now_ns));
        self.note(id, || {
            format!("store got {call:?}: {outcome:?}, answer {applied:?}")
        });
        let applied = applied.map(|(answer, effects)| {
            self.effects(id, effects);
            answer
        });
        let answer = match outcome {
            Outcome::Apply => applied,
            Outcome::Fail => Some(match call {
                Call::Session(_) => Answer::Session(Reply::Failed),
                Call::Sem { .. } => Answer::Sem(SemAnswer::Failed),
            }),
            Outcome::UnknownLost | Outcome::UnknownCommitted => Some(match call {
                Call::Session(_) => Answer::Session(Reply::Unknown),
                Call::Sem { .. } => Answer::Sem(SemAnswer::Unknown),
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
            (Call::Sem { op, .. }, Some(Answer::Sem(answer))) => Input::Sem(op, answer),
            (call, Some(answer)) => panic!("{answer:?} does not answer {call:?}"),
        };
        self.schedule(now_ns + fate.back_ns, Ev::Input(id, input));
    }

    /// What a transaction did: grants out of order flagged, the granted waiters expected to be
    /// woken, the feed's notifications sent.
    fn effects(&mut self, caller: ProcessId, effects: Effects) {
        for text in effects.out_of_order {
            self.flag(caller, format!("grant out of queue order: {text}"));
        }
        self.stats.granted_from_queue += effects.from_queue;
        let now_ns = self.now_ns;
        let late_ns = self.params.feed_delay_max_ns + 1;
        for key in effects.granted {
            let Some((id, episode)) = self.waiter_of(key) else {
                continue;
            };
            self.unwoken.push((id, episode, now_ns));
            self.schedule(now_ns + late_ns, Ev::CheckWoken(id, episode, now_ns));
        }
        if !effects.woke {
            return;
        }
        let subscribed: Vec<(ProcessId, u64)> = self
            .places
            .iter()
            .filter_map(|place| place.live.as_ref())
            .filter(|live| live.acq.subscribed())
            .map(|live| (live.id, live.episode))
            .collect();
        for (id, episode) in subscribed {
            let delay_ns = self.rng.between(0, self.params.feed_delay_max_ns);
            self.schedule(now_ns + delay_ns, Ev::Wake(id, episode));
        }
    }

    /// The live process waiting (or looking) under the session `key`, and its acquire.
    fn waiter_of(&self, key: SessionKey) -> Option<(ProcessId, u64)> {
        self.places
            .iter()
            .filter_map(|place| place.live.as_ref())
            .find(|live| {
                live.writer.incarnation == key.incarnation
                    && live.session.id() == Some(key.id)
                    && matches!(live.acq, Acq::Waiting { .. } | Acq::Looking { .. })
            })
            .map(|live| (live.id, live.episode))
    }
}

/// What the caller of `call` hears when its timeout comes first.
fn unknown(call: Call) -> Input {
    match call {
        Call::Session(effect) => Input::Reply(session_op(&effect), Reply::Unknown),
        Call::Sem { op, .. } => Input::Sem(op, SemAnswer::Unknown),
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
