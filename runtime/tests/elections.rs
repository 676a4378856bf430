//! The elections suite: slots acquired, held, lost and released through [`Elections`], all on
//! one session, against the memory store (through a counting wrapper where calls are counted),
//! on tokio's paused clock. The lease is 20 s: keepalives every 5 s, store calls time out after
//! 0.5 s, kill deadline 16 s after a confirmed keepalive.

use vvm_test_support as common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::{foreign, pass, TestKiller, LEASE};
use vvm_adapters::MemoryStore;
use vvm_core::{LeaseConfig, LossReason, Slot};
use vvm_runtime::{
    Elections, ElectionsError, LeaseStore, SessionStore, Tenure, ELECTIONS_SLOTS_MAX,
};

const EPSILON: Duration = Duration::from_millis(1);

fn lease() -> LeaseConfig {
    LeaseConfig::new(LEASE).unwrap()
}

/// Counts every call by kind; fails keepalives while `failing` is set.
#[derive(Clone, Default)]
struct Counting {
    calls: Arc<[AtomicU64; 9]>,
    failing: Arc<AtomicBool>,
}

const CALLS: [Call; 9] = [
    Call::Insert,
    Call::Swap,
    Call::Delete,
    Call::Get,
    Call::CreateSession,
    Call::KeepAlive,
    Call::DeleteSession,
    Call::GetSession,
    Call::Acquire,
];

impl Counting {
    fn index(call: Call) -> usize {
        CALLS
            .iter()
            .position(|c| *c == call)
            .expect("every call is listed")
    }

    fn calls(&self, call: Call) -> u64 {
        self.calls[Self::index(call)].load(Ordering::SeqCst)
    }

    /// Every call so far, by kind.
    fn snapshot(&self) -> Vec<(Call, u64)> {
        CALLS.iter().map(|&call| (call, self.calls(call))).collect()
    }
}

impl Hook for Counting {
    fn fault(&self, call: Call) -> Fault {
        self.calls[Self::index(call)].fetch_add(1, Ordering::SeqCst);
        if call == Call::KeepAlive && self.failing.load(Ordering::SeqCst) {
            return Fault::Fail;
        }
        Fault::None
    }
}

type Counted = Faulty<Counting>;

fn start<S: SessionStore + Clone>(store: &S, address: &str, killer: &TestKiller) -> Elections {
    Elections::start(store.clone(), address, lease(), &killer.thread).unwrap()
}

/// The calls made between two snapshots, by kind, leaving out kinds with none.
fn made(before: &[(Call, u64)], after: &[(Call, u64)]) -> Vec<(Call, u64)> {
    before
        .iter()
        .zip(after)
        .map(|(&(call, was), &(_, is))| (call, is - was))
        .filter(|&(_, count)| count > 0)
        .collect()
}

// covers: Rt.Elections, Rt.Release
/// Three slots on one session: each acquire returns its own fencing token, keepalives keep
/// them without touching their records, one release deletes one record, and the release of
/// the rest deletes the session with them.
#[tokio::test(start_paused = true)]
async fn acquire_hold_and_release_several_slots_on_one_session() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);

    let mut tokens = Vec::new();
    for slot in 1..=3 {
        let token = elections.acquire(Slot(slot)).await.unwrap();
        let record = store.record(Slot(slot)).unwrap().unwrap();
        assert_eq!(record.value, *elections.value());
        assert_eq!(record.revision, token.revision);
        tokens.push(token);
    }
    let key = elections.session().expect("a session is open");

    // Three keepalives later every slot is still held, at the revision of its acquire.
    pass(lease().renew_interval() * 3 + EPSILON).await;
    assert_eq!(elections.held(), tokens);
    for token in &tokens {
        assert_eq!(elections.tenure(token.slot), Tenure::Held(*token));
        let record = store.record(token.slot).unwrap().unwrap();
        assert_eq!(
            record.revision, token.revision,
            "keepalives touch no holding"
        );
    }

    elections.release(Slot(2)).await.unwrap();
    assert_eq!(store.record(Slot(2)).unwrap(), None);
    assert_eq!(elections.tenure(Slot(2)), Tenure::Idle);
    assert_eq!(elections.session(), Some(key), "the session lives on");

    elections.release_all().await.unwrap();
    for slot in [1, 3] {
        assert_eq!(store.record(Slot(slot)).unwrap(), None);
        assert_eq!(elections.tenure(Slot(slot)), Tenure::Idle);
    }
    assert_eq!(store.get_session(key).await.unwrap(), None);
    assert_eq!(elections.session(), None);
    assert!(elections.held().is_empty());
}

