use vvm_sequencer::engine::{WsId, WsKind};
use vvm_sequencer::{Actualizing, SeqStorage, Sequencer};

fn misuse<St: SeqStorage>(seq: Sequencer<Actualizing, St>) {
    let _ = seq.start(WsKind(1), WsId(1));
}

fn main() {}
