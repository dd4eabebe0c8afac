//! `allot check`: the offline dry run. Reads manifests, runs [`Engine::admit`] on each object —
//! the same mutate-then-validate sequence the API server drives — and reports per object.

use std::io::Read;
use std::path::PathBuf;

use serde::Serialize;
use serde_json::Value;

use crate::admission::engine::{Admission, Engine, group_kind};
use crate::admission::finding::{Check, Finding};
use crate::admission::request::{Request, RequestOperation};
use crate::cli::junit;
use crate::model::error::Error;
use crate::model::json::Fields;
use crate::model::patch::PatchOp;
use crate::model::policy::Action;

/// One object read from the input.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// File name (`-` for stdin).
    pub source: String,
    /// 1-based document number in the file.
    pub document: usize,
    /// 1-based line where the object starts in its file (its first key); 0 when unknown (an
    /// object written inline in a test file).
    pub line: usize,
    pub object: Value,
}

/// Reads manifests from files, directories (recursively: `.yaml`, `.yml`, `.json`) and `-`.
/// `List` objects are expanded. Any unreadable file or invalid document is an error.
pub fn read_manifests(paths: &[PathBuf]) -> Result<Vec<Manifest>, Error> {
    let mut out = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(|source| Error::Io { path: path.clone(), source })?;
            parse_into("-", &text, &mut out)?;
            continue;
        }
        let meta = std::fs::metadata(path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let files = if meta.is_dir() {
            crate::model::files::yaml_files(path).map_err(|source| Error::Io { path: path.clone(), source })?
        } else {
            vec![path.clone()]
        };
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| Error::Io { path: file.clone(), source })?;
            parse_into(&file.display().to_string(), &text, &mut out)?;
        }
    }
    Ok(out)
}

fn parse_into(source: &str, text: &str, out: &mut Vec<Manifest>) -> Result<(), Error> {
    let docs = crate::model::documents::parse(source, text)
        .map_err(|e| Error::Manifest { location: source.to_string(), message: e.to_string() })?;
    for crate::model::documents::Document { index: document, line, item_lines, value } in docs {
        let location = format!("{source}: document {document}");
        let bad = |message: &str| Error::Manifest { location: location.clone(), message: message.to_string() };
        if !value.is_object() {
            return Err(bad("not a Kubernetes object (expected a mapping)"));
        }
        let kind = value.get("kind").and_then(Value::as_str).ok_or_else(|| bad("kind is missing"))?;
        if value.get("apiVersion").and_then(Value::as_str).is_none() {
            return Err(bad("apiVersion is missing"));
        }
        if kind == "List" || kind.ends_with("List") && value.get("items").is_some() {
            for (i, item) in value.get("items").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let line = item_lines.get(i).copied().unwrap_or(line);
                out.push(Manifest { source: source.to_string(), document, line, object: item.clone() });
            }
        } else {
            out.push(Manifest { source: source.to_string(), document, line, object: value });
        }
    }
    Ok(())
}

/// The result for one object.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    pub source: String,
    pub document: usize,
    /// Line of the object in `source` (0: unknown).
    pub line: usize,
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub allowed: bool,
    pub mutated: bool,
    pub patch: Vec<PatchOp>,
    pub changes: Vec<String>,
    pub findings: Vec<Finding>,
    pub notes: Vec<String>,
}

impl ObjectReport {
    /// `Kind namespace/name`, as messages name the object.
    pub fn label(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// Totals over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub objects: usize,
    pub admitted: usize,
    pub denied: usize,
    pub mutated: usize,
    pub warned: usize,
}

/// Everything `allot check` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    #[serde(rename = "policyVersion")]
    pub policy_version: String,
    pub results: Vec<ObjectReport>,
    pub summary: Summary,
}

impl Report {
    /// True when every object was admitted.
    pub fn all_admitted(&self) -> bool {
        self.summary.denied == 0
    }
}

/// Namespace a manifest lands in when it names none (as `kubectl apply` without `-n`).
pub const DEFAULT_NAMESPACE: &str = "default";

/// Core kinds that live in no namespace.
const CLUSTER_SCOPED_CORE_KINDS: &[&str] = &["Namespace", "Node", "PersistentVolume"];

