//! `allot test`: expected-result suites for CI, in the manner of `kyverno test` and `gator verify`.
//!
//! A test file holds `kind: Test` documents. Each names its policies, optional namespace labels
//! and team usage, and a list of cases: one resource each (inline, or from a manifest file) and
//! what the engine must decide about it — admitted or denied, by which rules, which warnings and
//! audit findings, the exact patch, fields of the mutated object, words of a message.
//!
//! Cases run through the very path `allot check` uses ([`check::admit_manifest`] on an engine
//! that knows the gang members among the test's resources, [`check::gang_directory`]), so a
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::check::{self, Manifest, ObjectReport};
use crate::engine::Engine;
use crate::junit;
use crate::namespaces::{self, Labels, NamespaceLabels, NoNamespaces, StaticNamespaces};
use crate::patch::PatchOp;
use crate::policy::{self, API_VERSION, Action, PolicySet};
use crate::quota::StaticUsage;
use crate::resources::ResourceList;

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

fn list_problems(problems: &[String]) -> String {
    let mut out = format!("{} problem(s) in the test files:", problems.len());
    for p in problems {
        out.push_str("\n  ");
        out.push_str(&p.replace('\n', "\n    "));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The file format
// ---------------------------------------------------------------------------------------------

/// `kind: Test`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TestSpec {
    api_version: String,
    #[allow(dead_code, reason = "checked before decoding; kept so that `kind` is a known field")]
    kind: String,
    metadata: TestMetadata,
    /// Policy directories or files, relative to the test file, loaded in order as one set.
    #[serde(default, deserialize_with = "present")]
    policies: Option<PolicyPaths>,
    /// Namespace manifests (relative to the test file) whose labels Team selectors match.
    #[serde(default)]
    namespaces: Vec<String>,
    /// Namespace labels written inline; added to (and overriding) those of `namespaces`.
    #[serde(default)]
    namespace_labels: BTreeMap<String, Labels>,
    /// Team usage for deny-mode quotas, as in `allot check --state`.
    #[serde(default, deserialize_with = "present")]
    usage: Option<UsageSpec>,
    cases: Vec<CaseSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestMetadata {
    name: String,
}

/// One path or a list of paths.
#[derive(Debug, Clone)]
struct PolicyPaths(Vec<String>);

impl<'de> Deserialize<'de> for PolicyPaths {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = PolicyPaths;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy directory or file, or a list of them")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PolicyPaths, E> {
                Ok(PolicyPaths(vec![v.to_string()]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<PolicyPaths, A::Error> {
                let mut paths = Vec::new();
                while let Some(p) = seq.next_element::<String>()? {
                    paths.push(p);
                }
                Ok(PolicyPaths(paths))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `usage: {teams: {vision: {nvidia.com/gpu: 12}}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageSpec {
    teams: BTreeMap<String, BTreeMap<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CaseSpec {
    name: String,
    /// The object under test, inline.
    #[serde(default, deserialize_with = "present")]
    resource: Option<Value>,
    /// Or a manifest file, relative to the test file.
    #[serde(default, deserialize_with = "present")]
    path: Option<String>,
    /// Which object of `path`, when it holds several.
    #[serde(default, deserialize_with = "present")]
    select: Option<Select>,
    /// Team usage for this case instead of the test's.
    #[serde(default, deserialize_with = "present")]
    usage: Option<UsageSpec>,
    #[serde(default, deserialize_with = "present")]
    expect: Option<Expect>,
}

/// Picks one object of a manifest file; every field given must match.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Select {
    /// 1-based document number, as `allot check` prints it (`file.yaml#2`).
    #[serde(default, deserialize_with = "present")]
    document: Option<usize>,
    #[serde(default, deserialize_with = "present")]
    kind: Option<String>,
    #[serde(default, deserialize_with = "present")]
    name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    namespace: Option<String>,
}

/// What a case expects. Every key is optional; at least one must be given.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expect {
    /// Admitted (true) or denied (false).
    #[serde(default, deserialize_with = "present")]
    pub allowed: Option<bool>,
    /// Exactly these rules deny (`[]`: none).
    #[serde(default, deserialize_with = "present")]
    pub denied_by: Option<Vec<String>>,
    /// Exactly these rules warn.
    #[serde(default, deserialize_with = "present")]
    pub warned_by: Option<Vec<String>>,
    /// Exactly these rules audit.
    #[serde(default, deserialize_with = "present")]
    pub audited_by: Option<Vec<String>>,
    /// The mutating webhook returns a patch (true) or none (false).
    #[serde(default, deserialize_with = "present")]
    pub mutated: Option<bool>,
    /// Exactly this patch, in order.
    #[serde(default, deserialize_with = "present")]
    pub patch: Option<Vec<ExpectedOp>>,
    /// JSON pointer into the mutated object → value; `null` means absent.
    #[serde(default, deserialize_with = "present")]
    pub fields: Option<BTreeMap<String, Value>>,
    /// Each string occurs in some finding (`path: message`).
    #[serde(default, deserialize_with = "present")]
    pub message_contains: Option<Vec<String>>,
}

/// One expected JSON Patch operation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedOp {
    pub op: OpName,
    pub path: String,
    #[serde(default, deserialize_with = "present")]
    pub value: Option<Value>,
}

/// RFC 6902 operations the engine emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpName {
    Add,
    Replace,
    Remove,
    Test,
}

/// A field that, when written, must hold a value: `deniedBy:` with nothing after it is YAML
/// `null`, and must not quietly mean "no expectation".
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// Decodes with the field path in the error (`cases[2].expect.denyBy: unknown field …`).
fn decode<T: DeserializeOwned>(value: Value) -> Result<T, (String, String)> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        (if path == "." { String::new() } else { path }, e.into_inner().to_string())
    })
}

impl ExpectedOp {
    fn to_patch_op(&self) -> Result<PatchOp, String> {
        let path = self.path.clone();
        if !(path.is_empty() || path.starts_with('/')) {
            return Err(format!("path: {path:?} is not a JSON pointer (write /spec/…)"));
        }
        match (self.op, self.value.clone()) {
            (OpName::Remove, None) => Ok(PatchOp::Remove { path }),
            (OpName::Remove, Some(_)) => Err("value: a remove operation takes no value".into()),
            (op, None) => Err(format!("value: a {} operation needs a value", op_label(op))),
            (OpName::Add, Some(value)) => Ok(PatchOp::Add { path, value }),
            (OpName::Replace, Some(value)) => Ok(PatchOp::Replace { path, value }),
            (OpName::Test, Some(value)) => Ok(PatchOp::Test { path, value }),
        }
    }
}

