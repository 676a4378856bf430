//! The memory store on its own: expiry by the injected clock, revisions, faults and the helpers
//! that change records underneath the VVMs.

use std::time::Duration;

use vvm_core::{Incarnation, Slot};

use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;
use vvm_runtime::{Lease, LeaseStore, LeaseValue, StoreError};

fn value(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(1),
        stopping: false,
    }
}

const TTL: Duration = Duration::from_secs(10);

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn records_expire_by_the_injected_clock() {
    let store = MemoryStore::new();
    let a = value("a");
    assert!(store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .is_some());
    tokio::time::advance(TTL - Duration::from_nanos(1)).await;
    let left = store.time_left(Slot(1)).await.unwrap();
    assert_eq!(left, Some(Duration::from_nanos(1)));
    assert!(store.get(Slot(1)).await.unwrap().is_some());
    tokio::time::advance(Duration::from_nanos(1)).await;
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    assert!(store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .is_some());
}

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn revisions_increase_across_delete_and_reinsert() {
    let store = MemoryStore::new();
    let a = value("a");
    let first = store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .unwrap();
    let lease = Lease {
        value: a.clone(),
        revision: first,
    };
    assert!(store.compare_and_delete(Slot(1), &lease).await.unwrap());
    let second = store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(second > first);
    let stale = store
        .compare_and_swap(Slot(1), &lease, &a, TTL)
        .await
        .unwrap();
    assert_eq!(
        stale, None,
        "a swap against an old revision must be refused"
    );
}

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn unknown_committed_applies_and_unknown_not_committed_does_not() {
    let store = MemoryStore::new();
    let a = value("a");
    store.inject(Slot(1), Injection::new(Fault::UnknownNotCommitted).times(1));
    assert!(store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap_err()
        .is_unknown());
    assert_eq!(store.record(Slot(1)).unwrap(), None);
    store.inject(Slot(1), Injection::new(Fault::UnknownCommitted).times(1));
    assert!(store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap_err()
        .is_unknown());
    assert_eq!(store.record(Slot(1)).unwrap().unwrap().value, a);
    assert_eq!(store.calls(Slot(1), Op::Insert), 2);
}

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn faults_aimed_at_one_operation_spare_the_others() {
    let store = MemoryStore::new();
    let a = value("a");
    store.inject(Slot(1), Injection::new(Fault::Fail).on(Op::CompareAndSwap));
    let revision = store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .unwrap();
    let lease = Lease {
        value: a.clone(),
        revision,
    };
    let swap = store.compare_and_swap(Slot(1), &lease, &a, TTL).await;
    assert!(matches!(swap, Err(StoreError::Failed { .. })));
    store.clear_fault(Slot(1));
    assert!(store
        .compare_and_swap(Slot(1), &lease, &a, TTL)
        .await
        .unwrap()
        .is_some());
}

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn hang_never_completes_and_delay_completes_later() {
    let store = MemoryStore::new();
    store.inject(Slot(1), Injection::new(Fault::Hang).times(1));
    let hung = tokio::time::timeout(Duration::from_secs(60), store.get(Slot(1))).await;
    assert!(hung.is_err());
    store.inject(
        Slot(1),
        Injection::new(Fault::Delay(Duration::from_secs(2))).times(1),
    );
    let start = tokio::time::Instant::now();
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    assert_eq!(start.elapsed(), Duration::from_secs(2));
}

// covers: Rt.MemoryStore
#[tokio::test(start_paused = true)]
async fn helpers_change_records_underneath() {
    let store = MemoryStore::new();
    let (a, b) = (value("a"), value("b"));
    let revision = store.set(Slot(2), &a, TTL).unwrap();
    let changed = store.overwrite(Slot(2), &b).unwrap().unwrap();
    assert!(changed > revision);
    assert_eq!(store.record(Slot(2)).unwrap().unwrap().value, b);
    assert!(store.delete(Slot(2)));
    assert!(!store.delete(Slot(2)));
    assert_eq!(store.overwrite(Slot(2), &b).unwrap(), None);
    store.set_raw(Slot(3), b"garbage".to_vec(), TTL).unwrap();
    assert!(matches!(
        store.get(Slot(3)).await,
        Err(StoreError::Corrupt { slot: 3, .. })
    ));
}

