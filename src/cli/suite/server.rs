//! `allot test --server KUBECONFIG`: a suite run against the native policies installed in a
//! real API server, by server-side dry-run creates (`dryRun=All`: nothing is stored), so users
//! see that the compiled form and the engine agree.
//!
//! It does not install anything: the native policies of each test's policy set (`allot
//! compile`) must be applied beforehand, and the namespaces the cases use must exist (with
//! the labels the test's namespace file gives them). Each test first checks that every object
//! `allot compile` emits for its policies exists on the server (by name), else its cases fail.
//!
//! A case the native policies cannot answer alone is reported as skipped (webhook-only), with
//! the reason, and never counted as passed: the case is split like `--native-covers` splits
//! the webhook ([`crate::admission::covers`]), and any finding or patch left in the webhook's share makes
//! it webhook-only. The others are created on the server and compared with the case's
//! expectations: the verdict, the rules that deny and warn (a native policy's rule is read from
//! its name, or from the `[rule/id]` its message starts with), the fields of the object the
//! server returns, message words, and the patch's paths (present after `add`/`replace`, gone
//! after `remove`). What the server does not show — audit findings, and whether a change came
//! from a mutation or the API server's defaulting (`mutated`) — is listed as unchecked.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::core::Resource;
use serde_json::Value;

use super::errors::PolicySourceError;
use super::load::{LoadedTest, Suite, read_policy_sources};
use crate::admission::covers::{NativeSplit, SplitError};
use crate::admission::engine::Engine;
use crate::admission::finding::Check;
use crate::admission::native::{COMPILED_FROM_ANNOTATION, NativeObject, object_name};
use crate::admission::quota::StaticUsage;
use crate::cli::check::{self, Manifest};
use crate::model::json::Fields;
use crate::model::namespaces::{NamespaceLabels, NoNamespaces};

/// The outcome of a suite run on a server.
#[derive(Debug, Clone)]
pub struct ServerReport {
    pub tests: Vec<ServerTest>,
}

/// One Test document's cases on the server.
#[derive(Debug, Clone)]
pub struct ServerTest {
    pub file: String,
    pub document: usize,
    pub name: String,
    pub cases: Vec<ServerCase>,
}

/// One case on the server.
#[derive(Debug, Clone)]
pub struct ServerCase {
    pub name: String,
    pub outcome: ServerOutcome,
    /// Expectations the server's answer cannot show (`auditedBy`, `mutated`).
    pub unchecked: Vec<&'static str>,
}

/// What became of a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerOutcome {
    Passed,
    /// What differed.
    Failed(Vec<String>),
    /// Left (at least partly) to the webhook: why.
    WebhookOnly(String),
}

impl ServerReport {
    fn count(&self, pick: impl Fn(&ServerOutcome) -> bool) -> usize {
        self.tests.iter().flat_map(|t| &t.cases).filter(|c| pick(&c.outcome)).count()
    }

    /// Cases whose expectations held on the server.
    pub fn passed(&self) -> usize {
        self.count(|o| *o == ServerOutcome::Passed)
    }

    /// Cases that did not.
    pub fn failed(&self) -> usize {
        self.count(|o| matches!(o, ServerOutcome::Failed(_)))
    }

    /// Cases left to the webhook.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, ServerOutcome::WebhookOnly(_)))
    }

    /// Each case with its outcome, and a summary.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for t in &self.tests {
            out.push_str(&format!("{}#{} {} [native policies on the server]\n", t.file, t.document, t.name));
            for c in &t.cases {
                let unchecked = if c.unchecked.is_empty() {
                    String::new()
                } else {
                    format!(" (unchecked on a server: {})", c.unchecked.join(", "))
                };
                match &c.outcome {
                    ServerOutcome::Passed => out.push_str(&format!("  ok    {}{unchecked}\n", c.name)),
                    ServerOutcome::WebhookOnly(why) => {
                        out.push_str(&format!("  skip  {} (webhook-only: {why})\n", c.name))
                    }
                    ServerOutcome::Failed(mismatches) => {
                        out.push_str(&format!("  FAIL  {}{unchecked}\n", c.name));
                        for m in mismatches {
                            out.push_str(&super::report::indent(m, "        "));
                        }
                    }
                }
            }
        }
        out.push_str(&format!(
            "\n{} passed, {} failed, {} skipped (webhook-only) on the server\n",
            self.passed(),
            self.failed(),
            self.skipped()
        ));
        out
    }
}

