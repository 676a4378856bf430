//! Model checking semaphores with stateright: two or three processes, each with a real core
//! [`Session`] and one acquire of one counted semaphore, on one atomic store of session records
//! and that semaphore, whose every operation is the real [`vvm_core::semaphore`] method applied
//! at delivery.
//!
//! The semaphore has limit [`LIMIT`] = 2; the processes ask for counts such as 1, 2 and 1, so
//! that a request of 2 queued behind an owner of 1 blocks the 1 that arrives after it (strict
//! FIFO) — the case where serving the queue in order matters.
//!
//! Each process runs a real [`Session`] (keepalive every `L/4`, kill deadline, loss) and the
//! life of its acquire as the runtime drives it (`runtime/src/semaphore/grant.rs`):
//!
//! - **idle** → the holding attached to the alive session (S29) and the acquire sent
//!   (**acquiring**); its answer: granted → services start (**running**, acting); queued →
//!   **waiting**; anything else (refused, failed, unknown) → detached, back to idle (a request
//!   that was written after all is left to end with the session, as `Claim` does).
//! - **waiting**: the process is subscribed to the semaphore's feed, which every write of the
//!   semaphore wakes; it looks (one transaction, a describe, **looking**) when woken, or when
//!   the expiry of another party's session that the last answer reported (`parties_expire_in`)
//!   is due. The look's answer: owner → services start; still queued → waiting again; gone →
//!   withdrawn; a failed look ends the wait and withdraws the request (**withdrawing**: a
//!   release in flight), as `wait`'s `?` and the claim's drop do.
//! - **running** → the user stops its services and releases (**releasing**), then detaches.
//! - On the session's one `Lost`: running services are told to stop (**stopping**, still acting
//!   until they have, as late as the scheduler likes), then detached; a waiter not looking is
//!   detached at once (its wait ends on the loss); a call in flight ends with its answer.
//! - A process whose local clock reaches its kill deadline dies at that instant with everything
//!   it runs and restarts as a new incarnation, which opens a session at once.
//!
//! The store keeps session records with a TTL judged by true time (as in
//! `model_check_sessions.rs`) and the semaphore. Every semaphore call is one transaction, as the
//! contract of `runtime/src/semaphore_store.rs` says: the caller's session must be live
//! (`SessionGone` otherwise); every party whose session is not live is removed first
//! ([`Semaphore::expire_session`], lazy expiry); then the one core operation; a write wakes the
//! feed. Deleting a session record removes its parties in the same transaction (eager expiry).
//! Keepalives give the record a new revision (the transactional store's way, `KeepAlives::Bump`
//! of the sessions model), so that a keepalive that lands late makes the next one refused. An
//! owner's record removed from outside (budget `removals`) leaves its parties and wakes the feed;
//! the store counts its units until a TTL after the removal (`Sem.Store.Unreleased`), and
//! `Rule::RemovedNotWaited` (expired at once) must break the limit.
//!
//! Every step is one of: deliver the oldest call of a process (applied atomically, answered at
//! once) or a late one whose caller gave up; a fault on a call within the budget (failed, lost,
//! answer lost, late); fire a due timer; acquire; look; release; stop services after a loss; open;
//! close (budget); crash (budget); advance true time to the next due instant (timers, kill
//! deadlines, record expiries, waiters' expiry looks) once every call is answered. Clocks run at
//! 0.9 and 1.1 of true time (the third process at 1.0).
//!
//! Properties, about what the user sees (services running):
//!
//! - [`SAFETY`] (`always`): at every instant the owners whose services run hold at most
//!   [`LIMIT`] units together; and services run only while their process is alive.
//! - [`ORDER`] (`always`): the queue is served in arrival order. A ledger kept by the model
//!   beside the store (not the core's order ids) lists the requests that were seen queued, in
//!   the order they were seen queued; a request that left (released, withdrawn, expired) leaves
//!   it. A grant is in order when it goes to the ledger's first request, or, for a request
//!   granted at once, when the ledger is empty: an acquire that queued behind another is never
//!   granted before it unless the other left, and nobody is granted past the queue.
//! - [`WAKEUP`] (`always`): no lost wake-up. After every store transaction the head of the
//!   queue does not fit in the units the owners leave free; a waiting process whose request the
//!   store has granted has been woken (its wait ends at its next look); and a waiting process
//!   that is not woken while other parties exist has a look armed at their soonest expiry.
//! - `sometimes`: two owners act at once, a queued request is granted after others left, a
//!   session is lost and a process killed while owning: the runs are not vacuous.
//!
//! Unsound variants ([`Rule`]) must each be caught: the killer ignored (over the limit), a store
//! that grants whatever fits, past the queue (out of order), and a release that does not wake
//! the feed (a waiter never learns of its grant).
//!
//! The state is kept canonical where order does not matter: revisions count per session record
//! and the calls in flight are ordered by process. The semaphore's own counters (order ids,
//! generation) do tell apart states that differ only in how many grants came before; acquires
//! per process are bounded so that runs stay finite.

#[path = "support/model.rs"]
mod model;

use model::{
    advance_steps, deliveries, env_usize, explore, live_session, session_steps, take, timer_steps,
    Allowance, Calls, Fault, Key, Msg, Search, SessionCall, SessionRecord, Sessions, Spent, Step,
    Task, SESSION_FAULTS,
};

use core::time::Duration;