fn op_label(op: OpName) -> &'static str {
    match op {
        OpName::Add => "add",
        OpName::Replace => "replace",
        OpName::Remove => "remove",
        OpName::Test => "test",
    }
}

// ---------------------------------------------------------------------------------------------
// Expectations
// ---------------------------------------------------------------------------------------------

/// A case's expectations, checked for consistency.
#[derive(Debug, Clone)]
pub struct Expectations {
    expect: Expect,
    patch: Option<Vec<PatchOp>>,
}

impl Expectations {
    /// Checks an `expect` block: it must expect something, not contradict itself, and hold valid
    /// pointers and patch operations. Errors name the field under `expect`.
    pub fn new(expect: Expect) -> Result<Expectations, Vec<String>> {
        let mut errors = Vec::new();
        let e = &expect;
        let nothing = e.allowed.is_none()
            && e.denied_by.is_none()
            && e.warned_by.is_none()
            && e.audited_by.is_none()
            && e.mutated.is_none()
            && e.patch.is_none()
            && e.fields.is_none()
            && e.message_contains.is_none();
        if nothing {
            errors.push(
                "expect: expects nothing; give allowed, deniedBy, warnedBy, auditedBy, mutated, patch, fields \
                 or messageContains"
                    .to_string(),
            );
        }
        match (e.allowed, &e.denied_by) {
            (Some(true), Some(rules)) if !rules.is_empty() => {
                errors.push(format!("expect: allowed: true contradicts deniedBy: [{}]", rules.join(", ")))
            }
            (Some(false), Some(rules)) if rules.is_empty() => {
                errors.push("expect: allowed: false contradicts deniedBy: [] (denied by no rule)".into())
            }
            _ => {}
        }
        match (e.mutated, &e.patch) {
            (Some(false), Some(ops)) if !ops.is_empty() => {
                errors.push("expect: mutated: false contradicts a non-empty patch".into())
            }
            (Some(true), Some(ops)) if ops.is_empty() => {
                errors.push("expect: mutated: true contradicts patch: []".into())
            }
            _ => {}
        }
        for (field, rules) in [("deniedBy", &e.denied_by), ("warnedBy", &e.warned_by), ("auditedBy", &e.audited_by)] {
            for (i, rule) in rules.iter().flatten().enumerate() {
                if rule.trim().is_empty() {
                    errors.push(format!("expect.{field}[{i}]: empty rule name"));
                }
            }
        }
        if let Some(fields) = &e.fields {
            if fields.is_empty() {
                errors.push("expect.fields: empty; name at least one JSON pointer, or leave fields out".into());
            }
            for pointer in fields.keys().filter(|p| !p.starts_with('/')) {
                errors.push(format!("expect.fields.{pointer}: not a JSON pointer (write /spec/…)"));
            }
        }
        if let Some(words) = &e.message_contains {
            if words.is_empty() {
                errors.push("expect.messageContains: empty; give a substring, or leave messageContains out".into());
            }
            for (i, _) in words.iter().enumerate().filter(|(_, w)| w.is_empty()) {
                errors.push(format!("expect.messageContains[{i}]: empty string (it is in every message)"));
            }
        }
        let mut patch = None;
        if let Some(ops) = &e.patch {
            let mut converted = Vec::with_capacity(ops.len());
            for (i, op) in ops.iter().enumerate() {
                match op.to_patch_op() {
                    Ok(op) => converted.push(op),
                    Err(message) => errors.push(format!("expect.patch[{i}].{message}")),
                }
            }
            patch = Some(converted);
        }
        if errors.is_empty() { Ok(Expectations { expect, patch }) } else { Err(errors) }
    }

    /// What differs between the expectations and what the engine decided: one entry per
    /// expectation that failed, each saying what was expected and what came out. Empty: pass.
    pub fn compare(&self, report: &ObjectReport, mutated: &Value) -> Vec<String> {
        let e = &self.expect;
        let mut out = Vec::new();
        if let Some(allowed) = e.allowed
            && allowed != report.allowed
        {
            let why = if report.allowed {
                String::new()
            } else {
                format!(" (denied by [{}])", join(&rules_with(report, Action::Deny)))
            };
            out.push(format!("allowed: expected {allowed}, got {}{why}", report.allowed));
        }
        for (field, action, expected) in [
            ("deniedBy", Action::Deny, &e.denied_by),
            ("warnedBy", Action::Warn, &e.warned_by),
            ("auditedBy", Action::Audit, &e.audited_by),
        ] {
            if let Some(expected) = expected {
                out.extend(compare_rules(field, action, expected, report));
            }
        }
        if let Some(want) = e.mutated
            && want != report.mutated
        {
            out.push(format!("mutated: expected {want}, got {}", report.mutated));
        }
        if let Some(expected) = &self.patch {
            out.extend(compare_patch(expected, &report.patch));
        }
        for (pointer, want) in e.fields.iter().flatten() {
            let got = mutated.pointer(pointer).filter(|v| !v.is_null());
            let show = |v: Option<&Value>| v.map_or_else(|| "absent".to_string(), compact);
            let want = (!want.is_null()).then_some(want);
            if want != got {
                out.push(format!("fields {pointer}: expected {}, got {}", show(want), show(got)));
            }
        }
        for word in e.message_contains.iter().flatten() {
            if !report.findings.iter().any(|f| f.describe().contains(word.as_str())) {
                let messages: Vec<String> =
                    report.findings.iter().map(|f| format!("[{}] {}", f.rule, f.describe())).collect();
                let seen = if messages.is_empty() {
                    "\n  (there are no findings)".to_string()
                } else {
                    messages.iter().map(|m| format!("\n  finding: {m}")).collect()
                };
                out.push(format!("messageContains: no finding message contains {word:?}{seen}"));
            }
        }
        out
    }
}

fn rules_with(report: &ObjectReport, action: Action) -> BTreeSet<String> {
    report.findings.iter().filter(|f| f.action == action).map(|f| f.rule.clone()).collect()
}

fn join<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    items.into_iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The exact set of rules with `action`, compared by name; the messages of unexpected ones.
fn compare_rules(field: &str, action: Action, expected: &[String], report: &ObjectReport) -> Option<String> {
    let want: BTreeSet<String> = expected.iter().cloned().collect();
    let got = rules_with(report, action);
    if want == got {
        return None;
    }
    let mut text = format!("{field}: expected [{}], got [{}]", join(&want), join(&got));
    let missing: Vec<&String> = want.difference(&got).collect();
    if !missing.is_empty() {
        text.push_str(&format!("\n  missing: {}", join(missing)));
    }
    for rule in got.difference(&want) {
        for f in report.findings.iter().filter(|f| f.action == action && &f.rule == rule) {
            text.push_str(&format!("\n  unexpected: [{rule}] {}", f.describe()));
        }
    }
    Some(text)
}

