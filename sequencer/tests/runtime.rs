//! The sequencer with its background task over the memory storage: the ported scenarios and
//! the rules a careless design gets wrong.

mod support;

use std::time::Duration;

use support::*;
use vvm_sequencer::engine::{
    Number, PLogOffset, Phase, SeqError, SeqId, StartRefusal, WsId, WsKind,
};
use vvm_sequencer::storages::memory::{MemorySeqStorage, SeqFault, SeqOp};
use vvm_sequencer::{NextError, SeqStorage, Sequencer};

// covers: Seq.Basic, Seq.Next
#[tokio::test]
async fn basic_run_hands_out_consecutive_numbers_and_offsets() {
    let storage = MemorySeqStorage::new(PLogOffset(1));
    storage
        .write_values_and_next_plog_offset(
            &[vvm_sequencer::engine::SeqValue {
                key: key(1, A),
                value: Number(100),
            }],
            PLogOffset(2),
        )
        .await
        .unwrap();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.seq.offset(), PLogOffset(2));
    for expected in 101..=200 {
        assert_eq!(tx.next(1, A).await, Number(expected));
    }
    let mut seq = tx.commit(&storage);
    for i in 0..100u64 {
        let mut tx = Tx::begin(seq, 1).await;
        assert_eq!(tx.seq.offset(), PLogOffset(3 + i));
        assert_eq!(tx.next(1, A).await, Number(201 + i));
        seq = tx.commit(&storage);
    }
    assert_eq!(
        storage.calls(SeqOp::ReadNumbers),
        1,
        "the cache answered after the first"
    );
    seq.shutdown().await.unwrap();
    assert_eq!(storage.stored_number(key(1, A)), Number(300));
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(103));
}

// covers: Seq.NewActualizes
#[tokio::test]
async fn a_new_sequencer_refuses_start_until_it_has_actualized() {
    let storage = MemorySeqStorage::default();
    storage.append_event(PLogOffset(1), &[sv(1, A, 5)]).unwrap();
    storage.inject(
        SeqOp::Replay,
        SeqFault::Delay(Duration::from_millis(50)),
        Some(1),
    );
    let seq = Sequencer::new(
        params(1, 1).build().unwrap(),
        storage.clone(),
        fast_config(),
    )
    .unwrap()
    .idle();
    let busy = seq.start(KIND, WsId(1)).unwrap_err();
    assert_eq!(busy.reason, StartRefusal::Actualizing);
    let mut tx = Tx::begin(busy.into_idle(), 1).await;
    assert_eq!(tx.seq.offset(), PLogOffset(2));
    assert_eq!(tx.next(1, A).await, Number(6));
}

fn sv(ws: u64, seq: SeqId, n: u64) -> vvm_sequencer::engine::SeqValue {
    vvm_sequencer::engine::SeqValue {
        key: key(ws, seq),
        value: Number(n),
    }
}

// covers: Seq.ReplayMax
#[tokio::test]
async fn replayed_numbers_merge_by_maximum_with_repeated_keys() {
    let storage = MemorySeqStorage::default();
    storage
        .append_event(PLogOffset(1), &[sv(1, A, 5), sv(1, A, 3), sv(1, B, 9)])
        .unwrap();
    storage.append_event(PLogOffset(2), &[sv(1, A, 4)]).unwrap();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(6));
    assert_eq!(tx.next(1, B).await, Number(10));
}

// covers: Seq.SourceOrder, Seq.NextMax
#[tokio::test]
async fn numbers_come_from_the_transaction_then_the_cache_then_the_backlog_and_storage() {
    let storage = MemorySeqStorage::default();
    storage.put_number(key(1, A), Number(10));
    storage.put_number(key(2, A), Number(50));
    let seq = ready(params(1, 1).cache_capacity(1).build().unwrap(), &storage).await;

    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(11), "storage");
    assert_eq!(storage.calls(SeqOp::ReadNumbers), 1);
    assert_eq!(tx.next(1, A).await, Number(12), "cache");
    assert_eq!(
        tx.next(1, B).await,
        Number(1),
        "storage: B has nothing, initial value"
    );
    assert_eq!(storage.calls(SeqOp::ReadNumbers), 2);
    assert_eq!(
        tx.next(1, A).await,
        Number(13),
        "transaction (A was evicted by B)"
    );
    assert_eq!(storage.calls(SeqOp::ReadNumbers), 2);

    // Keep the numbers in the backlog: writes fail from now on.
    storage.inject(SeqOp::Write, SeqFault::Fail, None);
    let seq = tx.commit(&storage);
    let mut tx = Tx::begin(seq, 2).await;
    assert_eq!(tx.next(2, A).await, Number(51), "storage; evicts ws 1");
    let seq = tx.commit(&storage);
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(
        tx.next(1, A).await,
        Number(14),
        "backlog (13) above storage (10)"
    );
    assert_eq!(
        storage.calls(SeqOp::ReadNumbers),
        4,
        "storage is read even when the backlog has the key"
    );
    assert_eq!(storage.stored_number(key(1, A)), Number(10));
    tx.seq.shutdown().await.unwrap_err();
}

