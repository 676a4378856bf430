//! The etcd store against real etcd processes on loopback: what only a real server shows
//! (server-side expiry, `mod_revision`, lease bookkeeping, refused TTLs, error mapping,
//! authentication). The store contract itself is checked by `conformance_etcd.rs`.

use vvm_test_support::etcd as etcd_support;

use std::time::{Duration, Instant};

use etcd_support::{single, store};
use vvm_adapters::etcd::cluster::ClusterOptions;
use vvm_adapters::etcd::cluster::EtcdCluster;
use vvm_adapters::etcd::{Credentials, EtcdError, EtcdOptions, EtcdStore};
use vvm_core::{Incarnation, LeaseConfig, Revision, SessionId, SessionKey, Slot};
use vvm_runtime::{Acquired, Lease, LeaseStore, LeaseValue, SessionStore, StoreError};

const TTL: Duration = Duration::from_secs(2);

fn value(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(7),
        stopping: false,
    }
}

async fn raw_client(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a plain client connects")
}

// covers: Et.Lease
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_return_the_mod_revision_that_reads_report() {
    let Some(cluster) = single("writes_return_the_mod_revision_that_reads_report").await else {
        return;
    };
    let store = store(&cluster, "revisions/").await;
    let a = value("a");
    let first = store
        .insert_if_not_exists(Slot(1), &a, TTL * 5)
        .await
        .unwrap()
        .unwrap();
    let read = store.get(Slot(1)).await.unwrap().unwrap();
    assert_eq!(
        read,
        Lease {
            value: a.clone(),
            revision: first
        }
    );

    let b = value("b");
    let swapped = store
        .compare_and_swap(Slot(1), &read, &b, TTL * 5)
        .await
        .unwrap()
        .unwrap();
    assert!(swapped > first);
    assert_eq!(store.get(Slot(1)).await.unwrap().unwrap().revision, swapped);
    let mut raw = raw_client(&cluster).await;
    let kv = raw.get("revisions/1", None).await.unwrap();
    assert_eq!(
        kv.kvs()[0].mod_revision() as u64,
        swapped.0,
        "the key is <prefix><slot>"
    );

    let held = Lease {
        value: b,
        revision: swapped,
    };
    assert!(store.compare_and_delete(Slot(1), &held).await.unwrap());
    let again = store
        .insert_if_not_exists(Slot(1), &a, TTL * 5)
        .await
        .unwrap()
        .unwrap();
    assert!(
        again > swapped,
        "revisions increase across delete and re-insert"
    );
}