fn compare_patch(expected: &[PatchOp], got: &[PatchOp]) -> Option<String> {
    if expected == got {
        return None;
    }
    let first = expected.iter().zip(got).take_while(|(a, b)| a == b).count();
    let counts = format!("expected {} op(s), got {}", expected.len(), got.len());
    Some(match (expected.get(first), got.get(first)) {
        (Some(want), Some(have)) => format!(
            "patch: op {} differs ({counts})\n  expected: {}\n  got:      {}",
            first + 1,
            check::describe_op(want),
            check::describe_op(have)
        ),
        (Some(_), None) => format!(
            "patch: {counts}; missing:\n  {}",
            expected[first..].iter().map(check::describe_op).collect::<Vec<_>>().join("\n  ")
        ),
        (None, _) => format!(
            "patch: {counts}; unexpected:\n  {}",
            got[first..].iter().map(check::describe_op).collect::<Vec<_>>().join("\n  ")
        ),
    })
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// Every test, ready to run: policies compiled, resources read.
pub struct Suite {
    tests: Vec<LoadedTest>,
}

struct LoadedTest {
    file: String,
    document: usize,
    name: String,
    /// What the policies were loaded from, for the report.
    policy_label: String,
    policies: Arc<PolicySet>,
    labels: Option<StaticNamespaces>,
    cases: Vec<LoadedCase>,
}

struct LoadedCase {
    name: String,
    manifest: Manifest,
    usage: BTreeMap<String, ResourceList>,
    expectations: Expectations,
}

/// Compiled policy sets by the list of paths they come from: test files usually share one.
#[derive(Default)]
struct PolicyCache(HashMap<Vec<PathBuf>, Option<Arc<PolicySet>>>);

impl PolicyCache {
    /// The set compiled from `paths`, or `None` after reporting its errors (once per set).
    fn get(&mut self, paths: &[PathBuf], location: &str, problems: &mut Vec<String>) -> Option<Arc<PolicySet>> {
        if let Some(cached) = self.0.get(paths) {
            return cached.clone();
        }
        let compiled = match read_policy_sources(paths).and_then(|s| policy::compile(&s).map_err(|e| e.0)) {
            Ok(set) => Some(Arc::new(set)),
            Err(errors) => {
                problems.extend(errors.into_iter().map(|e| format!("{location}: policies: {e}")));
                None
            }
        };
        self.0.insert(paths.to_vec(), compiled.clone());
        compiled
    }
}

fn read_policy_sources(paths: &[PathBuf]) -> Result<Vec<policy::Source>, Vec<String>> {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        match std::fs::metadata(path) {
            Err(e) => errors.push(format!("{}: {e}", path.display())),
            Ok(meta) if meta.is_dir() => match policy::read_sources(path) {
                Ok(s) => sources.extend(s),
                Err(e) => errors.extend(e.0),
            },
            Ok(_) => match std::fs::read_to_string(path) {
                Ok(text) => sources.push(policy::Source { name: path.display().to_string(), text }),
                Err(e) => errors.push(format!("{}: {e}", path.display())),
            },
        }
    }
    if errors.is_empty() { Ok(sources) } else { Err(errors) }
}

/// `a/b/../c` → `a/c`, as Go's `filepath.Join` cleans paths: test files name their policies and
/// resources relative to themselves, and messages should show `policies/teams.yaml`, not
/// `policy-tests/../policies/teams.yaml`.
fn tidy(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    if out.as_os_str().is_empty() { PathBuf::from(".") } else { out }
}

/// A document found in a test file.
struct TestDocument {
    file: PathBuf,
    index: usize,
    value: Value,
}

/// What a document in a searched file is.
enum DocumentRole {
    Test,
    Fixture,
    Invalid(String),
}

fn role(doc: &Value) -> DocumentRole {
    let kind = doc.get("kind").and_then(Value::as_str);
    let api_version = doc.get("apiVersion").and_then(Value::as_str);
    let ours = api_version.is_some_and(|a| a.split('/').next() == Some("allot.dev"));
    match kind {
        // A Test of some other API group is somebody else's object.
        Some(TEST_KIND) if ours || api_version.is_none() => DocumentRole::Test,
        Some(k) if ours && !POLICY_KINDS.contains(&k) => DocumentRole::Invalid(format!(
            "kind: {k:?} is neither {TEST_KIND} nor a policy kind ({})",
            POLICY_KINDS.join(", ")
        )),
        None if ours => DocumentRole::Invalid("kind is missing".into()),
        _ => DocumentRole::Fixture,
    }
}

/// Reads one file; returns its Test documents. `explicit`: named on the command line, so it
/// must be a test file.
fn read_test_file(file: &Path, explicit: bool, problems: &mut Vec<String>) -> Vec<TestDocument> {
    let name = file.display().to_string();
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!("{name}: {e}"));
            return Vec::new();
        }
    };
    let docs = match policy::parse_documents(&name, &text) {
        Ok(d) => d,
        Err(e) => {
            problems.push(e);
            return Vec::new();
        }
    };
    let roles: Vec<DocumentRole> = docs.iter().map(|(_, d)| role(d)).collect();
    let is_test_file = roles.iter().any(|r| matches!(r, DocumentRole::Test));
    let mut tests = Vec::new();
    for ((index, value), role) in docs.into_iter().zip(roles) {
        match role {
            DocumentRole::Test => tests.push(TestDocument { file: file.to_path_buf(), index, value }),
            DocumentRole::Invalid(message) => problems.push(format!("{name}: document {index}: {message}")),
            DocumentRole::Fixture if is_test_file => {
                let kind = value.get("kind").and_then(Value::as_str).unwrap_or("(no kind)");
                problems.push(format!(
                    "{name}: document {index}: a test file holds only {TEST_KIND} documents, this one is {kind}; \
                     put resources inline under cases[].resource or in a file of their own (cases[].path)"
                ));
            }
            DocumentRole::Fixture => {}
        }
    }
    if explicit && !is_test_file {
        problems.push(format!("{name}: no {TEST_KIND} documents (apiVersion: {API_VERSION}, kind: {TEST_KIND})"));
    }
    tests
}