impl Suite {
    /// Runs every case against the native policies installed in the API server of `client`.
    pub async fn run_on_server(&self, client: &kube::Client) -> ServerReport {
        let mut tests = Vec::new();
        for test in &self.tests {
            tests.push(run_test(test, client).await);
        }
        ServerReport { tests }
    }
}

async fn run_test(test: &LoadedTest, client: &kube::Client) -> ServerTest {
    let mut report =
        ServerTest { file: test.file.clone(), document: test.document, name: test.name.clone(), cases: Vec::new() };
    let fail_all = |report: &mut ServerTest, why: String| {
        report.cases = test
            .cases
            .iter()
            .map(|c| ServerCase {
                name: c.name.clone(),
                outcome: ServerOutcome::Failed(vec![why.clone()]),
                unchecked: vec![],
            })
            .collect();
    };
    let split = match native_half(test) {
        Ok(split) => split,
        Err(why) => {
            fail_all(&mut report, why.to_string());
            return report;
        }
    };
    let compiled = crate::admission::native::compile(&test.policies);
    if let Err(why) = installed(client, &compiled.objects, &split.fingerprint).await {
        fail_all(&mut report, why.to_string());
        return report;
    }
    let labels: &dyn NamespaceLabels = match &test.labels {
        Some(l) => l,
        None => &NoNamespaces,
    };
    let rule_prefixes: Vec<(String, String)> = test
        .policies
        .rules
        .iter()
        .map(|r| (format!("{}-", object_name(&["allot-rule", &r.name])), r.name.clone()))
        .collect();
    let claims = check::claim_objects(&test.manifests());
    for case in &test.cases {
        let usage = StaticUsage::new(case.usage.clone());
        let unchecked: Vec<&'static str> = [
            ("auditedBy", case.expectations.expect.audited_by.as_ref().is_some_and(|a| !a.is_empty())),
            ("mutated", case.expectations.expect.mutated.is_some()),
            ("patch removals", case.expectations.patch.iter().flatten().any(is_remove)),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        let outcome = match webhook_share(&split, labels, &claims, &usage, &case.manifest) {
            Some(why) => ServerOutcome::WebhookOnly(why),
            None => match dry_run(client, &case.manifest.object).await {
                Ok(answer) => {
                    let mismatches = compare(&case.expectations, &answer, &rule_prefixes);
                    if mismatches.is_empty() { ServerOutcome::Passed } else { ServerOutcome::Failed(mismatches) }
                }
                Err(why) => ServerOutcome::Failed(vec![why.to_string()]),
            },
        };
        report.cases.push(ServerCase { name: case.name.clone(), outcome, unchecked });
    }
    report
}

/// Why a test's policies have no native half to look for on the server.
#[derive(Debug, thiserror::Error)]
pub enum NativeHalfError {
    /// The policy files cannot be read again.
    #[error("the native half of the policies: {}", join(.0))]
    Sources(Vec<PolicySourceError>),
    /// They do not split into the native and the webhook's share.
    #[error("the native half of the policies: {0}")]
    Split(#[source] SplitError),
}

impl NativeHalfError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            NativeHalfError::Sources(_) => "sources",
            NativeHalfError::Split(_) => "split",
        }
    }
}

