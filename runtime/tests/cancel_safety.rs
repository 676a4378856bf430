//! Acquires, watches and withdrawals under cancellation and store trouble, on the memory store
//! behind a hook that fails or delays the calls a test names: a caller that gives up (a
//! `timeout`, a `select!`), a store call that fails or one whose outcome is unknown leaves
//! nothing held for nobody and misses no change.

use vvm_test_support as common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::{coordination, TestKiller};
use vvm_runtime::{AcquireOptions, CoordinationError, StoreError, WatchKind};

/// Gives the calls of one kind a fault until it is cleared.
#[derive(Clone, Default)]
struct Trouble(Arc<Mutex<Vec<(Call, Fault)>>>);

impl Trouble {
    fn set(&self, call: Call, fault: Fault) {
        let mut faults = self.0.lock().unwrap();
        faults.retain(|(c, _)| *c != call);
        faults.push((call, fault));
    }

    fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl Hook for Trouble {
    fn fault(&self, call: Call) -> Fault {
        let faults = self.0.lock().unwrap();
        faults
            .iter()
            .find(|(c, _)| *c == call)
            .map_or(Fault::None, |(_, fault)| *fault)
    }
}

type Store = Faulty<Trouble>;

/// How long a test waits for what must happen at once (a loaded machine included).
const PROMPT: Duration = Duration::from_secs(5);

/// A change made while the watch waited, whose read then failed, is answered by the next read.
// covers: Sem.Store.Watch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_answers_the_last_change_after_a_failed_read() {
    let store = Store::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    a.create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let mut watch = a.watch("config", WatchKind::DATA).expect("valid name");
    assert_eq!(watch.next().await.expect("the state now").data, b"v1");

    a.update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    store.hook.set(Call::Semaphore, Fault::Fail);
    let failed = watch.next().await;
    assert!(
        matches!(
            failed,
            Err(CoordinationError::Store(StoreError::Failed { .. }))
        ),
        "{failed:?}"
    );
    store.hook.clear();
    let next = tokio::time::timeout(PROMPT, watch.next()).await;
    let description = next
        .expect("the change made before the failed read is answered, not waited for again")
        .expect("read");
    assert_eq!(description.data, b"v2");
}

/// A change made while the watch waited, whose read was then abandoned by its caller, is
/// answered by the next read.
// covers: Sem.Store.Watch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_answers_the_last_change_after_an_abandoned_read() {
    let store = Store::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    a.create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let mut watch = a.watch("config", WatchKind::DATA).expect("valid name");
    assert_eq!(watch.next().await.expect("the state now").data, b"v1");

    a.update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    store
        .hook
        .set(Call::Semaphore, Fault::Delay(Duration::from_millis(400)));
    let abandoned = tokio::time::timeout(Duration::from_millis(100), watch.next()).await;
    assert!(abandoned.is_err(), "the read was slow: {abandoned:?}");
    store.hook.clear();
    let next = tokio::time::timeout(PROMPT, watch.next()).await;
    let description = next
        .expect("the change made before the abandoned read is answered, not waited for again")
        .expect("read");
    assert_eq!(description.data, b"v2");
}

