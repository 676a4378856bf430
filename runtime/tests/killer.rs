//! The killer as a VVM uses it: it fires at the deadline the VVM armed, from its own OS thread
//! even when no tokio worker can run, and only confirmed renewals move that deadline later; the
//! killer thread on its own, on a manual clock; after a (modelled) suspend of the host; and the
//! production killer in a child process whose log writer is blocked.

use vvm_test_support as common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, pass, TestKiller, LEASE};
use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;
use vvm_core::{Instant, LeaseConfig, Slot, VvmConfig};
use vvm_runtime::clock::boot_instant;
use vvm_runtime::{
    clock::Clock, clock::TimeSource, killer::ExitKiller, killer::KILL_EXIT_CODE, KillerThread,
    ManualSuspend, RecordingKiller, Services, Vvm, VvmError,
};
use vvm_runtime::{killer::KillerEntry, killer::PASSED_BATCH_MAX, killer::WAIT_ARMED_MAX};

const SLOT: Slot = Slot(1);
const EPSILON: Duration = Duration::from_millis(1);
/// Only keeps a broken test from hanging; no assertion depends on it.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn lease() -> LeaseConfig {
    LeaseConfig::new(LEASE).unwrap()
}

// covers: Rt.Killer
#[tokio::test(start_paused = true)]
async fn the_killer_fires_at_the_deadline_of_a_vvm_whose_renewals_hang() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let launched_at = Clock.now();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let deadline = vvm.kill_deadline().unwrap();
    assert_eq!(deadline, launched_at + lease().kill_after());

    // From now on every call hangs: no renewal is ever confirmed.
    store.inject(SLOT, Injection::new(Fault::Hang));
    pass(deadline.saturating_since(Clock.now()) - EPSILON).await;
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "fired before the deadline"
    );
    assert_eq!(
        vvm.kill_deadline(),
        Some(deadline),
        "unconfirmed renewals never extend it"
    );

    pass(EPSILON).await;
    killer.catch_up();
    let reports = killer.recorder.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].deadline, deadline);
    assert_eq!(&*reports[0].label, "10.0.0.1:7000");

    // Shutting down does not disarm anything: the deadline already passed and was acted on.
    store.clear_fault(SLOT);
    assert!(vvm.shutdown().await.is_err(), "the lease was lost");
    assert_eq!(killer.recorder.reports().len(), 1);
}

// covers: Rt.KillerDisarm
#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_removes_the_deadline_and_a_loss_keeps_it() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let deadline = vvm.kill_deadline().unwrap();
    assert_eq!(vvm.shutdown().await, Ok(()));
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert!(killer.thread.armed().is_empty(), "a clean release disarms");
    pass(deadline.saturating_since(Clock.now()) + EPSILON).await;
    killer.catch_up();
    assert!(killer.recorder.reports().is_empty());

    // A loss (the record taken underneath) leaves the deadline armed: it fires.
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let deadline = vvm.kill_deadline().unwrap();
    store.overwrite(SLOT, &common::foreign("z")).unwrap();
    pass(lease().renew_interval() + EPSILON).await;
    assert!(vvm.is_lost());
    assert!(vvm.shutdown().await.is_err(), "the lease was lost");
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "shutdown after a loss did not disarm"
    );
    pass(deadline.saturating_since(Clock.now())).await;
    killer.catch_up();
    let reports = killer.recorder.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].deadline, deadline);
}

// covers: Rt.DeadlineMovesOnConfirm
#[tokio::test(start_paused = true)]
async fn only_confirmed_renewals_move_the_deadline_later() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let first = vvm.kill_deadline().unwrap();

    // A confirmed renewal at 5 s moves the deadline to its send time + 16 s.
    let renewal_at = Clock.now() + lease().renew_interval();
    pass(lease().renew_interval() + EPSILON).await;
    let renewed = vvm.kill_deadline().unwrap();
    assert_eq!(renewed, renewal_at + lease().kill_after());
    assert!(renewed > first);
    let armed = killer.thread.armed();
    assert_eq!(armed.len(), 1);
    assert_eq!(armed[0].1, renewed, "the killer holds what the VVM armed");

    // Renewals whose outcome stays unknown (nothing committed) are never confirmed: attempts
    // at 10, 11, 13 and 17 s, then the loss (a retry at 21 s could not beat the deadline), and
    // the deadline has not moved.
    let unknown = Injection::new(Fault::UnknownNotCommitted).on(Op::CompareAndSwap);
    store.inject(SLOT, unknown);
    let backoffs = lease().retry_backoff(1) + lease().retry_backoff(2) + lease().retry_backoff(3);
    pass(lease().renew_interval() + backoffs + EPSILON).await;
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 5);
    assert!(vvm.current_problem().is_some());
    assert_eq!(vvm.kill_deadline(), Some(renewed));
    assert_eq!(killer.thread.armed()[0].1, renewed);

    killer.time.set(renewed);
    assert_eq!(killer.recorder.reports().len(), 1);
    assert!(vvm.shutdown().await.is_err());
}

