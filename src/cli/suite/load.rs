//! Loading: finding test files, parsing `kind: Test` documents strictly, compiling their
//! policies and reading their resources, namespaces and usage. All-or-nothing: every problem is
//! collected before anything runs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::errors::{CaseError, PolicySourceError, SelectError, UsageError};
use super::expect::{Expect, Expectations, decode, present};
use super::{POLICY_KINDS, SuiteError, TEST_KIND};
use crate::cli::check::{self, Manifest};
use crate::model::json::Fields;
use crate::model::namespaces::{self, Labels, StaticNamespaces};
use crate::model::policy::{self, API_VERSION, PolicySet};
use crate::model::resources::ResourceList;

/// `kind: Test`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TestSpec {
    pub(super) api_version: String,
    #[allow(dead_code, reason = "checked before decoding; kept so that `kind` is a known field")]
    pub(super) kind: String,
    pub(super) metadata: TestMetadata,
    /// Policy directories or files, relative to the test file, loaded in order as one set.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "PolicyPaths")]
    pub(super) policies: Option<PolicyPaths>,
    /// Namespace manifests (relative to the test file) whose labels Team selectors match.
    #[serde(default)]
    pub(super) namespaces: Vec<String>,
    /// Namespace labels written inline; added to (and overriding) those of `namespaces`.
    #[serde(default)]
    pub(super) namespace_labels: BTreeMap<String, Labels>,
    /// Team usage for deny-mode quotas, as in `allot check --state`.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "UsageSpec")]
    pub(super) usage: Option<UsageSpec>,
    pub(super) cases: Vec<CaseSpec>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TestMetadata {
    /// The test's name, in reports.
    pub(super) name: String,
}

/// One path or a list of paths.
#[derive(Debug, Clone)]
pub(super) struct PolicyPaths(pub(super) Vec<String>);

impl JsonSchema for PolicyPaths {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PolicyPaths".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A policy directory or file, or a list of them, relative to the test file.",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        })
    }
}

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
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageSpec {
    /// Team → resource → quantity in use.
    pub(super) teams: BTreeMap<String, BTreeMap<String, Value>>,
}

/// One case: an object (inline or from a file) and what Allot must decide about it.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct CaseSpec {
    /// The case's name, in reports.
    pub(super) name: String,
    /// The object under test, inline.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Value")]
    pub(super) resource: Option<Value>,
    /// Or a manifest file, relative to the test file.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(super) path: Option<String>,
    /// Which object of `path`, when it holds several.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Select")]
    pub(super) select: Option<Select>,
    /// Team usage for this case instead of the test's.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "UsageSpec")]
    pub(super) usage: Option<UsageSpec>,
    /// What Allot must decide (at least one key).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Expect")]
    pub(super) expect: Option<Expect>,
}

/// Picks one object of a manifest file; every field given must match.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Select {
    /// 1-based document number, as `allot check` prints it (`file.yaml#2`).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "usize")]
    pub(super) document: Option<usize>,
    /// The object's `kind`.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(super) kind: Option<String>,
    /// The object's `metadata.name`.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(super) name: Option<String>,
    /// The object's namespace.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "String")]
    pub(super) namespace: Option<String>,
}

/// Every test, ready to run: policies compiled, resources read.
pub struct Suite {
    pub(super) tests: Vec<LoadedTest>,
}

pub(super) struct LoadedTest {
    pub(super) file: String,
    pub(super) document: usize,
    pub(super) name: String,
    /// What the policies were loaded from, for the report.
    pub(super) policy_label: String,
    pub(super) policies: Arc<PolicySet>,
    /// The files and directories the policies were read from (`allot test --server` compiles
    /// their native half).
    pub(super) policy_paths: Vec<PathBuf>,
    pub(super) labels: Option<StaticNamespaces>,
    pub(super) cases: Vec<LoadedCase>,
}

impl LoadedTest {
    /// The test's resources as one run's manifests (gang members see each other, claims and
    /// PodGroups are resolved among them, as in `allot check`).
    pub(super) fn manifests(&self) -> Vec<Manifest> {
        self.cases.iter().map(|c| c.manifest.clone()).collect()
    }
}

pub(super) struct LoadedCase {
    pub(super) name: String,
    pub(super) manifest: Manifest,
    pub(super) usage: BTreeMap<String, ResourceList>,
    pub(super) expectations: Expectations,
}