// covers: Rt.ElectionsOneKeepalive
/// One slot, ten, a thousand: the store sees the same calls per lease period, one keepalive
/// every `L/4` and nothing else, because the slots are holdings of one session.
#[tokio::test(start_paused = true)]
async fn any_number_of_slots_costs_one_keepalive_per_period() {
    let mut per_count = Vec::new();
    for count in [1, 10, 1_000] {
        let (store, killer) = (Counted::default(), TestKiller::new());
        let elections = start(&store, "10.0.0.1:7000", &killer);
        for slot in 1..=count {
            elections.acquire(Slot(slot)).await.unwrap();
        }
        let before = store.hook.snapshot();
        pass(LEASE * 10).await;
        let calls = made(&before, &store.hook.snapshot());
        // 40 keepalives in 10 L, give or take the one at the window's edge.
        assert!(
            matches!(calls.as_slice(), [(Call::KeepAlive, 39..=41)]),
            "{count} slots made {calls:?} in ten lease periods; expected only about 40 keepalives"
        );
        assert_eq!(elections.held().len(), count as usize);
        assert_eq!(
            killer.thread.armed().len(),
            1,
            "{count} slots, one kill deadline"
        );
        per_count.push(calls);
        elections.cleanup().await;
    }
    assert!(
        per_count.windows(2).all(|pair| pair[0] == pair[1]),
        "the calls per period depend on the number of slots: {per_count:?}"
    );
}

// covers: Rt.ElectionsDisarm
/// A process that releases its slots and goes on working keeps running: releasing the last
/// slot deletes the session, which removes its kill deadline; releasing the others before it
/// leaves the deadline to the slots still held.
#[tokio::test(start_paused = true)]
async fn releasing_every_slot_removes_the_kill_deadline_and_the_process_lives_on() {
    let (store, killer) = (Counted::default(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    assert!(
        killer.thread.armed().is_empty(),
        "nothing held, no deadline"
    );
    for slot in 1..=3 {
        elections.acquire(Slot(slot)).await.unwrap();
    }
    pass(lease().renew_interval() + EPSILON).await;
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "one deadline for three slots"
    );

    elections.release(Slot(1)).await.unwrap();
    elections.release(Slot(2)).await.unwrap();
    assert_eq!(killer.thread.armed().len(), 1, "slot 3 is still held");
    elections.release(Slot(3)).await.unwrap();
    assert!(
        killer.thread.armed().is_empty(),
        "the deadline outlived the release of every slot: {:?}",
        killer.thread.armed()
    );

    // Again with one call for all: release_all.
    for slot in 1..=3 {
        elections.acquire(Slot(slot)).await.unwrap();
    }
    let before = store.hook.snapshot();
    elections.release_all().await.unwrap();
    assert_eq!(
        made(&before, &store.hook.snapshot()),
        [(Call::DeleteSession, 1)],
        "one delete of the session releases every slot"
    );
    assert!(
        killer.thread.armed().is_empty(),
        "the deadline outlived release_all: {:?}",
        killer.thread.armed()
    );
    // Working on well past the last deadline the session ever had.
    pass(LEASE * 2).await;
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "killed after a clean release: {:?}",
        killer.recorder.reports()
    );
}