fn join(errors: &[PolicySourceError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// The test's policies split as `--native-covers` splits them, compiled with the test's
/// DeviceClasses as its policy set was.
fn native_half(test: &LoadedTest) -> Result<NativeSplit, NativeHalfError> {
    let sources = read_policy_sources(&test.policy_paths).map_err(NativeHalfError::Sources)?;
    let facts = crate::model::policy::ClusterFacts::from_objects(test.cases.iter().map(|c| &c.manifest.object));
    NativeSplit::from_sources_with(&sources, &facts).map_err(NativeHalfError::Split)
}

/// What the webhook's share of the policies still does for this case (findings or a patch),
/// as a reason; `None` when the native policies answer it alone.
fn webhook_share(
    split: &NativeSplit,
    labels: &dyn NamespaceLabels,
    claims: &dyn crate::model::dra::ClaimSource,
    usage: &StaticUsage,
    manifest: &Manifest,
) -> Option<String> {
    if split.claims_to_webhook && !split.takes(manifest.object.to_string().as_bytes()) {
        return Some(crate::admission::native::DRA_WEBHOOK_ONLY.to_string());
    }
    let validate =
        check::admit_manifest(&Engine::new(&split.validate, labels).with_claims(claims).with_quota(usage), manifest);
    let mutate =
        check::admit_manifest(&Engine::new(&split.mutate, labels).with_claims(claims).with_quota(usage), manifest);
    let rules: BTreeSet<String> = validate
        .report
        .findings
        .iter()
        .filter(|f| f.rule != crate::admission::finding::RuleId::Check(Check::ApiServerValidation))
        .map(|f| format!("{} ({})", f.rule, f.action.label()))
        .collect();
    let mut why = Vec::new();
    if !rules.is_empty() {
        why.push(format!("the webhook's rules {}", rules.into_iter().collect::<Vec<_>>().join(", ")));
    }
    if !mutate.report.patch.is_empty() {
        why.push(format!("the webhook's mutation: {}", mutate.report.changes.join("; ")));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Why a test's native policies are not the ones on the server.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The server's admission policies or bindings cannot be listed.
    #[error("listing {kind}: {source}")]
    List {
        kind: String,
        #[source]
        source: kube::Error,
    },
    /// Objects these policies compile to are not on the server.
    #[error(
        "the native policies are not installed: {} of {total} objects missing ({}…); apply `allot compile` for these \
         policies first",
        .missing.len(),
        first(.missing)
    )]
    Missing { missing: Vec<String>, total: usize },
    /// Objects of these names are on the server, compiled from other policies.
    #[error(
        "the native policies installed are not these policies' ({} of {total} objects compiled from other policies or \
         by an older allot, e.g. {}; these compile to {fingerprint}): apply `allot compile` for these policies again",
        .stale.len(),
        first(.stale)
    )]
    Stale { stale: Vec<String>, total: usize, fingerprint: String },
    /// Objects another `allot compile` installed would answer beside these policies.
    #[error(
        "{} object(s) another `allot compile` installed act beside these policies ({}): delete them, or they \
         answer too",
        .leftovers.len(),
        first(.leftovers)
    )]
    Leftovers { leftovers: Vec<String> },
}

impl InstallError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            InstallError::List { .. } => "list",
            InstallError::Missing { .. } => "missing",
            InstallError::Stale { .. } => "stale",
            InstallError::Leftovers { .. } => "leftovers",
        }
    }
}

/// Up to three distinct names (a policy and its binding share one).
fn first(names: &[String]) -> String {
    let distinct: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    distinct.into_iter().take(3).collect::<Vec<_>>().join(", ")
}

/// Each object's name and the fingerprint it was compiled from (`None`: not by `allot compile`).
type Names = BTreeMap<String, Option<String>>;

/// The admission policies and bindings on the server, by kind.
struct OnServer {
    mutating: Names,
    mutating_bindings: Names,
    validating: Names,
    validating_bindings: Names,
}

impl OnServer {
    /// Lists the four kinds `allot compile` emits: the names are all that is compared.
    async fn list(client: &kube::Client) -> Result<OnServer, InstallError> {
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
            ValidatingAdmissionPolicyBinding,
        };
        Ok(OnServer {
            mutating: names::<MutatingAdmissionPolicy>(client).await?,
            mutating_bindings: names::<MutatingAdmissionPolicyBinding>(client).await?,
            validating: names::<ValidatingAdmissionPolicy>(client).await?,
            validating_bindings: names::<ValidatingAdmissionPolicyBinding>(client).await?,
        })
    }

    /// The objects of `object`'s kind.
    fn of(&self, object: &NativeObject) -> &Names {
        match object {
            NativeObject::MutatingPolicy(_) => &self.mutating,
            NativeObject::MutatingBinding(_) => &self.mutating_bindings,
            NativeObject::ValidatingPolicy(_) => &self.validating,
            NativeObject::ValidatingBinding(_) => &self.validating_bindings,
        }
    }

    /// Every object listed, of all four kinds.
    fn all(&self) -> impl Iterator<Item = (&String, &Option<String>)> {
        [&self.mutating, &self.mutating_bindings, &self.validating, &self.validating_bindings]
            .into_iter()
            .flat_map(|set| set.iter())
    }
}

