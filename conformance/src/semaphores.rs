//! The semaphore cases: every [`SemaphoreStore`] runs the core's operations in one transaction
//! per call, judges parties by their sessions, and wakes waiters and watches through its feed;
//! the runtime's [`Coordination`] waits, times out and watches on it.

use std::time::Duration;

use vvm::coordination::{Description, RequestId, SemaphoreName, Status};
use vvm::{
    coordination::{CoordinationError, SemaphoreError, WatchKind},
    lifecycle::Incarnation,
    session::{SessionId, SessionKey},
    store::{Applied, SemaphoreRequest, SemaphoreStore, SemaphoreStoreError, SessionStore},
    testing::RecordingKiller,
    AcquireOptions, Coordination, KillerThread, LeaseConfig, SessionHandle,
};

use crate::{value, Harness, LONG_TTL};

fn key(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

fn name(text: &str) -> SemaphoreName {
    SemaphoreName::new(text).expect("a valid name")
}

/// Opens session `n` with `ttl`; the create must win.
async fn open<S: SemaphoreStore>(store: &S, n: u64, ttl: Duration) -> vvm::lifecycle::Revision {
    store
        .create_session(key(n), &value(n), ttl)
        .await
        .expect("the create runs")
        .expect("a fresh key is free")
}

async fn run<S: SemaphoreStore>(
    store: &S,
    n: u64,
    semaphore: &str,
    request: SemaphoreRequest,
) -> Result<Applied, SemaphoreStoreError> {
    store.semaphore(key(n), &name(semaphore), request).await
}

/// An acquire made now.
fn acquire(count: u64, data: &[u8], timeout_ms: u64) -> SemaphoreRequest {
    acquire_as(vvm::store::next_request_id(), count, data, timeout_ms)
}

/// An acquire numbered `request`: made earlier, or sent again.
fn acquire_as(request: RequestId, count: u64, data: &[u8], timeout_ms: u64) -> SemaphoreRequest {
    SemaphoreRequest::Acquire {
        request,
        count,
        data: data.to_vec(),
        timeout_ms,
        ephemeral: false,
    }
}

fn create(limit: u64) -> SemaphoreRequest {
    SemaphoreRequest::Create {
        limit,
        data: Vec::new(),
    }
}

fn status(applied: &Applied) -> Status {
    applied.outcome.as_ref().expect("an outcome").status.clone()
}

async fn describe<S: SemaphoreStore>(store: &S, n: u64, semaphore: &str) -> Description {
    run(store, n, semaphore, SemaphoreRequest::Describe)
        .await
        .expect("described")
        .description
        .expect("the semaphore exists")
}

fn owners(description: &Description) -> Vec<SessionKey> {
    description.owners.iter().map(|o| o.session).collect()
}

fn waiters(description: &Description) -> Vec<SessionKey> {
    description.waiters.iter().map(|w| w.session).collect()
}

/// Waiters are granted in arrival order, each when the units it waits for are free, and
/// every client of the store sees the same queue.
// covers: Sem.Store.Transaction, Sem.Fifo
pub async fn semaphore_queue_is_fifo<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let other = harness.client(&store).await;
    for n in 1..=4 {
        open(&store, n, LONG_TTL).await;
    }
    run(&store, 1, "lock", create(2)).await.expect("created");
    let a = run(&store, 1, "lock", acquire(2, b"a", 1_000))
        .await
        .expect("runs");
    assert!(matches!(status(&a), Status::Granted { .. }), "{a:?}");
    for n in [2, 3, 4] {
        let queued = run(&other, n, "lock", acquire(1 + n % 2, b"w", 60_000))
            .await
            .expect("runs");
        assert!(
            matches!(status(&queued), Status::Queued { .. }),
            "{queued:?}"
        );
    }
    assert_eq!(
        waiters(&describe(&store, 1, "lock").await),
        [key(2), key(3), key(4)]
    );
    // 2 units free: session 2 (1 unit) and session 3 (2 units) in order; 3 does not fit yet.
    run(&store, 1, "lock", SemaphoreRequest::release())
        .await
        .expect("released");
    let now = describe(&other, 2, "lock").await;
    assert_eq!(owners(&now), [key(2)], "the head is granted");
    assert_eq!(
        waiters(&now),
        [key(3), key(4)],
        "a head that does not fit blocks the rest"
    );
    run(&other, 2, "lock", SemaphoreRequest::release())
        .await
        .expect("released");
    let now = describe(&store, 3, "lock").await;
    assert_eq!(owners(&now), [key(3)]);
    assert_eq!(waiters(&now), [key(4)]);
    let tokens: Vec<u64> = now.owners.iter().map(|o| o.token.0).collect();
    assert_eq!(tokens, [3], "the third grant carries token 3");
}

