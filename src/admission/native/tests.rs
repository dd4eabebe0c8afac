//! The emitted objects parse as k8s-openapi types, every CEL expression in them parses in the
//! `cel` crate, the validations say what the engine says on sample Pods (evaluated with the
//! Kubernetes CEL libraries), and the report is right for the shipped policies.

use std::path::Path;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::{Context, Program, Value as CelValue};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};

use super::*;
use crate::model::expression::json_to_cel;
use crate::model::policy::{Action, Source, load_dir};

/// `pod` through the engine as the dry-run CREATE `allot check` makes of a manifest (in the
/// pod's own namespace).
fn admit_pod(engine: &crate::admission::engine::Engine<'_>, pod: &Value) -> crate::admission::engine::Admission {
    use crate::admission::request::{Request, RequestOperation};
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    engine.admit(&Request {
        uid: "",
        operation: RequestOperation::Create,
        group: "",
        kind: "Pod",
        namespace,
        object: pod,
        old_object: None,
        dry_run: true,
        username: "allot-check",
        groups: &[],
    })
}

/// What both phases of an admission report.
fn reported(
    admission: &crate::admission::engine::Admission,
) -> impl Iterator<Item = &crate::admission::finding::Finding> {
    admission.mutation.findings.iter().chain(&admission.validation.findings)
}

/// Runs `f` on a thread with a large stack: the expanded accelerator counts nest a dozen
/// comprehensions, deeper than the `cel` crate's recursive parser and interpreter fit in a
/// test thread's 2 MiB in a debug build (the API server's Go stacks grow).
fn on_big_stack(f: impl FnOnce() + Send + 'static) {
    let handle = std::thread::Builder::new().stack_size(256 << 20).spawn(f).expect("thread");
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

fn shipped() -> PolicySet {
    load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).expect("shipped policies load")
}

fn policies(text: &str) -> PolicySet {
    crate::model::policy::compile(&[Source { name: "test.yaml".into(), text: text.into() }]).expect("policies compile")
}

#[test]
fn every_object_round_trips_through_its_k8s_openapi_type() {
    let compiled = compile(&shipped());
    assert!(!compiled.objects.is_empty());
    let mut names = std::collections::BTreeSet::new();
    for object in &compiled.objects {
        let json = object.to_json().expect("serializes");
        assert_eq!(json["apiVersion"], "admissionregistration.k8s.io/v1", "{json}");
        let kind = json["kind"].as_str().unwrap_or_default().to_string();
        let back = match kind.as_str() {
            "MutatingAdmissionPolicy" => serde_json::from_value::<MutatingAdmissionPolicy>(json.clone()).map(|_| ()),
            "MutatingAdmissionPolicyBinding" => {
                serde_json::from_value::<MutatingAdmissionPolicyBinding>(json.clone()).map(|_| ())
            }
            "ValidatingAdmissionPolicy" => {
                serde_json::from_value::<ValidatingAdmissionPolicy>(json.clone()).map(|_| ())
            }
            "ValidatingAdmissionPolicyBinding" => {
                serde_json::from_value::<ValidatingAdmissionPolicyBinding>(json.clone()).map(|_| ())
            }
            other => panic!("unexpected kind {other}"),
        };
        back.unwrap_or_else(|e| panic!("{kind} {} does not parse: {e}", object.name()));
        assert!(names.insert((kind, object.name().to_string())), "{} emitted twice", object.name());
    }
    // Every policy has its binding, of the same name.
    for object in &compiled.objects {
        let binding = match object {
            NativeObject::MutatingPolicy(_) => "MutatingAdmissionPolicyBinding",
            NativeObject::ValidatingPolicy(_) => "ValidatingAdmissionPolicyBinding",
            _ => continue,
        };
        assert!(names.contains(&(binding.to_string(), object.name().to_string())), "{} has no binding", object.name());
    }
    // The YAML stream parses back into as many documents.
    let yaml = compiled.to_yaml().expect("yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("yaml parses");
    assert_eq!(docs.len(), compiled.objects.len());
}

#[test]
fn every_expression_parses_in_the_cel_crate() {
    on_big_stack(every_expression_parses_in_the_cel_crate_body);
}

fn every_expression_parses_in_the_cel_crate_body() {
    let extra = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: speech}
spec:
  namespaces: {names: [speech, "sp?-*"], selector: {matchLabels: {team: speech}, matchExpressions: [{key: tier, operator: NotIn, values: [free]}]}}
  priority: {default: low-priority, allowed: [low-priority]}
---
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: pool}
spec:
  match: {teams: [speech], namespaces: ["sp*"]}
  when: "has(object.metadata.labels) && 'train' in object.metadata.labels"
  tolerations: [{key: pool, operator: Equal, value: a100, effect: NoExecute, tolerationSeconds: 60}]
  nodeSelector: {example.com/pool: a100}
  nodeAffinity: [{key: zone, operator: In, values: [a, b.c]}, {key: spot, operator: DoesNotExist}]
  onConflict: Keep
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: team-label}
spec:
  match: {kinds: [Pod, batch/Job], teams: [speech]}
  expression: "has(object.metadata.labels) && object.metadata.labels['team'] == team && namespace != ''"
  messageExpression: "'pod ' + object.metadata.name + ' needs label team=' + team"
  action: Warn