// covers: Rt.ElectionsLoss
/// The session's record deleted underneath: at the next keepalive every slot turns lost in one
/// change, nothing new is acquired until the lost slots are released, the deadline stays armed,
/// and after the release a new session acquires again.
#[tokio::test(start_paused = true)]
async fn a_lost_session_loses_every_slot_at_once() {
    let (store, killer) = (Counted::default(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    for slot in 1..=3 {
        elections.acquire(Slot(slot)).await.unwrap();
    }
    let key = elections.session().unwrap();
    let record = store.get_session(key).await.unwrap().unwrap();
    assert!(store
        .store
        .delete_session(key, record.revision)
        .await
        .unwrap());

    let mut watch = elections.watch();
    let lost = tokio::time::timeout(LEASE, watch.wait_for(|tenures| tenures.held().count() < 3))
        .await
        .expect("the loss is seen within a lease")
        .unwrap()
        .clone();
    assert_eq!(lost.lost(), Some(LossReason::Overtaken));
    for slot in 1..=3 {
        assert_eq!(
            lost.get(Slot(slot)),
            Tenure::Lost {
                slot: Slot(slot),
                reason: LossReason::Overtaken
            },
            "the first change after the loss shows every slot lost"
        );
        assert_eq!(
            elections.tenure(Slot(slot)),
            Tenure::Lost {
                slot: Slot(slot),
                reason: LossReason::Overtaken
            }
        );
    }
    assert_eq!(
        elections.acquire(Slot(4)).await,
        Err(ElectionsError::Lost(LossReason::Overtaken))
    );
    assert_eq!(store.store.record(Slot(4)).unwrap(), None);

    elections.release_all().await.unwrap();
    assert_eq!(killer.thread.armed().len(), 1, "a loss keeps the deadline");
    let token = elections.acquire(Slot(4)).await.expect("a new session");
    assert_ne!(elections.session(), Some(key));
    assert_eq!(elections.tenure(Slot(4)), Tenure::Held(token));
    elections.cleanup().await;
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "the lost session's deadline stays after the new one closed"
    );
}

// covers: Rt.ElectionsLoss
/// Keepalives that keep failing lose the session (and every slot) before its deadline; the
/// deadline still fires, even after the lost slots were released.
#[tokio::test(start_paused = true)]
async fn failing_keepalives_lose_every_slot_and_the_deadline_fires() {
    let (store, killer) = (Counted::default(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    elections.acquire(Slot(1)).await.unwrap();
    elections.acquire(Slot(2)).await.unwrap();
    store.hook.failing.store(true, Ordering::SeqCst);

    let mut watch = elections.watch();
    tokio::time::timeout(LEASE, watch.wait_for(|tenures| tenures.lost().is_some()))
        .await
        .expect("the loss is seen within a lease")
        .unwrap();
    for slot in [Slot(1), Slot(2)] {
        assert_eq!(
            elections.tenure(slot),
            Tenure::Lost {
                slot,
                reason: LossReason::RenewalFailed
            }
        );
    }
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "lost before the deadline"
    );
    elections.release(Slot(1)).await.unwrap();
    elections.release(Slot(2)).await.unwrap();
    assert_eq!(killer.thread.armed().len(), 1, "a loss keeps the deadline");
    pass(LEASE).await;
    killer.catch_up();
    assert_eq!(killer.recorder.reports().len(), 1, "the deadline fired");
}

// covers: Rt.ElectionsVanished
/// One slot's record removed from outside while the session lives (an operator "unsticking"
/// it): that slot alone turns lost at once, and another process may hold it meanwhile; the
/// other slots stay held. The lost slot is not acquired again until it is released, and its
/// release deletes nothing: the record there now is the other process's.
#[tokio::test(start_paused = true)]
async fn a_slot_whose_record_is_removed_from_outside_is_lost_alone_at_once() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    let mut tokens = Vec::new();
    for slot in 1..=3 {
        tokens.push(elections.acquire(Slot(slot)).await.unwrap());
    }
    assert!(store.delete(Slot(2)));
    let other = foreign("10.0.0.2:7000");
    store.set(Slot(2), &other, LEASE).unwrap();
    pass(EPSILON).await;
    assert_eq!(
        elections.tenure(Slot(2)),
        Tenure::Lost {
            slot: Slot(2),
            reason: LossReason::Overtaken
        },
        "still held after its record was removed"
    );
    assert_eq!(elections.held(), [tokens[0], tokens[2]]);
    assert_eq!(elections.watch().borrow().lost(), None, "the session lives");
    assert_eq!(
        elections.acquire(Slot(2)).await,
        Err(ElectionsError::AlreadyHeld(Slot(2)))
    );
    elections.release(Slot(2)).await.unwrap();
    assert_eq!(elections.tenure(Slot(2)), Tenure::Idle);
    assert_eq!(store.record(Slot(2)).unwrap().unwrap().value, other);
    // Keepalives go on for the others.
    pass(LEASE * 2).await;
    assert_eq!(elections.held(), [tokens[0], tokens[2]]);
    elections.release_all().await.unwrap();
    assert!(killer.thread.armed().is_empty());
}

// covers: Rt.ElectionsInput
/// Bad input is refused with a typed error and no store call.
#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_without_a_store_call() {
    let (store, killer) = (Counted::default(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    assert_eq!(
        elections.acquire(Slot(0)).await,
        Err(ElectionsError::InvalidSlot(Slot(0)))
    );
    assert!(
        store.hook.snapshot().iter().all(|&(_, calls)| calls == 0),
        "no call for slot 0"
    );

    elections.acquire(Slot(1)).await.unwrap();
    let before = store.hook.snapshot();
    assert_eq!(
        elections.acquire(Slot(1)).await,
        Err(ElectionsError::AlreadyHeld(Slot(1)))
    );
    assert!(made(&before, &store.hook.snapshot()).is_empty());

    elections.cleanup().await;
    assert_eq!(
        elections.acquire(Slot(1)).await,
        Err(ElectionsError::Closed)
    );
    assert_eq!(
        elections.release(Slot(1)).await,
        Err(ElectionsError::Closed)
    );
    assert_eq!(elections.release_all().await, Err(ElectionsError::Closed));
    // Cleaning up twice is harmless.
    elections.cleanup().await;
}

// covers: Rt.ElectionsInput
/// One handle holds at most `ELECTIONS_SLOTS_MAX` slots; the next is refused, typed.
#[tokio::test(start_paused = true)]
async fn more_slots_than_the_bound_are_refused() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    let max = u32::try_from(ELECTIONS_SLOTS_MAX).unwrap();
    for slot in 1..=max {
        elections.acquire(Slot(slot)).await.unwrap();
    }
    assert_eq!(
        elections.acquire(Slot(max + 1)).await,
        Err(ElectionsError::TooManySlots {
            max: ELECTIONS_SLOTS_MAX
        })
    );
    assert_eq!(store.record(Slot(max + 1)).unwrap(), None);
    elections.release_all().await.unwrap();
    assert_eq!(store.record(Slot(max)).unwrap(), None);
}

// covers: Rt.Elections
/// A slot with someone else's live record is not won; with nothing held, no session stays open
/// and no deadline is armed, and a candidate trying again costs one read per try.
#[tokio::test(start_paused = true)]
async fn a_slot_held_by_another_is_not_won_and_leaves_no_session() {
    let (store, killer) = (Counted::default(), TestKiller::new());
    let other = foreign("10.0.0.2:7000");
    store.store.set(Slot(1), &other, LEASE).unwrap();
    let elections = start(&store, "10.0.0.1:7000", &killer);

    for _ in 0..3 {
        let before = store.hook.snapshot();
        assert_eq!(
            elections.acquire(Slot(1)).await,
            Err(ElectionsError::Held(Slot(1)))
        );
        assert_eq!(made(&before, &store.hook.snapshot()), [(Call::Get, 1)]);
    }
    assert_eq!(store.store.record(Slot(1)).unwrap().unwrap().value, other);
    assert_eq!(elections.tenure(Slot(1)), Tenure::Idle);
    assert_eq!(elections.session(), None);
    assert!(killer.thread.armed().is_empty());

    // Held on one slot, another is won on the open session; the refusal leaves it open.
    let token = elections.acquire(Slot(2)).await.unwrap();
    assert_eq!(
        elections.acquire(Slot(1)).await,
        Err(ElectionsError::Held(Slot(1)))
    );
    assert_eq!(elections.held(), [token]);
}

// covers: Rt.Elections
/// Dropping the handle releases what it holds, in the background.
#[tokio::test(start_paused = true)]
async fn dropping_the_handle_releases_every_slot() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, "10.0.0.1:7000", &killer);
    elections.acquire(Slot(1)).await.unwrap();
    elections.acquire(Slot(2)).await.unwrap();
    drop(elections);
    pass(EPSILON).await;
    assert_eq!(store.record(Slot(1)).unwrap(), None);
    assert_eq!(store.record(Slot(2)).unwrap(), None);
    assert!(killer.thread.armed().is_empty());
}

