//! The killer: one OS thread that ends the process when a kill deadline passes.
//!
//! Each VVM owns one [`KillerEntry`] and replaces its deadline on every `ArmKiller` effect. The
//! thread sleeps on a condition variable until the earliest armed deadline and then calls the
//! injected [`Killer`]. It is a plain OS thread, not a tokio task, so that a runtime whose workers
//! are all blocked cannot delay it; nothing on the renewal path ever waits for it. A deadline is
//! removed only by [`KillerEntry::disarm`], which a VVM calls after a clean release; otherwise a
//! shut-down VVM's last deadline still ends the process, because work started while it led may
//! still be running.
//!
//! # Any number of entries
//!
//! Every entry keeps its own deadline, however many are armed: the deadlines are indexed by
//! entry and ordered by time, so arming, disarming and finding the earliest cost `O(log n)` in
//! the number `n` of armed entries, and each entry costs a constant amount of memory. Nothing
//! is shared between entries, so a renewal always extends exactly its own holding's deadline.
//!
//! # Nothing on the kill path can block
//!
//! The production [`ExitKiller`] logs nothing through `tracing`, takes no lock, allocates nothing
//! and touches no stdio buffer: it writes one fixed line to standard error without waiting for
//! the reader ([`write_kill_message`]) and ends the process with `_exit`
//! ([`KILL_EXIT_CODE`]), running no exit handler. The thread itself collects passed deadlines,
//! at most [`PASSED_BATCH_MAX`] at a time, into a buffer allocated when it started, releases the
//! lock that [`KillerEntry::arm`] also takes before calling the killer, and logs nothing. That lock is only ever held for a few map
//! operations, never while logging or waiting. Whoever wants the reason logged does so before the
//! deadline, e.g. when a renewal fails.
//!
//! # Time
//!
//! Deadlines are core [`Instant`]s on the runtime's one clock (see [`crate::clock`]): the thread
//! reads the operating system's monotonic clock from [`crate::clock::origin`] plus the time the
//! host spent suspended ([`HostSuspend`]), which is `CLOCK_BOOTTIME` on Linux, so it agrees with
//! the driver's [`Clock`](crate::Clock) whenever tokio's clock is not paused. It sleeps at most
//! [`WAIT_ARMED_MAX`] while a deadline is armed and re-reads the clock on every wake: after a
//! resume from suspend the condition variable's timeout (monotonic) may still have that long to
//! run, and the deadline may long have passed.
//!
//! Under `tokio::time::pause()` tokio's clock and the operating system's drift apart, so a
//! paused-time test uses [`KillerThread::manual`]: that killer's clock moves only when the test
//! calls [`ManualKillerTime::set`] with a reading of the driver's clock, and `set` returns only
//! after the thread has acted on the new time. Together with a [`RecordingKiller`] the test can
//! then assert exactly when the killer fired. A paused-time test must never use the process-wide
//! [`KillerThread::global`] killer: real time keeps running while virtual time stands still.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use vvm_core::Instant;

use crate::clock::{boot_instant, HostSuspend, SuspendSource};

mod exit;

pub use exit::{write_kill_message, ExitKiller, KILL_EXIT_CODE, KILL_MESSAGE};

/// Most passed deadlines the thread hands to the killer in one round. The production killer
/// never returns from the first; a returning (test) killer gets the rest in the next rounds, so
/// the bound only sizes the buffer allocated when the thread starts, never the entries.
pub const PASSED_BATCH_MAX: usize = 64;
/// Most reports a [`RecordingKiller`] keeps.
pub const RECORDS_MAX: usize = 1024;
/// Longest single sleep of the thread while a deadline is armed: after a resume from suspend the
/// thread notices a passed deadline within this (its sleep is timed on the monotonic clock,
/// which did not move while the host slept).
pub const WAIT_ARMED_MAX: Duration = Duration::from_millis(50);
/// Longest single sleep of a manual-clock killer (tests): it must notice when its last handle is
/// gone. The real-clock thread sleeps without a limit while nothing is armed: arming wakes it.
const WAIT_IDLE_MAX: Duration = Duration::from_secs(1);

