use vvm_core::sequencer::{WsId, WsKind};
use vvm_runtime::sequencer::{Actualizing, SeqStorage, Sequencer};

fn misuse<St: SeqStorage>(seq: Sequencer<Actualizing, St>) {
    let _ = seq.start(WsKind(1), WsId(1));
}

fn main() {}
