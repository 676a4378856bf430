//! The TTL-record cases: each takes a fresh store from the harness and checks one rule of the
//! [`LeaseStore`] contract.

use std::collections::HashSet;

use tokio::task::JoinSet;
use vvm::{
    lifecycle::Revision,
    session::LeaseValue,
    store::{Lease, LeaseStore},
    Slot,
};

use crate::{value, Harness, LONG_TTL};

const KEY: Slot = Slot(1);
const OTHER_KEY: Slot = Slot(2);

/// Inserts `value` under `key` for [`LONG_TTL`]; the insert must win.
async fn insert<S: LeaseStore>(store: &S, key: Slot, value: &LeaseValue) -> Lease {
    let revision = store
        .insert_if_not_exists(key, value, LONG_TTL)
        .await
        .expect("insert succeeds")
        .expect("insert into an empty key wins");
    Lease {
        value: value.clone(),
        revision,
    }
}

/// Inserts `value` under `key` with the harness's short TTL; the insert must win.
async fn insert_short<H: Harness>(
    harness: &H,
    store: &H::Store,
    key: Slot,
    value: &LeaseValue,
) -> Lease {
    let revision = store
        .insert_if_not_exists(key, value, harness.short_ttl())
        .await
        .expect("insert succeeds")
        .expect("insert into an empty key wins");
    Lease {
        value: value.clone(),
        revision,
    }
}

async fn get<S: LeaseStore>(store: &S, key: Slot) -> Option<Lease> {
    store.get(key).await.expect("get succeeds")
}

fn at(lease: &Lease, revision: Revision) -> Lease {
    Lease {
        value: lease.value.clone(),
        revision,
    }
}

/// An insert into an empty key wins, and the record reads back.
// covers: St.Contract
pub async fn insert_into_empty<H: Harness>(harness: &H) {
    let store = harness.store().await;
    assert_eq!(get(&store, KEY).await, None, "a fresh store is empty");
    let lease = insert(&store, KEY, &value(1)).await;
    assert!(lease.revision > Revision(0));
    assert_eq!(get(&store, KEY).await, Some(lease));
}

/// A live record is never replaced by an insert, whoever tries.
// covers: St.Contract
pub async fn no_insert_over_a_live_record<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert(&store, KEY, &value(1)).await;
    for attempt in [value(2), value(1)] {
        let refused = store.insert_if_not_exists(KEY, &attempt, LONG_TTL).await;
        assert_eq!(
            refused,
            Ok(None),
            "insert of {attempt:?} over a live record"
        );
    }
    let other = harness.client(&store).await;
    assert_eq!(
        other.insert_if_not_exists(KEY, &value(3), LONG_TTL).await,
        Ok(None)
    );
    assert_eq!(
        get(&store, KEY).await,
        Some(lease),
        "the record is unchanged"
    );
}

/// Once a record expired, an insert wins again, with a higher revision.
// covers: St.Contract
pub async fn insert_after_expiry<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let first = insert_short(harness, &store, KEY, &value(1)).await;
    harness.expire().await;
    let second = insert(&store, KEY, &value(2)).await;
    assert!(
        second.revision > first.revision,
        "{second:?} after {first:?}"
    );
    assert_eq!(get(&store, KEY).await, Some(second));
}

/// A swap of the exact live record wins, with a higher revision; the old lease no longer
/// matches anything.
// covers: St.Contract
pub async fn cas_success_returns_a_higher_revision<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let first = insert(&store, KEY, &value(1)).await;
    let revision = store
        .compare_and_swap(KEY, &first, &value(2), LONG_TTL)
        .await
        .expect("swap succeeds")
        .expect("swap of the live record wins");
    assert!(revision > first.revision);
    let second = Lease {
        value: value(2),
        revision,
    };
    assert_eq!(get(&store, KEY).await, Some(second.clone()));
    // Renewing with the same value also moves the revision.
    let renewed = store
        .compare_and_swap(KEY, &second, &value(2), LONG_TTL)
        .await;
    assert!(
        matches!(renewed, Ok(Some(r)) if r > revision),
        "{renewed:?}"
    );
    let stale = store
        .compare_and_swap(KEY, &first, &value(3), LONG_TTL)
        .await;
    assert_eq!(stale, Ok(None), "a swap against a replaced lease");
}