use stateright::{Model, Property};
use vvm_core::semaphore::{RequestId, Semaphore, SemaphoreError, SessionKey, Status};
use vvm_core::{
    HoldingId, Incarnation, Instant, LeaseConfig, OpId, Reply, SessionEffect, SessionEvent,
    SessionId,
};

const SECOND_NS: u64 = 1_000_000_000;
const LEASE: Duration = Duration::from_secs(20);
const LEASE_NS: u64 = 20 * SECOND_NS;
/// The semaphore's limit.
const LIMIT: u64 = 2;
/// Its name.
const NAME: &str = "jobs";
/// How long an acquire may wait: longer than any run, so that only grants and losses end a
/// wait (the runtime's timeout is a local timer and a `cancel_waiter_timeout`, which the
/// simulator covers).
const TIMEOUT_MS: u64 = 3_600_000;
/// Clock rates in parts per million of true time: slow, fast, exact.
const RATES_PPM: [u64; 3] = [900_000, 1_100_000, 1_000_000];
/// Runs of the exhaustive checks to the horizon end here: past an owner's deadline and its
/// record's expiry after a keepalive at `L/4`, and a waiter granted after them.
const SHORT_HORIZON_NS: u64 = 3 * LEASE_NS / 2;
/// Runs end here otherwise.
const HORIZON_NS: u64 = 3 * LEASE_NS;

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
    /// Due timers left unfired while time moves on (they fire at any later instant).
    late_timers: u8,
    /// Acquires per process.
    acquires: u8,
    /// Owners' session records removed from outside (a SQLite row deleted, an etcd lease
    /// revoked by hand), their parties left in the semaphore.
    removals: u8,
}

/// Two faults of any kind on any call, a crash, a close, one late timer, two acquires each.
const FULL: Budget = Budget {
    faults: 2,
    fault_kinds: &SESSION_FAULTS,
    keepalives_only: false,
    crashes: 1,
    closes: 1,
    late_timers: 1,
    acquires: 2,
    removals: 0,
};

/// No fault; every process acquires once, timers on time: the queue and its wake-ups alone.
const CALM: Budget = Budget {
    faults: 0,
    fault_kinds: &[],
    keepalives_only: false,
    crashes: 0,
    closes: 0,
    late_timers: 0,
    acquires: 1,
    removals: 0,
};

/// One keepalive timer left unfired past its instant (it fires at any later instant, or
/// never): an owner killed at its deadline while acting, its record expiring, the waiter behind
/// it granted.
const ONE_LATE_TIMER: Budget = Budget {
    late_timers: 1,
    ..CALM
};

/// One keepalive that lands late (its caller heard `Unknown`): the next keepalive is refused
/// and the session lost while its owner acts, services stopping as late as the scheduler likes.
const ONE_LATE_KEEPALIVE: Budget = Budget {
    faults: 1,
    fault_kinds: &[Fault::Late],
    keepalives_only: true,
    ..CALM
};

/// One owner's session record removed from outside at any moment (`Sem.Store.Unreleased`):
/// the owner's keepalive is refused and its services stop as late as the scheduler likes (or
/// at its killer), while its units stay counted for a TTL after the removal.
const ONE_REMOVAL: Budget = Budget {
    removals: 1,
    ..CALM
};

/// The rules of the runtime and store; all but [`Rule::Sound`] are broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rule {
    /// As the runtime and the stores do it.
    Sound,
    /// Unsound: the killer never fires; an owner whose session was lost acts on past its kill
    /// deadline, after its record expired and its units passed to a waiter.
    KillerIgnored,
    /// Unsound, in the store: an acquire that fits in the free units is granted at once even
    /// when others are queued (the real core is run, with the queue set aside around it).
    GrantWhenFits,
    /// Unsound, in the store: a release's write does not wake the feed, so the waiter it grants
    /// is not told.
    ReleaseNotWoken,
    /// Unsound, in the store: an owner whose session record was removed from outside is
    /// removed at the next transaction, as if it had expired (the stores before
    /// `Sem.Store.Unreleased`).
    RemovedNotWaited,
}

/// The acquire of one process, as the runtime drives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Acq {
    /// Nothing attached.
    Idle,
    /// Attached; the acquire is in flight.
    Acquiring,
    /// Queued; waiting for the feed or an expiry look.
    Waiting,
    /// Queued; a look (describe) is in flight.
    Looking,
    /// Granted and seen: services run (acting).
    Running,
    /// The session was lost: services told to stop; acting until they have.
    Stopping,
    /// Services stopped; the release is in flight.
    Releasing,
    /// The wait failed; the release withdrawing the request is in flight.
    Withdrawing,
}

impl Acq {
    fn acting(self) -> bool {
        matches!(self, Acq::Running | Acq::Stopping)
    }

    /// Subscribed to the semaphore's feed (`semaphore_changed`).
    fn subscribed(self) -> bool {
        matches!(self, Acq::Acquiring | Acq::Waiting | Acq::Looking)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    task: Task,
    acq: Acq,
    /// The feed fired since the process last subscribed.
    woken: bool,
    /// True instant of the waiter's look at another party's expiry.
    look_at: Option<u64>,
    acquires: u8,
    /// Acquires and releases this session made: the next one's request id is one more (ids
    /// rise in the order calls are made, as the runtime's `next_request_id` does). Looks carry
    /// no id (they change nothing), so that they add no states.
    calls: u8,
}

/// A semaphore operation of the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SemOp {
    Acquire,
    Look,
    Release,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Call {
    /// `Create`, `KeepAlive`, `Delete` or `Get` of the session machine.
    Session(SessionEffect),
    /// A semaphore transaction of the session `session`, its call `request`.
    Sem {
        op: SemOp,
        session: SessionId,
        request: u8,
    },
}

impl SessionCall for Call {
    fn session(effect: SessionEffect) -> Self {
        Call::Session(effect)
    }

