use vvm_sequencer::engine::{WsId, WsKind};
use vvm_sequencer::{Idle, SeqStorage, Sequencer};

fn misuse<St: SeqStorage>(seq: Sequencer<Idle, St>) {
    let tx = seq.start(WsKind(1), WsId(1)).unwrap();
    let _ = tx.start(WsKind(1), WsId(2));
}

fn main() {}
