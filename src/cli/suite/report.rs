//! Reporting: what a run found, as text for people and as JUnit for CI.

use std::path::Path;

use super::SuiteError;
use crate::cli::junit;

/// The outcome of a suite run.
#[derive(Debug, Clone)]
pub struct SuiteReport {
    pub tests: Vec<TestReport>,
}

/// The outcome of one Test document.
#[derive(Debug, Clone)]
pub struct TestReport {
    pub file: String,
    pub document: usize,
    pub name: String,
    /// Where the policies came from, and their version hash.
    pub policies: String,
    pub cases: Vec<CaseReport>,
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct CaseReport {
    pub name: String,
    /// What differed; empty when the case passed.
    pub mismatches: Vec<String>,
    /// What the engine decided, as `allot check` prints it.
    pub engine: String,
}

impl CaseReport {
    /// True when every expectation held.
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

pub(super) fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

impl SuiteReport {
    fn all_cases(&self) -> impl Iterator<Item = (&TestReport, &CaseReport)> {
        self.tests.iter().flat_map(|t| t.cases.iter().map(move |c| (t, c)))
    }

    /// Cases that passed.
    pub fn passed(&self) -> usize {
        self.all_cases().filter(|(_, c)| c.passed()).count()
    }

    /// Cases that failed.
    pub fn failed(&self) -> usize {
        self.all_cases().filter(|(_, c)| !c.passed()).count()
    }

    /// True when every case passed.
    pub fn all_passed(&self) -> bool {
        self.failed() == 0
    }

    /// Each test and case, what differed for failed ones (with the engine's decision), and a
    /// summary.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tests {
            out.push_str(&format!("{}#{} {} [policies: {}]\n", t.file, t.document, t.name, t.policies));
            for c in &t.cases {
                if c.passed() {
                    out.push_str(&format!("  ok    {}\n", c.name));
                    continue;
                }
                out.push_str(&format!("  FAIL  {}\n", c.name));
                for m in &c.mismatches {
                    out.push_str(&indent(m, "        "));
                }
                out.push_str("        the engine decided:\n");
                out.push_str(&indent(&c.engine, "          "));
            }
        }
        let failed: Vec<String> =
            self.all_cases().filter(|(_, c)| !c.passed()).map(|(t, c)| format!("{} › {}", t.file, c.name)).collect();
        out.push_str(&format!(
            "\n{} case(s) in {} test(s): {} passed, {} failed\n",
            self.passed() + failed.len(),
            self.tests.len(),
            self.passed(),
            failed.len()
        ));
        for f in &failed {
            out.push_str(&format!("FAILED  {f}\n"));
        }
        out
    }

    /// JUnit XML: a test suite per Test document, a test case per case, a failure per failed
    /// case with every mismatch and the engine's decision.
    pub fn render_junit(&self) -> String {
        let suites: Vec<junit::Suite> = self
            .tests
            .iter()
            .map(|t| junit::Suite {
                name: format!("{}#{} {}", t.file, t.document, t.name),
                cases: t
                    .cases
                    .iter()
                    .map(|c| junit::Case {
                        classname: t.name.clone(),
                        name: c.name.clone(),
                        file: Some(t.file.clone()),
                        failure: (!c.passed()).then(|| junit::Failure {
                            message: c.mismatches.first().and_then(|m| m.lines().next()).unwrap_or("").to_string(),
                            kind: "mismatch",
                            body: format!("{}\n\nthe engine decided:\n{}", c.mismatches.join("\n"), c.engine),
                        }),
                        output: None,
                    })
                    .collect(),
            })
            .collect();
        junit::render("allot test", &suites)
    }

    /// Writes [`SuiteReport::render_junit`] to `path`.
    pub fn write_junit(&self, path: &Path) -> Result<(), SuiteError> {
        std::fs::write(path, self.render_junit())
            .map_err(|source| SuiteError::Junit { path: path.to_path_buf(), source })
    }
}