// covers: Et.Lease
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_expire_on_the_server_after_their_ttl() {
    let Some(cluster) = single("records_expire_on_the_server_after_their_ttl").await else {
        return;
    };
    let store = store(&cluster, "expiry/").await;
    let sent = Instant::now();
    let revision = store
        .insert_if_not_exists(Slot(1), &value("a"), TTL)
        .await
        .unwrap()
        .unwrap();
    // Half the TTL after the request was sent the record certainly lives.
    tokio::time::sleep_until((sent + TTL / 2).into()).await;
    assert_eq!(
        store.get(Slot(1)).await.unwrap().map(|l| l.revision),
        Some(revision)
    );
    // etcd checks leases every 0.5 s; the record is gone soon after its TTL.
    let limit = sent + TTL * 3;
    while store.get(Slot(1)).await.unwrap().is_some() {
        assert!(Instant::now() < limit, "the record outlived three TTLs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sent.elapsed() >= TTL, "the record vanished before its TTL");
    assert!(store
        .insert_if_not_exists(Slot(1), &value("b"), TTL)
        .await
        .unwrap()
        .is_some());
}

/// Counts the leases the server holds, waiting (bounded) for background revocations.
async fn leases_settle_at_most(cluster: &EtcdCluster, most: usize) -> usize {
    let mut raw = raw_client(cluster).await;
    let limit = Instant::now() + Duration::from_secs(5);
    loop {
        let count = raw.leases().await.unwrap().leases().len();
        if count <= most || Instant::now() > limit {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// covers: Et.NoLeak
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_and_unused_leases_are_revoked() {
    let Some(cluster) = single("replaced_and_unused_leases_are_revoked").await else {
        return;
    };
    let store = store(&cluster, "leases/").await;
    let (a, b) = (value("a"), value("b"));
    let long = Duration::from_secs(60);
    let mut held = Lease {
        value: a.clone(),
        revision: store
            .insert_if_not_exists(Slot(1), &a, long)
            .await
            .unwrap()
            .unwrap(),
    };
    for _ in 0..20 {
        // A renewal replaces the record's lease; a refused insert and a refused swap leave
        // their fresh leases unused.
        let revision = store
            .compare_and_swap(Slot(1), &held, &a, long)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            store.insert_if_not_exists(Slot(1), &b, long).await.unwrap(),
            None
        );
        let stale = Lease {
            value: b.clone(),
            revision,
        };
        assert_eq!(
            store
                .compare_and_swap(Slot(1), &stale, &b, long)
                .await
                .unwrap(),
            None
        );
        held.revision = revision;
    }
    assert_eq!(
        leases_settle_at_most(&cluster, 1).await,
        1,
        "only the record's own lease stays"
    );
    assert!(store.compare_and_delete(Slot(1), &held).await.unwrap());
    assert_eq!(
        leases_settle_at_most(&cluster, 0).await,
        0,
        "a deleted record's lease is revoked"
    );
}

// covers: Et.Ttl, Et.NoLeak
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_the_cluster_cannot_honour_is_refused_not_rounded() {
    let test = "a_ttl_the_cluster_cannot_honour_is_refused_not_rounded";
    if !etcd_support::available(test) {
        return;
    }
    // An election timeout of 2 s makes etcd's own minimum lease TTL 3 s.
    let options = ClusterOptions::new(1)
        .unwrap()
        .timing(Duration::from_millis(200), Duration::from_millis(2000))
        .unwrap();
    let cluster = EtcdCluster::start(options).await.unwrap();
    let store = store(&cluster, "ttl/").await;

    let two = LeaseConfig::new(Duration::from_secs(2)).unwrap();
    assert_eq!(
        store.validate(&two).await,
        Err(EtcdError::TtlNotHonoured {
            asked_secs: 2,
            granted_secs: 3
        })
    );
    let insert = store
        .insert_if_not_exists(Slot(1), &value("a"), Duration::from_secs(2))
        .await;
    assert!(
        matches!(&insert, Err(error @ StoreError::Failed { .. })
            if error.find::<EtcdError>() == Some(&EtcdError::TtlNotHonoured { asked_secs: 2, granted_secs: 3 })),
        "{insert:?}"
    );
    assert_eq!(
        store.get(Slot(1)).await.unwrap(),
        None,
        "nothing was written"
    );

    let fractional = LeaseConfig::new(Duration::from_millis(3500)).unwrap();
    assert!(matches!(
        store.validate(&fractional).await,
        Err(EtcdError::TtlNotWholeSeconds { .. })
    ));
    let insert = store
        .insert_if_not_exists(Slot(1), &value("a"), Duration::from_millis(3500))
        .await;
    assert!(matches!(insert, Err(StoreError::Failed { .. })));

    let three = LeaseConfig::new(Duration::from_secs(3)).unwrap();
    assert_eq!(store.validate(&three).await, Ok(()));
    assert_eq!(
        leases_settle_at_most(&cluster, 0).await,
        0,
        "probe and refused leases are revoked"
    );
}

// covers: Et.Errors
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_and_writes_nothing() {
    // A port nobody listens on: bound, read and closed again.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let options = EtcdOptions::new([format!("127.0.0.1:{port}")])
        .unwrap()
        .connect_timeout(Duration::from_millis(200))
        .unwrap()
        .request_timeout(Duration::from_millis(500))
        .unwrap();
    let store = EtcdStore::connect(options)
        .await
        .expect("connecting is lazy without credentials");
    let held = Lease {
        value: value("a"),
        revision: vvm_core::Revision(3),
    };
    let outcomes = [
        store.compare_and_delete(Slot(1), &held).await.map(|_| ()),
        store
            .insert_if_not_exists(Slot(1), &value("a"), TTL)
            .await
            .map(|_| ()),
        store
            .compare_and_swap(Slot(1), &held, &value("a"), TTL)
            .await
            .map(|_| ()),
        store.get(Slot(1)).await.map(|_| ()),
    ];
    for outcome in outcomes {
        assert!(
            matches!(&outcome, Err(StoreError::Failed { .. })),
            "{outcome:?}"
        );
    }
}

// covers: Et.Corrupt
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_record_that_is_not_a_lease_is_corrupt_and_never_overwritten() {
    let Some(cluster) =
        single("a_live_record_that_is_not_a_lease_is_corrupt_and_never_overwritten").await
    else {
        return;
    };
    let store = store(&cluster, "corrupt/").await;
    let mut raw = raw_client(&cluster).await;
    let put = raw.put("corrupt/4", "garbage", None).await.unwrap();
    let revision = vvm_core::Revision(put.header().unwrap().revision() as u64);
    assert!(matches!(
        store.get(Slot(4)).await,
        Err(StoreError::Corrupt { slot: 4, .. })
    ));
    assert_eq!(
        store
            .insert_if_not_exists(Slot(4), &value("a"), TTL)
            .await
            .unwrap(),
        None
    );
    let guess = Lease {
        value: value("a"),
        revision,
    };
    assert_eq!(
        store
            .compare_and_swap(Slot(4), &guess, &value("a"), TTL)
            .await
            .unwrap(),
        None
    );
    assert!(!store.compare_and_delete(Slot(4), &guess).await.unwrap());
    assert_eq!(
        raw.get("corrupt/4", None).await.unwrap().kvs()[0].value(),
        b"garbage"
    );
}

// covers: Et.Options
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_authenticate_the_store() {
    let Some(cluster) = single("credentials_authenticate_the_store").await else {
        return;
    };
    let mut raw = raw_client(&cluster).await;
    raw.user_add("root", "root-secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.user_add("vvm", "vvm-secret", None).await.unwrap();
    raw.role_add("vvm").await.unwrap();
    let permission = etcd_client::Permission::read_write("auth/").with_prefix();
    raw.role_grant_permission("vvm", permission).await.unwrap();
    raw.user_grant_role("vvm", "vvm").await.unwrap();
    raw.auth_enable().await.unwrap();

    let options = cluster.store_options().unwrap().prefix("auth/").unwrap();
    let wrong = options
        .clone()
        .credentials(Credentials::new("vvm", "wrong"));
    let refused = EtcdStore::connect(wrong).await.unwrap_err();
    assert!(
        matches!(&refused, EtcdError::Authentication { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("authentication failed"));
    assert!(!refused.to_string().contains("wrong"));

    let anonymous = EtcdStore::connect(options.clone()).await.unwrap();
    let outcome = anonymous
        .insert_if_not_exists(Slot(1), &value("a"), TTL)
        .await;
    assert!(
        matches!(outcome, Err(StoreError::Failed { .. })),
        "{outcome:?}"
    );

    let store = EtcdStore::connect(options.credentials(Credentials::new("vvm", "vvm-secret")))
        .await
        .unwrap();
    assert!(!format!("{store:?}").contains("vvm-secret"));
    let revision = store
        .insert_if_not_exists(Slot(1), &value("a"), TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.get(Slot(1)).await.unwrap().unwrap().revision,
        revision
    );
}

/// One member of three killed: every operation still succeeds on the other two. The client
/// keeps the dead member's endpoint in its rotation; a request routed there is refused before
/// it leaves the process and is sent again, so no operation fails for it.
// covers: Et.MemberRefused
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_does_not_fail_operations() {
    let test = "a_dead_member_does_not_fail_operations";
    let Some(mut cluster) = etcd_support::three(test).await else {
        return;
    };
    let store = store(&cluster, "dead-member/").await;
    let mut lease = Lease {
        value: value("a"),
        revision: store
            .insert_if_not_exists(Slot(1), &value("a"), TTL * 30)
            .await
            .expect("the insert runs")
            .expect("the slot is free"),
    };
    // A follower: the cluster keeps its leader, so only the refused connections are tested.
    let leader = cluster.leader().await.expect("the cluster has a leader");
    let follower = (0..cluster.len())
        .find(|member| *member != leader)
        .expect("a member that does not lead");
    cluster.kill(follower).expect("the member is killed");
    // Each renewal is a lease grant and a transaction, each routed to any member.
    for round in 0..30 {
        let revision = store
            .compare_and_swap(Slot(1), &lease, &value("a"), TTL * 30)
            .await
            .unwrap_or_else(|error| panic!("renewal {round} failed: {error}: {error:?}"))
            .expect("our record is swapped");
        lease.revision = revision;
        assert_eq!(
            store.get(Slot(1)).await.expect("the read runs"),
            Some(lease.clone())
        );
    }
}

fn session(id: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(7),
        id: SessionId(id),
    }
}

/// The etcd lease `key` (a session record or a slot) is bound to, read raw; `None` when absent.
async fn bound_lease(raw: &mut etcd_client::Client, key: Vec<u8>) -> Option<i64> {
    raw.get(key, None)
        .await
        .unwrap()
        .kvs()
        .first()
        .map(|kv| kv.lease())
}

async fn written(store: &EtcdStore, slot: Slot, key: SessionKey) -> Revision {
    match store.acquire(slot, key).await.unwrap() {
        Acquired::Written(revision) => revision,
        other => panic!("{slot:?} for {key}: {other:?}"),
    }
}

/// A session is one lease: its record and every holding are bound to it; a keepalive renews
/// it and keeps the record's revision; a keepalive of another TTL is refused; the delete checks
/// the revision, then revokes the lease at once, which deletes every holding.
// covers: Et.Sessions
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_holdings_vanish_when_the_session_is_deleted() {
    let Some(cluster) = single("a_sessions_holdings_vanish_when_the_session_is_deleted").await
    else {
        return;
    };
    let store = store(&cluster, "sessions/").await;
    let mut raw = raw_client(&cluster).await;
    let ttl = TTL * 5;
    let created = store
        .create_session(session(1), &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.session_key(session(1)),
        b"sessions/session/0000000000000007-1"
    );
    let lease = bound_lease(&mut raw, store.session_key(session(1)))
        .await
        .expect("the record exists");
    assert_ne!(lease, 0);
    assert_eq!(
        store
            .create_session(session(1), &value("t"), ttl)
            .await
            .unwrap(),
        None,
        "a live session's key is taken"
    );

    let mut holdings = Vec::new();
    for slot in [Slot(1), Slot(2), Slot(3)] {
        let revision = written(&store, slot, session(1)).await;
        assert!(revision > created);
        assert_eq!(
            store.get(slot).await.unwrap(),
            Some(Lease {
                value: value("s"),
                revision
            }),
            "a holding reads as a record with the session's value"
        );
        assert_eq!(bound_lease(&mut raw, store.key(slot)).await, Some(lease));
        holdings.push(revision);
    }
    assert_eq!(
        leases_settle_at_most(&cluster, 1).await,
        1,
        "one lease for the session and all its holdings"
    );

    assert_eq!(
        store.keep_alive(session(1), created, ttl).await.unwrap(),
        Some(created),
        "etcd's keepalive writes no key"
    );
    let other_ttl = store.keep_alive(session(1), created, TTL).await;
    assert!(
        matches!(&other_ttl, Err(error @ StoreError::Failed { .. })
            if error.find::<EtcdError>() == Some(&EtcdError::SessionTtlMismatch { asked_secs: 2, lease_secs: 10 })),
        "{other_ttl:?}"
    );
    let wrong = Revision(created.0 + 1000);
    assert_eq!(
        store.keep_alive(session(1), wrong, ttl).await.unwrap(),
        None
    );
    assert!(!store.delete_session(session(1), wrong).await.unwrap());
    assert!(store.get(Slot(1)).await.unwrap().is_some());

    assert!(store.delete_session(session(1), created).await.unwrap());
    // The lease was revoked before the delete answered: no waiting.
    for slot in [Slot(1), Slot(2), Slot(3)] {
        assert_eq!(bound_lease(&mut raw, store.key(slot)).await, None);
    }
    assert_eq!(raw.leases().await.unwrap().leases().len(), 0);
    assert_eq!(store.get_session(session(1)).await.unwrap(), None);
    assert_eq!(
        store.acquire(Slot(1), session(1)).await.unwrap(),
        Acquired::SessionGone
    );
    assert!(!store.delete_session(session(1), created).await.unwrap());
    assert_eq!(
        store.keep_alive(session(1), created, ttl).await.unwrap(),
        None
    );
}

/// One keepalive per period keeps every holding live past the TTL; without keepalives the
/// record and every holding vanish in one revision.
// covers: Et.Sessions
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_keep_every_holding_and_expiry_ends_them_all() {
    let Some(cluster) = single("keepalives_keep_every_holding_and_expiry_ends_them_all").await
    else {
        return;
    };
    let store = store(&cluster, "kept/").await;
    let created = store
        .create_session(session(1), &value("s"), TTL)
        .await
        .unwrap()
        .unwrap();
    for slot in [Slot(1), Slot(2)] {
        written(&store, slot, session(1)).await;
    }
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            store.keep_alive(session(1), created, TTL).await.unwrap(),
            Some(created)
        );
    }
    assert!(store.get(Slot(1)).await.unwrap().is_some());
    assert!(store.get(Slot(2)).await.unwrap().is_some());

    let stopped = Instant::now();
    while store.get_session(session(1)).await.unwrap().is_some() {
        assert!(
            stopped.elapsed() < TTL * 3,
            "the session outlived three TTLs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    assert_eq!(store.get(Slot(2)).await.unwrap(), None);
    assert_eq!(
        store.keep_alive(session(1), created, TTL).await.unwrap(),
        None
    );
    assert_eq!(
        store.acquire(Slot(3), session(1)).await.unwrap(),
        Acquired::SessionGone
    );
}

/// A lease revoked behind the store's back ends the session: its keepalive is `None`, its
/// holdings are gone, its acquires are `SessionGone`. A session never created acquires nothing.
// covers: Et.Sessions
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_of_a_session_whose_lease_was_revoked_elsewhere_is_none() {
    let Some(cluster) =
        single("keep_alive_of_a_session_whose_lease_was_revoked_elsewhere_is_none").await
    else {
        return;
    };
    let store = store(&cluster, "revoked/").await;
    let mut raw = raw_client(&cluster).await;
    assert_eq!(
        store.acquire(Slot(1), session(9)).await.unwrap(),
        Acquired::SessionGone,
        "never created"
    );
    let ttl = TTL * 5;
    let created = store
        .create_session(session(1), &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();
    written(&store, Slot(1), session(1)).await;
    let lease = bound_lease(&mut raw, store.session_key(session(1)))
        .await
        .unwrap();
    raw.lease_revoke(lease).await.unwrap();
    assert_eq!(
        store.keep_alive(session(1), created, ttl).await.unwrap(),
        None
    );
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    assert_eq!(
        store.acquire(Slot(2), session(1)).await.unwrap(),
        Acquired::SessionGone
    );
    assert_eq!(store.get(Slot(2)).await.unwrap(), None, "nothing written");
}

/// A session created elsewhere, or whose create's outcome was unknown, is kept alive and
/// acquires once read back: the store learns its lease from the record, and its TTL from etcd.
// covers: Et.SessionLearnt
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_read_back_by_another_store_is_kept_alive() {
    let Some(cluster) = single("a_session_read_back_by_another_store_is_kept_alive").await else {
        return;
    };
    let creator = store(&cluster, "learnt/").await;
    let ttl = TTL * 5;
    let created = creator
        .create_session(session(1), &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();
    let created_2 = creator
        .create_session(session(2), &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();

    let reader = store(&cluster, "learnt/").await;
    let record = reader.get_session(session(1)).await.unwrap().unwrap();
    assert_eq!((record.value, record.revision), (value("s"), created));
    let other_ttl = reader.keep_alive(session(1), created, TTL).await;
    assert!(
        matches!(&other_ttl, Err(error) if error.find::<EtcdError>() == Some(&EtcdError::SessionTtlMismatch { asked_secs: 2, lease_secs: 10 })),
        "{other_ttl:?}"
    );
    assert_eq!(
        reader.keep_alive(session(1), created, ttl).await.unwrap(),
        Some(created)
    );
    let revision = written(&reader, Slot(1), session(1)).await;
    assert_eq!(
        creator
            .get(Slot(1))
            .await
            .unwrap()
            .map(|lease| lease.revision),
        Some(revision)
    );

    // Never read: the keepalive reads the record itself; the acquire too.
    let fresh = store(&cluster, "learnt/").await;
    assert_eq!(
        fresh.keep_alive(session(2), created_2, ttl).await.unwrap(),
        Some(created_2)
    );
    let other = store(&cluster, "learnt/").await;
    written(&other, Slot(2), session(2)).await;
    assert!(creator.delete_session(session(2), created_2).await.unwrap());
    assert_eq!(
        fresh.keep_alive(session(2), created_2, ttl).await.unwrap(),
        None
    );
    assert_eq!(other.get(Slot(2)).await.unwrap(), None);
}

/// An acquire writes only on a free slot: a slot record or another session's holding is
/// `Held`; the session's own holding answers its revision and writes nothing (idempotent, which
/// is also how a second send of an applied acquire is recognised).
// covers: Et.AcquireResend
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_on_a_held_slot_is_held() {
    let Some(cluster) = single("acquire_on_a_held_slot_is_held").await else {
        return;
    };
    let store = store(&cluster, "held/").await;
    let ttl = TTL * 5;
    for id in [1, 2] {
        store
            .create_session(session(id), &value(&format!("s{id}")), ttl)
            .await
            .unwrap()
            .unwrap();
    }
    store
        .insert_if_not_exists(Slot(1), &value("plain"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.acquire(Slot(1), session(1)).await.unwrap(),
        Acquired::Held
    );
    let theirs = written(&store, Slot(2), session(2)).await;
    assert_eq!(
        store.acquire(Slot(2), session(1)).await.unwrap(),
        Acquired::Held
    );
    let ours = written(&store, Slot(3), session(1)).await;
    assert_eq!(
        store.acquire(Slot(3), session(1)).await.unwrap(),
        Acquired::Written(ours),
        "the holding as it is"
    );
    assert_eq!(
        store
            .get(Slot(3))
            .await
            .unwrap()
            .map(|lease| lease.revision),
        Some(ours),
        "nothing written"
    );
    assert_eq!(
        store.get(Slot(2)).await.unwrap(),
        Some(Lease {
            value: value("s2"),
            revision: theirs
        })
    );
}

/// Releasing a holding (compare-and-delete) or replacing it (compare-and-swap) leaves its
/// session's lease alone: the session and its other holdings stay live.
// covers: Et.HoldingRelease
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_holding_does_not_end_the_session() {
    let Some(cluster) = single("releasing_a_holding_does_not_end_the_session").await else {
        return;
    };
    let store = store(&cluster, "release/").await;
    let mut raw = raw_client(&cluster).await;
    let ttl = TTL * 5;
    let created = store
        .create_session(session(1), &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();
    for slot in [Slot(1), Slot(2), Slot(3)] {
        written(&store, slot, session(1)).await;
    }
    let lease = bound_lease(&mut raw, store.session_key(session(1)))
        .await
        .unwrap();
    let first = store.get(Slot(1)).await.unwrap().unwrap();
    assert!(store.compare_and_delete(Slot(1), &first).await.unwrap());
    let second = store.get(Slot(2)).await.unwrap().unwrap();
    let swapped = store
        .compare_and_swap(Slot(2), &second, &value("s"), ttl)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(
        bound_lease(&mut raw, store.key(Slot(2))).await,
        Some(lease),
        "a swapped holding is a slot record of its own lease"
    );
    // Background revocations would have run by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(raw.lease_time_to_live(lease, None).await.unwrap().ttl() > 0);
    assert_eq!(bound_lease(&mut raw, store.key(Slot(3))).await, Some(lease));
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    assert_eq!(
        store
            .get(Slot(2))
            .await
            .unwrap()
            .map(|lease| lease.revision),
        Some(swapped)
    );
    assert_eq!(
        store.keep_alive(session(1), created, ttl).await.unwrap(),
        Some(created)
    );
    assert!(store.get_session(session(1)).await.unwrap().is_some());
}

/// A VVM on a session on etcd: its holding's key deleted from outside (`etcdctl del`) while the
/// session's lease lives is a loss at once — the session's keepalive is a lease keepalive that
/// never notices its keys deleted, so without the watch of its own record the VVM would run on
/// for as long as the session lives. L = 12 s: a loss within 2 s is the watch's.
// covers: VVM.VanishedStops, Holding.Vanished
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holding_deleted_from_outside_is_a_loss_at_once_on_etcd() {
    let test = "a_holding_deleted_from_outside_is_a_loss_at_once_on_etcd";
    let Some(cluster) = single(test).await else {
        return;
    };
    let store = store(&cluster, "vanished/").await;
    let mut raw = raw_client(&cluster).await;
    let recorder = vvm_runtime::RecordingKiller::new();
    let config = vvm_core::VvmConfig::builder("10.0.0.1:7000")
        .slots(1)
        .lease(Duration::from_secs(12))
        .build()
        .unwrap();
    let vvm =
        vvm_runtime::Vvm::provide_on_session(config, store.clone(), vvm_runtime::Services::new())
            .unwrap()
            .with_killer(vvm_runtime::KillerThread::new(recorder))
            .launch()
            .await;
    let token = vvm.token().expect("running");
    let key = store.key(token.slot);
    let deleted = Instant::now();
    assert_eq!(raw.delete(key, None).await.unwrap().deleted(), 1);
    let problem = tokio::time::timeout(Duration::from_secs(2), vvm.problem())
        .await
        .unwrap_or_else(|_| panic!("still leading {:?} after the delete", deleted.elapsed()));
    assert!(
        matches!(
            problem,
            vvm_runtime::VvmError::LeadershipLost {
                reason: vvm_core::LossReason::Overtaken,
                ..
            }
        ),
        "{problem:?}"
    );
    assert!(vvm.shutdown().await.is_err());
}

/// A holding's key deleted from outside (`etcdctl del`) while its session lives keeps the slot
/// held for another session until that session ends — its holder may still act — while a
/// holding its holder released is free at once; a slot never taken is taken in the second
/// transaction (its state key absent).
// covers: Et.HoldingRemoved
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holding_deleted_from_outside_keeps_its_slot_while_its_session_lives() {
    let Some(cluster) =
        single("a_holding_deleted_from_outside_keeps_its_slot_while_its_session_lives").await
    else {
        return;
    };
    let store = store(&cluster, "removed/").await;
    let mut raw = raw_client(&cluster).await;
    let ttl = TTL * 5;
    let holder = store
        .create_session(session(1), &value("a"), ttl)
        .await
        .unwrap()
        .unwrap();
    store
        .create_session(session(2), &value("b"), ttl)
        .await
        .unwrap()
        .unwrap();
    written(&store, Slot(1), session(1)).await;
    let six = written(&store, Slot(6), session(1)).await;

    raw.delete(store.key(Slot(1)), None).await.unwrap();
    assert_eq!(
        store.acquire(Slot(1), session(2)).await.unwrap(),
        Acquired::Held,
        "its holder's session lives"
    );
    // Released by its holder: free at once.
    let released = Lease {
        value: value("a"),
        revision: six,
    };
    assert!(store.compare_and_delete(Slot(6), &released).await.unwrap());
    written(&store, Slot(6), session(2)).await;
    // The holder's session ends: free.
    assert!(store.delete_session(session(1), holder).await.unwrap());
    written(&store, Slot(1), session(2)).await;
}