/// A second acquire of a session replaces its request in place: same order id, same token.
// covers: Sem.Store.Transaction, Sem.ReplaceInPlace
pub async fn semaphore_acquire_again_replaces_in_place<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 1, "pool", create(3)).await.expect("created");
    let first = status(
        &run(&store, 1, "pool", acquire(3, b"one", 1_000))
            .await
            .expect("runs"),
    );
    let again = status(
        &run(&store, 1, "pool", acquire(2, b"two", 1_000))
            .await
            .expect("runs"),
    );
    assert_eq!(first, again, "same order id and token");
    let queued = status(
        &run(&store, 2, "pool", acquire(2, b"x", 60_000))
            .await
            .expect("runs"),
    );
    let requeued = status(
        &run(&store, 2, "pool", acquire(2, b"y", 60_000))
            .await
            .expect("runs"),
    );
    assert_eq!(queued, requeued, "a waiter keeps its place");
    let now = describe(&store, 1, "pool").await;
    assert_eq!((now.count, now.owners[0].data.as_slice()), (2, &b"two"[..]));
    assert_eq!(now.waiters[0].data, b"y");
    let raised = run(&store, 1, "pool", acquire(3, b"two", 1_000)).await;
    assert!(
        matches!(
            raised,
            Err(SemaphoreStoreError::Refused(
                SemaphoreError::OwnerCountRaised { .. }
            ))
        ),
        "{raised:?}"
    );
}

/// An acquire with timeout 0 is granted now or not at all, and never queues.
// covers: Sem.Store.Transaction, Sem.TryOnce
pub async fn semaphore_try_once_never_queues<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 1, "lock", create(1)).await.expect("created");
    let free = run(&store, 2, "lock", acquire(1, b"", 0))
        .await
        .expect("runs");
    assert!(matches!(status(&free), Status::Granted { .. }));
    let taken = run(&store, 1, "lock", acquire(1, b"", 0))
        .await
        .expect("runs");
    assert_eq!(status(&taken), Status::NotGranted);
    assert!(describe(&store, 1, "lock").await.waiters.is_empty());
}

/// A call the store applies after the session moved on (its caller gave up on the answer) acts
/// on nothing the session asked since: a late release leaves the later grant, a late acquire
/// is refused, a late timeout leaves the request that replaced it; nothing is written.
// covers: Sem.RequestIds
pub async fn semaphore_late_calls_act_on_nothing_newer<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 1, "lock", create(1)).await.expect("created");
    let late_release = vvm::store::next_request_id();
    let late_acquire = vvm::store::next_request_id();
    let granted = run(&store, 1, "lock", acquire(1, b"now", 60_000))
        .await
        .expect("runs");
    assert!(
        matches!(status(&granted), Status::Granted { .. }),
        "{granted:?}"
    );
    let queued_by = vvm::store::next_request_id();
    run(&store, 2, "lock", acquire_as(queued_by, 1, b"w", 60_000))
        .await
        .expect("queued");
    run(&store, 2, "lock", acquire(1, b"w", 60_000))
        .await
        .expect("replaced in place");
    let before = describe(&store, 1, "lock").await;

    let released = run(
        &store,
        1,
        "lock",
        SemaphoreRequest::Release {
            request: late_release,
        },
    )
    .await
    .expect("runs");
    assert_eq!(status(&released), Status::Superseded);
    let refused = run(&store, 1, "lock", acquire_as(late_acquire, 1, b"old", 0)).await;
    assert!(
        matches!(
            refused,
            Err(SemaphoreStoreError::Refused(
                SemaphoreError::StaleRequest { .. }
            ))
        ),
        "{refused:?}"
    );
    let timed_out = run(
        &store,
        2,
        "lock",
        SemaphoreRequest::CancelWaiterTimeout { request: queued_by },
    )
    .await
    .expect("runs");
    assert_eq!(status(&timed_out), Status::Superseded);
    assert_eq!(describe(&store, 1, "lock").await, before, "nothing written");

    // A release made now ends the grant and grants the waiter.
    let released = run(&store, 1, "lock", SemaphoreRequest::release())
        .await
        .expect("runs");
    assert!(matches!(status(&released), Status::Released { .. }));
    assert_eq!(owners(&describe(&store, 2, "lock").await), [key(2)]);
}