/// Metadata only: the annotation says which policies an object was compiled from.
async fn names<K>(client: &kube::Client) -> Result<Names, InstallError>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let list = kube::Api::<K>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(|source| InstallError::List { kind: K::kind(&()).to_string(), source })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|o| {
            let from = o.metadata.annotations.as_ref().and_then(|a| a.get(COMPILED_FROM_ANNOTATION)).cloned();
            o.metadata.name.map(|name| (name, from))
        })
        .collect())
}

/// Every compiled object is on the server (by kind and name), installed from these policies
/// (its [`COMPILED_FROM_ANNOTATION`] is `fingerprint`), and no object another compile left there
/// acts beside them.
async fn installed(client: &kube::Client, objects: &[NativeObject], fingerprint: &str) -> Result<(), InstallError> {
    let on_server = OnServer::list(client).await?;
    let missing: Vec<String> =
        objects.iter().filter(|o| !on_server.of(o).contains_key(o.name())).map(|o| o.name().to_string()).collect();
    if !missing.is_empty() {
        return Err(InstallError::Missing { missing, total: objects.len() });
    }
    let stale: Vec<String> = objects
        .iter()
        .filter(|o| on_server.of(o).get(o.name()).is_some_and(|from| from.as_deref() != Some(fingerprint)))
        .map(|o| o.name().to_string())
        .collect();
    if !stale.is_empty() {
        return Err(InstallError::Stale { stale, total: objects.len(), fingerprint: fingerprint.to_string() });
    }
    let expected: BTreeSet<&str> = objects.iter().map(NativeObject::name).collect();
    let leftovers: Vec<String> = on_server
        .all()
        .filter(|(name, from)| from.is_some() && !expected.contains(name.as_str()))
        .map(|(name, _)| name.clone())
        .collect();
    if !leftovers.is_empty() {
        return Err(InstallError::Leftovers { leftovers });
    }
    Ok(())
}

/// The server's answer to a dry-run create.
#[derive(Debug)]
struct Answer {
    /// The object as it would be stored, when admitted.
    object: Option<Value>,
    /// The refusal's message, when denied.
    refusal: Option<String>,
    warnings: Vec<String>,
}

/// Why a case's object got no admission answer from the server (a refusal is an answer).
#[derive(Debug, thiserror::Error)]
pub enum DryRunError {
    /// The server has no resource for the object's apiVersion and kind.
    #[error("the API server does not serve {api_version} {kind}: {source}")]
    NotServed {
        api_version: String,
        kind: String,
        #[source]
        source: kube::Error,
    },
    /// The object does not serialize as a request body.
    #[error("{0}")]
    Encode(serde_json::Error),
    /// The create request cannot be built.
    #[error("{0}")]
    Request(kube::core::request::Error),
    /// The request did not reach the server, or its answer did not come back.
    #[error("{0}")]
    Send(kube::Error),
    /// The answer's body could not be read.
    #[error("{0}")]
    Body(kube::Error),
    /// The answer is not JSON.
    #[error("the API server's answer: {0}")]
    Answer(serde_json::Error),
    /// The server failed the request otherwise than by refusing the object.
    #[error("the API server answered {status}: {message}")]
    Status { status: axum::http::StatusCode, message: String },
}

impl DryRunError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DryRunError::NotServed { .. } => "not_served",
            DryRunError::Encode(_) => "encode",
            DryRunError::Request(_) => "request",
            DryRunError::Send(_) => "send",
            DryRunError::Body(_) => "body",
            DryRunError::Answer(_) => "answer",
            DryRunError::Status { .. } => "status",
        }
    }
}