// covers: Rt.ElectionsAddress
#[tokio::test(start_paused = true)]
async fn an_address_that_the_configuration_refuses_is_refused_by_the_elections_too() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let long = "a".repeat(vvm_core::ADDRESS_MAX_BYTES + 1);
    for address in ["", long.as_str(), "10.0.0.1\n:7000", "tab\there"] {
        let expected = vvm_core::VvmConfig::builder(address).build().unwrap_err();
        match Elections::start(store.clone(), address, lease(), &killer.thread) {
            Err(ElectionsError::InvalidAddress(error)) => assert_eq!(error, expected),
            Err(other) => panic!("{address:?}: unexpected error {other}"),
            Ok(_) => panic!("{address:?} was accepted"),
        }
    }
    assert_eq!(store.record(Slot(1)).unwrap(), None);
    let longest = "a".repeat(vvm_core::ADDRESS_MAX_BYTES);
    let elections = Elections::start(store.clone(), &longest, lease(), &killer.thread).unwrap();
    assert!(elections.acquire(Slot(1)).await.is_ok());
    elections.cleanup().await;
}

/// Acquires every slot of `slots` on `elections` that it does not hold yet, waking on the
/// store's change feed between tries; returns once all are held.
async fn take_when_free(store: &MemoryStore, elections: &Elections, slots: &[Slot]) {
    loop {
        // Created before the tries, so that a change during them is not missed.
        let change = store.changed(slots);
        for &slot in slots {
            if elections.tenure(slot) == Tenure::Idle {
                let _ = elections.acquire(slot).await;
            }
        }
        if elections.held().len() == slots.len() {
            return;
        }
        change.await;
    }
}