/// What the killer knows when a deadline passes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillReport {
    /// Who armed the deadline (the VVM's address).
    pub label: Arc<str>,
    /// The deadline that passed.
    pub deadline: Instant,
    /// The killer's clock when it noticed.
    pub observed: Instant,
}

/// Ends the process, or, in tests, observes that it would have.
pub trait Killer: Send + Sync + 'static {
    /// Called on the killer thread once per passed deadline. Must not return in production:
    /// past the deadline this process may no longer act as leader.
    fn kill(&self, report: &KillReport);
}

/// A killer for tests: records each report (at most [`RECORDS_MAX`]) instead of ending anything.
#[derive(Clone, Debug, Default)]
pub struct RecordingKiller {
    inner: Arc<(Mutex<Vec<KillReport>>, Condvar)>,
}

impl RecordingKiller {
    /// An empty recorder.
    pub fn new() -> Self {
        RecordingKiller::default()
    }

    /// The reports so far.
    pub fn reports(&self) -> Vec<KillReport> {
        lock(&self.inner.0).clone()
    }

    /// Blocks until at least `count` reports exist or `limit` passes; returns the reports then.
    /// The limit only keeps a broken test from hanging; assert on what is returned.
    pub fn wait_for(&self, count: usize, limit: Duration) -> Vec<KillReport> {
        let guard = lock(&self.inner.0);
        let (guard, _) = self
            .inner
            .1
            .wait_timeout_while(guard, limit, |reports| reports.len() < count)
            .unwrap_or_else(PoisonError::into_inner);
        guard.clone()
    }
}

