//! The VVM suite: whole VVMs launched against the memory store on tokio's paused clock, with a
//! recording killer. Test VVMs lease for 20 s and try to acquire for 3 s, one round a second.

use vvm_test_support as common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    config, foreign, pass, FailsLater, FailsToStart, IgnoresStop, Journal, NeverReady, TestKiller,
    Worker, LEASE,
};
use tokio::sync::Notify;
use vvm_adapters::MemoryStore;
use vvm_core::{LossReason, Phase, Slot};
use vvm_runtime::{discovery::leaders, ErrorChain, ServiceError, Services, Vvm, VvmError};

const SLOT: Slot = Slot(1);

fn workers(journal: &Journal, names: &[&'static str]) -> Services {
    names.iter().fold(Services::new(), |services, name| {
        let worker = Worker {
            name,
            journal: journal.clone(),
        };
        services.with(worker).unwrap()
    })
}

// covers: Rt.ServiceOrder, Rt.Discovery
#[tokio::test(start_paused = true)]
async fn a_vvm_starts_its_services_in_order_and_stops_them_in_reverse() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let services = workers(&journal, &["a", "b", "c"]);
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;

    assert_eq!(vvm.phase(), Phase::Running);
    assert_eq!(vvm.current_problem(), None);
    let token = vvm.token().unwrap();
    assert_eq!(token.slot, SLOT);
    assert_eq!(journal.entries(), ["start a", "start b", "start c"]);

    let table = leaders(&store, 1, Duration::from_secs(1)).await.unwrap();
    let (holder, held_token) = table[0].holder.clone().unwrap();
    assert_eq!(holder.address, "10.0.0.1:7000");
    assert_eq!(held_token, token);

    assert_eq!(vvm.shutdown().await, Ok(()));
    let stops = &journal.entries()[3..];
    assert_eq!(stops, ["stop c", "stop b", "stop a"]);
}

// covers: Rt.Collision
#[tokio::test(start_paused = true)]
async fn a_second_vvm_for_the_only_slot_fails_to_acquire_and_the_first_shuts_down_cleanly() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let first = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert_eq!(first.phase(), Phase::Running);

    let second = Vvm::provide(config("10.0.0.2:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let expected = VvmError::AcquisitionFailed {
        slots: 1,
        acquisition: Duration::from_secs(3),
        refusals: vec![vvm_runtime::SlotRefusal {
            slot: SLOT,
            reason: vvm_runtime::RefusalReason::HeldBy("10.0.0.1:7000".into()),
        }],
    };
    assert_eq!(second.current_problem(), Some(expected.clone()));
    assert_eq!(second.problem().await, expected);
    assert_eq!(second.token(), None);
    assert_eq!(second.shutdown().await, Err(expected));

    let record = store.record(SLOT).unwrap().unwrap();
    assert_eq!(
        record.value.address, "10.0.0.1:7000",
        "the loser never touched the slot"
    );
    assert_eq!(first.shutdown().await, Ok(()));
}

// covers: Rt.Release
#[tokio::test(start_paused = true)]
async fn manual_shutdown_releases_the_key() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    // Renewals keep the record alive well past one lease.
    pass(LEASE * 2).await;
    let before = store.record(SLOT).unwrap().unwrap();
    assert_eq!(before.value.address, "10.0.0.1:7000");
    assert_eq!(Some(before.revision), vvm.token().map(|t| t.revision));

    assert_eq!(vvm.shutdown().await, Ok(()));
    assert_eq!(store.record(SLOT).unwrap(), None);
}

// covers: Rt.ServiceProblem, Rt.ServiceOrder
#[tokio::test(start_paused = true)]
async fn a_service_that_fails_to_start_becomes_the_problem_shutdown_returns() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let failing = FailsToStart {
        message: "port 8080 is taken",
        journal: journal.clone(),
    };
    let later = Worker {
        name: "never",
        journal: journal.clone(),
    };
    let services = workers(&journal, &["first"])
        .with(failing)
        .unwrap()
        .with(later)
        .unwrap();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;

    let expected = VvmError::ServiceStartFailed {
        index: 1,
        name: "fails-to-start".into(),
        source: ServiceError::new("port 8080 is taken"),
    };
    assert_eq!(vvm.problem().await, expected);
    assert_eq!(vvm.shutdown().await, Err(expected.clone()));
    assert_eq!(
        ErrorChain(&expected).to_string(),
        "service #1 `fails-to-start` failed to start: port 8080 is taken"
    );
    assert_eq!(
        journal.entries(),
        ["start first", "start fails-to-start", "stop first"]
    );
    assert_eq!(store.record(SLOT).unwrap(), None);
}

