//! Guards for the user's own store transactions (`EtcdStore::guard`, `SqliteStore::guard`): a
//! write under a holding lands while the holding is live, and a deposed holder's write is
//! refused — on a real etcd on loopback, and on an SQLite file written through a connection of
//! the user's own.

use vvm_test_support::etcd as etcd_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Txn, TxnOp};
use etcd_support::{single, store};
use vvm_adapters::etcd::{EtcdGuard, EtcdGuardError, EtcdStore};
use vvm_adapters::sqlite::rusqlite::{Connection, TransactionBehavior};
use vvm_adapters::sqlite::{ClockError, SqliteGuardError, StoreClock};
use vvm_adapters::SqliteStore;
use vvm_conformance::ScratchDir;
use vvm_core::{FencingToken, Incarnation, LeaseConfig, Revision, SessionId, SessionKey, Slot};
use vvm_runtime::{
    AcquireOptions, Acquired, Coordination, KillerThread, LeaseStore, LeaseValue, RecordingKiller,
    SessionHandle, SessionStore,
};

const SLOT: Slot = Slot(1);
const LONG_TTL: Duration = Duration::from_secs(3600);
const DATA: &str = "app/config";

fn session(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

fn value(n: u64) -> LeaseValue {
    LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n))
}

fn token(revision: Revision) -> FencingToken {
    FencingToken {
        slot: SLOT,
        revision,
    }
}

// ---------------------------------------------------------------------------------------------
// etcd

/// A session of `n` holding `SLOT`: its fencing token.
async fn etcd_holder(store: &EtcdStore, n: u64) -> FencingToken {
    store
        .create_session(session(n), &value(n), LONG_TTL)
        .await
        .unwrap()
        .expect("the session is created");
    match store.acquire(SLOT, session(n)).await.unwrap() {
        Acquired::Written(revision) => token(revision),
        other => panic!("session {n} did not win {SLOT:?}: {other:?}"),
    }
}

/// The user's own transaction, guarded by `token`'s holding: puts `data`; whether it applied.
async fn etcd_guarded_put(
    store: &EtcdStore,
    raw: &mut Client,
    token: FencingToken,
    data: &str,
) -> bool {
    let guard = store.guard(token).expect("a token of this store");
    etcd_put(raw, &guard, data).await
}

/// The user's own transaction, guarded by `guard`: puts `data`; whether it applied.
async fn etcd_put(raw: &mut Client, guard: &EtcdGuard, data: &str) -> bool {
    let txn = Txn::new()
        .when(guard.compares())
        .and_then([TxnOp::put(DATA, data, None)]);
    raw.txn(txn).await.unwrap().succeeded()
}

/// A killer that records instead of ending the test process.
fn killer() -> KillerThread {
    KillerThread::new(RecordingKiller::new())
}

/// A coordination of its own session for `n`.
async fn member<S: vvm_runtime::SemaphoreStore + Clone>(store: &S, n: u64) -> Coordination<S> {
    let session = SessionHandle::open(store.clone(), LeaseConfig::default(), value(n), &killer())
        .await
        .expect("the session opens");
    Coordination::new(session)
}