"#;
    for set in [shipped(), policies(extra)] {
        let compiled = compile(&set);
        let mut count = 0;
        for object in &compiled.objects {
            for (place, expression) in object.expressions() {
                count += 1;
                parse(&expression).unwrap_or_else(|e| panic!("{} {place}: {e}\n{expression}", object.name()));
            }
        }
        assert!(count > 10, "only {count} expressions");
    }
    let compiled = compile(&policies(extra));
    let report = compiled.report_text();
    assert!(report.contains("Rule/team-label: compiled"), "{report}");
    assert!(report.contains("Placement/pool: compiled"), "{report}");
    let names: Vec<&str> = compiled.objects.iter().map(NativeObject::name).collect();
    assert!(names.contains(&"allot-rule-team-label-kind-batch-job"), "{names:?}");
    assert!(names.contains(&"allot-placement-pool-conflicts"), "{names:?}");
}

#[test]
fn the_report_for_the_shipped_policies() {
    let compiled = compile(&shipped());
    let status = |policy: &str| {
        compiled.coverage.iter().find(|c| c.policy.to_string() == policy).map(Coverage::status).unwrap_or("missing")
    };
    // reserveTolerations stays with the webhook: a node's taints are cluster state.
    assert_eq!(status("Placement/nvidia-gpu"), "partly compiled");
    assert_eq!(status("Placement/amd-gpu"), "partly compiled");
    assert_eq!(status("default priority class"), "compiled");
    assert_eq!(status("Team priority classes"), "compiled");
    assert_eq!(status("Cluster/accelerators.checks"), "compiled", "max-per-pod is expanded");
    assert_eq!(status("Rule/pinned-images-on-gpus"), "compiled", "accelerators(c) of a container is expanded");
    for rule in ["gpu-pods-belong-to-a-team", "high-priority-is-audited"] {
        assert_eq!(status(&format!("Rule/{rule}")), "compiled", "accelerators(object) is expanded: {rule}");
    }
    assert_eq!(status("Team/vision"), "webhook-only");
    assert_eq!(status("GangPolicy/default"), "webhook-only");
    assert_eq!(status("Cluster/dra"), "webhook-only", "claim Pods are the webhook's: {}", compiled.report_text());
    assert!(!compiled.fully_native());
    let checks = compiled.coverage.iter().find(|c| c.policy == super::Subject::AcceleratorChecks).map(|c| &c.compiled);
    assert!(
        checks.is_some_and(|c| c
            .iter()
            .any(|l| l.part == super::Part::Check(crate::admission::finding::Check::MaxPerPod)
                && l.text.starts_with("max-per-pod (deny)"))),
        "{checks:?}"
    );
}

#[test]
fn a_policy_set_without_stateful_parts_is_fully_native() {
    let set = policies(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  accelerators: {checks: {requestsEqualLimits: Deny}}
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: no-latest}
spec:
  expression: "object.spec.containers.all(c, !c.image.endsWith(':latest'))"
  message: no latest
"#,
    );
    let compiled = compile(&set);
    assert!(compiled.fully_native(), "{}", compiled.report_text());
    assert!(
        compiled
            .coverage
            .iter()
            .any(|c| c.policy == super::Subject::Rule("no-latest".into()) && c.status() == "compiled")
    );
}

/// Every policy skips Allot's own identity (the webhooks' `not-allot-itself`), with the name
/// it is given, and nothing else changes: bindings have no conditions of their own.
#[test]
fn every_policy_skips_allot_itself_and_nothing_else_moves() {
    let set = shipped();
    let plain = compile(&set);
    let named = compile_for(&set, "system:serviceaccount:gpu-ops:allot");
    assert_eq!(plain.objects.len(), named.objects.len());
    assert_eq!(plain.report_text(), named.report_text());
    let mut policies = 0;
    for object in &named.objects {
        let conditions = match object {
            NativeObject::MutatingPolicy(o) => o.spec.as_ref().and_then(|s| s.match_conditions.clone()),
            NativeObject::ValidatingPolicy(o) => o.spec.as_ref().and_then(|s| s.match_conditions.clone()),
            NativeObject::MutatingBinding(_) | NativeObject::ValidatingBinding(_) => continue,
        };
        policies += 1;
        let skip: Vec<_> = conditions.iter().flatten().filter(|c| c.name == "not-allot-itself").collect();
        assert_eq!(skip.len(), 1, "{}", object.name());
        assert_eq!(
            skip[0].expression,
            r#"request.userInfo.username != "system:serviceaccount:" + "gpu-ops" + ":" + "allot""#
        );
        assert!(conditions.iter().flatten().any(|c| c.name == "not-kubelet"), "{}", object.name());
    }
    assert!(policies > 10, "{policies}");
    // The condition is a real CEL condition: Allot's request is skipped, a tenant's is not.
    let skip = r#"request.userInfo.username != "system:serviceaccount:" + "gpu-ops" + ":" + "allot""#;
    for (user, matched) in [("system:serviceaccount:gpu-ops:allot", false), ("alice", true)] {
        let mut ctx = Context::default();
        ctx.add_variable_from_value("request", json_to_cel(&json!({"userInfo": {"username": user}})));
        let program = Program::compile(skip).expect("compiles");
        assert_eq!(program.execute(&ctx).expect("evaluates"), CelValue::Bool(matched), "{user}");
    }
}

/// A Kubernetes CEL context with `object`, `request` and `namespaceObject` bound.
fn context(object: &Value, namespace: &str, labels: Value) -> Context<'static> {
    let mut ctx = Context::default();
    ctx.register_all();
    crate::model::expression::quantity::register(&mut ctx);
    ctx.add_variable_from_value("object", json_to_cel(object));
    ctx.add_variable_from_value("request", json_to_cel(&json!({"namespace": namespace, "operation": "CREATE"})));
    ctx.add_variable_from_value(
        "namespaceObject",
        json_to_cel(&json!({"metadata": {"name": namespace, "labels": labels}})),
    );
    ctx
}

