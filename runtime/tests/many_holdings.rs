//! Holdings beyond four thousand in one process: every session kept alive on time keeps the
//! process alive, whatever the count, because every session's deadline moves with its own
//! keepalives.

use vvm_test_support as common;

use std::time::Duration;

use common::{pass, TestKiller};
use vvm_adapters::MemoryStore;
use vvm_core::{LeaseConfig, Slot};
use vvm_runtime::{Elections, Tenure};

/// Well beyond 4 096 holdings in one process.
const HOLDINGS: u32 = 4_200;
/// The shortest lease accepted: keepalives every 0.5 s, kill deadline 1.6 s after a confirmed write.
const LEASE: Duration = Duration::from_secs(2);

// covers: Rt.KillerScales
/// 4 200 `Elections` handles on one memory store and one killer, each holding its own slot on
/// its own session and keeping it alive for ten leases: no deadline may pass, and every holding
/// is still held.
#[tokio::test(start_paused = true)]
async fn more_than_four_thousand_renewed_holdings_are_never_killed() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let lease = LeaseConfig::new(LEASE).unwrap();
    let mut handles = Vec::with_capacity(HOLDINGS as usize);
    for index in 1..=HOLDINGS {
        let address = format!("10.0.{}.{}:7000", index / 256, index % 256);
        let elections = Elections::start(store.clone(), &address, lease, &killer.thread).unwrap();
        elections.acquire(Slot(index)).await.unwrap();
        handles.push(elections);
    }

    // Ten leases in steps of a renew interval; the killer's clock follows the driver's.
    for _ in 0..40 {
        pass(lease.renew_interval()).await;
        killer.catch_up();
    }
    let reports = killer.recorder.reports();
    assert!(
        reports.is_empty(),
        "{} kill(s) although every lease was renewed, first: {:?}",
        reports.len(),
        reports.first()
    );
    let held = handles
        .iter()
        .enumerate()
        .filter(|(index, elections)| {
            let slot = Slot(u32::try_from(index + 1).expect("few slots"));
            matches!(elections.tenure(slot), Tenure::Held(_))
        })
        .count();
    assert_eq!(held, HOLDINGS as usize);
    assert_eq!(
        killer.thread.armed().len(),
        HOLDINGS as usize,
        "one deadline each"
    );
    for elections in &handles {
        elections.release_all().await.unwrap();
    }
    assert!(killer.thread.armed().is_empty(), "every release disarmed");
}
