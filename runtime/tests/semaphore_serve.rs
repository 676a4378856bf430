//! Services under a semaphore's grant (`SemaphoreGrant::serve`), on the memory store: they see
//! the grant's token and the session's kill deadline, stop before the grant is released, stop at
//! once when the grant ends underneath, and leave the grant held after a stop that was not clean.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestKiller;
use vvm_adapters::MemoryStore;
use vvm_runtime::{
    AcquireOptions, Coordination, ServeError, ServeTimeouts, Service, ServiceContext, ServiceError,
    Services,
};

/// What the service saw, for the test to judge.
#[derive(Clone, Default)]
struct Seen {
    token: Arc<Mutex<Option<vvm_core::FencingToken>>>,
    deadline_matches: Arc<Mutex<bool>>,
    /// Owners of the semaphore when the service was asked to stop: still ours, since the
    /// release follows the stop.
    owners_at_stop: Arc<Mutex<Option<usize>>>,
    lost: Arc<Mutex<bool>>,
    /// The sessions owning the semaphore when the service returned, after lingering.
    owners_at_end: Arc<Mutex<Option<Vec<vvm_core::SessionKey>>>>,
}

struct Worker<S> {
    seen: Seen,
    coordination: Coordination<S>,
    /// Ignore the stop: an unclean stop.
    stubborn: bool,
    /// How long it takes to stop once asked (and the semaphore's owners were read).
    linger: Duration,
}

impl Service for Worker<MemoryStore> {
    fn name(&self) -> Cow<'static, str> {
        "worker".into()
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        *self.seen.token.lock().unwrap() = context.token();
        *self.seen.deadline_matches.lock().unwrap() =
            context.kill_deadline() == self.coordination.session().kill_deadline();
        context.ready();
        let mut lost = context.lost();
        let mut shutdown = context.shutdown();
        tokio::select! {
            () = shutdown.requested() => {}
            () = lost.occurred() => {
                *self.seen.lost.lock().unwrap() = true;
                shutdown.requested().await;
            }
        }
        let owners = self
            .coordination
            .describe("work")
            .await
            .map(|d| d.owners.len())
            .ok();
        *self.seen.owners_at_stop.lock().unwrap() = owners;
        if self.stubborn {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(self.linger).await;
        let owners = self
            .coordination
            .describe("work")
            .await
            .map(|d| d.owners.iter().map(|owner| owner.session).collect())
            .ok();
        *self.seen.owners_at_end.lock().unwrap() = owners;
        Ok(())
    }
}

fn worker(coordination: &Coordination<MemoryStore>, seen: &Seen, stubborn: bool) -> Services {
    lingering_worker(coordination, seen, stubborn, Duration::ZERO)
}

/// [`worker`] that takes `linger` to stop once asked.
fn lingering_worker(
    coordination: &Coordination<MemoryStore>,
    seen: &Seen,
    stubborn: bool,
    linger: Duration,
) -> Services {
    Services::new()
        .with(Worker {
            seen: seen.clone(),
            coordination: coordination.clone(),
            stubborn,
            linger,
        })
        .expect("one service")
}

/// The services see the grant's generation and the session's deadline, and are stopped while
/// the grant is still held; it is released after.
// covers: Sem.ServeOrder, Lease.TokenForm
#[tokio::test(start_paused = true)]
async fn services_run_under_the_grant_and_stop_before_its_release() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let coordination = common::coordination(&store, 1, &killer).await;
    coordination.create("work", 2, Vec::new()).await.unwrap();
    let grant = coordination
        .acquire("work", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("fits");
    let token = grant.token();
    assert_eq!(
        token.to_string(),
        "0:1",
        "the first grant: slot 0, generation 1"
    );
    let seen = Seen::default();
    let stop = tokio::time::sleep(Duration::from_secs(30));
    grant
        .serve(
            worker(&coordination, &seen, false),
            ServeTimeouts::default(),
            stop,
        )
        .await
        .expect("a clean stop and release");
    assert_eq!(*seen.token.lock().unwrap(), Some(token));
    assert!(*seen.deadline_matches.lock().unwrap());
    assert_eq!(
        *seen.owners_at_stop.lock().unwrap(),
        Some(1),
        "held while stopping"
    );
    assert!(coordination
        .describe("work")
        .await
        .unwrap()
        .owners
        .is_empty());
    assert!(!*seen.lost.lock().unwrap());
}

