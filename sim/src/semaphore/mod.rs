//! A scenario of processes that acquire and release units of one counted semaphore under their
//! sessions.
//!
//! Every process runs the real [`Session`](vvm_core::Session) machine ([`SessionTask`]) and,
//! for its one acquire at a time, the life the runtime gives it
//! (`runtime/src/semaphore/grant.rs`): the holding attached to the alive session (S29) before
//! the acquire is sent, with a random count (1 to the limit) and a random timeout (0: try once;
//! short; long); granted → services start (**acting** with the count); queued → the process
//! waits, subscribed to the semaphore's feed, and looks (one transaction, a describe) when the
//! feed wakes it or when the soonest expiry of another party's session (as the last answer
//! reported) comes, on its own clock; when its timeout passes it cancels the request
//! (`cancel_waiter_timeout`), keeping a grant that came first. A failed look ends the wait and
//! withdraws the request with a release. An owner holds for a random time, stops its services,
//! then releases. On the session's one `Lost`, services are told to stop (acting until they
//! have, slow stops up to `2·L`) and the holding is detached only then; a waiter's wait ends at
//! once. A new session is opened once nothing is attached.
//!
//! The store is the world's: every semaphore operation is the real core method in one
//! transaction (session checked live, dead parties removed first, a write wakes the feed); the
//! feed reaches each subscriber after a random push delay up to
//! [`SemaphoreParams::feed_delay_max_ns`].
//!
//! A semaphore call that reaches the store after its caller's timeout gave up on it is dropped
//! unless [`SemaphoreParams::stale_calls`]; then it lands late, and its request id keeps it from
//! acting on the session's later requests (a late release would otherwise end a later grant
//! while its services run). Session calls may always arrive late.
//!
//! The faults are the world's ([`Params::random`]): store errors, unknown outcomes (committed or
//! not), latency, hung calls, store outages, pauses up to `3·L` (also right after a call),
//! crashes with restart, clock-rate error up to 10 %; and services slow to stop.
//!
//! The oracle judges what users see:
//!
//! - the owners whose services run hold at most the limit together, at every instant;
//! - grants go in queue order (the store's [`Ledger`](crate::store::Ledger));
//! - a waiter the store grants is woken by the feed within the push delay (the notification
//!   reaches the process, paused or not), and no process still waits, at the end of a run, on a
//!   grant the store made long before.
//!
//! [`Params::random`]: crate::params::Params::random

mod params;

use std::collections::BTreeMap;

use vvm_core::semaphore::{RequestId, SessionKey};
use vvm_core::{HoldingId, Incarnation, LeaseConfig};

use crate::oracle::{ProcessId, Violation};
use crate::params::Params;
use crate::session_task::{self as task, OnSession, SessionInput, SessionTask};
use crate::store::{Answer, Call, Effects, KeepAlives, Request, SemAnswer, StoreModel};
use crate::trace::Death;
use crate::world::{Scenario, World};

pub use params::{Rule, SemaphoreParams, SemaphoreStats};

/// The least pause before a look at a party's expiry (the runtime's `EXPIRY_LOOK_MIN`).
const EXPIRY_LOOK_MIN_NS: u64 = 1_000_000;

/// The simulation of one semaphore.
pub type SemaphoreSim = World<Semaphores>;

/// An input of a process, before it carries a time. Inputs of an acquire carry its episode:
/// one that arrives after the acquire ended is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Of the session.
    Session(SessionInput),
    /// Acquire (after thinking).
    Acquire,
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

/// An event of the scenario's own.
pub enum Event {
    /// The feed's notification of the acquire `.1` reaches a process.
    Wake(ProcessId, u64),
    /// The oracle checks that the waiter of the acquire `.1` granted at `.2` was woken.
    CheckWoken(ProcessId, u64, u64),
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

/// What a process of this scenario is beside the world's part.
pub struct Proc {
    task: SessionTask,
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

/// The scenario: its parameters, counts, and what its oracle keeps beside the world's.
pub struct Semaphores {
    params: SemaphoreParams,
    lease: LeaseConfig,
    sem_ops: u64,
    /// Units each process acts with now.
    acting: BTreeMap<ProcessId, u64>,
    /// Waiters the store granted whose notification has not reached them: who, which
    /// acquire, when granted.
    unwoken: Vec<(ProcessId, u64, u64)>,
    stats: SemaphoreStats,
}

impl World<Semaphores> {
    /// A simulation of `params` whose every random choice comes from `seed`.
    pub fn new(seed: u64, params: SemaphoreParams) -> Self {
        let mut store = StoreModel::new(params.base.slots, KeepAlives::Bump, params.limit);
        match params.rule {
            Rule::GrantWhenFits => store.grant_when_fits(),
            Rule::ReleaseNotWoken => store.silence_releases(),
            Rule::Sound | Rule::KillerIgnored => {}
        }
        let scenario = Semaphores {
            lease: LeaseConfig::new(params.base.lease).expect("simulation lease is valid"),
            sem_ops: 0,
            acting: BTreeMap::new(),
            unwoken: Vec::new(),
            stats: SemaphoreStats::default(),
            params,
        };
        World::of(seed, scenario, store)
    }