/// An ephemeral semaphore is made by its first acquire and deleted with its last release;
/// made again, its tokens go on.
// covers: Sem.Store.Ephemeral
pub async fn semaphore_ephemeral_lives_with_its_parties<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, LONG_TTL).await;
    let ephemeral = SemaphoreRequest::Acquire {
        request: vvm::store::next_request_id(),
        count: 1,
        data: b"me".to_vec(),
        timeout_ms: 0,
        ephemeral: true,
    };
    let missing = run(&store, 1, "tmp", acquire(1, b"", 0)).await;
    assert_eq!(missing, Err(SemaphoreStoreError::NotFound(name("tmp"))));
    let made = run(&store, 1, "tmp", ephemeral.clone())
        .await
        .expect("made");
    let description = made.description.expect("it exists");
    assert!(description.ephemeral);
    assert_eq!(description.limit, u64::MAX);
    let released = run(&store, 1, "tmp", SemaphoreRequest::release())
        .await
        .expect("runs");
    assert!(matches!(status(&released), Status::Released { .. }));
    assert_eq!(released.description, None, "deleted with its last party");
    assert_eq!(
        run(&store, 1, "tmp", SemaphoreRequest::Describe).await,
        Err(SemaphoreStoreError::NotFound(name("tmp")))
    );
    let again = run(&store, 1, "tmp", ephemeral).await.expect("made again");
    assert!(
        matches!(status(&again), Status::Granted { token, .. } if token.0 == 2),
        "tokens go on across re-creation: {again:?}"
    );
}

/// A delete is refused while there are parties unless forced; forced, it ends them all, but
/// the owners' units stay counted until they leave: the semaphore is being deleted, refuses
/// acquires and the creation of its name, and goes with its last owner's release.
// covers: Sem.Store.Transaction, Sem.Delete, Sem.ForcedDelete
pub async fn semaphore_delete_is_refused_while_busy_unless_forced<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let other = harness.client(&store).await;
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 1, "lock", create(1)).await.expect("created");
    run(&store, 1, "lock", acquire(1, b"", 0))
        .await
        .expect("granted");
    run(&store, 2, "lock", acquire(1, b"", 60_000))
        .await
        .expect("queued");
    let busy = run(&store, 2, "lock", SemaphoreRequest::Delete { force: false }).await;
    assert_eq!(
        busy,
        Err(SemaphoreStoreError::Refused(SemaphoreError::Busy {
            owners: 1,
            waiters: 1
        }))
    );
    let deleted = run(&store, 2, "lock", SemaphoreRequest::Delete { force: true })
        .await
        .expect("forced");
    assert!(
        matches!(status(&deleted), Status::Deleted { ref owners, ref waiters } if owners.len() == 1 && waiters.len() == 1)
    );
    let left = describe(&other, 2, "lock").await;
    assert!(left.deleting, "being deleted: {left:?}");
    assert_eq!((owners(&left), waiters(&left)), (vec![key(1)], vec![]));
    assert_eq!(left.count, 1, "the former owner's unit stays counted");
    let being_deleted = Err(SemaphoreStoreError::Refused(SemaphoreError::BeingDeleted {
        name: name("lock"),
        owners: 1,
    }));
    assert_eq!(
        run(&other, 2, "lock", acquire(1, b"", 0)).await,
        being_deleted
    );
    assert_eq!(run(&other, 2, "lock", create(1)).await, being_deleted);
    let released = run(&store, 1, "lock", SemaphoreRequest::release())
        .await
        .expect("runs");
    assert!(matches!(status(&released), Status::Released { .. }));
    assert_eq!(released.description, None, "gone with its last owner");
    assert_eq!(
        run(&other, 1, "lock", SemaphoreRequest::Describe).await,
        Err(SemaphoreStoreError::NotFound(name("lock")))
    );
    run(&other, 2, "lock", create(1))
        .await
        .expect("created again");
    let again = run(&store, 2, "lock", acquire(1, b"", 0))
        .await
        .expect("runs");
    assert!(
        matches!(status(&again), Status::Granted { token, .. } if token.0 == 2),
        "tokens go on across re-creation: {again:?}"
    );
}

