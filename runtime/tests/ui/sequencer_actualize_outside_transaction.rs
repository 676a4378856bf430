use vvm_sequencer::{Idle, SeqStorage, Sequencer};

fn misuse<St: SeqStorage>(seq: Sequencer<Idle, St>) {
    let _ = seq.actualize();
}

fn main() {}
