//! Sessions at run time, on the memory store and tokio's paused clock: one keepalive for any
//! number of holdings, holdings that end with the session, the close rules, and the one kill
//! deadline.

use vvm_test_support as common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::TestKiller;
use vvm_core::{Incarnation, LeaseConfig, LossReason, Slot};
use vvm_runtime::{
    clock::Clock, clock::TimeSource, LeaseStore, LeaseValue, SessionError, SessionHandle,
    SessionStatus, SessionStore,
};

const LEASE: Duration = Duration::from_secs(20);

fn value(n: u64) -> LeaseValue {
    LeaseValue {
        address: format!("10.0.0.{n}:7000"),
        incarnation: Incarnation(n),
        stopping: false,
    }
}

/// Counts keepalives, fails them while `failing` is set, and delays acquires.
#[derive(Clone, Default)]
struct Counting {
    keepalives: Arc<AtomicU64>,
    failing: Arc<AtomicBool>,
    /// How long each acquire waits before it is applied, in milliseconds.
    acquire_delay_ms: Arc<AtomicU64>,
}

impl Hook for Counting {
    fn fault(&self, call: Call) -> Fault {
        match call {
            Call::KeepAlive => {
                self.keepalives.fetch_add(1, Ordering::Relaxed);
                match self.failing.load(Ordering::Relaxed) {
                    true => Fault::Fail,
                    false => Fault::None,
                }
            }
            Call::Acquire => Fault::Delay(Duration::from_millis(
                self.acquire_delay_ms.load(Ordering::Relaxed),
            )),
            _ => Fault::None,
        }
    }
}

type Counted = Faulty<Counting>;

async fn open(store: &Counted, n: u64, killer: &TestKiller) -> SessionHandle<Counted> {
    SessionHandle::open(
        store.clone(),
        LeaseConfig::new(LEASE).expect("valid"),
        value(n),
        &killer.thread,
    )
    .await
    .expect("the session opens")
}

/// A thousand holdings, ten lease periods: one keepalive every `L/4` in all, every holding
/// still live, and one kill deadline `0.8·L` after the last keepalive's send.
// covers: Session.CostGrowth, Session.RuntimeOneTask
#[tokio::test(start_paused = true)]
async fn one_keepalive_every_quarter_lease_keeps_a_thousand_holdings() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = open(&store, 1, &killer).await;
    let mut holdings = Vec::new();
    for slot in 0..1_000 {
        holdings.push(
            session
                .acquire(Slot(slot))
                .await
                .expect("runs")
                .expect("free"),
        );
    }
    tokio::time::sleep(LEASE * 10).await;
    let keepalives = store.hook.keepalives.load(Ordering::Relaxed);
    assert!(
        (39..=41).contains(&keepalives),
        "{keepalives} keepalives in 10 L"
    );
    for slot in [0, 500, 999] {
        assert!(store.get(Slot(slot)).await.expect("read").is_some());
    }
    let armed = killer.thread.armed();
    assert_eq!(
        armed.len(),
        1,
        "one kill deadline for the session: {armed:?}"
    );
    let deadline = armed[0].1;
    assert!(deadline > Clock.now() && deadline <= Clock.now() + LEASE.mul_f64(0.8));
    assert!(killer.recorder.reports().is_empty());
    // What runs under the holdings reads the same deadline the killer holds.
    assert_eq!(session.kill_deadline(), Some(deadline));
    let mut deadlines = session.kill_deadlines();
    deadlines.mark_unchanged();
    tokio::time::sleep(LEASE / 4).await;
    assert!(deadlines.has_changed().expect("the session runs"));
    assert_eq!(*deadlines.borrow(), Some(killer.thread.armed()[0].1));
    assert!(deadlines.borrow().expect("armed") > deadline);
    for holding in holdings {
        holding.release().await.expect("released");
    }
    assert!(session.close().await.expect("closed"));
    assert_eq!(session.kill_deadline(), None, "a clean close removes it");
}

