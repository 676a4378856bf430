//! The PostgreSQL store on a real server started by the bench (`test-support/src/postgres.rs`:
//! initdb in a temporary directory, loopback, `fsync=off`), measured the way the runtime calls
//! it: one `block_on` of the store's future on a tokio runtime.
//!
//! - `postgres/acquire_release`: an insert on a free slot, then the compare-and-delete that
//!   releases it (two transactions);
//! - `postgres/renew`: one renewal (compare-and-swap of the record for itself), as a keepalive;
//! - `postgres/hand_off`: a holder releases, and a waiting candidate on another store handle
//!   (its own connections and listener) is woken by its change feed (`LISTEN`/`NOTIFY`) and
//!   inserts: from the start of the release to the end of the successor's insert.
//!
//! Run: `cargo bench --features postgres --bench postgres` (skipped, one line, without
//! PostgreSQL installed).

use vvm_test_support::postgres as postgres_support;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use postgres_support::PgServer;
use vvm::{
    lifecycle::Incarnation,
    session::LeaseValue,
    store::{Lease, LeaseStore},
    Slot,
};
use vvm_adapters::postgres::{open, PgConfig, PgStore};
use vvm_adapters::txkv::TxOptions;

const TTL: Duration = Duration::from_secs(20);

fn value(n: u64) -> LeaseValue {
    LeaseValue {
        address: format!("10.0.0.{n}:7000"),
        incarnation: Incarnation(n),
        stopping: false,
    }
}

async fn store(server: &PgServer) -> PgStore {
    let config = PgConfig::new("127.0.0.1", server.port(), "vvm", "postgres")
        .and_then(|config| config.schema("bench"))
        .expect("the configuration is valid");
    open(config, TxOptions::default())
        .await
        .expect("the store opens")
}

fn postgres(c: &mut Criterion) {
    let Some(server) = PgServer::start("postgres bench") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let holder = runtime.block_on(store(&server));
    let waiter = runtime.block_on(store(&server));

    let mine = value(1);
    c.bench_function("postgres/acquire_release", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let revision = holder
                    .insert_if_not_exists(Slot(1), &mine, TTL)
                    .await
                    .expect("insert succeeds")
                    .expect("insert wins");
                let lease = Lease {
                    value: mine.clone(),
                    revision,
                };
                assert!(holder.compare_and_delete(Slot(1), &lease).await.unwrap());
            })
        })
    });

    let revision = runtime
        .block_on(holder.insert_if_not_exists(Slot(2), &mine, TTL))
        .expect("insert succeeds")
        .expect("insert wins");
    let mut lease = Lease {
        value: mine.clone(),
        revision,
    };
    c.bench_function("postgres/renew", |b| {
        b.iter(|| {
            lease.revision = runtime
                .block_on(holder.compare_and_swap(Slot(2), &lease, &mine, TTL))
                .expect("swap succeeds")
                .expect("swap wins");
        })
    });

    // Each iteration: slot 3 is held by `from`; `to` waits on its feed; `from` releases; `to`
    // is woken and inserts. Then the roles swap.
    let theirs = value(2);
    c.bench_function("postgres/hand_off", |b| {
        b.iter_custom(|iterations| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                let (mut from, mut to) = ((&holder, &mine), (&waiter, &theirs));
                let revision = from
                    .0
                    .insert_if_not_exists(Slot(3), from.1, TTL)
                    .await
                    .unwrap()
                    .expect("slot 3 is free");
                let mut held = Lease {
                    value: from.1.clone(),
                    revision,
                };
                for _ in 0..iterations {
                    // The waiter's refused insert, then its feed, as a candidate does.
                    assert!(to
                        .0
                        .insert_if_not_exists(Slot(3), to.1, TTL)
                        .await
                        .unwrap()
                        .is_none());
                    let changed = to.0.changed(&[Slot(3)]);
                    let wait = tokio::spawn(changed);
                    // Let the feed's round register its watch.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let started = Instant::now();
                    assert!(from.0.compare_and_delete(Slot(3), &held).await.unwrap());
                    wait.await.expect("the feed resolves");
                    let revision =
                        to.0.insert_if_not_exists(Slot(3), to.1, TTL)
                            .await
                            .unwrap()
                            .expect("the released slot is free");
                    total += started.elapsed();
                    held = Lease {
                        value: to.1.clone(),
                        revision,
                    };
                    std::mem::swap(&mut from, &mut to);
                }
                assert!(from.0.compare_and_delete(Slot(3), &held).await.unwrap());
                total
            })
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(5));
    targets = postgres
}
criterion_main!(benches);
