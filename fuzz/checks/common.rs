//! Set-up shared by the checks: the repository's shipped policies and sample inputs, read once
//! per process.

use std::path::{Path, PathBuf};

use allot::model::namespaces::{self, StaticNamespaces};
use allot::model::policy::{self, PolicySet};

/// The repository root: the fuzz package lives in `fuzz/`, the main crate (whose test replays
/// the regressions) at the root.
pub fn repo() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    if manifest.join("policies").is_dir() { manifest.to_path_buf() } else { manifest.join("..") }
}

/// `policies/`, compiled with [`policy::compile`]. Panics (at start-up, not as a finding) if the
/// shipped policies do not load.
pub fn shipped_policies() -> PolicySet {
    let dir = repo().join("policies");
    let sources = policy::read_sources(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    policy::compile(&sources).unwrap_or_else(|e| panic!("compiling {}: {e}", dir.display()))
}

/// Namespace labels from `examples/cluster/namespaces.yaml`, so that Team label selectors are
/// evaluated (known namespaces) as well as reported undecided (every other namespace).
pub fn example_namespaces() -> StaticNamespaces {
    let path = repo().join("examples/cluster/namespaces.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    namespaces::from_manifests(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"))
}

/// The AdmissionReview fixtures of the integration tests, with the phase their name says.
pub fn fixture_reviews() -> Vec<(String, Vec<u8>)> {
    let dir = repo().join("tests/fixtures/admission-reviews");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let body = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), body)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no fixtures in {}", dir.display());
    out
}
