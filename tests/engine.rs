//! In-process engine tests on real AdmissionReviews captured from kube-apiserver 1.36: every
//! patch is applied with json-patch and the result parsed as a k8s-openapi object.

use std::path::Path;

use allot::admission::engine::{Engine, Request, RequestOperation, group_kind};
use allot::admission::{self, Phase};
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::{self, PolicySet, Source};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews").join(name);
    serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("fixture JSON")
}

fn shipped() -> PolicySet {
    policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).expect("shipped policies")
}

fn with_extra(extra: &str) -> PolicySet {
    let mut sources = policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    sources.push(Source { name: "extra.yaml".into(), text: extra.into() });
    policy::compile(&sources).unwrap_or_else(|e| panic!("{e}"))
}

/// The shipped policies with `externalSchedulers: []` of the Cluster document replaced by `line`.
fn with_cluster_spec(line: &str) -> PolicySet {
    let mut sources = policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let cluster = sources.iter_mut().find(|s| s.text.contains("kind: Cluster")).expect("a Cluster document");
    assert!(cluster.text.contains("\n  externalSchedulers: []\n"));
    cluster.text = cluster.text.replacen("\n  externalSchedulers: []\n", &format!("\n  {line}\n"), 1);
    policy::compile(&sources).unwrap_or_else(|e| panic!("{e}"))
}

/// Sends a review through `admission::review` and returns the response object.
fn answer(policies: &PolicySet, review: &Value, phase: Phase) -> Value {
    let engine = Engine::new(policies, &NoNamespaces);
    let body = serde_json::to_vec(review).unwrap();
    let answer = admission::review(&body, phase, &engine).expect("well-formed review");
    let out: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    assert_eq!(out["response"]["uid"], review["request"]["uid"]);
    out["response"].clone()
}

/// Decodes the base64 patch of a response (asserting its shape), if any.
fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let encoded = response.get("patch")?;
    assert_eq!(response["patchType"], "JSONPatch");
    let encoded = encoded.as_str().expect("patch must be a base64 string, not a byte array");
    let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64");
    Some(serde_json::from_slice(&bytes).expect("RFC 6902 patch"))
}

fn apply(object: &Value, patch: &json_patch::Patch) -> Value {
    let mut out = object.clone();
    json_patch::patch(&mut out, patch).expect("patch applies");
    out
}

fn with_object(review: &Value, object: Value) -> Value {
    let mut r = review.clone();
    r["request"]["object"] = object;
    r
}

#[test]
fn gpu_pod_gets_its_toleration_once_and_the_patch_is_idempotent() {
    let policies = shipped();
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let response = answer(&policies, &review, Phase::Mutate);
    assert_eq!(response["allowed"], true);
    let patch = patch_of(&response).expect("a patch");
    let mutated = apply(&review["request"]["object"], &patch);
    let pod: Pod = serde_json::from_value(mutated.clone()).expect("a valid Pod");
    let tolerations = pod.spec.unwrap().tolerations.unwrap();
    let gpu: Vec<_> = tolerations.iter().filter(|t| t.key.as_deref() == Some("nvidia.com/gpu")).collect();
    assert_eq!(gpu.len(), 1);
    assert_eq!(gpu[0].operator.as_deref(), Some("Exists"));
    assert_eq!(gpu[0].effect.as_deref(), Some("NoSchedule"));
    assert_eq!(tolerations.len(), 3, "the API server's own tolerations are kept");
    // The class the Priority plugin filled in is the team default already: no priority change.
    assert!(patch.0.iter().all(|op| !serde_json::to_string(op).unwrap().contains("priority")));

    // Reinvocation / second pass: nothing more to do.
    let again = answer(&policies, &with_object(&review, mutated), Phase::Mutate);
    assert!(again.get("patch").is_none(), "{again}");
}

#[test]
fn tolerated_pod_is_left_alone_and_its_class_is_checked_against_the_team() {
    let policies = shipped();
    let response = answer(&policies, &fixture("014-mutate-create-pod-tolerated-gpu-pod.json"), Phase::Mutate);
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "toleration already present: {response}");

    // nlp may only use low-priority; this pod asks high-priority.
    let response = answer(&policies, &fixture("015-validate-create-pod-tolerated-gpu-pod.json"), Phase::Validate);
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("[team/priority-class]"), "{message}");
    assert!(
        message.contains("team nlp may use priority classes low-priority; this pod asks high-priority"),
        "{message}"
    );
}

#[test]
fn cpu_pod_gets_no_placement() {
    let policies = shipped();
    let response = answer(&policies, &fixture("012-mutate-create-pod-plain-cpu-pod.json"), Phase::Mutate);
    assert_eq!(response["allowed"], true);
    assert!(response.get("patch").is_none(), "{response}");
    let response = answer(&policies, &fixture("013-validate-create-pod-plain-cpu-pod.json"), Phase::Validate);
    assert_eq!(response["allowed"], true);
}

#[test]
fn job_with_request_above_limit_is_denied_with_its_path() {
    let policies = shipped();
    let mut review = fixture("007-mutate-create-job-bad-gpu.json");
    let response = answer(&policies, &review, Phase::Mutate);
    assert_eq!(response["allowed"], true, "mutation ignores Jobs");
    assert!(response.get("patch").is_none());
    review["request"]["options"]["kind"] = json!("CreateOptions");
    let response = answer(&policies, &review, Phase::Validate);
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("allot denied Job nlp/bad-gpu: "), "{message}");
    assert!(
        message.contains(
            "[accelerators/requests-equal-limits] spec.template.spec.containers[0]: container t: nvidia.com/gpu request 2 must equal its limit 1"
        ),
        "{message}"
    );
}

