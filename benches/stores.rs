//! Latency of one lease renewal (compare-and-swap) on each store, measured the way the runtime
//! calls it: one `block_on` of the store's future on a current-thread tokio runtime.
//!
//! - `cas/memory`: the memory store (a mutex and a hash map);
//! - `cas/sqlite`: the SQLite store as shipped (WAL, `synchronous=NORMAL`, `spawn_blocking`);
//! - `cas/sqlite_raw_normal`, `cas/sqlite_raw_full`: the same transaction (lock, read, bump the
//!   counter, write) on a bare rusqlite connection, without the store around it, with
//!   `synchronous=NORMAL` and `FULL`: what the store adds, and what a disk sync per commit costs;
//! - `cas/sqlite_contended` and `cas/sqlite_raw_contended_default_handler`: while another
//!   connection commits in a loop (one commit, then [`HOG_PAUSE`]: thousands of commits per
//!   second, far more than any set of VVMs renews), the store with its short polls, and the bare
//!   transaction with SQLite's own busy handler, whose growing sleeps keep missing the free
//!   windows.
//!
//! Files go to a scratch directory under the system's temporary directory (a real disk here,
//! not tmpfs, or `FULL` would be free). Run: `cargo bench --bench stores`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use rusqlite::{Connection, TransactionBehavior};
use vvm::{
    lifecycle::Incarnation,
    session::LeaseValue,
    store::{Lease, LeaseStore},
    Slot,
};
use vvm_adapters::{MemoryStore, SqliteStore};

/// The contended store's lock wait: long enough that no renewal fails during the run.
const CONTENDED_BUSY_WAIT: Duration = Duration::from_secs(1);

/// What the other writer does between two commits.
const HOG_PAUSE: Duration = Duration::from_micros(200);

const SLOT: Slot = Slot(1);
const TTL: Duration = Duration::from_secs(20);

fn value() -> LeaseValue {
    LeaseValue {
        address: "10.0.0.1:7000".into(),
        incarnation: Incarnation(0x5eed),
        stopping: false,
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("vvm-bench-stores-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Renews one lease over and over: each iteration swaps the current record for itself.
fn bench_store<S: LeaseStore>(c: &mut Criterion, name: &str, store: S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let value = value();
    let revision = runtime
        .block_on(store.insert_if_not_exists(SLOT, &value, TTL))
        .expect("insert succeeds")
        .expect("insert wins");
    let mut lease = Lease { value, revision };
    c.bench_function(name, |b| {
        b.iter(|| {
            let revision = runtime
                .block_on(store.compare_and_swap(SLOT, &lease, &lease.value, TTL))
                .expect("swap succeeds")
                .expect("swap wins");
            lease.revision = revision;
        })
    });
}

/// The store's renewal transaction on a bare connection.
fn bench_raw(c: &mut Criterion, name: &str, path: &Path, synchronous: &str) {
    let mut conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    conn.query_row("PRAGMA journal_mode = WAL", [], |row| {
        row.get::<_, String>(0)
    })
    .expect("WAL");
    conn.pragma_update(None, "synchronous", synchronous)
        .expect("synchronous");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, revision INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS leases (slot INTEGER PRIMARY KEY, value BLOB NOT NULL,
             revision INTEGER NOT NULL, boot_id TEXT NOT NULL, expires_ns INTEGER NOT NULL);
         INSERT OR IGNORE INTO counter VALUES (0, 0);",
    )
    .expect("schema");
    let bytes = value().encode().into_bytes();
    c.bench_function(name, |b| {
        b.iter(|| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .expect("begin");
            let _current: Option<i64> = tx
                .prepare_cached("SELECT revision FROM leases WHERE slot = ?1")
                .expect("prepare")
                .query_row([1], |row| row.get(0))
                .ok();
            let revision: i64 = tx
                .prepare_cached(
                    "UPDATE counter SET revision = revision + 1 WHERE id = 0 RETURNING revision",
                )
                .expect("prepare")
                .query_row([], |row| row.get(0))
                .expect("counter");
            tx.prepare_cached("INSERT OR REPLACE INTO leases VALUES (1, ?1, ?2, 'boot', ?3)")
                .expect("prepare")
                .execute((bytes.as_slice(), revision, revision))
                .expect("write");
            tx.commit().expect("commit");
        })
    });
}

fn stores(c: &mut Criterion) {
    let scratch = Scratch::new();
    bench_store(c, "cas/memory", MemoryStore::new());
    let sqlite = SqliteStore::open(scratch.file("store.sqlite")).expect("store opens");
    bench_store(c, "cas/sqlite", sqlite);
    let normal = scratch.file("raw-normal.sqlite");
    bench_raw(c, "cas/sqlite_raw_normal", &normal, "NORMAL");
    bench_raw(
        c,
        "cas/sqlite_raw_full",
        &scratch.file("raw-full.sqlite"),
        "FULL",
    );

    let path = scratch.file("contended.sqlite");
    let contended = SqliteStore::builder()
        .busy_wait(CONTENDED_BUSY_WAIT)
        .open(&path)
        .expect("store opens");
    let stop = Arc::new(AtomicBool::new(false));
    let hog = std::thread::spawn({
        let (path, stop) = (path.clone(), Arc::clone(&stop));
        move || commit_in_a_loop(&path, &stop)
    });
    bench_store(c, "cas/sqlite_contended", contended);
    bench_raw(
        c,
        "cas/sqlite_raw_contended_default_handler",
        &path,
        "NORMAL",
    );
    stop.store(true, Ordering::Relaxed);
    let commits = hog.join().expect("the other writer ends");
    eprintln!("the other connection committed {commits} times meanwhile");
}

/// Commits one small write after another until `stop`; returns how many.
fn commit_in_a_loop(path: &Path, stop: &AtomicBool) -> u64 {
    let conn = Connection::open(path).expect("open");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let mut commits = 0;
    while !stop.load(Ordering::Relaxed) {
        conn.execute_batch(
            "BEGIN IMMEDIATE;
             UPDATE vvm_leases SET expires_ns = expires_ns WHERE slot = 2;
             UPDATE vvm_store SET revision = revision + 1 WHERE id = 0;
             COMMIT;",
        )
        .expect("the other writer commits");
        commits += 1;
        std::thread::sleep(HOG_PAUSE);
    }
    commits
}

criterion_group!(benches, stores);
criterion_main!(benches);