/// Parses as the API server does: with CEL's optional syntax (`{?'k': x.?k}`), which
/// Kubernetes enables and `Program::compile` does not.
fn parse(expression: &str) -> Result<kube::core::cel::cel::IdedExpr, kube::core::cel::cel::ParseErrors> {
    kube::core::cel::cel::parser::Parser::default().enable_optional_syntax(true).parse(expression)
}

fn eval(ctx: &Context<'_>, expression: &str) -> CelValue {
    let parsed = parse(expression).unwrap_or_else(|e| panic!("{e}: {expression}"));
    CelValue::resolve(&parsed, ctx).unwrap_or_else(|e| panic!("{e}: {expression}"))
}

/// Evaluates a validating policy as the API server would: variables in order, then every
/// validation; true when all pass.
fn admits(policy: &ValidatingAdmissionPolicy, object: &Value, namespace: &str) -> bool {
    admits_in(policy, object, namespace, json!({}))
}

/// [`admits`] in a namespace with `labels`.
fn admits_in(policy: &ValidatingAdmissionPolicy, object: &Value, namespace: &str, labels: Value) -> bool {
    let ctx = bound(policy, object, namespace, labels);
    policy
        .spec
        .iter()
        .flat_map(|s| s.validations.iter().flatten())
        .all(|v| eval(&ctx, &v.expression) == CelValue::Bool(true))
}

/// [`context`] with the policy's `variables` evaluated in order, as the API server binds them.
fn bound(policy: &ValidatingAdmissionPolicy, object: &Value, namespace: &str, labels: Value) -> Context<'static> {
    let mut ctx = context(object, namespace, labels);
    let mut variables = std::collections::HashMap::new();
    for v in policy.spec.iter().flat_map(|s| s.variables.iter().flatten()) {
        ctx.add_variable_from_value("variables", variables_value(&variables));
        variables.insert(v.name.clone(), eval(&ctx, &v.expression));
    }
    ctx.add_variable_from_value("variables", variables_value(&variables));
    ctx
}

fn variables_value(vars: &std::collections::HashMap<String, CelValue>) -> CelValue {
    let map: std::collections::HashMap<String, CelValue> = vars.clone();
    CelValue::Map(map.into())
}

fn engine_denies(set: &PolicySet, object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    let group = crate::model::workload::group_of(object["apiVersion"].as_str().unwrap_or_default());
    crate::model::workload::pods_of(object, group, kind).iter().any(|view| {
        let team = crate::model::namespaces::team_of(set, "nlp", &crate::model::namespaces::NoNamespaces);
        crate::admission::validate::check_pod(set, view, &team)
            .iter()
            .any(|f| f.action == Action::Deny && f.rule.as_str().starts_with("accelerators/"))
    })
}

#[test]
fn accelerator_checks_agree_with_the_engine_on_pods_and_templates() {
    on_big_stack(accelerator_checks_agree_with_the_engine_on_pods_and_templates_body);
}

fn accelerator_checks_agree_with_the_engine_on_pods_and_templates_body() {
    let set = shipped();
    let compiled = compile(&set);
    let policy = |name: &str| {
        compiled
            .objects
            .iter()
            .find_map(|o| match o {
                NativeObject::ValidatingPolicy(p) if p.metadata.name.as_deref() == Some(name) => Some(p.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no policy {name}"))
    };
    let container = |resources: Value| json!({"name": "c", "image": "x:1", "resources": resources});
    let pod = |containers: Value, init: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "nlp"},
               "spec": {"containers": containers, "initContainers": init}})
    };
    let cases = [
        pod(
            json!([container(json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}))]),
            json!([]),
        ),
        pod(
            json!([container(json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "2"}}))]),
            json!([]),
        ),
        pod(
            json!([container(json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1000m"}}))]),
            json!([]),
        ),
        pod(json!([container(json!({"requests": {"nvidia.com/mig-1g.10gb": "1"}}))]), json!([])),
        pod(
            json!([container(json!({"limits": {"amd.com/gpu": "500m"}, "requests": {"amd.com/gpu": "500m"}}))]),
            json!([]),
        ),
        pod(json!([container(json!({"limits": {"example.com/fpga": "500m"}}))]), json!([])),
        pod(
            json!([container(json!({}))]),
            json!([container(json!({"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}))]),
        ),
        pod(
            json!([container(json!({}))]),
            json!([{"name": "s", "image": "x:1", "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]),
        ),
    ];
    let denied = cases.iter().filter(|c| engine_denies(&set, c)).count();
    assert!(denied >= 3 && denied < cases.len(), "the cases cover both verdicts ({denied} denied)");
    let pods = policy("allot-accelerators-deny-pod");
    for case in &cases {
        assert_eq!(!admits(&pods, case, "nlp"), engine_denies(&set, case), "Pod {case}");
    }
    // The same Pods as the template of a Kubeflow PyTorchJob (values of a map) and a JobSet (a list).
    let pytorch = policy("allot-accelerators-deny-pytorchjob");
    let jobset = policy("allot-accelerators-deny-jobset");
    for case in &cases {
        let template = json!({"metadata": {}, "spec": case["spec"].clone()});
        let job = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j", "namespace": "nlp"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {"containers": [container(json!({}))]}}},
                                             "Worker": {"replicas": 2, "template": template.clone()}}}});
        assert_eq!(!admits(&pytorch, &job, "nlp"), engine_denies(&set, &job), "PyTorchJob {job}");
        let js = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "j", "namespace": "nlp"},
            "spec": {"replicatedJobs": [{"template": {"spec": {"template": template}}}]}});
        assert_eq!(!admits(&jobset, &js, "nlp"), engine_denies(&set, &js), "JobSet {js}");
    }
}

#[test]
fn the_team_expression_agrees_with_team_lookup() {
    let set = policies(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: vision}
spec: {namespaces: {names: [vision, "vision-*"]}}
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: nlp}
spec: {namespaces: {names: [nlp], selector: {matchLabels: {team: nlp}, matchExpressions: [{key: tier, operator: NotIn, values: [free]}]}}}
"#,
    );
    let team = cel::team(&set).expect("expressible");
    let labels = crate::model::namespaces::from_manifests(
        "ns.yaml",
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: research, labels: {team: nlp}}
---
apiVersion: v1
kind: Namespace
metadata: {name: free-research, labels: {team: nlp, tier: free}}
---
apiVersion: v1
kind: Namespace
metadata: {name: vision-labelled, labels: {team: nlp}}
"#,
    )
    .expect("namespaces");
    let label_json = |ns: &str| match ns {
        "research" => json!({"team": "nlp"}),
        "free-research" => json!({"team": "nlp", "tier": "free"}),
        "vision-labelled" => json!({"team": "nlp"}),
        _ => json!({}),
    };
    for ns in ["vision", "vision-x", "visionary", "nlp", "research", "free-research", "vision-labelled", "other"] {
        let expected =
            crate::model::namespaces::team_of(&set, ns, &labels).team.map(|t| t.name.clone()).unwrap_or_default();
        let got = eval(&context(&json!({}), ns, label_json(ns)), &team);
        assert_eq!(got, CelValue::String(expected.into()), "namespace {ns}");
    }
}

