//! Acting means services running. Each test runs real VVMs (driver, pipeline, killer thread on a
//! manual clock) against the memory store under paused time, records when each service really
//! starts and stops — and when the killer would have ended its process — and checks what a user
//! sees: never two services of one slot at once, a short store hiccup costing nothing, a host
//! that stepped down cleanly free to live on.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{campaign_config, pass, TestKiller, LEASE};
use tokio::task::JoinHandle;
use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;
use vvm_core::{Instant, LossReason, Slot};
use vvm_runtime::{
    clock::Clock, clock::TimeSource, Launched, Provided, Service, ServiceContext, ServiceError,
    Services, Vvm, VvmError,
};

const SLOT: Slot = Slot(1);
const STEP: Duration = Duration::from_millis(100);

/// One service's life: who ran it, when it started and when it stopped (if it did).
#[derive(Clone, Debug)]
struct Life {
    address: &'static str,
    started: Instant,
    stopped: Option<Instant>,
}

/// Every service life of a test, shared by the services.
#[derive(Clone, Default)]
struct Lives(Arc<Mutex<Vec<Life>>>);

impl Lives {
    fn all(&self) -> Vec<Life> {
        self.0.lock().unwrap().clone()
    }

    fn of(&self, address: &str) -> Vec<Life> {
        self.all()
            .into_iter()
            .filter(|l| l.address == address)
            .collect()
    }
}

/// Ready at once; records its life; stops when asked. It also remembers what its context said
/// about the token once leadership was lost.
struct Recorded {
    address: &'static str,
    lives: Lives,
    token_after_loss: Arc<Mutex<Option<Option<vvm_core::FencingToken>>>>,
}

impl Recorded {
    fn new(address: &'static str, lives: &Lives) -> Self {
        Recorded {
            address,
            lives: lives.clone(),
            token_after_loss: Arc::default(),
        }
    }
}

impl Service for Recorded {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("recorded")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let index = {
            let mut lives = self.lives.0.lock().unwrap();
            lives.push(Life {
                address: self.address,
                started: Clock.now(),
                stopped: None,
            });
            lives.len() - 1
        };
        context.ready();
        let mut shutdown = context.shutdown();
        let mut lost = context.lost();
        tokio::select! {
            () = shutdown.requested() => {}
            () = lost.occurred() => {
                *self.token_after_loss.lock().unwrap() = Some(context.token());
                shutdown.requested().await;
            }
        }
        self.lives.0.lock().unwrap()[index].stopped = Some(Clock.now());
        Ok(())
    }
}

