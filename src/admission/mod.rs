//! AdmissionReview v1: decoding requests and encoding responses.
//!
//! Own types rather than `kube::core::admission`, for two reasons: the object stays raw JSON
//! (the engine works on JSON, and re-serialising a typed object would both cost time and drop
//! unknown fields), and kube-core serialises `patch` as an array of bytes (kube-rs/kube#1781),
//! where every other webhook — and the API server's own documentation — uses base64.

//!
//! Below the door, the rest of the admission layer: the [`engine`] that answers a request, its
//! [`mutate`] and [`validate`] halves and the [`tenant`] guards, the checks of native
//! policies ([`native`]) and of what the policies cover ([`covers`]), the findings it reports,
//! and the interfaces it asks of what runs beside it: quota books ([`quota`]) and the gang
//! [`directory`].

pub mod covers;
pub mod directory;
pub mod engine;
pub mod finding;
pub mod mutate;
pub mod native;
pub mod quota;
pub mod request;
pub mod reserve;
pub mod tenant;
pub mod validate;

use std::cell::Cell;
use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admission::engine::{Engine, Outcome};
use crate::admission::finding::Finding;
use crate::admission::request::{Request, RequestOperation};
use crate::model::json::Fields;
use crate::model::policy::{Action, LAST_APPLIED_ANNOTATION, Unread};

/// Which webhook is answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Mutate,
    Validate,
}

impl Phase {
    /// Label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Mutate => "mutate",
            Phase::Validate => "validate",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<RequestIn>,
}

#[derive(Debug, Deserialize, Default)]
struct GroupVersionKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

#[derive(Debug, Deserialize, Default)]
struct UserInfo {
    #[serde(default)]
    username: String,
    #[serde(default)]
    groups: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn {
    // Defaults, so that a missing field is reported by the checks below with a clear message.
    #[serde(default)]
    uid: String,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default, deserialize_with = "trimmed_object")]
    object: Option<Value>,
    #[serde(default, deserialize_with = "trimmed_object")]
    old_object: Option<Value>,
    #[serde(default)]
    dry_run: Option<bool>,
}

/// `object` / `oldObject` as JSON without `metadata.managedFields` (nothing Allot decides reads
/// them, CEL never binds them, and they are a quarter of a typical Pod's bytes and most of its
/// small maps) and without what the policy set leaves [`Unread`] (set by [`decode_for`]).
/// Skipped while parsing, so they are never built; still parsed, so a body that is not JSON is
/// refused. What is valid JSON but only `serde_json::Value` refuses (a lone surrogate escape,
/// a number past `f64`, nesting past 128 levels) passes in a skipped part, as nothing reads it
/// (serde_json skips iteratively: no depth limit is needed for the stack).
fn trimmed_object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    struct Trimmed(Value);
    impl<'de> Deserialize<'de> for Trimmed {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Trimmed, D::Error> {
            let unread = UNREAD.with(Cell::get);
            d.deserialize_any(TrimmedVisitor { level: Level::Object, unread }).map(Trimmed)
        }
    }
    Option::<Trimmed>::deserialize(d).map(|o| o.map(|t| t.0))
}

thread_local! {
    /// What the review being decoded on this thread may leave out. A thread-local because
    /// serde's derived `ReviewIn` passes no state to `trimmed_object`; set and restored around
    /// one synchronous `serde_json` call by [`decode_for`].
    static UNREAD: Cell<Unread> = const { Cell::new(Unread::NOTHING) };
}

/// Restores the thread's [`UNREAD`] when a decode ends, however it ends.
struct UnreadScope(Unread);

impl UnreadScope {
    fn enter(unread: Unread) -> UnreadScope {
        UnreadScope(UNREAD.with(|u| u.replace(unread)))
    }
}

impl Drop for UnreadScope {
    fn drop(&mut self) {
        UNREAD.with(|u| u.set(self.0));
    }
}

