//! `Vvm::subscribe`: a host watches its VVM's state — services running, token, deadline,
//! finished — as it changes, through a shutdown and through a loss.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use common::{config, foreign, pass, Journal, TestKiller, Worker};
use vvm_adapters::MemoryStore;
use vvm_core::{Phase, Slot};
use vvm_runtime::{observe::observe, observe::ObserveOptions};
use vvm_runtime::{
    Service, ServiceContext, ServiceError, Services, Vvm, VvmSnapshot, VvmSubscription,
};

const SLOT: Slot = Slot(1);
/// Only keeps a broken test from hanging; no assertion depends on it.
const HANG_GUARD: Duration = Duration::from_secs(600);

fn services(journal: &Journal) -> Services {
    Services::new()
        .with(Worker {
            name: "w",
            journal: journal.clone(),
        })
        .unwrap()
}

/// Every state until the subscription ends (the driver is gone).
async fn collect(mut states: VvmSubscription) -> Vec<VvmSnapshot> {
    let mut seen = Vec::new();
    while let Some(state) = states.changed().await {
        seen.push(state);
    }
    seen
}

// covers: Rt.Subscribe
#[tokio::test(start_paused = true)]
async fn a_subscriber_sees_services_running_then_stopped_then_finished() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(config("a", 1), store.clone(), services(&journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let states = vvm.subscribe();
    let now = states.current();
    assert!(now.services_running, "{now:?}");
    assert_eq!(now.phase, Phase::Running);
    assert_eq!(now.token, vvm.token());
    assert!(now.token.is_some() && now.kill_deadline.is_some());
    assert!(!now.lost && !now.finished && now.problem.is_none());

    let watcher = tokio::spawn(collect(states.clone()));
    pass(Duration::from_secs(30)).await;
    assert_eq!(vvm.shutdown().await, Ok(()));
    let seen = tokio::time::timeout(HANG_GUARD, watcher)
        .await
        .expect("the subscription ends with the driver")
        .unwrap();
    let last = seen.last().expect("states after the shutdown began");
    assert!(last.finished && !last.services_running, "{last:?}");
    let stopped = seen
        .iter()
        .position(|state| !state.services_running)
        .expect("the services were seen stopped");
    let finished = seen
        .iter()
        .position(|state| state.finished)
        .expect("the end was seen");
    assert!(
        stopped <= finished,
        "finished before the services stopped: {seen:#?}"
    );
    // The subscription made earlier still reads the last state.
    assert!(states.current().finished);
}

// covers: Rt.Subscribe
#[tokio::test(start_paused = true)]
async fn a_subscriber_sees_a_loss_and_the_token_withdrawn() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(config("a", 1), store.clone(), services(&journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let mut states = vvm.subscribe();
    // Someone else's record replaces ours: the next renewal is refused.
    store
        .set(SLOT, &foreign("z"), common::LEASE * 10)
        .expect("the record is replaced");
    let lost = tokio::time::timeout(HANG_GUARD, async {
        loop {
            let state = states.changed().await.expect("the VVM reports the loss");
            if state.lost {
                return state;
            }
        }
    })
    .await
    .expect("a loss within the guard");
    assert_eq!(lost.token, None, "no token after a loss: {lost:?}");
    assert!(lost.problem.is_some(), "{lost:?}");
    let _ = vvm.shutdown().await;
    assert!(!states.current().services_running);
}

// covers: Rt.SubscribeReleased
/// After a clean shutdown released the slot, a subscriber no longer sees this VVM's token —
/// not from the moment its services were asked to stop — while a successor already leads.
#[tokio::test(start_paused = true)]
async fn a_subscriber_sees_no_token_once_the_services_are_asked_to_stop() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(config("a", 1), store.clone(), services(&journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let states = vvm.subscribe();
    assert!(states.current().token.is_some());
    let watcher = tokio::spawn(collect(states.clone()));
    assert_eq!(vvm.shutdown().await, Ok(()));
    let seen = tokio::time::timeout(HANG_GUARD, watcher)
        .await
        .expect("the subscription ends with the driver")
        .unwrap();
    let stopping = seen
        .iter()
        .position(|state| state.phase != Phase::Running)
        .expect("the shutdown was seen");
    let stale: Vec<_> = seen[stopping..]
        .iter()
        .filter(|state| state.token.is_some())
        .collect();
    assert!(stale.is_empty(), "a token after the stop began: {stale:#?}");

    let successor = Vvm::provide(config("b", 1), store.clone(), services(&journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(successor.token().is_some(), "the successor leads");
    let now = states.current();
    assert_eq!(now.token, None, "the released VVM still claims: {now:?}");
    assert_eq!(successor.shutdown().await, Ok(()));
}

/// Ready at once; takes `linger` to stop once asked.
struct SlowToStop {
    linger: Duration,
    journal: Journal,
}

impl Service for SlowToStop {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("slow-to-stop")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        context.ready();
        context.shutdown().requested().await;
        self.journal.push("asked to stop".into());
        tokio::time::sleep(self.linger).await;
        self.journal.push("stopped".into());
        Ok(())
    }
}

// covers: Rt.StoppingMark
/// An observer in another process learns that the holder's services were asked to stop from
/// the store, at once (not at the next renewal, `L/4` later), while the holder still has the
/// slot; the release follows the services' stop.
#[tokio::test(start_paused = true)]
async fn observers_see_the_holder_stopping_from_the_request_to_stop_until_the_release() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let linger = Duration::from_secs(8);
    let services = Services::new()
        .with(SlowToStop {
            linger,
            journal: journal.clone(),
        })
        .unwrap();
    let vvm = Vvm::provide(config("a", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let mut observer =
        observe(Arc::new(store.clone()), &[SLOT], ObserveOptions::default()).unwrap();
    let first = observer.next().await.unwrap();
    let holder = first.holder.expect("a leads");
    assert!(!holder.value.stopping, "{holder:?}");

    // Between two renewals, so that only an immediate write can be seen at once.
    pass(Duration::from_secs(1)).await;
    let asked = tokio::time::Instant::now();
    let shutdown = tokio::spawn(vvm.shutdown());
    let change = tokio::time::timeout(HANG_GUARD, observer.next())
        .await
        .unwrap()
        .unwrap();
    let seen_after = asked.elapsed();
    let holder = change
        .holder
        .expect("the slot is still held while the services stop");
    assert!(holder.value.stopping, "not marked stopping: {holder:?}");
    assert_eq!(holder.value.address, "a");
    assert!(
        seen_after < Duration::from_millis(100),
        "the mark came {seen_after:?} after the request to stop"
    );
    assert_eq!(
        journal.entries(),
        ["asked to stop"],
        "the services still stop"
    );

    let change = tokio::time::timeout(HANG_GUARD, observer.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.holder, None, "released after the services stopped");
    assert!(asked.elapsed() >= linger);
    assert_eq!(journal.entries(), ["asked to stop", "stopped"]);
    assert_eq!(shutdown.await.unwrap(), Ok(()));
}

/// The next item of any change feed, through its `Stream` implementation alone.
async fn next_item<T: vvm_runtime::Stream + Unpin>(feed: &mut T) -> Option<T::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *feed).poll_next(cx)).await
}

// covers: Rt.Streams
/// Every change feed a user reads is a `Stream` with the same answers as its own `next`: a
/// VVM's subscription (which ends with the driver), an observer of slots and a semaphore's watch.
#[tokio::test(start_paused = true)]
async fn every_change_feed_is_a_stream() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(config("a", 1), store.clone(), services(&journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let token = vvm.token().expect("leads");

    let mut observer = observe(Arc::new(store.clone()), &[SLOT], ObserveOptions::default())
        .expect("valid options");
    let first = next_item(&mut observer).await.expect("never ends").unwrap();
    assert_eq!(first.holder.map(|holder| holder.token), Some(token));

    let coordination = common::coordination(&store, 2, &killer).await;
    coordination
        .create("config", 1, b"v1".to_vec())
        .await
        .unwrap();
    let mut watch = coordination
        .watch("config", vvm_runtime::WatchKind::DATA)
        .unwrap();
    let now = next_item(&mut watch).await.expect("never ends").unwrap();
    assert_eq!(now.data, b"v1");
    coordination
        .update_data("config", b"v2".to_vec())
        .await
        .unwrap();
    let changed = next_item(&mut watch).await.expect("never ends").unwrap();
    assert_eq!(changed.data, b"v2");

    let mut states = vvm.subscribe();
    let shutdown = tokio::spawn(vvm.shutdown());
    let mut last = None;
    while let Some(state) = tokio::time::timeout(HANG_GUARD, next_item(&mut states))
        .await
        .expect("the subscription ends with the driver")
    {
        last = Some(state);
    }
    assert!(last.expect("states after the shutdown began").finished);
    assert_eq!(shutdown.await.unwrap(), Ok(()));
}
