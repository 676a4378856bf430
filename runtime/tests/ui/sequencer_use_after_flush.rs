use vvm_sequencer::engine::{SeqId, WsId, WsKind};
use vvm_sequencer::{Idle, SeqStorage, Sequencer};

async fn misuse<St: SeqStorage>(seq: Sequencer<Idle, St>) {
    let mut tx = seq.start(WsKind(1), WsId(1)).unwrap();
    let _idle = tx.flush();
    let _ = tx.next(SeqId(1)).await;
}

fn main() {}