// covers: Rt.Killer
#[test]
fn the_killer_fires_while_every_tokio_worker_is_blocked() {
    const WORKERS: usize = 2;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
        .unwrap();
    let recorder = RecordingKiller::new();
    let killer = KillerThread::new(recorder.clone());
    // The shortest lease: the deadline is 1.6 s after the last confirmed write.
    let config = VvmConfig::builder("10.0.0.1:7000")
        .lease(vvm_core::LEASE_MIN)
        .build()
        .unwrap();
    let vvm = runtime.block_on(
        Vvm::provide(config, MemoryStore::new(), Services::new())
            .unwrap()
            .with_killer(killer)
            .launch(),
    );
    assert!(vvm.current_problem().is_none());
    let armed_at_launch = vvm.kill_deadline().unwrap();

    // Occupy every worker with a task that blocks its thread until the killer has fired.
    let entered = Arc::new(AtomicUsize::new(0));
    for _ in 0..WORKERS {
        let (recorder, entered) = (recorder.clone(), entered.clone());
        runtime.spawn(async move {
            entered.fetch_add(1, Ordering::SeqCst);
            recorder.wait_for(1, HANG_GUARD);
        });
    }
    let reports = recorder.wait_for(1, HANG_GUARD);
    assert_eq!(
        entered.load(Ordering::SeqCst),
        WORKERS,
        "every worker was blocked"
    );
    assert_eq!(reports.len(), 1, "the killer did not fire");
    let report = &reports[0];
    assert!(report.observed >= report.deadline);
    assert!(report.deadline >= armed_at_launch);

    // Once the workers are free again the VVM may still renew (the record outlives the kill
    // deadline by design) or find it gone; either way it shuts down.
    let outcome = runtime.block_on(vvm.shutdown());
    assert!(
        matches!(outcome, Ok(()) | Err(VvmError::LeadershipLost { .. })),
        "{outcome:?}"
    );
    runtime.shutdown_timeout(HANG_GUARD);
}

// covers: Rt.Killer
#[test]
fn a_manual_killer_fires_exactly_at_the_deadline() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entry = thread.register("a");
    entry.arm(Instant::from_nanos(100));
    time.set(Instant::from_nanos(99));
    assert!(recorder.reports().is_empty());
    time.set(Instant::from_nanos(100));
    let reports = recorder.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].deadline, Instant::from_nanos(100));
    assert_eq!(entry.deadline(), None);
}

#[test]
fn a_later_arm_replaces_the_deadline() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entry = thread.register("a");
    entry.arm(Instant::from_nanos(100));
    entry.arm(Instant::from_nanos(200));
    time.set(Instant::from_nanos(150));
    assert!(recorder.reports().is_empty());
    time.set(Instant::from_nanos(200));
    assert_eq!(recorder.reports().len(), 1);
}

/// Well beyond 4 096 entries on one killer.
const ENTRIES_MANY: usize = 5_000;

