//! No runtime task outlives a VVM: after every shutdown the runtime holds exactly the tasks it
//! held before the launch, over many launch/shutdown cycles.

use vvm_test_support as common;

use common::{config, pass, Journal, TestKiller, Worker};
use vvm_adapters::MemoryStore;
use vvm_runtime::{Services, Vvm};

const CYCLES: usize = 200;

// covers: Rt.NoLeak
#[test]
fn no_runtime_task_remains_after_shutdown_over_200_cycles() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
        let metrics = tokio::runtime::Handle::current().metrics();
        let before = metrics.num_alive_tasks();
        for cycle in 0..CYCLES {
            let services = ["a", "b"].iter().fold(Services::new(), |services, name| {
                let worker = Worker {
                    name,
                    journal: journal.clone(),
                };
                services.with(worker).unwrap()
            });
            let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
                .unwrap()
                .with_killer(killer.thread.clone())
                .launch()
                .await;
            assert!(vvm.current_problem().is_none(), "cycle {cycle}");
            // Driver, pipeline and two services.
            assert_eq!(metrics.num_alive_tasks(), before + 4, "cycle {cycle}");
            pass(common::LEASE / 2).await;
            assert_eq!(vvm.shutdown().await, Ok(()), "cycle {cycle}");
            assert_eq!(metrics.num_alive_tasks(), before, "cycle {cycle}");
        }
        assert_eq!(journal.entries().len(), CYCLES * 4);
    });
}
