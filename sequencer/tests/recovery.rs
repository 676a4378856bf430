//! The sequencer's bounded behaviour when storage misbehaves: timeouts, shutdown in bounded
//! time, and recovery after crashes between a write's values and its offset.

mod support;

use std::time::{Duration, Instant};

use support::*;
use vvm_sequencer::engine::{Number, PLogOffset, Phase};
use vvm_sequencer::storages::memory::{MemorySeqStorage, SeqFault, SeqOp};
use vvm_sequencer::{ActualizeError, NextError, SeqStorageError, Sequencer, ShutdownError};

// covers: Seq.Timeouts
#[tokio::test]
async fn a_hanging_storage_read_times_out_and_the_transaction_can_be_given_up() {
    let storage = MemorySeqStorage::default();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    storage.inject(SeqOp::ReadNumbers, SeqFault::Hang, Some(1));
    let mut tx = start(seq, 1).await;
    let started = Instant::now();
    let err = tx.next(A).await.unwrap_err();
    assert!(
        matches!(err, NextError::Storage(SeqStorageError::Timeout { .. })),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut tx = Tx::begin(tx.actualize().ready().await, 1).await;
    assert_eq!(tx.next(1, A).await, Number(1));
}

// covers: Seq.ShutdownBounded
#[tokio::test]
async fn shutdown_returns_in_bounded_time_when_storage_hangs_forever() {
    let storage = MemorySeqStorage::default();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    storage.inject(SeqOp::Write, SeqFault::Hang, None);
    storage.inject(SeqOp::Replay, SeqFault::Hang, None);
    let mut tx = Tx::begin(seq, 1).await;
    tx.next(1, A).await;
    let seq = tx.commit(&storage);
    tokio::time::sleep(Duration::from_millis(20)).await; // the flusher is now stuck in a write
    let started = Instant::now();
    let err = seq.shutdown().await.unwrap_err();
    assert_eq!(
        err,
        ShutdownError::Unflushed {
            unflushed_keys: 1,
            unflushed_events: 1
        }
    );
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "shutdown took {took:?}"
    );

    // Also while actualizing against a hanging replay, and inside a transaction.
    let seq = Sequencer::new(
        params(1, 1).build().unwrap(),
        storage.clone(),
        fast_config(),
    )
    .unwrap();
    let started = Instant::now();
    let err = seq.shutdown().await.unwrap_err();
    assert!(matches!(err, ShutdownError::NotActualized { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_millis(1_000));
}

// covers: Seq.ShutdownHonest
#[tokio::test]
async fn shutdown_during_an_unfinished_or_failed_actualization_says_not_actualized() {
    let storage = MemorySeqStorage::default();
    storage.append_event(PLogOffset(1), &[sv(1, A, 3)]).unwrap();
    storage.inject(SeqOp::Replay, SeqFault::Hang, None);
    let seq = Sequencer::new(
        params(1, 1).build().unwrap(),
        storage.clone(),
        fast_config(),
    )
    .unwrap();
    let err = seq
        .shutdown()
        .await
        .expect_err("shutdown while the replay hangs must not say Ok");
    assert!(
        matches!(
            err,
            ShutdownError::NotActualized {
                phase: Phase::Loading | Phase::Replaying(_),
                cause: None
            }
        ),
        "{err}"
    );
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(1));

    storage.inject(SeqOp::Replay, SeqFault::Fail, None);
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let err = seq
        .shutdown()
        .await
        .expect_err("shutdown after the actualization gave up must not say Ok");
    assert!(
        matches!(
            err,
            ShutdownError::NotActualized {
                phase: Phase::Failed,
                cause: Some(ActualizeError::Storage(SeqStorageError::Failed { .. }))
            }
        ),
        "{err}"
    );
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(1));
}

fn sv(ws: u64, seq: vvm_sequencer::engine::SeqId, n: u64) -> vvm_sequencer::engine::SeqValue {
    vvm_sequencer::engine::SeqValue {
        key: key(ws, seq),
        value: Number(n),
    }
}

// covers: Seq.Shutdown
#[tokio::test]
async fn shutdown_persists_the_backlog_and_stops_the_task_and_a_successor_continues() {
    let storage = MemorySeqStorage::default();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    // Slow writes: the flusher cannot have written before shutdown begins.
    storage.inject(
        SeqOp::Write,
        SeqFault::Delay(Duration::from_millis(30)),
        Some(1),
    );
    let mut tx = Tx::begin(seq, 1).await;
    tx.next(1, A).await;
    let seq = tx.commit(&storage);
    seq.shutdown().await.unwrap();
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(2));
    let writes = storage.calls(SeqOp::Write);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        storage.calls(SeqOp::Write),
        writes,
        "no task survived shutdown"
    );

    // Cleanup twice: a successor over the same storage starts and stops cleanly too; an open
    // transaction is simply given up.
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(2));
    tx.seq.shutdown().await.unwrap();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(
        tx.next(1, A).await,
        Number(2),
        "the given-up event never reached the PLog"
    );
    drop(tx);
}

// covers: Seq.FlushAtomic, Seq.Gapless
#[tokio::test]
async fn a_crash_between_values_and_offset_never_hands_a_committed_number_out_again() {
    // Deterministic walk: transactions on three workspaces, crashes (the write dies after the
    // values, before the offset; or the process dies with a backlog) and recoveries.
    let storage = MemorySeqStorage::default();
    let p = params(1, 1_000)
        .unflushed_keys_max(4)
        .unflushed_events_max(3);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut roll = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut crashes = 0;
    for _life in 0..30 {
        let mut seq = ready(p.clone().build().unwrap(), &storage).await;
        for _ in 0..(1 + roll(8)) {
            let ws = roll(3);
            let mut tx = Tx::begin(seq, ws).await;
            for s in [A, B] {
                let expected = storage.plog_highest(key(ws, s)).0 + 1;
                let expected = expected.max(if s == A { 1 } else { 1_000 });
                assert_eq!(tx.next(ws, s).await, Number(expected), "ws {ws} {s:?}");
            }
            if roll(4) == 0 {
                storage.inject(SeqOp::Write, SeqFault::FailHalfway, Some(1));
            }
            seq = tx.commit(&storage);
            tokio::time::sleep(Duration::from_millis(roll(2))).await;
        }
        crashes += 1;
        drop(seq); // a crash: no last flush, the task is aborted wherever it is
        storage.clear_faults();
    }
    assert_eq!(crashes, 30);
}
