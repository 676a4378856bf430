//! The sequencer over each of its storages (memory, SQLite on a file, the transactional-KV
//! storage on `MemoryKv`): what must hold whatever the storage and its timing.

mod support;

use std::time::Duration;

use support::storages::{AppendError, Kind, Place, Storage, KINDS};
use support::{key, KIND};
use vvm_sequencer::engine::{Number, PLogOffset, Params, SeqId, SeqValue, WsId};
use vvm_sequencer::{Idle, SeqConfig, Sequencer};

const A: SeqId = SeqId(1);

fn sv(ws: u64, n: u64) -> SeqValue {
    SeqValue {
        key: key(ws, A),
        value: Number(n),
    }
}

/// Timeouts that leave a slow write (a few hundred ms) room, and SQLite's busy wait too.
fn config() -> SeqConfig {
    SeqConfig {
        call_timeout_ms: 3_000,
        replay_call_timeout_ms: 3_000,
        replay_page_events: 1_000,
        retries_max: 2,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        shutdown_timeout_ms: 3_000,
    }
}

async fn ready(params: &Params, storage: &Storage) -> Sequencer<Idle, Storage> {
    Sequencer::new(params.clone(), storage.clone(), config())
        .unwrap()
        .ready()
        .await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The writer cannot tell whether the event landed: `actualize`.
    Unknown,
    /// The process dies right after the append.
    Crash,
}

// covers: Seq.NextMax, Seq.Gapless
#[tokio::test]
async fn a_replayed_number_below_the_stored_one_never_brings_a_committed_number_back() {
    // A sequence that starts at 200 001 holds a singleton id 65 537 in one event (allowed:
    // numbers below the initial value are replayed by maximum). While that low number sits in
    // the backlog unwritten (a slow write), `next` must still continue after 200 050.
    let params = Params::builder()
        .sequence(KIND, A, Number(200_001))
        .build()
        .unwrap();
    let (mut got, mut expected) = (Vec::new(), Vec::new());
    for kind in KINDS {
        for outcome in [Outcome::Unknown, Outcome::Crash] {
            expected.push((kind, outcome, 200_051));
            let place = Place::new(kind, "replayed-low");
            let storage = place.open();
            let mut seq = ready(&params, &storage).await;
            for n in 200_001..=200_050 {
                let mut tx = seq.start(KIND, WsId(1)).unwrap();
                assert_eq!(tx.next(A).await.unwrap(), Number(n));
                storage.append(tx.offset(), &[sv(1, n)]).await.unwrap();
                seq = tx.flush();
            }
            seq.shutdown().await.unwrap();

            let storage = place.open();
            let seq = ready(&params, &storage).await;
            let tx = seq.start(KIND, WsId(1)).unwrap();
            assert_eq!(tx.offset(), PLogOffset(51));
            storage.append(tx.offset(), &[sv(1, 65_537)]).await.unwrap();
            // From here on every write takes a while: the replayed 65 537 stays in the
            // backlog while the next transactions run.
            storage.slow_writes(Duration::from_millis(400));
            let seq = match outcome {
                Outcome::Unknown => tx.actualize().ready().await,
                Outcome::Crash => {
                    drop(tx);
                    let storage = place.open();
                    storage.slow_writes(Duration::from_millis(400));
                    ready(&params, &storage).await
                }
            };
            assert_eq!(seq.status().unflushed_keys, 1, "{kind:?} {outcome:?}");
            let mut tx = seq.start(KIND, WsId(1)).unwrap();
            assert_eq!(tx.offset(), PLogOffset(52));
            // 200 001 ..= 200 050 are committed.
            got.push((kind, outcome, tx.next(A).await.unwrap().0));
            tx.storage().slow_writes(Duration::ZERO);
            storage.slow_writes(Duration::ZERO);
            drop(tx);
        }
    }
    assert_eq!(got, expected);
}

// covers: Seq.SecondWriter
#[tokio::test]
async fn a_second_writer_at_a_taken_offset_is_refused_on_every_storage() {
    // Two processes on one storage, one workspace, the same offset and the same numbers: the
    // PLog takes one event; the second writer learns that its offset is taken.
    let params = Params::builder()
        .sequence(KIND, A, Number(1))
        .build()
        .unwrap();
    for kind in KINDS {
        let place = Place::new(kind, "second-writer");
        let (first, second) = (place.open(), place.open());
        let seq_first = ready(&params, &first).await;
        let seq_second = ready(&params, &second).await;
        let mut tx_first = seq_first.start(KIND, WsId(1)).unwrap();
        let mut tx_second = seq_second.start(KIND, WsId(1)).unwrap();
        assert_eq!(tx_first.offset(), tx_second.offset());
        let n = tx_first.next(A).await.unwrap();
        assert_eq!(tx_second.next(A).await.unwrap(), n);
        let event = [sv(1, n.0)];
        first.append(tx_first.offset(), &event).await.unwrap();
        assert_eq!(
            second.append(tx_second.offset(), &event).await,
            Err(AppendError::Taken(tx_second.offset())),
            "{kind:?}: both writers would be told their event is in the PLog"
        );
        // Even the first writer's own second call is another writer.
        assert_eq!(
            first.append(tx_first.offset(), &event).await,
            Err(AppendError::Taken(tx_first.offset())),
            "{kind:?}"
        );
        assert_eq!(first.plog().await, [(PLogOffset(1), event.to_vec())]);
        drop((tx_first, tx_second));
    }
}

