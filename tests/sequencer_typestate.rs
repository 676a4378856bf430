//! Misuse of the sequencer's typestate API does not compile; each case shows a readable error.

// covers: Seq.Typestate
#[test]
fn sequencer_misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/sequencer_*.rs");
}
