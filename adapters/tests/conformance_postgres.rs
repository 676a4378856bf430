//! The store conformance suite on a real PostgreSQL server: the PostgreSQL mapping under the
//! lease logic that `conformance_txkv.rs` checks in memory. One server is started for the whole
//! test process (`support/postgres.rs`: initdb in a temporary directory, a free loopback port,
//! as `nobody` under root); every store of every case lives in a schema of its own. Expiry is by
//! observation on this process's clock, so letting time pass really sleeps. Without PostgreSQL
//! installed every case prints one line saying it was skipped (under CI it fails instead).

use vvm_test_support::postgres as postgres_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use postgres_support::PgServer;
use vvm_adapters::postgres::{open, PgConfig, PgStore};
use vvm_adapters::txkv::TxOptions;
use vvm_conformance::Harness;

struct Postgres {
    server: &'static PgServer,
}

impl Postgres {
    /// The harness for the running case, or `None` after the skip line.
    fn start() -> Option<Postgres> {
        let case = std::thread::current()
            .name()
            .unwrap_or("conformance_postgres")
            .to_owned();
        Some(Postgres {
            server: PgServer::shared(&case)?,
        })
    }
}

impl Harness for Postgres {
    type Store = PgStore;

    async fn store(&self) -> PgStore {
        static SCHEMAS: AtomicU64 = AtomicU64::new(0);
        let schema = format!("conformance_{}", SCHEMAS.fetch_add(1, Ordering::Relaxed));
        let config = PgConfig::new("127.0.0.1", self.server.port(), "vvm", "postgres")
            .and_then(|config| config.schema(&schema))
            .expect("the configuration is valid");
        open(config, TxOptions::default())
            .await
            .expect("the store opens")
    }

    /// The notes of expiry by observation are per store value: a client shares them (as the
    /// VVMs of one process do), and with them the store's connections.
    async fn client(&self, store: &PgStore) -> PgStore {
        store.clone()
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(4)
    }
}

// covers: Pg.Mapping
vvm_conformance::ttl_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
vvm_conformance::observe_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
vvm_conformance::elections_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
// covers: Pg.Feed
vvm_conformance::feed_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
vvm_conformance::session_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
// covers: Tx.Semaphores
vvm_conformance::semaphore_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Postgres::start() {
        Some(postgres) => postgres,
        None => return,
    }
);
