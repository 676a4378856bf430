//! An acquire whose outcome is unknown (the store may have applied it; the answer was lost) is
//! withdrawn by the runtime, so that it holds no units until its session ends.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::{coordination, TestKiller};
use vvm::{AcquireOptions, CoordinationError, StoreError};

/// Applies the next semaphore transaction and reports its outcome as unknown, once.
#[derive(Clone, Default)]
struct LoseNextAnswer(Arc<Mutex<bool>>);

impl Hook for LoseNextAnswer {
    fn fault(&self, call: Call) -> Fault {
        let mut armed = self.0.lock().unwrap();
        match call {
            Call::Semaphore if *armed => {
                *armed = false;
                Fault::UnknownApplied
            }
            _ => Fault::None,
        }
    }
}

type Store = Faulty<LoseNextAnswer>;

/// The acquire was granted in the store but its answer lost: the caller gets the unknown
/// outcome, and the grant it never saw is released, so another session gets the units at once
/// instead of when the first session ends.
// covers: Sem.RequestIds
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_of_unknown_outcome_is_withdrawn() {
    let store = Store::default();
    let killer = TestKiller::new();
    let a = coordination(&store, 1, &killer).await;
    let b = coordination(&store, 2, &killer).await;
    a.create("lock", 1, Vec::new()).await.expect("created");

    *store.hook.0.lock().unwrap() = true;
    let unknown = a.acquire("lock", AcquireOptions::new(1)).await;
    assert!(
        matches!(
            unknown,
            Err(CoordinationError::Store(StoreError::Unknown { .. }))
        ),
        "{unknown:?}"
    );
    // The withdrawal runs in the background; the session stays open throughout.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let owners = a.describe("lock").await.expect("described").owners;
        if owners.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "the grant nobody saw still holds the units: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let granted = b
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await
        .expect("runs");
    assert!(granted.is_some(), "the units are free for another session");
    // The first session's claim on the name was given back: its next acquire runs (and finds
    // the units taken).
    let again = a
        .acquire("lock", AcquireOptions::new(1).timeout(Duration::ZERO))
        .await;
    assert!(matches!(again, Ok(None)), "{again:?}");
}
