//! Misuse of the typestate handles does not compile, and the compiler says why in a readable way:
//! a VVM cannot be shut down before launch, launched twice or used after its shutdown; a
//! sequencer's transaction calls exist only inside a transaction and `start` only when idle.
//! (The sequencer's cases are here, beside the VVM's, so that both compile in one trybuild
//! project: the sequencer crate's own dev-dependencies would make a second one several times
//! as long to build.)

// covers: Rt.Typestate
#[test]
fn misuse_of_the_vvm_handle_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/vvm_*.rs");
}

// covers: Seq.Typestate
#[test]
fn sequencer_misuse_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/sequencer_*.rs");
}