#[test]
fn good_jobs_and_gated_pods_are_admitted() {
    let policies = shipped();
    for name in [
        "002-validate-create-job-mnist-demo.json",
        "004-validate-create-job-test1.json",
        "006-validate-create-job-test-p1.json",
        "009-validate-create-job-gang-a.json",
        "011-validate-create-pod-my-gpu-pod.json",
        "019-validate-create-pod-gated-worker-0.json",
    ] {
        let response = answer(&policies, &fixture(name), Phase::Validate);
        assert_eq!(response["allowed"], true, "{name}: {response}");
    }
}

#[test]
fn updates_are_not_mutated_and_pod_specs_are_not_rechecked() {
    let policies = shipped();
    for name in ["016-mutate-update-pod-my-gpu-pod.json", "020-mutate-update-pod-gated-worker-0.json"] {
        let response = answer(&policies, &fixture(name), Phase::Mutate);
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none(), "{name}");
    }
    // A pod admitted under older policies (request != limit here) can still be updated.
    let mut review = fixture("017-validate-update-pod-my-gpu-pod.json");
    // (The API server forbids changing resources on UPDATE outside pods/resize: the old object
    // has the same request.)
    review["request"]["object"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("2");
    review["request"]["oldObject"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = json!("2");
    let response = answer(&policies, &review, Phase::Validate);
    assert_eq!(response["allowed"], true, "{response}");
}

const VISION_DEFAULT: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: research}
spec:
  namespaces: {names: [vision]}
  priority: {default: research-default}
"#;

#[test]
fn default_priority_replaces_the_global_default_and_drops_priority_fields() {
    // A team listed before the shipped ones would win; here `research` comes after `vision`,
    // so put it first by building the set by hand.
    let mut sources = vec![Source { name: "0-research.yaml".into(), text: VISION_DEFAULT.into() }];
    sources.extend(policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap());
    let policies = policy::compile(&sources).unwrap();
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    assert_eq!(review["request"]["object"]["spec"]["priorityClassName"], "low-priority");
    assert_eq!(review["request"]["object"]["spec"]["priority"], 0);
    let response = answer(&policies, &review, Phase::Mutate);
    let patch = patch_of(&response).expect("patch");
    let ops = serde_json::to_value(&patch).unwrap();
    assert!(
        ops.as_array()
            .unwrap()
            .contains(&json!({"op": "replace", "path": "/spec/priorityClassName", "value": "research-default"})),
        "{ops}"
    );
    assert!(ops.as_array().unwrap().contains(&json!({"op": "remove", "path": "/spec/priority"})), "{ops}");
    assert!(ops.as_array().unwrap().contains(&json!({"op": "remove", "path": "/spec/preemptionPolicy"})), "{ops}");
    let mutated = apply(&review["request"]["object"], &patch);
    let pod: Pod = serde_json::from_value(mutated.clone()).unwrap();
    let spec = pod.spec.unwrap();
    assert_eq!(spec.priority_class_name.as_deref(), Some("research-default"));
    assert_eq!(spec.priority, None);
    assert_eq!(spec.preemption_policy, None);
    let again = answer(&policies, &with_object(&review, mutated), Phase::Mutate);
    assert!(again.get("patch").is_none(), "{again}");

    // An explicit class the user chose (not the global default) is never replaced.
    let mut explicit = review.clone();
    explicit["request"]["object"]["spec"]["priorityClassName"] = json!("high-priority");
    let response = answer(&policies, &explicit, Phase::Mutate);
    let ops = serde_json::to_string(&patch_of(&response).unwrap()).unwrap();
    assert!(!ops.contains("priority"), "{ops}");
}

fn engine_mutate(policies: &PolicySet, pod: &Value) -> allot::admission::engine::Outcome {
    mutate_as(&Engine::new(policies, &NoNamespaces), pod, "test")
}

/// The mutating webhook's answer for `pod`, created in `vision` by `username`.
fn mutate_as(engine: &Engine<'_>, pod: &Value, username: &str) -> allot::admission::engine::Outcome {
    engine.mutate(&create_request(pod, "vision", username))
}

/// A CREATE of `object` in `namespace` by `username`.
fn create_request<'a>(object: &'a Value, namespace: &'a str, username: &'a str) -> Request<'a> {
    let (group, kind) = group_kind(object);
    Request {
        uid: "test",
        operation: RequestOperation::Create,
        group,
        kind,
        namespace,
        object,
        old_object: None,
        dry_run: false,
        username,
        groups: &[],
    }
}

const POOL: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: pool}
spec:
  nodeSelector: {node-type: my-precious}
  nodeAffinity:
    - {key: topology.kubernetes.io/zone, operator: In, values: [zone-a]}
  onConflict: ONCONFLICT
"#;

fn gpu_pod(extra_spec: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "vision"},
        "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    for (k, v) in extra_spec.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    pod
}

