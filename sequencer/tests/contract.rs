//! The sequencer against storages that stretch or break the storage contract: a PLog delivered
//! out of order, and a write that lands after its caller stopped waiting for it.

mod support;

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use support::*;
use vvm_sequencer::engine::{Number, PLogOffset, Params, Phase, SeqId, SeqValue, WsId};
use vvm_sequencer::storages::memory::{MemorySeqStorage, SeqOp};
use vvm_sequencer::{
    ActualizeError, ReplaySink, SeqConfig, SeqStorage, SeqStorageError, Sequencer, ShutdownError,
    StartRefusal,
};

const C: SeqId = SeqId(3);
const D: SeqId = SeqId(4);

fn sv(seq: SeqId, n: u64) -> SeqValue {
    SeqValue {
        key: key(1, seq),
        value: Number(n),
    }
}

/// Feeds the PLog events of `inner` in the order `order` (offsets) lists them in.
#[derive(Clone)]
struct Reordered {
    inner: MemorySeqStorage,
    order: Vec<u64>,
}

impl SeqStorage for Reordered {
    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        self.inner.read_numbers(ws_id, seq_ids).await
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        self.inner.read_next_plog_offset().await
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        self.inner
            .write_values_and_next_plog_offset(values, next_plog_offset)
            .await
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        let mut events = BTreeMap::new();
        self.inner
            .actualize_from_plog(offset, &mut |o, values| {
                events.insert(o.0, values.to_vec());
                ControlFlow::Continue(())
            })
            .await?;
        for o in &self.order {
            if let Some(values) = events.get(o) {
                if sink(PLogOffset(*o), values).is_break() {
                    break;
                }
            }
        }
        Ok(())
    }
}

/// Four sequences of one workspace; their last numbers after the four events are 3, 2, 3, 1.
fn four_events(order: Vec<u64>) -> Reordered {
    let inner = MemorySeqStorage::default();
    let events = [
        vec![sv(A, 1), sv(B, 1), sv(C, 1), sv(D, 1)],
        vec![sv(A, 2), sv(B, 2)],
        vec![sv(A, 3), sv(C, 2)],
        vec![sv(C, 3)],
    ];
    for (o, values) in (1u64..).zip(&events) {
        inner.append_event(PLogOffset(o), values).unwrap();
    }
    Reordered { inner, order }
}

fn four_sequences() -> Params {
    params(1, 1)
        .sequence(KIND, C, Number(1))
        .sequence(KIND, D, Number(1))
        .build()
        .unwrap()
}

async fn actualized<St: SeqStorage>(storage: St) -> Sequencer<vvm_sequencer::Idle, St> {
    Sequencer::new(four_sequences(), storage, fast_config())
        .unwrap()
        .ready()
        .await
}

async fn next_of_each<St: SeqStorage>(tx: &mut Sequencer<vvm_sequencer::InTx, St>) -> Vec<u64> {
    let mut got = Vec::new();
    for s in [A, B, C, D] {
        got.push(tx.next(s).await.unwrap().0);
    }
    got
}

