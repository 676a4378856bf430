//! Seeded chaos of the session runtime: three processes, each opening sessions, acquiring two
//! slots as holdings and running a service on each, over a memory store whose calls fail, hang,
//! or commit with an unknown outcome at random, on tokio's paused clock. The oracle watches
//! what a user sees — a service running on a slot — and checks at every start that no other
//! process's service runs on that slot, unless that process is past its session's kill deadline
//! (its killer has ended it). Fencing tokens must rise per slot.
//!
//! `cargo test --test session_chaos` runs 200 seeds; `VVM_SESSION_CHAOS_SEEDS=N` runs more.

use vvm_test_support as common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::faulty::{Call, Fault, Faulty, Hook};
use common::TestKiller;
use vvm_adapters::MemoryStore;
use vvm_core::{Incarnation, LeaseConfig, Revision, Slot};
use vvm_runtime::{clock::Clock, clock::TimeSource, LeaseValue, SessionHandle, SessionStatus};
use vvm_sim::rng::Rng;

const LEASE: Duration = Duration::from_secs(20);
const SLOTS: u32 = 2;
const PROCESSES: u64 = 3;
const RUN: Duration = Duration::from_secs(200);
const SEEDS_DEFAULT: u64 = 200;

/// Draws a fault for every call from the seed.
#[derive(Clone)]
struct Chaos {
    rng: Arc<Mutex<Rng>>,
}

impl Hook for Chaos {
    fn fault(&self, _call: Call) -> Fault {
        let mut rng = lock(&self.rng);
        match rng.below(100) {
            0..=7 => Fault::Fail,
            8..=11 => Fault::UnknownApplied,
            12..=15 => Fault::UnknownLost,
            16..=25 => Fault::Delay(Duration::from_millis(rng.below(6_000))),
            _ => Fault::None,
        }
    }
}

type ChaosStore = Faulty<Chaos>;

/// Who runs a service on a slot: the process, its killer, and the label of the session's kill
/// deadline.
#[derive(Clone)]
struct Acting {
    process: u64,
    killer: Arc<TestKiller>,
    label: String,
}

#[derive(Default)]
struct Oracle {
    acting: HashMap<Slot, Acting>,
    tokens: HashMap<Slot, Revision>,
    violations: Vec<String>,
    starts: u64,
    killed: u64,
}

impl Oracle {
    /// A service starts on `slot` under the holding's `token`.
    fn start(&mut self, slot: Slot, token: Revision, who: Acting) {
        self.starts += 1;
        let now = Clock.now();
        if let Some(other) = self.acting.get(&slot) {
            let deadline = other
                .killer
                .thread
                .armed()
                .into_iter()
                .find(|(label, _)| **label == *other.label)
                .map(|(_, at)| at);
            match deadline {
                Some(at) if at <= now => self.killed += 1,
                _ => self.violations.push(format!(
                    "slot {}: process {} starts while process {} runs (deadline {deadline:?}, now {now:?})",
                    slot.0, who.process, other.process
                )),
            }
        }
        if let Some(last) = self.tokens.insert(slot, token) {
            if last >= token {
                self.violations
                    .push(format!("slot {}: token {token:?} after {last:?}", slot.0));
            }
        }
        self.acting.insert(slot, who);
    }

