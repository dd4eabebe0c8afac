//! The `policy_parse` target: see `checks/policy_parse.rs`, which the main crate's
//! `tests/fuzz_regressions.rs` also runs on every input in `regressions/policy_parse/`.

#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::policy_parse::run(data));
