//! The session cases: every [`SessionStore`] keeps session records with the same conditional
//! rules as slot records, and holdings that live exactly as long as their session, in the
//! key space of the slots.

use tokio::task::JoinSet;
use vvm::{
    lifecycle::{Incarnation, Revision},
    session::{SessionId, SessionKey},
    store::{Acquired, Lease, LeaseStore, SessionStore},
    Slot,
};

use crate::{value, Harness, LONG_TTL};

fn key(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

/// Opens session `n` (its value is `value(n)`) with `ttl`; the create must win.
async fn open<S: SessionStore>(store: &S, n: u64, ttl: std::time::Duration) -> Revision {
    store
        .create_session(key(n), &value(n), ttl)
        .await
        .expect("the create succeeds")
        .expect("a fresh key is free")
}

async fn acquired<S: SessionStore>(store: &S, slot: Slot, n: u64) -> Revision {
    match store.acquire(slot, key(n)).await.expect("the acquire runs") {
        Acquired::Written(revision) => revision,
        other => panic!("slot {slot:?} for session {n}: {other:?}"),
    }
}

async fn get<S: LeaseStore>(store: &S, slot: Slot) -> Option<Lease> {
    store.get(slot).await.expect("the read runs")
}

/// A session record is created once, read back, and kept alive at a revision not below its
/// own; a second create under its key is refused.
// covers: St.Sessions
pub async fn session_create_read_and_keep_alive<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    assert_eq!(store.get_session(key(1)).await.expect("read"), None);
    let revision = open(&store, 1, LONG_TTL).await;
    assert_eq!(
        store
            .create_session(key(1), &value(2), LONG_TTL)
            .await
            .expect("runs"),
        None,
        "a live session's key is taken"
    );
    let record = store
        .get_session(key(1))
        .await
        .expect("read")
        .expect("live");
    assert_eq!((record.value, record.revision), (value(1), revision));
    let kept = store
        .keep_alive(key(1), revision, LONG_TTL)
        .await
        .expect("runs")
        .expect("our live session is kept alive");
    assert!(kept >= revision);
    let other = harness.client(&store).await;
    let record = other
        .get_session(key(1))
        .await
        .expect("read")
        .expect("live");
    assert_eq!(record.revision, kept);
}

/// An expired session can no longer be kept alive, and its holdings are gone with it: the slots
/// are free for anyone.
// covers: St.Sessions, St.HoldingsLiveWithTheSession
pub async fn session_expiry_ends_every_holding<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    let revision = open(&store, 1, harness.short_ttl()).await;
    acquired(&store, Slot(1), 1).await;
    acquired(&store, Slot(2), 1).await;
    harness.expire().await;
    assert_eq!(
        store
            .keep_alive(key(1), revision, harness.short_ttl())
            .await
            .expect("runs"),
        None
    );
    assert_eq!(store.get_session(key(1)).await.expect("read"), None);
    let other = harness.client(&store).await;
    for slot in [Slot(1), Slot(2)] {
        assert_eq!(
            get(&other, slot).await,
            None,
            "{slot:?} ended with its session"
        );
        assert!(other
            .insert_if_not_exists(slot, &value(9), LONG_TTL)
            .await
            .expect("runs")
            .is_some());
    }
    assert_eq!(
        store.acquire(Slot(3), key(1)).await.expect("runs"),
        Acquired::SessionGone
    );
}

/// Deleting a session at its revision deletes every holding at once; at another revision it
/// deletes nothing.
// covers: St.Sessions, St.HoldingsLiveWithTheSession
pub async fn session_delete_ends_every_holding<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    let revision = open(&store, 1, LONG_TTL).await;
    acquired(&store, Slot(1), 1).await;
    acquired(&store, Slot(2), 1).await;
    let wrong = Revision(revision.0 + 1_000_000);
    assert!(!store.delete_session(key(1), wrong).await.expect("runs"));
    assert!(get(&store, Slot(1)).await.is_some());
    assert!(store.delete_session(key(1), revision).await.expect("runs"));
    let other = harness.client(&store).await;
    for slot in [Slot(1), Slot(2)] {
        assert_eq!(get(&other, slot).await, None);
    }
    assert_eq!(other.get_session(key(1)).await.expect("read"), None);
    assert_eq!(
        store.acquire(Slot(1), key(1)).await.expect("runs"),
        Acquired::SessionGone
    );
    assert!(!store.delete_session(key(1), revision).await.expect("runs"));
}