// covers: Seq.SourceOrder
#[tokio::test]
async fn a_workspace_missing_from_the_cache_costs_one_storage_read_zeros_included() {
    let storage = MemorySeqStorage::default();
    let p = params(1, 1).sequence(KIND, SeqId(3), Number(1));
    let seq = ready(p.build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    for s in [A, B, SeqId(3)] {
        assert_eq!(tx.next(1, s).await, Number(1), "{s:?}: nothing stored");
    }
    assert_eq!(
        storage.calls(SeqOp::ReadNumbers),
        1,
        "one read for the workspace's three sequences"
    );
}

// covers: Seq.CacheOne
#[tokio::test]
async fn a_cache_of_one_key_still_hands_out_every_number_once() {
    let storage = MemorySeqStorage::default();
    let mut seq = ready(params(100, 1).cache_capacity(1).build().unwrap(), &storage).await;
    for round in 0..20u64 {
        let mut tx = Tx::begin(seq, 1 + round % 3).await;
        let ws = 1 + round % 3;
        let a = tx.next(ws, A).await;
        let b = tx.next(ws, B).await;
        let a2 = tx.next(ws, A).await;
        assert_eq!(a2.0, a.0 + 1);
        assert_eq!(tx.next(ws, B).await.0, b.0 + 1);
        seq = tx.commit(&storage);
    }
    for ws in 1..=3u64 {
        let mut tx = Tx::begin(seq, ws).await;
        assert_eq!(
            tx.next(ws, A).await.0,
            storage.plog_highest(key(ws, A)).0 + 1
        );
        assert_eq!(
            tx.next(ws, B).await.0,
            storage.plog_highest(key(ws, B)).0 + 1
        );
        seq = tx.seq.actualize().ready().await;
    }
}

// covers: Seq.UnknownSeq
#[tokio::test]
async fn an_unknown_sequence_or_kind_is_an_error_that_changes_nothing() {
    let storage = MemorySeqStorage::default();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let busy = seq.start(WsKind(9), WsId(1)).unwrap_err();
    assert_eq!(busy.reason, StartRefusal::UnknownWsKind(WsKind(9)));
    assert!(!busy.reason.is_transient());
    let mut tx = Tx::begin(busy.into_idle(), 1).await;
    assert_eq!(tx.next(1, A).await, Number(1));
    let err = tx.seq.next(SeqId(77)).await.unwrap_err();
    assert!(matches!(
        err,
        NextError::Seq(SeqError::UnknownSeqId {
            seq_id: SeqId(77),
            ..
        })
    ));
    assert_eq!(tx.next(1, A).await, Number(2));
    let seq = tx.commit(&storage);
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(3));
}

// covers: Seq.LongRecovery
#[tokio::test]
async fn recovery_over_0_to_50_events_continues_every_sequence() {
    for events in 0..=50u64 {
        let storage = MemorySeqStorage::default();
        for o in 1..=events {
            storage
                .append_event(PLogOffset(o), &[sv(o % 7, A, o), sv(1, B, o)])
                .unwrap();
        }
        let p = params(1, 1).unflushed_keys_max(5).unflushed_events_max(5);
        let seq = ready(p.build().unwrap(), &storage).await;
        let mut tx = Tx::begin(seq, 1).await;
        assert_eq!(tx.seq.offset(), PLogOffset(events + 1));
        let expected_a = storage.plog_highest(key(1, A)).0 + 1;
        assert_eq!(tx.next(1, A).await, Number(expected_a), "{events} events");
        assert_eq!(tx.next(1, B).await, Number(events + 1));
        let seq = tx.commit(&storage);
        seq.shutdown().await.unwrap();
        assert_eq!(storage.stored_next_plog_offset(), PLogOffset(events + 2));
    }
}