#[test]
fn node_selector_conflicts_deny_or_keep_as_the_policy_says() {
    let deny = with_extra(&POOL.replace("ONCONFLICT", "Deny"));
    let pod = gpu_pod(json!({"nodeSelector": {"node-type": "cheap"}}));
    let outcome = engine_mutate(&deny, &pod);
    assert!(!outcome.allowed());
    let f = outcome.findings.iter().find(|f| f.rule == "placement/pool").unwrap();
    assert_eq!(f.path, "spec.nodeSelector");
    assert!(f.message.contains("node-type=cheap conflicts with node-type=my-precious"), "{}", f.message);

    let keep = with_extra(&POOL.replace("ONCONFLICT", "Keep"));
    let outcome = engine_mutate(&keep, &pod);
    assert!(outcome.allowed());
    let mutated = allot::model::patch::apply(&pod, &outcome.patch).unwrap();
    assert_eq!(mutated["spec"]["nodeSelector"]["node-type"], "cheap", "the user's value is never overwritten");
    assert!(outcome.findings.iter().any(|f| f.action == allot::model::policy::Action::Warn));
}

#[test]
fn node_affinity_is_anded_into_every_existing_term() {
    let policies = with_extra(&POOL.replace("ONCONFLICT", "Deny"));
    let pod = gpu_pod(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
    "nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]}}}}));
    let outcome = engine_mutate(&policies, &pod);
    let mutated = allot::model::patch::apply(&pod, &outcome.patch).unwrap();
    let parsed: Pod = serde_json::from_value(mutated.clone()).unwrap();
    let terms = parsed
        .spec
        .unwrap()
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms.len(), 2);
    for term in &terms {
        let exprs = term.match_expressions.as_ref().unwrap();
        assert!(exprs.iter().any(|e| e.key == "topology.kubernetes.io/zone"), "{term:?}");
    }
    assert_eq!(engine_mutate(&policies, &mutated).patch, vec![], "idempotent");

    // No affinity at all: one add creates the whole structure.
    let bare = gpu_pod(json!({}));
    let outcome = engine_mutate(&policies, &bare);
    assert!(outcome.patch.iter().any(|op| op.path() == "/spec/affinity"), "{:?}", outcome.patch);
    let mutated = allot::model::patch::apply(&bare, &outcome.patch).unwrap();
    let _: Pod = serde_json::from_value(mutated.clone()).unwrap();
    assert_eq!(mutated["spec"]["nodeSelector"]["node-type"], "my-precious");
}

#[test]
fn a_rule_reading_dotted_keys_really_denies() {
    // DESIGN.md's pitfall: with escaped keys such a rule errors, and an erroring guarded rule
    // could pass silently. Here it must deny 3 GPUs and admit 2.
    let policies = with_extra(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: at-most-two}
spec:
  expression: >-
    object.spec.containers.all(c, !has(c.resources.limits) ||
      !('nvidia.com/gpu' in c.resources.limits) || int(c.resources.limits['nvidia.com/gpu']) <= 2)
  message: at most 2 GPUs per container
"#,
    );
    let mut review = fixture("011-validate-create-pod-my-gpu-pod.json");
    let response = answer(&policies, &review, Phase::Validate);
    assert_eq!(response["allowed"], true, "{response}");
    for field in ["limits", "requests"] {
        review["request"]["object"]["spec"]["containers"][0]["resources"][field]["nvidia.com/gpu"] = json!("3");
    }
    let response = answer(&policies, &review, Phase::Validate);
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"].as_str().unwrap().contains("[at-most-two] at most 2 GPUs per container"));
}

#[test]
fn a_rule_that_errors_denies_instead_of_passing() {
    let policies = with_extra(
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: broken-at-runtime}\nspec:\n  expression: object.spec.nonexistent.field == 1\n  message: m\n",
    );
    let response = answer(&policies, &fixture("011-validate-create-pod-my-gpu-pod.json"), Phase::Validate);
    assert_eq!(response["allowed"], false);
    assert!(response["status"]["message"].as_str().unwrap().contains("could not be evaluated"));
}

#[test]
fn warn_and_audit_actions_reach_the_response() {
    let policies = with_extra(
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: warn-me}\nspec:\n  expression: 'false'\n  message: careful\n  action: Warn\n---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: Audit Me}\nspec:\n  expression: 'false'\n  messageExpression: \"'seen ' + object.metadata.name\"\n  action: Audit\n",
    );
    let response = answer(&policies, &fixture("011-validate-create-pod-my-gpu-pod.json"), Phase::Validate);
    assert_eq!(response["allowed"], true);
    assert_eq!(response["warnings"], json!(["[warn-me] careful"]));
    assert_eq!(response["auditAnnotations"], json!({"audit-me": "seen my-gpu-pod"}));
}

#[test]
fn workload_templates_are_checked_as_their_pods_will_be() {
    let policies = with_extra(
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: must-tolerate}\nspec:\n  expression: \"accelerators(object) == 0 || (has(object.spec.tolerations) && object.spec.tolerations.exists(t, t.key == 'nvidia.com/gpu'))\"\n  message: GPU pods must tolerate the GPU taint\n",
    );
    // The Job's template has no toleration, but its Pods will get one from the mutating
    // webhook: the rule sees the template as the Pod will be, and admits.
    let response = answer(&policies, &fixture("002-validate-create-job-mnist-demo.json"), Phase::Validate);
    assert_eq!(response["allowed"], true, "{response}");
    // The same rule on a Pod that somehow arrives without it denies.
    let mut review = fixture("011-validate-create-pod-my-gpu-pod.json");
    review["request"]["object"]["spec"]["tolerations"] = json!([]);
    let response = answer(&policies, &review, Phase::Validate);
    assert_eq!(response["allowed"], false);
}

