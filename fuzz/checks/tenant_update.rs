//! Pod UPDATEs a tenant might send: the gated gang worker of fixture 021 edited by arbitrary
//! bytes (each byte pair picks a label, annotation or gate edit, with extreme values such as
//! `allot.dev/gang-size: 4294967295`), through `Engine::validate` as a tenant and as Allot.
//!
//! Invariants, besides "never panics": a tenant's UPDATE is admitted only when it leaves
//! Allot's gates and every guarded key (`allot::admission::tenant::is_guarded_key`) as they were; Allot's
//! own identity is never denied for such edits.

use super::common;

use std::sync::OnceLock;

use allot::admission::engine::{Engine, Request, RequestOperation};
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::PolicySet;
use serde_json::{Value, json};

const ALLOT: &str = allot::admission::tenant::DEFAULT_ALLOT_USERNAME;
const KEYS: &[&str] = &[
    "allot.dev/gang-name",
    "allot.dev/gang-size",
    "allot.dev/gang-released",
    "allot.dev/x",
    "kueue.x-k8s.io/pod-group-name",
    "kueue.x-k8s.io/pod-group-total-count",
    "kueue.x-k8s.io/managed",
    "scheduling.x-k8s.io/pod-group",
    "scheduling.k8s.io/group-name",
    "batch.kubernetes.io/job-name",
    "leaderworkerset.sigs.k8s.io/group-index",
    "app",
    "example.com/note",
];
const VALUES: &[&str] =
    &["", "1", "0", "-1", "4294967295", "99999999999999999999999", "1e18", "true", "g", "\u{1F600}"];
const GATES: &[&str] = &["allot.dev/gang", "allot.dev/quota", "example.com/hold", "kueue.x-k8s.io/admission"];

fn setup() -> &'static (PolicySet, Value) {
    static SETUP: OnceLock<(PolicySet, Value)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let path = common::repo().join("tests/fixtures/admission-reviews/021-validate-update-pod-gated-worker-0.json");
        let review: Value = serde_json::from_slice(&std::fs::read(path).expect("fixture 021")).expect("JSON");
        let mut old = review["request"]["oldObject"].clone();
        old["spec"]["schedulingGates"] = json!(GATES.iter().map(|g| json!({"name": g})).collect::<Vec<_>>());
        old["metadata"]["annotations"]["allot.dev/gang-released"] = json!("t");
        (common::shipped_policies(), old)
    })
}

fn guarded(pod: &Value) -> Value {
    let pick = |field: &str| -> serde_json::Map<String, Value> {
        pod["metadata"][field]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| allot::admission::tenant::is_guarded_key(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let gates: Vec<Value> = pod["spec"]["schedulingGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["name"].as_str().is_some_and(|n| n.starts_with("allot.dev/")))
        .cloned()
        .collect();
    json!({"labels": pick("labels"), "annotations": pick("annotations"), "gates": gates})
}

fn validate(policies: &PolicySet, old: &Value, new: &Value, username: &str) -> bool {
    let request = Request {
        uid: "fuzz",
        operation: RequestOperation::Update,
        group: "",
        kind: "Pod",
        namespace: "vision",
        object: new,
        old_object: Some(old),
        dry_run: false,
        username,
        groups: &[],
    };
    Engine::new(policies, &NoNamespaces).validate(&request).allowed()
}

/// The target's check of one input.
pub fn run(data: &[u8]) {
    let (policies, old) = setup();
    let mut new = old.clone();
    for pair in data.chunks(2) {
        let (op, arg) = (pair[0], pair.get(1).copied().unwrap_or(0) as usize);
        let key = KEYS[arg % KEYS.len()];
        let value = VALUES[(arg / KEYS.len()) % VALUES.len()];
        match op % 5 {
            0 => new["metadata"]["labels"][key] = json!(value),
            1 => new["metadata"]["annotations"][key] = json!(value),
            2 => {
                if let Some(m) = new["metadata"]["labels"].as_object_mut() {
                    m.remove(key);
                }
            }
            3 => {
                if let Some(m) = new["metadata"]["annotations"].as_object_mut() {
                    m.remove(key);
                }
            }
            _ => {
                if let Some(gates) = new["spec"]["schedulingGates"].as_array_mut() {
                    gates.retain(|g| g["name"] != GATES[arg % GATES.len()]);
                }
            }
        }
    }
    let changed = guarded(old) != guarded(&new);
    let tenant = validate(policies, old, &new, "alice");
    assert_eq!(
        tenant,
        !changed,
        "a tenant's UPDATE was {} although it {} Allot's gates or keys",
        if tenant { "admitted" } else { "denied" },
        if changed { "changes" } else { "leaves" }
    );
    assert!(validate(policies, old, &new, ALLOT), "Allot's own UPDATE was denied");
}