async fn etcd_data(raw: &mut Client) -> Option<String> {
    let got = raw.get(DATA, None).await.unwrap();
    got.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

/// Leader A writes through its guard; its session's lease is revoked from outside (what its
/// expiry does too) and B takes the slot: A's guarded write is refused, B's lands. When the
/// slot's key is created again later — by A itself, on a new session — A's old guard stays
/// refused and only the new tenure's guard passes.
// covers: Guard.Etcd, Guard.Deposed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_deposed_leaders_guarded_write_is_refused() {
    let Some(cluster) = single("etcd_a_deposed_leaders_guarded_write_is_refused").await else {
        return;
    };
    let store = store(&cluster, "guard/").await;
    let mut raw = Client::connect(cluster.endpoints(), None).await.unwrap();

    let a = etcd_holder(&store, 1).await;
    let guard = store.guard(a).unwrap();
    assert_eq!(guard.key(), b"guard/1");
    assert_eq!(guard.created_max(), a.revision.0 as i64);
    assert!(
        etcd_guarded_put(&store, &mut raw, a, "a1").await,
        "A is live"
    );
    assert_eq!(etcd_data(&mut raw).await.as_deref(), Some("a1"));

    // A is deposed: the lease of its session (and of its holding) ends.
    let record = raw.get(store.session_key(session(1)), None).await.unwrap();
    let lease = record.kvs().first().expect("A's session record").lease();
    raw.lease_revoke(lease).await.unwrap();
    assert!(
        !etcd_guarded_put(&store, &mut raw, a, "a2").await,
        "A's holding is gone"
    );
    let b = etcd_holder(&store, 2).await;
    assert!(
        !etcd_guarded_put(&store, &mut raw, a, "a3").await,
        "the slot is B's: A's write must be refused"
    );
    assert!(etcd_guarded_put(&store, &mut raw, b, "b1").await, "B leads");
    assert_eq!(etcd_data(&mut raw).await.as_deref(), Some("b1"));

    // The key is created again by A on a new session: A's old guard names the old tenure.
    let b_session = raw.get(store.session_key(session(2)), None).await.unwrap();
    let b_revision = Revision(b_session.kvs()[0].mod_revision() as u64);
    assert!(store.delete_session(session(2), b_revision).await.unwrap());
    let again = {
        store
            .create_session(session(3), &value(1), LONG_TTL)
            .await
            .unwrap()
            .expect("created");
        match store.acquire(SLOT, session(3)).await.unwrap() {
            Acquired::Written(revision) => token(revision),
            other => panic!("{other:?}"),
        }
    };
    assert!(
        !etcd_guarded_put(&store, &mut raw, a, "a4").await,
        "A's first tenure is over, though A holds the slot again"
    );
    assert!(!etcd_guarded_put(&store, &mut raw, b, "b2").await, "B left");
    assert!(etcd_guarded_put(&store, &mut raw, again, "a5").await);
    assert_eq!(etcd_data(&mut raw).await.as_deref(), Some("a5"));
}

/// A VVM leading by the per-slot lease protocol renews by rewriting its key: the guard of any
/// token of the tenure passes until the tenure ends; then the key another holder creates
/// refuses them all. A token etcd cannot have assigned is refused up front.
// covers: Guard.Etcd, Guard.Deposed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_guard_spans_renewals_and_ends_with_the_tenure() {
    let Some(cluster) = single("etcd_a_guard_spans_renewals_and_ends_with_the_tenure").await else {
        return;
    };
    let store = store(&cluster, "renewed/").await;
    let mut raw = Client::connect(cluster.endpoints(), None).await.unwrap();
    let ttl = Duration::from_secs(10);

    let first = store
        .insert_if_not_exists(SLOT, &value(1), ttl)
        .await
        .unwrap()
        .expect("free");
    let lease = vvm_runtime::Lease {
        value: value(1),
        revision: first,
    };
    let renewed = store
        .compare_and_swap(SLOT, &lease, &value(1), ttl)
        .await
        .unwrap()
        .expect("renewed");
    assert!(renewed > first);
    assert!(etcd_guarded_put(&store, &mut raw, token(first), "first").await);
    assert!(etcd_guarded_put(&store, &mut raw, token(renewed), "renewed").await);

    let lease = vvm_runtime::Lease {
        value: value(1),
        revision: renewed,
    };
    assert!(store.compare_and_delete(SLOT, &lease).await.unwrap());
    let other = store
        .insert_if_not_exists(SLOT, &value(2), ttl)
        .await
        .unwrap()
        .expect("free again");
    assert!(!etcd_guarded_put(&store, &mut raw, token(first), "x").await);
    assert!(!etcd_guarded_put(&store, &mut raw, token(renewed), "x").await);
    assert!(etcd_guarded_put(&store, &mut raw, token(other), "other").await);
    assert_eq!(etcd_data(&mut raw).await.as_deref(), Some("other"));

    assert!(matches!(
        store.guard(token(Revision(0))),
        Err(EtcdGuardError::NotAnEtcdRevision { revision: 0 })
    ));
    assert!(matches!(
        store.guard(token(Revision(u64::MAX))),
        Err(EtcdGuardError::NotAnEtcdRevision { revision: u64::MAX })
    ));
}

