//! What each fuzz target checks of one input, as plain functions of the input's bytes: the
//! targets (`fuzz_targets/`) call them under libFuzzer, and the main crate's
//! `tests/fuzz_regressions.rs` includes this module (`#[path]`) to replay every input kept in
//! `regressions/<target>/` without a fuzz build. A check panics on a finding.
//!
//! Only crates the main crate also depends on (or has as dev-dependencies: `arbitrary`) are
//! used here, at the versions of the main `Cargo.lock` (see `lock.sh`).

#![allow(dead_code)] // each target uses one check

pub mod admission_review;
pub mod cel_expression;
pub mod common;
pub mod policy_parse;
pub mod tenant_update;
pub mod update_pair;

/// A target's check of one input: panics on a finding.
pub type Check = fn(&[u8]);

/// Every target, by its name in `Cargo.toml` and `regressions/`, with its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("admission_review", admission_review::run),
    ("cel_expression", cel_expression::run),
    ("policy_parse", policy_parse::run),
    ("tenant_update", tenant_update::run),
    ("update_pair", update_pair::run),
];
