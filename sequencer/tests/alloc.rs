//! Steady-state transactions allocate nothing: `start`, a cached `next` and `flush`.
//!
//! Its own test binary without a test harness (`harness = false`): the counting allocator sees
//! every thread of the process, so nothing else may run beside it — not even libtest's own
//! thread, which allocates when it blocks on its result channel, at a moment of the scheduler's
//! choosing (inside the measured window on a loaded machine).

use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};
use std::alloc::System;

use vvm_sequencer::engine::{Number, Params, SeqId, WsId, WsKind, UNFLUSHED_EVENTS_LIMIT};
use vvm_sequencer::storages::memory::MemorySeqStorage;
use vvm_sequencer::{SeqConfig, Sequencer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const KIND: WsKind = WsKind(1);
const HOT_WORKSPACES: u64 = 16;
const TRANSACTIONS: u64 = 20_000;

fn main() {
    start_next_and_flush_allocate_nothing_in_the_steady_state();
    println!("test start_next_and_flush_allocate_nothing_in_the_steady_state ... ok");
}

// covers: Seq.ZeroAlloc
fn start_next_and_flush_allocate_nothing_in_the_steady_state() {
    // Paused time: a flush timer firing inside the measured loop (as on a loaded machine, where
    // the loop takes longer) would count the flusher's own work.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let params = Params::builder()
            .sequence(KIND, SeqId(1), Number(1))
            .sequence(KIND, SeqId(2), Number(1))
            .unflushed_events_max(UNFLUSHED_EVENTS_LIMIT)
            .build()
            .unwrap();
        let storage = MemorySeqStorage::default();
        let mut seq = Sequencer::new(params, storage, SeqConfig::default())
            .unwrap()
            .ready()
            .await;
        // Warm up: every hot key cached and in the backlog.
        for ws in 0..HOT_WORKSPACES {
            let mut tx = seq.start(KIND, WsId(ws)).unwrap();
            tx.next(SeqId(1)).await.unwrap();
            tx.next(SeqId(2)).await.unwrap();
            seq = tx.flush();
        }

        let sanity = Region::new(GLOBAL);
        let v: Vec<u64> = Vec::with_capacity(4);
        assert_eq!(sanity.change().allocations, 1, "the counter counts");
        drop(v);

        let region = Region::new(GLOBAL);
        let mut last = 0;
        for i in 0..TRANSACTIONS {
            let mut tx = seq.start(KIND, WsId(i % HOT_WORKSPACES)).unwrap();
            last = tx.next(SeqId(1)).await.unwrap().0;
            tx.next(SeqId(2)).await.unwrap();
            seq = tx.flush();
        }
        let change = region.change();
        assert_eq!(
            (change.allocations, change.reallocations),
            (0, 0),
            "{TRANSACTIONS} transactions: {change:?}"
        );
        assert_eq!(last, 1 + TRANSACTIONS / HOT_WORKSPACES);
        seq.shutdown().await.unwrap();
    });
}