/// A semaphore being deleted also goes when its last owners' sessions end: one by the
/// deletion of its session record (at once), the last by its expiry (removed by the next
/// transaction, which then finds the name free).
// covers: Sem.ForcedDelete, Sem.Store.EagerExpiry, Sem.Store.LazyExpiry
pub async fn semaphore_being_deleted_goes_when_its_owners_sessions_end<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, harness.short_ttl()).await;
    open(&store, 2, LONG_TTL).await;
    let revision = open(&store, 3, LONG_TTL).await;
    run(&store, 2, "lock", create(2)).await.expect("created");
    for n in [1, 3] {
        run(&store, n, "lock", acquire(1, b"", 0))
            .await
            .expect("granted");
    }
    run(&store, 2, "lock", SemaphoreRequest::Delete { force: true })
        .await
        .expect("forced");
    assert!(store.delete_session(key(3), revision).await.expect("runs"));
    let left = describe(&store, 2, "lock").await;
    assert!(left.deleting);
    assert_eq!(owners(&left), [key(1)], "the deleted session left at once");
    harness.expire().await;
    let other = harness.client(&store).await;
    wait_out_ended_owner(harness, &other, 2, "lock").await;
    let created = run(&other, 2, "lock", create(1)).await.expect("runs");
    assert_eq!(created.expired, [key(1)]);
    let description = created.description.expect("created");
    assert!(!description.deleting && description.owners.is_empty());
}

/// A grant of a semaphore deleted by force ends at once for its holder, whose unit stays
/// counted until it releases; a queued acquire ends as for a deleted semaphore; an owners'
/// watch sees the semaphore being deleted, then gone.
// covers: Sem.ForcedDelete, Sem.ServeLoss, Sem.Store.Watch
pub async fn coordination_forced_delete_ends_grants_and_keeps_their_units<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let a = coordination(harness, store.clone(), 1).await;
    let b = coordination(harness, harness.client(&store).await, 2).await;
    a.create("lock", 1, Vec::new()).await.expect("created");
    let grant = a
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let queued = tokio::spawn(async move {
        let acquired = b.acquire("lock", AcquireOptions::new(1)).await;
        (b, acquired.map(|grant| grant.is_some()))
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut members = a.watch("lock", WatchKind::OWNERS).expect("a valid name");
    assert!(!members.next().await.expect("now").deleting);
    a.delete("lock", true).await.expect("forced");
    // The owner entry stays (its unit is counted), yet it owns no more: a change of the owners.
    let snapshot = tokio::time::timeout(Duration::from_secs(10), members.next())
        .await
        .expect("the watch sees the delete")
        .expect("a snapshot");
    assert!(
        snapshot.deleting && snapshot.owners.len() == 1,
        "{snapshot:?}"
    );
    let end = tokio::time::timeout(Duration::from_secs(10), grant.ended())
        .await
        .expect("the holder learns its grant ended");
    assert_eq!(end, vvm::coordination::GrantEnd::Ended);
    let (b, acquired) = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter learns")
        .expect("the task ran");
    assert!(
        matches!(acquired, Err(CoordinationError::NotFound(_))),
        "{acquired:?}"
    );
    let refused = b.create("lock", 1, Vec::new()).await;
    assert!(
        matches!(
            refused,
            Err(CoordinationError::Refused(SemaphoreError::BeingDeleted {
                owners: 1,
                ..
            }))
        ),
        "{refused:?}"
    );
    assert!(grant.release().await.expect("runs"), "still held until now");
    let gone = tokio::time::timeout(Duration::from_secs(10), members.next())
        .await
        .expect("the watch sees the deletion");
    assert!(
        matches!(gone, Err(CoordinationError::NotFound(_))),
        "{gone:?}"
    );
    b.create("lock", 1, Vec::new())
        .await
        .expect("free once the holder released");
}

/// On a store that waits out an ended owner ([`Harness::waits_out_ended_owners`]): the first
/// look of `store` (by session `n`) at `name` after the owner's session ended still counts the
/// owner, says it is waited for at most the short TTL, and removes nothing; then that TTL
/// passes. Elsewhere nothing.
async fn wait_out_ended_owner<H: Harness>(harness: &H, store: &H::Store, n: u64, name: &str)
where
    H::Store: SemaphoreStore,
{
    if !harness.waits_out_ended_owners() {
        return;
    }
    let first = run(store, n, name, SemaphoreRequest::Describe)
        .await
        .expect("runs");
    assert!(first.expired.is_empty(), "{first:?}");
    let left = first.parties_expire_in.expect("the owner is waited out");
    assert!(left <= harness.short_ttl(), "{left:?}");
    harness.expire().await;
}

/// An owner whose session expired is removed by the next operation on the semaphore, which
/// grants the waiter behind it; before that, every answer says when the owner's session
/// expires.
// covers: Sem.Store.LazyExpiry, Sem.Store.ExpiryHint
pub async fn semaphore_expired_session_releases_and_grants_the_next<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, harness.short_ttl()).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 2, "lock", create(1)).await.expect("created");
    run(&store, 1, "lock", acquire(1, b"", 0))
        .await
        .expect("granted");
    let queued = run(&store, 2, "lock", acquire(1, b"", 60_000_000))
        .await
        .expect("queued");
    let hint = queued
        .parties_expire_in
        .expect("the owner's session has an expiry");
    assert!(hint <= harness.short_ttl(), "{hint:?}");
    harness.expire().await;
    let other = harness.client(&store).await;
    wait_out_ended_owner(harness, &other, 2, "lock").await;
    let after = run(&other, 2, "lock", SemaphoreRequest::Describe)
        .await
        .expect("runs");
    assert_eq!(after.expired, [key(1)]);
    let description = after.description.expect("exists");
    assert_eq!(owners(&description), [key(2)], "the waiter was granted");
    assert!(description.waiters.is_empty());
}

