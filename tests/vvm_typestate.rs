//! Misuse of a VVM handle does not compile: shutting down before launch, launching twice and
//! using a VVM after its shutdown are type errors, with readable messages.

// covers: Rt.Typestate
#[test]
fn misuse_of_the_vvm_handle_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/vvm_*.rs");
}