/// Finds the Test documents under `paths` (files and directories).
fn find_tests(paths: &[PathBuf], problems: &mut Vec<String>) -> Vec<TestDocument> {
    let mut tests = Vec::new();
    let mut seen = HashSet::new();
    for path in paths {
        let path = tidy(path);
        match std::fs::metadata(&path) {
            Err(e) => problems.push(format!("{}: {e}", path.display())),
            Ok(meta) if meta.is_dir() => {
                let files = match crate::files::yaml_files(&path) {
                    Ok(files) => files,
                    Err(e) => {
                        problems.push(format!("{}: {e}", path.display()));
                        continue;
                    }
                };
                let (tests_before, problems_before) = (tests.len(), problems.len());
                for file in files.into_iter().filter(|f| seen.insert(f.clone())) {
                    tests.extend(read_test_file(&file, false, problems));
                }
                if tests.len() == tests_before && problems.len() == problems_before {
                    problems.push(format!(
                        "{}: no test files (YAML or JSON with a document of kind: {TEST_KIND}) found",
                        path.display()
                    ));
                }
            }
            Ok(_) => {
                if seen.insert(path.clone()) {
                    tests.extend(read_test_file(&path, true, problems));
                }
            }
        }
    }
    tests
}

/// Reads and checks every test under `paths`, with their policies (`policies` replaces the ones
/// each test names), namespaces and resources. All-or-nothing: any problem fails the load, and
/// the error lists every problem found.
pub fn load(paths: &[PathBuf], policies: Option<&Path>) -> Result<Suite, SuiteError> {
    let mut problems = Vec::new();
    let documents = find_tests(paths, &mut problems);
    let mut cache = PolicyCache::default();
    let mut tests = Vec::new();
    for doc in documents {
        if let Some(test) = load_test(doc, policies, &mut cache, &mut problems) {
            tests.push(test);
        }
    }
    if problems.is_empty() { Ok(Suite { tests }) } else { Err(SuiteError::Invalid(problems)) }
}

fn load_test(
    doc: TestDocument,
    policies_override: Option<&Path>,
    cache: &mut PolicyCache,
    problems: &mut Vec<String>,
) -> Option<LoadedTest> {
    let file = doc.file.display().to_string();
    let base = doc.file.parent().map(Path::to_path_buf).unwrap_or_default();
    let name_hint = doc.value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("?").to_string();
    let location = format!("{file}: document {} ({TEST_KIND} {name_hint})", doc.index);
    if !doc.value.is_object() {
        problems.push(format!("{location}: a {TEST_KIND} document must be a mapping"));
        return None;
    }
    let raw = doc.value.clone();
    let spec: TestSpec = match decode(doc.value) {
        Ok(s) => s,
        Err((path, message)) => {
            let case = case_hint(&raw, &path);
            let path = if path.is_empty() { String::new() } else { format!("{path}: ") };
            problems.push(format!("{location}: {path}{message}{case}"));
            return None;
        }
    };
    let before = problems.len();
    let problem = |problems: &mut Vec<String>, message: String| problems.push(format!("{location}: {message}"));
    if spec.api_version != API_VERSION {
        problem(problems, format!("apiVersion: {:?} is not supported; use {API_VERSION}", spec.api_version));
    }
    if spec.metadata.name.trim().is_empty() {
        problem(problems, "metadata.name: must not be empty".into());
    }
    if spec.cases.is_empty() {
        problem(problems, "cases: must not be empty".into());
    }

    let resolve = |p: &str| tidy(&base.join(p));
    let policy_paths: Vec<PathBuf> = match (policies_override, &spec.policies) {
        (Some(dir), _) => vec![tidy(dir)],
        (None, Some(paths)) if !paths.0.is_empty() => paths.0.iter().map(|p| resolve(p)).collect(),
        (None, Some(_)) => {
            problem(problems, "policies: empty list; name a policy directory or file".into());
            Vec::new()
        }
        (None, None) => {
            problem(
                problems,
                "policies: not set; name the policy directory (relative to this file) or pass --policies".into(),
            );
            Vec::new()
        }
    };
    let policy_label = policy_paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" + ");
    let policies = if policy_paths.is_empty() { None } else { cache.get(&policy_paths, &location, problems) };

    let labels = read_namespaces(&spec, &resolve, &location, problems);
    let team_names: Option<BTreeSet<&str>> =
        policies.as_deref().map(|p| p.teams.iter().map(|t| t.name.as_str()).collect());
    let file_usage = spec
        .usage
        .as_ref()
        .and_then(|u| parse_usage(u, "usage", team_names.as_ref()).map_err(|e| problem(problems, e)).ok())
        .unwrap_or_default();

    let mut cases = Vec::new();
    let mut case_names = HashSet::new();
    for (i, case) in spec.cases.into_iter().enumerate() {
        let at = format!("{location}: cases[{i}] ({:?})", case.name);
        if case.name.trim().is_empty() {
            problems.push(format!("{location}: cases[{i}].name: must not be empty"));
        } else if !case_names.insert(case.name.clone()) {
            problems.push(format!("{at}: name: another case of this test has the same name"));
        }
        let usage = match &case.usage {
            Some(u) => parse_usage(u, "usage", team_names.as_ref()).map_err(|e| problems.push(format!("{at}: {e}"))),
            None => Ok(file_usage.clone()),
        };
        let expectations = Expectations::new(case.expect.clone().unwrap_or_default())
            .map_err(|errors| problems.extend(errors.into_iter().map(|e| format!("{at}: {e}"))));
        let manifest =
            case_manifest(&case, &file, doc.index, &resolve).map_err(|e| problems.push(format!("{at}: {e}")));
        if let (Ok(usage), Ok(expectations), Ok(manifest)) = (usage, expectations, manifest) {
            cases.push(LoadedCase { name: case.name, manifest, usage, expectations });
        }
    }
    if problems.len() > before {
        return None;
    }
    Some(LoadedTest {
        file,
        document: doc.index,
        name: spec.metadata.name,
        policy_label,
        policies: policies?,
        labels,
        cases,
    })
}

/// ` (case "name")` when a decode error is inside `cases[N]`.
fn case_hint(raw: &Value, path: &str) -> String {
    let index =
        path.strip_prefix("cases[").and_then(|rest| rest.split_once(']')).and_then(|(n, _)| n.parse::<usize>().ok());
    index
        .and_then(|i| raw.get("cases")?.get(i)?.get("name")?.as_str())
        .map(|name| format!(" (case {name:?})"))
        .unwrap_or_default()
}

