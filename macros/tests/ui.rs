//! Compile-time behaviour of `#[derive(IdempotentResource)]`: every supported form compiles,
//! every misuse gives a spanned, readable error (cases in `tests/ui/`).

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass_*.rs");
    t.compile_fail("tests/ui/fail_*.rs");
}