// covers: Seq.MultipleActualizes
#[tokio::test]
async fn many_random_flushes_and_actualizes_keep_numbers_consecutive() {
    let storage = MemorySeqStorage::default();
    storage.put_number(key(1, A), Number(100));
    let mut seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut flushes = 0u64;
    for _ in 0..100 {
        let mut tx = Tx::begin(seq, 1).await;
        assert_eq!(tx.next(1, A).await, Number(100 + flushes + 1));
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        seq = if rng.is_multiple_of(2) {
            flushes += 1;
            tx.commit(&storage)
        } else {
            tx.seq.actualize().ready().await
        };
    }
    assert!(flushes > 20 && flushes < 80, "{flushes}");
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(100 + flushes + 1));
}

// covers: Seq.FlushFails, Seq.Backpressure
#[tokio::test]
async fn a_permanently_failing_flush_makes_start_busy_and_recovers_when_storage_does() {
    let storage = MemorySeqStorage::default();
    let p = params(1, 1).unflushed_keys_max(5).unflushed_events_max(100);
    let mut seq = ready(p.build().unwrap(), &storage).await;
    storage.inject(SeqOp::Write, SeqFault::Fail, None);
    for ws in 1..=6u64 {
        let mut tx = Tx::begin(seq, ws).await;
        tx.next(ws, A).await;
        seq = tx.commit(&storage);
    }
    let busy = seq.start(KIND, WsId(7)).unwrap_err();
    assert!(is_backlog(&busy.reason), "the 7th start: {}", busy.reason);
    let seq = busy.into_idle();
    for _ in 0..1_000 {
        if seq.status().writes_failed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(seq.status().writes_failed > 0);
    assert!(seq.status().last_error.is_some());

    storage.clear_faults();
    // The refused start woke the flusher; `start` retries until the backlog drained.
    let mut tx = Tx::begin(seq, 7).await;
    assert_eq!(tx.next(7, A).await, Number(1));
    let seq = tx.commit(&storage);
    seq.shutdown().await.unwrap();
    for ws in 1..=7 {
        assert_eq!(storage.stored_number(key(ws, A)), Number(1));
    }
}

// covers: Seq.BackpressureEvents
#[tokio::test]
async fn one_busy_workspace_cannot_grow_the_replay_window_without_bound() {
    let storage = MemorySeqStorage::default();
    let p = params(1, 1).unflushed_keys_max(500).unflushed_events_max(3);
    let mut seq = ready(p.build().unwrap(), &storage).await;
    storage.inject(SeqOp::Write, SeqFault::Fail, None);
    let mut refused = None;
    for i in 0..10u64 {
        match seq.start(KIND, WsId(1)) {
            Ok(tx) => {
                let mut tx = Tx {
                    seq: tx,
                    values: Vec::new(),
                };
                assert_eq!(tx.next(1, A).await, Number(i + 1));
                seq = tx.commit(&storage);
            }
            Err(busy) => {
                refused = Some((i, busy.reason));
                seq = busy.into_idle();
                break;
            }
        }
    }
    let (at, reason) = refused.expect("start must be refused once 3 events are unflushed");
    assert_eq!(at, 4);
    assert_eq!(
        reason,
        StartRefusal::Backlog {
            unflushed_keys: 1,
            unflushed_events: 4
        }
    );
    storage.clear_faults();
    seq.shutdown().await.unwrap();
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(5));
}