fn read_namespaces(
    spec: &TestSpec,
    resolve: &dyn Fn(&str) -> PathBuf,
    location: &str,
    problems: &mut Vec<String>,
) -> Option<StaticNamespaces> {
    if spec.namespaces.is_empty() && spec.namespace_labels.is_empty() {
        return None;
    }
    let mut table = HashMap::new();
    for (i, path) in spec.namespaces.iter().enumerate() {
        let path = resolve(path);
        let name = path.display().to_string();
        let read = std::fs::read_to_string(&path)
            .map_err(|e| format!("{name}: {e}"))
            .and_then(|text| namespaces::from_manifests(&name, &text));
        match read {
            Ok(ns) => table.extend(ns.0),
            Err(e) => problems.push(format!("{location}: namespaces[{i}]: {e}")),
        }
    }
    table.extend(spec.namespace_labels.clone());
    Some(StaticNamespaces(table))
}

fn parse_usage(
    usage: &UsageSpec,
    field: &str,
    teams: Option<&BTreeSet<&str>>,
) -> Result<BTreeMap<String, ResourceList>, String> {
    let mut out = BTreeMap::new();
    for (team, amounts) in &usage.teams {
        if let Some(known) = teams
            && !known.contains(team.as_str())
        {
            return Err(format!(
                "{field}.teams.{team}: no Team named {team:?} in the policies (teams: {})",
                known.iter().copied().collect::<Vec<_>>().join(", ")
            ));
        }
        out.insert(team.clone(), crate::quota::parse_amounts(&format!("{field}.teams.{team}"), amounts)?);
    }
    Ok(out)
}