// covers: Rt.ServiceProblem
#[tokio::test(start_paused = true)]
async fn a_running_service_that_fails_becomes_the_problem() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let trigger = Arc::new(Notify::new());
    let services = Services::new()
        .with(FailsLater {
            trigger: trigger.clone(),
        })
        .unwrap();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert_eq!(vvm.current_problem(), None);

    trigger.notify_one();
    let expected = VvmError::ServiceFailed {
        index: 0,
        name: "fails-later".into(),
        source: ServiceError::new("disk full"),
    };
    assert_eq!(vvm.problem().await, expected);
    assert_eq!(vvm.shutdown().await, Err(expected));
}

// covers: Rt.LossProblem
#[tokio::test(start_paused = true)]
async fn an_overwritten_key_raises_leadership_lost_and_shutdown_returns_it() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(
        config("10.0.0.1:7000", 1),
        store.clone(),
        workers(&journal, &["a"]),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;

    let other = foreign("10.0.0.9:7000");
    store.overwrite(SLOT, &other).unwrap().unwrap();
    let problem = vvm.problem();
    let copy = problem.clone();
    let expected = VvmError::LeadershipLost {
        slot: SLOT,
        reason: LossReason::Overtaken,
    };
    assert_eq!(problem.await, expected);
    assert_eq!(
        copy.await,
        expected,
        "every clone resolves with the same problem"
    );
    // The loss stops the services at once, without waiting for the host.
    tokio::task::yield_now().await;
    assert_eq!(journal.entries(), ["start a", "stop a"]);

    assert_eq!(vvm.shutdown().await, Err(expected));
    assert_eq!(journal.entries(), ["start a", "stop a"]);
    assert_eq!(
        store.record(SLOT).unwrap().unwrap().value,
        other,
        "the new holder's record stays"
    );
}

// covers: Rt.Collision, Rt.Discovery
#[tokio::test(start_paused = true)]
async fn three_vvms_hold_three_slots_and_a_fourth_fails_to_acquire() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let mut running = Vec::new();
    for n in 1..=3 {
        let vvm = Vvm::provide(
            config(&format!("10.0.0.{n}:7000"), 3),
            store.clone(),
            Services::new(),
        )
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
        assert_eq!(vvm.current_problem(), None);
        running.push(vvm);
    }
    let mut slots: Vec<u32> = running
        .iter()
        .map(|vvm| vvm.token().unwrap().slot.0)
        .collect();
    slots.sort_unstable();
    assert_eq!(slots, [1, 2, 3]);

    let fourth = Vvm::provide(config("10.0.0.4:7000", 3), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(matches!(
        fourth.current_problem(),
        Some(VvmError::AcquisitionFailed { slots: 3, .. })
    ));

    let table = leaders(&store, 3, Duration::from_secs(1)).await.unwrap();
    let holders: Vec<String> = table
        .iter()
        .map(|s| s.holder.clone().unwrap().0.address)
        .collect();
    assert_eq!(holders.len(), 3);
    assert!(!holders.contains(&"10.0.0.4:7000".to_owned()));

    assert!(fourth.shutdown().await.is_err());
    for vvm in running {
        assert_eq!(vvm.shutdown().await, Ok(()));
    }
    let table = leaders(&store, 3, Duration::from_secs(1)).await.unwrap();
    assert!(table.iter().all(|slot| slot.holder.is_none()));
}

// covers: Rt.Drop
#[tokio::test(start_paused = true)]
async fn dropping_a_launched_vvm_shuts_it_down_in_the_background() {
    let (store, killer, journal) = (MemoryStore::new(), TestKiller::new(), Journal::default());
    let vvm = Vvm::provide(
        config("10.0.0.1:7000", 1),
        store.clone(),
        workers(&journal, &["a"]),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    assert!(store.record(SLOT).unwrap().is_some());

    drop(vvm);
    pass(Duration::from_secs(1)).await;
    assert_eq!(journal.entries(), ["start a", "stop a"]);
    assert_eq!(store.record(SLOT).unwrap(), None);
}

// covers: Rt.Drop
#[tokio::test(start_paused = true)]
async fn abandoning_a_launch_mid_acquisition_ends_the_vvm_without_a_trace() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    store.set(SLOT, &foreign("10.0.0.9:7000"), LEASE).unwrap();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone());
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();

    tokio::select! {
        _ = vvm.launch() => panic!("the slot is held by another VVM"),
        () = pass(Duration::from_millis(1500)) => {}
    }
    pass(Duration::from_secs(1)).await;
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        before
    );
    assert_eq!(
        store.record(SLOT).unwrap().unwrap().value.address,
        "10.0.0.9:7000"
    );
}

// covers: Rt.ServiceProblem
#[tokio::test(start_paused = true)]
async fn a_service_that_never_reports_readiness_fails_after_the_start_timeout() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let services = Services::new().with(NeverReady).unwrap();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .with_service_timeouts(Duration::from_secs(2), Duration::from_secs(1))
        .launch()
        .await;

    let problem = vvm.current_problem();
    assert!(
        matches!(&problem, Some(VvmError::ServiceStartFailed { index: 0, source, .. }) if source.message().contains("readiness")),
        "{problem:?}"
    );
    assert!(vvm.shutdown().await.is_err());
    assert_eq!(store.record(SLOT).unwrap(), None);
}