/// Waits until `name` has neither owners nor waiters, as `by` describes it.
async fn until_free(by: &vvm_runtime::Coordination<Store>, name: &str, what: &str) {
    let give_up = tokio::time::Instant::now() + PROMPT;
    loop {
        let description = by.describe(name).await.expect("described");
        if description.owners.is_empty() && description.waiters.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what}: owners {:?}, waiters {:?}",
            description.owners,
            description.waiters
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An acquire whose caller gave up during its first store call (the store queued it; the
/// answer came too late) is withdrawn: the units released later are granted to nobody, and
/// another session gets them at once.
// covers: Sem.CancelAcquire
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_dropped_during_its_first_call_leaves_nothing_queued() {
    let store = Store::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    let b = coordination(&store, 2, &killer).await;
    let c = coordination(&store, 3, &killer).await;
    a.create("lock", 1, Vec::new()).await.expect("created");
    let held = b
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");

    store.hook.set(
        Call::Semaphore,
        Fault::LateAnswer(Duration::from_millis(400)),
    );
    let abandoned = tokio::time::timeout(
        Duration::from_millis(100),
        a.acquire("lock", AcquireOptions::new(1)),
    )
    .await;
    assert!(abandoned.is_err(), "the answer was late: {abandoned:?}");
    store.hook.clear();
    assert!(held.release().await.expect("released"));
    until_free(&c, "lock", "the abandoned request was granted to nobody").await;
    let granted = c
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(granted.is_some(), "the units are free for another session");
}

/// Waits until `by` sees the session `n` among the waiters of `name`.
async fn until_queued(by: &vvm_runtime::Coordination<Store>, name: &str, n: u64) {
    let give_up = tokio::time::Instant::now() + PROMPT;
    loop {
        let description = by.describe(name).await.expect("described");
        if description
            .waiters
            .iter()
            .any(|w| w.session.incarnation == vvm_core::Incarnation(n))
        {
            return;
        }
        assert!(tokio::time::Instant::now() < give_up, "never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A queued acquire dropped while the store fails: its withdrawal fails at first and is tried
/// again until it is done, so the units released later are not granted to nobody.
// covers: Sem.CancelWithdraw
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawal_during_a_store_blip_is_retried() {
    let store = Store::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    let b = coordination(&store, 2, &killer).await;
    let c = coordination(&store, 3, &killer).await;
    a.create("lock", 1, Vec::new()).await.expect("created");
    let held = b
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("lock", AcquireOptions::new(1)).await })
    };
    until_queued(&c, "lock", 1).await;

    // The blip: the abandoned request's withdrawal fails while it lasts.
    store.hook.set(Call::Semaphore, Fault::Fail);
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.hook.clear();

    assert!(held.release().await.expect("released"));
    until_free(
        &c,
        "lock",
        "the abandoned request holds the units for nobody",
    )
    .await;
    let granted = c
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(granted.is_some(), "the units are free for another session");
}

/// An `Elections::acquire` whose caller gave up while the store was busy wins nothing for
/// nobody: the slot the handle's task took afterwards is released, and another candidate gets it.
// covers: Rt.ElectionsAbandoned
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_elections_acquire_keeps_no_slot() {
    let store = Store::default();
    let killer = TestKiller::new();
    let lease = vvm_core::LeaseConfig::new(common::LEASE).expect("valid");
    let first =
        vvm_runtime::Elections::start(store.clone(), "10.0.0.1:7000", lease, &killer.thread)
            .expect("started");
    let second =
        vvm_runtime::Elections::start(store.clone(), "10.0.0.2:7000", lease, &killer.thread)
            .expect("started");

    store
        .hook
        .set(Call::Acquire, Fault::Delay(Duration::from_millis(400)));
    let abandoned =
        tokio::time::timeout(Duration::from_millis(150), first.acquire(vvm_core::Slot(1))).await;
    assert!(abandoned.is_err(), "the store was busy: {abandoned:?}");
    store.hook.clear();
    // The task's store call is applied after 400 ms; what it won is given back then.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let give_up = tokio::time::Instant::now() + PROMPT;
    loop {
        match second.acquire(vvm_core::Slot(1)).await {
            Ok(_) => break,
            Err(vvm_runtime::ElectionsError::Held(_)) => {}
            Err(error) => panic!("{error:?}"),
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the abandoned acquire keeps slot 1: {:?}",
            first.tenure(vvm_core::Slot(1))
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(first.tenure(vvm_core::Slot(1)), vvm_runtime::Tenure::Idle);
    second.cleanup().await;
    first.cleanup().await;
}

/// Two `Coordination` handles on one session are one party of the store: the second handle's
/// acquire of a name the first holds is refused, so the session never holds more than it was
/// granted and the first handle's grant stays what it believes it is.
// covers: Sem.OneView
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_on_one_session_share_one_view() {
    let store = Store::default();
    let killer = TestKiller::new();
    let session = common::open_session(&store, 1, &killer).await;
    let first = vvm_runtime::Coordination::new(session.clone());
    let second = vvm_runtime::Coordination::new(session);
    let other = coordination(&store, 2, &killer).await;
    first.create("pool", 3, Vec::new()).await.expect("created");
    let held = first
        .acquire("pool", AcquireOptions::new(3))
        .await
        .expect("runs")
        .expect("free");

    let again = second
        .acquire("pool", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await;
    assert!(
        matches!(again, Err(CoordinationError::AlreadyHeld(_))),
        "the session holds the name through the first handle: {again:?}"
    );
    let description = other.describe("pool").await.expect("described");
    assert_eq!(description.owners.len(), 1);
    assert_eq!(
        description.owners[0].count, 3,
        "the first handle's grant is what it believes"
    );
    let waiter = other
        .acquire("pool", AcquireOptions::new(2).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(waiter.is_none(), "3 of 3 units are held: {waiter:?}");
    assert!(held.release().await.expect("released"));
    // Given back by the first handle, the name is free for the second.
    let granted = second
        .acquire("pool", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(granted.is_some());
}

/// Applies the next semaphore transaction and reports its outcome as unknown, once.
#[derive(Clone, Default)]
struct LoseNextAnswer(Arc<Mutex<bool>>);

impl Hook for LoseNextAnswer {
    fn fault(&self, call: Call) -> Fault {
        let mut armed = self.0.lock().unwrap();
        match call {
            Call::Semaphore if *armed => {
                *armed = false;
                Fault::UnknownApplied
            }
            _ => Fault::None,
        }
    }
}

/// The acquire was granted in the store but its answer lost: the caller gets the unknown
/// outcome, and the grant it never saw is released, so another session gets the units at once
/// instead of when the first session ends.
// covers: Sem.RequestIds
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_of_unknown_outcome_is_withdrawn() {
    let store = Faulty::<LoseNextAnswer>::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    let b = coordination(&store, 2, &killer).await;
    a.create("lock", 1, Vec::new()).await.expect("created");

    *store.hook.0.lock().unwrap() = true;
    let unknown = a.acquire("lock", AcquireOptions::new(1)).await;
    assert!(
        matches!(
            unknown,
            Err(CoordinationError::Store(StoreError::Unknown { .. }))
        ),
        "{unknown:?}"
    );
    // The withdrawal runs in the background; the session stays open throughout.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let owners = a.describe("lock").await.expect("described").owners;
        if owners.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the grant nobody saw still holds the units: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let granted = b
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(granted.is_some(), "the units are free for another session");
    // The first session's claim on the name was given back: its next acquire runs (and finds
    // the units taken).
    let again = a
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await;
    assert!(matches!(again, Ok(None)), "{again:?}");
}

/// A queued acquire rides out looks that fail while its session lives, and is granted when the
/// units come; under failures that outlast its timeout it is answered at the timeout (with the
/// store's error) and its request is withdrawn.
// covers: Sem.Store.WaitOutage
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_rides_out_failing_looks() {
    // Two clients of one memory store: only the waiter's calls fail.
    let owner_store = Store::default();
    let waiter_store = Faulty {
        store: owner_store.store.clone(),
        hook: Trouble::default(),
    };
    let killer = TestKiller::new();
    let owner = coordination(&owner_store, 1, &killer).await;
    let waiter = coordination(&waiter_store, 2, &killer).await;
    owner.create("lock", 1, Vec::new()).await.expect("created");
    let held = owner
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");

    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire("lock", AcquireOptions::new(1)).await })
    };
    until_queued(&owner, "lock", 2).await;
    waiter_store.hook.set(Call::Semaphore, Fault::Fail);
    // Wakes the waiter, whose look fails.
    owner
        .update_data("lock", b"busy".to_vec())
        .await
        .expect("updated");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiting.is_finished(),
        "the queued acquire ended on a failed look: {:?}",
        waiting.await
    );
    waiter_store.hook.clear();
    assert!(held.release().await.expect("released"));
    let grant = tokio::time::timeout(PROMPT, waiting)
        .await
        .expect("granted once the owner released")
        .expect("no panic")
        .expect("the acquire rode out the failed looks")
        .expect("granted");
    let held = grant;

    // Failures that outlast the timeout: answered at the timeout, and nothing stays queued.
    let other = coordination(&waiter_store, 3, &killer).await;
    let timed = {
        let other = other.clone();
        tokio::spawn(async move {
            let options = AcquireOptions::new(1).timeout(Duration::from_millis(300));
            other.acquire("lock", options).await
        })
    };
    until_queued(&owner, "lock", 3).await;
    waiter_store.hook.set(Call::Semaphore, Fault::Fail);
    let answered = tokio::time::timeout(PROMPT, timed)
        .await
        .expect("answered at the timeout")
        .expect("no panic");
    assert!(
        matches!(answered, Err(CoordinationError::Store(_))),
        "{answered:?}"
    );
    waiter_store.hook.clear();
    let give_up = tokio::time::Instant::now() + PROMPT;
    while !owner
        .describe("lock")
        .await
        .expect("described")
        .waiters
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the request stayed queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(held.release().await.expect("released"));
}

/// Counts the semaphore transactions and gives the next ones the faults queued, in order.
#[derive(Clone, Default)]
struct Counted {
    calls: Arc<std::sync::atomic::AtomicUsize>,
    next: Arc<Mutex<std::collections::VecDeque<Fault>>>,
}

impl Counted {
    fn calls(&self) -> usize {
        self.calls.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn queue(&self, faults: &[Fault]) {
        self.next.lock().unwrap().extend(faults.iter().copied());
    }
}

impl Hook for Counted {
    fn fault(&self, call: Call) -> Fault {
        if call != Call::Semaphore {
            return Fault::None;
        }
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.next.lock().unwrap().pop_front().unwrap_or(Fault::None)
    }
}

/// Semaphores on a session whose store calls may hang well beyond [`PROMPT`] (a lease of
/// 400 s: a store-call timeout of 10 s).
async fn patient(
    store: &Faulty<Counted>,
    killer: &TestKiller,
) -> vvm_runtime::Coordination<Faulty<Counted>> {
    let lease = vvm_core::LeaseConfig::new(Duration::from_secs(400)).expect("valid");
    let value = vvm_runtime::LeaseValue::new("10.0.0.1:7000", vvm_core::Incarnation(1));
    let session = vvm_runtime::SessionHandle::open(store.clone(), lease, value, &killer.thread)
        .await
        .expect("the session opens");
    vvm_runtime::Coordination::new(session)
}

/// `n` watches of the data of `config` on `by`, each past its first snapshot (`v1`).
async fn watching(
    by: &vvm_runtime::Coordination<Faulty<Counted>>,
    n: usize,
) -> Vec<vvm_runtime::Watch<Faulty<Counted>>> {
    let mut watches = Vec::new();
    for _ in 0..n {
        let mut watch = by.watch("config", WatchKind::DATA).expect("valid name");
        assert_eq!(watch.next().await.expect("the state now").data, b"v1");
        watches.push(watch);
    }
    watches
}

/// Each watch's next answers, in tasks, until it answers `v2` or [`PROMPT`] passes: how many
/// errors it answered before.
fn until_v2(
    watches: Vec<vvm_runtime::Watch<Faulty<Counted>>>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    watches
        .into_iter()
        .map(|mut watch| {
            tokio::spawn(async move {
                let mut errors = 0;
                loop {
                    match tokio::time::timeout(PROMPT, watch.next()).await {
                        Ok(Ok(description)) if description.data == b"v2" => return errors,
                        Ok(Ok(description)) => panic!("answered {:?}", description.data),
                        Ok(Err(_)) => errors += 1,
                        Err(_) => panic!("the watch missed the last change"),
                    }
                }
            })
        })
        .collect()
}

/// How many watches of one name make one change cost in reads.
const WATCHES: usize = 20;

/// The watches of one name on one handle share one read per change: the store sees one
/// describe, not one per watch.
// covers: Sem.Store.WatchShared
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watches_of_a_name_share_one_read_per_change() {
    let store = Faulty::<Counted>::default();
    let killer = TestKiller::new();
    let a = patient(&store, &killer).await;
    a.create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let answers = until_v2(watching(&a, WATCHES).await);
    let before = store.hook.calls();
    a.update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    for answer in answers {
        assert_eq!(answer.await.expect("no panic"), 0, "no read failed");
    }
    // The update is one of the calls.
    let reads = store.hook.calls() - before - 1;
    assert_eq!(
        reads, 1,
        "{WATCHES} watches of one name made {reads} reads of one change"
    );
}

/// A shared read that fails is answered with its error to the watch that made it only; every
/// watch still answers the last change, and the others share the read made again.
// covers: Sem.Store.Watch, Sem.Store.WatchShared
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_shared_read_leaves_no_watch_behind_the_last_change() {
    let store = Faulty::<Counted>::default();
    let killer = TestKiller::new();
    let a = patient(&store, &killer).await;
    a.create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let answers = until_v2(watching(&a, 8).await);
    let before = store.hook.calls();
    // The update passes; the first read after it fails.
    store.hook.queue(&[Fault::None, Fault::Fail]);
    a.update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    let mut errors = 0;
    for answer in answers {
        errors += answer.await.expect("no panic");
    }
    assert_eq!(errors, 1, "only the read's maker answers its error");
    // The failed read, the one the others shared, and at most one fresh read of the watch
    // that answered the error.
    let reads = store.hook.calls() - before - 1;
    assert!(reads <= 3, "8 watches made {reads} reads of one change");
}

/// A watch dropped while its read, shared by the other watches, hangs: they read again and
/// answer the change, instead of waiting for a read nobody makes any more.
// covers: Sem.Store.Watch, Sem.Store.WatchShared
#[tokio::test(flavor = "current_thread")]
async fn a_watch_dropped_while_it_reads_for_the_others_does_not_stall_them() {
    let store = Faulty::<Counted>::default();
    let killer = TestKiller::new();
    let a = patient(&store, &killer).await;
    a.create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let mut watches = watching(&a, 9).await;
    let mut reader = watches.pop().expect("nine watches");
    let before = store.hook.calls();
    // The update passes; the reader's read hangs (beyond the test's patience, within the
    // store-call timeout).
    store
        .hook
        .queue(&[Fault::None, Fault::Delay(Duration::from_secs(60))]);
    a.update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    let reading = tokio::spawn(async move { reader.next().await });
    let give_up = tokio::time::Instant::now() + PROMPT;
    while store.hook.calls() < before + 2 {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the read did not start"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The others wake and wait for the read in flight.
    let answers = until_v2(watches);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!reading.is_finished(), "the read hangs");
    reading.abort();
    for answer in answers {
        assert_eq!(answer.await.expect("no panic"), 0, "no read failed");
    }
    // The abandoned read and the one the others shared.
    let reads = store.hook.calls() - before - 1;
    assert_eq!(reads, 2, "8 watches made {reads} reads of one change");
}