#[test]
fn every_example_workload_kind_is_seen() {
    let manifests =
        allot::cli::check::read_manifests(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")]).unwrap();
    let policies = shipped();
    let engine = Engine::new(&policies, &NoNamespaces);
    let report = allot::cli::check::run(&engine, &manifests);
    let by_name = |name: &str| report.results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name}"));
    let pt = by_name("bert-finetune");
    assert!(!pt.allowed);
    let f =
        pt.findings.iter().find(|f| f.rule == "accelerators/requests-equal-limits").expect("request != limit found");
    assert_eq!(f.path, "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0]");
    // Without namespace labels the nlp team's selector cannot match nlp-research, and the
    // engine says so instead of guessing.
    assert!(pt.notes.iter().any(|n| n.contains("team nlp selects namespaces by label")), "{:?}", pt.notes);
    let js = by_name("llm-pretrain");
    let paths: Vec<_> = js.findings.iter().map(|f| (f.rule.as_str(), f.path.as_str())).collect();
    assert!(
        paths.contains(&(
            "accelerators/init-containers",
            "spec.replicatedJobs[1].template.spec.template.spec.initContainers[0]"
        )),
        "{paths:?}"
    );
    assert!(
        paths.contains(&("accelerators/max-per-pod", "spec.replicatedJobs[1].template.spec.template.spec")),
        "{paths:?}"
    );
    assert!(by_name("mnist-ddp").allowed);
    let job: Job = serde_yaml_job(&manifests, "mnist-ddp");
    assert_eq!(job.spec.unwrap().parallelism, Some(4));
}

fn serde_yaml_job(manifests: &[allot::cli::check::Manifest], name: &str) -> Job {
    let m = manifests.iter().find(|m| m.object["metadata"]["name"] == name).unwrap();
    serde_json::from_value(m.object.clone()).unwrap()
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn quantity() -> impl Strategy<Value = Value> {
        prop_oneof![(0u32..9).prop_map(|n| json!(n.to_string())), (0u32..9).prop_map(|n| json!(n)), Just(json!("500m")),]
    }

    fn container() -> impl Strategy<Value = Value> {
        (
            prop::option::of(quantity()),
            prop::option::of(quantity()),
            prop::sample::select(vec!["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "cpu"]),
        )
            .prop_map(|(req, lim, name)| {
                let mut resources = serde_json::Map::new();
                if let Some(r) = req {
                    resources.insert("requests".into(), json!({ name: r }));
                }
                if let Some(l) = lim {
                    resources.insert("limits".into(), json!({ name: l }));
                }
                json!({"name": "c", "image": "i:1", "resources": resources})
            })
    }

    fn pod() -> impl Strategy<Value = Value> {
        (
            prop::collection::vec(container(), 1..3),
            prop::option::of(prop::sample::select(vec![
                json!([]),
                json!([{"key": "nvidia.com/gpu", "operator": "Exists"}]),
                json!([{"operator": "Exists"}]),
                json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}]),
            ])),
            prop::option::of(prop::sample::select(vec![
                json!({}),
                json!({"node-type": "cheap"}),
                json!({"other": "x"}),
            ])),
            prop::option::of(prop::sample::select(vec!["low-priority", "high-priority", ""])),
            prop::bool::ANY,
            prop::option::of(prop::sample::select(vec![
                json!({}),
                json!({"nodeAffinity": {}}),
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                    {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
                ]}}}),
            ])),
        )
            .prop_map(|(containers, tolerations, selector, class, with_priority, affinity)| {
                let mut spec = json!({"containers": containers});
                if let Some(t) = tolerations {
                    spec["tolerations"] = t;
                }
                if let Some(s) = selector {
                    spec["nodeSelector"] = s;
                }
                if let Some(c) = class {
                    spec["priorityClassName"] = json!(c);
                }
                if let Some(a) = affinity {
                    spec["affinity"] = a;
                }
                if with_priority {
                    spec["priority"] = json!(0);
                    spec["preemptionPolicy"] = json!("PreemptLowerPriority");
                }
                let mut metadata = json!({"name": "p", "namespace": "vision"});
                if with_priority {
                    // Reuse the flag to vary gang membership too.
                    metadata["labels"] = json!({"allot.dev/gang-name": "g"});
                    metadata["annotations"] = json!({"allot.dev/gang-size": "2"});
                }
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Mutating the mutated pod yields nothing, and every patch yields a valid Pod.
        #[test]
        fn mutation_is_idempotent(pod in pod()) {
            let mut sources = vec![Source { name: "0.yaml".into(), text: VISION_DEFAULT.into() }];
            sources.push(Source { name: "1.yaml".into(), text: POOL.replace("ONCONFLICT", "Keep") });
            sources.extend(policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap());
            let policies = policy::compile(&sources).unwrap();
            let first = engine_mutate(&policies, &pod);
            let mutated = allot::model::patch::apply(&pod, &first.patch).expect("patch applies");
            let parsed: Result<Pod, _> = serde_json::from_value(mutated.clone());
            prop_assert!(parsed.is_ok(), "{:?}", parsed.err());
            let second = engine_mutate(&policies, &mutated);
            prop_assert!(second.patch.is_empty(), "second patch {:?} after {:?}", second.patch, first.patch);
        }

        /// Arbitrary JSON never panics the review path; it answers or says why not.
        #[test]
        fn arbitrary_reviews_never_panic(body in any::<Vec<u8>>(), kind in "[A-Za-z]{0,8}", op in "(CREATE|UPDATE|DELETE|X)") {
            let policies = shipped();
            let engine = Engine::new(&policies, &NoNamespaces);
            let _ = admission::review(&body, Phase::Mutate, &engine);
            let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                "uid": "u", "kind": {"group": "", "version": "v1", "kind": kind}, "operation": op,
                "namespace": "vision", "object": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": body.len()}}}]}}
            }});
            for phase in [Phase::Mutate, Phase::Validate] {
                let answered = admission::review(&serde_json::to_vec(&review).unwrap(), phase, &engine);
                prop_assert!(answered.is_ok() == (op != "X"));
            }
        }
    }
}