#[test]
fn a_kind_without_a_group_binds_every_kind_of_that_name_under_distinct_names() {
    let set = policies(
        r#"
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: Jobs_Need_Labels}
spec:
  match: {kinds: [Job]}
  expression: "has(object.metadata.labels)"
  message: label your jobs
"#,
    );
    let compiled = compile(&set);
    let names: Vec<&str> = compiled.objects.iter().map(NativeObject::name).collect();
    assert!(names.contains(&"allot-rule-jobs-need-labels-kind-batch-job"), "{names:?}");
    assert!(names.contains(&"allot-rule-jobs-need-labels-kind-batch.volcano.sh-job"), "{names:?}");
    let policies: Vec<&str> = compiled
        .objects
        .iter()
        .filter(|o| matches!(o, NativeObject::ValidatingPolicy(_)))
        .map(NativeObject::name)
        .collect();
    let unique: std::collections::BTreeSet<_> = policies.iter().collect();
    assert_eq!(unique.len(), policies.len(), "{policies:?}");
}

/// The shipped Warn rule that counts a container's accelerators (`accelerators(c)`, expanded
/// into quantity arithmetic) warns exactly when the engine does.
#[test]
fn an_expanded_accelerator_count_agrees_with_the_engine() {
    on_big_stack(an_expanded_accelerator_count_agrees_with_the_engine_body);
}

fn an_expanded_accelerator_count_agrees_with_the_engine_body() {
    let set = shipped();
    let compiled = compile(&set);
    let policy = compiled
        .objects
        .iter()
        .find_map(|o| match o {
            NativeObject::ValidatingPolicy(p)
                if p.metadata.name.as_deref() == Some("allot-rule-pinned-images-on-gpus-pod") =>
            {
                Some(p.clone())
            }
            _ => None,
        })
        .expect("compiled");
    let engine = crate::admission::engine::Engine::new(&set, &crate::model::namespaces::NoNamespaces);
    let mut warned = 0;
    for (image, resources) in [
        ("train:latest", json!({"limits": {"nvidia.com/gpu": "1"}})),
        ("train:latest", json!({"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "0"}})),
        ("train:latest", json!({"requests": {"nvidia.com/mig-1g.10gb": "500m"}})),
        ("train:latest", json!({"limits": {"example.com/fpga": "1"}})),
        ("train:latest", json!({})),
        ("registry:5000/train", json!({"limits": {"amd.com/gpu": "2"}})),
        ("registry:5000/train:v1", json!({"limits": {"amd.com/gpu": "2"}})),
        ("train@sha256:abc", json!({"limits": {"nvidia.com/gpu": "1"}})),
    ] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "vision"},
            "spec": {"containers": [{"name": "c", "image": image, "resources": resources}]}});
        let admitted = admit_pod(&engine, &pod);
        let engine_warns = reported(&admitted).any(|f| f.rule.as_str() == "pinned-images-on-gpus");
        warned += usize::from(engine_warns);
        assert_eq!(!admits(&policy, &admitted.mutated, "vision"), engine_warns, "{image} {resources}");
    }
    assert!((2..8).contains(&warned), "both answers occur ({warned})");
}