    fn as_session(&self) -> Option<SessionEffect> {
        match *self {
            Call::Session(effect) => Some(effect),
            Call::Sem { .. } => None,
        }
    }
}

/// What a semaphore transaction tells the runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SemAnswer {
    /// Applied: the caller owns (`Some(true)`), waits (`Some(false)`) or is absent (`None`);
    /// with the soonest expiry of another party's session, in true nanoseconds from now.
    Applied {
        owns: Option<bool>,
        expire_in_ns: Option<u64>,
    },
    SessionGone,
    Failed,
    Unknown,
}

enum Answer {
    Session(OpId, Reply),
    Sem(SemAnswer),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    now_ns: u64,
    procs: Vec<Proc>,
    /// Live session records (an expired one is removed when time moves).
    sessions: Vec<SessionRecord>,
    semaphore: Semaphore,
    msgs: Vec<Msg<Call>>,
    /// What the adversary spent.
    spent: Spent,
    /// The requests seen queued, in the order they were seen queued (the model's ledger).
    ledger: Vec<SessionKey>,
    /// A grant went past an earlier request of the ledger.
    out_of_order: bool,
    /// A request of the ledger was granted.
    granted_from_queue: bool,
    /// A session was lost while its owner's services ran.
    lost_while_owning: bool,
    /// A process was killed at its deadline while its services ran.
    killed_while_owning: bool,
    /// Owners whose session record was removed from outside, each with the instant until
    /// which its units count (the removal plus the session's TTL).
    removed: Vec<(SessionKey, u64)>,
    /// Removals made.
    removals: u8,
    /// A queued request was granted after an owner's record was removed from outside.
    granted_after_removal: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A step every model of sessions has.
    Step(Step),
    /// Process `p` attaches a holding and sends its acquire.
    Acquire(usize),
    /// Waiting process `p`, woken or at its expiry look, looks at the semaphore.
    Look(usize),
    /// Process `p` stops its services and releases.
    Release(usize),
    /// The adversary removes the session record of owner `p` from outside.
    Remove(usize),
    /// The services of process `p`, told to stop, have stopped; the holding is detached.
    Stop(usize),
}

impl From<Step> for Action {
    fn from(step: Step) -> Self {
        Action::Step(step)
    }
}

const SAFETY: &str = "the owners whose services run hold at most the limit";
const ONLY_ALIVE: &str = "services run only while their process is alive";
const ORDER: &str = "the queue is served in arrival order";
const WAKEUP: &str = "no lost wake-up";
const TWO_OWNERS: &str = "two owners act at once";
const FROM_QUEUE: &str = "a queued request is granted after others left";
const LOST_WHILE_OWNING: &str = "a session is lost while its owner acts";
const KILLED_WHILE_OWNING: &str = "a process is killed at its deadline while owning";
const GRANTED_AFTER_REMOVAL: &str = "a request is granted after an owner was removed from outside";