#[test]
fn cpu_pods_can_be_kept_off_gpu_nodes() {
    let policies = with_extra(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: keep-cpu-off-gpu}
spec:
  appliesTo: OtherPods
  nodeAffinity:
    - {key: node-type, operator: NotIn, values: [my-precious]}
"#,
    );
    let cpu = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "c", "namespace": "vision"},
        "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"requests": {"cpu": "1"}}}]}});
    let outcome = engine_mutate(&policies, &cpu);
    let mutated = allot::model::patch::apply(&cpu, &outcome.patch).unwrap();
    let pod: Pod = serde_json::from_value(mutated).unwrap();
    let terms = pod
        .spec
        .unwrap()
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    let expr = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!((expr.key.as_str(), expr.operator.as_str()), ("node-type", "NotIn"));
    assert!(outcome.patch.iter().all(|op| op.path() != "/spec/tolerations"), "no GPU toleration for a CPU pod");

    let outcome = engine_mutate(&policies, &gpu_pod(json!({})));
    assert!(outcome.patch.iter().all(|op| !op.path().starts_with("/spec/affinity")), "{:?}", outcome.patch);
}

#[test]
fn placements_can_be_conditional_on_cel() {
    let policies = with_extra(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: premium}
spec:
  when: "has(object.metadata.labels) && object.metadata.labels['allot.dev/tier'] == 'premium'"
  nodeSelector: {node-type: h100}
"#,
    );
    let mut pod = gpu_pod(json!({}));
    let plain = engine_mutate(&policies, &pod);
    assert!(plain.patch.iter().all(|op| op.path() != "/spec/nodeSelector"), "{:?}", plain.patch);
    pod["metadata"]["labels"] = json!({"allot.dev/tier": "premium"});
    let premium = engine_mutate(&policies, &pod);
    let mutated = allot::model::patch::apply(&pod, &premium.patch).unwrap();
    assert_eq!(mutated["spec"]["nodeSelector"], json!({"node-type": "h100"}));

    // A condition that errors is a denial, never a silently skipped placement.
    let broken = with_extra(
        "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: broken}\nspec:\n  when: object.metadata.nope == 1\n  nodeSelector: {a: b}\n",
    );
    let outcome = engine_mutate(&broken, &gpu_pod(json!({})));
    assert!(!outcome.allowed());
    assert!(outcome.findings[0].message.contains("spec.when could not be evaluated"));
}

#[test]
fn team_label_selectors_use_namespace_labels() {
    let policies = shipped();
    let labels = allot::model::namespaces::StaticNamespaces(
        [("ml-east".to_string(), [("team".to_string(), "nlp".to_string())].into_iter().collect())]
            .into_iter()
            .collect(),
    );
    let engine = Engine::new(&policies, &labels);
    let lookup = allot::model::namespaces::team_of(&policies, "ml-east", &labels);
    assert_eq!(lookup.team.map(|t| t.name.as_str()), Some("nlp"));
    assert!(lookup.undecided.is_none());
    let mut pod = gpu_pod(json!({"priorityClassName": "high-priority"}));
    pod["metadata"]["namespace"] = json!("ml-east");
    let outcome = engine.validate(&Request {
        uid: "test",
        operation: RequestOperation::Create,
        group: "",
        kind: "Pod",
        namespace: "ml-east",
        object: &pod,
        old_object: None,
        dry_run: false,
        username: "u",
        groups: &[],
    });
    assert!(outcome.findings.iter().any(|f| f.rule == "team/priority-class"), "{:?}", outcome.findings);
    assert!(outcome.notes.is_empty(), "{:?}", outcome.notes);
}

mod gangs {
    use super::*;

    fn gate_ops(response: &Value) -> Vec<Value> {
        patch_of(response)
            .map(|p| serde_json::to_value(&p).unwrap().as_array().unwrap().clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|op| op["path"].as_str().unwrap().starts_with("/spec/schedulingGates"))
            .collect()
    }