// covers: Rt.KillerScales
/// Every one of 5 000 entries keeps its own deadline: a later arm (a renewal) moves each one,
/// so none fires at its first deadline, and each fires at its own later one.
#[test]
fn every_entry_of_thousands_keeps_its_own_deadline() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entries: Vec<_> = (0..ENTRIES_MANY).map(|_| thread.register("x")).collect();
    for entry in &entries {
        entry.arm(Instant::from_nanos(1_000));
    }
    for (index, entry) in entries.iter().enumerate() {
        entry.arm(Instant::from_nanos(2_000 + index as u64));
    }
    let last = entries.last().unwrap();
    assert_eq!(
        last.deadline(),
        Some(Instant::from_nanos(2_000 + ENTRIES_MANY as u64 - 1))
    );
    time.set(Instant::from_nanos(1_999));
    assert!(
        recorder.reports().is_empty(),
        "{} deadline(s) fired before any was due",
        recorder.reports().len()
    );
    assert_eq!(thread.armed().len(), ENTRIES_MANY);
    // The earliest ten pass, in order; the others stay armed.
    time.set(Instant::from_nanos(2_009));
    let fired: Vec<_> = recorder.reports().iter().map(|r| r.deadline).collect();
    let expected: Vec<_> = (0..10).map(|i| Instant::from_nanos(2_000 + i)).collect();
    assert_eq!(fired, expected);
    assert_eq!(thread.armed().len(), ENTRIES_MANY - 10);
}

// covers: Rt.KillerScales, Rt.Disarm
/// Each of 5 000 entries can be disarmed; then nothing fires.
#[test]
fn every_entry_of_thousands_can_be_disarmed() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entries: Vec<_> = (0..ENTRIES_MANY).map(|_| thread.register("x")).collect();
    for entry in &entries {
        entry.arm(Instant::from_nanos(50));
    }
    assert!(entries.iter().all(KillerEntry::disarm));
    assert!(thread.armed().is_empty());
    time.set(Instant::from_nanos(100));
    assert!(recorder.reports().is_empty(), "a disarmed deadline fired");
}

// covers: Rt.KillerScales
/// More deadlines passing at once than the thread hands over in one round: a returning killer
/// is still called once for each.
#[test]
fn more_deadlines_passing_at_once_than_one_round_all_fire() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let count = PASSED_BATCH_MAX * 3 + 1;
    let entries: Vec<_> = (0..count).map(|_| thread.register("x")).collect();
    for entry in &entries {
        entry.arm(Instant::from_nanos(10));
    }
    time.set(Instant::from_nanos(10));
    assert_eq!(recorder.reports().len(), count);
    assert!(thread.armed().is_empty());
}

// covers: Rt.Disarm
#[test]
fn disarm_removes_the_deadline_of_an_entry() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entry = thread.register("a");
    let other = thread.register("b");
    entry.arm(Instant::from_nanos(100));
    other.arm(Instant::from_nanos(300));
    assert!(entry.disarm());
    assert_eq!(entry.deadline(), None);
    assert_eq!(thread.armed().len(), 1, "only this entry's deadline went");
    time.set(Instant::from_nanos(200));
    assert!(recorder.reports().is_empty(), "a disarmed deadline fired");
    assert!(!entry.disarm(), "nothing was armed any more");
    // A disarmed entry can be armed again.
    entry.arm(Instant::from_nanos(250));
    time.set(Instant::from_nanos(300));
    let labels: Vec<_> = recorder.reports().iter().map(|r| r.label.clone()).collect();
    assert_eq!(labels, [Arc::from("a"), Arc::from("b")]);
}

/// How soon after the host resumes the killer must act on a deadline that passed while it slept.
const RESUME_NOTICE_MAX: Duration = Duration::from_millis(100);

// covers: Rt.OneClock
/// Issue 11, finding 2: L = 2 s, the holder armed its deadline 1.6 s out, then the host slept
/// 3 s. Its lease has expired for everyone else (the stores' clocks kept running), so the killer
/// must fire at once on resume, not 1.4 s later when the monotonic clock reaches the deadline.
#[test]
fn after_a_suspend_longer_than_the_lease_the_killer_fires_at_once() {
    let lease = LeaseConfig::new(Duration::from_secs(2)).unwrap();
    let recorder = RecordingKiller::new();
    let suspend = ManualSuspend::new();
    let thread = KillerThread::with_suspend(recorder.clone(), suspend.clone());
    let entry = thread.register("suspended");
    let armed_at = boot_instant(std::time::Instant::now(), &suspend);
    let deadline = armed_at + lease.kill_after();
    entry.arm(deadline);

    // Not a multiple of the thread's longest sleep: the resume falls between two of its wakes.
    std::thread::sleep(Duration::from_millis(225));
    assert!(recorder.reports().is_empty(), "fired before the suspend");
    let resumed = std::time::Instant::now();
    suspend.suspend(Duration::from_secs(3));
    let reports = recorder.wait_for(1, HANG_GUARD);
    let noticed_after = resumed.elapsed();
    eprintln!("the killer fired {noticed_after:?} after the resume");

    assert_eq!(reports.len(), 1, "the killer never fired");
    assert!(
        noticed_after <= RESUME_NOTICE_MAX,
        "the killer fired {noticed_after:?} after the resume; the lease had already expired"
    );
    assert_eq!(reports[0].deadline, deadline);
    assert!(reports[0].observed >= armed_at + Duration::from_secs(3));
    assert!(WAIT_ARMED_MAX < RESUME_NOTICE_MAX);
}