// covers: Seq.InitialFloor
#[tokio::test]
async fn after_replaying_numbers_below_the_initial_value_next_starts_at_the_initial_value() {
    let storage = MemorySeqStorage::default();
    for o in 1..=3u64 {
        storage
            .append_event(PLogOffset(o), &[sv(1, A, 65_535 + o)])
            .unwrap();
    }
    let seq = ready(params(200_001, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(200_001));
    assert_eq!(tx.next(1, A).await, Number(200_002));
}

// covers: Seq.StoredNeverDecreases
#[tokio::test]
async fn a_replayed_lower_number_never_lowers_what_is_stored() {
    // Stored numbers may run ahead of the stored offset (values land before the offset).
    let storage = MemorySeqStorage::default();
    storage.put_number(key(1, A), Number(10));
    storage.append_event(PLogOffset(1), &[sv(1, A, 7)]).unwrap();
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let seq = seq.shutdown_flushed().await;
    assert_eq!(storage.stored_next_plog_offset(), PLogOffset(2));
    assert_eq!(
        storage.stored_number(key(1, A)),
        Number(10),
        "never lowered to 7"
    );
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(11));
}

/// Waits until the flusher persisted everything (bounded).
trait Flushed: Sized {
    async fn shutdown_flushed(self) -> Self;
}

impl Flushed for Seq<vvm_sequencer::Idle> {
    async fn shutdown_flushed(self) -> Self {
        for _ in 0..1_000 {
            let s = self.status();
            if s.unflushed_keys == 0
                && s.unflushed_events == 0
                && matches!(s.phase, Phase::Ready(_))
            {
                return self;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never flushed: {:?}", self.status());
    }
}

// covers: Seq.NoWrap
#[tokio::test]
async fn a_sequence_at_u64_max_is_an_error_not_a_wrap() {
    let storage = MemorySeqStorage::default();
    storage.put_number(key(1, A), Number(u64::MAX - 1));
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    let mut tx = Tx::begin(seq, 1).await;
    assert_eq!(tx.next(1, A).await, Number(u64::MAX));
    let err = tx.seq.next(A).await.unwrap_err();
    assert!(
        matches!(err, NextError::Seq(SeqError::Exhausted { .. })),
        "{err}"
    );
    assert_eq!(tx.next(1, B).await, Number(1), "other sequences go on");
}

// covers: Seq.ReadyAfterFailure
#[tokio::test]
async fn after_a_failed_actualization_ready_awaits_the_next_one() {
    let storage = MemorySeqStorage::default();
    storage.append_event(PLogOffset(1), &[sv(1, A, 3)]).unwrap();
    storage.inject(SeqOp::Replay, SeqFault::Fail, None);
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    assert_eq!(seq.status().phase, Phase::Failed);
    // Still failing: `ready` starts a new actualization, waits for it and returns once it
    // failed as well (it does not loop).
    let seq = seq.ready().await;
    assert_eq!(seq.status().phase, Phase::Failed);
    assert_eq!(
        storage.calls(SeqOp::Replay),
        6,
        "two actualizations of 3 calls"
    );
    // The storage recovers; the caller refused by `start` awaits instead of polling it.
    storage.clear_faults();
    let busy = seq.start(KIND, WsId(1)).unwrap_err();
    assert_eq!(busy.reason, StartRefusal::ActualizationFailed);
    let seq = busy.into_idle().ready().await;
    assert!(
        matches!(seq.status().phase, Phase::Ready(_)),
        "{:?}",
        seq.status()
    );
    let mut tx = seq.start(KIND, WsId(1)).unwrap();
    assert_eq!(tx.next(A).await.unwrap(), Number(4));
    // On a ready sequencer `ready` returns at once and starts nothing.
    let seq = tx.actualize().ready().await.ready().await;
    assert_eq!(storage.calls(SeqOp::Replay), 8);
    drop(seq);
}

// covers: Seq.ActualizeRetry
#[tokio::test]
async fn a_failed_actualization_is_restarted_by_the_next_start() {
    let storage = MemorySeqStorage::default();
    storage.append_event(PLogOffset(1), &[sv(1, A, 3)]).unwrap();
    storage.inject(SeqOp::Replay, SeqFault::Fail, None);
    let seq = ready(params(1, 1).build().unwrap(), &storage).await;
    assert_eq!(seq.status().phase, Phase::Failed);
    assert_eq!(
        storage.calls(SeqOp::Replay),
        3,
        "1 attempt + retries_max (2)"
    );
    let busy = seq.start(KIND, WsId(1)).unwrap_err();
    assert_eq!(busy.reason, StartRefusal::ActualizationFailed);
    storage.clear_faults();
    let mut tx = Tx::begin(busy.into_idle(), 1).await;
    assert_eq!(tx.next(1, A).await, Number(4));
}