/// Deleting a session removes its parties at once, granting the waiters behind them.
// covers: Sem.Store.EagerExpiry
pub async fn semaphore_deleted_session_releases_at_once<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let revision = open(&store, 1, LONG_TTL).await;
    open(&store, 2, LONG_TTL).await;
    run(&store, 2, "lock", create(1)).await.expect("created");
    run(&store, 1, "lock", acquire(1, b"", 0))
        .await
        .expect("granted");
    run(&store, 2, "lock", acquire(1, b"", 60_000))
        .await
        .expect("queued");
    let change = store.semaphore_changed(&name("lock"));
    assert!(store.delete_session(key(1), revision).await.expect("runs"));
    tokio::time::timeout(Duration::from_secs(5), change)
        .await
        .expect("the delete woke the feed");
    let after = run(&store, 2, "lock", SemaphoreRequest::Describe)
        .await
        .expect("runs");
    assert!(
        after.expired.is_empty(),
        "removed by the delete, not lazily"
    );
    assert_eq!(owners(&after.description.expect("exists")), [key(2)]);
}

/// Every refusal is typed and writes nothing: an unknown semaphore, a count of 0 or above
/// the limit, oversized data, a taken name, a session that is not live.
// covers: Sem.Store.TypedErrors, Sem.Store.SessionChecked
pub async fn semaphore_refusals_are_typed_and_write_nothing<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    open(&store, 1, LONG_TTL).await;
    open(&store, 2, harness.short_ttl()).await;
    let missing = run(&store, 1, "none", acquire(1, b"", 0)).await;
    assert_eq!(missing, Err(SemaphoreStoreError::NotFound(name("none"))));
    let missing = run(
        &store,
        1,
        "none",
        SemaphoreRequest::UpdateData { data: vec![1] },
    )
    .await;
    assert_eq!(missing, Err(SemaphoreStoreError::NotFound(name("none"))));
    run(&store, 1, "lock", create(2)).await.expect("created");
    let before = describe(&store, 1, "lock").await;
    for count in [0, 3] {
        let refused = run(&store, 1, "lock", acquire(count, b"", 0)).await;
        assert_eq!(
            refused,
            Err(SemaphoreStoreError::Refused(
                SemaphoreError::CountOutOfRange { count, limit: 2 }
            ))
        );
    }
    let big = vec![0; vvm::coordination::PARTY_DATA_BYTES_MAX + 1];
    let refused = run(&store, 1, "lock", acquire(1, &big, 0)).await;
    assert!(matches!(
        refused,
        Err(SemaphoreStoreError::Refused(
            SemaphoreError::DataTooLarge { .. }
        ))
    ));
    let big = vec![0; vvm::coordination::DATA_BYTES_MAX + 1];
    let refused = run(
        &store,
        1,
        "lock",
        SemaphoreRequest::UpdateData { data: big },
    )
    .await;
    assert!(matches!(
        refused,
        Err(SemaphoreStoreError::Refused(
            SemaphoreError::DataTooLarge { .. }
        ))
    ));
    let taken = run(&store, 1, "lock", create(5)).await;
    assert_eq!(
        taken,
        Err(SemaphoreStoreError::Refused(SemaphoreError::AlreadyExists(
            name("lock")
        )))
    );
    let zero = run(&store, 1, "other", create(0)).await;
    assert_eq!(
        zero,
        Err(SemaphoreStoreError::Refused(SemaphoreError::LimitZero))
    );
    harness.expire().await;
    let gone = run(&store, 2, "lock", acquire(1, b"", 0)).await;
    assert_eq!(gone, Err(SemaphoreStoreError::SessionGone(key(2))));
    let never = run(
        &store,
        9,
        "lock",
        SemaphoreRequest::UpdateData { data: vec![7] },
    )
    .await;
    assert_eq!(never, Err(SemaphoreStoreError::SessionGone(key(9))));
    assert_eq!(
        describe(&store, 1, "lock").await,
        before,
        "nothing was written"
    );
    assert_eq!(
        run(&store, 1, "other", SemaphoreRequest::Describe).await,
        Err(SemaphoreStoreError::NotFound(name("other")))
    );
}