struct SemaphoreModel {
    /// Units each process asks for; one process per entry.
    counts: &'static [u64],
    budget: Budget,
    horizon_ns: u64,
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
        live_session(&self.sessions, self.now_ns, key)
    }

    /// The store's key of a semaphore party's session, if a record of it is live.
    fn live_party(&self, session: SessionKey) -> Option<&SessionRecord> {
        let now_ns = self.now_ns;
        self.sessions
            .iter()
            .find(|r| r.key.session_key() == session && now_ns < r.expires_ns)
    }

    /// The key of process `p`'s current session, while it has one.
    fn key_of(&self, p: usize) -> Option<SessionKey> {
        let proc = &self.procs[p];
        let id = proc.task.session.id()?;
        Some(SessionKey {
            incarnation: incarnation(p, proc.task.generation),
            id,
        })
    }

    /// Whether `p` owns units under a live session record (which the adversary may remove).
    fn removable(&self, p: usize) -> bool {
        let Some(key) = self.key_of(p) else {
            return false;
        };
        self.semaphore.owners().iter().any(|o| o.session == key) && self.live_party(key).is_some()
    }

    fn acts(&self, p: usize) -> bool {
        self.procs[p].acq.acting()
    }

    /// Whether `p` may run services now: its kill deadline armed and not reached.
    fn alive(&self, p: usize) -> bool {
        self.procs[p].task.alive(local(p, self.now_ns))
    }

    fn look_due(&self, p: usize) -> bool {
        let proc = &self.procs[p];
        proc.acq == Acq::Waiting && (proc.woken || proc.look_at.is_some_and(|at| at <= self.now_ns))
    }

    /// The feed of the semaphore fires: every subscribed process is woken.
    fn wake(&mut self) {
        for proc in &mut self.procs {
            if proc.acq.subscribed() {
                proc.woken = true;
            }
        }
    }

    /// Removes expired session records, and the memory of removed owners whose wait is over.
    fn prune(&mut self) {
        let now_ns = self.now_ns;
        self.sessions.retain(|r| now_ns < r.expires_ns);
        self.removed.retain(|(_, until)| now_ns < *until);
    }

    /// Until when the units of `party`, whose record was removed from outside, still count.
    fn counted_until(&self, party: SessionKey) -> Option<u64> {
        let now_ns = self.now_ns;
        self.removed
            .iter()
            .find(|(k, until)| *k == party && now_ns < *until)
            .map(|(_, until)| *until)
    }

    /// Units the owners whose services run hold together.
    fn acting_units(&self, counts: &[u64]) -> u64 {
        (0..self.procs.len())
            .filter(|&p| self.acts(p))
            .map(|p| counts[p])
            .sum()
    }

    /// Keeps the ledger after a transaction turned `before` into the stored semaphore: requests
    /// that left leave it, grants are judged against it, newly queued requests join its end.
    fn observe_queue(&mut self, before: &Semaphore) {
        let after = &self.semaphore;
        let was_owner = |k: &SessionKey| before.owners().iter().any(|o| o.session == *k);
        let newly: Vec<SessionKey> = after
            .owners()
            .iter()
            .map(|o| o.session)
            .filter(|k| !was_owner(k))
            .collect();
        let waits = |k: &SessionKey| after.waiters().iter().any(|w| w.session == *k);
        self.ledger.retain(|k| waits(k) || newly.contains(k));
        for k in newly {
            match self.ledger.iter().position(|&l| l == k) {
                Some(0) => {
                    self.ledger.remove(0);
                    self.granted_from_queue = true;
                }
                Some(at) => {
                    // Granted while an earlier request still waits.
                    self.ledger.remove(at);
                    self.out_of_order = true;
                }
                // Granted at once: only when nobody waits.
                None => self.out_of_order |= !self.ledger.is_empty(),
            }
        }
        for w in after.waiters() {
            if !self.ledger.contains(&w.session) {
                self.ledger.push(w.session);
            }
        }
    }

    /// The head of the queue fits in the units the owners leave free (it should have been
    /// granted): judged here from the owners and waiters, not by the core's own check.
    fn head_fits(&self) -> bool {
        let held: u64 = self.semaphore.owners().iter().map(|o| o.count).sum();
        self.semaphore
            .waiters()
            .first()
            .is_some_and(|head| head.count <= LIMIT.saturating_sub(held))
    }

    /// Whether waiting process `p` has been told all it needs: woken if the store granted it,
    /// and a look armed while other parties exist.
    fn waiter_told(&self, p: usize) -> bool {
        let proc = &self.procs[p];
        if proc.acq != Acq::Waiting || proc.woken {
            return true;
        }
        let Some(key) = self.key_of(p) else {
            return true;
        };
        let granted = self.semaphore.owners().iter().any(|o| o.session == key);
        let others = self
            .semaphore
            .owners()
            .iter()
            .map(|o| o.session)
            .chain(self.semaphore.waiters().iter().map(|w| w.session))
            .any(|k| k != key);
        !granted && (!others || proc.look_at.is_some())
    }
}

impl SemaphoreModel {
    fn new(counts: &'static [u64], budget: Budget, horizon_ns: u64, rule: Rule) -> Self {
        assert!(counts.len() <= RATES_PPM.len(), "a clock rate per process");
        SemaphoreModel {
            counts,
            budget,
            horizon_ns,
            rule,
            lease: LeaseConfig::new(LEASE).expect("valid lease"),
        }
    }

    fn processes(&self) -> usize {
        self.counts.len()
    }

    fn fresh(&self, p: usize, generation: u8, acquires: u8) -> Proc {
        Proc {
            task: Task::new(self.lease, p, generation),
            acq: Acq::Idle,
            woken: false,
            look_at: None,
            acquires,
            calls: 0,
        }
    }

