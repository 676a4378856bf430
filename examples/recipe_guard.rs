//! Fenced writes: the leader's writes to the application's own data go through a guard in the
//! same store transaction, so that a write of a deposed leader — one delayed past its tenure
//! by a pause or a slow network — is refused by the store itself, not by the leader's belief
//! that it still leads. etcd's `Mutex.IsOwner()` compare, on etcd and on SQLite.
//!
//! ```text
//! cargo run --features open,sqlite,etcd --example recipe_guard sqlite:/tmp/recipe_guard.sqlite
//! cargo run --features open,sqlite,etcd --example recipe_guard etcd://127.0.0.1:2379
//! ```
//!
//! Leader A writes the configuration under its guard; A's session ends without it (removed
//! from outside, as an expiry during a pause would end it); B is elected and writes under its
//! own guard; A's next write, made under its old token, is refused.

use std::error::Error;

use vvm::adapters::etcd::etcd_client::{Txn, TxnOp};
use vvm::adapters::open::{open, AnyStore};
use vvm::adapters::sqlite::rusqlite::{Connection, TransactionBehavior};
use vvm::adapters::sqlite::SqliteGuardError;
use vvm::{store::SessionStore, Elections, FencingToken, KillerThread, LeaseConfig, Slot};

type BoxError = Box<dyn Error + Send + Sync>;

/// The application's own data: the key on etcd, the row on SQLite.
const CONFIG: &str = "app/config";

/// Writes `value` as the application's configuration, guarded by the holding of `token`:
/// whether it landed (`false`: the holding was over, nothing was written).
async fn guarded_write(
    store: &AnyStore,
    token: FencingToken,
    value: &str,
) -> Result<bool, BoxError> {
    match store {
        AnyStore::Etcd(store) => {
            let guard = store.guard(token)?;
            // The guard's comparisons, and any of the application's own, in one `when`.
            let txn = Txn::new()
                .when(guard.compares())
                .and_then([TxnOp::put(CONFIG, value, None)]);
            Ok(store.kv_client().txn(txn).await?.succeeded())
        }
        AnyStore::Sqlite(store) => {
            let (path, guard, value) = (store.path().to_owned(), store.guard(token), value.to_owned());
            // rusqlite blocks: off the async workers.
            tokio::task::spawn_blocking(move || -> Result<bool, BoxError> {
                let mut conn = Connection::open(path)?;
                conn.busy_timeout(std::time::Duration::from_secs(5))?;
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS app_data (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
                    [],
                )?;
                // IMMEDIATE: the write lock is held from the check to the commit, so no other
                // holder can take the slot in between.
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                match guard.check(&tx) {
                    Ok(()) => {}
                    Err(SqliteGuardError::Deposed { .. }) => return Ok(false),
                    Err(error) => return Err(error.into()),
                }
                tx.execute(
                    "INSERT OR REPLACE INTO app_data (key, value) VALUES (?1, ?2)",
                    [CONFIG, value.as_str()],
                )?;
                tx.commit()?;
                Ok(true)
            })
            .await?
        }
        _ => Err(format!("{store:?}: guards are for etcd and SQLite, whose transactions the application writes itself").into()),
    }
}

/// Reads the application's configuration back.
async fn read_config(store: &AnyStore) -> Result<Option<String>, BoxError> {
    match store {
        AnyStore::Etcd(store) => {
            let got = store.kv_client().get(CONFIG, None).await?;
            Ok(got
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
        }
        AnyStore::Sqlite(store) => {
            let conn = Connection::open(store.path())?;
            Ok(conn
                .query_row(
                    "SELECT value FROM app_data WHERE key = ?1",
                    [CONFIG],
                    |row| row.get(0),
                )
                .ok())
        }
        _ => Ok(None),
    }
}

/// A leads and writes, and is deposed; B leads and writes; A's late write is refused. Returns each
/// write's writer and whether it landed, and the configuration in the end.
pub async fn run(
    store: AnyStore,
    killer: &KillerThread,
) -> Result<(Vec<(&'static str, bool)>, Option<String>), BoxError> {
    let lease = LeaseConfig::default();
    let slot = Slot(1);
    let mut writes = Vec::new();

    // Each candidate's session carries a fresh random incarnation (`Elections::start`).
    let a = Elections::start(store.clone(), "10.0.0.1:7000", lease, killer)?;
    let a_token = a.acquire(slot).await?;
    let landed = guarded_write(&store, a_token, "from 10.0.0.1").await?;
    println!("A (token {a_token:?}) writes: landed = {landed}");
    writes.push(("A", landed));

    // A is deposed without knowing it yet: its session ends in the store — here removed from
    // outside, as `etcdctl lease revoke` would, or its expiry while A is paused. A's kill
    // deadline stays armed: were this process to go on, it would end before A's lease could
    // have run out. The killer stops A's work; the guard stops A's writes already under way.
    let a_session = a.session().ok_or("A holds its slot on a session")?;
    if let Some(record) = store.get_session(a_session).await? {
        store.delete_session(a_session, record.revision).await?;
    }
    // B is elected.
    let b = Elections::start(store.clone(), "10.0.0.2:7000", lease, killer)?;
    let b_token = b.acquire(slot).await?;
    let landed = guarded_write(&store, b_token, "from 10.0.0.2").await?;
    println!("B (token {b_token:?}) writes: landed = {landed}");
    writes.push(("B", landed));

    // A's write, made under its old token, arrives late: the store refuses it.
    let landed = guarded_write(&store, a_token, "late, from 10.0.0.1").await?;
    println!("A's late write: landed = {landed}");
    writes.push(("A late", landed));

    let config = read_config(&store).await?;
    println!("config: {config:?}");
    b.cleanup().await;
    a.cleanup().await;
    Ok((writes, config))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The process-wide killer: this process ends before a session it cannot keep could let
    // another leader act beside it.
    let killer = KillerThread::global();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "sqlite:/tmp/recipe_guard.sqlite".to_owned());
    let store = open(&url, &LeaseConfig::default()).await?;
    run(store, &killer).await?;
    Ok(())
}