/// A forced delete ends the grant underneath: the services see the loss and stop at once, and
/// serve reports it; the grant's release after the stop takes the semaphore being deleted away.
// covers: Sem.ServeLoss, Sem.ForcedDelete
#[tokio::test(start_paused = true)]
async fn a_grant_ended_underneath_stops_the_services() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let coordination = common::coordination(&store, 1, &killer).await;
    let other = common::coordination(&store, 2, &killer).await;
    coordination.create("work", 1, Vec::new()).await.unwrap();
    let grant = coordination
        .acquire("work", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("fits");
    let seen = Seen::default();
    let services = worker(&coordination, &seen, false);
    let serving = tokio::spawn(async move {
        grant
            .serve(services, ServeTimeouts::default(), std::future::pending())
            .await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    other.delete("work", true).await.expect("forced");
    let outcome = tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("stops at once")
        .expect("no panic");
    assert!(
        matches!(outcome, Err(ServeError::GrantEnded(_))),
        "{outcome:?}"
    );
    assert!(*seen.lost.lock().unwrap(), "the services saw the loss");
    let gone = other.describe("work").await;
    assert!(
        matches!(gone, Err(vvm_runtime::CoordinationError::NotFound(_))),
        "released after the stop, so deleted: {gone:?}"
    );
}

/// A service that does not stop within its timeout leaves the grant held: its units stay taken
/// until the session ends.
// covers: Sem.ServeUnclean
#[tokio::test(start_paused = true)]
async fn an_unclean_stop_leaves_the_grant_held() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let coordination = common::coordination(&store, 1, &killer).await;
    coordination.create("work", 1, Vec::new()).await.unwrap();
    let grant = coordination
        .acquire("work", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("fits");
    let seen = Seen::default();
    let timeouts = ServeTimeouts {
        start: Duration::from_secs(5),
        stop: Duration::from_secs(1),
    };
    let outcome = grant
        .serve(
            worker(&coordination, &seen, true),
            timeouts,
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await;
    assert!(
        matches!(outcome, Err(ServeError::UncleanStop)),
        "{outcome:?}"
    );
    assert_eq!(
        coordination.describe("work").await.unwrap().owners.len(),
        1,
        "still held"
    );
    // Abandoned: lost, no keepalive moves the deadline any more, and the killer fires at it.
    let deadline = coordination.session().kill_deadline().expect("still armed");
    assert_eq!(
        coordination.session().lost().await,
        Some(vvm_core::LossReason::Abandoned)
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        coordination.session().kill_deadline(),
        Some(deadline),
        "not moved"
    );
    killer.catch_up();
    assert_eq!(
        killer.recorder.reports().len(),
        1,
        "the killer fired at the deadline"
    );
}

/// Dropping `serve` (its caller's `select!` or timeout) does not release the grant beside a
/// service that is still stopping: the service is asked to stop, and the units go back only
/// once it returned; no waiter is granted them before.
// covers: Sem.ServeOrder
#[tokio::test(start_paused = true)]
async fn a_dropped_serve_releases_the_grant_only_after_its_services_stopped() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let coordination = common::coordination(&store, 1, &killer).await;
    let other = common::coordination(&store, 2, &killer).await;
    coordination.create("work", 1, Vec::new()).await.unwrap();
    let grant = coordination
        .acquire("work", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("fits");
    let seen = Seen::default();
    let services = lingering_worker(&coordination, &seen, false, Duration::from_secs(1));
    let serve = grant.serve(services, ServeTimeouts::default(), std::future::pending());
    let gave_up = tokio::time::timeout(Duration::from_millis(100), serve).await;
    assert!(gave_up.is_err(), "still serving when dropped");
    let waiter = other
        .acquire(
            "work",
            AcquireOptions::new(1).timeout(Duration::from_secs(10)),
        )
        .await
        .unwrap()
        .expect("granted once the units are back");
    assert_eq!(
        *seen.owners_at_end.lock().unwrap(),
        Some(vec![coordination.session().key()]),
        "the units were still ours alone when the service returned"
    );
    drop(waiter);
}
