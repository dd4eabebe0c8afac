//! The `cel_expression` target: see `checks/cel_expression.rs`, which the main crate's
//! `tests/fuzz_regressions.rs` also runs on every input in `regressions/cel_expression/`.

#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::cel_expression::run(data));
