//! The store conformance suite on the memory store, on tokio's paused clock (which is also the
//! store's clock): letting time pass costs nothing.

use std::time::Duration;

use vvm_adapters::MemoryStore;
use vvm_conformance::Harness;

struct Memory;

impl Harness for Memory {
    type Store = MemoryStore;

    async fn store(&self) -> MemoryStore {
        MemoryStore::new()
    }

    async fn client(&self, store: &MemoryStore) -> MemoryStore {
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

vvm_conformance::feed_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
vvm_conformance::observe_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
vvm_conformance::ttl_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
vvm_conformance::elections_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
vvm_conformance::session_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
vvm_conformance::semaphore_cases!(
    #[tokio::test(start_paused = true)]
    Memory
);