    /// Detaches the holding of `p` (its services, if any, have stopped): idle again.
    fn give_back(world: &mut World, p: usize) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let proc = &mut world.procs[p];
        proc.acq = Acq::Idle;
        proc.woken = false;
        proc.look_at = None;
        proc.task.detach(now, HoldingId(0));
    }

    /// Sends a semaphore call of `p`'s alive session.
    fn send_sem(world: &mut World, p: usize, op: SemOp) {
        let proc = &mut world.procs[p];
        let session = proc.task.session.id().expect("a session");
        if op != SemOp::Look {
            proc.calls += 1;
        }
        world.msgs.push(Msg {
            p: p as u8,
            generation: proc.task.generation,
            call: Call::Sem {
                op,
                session,
                request: proc.calls,
            },
            answered: false,
        });
    }

    /// The core's acquire, as the store runs it; under [`Rule::GrantWhenFits`] with the queue
    /// set aside while it runs, so that a request that fits is granted past the waiters.
    fn acquire(&self, world: &mut World, me: SessionKey, request: RequestId, count: u64) {
        let semaphore = &mut world.semaphore;
        let party = semaphore.owners().iter().any(|o| o.session == me)
            || semaphore.waiters().iter().any(|w| w.session == me);
        let free = LIMIT - semaphore.count();
        if self.rule == Rule::GrantWhenFits && !party && count <= free {
            let waiters = semaphore.waiters().to_vec();
            // From the back, so that no waiter is granted by another one's leaving.
            for w in waiters.iter().rev() {
                semaphore.release(w.session, w.request);
            }
            semaphore
                .acquire(me, request, count, Vec::new(), TIMEOUT_MS)
                .expect("a valid acquire");
            for w in waiters {
                semaphore
                    .acquire(w.session, w.request, w.count, w.data, w.timeout_ms)
                    .expect("a valid acquire");
            }
            return;
        }
        // Refused only when late (an older call than the one that shaped the party): nothing
        // changes, as the store leaves it.
        match semaphore.acquire(me, request, count, Vec::new(), TIMEOUT_MS) {
            Ok(outcome) => assert_ne!(outcome.status, Status::NotGranted, "never a try"),
            Err(SemaphoreError::StaleRequest { .. }) => {}
            Err(other) => panic!("counts are within the limit and never raised: {other}"),
        }
    }

    /// After a transaction: the ledger judges it, and a write wakes the feed.
    fn written(&self, world: &mut World, before: &Semaphore, release: bool) {
        let from_queue = world.granted_from_queue;
        world.observe_queue(before);
        if world.removals > 0 && world.granted_from_queue && !from_queue {
            world.granted_after_removal = true;
        }
        let silent = release && self.rule == Rule::ReleaseNotWoken;
        if world.semaphore != *before && !silent {
            world.wake();
        }
    }

    /// What the runtime does with a semaphore answer (`grant::acquire`, `wait`, `release`).
    fn answered(world: &mut World, p: usize, answer: SemAnswer) {
        let alive = world.procs[p].task.session.liveness().is_some();
        let proc = &mut world.procs[p];
        let start = |proc: &mut Proc| {
            // Services start on the grant; if the session was lost meanwhile, they are told to
            // stop at once.
            proc.acq = if alive { Acq::Running } else { Acq::Stopping };
            proc.woken = false;
            proc.look_at = None;
        };
        let wait = |proc: &mut Proc, expire_in_ns: Option<u64>, now_ns: u64| {
            proc.acq = Acq::Waiting;
            // The look at the soonest expiry is a local timer: a slow clock looks late, a fast
            // one early (and again, with nothing changed, until the expiry: those looks are
            // left out).
            proc.look_at = expire_in_ns.map(|in_ns| {
                let local_at = local(p, now_ns) + in_ns;
                true_at(p, local_at).max(now_ns + in_ns)
            });
        };
        let now_ns = world.now_ns;
        match (proc.acq, answer) {
            (
                Acq::Acquiring | Acq::Looking,
                SemAnswer::Applied {
                    owns: Some(true), ..
                },
            ) => start(proc),
            (
                Acq::Acquiring | Acq::Looking,
                SemAnswer::Applied {
                    owns: Some(false),
                    expire_in_ns,
                },
            ) if alive => wait(proc, expire_in_ns, now_ns),
            // Queued, but the session is over: the wait ends at once, without a call.
            (
                Acq::Acquiring | Acq::Looking,
                SemAnswer::Applied {
                    owns: Some(false), ..
                },
            ) => Self::give_back(world, p),
            // The acquire failed or its outcome is unknown: nothing held (what was written
            // after all ends with the session).
            (Acq::Acquiring, _) => Self::give_back(world, p),
            // The wait failed (or the request is gone): the request is withdrawn with a
            // release, if the session still allows a call.
            (Acq::Looking, _) if alive => {
                proc.acq = Acq::Withdrawing;
                Self::send_sem(world, p, SemOp::Release);
            }
            (Acq::Looking | Acq::Releasing | Acq::Withdrawing, _) => Self::give_back(world, p),
            (acq, answer) => unreachable!("{answer:?} while {acq:?}"),
        }
    }
}