/// Compiled policy sets by the list of paths they come from and the DeviceClasses among the
/// test's resources: test files usually share one.
#[derive(Default)]
pub(super) struct PolicyCache(pub(super) HashMap<(Vec<PathBuf>, policy::ClusterFacts), Option<Arc<PolicySet>>>);

impl PolicyCache {
    /// The set compiled from `paths` with `facts`, or `None` after reporting its errors (once
    /// per set).
    fn get(
        &mut self,
        paths: &[PathBuf],
        facts: &policy::ClusterFacts,
        location: &str,
        problems: &mut Vec<String>,
    ) -> Option<Arc<PolicySet>> {
        let key = (paths.to_vec(), facts.clone());
        if let Some(cached) = self.0.get(&key) {
            return cached.clone();
        }
        let compiled = match read_policy_sources(paths).and_then(|s| {
            policy::compile_with(&s, facts)
                .map_err(|e| e.0.into_iter().map(|m| PolicySourceError::Compile(m.to_string())).collect())
        }) {
            Ok(set) => Some(Arc::new(set)),
            Err(errors) => {
                problems.extend(errors.into_iter().map(|e| format!("{location}: policies: {e}")));
                None
            }
        };
        self.0.insert(key, compiled.clone());
        compiled
    }
}

/// The policy sources of the files and directories named: every problem, or every source.
pub(super) fn read_policy_sources(paths: &[PathBuf]) -> Result<Vec<policy::Source>, Vec<PolicySourceError>> {
    let mut sources = Vec::new();
    let mut errors = Vec::new();
    let unreadable = |path: &PathBuf, source| PolicySourceError::Unreadable { path: path.clone(), source };
    for path in paths {
        match std::fs::metadata(path) {
            Err(e) => errors.push(unreadable(path, e)),
            Ok(meta) if meta.is_dir() => match policy::read_sources(path) {
                Ok(s) => sources.extend(s),
                Err(e) => errors.extend(e.0.into_iter().map(|m| PolicySourceError::Directory(m.to_string()))),
            },
            Ok(_) => match std::fs::read_to_string(path) {
                Ok(text) => sources.push(policy::Source { name: path.display().to_string(), text }),
                Err(e) => errors.push(unreadable(path, e)),
            },
        }
    }
    if errors.is_empty() { Ok(sources) } else { Err(errors) }
}

