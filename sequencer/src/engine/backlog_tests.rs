//! The backlog's transitions, one test per row group of the table in `specs/sequencer.md`.

use super::*;

fn params(keys_max: usize, events_max: u64) -> Params {
    Params::builder()
        .sequence(WsKind(1), SeqId(1), Number(1))
        .sequence(WsKind(1), SeqId(2), Number(1))
        .unflushed_keys_max(keys_max)
        .unflushed_events_max(events_max)
        .build()
        .unwrap()
}

fn key(ws: u64, seq: u16) -> NumberKey {
    NumberKey {
        ws_id: WsId(ws),
        seq_id: SeqId(seq),
    }
}

fn sv(ws: u64, seq: u16, n: u64) -> SeqValue {
    SeqValue {
        key: key(ws, seq),
        value: Number(n),
    }
}

fn ready_at(params: &Params, offset: u64) -> Backlog {
    let mut b = Backlog::new(params);
    b.begin_actualization();
    b.loaded(PLogOffset(offset)).unwrap();
    b.actualized().unwrap();
    b
}

// covers: Seq.BusyActualizing
#[test]
fn start_is_refused_until_the_actualization_is_done() {
    let p = params(10, 10);
    let mut b = Backlog::new(&p);
    assert_eq!(b.admit(), Err(StartRefusal::Actualizing));
    b.loaded(PLogOffset(4)).unwrap();
    assert_eq!(b.admit(), Err(StartRefusal::Actualizing));
    assert_eq!(
        b.replay(PLogOffset(4), &[sv(1, 1, 9)]),
        Ok(ReplayStep::Continue)
    );
    assert_eq!(b.admit(), Err(StartRefusal::Actualizing));
    b.actualized().unwrap();
    assert_eq!(b.admit(), Ok(PLogOffset(5)));
    assert!(StartRefusal::Actualizing.is_transient());
    assert!(!StartRefusal::OffsetsExhausted.is_transient());
}

// covers: Seq.Backpressure
#[test]
fn start_is_refused_when_unflushed_keys_are_over_the_limit() {
    let p = params(2, 100);
    let mut b = ready_at(&p, 1);
    for ws in 1..=3u64 {
        let at = b.admit().unwrap();
        b.commit(at, WsId(ws), &[(SeqId(1), Number(1))]).unwrap();
    }
    assert_eq!(
        b.admit(),
        Err(StartRefusal::Backlog {
            unflushed_keys: 3,
            unflushed_events: 3
        })
    );
    let mut batch = Vec::new();
    let t = b.take_batch(&mut batch).unwrap();
    assert!(b.batch_written(t, &batch));
    assert_eq!(b.admit(), Ok(PLogOffset(4)));
}

// covers: Seq.BackpressureEvents
#[test]
fn start_is_refused_when_unflushed_events_are_over_the_limit_even_with_one_key() {
    // One busy workspace reusing one key: a key count alone stays at 1 forever, while the
    // replay window after a crash grows with every event.
    let p = params(500, 3);
    let mut b = ready_at(&p, 1);
    for n in 1..=4u64 {
        let at = b.admit().unwrap();
        b.commit(at, WsId(1), &[(SeqId(1), Number(n))]).unwrap();
    }
    assert_eq!(b.unflushed_keys(), 1);
    assert_eq!(
        b.admit(),
        Err(StartRefusal::Backlog {
            unflushed_keys: 1,
            unflushed_events: 4
        })
    );
}

// covers: Seq.FlushAtomic
#[test]
fn a_batch_is_all_pending_numbers_with_the_offset_they_cover() {
    let p = params(10, 10);
    let mut b = ready_at(&p, 1);
    let at = b.admit().unwrap();
    b.commit(at, WsId(1), &[(SeqId(1), Number(5)), (SeqId(2), Number(1))])
        .unwrap();
    let mut batch = Vec::new();
    let t = b.take_batch(&mut batch).unwrap();
    batch.sort();
    assert_eq!(batch, vec![sv(1, 1, 5), sv(1, 2, 1)]);
    assert_eq!(t.next_offset(), PLogOffset(2));
    assert_eq!(b.take_batch(&mut Vec::new()), None, "one batch at a time");

    // Committed while the batch is in flight: must survive its completion.
    let at = b.admit().unwrap();
    b.commit(at, WsId(1), &[(SeqId(1), Number(6))]).unwrap();
    assert!(b.batch_written(t, &batch));
    assert_eq!(b.lookup(&key(1, 1)), Some(Number(6)));
    assert_eq!(b.lookup(&key(1, 2)), None);
    assert_eq!(b.unflushed_events(), 1);
    let t2 = b.take_batch(&mut batch).unwrap();
    assert_eq!(batch, vec![sv(1, 1, 6)]);
    assert_eq!(t2.next_offset(), PLogOffset(3));
    assert!(b.batch_failed(t2));
    assert_eq!(
        b.lookup(&key(1, 1)),
        Some(Number(6)),
        "a failed batch keeps everything"
    );
    let t3 = b.take_batch(&mut batch).unwrap();
    assert!(b.batch_written(t3, &batch));
    assert_eq!((b.unflushed_keys(), b.unflushed_events()), (0, 0));
    assert_eq!(b.take_batch(&mut batch), None, "nothing to write");
}

