use vvm_runtime::sequencer::SeqState;

struct Committed;

impl SeqState for Committed {}

fn main() {}
