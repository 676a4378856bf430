//! The memory store on its own: expiry by the injected clock, revisions, faults and the helpers
//! that change records underneath the VVMs.

use std::time::Duration;

use vvm::{Incarnation, Lease, LeaseStore, LeaseValue, Slot, StoreError};
use vvm_adapters::memory::{Fault, Injection, Op};
use vvm_adapters::MemoryStore;

fn value(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(1),
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
