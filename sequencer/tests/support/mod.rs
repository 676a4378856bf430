//! Helpers shared by the sequencer's integration tests: a command processor's view of one
//! transaction (numbers taken, event written to the PLog, then flush).
#![allow(dead_code)]

pub mod storages;

use std::time::Duration;

use vvm_sequencer::engine::{Number, NumberKey, Params, SeqId, SeqValue, WsId, WsKind};
use vvm_sequencer::storages::memory::MemorySeqStorage;
use vvm_sequencer::{Idle, InTx, SeqConfig, Sequencer, StartRefusal};

pub const KIND: WsKind = WsKind(1);
pub const A: SeqId = SeqId(1);
pub const B: SeqId = SeqId(2);

pub fn key(ws: u64, seq: SeqId) -> NumberKey {
    NumberKey {
        ws_id: WsId(ws),
        seq_id: seq,
    }
}

/// Short timeouts and backoff, so that failure paths run in milliseconds.
pub fn fast_config() -> SeqConfig {
    SeqConfig {
        call_timeout_ms: 100,
        replay_call_timeout_ms: 1_000,
        replay_page_events: 1_000,
        retries_max: 2,
        backoff_initial_ms: 1,
        backoff_max_ms: 5,
        shutdown_timeout_ms: 300,
    }
}

pub fn params(initial_a: u64, initial_b: u64) -> vvm_sequencer::engine::ParamsBuilder {
    Params::builder()
        .sequence(KIND, A, Number(initial_a))
        .sequence(KIND, B, Number(initial_b))
}

pub type Seq<S> = Sequencer<S, MemorySeqStorage>;

pub async fn ready(params: Params, storage: &MemorySeqStorage) -> Seq<Idle> {
    Sequencer::new(params, storage.clone(), fast_config())
        .unwrap()
        .ready()
        .await
}

/// Starts, retrying (bounded) while the refusal is transient.
pub async fn start(mut seq: Seq<Idle>, ws: u64) -> Seq<InTx> {
    for _ in 0..2_000 {
        match seq.start(KIND, WsId(ws)) {
            Ok(tx) => return tx,
            Err(busy) => {
                assert!(busy.reason.is_transient(), "{busy}");
                seq = busy.into_idle();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    panic!("start stayed refused");
}

/// A transaction whose numbers are recorded for the PLog event.
pub struct Tx {
    pub seq: Seq<InTx>,
    pub values: Vec<SeqValue>,
}

impl Tx {
    pub async fn begin(seq: Seq<Idle>, ws: u64) -> Tx {
        Tx {
            seq: start(seq, ws).await,
            values: Vec::new(),
        }
    }

    pub async fn next(&mut self, ws: u64, seq_id: SeqId) -> Number {
        let n = self.seq.next(seq_id).await.unwrap();
        self.values.push(SeqValue {
            key: key(ws, seq_id),
            value: n,
        });
        n
    }

    /// Writes the event to the PLog, then flushes.
    pub fn commit(self, storage: &MemorySeqStorage) -> Seq<Idle> {
        storage
            .append_event(self.seq.offset(), &self.values)
            .unwrap();
        self.seq.flush()
    }
}

pub fn is_backlog(reason: &StartRefusal) -> bool {
    matches!(reason, StartRefusal::Backlog { .. })
}
