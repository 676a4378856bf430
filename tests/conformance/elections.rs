//! The elections cases: the runtime's [`Elections`] acquiring, holding, losing and releasing a
//! slot on the store under test, while the case changes records underneath through the
//! store's own operations.
//!
//! Every wait for a change of [`Tenure`] is bounded by one lease: a VVM must notice a lost
//! record within its lease, whatever the store.

use vvm::{
    Elections, ElectionsError, FencingToken, KillerThread, Lease, LeaseConfig, LeaseStore,
    LossReason, ManualKillerTime, RecordingKiller, Slot, Tenure,
};

use super::{value, Harness, LONG_TTL};

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

impl<S: LeaseStore + Clone> Setup<S> {
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

    /// Waits (at most one lease) until `elections` reaches a tenure that satisfies `wanted`.
    async fn wait_for(
        &self,
        elections: &Elections,
        what: &str,
        wanted: impl Fn(&Tenure) -> bool,
    ) -> Tenure {
        let mut tenure = elections.watch();
        let reached =
            tokio::time::timeout(self.lease.lease(), tenure.wait_for(|t| wanted(t))).await;
        match reached {
            Ok(Ok(reached)) => *reached,
            _ => panic!("{what} within a lease; tenure is {:?}", elections.tenure()),
        }
    }
}

fn held(tenure: Tenure) -> FencingToken {
    match tenure {
        Tenure::Held(token) => token,
        other => panic!("expected a held slot, got {other:?}"),
    }
}

fn overtaken() -> Tenure {
    Tenure::Lost {
        slot: SLOT,
        reason: LossReason::Overtaken,
    }
}

/// A slot is acquired, kept through renewals well past its TTL, and released.
// covers: St.Elections
pub async fn elections_acquire_hold_and_release<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");

    let token = elections.acquire(SLOT).await.expect("an empty slot is won");
    let expected = Lease {
        value: elections.value().clone(),
        revision: token.revision,
    };
    assert_eq!(setup.record(SLOT).await, Some(expected));

    // Two leases later the record would long have expired without renewals.
    harness.pass(setup.lease.lease() * 2).await;
    let renewed = held(elections.tenure());
    assert!(
        renewed.revision > token.revision,
        "renewals move the revision"
    );
    let record = setup.record(SLOT).await.expect("the renewed record lives");
    assert_eq!(record.value, *elections.value());
    assert!(record.revision >= renewed.revision);

    elections.release().await.expect("release succeeds");
    assert_eq!(elections.tenure(), Tenure::Idle);
    assert_eq!(setup.record(SLOT).await, None, "release deletes the record");
}

/// A slot with a live record of someone else is not acquired, and the record stays.
// covers: St.Elections
pub async fn elections_acquire_fails_while_another_holds<H: Harness>(harness: &H) {
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
    assert_eq!(elections.tenure(), Tenure::Idle);
    assert_eq!(
        setup.record(SLOT).await,
        Some(Lease {
            value: other,
            revision
        })
    );
}

/// A record replaced underneath is noticed at the next renewal; the other value is kept.
// covers: St.Elections
pub async fn elections_a_changed_record_loses_leadership_and_stays<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    elections.acquire(SLOT).await.expect("an empty slot is won");

    let ours = setup.record(SLOT).await.expect("our record");
    let revision = setup
        .store
        .compare_and_swap(SLOT, &ours, &value(9), LONG_TTL)
        .await
        .expect("swap succeeds")
        .expect("swap of the live record wins");

    let lost = setup
        .wait_for(&elections, "loss", |t| matches!(t, Tenure::Lost { .. }))
        .await;
    assert_eq!(lost, overtaken());
    let theirs = Lease {
        value: value(9),
        revision,
    };
    assert_eq!(
        setup.record(SLOT).await,
        Some(theirs),
        "the other record is not deleted"
    );
}

/// A record deleted underneath is noticed at the next renewal and not written again.
// covers: St.Elections
pub async fn elections_a_deleted_record_loses_leadership<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    elections.acquire(SLOT).await.expect("an empty slot is won");

    let ours = setup.record(SLOT).await.expect("our record");
    assert_eq!(setup.store.compare_and_delete(SLOT, &ours).await, Ok(true));

    let lost = setup
        .wait_for(&elections, "loss", |t| matches!(t, Tenure::Lost { .. }))
        .await;
    assert_eq!(lost, overtaken());
    assert_eq!(setup.record(SLOT).await, None);
}

/// Releasing with nothing held writes nothing; the handle still acquires afterwards.
// covers: St.Elections
pub async fn elections_release_without_acquire_does_nothing<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");

    elections.release().await.expect("release succeeds");
    assert_eq!(elections.tenure(), Tenure::Idle);
    assert_eq!(setup.record(SLOT).await, None);
    let token = elections.acquire(SLOT).await.expect("an empty slot is won");
    assert_eq!(
        setup.record(SLOT).await.map(|r| r.revision),
        Some(token.revision)
    );
}

/// Cleanup releases what is held; afterwards nothing is acquired any more.
// covers: St.Elections
pub async fn elections_acquire_after_cleanup_fails<H: Harness>(harness: &H) {
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

/// Cleanup after a renewal deletes the renewed record, not a stale one.
// covers: St.Elections
pub async fn elections_cleanup_after_renewals_releases<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let elections = setup.elections("10.1.0.1:7000");
    let first = elections.acquire(SLOT).await.expect("an empty slot is won");

    let renewed = setup
        .wait_for(
            &elections,
            "a renewal",
            |t| matches!(t, Tenure::Held(token) if token.revision > first.revision),
        )
        .await;
    held(renewed);
    elections.cleanup().await;
    assert_eq!(setup.record(SLOT).await, None);
    assert_eq!(elections.tenure(), Tenure::Idle);
}

/// Of two contenders only one holds the slot; once it releases, the other wins it with a
/// higher revision (a larger fencing token).
// covers: St.Elections
pub async fn elections_a_released_slot_passes_to_the_next_contender<H: Harness>(harness: &H) {
    let setup = Setup::new(harness).await;
    let first = setup.elections("10.1.0.1:7000");
    let second = setup.elections("10.1.0.2:7000");

    let first_token = first.acquire(SLOT).await.expect("an empty slot is won");
    assert_eq!(second.acquire(SLOT).await, Err(ElectionsError::Held(SLOT)));
    first.release().await.expect("release succeeds");

    let second_token = second.acquire(SLOT).await.expect("a released slot is won");
    assert!(second_token.revision > first_token.revision);
    let record = setup.record(SLOT).await.expect("the new holder's record");
    assert_eq!(record.value, *second.value());
    assert_eq!(first.tenure(), Tenure::Idle);
}