// covers: Seq.SecondWriter, Seq.TxKvStorage
#[tokio::test]
async fn a_txkv_append_whose_outcome_was_unknown_finds_its_own_record() {
    use vvm_adapters::txkv::KvFault;
    let place = Place::new(Kind::Txkv, "own-retry");
    let Place::Txkv(kv) = &place else {
        unreachable!()
    };
    let storage = place.open();
    // The commit lands but reports an unknown outcome; the call runs it again and finds its
    // own record, not another writer's.
    assert!(kv.inject(KvFault::UnknownApplied));
    storage.append(PLogOffset(1), &[sv(1, 1)]).await.unwrap();
    assert!(kv.inject(KvFault::UnknownNotApplied));
    storage.append(PLogOffset(2), &[sv(1, 2)]).await.unwrap();
    assert_eq!(
        storage.plog().await,
        [
            (PLogOffset(1), vec![sv(1, 1)]),
            (PLogOffset(2), vec![sv(1, 2)])
        ]
    );
}

/// How many of workspaces `1..=count` have a stored number of `A`, read by another connection.
fn stored_workspaces(path: &std::path::Path, count: u64) -> usize {
    let conn = rusqlite::Connection::open(path).unwrap();
    let stored: i64 = conn
        .query_row(
            "SELECT count(*) FROM seq_numbers WHERE seq_id = ?1",
            [A.0],
            |r| r.get(0),
        )
        .unwrap();
    assert!(stored >= 0 && stored as u64 <= count);
    stored as usize
}

// covers: Seq.SqliteCallsBounded
#[test]
fn timed_out_sqlite_calls_leave_at_most_one_call_behind() {
    use vvm_sequencer::storages::sqlite::{Durability, SqliteSeqStorage};
    use vvm_sequencer::SeqStorage;
    const CALLS: u64 = 10;
    let file = support::storages::TempFile::new("held-lock");
    // The default busy wait (1 s): longer than the 20 ms each caller below waits.
    let storage = SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Normal).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Another process holds the write lock.
    let other = rusqlite::Connection::open(&file.0).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    runtime.block_on(async {
        // Each write is given up on after 20 ms, as by a call timeout below the busy wait, and
        // the next one comes (a retry; another batch).
        for ws in 1..=CALLS {
            let values = [sv(ws, ws)];
            let write = storage.write_values_and_next_plog_offset(&values, PLogOffset(1 + ws));
            let given_up = tokio::time::timeout(Duration::from_millis(20), write).await;
            assert!(
                given_up.is_err(),
                "write {ws} ran although the lock is held"
            );
        }
    });
    other.execute_batch("COMMIT").unwrap();
    // Dropping the runtime waits for every call still on its blocking pool: what the timed-out
    // calls left behind now runs (the lock is free) and its writes land.
    drop(runtime);
    let landed = stored_workspaces(&file.0, CALLS);
    assert!(
        landed <= 1,
        "{landed} of {CALLS} given-up writes ran after their callers left: they queued on the blocking pool"
    );
}

// covers: Seq.TimeoutsValid
#[tokio::test]
async fn a_call_timeout_not_longer_than_the_sqlite_busy_wait_is_refused() {
    use vvm_sequencer::storages::sqlite::{Durability, SqliteSeqStorage, BUSY_TIMEOUT_MS};
    use vvm_sequencer::{SeqConfigError, SetupError};
    let file = support::storages::TempFile::new("timeouts");
    let storage = SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Normal).unwrap();
    let params = Params::builder()
        .sequence(KIND, A, Number(1))
        .build()
        .unwrap();
    let short = SeqConfig {
        call_timeout_ms: 100,
        ..config()
    };
    match Sequencer::new(params.clone(), storage.clone(), short) {
        Err(SetupError::Config(SeqConfigError::TimeoutBelowLockWait {
            what: "call_timeout_ms",
            timeout_ms: 100,
            lock_wait_ms: BUSY_TIMEOUT_MS,
        })) => {}
        Err(other) => panic!("{other}"),
        Ok(_) => {
            panic!("a 100 ms call timeout below a {BUSY_TIMEOUT_MS} ms busy wait was accepted")
        }
    }
    // A shorter busy wait makes the same timeouts fit.
    let storage = storage.with_busy_timeout_ms(50).unwrap();
    let seq = Sequencer::new(params, storage, short)
        .unwrap()
        .ready()
        .await;
    seq.shutdown().await.unwrap();
    assert!(SqliteSeqStorage::open_in_memory(PLogOffset(1))
        .unwrap()
        .with_busy_timeout_ms(0)
        .is_err());
}