    #[test]
    fn a_gang_member_is_gated_once() {
        let policies = shipped();
        // Fixture 018 was captured with the gate already set: nothing to add.
        let review = fixture("018-mutate-create-pod-gated-worker-0.json");
        assert!(gate_ops(&answer(&policies, &review, Phase::Mutate)).is_empty());
        // Without it, the gate is added, and the pod parses with it.
        let mut object = review["request"]["object"].clone();
        object["spec"].as_object_mut().unwrap().remove("schedulingGates");
        let review = with_object(&review, object.clone());
        let response = answer(&policies, &review, Phase::Mutate);
        assert_eq!(
            gate_ops(&response),
            vec![json!({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "allot.dev/gang"}]})]
        );
        let pod: Pod = serde_json::from_value(apply(&object, &patch_of(&response).unwrap())).unwrap();
        assert_eq!(pod.spec.unwrap().scheduling_gates.unwrap()[0].name, "allot.dev/gang");
        // Other gates are kept, ours appended.
        object["spec"]["schedulingGates"] = json!([{"name": "example.com/other"}]);
        let response = answer(&policies, &with_object(&review, object), Phase::Mutate);
        assert_eq!(
            gate_ops(&response),
            vec![json!({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "allot.dev/gang"}})]
        );
    }

    #[test]
    fn kueue_pod_groups_migrate_unchanged_and_kueue_managed_pods_are_left_alone() {
        let policies = shipped();
        let mut object = fixture("012-mutate-create-pod-plain-cpu-pod.json")["request"]["object"].clone();
        object["metadata"]["labels"] = json!({"kueue.x-k8s.io/pod-group-name": "pg"});
        object["metadata"]["annotations"] = json!({"kueue.x-k8s.io/pod-group-total-count": "3"});
        let review = with_object(&fixture("012-mutate-create-pod-plain-cpu-pod.json"), object.clone());
        assert_eq!(gate_ops(&answer(&policies, &review, Phase::Mutate)).len(), 1);
        object["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        let review = with_object(&review, object);
        let kueue = with_cluster_spec("externalSchedulers: [Kueue]");
        assert!(gate_ops(&answer(&kueue, &review, Phase::Mutate)).is_empty(), "Kueue owns this pod");
        // Where the cluster does not say it runs Kueue, its gate alone exempts nothing.
        assert_eq!(gate_ops(&answer(&policies, &review, Phase::Mutate)).len(), 1);
    }

    #[test]
    fn bound_pods_are_never_gated_and_bad_sizes_are_denied() {
        let policies = shipped();
        let review = fixture("018-mutate-create-pod-gated-worker-0.json");
        let mut object = review["request"]["object"].clone();
        object["spec"].as_object_mut().unwrap().remove("schedulingGates");
        object["spec"]["nodeName"] = json!("gpu-node-1");
        assert!(gate_ops(&answer(&policies, &with_object(&review, object.clone()), Phase::Mutate)).is_empty());

        object["spec"].as_object_mut().unwrap().remove("nodeName");
        object["metadata"]["annotations"]["allot.dev/gang-size"] = json!("zero");
        for phase in [Phase::Mutate, Phase::Validate] {
            let response = answer(&policies, &with_object(&review, object.clone()), phase);
            assert_eq!(response["allowed"], false);
            let message = response["status"]["message"].as_str().unwrap();
            assert!(
                message
                    .contains("[gang/metadata] metadata: allot.dev/gang-size must be a positive integer, got \"zero\""),
                "{message}"
            );
        }
    }

    #[test]
    fn a_job_template_with_bad_gang_metadata_is_denied_at_apply() {
        let policies = shipped();
        let mut review = fixture("009-validate-create-job-gang-a.json");
        assert_eq!(answer(&policies, &review, Phase::Validate)["allowed"], true);
        review["request"]["object"]["spec"]["template"]["metadata"]["annotations"]["allot.dev/gang-size"] = json!("-4");
        let response = answer(&policies, &review, Phase::Validate);
        assert_eq!(response["allowed"], false);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(message.contains("spec.template.metadata: allot.dev/gang-size"));
        // Once, at the template's path (the mutation preview used to add a copy at `metadata`).
        assert_eq!(message.matches("[gang/metadata]").count(), 1, "{message}");
    }

    #[test]
    fn members_must_agree_with_existing_members() {
        let policies = shipped();
        let review = fixture("019-validate-create-pod-gated-worker-0.json");
        let peer = |size: u32, class: &str| allot::admission::directory::Peer {
            pod: "gated-worker-1".into(),
            size: Some(size),
            priority_class: Some(class.into()),
            scheduler_name: Some("default-scheduler".into()),
        };
        let agree = allot::admission::directory::StaticGangs(
            [(("vision".to_string(), "gang-b".to_string()), vec![peer(2, "low-priority")])].into_iter().collect(),
        );
        let disagree = allot::admission::directory::StaticGangs(
            [(("vision".to_string(), "gang-b".to_string()), vec![peer(3, "low-priority")])].into_iter().collect(),
        );
        let body = serde_json::to_vec(&review).unwrap();
        let engine = Engine::new(&policies, &NoNamespaces).with_gangs(&agree);
        assert!(admission::review(&body, Phase::Validate, &engine).unwrap().allowed);
        let engine = Engine::new(&policies, &NoNamespaces).with_gangs(&disagree);
        let answer = admission::review(&body, Phase::Validate, &engine).unwrap();
        assert!(!answer.allowed);
        let f = &answer.outcome.findings[0];
        assert_eq!(f.rule, "gang/consistency");
        assert_eq!(
            f.message,
            "gang vision/gang-b: this pod has size 2, member gated-worker-1 has 3; all members of a gang must agree"
        );
    }
}

/// `allot check` resolves DRA claims among the manifests it is given: a Pod whose template is
/// among them is placed and counted; one whose template is not is denied, saying so.
/// Pod `name` in vision whose one container uses its one claim, `entry` (a `spec.resourceClaims`
/// entry: its name, and the claim or template it names).
fn claiming_pod(name: &str, entry: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision"},
        "spec": {
            "resourceClaims": [entry.clone()],
            "containers": [{"name": "c", "image": "ghcr.io/example/train:1.0.0", "resources": {"claims": [{"name": entry["name"]}]}}]
        }
    })
}

/// ResourceClaimTemplate `name` in vision asking `count` devices of class gpu.nvidia.com.
fn gpu_template(name: &str, count: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "vision"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}
        ]}}}
    })
}

