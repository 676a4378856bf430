//! The per-slot elections suite: one slot acquired, renewed, lost and released through
//! [`LeaseElections`] (its own lease record, renewals and kill deadline), against the memory
//! store, on tokio's paused clock. The lease is 20 s: renewals every 5 s,
//! retries 1 s apart, store calls time out after 0.5 s.

mod common;

use std::time::Duration;

use common::{foreign, pass, TestKiller, LEASE};
use vvm::{ElectionsError, LeaseConfig, LeaseElections, LossReason, Slot, Tenure};
use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;

const SLOT: Slot = Slot(1);
const EPSILON: Duration = Duration::from_millis(1);

fn lease() -> LeaseConfig {
    LeaseConfig::new(LEASE).unwrap()
}

fn start(store: &MemoryStore, killer: &TestKiller) -> LeaseElections {
    LeaseElections::start(store.clone(), "10.0.0.1:7000", lease(), &killer.thread).unwrap()
}

fn held_revision(elections: &LeaseElections) -> u64 {
    match elections.tenure() {
        Tenure::Held(token) => token.revision.0,
        other => panic!("expected a held lease, got {other:?}"),
    }
}

// covers: Rt.LeaseElections, Rt.Release
#[tokio::test(start_paused = true)]
async fn acquire_hold_and_release_a_slot() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);

    let token = elections.acquire(SLOT).await.unwrap();
    let record = store.record(SLOT).unwrap().unwrap();
    assert_eq!(record.value, *elections.value());
    assert_eq!(record.revision, token.revision);

    // Three renewals later the lease is still ours, at the revision of the last one.
    pass(lease().renew_interval() * 3 + EPSILON).await;
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 3);
    let renewed = held_revision(&elections);
    assert!(renewed > token.revision.0);
    assert_eq!(store.record(SLOT).unwrap().unwrap().revision.0, renewed);

    elections.release().await.unwrap();
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert_eq!(elections.tenure(), Tenure::Idle);
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn acquiring_a_slot_held_by_another_value_fails() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let other = foreign("10.0.0.2:7000");
    store.set(SLOT, &other, LEASE).unwrap();
    let elections = start(&store, &killer);

    assert_eq!(
        elections.acquire(SLOT).await,
        Err(ElectionsError::Held(SLOT))
    );
    assert_eq!(store.record(SLOT).unwrap().unwrap().value, other);
    assert_eq!(elections.tenure(), Tenure::Idle);
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn a_changed_value_loses_leadership_without_deleting_the_other_value() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    let other = foreign("10.0.0.2:7000");
    store.overwrite(SLOT, &other).unwrap().unwrap();
    pass(lease().renew_interval() + EPSILON).await;

    let lost = Tenure::Lost {
        slot: SLOT,
        reason: LossReason::Overtaken,
    };
    assert_eq!(elections.tenure(), lost);
    assert_eq!(store.record(SLOT).unwrap().unwrap().value, other);
    assert_eq!(
        store.calls(SLOT, Op::CompareAndSwap),
        1,
        "a refused renewal is not retried"
    );
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn a_key_deleted_underneath_loses_leadership() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    assert!(store.delete(SLOT));
    pass(lease().renew_interval() + EPSILON).await;

    let lost = Tenure::Lost {
        slot: SLOT,
        reason: LossReason::Overtaken,
    };
    assert_eq!(elections.tenure(), lost);
    assert_eq!(store.record(SLOT).unwrap(), None);
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn release_without_acquire_does_nothing() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);

    elections.release().await.unwrap();
    assert_eq!(elections.tenure(), Tenure::Idle);
    assert_eq!(store.calls(SLOT, Op::CompareAndDelete), 0);
    // The handle still works afterwards.
    elections.acquire(SLOT).await.unwrap();
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn acquire_after_cleanup_fails() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    elections.cleanup().await;
    assert_eq!(
        store.record(SLOT).unwrap(),
        None,
        "cleanup releases what is held"
    );
    assert_eq!(elections.acquire(SLOT).await, Err(ElectionsError::Closed));
    assert_eq!(store.calls(SLOT, Op::Insert), 1);
    // Cleaning up twice is harmless.
    elections.cleanup().await;
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn cleanup_during_a_renewal_waits_for_it_and_releases() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    // The renewal at 5 s takes 0.3 s (below the 0.5 s call timeout): cleanup arrives mid-call.
    let slow = Injection::new(Fault::Delay(Duration::from_millis(300))).on(Op::CompareAndSwap);
    store.inject(SLOT, slow);
    pass(lease().renew_interval() + EPSILON).await;
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 1);
    assert_eq!(
        store.calls(SLOT, Op::CompareAndDelete),
        0,
        "the renewal is still in flight"
    );

    elections.cleanup().await;
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert_eq!(store.calls(SLOT, Op::CompareAndDelete), 1);
    assert_eq!(elections.tenure(), Tenure::Idle);
}

