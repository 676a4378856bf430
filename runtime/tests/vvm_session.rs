//! A VVM that holds its slot as a holding of a session (`Vvm::provide_on_session`,
//! `Vvm::provide_on_shared_session`): on the memory store with tokio's paused clock, and on an
//! SQLite file.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::{open_session, pass, IgnoresStop, Journal, TestKiller, Worker};
use vvm_adapters::{MemoryStore, SqliteStore};
use vvm_core::{FencingToken, Instant, LossReason, Slot, VvmConfig};
use vvm_runtime::{
    clock::Clock, clock::TimeSource, KillerThread, Launched, LeaseStore, RecordingKiller, Service,
    ServiceContext, ServiceError, Services, SessionHandle, SessionStore, Vvm, VvmError,
};

const LEASE: Duration = Duration::from_secs(20);

/// Journals the store calls that end a tenure, fails keepalives while `failing`.
#[derive(Clone, Default)]
struct Calls {
    journal: Journal,
    keepalives: Arc<AtomicU64>,
    failing: Arc<AtomicBool>,
}

impl Hook for Calls {
    fn fault(&self, call: Call) -> Fault {
        match call {
            Call::KeepAlive => {
                self.keepalives.fetch_add(1, Ordering::Relaxed);
                if self.failing.load(Ordering::Relaxed) {
                    return Fault::Fail;
                }
            }
            Call::Delete | Call::DeleteSession | Call::Acquire => {
                self.journal.push(format!("{call:?}"));
            }
            _ => {}
        }
        Fault::None
    }
}

type Store = Faulty<Calls>;

/// A token and a kill deadline, as a service read them.
type Look = (Option<FencingToken>, Option<Instant>);

/// What a service saw, look after look.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Look>>>);

/// Ready at once; records its token and kill deadline at start and on `look`, stops when asked.
struct Looks {
    seen: Seen,
    journal: Journal,
    look: Arc<tokio::sync::Notify>,
}

impl Service for Looks {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("looks")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let record = |context: &ServiceContext| {
            let seen = (context.token(), context.kill_deadline());
            self.seen.0.lock().unwrap().push(seen);
        };
        record(&context);
        context.ready();
        let mut shutdown = context.shutdown();
        loop {
            tokio::select! {
                () = shutdown.requested() => break,
                () = self.look.notified() => record(&context),
            }
        }
        self.journal.push("stop looks".into());
        Ok(())
    }
}

fn config(address: &str, slots: u32) -> VvmConfig {
    VvmConfig::builder(address)
        .slots(slots)
        .lease(LEASE)
        .build()
        .unwrap()
}

fn worker(name: &'static str, journal: &Journal) -> Services {
    Services::new()
        .with(Worker {
            name,
            journal: journal.clone(),
        })
        .unwrap()
}