/// A session deleted underneath is lost at its next keepalive: every holding ends at once,
/// nothing new is acquired, and it closes (deleting nothing) once every holding is dropped.
// covers: Session.LossOfAllHoldings, Session.DetachAfterServices
#[tokio::test(start_paused = true)]
async fn a_session_deleted_underneath_loses_every_holding_and_closes_after_they_detach() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = open(&store, 1, &killer).await;
    let first = session.acquire(Slot(1)).await.expect("runs").expect("free");
    let second = session.acquire(Slot(2)).await.expect("runs").expect("free");
    let SessionStatus::Open { key, revision } = session.status() else {
        panic!("open: {:?}", session.status());
    };
    assert!(store
        .store
        .delete_session(key, revision)
        .await
        .expect("runs"));
    assert_eq!(store.get(Slot(1)).await.expect("read"), None);
    assert_eq!(session.lost().await, Some(LossReason::Overtaken));
    assert!(matches!(
        session.acquire(Slot(3)).await,
        Err(SessionError::AttachRefused(_))
    ));
    drop((first, second));
    assert!(
        !session.close().await.expect("closes"),
        "nothing left to delete"
    );
}

/// A close waits for the holdings: refused while one is attached, then it deletes the session
/// record (and with it any holding left to it) and disarms the kill deadline.
// covers: Session.Close
#[tokio::test(start_paused = true)]
async fn close_is_refused_while_a_holding_is_attached_then_deletes_the_session() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = open(&store, 1, &killer).await;
    let key = session.key();
    let released = session.acquire(Slot(1)).await.expect("runs").expect("free");
    let left = session.acquire(Slot(2)).await.expect("runs").expect("free");
    let other = open(&store, 2, &killer).await;
    assert!(
        matches!(other.acquire(Slot(1)).await, Ok(None)),
        "held by session 1"
    );
    assert!(matches!(
        session.close().await,
        Err(SessionError::HoldingsRemain { holdings: 2 })
    ));
    assert!(released.release().await.expect("runs"));
    drop(left);
    assert!(session.close().await.expect("closes"));
    assert_eq!(store.get_session(key).await.expect("read"), None);
    assert_eq!(store.get(Slot(2)).await.expect("read"), None);
    assert!(killer
        .thread
        .armed()
        .iter()
        .all(|(label, _)| !label.contains("10.0.0.1:")));
}

/// Keepalives that keep failing lose the session before its deadline, and a holding whose
/// services do not stop meets the killer at the deadline.
// covers: Session.KillDeadline
#[tokio::test(start_paused = true)]
async fn failing_keepalives_lose_the_session_and_the_killer_fires_at_its_deadline() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = open(&store, 1, &killer).await;
    let _held = session.acquire(Slot(1)).await.expect("runs").expect("free");
    store.hook.failing.store(true, Ordering::Relaxed);
    assert_eq!(session.lost().await, Some(LossReason::RenewalFailed));
    let deadline = killer.thread.armed()[0].1;
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "lost before the deadline"
    );
    tokio::time::sleep_until(Clock.to_tokio(deadline)).await;
    killer.catch_up();
    assert_eq!(killer.recorder.reports().len(), 1);
}

/// One slot per session at a time: a second acquire of a slot the session holds is refused
/// without a store call; every tenure gets a higher fencing token.
// covers: Session.Attach, Session.AttachBeforeAcquire, Session.TokenPerTenure
#[tokio::test(start_paused = true)]
async fn a_slot_is_held_once_per_session() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = open(&store, 1, &killer).await;
    let held = session.acquire(Slot(1)).await.expect("runs").expect("free");
    assert!(matches!(
        session.acquire(Slot(1)).await,
        Err(SessionError::AlreadyHeld { slot: 1 })
    ));
    let first = held.token();
    drop(held);
    // Dropped, not released: the record stays with the session until the next acquire of the
    // slot deletes it, so the next tenure's fencing token is higher.
    assert!(store.get(Slot(1)).await.expect("read").is_some());
    let again = session.acquire(Slot(1)).await.expect("runs").expect("ours");
    assert!(again.token() > first, "{} > {first}", again.token());
}