/// Holdings and slot records are one key space: a holding refuses inserts and other sessions'
/// acquires, a slot record refuses acquires, and a holding reads as a record with the session's
/// value. A second acquire by the holding session answers the holding as it is. A session never
/// created acquires nothing.
// covers: St.HoldingsAreSlotRecords
pub async fn holdings_and_slot_records_exclude_each_other<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    assert_eq!(
        store.acquire(Slot(1), key(1)).await.expect("runs"),
        Acquired::SessionGone
    );
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    let revision = acquired(&store, Slot(1), 1).await;
    let other = harness.client(&store).await;
    assert_eq!(
        get(&other, Slot(1)).await,
        Some(Lease {
            value: value(1),
            revision
        })
    );
    assert_eq!(
        other.acquire(Slot(1), key(2)).await.expect("runs"),
        Acquired::Held
    );
    assert_eq!(
        store.acquire(Slot(1), key(1)).await.expect("runs"),
        Acquired::Written(revision),
        "idempotent: the holding as it is, nothing written"
    );
    assert_eq!(
        get(&other, Slot(1)).await.map(|lease| lease.revision),
        Some(revision)
    );
    assert_eq!(
        other
            .insert_if_not_exists(Slot(1), &value(3), LONG_TTL)
            .await
            .expect("runs"),
        None
    );
    assert!(other
        .insert_if_not_exists(Slot(2), &value(3), LONG_TTL)
        .await
        .expect("runs")
        .is_some());
    assert_eq!(
        store.acquire(Slot(2), key(1)).await.expect("runs"),
        Acquired::Held
    );
}

/// A holding is released like any record; the session and its other holdings stay, and the
/// slot's next holding has a higher revision (the fencing token rises).
// covers: St.HoldingsAreSlotRecords, St.Sessions
pub async fn a_released_holding_leaves_the_session_alive<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    let session = open(&store, 1, LONG_TTL).await;
    let first = acquired(&store, Slot(1), 1).await;
    acquired(&store, Slot(2), 1).await;
    let lease = get(&store, Slot(1)).await.expect("held");
    assert!(store
        .compare_and_delete(Slot(1), &lease)
        .await
        .expect("runs"));
    assert_eq!(get(&store, Slot(1)).await, None);
    assert!(get(&store, Slot(2)).await.is_some());
    assert!(store
        .keep_alive(key(1), session, LONG_TTL)
        .await
        .expect("runs")
        .is_some());
    open(&store, 2, LONG_TTL).await;
    let second = acquired(&store, Slot(1), 2).await;
    assert!(second > first, "{second:?} > {first:?}");
}

/// Twenty sessions acquire one slot at once, each from its own client: exactly one wins.
// covers: St.HoldingsAreSlotRecords
pub async fn one_of_20_concurrent_acquires_wins<H: Harness>(harness: &H)
where
    H::Store: SessionStore,
{
    let store = harness.store().await;
    let mut tasks = JoinSet::new();
    for n in 1..=20 {
        let client = harness.client(&store).await;
        open(&client, n, LONG_TTL).await;
        tasks.spawn(async move { client.acquire(Slot(1), key(n)).await });
    }
    let mut written = 0;
    while let Some(outcome) = tasks.join_next().await {
        match outcome.expect("the task ran").expect("the acquire runs") {
            Acquired::Written(_) => written += 1,
            Acquired::Held => {}
            Acquired::SessionGone => panic!("every session is live"),
        }
    }
    assert_eq!(written, 1);
}