#[test]
fn an_event_without_numbers_still_moves_the_offset_to_write() {
    let p = params(10, 10);
    let mut b = ready_at(&p, 7);
    let at = b.admit().unwrap();
    b.commit(at, WsId(1), &[]).unwrap();
    let mut batch = Vec::new();
    let t = b.take_batch(&mut batch).unwrap();
    assert!(batch.is_empty());
    assert_eq!(t.next_offset(), PLogOffset(8));
}

// covers: Seq.ReplayMax
#[test]
fn replay_merges_by_maximum_with_repeated_keys_in_any_order() {
    let p = params(10, 100);
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(1)).unwrap();
    b.replay(PLogOffset(1), &[sv(1, 1, 5), sv(1, 1, 3), sv(2, 1, 2)])
        .unwrap();
    b.replay(PLogOffset(2), &[sv(1, 1, 4), sv(2, 1, 7)])
        .unwrap();
    assert_eq!(b.lookup(&key(1, 1)), Some(Number(5)));
    assert_eq!(b.lookup(&key(2, 1)), Some(Number(7)));
    b.actualized().unwrap();
    assert_eq!(b.admit(), Ok(PLogOffset(3)));
    // Committed numbers merge the same way.
    b.commit(PLogOffset(3), WsId(1), &[(SeqId(1), Number(2))])
        .unwrap();
    assert_eq!(b.lookup(&key(1, 1)), Some(Number(5)));
}

// covers: Seq.ReplayOrder, Seq.CorruptPermanent
#[test]
fn an_event_below_the_covered_offset_is_refused_and_the_log_is_corrupt_for_good() {
    let p = params(10, 100);
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(1)).unwrap();
    b.replay(PLogOffset(1), &[sv(1, 1, 1), sv(1, 2, 1)])
        .unwrap();
    b.replay(PLogOffset(4), &[sv(1, 2, 3)]).unwrap();
    let before = b.clone();
    // Events 2 and 3 arrive late: skipping them would lose their numbers, merging them would
    // accept a log that may have lost others.
    assert_eq!(
        b.replay(PLogOffset(2), &[sv(1, 1, 2)]),
        Err(BacklogError::PLogOutOfOrder {
            covered: PLogOffset(5),
            got: PLogOffset(2)
        })
    );
    // Nothing of the event is merged; the backlog is corrupt for good (not Failed, which a
    // retry loop would take as passing) and forgets what it replayed.
    let corrupt = Phase::Corrupt {
        covered: PLogOffset(5),
        got: PLogOffset(2),
    };
    assert_ne!(b, before);
    assert_eq!(b.phase(), corrupt);
    assert_eq!(b.lookup(&key(1, 1)), None);
    assert_eq!(b.unflushed_keys(), 0);
    let refusal = b.admit().unwrap_err();
    assert_eq!(
        refusal,
        StartRefusal::CorruptPLog {
            covered: PLogOffset(5),
            got: PLogOffset(2)
        }
    );
    assert!(!refusal.is_transient(), "a corrupt log is permanent");
    assert!(b.take_batch(&mut Vec::new()).is_none());
    b.actualization_failed();
    assert_eq!(b.phase(), corrupt, "the driver's give-up keeps the cause");
    assert!(b.replay(PLogOffset(6), &[]).is_err(), "no replay goes on");
    // Only an explicit new actualization leaves it.
    b.begin_actualization();
    assert_eq!(b.phase(), Phase::Loading);
    // Offsets equal to one replayed, and below the stored offset, are out of order too.
    b.loaded(PLogOffset(1)).unwrap();
    b.replay(PLogOffset(4), &[]).unwrap();
    assert!(b.replay(PLogOffset(4), &[]).is_err());
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(7)).unwrap();
    assert!(matches!(
        b.replay(PLogOffset(6), &[]),
        Err(BacklogError::PLogOutOfOrder { .. })
    ));
    assert_eq!(b.replay_from(), None);
}

// covers: Seq.NextMax
#[test]
fn a_snapshot_holds_every_sequence_of_the_kind_zeros_included() {
    let p = params(10, 100);
    let mut b = ready_at(&p, 1);
    b.commit(PLogOffset(1), WsId(1), &[(SeqId(2), Number(6))])
        .unwrap();
    let mut out = vec![Number(99)];
    let seqs = [(SeqId(1), Number(1)), (SeqId(2), Number(1))];
    b.snapshot(WsId(1), &seqs, &mut out);
    assert_eq!(out, [Number(0), Number(6)]);
    b.snapshot(WsId(2), &seqs, &mut out);
    assert_eq!(out, [Number(0), Number(0)]);
}

