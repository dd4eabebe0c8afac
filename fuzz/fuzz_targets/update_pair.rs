//! The `update_pair` target: see `checks/update_pair.rs`, which the main crate's
//! `tests/fuzz_regressions.rs` also runs on every input in `regressions/update_pair/`.

#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::update_pair::run(data));