impl Killer for RecordingKiller {
    fn kill(&self, report: &KillReport) {
        let mut reports = lock(&self.inner.0);
        if reports.len() < RECORDS_MAX {
            reports.push(report.clone());
        }
        self.inner.1.notify_all();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; the killer must keep working.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct Armed {
    label: Arc<str>,
    deadline: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// Each entry's deadline, by entry id.
    armed: BTreeMap<u64, Armed>,
    /// The same deadlines ordered by time (then entry id): the earliest is the first, found
    /// without looking at the others.
    by_deadline: BTreeSet<(Instant, u64)>,
    registered: u64,
    manual_now: Instant,
    generation: u64,
    processed: u64,
    thread_alive: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    processed: Condvar,
    killer: Box<dyn Killer>,
    manual: bool,
    suspend: Box<dyn SuspendSource>,
}

impl State {
    /// Sets entry `id`'s deadline, replacing the one it had.
    fn arm(&mut self, id: u64, armed: Armed) {
        let at = armed.deadline;
        if let Some(old) = self.armed.insert(id, armed) {
            self.by_deadline.remove(&(old.deadline, id));
        }
        self.by_deadline.insert((at, id));
    }

    /// Removes entry `id`'s deadline; whether it had one.
    fn disarm(&mut self, id: u64) -> bool {
        match self.armed.remove(&id) {
            Some(old) => self.by_deadline.remove(&(old.deadline, id)),
            None => false,
        }
    }

    fn earliest(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }
}

impl Shared {
    fn now(&self, state: &State) -> Instant {
        if self.manual {
            state.manual_now
        } else {
            self.clock_now()
        }
    }

    /// The killer's clock: the boot clock on Linux (see [`crate::clock`]).
    fn clock_now(&self) -> Instant {
        boot_instant(std::time::Instant::now(), self.suspend.as_ref())
    }

    fn kill(&self, reports: &[Passed]) {
        for passed in reports {
            // A panicking test killer must not take the thread, and every later deadline, down.
            // Its panic message was printed by the panic hook; nothing is logged here, on the
            // kill path.
            let _ = catch_unwind(AssertUnwindSafe(|| self.killer.kill(&passed.report)));
        }
    }
}

/// A deadline that passed: whose and its report.
#[derive(Debug)]
struct Passed {
    id: u64,
    report: KillReport,
}

/// Collects the earliest deadlines at or before `now`, at most `passed`'s capacity
/// ([`PASSED_BATCH_MAX`], see [`run`]) so that this never allocates, without removing anything:
/// removal frees memory, and the production killer never returns to need it. Walks only the
/// passed deadlines, in time order.
fn collect_passed(state: &State, now: Instant, passed: &mut Vec<Passed>) {
    passed.clear();
    let room = passed.capacity();
    for &(deadline, id) in state.by_deadline.iter().take(room) {
        if deadline > now {
            break;
        }
        let Some(armed) = state.armed.get(&id) else {
            continue;
        };
        passed.push(Passed {
            id,
            report: KillReport {
                label: armed.label.clone(),
                deadline,
                observed: now,
            },
        });
    }
}

/// Removes the deadlines a returning (test) killer was called for, unless re-armed meanwhile.
fn remove_passed(state: &mut State, passed: &[Passed]) {
    for passed in passed {
        let id = passed.id;
        if state
            .armed
            .get(&id)
            .is_some_and(|armed| armed.deadline == passed.report.deadline)
        {
            state.disarm(id);
        }
    }
}

fn run(shared: Arc<Shared>) {
    // Room for one round of passed deadlines, allocated here so that collecting them never
    // allocates; more passed deadlines than that are taken in the following rounds.
    let mut passed = Vec::with_capacity(PASSED_BATCH_MAX);
    let mut state = lock(&shared.state);
    loop {
        let now = shared.now(&state);
        let generation = state.generation;
        collect_passed(&state, now, &mut passed);
        if !passed.is_empty() {
            // Never call the killer holding the lock `arm` takes.
            drop(state);
            shared.kill(&passed);
            state = lock(&shared.state);
            remove_passed(&mut state, &passed);
            continue;
        }
        state.processed = generation;
        shared.processed.notify_all();
        // A manual clock with no handle left can never move again: nothing can fire any more.
        if shared.manual && Arc::strong_count(&shared) == 1 {
            state.thread_alive = false;
            return;
        }
        let wait = match state.earliest() {
            Some(deadline) if !shared.manual => deadline.saturating_since(now).min(WAIT_ARMED_MAX),
            // Nothing armed: only an arm (which wakes it) can give the thread work, so a
            // process that holds nothing never wakes it (a standby costs nothing).
            None if !shared.manual => {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            _ => WAIT_IDLE_MAX,
        };
        state = shared
            .wake
            .wait_timeout(state, wait)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Handle of one killer thread. Cloning shares the thread.
#[derive(Clone)]
pub struct KillerThread {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KillerThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KillerThread")
            .field("manual", &self.shared.manual)
            .finish_non_exhaustive()
    }
}

impl KillerThread {
    /// The process-wide killer: [`ExitKiller`] on the runtime's clock (the boot clock on Linux).
    /// Started on first use; every VVM uses it unless told otherwise.
    pub fn global() -> KillerThread {
        static GLOBAL: OnceLock<KillerThread> = OnceLock::new();
        GLOBAL.get_or_init(|| KillerThread::new(ExitKiller)).clone()
    }

    /// A killer thread calling `killer`, on the runtime's clock (the boot clock on Linux).
    pub fn new(killer: impl Killer) -> KillerThread {
        KillerThread::with_suspend(killer, HostSuspend)
    }

    /// A killer thread calling `killer`, on the operating system's monotonic clock plus the
    /// suspended time `suspend` reports: with a [`ManualSuspend`](crate::clock::ManualSuspend),
    /// a test models a host suspend.
    pub fn with_suspend(killer: impl Killer, suspend: impl SuspendSource) -> KillerThread {
        KillerThread::start(Box::new(killer), false, Box::new(suspend))
    }

    /// A killer thread calling `killer`, whose clock moves only through the returned
    /// [`ManualKillerTime`]. For paused-time tests.
    pub fn manual(killer: impl Killer) -> (KillerThread, ManualKillerTime) {
        let thread = KillerThread::start(Box::new(killer), true, Box::new(HostSuspend));
        let time = ManualKillerTime {
            thread: thread.clone(),
        };
        (thread, time)
    }

    fn start(
        killer: Box<dyn Killer>,
        manual: bool,
        suspend: Box<dyn SuspendSource>,
    ) -> KillerThread {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            processed: Condvar::new(),
            killer,
            manual,
            suspend,
        });
        let for_thread = shared.clone();
        lock(&shared.state).thread_alive = true;
        let spawned = std::thread::Builder::new()
            .name("vvm-killer".into())
            .spawn(move || run(for_thread));
        if let Err(err) = spawned {
            // Without a thread no deadline can be enforced; `arm` then kills at once.
            tracing::error!(%err, "could not start the killer thread");
            lock(&shared.state).thread_alive = false;
        }
        KillerThread { shared }
    }

    /// A new entry labelled `label` (shown in kill reports), with no deadline yet.
    pub fn register(&self, label: &str) -> KillerEntry {
        let mut state = lock(&self.shared.state);
        state.registered += 1;
        KillerEntry {
            thread: self.clone(),
            id: state.registered,
            label: Arc::from(label),
        }
    }

    /// Every armed deadline, earliest first, with its label.
    pub fn armed(&self) -> Vec<(Arc<str>, Instant)> {
        let state = lock(&self.shared.state);
        state
            .by_deadline
            .iter()
            .filter_map(|(deadline, id)| Some((state.armed.get(id)?.label.clone(), *deadline)))
            .collect()
    }
}

/// One VVM's place in the killer: holds at most one deadline, replaced by each
/// [`arm`](Self::arm) and removed only by [`disarm`](Self::disarm). Dropping it leaves the
/// deadline armed.
#[derive(Debug)]
pub struct KillerEntry {
    thread: KillerThread,
    id: u64,
    label: Arc<str>,
}

impl KillerEntry {
    /// Replaces this entry's deadline by `at` — unless the deadline it has passed already: a
    /// passed deadline is never replaced, so the kill does not depend on the thread having
    /// been scheduled before the next renewal was confirmed.
    pub fn arm(&self, at: Instant) {
        let shared = &self.thread.shared;
        let mut state = lock(&shared.state);
        if !state.thread_alive {
            drop(state);
            let now = shared.clock_now();
            shared.kill(&[Passed {
                id: self.id,
                report: KillReport {
                    label: self.label.clone(),
                    deadline: at,
                    observed: now,
                },
            }]);
            return;
        }
        let now = shared.now(&state);
        if state
            .armed
            .get(&self.id)
            .is_some_and(|armed| armed.deadline <= now)
        {
            // A deadline that passed is final: the thread ends the process at its next look,
            // however late it is scheduled (a process stopped past its deadline and resumed).
            // A renewal confirmed after it — sent late, by a process that should have been
            // ended already — must not take the kill back.
            shared.wake.notify_all();
            return;
        }
        let armed = Armed {
            label: self.label.clone(),
            deadline: at,
        };
        state.arm(self.id, armed);
        shared.wake.notify_all();
    }

    /// Removes this entry's deadline, for a VVM that released its lease cleanly (every service
    /// stopped by itself, the delete confirmed): nothing it started can still act.
    ///
    /// Returns `true` when a deadline was removed, `false` when none was armed (never armed, or
    /// already fired).
    pub fn disarm(&self) -> bool {
        let shared = &self.thread.shared;
        let removed = lock(&shared.state).disarm(self.id);
        // The thread may be sleeping until the removed deadline; it finds nothing then.
        shared.wake.notify_all();
        removed
    }

    /// The deadline this entry holds, if armed and not yet fired.
    pub fn deadline(&self) -> Option<Instant> {
        let state = lock(&self.thread.shared.state);
        state.armed.get(&self.id).map(|armed| armed.deadline)
    }
}

/// The clock of a [`KillerThread::manual`] killer.
#[derive(Clone, Debug)]
pub struct ManualKillerTime {
    thread: KillerThread,
}

impl ManualKillerTime {
    /// Moves the killer's clock to `now` (never backwards) and returns once the thread has
    /// fired every deadline at or before it.
    pub fn set(&self, now: Instant) {
        let shared = &self.thread.shared;
        let mut state = lock(&shared.state);
        state.manual_now = state.manual_now.max(now);
        state.generation += 1;
        let generation = state.generation;
        shared.wake.notify_all();
        while state.thread_alive && state.processed < generation {
            state = shared
                .processed
                .wait_timeout(state, WAIT_IDLE_MAX)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