#[test]
fn replay_asks_for_a_flush_when_over_a_limit() {
    let p = params(2, 100);
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(0)).unwrap();
    assert_eq!(
        b.replay(PLogOffset(0), &[sv(1, 1, 1), sv(2, 1, 1)]),
        Ok(ReplayStep::Continue)
    );
    assert_eq!(
        b.replay(PLogOffset(1), &[sv(3, 1, 1)]),
        Ok(ReplayStep::Full)
    );
    let mut batch = Vec::new();
    let t = b.take_batch(&mut batch).unwrap();
    assert_eq!((batch.len(), t.next_offset()), (3, PLogOffset(2)));
    assert!(b.batch_written(t, &batch));
    assert_eq!(
        b.replay(PLogOffset(2), &[sv(3, 1, 2)]),
        Ok(ReplayStep::Continue)
    );
}

// covers: Seq.StaleBatch
#[test]
fn a_batch_from_before_an_actualization_is_ignored() {
    let p = params(10, 10);
    let mut b = ready_at(&p, 1);
    let at = b.admit().unwrap();
    b.commit(at, WsId(1), &[(SeqId(1), Number(5))]).unwrap();
    let mut batch = Vec::new();
    let t = b.take_batch(&mut batch).unwrap();
    b.begin_actualization();
    assert_eq!(b.unflushed_keys(), 0);
    b.loaded(PLogOffset(1)).unwrap();
    b.replay(PLogOffset(1), &[sv(1, 1, 5)]).unwrap();
    assert!(!b.batch_written(t, &batch));
    assert!(!b.batch_failed(t));
    assert_eq!(b.lookup(&key(1, 1)), Some(Number(5)));
    assert_eq!(
        b.unflushed_events(),
        1,
        "the stale batch did not count as persisted"
    );
}

// covers: Seq.ActualizeRetry
#[test]
fn a_failed_actualization_refuses_start_until_a_new_one_succeeds() {
    let p = params(10, 10);
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(1)).unwrap();
    b.replay(PLogOffset(1), &[sv(1, 1, 5)]).unwrap();
    b.actualization_failed();
    assert_eq!(b.phase(), Phase::Failed);
    assert_eq!(b.admit(), Err(StartRefusal::ActualizationFailed));
    assert_eq!(b.take_batch(&mut Vec::new()), None);
    b.begin_actualization();
    b.loaded(PLogOffset(1)).unwrap();
    b.actualized().unwrap();
    assert_eq!(b.admit(), Ok(PLogOffset(1)));
}

#[test]
fn calls_out_of_phase_are_errors_that_change_nothing() {
    let p = params(10, 10);
    let mut b = Backlog::new(&p);
    let before = b.clone();
    assert!(matches!(
        b.commit(PLogOffset(1), WsId(1), &[]),
        Err(BacklogError::WrongPhase { .. })
    ));
    assert!(b.replay(PLogOffset(1), &[]).is_err());
    assert!(b.actualized().is_err());
    assert_eq!(b, before);
    let mut b = ready_at(&p, 3);
    assert!(b.loaded(PLogOffset(1)).is_err());
    assert_eq!(
        b.commit(PLogOffset(9), WsId(1), &[]),
        Err(BacklogError::OffsetMismatch {
            expected: PLogOffset(3),
            got: PLogOffset(9)
        })
    );
    assert_eq!(b.replay_from(), None);
}

// covers: Seq.NoWrap
#[test]
fn offsets_never_wrap() {
    let p = params(10, 10);
    let b = ready_at(&p, u64::MAX);
    assert_eq!(b.admit(), Err(StartRefusal::OffsetsExhausted));
    let mut b = Backlog::new(&p);
    b.loaded(PLogOffset(5)).unwrap();
    assert_eq!(
        b.replay(PLogOffset(u64::MAX), &[]),
        Err(BacklogError::OffsetsExhausted(PLogOffset(u64::MAX)))
    );
    assert_eq!(b.replay_from(), Some(PLogOffset(5)));
}

#[test]
fn an_abandoned_batch_can_be_taken_again_and_its_late_completion_is_ignored() {
    let p = params(10, 10);
    let mut b = ready_at(&p, 1);
    let at = b.admit().unwrap();
    b.commit(at, WsId(1), &[(SeqId(1), Number(5))]).unwrap();
    let mut batch = Vec::new();
    let lost = b.take_batch(&mut batch).unwrap();
    b.abandon_batch();
    let again = b.take_batch(&mut batch).unwrap();
    assert_eq!(batch, vec![sv(1, 1, 5)]);
    assert!(!b.batch_written(lost, &batch));
    assert!(b.batch_written(again, &batch));
    assert_eq!(b.unflushed_keys(), 0);
}