/// The feed of a semaphore resolves on a write by another client after the call, and not
/// on a write to another semaphore.
// covers: Sem.Store.Feed
pub async fn semaphore_feed_wakes_on_a_write<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let other = harness.client(&store).await;
    open(&store, 1, LONG_TTL).await;
    run(&store, 1, "a", create(1)).await.expect("created");
    run(&store, 1, "b", create(1)).await.expect("created");
    let mut change = store.semaphore_changed(&name("a"));
    run(
        &other,
        1,
        "b",
        SemaphoreRequest::UpdateData { data: vec![1] },
    )
    .await
    .expect("runs");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut change)
            .await
            .is_err(),
        "a write to another semaphore does not wake it"
    );
    run(
        &other,
        1,
        "a",
        SemaphoreRequest::UpdateData { data: vec![1] },
    )
    .await
    .expect("runs");
    tokio::time::timeout(Duration::from_secs(5), change)
        .await
        .expect("the write woke the feed");
}

async fn coordination<H: Harness>(harness: &H, store: H::Store, n: u64) -> Coordination<H::Store>
where
    H::Store: SemaphoreStore,
{
    let killer = KillerThread::new(RecordingKiller::new());
    let lease = LeaseConfig::new(harness.lease()).expect("a valid lease");
    let lease = match harness.store_timeout() {
        Some(timeout) => lease.with_store_timeout(timeout).expect("a valid timeout"),
        None => lease,
    };
    let session = SessionHandle::open(store, lease, value(n), &killer)
        .await
        .expect("the session opens");
    Coordination::new(session)
}