/// Whether `change` resolves within `within` (tokio's clock; paused in these tests).
async fn resolves(change: vvm_runtime::SlotChange, within: Duration) -> bool {
    tokio::time::timeout(within, change).await.is_ok()
}

// covers: St.ChangeFeed
#[tokio::test(start_paused = true)]
async fn the_change_feed_wakes_on_insert_holder_change_delete_and_expiry_not_on_renewals() {
    let store = MemoryStore::new();
    let (a, b) = (value("a"), value("b"));
    let wait = Duration::from_millis(10);

    // Nothing happens: no wake-up.
    assert!(!resolves(store.changed(&[Slot(1)]), wait).await);

    // Insert.
    let change = store.changed(&[Slot(1)]);
    let revision = store
        .insert_if_not_exists(Slot(1), &a, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(resolves(change, wait).await);

    // A write of another slot does not wake a waiter of slot 1, but does one of both.
    let one = store.changed(&[Slot(1)]);
    let both = store.changed(&[Slot(1), Slot(2)]);
    store.insert_if_not_exists(Slot(2), &b, TTL).await.unwrap();
    assert!(!resolves(one, wait).await);
    assert!(resolves(both, wait).await);

    // Compare-and-swap by the same holder (a renewal): a waiter would only be refused again.
    // covers: St.FeedIgnoresRenewals
    let change = store.changed(&[Slot(1)]);
    let held = Lease {
        value: a.clone(),
        revision,
    };
    let revision = store
        .compare_and_swap(Slot(1), &held, &a, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(!resolves(change, wait).await);

    // Compare-and-swap to another holder (value) wakes the waiter.
    let change = store.changed(&[Slot(1)]);
    let held = Lease {
        value: a.clone(),
        revision,
    };
    let c = value("c");
    let swapped = store
        .compare_and_swap(Slot(1), &held, &c, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(resolves(change, wait).await);
    let held = Lease {
        value: c,
        revision: swapped,
    };
    let revision = store
        .compare_and_swap(Slot(1), &held, &a, TTL)
        .await
        .unwrap()
        .unwrap();

    // A refused write changes nothing and wakes nobody.
    let change = store.changed(&[Slot(1)]);
    assert_eq!(store.insert_if_not_exists(Slot(1), &b, TTL).await, Ok(None));
    assert!(!resolves(change, wait).await);

    // Compare-and-delete (a release).
    let change = store.changed(&[Slot(1)]);
    let held = Lease { value: a, revision };
    assert_eq!(store.compare_and_delete(Slot(1), &held).await, Ok(true));
    assert!(resolves(change, wait).await);

    // Expiry: nothing is told at the instant itself (the waiter's own timer covers that), but
    // the first operation that finds the record expired removes it and wakes the waiter.
    let change = store.changed(&[Slot(2)]);
    tokio::time::advance(TTL).await;
    assert_eq!(store.get(Slot(2)).await, Ok(None));
    assert!(resolves(change, wait).await);
}

// covers: St.ChangeFeed
#[tokio::test(start_paused = true)]
async fn the_change_feed_sees_a_change_made_before_its_first_poll() {
    let store = MemoryStore::new();
    let change = store.changed(&[Slot(3)]);
    // Written after the call but before the future is polled at all.
    store.set(Slot(3), &value("a"), TTL).unwrap();
    assert!(resolves(change, Duration::from_millis(1)).await);
    // The helpers that change records underneath wake waiters too.
    let change = store.changed(&[Slot(3)]);
    assert!(store.delete(Slot(3)));
    assert!(resolves(change, Duration::from_millis(1)).await);
}