// covers: Rt.ServiceProblem, Rt.NoLeak, Rt.CleanStop
#[tokio::test(start_paused = true)]
async fn a_service_that_ignores_the_stop_is_aborted_and_reported() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let services = Services::new().with(IgnoresStop).unwrap();
    let before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let vvm = Vvm::provide(config("10.0.0.1:7000", 1), store.clone(), services)
        .unwrap()
        .with_killer(killer.thread.clone())
        .with_service_timeouts(Duration::from_secs(2), Duration::from_secs(1))
        .launch()
        .await;
    assert_eq!(vvm.current_problem(), None);

    let outcome = vvm.shutdown().await;
    assert!(
        matches!(&outcome, Err(VvmError::ServiceFailed { index: 0, source, .. }) if source.message().contains("did not stop")),
        "{outcome:?}"
    );
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        before
    );
    assert_eq!(
        store.record(SLOT).unwrap(),
        None,
        "the lease is released anyway"
    );
    assert_eq!(
        killer.thread.armed().len(),
        1,
        "an aborted service makes the stop unclean: the deadline stays"
    );
}

/// A candidate that waits 60 s between rounds: only a change feed can make it lead sooner.
fn patient_config(address: &str) -> vvm_core::VvmConfig {
    vvm_core::VvmConfig::builder(address)
        .lease(LEASE)
        .acquisition(Duration::from_secs(600))
        .round_interval(Duration::from_secs(60))
        .build()
        .unwrap()
}

// covers: VVM.TryAtChange, St.ChangeFeed
#[tokio::test(start_paused = true)]
async fn a_waiting_candidate_takes_a_released_slot_at_once_not_at_its_next_round() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    let holder = Vvm::provide(
        patient_config("10.0.0.1:7000"),
        store.clone(),
        Services::new(),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch()
    .await;
    assert_eq!(holder.phase(), Phase::Running);

    let candidate = Vvm::provide(
        patient_config("10.0.0.2:7000"),
        store.clone(),
        Services::new(),
    )
    .unwrap()
    .with_killer(killer.thread.clone())
    .launch();
    let candidate = tokio::spawn(candidate);
    // Refused, now between rounds (the next one is 60 s away).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!candidate.is_finished());

    let released_at = tokio::time::Instant::now();
    assert_eq!(holder.shutdown().await, Ok(()));
    let candidate = candidate.await.unwrap();
    let waited = released_at.elapsed();
    assert_eq!(candidate.phase(), Phase::Running);
    assert_eq!(candidate.token().unwrap().slot, SLOT);
    // Without the feed it would lead at its next round, 58 s later.
    assert!(waited < Duration::from_secs(1), "led after {waited:?}");
    assert_eq!(candidate.shutdown().await, Ok(()));
}

// covers: Rt.AcquisitionWhy
#[tokio::test(start_paused = true)]
async fn a_failed_acquisition_names_each_slot_and_why_it_was_not_won() {
    let (store, killer) = (MemoryStore::new(), TestKiller::new());
    // Slot 1: bytes no VVM wrote; slot 2: another VVM's live record.
    store
        .set_raw(
            Slot(1),
            b"not a lease record".to_vec(),
            Duration::from_secs(600),
        )
        .unwrap();
    let other = foreign("10.0.0.9:7000");
    store
        .set(Slot(2), &other, Duration::from_secs(600))
        .unwrap();
    let vvm = Vvm::provide(config("10.0.0.2:7000", 2), store.clone(), Services::new())
        .unwrap()
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let problem = vvm.problem().await;
    let VvmError::AcquisitionFailed { refusals, .. } = &problem else {
        panic!("{problem:?}");
    };
    assert_eq!(refusals.len(), 2, "{problem}");
    assert_eq!(refusals[0].slot, Slot(1));
    assert!(
        matches!(&refusals[0].reason, vvm_runtime::RefusalReason::Store(why) if why.contains("corrupt")),
        "{problem}"
    );
    assert_eq!(refusals[1].slot, Slot(2));
    assert_eq!(
        refusals[1].reason,
        vvm_runtime::RefusalReason::HeldBy("10.0.0.9:7000".into())
    );
    let shown = problem.to_string();
    assert!(
        shown.starts_with("no slot out of 2 was acquired within 3s: slot 1: "),
        "{shown}"
    );
    assert!(
        shown.contains("slot 1: record of slot 1 is corrupt"),
        "{shown}"
    );
    assert!(
        shown.ends_with("; slot 2: held by 10.0.0.9:7000"),
        "{shown}"
    );
    assert_eq!(vvm.shutdown().await, Err(problem));
    // Neither record was touched.
    assert_eq!(store.record(Slot(2)).unwrap().unwrap().value, other);
}