/// `objects` as the documents 1, 2, … of file `source`, for `allot check`.
fn manifests(source: &str, objects: Vec<Value>) -> Vec<allot::cli::check::Manifest> {
    let numbered = objects.into_iter().zip(1..);
    numbered
        .map(|(object, document)| allot::cli::check::Manifest { source: source.into(), document, line: 0, object })
        .collect()
}

#[test]
fn check_resolves_claim_templates_among_its_manifests() {
    let template = gpu_template("two-gpus", 2);
    let pod =
        |name: &str, template: &str| claiming_pod(name, json!({"name": "gpus", "resourceClaimTemplateName": template}));
    let policies = shipped();
    let engine = Engine::new(&policies, &NoNamespaces);
    let manifests = manifests("dra.yaml", vec![template, pod("placed", "two-gpus"), pod("ghost", "gone")]);
    let report = allot::cli::check::run(&engine, &manifests);
    let by_name = |name: &str| report.results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name}"));
    let placed = by_name("placed");
    assert!(placed.allowed, "{:?}", placed.findings);
    assert!(
        placed.patch.iter().any(|op| serde_json::to_string(op).unwrap().contains("nvidia.com/gpu")),
        "the GPU toleration: {:?}",
        placed.patch
    );
    let ghost = by_name("ghost");
    assert!(!ghost.allowed);
    let f = ghost.findings.iter().find(|f| f.rule == "accelerators/claims").expect("accelerators/claims");
    assert_eq!(f.path, "spec.resourceClaims[0]");
    assert!(f.message.contains("references ResourceClaimTemplate \"gone\", not among the manifests"), "{}", f.message);
    // Without the template among the manifests the first pod is denied too: never free.
    let alone = allot::cli::check::run(&engine, &manifests[1..2]);
    assert!(!alone.results[0].allowed);
}

/// A ResourceClaim a tenant annotates as the scheduler's extended-resource claim and names in
/// her pod's `spec.resourceClaims` counts by its devices: the pod is placed like any GPU pod and
/// held to `maxPerPod` (before: skipped for the annotation, so 9 GPUs passed the 8-GPU check
/// and 8 got no placement).
#[test]
fn a_forged_extended_resource_claim_is_placed_and_checked() {
    let claim = |name: &str, count: u32| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "vision",
                         "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"}},
            "spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}
            ]}}
        })
    };
    let pod = |name: &str, claim: &str| claiming_pod(name, json!({"name": "g", "resourceClaimName": claim}));
    let policies = shipped();
    let engine = Engine::new(&policies, &NoNamespaces);
    let manifests =
        manifests("forged.yaml", vec![claim("free", 8), claim("freer", 9), pod("eight", "free"), pod("nine", "freer")]);
    let report = allot::cli::check::run(&engine, &manifests);
    let by_name = |name: &str| report.results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("{name}"));
    let eight = by_name("eight");
    assert!(
        eight.patch.iter().any(|op| serde_json::to_string(op).unwrap().contains("nvidia.com/gpu")),
        "the GPU toleration: {:?}",
        eight.patch
    );
    let nine = by_name("nine");
    assert!(!nine.allowed, "9 claim GPUs over maxPerPod 8: {:?}", nine.findings);
    assert!(nine.findings.iter().any(|f| f.message.contains("nvidia.com/gpu")), "{:?}", nine.findings);
}

/// At CREATE a pod's `status` is the requester's (the API server resets it only after the
/// mutating webhooks): a tenant's status naming a small claim "made from" her 9-GPU template,
/// owned by the UID she wrote, does not stand for the template. The template is counted, and
/// the pod is held to `maxPerPod` and placed.
#[test]
fn a_created_pods_status_does_not_replace_its_template() {
    let template = gpu_template("nine", 9);
    let tiny = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "tiny", "namespace": "vision",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "forged", "controller": true}]},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}
    });
    let mut pod = claiming_pod("p", json!({"name": "g", "resourceClaimTemplateName": "nine"}));
    pod["metadata"]["uid"] = json!("forged");
    pod["status"] = json!({"resourceClaimStatuses": [{"name": "g", "resourceClaimName": "tiny"}]});
    let policies = shipped();
    let engine = Engine::new(&policies, &NoNamespaces);
    let report = allot::cli::check::run(&engine, &manifests("status.yaml", vec![template, tiny, pod]));
    let result = report.results.iter().find(|r| r.name == "p").expect("the pod");
    assert!(!result.allowed, "9 template GPUs over maxPerPod 8: {:?}", result.findings);
    assert!(result.findings.iter().any(|f| f.message.contains("nvidia.com/gpu")), "{:?}", result.findings);
}

/// `pod` as the mutating webhook leaves it, claims and PodGroups looked up in `claims`.
fn mutated_with(policies: &PolicySet, pod: &Value, claims: &dyn allot::model::dra::ClaimSource) -> Pod {
    let outcome = mutate_as(&Engine::new(policies, &NoNamespaces).with_claims(claims), pod, "alice");
    let patch: json_patch::Patch = serde_json::from_value(json!(outcome.patch)).expect("a JSON Patch");
    serde_json::from_value(apply(pod, &patch)).expect("a Pod")
}

/// Allot's gang gate and the native PodGroup named, of a mutated Pod.
fn gate_and_group(pod: &Pod) -> (bool, Option<String>) {
    let spec = pod.spec.as_ref();
    let gated =
        spec.and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.name == "allot.dev/gang"));
    (gated, spec.and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.clone()))
}

