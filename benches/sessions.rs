//! Store calls of sessions, measured the way the runtime makes them (one `block_on` of the
//! store's future on a current-thread tokio runtime):
//!
//! - `keepalive/<store>/<n>`: one keepalive of a session holding `n` slots (0 and 100 000): the
//!   cost must not grow with `n`;
//! - `acquire_release/<store>`: acquiring a free slot on a live session and releasing it;
//! - `cas/<store>`: the per-slot renewal (compare-and-swap) it replaces, for comparison.
//!
//! Stores: the memory store, the transactional store on its in-memory key-value model (the logic
//! FoundationDB runs), and SQLite (a file in a scratch directory). Run:
//! `cargo bench --bench sessions`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tokio::runtime::Runtime;
use vvm::adapters::txkv::{MemoryKv, TxLeaseStore, TxOptions};
use vvm::adapters::{MemoryStore, SqliteStore};
use vvm::{
    lifecycle::{Incarnation, Revision},
    session::{LeaseValue, SessionId, SessionKey},
    store::{Acquired, Lease, SessionStore},
    Slot,
};

const TTL: Duration = Duration::from_secs(3600);
const HOLDINGS: [u32; 2] = [0, 100_000];

fn value() -> LeaseValue {
    LeaseValue {
        address: "10.0.0.1:7000".into(),
        incarnation: Incarnation(0x5eed),
        stopping: false,
    }
}

fn key() -> SessionKey {
    SessionKey {
        incarnation: Incarnation(0x5eed),
        id: SessionId(1),
    }
}

/// A session on `store` holding slots `0..holdings`; its revision.
fn session<S: SessionStore>(runtime: &Runtime, store: &S, holdings: u32) -> Revision {
    runtime.block_on(async {
        let revision = store
            .create_session(key(), &value(), TTL)
            .await
            .expect("runs")
            .expect("created");
        for slot in 0..holdings {
            let acquired = store.acquire(Slot(slot), key()).await.expect("runs");
            assert!(matches!(acquired, Acquired::Written(_)), "{acquired:?}");
        }
        revision
    })
}

fn keepalive<S: SessionStore>(c: &mut Criterion, name: &str, fresh: impl Fn() -> S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("keepalive");
    for holdings in HOLDINGS {
        let store = fresh();
        let mut revision = session(&runtime, &store, holdings);
        group.bench_function(BenchmarkId::new(name, holdings), |b| {
            b.iter(|| {
                revision = runtime
                    .block_on(store.keep_alive(key(), revision, TTL))
                    .expect("runs")
                    .expect("kept alive");
            })
        });
    }
    group.finish();
}

fn acquire_release<S: SessionStore>(c: &mut Criterion, name: &str, store: S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    session(&runtime, &store, 0);
    c.bench_function(&format!("acquire_release/{name}"), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let Acquired::Written(revision) =
                    store.acquire(Slot(1), key()).await.expect("runs")
                else {
                    panic!("slot 1 is free");
                };
                let lease = Lease {
                    value: value(),
                    revision,
                };
                assert!(store
                    .compare_and_delete(Slot(1), &lease)
                    .await
                    .expect("runs"));
            })
        })
    });
    let mut lease = runtime.block_on(async {
        let revision = store
            .insert_if_not_exists(Slot(2), &value(), TTL)
            .await
            .expect("runs")
            .expect("free");
        Lease {
            value: value(),
            revision,
        }
    });
    c.bench_function(&format!("cas/{name}"), |b| {
        b.iter(|| {
            lease.revision = runtime
                .block_on(store.compare_and_swap(Slot(2), &lease, &value(), TTL))
                .expect("runs")
                .expect("ours");
        })
    });
}

fn txkv() -> TxLeaseStore<MemoryKv> {
    TxLeaseStore::new(MemoryKv::new(), TxOptions::default())
}

/// A SQLite store on a fresh file under `dir`.
fn sqlite(dir: &std::path::Path) -> impl Fn() -> SqliteStore + '_ {
    let files = std::sync::atomic::AtomicU32::new(0);
    move || {
        let n = files.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        SqliteStore::open(dir.join(format!("bench-{n}.sqlite"))).expect("the store opens")
    }
}

fn benches(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("vvm-bench-sessions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    keepalive(c, "memory", MemoryStore::new);
    keepalive(c, "txkv", txkv);
    keepalive(c, "sqlite", sqlite(&dir));
    acquire_release(c, "memory", MemoryStore::new());
    acquire_release(c, "txkv", txkv());
    let store = SqliteStore::open(dir.join("acquire.sqlite")).expect("the store opens");
    acquire_release(c, "sqlite", store);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group! {
    name = group;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(group);