/// A queued acquire waits for its grant and gets it when the owner releases, woken by the
/// feed; a queued acquire whose timeout passes leaves the queue.
// covers: Sem.Store.Wait, Sem.Store.Timeout
pub async fn coordination_queued_acquire_waits_for_its_grant<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let a = coordination(harness, store.clone(), 1).await;
    let b = coordination(harness, harness.client(&store).await, 2).await;
    a.create("lock", 1, Vec::new()).await.expect("created");
    let held = a
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let timed_out = b
        .acquire(
            "lock",
            AcquireOptions::new(1).timeout(Duration::from_millis(200)),
        )
        .await
        .expect("runs");
    assert!(timed_out.is_none(), "the timeout passed");
    assert!(
        a.describe("lock").await.expect("runs").waiters.is_empty(),
        "it left the queue"
    );
    let waiting = tokio::spawn(async move {
        let grant = b
            .acquire("lock", AcquireOptions::new(1).data(b"b".to_vec()))
            .await
            .expect("runs")
            .expect("granted");
        let token = grant.token();
        grant.release().await.expect("released");
        token
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let first = held.token();
    assert!(held.release().await.expect("runs"));
    let token = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted after the release")
        .expect("the task ran");
    assert!(token > first, "tokens rise with every grant");
}

/// A limit raised under an owner grants the queued acquire at once (it returns its grant); a
/// limit below the units in use is refused and changes nothing; an unknown name is not found.
// covers: Sem.SetLimit, Sem.Store.Wait
pub async fn coordination_set_limit_grants_waiters_and_never_goes_below_use<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let a = coordination(harness, store.clone(), 1).await;
    let b = coordination(harness, harness.client(&store).await, 2).await;
    a.create("lock", 1, Vec::new()).await.expect("created");
    let held = a
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let waiting = tokio::spawn(async move {
        b.acquire("lock", AcquireOptions::new(1))
            .await
            .expect("runs")
            .expect("granted")
    });
    // Queued behind the owner first.
    let queued = async {
        while a.describe("lock").await.expect("runs").waiters.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("queued");
    let raised = a.set_limit("lock", 2).await.expect("raised");
    assert_eq!(
        raised,
        vvm::coordination::LimitSet {
            previous: 1,
            granted: 1
        }
    );
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted by the raise, while the first owner holds")
        .expect("the task ran");
    assert!(granted.token() > held.token(), "the next token");
    match a.set_limit("lock", 1).await {
        Err(CoordinationError::Refused(SemaphoreError::LimitBelowUse {
            in_use: 2,
            wanted: 1,
        })) => {}
        other => panic!("a limit below the units in use: {other:?}"),
    }
    let described = a.describe("lock").await.expect("runs");
    assert_eq!((described.limit, described.count), (2, 2));
    assert!(matches!(
        a.set_limit("missing", 2).await,
        Err(CoordinationError::NotFound(_))
    ));
    assert!(granted.release().await.expect("runs"));
    assert!(held.release().await.expect("runs"));
}

/// A watch answers the state now, then the latest state after changes: a slow reader skips
/// the snapshots in between but ends at the last one, and then waits.
// covers: Sem.Store.Watch
pub async fn coordination_watch_ends_at_the_latest_state<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let writer = coordination(harness, store.clone(), 1).await;
    let reader = coordination(harness, harness.client(&store).await, 2).await;
    writer
        .create("config", 1, b"v0".to_vec())
        .await
        .expect("created");
    let mut watch = reader
        .watch("config", WatchKind::DATA)
        .expect("a valid name");
    assert_eq!(watch.next().await.expect("now").data, b"v0");
    for version in 1..=5 {
        writer
            .update_data("config", format!("v{version}").into_bytes())
            .await
            .expect("updated");
    }
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a change")
        .expect("a snapshot");
    assert_eq!(next.data, b"v5", "coalesced to the latest state");
    let grant = writer
        .acquire("config", AcquireOptions::new(1))
        .await
        .expect("runs");
    assert!(grant.is_some());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), watch.next())
            .await
            .is_err(),
        "owners changed, data did not: no snapshot"
    );
    writer
        .update_data("config", b"v6".to_vec())
        .await
        .expect("updated");
    let next = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a change")
        .expect("a snapshot");
    assert_eq!(next.data, b"v6");
    drop(grant);
}

/// The runtime's errors are typed: an invalid name, an unknown semaphore, a second acquire
/// through the same handle.
// covers: Sem.Store.TypedErrors
pub async fn coordination_errors_are_typed<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    let store = harness.store().await;
    let a = coordination(harness, store, 1).await;
    assert!(matches!(
        a.create("", 1, Vec::new()).await,
        Err(CoordinationError::InvalidName(_))
    ));
    assert!(matches!(
        a.create("bad\nname", 1, Vec::new()).await,
        Err(CoordinationError::InvalidName(_))
    ));
    assert!(matches!(
        a.describe("none").await,
        Err(CoordinationError::NotFound(_))
    ));
    a.create("lock", 1, Vec::new()).await.expect("created");
    let grant = a
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs");
    assert!(grant.is_some());
    assert!(matches!(
        a.acquire("lock", AcquireOptions::new(1)).await,
        Err(CoordinationError::AlreadyHeld(_))
    ));
    assert!(matches!(
        a.acquire("lock", AcquireOptions::new(0)).await,
        Err(CoordinationError::AlreadyHeld(_))
    ));
    drop(grant);
    assert!(matches!(
        a.delete("none", false).await,
        Err(CoordinationError::NotFound(_))
    ));
}

