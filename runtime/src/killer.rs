//! The killer: one OS thread that ends the process when a kill deadline passes.
//!
//! Each VVM owns one [`KillerEntry`] and replaces its deadline on every `ArmKiller` effect. The
//! thread sleeps on a condition variable until the earliest armed deadline and then calls the
//! injected [`Killer`]. It is a plain OS thread, not a tokio task, so that a runtime whose workers
//! are all blocked cannot delay it; nothing on the renewal path ever waits for it. Deadlines are
//! never disarmed: after a VVM shut down, its last deadline may still end the process, because
//! work started while it led may still be running.
//!
//! # Time
//!
//! Deadlines are core [`Instant`]s. A killer made with [`KillerThread::new`] reads the operating
//! system's monotonic clock from [`crate::clock::origin`], the same zero the driver's
//! [`Clock`](crate::Clock) uses, so both agree whenever tokio's clock is not paused.
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

use crate::clock::instant_from_std;

/// Most deadlines held at once. Beyond it new VVMs share one conservative deadline that can only
/// move earlier, so the limit can cost an early exit but never a late one.
pub const DEADLINES_MAX: usize = 4096;
/// Most reports a [`RecordingKiller`] keeps.
pub const RECORDS_MAX: usize = 1024;
/// Longest single sleep of the thread; it re-reads the clock at least this often.
const WAIT_MAX: Duration = Duration::from_secs(1);

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

/// The production killer: logs at error level, then `std::process::exit(1)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitKiller;

impl Killer for ExitKiller {
    fn kill(&self, report: &KillReport) {
        tracing::error!(
            label = %report.label,
            deadline_ns = report.deadline.as_nanos(),
            observed_ns = report.observed.as_nanos(),
            "kill deadline passed without a confirmed renewal; ending the process"
        );
        std::process::exit(1);
    }
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
}

impl Shared {
    fn now(&self, state: &State) -> Instant {
        if self.manual {
            state.manual_now
        } else {
            instant_from_std(std::time::Instant::now())
        }
    }

    fn kill(&self, reports: &[KillReport]) {
        for report in reports {
            // A panicking test killer must not take the thread, and every later deadline, down.
            if catch_unwind(AssertUnwindSafe(|| self.killer.kill(report))).is_err() {
                tracing::error!(label = %report.label, "the killer panicked");
            }
        }
    }
}

fn take_expired(state: &mut State, now: Instant) -> Vec<KillReport> {
    let mut reports = Vec::new();
    state.armed.retain(|_, armed| {
        if armed.deadline > now {
            return true;
        }
        reports.push(KillReport {
            label: armed.label.clone(),
            deadline: armed.deadline,
            observed: now,
        });
        false
    });
    if let Some(deadline) = state.overflow.filter(|deadline| *deadline <= now) {
        state.overflow = None;
        reports.push(KillReport {
            label: Arc::from("(overflow)"),
            deadline,
            observed: now,
        });
    }
    reports
}

fn earliest(state: &State) -> Option<Instant> {
    let armed = state.armed.values().map(|armed| armed.deadline).min();
    match (armed, state.overflow) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn run(shared: Arc<Shared>) {
    let mut state = lock(&shared.state);
    loop {
        let now = shared.now(&state);
        let generation = state.generation;
        let expired = take_expired(&mut state, now);
        if !expired.is_empty() {
            drop(state);
            shared.kill(&expired);
            state = lock(&shared.state);
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
            Some(deadline) if !shared.manual => deadline.saturating_since(now).min(WAIT_MAX),
            _ => WAIT_MAX,
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
    /// The process-wide killer: [`ExitKiller`] on the operating system's monotonic clock.
    /// Started on first use; every VVM uses it unless told otherwise.
    pub fn global() -> KillerThread {
        static GLOBAL: OnceLock<KillerThread> = OnceLock::new();
        GLOBAL.get_or_init(|| KillerThread::new(ExitKiller)).clone()
    }

    /// A killer thread calling `killer`, on the operating system's monotonic clock.
    pub fn new(killer: impl Killer) -> KillerThread {
        KillerThread::start(Box::new(killer), false)
    }

    /// A killer thread calling `killer`, whose clock moves only through the returned
    /// [`ManualKillerTime`]. For paused-time tests.
    pub fn manual(killer: impl Killer) -> (KillerThread, ManualKillerTime) {
        let thread = KillerThread::start(Box::new(killer), true);
        let time = ManualKillerTime {
            thread: thread.clone(),
        };
        (thread, time)
    }

    fn start(killer: Box<dyn Killer>, manual: bool) -> KillerThread {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            processed: Condvar::new(),
            killer,
            manual,
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
/// [`arm`](Self::arm). Dropping it leaves the deadline armed.
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
            let now = instant_from_std(std::time::Instant::now());
            shared.kill(&[KillReport {
                label: self.label.clone(),
                deadline: at,
                observed: now,
            }]);
            return;
        }
        let full = state.armed.len() >= DEADLINES_MAX && !state.armed.contains_key(&self.id);
        if full || self.overflowed.load(Ordering::Relaxed) {
            if !self.overflowed.swap(true, Ordering::Relaxed) {
                tracing::warn!(label = %self.label, "too many kill deadlines; sharing a conservative one");
            }
            state.overflow = Some(state.overflow.map_or(at, |old| old.min(at)));
        } else {
            let armed = Armed {
                label: self.label.clone(),
                deadline: at,
            };
            state.armed.insert(self.id, armed);
        }
        shared.wake.notify_all();
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
                .wait_timeout(state, WAIT_MAX)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
