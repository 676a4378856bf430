//! A service can follow its VVM's kill deadline (`ServiceContext::kill_deadlines`), to hand it on
//! to a process of its own that must end by the same deadline (what `vvm run -- CMD` does with
//! its supervisor). In a file of its own: `launch.rs` catches a log line through a per-thread
//! subscriber, which a service logging on another thread of the same process can hide.

use vvm_test_support as common;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use common::{campaign_config, pass, TestKiller, LEASE};
use vvm_adapters::MemoryStore;
use vvm_core::{Instant, Slot};
use vvm_runtime::{Service, ServiceContext, ServiceError, Services, Vvm};

/// Records the deadline at start, then every change it is told of.
struct Follower {
    seen: Arc<Mutex<Vec<Instant>>>,
}

impl Service for Follower {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("follower")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let mut deadlines = context.kill_deadlines();
        let first = context
            .kill_deadline()
            .ok_or_else(|| ServiceError::new("no deadline at start"))?;
        assert_eq!(deadlines.current(), Some(first));
        self.seen.lock().unwrap().push(first);
        context.ready();
        let mut shutdown = context.shutdown();
        loop {
            tokio::select! {
                _ = shutdown.requested() => return Ok(()),
                Some(deadline) = deadlines.changed() => self.seen.lock().unwrap().push(deadline),
            }
        }
    }
}

// covers: Rt.KillDeadlines
#[tokio::test(start_paused = true)]
async fn a_service_follows_every_renewal_of_the_kill_deadline() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let services = Services::new()
        .with(Follower { seen: seen.clone() })
        .unwrap();
    let vvm = Vvm::provide(campaign_config("a"), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(vvm.token().is_some_and(|token| token.slot == Slot(1)));
    // Four lease periods: a renewal every L/4, each moving the deadline later.
    pass(LEASE * 4).await;
    let last = vvm.kill_deadline();
    assert_eq!(vvm.shutdown().await, Ok(()));
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() >= 13, "{} deadlines: {seen:?}", seen.len());
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // The service was told of the deadline the VVM held (a renewal may follow it while the
    // shutdown begins).
    let last = last.expect("a deadline while leading");
    assert!(seen.contains(&last), "{last:?} not in {seen:?}");
    // Each renewal moved it by about L/4.
    let step = seen[seen.len() - 1].saturating_since(seen[seen.len() - 2]);
    assert!(step >= LEASE / 8 && step <= LEASE / 2, "{step:?}");
}