/// A leader by a semaphore grant writes through its grant's guard; its session's lease is
/// revoked from outside and the waiting candidate B is granted: A's guarded write is refused,
/// B's lands, and a guard of A's ended grant is refused up front.
// covers: Guard.EtcdGrant, Guard.Deposed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_deposed_grant_holders_guarded_write_is_refused() {
    let Some(cluster) = single("etcd_a_deposed_grant_holders_guarded_write_is_refused").await
    else {
        return;
    };
    let store = store(&cluster, "grants/").await;
    let mut raw = Client::connect(cluster.endpoints(), None).await.unwrap();

    let a = member(&store, 1).await;
    a.create("leader", 1, Vec::new()).await.unwrap();
    let a_grant = a
        .acquire("leader", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("granted");
    let a_guard = store.grant_guard(&a_grant).await.unwrap();
    assert!(a_guard.key().starts_with(b"grants/\0semaphore/leader\0"));
    assert!(etcd_put(&mut raw, &a_guard, "a1").await, "A leads");

    let b = member(&store, 2).await;
    let waiting = tokio::spawn(async move {
        let wait = AcquireOptions::new(1).timeout(Duration::from_secs(30));
        let grant = b.acquire("leader", wait).await;
        (b, grant)
    });
    // A is deposed: its session's lease ends (as its expiry does).
    let record = raw
        .get(store.session_key(a_grant.session()), None)
        .await
        .unwrap();
    let lease = record.kvs().first().expect("A's session record").lease();
    raw.lease_revoke(lease).await.unwrap();
    let (_b, b_grant) = waiting.await.unwrap();
    let b_grant = b_grant
        .unwrap()
        .expect("B is granted once A's session ended");
    let b_guard = store.grant_guard(&b_grant).await.unwrap();
    assert!(
        !etcd_put(&mut raw, &a_guard, "a2").await,
        "B leads: A's write must be refused"
    );
    assert!(etcd_put(&mut raw, &b_guard, "b1").await, "B leads");
    assert_eq!(etcd_data(&mut raw).await.as_deref(), Some("b1"));
    assert!(matches!(
        store.grant_guard(&a_grant).await,
        Err(EtcdGuardError::GrantOver { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// SQLite

/// A clock the test moves by hand, in one boot.
#[derive(Clone, Debug)]
struct ManualClock {
    ns: Arc<AtomicU64>,
}

impl ManualClock {
    fn new() -> Self {
        ManualClock {
            ns: Arc::new(AtomicU64::new(1_000_000_000)),
        }
    }

    fn advance(&self, by: Duration) {
        self.ns.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl StoreClock for ManualClock {
    fn boot_id(&self) -> &str {
        "guard-boot"
    }

    fn since_boot(&self) -> Result<Duration, ClockError> {
        Ok(Duration::from_nanos(self.ns.load(Ordering::SeqCst)))
    }
}

/// The user's own transaction on `conn`, guarded by `token`'s holding: writes `data` and
/// commits when the guard passes; the guard's answer.
fn sqlite_guarded_write(
    store: &SqliteStore,
    conn: &mut Connection,
    token: FencingToken,
    data: &str,
) -> Result<(), SqliteGuardError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    store.guard(token).check(&tx)?;
    tx.execute(
        "INSERT OR REPLACE INTO app (k, v) VALUES ('config', ?1)",
        [data],
    )
    .unwrap();
    tx.commit().unwrap();
    Ok(())
}

fn sqlite_data(conn: &Connection) -> Option<String> {
    conn.query_row("SELECT v FROM app WHERE k = 'config'", [], |row| row.get(0))
        .ok()
}

fn user_connection(path: &std::path::Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute(
        "CREATE TABLE IF NOT EXISTS app (k TEXT PRIMARY KEY, v TEXT)",
        [],
    )
    .unwrap();
    conn
}

fn deposed(result: Result<(), SqliteGuardError>) -> Option<Revision> {
    match result {
        Err(SqliteGuardError::Deposed { found, .. }) => found,
        other => panic!("expected Deposed, got {other:?}"),
    }
}

/// Leader A (a holding on its session) writes through its guard in the user's own
/// `BEGIN IMMEDIATE` transaction; while such a transaction is open, B cannot take the slot,
/// even after A's session expired, so A's checked write commits before any takeover. Once
/// A's session expired by the store's clock — A's holding row is still there, with no expiry
/// of its own — the guard refuses A's write at once; B takes the slot, A's write is still
/// refused, B's lands. A transaction that does not hold
/// the write lock, or that is on another file, is refused whatever the holding.
// covers: Guard.Sqlite, Guard.Deposed, Guard.SqliteImmediate
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_deposed_leaders_guarded_write_is_refused() {
    let dir = ScratchDir::new("vvm-guard-sqlite");
    let path = dir.file("store.sqlite");
    let clock = ManualClock::new();
    let store = SqliteStore::builder()
        .clock(clock.clone())
        .open(&path)
        .unwrap();
    let mut conn = user_connection(&path);
    let ttl = Duration::from_secs(10);

    store
        .create_session(session(1), &value(1), ttl)
        .await
        .unwrap()
        .expect("created");
    let a = match store.acquire(SLOT, session(1)).await.unwrap() {
        Acquired::Written(revision) => token(revision),
        other => panic!("{other:?}"),
    };
    sqlite_guarded_write(&store, &mut conn, a, "a1").expect("A is live");
    assert_eq!(sqlite_data(&conn).as_deref(), Some("a1"));

    // Deferred: the check would not hold the lock until the commit.
    let tx = conn.transaction().unwrap();
    assert!(matches!(
        store.guard(a).check(&tx),
        Err(SqliteGuardError::NotWriteTransaction)
    ));
    // Deferred, having read already: a reader's snapshot, still no lock.
    let _: i64 = tx
        .query_row("SELECT count(*) FROM app", [], |row| row.get(0))
        .unwrap();
    assert!(matches!(
        store.guard(a).check(&tx),
        Err(SqliteGuardError::NotWriteTransaction)
    ));
    drop(tx);
    // Another file.
    let mut elsewhere = user_connection(&dir.file("other.sqlite"));
    let tx = elsewhere
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    assert!(matches!(
        store.guard(a).check(&tx),
        Err(SqliteGuardError::OtherFile { .. })
    ));
    drop(tx);

    // B's session, outliving A's.
    store
        .create_session(session(2), &value(2), ttl * 3)
        .await
        .unwrap()
        .expect("created");
    // A's guarded transaction holds the write lock from its check to its commit: A's session
    // expires meanwhile, and still B cannot take the slot before A's write is committed.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    store.guard(a).check(&tx).expect("A is live");
    clock.advance(ttl + Duration::from_millis(1));
    let during = store.acquire(SLOT, session(2)).await;
    assert!(
        matches!(during, Err(vvm_runtime::StoreError::Failed { .. })),
        "the write lock is A's: {during:?}"
    );
    tx.execute(
        "INSERT OR REPLACE INTO app (k, v) VALUES ('config', 'a2')",
        [],
    )
    .unwrap();
    tx.commit().unwrap();

    // A's session has expired by the store's clock (no keepalive): its holding is over.
    let refused = sqlite_guarded_write(&store, &mut conn, a, "a3");
    assert!(refused.as_ref().is_err_and(SqliteGuardError::is_deposed));
    assert_eq!(deposed(refused), None, "no live record");
    assert_eq!(sqlite_data(&conn).as_deref(), Some("a2"));

    let b = match store.acquire(SLOT, session(2)).await.unwrap() {
        Acquired::Written(revision) => token(revision),
        other => panic!("B did not take the slot: {other:?}"),
    };
    assert_eq!(
        deposed(sqlite_guarded_write(&store, &mut conn, a, "a4")),
        Some(b.revision),
        "the slot is B's: A's write must be refused"
    );
    sqlite_guarded_write(&store, &mut conn, b, "b1").expect("B leads");
    assert_eq!(sqlite_data(&conn).as_deref(), Some("b1"));
}

/// The user's own `BEGIN IMMEDIATE` transaction on `conn`, checked by `guard`: writes `data`
/// and commits when it passes; its answer.
fn sqlite_checked_write(
    guard: &vvm_adapters::sqlite::SqliteGuard,
    conn: &mut Connection,
    data: &str,
) -> Result<(), SqliteGuardError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    guard.check(&tx)?;
    tx.execute(
        "INSERT OR REPLACE INTO app (k, v) VALUES ('config', ?1)",
        [data],
    )
    .unwrap();
    tx.commit().unwrap();
    Ok(())
}

/// A leader by a semaphore grant writes through its grant's guard; its session expires by the
/// store's clock — the semaphore's row still names it owner, as nothing wrote it since — and
/// the guard refuses at once; B is granted, A's write is still refused, B's lands.
// covers: Guard.SqliteGrant, Guard.Deposed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_deposed_grant_holders_guarded_write_is_refused() {
    let dir = ScratchDir::new("vvm-guard-sqlite-grant");
    let path = dir.file("store.sqlite");
    let clock = ManualClock::new();
    let store = SqliteStore::builder()
        .clock(clock.clone())
        .open(&path)
        .unwrap();
    let mut conn = user_connection(&path);

    let a = member(&store, 1).await;
    a.create("leader", 1, Vec::new()).await.unwrap();
    let a_grant = a
        .acquire("leader", AcquireOptions::new(1))
        .await
        .unwrap()
        .expect("granted");
    let a_guard = store.grant_guard(&a_grant);
    sqlite_checked_write(&a_guard, &mut conn, "a1").expect("A leads");

    // A's session expires by the store's clock.
    clock.advance(LeaseConfig::default().lease() + Duration::from_millis(1));
    let refused = sqlite_checked_write(&a_guard, &mut conn, "a2");
    assert!(
        matches!(refused, Err(SqliteGuardError::GrantOver { .. })),
        "A's session expired: {refused:?}"
    );

    let b = member(&store, 2).await;
    let b_grant = b
        .acquire(
            "leader",
            AcquireOptions::new(1).timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .expect("B is granted: A's session expired");
    let b_guard = store.grant_guard(&b_grant);
    let refused = sqlite_checked_write(&a_guard, &mut conn, "a3");
    assert!(
        refused.as_ref().is_err_and(SqliteGuardError::is_deposed),
        "B leads: A's write must be refused: {refused:?}"
    );
    sqlite_checked_write(&b_guard, &mut conn, "b1").expect("B leads");
    assert_eq!(sqlite_data(&conn).as_deref(), Some("b1"));
}

/// A per-slot record (a VVM's own lease) is guarded by the token of its latest write: a
/// renewal writes a new revision, which the VVM's services read as their token; once the
/// record expires and another holder takes the slot, every token of the old tenure is refused.
// covers: Guard.Sqlite, Guard.Deposed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_per_slot_record_is_guarded_by_its_latest_token() {
    let dir = ScratchDir::new("vvm-guard-sqlite-slot");
    let path = dir.file("store.sqlite");
    let clock = ManualClock::new();
    let store = SqliteStore::builder()
        .clock(clock.clone())
        .open(&path)
        .unwrap();
    let mut conn = user_connection(&path);
    let ttl = Duration::from_secs(10);

    let first = store
        .insert_if_not_exists(SLOT, &value(1), ttl)
        .await
        .unwrap()
        .expect("free");
    sqlite_guarded_write(&store, &mut conn, token(first), "first").expect("live");
    let lease = vvm_runtime::Lease {
        value: value(1),
        revision: first,
    };
    let renewed = store
        .compare_and_swap(SLOT, &lease, &value(1), ttl)
        .await
        .unwrap()
        .expect("renewed");
    assert_eq!(
        deposed(sqlite_guarded_write(&store, &mut conn, token(first), "x")),
        Some(renewed),
        "an older token of the tenure is refused: take the token afresh"
    );
    sqlite_guarded_write(&store, &mut conn, token(renewed), "renewed").expect("live");

    clock.advance(ttl + Duration::from_millis(1));
    assert_eq!(
        deposed(sqlite_guarded_write(&store, &mut conn, token(renewed), "x")),
        None
    );
    let other = store
        .insert_if_not_exists(SLOT, &value(2), ttl)
        .await
        .unwrap()
        .expect("expired: free");
    assert_eq!(
        deposed(sqlite_guarded_write(&store, &mut conn, token(renewed), "x")),
        Some(other)
    );
    sqlite_guarded_write(&store, &mut conn, token(other), "other").expect("live");
    assert_eq!(sqlite_data(&conn).as_deref(), Some("other"));
}
