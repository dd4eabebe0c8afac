//! The AdmissionReviews captured from a real API server (`tests/fixtures/admission-reviews/`),
//! read by the unit tests of several modules.

use serde_json::Value;

/// Every captured review, by file name, in name order.
pub(crate) fn reviews() -> Vec<(String, Value)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let review = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.file_name().unwrap_or_default().to_string_lossy().into_owned(), review)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The `request.object` of the captured review `name`.
pub(crate) fn object(name: &str) -> Value {
    let (_, review) =
        reviews().into_iter().find(|(file, _)| file == name).unwrap_or_else(|| panic!("no fixture {name}"));
    review["request"]["object"].clone()
}