/// Set in the child process of [`a_blocked_log_writer_does_not_delay_the_kill`].
const BLOCKED_CHILD_ENV: &str = "VVM_TEST_BLOCKED_KILL_CHILD";
/// The child arms its deadline this far ahead.
const CHILD_DEADLINE_AHEAD: Duration = Duration::from_millis(300);
/// Issue 11 fixes it: the child must have ended this soon after its deadline.
const KILL_LATE_MAX: Duration = Duration::from_millis(100);
/// How long past its deadline a child that was not killed is left running.
const CHILD_GIVE_UP_AFTER: Duration = Duration::from_secs(5);

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for the parent and the child process.
fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

// covers: Rt.KillNeverBlocks
/// Issue 11, finding 1. A child process whose standard error is a full pipe nobody reads, with a
/// tracing subscriber that writes there (so every log line blocks, holding the standard error
/// lock) and a thread that keeps logging, arms the production killer 300 ms ahead. It must end
/// with [`KILL_EXIT_CODE`] within 100 ms of that deadline.
#[test]
fn a_blocked_log_writer_does_not_delay_the_kill() {
    if std::env::var_os(BLOCKED_CHILD_ENV).is_some() {
        blocked_child();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_blocked_log_writer_does_not_delay_the_kill"])
        .args(["--nocapture", "--test-threads", "1"])
        .env(BLOCKED_CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held open and never read: the child's writes to it block once it is full.
    let _stderr = child.stderr.take().unwrap();
    let mut deadline_ns = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // The test harness may have begun the line with the test's name.
        if let Some((_, ns)) = line.split_once("deadline_ns=") {
            deadline_ns = Some(ns.trim().parse::<u64>().unwrap());
            break;
        }
    }
    let deadline_ns = deadline_ns.expect("the child reports its deadline");
    let give_up_ns = deadline_ns + CHILD_GIVE_UP_AFTER.as_nanos() as u64;
    let (status, ended_ns) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, monotonic_ns());
        }
        if monotonic_ns() > give_up_ns {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the child was still running {CHILD_GIVE_UP_AFTER:?} after its kill deadline");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let late = Duration::from_nanos(ended_ns.saturating_sub(deadline_ns));
    eprintln!("the child ended {late:?} after its deadline: {status}");
    assert_eq!(status.code(), Some(KILL_EXIT_CODE), "{status}");
    assert!(
        ended_ns >= deadline_ns,
        "the child ended before its deadline"
    );
    assert!(
        late <= KILL_LATE_MAX,
        "the child ended {late:?} after its deadline"
    );
}

/// Set in the child process of [`the_kill_message_reaches_a_pipe_and_a_file`].
const MESSAGE_CHILD_ENV: &str = "VVM_TEST_KILL_MESSAGE_CHILD";

