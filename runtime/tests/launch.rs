//! A launch always ends: a stop asked while the VVM campaigns ends it at once (and no service
//! starts after it), and a service pipeline that vanishes before reporting makes it return with
//! a problem instead of waiting for a report that never comes.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{campaign_config, foreign, pass, Journal, TestKiller, Worker, LEASE};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use vvm_adapters::MemoryStore;
use vvm_core::{Phase, Slot};
use vvm_runtime::{
    clock::Clock, clock::TimeSource, Service, ServiceContext, ServiceError, Services, Vvm, VvmError,
};

const SLOT: Slot = Slot(1);
/// Only keeps a broken test from hanging; no assertion depends on it.
const HANG_GUARD: Duration = Duration::from_secs(600);

// covers: Rt.StopDuringLaunch
/// The slot is held elsewhere; the host asks to stop two seconds into the campaign: `launch`
/// returns at once, `shutdown` reports a clean end, and when the slot frees afterwards no
/// service starts and nothing of ours is written.
#[tokio::test(start_paused = true)]
async fn a_stop_during_the_campaign_ends_the_launch_at_once_and_starts_nothing() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    store.set(SLOT, &foreign("z"), LEASE * 10).unwrap();
    let services = Services::new()
        .with(Worker {
            name: "w",
            journal: journal.clone(),
        })
        .unwrap();
    let vvm = Vvm::provide(campaign_config("a"), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone());
    let stop = vvm.stop_handle();
    let launch = tokio::spawn(vvm.launch());
    pass(Duration::from_secs(2)).await;
    let asked = Clock.now();
    stop.stop();
    let vvm = tokio::time::timeout(HANG_GUARD, launch)
        .await
        .expect("launch returned after the stop")
        .unwrap();
    let took = Clock.now().saturating_since(asked);
    assert!(
        took < Duration::from_secs(1),
        "launch took {took:?} after the stop"
    );
    // The slot frees right away: nobody may start the service any more.
    assert!(store.delete(SLOT));
    pass(Duration::from_secs(3)).await;
    assert_eq!(vvm.shutdown().await, Ok(()));
    assert!(journal.entries().is_empty(), "{:?}", journal.entries());
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert!(killer.thread.armed().is_empty());
}

// covers: Rt.StopDuringLaunch
/// A stop asked while an insert is in flight waits for its answer: a won slot is released
/// before `shutdown` returns, and its services never start.
#[tokio::test(start_paused = true)]
async fn a_stop_while_the_insert_is_in_flight_releases_a_won_slot() {
    use vvm_adapters::memory::{Fault, Injection, Op};
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    store.inject(
        SLOT,
        Injection::new(Fault::Delay(Duration::from_millis(300)))
            .on(Op::Insert)
            .times(1),
    );
    let services = Services::new()
        .with(Worker {
            name: "w",
            journal: journal.clone(),
        })
        .unwrap();
    let vvm = Vvm::provide(campaign_config("a"), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone());
    let stop = vvm.stop_handle();
    let launch = tokio::spawn(vvm.launch());
    pass(Duration::from_millis(100)).await;
    stop.stop();
    let vvm = launch.await.unwrap();
    assert_eq!(vvm.shutdown().await, Ok(()));
    assert!(journal.entries().is_empty());
    assert_eq!(
        store.record(SLOT).unwrap(),
        None,
        "the won slot was released"
    );
}

/// Panics when an event with this message is logged: a log sink that breaks inside the task
/// that logs (as the fmt layer does on a broken stderr).
struct PanicOn(&'static str);

struct Message(Option<String>);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: Subscriber> Layer<S> for PanicOn {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut message = Message(None);
        event.record(&mut message);
        if message.0.as_deref() == Some(self.0) {
            panic!("the log sink broke");
        }
    }
}

/// Ready at once; says whether its future is still alive.
struct Alive(Arc<AtomicBool>);

impl Service for Alive {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("alive")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        self.0.store(true, Ordering::SeqCst);
        let _flag = Flag(self.0.clone());
        context.ready();
        std::future::pending().await
    }
}