/// The names of the semaphores a store holds, listed a bounded page at a time: sorted by their
/// bytes, a deleted one gone (although the store keeps its counters), an ephemeral one listed
/// while it lives, each page continuing after the last name of the one before; a page of no
/// names or above the bound is refused before any store call. The listing writes nothing.
// covers: Sem.Store.List
pub async fn semaphore_names_are_listed_in_pages<H: Harness>(harness: &H)
where
    H::Store: SemaphoreStore,
{
    use vvm::coordination::{NamesPage, NamesPageError, NAMES_PAGE_MAX};

    let store = harness.store().await;
    let other = harness.client(&store).await;
    let a = coordination(harness, store.clone(), 1).await;
    let everything = || NamesPage::new(None, NAMES_PAGE_MAX).expect("a valid page");
    let empty = a.semaphore_names(&everything()).await.expect("listed");
    assert!(empty.names.is_empty());
    assert!(!empty.more);
    // Created out of order. By bytes: "a" < "a b" < "b" < "b2" < "pool" < "é" (0xC3 comes
    // after every ASCII byte).
    for created in ["b2", "é", "a b", "b", "a"] {
        a.create(created, 2, Vec::new()).await.expect("created");
    }
    a.delete("b", false).await.expect("deleted");
    // An ephemeral one, made by an acquire, is listed while its party lives.
    let grant = a
        .acquire("pool", AcquireOptions::new(1).ephemeral())
        .await
        .expect("runs")
        .expect("granted");
    let listed = |names: &vvm::coordination::SemaphoreNames| -> Vec<String> {
        names.names.iter().map(|n| n.as_str().to_owned()).collect()
    };
    let all = store.semaphore_names(&everything()).await.expect("listed");
    assert_eq!(listed(&all), ["a", "a b", "b2", "pool", "é"]);
    assert!(!all.more);
    // Another client of the store sees the same.
    let seen = other.semaphore_names(&everything()).await.expect("listed");
    assert_eq!(seen, all);

    // Pages of two: each continues after the last name of the one before.
    let mut page = Some(NamesPage::new(None, 2).expect("a valid page"));
    let mut pages = Vec::new();
    while let Some(this) = page {
        let names = a.semaphore_names(&this).await.expect("listed");
        assert!(names.names.len() <= 2);
        pages.push(listed(&names));
        page = this.next(&names);
        assert!(pages.len() <= 3, "the listing must end: {pages:?}");
    }
    assert_eq!(
        pages,
        [vec!["a", "a b"], vec!["b2", "pool"], vec!["é"]]
            .map(|p| p.into_iter().map(str::to_owned).collect::<Vec<_>>())
    );
    // Pages of one name (on etcd a read then ends on the ephemeral one's party key).
    let mut page = Some(NamesPage::new(None, 1).expect("a valid page"));
    let mut one_by_one = Vec::new();
    while let Some(this) = page {
        let names = store.semaphore_names(&this).await.expect("listed");
        one_by_one.extend(listed(&names));
        page = this.next(&names);
        assert!(
            one_by_one.len() <= 5,
            "the listing must end: {one_by_one:?}"
        );
    }
    assert_eq!(one_by_one, ["a", "a b", "b2", "pool", "é"]);
    // After a name that is not a semaphore (the deleted "b"), and after the last one.
    let after_b = NamesPage::new(Some(name("b")), 1).expect("a valid page");
    let names = store.semaphore_names(&after_b).await.expect("listed");
    assert_eq!(listed(&names), ["b2"]);
    assert!(names.more);
    let after_last = NamesPage::new(Some(name("é")), 5).expect("a valid page");
    let names = store.semaphore_names(&after_last).await.expect("listed");
    assert!(names.names.is_empty());
    assert!(!names.more);

    // The ephemeral semaphore goes with its last party, and leaves the listing.
    assert!(grant.release().await.expect("released"));
    let all = store.semaphore_names(&everything()).await.expect("listed");
    assert_eq!(listed(&all), ["a", "a b", "b2", "é"]);

    for limit in [0, NAMES_PAGE_MAX + 1] {
        assert_eq!(
            NamesPage::new(None, limit),
            Err(NamesPageError::Limit {
                limit,
                max: NAMES_PAGE_MAX
            })
        );
    }
}
