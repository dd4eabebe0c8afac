//! Arbitrary bytes as an AdmissionReview, through the same entry point as `POST /mutate` and
//! `POST /validate` (`allot::admission::review`), against the shipped policies.
//!
//! Invariants checked, besides "never panics":
//! - an `Ok` answer's body is JSON: an `admission.k8s.io/v1` AdmissionReview whose
//!   `response.uid` is the request's and whose `response.allowed` is the answer's;
//! - a denial carries a status message and no patch;
//! - a patch comes only from the mutating phase, is base64 of an RFC 6902 patch, and applies to
//!   the request's object (json-patch, as the API server would);
//! - mutation is idempotent (`reinvocationPolicy: IfNeeded`): the patched object, reviewed
//!   again, is admitted with no further patch.

use super::common;

use std::sync::OnceLock;

use allot::admission::engine::Engine;
use allot::admission::{self, Answer, Phase};
use allot::model::namespaces::StaticNamespaces;
use allot::model::policy::PolicySet;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of an AdmissionReview that `admission::review` reads, to rebuild the review around
/// a patched object. Typed like the server's own decoding down to the values it reads, because
/// serde_json skips unread fields without validating their strings' escapes (a lone surrogate
/// escape in an unknown key's string is accepted there, and must be here; bytes that are not
/// UTF-8 are refused anywhere, the body is checked as a whole). Absent and
/// `null` mean the same to the server.
#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct Mirror {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    api_version: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    kind: Value,
    request: MirrorRequest,
}

#[derive(Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct MirrorRequest {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    uid: Value,
    kind: MirrorKind,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    namespace: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    name: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    operation: Value,
    #[serde(default)]
    user_info: MirrorUser,
    /// Taken from the server's decoding (`admission::decode`), not decoded here: the server
    /// skips `metadata.managedFields` unread, so what only a `Value` refuses there (a lone
    /// surrogate escape) is accepted
    /// (fuzz/regressions/admission_review/managed-fields-not-utf8 was such a case until the body
    /// was checked as UTF-8 as a whole).
    #[serde(default, skip_deserializing)]
    object: Value,
    #[serde(default, skip_deserializing, skip_serializing_if = "Value::is_null")]
    old_object: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    dry_run: Value,
}

#[derive(Deserialize, Serialize)]
struct MirrorKind {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    group: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    kind: Value,
}

#[derive(Deserialize, Serialize, Default)]
struct MirrorUser {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    username: Value,
    #[serde(default, skip_serializing_if = "Value::is_null")]
    groups: Value,
}

struct Setup {
    policies: PolicySet,
    namespaces: StaticNamespaces,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

fn setup() -> &'static Setup {
    SETUP.get_or_init(|| Setup { policies: common::shipped_policies(), namespaces: common::example_namespaces() })
}

/// The target's check of one input.
pub fn run(data: &[u8]) {
    let setup = setup();
    let engine = Engine::new(&setup.policies, &setup.namespaces);
    for phase in [Phase::Mutate, Phase::Validate] {
        if let Ok(answer) = admission::review(data, phase, &engine) {
            check(data, phase, &answer, &engine);
        }
    }
}

fn check(input: &[u8], phase: Phase, answer: &Answer, engine: &Engine<'_>) {
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or_else(|e| {
        panic!("{phase:?}: response body is not JSON ({e}): {:?}", String::from_utf8_lossy(&answer.body))
    });
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1", "{phase:?}: {body}");
    assert_eq!(body["kind"], "AdmissionReview", "{phase:?}: {body}");
    let response = &body["response"];
    assert_eq!(response["uid"].as_str(), Some(answer.uid.as_str()), "{phase:?}: uid not echoed: {body}");
    assert_eq!(response["allowed"].as_bool(), Some(answer.allowed), "{phase:?}: {body}");

    if !answer.allowed {
        assert!(response.get("patch").is_none(), "{phase:?}: a denial carries a patch: {body}");
        assert!(response["status"]["message"].is_string(), "{phase:?}: a denial without a message: {body}");
        return;
    }
    let Some(patch) = response.get("patch") else {
        assert!(!answer.mutated, "{phase:?}: answer says mutated but the body has no patch: {body}");
        return;
    };
    assert_eq!(phase, Phase::Mutate, "the validating webhook returned a patch: {body}");
    assert_eq!(response["patchType"], "JSONPatch", "{body}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().unwrap_or_else(|| panic!("patch is not a string: {body}")))
        .unwrap_or_else(|e| panic!("patch is not base64 ({e}): {body}"));
    let ops: json_patch::Patch =
        serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("patch is not an RFC 6902 patch ({e}): {body}"));

    // The object the patch is for: whole, as the API server applies the patch to it, when
    // serde_json's `Value` takes it; else as the server decoded it (valid JSON only a `Value`
    // refuses, a lone surrogate escape or a number past f64, may sit in a part the policies
    // leave unread, which the server skips unbuilt).
    let mut review: Mirror = serde_json::from_slice(input).expect("review() accepted a review the mirror rejects");
    let decoded = admission::decode(input)
        .or_else(|_| admission::decode_for(input, engine.policies.unread))
        .expect("review() accepted it");
    review.request.object = decoded.object().cloned().unwrap_or_default();
    review.request.old_object = decoded.old_object().cloned().unwrap_or_default();
    let object = &mut review.request.object;
    let mut patched = object.clone();
    if let Err(e) = json_patch::patch(&mut patched, &ops) {
        panic!(
            "patch does not apply to request.object: {e}\npatch: {}\nobject: {object}",
            String::from_utf8_lossy(&bytes)
        );
    }

    // Reinvocation: the API server may call the mutating webhook again on its own output.
    *object = patched;
    let again = serde_json::to_vec(&review).expect("re-encoding the review");
    match admission::review(&again, Phase::Mutate, engine) {
        Ok(second) => {
            assert!(
                second.allowed && second.outcome.patch.is_empty(),
                "mutation is not idempotent: second pass allowed={} patch={:?} findings={:?}\nfirst patch: {}",
                second.allowed,
                second.outcome.patch,
                second.outcome.findings,
                String::from_utf8_lossy(&bytes)
            );
        }
        Err(e) => panic!("the patched review is rejected: {e}"),
    }
}
