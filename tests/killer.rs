//! The killer as a VVM uses it: it fires at the deadline the VVM armed, from its own OS thread
//! even when no tokio worker can run, and only confirmed renewals move that deadline later; and
//! the killer thread on its own, on a manual clock.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, pass, TestKiller, LEASE};
use vvm::killer::DEADLINES_MAX;
use vvm::{
    Clock, Instant, KillerThread, LeaseConfig, RecordingKiller, Services, Slot, TimeSource, Vvm,
    VvmConfig, VvmError,
};
use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;

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

// covers: Rt.KillerNeverDisarmed
#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_leaves_the_last_deadline_armed() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let deadline = vvm.kill_deadline().unwrap();
    assert_eq!(vvm.shutdown().await, Ok(()));
    assert_eq!(store.record(SLOT).unwrap(), None);

    assert_eq!(killer.thread.armed().len(), 1, "shutdown did not disarm");
    killer.time.set(deadline);
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

    // Renewals whose outcome stays unknown (nothing committed) are never confirmed: three
    // attempts, then the loss, and the deadline has not moved.
    let unknown = Injection::new(Fault::UnknownNotCommitted).on(Op::CompareAndSwap);
    store.inject(SLOT, unknown);
    pass(lease().renew_interval() + lease().retry_interval() * 3).await;
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 4);
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
        .lease(vvm::vvm_core::LEASE_MIN)
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

#[test]
fn overflowing_entries_share_the_earliest_deadline() {
    let recorder = RecordingKiller::new();
    let (thread, time) = KillerThread::manual(recorder.clone());
    let entries: Vec<_> = (0..=DEADLINES_MAX).map(|_| thread.register("x")).collect();
    for entry in &entries[..DEADLINES_MAX] {
        entry.arm(Instant::from_nanos(1_000));
    }
    let extra = &entries[DEADLINES_MAX];
    extra.arm(Instant::from_nanos(50));
    extra.arm(Instant::from_nanos(500));
    assert_eq!(extra.deadline(), Some(Instant::from_nanos(50)));
    time.set(Instant::from_nanos(50));
    assert_eq!(recorder.reports().len(), 1);
}