// covers: Rt.ElectionsFailover
/// Real time: a successor waiting on the change feed holds every slot within 50 ms after the
/// holder's session record leaves the store (deleted, as at its expiry), and a newcomer within
/// 20 ms after that successor releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_takes_every_slot_quickly_after_failover_and_hand_off() {
    const FAILOVER_MAX: Duration = Duration::from_millis(50);
    const HAND_OFF_MAX: Duration = Duration::from_millis(20);
    let slots = [Slot(1), Slot(2), Slot(3)];
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let holder = start(&store, "10.0.0.1:7000", &killer);
    for &slot in &slots {
        holder.acquire(slot).await.unwrap();
    }
    let successor = Arc::new(start(&store, "10.0.0.2:7000", &killer));

    // Failover: the holder's session record leaves the store.
    let waiting = tokio::spawn({
        let (store, successor) = (store.clone(), successor.clone());
        async move { take_when_free(&store, &successor, &slots).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(successor.held().is_empty(), "the holder still holds");
    let key = holder.session().unwrap();
    let record = store.get_session(key).await.unwrap().unwrap();
    let left = std::time::Instant::now();
    assert!(store.delete_session(key, record.revision).await.unwrap());
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the successor holds every slot within a second of the failover")
        .unwrap();
    let failover = left.elapsed();

    // Hand-off: the successor releases every slot to a newcomer.
    let newcomer = Arc::new(start(&store, "10.0.0.3:7000", &killer));
    let waiting = tokio::spawn({
        let (store, newcomer) = (store.clone(), newcomer.clone());
        async move { take_when_free(&store, &newcomer, &slots).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let released = std::time::Instant::now();
    successor.release_all().await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("the newcomer holds every slot within a second of the release")
        .unwrap();
    let hand_off = released.elapsed();

    println!("failover {failover:?}, hand-off {hand_off:?} (3 slots, memory store)");
    assert!(failover <= FAILOVER_MAX, "failover took {failover:?}");
    assert!(hand_off <= HAND_OFF_MAX, "hand-off took {hand_off:?}");
}
