use vvm_core::sequencer::{WsId, WsKind};
use vvm_runtime::sequencer::{Idle, SeqStorage, Sequencer};

fn misuse<St: SeqStorage>(seq: Sequencer<Idle, St>) {
    let tx = seq.start(WsKind(1), WsId(1)).unwrap();
    let _ = tx.start(WsKind(1), WsId(2));
}

fn main() {}