/// A VVM of `address` on `store` and `killer`, running one [`Recorded`] service.
fn provided(
    address: &'static str,
    lives: &Lives,
    store: &MemoryStore,
    killer: &TestKiller,
) -> Vvm<Provided> {
    let services = Services::new().with(Recorded::new(address, lives)).unwrap();
    Vvm::provide(campaign_config(address), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
}

/// Runs time forward in small steps, moving the killer's clock along; returns when `until`
/// holds or after `limit`.
async fn run_until(killer: &TestKiller, limit: Duration, until: impl Fn() -> bool) {
    let end = Clock.now() + limit;
    while !until() && Clock.now() < end {
        pass(STEP).await;
        killer.catch_up();
    }
}

/// When each address's process would have been ended by its killer.
fn kills(killer: &TestKiller, address: &str) -> Option<Instant> {
    killer
        .recorder
        .reports()
        .iter()
        .filter(|r| &*r.label == address)
        .map(|r| r.observed)
        .min()
}

/// A life ends when its service stopped or its process was killed, whichever came first.
fn end_of(life: &Life, killed: Option<Instant>) -> Option<Instant> {
    match (life.stopped, killed) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// No two lives overlap (a life still open counts as running to the end of the test).
fn assert_one_acting(lives: &[Life], killer: &TestKiller) {
    for (i, a) in lives.iter().enumerate() {
        for b in &lives[i + 1..] {
            if a.address == b.address {
                continue;
            }
            let a_end = end_of(a, kills(killer, a.address));
            let b_end = end_of(b, kills(killer, b.address));
            let a_before_b = a_end.is_some_and(|end| end <= b.started);
            let b_before_a = b_end.is_some_and(|end| end <= a.started);
            assert!(
                a_before_b || b_before_a,
                "two services of slot 1 ran at once: {a:?} (ended {a_end:?}) and {b:?} (ended {b_end:?})"
            );
        }
    }
}

/// `a` leads slot 1 with a recorded service; `b` campaigns for it on its own task (its launch
/// returns only once it leads). Both share one killer.
async fn holder_and_contender(
    store: &MemoryStore,
    killer: &TestKiller,
    lives: &Lives,
) -> (Vvm<Launched>, JoinHandle<Vvm<Launched>>) {
    let a = provided("a", lives, store, killer).launch().await;
    assert!(a.token().is_some(), "a leads");
    let b = provided("b", lives, store, killer);
    (a, tokio::spawn(b.launch()))
}

// covers: Verify.Scenarios, VVM.LossKeepsRecord, LeadershipMonitor
/// Renewals fail at 5, 6, 8 and 12 s (every compare-and-swap of slot 1 fails). The holder gives
/// up renewing, stops its service and leaves the record to expire at 20 s; the contender starts
/// its service only after that. (With a delete on the loss path the record was gone at 7 s and
/// the contender ran beside the holder's service until the holder's deadline at 16 s.)
#[tokio::test(start_paused = true)]
async fn failed_renewals_never_free_the_slot_while_the_holders_service_runs() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    store.inject(SLOT, Injection::new(Fault::Fail).on(Op::CompareAndSwap));
    let (a, b) = holder_and_contender(&store, &killer, &lives).await;
    run_until(&killer, Duration::from_secs(30), || a.is_lost()).await;
    // The store answers again (for the contender's renewals).
    store.clear_fault(SLOT);
    run_until(&killer, Duration::from_secs(40), || false).await;
    let b = b.await.unwrap();
    assert_one_acting(&lives.all(), &killer);
    let a_life = &lives.of("a")[0];
    let b_life = &lives.of("b")[0];
    assert!(
        a_life.stopped.is_some_and(|s| s < b_life.started),
        "{a_life:?} / {b_life:?}"
    );
    assert!(
        b_life.started.saturating_since(a_life.started) >= LEASE,
        "the contender started before the holder's record could expire: {a_life:?} / {b_life:?}"
    );
    assert!(matches!(
        a.current_problem(),
        Some(VvmError::LeadershipLost {
            reason: LossReason::RenewalFailed,
            ..
        })
    ));
    assert!(a.token().is_none(), "no token after a loss");
    assert!(a.shutdown().await.is_err());
    assert_eq!(b.shutdown().await, Ok(()));
}

// covers: Verify.Scenarios, VVM.LossKeepsRecord
/// Every renewal commits but its answer is lost (the read-back finds it ours): the holder keeps
/// the record alive while it retries, gives up, stops its service, and the contender starts
/// only after the last committed renewal expired.
#[tokio::test(start_paused = true)]
async fn renewals_that_commit_with_lost_answers_never_free_the_slot_early() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    store.inject(
        SLOT,
        Injection::new(Fault::UnknownCommitted).on(Op::CompareAndSwap),
    );
    let (a, b) = holder_and_contender(&store, &killer, &lives).await;
    run_until(&killer, Duration::from_secs(30), || a.is_lost()).await;
    // The store answers again (for the contender's renewals).
    store.clear_fault(SLOT);
    run_until(&killer, Duration::from_secs(40), || false).await;
    let b = b.await.unwrap();
    assert_one_acting(&lives.all(), &killer);
    let (a_life, b_life) = (&lives.of("a")[0], &lives.of("b")[0]);
    assert!(a_life.stopped.is_some_and(|s| s < b_life.started));
    assert!(kills(&killer, "a").is_none_or(|k| k <= b_life.started));
    assert!(a.shutdown().await.is_err());
    assert_eq!(b.shutdown().await, Ok(()));
}