/// The gang members among the manifests — as the mutating webhook will have left them — so
/// members that disagree are caught in one run, as the server catches them from its Pod watch.
pub fn gang_directory(engine: &Engine<'_>, manifests: &[Manifest]) -> crate::admission::directory::StaticGangs {
    let mutated: Vec<(&str, Value)> = manifests
        .iter()
        .filter(|m| group_kind(&m.object) == ("", "Pod"))
        .map(|m| {
            let namespace =
                m.object.field(&["metadata", "namespace"]).and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE);
            let request = create_request(m, "", "Pod", namespace);
            let patch = engine.mutate(&request).patch;
            (namespace, crate::model::patch::apply(&m.object, &patch).unwrap_or_else(|_| m.object.clone()))
        })
        .collect();
    crate::admission::directory::StaticGangs::from_pods(
        mutated.iter().map(|(ns, pod)| (*ns, pod)),
        engine.policies,
        engine.namespaces,
    )
}

fn create_request<'m>(m: &'m Manifest, group: &'m str, kind: &'m str, namespace: &'m str) -> Request<'m> {
    Request {
        uid: "",
        operation: RequestOperation::Create,
        group,
        kind,
        namespace,
        object: &m.object,
        old_object: None,
        dry_run: true,
        username: "allot-check",
        groups: &[],
    }
}

/// The ResourceClaims and ResourceClaimTemplates among the manifests: where a dry run resolves
/// the claims its Pods and templates name (a reference to one not given is reported as "not
/// among the manifests").
pub fn claim_objects(manifests: &[Manifest]) -> crate::model::dra::ClaimObjects {
    let mut claims = crate::model::dra::ClaimObjects::new("not among the manifests");
    for m in manifests {
        claims.insert(&m.object, DEFAULT_NAMESPACE);
    }
    claims
}

/// Runs the engine on every manifest.
pub fn run(engine: &Engine<'_>, manifests: &[Manifest]) -> Report {
    let claims = claim_objects(manifests);
    let engine = engine.with_claims(&claims);
    let gangs = gang_directory(&engine, manifests);
    let engine = engine.with_gangs(&gangs);
    let mut results = Vec::with_capacity(manifests.len());
    let mut summary = Summary::default();
    for m in manifests {
        let report = admit_manifest(&engine, m).report;
        summary.objects += 1;
        if report.allowed {
            summary.admitted += 1;
        } else {
            summary.denied += 1;
        }
        // A denied object is never patched: count mutations of admitted objects only.
        summary.mutated += usize::from(report.allowed && report.mutated);
        summary.warned += usize::from(report.findings.iter().any(|f| f.action == Action::Warn));
        results.push(report);
    }
    Report { policy_version: engine.policies.version.clone(), results, summary }
}

/// One manifest after [`admit_manifest`].
#[derive(Debug, Clone)]
pub struct Admitted {
    pub report: ObjectReport,
    /// The object as the mutating webhook leaves it (the input when there is no patch).
    pub mutated: Value,
}

/// One manifest through [`Engine::admit`] as a dry-run CREATE — the request `allot check` makes
/// for each object, and `allot test` for each case. `engine` should already know the run's gang
/// members ([`gang_directory`]) and quota usage.
pub fn admit_manifest(engine: &Engine<'_>, m: &Manifest) -> Admitted {
    let (group, kind) = group_kind(&m.object);
    let namespace = if group.is_empty() && CLUSTER_SCOPED_CORE_KINDS.contains(&kind) {
        ""
    } else {
        m.object.field(&["metadata", "namespace"]).and_then(Value::as_str).unwrap_or(DEFAULT_NAMESPACE)
    };
    let request = create_request(m, group, kind, namespace);
    let admission = engine.admit(&request);
    let mut report = object_report(m, &admission, namespace);
    let refused = api_server_findings(engine, &Request { object: &admission.mutated, ..request });
    if !refused.is_empty() {
        report.allowed = false;
        report.findings.extend(refused);
    }
    Admitted { report, mutated: admission.mutated }
}

/// Rule id of what the API server's own validation would refuse.
pub const API_SERVER_RULE: &str = Check::ApiServerValidation.id();

/// What the API server's own validation refuses in the object as the webhooks leave it (its
/// metadata; a Pod's fields Allot writes or trusts; each Pod template as its Pods will be), so
/// that a dry run never says "admitted" for an object `kubectl apply` would fail on.
fn api_server_findings(engine: &Engine<'_>, request: &Request<'_>) -> Vec<Finding> {
    let is_pod = request.is_pod();
    let mut errors = Vec::new();
    if !is_pod {
        let metadata = request.object.get("metadata").unwrap_or(&Value::Null);
        errors.extend(crate::model::apivalidation::object_meta(metadata, "metadata"));
    }
    for view in engine.pods_as_created(request) {
        errors.extend(crate::model::apivalidation::pod(&view.pod, &view.path, is_pod));
    }
    errors
        .into_iter()
        .map(|e| Finding {
            rule: Check::ApiServerValidation.into(),
            action: Action::Deny,
            path: e.path,
            message: format!("{}; the API server would refuse this object", e.message),
        })
        .collect()
}