    /// The parameters of the run.
    pub fn params(&self) -> &SemaphoreParams {
        &self.s.params
    }

    /// Counts so far.
    pub fn stats(&self) -> SemaphoreStats {
        SemaphoreStats {
            store_calls: self.counts.store_calls,
            starts: self.counts.starts,
            crashed: self.counts.crashed,
            ..self.s.stats
        }
    }

    /// Every violation so far, with those judged at the end: a process still waiting on a
    /// grant the store made more than a lease ago (plus the feed's delay) never learnt of it.
    pub fn check(&self) -> Vec<Violation> {
        let (mut violations, _) = self.check_oracle();
        let late_ns = self.s.params.base.lease_ns() + self.s.params.feed_delay_max_ns;
        for &(id, episode, granted_ns) in &self.s.unwoken {
            let waits = self.places[id.index as usize]
                .live
                .as_ref()
                .is_some_and(|l| {
                    l.id == id && l.proc.episode == episode && l.proc.acq.subscribed()
                });
            if waits && granted_ns + late_ns < self.now_ns() {
                violations.push(Violation::Other {
                    process: id,
                    at_ns: granted_ns,
                    text: format!("{id} was granted at {granted_ns} ns and still waits"),
                });
            }
        }
        violations
    }
}

type W = World<Semaphores>;

fn flag(world: &mut W, id: ProcessId, text: String) {
    world.line(id, || format!("VIOLATION: {text}"));
    let now_ns = world.now_ns();
    world.oracle.flag(id, now_ns, text);
}

impl Scenario for Semaphores {
    type Proc = Proc;
    type Input = Input;
    type Event = Event;

    fn base(&self) -> &Params {
        &self.params.base
    }

    fn killer_works(&self) -> bool {
        self.params.rule != Rule::KillerIgnored
    }

    fn drops_stale(&self, call: &Call) -> bool {
        !self.params.stale_calls && matches!(call, Call::Sem { .. })
    }

    fn spawn(world: &mut W, _index: u32, incarnation: Incarnation) -> Proc {
        let count = world.rng.between(1, world.s.params.limit);
        Proc {
            task: SessionTask::new(world.s.lease, incarnation),
            acq: Acq::Idle,
            episode: 0,
            woken_in_look: false,
            timed_out: false,
            count,
            acquire_request: RequestId(0),
        }
    }

    fn launch() -> Input {
        Input::Session(SessionInput::Open)
    }

    /// Runs one input through the process, as the runtime's session task and acquire do.
    fn handle(world: &mut W, id: ProcessId, input: Input) {
        world.s.stats.events += 1;
        let proc = world.proc(id);
        let episode = proc.episode;
        match input {
            Input::Session(input) => task::handle(world, id, input),
            Input::Acquire => acquire(world, id),
            Input::Sem(op, answer) => answered(world, id, op, answer),
            Input::Wake(e) if e == episode => match proc.acq {
                Acq::Waiting { count } => look(world, id, count, false),
                Acq::Looking { .. } => proc.woken_in_look = true,
                _ => {}
            },
            Input::ExpiryLook(e) if e == episode => {
                if let Acq::Waiting { count } = proc.acq {
                    look(world, id, count, false);
                }
            }
            Input::WaitTimeout(e) if e == episode => match proc.acq {
                Acq::Waiting { count } => look(world, id, count, true),
                Acq::Looking { .. } => proc.timed_out = true,
                _ => {}
            },
            Input::HoldEnd(e) if e == episode => {
                if let Acq::Running { count } = proc.acq {
                    world.line(id, || "done: stops its services".to_owned());
                    stop_services(world, id, count, true);
                }
            }
            Input::Stopped(e) if e == episode => {
                if let Acq::Stopping { release, .. } = proc.acq {
                    set_acting(world, id, None);
                    if release && world.proc(id).task.session.liveness().is_some() {
                        send_sem(world, id, |request| Request::Release { request });
                    } else {
                        give_back(world, id);
                    }
                }
            }
            Input::Wake(_)
            | Input::ExpiryLook(_)
            | Input::WaitTimeout(_)
            | Input::HoldEnd(_)
            | Input::Stopped(_) => {}
        }
        task::check_killer(world, id);
    }