// covers: Verify.Scenarios, Lease.RetryUntilDeadline
/// Three renewal attempts fail (as when the store's own leader is replaced), then the store
/// answers again: the holder keeps its slot, its service never stops, its token moves on, and
/// the contender never runs.
#[tokio::test(start_paused = true)]
async fn a_store_hiccup_shorter_than_the_margin_costs_nothing() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    let a = provided("a", &lives, &store, &killer).launch().await;
    let first = a.token().unwrap();
    store.inject(
        SLOT,
        Injection::new(Fault::Fail).on(Op::CompareAndSwap).times(3),
    );
    let b = provided("b", &lives, &store, &killer);
    let b = tokio::spawn(b.launch());
    run_until(&killer, Duration::from_secs(40), || false).await;
    assert_eq!(a.current_problem(), None);
    assert!(
        a.token().unwrap().revision > first.revision,
        "renewed after the hiccup"
    );
    assert_eq!(lives.of("a")[0].stopped, None, "the service never stopped");
    assert!(lives.of("b").is_empty(), "the contender never ran");
    assert!(kills(&killer, "a").is_none());
    assert_eq!(a.shutdown().await, Ok(()));
    // b never leads: its launch ends with the acquisition window.
    run_until(&killer, Duration::from_secs(120), || b.is_finished()).await;
    let _ = b.await.unwrap().shutdown().await;
}

// covers: Rt.StoreTimeout
/// A renewal that fails, then two calls that hang (its retry and the read-back of that retry's
/// unknown outcome): each hanging call is given up at its own timeout, never waited for longer,
/// and the next retry renews. The holder keeps its slot and its service never stops.
#[tokio::test(start_paused = true)]
async fn hanging_store_calls_time_out_and_the_next_retry_keeps_the_slot() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    let lease = vvm_core::LeaseConfig::new(common::LEASE).unwrap();
    let a = provided("a", &lives, &store, &killer).launch().await;
    let first = a.token().unwrap();
    store.inject(
        SLOT,
        Injection::new(Fault::Fail).on(Op::CompareAndSwap).times(1),
    );
    pass(lease.renew_interval() + STEP).await;
    store.inject(SLOT, Injection::new(Fault::Hang).times(2));
    pass(lease.retry_interval() + lease.store_timeout() * 2 + STEP).await;
    pass(lease.retry_backoff(2) + STEP).await;
    killer.catch_up();
    assert!(
        a.token().unwrap().revision > first.revision,
        "renewed by the retry after the timeouts"
    );
    assert_eq!(
        store.calls(SLOT, Op::CompareAndSwap),
        3,
        "fail, hang, success"
    );
    assert_eq!(a.current_problem(), None);
    assert_eq!(lives.of("a")[0].stopped, None, "the service never stopped");
    assert!(kills(&killer, "a").is_none());
    assert_eq!(a.shutdown().await, Ok(()));
}

// covers: Verify.Scenarios, VVM.DisarmAfterCleanRelease, Rt.KillerDisarm
/// A host that shut its VVM down cleanly (service stopped by itself, record deleted) lives on
/// past the old deadline, and launches a new VVM in the same process, which leads again.
#[tokio::test(start_paused = true)]
async fn a_host_that_stepped_down_cleanly_lives_on_and_may_launch_again() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    let a = provided("a", &lives, &store, &killer).launch().await;
    let deadline = a.kill_deadline().unwrap();
    assert_eq!(a.shutdown().await, Ok(()));
    assert!(killer.thread.armed().is_empty(), "the deadline was removed");
    run_until(
        &killer,
        deadline.saturating_since(Clock.now()) + LEASE,
        || false,
    )
    .await;
    assert!(
        killer.recorder.reports().is_empty(),
        "killed after stepping down"
    );

    let again = provided("a", &lives, &store, &killer).launch().await;
    assert!(again.token().is_some(), "leads again");
    assert_eq!(killer.thread.armed().len(), 1, "with a deadline of its own");
    assert_eq!(again.shutdown().await, Ok(()));
}

