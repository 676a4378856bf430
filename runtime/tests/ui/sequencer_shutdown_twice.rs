use vvm_sequencer::{Idle, SeqStorage, Sequencer};

async fn misuse<St: SeqStorage>(seq: Sequencer<Idle, St>) {
    let _ = seq.shutdown().await;
    let _ = seq.shutdown().await;
}

fn main() {}