/// A swap whose expected value differs is refused and changes nothing.
// covers: St.Contract
pub async fn cas_on_value_mismatch<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert(&store, KEY, &value(1)).await;
    let wrong = Lease {
        value: value(2),
        revision: lease.revision,
    };
    assert_eq!(
        store
            .compare_and_swap(KEY, &wrong, &value(3), LONG_TTL)
            .await,
        Ok(None)
    );
    // Same address, other incarnation: a restarted process must not take its old record.
    let restarted = Lease {
        value: LeaseValue {
            address: lease.value.address.clone(),
            incarnation: vvm::lifecycle::Incarnation(lease.value.incarnation.0 + 1),
            stopping: false,
        },
        revision: lease.revision,
    };
    assert_eq!(
        store
            .compare_and_swap(KEY, &restarted, &value(3), LONG_TTL)
            .await,
        Ok(None)
    );
    assert_eq!(get(&store, KEY).await, Some(lease));
}

/// A swap whose expected revision differs is refused and changes nothing.
// covers: St.Contract
pub async fn cas_on_revision_mismatch<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert(&store, KEY, &value(1)).await;
    for revision in [
        Revision(lease.revision.0 + 1),
        Revision(lease.revision.0.saturating_sub(1)),
        Revision(0),
    ] {
        let wrong = at(&lease, revision);
        let refused = store
            .compare_and_swap(KEY, &wrong, &value(2), LONG_TTL)
            .await;
        assert_eq!(refused, Ok(None), "swap expecting revision {revision:?}");
    }
    assert_eq!(get(&store, KEY).await, Some(lease));
}

/// A swap of an expired record is refused and writes nothing.
// covers: St.Contract
pub async fn cas_after_expiry<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert_short(harness, &store, KEY, &value(1)).await;
    harness.expire().await;
    assert_eq!(
        store
            .compare_and_swap(KEY, &lease, &value(1), LONG_TTL)
            .await,
        Ok(None)
    );
    assert_eq!(
        get(&store, KEY).await,
        None,
        "a refused swap writes nothing"
    );
}

/// Deleting the exact live record succeeds once.
// covers: St.Contract
pub async fn cad_success<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert(&store, KEY, &value(1)).await;
    assert_eq!(store.compare_and_delete(KEY, &lease).await, Ok(true));
    assert_eq!(get(&store, KEY).await, None);
    assert_eq!(
        store.compare_and_delete(KEY, &lease).await,
        Ok(false),
        "deleted twice"
    );
}

/// A delete whose expected value or revision differs is refused and changes nothing.
// covers: St.Contract
pub async fn cad_on_mismatch<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert(&store, KEY, &value(1)).await;
    let wrong_value = Lease {
        value: value(2),
        revision: lease.revision,
    };
    let wrong_revision = at(&lease, Revision(lease.revision.0 + 1));
    for wrong in [wrong_value, wrong_revision] {
        assert_eq!(
            store.compare_and_delete(KEY, &wrong).await,
            Ok(false),
            "{wrong:?}"
        );
    }
    assert_eq!(get(&store, KEY).await, Some(lease));
}

/// An expired record cannot be deleted by comparison; the key is free anyway.
// covers: St.Contract
pub async fn cad_after_expiry<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let lease = insert_short(harness, &store, KEY, &value(1)).await;
    harness.expire().await;
    assert_eq!(store.compare_and_delete(KEY, &lease).await, Ok(false));
    assert_eq!(get(&store, KEY).await, None);
    insert(&store, KEY, &value(2)).await;
}

/// `get` returns the value and revision of the last write, also seen by another client.
// covers: St.Contract
pub async fn get_returns_value_and_revision_of_the_last_write<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let other = harness.client(&store).await;
    let first = insert(&store, KEY, &value(1)).await;
    assert_eq!(get(&other, KEY).await, Some(first.clone()));
    let revision = other
        .compare_and_swap(KEY, &first, &value(2), LONG_TTL)
        .await
        .expect("swap succeeds")
        .expect("swap wins");
    let second = Lease {
        value: value(2),
        revision,
    };
    assert_eq!(get(&store, KEY).await, Some(second.clone()));
    assert_eq!(get(&other, KEY).await, Some(second));
}