/// A cluster source that gangs native PodGroups (as `allot serve` once discovery shows them).
struct NativeGangs;

impl allot::model::dra::ClaimSource for NativeGangs {
    fn template(&self, _: &str, _: &str) -> Option<std::sync::Arc<Value>> {
        None
    }
    fn claim(&self, _: &str, _: &str) -> Option<std::sync::Arc<Value>> {
        None
    }
    fn schedules_native_gangs(&self) -> bool {
        true
    }
}

/// A gang member naming a native PodGroup is left ungated only where the cluster gangs native
/// PodGroups: elsewhere the API server drops `spec.schedulingGroup` after the mutating webhook
/// has seen it, and a tenant could name any PodGroup to keep her gang from its gate.
#[test]
fn a_pod_group_name_takes_no_gang_member_from_its_gate_unless_the_cluster_gangs_them() {
    let policies = shipped();
    let mut member = gpu_pod(json!({"schedulingGroup": {"podGroupName": "anything"}}));
    member["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
    member["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
    // No cluster that gangs them (no source, or a server whose discovery did not show them).
    assert!(gate_and_group(&mutated_with(&policies, &member, &allot::model::dra::NoClaims)).0);
    assert!(!gate_and_group(&mutated_with(&policies, &member, &NativeGangs)).0);
    // Manifests, as `allot check` takes them: the pod is in its PodGroup.
    let manifests = allot::model::dra::ClaimObjects::new("not among the manifests");
    assert!(!gate_and_group(&mutated_with(&policies, &member, &manifests)).0);
}

/// GangPolicy `nativeScheduling`: an inferred gang's member names the PodGroup Allot's leader
/// creates (`allot-` + the gang) instead of getting Allot's gate, only where the cluster gangs
/// native PodGroups; the patch is idempotent (a second pass adds nothing); a gang named by
/// labels keeps Allot's gate.
#[test]
fn native_scheduling_hands_inferred_gangs_to_the_scheduler_where_it_can() {
    let mut sources = policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let hand_off = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: hand-off}\nspec:\n  \
                    match: {namespaces: [vision]}\n  infer: [Job]\n  nativeScheduling: true\n";
    // First: the first GangPolicy that matches wins.
    sources.insert(0, Source { name: "hand-off.yaml".into(), text: hand_off.into() });
    let policies = policy::compile(&sources).unwrap_or_else(|e| panic!("{e}"));
    let mut worker = gpu_pod(json!({}));
    worker["metadata"]["labels"] =
        json!({"batch.kubernetes.io/job-name": "train", "batch.kubernetes.io/job-completion-index": "0"});
    worker["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u"}]);

    let handed = mutated_with(&policies, &worker, &NativeGangs);
    assert_eq!(gate_and_group(&handed), (false, Some("allot-job-train".to_string())));
    let again = serde_json::to_value(&handed).unwrap();
    assert_eq!(mutated_with(&policies, &again, &NativeGangs), handed, "a reinvocation changes nothing");
    // Where the cluster does not gang them, Allot gates the gang itself.
    assert_eq!(gate_and_group(&mutated_with(&policies, &worker, &allot::model::dra::NoClaims)), (true, None));
    // A gang named by labels is Allot's to gate, whatever the policy says.
    let mut labelled = gpu_pod(json!({}));
    labelled["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
    labelled["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
    assert_eq!(gate_and_group(&mutated_with(&policies, &labelled, &NativeGangs)), (true, None));
}

/// A workload template's preview (the mutated spec written over the template, no patch built)
/// is the Pod the API server makes of it: the template as a Pod, mutated by `/mutate`'s JSON
/// Patch, applied. Every example and captured workload, in every namespace they name and in a
/// team's.
#[test]
fn a_templates_preview_is_its_pod_patched() {
    let policies = shipped();
    let engine = Engine::new(&policies, &NoNamespaces);
    let examples =
        allot::cli::check::read_manifests(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")]).unwrap();
    let mut objects: Vec<Value> = examples.into_iter().map(|m| m.object).collect();
    let reviews = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews");
    for entry in std::fs::read_dir(&reviews).expect("fixtures") {
        let name = entry.expect("fixture").file_name().to_string_lossy().into_owned();
        objects.push(fixture(&name)["request"]["object"].clone());
    }
    let mut in_vision = objects.clone();
    for object in &mut in_vision {
        object["metadata"]["namespace"] = json!("vision");
    }
    objects.extend(in_vision);
    let (mut templates, mut mutated) = (0, 0);
    for object in &objects {
        // As alice, whom no identity exempts: a template's preview knows no identity either.
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
        let req = create_request(object, namespace, "alice");
        let views = allot::model::workload::pods_of(object, req.group, req.kind);
        let previews = engine.pods_as_created(&req);
        assert_eq!(views.len(), previews.len());
        for (view, preview) in views.iter().zip(&previews) {
            if view.path.is_empty() {
                continue;
            }
            templates += 1;
            let patch = engine.mutate(&create_request(&view.pod, namespace, "alice")).patch;
            mutated += usize::from(!patch.is_empty());
            let patched = allot::model::patch::apply(&view.pod, &patch).expect("the patch applies");
            assert_eq!(*preview.pod, patched, "{} in {}", view.path, req.namespace);
        }
    }
    assert!(templates >= 20 && mutated >= 10, "{templates} templates, {mutated} mutated");
}