impl Calls for SemaphoreModel {
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
        let now_ns = world.now_ns;
        let key = |id| Key {
            p: msg.p,
            generation: msg.generation,
            id,
        };
        match msg.call {
            Call::Session(effect) => {
                // A keepalive gets a new revision, as the transactional store gives: one that
                // lands late makes the next one refused.
                let writer = (msg.p, msg.generation);
                let (op, reply, ended) =
                    model::apply_session(&mut world.sessions, now_ns, writer, effect, true);
                if let Some(ended) = ended {
                    // The session ends, and its parties with it in the same transaction.
                    let before = world.semaphore.clone();
                    world.semaphore.expire_session(ended.session_key());
                    self.written(world, &before, false);
                }
                Answer::Session(op, reply)
            }
            Call::Sem {
                op,
                session,
                request,
            } => {
                let request = RequestId(u64::from(request));
                if world.live_session(key(session)).is_none() {
                    return Answer::Sem(SemAnswer::SessionGone);
                }
                let me = key(session).session_key();
                let before = world.semaphore.clone();
                // Lazy expiry: no operation sees, counts or queues behind a dead party.
                let parties: Vec<SessionKey> = before
                    .owners()
                    .iter()
                    .map(|o| o.session)
                    .chain(before.waiters().iter().map(|w| w.session))
                    .collect();
                let waits = self.rule != Rule::RemovedNotWaited;
                for party in parties {
                    let counted = waits && world.counted_until(party).is_some();
                    if world.live_party(party).is_none() && !counted {
                        world.semaphore.expire_session(party);
                    }
                }
                let count = self.counts[msg.p as usize];
                match op {
                    SemOp::Acquire => self.acquire(world, me, request, count),
                    SemOp::Look => {}
                    SemOp::Release => {
                        world.semaphore.release(me, request);
                    }
                }
                self.written(world, &before, op == SemOp::Release);
                let semaphore = &world.semaphore;
                let owns = if semaphore.owners().iter().any(|o| o.session == me) {
                    Some(true)
                } else if semaphore.waiters().iter().any(|w| w.session == me) {
                    Some(false)
                } else {
                    None
                };
                let others = semaphore
                    .owners()
                    .iter()
                    .map(|o| o.session)
                    .chain(semaphore.waiters().iter().map(|w| w.session))
                    .filter(|&k| k != me);
                let expire_in_ns = others
                    .filter_map(|k| match world.live_party(k) {
                        Some(r) => Some(r.expires_ns - now_ns),
                        None => world.counted_until(k).map(|until| until - now_ns),
                    })
                    .min();
                Answer::Sem(SemAnswer::Applied { owns, expire_in_ns })
            }
        }
    }

    /// The answer to `msg` reaches its caller, if it still waits for it.
    fn answer(&self, world: &mut World, msg: &Msg<Call>, answer: Answer) {
        let p = msg.p as usize;
        if msg.answered || world.procs[p].task.generation != msg.generation {
            return;
        }
        match answer {
            Answer::Session(op, reply) => {
                self.handle(world, p, |now| SessionEvent::Reply { now, op, reply })
            }
            Answer::Sem(answer) => Self::answered(world, p, answer),
        }
    }

    fn failed(call: &Call) -> Answer {
        match *call {
            Call::Session(effect) => Answer::Session(model::session_op(&effect), Reply::Failed),
            Call::Sem { .. } => Answer::Sem(SemAnswer::Failed),
        }
    }

    fn unknown(answer: Answer) -> Answer {
        match answer {
            Answer::Session(op, _) => Answer::Session(op, Reply::Unknown),
            Answer::Sem(_) => Answer::Sem(SemAnswer::Unknown),
        }
    }
}

impl Sessions for SemaphoreModel {
    fn processes(&self) -> usize {
        self.counts.len()
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
    /// gone with everything it ran; its calls on their way may still reach the store. The
    /// acquires it made still count against the budget.
    fn start(&self, world: &mut World, p: usize, generation: u8) {
        let acquires = world.procs[p].acquires;
        world.procs[p] = self.fresh(p, generation, acquires);
        model::orphan(&mut world.msgs, p);
        self.handle(world, p, |now| SessionEvent::Open { now });
    }

    /// Runs one event through process `p`'s session and performs the effects.
    fn handle(&self, world: &mut World, p: usize, event: impl FnOnce(Instant) -> SessionEvent) {
        let now = Instant::from_nanos(local(p, world.now_ns));
        let handled = world.procs[p].task.handle(&mut world.msgs, p, now, event);
        if handled.lost {
            world.lost_while_owning |= world.acts(p);
            match world.procs[p].acq {
                // Every grant ends at once: its services are told to stop.
                Acq::Running => world.procs[p].acq = Acq::Stopping,
                // The wait ends on the loss; the withdrawal is refused at once (the session is
                // over), so the holding is given back without a call.
                Acq::Waiting => Self::give_back(world, p),
                // A call in flight ends with its answer.
                Acq::Idle
                | Acq::Acquiring
                | Acq::Looking
                | Acq::Stopping
                | Acq::Releasing
                | Acq::Withdrawing => {}
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
            let look = proc.look_at.filter(|_| proc.acq == Acq::Waiting);
            proc.task
                .timer
                .map(|(_, at)| at)
                .into_iter()
                .chain(killer)
                .map(move |at| true_at(p, at))
                .chain(look)
        });
        let expiries = world.sessions.iter().map(|r| r.expires_ns);
        due.chain(expiries).filter(|&at| at > now_ns).min()
    }

    fn killed(world: &mut World, p: usize) {
        world.killed_while_owning |= world.acts(p);
    }

    fn prune(world: &mut World) {
        world.prune();
    }
}

impl Model for SemaphoreModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        let semaphore =
            Semaphore::create(None, NAME, LIMIT, Vec::new()).expect("a valid semaphore");
        let mut world = World {
            now_ns: 0,
            procs: (0..self.processes()).map(|p| self.fresh(p, 0, 0)).collect(),
            sessions: Vec::new(),
            semaphore,
            msgs: Vec::new(),
            spent: Spent::default(),
            ledger: Vec::new(),
            out_of_order: false,
            granted_from_queue: false,
            lost_while_owning: false,
            killed_while_owning: false,
            removed: Vec::new(),
            removals: 0,
            granted_after_removal: false,
        };
        for p in 0..self.processes() {
            self.start(&mut world, p, 0);
        }
        vec![world]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        deliveries(self, world, actions);
        for p in 0..self.processes() {
            let proc = &world.procs[p];
            timer_steps::<Self>(world, p, actions);
            match proc.acq {
                Acq::Idle
                    if proc.task.session.liveness().is_some()
                        && proc.acquires < self.budget.acquires =>
                {
                    actions.push(Action::Acquire(p))
                }
                Acq::Waiting if world.look_due(p) => actions.push(Action::Look(p)),
                Acq::Running => actions.push(Action::Release(p)),
                Acq::Stopping => actions.push(Action::Stop(p)),
                _ => {}
            }
            if world.removals < self.budget.removals && world.removable(p) {
                actions.push(Action::Remove(p));
            }
            session_steps(self, world, p, actions);
        }
        advance_steps(self, world, actions);
    }

    fn next_state(&self, last: &World, action: Action) -> Option<World> {
        let mut world = last.clone();
        match action {
            Action::Step(step) => take(self, &mut world, step)?,
            Action::Acquire(p) => {
                let now = Instant::from_nanos(local(p, world.now_ns));
                let proc = &mut world.procs[p];
                if !proc.task.attach(now, HoldingId(0)) {
                    // Refused (past the deadline): nothing changes.
                    return None;
                }
                proc.acquires += 1;
                proc.acq = Acq::Acquiring;
                // Subscribed before the acquire: a grant right after it is not missed.
                proc.woken = false;
                proc.look_at = None;
                Self::send_sem(&mut world, p, SemOp::Acquire);
            }
            Action::Look(p) => {
                let proc = &mut world.procs[p];
                proc.acq = Acq::Looking;
                // Subscribed again before the look.
                proc.woken = false;
                proc.look_at = None;
                Self::send_sem(&mut world, p, SemOp::Look);
            }
            Action::Release(p) => {
                // The user stopped its services, then releases.
                world.procs[p].acq = Acq::Releasing;
                Self::send_sem(&mut world, p, SemOp::Release);
            }
            Action::Stop(p) => Self::give_back(&mut world, p),
            Action::Remove(p) => {
                let key = world.key_of(p).expect("an owner has a session");
                let now_ns = world.now_ns;
                world.sessions.retain(|r| r.key.session_key() != key);
                world.removed.push((key, now_ns + LEASE_NS));
                world.removals += 1;
                // The deletion wakes the semaphore's feed (`Sq.SemaphoreUnreleased`: the owners'
                // rows are compared; on etcd the party key's deletion is an event).
                world.wake();
            }
        }
        // One order for the calls of different processes: only each one's own order matters.
        world.msgs.sort_by_key(|m| m.p);
        Some(world)
    }

    fn within_boundary(&self, world: &World) -> bool {
        world.now_ns <= self.horizon_ns
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAFETY, |model: &Self, world: &World| {
                world.acting_units(model.counts) <= LIMIT
            }),
            Property::always(ONLY_ALIVE, |model: &Self, world: &World| {
                (0..model.processes()).all(|p| !world.acts(p) || world.alive(p))
            }),
            Property::always(ORDER, |_, world: &World| !world.out_of_order),
            Property::always(WAKEUP, |model: &Self, world: &World| {
                !world.head_fits() && (0..model.processes()).all(|p| world.waiter_told(p))
            }),
            Property::sometimes(TWO_OWNERS, |model: &Self, world: &World| {
                (0..model.processes()).filter(|&p| world.acts(p)).count() >= 2
            }),
            Property::sometimes(FROM_QUEUE, |_, world: &World| world.granted_from_queue),
            Property::sometimes(LOST_WHILE_OWNING, |_, world: &World| {
                world.lost_while_owning
            }),
            Property::sometimes(KILLED_WHILE_OWNING, |_, world: &World| {
                world.killed_while_owning
            }),
            Property::sometimes(GRANTED_AFTER_REMOVAL, |_, world: &World| {
                world.granted_after_removal
            }),
        ]
    }
}

