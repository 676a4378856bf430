use vvm_sequencer::SeqState;

struct Committed;

impl SeqState for Committed {}

fn main() {}