/// Where [`TrimmedVisitor`] is: the object, its `metadata` (`managedFields` is skipped), its
/// `metadata.annotations` or its `spec`.
#[derive(Clone, Copy)]
enum Level {
    Object,
    Metadata,
    Annotations,
    Spec,
}

/// Builds a `Value` exactly as `Value`'s own `Deserialize` does, except for what it skips.
#[derive(Clone, Copy)]
struct TrimmedVisitor {
    level: Level,
    unread: Unread,
}

impl TrimmedVisitor {
    /// True when the field `key` at this level is skipped.
    fn skips(self, key: &str) -> bool {
        match (self.level, key) {
            (Level::Metadata, "managedFields") => true,
            (Level::Annotations, LAST_APPLIED_ANNOTATION) => self.unread.last_applied,
            (Level::Spec, "volumes") => self.unread.volumes,
            _ => false,
        }
    }

    /// The level of the value under `key`, when something below it may be skipped.
    fn below(self, key: &str) -> Option<TrimmedVisitor> {
        let level = match (self.level, key) {
            (Level::Object, "metadata") => Level::Metadata,
            (Level::Object, "spec") if self.unread.volumes => Level::Spec,
            (Level::Metadata, "annotations") if self.unread.last_applied => Level::Annotations,
            _ => return None,
        };
        Some(TrimmedVisitor { level, ..self })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for TrimmedVisitor {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for TrimmedVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.skips(&key) {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            }
            let value = match self.below(&key) {
                Some(below) => map.next_value_seed(below)?,
                None => map.next_value::<Value>()?,
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A summary of one answered review, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The AdmissionReview to send back, serialised.
    pub body: Vec<u8>,
    pub uid: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub allowed: bool,
    pub mutated: bool,
    pub outcome: Outcome,
}

impl Answer {
    /// Adds a denial decided after the evaluation (a deferred quota charge the shared ledger
    /// refused) and encodes the response again.
    pub fn deny_later(&mut self, finding: crate::admission::finding::Finding) {
        self.outcome.findings.push(finding);
        self.allowed = self.outcome.allowed();
        self.mutated = self.allowed && !self.outcome.patch.is_empty();
        self.body = encode_response(&self.uid, &self.kind, &self.namespace, &self.name, &self.outcome);
    }
}

/// Why a review could not be answered at all (the server maps this to HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadReview(pub String);

/// Decodes a review, runs the engine for `phase` and encodes the response.
pub fn review(body: &[u8], phase: Phase, engine: &Engine<'_>) -> Result<Answer, BadReview> {
    Ok(answer(&decode_for(body, engine.policies.unread)?, phase, engine))
}

/// A review decoded and checked, ready to be answered: [`decode`] then [`answer`] is
/// [`review`], split so that a caller answering the same review many times (the `policy_parse`
/// fuzz target, against every policy it generates) decodes it once.
#[derive(Debug)]
pub struct DecodedReview {
    req: RequestIn,
    operation: RequestOperation,
    namespace: String,
    /// What was left out of `object` and `oldObject` (see [`decode_for`]).
    unread: Unread,
}

impl DecodedReview {
    /// `request.uid`, which the answer echoes.
    pub fn uid(&self) -> &str {
        &self.req.uid
    }

    /// `request.object` as decoded (without `metadata.managedFields`, which is skipped unread,
    /// and what [`decode_for`] was told to leave out).
    pub fn object(&self) -> Option<&Value> {
        self.req.object.as_ref()
    }

    /// `request.oldObject` as decoded, like [`DecodedReview::object`].
    pub fn old_object(&self) -> Option<&Value> {
        self.req.old_object.as_ref()
    }
}

/// Decodes and checks an AdmissionReview.
pub fn decode(body: &[u8]) -> Result<DecodedReview, BadReview> {
    decode_for(body, Unread::NOTHING)
}

/// [`decode`], leaving out of `object` and `oldObject` what `unread` says nobody reads (the
/// server passes its policy set's [`PolicySet::unread`](crate::model::policy::PolicySet)). An answer
/// is the same as on the whole object: only the cost differs.
pub fn decode_for(body: &[u8], unread: Unread) -> Result<DecodedReview, BadReview> {
    // UTF-8 checked once over the whole body (word at a time over ASCII), then parsed as a
    // `str`: serde_json's slice reader checks every string on its own, a tenth of decoding.
    let text = std::str::from_utf8(body).map_err(|e| BadReview(format!("invalid JSON: not UTF-8: {e}")))?;
    let parsed = {
        let _scope = UnreadScope::enter(unread);
        serde_json::from_str::<ReviewIn>(text)
    };
    let review = parsed.map_err(|e| BadReview(format!("invalid JSON: {e}")))?;
    if review.kind.as_deref() != Some("AdmissionReview") {
        return Err(BadReview(format!("kind must be AdmissionReview, got {:?}", review.kind.unwrap_or_default())));
    }
    let api_version = review.api_version.unwrap_or_default();
    if api_version != "admission.k8s.io/v1" {
        return Err(BadReview(format!("apiVersion must be admission.k8s.io/v1, got {api_version:?}")));
    }
    let req = review.request.ok_or_else(|| BadReview("request is missing".into()))?;
    if req.uid.is_empty() {
        return Err(BadReview("request.uid is empty".into()));
    }
    let operation = RequestOperation::parse(&req.operation).ok_or_else(|| {
        BadReview(format!("request.operation {:?} is not CREATE, UPDATE, DELETE or CONNECT", req.operation))
    })?;
    let namespace = req.namespace.clone().unwrap_or_default();
    Ok(DecodedReview { req, operation, namespace, unread })
}

/// Runs the engine for `phase` on a decoded review and encodes the response.
///
/// `decoded` must leave out no more than `engine`'s policy set leaves unread (an answer on an
/// object missing a part some rule reads would be wrong); [`review`] decodes for the very set it
/// answers with.
pub fn answer(decoded: &DecodedReview, phase: Phase, engine: &Engine<'_>) -> Answer {
    let DecodedReview { req, operation, namespace, unread } = decoded;
    debug_assert!(unread.within(engine.policies.unread), "a review decoded leaving out what this policy set reads");
    let outcome = match req.object.as_ref().filter(|o| o.is_object()) {
        Some(object) => {
            let request = Request {
                uid: &req.uid,
                operation: *operation,
                group: &req.kind.group,
                kind: &req.kind.kind,
                namespace,
                object,
                old_object: req.old_object.as_ref().filter(|o| o.is_object()),
                dry_run: req.dry_run.unwrap_or(false),
                username: &req.user_info.username,
                groups: &req.user_info.groups,
            };
            match phase {
                Phase::Mutate => engine.mutate(&request),
                Phase::Validate => engine.validate(&request),
            }
        }
        // DELETE and CONNECT carry no object: nothing to decide.
        None => Outcome::default(),
    };
    let name = req
        .name
        .clone()
        .or_else(|| {
            req.object.as_ref().and_then(|o| o.field(&["metadata", "name"])).and_then(Value::as_str).map(String::from)
        })
        .or_else(|| {
            req.object
                .as_ref()
                .and_then(|o| o.field(&["metadata", "generateName"]))
                .and_then(Value::as_str)
                .map(|g| format!("{g}*"))
        })
        .unwrap_or_default();
    let allowed = outcome.allowed();
    let body = encode_response(&req.uid, &req.kind.kind, namespace, &name, &outcome);
    Answer {
        body,
        uid: req.uid.clone(),
        kind: req.kind.kind.clone(),
        namespace: namespace.clone(),
        name,
        allowed,
        mutated: allowed && !outcome.patch.is_empty(),
        outcome,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    audit_annotations: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct StatusOut {
    code: u16,
    reason: &'static str,
    message: String,
}

fn tagged(f: &Finding) -> String {
    format!("[{}] {}", f.rule, f.describe())
}

/// The denial message shown by `kubectl`: what was denied and every reason.
pub fn denial_message(kind: &str, namespace: &str, name: &str, findings: &[Finding]) -> String {
    let reasons: Vec<String> = findings.iter().filter(|f| f.action == Action::Deny).map(tagged).collect();
    let object = if namespace.is_empty() { format!("{kind} {name}") } else { format!("{kind} {namespace}/{name}") };
    format!("allot denied {object}: {}", reasons.join("; "))
}

fn audit_key(rule: &str) -> String {
    let mut key: String =
        rule.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_' { c.to_ascii_lowercase() } else { '-' }
            })
            .collect();
    key.truncate(63);
    key.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

/// Serialises an AdmissionReview response for `outcome`. A denial carries no patch.
pub fn encode_response(uid: &str, kind: &str, namespace: &str, name: &str, outcome: &Outcome) -> Vec<u8> {
    let allowed = outcome.allowed();
    let status = (!allowed).then(|| StatusOut {
        code: 403,
        reason: "Forbidden",
        message: denial_message(kind, namespace, name, &outcome.findings),
    });
    let patch = (allowed && !outcome.patch.is_empty())
        .then(|| serde_json::to_vec(&outcome.patch).map(|b| base64::engine::general_purpose::STANDARD.encode(b)).ok())
        .flatten();
    let mut audit_annotations = BTreeMap::new();
    for f in outcome.findings.iter().filter(|f| f.action == Action::Audit) {
        audit_annotations
            .entry(audit_key(f.rule.as_str()))
            .and_modify(|v: &mut String| {
                v.push_str("; ");
                v.push_str(&f.describe());
            })
            .or_insert_with(|| f.describe());
    }
    let review = ReviewOut {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: ResponseOut {
            uid,
            allowed,
            status,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            warnings: outcome.findings.iter().filter(|f| f.action == Action::Warn).map(tagged).collect(),
            audit_annotations,
        },
    };
    serde_json::to_vec(&review).unwrap_or_else(|_| b"{}".to_vec())
}

/// The AdmissionReview sent when answering failed inside Allot (a contained panic): a
/// well-formed denial with status 500, echoing the request's uid when it can be read, so the
/// API server applies the webhook's answer instead of failing the call on a dropped connection.
pub fn internal_error_response(body: &[u8], message: &str) -> Vec<u8> {
    let uid = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.field(&["request", "uid"]).and_then(serde_json::Value::as_str).map(str::to_string))
        .unwrap_or_default();
    internal_error_for(&uid, message)
}

/// [`internal_error_response`] for a review whose uid is known.
pub fn internal_error_for(uid: &str, message: &str) -> Vec<u8> {
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": false,
            "status": {"code": 500, "reason": "InternalError", "message": format!("allot: internal error: {message}")},
        },
    });
    serde_json::to_vec(&review).unwrap_or_else(|_| b"{}".to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decoded(object: Value) -> Option<Value> {
        let review = json!({"request": {"uid": "u", "object": object.clone(), "oldObject": object}});
        let body = serde_json::to_vec(&review).expect("JSON");
        let review: ReviewIn = serde_json::from_slice(&body).expect("a review");
        let request = review.request.expect("a request");
        assert_eq!(request.object, request.old_object, "object and oldObject are decoded alike");
        request.object
    }

    #[test]
    fn objects_are_decoded_whole_except_top_level_managed_fields() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}, "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "c", "managedFields": 1, "args": [1, -2, 2.5, true, null, "s"]}]},
            "managedFields": "kept: not in metadata",
        });
        let mut expected = pod.clone();
        expected["metadata"].as_object_mut().expect("metadata").remove("managedFields");
        assert_eq!(decoded(pod), Some(expected));
        // Anything else comes through as `Value` decodes it.
        for other in
            [json!(null), json!(5), json!("x"), json!([1, {"metadata": {"managedFields": 1}}]), json!({"metadata": 7})]
        {
            let want = if other.is_null() { None } else { Some(other.clone()) };
            assert_eq!(decoded(other), want);
        }
    }

    fn decoded_for(object: &Value, unread: Unread) -> (Value, Value) {
        let review = json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u", "operation": "UPDATE", "object": object, "oldObject": object}});
        let body = serde_json::to_vec(&review).expect("JSON");
        let decoded = decode_for(&body, unread).expect("a review");
        (decoded.object().expect("object").clone(), decoded.old_object().expect("oldObject").clone())
    }

    #[test]
    fn what_the_policies_leave_unread_is_left_out_of_object_and_old_object_only_there() {
        let pod = json!({
            "kind": "Pod",
            "metadata": {"name": "p", "annotations": {LAST_APPLIED_ANNOTATION: "{\"kind\":\"Pod\"}", "a": "b"},
                "labels": {LAST_APPLIED_ANNOTATION: "kept: a label"}},
            "spec": {
                "volumes": [{"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                "containers": [{"name": "c", "volumeMounts": [{"name": "token", "mountPath": "/t"}], "volumes": 1}],
                "template": {"spec": {"volumes": [{"name": "kept: a template's"}]}},
            },
            "status": {"volumes": "kept: not in spec"},
            "volumes": "kept: not in spec",
        });
        let mut trimmed = pod.clone();
        trimmed["metadata"]["annotations"].as_object_mut().expect("annotations").remove(LAST_APPLIED_ANNOTATION);
        trimmed["spec"].as_object_mut().expect("spec").remove("volumes");
        assert_eq!(decoded_for(&pod, Unread::EVERYTHING), (trimmed.clone(), trimmed));
        assert_eq!(decoded_for(&pod, Unread::NOTHING), (pod.clone(), pod.clone()));
        // Each on its own.
        let (only_volumes, _) = decoded_for(&pod, Unread { last_applied: false, volumes: true });
        assert_eq!(only_volumes["metadata"], pod["metadata"]);
        assert!(only_volumes["spec"].get("volumes").is_none());
        let (only_last_applied, _) = decoded_for(&pod, Unread { last_applied: true, volumes: false });
        assert_eq!(only_last_applied["spec"], pod["spec"]);
        assert_eq!(only_last_applied["metadata"]["annotations"], json!({"a": "b"}));
        // The annotation map stays when the copy was its only entry: a patch adding an
        // annotation is built for a map that exists, as it does on the API server's side.
        let applied_only = json!({"metadata": {"annotations": {LAST_APPLIED_ANNOTATION: "{}"}}, "spec": {}});
        assert_eq!(
            decoded_for(&applied_only, Unread::EVERYTHING).0,
            json!({"metadata": {"annotations": {}}, "spec": {}})
        );
        // `decode` is the whole object.
        let body = serde_json::to_vec(&json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u", "operation": "CREATE", "object": pod}}))
        .expect("JSON");
        assert_eq!(decode(&body).expect("a review").object(), Some(&pod));
    }

    #[test]
    fn a_part_left_out_is_still_parsed_as_json() {
        for (object, why) in [
            (r#"{"spec":{"volumes":[{"name":"v"},]}}"#, "trailing comma"),
            (r#"{"spec":{"volumes":[{"name":"\q"}]}}"#, "bad escape"),
            (
                r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":"\u12"}}}"#,
                "short escape",
            ),
            (r#"{"metadata":{"annotations":{"kubectl.kubernetes.io/last-applied-configuration":{"a":}}}}"#, "no value"),
        ] {
            let body = format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","operation":"CREATE","object":{object}}}}}"#
            );
            let error = decode_for(body.as_bytes(), Unread::EVERYTHING).expect_err(why);
            assert!(error.0.starts_with("invalid JSON"), "{why}: {error}");
            let whole = decode(body.as_bytes()).expect_err(why);
            assert!(whole.0.starts_with("invalid JSON"), "{why}: the whole object is refused too: {whole}");
        }
        // Valid JSON that only `Value` refuses passes where nothing is built from it.
        let deep = format!("{}1{}", "[".repeat(5_000), "]".repeat(5_000));
        for (volumes, why) in [
            (r#"[{"name":"\ud800"}]"#, "a lone surrogate escape"),
            ("[1e400]", "a number past f64"),
            (&deep, "deep nesting"),
        ] {
            let body = format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u","operation":"CREATE","object":{{"spec":{{"volumes":{volumes}}}}}}}}}"#
            );
            assert!(decode(body.as_bytes()).is_err(), "{why}: refused where it is built");
            let skipped = decode_for(body.as_bytes(), Unread::EVERYTHING).unwrap_or_else(|e| panic!("{why}: {e}"));
            assert_eq!(skipped.object(), Some(&json!({"spec": {}})), "{why}");
        }
    }

    /// With the shipped policies (which read neither), every captured review is answered byte
    /// for byte as it is on the whole object, on both webhooks.
    #[test]
    fn leaving_out_what_nobody_reads_changes_no_answer() {
        let policies =
            crate::model::policy::load_dir(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"))
                .expect("shipped policies");
        assert_eq!(policies.unread, Unread::EVERYTHING, "the shipped rules read neither");
        let engine = Engine::new(&policies, &crate::model::namespaces::NoNamespaces).with_change_descriptions(false);
        let mut trimmed_any = false;
        for (name, captured) in crate::model::fixtures::reviews() {
            let body = serde_json::to_vec(&captured).expect("JSON");
            let whole = decode(&body).expect("decodes");
            trimmed_any |= whole.object() != decode_for(&body, policies.unread).expect("decodes").object();
            for phase in [Phase::Mutate, Phase::Validate] {
                let served = review(&body, phase, &engine).expect("answered").body;
                assert_eq!(served, answer(&whole, phase, &engine).body, "{name} {phase:?}");
            }
        }
        assert!(trimmed_any, "no captured review has a part left out: this test would show nothing");
    }

    /// fuzz/regressions/admission_review/managed-fields-not-utf8: found by the admission_review
    /// target 2026-11-23 after 134 execs. A byte that is not UTF-8 inside
    /// `metadata.managedFields` (here `"f:\x97magePullPolicy"`), a part Allot skips unread.
    /// The body is checked as UTF-8 as a whole before parsing (JSON is UTF-8; the API server
    /// never sends such bytes, Go encodes invalid UTF-8 as U+FFFD), so wherever the byte is, the
    /// review is refused with the position, as `serde_json::Value` refuses it, and nothing is
    /// decided on the rest (until 2026-11-26 the skipped part was not checked, and the review
    /// was answered on the valid rest).
    #[test]
    fn invalid_utf8_anywhere_refuses_the_review_with_its_position() {
        let body = include_bytes!("../../fuzz/regressions/admission_review/managed-fields-not-utf8");
        let at = body.iter().position(|&b| b == 0x97).expect("the regression input holds a byte that is not UTF-8");
        assert!(serde_json::from_slice::<Value>(body).is_err());
        let error = decode(body).expect_err("not UTF-8: refused");
        assert!(error.0.starts_with("invalid JSON: not UTF-8") && error.0.contains(&format!("index {at}")), "{error}");
        // The same bytes made valid (the API server's U+FFFD) are answered.
        let repaired = String::from_utf8_lossy(body).into_owned();
        let decoded = decode(repaired.as_bytes()).expect("decoded once UTF-8");
        assert!(decoded.object().is_some_and(|o| o["metadata"].get("managedFields").is_none()));
        assert_eq!(decoded.uid(), "ebcfebaf-af01-4396-ae6e-9f4258a1311f");
    }
}
