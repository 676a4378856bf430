//! The elections cases: the runtime's [`Elections`] acquiring, holding, losing and releasing
//! slots as holdings of one session on the store under test, while the case changes records
//! underneath through the store's own operations.
//!
//! Every wait for a change of [`Tenure`] is bounded by one lease: a holder must notice a lost
//! session within its lease, whatever the store.

use vvm::{
    elections::ElectionsError,
    store::{Lease, LeaseStore, SessionStore},
    testing::{ManualKillerTime, RecordingKiller},
    Elections, FencingToken, KillerThread, LeaseConfig, LossReason, Slot, Tenure,
};

use crate::{value, Harness, LONG_TTL};

const SLOT: Slot = Slot(3);
const OTHER_SLOT: Slot = Slot(4);

/// A killer that only records; its clock never moves, so it ends nothing.
struct Killer {
    thread: KillerThread,
    _time: ManualKillerTime,
}

impl Killer {
    fn new() -> Self {
        let (thread, time) = KillerThread::manual(RecordingKiller::new());
        Killer {
            thread,
            _time: time,
        }
    }
}

struct Setup<S> {
    store: S,
    lease: LeaseConfig,
    killer: Killer,
}

impl<S: SessionStore + Clone> Setup<S> {
    async fn new<H: Harness<Store = S>>(harness: &H) -> Self {
        Setup {
            store: harness.store().await,
            lease: {
                let lease =
                    LeaseConfig::new(harness.lease()).expect("the harness's lease is valid");
                match harness.store_timeout() {
                    Some(timeout) => lease
                        .with_store_timeout(timeout)
                        .expect("the harness's store timeout is valid"),
                    None => lease,
                }
            },
            killer: Killer::new(),
        }
    }

    fn elections(&self, address: &str) -> Elections {
        Elections::start(self.store.clone(), address, self.lease, &self.killer.thread)
            .expect("elections start inside a runtime")
    }

    async fn record(&self, slot: Slot) -> Option<Lease> {
        self.store.get(slot).await.expect("get succeeds")
    }

    /// Waits (at most one lease) until `slot` of `elections` reaches a tenure that satisfies
    /// `wanted`.
    async fn wait_for(
        &self,
        elections: &Elections,
        slot: Slot,
        what: &str,
        wanted: impl Fn(&Tenure) -> bool,
    ) -> Tenure {
        let mut tenures = elections.watch();
        let reached = tokio::time::timeout(
            self.lease.lease(),
            tenures.wait_for(|t| wanted(&t.get(slot))),
        )
        .await;
        match reached {
            Ok(Ok(reached)) => reached.get(slot),
            _ => panic!(
                "{what} within a lease; slot {} is {:?}",
                slot.0,
                elections.tenure(slot)
            ),
        }
    }
}

fn held(tenure: Tenure) -> FencingToken {
    match tenure {
        Tenure::Held(token) => token,
        other => panic!("expected a held slot, got {other:?}"),
    }
}

fn overtaken(slot: Slot) -> Tenure {
    Tenure::Lost {
        slot,
        reason: LossReason::Overtaken,
    }
}

/// Two slots are acquired on one session, kept by its keepalives well past its TTL (their
/// records and tokens unchanged), and released: one alone, then the other with the session.
// covers: St.Elections
pub async fn elections_acquire_hold_and_release<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");

    let token = elections.acquire(SLOT).await.expect("an empty slot is won");
    let other = elections
        .acquire(OTHER_SLOT)
        .await
        .expect("a second empty slot is won");
    let expected = Lease {
        value: elections.value().clone(),
        revision: token.revision,
    };
    assert_eq!(setup.record(SLOT).await, Some(expected.clone()));

    // Two leases later the records would long have expired without keepalives.
    harness.pass(setup.lease.lease() * 2).await;
    assert_eq!(
        held(elections.tenure(SLOT)),
        token,
        "keepalives keep the token"
    );
    assert_eq!(setup.record(SLOT).await, Some(expected));

    elections.release(SLOT).await.expect("release succeeds");
    assert_eq!(elections.tenure(SLOT), Tenure::Idle);
    assert_eq!(setup.record(SLOT).await, None, "release deletes the record");
    assert_eq!(held(elections.tenure(OTHER_SLOT)), other);
    let key = elections.session().expect("the session lives on");

    elections.release_all().await.expect("release succeeds");
    assert_eq!(setup.record(OTHER_SLOT).await, None);
    assert_eq!(
        setup.store.get_session(key).await.expect("read succeeds"),
        None,
        "releasing the last slot deletes the session"
    );
}

/// A slot with a live record of someone else is not acquired, and the record stays.
// covers: St.Elections
pub async fn elections_acquire_fails_while_another_holds<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let other = value(9);
    let revision = setup
        .store
        .insert_if_not_exists(SLOT, &other, LONG_TTL)
        .await
        .expect("insert succeeds")
        .expect("insert wins");
    let elections = setup.elections("10.1.0.1:7000");

    assert_eq!(
        elections.acquire(SLOT).await,
        Err(ElectionsError::Held(SLOT))
    );
    assert_eq!(elections.tenure(SLOT), Tenure::Idle);
    assert_eq!(
        elections.session(),
        None,
        "no session while nothing is held"
    );
    assert_eq!(
        setup.record(SLOT).await,
        Some(Lease {
            value: other,
            revision
        })
    );
}