/// The case's one object: inline, or the one object of `path` that `select` picks.
fn case_manifest(
    case: &CaseSpec,
    file: &str,
    document: usize,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<Manifest, String> {
    match (&case.resource, &case.path) {
        (Some(_), Some(_)) => Err("give resource or path, not both".into()),
        (None, None) => Err("no resource: give resource (an inline object) or path (a manifest file)".into()),
        (Some(_), None) if case.select.is_some() => Err("select: only with path".into()),
        (Some(object), None) => {
            let bad = |m: &str| Err(format!("resource: {m}"));
            if !object.is_object() {
                return bad("not a Kubernetes object (expected a mapping)");
            }
            if object.get("apiVersion").and_then(Value::as_str).is_none() {
                return bad("apiVersion is missing");
            }
            match object.get("kind").and_then(Value::as_str) {
                None => bad("kind is missing"),
                Some(kind) if kind.ends_with("List") => bad("a case tests one object, not a List"),
                Some(_) => Ok(Manifest { source: file.to_string(), document, object: object.clone() }),
            }
        }
        (None, Some(path)) => {
            let resolved = resolve(path);
            let manifests = check::read_manifests(std::slice::from_ref(&resolved)).map_err(|e| format!("path: {e}"))?;
            select_one(manifests, case.select.as_ref(), &resolved.display().to_string())
        }
    }
}

fn select_one(manifests: Vec<Manifest>, select: Option<&Select>, path: &str) -> Result<Manifest, String> {
    let text = |m: &Manifest, p: &str| m.object.pointer(p).and_then(Value::as_str).map(str::to_string);
    let namespace = |m: &Manifest| text(m, "/metadata/namespace").unwrap_or_else(|| check::DEFAULT_NAMESPACE.into());
    let describe = |m: &Manifest| {
        format!(
            "{} {}/{} (document {})",
            text(m, "/kind").unwrap_or_default(),
            namespace(m),
            text(m, "/metadata/name").unwrap_or_default(),
            m.document
        )
    };
    let all: Vec<String> = manifests.iter().map(describe).collect();
    let matching: Vec<Manifest> = manifests
        .into_iter()
        .filter(|m| {
            select.is_none_or(|s| {
                s.document.is_none_or(|d| d == m.document)
                    && s.kind.as_ref().is_none_or(|k| text(m, "/kind").as_ref() == Some(k))
                    && s.name.as_ref().is_none_or(|n| text(m, "/metadata/name").as_ref() == Some(n))
                    && s.namespace.as_ref().is_none_or(|n| &namespace(m) == n)
            })
        })
        .collect();
    match matching.len() {
        1 => matching.into_iter().next().ok_or_else(|| "no object".to_string()),
        0 if select.is_some() => Err(format!("select: no object of {path} matches; it holds {}", all.join(", "))),
        0 => Err(format!("path: {path} holds no object")),
        n => Err(format!(
            "path: {n} objects of {path} match ({}); pick one with select: {{kind, name, namespace, document}}",
            matching.iter().map(describe).collect::<Vec<_>>().join(", ")
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Running and reporting
// ---------------------------------------------------------------------------------------------

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

fn run_test(test: &LoadedTest) -> TestReport {
    let labels: &dyn NamespaceLabels = match &test.labels {
        Some(l) => l,
        None => &NoNamespaces,
    };
    let engine = Engine::new(&test.policies, labels);
    // The test's resources are one run's manifests: gang members see each other, as in `allot check`.
    let manifests: Vec<Manifest> = test.cases.iter().map(|c| c.manifest.clone()).collect();
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

fn indent(text: &str, by: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn yaml(text: &str) -> Value {
        let mut docs = policy::parse_documents("test", text).expect("valid YAML");
        assert_eq!(docs.len(), 1, "one document");
        docs.remove(0).1
    }

    /// The engine's decision on one resource, as `allot check` makes it, with the shipped policies.
    fn admit(resource: &str) -> check::Admitted {
        let policies = policy::load_dir(&repo().join("policies")).expect("the shipped policies load");
        let engine = Engine::new(&policies, &NoNamespaces);
        check::admit_manifest(&engine, &Manifest { source: "t.yaml".into(), document: 1, object: yaml(resource) })
    }

    fn expectations(text: &str) -> Expectations {
        let expect: Expect = decode(yaml(text)).expect("a valid expect block");
        Expectations::new(expect).expect("consistent expectations")
    }

    /// The mismatches of `expect` (YAML) against the engine's decision on `resource`.
    fn mismatches(resource: &str, expect: &str) -> Vec<String> {
        let admitted = admit(resource);
        expectations(expect).compare(&admitted.report, &admitted.mutated)
    }

    fn one(mismatches: Vec<String>) -> String {
        assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
        mismatches.into_iter().next().unwrap_or_default()
    }

    /// Denied (no team), warned (`:latest`), audited (high-priority), mutated (toleration).
    const STRAY: &str = "
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: scratch}
spec:
  priorityClassName: high-priority
  containers:
    - name: train
      image: pytorch/pytorch:latest
      resources: {limits: {nvidia.com/gpu: 2}}
";

    /// Admitted, mutated: toleration and priority class.
    const GPU_POD: &str = "
apiVersion: v1
kind: Pod
metadata: {name: gpu, namespace: vision}
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.1-runtime-ubuntu22.04
      resources: {limits: {nvidia.com/gpu: 1}}
";

    #[test]
    fn allowed() {
        assert_eq!(mismatches(GPU_POD, "allowed: true"), Vec::<String>::new());
        assert_eq!(mismatches(STRAY, "allowed: false"), Vec::<String>::new());
        assert_eq!(
            one(mismatches(STRAY, "allowed: true")),
            "allowed: expected true, got false (denied by [gpu-pods-belong-to-a-team])"
        );
        assert_eq!(one(mismatches(GPU_POD, "allowed: false")), "allowed: expected false, got true");
    }

    #[test]
    fn rule_sets_are_exact_and_name_what_is_missing_and_unexpected() {
        let right = "{deniedBy: [gpu-pods-belong-to-a-team], warnedBy: [pinned-images-on-gpus], \
                     auditedBy: [high-priority-is-audited]}";
        assert_eq!(mismatches(STRAY, right), Vec::<String>::new());
        assert_eq!(mismatches(GPU_POD, "{deniedBy: [], warnedBy: [], auditedBy: []}"), Vec::<String>::new());

        let denied = one(mismatches(STRAY, "deniedBy: [team/quota]"));
        assert_eq!(
            denied,
            "deniedBy: expected [team/quota], got [gpu-pods-belong-to-a-team]\n  missing: team/quota\n  \
             unexpected: [gpu-pods-belong-to-a-team] namespace scratch belongs to no team; GPU workloads run in \
             team namespaces"
        );
        // A subset is not the set.
        let subset = one(mismatches(STRAY, "deniedBy: [gpu-pods-belong-to-a-team, accelerators/max-per-pod]"));
        assert!(subset.ends_with("\n  missing: accelerators/max-per-pod"), "{subset}");

        let warned = one(mismatches(STRAY, "warnedBy: []"));
        assert!(warned.starts_with("warnedBy: expected [], got [pinned-images-on-gpus]\n"), "{warned}");
        assert!(warned.contains("unexpected: [pinned-images-on-gpus] GPU containers should pin an image tag"));

        let audited = one(mismatches(GPU_POD, "auditedBy: [high-priority-is-audited]"));
        assert_eq!(
            audited,
            "auditedBy: expected [high-priority-is-audited], got []\n  missing: high-priority-is-audited"
        );
    }

    #[test]
    fn mutated() {
        assert_eq!(mismatches(GPU_POD, "mutated: true"), Vec::<String>::new());
        assert_eq!(one(mismatches(GPU_POD, "mutated: false")), "mutated: expected false, got true");
        let job = "{apiVersion: batch/v1, kind: Job, metadata: {name: j, namespace: vision}, spec: {template: {spec: {containers: []}}}}";
        assert_eq!(one(mismatches(job, "mutated: true")), "mutated: expected true, got false");
    }

    #[test]
    fn patch_is_exact_and_in_order() {
        let right = "
patch:
  - {op: add, path: /spec/tolerations, value: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
  - {op: add, path: /spec/priorityClassName, value: low-priority}
";
        assert_eq!(mismatches(GPU_POD, right), Vec::<String>::new());

        let wrong_value = right.replace("value: low-priority", "value: high-priority");
        assert_eq!(
            one(mismatches(GPU_POD, &wrong_value)),
            "patch: op 2 differs (expected 2 op(s), got 2)\n  \
             expected: add     /spec/priorityClassName \"high-priority\"\n  \
             got:      add     /spec/priorityClassName \"low-priority\""
        );
        let missing = format!("{right}  - {{op: remove, path: /spec/priority}}\n");
        assert_eq!(
            one(mismatches(GPU_POD, &missing)),
            "patch: expected 3 op(s), got 2; missing:\n  remove  /spec/priority"
        );
        let only_class = "patch: [{op: add, path: /spec/priorityClassName, value: low-priority}]";
        let extra = one(mismatches(GPU_POD, only_class));
        assert!(extra.starts_with("patch: op 1 differs (expected 1 op(s), got 2)\n"), "{extra}");
        let cpu = "{apiVersion: v1, kind: Pod, metadata: {name: c, namespace: vision}, spec: {containers: [{name: a, image: a:1}]}}";
        assert_eq!(mismatches(cpu, only_class), Vec::<String>::new());
        let none = "patch: []";
        assert_eq!(
            one(mismatches(cpu, none)),
            "patch: expected 0 op(s), got 1; unexpected:\n  add     /spec/priorityClassName \"low-priority\""
        );
    }

    #[test]
    fn fields_read_the_mutated_object_and_null_means_absent() {
        let right = "fields: {/spec/priorityClassName: low-priority, /spec/tolerations/0/key: nvidia.com/gpu, \
                     /spec/schedulingGates: null, /metadata/name: gpu}";
        assert_eq!(mismatches(GPU_POD, right), Vec::<String>::new());
        assert_eq!(
            one(mismatches(GPU_POD, "fields: {/spec/priorityClassName: high-priority}")),
            "fields /spec/priorityClassName: expected \"high-priority\", got \"low-priority\""
        );
        assert_eq!(
            one(mismatches(GPU_POD, "fields: {/spec/tolerations: null}")),
            "fields /spec/tolerations: expected absent, got \
             [{\"effect\":\"NoSchedule\",\"key\":\"nvidia.com/gpu\",\"operator\":\"Exists\"}]"
        );
        assert_eq!(
            one(mismatches(GPU_POD, "fields: {/spec/schedulingGates/0/name: allot.dev/gang}")),
            "fields /spec/schedulingGates/0/name: expected \"allot.dev/gang\", got absent"
        );
    }

    #[test]
    fn message_contains_searches_every_finding() {
        let right = "messageContains: [\"namespace scratch belongs to no team\", \"requesting 2 accelerator(s)\"]";
        assert_eq!(mismatches(STRAY, right), Vec::<String>::new());
        let wrong = one(mismatches(STRAY, "messageContains: [\"16/16\"]"));
        assert!(wrong.starts_with("messageContains: no finding message contains \"16/16\"\n"), "{wrong}");
        assert!(wrong.contains("\n  finding: [gpu-pods-belong-to-a-team] namespace scratch belongs to no team"));
        assert_eq!(
            one(mismatches(GPU_POD, "messageContains: [quota]")),
            "messageContains: no finding message contains \"quota\"\n  (there are no findings)"
        );
    }

    #[test]
    fn every_failed_expectation_is_reported() {
        let all_wrong =
            mismatches(STRAY, "{allowed: true, deniedBy: [], mutated: false, fields: {/spec/priorityClassName: x}}");
        assert_eq!(all_wrong.len(), 4, "{all_wrong:#?}");
    }

    fn invalid(text: &str) -> Vec<String> {
        let expect: Expect = decode(yaml(text)).expect("decodes");
        Expectations::new(expect).expect_err("invalid expectations")
    }

    #[test]
    fn expectations_must_expect_something_consistent() {
        assert!(invalid("{}")[0].starts_with("expect: expects nothing; give allowed, deniedBy"), "{:?}", invalid("{}"));
        assert_eq!(invalid("{allowed: true, deniedBy: [r]}"), ["expect: allowed: true contradicts deniedBy: [r]"]);
        assert_eq!(
            invalid("{allowed: false, deniedBy: []}"),
            ["expect: allowed: false contradicts deniedBy: [] (denied by no rule)"]
        );
        assert_eq!(
            invalid("{mutated: false, patch: [{op: remove, path: /spec/x}]}"),
            ["expect: mutated: false contradicts a non-empty patch"]
        );
        assert_eq!(invalid("{fields: {spec.x: 1}}"), ["expect.fields.spec.x: not a JSON pointer (write /spec/…)"]);
        assert_eq!(
            invalid("{patch: [{op: remove, path: /a, value: 1}]}"),
            ["expect.patch[0].value: a remove operation takes no value"]
        );
        assert_eq!(invalid("{patch: [{op: add, path: /a}]}"), ["expect.patch[0].value: a add operation needs a value"]);
        assert_eq!(invalid("{messageContains: []}").len(), 1);
        // `value: null` is a value (add null), not a missing one.
        let expect: Expect = decode(yaml("{patch: [{op: add, path: /a, value: null}]}")).unwrap();
        assert!(Expectations::new(expect).is_ok());
    }

    #[test]
    fn decoding_is_strict_and_names_the_field() {
        let (path, message) = decode::<Expect>(yaml("{denyBy: [r]}")).unwrap_err();
        assert_eq!(path, "denyBy");
        assert!(message.starts_with("unknown field `denyBy`, expected one of `allowed`, `deniedBy`"), "{message}");
        // `deniedBy:` with nothing after it is null: an error, not "no expectation".
        let (path, message) = decode::<Expect>(yaml("{deniedBy: null}")).unwrap_err();
        assert_eq!(path, "deniedBy");
        assert!(message.contains("invalid type: null"), "{message}");
        let (path, message) = decode::<Expect>(yaml("{patch: [{op: move, path: /a}]}")).unwrap_err();
        assert_eq!(path, "patch[0].op");
        assert!(message.starts_with("unknown variant `move`"), "{message}");
    }

    // --- loading files ----------------------------------------------------------------------

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, text).expect("write");
        path
    }

    /// A test document using the shipped policies, with `cases` (YAML, indented by 2).
    fn test_file(cases: &str) -> String {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: demo}}\npolicies: {}\ncases:\n{cases}",
            repo().join("policies").display()
        )
    }

    const GPU_CASE: &str = "
  - name: gpu pod
    resource: {apiVersion: v1, kind: Pod, metadata: {name: gpu, namespace: vision}, spec: {containers: [{name: c, image: 'i:1', resources: {limits: {nvidia.com/gpu: 1}}}]}}
";

    fn problems(paths: &[PathBuf]) -> Vec<String> {
        match load(paths, None) {
            Err(SuiteError::Invalid(p)) => p,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("expected problems"),
        }
    }

    #[test]
    fn unknown_fields_name_file_document_field_and_case() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = format!("{GPU_CASE}    expect: {{denyBy: [x]}}\n");
        let file = write(dir.path(), "t.yaml", &format!("---\n{}", test_file(&cases)));
        let p = problems(std::slice::from_ref(&file));
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(
            p[0].starts_with(&format!(
                "{}: document 1 (Test demo): cases[0].expect.denyBy: unknown field `denyBy`",
                file.display()
            )),
            "{}",
            p[0]
        );
        assert!(p[0].ends_with("(case \"gpu pod\")"), "{}", p[0]);

        let file = write(
            dir.path(),
            "top.yaml",
            &format!("{}polices: x\n", test_file(&format!("{GPU_CASE}    expect: {{allowed: true}}\n"))),
        );
        let p = problems(&[file]);
        assert!(p[0].contains("document 1 (Test demo): polices: unknown field `polices`"), "{p:?}");
    }

    #[test]
    fn a_case_that_expects_nothing_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = write(dir.path(), "t.yaml", &test_file(GPU_CASE));
        let p = problems(std::slice::from_ref(&file));
        assert_eq!(
            p,
            [format!(
                "{}: document 1 (Test demo): cases[0] (\"gpu pod\"): expect: expects nothing; give allowed, deniedBy, \
                 warnedBy, auditedBy, mutated, patch, fields or messageContains",
                file.display()
            )]
        );
    }

    #[test]
    fn resources_policies_and_usage_are_checked_at_load() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "pods.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n",
        );
        let cases = "
  - name: two objects
    path: pods.yaml
    expect: {allowed: true}
  - name: nothing selected
    path: pods.yaml
    select: {name: c}
    expect: {allowed: true}
  - name: missing file
    path: nope.yaml
    expect: {allowed: true}
  - name: both
    path: pods.yaml
    resource: {apiVersion: v1, kind: Pod}
    expect: {allowed: true}
  - name: unknown team
    usage: {teams: {visoin: {nvidia.com/gpu: 1}}}
    path: pods.yaml
    select: {document: 2}
    expect: {allowed: true}
