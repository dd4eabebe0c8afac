//! UPDATE reviews from two arbitrary objects: the old and the new version of a Pod or a
//! workload (the bytes before the first NUL are `oldObject`, the rest `object`, each JSON),
//! through both phases against the shipped policies. Rules that read `oldObject` and the
//! checks that compare versions (gang gates, quota on UPDATE) see fuzzed pairs.
//!
//! Checks: never panics; a well-formed review is always answered (`Ok`) with the request's uid.

use super::common;

use std::sync::OnceLock;

use allot::admission::engine::Engine;
use allot::admission::{self, Phase};
use allot::model::namespaces::StaticNamespaces;
use allot::model::policy::PolicySet;
use serde_json::{Value, json};

struct Setup {
    policies: PolicySet,
    namespaces: StaticNamespaces,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

/// (group, version, kind, resource) of the kinds an UPDATE is sent for; the first byte picks.
const KINDS: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "Pod", "pods"),
    ("batch", "v1", "Job", "jobs"),
    ("apps", "v1", "Deployment", "deployments"),
    ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
    ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
];

/// The target's check of one input.
pub fn run(data: &[u8]) {
    let setup =
        SETUP.get_or_init(|| Setup { policies: common::shipped_policies(), namespaces: common::example_namespaces() });
    let Some((&pick, rest)) = data.split_first() else { return };
    let (old, new) = match rest.iter().position(|b| *b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, rest),
    };
    let (Ok(old), Ok(new)) = (serde_json::from_slice::<Value>(old), serde_json::from_slice::<Value>(new)) else {
        return;
    };
    let (group, version, kind, resource) = KINDS[usize::from(pick) % KINDS.len()];
    let namespace = new.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("vision").to_string();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "fuzz-update",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "namespace": namespace,
            "operation": "UPDATE",
            "userInfo": {"username": "fuzz", "groups": ["system:authenticated"]},
            "object": new,
            "oldObject": old,
        }
    });
    let body = serde_json::to_vec(&review).expect("a Value serialises");
    let engine = Engine::new(&setup.policies, &setup.namespaces);
    for phase in [Phase::Mutate, Phase::Validate] {
        let answer = admission::review(&body, phase, &engine).expect("a well-formed UPDATE review is answered");
        let out: Value = serde_json::from_slice(&answer.body).expect("the response is JSON");
        assert_eq!(out["response"]["uid"], "fuzz-update");
        assert_eq!(out["response"]["allowed"], answer.allowed);
    }
}
