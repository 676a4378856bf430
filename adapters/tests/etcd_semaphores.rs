//! Semaphores on a real etcd on loopback: what the mapping onto etcd's keys shows beyond the
//! conformance suite (`conformance_etcd.rs`): the queue is the order of the party keys' creation
//! revisions, and a party's key is bound to its session's lease, so that etcd's own expiry of
//! the session wakes the waiters.

use vvm_test_support::etcd as etcd_support;

use std::time::Duration;

use etcd_client::GetOptions;
use etcd_support::{single, store};
use vvm_core::semaphore::SemaphoreName;
use vvm_core::{Incarnation, SessionId, SessionKey};
use vvm_runtime::{LeaseValue, SemaphoreRequest, SemaphoreStore, SessionStore};

const LONG_TTL: Duration = Duration::from_secs(3600);
const SHORT_TTL: Duration = Duration::from_secs(2);

fn key(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

fn acquire(count: u64) -> SemaphoreRequest {
    SemaphoreRequest::Acquire {
        request: vvm_runtime::next_request_id(),
        count,
        data: Vec::new(),
        timeout_ms: 60_000,
        ephemeral: false,
    }
}

/// The waiters in queue order are the party keys in creation-revision order, also after a
/// waiter replaced its request in place; every party key is bound to a lease.
// covers: Et.Semaphores
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_the_creation_order_of_the_party_keys() {
    let Some(cluster) = single("the_queue_is_the_creation_order_of_the_party_keys").await else {
        return;
    };
    let store = store(&cluster, "sem/").await;
    let name = SemaphoreName::new("lock").expect("a name");
    for n in 1..=4 {
        let value = LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n));
        store
            .create_session(key(n), &value, LONG_TTL)
            .await
            .expect("runs")
            .expect("created");
    }
    let create = SemaphoreRequest::Create {
        limit: 2,
        data: Vec::new(),
    };
    store
        .semaphore(key(1), &name, create)
        .await
        .expect("created");
    store
        .semaphore(key(1), &name, acquire(2))
        .await
        .expect("granted");
    for n in [3, 2, 4] {
        store
            .semaphore(key(n), &name, acquire(1))
            .await
            .expect("queued");
    }
    // Session 3 changes its count in place: it keeps its place, and its key.
    store
        .semaphore(key(3), &name, acquire(2))
        .await
        .expect("replaced");
    let description = store
        .semaphore(key(1), &name, SemaphoreRequest::Describe)
        .await
        .expect("described")
        .description
        .expect("exists");
    let queue: Vec<String> = description
        .waiters
        .iter()
        .map(|w| w.session.to_string())
        .collect();
    assert_eq!(queue.len(), 3);

    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a plain client connects");
    let mut start = store.semaphore_key(&name);
    start.push(0);
    let mut end = store.semaphore_key(&name);
    end.push(1);
    let parties = client
        .get(start.clone(), Some(GetOptions::new().with_range(end)))
        .await
        .expect("read");
    let all: Vec<(i64, String, i64)> = parties
        .kvs()
        .iter()
        .map(|kv| {
            let session = String::from_utf8_lossy(&kv.key()[start.len()..]).into_owned();
            (kv.create_revision(), session, kv.lease())
        })
        .collect();
    // Each party's mark (`<party key> NUL`, `Et.SemaphoreUnreleased`) is bound to no lease.
    let (marks, mut keys): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|(_, session, _)| session.ends_with('\0'));
    assert_eq!(marks.len(), keys.len(), "{marks:?} {keys:?}");
    assert!(marks.iter().all(|(_, _, lease)| *lease == 0), "{marks:?}");
    keys.sort();
    assert!(keys.iter().all(|(_, _, lease)| *lease != 0), "{keys:?}");
    let by_creation: Vec<String> = keys.into_iter().map(|(_, session, _)| session).collect();
    assert_eq!(
        by_creation,
        [vec![key(1).to_string()], queue].concat(),
        "owner first, then the waiters in queue order"
    );
}

/// An owner's session that ends on etcd (its lease expires) wakes a waiter's feed without
/// anybody writing; the owner is then waited out for its TTL, and the next look after that
/// grants the waiter.
// covers: Sem.Store.LeaseEndWakes, Et.Semaphores, Et.SemaphoreUnreleased
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_party_whose_lease_ends_wakes_the_feed() {
    let Some(cluster) = single("a_party_whose_lease_ends_wakes_the_feed").await else {
        return;
    };
    let store = store(&cluster, "sem/").await;
    let name = SemaphoreName::new("lock").expect("a name");
    let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    store
        .create_session(key(1), &value, SHORT_TTL)
        .await
        .expect("runs")
        .expect("created");
    store
        .create_session(key(2), &value, LONG_TTL)
        .await
        .expect("runs")
        .expect("created");
    let create = SemaphoreRequest::Create {
        limit: 1,
        data: Vec::new(),
    };
    store
        .semaphore(key(2), &name, create)
        .await
        .expect("created");
    store
        .semaphore(key(1), &name, acquire(1))
        .await
        .expect("granted");
    store
        .semaphore(key(2), &name, acquire(1))
        .await
        .expect("queued");
    let mut change = store.semaphore_changed(&name);
    // Nothing is written: only etcd's expiry of the lease can wake it (within its lease check).
    let woke = tokio::time::timeout(SHORT_TTL + Duration::from_secs(3), &mut change).await;
    assert!(woke.is_ok(), "the end of the owner's lease woke the feed");
    // An expired lease and a revoked one look alike: the owner, gone without a release, is
    // waited out for its TTL from this first sight (`Et.SemaphoreUnreleased`).
    let first = store
        .semaphore(key(2), &name, SemaphoreRequest::Describe)
        .await
        .expect("described");
    assert!(first.expired.is_empty(), "{first:?}");
    let left = first.parties_expire_in.expect("the owner is waited out");
    assert!(
        left <= SHORT_TTL,
        "the owner's own TTL, from its mark: {left:?}"
    );
    tokio::time::sleep(left + Duration::from_millis(50)).await;
    let after = store
        .semaphore(key(2), &name, SemaphoreRequest::Describe)
        .await
        .expect("described");
    assert_eq!(after.expired, [key(1)]);
    let description = after.description.expect("exists");
    assert_eq!(description.owners.len(), 1);
    assert_eq!(description.owners[0].session, key(2));
}