// covers: Seq.ReplayOrder, Seq.Gapless, Seq.CorruptPermanent
#[tokio::test]
async fn a_plog_delivered_out_of_order_fails_the_actualization_instead_of_reissuing_numbers() {
    let seq = actualized(four_events(vec![1, 2, 3, 4])).await;
    let mut tx = seq.start(KIND, WsId(1)).unwrap();
    assert_eq!(next_of_each(&mut tx).await, [4, 3, 4, 2], "the clean log");

    let seq = actualized(four_events(vec![1, 4, 2, 3])).await;
    let (covered, got) = (PLogOffset(5), PLogOffset(2));
    assert_eq!(seq.status().phase, Phase::Corrupt { covered, got });
    assert_eq!(
        seq.storage().inner.calls(SeqOp::Replay),
        1,
        "a corrupt log is not read again within the actualization"
    );
    // Permanent: `start` says so (not transient, so a retry loop ends), and neither it nor
    // `ready` reads the same log again.
    let mut seq = seq;
    for _ in 0..3 {
        seq = match seq.start(KIND, WsId(1)) {
            Ok(mut tx) => {
                let got = next_of_each(&mut tx).await;
                panic!("an out-of-order PLog was accepted: next gave {got:?}, the clean log gives [4, 3, 4, 2]");
            }
            Err(busy) => {
                assert_eq!(busy.reason, StartRefusal::CorruptPLog { covered, got });
                assert!(!busy.reason.is_transient(), "{}", busy.reason);
                busy.into_idle().ready().await
            }
        };
    }
    assert_eq!(seq.storage().inner.calls(SeqOp::Replay), 1);
    let corrupt = ActualizeError::CorruptPLog { covered, got };
    assert!(
        seq.status()
            .last_error
            .is_some_and(|e| e == corrupt.to_string()),
        "{:?}",
        seq.status()
    );
    match seq.shutdown().await {
        Err(ShutdownError::NotActualized { cause, .. }) => assert_eq!(cause, Some(corrupt)),
        other => panic!("{other:?}"),
    }
}

/// A storage whose writes land `land_after` after they were asked for, whether or not the
/// caller still waits (as a remote store that received the request does); it logs its calls.
#[derive(Clone)]
struct LateWrite {
    inner: MemorySeqStorage,
    land_after: Duration,
    log: Arc<Mutex<Vec<String>>>,
}

impl LateWrite {
    fn note(&self, line: String) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    }

    fn log(&self) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl SeqStorage for LateWrite {
    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        self.inner.read_numbers(ws_id, seq_ids).await
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        let offset = self.inner.read_next_plog_offset().await?;
        self.note(format!("read offset {}", offset.0));
        Ok(offset)
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        self.note(format!("write begins (offset {})", next_plog_offset.0));
        let (done, landed) = tokio::sync::oneshot::channel();
        let this = self.clone();
        let values = values.to_vec();
        tokio::spawn(async move {
            tokio::time::sleep(this.land_after).await;
            let result = this
                .inner
                .write_values_and_next_plog_offset(&values, next_plog_offset)
                .await;
            this.note(format!("write lands (offset {})", next_plog_offset.0));
            let _ = done.send(result);
        });
        landed
            .await
            .unwrap_or_else(|lost| Err(SeqStorageError::failed(lost)))
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        self.inner.actualize_from_plog(offset, sink).await
    }
}

// covers: Seq.ActualizeWaitsForWrite
#[tokio::test]
async fn a_new_actualization_reads_the_offset_only_after_the_write_in_flight_returned() {
    let storage = LateWrite {
        inner: MemorySeqStorage::default(),
        land_after: Duration::from_millis(150),
        log: Arc::default(),
    };
    // The write lands well within its call timeout.
    let config = SeqConfig {
        call_timeout_ms: 2_000,
        ..fast_config()
    };
    let seq = Sequencer::new(params(1, 1).build().unwrap(), storage.clone(), config)
        .unwrap()
        .ready()
        .await;
    let mut tx = seq.start(KIND, WsId(1)).unwrap();
    let n = tx.next(A).await.unwrap();
    storage
        .inner
        .append_event(tx.offset(), &[sv(A, n.0)])
        .unwrap();
    let seq = tx.flush();
    for _ in 0..1_000 {
        if storage.log().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The flusher now waits for its write; the next event is given up.
    let tx = seq.start(KIND, WsId(1)).unwrap();
    let seq = tx.actualize().ready().await;
    for _ in 0..1_000 {
        if storage.log().iter().any(|l| l.starts_with("write lands")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        storage.log(),
        [
            "read offset 1",
            "write begins (offset 2)",
            "write lands (offset 2)",
            "read offset 2"
        ]
    );
    let mut tx = seq.start(KIND, WsId(1)).unwrap();
    assert_eq!(tx.offset(), PLogOffset(2));
    assert_eq!(tx.next(A).await.unwrap(), Number(2));
}
