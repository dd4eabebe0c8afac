//! Every input kept in `fuzz/regressions/<target>/` replayed through that fuzz target's own
//! checks (`fuzz/checks/`, included here as the targets include it), so a fixed crash stays
//! fixed in `cargo test`, without a fuzz build or libFuzzer.
//!
//! A check panics on a finding; each input runs under `catch_unwind`, and a test fails naming
//! every input that failed. A directory with no check (a new target not listed in
//! `fuzz/checks/mod.rs`), or a fuzz target in `fuzz/Cargo.toml` that has no check, fails too.

#[path = "../fuzz/checks/mod.rs"]
mod checks;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn regressions() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions")
}

/// The check of `target`, by its directory name.
fn check_of(target: &str) -> Option<checks::Check> {
    checks::TARGETS.iter().find(|(name, _)| *name == target).map(|(_, run)| *run)
}

/// The kept inputs of `target`, sorted (none when it has no directory yet).
fn inputs(target: &str) -> Vec<PathBuf> {
    files_in(&regressions().join(target))
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    files.sort();
    files
}

/// Runs `target`'s check on each of its kept inputs; the failures, as `file: message`.
fn replay(target: &str) -> Vec<String> {
    let run = check_of(target).unwrap_or_else(|| panic!("no check for fuzz target {target} in fuzz/checks/mod.rs"));
    replay_in(&regressions().join(target), run)
}

/// Runs `run` on each file in `dir`; the failures, as `file: message`.
fn replay_in(dir: &Path, run: checks::Check) -> Vec<String> {
    let mut failures = Vec::new();
    for path in files_in(dir) {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| run(&data))) {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {message}", path.display()));
        }
    }
    failures
}

fn assert_replays(target: &str) {
    let failures = replay(target);
    assert!(failures.is_empty(), "{} kept input(s) of {target} fail again:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn admission_review_regressions_pass() {
    assert_replays("admission_review");
}

#[test]
fn cel_expression_regressions_pass() {
    assert!(inputs("cel_expression").len() >= 6, "the kept cel_expression inputs are missing");
    assert_replays("cel_expression");
}

#[test]
fn policy_parse_regressions_pass() {
    assert_replays("policy_parse");
}

#[test]
fn tenant_update_regressions_pass() {
    assert_replays("tenant_update");
}

#[test]
fn update_pair_regressions_pass() {
    assert_replays("update_pair");
}

/// Every regression directory is a target with a check, and every target is replayed above.
#[test]
fn every_target_and_every_regression_directory_has_a_check() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/Cargo.toml"))
        .unwrap_or_else(|e| panic!("fuzz/Cargo.toml: {e}"));
    let bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|section| section.lines().find_map(|l| l.trim().strip_prefix("name = ")))
        .map(|name| name.trim_matches('"'))
        .collect();
    let mut checked: Vec<&str> = checks::TARGETS.iter().map(|(name, _)| *name).collect();
    let mut declared = bins.clone();
    checked.sort_unstable();
    declared.sort_unstable();
    assert_eq!(declared, checked, "fuzz/Cargo.toml's targets and fuzz/checks/mod.rs's TARGETS differ");
    let replayed = ["admission_review", "cel_expression", "policy_parse", "tenant_update", "update_pair"];
    assert_eq!(checked, replayed, "a target without a replay test here");
    for entry in std::fs::read_dir(regressions()).unwrap_or_else(|e| panic!("fuzz/regressions: {e}")) {
        let path = entry.unwrap_or_else(|e| panic!("fuzz/regressions: {e}")).path();
        if path.is_dir() {
            let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
            assert!(check_of(&name).is_some(), "fuzz/regressions/{name} is no fuzz target with a check");
        }
    }
}

/// The replay can fail: a check that panics on a kept input is reported with the input's name
/// and the check's message, and the inputs after it still run.
#[test]
fn a_failing_input_is_reported() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("a-finding"), b"bad").expect("write");
    std::fs::write(dir.path().join("b-fine"), b"").expect("write");
    let failures = replay_in(dir.path(), |data| assert!(data.is_empty(), "a finding on {} bytes", data.len()));
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("a-finding") && failures[0].contains("a finding on 3 bytes"), "{failures:?}");
}