/// Launch on its own session; the service sees the holding's revision as its token and the
/// session's kill deadline, also as keepalives move it; the shutdown stops the services, then
/// releases the holding, then closes the session, which removes the kill deadline.
// covers: Rt.VvmOnSession, Rt.SessionShutdownOrder
#[tokio::test(start_paused = true)]
async fn a_vvm_on_its_own_session_runs_then_shuts_down_in_order() {
    let store = Store::default();
    let killer = TestKiller::new();
    let (seen, look) = (Seen::default(), Arc::new(tokio::sync::Notify::new()));
    let services = Services::new()
        .with(Looks {
            seen: seen.clone(),
            journal: store.hook.journal.clone(),
            look: look.clone(),
        })
        .unwrap();
    let vvm = Vvm::provide_on_session(config("10.0.0.1:7000", 2), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let token = vvm.token().expect("running");
    let record = store
        .get(token.slot)
        .await
        .unwrap()
        .expect("the holding's record");
    assert_eq!(
        token.revision, record.revision,
        "the token is the holding's revision"
    );
    let armed = killer.thread.armed();
    assert_eq!(armed.len(), 1, "one deadline, the session's: {armed:?}");
    assert_eq!(seen.0.lock().unwrap()[0], (Some(token), Some(armed[0].1)));
    assert_eq!(vvm.kill_deadline(), Some(armed[0].1));

    // A keepalive moves the session's deadline; the service reads the new one.
    // Half-way between two keepalives, so that none lands between the look and the check.
    pass(LEASE / 2 + LEASE / 8).await;
    look.notify_one();
    pass(Duration::from_millis(1)).await;
    let later = killer.thread.armed()[0].1;
    assert!(later > armed[0].1);
    assert_eq!(seen.0.lock().unwrap()[1], (Some(token), Some(later)));
    assert!(store.hook.keepalives.load(Ordering::Relaxed) >= 1);

    vvm.shutdown().await.expect("clean");
    assert_eq!(
        store.hook.journal.entries(),
        ["Acquire", "stop looks", "Delete", "DeleteSession"],
        "services stopped, holding released, session closed"
    );
    assert_eq!(store.get(token.slot).await.unwrap(), None);
    assert!(
        killer.thread.armed().is_empty(),
        "the session's close disarmed"
    );
    killer.catch_up();
    assert!(killer.recorder.reports().is_empty());
}

/// Fails the first `creates` session creates; counts them all.
#[derive(Clone, Default)]
struct FailingCreates {
    creates: Arc<AtomicU64>,
    failing: u64,
}

impl Hook for FailingCreates {
    fn fault(&self, call: Call) -> Fault {
        if call == Call::CreateSession
            && self.creates.fetch_add(1, Ordering::Relaxed) < self.failing
        {
            return Fault::Fail;
        }
        Fault::None
    }
}

fn failing_creates(failing: u64) -> Faulty<FailingCreates> {
    Faulty {
        store: MemoryStore::default(),
        hook: FailingCreates {
            failing,
            ..FailingCreates::default()
        },
    }
}

/// A store blip while the VVM opens its session is ridden out within the acquisition window,
/// as a candidate's on a per-slot lease; past the window the VVM says the session was not
/// opened.
// covers: Rt.VvmOnSession
#[tokio::test(start_paused = true)]
async fn a_vvm_on_a_session_rides_out_failed_creates_within_its_acquisition_window() {
    let store = failing_creates(3);
    let killer = TestKiller::new();
    let journal = Journal::default();
    let vvm = Vvm::provide_on_session(
        config("10.0.0.1:7000", 1),
        store.clone(),
        worker("w", &journal),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    assert!(
        vvm.token().is_some(),
        "leading after three failed creates: {:?}",
        vvm.current_problem()
    );
    assert_eq!(store.hook.creates.load(Ordering::Relaxed), 4);
    vvm.shutdown().await.expect("clean");

    // Failing for ever: the window (acquisition 5 s) ends the tries.
    let store = failing_creates(u64::MAX);
    let config = VvmConfig::builder("10.0.0.2:7000")
        .slots(1)
        .lease(LEASE)
        .acquisition(Duration::from_secs(5))
        .build()
        .unwrap();
    let began = tokio::time::Instant::now();
    let vvm = Vvm::provide_on_session(config, store.clone(), worker("w", &journal))
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(matches!(
        vvm.current_problem(),
        Some(VvmError::SessionNotOpened { .. })
    ));
    let waited = began.elapsed();
    assert!(
        // Tried again (pauses of 1 s to 5 s at L = 20 s), and never past the window.
        waited <= Duration::from_secs(5) && store.hook.creates.load(Ordering::Relaxed) >= 2,
        "tried {} times in {waited:?}",
        store.hook.creates.load(Ordering::Relaxed)
    );
    assert!(vvm.shutdown().await.is_err());
}

/// Keepalives failing lose the session: the services stop at once, the VVM reports the loss,
/// and the session's kill deadline stays armed (nothing vouches for the services).
// covers: Rt.SessionLossStops
#[tokio::test(start_paused = true)]
async fn a_lost_session_stops_the_services_and_leaves_the_killer_armed() {
    let store = Store::default();
    let killer = TestKiller::new();
    let journal = Journal::default();
    let vvm = Vvm::provide_on_session(
        config("10.0.0.1:7000", 1),
        store.clone(),
        worker("w", &journal),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    assert!(vvm.token().is_some());
    store.hook.failing.store(true, Ordering::Relaxed);
    let problem = vvm.problem().await;
    assert!(
        matches!(
            problem,
            VvmError::LeadershipLost {
                slot: Slot(1),
                reason: LossReason::RenewalFailed
            }
        ),
        "{problem:?}"
    );
    assert!(vvm.is_lost());
    assert_eq!(vvm.token(), None);
    let armed = killer.thread.armed();
    assert_eq!(armed.len(), 1, "the deadline stays armed after a loss");
    assert!(vvm.shutdown().await.is_err());
    assert_eq!(journal.entries(), ["start w", "stop w"]);
    assert_eq!(killer.thread.armed(), armed, "not extended, not removed");
    tokio::time::sleep_until(Clock.to_tokio(armed[0].1)).await;
    killer.catch_up();
    assert_eq!(killer.recorder.reports().len(), 1, "the killer fires at it");
}

/// Services that do not stop in time are aborted: the stop is not clean, so the session is
/// given up — no keepalive any more, its deadline neither extended nor removed, and the killer
/// ends the process at it.
// covers: Rt.SessionUncleanStop
#[tokio::test(start_paused = true)]
async fn a_stop_that_was_not_clean_abandons_the_session_with_its_deadline_armed() {
    let store = Store::default();
    let killer = TestKiller::new();
    let services = Services::new().with(IgnoresStop).unwrap();
    let vvm = Vvm::provide_on_session(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .with_service_timeouts(Duration::from_secs(1), Duration::from_secs(1))
        .launch()
        .await;
    let token = vvm.token().expect("running");
    let stopped = vvm.shutdown().await;
    assert!(
        matches!(stopped, Err(VvmError::ServiceFailed { index: 0, .. })),
        "{stopped:?}"
    );
    let armed = killer.thread.armed();
    assert_eq!(armed.len(), 1, "the deadline stays armed: {armed:?}");
    assert!(
        !store
            .hook
            .journal
            .entries()
            .contains(&"DeleteSession".to_string()),
        "not closed cleanly"
    );
    assert_eq!(
        store.get(token.slot).await.unwrap(),
        None,
        "the holding is released"
    );
    let keepalives = store.hook.keepalives.load(Ordering::Relaxed);
    pass(LEASE / 2).await;
    assert_eq!(
        store.hook.keepalives.load(Ordering::Relaxed),
        keepalives,
        "no keepalive after the abandon"
    );
    assert_eq!(killer.thread.armed(), armed, "not extended");
    tokio::time::sleep_until(Clock.to_tokio(armed[0].1)).await;
    killer.catch_up();
    assert_eq!(killer.recorder.reports().len(), 1);
}

/// `first` (10.0.0.1) launched on a session of its own on `store`, and the configuration of a
/// second VVM (10.0.0.2) that waits for the slot as long as it lives.
async fn first_leads<S>(
    store: &S,
    killer: &TestKiller,
    journal: &Journal,
) -> (Vvm<Launched>, vvm_core::VvmConfigBuilder)
where
    S: SessionStore + Clone + Send + Sync + 'static,
{
    let first = Vvm::provide_on_session(
        config("10.0.0.1:7000", 1),
        store.clone(),
        worker("first", journal),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    let second = VvmConfig::builder("10.0.0.2:7000")
        .slots(1)
        .lease(LEASE)
        .acquire_forever();
    (first, second)
}

/// Two VVMs on sessions of their own compete for one slot: the second waits and takes it
/// after the first shut down, with a higher fencing token.
// covers: Rt.VvmOnSession
#[tokio::test(start_paused = true)]
async fn two_vvms_on_sessions_hand_the_slot_over_after_a_shutdown() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let journal = Journal::default();
    let (first, second) = first_leads(&store, &killer, &journal).await;
    let first_token = first.token().expect("first leads");
    let second = Vvm::provide_on_session(second, store.clone(), worker("second", &journal))
        .unwrap()
        .with_killer(killer.thread.clone());
    let second = tokio::spawn(second.launch());
    pass(LEASE).await;
    assert_eq!(journal.entries(), ["start first"], "the second waits");
    first.shutdown().await.expect("clean");
    let second = second.await.unwrap();
    let second_token = second.token().expect("second leads");
    assert!(second_token.revision > first_token.revision);
    assert_eq!(
        journal.entries(),
        ["start first", "stop first", "start second"]
    );
    second.shutdown().await.expect("clean");
    assert!(killer.thread.armed().is_empty());
}

/// A candidate on its own session whose keepalives fail for longer than its lease (a store
/// outage only it sees) loses that session while it waits: it opens a fresh one and goes on
/// waiting — it neither gives up its acquisition nor is ended by the lost session's deadline,
/// under which nothing acted — and takes the slot once the holder leaves.
// covers: Rt.OwnSessionReopens, VVM.OwnSessionReopens, Session.NothingActingNoDeadline
#[tokio::test(start_paused = true)]
async fn a_waiting_vvm_rides_out_the_loss_of_its_session() {
    let store = Store::default();
    let killer = TestKiller::new();
    let journal = Journal::default();
    let (first, second) = first_leads(&store, &killer, &journal).await;
    let first_token = first.token().expect("first leads");
    // The same store, seen by the candidate through a hook of its own.
    let candidate = Faulty {
        store: store.store.clone(),
        hook: Calls::default(),
    };
    let second = Vvm::provide_on_session(second, candidate.clone(), worker("second", &journal))
        .unwrap()
        .with_killer(killer.thread.clone());
    let second = tokio::spawn(second.launch());
    pass(Duration::from_secs(1)).await;
    candidate.hook.failing.store(true, Ordering::Relaxed);
    // Three leases of failed keepalives: the candidate's sessions are lost again and again.
    pass(LEASE * 3).await;
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "a lost session under which nothing acted ended the process"
    );
    assert!(
        !second.is_finished(),
        "the candidate gave up its acquisition"
    );
    assert!(candidate.hook.keepalives.load(Ordering::Relaxed) > 3);
    candidate.hook.failing.store(false, Ordering::Relaxed);
    pass(LEASE).await;
    first.shutdown().await.expect("clean");
    let second = second.await.unwrap();
    let second_token = second
        .token()
        .expect("the candidate leads after the holder left");
    assert!(second_token.revision > first_token.revision);
    assert_eq!(
        journal.entries(),
        ["start first", "stop first", "start second"]
    );
    second.shutdown().await.expect("clean");
    killer.catch_up();
    assert!(killer.recorder.reports().is_empty());
    assert!(killer.thread.armed().is_empty());
}

/// VVMs `a` (10.0.0.1) and `b` (10.0.0.2) launched on `session`, each with a worker journaling
/// to `journal`.
async fn launch_a_and_b(session: &SessionHandle<Store>, journal: &Journal) -> Vec<Vvm<Launched>> {
    let mut vvms = Vec::new();
    for (address, name) in [("10.0.0.1:7000", "a"), ("10.0.0.2:7000", "b")] {
        let vvm = Vvm::provide_on_shared_session(
            config(address, 2),
            session.clone(),
            worker(name, journal),
        )
        .unwrap()
        .launch()
        .await;
        vvms.push(vvm);
    }
    vvms
}

/// Two VVMs share one session: one keepalive for both; a loss of the session stops both.
// covers: Rt.SharedSession
#[tokio::test(start_paused = true)]
async fn a_shared_session_lost_stops_every_vvm_on_it() {
    let store = Store::default();
    let killer = TestKiller::new();
    let session = open_session(&store, 9, &killer).await;
    let journal = Journal::default();
    let vvms = launch_a_and_b(&session, &journal).await;
    let slots: Vec<Slot> = vvms
        .iter()
        .map(|v| v.token().expect("leads").slot)
        .collect();
    assert_eq!(
        slots,
        [Slot(1), Slot(2)],
        "one slot each on the one session"
    );
    let before = store.hook.keepalives.load(Ordering::Relaxed);
    pass(LEASE).await;
    let keepalives = store.hook.keepalives.load(Ordering::Relaxed) - before;
    assert!(
        (3..=5).contains(&keepalives),
        "{keepalives} keepalives in L for both"
    );
    store.hook.failing.store(true, Ordering::Relaxed);
    for vvm in &vvms {
        let problem = vvm.problem().await;
        assert!(
            matches!(problem, VvmError::LeadershipLost { .. }),
            "{problem:?}"
        );
    }
    for vvm in vvms {
        assert!(vvm.shutdown().await.is_err());
    }
    let mut entries = journal.entries();
    entries.sort();
    assert_eq!(entries, ["start a", "start b", "stop a", "stop b"]);
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "the session's deadline stays"
    );
}

/// Two VVMs share one session; one shuts down cleanly: its services stop and its holding is
/// released, while the session stays open with the other VVM leading on it and keepalives going
/// on. Only the owner of the session closes it, once nothing is attached.
// covers: Rt.SharedSession, Rt.SessionShutdownOrder
#[tokio::test(start_paused = true)]
async fn one_vvm_of_a_shared_session_shuts_down_and_the_session_stays() {
    let store = Store::default();
    let killer = TestKiller::new();
    let session = open_session(&store, 9, &killer).await;
    let journal = store.hook.journal.clone();
    let mut vvms = launch_a_and_b(&session, &journal).await;
    let b = vvms.pop().expect("two");
    let a = vvms.pop().expect("two");
    let (slot_a, slot_b) = (
        a.token().expect("leads").slot,
        b.token().expect("leads").slot,
    );

    a.shutdown().await.expect("clean");
    let mut entries = journal.entries();
    entries.retain(|e| e != "Acquire");
    entries.retain(|e| !e.starts_with("start"));
    assert_eq!(
        entries,
        ["stop a", "Delete"],
        "a's services stopped, then its holding released; the session not closed"
    );
    assert_eq!(store.get(slot_a).await.unwrap(), None, "a's slot is free");
    assert!(
        store.get(slot_b).await.unwrap().is_some(),
        "b still holds its slot"
    );
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "the session's deadline stays armed"
    );

    // The session lives on for b: keepalives go on, b's services keep running.
    let before = store.hook.keepalives.load(Ordering::Relaxed);
    pass(LEASE).await;
    let keepalives = store.hook.keepalives.load(Ordering::Relaxed) - before;
    assert!(
        (3..=5).contains(&keepalives),
        "{keepalives} keepalives in L"
    );
    assert_eq!(b.token().map(|t| t.slot), Some(slot_b), "b still leads");

    b.shutdown().await.expect("clean");
    assert!(
        session.close().await.expect("closes"),
        "closed by its owner"
    );
    let mut entries = journal.entries();
    entries.retain(|e| e != "Acquire" && !e.starts_with("start"));
    assert_eq!(
        entries,
        ["stop a", "Delete", "stop b", "Delete", "DeleteSession"]
    );
    assert!(killer.thread.armed().is_empty(), "the close disarmed");
    killer.catch_up();
    assert!(killer.recorder.reports().is_empty());
}

/// On an SQLite file: launch on its own session, the token is the holding's revision, and a
/// clean shutdown releases the holding, deletes the session and disarms.
// covers: Rt.VvmOnSession, Rt.SessionShutdownOrder
#[tokio::test]
async fn a_vvm_on_a_session_on_sqlite_runs_and_cleans_up() {
    let dir = std::env::temp_dir().join(format!(
        "vvm-session-vvm-{}-{}",
        std::process::id(),
        Clock.now().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let store = SqliteStore::open(dir.join("leases.sqlite")).unwrap();
    let recorder = RecordingKiller::new();
    let killer = KillerThread::new(recorder.clone());
    let journal = Journal::default();
    let config = VvmConfig::builder("10.0.0.1:7000")
        .slots(2)
        .lease(Duration::from_secs(4))
        .build()
        .unwrap();
    let vvm = Vvm::provide_on_session(config, store.clone(), worker("w", &journal))
        .unwrap()
        .with_killer(killer.clone())
        .launch()
        .await;
    let token = vvm.token().expect("running");
    let record = store.get(token.slot).await.unwrap().expect("the holding");
    assert_eq!(record.revision, token.revision);
    assert_eq!(killer.armed().len(), 1);
    assert_eq!(vvm.kill_deadline(), Some(killer.armed()[0].1));
    vvm.shutdown().await.expect("clean");
    assert_eq!(journal.entries(), ["start w", "stop w"]);
    assert_eq!(store.get(token.slot).await.unwrap(), None);
    assert!(killer.armed().is_empty());
    assert!(recorder.reports().is_empty());
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    // The store was a session store all along.
    fn is_session_store<S: SessionStore>() {}
    is_session_store::<SqliteStore>();
}

/// On an SQLite file: the holding's row deleted from outside (a `DELETE`, "unsticking" a lock
/// by hand) while the session lives is a loss at once — the session's keepalives touch the
/// session's row only, so without the watch of its own record the VVM would run on until the
/// session ended. L = 12 s: a loss within 2 s is the watch's, not the session's.
// covers: VVM.VanishedStops, Holding.Vanished
#[tokio::test]
async fn a_holding_deleted_from_the_sqlite_file_is_a_loss_at_once() {
    let dir = std::env::temp_dir().join(format!(
        "vvm-session-vanished-{}-{}",
        std::process::id(),
        Clock.now().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("leases.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    let recorder = RecordingKiller::new();
    let killer = KillerThread::new(recorder.clone());
    let journal = Journal::default();
    let config = VvmConfig::builder("10.0.0.1:7000")
        .slots(1)
        .lease(Duration::from_secs(12))
        .build()
        .unwrap();
    let vvm = Vvm::provide_on_session(config, store.clone(), worker("w", &journal))
        .unwrap()
        .with_killer(killer.clone())
        .launch()
        .await;
    assert!(vvm.token().is_some(), "running");
    let database = rusqlite::Connection::open(&path).unwrap();
    database.busy_timeout(Duration::from_secs(5)).unwrap();
    let deleted = std::time::Instant::now();
    assert_eq!(database.execute("DELETE FROM vvm_leases", []).unwrap(), 1);
    let problem = tokio::time::timeout(Duration::from_secs(2), vvm.problem())
        .await
        .unwrap_or_else(|_| panic!("still leading {:?} after the delete", deleted.elapsed()));
    assert!(
        matches!(
            problem,
            VvmError::LeadershipLost {
                reason: LossReason::Overtaken,
                ..
            }
        ),
        "{problem:?}"
    );
    assert!(vvm.shutdown().await.is_err());
    assert_eq!(journal.entries(), ["start w", "stop w"]);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Set in the child process of [`a_killed_vvm_on_a_session_lets_the_waiting_one_lead_at_once_on_sqlite`]:
/// the path of the store.
const VVM_CHILD_ENV: &str = "VVM_TEST_VVM_SESSION_CHILD";

/// The lease of both VVMs: the session of the killed one would end at 0.75–1·L.
const KILLED_LEASE: Duration = Duration::from_secs(8);

fn one_slot(address: &str) -> VvmConfig {
    VvmConfig::builder(address)
        .slots(1)
        .lease(KILLED_LEASE)
        .build()
        .unwrap()
}

/// The child: a VVM on its own session leads slot 1, says so, and runs until it is killed.
fn vvm_child(path: &str) -> ! {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(path).unwrap();
        let killer = KillerThread::new(RecordingKiller::new());
        let journal = Journal::default();
        let vvm = Vvm::provide_on_session(one_slot("10.0.0.1:7000"), store, worker("w", &journal))
            .unwrap()
            .with_killer(killer)
            .launch()
            .await;
        assert!(vvm.token().is_some(), "the child leads");
        println!("vvm-child leading");
        std::future::pending::<()>().await;
    });
    unreachable!("the child runs until it is killed")
}

/// Real processes: a VVM on a session in a child process leads the one slot (L = 8 s); a VVM
/// on a session of this process waits for it. SIGKILL of the child frees its session's lock:
/// the waiting VVM's feed, blocked on that lock, wakes it, and its acquire ends the dead
/// session and takes the slot — well before the session's expiry (the bound, L/4, is for a
/// loaded machine; it takes milliseconds).
// covers: Sq.SessionLock, Rt.VvmOnSession
#[test]
fn a_killed_vvm_on_a_session_lets_the_waiting_one_lead_at_once_on_sqlite() {
    use std::io::BufRead;
    if let Some(path) = std::env::var_os(VVM_CHILD_ENV) {
        vvm_child(&path.to_string_lossy());
    }
    let dir = std::env::temp_dir().join(format!(
        "vvm-session-kill-{}-{}",
        std::process::id(),
        Clock.now().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("leases.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_vvm_on_a_session_lets_the_waiting_one_lead_at_once_on_sqlite",
        ])
        .args(["--nocapture", "--test-threads", "1"])
        .env(VVM_CHILD_ENV, &path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let leading = lines.any(|line| line.is_ok_and(|line| line.contains("vvm-child leading")));
    assert!(leading, "the child leads");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let recorder = RecordingKiller::new();
        let killer = KillerThread::new(recorder.clone());
        let journal = Journal::default();
        let launched = tokio::spawn(
            Vvm::provide_on_session(
                one_slot("10.0.0.2:7000"),
                store.clone(),
                worker("w", &journal),
            )
            .unwrap()
            .with_killer(killer.clone())
            .launch(),
        );
        // Waiting: the child's holding refuses it.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!launched.is_finished(), "led beside a live holder");

        child.kill().unwrap();
        child.wait().unwrap();
        let killed = std::time::Instant::now();
        let vvm = tokio::time::timeout(KILLED_LEASE * 2, launched)
            .await
            .expect("leads in the end")
            .unwrap();
        let waited = killed.elapsed();
        eprintln!("SIGKILL of the VVM on a session -> the other leads after {waited:?}");
        assert!(vvm.token().is_some(), "leads");
        assert!(
            waited < KILLED_LEASE / 4,
            "led {waited:?} after the SIGKILL (L = {KILLED_LEASE:?})"
        );
        vvm.shutdown().await.expect("clean");
        assert!(recorder.reports().is_empty());
    });
    let _ = std::fs::remove_dir_all(&dir);
}