/// etcd's own count of its watchers (`etcd_debugging_mvcc_watcher_total` on `/metrics`).
fn watchers(endpoint: &str) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint).expect("the member answers");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("sent");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    text.lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|count| count.trim().parse::<f64>().ok())
        .map(|count| count as u64)
        .expect("the watcher gauge")
}

/// The watches of one semaphore on one store client share one etcd watch: 100 `Watch`es waiting
/// cost the member one watcher, not 100, and one update reaches all of them. The shared watch
/// closes a linger after its last feed.
// covers: Et.SharedWatch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watches_of_one_semaphore_share_one_etcd_watch() {
    use vvm_core::LeaseConfig;
    use vvm_runtime::{Coordination, KillerThread, RecordingKiller, SessionHandle, WatchKind};
    const WATCHERS: usize = 100;
    let Some(cluster) = single("the_watches_of_one_semaphore_share_one_etcd_watch").await else {
        return;
    };
    let endpoint = cluster.endpoints()[0].clone();
    let store = store(&cluster, "shared/").await;
    let killer = KillerThread::new(RecordingKiller::new());
    let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    let lease = LeaseConfig::new(Duration::from_secs(20)).expect("valid");
    let session = SessionHandle::open(store, lease, value, &killer)
        .await
        .expect("opens");
    let coordination = Coordination::new(session);
    coordination
        .create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    let before = watchers(&endpoint);
    let mut tasks = Vec::new();
    for _ in 0..WATCHERS {
        let mut watch = coordination
            .watch("config", WatchKind::DATA)
            .expect("a watch");
        assert_eq!(watch.next().await.expect("the state").data, b"v1");
        tasks.push(tokio::spawn(
            async move { watch.next().await.map(|d| d.data) },
        ));
    }
    // Every watcher is now waiting on the feed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = watchers(&endpoint) - before;
    assert!(
        waiting <= 2,
        "{waiting} etcd watchers for {WATCHERS} watches of one name"
    );
    coordination
        .update_data("config", b"v2".to_vec())
        .await
        .expect("updated");
    for task in tasks {
        let data = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("every watcher woken")
            .expect("no panic")
            .expect("read");
        assert_eq!(data, b"v2");
    }
    // The watches are dropped: the shared watch ends a linger later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(watchers(&endpoint), before, "the shared watch was closed");
}

/// A queued acquire rides out an etcd outage that its session rides out: etcd killed while the
/// acquire waits and started again 2 s later, the session (lease 20 s) lives on, and so does the
/// request: it is granted when the owner releases after the restart, and nothing is granted to
/// nobody.
// covers: Sem.Store.WaitOutage
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquire_rides_out_an_outage_its_session_rides_out() {
    use vvm_core::LeaseConfig;
    use vvm_runtime::{AcquireOptions, Coordination, KillerThread, RecordingKiller};
    use vvm_runtime::{SessionHandle, SessionStatus};
    let test = "a_queued_acquire_rides_out_an_outage_its_session_rides_out";
    let Some(mut cluster) = single(test).await else {
        return;
    };
    let store = store(&cluster, "outage/").await;
    let killer = KillerThread::new(RecordingKiller::new());
    let lease = LeaseConfig::new(Duration::from_secs(20)).expect("valid");
    let mut handles = Vec::new();
    for n in 1..=2 {
        let value = LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n));
        let session = SessionHandle::open(store.clone(), lease, value, &killer)
            .await
            .expect("opens");
        handles.push(Coordination::new(session));
    }
    let (a, b) = (handles[0].clone(), handles[1].clone());
    a.create("lock", 1, Vec::new()).await.expect("created");
    let held = a
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire("lock", AcquireOptions::new(1)).await })
    };
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while a
        .describe("lock")
        .await
        .expect("described")
        .waiters
        .is_empty()
    {
        assert!(tokio::time::Instant::now() < give_up, "never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    cluster.kill(0).expect("etcd killed");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.restart(0).expect("etcd restarts");
    cluster
        .wait_healthy(etcd_support::START_LIMIT)
        .await
        .expect("etcd is back");
    assert!(
        !waiting.is_finished(),
        "the queued acquire ended in the outage: {:?}",
        waiting.await
    );
    for coordination in [&a, &b] {
        assert!(
            matches!(coordination.session().status(), SessionStatus::Open { .. }),
            "the session rode out the outage"
        );
    }
    // The release may meet the client still reconnecting: then it is withdrawn in the
    // background until done.
    let _ = held.release().await;
    let granted = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("granted once the owner released")
        .expect("no panic")
        .expect("the acquire rode out the outage");
    let grant = granted.expect("granted, not timed out");
    let owners = a.describe("lock").await.expect("described").owners;
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].session, b.session().key());
    assert!(grant.release().await.expect("released"));
}