async fn dry_run(client: &kube::Client, object: &Value) -> Result<Answer, DryRunError> {
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities): (ApiResource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|source| DryRunError::NotServed { api_version: api_version.into(), kind: kind.into(), source })?;
    // A cluster-scoped kind (a DeviceClass) is created without a namespace in its path.
    let namespace = match capabilities.scope {
        kube::discovery::Scope::Cluster => None,
        kube::discovery::Scope::Namespaced => {
            Some(object.field(&["metadata", "namespace"]).and_then(Value::as_str).unwrap_or("default"))
        }
    };
    let url = DynamicObject::url_path(&resource, namespace);
    let body = serde_json::to_vec(object).map_err(DryRunError::Encode)?;
    let params = PostParams { dry_run: true, ..Default::default() };
    let request = kube::core::Request::new(url).create(&params, body).map_err(DryRunError::Request)?;
    let response = client.send(request.map(kube::client::Body::from)).await.map_err(DryRunError::Send)?;
    let status = response.status();
    let warnings =
        response.headers().get_all("warning").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    let bytes = response.into_body().collect_bytes().await.map_err(DryRunError::Body)?;
    let body: Value = serde_json::from_slice(&bytes).map_err(DryRunError::Answer)?;
    if status.is_success() {
        Ok(Answer { object: Some(body), refusal: None, warnings })
    } else if status.as_u16() == 403 || status.as_u16() == 422 || status.as_u16() == 400 {
        let message = body.get("message").and_then(Value::as_str).unwrap_or("refused").to_string();
        Ok(Answer { object: None, refusal: Some(message), warnings })
    } else {
        let message = body.get("message").and_then(Value::as_str).unwrap_or("").to_string();
        Err(DryRunError::Status { status, message })
    }
}