// covers: Rt.KillNeverBlocks
/// The fixed line of a kill reaches standard error when it can: a pipe that is read (through
/// the killer's own non-blocking open of it) and a regular file.
#[test]
fn the_kill_message_reaches_a_pipe_and_a_file() {
    if std::env::var_os(MESSAGE_CHILD_ENV).is_some() {
        let entry = KillerThread::new(ExitKiller).register("message-child");
        entry.arm(Clock.now() + Duration::from_millis(50));
        std::thread::sleep(CHILD_GIVE_UP_AFTER);
        std::process::exit(0);
    }
    let child = || {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "the_kill_message_reaches_a_pipe_and_a_file"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(MESSAGE_CHILD_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    };

    let piped = child().stderr(Stdio::piped()).output().unwrap();
    assert_eq!(
        piped.status.code(),
        Some(KILL_EXIT_CODE),
        "{}",
        piped.status
    );
    let text = String::from_utf8_lossy(&piped.stderr);
    assert!(
        text.contains(vvm_runtime::killer::KILL_MESSAGE),
        "pipe got {text:?}"
    );

    let path = std::env::temp_dir().join(format!(
        "vvm-kill-message-{}-{}",
        std::process::id(),
        Clock.now().as_nanos()
    ));
    let file = std::fs::File::create(&path).unwrap();
    let status = child().stderr(file).status().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(status.code(), Some(KILL_EXIT_CODE), "{status}");
    assert!(
        text.contains(vvm_runtime::killer::KILL_MESSAGE),
        "file got {text:?}"
    );
    assert!(vvm_runtime::killer::KILL_MESSAGE.contains(&format!("exit code {KILL_EXIT_CODE}")));
}

/// The child's side of [`a_blocked_log_writer_does_not_delay_the_kill`]; never returns.
fn blocked_child() -> ! {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};

    let stderr = std::io::stderr();
    // Fill the pipe without blocking, then make it blocking again: every later write waits.
    let flags = fcntl_getfl(&stderr).unwrap();
    fcntl_setfl(&stderr, flags | OFlags::NONBLOCK).unwrap();
    let chunk = [b'x'; 4096];
    while rustix::io::write(&stderr, &chunk).is_ok() {}
    fcntl_setfl(&stderr, flags).unwrap();

    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    // The runtime keeps logging: this thread blocks in a write, holding standard error's lock.
    std::thread::spawn(|| loop {
        tracing::error!("a renewal failed");
    });
    std::thread::sleep(Duration::from_millis(50));

    let killer = KillerThread::new(ExitKiller);
    let entry = killer.register("blocked-child");
    let deadline_ns = monotonic_ns() + CHILD_DEADLINE_AHEAD.as_nanos() as u64;
    entry.arm(Clock.now() + CHILD_DEADLINE_AHEAD);
    println!("deadline_ns={deadline_ns}");
    std::thread::sleep(CHILD_GIVE_UP_AFTER * 2);
    // Not killed: end with an exit code the parent does not expect.
    std::process::exit(0);
}

/// A killer whose kill of `a` waits at a gate: the thread is busy (as if not scheduled) while
/// other deadlines pass.
struct Gated {
    open: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    fired: Arc<std::sync::Mutex<Vec<String>>>,
}

impl vvm_runtime::killer::Killer for Gated {
    fn kill(&self, report: &vvm_runtime::killer::KillReport) {
        if &*report.label == "a" {
            let (open, opened) = &*self.open;
            let mut open = open.lock().unwrap();
            while !*open {
                open = opened.wait(open).unwrap();
            }
        }
        self.fired.lock().unwrap().push(report.label.to_string());
    }
}

/// A deadline that passed is final: a process stopped past it (here: a killer thread busy
/// elsewhere) that confirms a renewal before the thread looks again must still be ended — the
/// later deadline does not replace the passed one.
// covers: Rt.KillerPassedFinal
#[test]
fn a_deadline_that_passed_is_not_taken_back_by_a_later_arm() {
    let open = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let fired = Arc::new(std::sync::Mutex::new(Vec::new()));
    let thread = KillerThread::new(Gated {
        open: open.clone(),
        fired: fired.clone(),
    });
    let (a, b) = (thread.register("a"), thread.register("b"));
    let now = Clock.now();
    a.arm(now + Duration::from_millis(10));
    b.arm(now + Duration::from_millis(30));
    // The thread is held in a's kill; b's deadline passes meanwhile.
    std::thread::sleep(Duration::from_millis(100));
    // A renewal confirmed late would move b's deadline 10 s on.
    b.arm(Clock.now() + Duration::from_secs(10));
    *open.0.lock().unwrap() = true;
    open.1.notify_all();
    let start = std::time::Instant::now();
    while fired.lock().unwrap().len() < 2 && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        *fired.lock().unwrap(),
        ["a", "b"],
        "b's passed deadline was taken back"
    );
}
