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
//! # Nothing on the kill path can block
//!
//! The production [`ExitKiller`] logs nothing through `tracing`, takes no lock, allocates nothing
//! and touches no stdio buffer: it writes one fixed line to standard error without waiting for
//! the reader ([`write_kill_message`]) and ends the process with `_exit`
//! ([`KILL_EXIT_CODE`]), running no exit handler. The thread itself collects passed deadlines
//! into a buffer allocated when it started, releases the lock that [`KillerEntry::arm`] also
//! takes before calling the killer, and logs nothing. That lock is only ever held for a few map
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

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use vvm_core::Instant;

use crate::clock::{boot_instant, HostSuspend, SuspendSource};

mod exit;

pub use exit::{write_kill_message, ExitKiller, KILL_EXIT_CODE, KILL_MESSAGE};

/// Most deadlines held at once. Beyond it new VVMs share one conservative deadline that can only
/// move earlier, so the limit can cost an early exit but never a late one.
pub const DEADLINES_MAX: usize = 4096;
/// Most reports a [`RecordingKiller`] keeps.
pub const RECORDS_MAX: usize = 1024;
/// Longest single sleep of the thread while a deadline is armed: after a resume from suspend the
/// thread notices a passed deadline within this (its sleep is timed on the monotonic clock,
/// which did not move while the host slept).
pub const WAIT_ARMED_MAX: Duration = Duration::from_millis(50);
/// Longest single sleep with nothing armed; arming wakes the thread anyway.
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
    armed: BTreeMap<u64, Armed>,
    /// Deadline shared by the entries registered beyond [`DEADLINES_MAX`]: moves only earlier.
    overflow: Option<Instant>,
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
    /// The label of reports of the shared overflow deadline, made once so that the kill path
    /// never allocates.
    overflow_label: Arc<str>,
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

/// A deadline that passed: whose (`None`: the shared overflow deadline) and its report.
#[derive(Debug)]
struct Passed {
    id: Option<u64>,
    report: KillReport,
}

/// Collects every deadline at or before `now` into `passed`, which has room for all of them
/// (see [`run`]), without removing anything: removal frees memory, and the production killer
/// never returns to need it.
fn collect_passed(
    state: &State,
    now: Instant,
    overflow_label: &Arc<str>,
    passed: &mut Vec<Passed>,
) {
    passed.clear();
    for (id, armed) in &state.armed {
        if armed.deadline <= now {
            passed.push(Passed {
                id: Some(*id),
                report: KillReport {
                    label: armed.label.clone(),
                    deadline: armed.deadline,
                    observed: now,
                },
            });
        }
    }
    if let Some(deadline) = state.overflow.filter(|deadline| *deadline <= now) {
        passed.push(Passed {
            id: None,
            report: KillReport {
                label: overflow_label.clone(),
                deadline,
                observed: now,
            },
        });
    }
}

/// Removes the deadlines a returning (test) killer was called for, unless re-armed meanwhile.
fn remove_passed(state: &mut State, passed: &[Passed]) {
    for passed in passed {
        let deadline = passed.report.deadline;
        match passed.id {
            Some(id) if state.armed.get(&id).is_some_and(|a| a.deadline == deadline) => {
                state.armed.remove(&id);
            }
            None if state.overflow == Some(deadline) => state.overflow = None,
            Some(_) | None => {}
        }
    }
}

fn earliest(state: &State) -> Option<Instant> {
    let armed = state.armed.values().map(|armed| armed.deadline).min();
    match (armed, state.overflow) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn run(shared: Arc<Shared>) {
    // Room for every deadline that can be armed at once (and the overflow one), allocated here
    // so that collecting passed deadlines never allocates.
    let mut passed = Vec::with_capacity(DEADLINES_MAX + 1);
    let mut state = lock(&shared.state);
    loop {
        let now = shared.now(&state);
        let generation = state.generation;
        collect_passed(&state, now, &shared.overflow_label, &mut passed);
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
        let wait = match earliest(&state) {
            Some(deadline) if !shared.manual => deadline.saturating_since(now).min(WAIT_ARMED_MAX),
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
            overflow_label: Arc::from("(overflow)"),
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
            overflowed: AtomicBool::new(false),
        }
    }

    /// Every armed deadline, earliest first, with its label.
    pub fn armed(&self) -> Vec<(Arc<str>, Instant)> {
        let state = lock(&self.shared.state);
        let mut armed: Vec<_> = state
            .armed
            .values()
            .map(|armed| (armed.label.clone(), armed.deadline))
            .collect();
        armed.sort_by_key(|(_, deadline)| *deadline);
        armed
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
    /// Set once this entry's deadline went to the shared overflow deadline.
    overflowed: AtomicBool,
}

impl KillerEntry {
    /// Replaces this entry's deadline by `at`.
    pub fn arm(&self, at: Instant) {
        let shared = &self.thread.shared;
        let mut state = lock(&shared.state);
        if !state.thread_alive {
            drop(state);
            let now = shared.clock_now();
            shared.kill(&[Passed {
                id: Some(self.id),
                report: KillReport {
                    label: self.label.clone(),
                    deadline: at,
                    observed: now,
                },
            }]);
            return;
        }
        let full = state.armed.len() >= DEADLINES_MAX && !state.armed.contains_key(&self.id);
        let mut first_overflow = false;
        if full || self.overflowed.load(Ordering::Relaxed) {
            first_overflow = !self.overflowed.swap(true, Ordering::Relaxed);
            state.overflow = Some(state.overflow.map_or(at, |old| old.min(at)));
        } else {
            let armed = Armed {
                label: self.label.clone(),
                deadline: at,
            };
            state.armed.insert(self.id, armed);
        }
        shared.wake.notify_all();
        // Never log under the lock: a stalled log writer would hold up the killer thread.
        drop(state);
        if first_overflow {
            tracing::warn!(label = %self.label, "too many kill deadlines; sharing a conservative one");
        }
    }

    /// Removes this entry's deadline, for a VVM that released its lease cleanly (every service
    /// stopped by itself, the delete confirmed): nothing it started can still act.
    ///
    /// Returns `true` when a deadline was removed, `false` when none was armed (never armed, or
    /// already fired) or when it cannot be disarmed: an entry registered while [`DEADLINES_MAX`]
    /// deadlines were armed shares the overflow deadline with others, which stays armed.
    pub fn disarm(&self) -> bool {
        if self.overflowed.load(Ordering::Relaxed) {
            return false;
        }
        let shared = &self.thread.shared;
        let removed = lock(&shared.state).armed.remove(&self.id).is_some();
        // The thread may be sleeping until the removed deadline; it finds nothing then.
        shared.wake.notify_all();
        removed
    }

    /// The deadline this entry holds, if armed and not yet fired.
    pub fn deadline(&self) -> Option<Instant> {
        let state = lock(&self.thread.shared.state);
        match self.overflowed.load(Ordering::Relaxed) {
            true => state.overflow,
            false => state.armed.get(&self.id).map(|armed| armed.deadline),
        }
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