fn object_report(m: &Manifest, a: &Admission, namespace: &str) -> ObjectReport {
    let name = m
        .object
        .field(&["metadata", "name"])
        .or_else(|| m.object.field(&["metadata", "generateName"]))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut findings = a.mutation.findings.clone();
    // Both phases check some things (gang metadata): report each finding once.
    for f in &a.validation.findings {
        if !findings.contains(f) {
            findings.push(f.clone());
        }
    }
    let mut notes = a.mutation.notes.clone();
    for n in &a.validation.notes {
        if !notes.contains(n) {
            notes.push(n.clone());
        }
    }
    ObjectReport {
        source: m.source.clone(),
        document: m.document,
        line: m.line,
        api_version: m.object.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string(),
        kind: m.object.get("kind").and_then(Value::as_str).unwrap_or("").to_string(),
        namespace: namespace.to_string(),
        name,
        allowed: a.allowed(),
        mutated: !a.mutation.patch.is_empty(),
        patch: a.mutation.patch.clone(),
        changes: a.mutation.changes.clone(),
        findings,
        notes,
    }
}

/// Human-readable report.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    for r in &report.results {
        out.push_str(&render_object(r));
    }
    let s = &report.summary;
    out.push_str(&format!(
        "\n{} object(s): {} admitted ({} mutated), {} denied, {} with warnings [policy set {}]\n",
        s.objects, s.admitted, s.mutated, s.denied, s.warned, report.policy_version
    ));
    out
}

/// One object's verdict, changes, patch, findings and notes, as `allot check` prints them.
pub fn render_object(r: &ObjectReport) -> String {
    let verdict = match (r.allowed, r.mutated) {
        (false, _) => "DENIED",
        (true, true) => "admitted, mutated",
        (true, false) => "admitted",
    };
    let mut out = format!("{}#{} {}: {verdict}\n", r.source, r.document, r.label());
    for c in &r.changes {
        out.push_str(&format!("    ~ {c}\n"));
    }
    if !r.patch.is_empty() {
        out.push_str("    patch:\n");
        for op in &r.patch {
            out.push_str(&format!("      {}\n", describe_op(op)));
        }
    }
    for f in &r.findings {
        out.push_str(&format!("    {:<5} [{}] {}\n", f.action.label(), f.rule, f.describe()));
    }
    for n in &r.notes {
        out.push_str(&format!("    note  {n}\n"));
    }
    out
}

/// A patch operation on one line: `add     /spec/priorityClassName "low-priority"`.
pub fn describe_op(op: &PatchOp) -> String {
    let compact = |v: &Value| serde_json::to_string(v).unwrap_or_default();
    match op {
        PatchOp::Add { path, value } => format!("add     {path} {}", compact(value)),
        PatchOp::Replace { path, value } => format!("replace {path} {}", compact(value)),
        PatchOp::Remove { path } => format!("remove  {path}"),
        PatchOp::Test { path, value } => format!("test    {path} {}", compact(value)),
    }
}

/// Machine-readable report.
pub fn render_json(report: &Report) -> String {
    serde_json::to_string_pretty(report).unwrap_or_default() + "\n"
}

/// JUnit XML: one test case per object, a failure per denied object.
pub fn render_junit(report: &Report) -> String {
    let cases = report
        .results
        .iter()
        .map(|r| {
            let denials: Vec<String> = r
                .findings
                .iter()
                .filter(|f| f.action == Action::Deny)
                .map(|f| format!("[{}] {}", f.rule, f.describe()))
                .collect();
            let other: Vec<String> = r
                .changes
                .iter()
                .cloned()
                .chain(
                    r.findings
                        .iter()
                        .filter(|f| f.action != Action::Deny)
                        .map(|f| format!("{} [{}] {}", f.action.label(), f.rule, f.describe())),
                )
                .chain(r.notes.iter().map(|n| format!("note {n}")))
                .collect();
            junit::Case {
                classname: format!("{}#{}", r.source, r.document),
                name: r.label(),
                file: None,
                failure: denials.first().map(|first| junit::Failure {
                    message: first.clone(),
                    kind: "denied",
                    body: denials.join("\n"),
                }),
                output: (!other.is_empty()).then(|| other.join("\n")),
            }
        })
        .collect();
    junit::render("allot check", &[junit::Suite { name: "allot check".into(), cases }])
}