/// An expired record reads as absent.
// covers: St.Contract
pub async fn get_is_absent_after_expiry<H: Harness>(harness: &H) {
    let store = harness.store().await;
    insert_short(harness, &store, KEY, &value(1)).await;
    harness.expire().await;
    assert_eq!(get(&store, KEY).await, None);
}

/// Revisions of one key strictly increase through insert, swap, delete, re-insert and expiry,
/// so that no old lease ever matches again.
// covers: St.Contract
pub async fn revisions_increase_across_delete_and_reinsert<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let a = value(1);
    let mut seen = vec![insert(&store, KEY, &a).await];
    let revision = store
        .compare_and_swap(KEY, &seen[0], &a, LONG_TTL)
        .await
        .expect("swap succeeds")
        .expect("swap wins");
    seen.push(at(&seen[0], revision));
    assert_eq!(store.compare_and_delete(KEY, &seen[1]).await, Ok(true));
    // The same value again: only the revision tells the records apart.
    seen.push(insert(&store, KEY, &a).await);
    assert_eq!(store.compare_and_delete(KEY, &seen[2]).await, Ok(true));
    seen.push(insert_short(harness, &store, KEY, &a).await);
    harness.expire().await;
    seen.push(insert(&store, KEY, &a).await);

    for pair in seen.windows(2) {
        assert!(
            pair[1].revision > pair[0].revision,
            "{:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    let current = seen.pop().expect("five leases");
    for old in &seen {
        assert_eq!(
            store.compare_and_swap(KEY, old, &value(9), LONG_TTL).await,
            Ok(None),
            "{old:?}"
        );
        assert_eq!(
            store.compare_and_delete(KEY, old).await,
            Ok(false),
            "{old:?}"
        );
    }
    assert_eq!(get(&store, KEY).await, Some(current));
}

/// Writes to one key do not touch another.
// covers: St.Contract
pub async fn different_keys_are_independent<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let one = insert(&store, KEY, &value(1)).await;
    let two = insert(&store, OTHER_KEY, &value(2)).await;
    assert_ne!(one.revision, Revision(0));
    // A lease of one key matches nothing under the other.
    assert_eq!(
        store
            .compare_and_swap(OTHER_KEY, &one, &value(3), LONG_TTL)
            .await,
        Ok(None)
    );
    assert_eq!(store.compare_and_delete(OTHER_KEY, &one).await, Ok(false));
    assert_eq!(store.compare_and_delete(KEY, &one).await, Ok(true));
    assert_eq!(get(&store, KEY).await, None);
    assert_eq!(get(&store, OTHER_KEY).await, Some(two.clone()));
    assert_eq!(
        store
            .insert_if_not_exists(OTHER_KEY, &value(4), LONG_TTL)
            .await,
        Ok(None)
    );
    assert_eq!(get(&store, OTHER_KEY).await, Some(two));
}

/// Contenders racing for one key, spread over this many clients.
const CLIENTS: usize = 4;
/// Insert attempts in the race.
const CONTENDERS: u64 = 1000;

/// 1000 concurrent inserts of different values on one key: exactly one wins, and the record
/// is the winner's.
// covers: St.Contract
pub async fn one_of_1000_concurrent_inserts_wins<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let mut clients = vec![store.clone()];
    while clients.len() < CLIENTS {
        clients.push(harness.client(&store).await);
    }
    let mut race = JoinSet::new();
    for n in 0..CONTENDERS {
        let client = clients[n as usize % CLIENTS].clone();
        race.spawn(async move {
            let value = value(n);
            let outcome = client.insert_if_not_exists(KEY, &value, LONG_TTL).await;
            (value, outcome)
        });
    }
    let mut winners = Vec::new();
    let mut values = HashSet::new();
    while let Some(joined) = race.join_next().await {
        let (value, outcome) = joined.expect("contender task completes");
        assert!(
            values.insert(value.clone()),
            "each contender has its own value"
        );
        match outcome {
            Ok(Some(revision)) => winners.push(Lease { value, revision }),
            Ok(None) => {}
            Err(error) => panic!("insert of {value:?} failed: {error}"),
        }
    }
    assert_eq!(values.len(), CONTENDERS as usize);
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(get(&store, KEY).await.as_ref(), winners.first());
}
