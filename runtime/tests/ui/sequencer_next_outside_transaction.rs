use vvm_sequencer::engine::SeqId;
use vvm_sequencer::{Idle, SeqStorage, Sequencer};

async fn misuse<St: SeqStorage>(mut seq: Sequencer<Idle, St>) {
    let _ = seq.next(SeqId(1)).await;
}

fn main() {}