    /// Graceful stops are not part of this scenario (its parameters draw none).
    fn stop(_world: &mut W, _id: ProcessId) {}

    fn died(world: &mut W, id: ProcessId, proc: Proc, death: Death) {
        set_acting(world, id, None);
        world.s.unwoken.retain(|&(p, _, _)| p != id);
        if death == Death::Killer {
            world.s.stats.killed_while_owning += u64::from(proc.acq.acting().is_some());
        }
    }

    fn answered(call: &Call, answer: Answer) -> Input {
        match (call, answer) {
            (Call::Session(effect), _) => task::answered::<Self>(effect, answer),
            (&Call::Sem { op, .. }, Answer::Sem(answer)) => Input::Sem(op, answer),
            (call, answer) => panic!("{answer:?} does not answer {call:?}"),
        }
    }

    /// What a transaction did: grants out of order flagged, the granted waiters expected to be
    /// woken, the feed's notifications sent.
    fn applied(world: &mut W, caller: ProcessId, effects: Effects) {
        for text in effects.out_of_order {
            flag(world, caller, format!("grant out of queue order: {text}"));
        }
        world.s.stats.granted_from_queue += effects.from_queue;
        let now_ns = world.now_ns();
        let late_ns = world.s.params.feed_delay_max_ns + 1;
        for key in effects.granted {
            let Some((id, episode)) = waiter_of(world, key) else {
                continue;
            };
            world.s.unwoken.push((id, episode, now_ns));
            world.schedule_own(now_ns + late_ns, Event::CheckWoken(id, episode, now_ns));
        }
        if !effects.woke {
            return;
        }
        let subscribed: Vec<(ProcessId, u64)> = world
            .lives()
            .filter(|live| live.proc.acq.subscribed())
            .map(|live| (live.id, live.proc.episode))
            .collect();
        for (id, episode) in subscribed {
            let delay_ns = world.rng.between(0, world.s.params.feed_delay_max_ns);
            world.schedule_own(now_ns + delay_ns, Event::Wake(id, episode));
        }
    }

    fn event(world: &mut W, event: Event) {
        match event {
            Event::Wake(id, episode) => {
                // The notification reached the process (handled now, or once it resumes).
                world.s.unwoken.retain(|&(p, e, _)| (p, e) != (id, episode));
                world.deliver(id, Input::Wake(episode));
            }
            Event::CheckWoken(id, episode, granted_ns) => {
                let entry = (id, episode, granted_ns);
                if world.s.unwoken.contains(&entry) {
                    let text = format!(
                        "{id} was granted at {granted_ns} ns and not woken within the feed's \
                         delay"
                    );
                    flag(world, id, text);
                }
            }
        }
    }
}

impl OnSession for Semaphores {
    fn task(proc: &mut Proc) -> &mut SessionTask {
        &mut proc.task
    }

    fn input(input: SessionInput) -> Input {
        Input::Session(input)
    }

    fn acting(proc: &Proc) -> bool {
        proc.acq.acting().is_some()
    }

    fn opened(world: &mut W, id: ProcessId) {
        schedule_acquire(world, id);
    }