// covers: VVM.ServicesVanished, Rt.PipelineVanished
/// The pipeline task panics right after its service reported ready (its log sink broke): the
/// launch returns with `ServicesVanished` instead of waiting forever, the service left behind is
/// aborted, and shutdown releases the slot but keeps the kill deadline (the stop was not clean).
#[tokio::test(start_paused = true)]
async fn a_pipeline_that_vanishes_during_start_ends_the_launch_with_a_problem() {
    let subscriber = tracing_subscriber::registry().with(PanicOn("service ready"));
    let _guard = tracing::subscriber::set_default(subscriber);
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let alive = Arc::new(AtomicBool::new(false));
    let services = Services::new().with(Alive(alive.clone())).unwrap();
    let launch = Vvm::provide(campaign_config("a"), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch();
    let vvm = tokio::time::timeout(HANG_GUARD, launch)
        .await
        .expect("launch returned although the pipeline vanished");
    assert_eq!(vvm.current_problem(), Some(VvmError::ServicesVanished));
    assert_ne!(vvm.phase(), Phase::StartingServices);
    pass(Duration::from_millis(10)).await;
    assert!(
        !alive.load(Ordering::SeqCst),
        "the service was left running"
    );
    assert_eq!(vvm.shutdown().await, Err(VvmError::ServicesVanished));
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "an unclean stop keeps the deadline"
    );
}

// covers: VVM.StandbyForever, Rt.StopDuringLaunch
/// A standby with an acquisition window of "forever" still campaigns after 30 days of a slot
/// held elsewhere, takes the slot when it frees, and is stoppable at any moment before that.
#[tokio::test(start_paused = true)]
async fn a_standby_forever_waits_a_month_and_still_stops_at_once() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let config = |address: &str| {
        vvm_core::VvmConfig::builder(address)
            .lease(LEASE)
            .acquire_forever()
            // Hourly rounds keep a month of paused time quick; the release is seen at once
            // through the store's change feed anyway.
            .round_interval(Duration::from_secs(3_600))
            .build()
            .unwrap()
    };
    let month = Duration::from_secs(30 * 86_400);
    // Held elsewhere for longer than the longest finite window (7 days).
    store.set(SLOT, &foreign("z"), month * 2).unwrap();

    let stopped = Vvm::provide(config("a"), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone());
    let stop = stopped.stop_handle();
    let stopped = tokio::spawn(stopped.launch());
    let taker = Vvm::provide(config("b"), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone());
    let taker = tokio::spawn(taker.launch());

    pass(month).await;
    assert!(!stopped.is_finished() && !taker.is_finished());
    let asked = Clock.now();
    stop.stop();
    let stopped = tokio::time::timeout(HANG_GUARD, stopped)
        .await
        .expect("launch returned after the stop")
        .unwrap();
    let took = Clock.now().saturating_since(asked);
    assert!(took < Duration::from_secs(1), "stopped after {took:?}");
    assert_eq!(stopped.current_problem(), None);
    assert_eq!(stopped.shutdown().await, Ok(()));

    // The other standby is still there when the slot frees, and takes it.
    assert!(store.delete(SLOT));
    let taker = tokio::time::timeout(HANG_GUARD, taker)
        .await
        .expect("the standby leads")
        .unwrap();
    assert_eq!(taker.phase(), Phase::Running);
    assert_eq!(taker.token().unwrap().slot, SLOT);
    assert_eq!(taker.shutdown().await, Ok(()));
}

/// Launches checked on a multi-threaded runtime: the race it guards against showed in about a
/// third of them, so two thousand make a miss all but impossible.
const LAUNCHES: usize = 2_000;

// covers: Rt.OneSnapshot
/// `launch` returns once the VVM runs, and then every reader agrees: the phase reads `Running`
/// at once, on a 2-worker runtime where the launching task may be woken on the other worker
/// while the driver is still publishing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_phase_reads_running_as_soon_as_launch_returns() {
    let killer = TestKiller::new();
    let mut early = Vec::new();
    for attempt in 0..LAUNCHES {
        let (store, journal) = (MemoryStore::new(), Journal::default());
        let services = Services::new()
            .with(Worker {
                name: "w",
                journal: journal.clone(),
            })
            .unwrap();
        let vvm = Vvm::provide(common::config("a", 1), store, services)
            .unwrap()
            .with_killer(killer.thread.clone())
            .launch()
            .await;
        let (phase, problem) = (vvm.phase(), vvm.current_problem());
        let snapshot = vvm.subscribe().current();
        if phase != Phase::Running || snapshot.phase != Phase::Running || problem.is_some() {
            early.push((attempt, phase, snapshot.phase, problem));
        }
        assert_eq!(vvm.shutdown().await, Ok(()));
    }
    assert!(
        early.is_empty(),
        "{} of {LAUNCHES} launches returned before the phase read Running, first: {:?}",
        early.len(),
        early.first()
    );
}
