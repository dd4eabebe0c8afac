//! The `tenant_update` target: see `checks/tenant_update.rs`, which the main crate's
//! `tests/fuzz_regressions.rs` also runs on every input in `regressions/tenant_update/`.

#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::tenant_update::run(data));