/// A random container: each of a few resource names (accelerators and not) absent, requested,
/// limited or both, with quantities that are whole, fractional, binary-suffixed or plain JSON
/// numbers.
fn arb_container(name: String) -> impl Strategy<Value = Value> {
    const NAMES: &[&str] = &["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "amd.com/gpu", "cpu", "example.com/fpga"];
    let quantity = prop_oneof![
        Just(json!("0")),
        Just(json!("1")),
        Just(json!("2")),
        Just(json!("3")),
        Just(json!("8")),
        Just(json!("500m")),
        Just(json!("1500m")),
        Just(json!("250m")),
        Just(json!("0.1")),
        Just(json!("1Ki")),
        Just(json!("999999999n")),
        Just(json!("1e1")),
        Just(json!(2)),
        Just(json!(4)),
    ];
    let entry = (0..4usize, quantity.clone(), quantity);
    (proptest::collection::vec(entry, NAMES.len()), any::<bool>()).prop_map(move |(entries, sidecar)| {
        let (mut requests, mut limits) = (serde_json::Map::new(), serde_json::Map::new());
        for (resource, (which, request, limit)) in NAMES.iter().zip(entries) {
            if which & 1 == 1 {
                requests.insert(resource.to_string(), request);
            }
            if which & 2 == 2 {
                limits.insert(resource.to_string(), limit);
            }
        }
        let mut c = json!({"name": name, "image": "x:1", "resources": {}});
        if !requests.is_empty() {
            c["resources"]["requests"] = Value::Object(requests);
        }
        if !limits.is_empty() {
            c["resources"]["limits"] = Value::Object(limits);
        }
        if sidecar {
            c["restartPolicy"] = json!("Always");
        }
        c
    })
}

/// A random pod spec: 0–3 app containers, 0–4 init containers (any of them a native sidecar,
/// in any order), sometimes an overhead.
fn arb_pod_spec() -> impl Strategy<Value = Value> {
    let containers = |prefix: &'static str, max: usize| {
        proptest::collection::vec(0..1000u32, 0..=max).prop_flat_map(move |ids| {
            ids.iter().enumerate().map(|(i, _)| arb_container(format!("{prefix}{i}"))).collect::<Vec<_>>()
        })
    };
    let overhead = prop_oneof![
        Just(None),
        Just(Some(json!({"nvidia.com/gpu": "500m"}))),
        Just(Some(json!({"cpu": "100m", "amd.com/gpu": "1"})))
    ];
    (containers("app", 3), containers("init", 4), overhead).prop_map(|(mut app, init, overhead)| {
        for c in &mut app {
            // Only init containers may be sidecars.
            if let Some(c) = c.as_object_mut() {
                c.remove("restartPolicy");
            }
        }
        let mut spec = json!({"containers": app, "initContainers": init});
        if let Some(o) = overhead {
            spec["overhead"] = o;
        }
        spec
    })
}