/// One check: the model, how it is searched, and the `sometimes` properties it must reach.
struct Check {
    counts: &'static [u64],
    budget: Budget,
    horizon_ns: u64,
    rule: Rule,
    search: Search,
    reach: &'static [&'static str],
}

fn run(check: &Check, expected: Option<&'static str>) -> model::Found {
    let model = SemaphoreModel::new(check.counts, check.budget, check.horizon_ns, check.rule);
    let label = format!(
        "semaphore model check ({:?}, counts {:?}, {:?})",
        check.rule, check.counts, check.budget
    );
    // A broken rule is judged by the violation it must lead to.
    explore(model, check.search, 0, expected, &label)
}

/// Runs a check of the sound model: fails with every counterexample, and when a `sometimes`
/// property it must reach was not reached (the search would be too shallow to mean anything).
fn check_sound(check: Check) {
    run(&check, None).assert_sound(check.reach);
}

/// Runs a check of an unsound model: it must find a run violating `expected`.
fn check_caught(check: Check, expected: &'static str) {
    run(&check, Some(expected)).assert_caught(expected, check.rule);
}

/// Three processes: an owner of 1, a request of 2 that waits behind it, and a request of 1
/// that would fit but must queue behind the 2.
const BLOCKING: &[u64] = &[1, 2, 1];

/// Depth of the exhaustive check with the full adversary.
const DEPTH: usize = 11;

// covers: Verify.SemaphoreSafety, Verify.SemaphoreOrder, Verify.SemaphoreWakeup
/// Every run of [`DEPTH`] steps (`VVM_SEMAPHORE_MODEL_DEPTH`) of three processes asking for 1,
/// 2 and 1 units: two faults (failed, lost, answer lost, late) on any call, a crash, a close,
/// a late timer, two acquires each. Depth 11: 7 366 255 states explored, 2 591 414 unique, in
/// 27 s of a debug `cargo test` on two cores beside the other checks of this file (33 s for the
/// whole file, 2.6 GB of memory); depth 10 takes 8 s alone, depth 12 about 2.5 times 11.
#[test]
fn semaphores_every_run_to_a_depth() {
    let depth = env_usize("VVM_SEMAPHORE_MODEL_DEPTH").unwrap_or(DEPTH);
    check_sound(Check {
        counts: BLOCKING,
        budget: FULL,
        horizon_ns: HORIZON_NS,
        rule: Rule::Sound,
        search: Search::Exhaustive(Some(depth)),
        reach: &[TWO_OWNERS, FROM_QUEUE],
    });
}

