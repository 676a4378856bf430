//! The lease logic of the transactional stores (FoundationDB's) beyond the conformance suite:
//! expiry by observation seen from separate processes, unknown commit outcomes, conflicts,
//! timeouts and unreadable records — on the in-memory transactional store, on tokio's paused
//! clock.

use std::time::Duration;

use vvm_core::{Incarnation, Slot};

use vvm_adapters::txkv::{KvFault, MemoryKv, TxError, TxLeaseError, TxLeaseStore, TxOptions};
use vvm_runtime::{Lease, LeaseStore, LeaseValue, StoreError};

const TTL: Duration = Duration::from_secs(10);
const SLOT: Slot = Slot(1);

fn value(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(3),
        stopping: false,
    }
}

fn store() -> TxLeaseStore<MemoryKv> {
    TxLeaseStore::new(MemoryKv::new(), TxOptions::default())
}

async fn pass(duration: Duration) {
    tokio::time::sleep(duration).await;
}

// covers: Tx.Observation
#[tokio::test(start_paused = true)]
async fn a_process_that_first_sees_a_record_late_waits_a_whole_ttl_from_then() {
    let holder = store();
    let contender = holder.other_observer();
    let revision = holder
        .insert_if_not_exists(SLOT, &value("a"), TTL)
        .await
        .unwrap()
        .unwrap();

    pass(TTL * 8 / 10).await;
    // First sighting, 8 s in: the contender starts counting now.
    assert_eq!(
        contender.get(SLOT).await.unwrap().unwrap().revision,
        revision
    );
    pass(TTL * 3 / 10).await;
    // 11 s after the write the writer itself counts it expired; the contender, 3 s after first
    // seeing it, does not.
    assert_eq!(holder.get(SLOT).await.unwrap(), None);
    assert_eq!(
        contender
            .insert_if_not_exists(SLOT, &value("b"), TTL)
            .await
            .unwrap(),
        None
    );
    pass(TTL * 7 / 10).await;
    // A whole TTL after its first sighting, unchanged: expired, and replaced at a higher revision.
    assert_eq!(contender.get(SLOT).await.unwrap(), None);
    let taken = contender
        .insert_if_not_exists(SLOT, &value("b"), TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(taken > revision);
    assert_eq!(holder.get(SLOT).await.unwrap().unwrap().value, value("b"));
}

/// The time left is this process's own count (what a watcher needs to tell a release from an
/// expiry): a whole TTL at a first sighting, running down while the record stays unchanged,
/// none once it is gone.
// covers: Tx.Observation
#[tokio::test(start_paused = true)]
async fn the_time_left_is_counted_from_each_process_s_first_sighting() {
    let holder = store();
    let observer = holder.other_observer();
    assert_eq!(holder.time_left(SLOT).await.unwrap(), None);
    holder
        .insert_if_not_exists(SLOT, &value("a"), TTL)
        .await
        .unwrap()
        .unwrap();
    pass(TTL * 4 / 10).await;
    assert_eq!(holder.time_left(SLOT).await.unwrap(), Some(TTL * 6 / 10));
    // First sighting now: the observer gives it a whole TTL from here.
    assert_eq!(observer.time_left(SLOT).await.unwrap(), Some(TTL));
    pass(TTL * 3 / 10).await;
    assert_eq!(observer.time_left(SLOT).await.unwrap(), Some(TTL * 7 / 10));
    let lease = holder.get(SLOT).await.unwrap().unwrap();
    assert!(holder.compare_and_delete(SLOT, &lease).await.unwrap());
    assert_eq!(observer.time_left(SLOT).await.unwrap(), None);
}

// covers: Tx.Observation
#[tokio::test(start_paused = true)]
async fn a_renewal_restarts_every_observers_wait() {
    let holder = store();
    let contender = holder.other_observer();
    let a = value("a");
    let mut held = Lease {
        value: a.clone(),
        revision: holder
            .insert_if_not_exists(SLOT, &a, TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    assert!(contender.get(SLOT).await.unwrap().is_some());
    // Renewed every 5 s for a minute: the contender never sees it unchanged for a whole TTL.
    for _ in 0..12 {
        pass(TTL / 2).await;
        held.revision = holder
            .compare_and_swap(SLOT, &held, &a, TTL)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            contender
                .insert_if_not_exists(SLOT, &value("b"), TTL)
                .await
                .unwrap(),
            None
        );
    }
    // The holder stops: a whole TTL after the contender first saw the last write, it is free.
    pass(TTL / 2).await;
    assert_eq!(
        contender
            .insert_if_not_exists(SLOT, &value("b"), TTL)
            .await
            .unwrap(),
        None
    );
    pass(TTL / 2).await;
    assert!(contender
        .insert_if_not_exists(SLOT, &value("b"), TTL)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        holder.compare_and_swap(SLOT, &held, &a, TTL).await.unwrap(),
        None
    );
}

// covers: Tx.Transactions
#[tokio::test(start_paused = true)]
async fn an_unknown_commit_outcome_is_unknown_and_never_retried() {
    let store = store();
    let a = value("a");
    store.kv().inject(KvFault::UnknownApplied);
    let outcome = store.insert_if_not_exists(SLOT, &a, TTL).await;
    assert!(outcome.unwrap_err().is_unknown());
    assert_eq!(store.kv().commits(), 1, "no second attempt");
    let written = store.get(SLOT).await.unwrap().unwrap();
    assert_eq!(written.value, a, "the write applied");

    store.kv().inject(KvFault::UnknownNotApplied);
    let outcome = store
        .compare_and_swap(SLOT, &written, &value("b"), TTL)
        .await;
    assert!(outcome.unwrap_err().is_unknown());
    assert_eq!(store.get(SLOT).await.unwrap(), Some(written));
}

// covers: Tx.Transactions
#[tokio::test(start_paused = true)]
async fn conflicts_are_retried_up_to_the_limit_then_fail() {
    let store = TxLeaseStore::new(
        MemoryKv::new(),
        TxOptions::default().retries_max(2).unwrap(),
    );
    for _ in 0..2 {
        store.kv().inject(KvFault::Conflict);
    }
    assert!(store
        .insert_if_not_exists(SLOT, &value("a"), TTL)
        .await
        .unwrap()
        .is_some());
    assert_eq!(store.kv().commits(), 1);

    for _ in 0..3 {
        store.kv().inject(KvFault::Conflict);
    }
    let outcome = store.insert_if_not_exists(Slot(2), &value("a"), TTL).await;
    assert!(
        matches!(
            outcome.as_ref().map_err(|e| e.find::<TxLeaseError>()),
            Err(Some(TxLeaseError::Conflicted {
                attempts: 3,
                last: Some(TxError::Retryable { .. }),
                ..
            }))
        ),
        "{outcome:?}"
    );
    assert_eq!(store.get(Slot(2)).await.unwrap(), None);

    store.kv().inject(KvFault::Fail);
    let outcome = store.insert_if_not_exists(Slot(2), &value("a"), TTL).await;
    assert!(
        matches!(outcome, Err(StoreError::Failed { .. })),
        "{outcome:?}"
    );
}

// covers: Tx.Transactions
#[tokio::test(start_paused = true)]
async fn a_hung_read_fails_and_a_hung_commit_is_unknown_after_the_timeout() {
    let timeout = Duration::from_millis(300);
    let store = TxLeaseStore::new(
        MemoryKv::new(),
        TxOptions::default().timeout(timeout).unwrap(),
    );
    store.kv().inject(KvFault::HangRead);
    let started = tokio::time::Instant::now();
    let outcome = store.insert_if_not_exists(SLOT, &value("a"), TTL).await;
    assert!(
        matches!(outcome, Err(StoreError::Failed { .. })),
        "{outcome:?}"
    );
    assert_eq!(started.elapsed(), timeout);

    store.kv().inject(KvFault::HangCommit);
    let outcome = store.insert_if_not_exists(SLOT, &value("a"), TTL).await;
    assert!(outcome.unwrap_err().is_unknown());
    store.kv().inject(KvFault::FailRead);
    assert!(matches!(
        store.get(SLOT).await,
        Err(StoreError::Failed { .. })
    ));
}

// covers: Tx.Observation
#[tokio::test(start_paused = true)]
async fn an_unreadable_record_is_corrupt_and_never_overwritten_or_expired() {
    let store = store();
    let key = store.key(SLOT);
    assert!(store.kv().put(&key, b"garbage"));
    assert!(matches!(
        store.get(SLOT).await,
        Err(StoreError::Corrupt { slot: 1, .. })
    ));
    pass(TTL * 100).await;
    assert!(matches!(
        store.get(SLOT).await,
        Err(StoreError::Corrupt { slot: 1, .. })
    ));
    assert_eq!(
        store
            .insert_if_not_exists(SLOT, &value("a"), TTL)
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.kv().value(&key), Some(b"garbage".to_vec()));
}

/// A slot's key removed from outside while its holder lives (`fdbcli clear`, a `DELETE` by
/// hand) is judged as the record still there by a candidate — refused, and free only a whole TTL
/// after the candidate first saw it — while its holder can no longer renew it and reads it gone;
/// the next holder's revision is above the removed one. A holder's release of the removed record
/// frees the slot at once.
// covers: Tx.RecordRemoved
#[tokio::test(start_paused = true)]
async fn a_record_removed_from_outside_is_waited_for_a_ttl_and_its_holder_loses_it() {
    let holder = store();
    let candidate = holder.other_observer();
    let first = holder
        .insert_if_not_exists(SLOT, &value("a"), TTL)
        .await
        .unwrap()
        .unwrap();
    let renewed = holder
        .compare_and_swap(
            SLOT,
            &Lease {
                value: value("a"),
                revision: first,
            },
            &value("a"),
            TTL,
        )
        .await
        .unwrap()
        .unwrap();
    let held = Lease {
        value: value("a"),
        revision: renewed,
    };
    pass(TTL / 2).await;
    let mut holders_feed = holder.changed(&[SLOT]);
    assert!(!resolves_within(&mut holders_feed, TTL / 100).await);
    holder.kv().remove(&holder.key(SLOT));
    assert!(
        resolves_within(&mut holders_feed, TTL / 100).await,
        "the holder's feed tells of the removal"
    );
    pass(TTL / 4).await;

    assert_eq!(holder.get(SLOT).await.unwrap(), None, "gone for its holder");
    assert_eq!(
        holder
            .compare_and_swap(SLOT, &held, &value("a"), TTL)
            .await
            .unwrap(),
        None,
        "not renewed"
    );
    // The candidate first sees it now: refused for a whole TTL from here, and its feed waits
    // (it does not wake it again and again).
    assert_eq!(
        candidate
            .insert_if_not_exists(SLOT, &value("b"), TTL)
            .await
            .unwrap(),
        None
    );
    let mut candidates_feed = candidate.changed(&[SLOT]);
    assert!(!resolves_within(&mut candidates_feed, TTL / 2).await);
    drop(candidates_feed);
    pass(TTL / 2 - Duration::from_millis(1)).await;
    assert_eq!(
        candidate
            .insert_if_not_exists(SLOT, &value("b"), TTL)
            .await
            .unwrap(),
        None,
        "a TTL has not passed since the candidate first saw it"
    );
    pass(Duration::from_millis(2)).await;
    let next = candidate
        .insert_if_not_exists(SLOT, &value("b"), TTL)
        .await
        .unwrap()
        .expect("free a TTL after the candidate first saw it");
    assert!(next > renewed, "{next:?} after {renewed:?}");

    // Removed again; this time the holder releases: free at once.
    let taken = Lease {
        value: value("b"),
        revision: next,
    };
    candidate.kv().remove(&candidate.key(SLOT));
    let third = holder.other_observer();
    assert_eq!(
        third
            .insert_if_not_exists(SLOT, &value("c"), TTL)
            .await
            .unwrap(),
        None
    );
    assert!(candidate.compare_and_delete(SLOT, &taken).await.unwrap());
    let last = third
        .insert_if_not_exists(SLOT, &value("c"), TTL)
        .await
        .unwrap()
        .expect("released by its holder: free at once");
    assert!(last > next);
}

// covers: Tx.Sessions
#[test]
fn bad_options_are_refused() {
    assert!(TxOptions::default().timeout(Duration::ZERO).is_err());
    assert!(TxOptions::default().retries_max(101).is_err());
    assert!(TxOptions::default().prefix(vec![b'p'; 257]).is_err());
    assert!(TxOptions::default().retries_max(100).is_ok());
    // No two accepted prefixes share a key: "app1" slot 1 would be "app" slot 11, and
    // "asession/00000000000000ff-" slot 3 would be "a"'s session record (ff, 3).
    for refused in ["app1", "vvm/7", "asession/00000000000000ff-", "session/"] {
        assert!(
            TxOptions::default().prefix(refused).is_err(),
            "{refused:?} accepted"
        );
    }
    for accepted in ["app", "app1/", "vvm/slot/", "sessions-"] {
        assert!(
            TxOptions::default().prefix(accepted).is_ok(),
            "{accepted:?} refused"
        );
    }
}

/// Whether `feed` resolves within `limit` (on the paused clock: as soon as nothing else can
/// happen); it stays usable when it did not.
async fn resolves_within(feed: &mut vvm_runtime::SlotChange, limit: Duration) -> bool {
    tokio::time::timeout(limit, feed).await.is_ok()
}

const QUIET: Duration = Duration::from_secs(1);

/// A holder with the slot and a waiter whose insert was refused (so it has seen the record).
async fn held_and_refused() -> (TxLeaseStore<MemoryKv>, TxLeaseStore<MemoryKv>, Lease) {
    let holder = store();
    let waiter = holder.other_observer();
    let a = value("a");
    let held = Lease {
        value: a.clone(),
        revision: holder
            .insert_if_not_exists(SLOT, &a, TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    assert_eq!(
        waiter
            .insert_if_not_exists(SLOT, &value("w"), TTL)
            .await
            .unwrap(),
        None
    );
    (holder, waiter, held)
}

fn other_holder() -> LeaseValue {
    LeaseValue {
        address: "b".into(),
        incarnation: Incarnation(4),
        stopping: false,
    }
}

// covers: Tx.Feed
#[tokio::test(start_paused = true)]
async fn the_feed_wakes_on_a_release_and_on_another_holder_not_on_renewals() {
    let (holder, waiter, mut held) = held_and_refused().await;
    let mut feed = waiter.changed(&[SLOT]);
    assert!(!resolves_within(&mut feed, QUIET).await);
    // Another slot taken and released.
    let other = Lease {
        value: other_holder(),
        revision: holder
            .insert_if_not_exists(Slot(2), &other_holder(), TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    assert!(holder.compare_and_delete(Slot(2), &other).await.unwrap());
    assert!(
        !resolves_within(&mut feed, QUIET).await,
        "a change of another slot does not wake"
    );
    for _ in 0..5 {
        held.revision = holder
            .compare_and_swap(SLOT, &held, &held.value.clone(), TTL)
            .await
            .unwrap()
            .unwrap();
        assert!(
            !resolves_within(&mut feed, QUIET).await,
            "a renewal by the same holder does not wake"
        );
    }
    // Each renewal fired the watch, which was set again: one watch, no more.
    assert_eq!(holder.kv().watches(), 1);
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    assert!(resolves_within(&mut feed, QUIET).await, "a release wakes");
    drop(feed);
    assert_eq!(holder.kv().watches(), 0, "a resolved feed keeps no watch");

    let revision = holder
        .insert_if_not_exists(SLOT, &held.value, TTL)
        .await
        .unwrap()
        .unwrap();
    held.revision = revision;
    waiter.get(SLOT).await.unwrap();
    let mut feed = waiter.changed(&[SLOT]);
    assert!(!resolves_within(&mut feed, QUIET).await);
    holder
        .compare_and_swap(SLOT, &held, &other_holder(), TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(
        resolves_within(&mut feed, QUIET).await,
        "another holder wakes"
    );
}

// covers: Tx.Feed
#[tokio::test(start_paused = true)]
async fn a_change_between_the_call_and_the_first_poll_is_not_missed() {
    let (holder, waiter, held) = held_and_refused().await;
    let feed = waiter.changed(&[SLOT]);
    // Released and taken by another holder before the feed first runs: the record is live
    // again, but not the one the waiter was refused by.
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    let taker = holder.other_observer();
    taker
        .insert_if_not_exists(SLOT, &other_holder(), TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(tokio::time::timeout(QUIET, feed).await.is_ok());

    // Released and not taken again: the slot is free.
    let (holder, waiter, held) = held_and_refused().await;
    let feed = waiter.changed(&[SLOT]);
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    assert!(tokio::time::timeout(QUIET, feed).await.is_ok());
}

// covers: Tx.Feed
#[tokio::test(start_paused = true)]
async fn a_dropped_feed_cancels_its_watches() {
    let (holder, waiter, _held) = held_and_refused().await;
    let mut feeds: Vec<_> = (0..4).map(|_| waiter.changed(&[SLOT])).collect();
    for feed in &mut feeds {
        assert!(!resolves_within(feed, QUIET).await);
    }
    assert_eq!(holder.kv().watches(), 4);
    drop(feeds);
    assert_eq!(holder.kv().watches(), 0);
}

// covers: Tx.Feed
#[tokio::test(start_paused = true)]
async fn a_feed_that_cannot_tell_wakes_after_a_pause() {
    // The store drops its watches (FoundationDB: the watch fails).
    let (holder, waiter, _held) = held_and_refused().await;
    let mut feed = waiter.changed(&[SLOT]);
    assert!(!resolves_within(&mut feed, QUIET).await);
    holder.kv().cancel_watches();
    assert!(resolves_within(&mut feed, QUIET).await);

    // A read of the feed fails: it wakes, but not before the pause.
    holder.kv().inject(KvFault::FailRead);
    let started = tokio::time::Instant::now();
    let feed = waiter.changed(&[SLOT]);
    assert!(tokio::time::timeout(QUIET, feed).await.is_ok());
    assert!(started.elapsed() >= vvm_adapters::txkv::FEED_UNKNOWN_PAUSE);

    // A read that hangs is bounded by the operation timeout.
    holder.kv().inject(KvFault::HangRead);
    let feed = waiter.changed(&[SLOT]);
    assert!(
        tokio::time::timeout(TxOptions::default().operation_timeout() * 2, feed)
            .await
            .is_ok()
    );
}