fn validation_of<'p>(
    policy: &'p ValidatingAdmissionPolicy,
    prefix: &str,
) -> &'p k8s_openapi::api::admissionregistration::v1::Validation {
    policy
        .spec
        .iter()
        .flat_map(|s| s.validations.iter().flatten())
        .find(|v| v.message.as_deref().is_some_and(|m| m.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no validation {prefix}"))
}

fn validating_policy(compiled: &Compiled, name: &str) -> ValidatingAdmissionPolicy {
    compiled
        .objects
        .iter()
        .find_map(|o| match o {
            NativeObject::ValidatingPolicy(p) if p.metadata.name.as_deref() == Some(name) => Some(p.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no policy {name}"))
}

/// Random pods (init containers, sidecars before and after them, app containers, overhead;
/// quantities such as `2`, `500m`, `1Ki`): the emitted CEL, evaluated in the `cel` crate with
/// the Kubernetes libraries, gives the engine's answers — `accelerators(object)` (its precomputed
/// count), the per-resource effective request of `max-per-pod` with its message's numbers, and
/// the verdicts of the shipped rules that count a Pod's accelerators.
#[test]
fn expanded_pod_counts_agree_with_the_engine() {
    on_big_stack(expanded_pod_counts_agree_with_the_engine_body);
}

fn expanded_pod_counts_agree_with_the_engine_body() {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::Cell;
    let set = shipped();
    let compiled = compile(&set);
    let matcher = set.accelerators.clone();
    let count = Program::compile(&cel::pod_value_units(&matcher, "object")).expect("count compiles");
    let gpus = Program::compile(&cel::pod_resource_units("object.spec", "'nvidia.com/gpu'")).expect("compiles");
    let pods = validating_policy(&compiled, "allot-accelerators-deny-pod");
    let max_per_pod = validation_of(&pods, "[accelerators/max-per-pod]");
    let max_expression = Program::compile(&max_per_pod.expression).expect("max-per-pod compiles");
    let max_message = Program::compile(max_per_pod.message_expression.as_deref().expect("a message expression"))
        .expect("message compiles");
    let team_rule = validating_policy(&compiled, "allot-rule-gpu-pods-belong-to-a-team-pod");
    let engine = crate::admission::engine::Engine::new(&set, &crate::model::namespaces::NoNamespaces);
    // Rules reading the helpers' maps by a literal key (a missing key errors in both) and the
    // Pod's count: the engine's own evaluation against the rewritten expression's.
    let rules = [
        "acceleratorRequests(object)['nvidia.com/gpu'] >= 2",
        "acceleratorRequests(object.spec)['amd.com/gpu'] == 1",
        "acceleratorRequests(object)['cpu'] == 1",
        "object.spec.containers.all(c, acceleratorRequests(c)['nvidia.com/gpu'] <= 1)",
        "object.spec.initContainers.exists(c, acceleratorLimits(c)['nvidia.com/mig-1g.10gb'] == 1)",
        "accelerators(object) <= 3 && accelerators(object.spec) >= 1",
    ];
    let env = crate::model::expression::Environment::new(matcher.clone());
    let rewritten: Vec<(crate::model::expression::Expression, Program)> = rules
        .iter()
        .map(|rule| {
            let native =
                cel::rewrite(rule, cel::Bindings { object: "object", old_object: None, accelerators: &matcher })
                    .unwrap_or_else(|e| panic!("{rule}: {e}"));
            (
                crate::model::expression::Expression::compile(rule).expect("engine compiles"),
                Program::compile(&native).expect("parses"),
            )
        })
        .collect();
    let answered = Cell::new(0);
    let mut runner = TestRunner::new(Config { cases: 300, failure_persistence: None, ..Config::default() });
    let (over, under, teamless_gpu) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let result = runner.run(&arb_pod_spec(), |spec| {
        let pod =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "scratch"}, "spec": spec});
        let ctx = context(&pod, "scratch", json!({}));
        let expected = crate::model::expression::object_accelerators(&pod, None, &matcher).expect("a pod");
        prop_assert_eq!(
            count.execute(&ctx).map_err(|e| e.to_string()),
            Ok(CelValue::Int(expected)),
            "accelerators(object)"
        );
        let asked =
            crate::model::resources::pod_requests(&pod["spec"]).get("nvidia.com/gpu").map_or(0, |q| q.ceil_units());
        prop_assert_eq!(gpus.execute(&ctx).map_err(|e| e.to_string()), Ok(CelValue::Int(asked)), "nvidia.com/gpu");

        for (i, (engine_rule, native_rule)) in rewritten.iter().enumerate() {
            let bindings = crate::model::expression::Bindings {
                vars: u8::MAX,
                object: json_to_cel(&pod),
                old_object: CelValue::Null,
                workload: json_to_cel(&pod),
                namespace: "scratch".into(),
                team: String::new(),
                request: json_to_cel(&json!({"operation": "CREATE"})),
                object_accelerators: None,
            };
            let engine = engine_rule.eval_bool(&env.scope(&bindings), &"t").ok();
            let native = match native_rule.execute(&ctx) {
                Ok(CelValue::Bool(b)) => Some(b),
                _ => None,
            };
            prop_assert_eq!(native, engine, "{}", rules[i]);
            answered.set(answered.get() + usize::from(engine.is_some()));
        }

        // max-per-pod: the validation and its message against the engine's finding.
        let mut vars = std::collections::HashMap::new();
        vars.insert("allotPods".to_string(), CelValue::List(vec![json_to_cel(&pod)].into()));
        vars.insert("allotPaths".to_string(), CelValue::List(vec![CelValue::String(String::new().into())].into()));
        let mut ctx = context(&pod, "scratch", json!({}));
        ctx.add_variable_from_value("variables", variables_value(&vars));
        let view = crate::model::workload::PodView::new(String::new(), std::borrow::Cow::Borrowed(&pod));
        let team = crate::model::namespaces::team_of(&set, "scratch", &crate::model::namespaces::NoNamespaces);
        let finding = crate::admission::validate::check_pod(&set, &view, &team)
            .into_iter()
            .find(|f| f.rule.as_str() == "accelerators/max-per-pod");
        let passes = max_expression.execute(&ctx).map_err(|e| e.to_string());
        prop_assert_eq!(passes, Ok(CelValue::Bool(finding.is_none())), "max-per-pod verdict");
        if let Some(finding) = finding {
            over.set(over.get() + 1);
            let message = max_message.execute(&ctx).map_err(|e| e.to_string());
            let CelValue::String(message) = message.clone().map_err(TestCaseError::fail)? else {
                return Err(TestCaseError::fail(format!("not a string: {message:?}")));
            };
            // The engine's words, its path (`spec: `) included.
            prop_assert_eq!(message.as_str(), format!("[accelerators/max-per-pod] {}", finding.describe()));
        } else {
            under.set(under.get() + 1);
        }

        // The shipped rule on a Pod in a namespace of no team, as the engine judges it.
        let engine_denies = reported(&admit_pod(&engine, &pod)).any(|f| f.rule.as_str() == "gpu-pods-belong-to-a-team");
        teamless_gpu.set(teamless_gpu.get() + usize::from(engine_denies));
        prop_assert_eq!(!admits(&team_rule, &pod, "scratch"), engine_denies, "gpu-pods-belong-to-a-team");
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(answered.get() > 300 && answered.get() < 300 * rules.len(), "answers and errors: {}", answered.get());
    let (over, under, teamless_gpu) = (over.get(), under.get(), teamless_gpu.get());
    assert!(
        over > 5 && under > 5 && teamless_gpu > 5,
        "both verdicts occur: {over} over, {under} under, {teamless_gpu}"
    );
}

/// The API server binds no `namespaceObject` in matchConditions, so a team chosen by a label
/// must be decided in the body: no condition reads the namespace, and a Job template in a
/// namespace labelled `team=nlp` is held to nlp's classes (kube-apiserver 1.36.2 admitted it
/// while the team was a match condition).
#[test]
fn no_match_condition_reads_the_namespace_and_label_chosen_teams_still_decide() {
    let compiled = compile(&shipped());
    for object in &compiled.objects {
        let conditions = match object {
            NativeObject::MutatingPolicy(o) => o.spec.as_ref().and_then(|s| s.match_conditions.clone()),
            NativeObject::ValidatingPolicy(o) => o.spec.as_ref().and_then(|s| s.match_conditions.clone()),
            _ => None,
        };
        for c in conditions.iter().flatten() {
            assert!(!c.expression.contains("namespaceObject"), "{}: {}", object.name(), c.name);
        }
    }
    let policy = compiled
        .objects
        .iter()
        .find_map(|o| match o {
            NativeObject::ValidatingPolicy(p) if o.name() == "allot-team-priority-classes-replicationcontroller" => {
                Some(p)
            }
            _ => None,
        })
        .expect("the team priority check for spec.template kinds (Jobs among them)");
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "f", "namespace": "nlp-research"},
        "spec": {"template": {"spec": {"priorityClassName": "high-priority",
            "containers": [{"name": "t", "image": "x:1"}]}}}});
    assert!(!admits_in(policy, &job, "nlp-research", json!({"team": "nlp"})), "nlp may not use high-priority");
    assert!(admits_in(policy, &job, "nlp-research", json!({})), "no label: no team, no limit");
    assert!(admits_in(policy, &job, "vision", json!({})), "vision may");
}