/// The session record deleted underneath is noticed at the next keepalive: every slot is lost
/// at once, and their records are gone with the session.
// covers: St.Elections
pub async fn elections_a_deleted_session_loses_every_slot<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    elections.acquire(SLOT).await.expect("an empty slot is won");
    elections
        .acquire(OTHER_SLOT)
        .await
        .expect("an empty slot is won");

    let key = elections.session().expect("a session holds the slots");
    let record = setup
        .store
        .get_session(key)
        .await
        .expect("read succeeds")
        .expect("our session record");
    let deleted = setup.store.delete_session(key, record.revision).await;
    assert_eq!(deleted, Ok(true));

    let lost = setup
        .wait_for(&elections, SLOT, "loss", |t| {
            matches!(t, Tenure::Lost { .. })
        })
        .await;
    assert_eq!(lost, overtaken(SLOT));
    assert_eq!(elections.tenure(OTHER_SLOT), overtaken(OTHER_SLOT));
    assert_eq!(setup.record(SLOT).await, None);
    assert_eq!(setup.record(OTHER_SLOT).await, None);
    assert_eq!(
        elections.acquire(Slot(5)).await,
        Err(ElectionsError::Lost(LossReason::Overtaken)),
        "nothing is acquired before the lost slots are released"
    );
}

/// After a lost session, another contender wins the slot with a higher revision; the loser,
/// once it released its lost slots, acquires again on a new session.
// covers: St.Elections
pub async fn elections_a_lost_slot_passes_to_the_next_contender<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let first = setup.elections("10.1.0.1:7000");
    let second = setup.elections("10.1.0.2:7000");
    let first_token = first.acquire(SLOT).await.expect("an empty slot is won");

    let key = first.session().expect("a session holds the slot");
    let record = setup
        .store
        .get_session(key)
        .await
        .expect("read succeeds")
        .expect("our session record");
    let deleted = setup.store.delete_session(key, record.revision).await;
    assert_eq!(deleted, Ok(true));
    let second_token = second.acquire(SLOT).await.expect("a freed slot is won");
    assert!(second_token.revision > first_token.revision);

    setup
        .wait_for(&first, SLOT, "loss", |t| matches!(t, Tenure::Lost { .. }))
        .await;
    first.release_all().await.expect("release succeeds");
    assert_eq!(
        first.acquire(SLOT).await,
        Err(ElectionsError::Held(SLOT)),
        "held by the second"
    );
    first
        .acquire(OTHER_SLOT)
        .await
        .expect("a new session acquires");
    assert_ne!(first.session(), Some(key));
    first.cleanup().await;
    second.cleanup().await;
}

/// Releasing with nothing held writes nothing; the handle still acquires afterwards.
// covers: St.Elections
pub async fn elections_release_without_acquire_does_nothing<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");

    elections.release(SLOT).await.expect("release succeeds");
    elections.release_all().await.expect("release succeeds");
    assert_eq!(elections.tenure(SLOT), Tenure::Idle);
    assert_eq!(setup.record(SLOT).await, None);
    let token = elections.acquire(SLOT).await.expect("an empty slot is won");
    assert_eq!(
        setup.record(SLOT).await.map(|r| r.revision),
        Some(token.revision)
    );
}

/// Cleanup releases what is held; afterwards nothing is acquired any more.
// covers: St.Elections
pub async fn elections_acquire_after_cleanup_fails<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    elections.acquire(SLOT).await.expect("an empty slot is won");

    elections.cleanup().await;
    assert_eq!(
        setup.record(SLOT).await,
        None,
        "cleanup releases what is held"
    );
    assert_eq!(
        elections.acquire(OTHER_SLOT).await,
        Err(ElectionsError::Closed)
    );
    assert_eq!(setup.record(OTHER_SLOT).await, None);
    elections.cleanup().await;
}

/// Cleanup after keepalives deletes the session and its holdings.
// covers: St.Elections
pub async fn elections_cleanup_after_keepalives_releases<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    elections.acquire(SLOT).await.expect("an empty slot is won");
    elections
        .acquire(OTHER_SLOT)
        .await
        .expect("an empty slot is won");
    let key = elections.session().expect("a session holds the slots");

    harness.pass(setup.lease.lease()).await;
    elections.cleanup().await;
    assert_eq!(setup.record(SLOT).await, None);
    assert_eq!(setup.record(OTHER_SLOT).await, None);
    assert_eq!(
        setup.store.get_session(key).await.expect("read succeeds"),
        None
    );
    assert_eq!(elections.tenure(SLOT), Tenure::Idle);
}

/// Of two contenders only one holds the slot; once it releases, the other wins it with a
/// higher revision (a larger fencing token).
// covers: St.Elections
pub async fn elections_a_released_slot_passes_to_the_next_contender<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let setup = Setup::new(harness).await;
    let first = setup.elections("10.1.0.1:7000");
    let second = setup.elections("10.1.0.2:7000");

    let first_token = first.acquire(SLOT).await.expect("an empty slot is won");
    assert_eq!(second.acquire(SLOT).await, Err(ElectionsError::Held(SLOT)));
    first.release(SLOT).await.expect("release succeeds");

    let second_token = second.acquire(SLOT).await.expect("a released slot is won");
    assert!(second_token.revision > first_token.revision);
    let record = setup.record(SLOT).await.expect("the new holder's record");
    assert_eq!(record.value, *second.value());
    assert_eq!(first.tenure(SLOT), Tenure::Idle);
}
