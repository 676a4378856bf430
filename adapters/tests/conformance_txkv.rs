//! The store conformance suite on the lease logic of the transactional stores (FoundationDB's),
//! run over the in-memory transactional key-value store on tokio's paused clock. Expiry is by
//! observation: the suite's clients are clones of one store, so they share one process's notes.

use std::time::Duration;

use vvm_adapters::txkv::{MemoryKv, TxLeaseStore, TxOptions};
use vvm_conformance::Harness;

struct Txkv;

impl Harness for Txkv {
    type Store = TxLeaseStore<MemoryKv>;

    async fn store(&self) -> Self::Store {
        TxLeaseStore::new(MemoryKv::new(), TxOptions::default())
    }

    async fn client(&self, store: &Self::Store) -> Self::Store {
        store.clone()
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(10)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(20)
    }
}

vvm_conformance::observe_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
vvm_conformance::ttl_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
vvm_conformance::elections_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
vvm_conformance::feed_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
vvm_conformance::session_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
// covers: Tx.Semaphores
vvm_conformance::semaphore_cases!(
    #[tokio::test(start_paused = true)]
    Txkv
);