    /// The session's one `Lost`: running services told to stop; a wait ends at once.
    fn lost(world: &mut W, id: ProcessId) {
        let acq = world.proc(id).acq;
        world.s.stats.losses_while_owning += u64::from(acq.acting().is_some());
        match acq {
            Acq::Running { count } => stop_services(world, id, count, false),
            Acq::Waiting { .. } => give_back(world, id),
            // A call in flight ends with its answer; stopping services keep stopping.
            Acq::Idle => task::schedule_open(world, id),
            Acq::Acquiring { .. }
            | Acq::Looking { .. }
            | Acq::Stopping { .. }
            | Acq::Releasing { .. } => {}
        }
    }
}

/// `Coordination::acquire`: attach, then send the acquire with a random count and timeout.
fn acquire(world: &mut W, id: ProcessId) {
    let proc = world.proc(id);
    if proc.acq != Acq::Idle || proc.task.session.liveness().is_none() {
        return; // the next open acquires again
    }
    if !task::attach(world, id, HoldingId(0)) {
        return;
    }
    let count = if world.s.params.counts_vary {
        world.rng.between(1, world.s.params.limit)
    } else {
        world.proc(id).count
    };
    let l_ms = world.s.params.base.lease_ns() / 1_000_000;
    let timeout_ms = match world.rng.below(5) {
        0 => 0,
        1 | 2 => world.rng.between(1, l_ms / 2),
        _ => world.rng.between(l_ms, 5 * l_ms),
    };
    world.s.stats.acquires += 1;
    let proc = world.proc(id);
    proc.episode += 1;
    proc.woken_in_look = false;
    proc.timed_out = false;
    world.line(id, || {
        format!("acquires {count} units, timeout {timeout_ms} ms")
    });
    send_sem(world, id, |request| Request::Acquire {
        count,
        timeout_ms,
        request,
    });
}

/// A look of a waiter: a describe, or a cancel once its timeout passed.
fn look(world: &mut W, id: ProcessId, count: u64, cancel: bool) {
    let proc = world.proc(id);
    proc.woken_in_look = false;
    proc.timed_out = false;
    let acquired = proc.acquire_request;
    let op = send_sem(world, id, |_| {
        if cancel {
            Request::Cancel { request: acquired }
        } else {
            Request::Look
        }
    });
    world.proc(id).acq = Acq::Looking { op, count, cancel };
}

/// Sends a semaphore call, made by `call` from the call's request id (its op number, which
/// increases in the order calls are made, as the runtime's ids do); sets the acquire's state for
/// an acquire or a release.
fn send_sem(world: &mut W, id: ProcessId, call: impl FnOnce(RequestId) -> Request) -> u64 {
    world.s.sem_ops += 1;
    let op = world.s.sem_ops;
    let request = call(RequestId(op));
    let sent_ns = world.local_ns(id);
    let proc = world.proc(id);
    let session = proc.task.session.id().expect("a session");
    match request {
        Request::Acquire {
            count, timeout_ms, ..
        } => {
            proc.acquire_request = RequestId(op);
            proc.acq = Acq::Acquiring {
                op,
                count,
                timeout_ms,
                sent_ns,
            }
        }
        Request::Release { .. } => proc.acq = Acq::Releasing { op },
        Request::Look | Request::Cancel { .. } => {}
    }
    let call = Call::Sem {
        op,
        id: session,
        request,
    };
    world.send(id, call);
    op
}

/// What the runtime does with a semaphore answer (`grant::acquire`, `wait`, `release`).
fn answered(world: &mut W, id: ProcessId, op: u64, answer: SemAnswer) {
    let proc = world.proc(id);
    let alive = proc.task.session.liveness().is_some();
    let acq = proc.acq;
    world.line(id, || format!("answer {answer:?} while {acq:?}"));
    match acq {
        Acq::Acquiring {
            op: sent,
            count,
            timeout_ms,
            sent_ns,
        } if sent == op => match answer {
            SemAnswer::Applied {
                owns: Some(true), ..
            } => granted(world, id, count, alive),
            SemAnswer::Applied {
                owns: Some(false),
                expire_in_ns,
            } if alive => {
                world.s.stats.queued += 1;
                let episode = world.proc(id).episode;
                let deadline_ns = sent_ns.saturating_add(timeout_ms.saturating_mul(1_000_000));
                world.at_local(id, deadline_ns, Input::WaitTimeout(episode));
                wait(world, id, count, expire_in_ns);
            }
            // Not granted (a try), refused, failed, unknown, or queued under a session now
            // over: nothing held; what was written after all ends with the session.
            _ => give_back(world, id),
        },
        Acq::Looking {
            op: sent,
            count,
            cancel,
        } if sent == op => match answer {
            SemAnswer::Applied {
                owns: Some(true), ..
            } => granted(world, id, count, alive),
            SemAnswer::Applied {
                owns: Some(false),
                expire_in_ns,
            } if alive && !cancel => {
                wait(world, id, count, expire_in_ns);
                let proc = world.proc(id);
                if proc.timed_out {
                    look(world, id, count, true);
                } else if proc.woken_in_look {
                    look(world, id, count, false);
                }
            }
            SemAnswer::Applied { owns: None, .. } if cancel => {
                world.s.stats.timed_out += 1;
                give_back(world, id);
            }
            // The wait failed, or the request is gone: withdrawn with a release while the
            // session allows a call.
            _ if alive => {
                send_sem(world, id, |request| Request::Release { request });
            }
            _ => give_back(world, id),
        },
        Acq::Releasing { op: sent } if sent == op => give_back(world, id),
        _ => {}
    }
}

/// Queued: wait, with a look armed at the soonest expiry of another party.
fn wait(world: &mut W, id: ProcessId, count: u64, expire_in_ns: Option<u64>) {
    let local_ns = world.local_ns(id);
    let proc = world.proc(id);
    proc.acq = Acq::Waiting { count };
    let episode = proc.episode;
    if let Some(in_ns) = expire_in_ns {
        let at_ns = local_ns + in_ns.max(EXPIRY_LOOK_MIN_NS);
        world.at_local(id, at_ns, Input::ExpiryLook(episode));
    }
}

/// The grant is seen: services start; if the session was lost meanwhile, they are told to stop
/// at once.
fn granted(world: &mut W, id: ProcessId, count: u64, alive: bool) {
    let episode = world.proc(id).episode;
    world.s.unwoken.retain(|&(p, e, _)| (p, e) != (id, episode));
    world.s.stats.grants += 1;
    world.proc(id).acq = Acq::Running { count };
    world.check_fresh(id, || format!("a grant of {count} units"));
    set_acting(world, id, Some(count));
    if alive {
        let hold_ns = world.rng.between(0, world.s.params.hold_max_ns);
        let local_ns = world.local_ns(id);
        world.at_local(id, local_ns + hold_ns, Input::HoldEnd(episode));
    } else {
        stop_services(world, id, count, false);
    }
}

/// Tells the services acting with `count` units to stop; they act until they have.
fn stop_services(world: &mut W, id: ProcessId, count: u64, release: bool) {
    let episode = world.proc(id).episode;
    world.proc(id).acq = Acq::Stopping { count, release };
    let slow = world.rng.chance(world.s.params.slow_stop_ppm);
    let delay_ns = if slow {
        world.rng.between(0, world.s.params.slow_stop_max_ns)
    } else {
        world
            .rng
            .between(0, world.s.params.base.service_delay_max_ns)
    };
    let at_ns = world.now_ns() + delay_ns;
    world.schedule_input(at_ns, id, Input::Stopped(episode));
}

/// Detaches the holding (nothing acts under it); then acquires again after thinking, or opens a
/// new session if the old one is lost.
fn give_back(world: &mut W, id: ProcessId) {
    let proc = world.proc(id);
    proc.acq = Acq::Idle;
    proc.episode += 1;
    task::detach(world, id, HoldingId(0));
    world.s.unwoken.retain(|&(p, _, _)| p != id);
    let session = &world.proc(id).task.session;
    if session.liveness().is_some() {
        schedule_acquire(world, id);
    } else if session.is_lost() && session.holdings() == 0 {
        task::schedule_open(world, id);
    }
}

fn schedule_acquire(world: &mut W, id: ProcessId) {
    let at_ns = world.now_ns() + world.rng.between(0, world.s.params.think_max_ns);
    world.schedule_input(at_ns, id, Input::Acquire);
}

/// `id` acts with `units` from now on (or stops acting, with `None`): the oracle checks the
/// limit at every start (a stop only lowers the sum).
fn set_acting(world: &mut W, id: ProcessId, units: Option<u64>) {
    let acting = &mut world.s.acting;
    let changed = match units {
        Some(units) => acting.insert(id, units) != Some(units),
        None => acting.remove(&id).is_some(),
    };
    if !changed {
        return;
    }
    world.line(id, || format!("acting with {units:?} units"));
    if units.is_some() {
        let sum: u64 = world.s.acting.values().sum();
        let stats = &mut world.s.stats;
        stats.units_max = stats.units_max.max(sum);
        stats.shared += u64::from(world.s.acting.len() >= 2);
        if sum > world.s.params.limit {
            let text = format!(
                "owners act with {sum} units on a semaphore of {}: {:?}",
                world.s.params.limit, world.s.acting
            );
            flag(world, id, text);
        }
    }
}

/// The live process waiting (or looking) under the session `key`, and its acquire.
fn waiter_of(world: &mut W, key: SessionKey) -> Option<(ProcessId, u64)> {
    world
        .lives()
        .find(|live| {
            live.writer.incarnation == key.incarnation
                && live.proc.task.session.id() == Some(key.id)
                && matches!(live.proc.acq, Acq::Waiting { .. } | Acq::Looking { .. })
        })
        .map(|live| (live.id, live.proc.episode))
}