    /// The service of `process` on `slot` stopped (it may have been superseded after its
    /// process's deadline: then there is nothing to remove).
    fn stop(&mut self, slot: Slot, process: u64, label: &str) {
        if self
            .acting
            .get(&slot)
            .is_some_and(|acting| acting.process == process && acting.label == label)
        {
            self.acting.remove(&slot);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One process: sessions one after another until the run ends.
async fn process(n: u64, store: ChaosStore, oracle: Arc<Mutex<Oracle>>, seed: u64) {
    let mut rng = Rng::new(seed ^ (n << 32));
    let killer = Arc::new(TestKiller::new());
    let lease = LeaseConfig::new(LEASE).expect("valid");
    let end = Clock.to_tokio(Clock.now() + RUN);
    let mut sessions = 0u64;
    while tokio::time::Instant::now() < end {
        sessions += 1;
        let label_address = format!("10.0.{n}.{sessions}:7000");
        let value = LeaseValue {
            address: label_address.clone(),
            // One incarnation per process, as a service has: the runtime keeps the session
            // ids of one process distinct (`Session.FreshId`).
            incarnation: Incarnation(n),
            stopping: false,
        };
        let label = format!("session of {label_address}");
        let Ok(session) = SessionHandle::open(store.clone(), lease, value, &killer.thread).await
        else {
            tokio::time::sleep(Duration::from_millis(rng.between(100, 3_000))).await;
            continue;
        };
        let session = Arc::new(session);
        let until = tokio::time::Instant::now() + Duration::from_millis(rng.between(1_000, 60_000));
        let mut services = tokio::task::JoinSet::new();
        while tokio::time::Instant::now() < until
            && matches!(session.status(), SessionStatus::Open { .. })
        {
            let slot = Slot(rng.below(u64::from(SLOTS)) as u32);
            if let Ok(Some(holding)) = session.acquire(slot).await {
                let who = Acting {
                    process: n,
                    killer: killer.clone(),
                    label: label.clone(),
                };
                lock(&oracle).start(slot, holding.token().revision, who);
                let (oracle, session, label) = (oracle.clone(), session.clone(), label.clone());
                let run = Duration::from_millis(rng.between(0, 40_000));
                // Most services stop within L/4 of a loss; some outlive the kill deadline.
                let stopping = Duration::from_millis(match rng.below(10) {
                    0 => rng.between(10_000, 30_000),
                    _ => rng.between(0, 5_000),
                });
                let release = rng.below(2) == 0;
                services.spawn(async move {
                    let lost = tokio::select! {
                        _ = session.lost() => true,
                        _ = tokio::time::sleep(run) => false,
                    };
                    tokio::time::sleep(stopping).await;
                    lock(&oracle).stop(slot, n, &label);
                    if release && !lost {
                        let _ = holding.release().await;
                    }
                });
            }
            tokio::time::sleep(Duration::from_millis(rng.between(10, 2_000))).await;
        }
        while services.join_next().await.is_some() {}
        if let Ok(session) = Arc::try_unwrap(session) {
            let _ = session.close().await;
        }
    }
}

async fn run_seed(seed: u64) -> Oracle {
    let store = Faulty {
        store: MemoryStore::new(),
        hook: Chaos {
            rng: Arc::new(Mutex::new(Rng::new(seed))),
        },
    };
    let oracle = Arc::new(Mutex::new(Oracle::default()));
    let mut processes = tokio::task::JoinSet::new();
    for n in 0..PROCESSES {
        processes.spawn(process(n, store.clone(), oracle.clone(), seed));
    }
    while processes.join_next().await.is_some() {}
    let oracle = std::mem::take(&mut *lock(&oracle));
    oracle
}

/// Every seed: no two processes run a service on one slot at once, unless the first is past
/// its kill deadline; tokens rise per slot. The run must also have acted (not vacuous).
// covers: Session.LossOfAllHoldings, Session.KillDeadline, Session.Chaos, Session.TokenPerTenure
#[test]
fn no_two_processes_run_a_service_on_one_slot() {
    let seeds = std::env::var("VVM_SESSION_CHAOS_SEEDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(SEEDS_DEFAULT);
    let (mut starts, mut killed) = (0, 0);
    for seed in 0..seeds {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let oracle = runtime.block_on(run_seed(seed));
        assert!(
            oracle.violations.is_empty(),
            "seed {seed}: {:#?}",
            oracle.violations
        );
        starts += oracle.starts;
        killed += oracle.killed;
    }
    eprintln!(
        "session chaos: {seeds} seeds, {starts} service starts, {killed} over a killed holder"
    );
    assert!(starts > seeds, "services started: {starts}");
}

/// The simulator (`vvm-sim`) drives holdings as the runtime does: it gives up an acquire whose
/// outcome stays unknown after as many sends.
#[test]
fn the_simulator_sends_an_acquire_as_often_as_the_runtime() {
    assert_eq!(
        u32::from(vvm_sim::session::ACQUIRE_SENDS_MAX),
        vvm_runtime::ACQUIRE_SENDS_MAX
    );
}