/// A TrainJob's trainer becomes a container with its resources and the container fields it
/// states (`image`, `env`…), as the engine's Pod view makes it, and without those it does not
/// state: `pinned-images-on-gpus` warns natively on a trainer image on `:latest` (seen missing
/// on a real API server: the native container had no image) and leaves a runtime's image alone.
#[test]
fn a_trainjobs_container_carries_the_fields_its_trainer_states() {
    let source = source_of("trainer.kubeflow.org", "trainjobs");
    let limits = json!({"limits": {"nvidia.com/gpu": 1}});
    // `dyn()` only steers the API server's type checker: the identity when evaluated.
    let context = |object: &Value, namespace: &str, labels: Value| {
        let mut ctx = context(object, namespace, labels);
        ctx.add_function("dyn", identity);
        ctx
    };
    let stated = json!({"spec": {"trainer": {"image": "ghcr.io/x/train:latest", "env": [{"name": "A", "value": "b"}],
        "numNodes": 2, "resourcesPerNode": limits}}});
    let ctx = context(&stated, "vision", json!({}));
    let container = format!("({})[0].spec.containers[0]", source.pods);
    assert_eq!(
        eval(&ctx, &format!("{container}.image")),
        CelValue::String("ghcr.io/x/train:latest".to_string().into())
    );
    assert_eq!(eval(&ctx, &format!("size({container}.env)")), CelValue::Int(1));
    assert_eq!(
        eval(&ctx, &format!("has({container}.resources.limits) && !has({container}.numNodes)")),
        CelValue::Bool(true)
    );
    let from_runtime = json!({"spec": {"trainer": {"resourcesPerNode": limits}}});
    let ctx = context(&from_runtime, "vision", json!({}));
    assert_eq!(eval(&ctx, &format!("has({container}.image) || has({container}.command)")), CelValue::Bool(false));
}

/// CEL's `dyn(x)`: `x` (it only changes what the type checker infers).
fn identity(value: CelValue) -> kube::core::cel::cel::ResolveResult {
    Ok(value)
}

/// The messages a policy's failing validations give for `object` (its `messageExpression`,
/// else its `message`), as the API server words a refusal or warning.
fn messages_of(policy: &ValidatingAdmissionPolicy, object: &Value, namespace: &str, labels: Value) -> Vec<String> {
    let ctx = bound(policy, object, namespace, labels);
    policy
        .spec
        .iter()
        .flat_map(|s| s.validations.iter().flatten())
        .filter(|v| eval(&ctx, &v.expression) != CelValue::Bool(true))
        .map(|v| match &v.message_expression {
            Some(m) => match eval(&ctx, m) {
                CelValue::String(s) => s.to_string(),
                other => panic!("a message that is not a string: {other:?}"),
            },
            None => v.message.clone().unwrap_or_default(),
        })
        .collect()
}

/// Native refusals and warnings name where in the object the engine's do: nothing before a
/// Pod's own finding, the template's path before a template's (`spec.template: …`), the
/// field for a priority class — the words the shipped suites expect (seen missing on a real
/// API server).
#[test]
fn native_messages_name_the_engines_paths() {
    on_big_stack(native_messages_name_the_engines_paths_body);
}

