//! `allot test`: expected-result suites for CI, in the manner of `kyverno test` and `gator verify`.
//!
//! A test file holds `kind: Test` documents. Each names its policies, optional namespace labels
//! and team usage, and a list of cases: one resource each (inline, or from a manifest file) and
//! what the engine must decide about it — admitted or denied, by which rules, which warnings and
//! audit findings, the exact patch, fields of the mutated object, words of a message.
//!
//! Cases run through the very path `allot check` uses ([`crate::cli::check::admit_manifest`] on an engine
//! that knows the gang members among the test's resources, [`crate::cli::check::gang_directory`]), so a
//! passing suite says exactly what `allot check` and the webhooks would do. Quota usage is the
//! test's (or case's) `usage`, fresh for every case: unlike one `allot check` run, cases do not
//! charge each other, so their order never matters.
//!
//! Parsing is strict like the policy loader's: unknown fields, `null` where a value is expected
//! and a case that expects nothing are errors naming the file, document and field path. Loading
//! is all-or-nothing: every problem of every file is reported at once and no case runs.
//!
//! Which files are test files: every file named on the command line must hold Test documents
//! only. In a directory (searched recursively for `.yaml`, `.yml`, `.json`; hidden entries
//! skipped) a file holding a Test document is a test file, and must hold nothing else; files
//! without one are fixtures and skipped — Kubernetes manifests, Namespace lists, and policy
//! documents (`allot.dev/v1alpha1` Cluster, Team, Placement, Rule, GangPolicy) that tests load
//! as extra policies. Any other `allot.dev` kind (a mistyped `kind: Tset`) and YAML that does not
//! parse are errors, so that a broken test file can never be skipped silently.

mod errors;
mod expect;
mod load;
mod report;
mod run;
mod server;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use errors::{CaseError, PolicySourceError, SelectError, UsageError};
pub use expect::{DecodeError, Expect, ExpectError, Expectations, ExpectedOp, OpName, PatchOpError};
pub use load::{Suite, load};
pub use server::{DryRunError, InstallError, NativeHalfError, ServerCase, ServerOutcome, ServerReport, ServerTest};

/// The JSON Schema of `kind: Test` documents (`allot schema --kind Test`), generated from the
/// very types `allot test` decodes, like the policy kinds' in [`crate::model::policy::schema`].
pub fn schema() -> schemars::Schema {
    let mut body = crate::model::policy::schema::generator().into_root_schema_for::<load::TestSpec>();
    body.insert("title".into(), format!("{TEST_KIND} ({})", crate::model::policy::API_VERSION).into());
    body.insert(
        "description".into(),
        "An `allot test` file: policies, namespaces and usage to load, and cases that each name an object and \
         what Allot must decide about it."
            .into(),
    );
    if let Some(serde_json::Value::Object(properties)) = body.get_mut("properties") {
        properties.insert(
            "apiVersion".into(),
            serde_json::json!({"description": "The format's version.", "const": crate::model::policy::API_VERSION}),
        );
        properties.insert("kind".into(), serde_json::json!({"const": TEST_KIND}));
    }
    body
}
pub use report::{CaseReport, SuiteReport, TestReport};

/// The kind of a test document.
pub const TEST_KIND: &str = "Test";

/// Policy kinds: `allot.dev` documents of these kinds in a test directory are fixtures.
const POLICY_KINDS: &[&str] = &["Cluster", "Team", "Placement", "Rule", "GangPolicy"];

/// Why a suite could not run.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// Test files, or the policies, namespaces and resources they name, are unreadable or
    /// invalid. Every problem found, each with its file, document and field.
    #[error("{}", list_problems(.0))]
    Invalid(Vec<String>),
    /// The JUnit report could not be written.
    #[error("{path}: {source}")]
    Junit {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SuiteError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SuiteError::Invalid(_) => "invalid",
            SuiteError::Junit { .. } => "junit",
        }
    }
}

fn list_problems(problems: &[String]) -> String {
    let mut out = format!("{} problem(s) in the test files:", problems.len());
    for p in problems {
        out.push_str("\n  ");
        out.push_str(&p.replace('\n', "\n    "));
    }
    out
}