/// The rules behind the ValidatingAdmissionPolicies a message names: a Rule's from the
/// policy's name, a built-in check's from the `[family/check]` its message starts with; a
/// refusal by anything else is the API server's own validation.
fn native_rules(text: &str, rule_prefixes: &[(String, String)]) -> BTreeSet<String> {
    const MARK: &str = "ValidatingAdmissionPolicy '";
    let mut rules = BTreeSet::new();
    for (i, _) in text.match_indices(MARK) {
        let rest = &text[i + MARK.len()..];
        let Some((name, after)) = rest.split_once('\'') else { continue };
        let rule = rule_prefixes
            .iter()
            .filter(|(prefix, _)| name.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map(|(_, rule)| rule.clone())
            .or_else(|| {
                let message = after.split_once("': ").map_or(after, |(_, m)| m);
                let message = message.split_once("denied request: ").map_or(message, |(_, m)| m);
                message.strip_prefix('[').and_then(|m| m.split_once(']')).map(|(id, _)| id.to_string())
            });
        rules.insert(rule.unwrap_or_else(|| format!("ValidatingAdmissionPolicy {name}")));
    }
    rules
}

fn compare(expectations: &super::Expectations, answer: &Answer, rule_prefixes: &[(String, String)]) -> Vec<String> {
    let e = &expectations.expect;
    let mut out = Vec::new();
    let allowed = answer.refusal.is_none();
    if let Some(want) = e.allowed
        && want != allowed
    {
        out.push(format!(
            "allowed: expected {want}, got {allowed}{}",
            answer.refusal.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
        ));
    }
    let denied = match &answer.refusal {
        Some(r) if r.contains("ValidatingAdmissionPolicy '") => native_rules(r, rule_prefixes),
        Some(r) if r.contains("admission webhook") => BTreeSet::from([format!("a webhook: {r}")]),
        Some(_) => BTreeSet::from([crate::cli::check::API_SERVER_RULE.to_string()]),
        None => BTreeSet::new(),
    };
    let warned: BTreeSet<String> = answer.warnings.iter().flat_map(|w| native_rules(w, rule_prefixes)).collect();
    for (field, expected, got) in [("deniedBy", &e.denied_by, &denied), ("warnedBy", &e.warned_by, &warned)] {
        if let Some(expected) = expected {
            let want: BTreeSet<String> = expected.iter().cloned().collect();
            if &want != got {
                out.push(format!(
                    "{field}: expected [{}], got [{}]",
                    want.into_iter().collect::<Vec<_>>().join(", "),
                    got.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    let object = answer.object.as_ref().map(without_default_tolerations);
    let object = object.as_ref();
    for (pointer, want) in e.fields.iter().flatten() {
        let got = object.and_then(|o| o.pointer(pointer)).filter(|v| !v.is_null());
        let want = (!want.is_null()).then_some(want);
        if want != got {
            let show = |v: Option<&Value>| v.map_or_else(|| "absent".to_string(), |v| v.to_string());
            out.push(format!("fields {pointer}: expected {}, got {}", show(want), show(got)));
        }
    }
    for word in e.message_contains.iter().flatten() {
        let said = answer.refusal.iter().chain(&answer.warnings).any(|m| m.contains(word.as_str()));
        if !said {
            out.push(format!("messageContains: neither the refusal nor a warning contains {word:?}"));
        }
    }
    for op in expectations.patch.iter().flatten() {
        let op = serde_json::to_value(op).unwrap_or_default();
        let (name, path) = (op["op"].as_str().unwrap_or_default(), op["path"].as_str().unwrap_or_default());
        // `/-` appends: the list must be there.
        let pointer = path.strip_suffix("/-").unwrap_or(path);
        let present = object.and_then(|o| o.pointer(pointer)).is_some();
        // (`remove` is not compared: the API server's defaulting fills fields in again, e.g.
        // `spec.priority` from the class; it is listed as unchecked.)
        let holds = match name {
            "add" | "replace" | "copy" | "move" => present,
            _ => true,
        };
        if !holds {
            out.push(format!("patch: {name} {path}: the object the server returns does not show it"));
        }
    }
    out
}

fn is_remove(op: &crate::model::patch::PatchOp) -> bool {
    serde_json::to_value(op).ok().is_some_and(|v| v["op"] == "remove")
}

/// The object without the tolerations the API server's DefaultTolerationSeconds plugin adds
/// to every Pod (not-ready and unreachable, NoExecute, 300 s), which no suite expects.
fn without_default_tolerations(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(tolerations) = object.pointer_mut("/spec/tolerations").and_then(Value::as_array_mut) {
        tolerations.retain(|t| {
            let key = t.get("key").and_then(Value::as_str).unwrap_or_default();
            !(matches!(key, "node.kubernetes.io/not-ready" | "node.kubernetes.io/unreachable")
                && t.get("effect").and_then(Value::as_str) == Some("NoExecute")
                && t.get("tolerationSeconds").and_then(Value::as_i64) == Some(300))
        });
        if tolerations.is_empty()
            && let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
        {
            spec.remove("tolerations");
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_read_from_policy_names_and_message_ids() {
        let prefixes = vec![
            ("allot-rule-pinned-images-on-gpus-".to_string(), "pinned-images-on-gpus".to_string()),
            ("allot-rule-pinned-".to_string(), "pinned".to_string()),
        ];
        let warning = "299 - \"Validation failed for ValidatingAdmissionPolicy 'allot-rule-pinned-images-on-gpus-pod' \
                       with binding 'allot-rule-pinned-images-on-gpus-pod': GPU containers should pin\"";
        assert_eq!(native_rules(warning, &prefixes), BTreeSet::from(["pinned-images-on-gpus".to_string()]));
        let denial = "pods \"o\" is forbidden: ValidatingAdmissionPolicy 'allot-accelerators-deny-pod' with binding \
                      'allot-accelerators-deny-pod' denied request: [accelerators/init-containers] accelerators are not \
                      allowed";
        assert_eq!(native_rules(denial, &prefixes), BTreeSet::from(["accelerators/init-containers".to_string()]));
        let unknown = "ValidatingAdmissionPolicy 'someone-else' with binding 'b' denied request: no";
        assert_eq!(native_rules(unknown, &prefixes), BTreeSet::from(["ValidatingAdmissionPolicy someone-else".into()]));
        assert!(native_rules("Pod \"x\" is invalid: spec", &prefixes).is_empty());
        assert_eq!(object_name(&["My_Rule.v2"]), "my-rule.v2");
    }
}
