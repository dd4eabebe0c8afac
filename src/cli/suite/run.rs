//! Running: every case through `allot check`'s own path, with fresh usage per case.

use super::load::{LoadedTest, Suite};
use super::report::{CaseReport, SuiteReport, TestReport};
use crate::admission::engine::Engine;
use crate::admission::quota::StaticUsage;
use crate::cli::check;
use crate::model::namespaces::{NamespaceLabels, NoNamespaces};

impl Suite {
    /// Runs every case.
    pub fn run(&self) -> SuiteReport {
        SuiteReport { tests: self.tests.iter().map(run_test).collect() }
    }

    /// Number of cases.
    pub fn cases(&self) -> usize {
        self.tests.iter().map(|t| t.cases.len()).sum()
    }
}

pub(super) fn run_test(test: &LoadedTest) -> TestReport {
    let labels: &dyn NamespaceLabels = match &test.labels {
        Some(l) => l,
        None => &NoNamespaces,
    };
    let manifests = test.manifests();
    let claims = check::claim_objects(&manifests);
    let engine = Engine::new(&test.policies, labels).with_claims(&claims);
    let gangs = check::gang_directory(&engine, &manifests);
    let cases = test
        .cases
        .iter()
        .map(|case| {
            let usage = StaticUsage::new(case.usage.clone());
            let engine = engine.with_gangs(&gangs).with_quota(&usage);
            let admitted = check::admit_manifest(&engine, &case.manifest);
            CaseReport {
                name: case.name.clone(),
                mismatches: case.expectations.compare(&admitted.report, &admitted.mutated),
                engine: check::render_object(&admitted.report),
            }
        })
        .collect();
    TestReport {
        file: test.file.clone(),
        document: test.document,
        name: test.name.clone(),
        policies: format!("{}, version {}", test.policy_label, test.policies.version),
        cases,
    }
}