// covers: Verify.SemaphoreSafety, Verify.SemaphoreOrder, Verify.SemaphoreWakeup
/// Every run to the horizon (`1.5·L`) of three processes asking for 1, 2 and 1 units, without
/// faults: every order of their acquires, looks, releases and keepalives.
#[test]
fn semaphores_every_calm_run() {
    check_sound(Check {
        counts: BLOCKING,
        budget: CALM,
        horizon_ns: SHORT_HORIZON_NS,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[TWO_OWNERS, FROM_QUEUE],
    });
}

// covers: Verify.SemaphoreSafety, Verify.SemaphoreWakeup
/// Every run to the horizon (`1.5·L`) of an owner of 2 and a waiter of 1, one keepalive timer
/// firing late (at any later instant, or never): the owner killed at its deadline while acting,
/// and the waiter granted at its look at the owner's expiry.
#[test]
fn semaphores_every_run_of_a_late_timer() {
    check_sound(Check {
        counts: &[2, 1],
        budget: ONE_LATE_TIMER,
        horizon_ns: SHORT_HORIZON_NS,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[KILLED_WHILE_OWNING, FROM_QUEUE],
    });
}

// covers: Verify.SemaphoreSafety, Verify.SemaphoreWakeup
/// Every run to the horizon (`1.5·L`) of an owner of 2 and a waiter of 1 with one keepalive
/// that lands late: the next one is refused and the session lost while its owner acts, its
/// services stopping at any instant or not before the killer.
#[test]
fn semaphores_every_run_of_a_late_keepalive() {
    check_sound(Check {
        counts: &[2, 1],
        budget: ONE_LATE_KEEPALIVE,
        horizon_ns: SHORT_HORIZON_NS,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[LOST_WHILE_OWNING, KILLED_WHILE_OWNING, FROM_QUEUE],
    });
}

// covers: Verify.SemaphoreSafety, Verify.SemaphoreWakeup, Sem.Store.Unreleased
/// Every run to the horizon (`1.5·L`) of an owner of 2 and a waiter of 1 where the owner's
/// session record is removed from outside at any moment: its keepalive is refused and its
/// services stop at any instant or at its killer; its units stay counted for a TTL after the
/// removal, and the waiter is granted only then.
#[test]
fn semaphores_every_run_of_an_owner_removed_from_outside() {
    check_sound(Check {
        counts: &[2, 1],
        budget: ONE_REMOVAL,
        horizon_ns: SHORT_HORIZON_NS,
        rule: Rule::Sound,
        search: Search::Exhaustive(None),
        reach: &[LOST_WHILE_OWNING, GRANTED_AFTER_REMOVAL],
    });
}

// covers: Verify.SemaphoreCanFail, Sem.Store.Unreleased
/// A store that removes an owner removed from outside at once, as if expired: the waiter is
/// granted while the owner's services still run, three units on a semaphore of two.
#[test]
fn semaphores_a_removed_owner_not_waited_out_is_caught() {
    check_caught(
        Check {
            counts: &[2, 1],
            budget: ONE_REMOVAL,
            horizon_ns: SHORT_HORIZON_NS,
            rule: Rule::RemovedNotWaited,
            search: Search::DepthFirst,
            reach: &[],
        },
        SAFETY,
    );
}

// covers: Verify.SemaphoreCanFail
/// With the killer ignored, an owner whose keepalive timer fired late acts on past its
/// deadline; its record expires, the waiter's look removes it and is granted: three units run
/// on a semaphore of two.
#[test]
fn semaphores_an_ignored_killer_is_caught() {
    check_caught(
        Check {
            counts: &[2, 1],
            budget: ONE_LATE_TIMER,
            horizon_ns: SHORT_HORIZON_NS,
            rule: Rule::KillerIgnored,
            search: Search::DepthFirst,
            reach: &[],
        },
        SAFETY,
    );
}

// covers: Verify.SemaphoreCanFail
/// A store that grants whatever fits: the request of 1 that arrives after the queued 2 is
/// granted past it.
#[test]
fn semaphores_a_grant_past_the_queue_is_caught() {
    check_caught(
        Check {
            counts: BLOCKING,
            budget: CALM,
            horizon_ns: SHORT_HORIZON_NS,
            rule: Rule::GrantWhenFits,
            search: Search::Exhaustive(Some(12)),
            reach: &[],
        },
        ORDER,
    );
}

// covers: Verify.SemaphoreCanFail
/// A release whose write does not wake the feed: the waiter it grants waits on, never told.
#[test]
fn semaphores_a_grant_not_woken_is_caught() {
    check_caught(
        Check {
            counts: &[2, 1],
            budget: CALM,
            horizon_ns: SHORT_HORIZON_NS,
            rule: Rule::ReleaseNotWoken,
            search: Search::Exhaustive(Some(12)),
            reach: &[],
        },
        WAKEUP,
    );
}