/// `a/b/../c` → `a/c`, as Go's `filepath.Join` cleans paths: test files name their policies and
/// resources relative to themselves, and messages should show `policies/teams.yaml`, not
/// `policy-tests/../policies/teams.yaml`.
pub(super) fn tidy(path: &Path) -> PathBuf {
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
pub(super) struct TestDocument {
    pub(super) file: PathBuf,
    pub(super) index: usize,
    pub(super) value: Value,
}

/// What a document in a searched file is.
pub(super) enum DocumentRole {
    Test,
    Fixture,
    Invalid(String),
}

pub(super) fn role(doc: &Value) -> DocumentRole {
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
pub(super) fn read_test_file(file: &Path, explicit: bool, problems: &mut Vec<String>) -> Vec<TestDocument> {
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
            problems.push(e.to_string());
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
pub(super) fn find_tests(paths: &[PathBuf], problems: &mut Vec<String>) -> Vec<TestDocument> {
    let mut tests = Vec::new();
    let mut seen = HashSet::new();
    for path in paths {
        let path = tidy(path);
        match std::fs::metadata(&path) {
            Err(e) => problems.push(format!("{}: {e}", path.display())),
            Ok(meta) if meta.is_dir() => {
                let files = match crate::model::files::yaml_files(&path) {
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

/// What the steps of loading one test share: where it is, for messages, and how its relative
/// paths resolve.
pub(super) struct TestContext<'a> {
    pub(super) file: &'a str,
    pub(super) document: usize,
    /// `FILE: document N (Test NAME)`, the start of every problem of this test.
    pub(super) location: &'a str,
    pub(super) resolve: &'a dyn Fn(&str) -> PathBuf,
}

pub(super) fn load_test(
    doc: TestDocument,
    policies_override: Option<&Path>,
    cache: &mut PolicyCache,
    problems: &mut Vec<String>,
) -> Option<LoadedTest> {
    let file = doc.file.display().to_string();
    let base = doc.file.parent().map(Path::to_path_buf).unwrap_or_default();
    let name_hint = doc.value.field(&["metadata", "name"]).and_then(Value::as_str).unwrap_or("?").to_string();
    let location = format!("{file}: document {} ({TEST_KIND} {name_hint})", doc.index);
    let spec = decode_spec(doc.value, &location, problems)?;
    let before = problems.len();
    check_header(&spec, &location, problems);
    let resolve = |p: &str| tidy(&base.join(p));
    let context = TestContext { file: &file, document: doc.index, location: &location, resolve: &resolve };
    let policy_paths = policy_paths(&spec, policies_override, &context, problems);
    let policy_label = policy_paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" + ");
    let no_facts = policy::ClusterFacts::default();
    let policies =
        if policy_paths.is_empty() { None } else { cache.get(&policy_paths, &no_facts, &location, problems) };

    let labels = read_namespaces(&spec, &resolve, &location, problems);
    let team_names: Option<BTreeSet<&str>> =
        policies.as_deref().map(|p| p.teams.iter().map(|t| t.name.as_str()).collect());
    let file_usage = spec
        .usage
        .as_ref()
        .and_then(|u| {
            parse_usage(u, "usage", team_names.as_ref()).map_err(|e| problems.push(format!("{location}: {e}"))).ok()
        })
        .unwrap_or_default();
    let cases = load_cases(spec.cases, &context, team_names.as_ref(), &file_usage, problems);
    if problems.len() > before {
        return None;
    }
    // DeviceClasses among the resources count for their extended resource, as the server's
    // watch of the cluster's makes them count.
    let facts = policy::ClusterFacts::from_objects(cases.iter().map(|c| &c.manifest.object));
    let policies = if facts == no_facts { policies } else { cache.get(&policy_paths, &facts, &location, problems) };
    Some(LoadedTest {
        file,
        document: doc.index,
        name: spec.metadata.name,
        policy_label,
        policies: policies?,
        policy_paths,
        labels,
        cases,
    })
}

/// Strict decoding first: nothing else of a document that is not a well-formed Test can be
/// trusted, so its one problem is reported alone (with the case it is in).
fn decode_spec(value: Value, location: &str, problems: &mut Vec<String>) -> Option<TestSpec> {
    if !value.is_object() {
        problems.push(format!("{location}: a {TEST_KIND} document must be a mapping"));
        return None;
    }
    let raw = value.clone();
    match decode(value) {
        Ok(s) => Some(s),
        Err(e) => {
            let case = case_hint(&raw, &e.path);
            problems.push(format!("{location}: {e}{case}"));
            None
        }
    }
}

/// The fields serde accepts but a test cannot run with: another apiVersion, no name, no cases.
fn check_header(spec: &TestSpec, location: &str, problems: &mut Vec<String>) {
    if spec.api_version != API_VERSION {
        problems.push(format!("{location}: apiVersion: {:?} is not supported; use {API_VERSION}", spec.api_version));
    }
    if spec.metadata.name.trim().is_empty() {
        problems.push(format!("{location}: metadata.name: must not be empty"));
    }
    if spec.cases.is_empty() {
        problems.push(format!("{location}: cases: must not be empty"));
    }
}

/// The policy files and directories of a test: `--policies` wins over the test's own, and a
/// test must name some (an empty set would pass every case for the wrong reason).
fn policy_paths(
    spec: &TestSpec,
    policies_override: Option<&Path>,
    context: &TestContext<'_>,
    problems: &mut Vec<String>,
) -> Vec<PathBuf> {
    let location = context.location;
    match (policies_override, &spec.policies) {
        (Some(dir), _) => vec![tidy(dir)],
        (None, Some(paths)) if !paths.0.is_empty() => paths.0.iter().map(|p| (context.resolve)(p)).collect(),
        (None, Some(_)) => {
            problems.push(format!("{location}: policies: empty list; name a policy directory or file"));
            Vec::new()
        }
        (None, None) => {
            problems.push(format!(
                "{location}: policies: not set; name the policy directory (relative to this file) or pass --policies"
            ));
            Vec::new()
        }
    }
}

/// Every case checked on its own (name, usage, expectations, object), so that one load reports
/// the problems of all of them; only the cases without a problem are returned.
fn load_cases(
    specs: Vec<CaseSpec>,
    context: &TestContext<'_>,
    team_names: Option<&BTreeSet<&str>>,
    file_usage: &BTreeMap<String, ResourceList>,
    problems: &mut Vec<String>,
) -> Vec<LoadedCase> {
    let location = context.location;
    let mut cases = Vec::new();
    let mut case_names = HashSet::new();
    for (i, case) in specs.into_iter().enumerate() {
        let at = format!("{location}: cases[{i}] ({:?})", case.name);
        if case.name.trim().is_empty() {
            problems.push(format!("{location}: cases[{i}].name: must not be empty"));
        } else if !case_names.insert(case.name.clone()) {
            problems.push(format!("{at}: name: another case of this test has the same name"));
        }
        let usage = match &case.usage {
            Some(u) => parse_usage(u, "usage", team_names).map_err(|e| problems.push(format!("{at}: {e}"))),
            None => Ok(file_usage.clone()),
        };
        let expectations = Expectations::new(case.expect.clone().unwrap_or_default())
            .map_err(|errors| problems.extend(errors.into_iter().map(|e| format!("{at}: {e}"))));
        let manifest = case_manifest(&case, context.file, context.document, context.resolve)
            .map_err(|e| problems.push(format!("{at}: {e}")));
        if let (Ok(usage), Ok(expectations), Ok(manifest)) = (usage, expectations, manifest) {
            cases.push(LoadedCase { name: case.name, manifest, usage, expectations });
        }
    }
    cases
}

/// ` (case "name")` when a decode error is inside `cases[N]`.
pub(super) fn case_hint(raw: &Value, path: &str) -> String {
    let index =
        path.strip_prefix("cases[").and_then(|rest| rest.split_once(']')).and_then(|(n, _)| n.parse::<usize>().ok());
    index
        .and_then(|i| raw.get("cases")?.get(i)?.get("name")?.as_str())
        .map(|name| format!(" (case {name:?})"))
        .unwrap_or_default()
}

pub(super) fn read_namespaces(
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
            .and_then(|text| namespaces::from_manifests(&name, &text).map_err(|e| e.to_string()));
        match read {
            Ok(ns) => table.extend(ns.0),
            Err(e) => problems.push(format!("{location}: namespaces[{i}]: {e}")),
        }
    }
    table.extend(spec.namespace_labels.clone());
    Some(StaticNamespaces(table))
}

pub(super) fn parse_usage(
    usage: &UsageSpec,
    field: &str,
    teams: Option<&BTreeSet<&str>>,
) -> Result<BTreeMap<String, ResourceList>, UsageError> {
    let mut out = BTreeMap::new();
    for (team, amounts) in &usage.teams {
        if let Some(known) = teams
            && !known.contains(team.as_str())
        {
            return Err(UsageError::UnknownTeam {
                field: field.to_string(),
                team: team.clone(),
                known: known.iter().map(|t| t.to_string()).collect(),
            });
        }
        let amounts = crate::admission::quota::parse_amounts(&format!("{field}.teams.{team}"), amounts)?;
        out.insert(team.clone(), amounts);
    }
    Ok(out)
}

/// The case's one object: inline, or the one object of `path` that `select` picks.
pub(super) fn case_manifest(
    case: &CaseSpec,
    file: &str,
    document: usize,
    resolve: &dyn Fn(&str) -> PathBuf,
) -> Result<Manifest, CaseError> {
    match (&case.resource, &case.path) {
        (Some(_), Some(_)) => Err(CaseError::ResourceAndPath),
        (None, None) => Err(CaseError::NoResource),
        (Some(_), None) if case.select.is_some() => Err(CaseError::SelectWithoutPath),
        (Some(object), None) => {
            if !object.is_object() {
                return Err(CaseError::NotAnObject);
            }
            if object.get("apiVersion").and_then(Value::as_str).is_none() {
                return Err(CaseError::NoApiVersion);
            }
            match object.get("kind").and_then(Value::as_str) {
                None => Err(CaseError::NoKind),
                Some(kind) if kind.ends_with("List") => Err(CaseError::List),
                Some(_) => Ok(Manifest { source: file.to_string(), document, line: 0, object: object.clone() }),
            }
        }
        (None, Some(path)) => {
            let resolved = resolve(path);
            let manifests = check::read_manifests(std::slice::from_ref(&resolved)).map_err(CaseError::Manifests)?;
            Ok(select_one(manifests, case.select.as_ref(), &resolved.display().to_string())?)
        }
    }
}

pub(super) fn select_one(
    manifests: Vec<Manifest>,
    select: Option<&Select>,
    path: &str,
) -> Result<Manifest, SelectError> {
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
    let mut matching: Vec<Manifest> = manifests
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
        1 => Ok(matching.swap_remove(0)),
        0 if select.is_some() => Err(SelectError::NoMatch { path: path.to_string(), objects: all }),
        0 => Err(SelectError::Empty { path: path.to_string() }),
        _ => Err(SelectError::Ambiguous { path: path.to_string(), matching: matching.iter().map(describe).collect() }),
    }
}