// covers: Rt.LossSignal, Rt.NoTokenAfterLoss
/// A loss reaches the services before their stop: the loss signal resolves, and from then on
/// neither the service context nor the handle hands out a token.
#[tokio::test(start_paused = true)]
async fn services_learn_of_a_loss_at_once_and_get_no_token_after_it() {
    let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
    let service = Recorded::new("a", &lives);
    let token_after_loss = service.token_after_loss.clone();
    let a = Vvm::provide(
        campaign_config("a"),
        store.clone(),
        Services::new().with(service).unwrap(),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    // Someone else takes the record: the next renewal (5 s) is rejected.
    store.overwrite(SLOT, &common::foreign("z")).unwrap();
    let problem = a.problem();
    run_until(&killer, Duration::from_secs(10), || a.is_lost()).await;
    assert!(a.is_lost());
    assert!(matches!(
        problem.await,
        VvmError::LeadershipLost {
            reason: LossReason::Overtaken,
            ..
        }
    ));
    assert_eq!(a.token(), None);
    pass(STEP).await;
    assert_eq!(
        *token_after_loss.lock().unwrap(),
        Some(None),
        "the service saw the loss"
    );
    assert!(lives.of("a")[0].stopped.is_some(), "and was stopped");
    assert!(a.shutdown().await.is_err());
}

// covers: Rt.NoTokenAfterLoss
/// Past the kill deadline no token is handed out, even before any loss was noticed (every
/// renewal hangs).
#[tokio::test(start_paused = true)]
async fn no_token_past_the_kill_deadline() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let a = Vvm::provide(campaign_config("a"), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    store.inject(SLOT, Injection::new(Fault::Hang));
    let deadline = a.kill_deadline().unwrap();
    pass(deadline.saturating_since(Clock.now()) - STEP).await;
    assert!(a.token().is_some());
    pass(STEP).await;
    assert_eq!(a.token(), None);
    store.clear_fault(SLOT);
    let _ = a.shutdown().await;
}

// covers: VVM.VanishedStops, Holding.Vanished
/// The same for a VVM on a session: a holding's record removed from outside while its session
/// lives (deleted, or rewritten as someone else's) is a loss at once — the session itself would
/// never report it, its keepalives touch the session's record only.
#[tokio::test(start_paused = true)]
async fn a_holding_removed_from_outside_is_a_loss_at_once_while_its_session_lives() {
    for rewritten in [false, true] {
        let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
        let a = Vvm::provide_on_session(
            campaign_config("a"),
            store.clone(),
            Services::new().with(Recorded::new("a", &lives)).unwrap(),
        )
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
        pass(STEP).await;
        assert!(a.token().is_some(), "a holds its slot");
        let problem = a.problem();
        if rewritten {
            store.overwrite(SLOT, &common::foreign("z")).unwrap();
        } else {
            assert!(store.delete(SLOT));
        }
        let removed = Clock.now();
        run_until(&killer, LEASE, || a.is_lost()).await;
        let after = Clock.now().saturating_since(removed);
        assert!(after < LEASE / 40, "lost {after:?} after the removal");
        assert!(matches!(
            problem.await,
            VvmError::LeadershipLost {
                reason: LossReason::Overtaken,
                ..
            }
        ));
        run_until(&killer, LEASE, || {
            lives
                .of("a")
                .first()
                .is_some_and(|life| life.stopped.is_some())
        })
        .await;
        assert!(
            lives.of("a")[0].stopped.is_some(),
            "the service was stopped"
        );
        assert!(a.shutdown().await.is_err());
    }
}

// covers: VVM.VanishedStops
/// A record removed from outside (deleted, or rewritten as someone else's) while the services
/// run is a loss at once: the driver's watch of its own record (the store's feed, then one read)
/// finds it gone, long before the next renewal would have been refused — no renewal is sent.
#[tokio::test(start_paused = true)]
async fn a_record_removed_from_outside_is_a_loss_before_the_next_renewal() {
    for rewritten in [false, true] {
        let (store, killer, lives) = (MemoryStore::new(), TestKiller::new(), Lives::default());
        let a = Vvm::provide(
            campaign_config("a"),
            store.clone(),
            Services::new().with(Recorded::new("a", &lives)).unwrap(),
        )
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
        pass(STEP).await;
        let problem = a.problem();
        if rewritten {
            store.overwrite(SLOT, &common::foreign("z")).unwrap();
        } else {
            assert!(store.delete(SLOT));
        }
        let removed = Clock.now();
        run_until(&killer, LEASE, || a.is_lost()).await;
        let after = Clock.now().saturating_since(removed);
        assert!(after < LEASE / 40, "lost {after:?} after the removal");
        assert_eq!(
            store.calls(SLOT, Op::CompareAndSwap),
            0,
            "a renewal was needed"
        );
        assert!(matches!(
            problem.await,
            VvmError::LeadershipLost {
                reason: LossReason::Overtaken,
                ..
            }
        ));
        run_until(&killer, LEASE, || {
            lives
                .of("a")
                .first()
                .is_some_and(|life| life.stopped.is_some())
        })
        .await;
        assert!(
            lives.of("a")[0].stopped.is_some(),
            "the service was stopped"
        );
        assert!(a.shutdown().await.is_err());
    }
}