// covers: Rt.LeaseElections, Rt.StoreTimeout
#[tokio::test(start_paused = true)]
async fn transient_store_errors_are_recovered_within_the_retry_budget() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    let first = elections.acquire(SLOT).await.unwrap();

    // The first renewal fails outright, its first retry (after L/20) hangs past the call
    // timeout (and the read-back hangs too); the second retry (after L/10) succeeds.
    store.inject(
        SLOT,
        Injection::new(Fault::Fail).on(Op::CompareAndSwap).times(1),
    );
    pass(lease().renew_interval() + EPSILON).await;
    store.inject(SLOT, Injection::new(Fault::Hang).times(2));
    pass(lease().retry_interval() + lease().store_timeout() * 2 + EPSILON).await;
    pass(lease().retry_backoff(2)).await;

    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 3);
    assert!(held_revision(&elections) > first.revision.0);
    assert_eq!(
        store.record(SLOT).unwrap().unwrap().value,
        *elections.value()
    );
}

// covers: Rt.LeaseElections, Lease.RetryUntilDeadline
#[tokio::test(start_paused = true)]
async fn persistent_store_errors_lose_leadership_once_the_deadline_cannot_be_met() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    // Attempts at 5 s, then after 1 s, 2 s and 4 s: 6, 8 and 12 s. A retry at 16 s could not be
    // answered before the deadline (16 s), so the failure at 12 s is the loss.
    store.inject(SLOT, Injection::new(Fault::Fail).on(Op::CompareAndSwap));
    let backoffs = lease().retry_backoff(1) + lease().retry_backoff(2) + lease().retry_backoff(3);
    pass(lease().renew_interval() + backoffs - EPSILON).await;
    assert!(
        matches!(elections.tenure(), Tenure::Held(_)),
        "still retrying"
    );
    pass(EPSILON * 2).await;

    let lost = Tenure::Lost {
        slot: SLOT,
        reason: LossReason::RenewalFailed,
    };
    assert_eq!(elections.tenure(), lost);
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 4);
    // A loss never deletes: the record is left to expire, since work started under it may
    // still run until the kill deadline.
    assert_eq!(store.calls(SLOT, Op::CompareAndDelete), 0);
    assert_eq!(
        store.record(SLOT).unwrap().unwrap().value,
        *elections.value()
    );
    pass(lease().renew_interval() * 2).await;
    assert_eq!(
        store.calls(SLOT, Op::CompareAndSwap),
        4,
        "no renewal after the loss"
    );
}

// covers: Rt.LeaseElections
#[tokio::test(start_paused = true)]
async fn cleanup_during_retries_releases_and_stops_retrying() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();

    store.inject(SLOT, Injection::new(Fault::Fail).on(Op::CompareAndSwap));
    pass(lease().renew_interval() + EPSILON).await;
    assert_eq!(store.calls(SLOT, Op::CompareAndSwap), 1);

    elections.cleanup().await;
    assert_eq!(store.record(SLOT).unwrap(), None);
    pass(lease().retry_interval() * 3).await;
    assert_eq!(
        store.calls(SLOT, Op::CompareAndSwap),
        1,
        "no retry after cleanup"
    );
}