/// Many slots at once: each answered as a single acquire would be, at its index; a slot named
/// twice or held by the handle already refuses the whole call and claims nothing.
// covers: Session.AcquireMany
#[tokio::test(start_paused = true)]
async fn acquire_many_answers_each_slot_as_acquire_would_and_refuses_a_repeated_slot() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let mine = open(&store, 1, &killer).await;
    let other = open(&store, 2, &killer).await;
    let taken = other.acquire(Slot(2)).await.expect("runs").expect("free");
    let slots = [Slot(1), Slot(2), Slot(3)];
    let held = mine.acquire_many(&slots).await.expect("runs");
    assert_eq!(
        held.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, false, true]
    );
    for holding in held.iter().flatten() {
        let record = store
            .get(holding.slot())
            .await
            .expect("read")
            .expect("written");
        assert_eq!(record.revision, holding.token().revision);
    }
    assert!(matches!(
        mine.acquire_many(&[Slot(4), Slot(1)]).await,
        Err(SessionError::AlreadyHeld { slot: 1 })
    ));
    assert!(matches!(
        mine.acquire_many(&[Slot(5), Slot(5)]).await,
        Err(SessionError::AlreadyHeld { slot: 5 })
    ));
    // A refused call claimed nothing: slots 4 and 5 are free for the handle.
    let again = mine.acquire_many(&[Slot(4), Slot(5)]).await.expect("runs");
    assert!(again.iter().all(Option::is_some));
    drop(taken);
}

/// On SQLite, a batch is one transaction of at most `ACQUIRE_BATCH_MAX` slots: the store refuses
/// a larger call and writes nothing; the handle splits 2 500 slots into three.
// covers: Session.AcquireMany
#[tokio::test]
async fn acquire_many_on_sqlite_splits_into_transactions_of_at_most_the_batch_bound() {
    let dir = vvm_conformance::ScratchDir::new("acquire-many");
    let store = vvm_adapters::SqliteStore::open(dir.path().join("s.sqlite")).unwrap();
    let killer = TestKiller::new();
    let session = SessionHandle::open(
        store.clone(),
        LeaseConfig::new(Duration::from_secs(10)).expect("valid"),
        value(1),
        &killer.thread,
    )
    .await
    .expect("opens");
    let key = session.key();
    let too_many: Vec<Slot> = (0..=vvm_runtime::ACQUIRE_BATCH_MAX as u32)
        .map(Slot)
        .collect();
    assert!(store.acquire_batch(too_many, key).await.is_err());
    assert_eq!(store.get(Slot(0)).await.unwrap(), None, "nothing written");
    let slots: Vec<Slot> = (0..2_500).map(Slot).collect();
    let held = session.acquire_many(&slots).await.expect("runs");
    assert_eq!(held.iter().flatten().count(), 2_500);
    assert!(store.get(Slot(2_499)).await.unwrap().is_some());
}

/// An acquire in flight holds the session open: a close asked meanwhile is refused, and the
/// acquire then ends with a holding.
// covers: Session.AttachBeforeAcquire
#[tokio::test(start_paused = true)]
async fn an_acquire_in_flight_keeps_the_session_from_closing() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let session = Arc::new(open(&store, 1, &killer).await);
    store.hook.acquire_delay_ms.store(100, Ordering::Relaxed);
    let acquiring = tokio::spawn({
        let session = session.clone();
        async move {
            session
                .acquire(Slot(1))
                .await
                .map(|held| held.map(|h| h.token().revision))
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(matches!(
        session.close().await,
        Err(SessionError::HoldingsRemain { holdings: 1 })
    ));
    let revision = acquiring.await.expect("ran").expect("runs");
    assert!(revision.is_some(), "acquired while the close was refused");
}

/// Two sessions of one process, with the same value, have distinct keys: a create read back after
/// an unknown outcome can only be its own.
// covers: Session.FreshId
#[tokio::test(start_paused = true)]
async fn sessions_of_one_process_never_share_a_key() {
    let store = Counted::default();
    let killer = TestKiller::new();
    let first = open(&store, 1, &killer).await;
    let second = open(&store, 1, &killer).await;
    assert_ne!(first.key(), second.key());
    assert_eq!(first.key().incarnation, second.key().incarnation);
    first.close().await.expect("closes");
    let third = open(&store, 1, &killer).await;
    assert!(third.key() != first.key() && third.key() != second.key());
}