fn native_messages_name_the_engines_paths_body() {
    let compiled = compile(&shipped());
    let gpu = json!({"containers": [{"name": "c", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": gpu});
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"template": {"spec": gpu}}});
    let teamless = "namespace scratch belongs to no team; GPU workloads run in team namespaces";
    let suffix = |group: &str, plural: &str| source_of(group, plural).suffix;
    let rule = |source: &str| validating_policy(&compiled, &format!("allot-rule-gpu-pods-belong-to-a-team-{source}"));
    assert_eq!(messages_of(&rule("pod"), &pod, "scratch", json!({})), [teamless.to_string()]);
    assert_eq!(
        messages_of(&rule(&suffix("batch", "jobs")), &job, "scratch", json!({})),
        [format!("spec.template: {teamless}")]
    );

    let mut high = gpu.clone();
    high["priorityClassName"] = json!("high-priority");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": high});
    // A PyTorchJob's replicas: CEL walks a map in no fixed order, so the key is a pattern.
    let pytorch = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": gpu}}, "Worker": {"template": {"spec": high}}}}});
    let classes = |source: &str| validating_policy(&compiled, &format!("allot-team-priority-classes-{source}"));
    let nlp = json!({"team": "nlp"});
    let said = "team nlp may use priority classes low-priority; this pod asks high-priority";
    assert_eq!(
        messages_of(&classes("pod"), &pod, "nlp-research", nlp.clone()),
        [format!("[team/priority-class] spec.priorityClassName: {said}")]
    );
    assert_eq!(
        messages_of(&classes(&suffix("kubeflow.org", "pytorchjobs")), &pytorch, "nlp-research", nlp),
        [format!("[team/priority-class] spec.pytorchReplicaSpecs.*.template.spec.priorityClassName: {said}")]
    );
}

/// A team that lists no allowed priority classes may use any class but the system ones,
/// natively as in the engine, with the engine's words; a namespace of no team is not judged.
#[test]
fn a_team_without_a_list_may_not_use_a_system_class_natively() {
    on_big_stack(a_team_without_a_list_may_not_use_a_system_class_natively_body);
}

fn a_team_without_a_list_may_not_use_a_system_class_natively_body() {
    let mut sources = crate::model::policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"))
        .expect("shipped sources");
    let teams = sources.iter_mut().find(|s| s.text.contains("kind: Team")).expect("the teams");
    teams.text = teams.text.replacen("    allowed: [low-priority, high-priority]\n", "", 1);
    let set = crate::model::policy::compile(&sources).expect("policies compile");
    let compiled = compile(&set);
    let policy = validating_policy(&compiled, "allot-team-priority-classes-pod");
    let pod = |class: Option<&str>| {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
        if let Some(class) = class {
            pod["spec"]["priorityClassName"] = json!(class);
        }
        pod
    };
    let engine_says = |object: &Value, namespace: &str| -> Vec<String> {
        let team = crate::model::namespaces::team_of(&set, namespace, &crate::model::namespaces::NoNamespaces);
        crate::model::workload::pods_of(object, "", "Pod")
            .iter()
            .flat_map(|view| {
                let mut found = crate::admission::validate::check_pod(&set, view, &team);
                found.extend(crate::admission::validate::check_system_priority_class(&set, view, &team));
                found
            })
            .filter(|f| f.rule.as_str() == "team/priority-class")
            .map(|f| format!("[team/priority-class] {}: {}", f.path, f.message))
            .collect()
    };
    for class in ["system-node-critical", "system-cluster-critical"] {
        let object = pod(Some(class));
        let said = engine_says(&object, "vision");
        assert_eq!(said.len(), 1, "the engine denies {class}");
        assert_eq!(messages_of(&policy, &object, "vision", json!({})), said);
    }
    for class in [Some("high-priority"), Some("other"), Some("low-priority"), None] {
        let object = pod(class);
        assert!(engine_says(&object, "vision").is_empty(), "{class:?}");
        assert!(admits(&policy, &object, "vision"), "{class:?}");
    }
    // nlp keeps its list, and its words.
    let high = pod(Some("high-priority"));
    assert_eq!(messages_of(&policy, &high, "nlp", json!({})), engine_says(&high, "nlp"));
    // A namespace of no team is left alone (the team condition reads the namespace's labels,
    // so it guards the validations rather than matching).
    assert!(admits(&policy, &pod(Some("system-node-critical")), "kube-system"));
}

/// The per-container checks' native messages are the engine's, path included, on Pods and on
/// the templates of workloads (one container asking one accelerator: CEL walks a container's
/// resources in no fixed order, the engine in name order).
#[test]
fn per_container_check_messages_are_the_engines() {
    on_big_stack(per_container_check_messages_are_the_engines_body);
}

fn per_container_check_messages_are_the_engines_body() {
    let set = shipped();
    let compiled = compile(&set);
    let container = |resources: Value| json!({"name": "train", "image": "x:1", "resources": resources});
    let specs = [
        json!({"containers": [container(json!({"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "1"}}))]}),
        json!({"containers": [{"name": "cpu", "image": "x:1"}, container(json!({"requests": {"nvidia.com/gpu": 1}}))]}),
        json!({"containers": [container(json!({"limits": {"nvidia.com/mig-1g.10gb": "500m"}}))]}),
        json!({"initContainers": [{"name": "warm", "image": "x:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
               "containers": [{"name": "c", "image": "x:1"}]}),
    ];
    for spec in specs {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec});
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": spec}}});
        let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "s"},
            "spec": {"replicatedJobs": [{"name": "ok", "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1"}]}}}}},
                                        {"name": "bad", "template": {"spec": {"template": {"spec": spec}}}}]}});
        for (object, group, plural) in
            [(&pod, "", "pods"), (&job, "batch", "jobs"), (&jobset, "jobset.x-k8s.io", "jobsets")]
        {
            let kind = object["kind"].as_str().unwrap_or_default();
            let engine: Vec<String> = crate::model::workload::pods_of(object, group, kind)
                .iter()
                .flat_map(|view| {
                    let team =
                        crate::model::namespaces::team_of(&set, "vision", &crate::model::namespaces::NoNamespaces);
                    crate::admission::validate::check_pod(&set, view, &team)
                })
                .filter(|f| f.action == Action::Deny && f.rule.as_str().starts_with("accelerators/"))
                .map(|f| format!("[{}] {}", f.rule, f.describe()))
                .collect();
            assert_eq!(engine.len(), 1, "one engine finding for {object}: {engine:?}");
            let source = source_of(group, plural);
            let policy = validating_policy(&compiled, &format!("allot-accelerators-deny-{}", source.suffix));
            assert_eq!(messages_of(&policy, object, "vision", json!({})), engine, "{object}");
        }
    }
}

/// The Pod source that binds `group`'s `plural` (its object-name suffix, Pods, paths).
fn source_of(group: &str, plural: &str) -> PodSource {
    pod_sources()
        .0
        .into_iter()
        .find(|s| s.resources.iter().any(|(g, r)| *g == group && r == plural))
        .unwrap_or_else(|| panic!("no source for {group}/{plural}"))
}