// covers: Rt.LeaseElections, Rt.ReplyMapping
#[tokio::test(start_paused = true)]
async fn a_renewal_with_unknown_outcome_that_committed_counts_once_read_back() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    let first = elections.acquire(SLOT).await.unwrap();

    let injection = Injection::new(Fault::UnknownCommitted)
        .on(Op::CompareAndSwap)
        .times(1);
    store.inject(SLOT, injection);
    pass(lease().renew_interval() + EPSILON).await;
    assert_eq!(store.calls(SLOT, Op::Get), 1);
    // Read back as committed: nothing is confirmed; the retry after L/20 swaps from it.
    pass(lease().retry_interval()).await;

    let stored = store.record(SLOT).unwrap().unwrap();
    assert_eq!(held_revision(&elections), stored.revision.0);
    assert!(stored.revision > first.revision);
}

// covers: Rt.LeaseElections
/// A process that releases its slot and goes on working keeps running: the confirmed delete
/// removes the kill deadline, which would otherwise end it 0.8·L after the last renewal.
#[tokio::test(start_paused = true)]
async fn a_release_removes_the_kill_deadline_and_the_process_lives_on() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();
    pass(lease().renew_interval() + EPSILON).await;
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "a held slot arms a deadline"
    );

    elections.release().await.unwrap();
    assert_eq!(store.record(SLOT).unwrap(), None);
    assert!(
        killer.thread.armed().is_empty(),
        "the deadline outlived the release: {:?}",
        killer.thread.armed()
    );
    // Working on well past the last deadline the lease ever had.
    pass(LEASE * 2).await;
    killer.catch_up();
    assert!(
        killer.recorder.reports().is_empty(),
        "killed after a clean release: {:?}",
        killer.recorder.reports()
    );
}

// covers: Rt.LeaseElections
/// The negative side: a loss deletes nothing, so its deadline stays armed and still fires.
#[tokio::test(start_paused = true)]
async fn a_release_after_a_loss_keeps_the_kill_deadline() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let elections = start(&store, &killer);
    elections.acquire(SLOT).await.unwrap();
    store
        .overwrite(SLOT, &foreign("10.0.0.2:7000"))
        .unwrap()
        .unwrap();
    pass(lease().renew_interval() + EPSILON).await;
    assert!(matches!(elections.tenure(), Tenure::Lost { .. }));
    elections.release().await.unwrap();
    assert_eq!(killer.thread.armed().len(), 1, "a loss keeps the deadline");
    pass(LEASE).await;
    killer.catch_up();
    assert_eq!(killer.recorder.reports().len(), 1, "the deadline fired");
}

// covers: Rt.ElectionsAddress
#[tokio::test(start_paused = true)]
async fn an_address_that_the_configuration_refuses_is_refused_by_the_elections_too() {
    let store = MemoryStore::new();
    let killer = TestKiller::new();
    let long = "a".repeat(vvm::vvm_core::ADDRESS_MAX_BYTES + 1);
    for address in ["", long.as_str(), "10.0.0.1\n:7000", "tab\there"] {
        let expected = vvm::VvmConfig::builder(address).build().unwrap_err();
        match LeaseElections::start(store.clone(), address, lease(), &killer.thread) {
            Err(ElectionsError::InvalidAddress(error)) => assert_eq!(error, expected),
            Err(other) => panic!("{address:?}: unexpected error {other}"),
            Ok(_) => panic!("{address:?} was accepted"),
        }
    }
    // Nothing was written for any of them.
    assert_eq!(store.record(SLOT).unwrap(), None);
    // The longest valid address is accepted and acquires.
    let longest = "a".repeat(vvm::vvm_core::ADDRESS_MAX_BYTES);
    let elections =
        LeaseElections::start(store.clone(), &longest, lease(), &killer.thread).unwrap();
    assert!(elections.acquire(SLOT).await.is_ok());
    elections.cleanup().await;
}
