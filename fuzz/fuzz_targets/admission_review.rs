//! The `admission_review` target: see `checks/admission_review.rs`, which the main crate's
//! `tests/fuzz_regressions.rs` also runs on every input in `regressions/admission_review/`.

#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::admission_review::run(data));