";
        let file = write(dir.path(), "t.yaml", &test_file(cases));
        let p = problems(&[file]);
        assert_eq!(p.len(), 5, "{p:#?}");
        assert!(p[0].contains("cases[0] (\"two objects\"): path: 2 objects of"), "{}", p[0]);
        assert!(
            p[0].contains("(Pod default/a (document 1), Pod default/b (document 2)); pick one with select"),
            "{}",
            p[0]
        );
        assert!(p[1].contains("select: no object of") && p[1].contains("matches; it holds Pod default/a"), "{}", p[1]);
        assert!(p[2].contains("cases[2] (\"missing file\"): path: ") && p[2].contains("nope.yaml"), "{}", p[2]);
        assert!(p[3].ends_with("give resource or path, not both"), "{}", p[3]);
        assert!(
            p[4].contains("usage.teams.visoin: no Team named \"visoin\" in the policies (teams: nlp, vision)"),
            "{}",
            p[4]
        );

        let no_policies = write(
            dir.path(),
            "np.yaml",
            &format!(
                "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: np}}\ncases:\n{GPU_CASE}    expect: {{allowed: true}}\n"
            ),
        );
        let p = problems(std::slice::from_ref(&no_policies));
        assert!(
            p[0].ends_with("policies: not set; name the policy directory (relative to this file) or pass --policies"),
            "{p:?}"
        );
        // --policies fills it in.
        let suite = load(&[no_policies], Some(&repo().join("policies"))).expect("loads with --policies");
        assert!(suite.run().all_passed());
    }

    #[test]
    fn directories_hold_test_files_and_fixtures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = test_file(&format!("{GPU_CASE}    expect: {{allowed: true}}\n"));
        write(dir.path(), "a/t.yaml", &good);
        write(dir.path(), "a/pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n");
        write(dir.path(), "a/policy.yaml", "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\n");
        write(dir.path(), "a/notes.txt", "not YAML at all: [");
        write(dir.path(), "a/.hidden/broken.yaml", "kind: [");
        let suite = load(&[dir.path().to_path_buf()], None).expect("fixtures are skipped");
        assert_eq!(suite.cases(), 1);

        // A mistyped kind in the allot.dev group is not skipped silently.
        write(dir.path(), "a/typo.yaml", "apiVersion: allot.dev/v1alpha1\nkind: Tset\nmetadata: {name: t}\n");
        let p = problems(&[dir.path().to_path_buf()]);
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(p[0].ends_with("typo.yaml: document 1: kind: \"Tset\" is neither Test nor a policy kind (Cluster, Team, Placement, Rule, GangPolicy)"), "{}", p[0]);

        // A test file holds only Test documents; a file named explicitly must be a test file.
        let mixed = write(
            dir.path(),
            "b/mixed.yaml",
            &format!("{good}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\n"),
        );
        let p = problems(&[mixed]);
        assert!(p[0].contains("document 2: a test file holds only Test documents, this one is Pod"), "{p:?}");
        let p = problems(&[dir.path().join("a/pod.yaml")]);
        assert!(p[0].ends_with("pod.yaml: no Test documents (apiVersion: allot.dev/v1alpha1, kind: Test)"), "{p:?}");
        let empty = tempfile::tempdir().expect("tempdir");
        let p = problems(&[empty.path().to_path_buf()]);
        assert!(p[0].contains("no test files"), "{p:?}");
        let p = problems(&[dir.path().join("missing")]);
        assert!(p[0].contains("missing"), "{p:?}");
        let other_group = write(dir.path(), "c/t.yaml", &good.replace("allot.dev/v1alpha1", "allot.dev/v1"));
        let p = problems(&[other_group]);
        assert!(p[0].contains("apiVersion: \"allot.dev/v1\" is not supported; use allot.dev/v1alpha1"), "{p:?}");
    }

    #[test]
    fn cases_share_gang_members_but_not_quota_usage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let member = |name: &str, size: u32| {
            format!(
                "{{apiVersion: v1, kind: Pod, metadata: {{name: {name}, namespace: vision, labels: {{allot.dev/gang-name: g}}, \
                 annotations: {{allot.dev/gang-size: '{size}'}}}}, spec: {{containers: [{{name: c, image: 'i:1', \
                 resources: {{limits: {{nvidia.com/gpu: 4}}}}}}]}}}}"
            )
        };
        let cases = format!(
            "
  - name: disagrees with m1
    resource: {}
    expect: {{deniedBy: [gang/consistency], messageContains: ['member m1 has 2']}}
  - name: disagrees with m0
    resource: {}
    expect: {{deniedBy: [gang/consistency]}}
  - name: four of sixteen, from the test's usage of twelve
    resource: {GPU_POD_INLINE}
    expect: {{allowed: true}}
  - name: again four, not charged by the case before
    resource: {GPU_POD_INLINE}
    expect: {{allowed: true}}
  - name: one more in use
    usage: {{teams: {{vision: {{nvidia.com/gpu: 13}}}}}}
    resource: {GPU_POD_INLINE}
    expect: {{deniedBy: [team/quota], messageContains: ['uses 13 of 16']}}
",
            member("m0", 4),
            member("m1", 2)
        );
        let text = test_file(&cases).replace("cases:\n", "usage: {teams: {vision: {nvidia.com/gpu: 12}}}\ncases:\n");
        let file = write(dir.path(), "t.yaml", &text);
        let report = load(&[file], None).expect("loads").run();
        let failures: Vec<_> = report.tests[0].cases.iter().filter(|c| !c.passed()).collect();
        assert!(failures.is_empty(), "{}", report.render_text());
        assert_eq!((report.passed(), report.failed()), (5, 0));
    }

    const GPU_POD_INLINE: &str = "{apiVersion: v1, kind: Pod, metadata: {name: four, namespace: vision}, spec: {containers: [{name: c, image: 'i:1', resources: {limits: {nvidia.com/gpu: 4}}}]}}";

    #[test]
    fn reports_say_what_failed_in_text_and_junit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = format!(
            "{GPU_CASE}    expect: {{allowed: true}}\n{}    expect: {{deniedBy: [team/quota]}}\n",
            GPU_CASE.replace("gpu pod", "wrong <one>")
        );
        let file = write(dir.path(), "t.yaml", &test_file(&cases));
        let report = load(std::slice::from_ref(&file), None).expect("loads").run();
        assert!(!report.all_passed());
        let text = report.render_text();
        assert!(text.contains("  ok    gpu pod\n"), "{text}");
        assert!(text.contains("  FAIL  wrong <one>\n        deniedBy: expected [team/quota], got []\n"), "{text}");
        assert!(text.contains("        the engine decided:\n          "), "{text}");
        assert!(text.contains("2 case(s) in 1 test(s): 1 passed, 1 failed\n"), "{text}");
        assert!(text.contains(&format!("FAILED  {} › wrong <one>", file.display())), "{text}");
        let xml = report.render_junit();
        assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
        assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
        assert!(xml.contains("<testsuites name=\"allot test\" tests=\"2\" failures=\"1\">"), "{xml}");
        assert!(xml.contains("name=\"wrong &lt;one&gt;\""), "{xml}");
        assert!(
            xml.contains("<failure message=\"deniedBy: expected [team/quota], got []\" type=\"mismatch\">"),
            "{xml}"
        );
    }

    #[test]
    fn paths_are_tidied_like_go_filepath_join() {
        assert_eq!(tidy(Path::new("policy-tests/../policies")), PathBuf::from("policies"));
        assert_eq!(tidy(Path::new("./a/./b/../c")), PathBuf::from("a/c"));
        assert_eq!(tidy(Path::new("../x")), PathBuf::from("../x"));
        assert_eq!(tidy(Path::new("a/..")), PathBuf::from("."));
        assert_eq!(tidy(Path::new("/a/../b")), PathBuf::from("/b"));
    }
}
