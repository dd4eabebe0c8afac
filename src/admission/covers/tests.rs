//! The split: covered checks are skipped, everything else is evaluated as before; the
//! webhook's share mutates nothing the native policies already did; the report is read
//! fail-safe.

use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::admission::engine::{Engine, Request, RequestOperation};
use crate::admission::native::Line;
use crate::model::namespaces::NoNamespaces;
use crate::model::patch;

/// The shipped policies plus a team-scoped placement with a nodeSelector, a team default
/// class and a team-scoped rule (all compiled), and a Rule reading Allot's helper as a whole map
/// (webhook-only: only one named entry is expanded into Kubernetes CEL).
const EXTRA: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: speech}
spec:
  namespaces: {names: [speech]}
  priority: {default: high-priority, allowed: [low-priority, high-priority]}
---
apiVersion: allot.dev/v1alpha1
kind: Placement
metadata: {name: speech-pool}
spec:
  appliesTo: AllPods
  match: {teams: [speech]}
  nodeSelector: {example.com/pool: a100}
  tolerations: [{key: example.com/pool, operator: Equal, value: a100, effect: NoSchedule}]
  onConflict: Deny
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: speech-pins-images}
spec:
  match: {teams: [speech]}
  expression: "object.spec.containers.all(c, !c.image.endsWith(':latest'))"
  message: speech pods pin their images
---
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: speech-one-accelerator-kind}
spec:
  match: {teams: [speech]}
  expression: "acceleratorRequests(object).size() <= 1"
  message: one kind of accelerator per pod
"#;

fn sources() -> Vec<Source> {
    let mut sources = policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).expect("shipped");
    sources.push(Source { name: "zz-extra.yaml".into(), text: EXTRA.into() });
    sources
}

fn pod(namespace: &str, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox:1.36"}]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace}, "spec": spec})
}

fn gpu(request: &str, limit: &str) -> Value {
    json!([{"name": "c", "image": "busybox:1.36",
        "resources": {"requests": {"nvidia.com/gpu": request}, "limits": {"nvidia.com/gpu": limit}}}])
}

/// A Pod asking two kinds of accelerator (what `speech-one-accelerator-kind` refuses).
fn two_kinds(namespace: &str) -> Value {
    pod(
        namespace,
        json!({"containers": [{"name": "c", "image": "busybox:1.36", "resources": {
            "requests": {"nvidia.com/gpu": "1", "amd.com/gpu": "1"},
            "limits": {"nvidia.com/gpu": "1", "amd.com/gpu": "1"}}}]}),
    )
}

fn job(namespace: &str, spec: Value) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": namespace},
        "spec": {"template": {"spec": spec}}})
}

/// Objects that touch every covered part and every webhook-only one of the policies.
fn objects() -> Vec<Value> {
    vec![
        pod("vision", json!({"containers": gpu("1", "1")})),
        pod("vision", json!({"containers": gpu("2", "1")})),
        pod("vision", json!({"containers": gpu("500m", "500m")})),
        pod("vision", json!({"containers": gpu("16", "16")})),
        pod(
            "vision",
            json!({"containers": [{"name": "c", "image": "busybox:latest",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
        ),
        pod("nlp", json!({"priorityClassName": "high-priority", "containers": gpu("1", "1")})),
        pod("speech", json!({})),
        pod("speech", json!({"nodeSelector": {"example.com/pool": "h100"}})),
        pod("speech", json!({"containers": [{"name": "c", "image": "busybox:latest"}]})),
        two_kinds("speech"),
        pod("scratch", json!({"containers": gpu("1", "1")})),
        pod(
            "vision",
            json!({"initContainers": [{"name": "i", "image": "busybox:1.36",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
        ),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g", "namespace": "vision",
            "labels": {"allot.dev/gang-name": "g"}, "annotations": {"allot.dev/gang-size": "2"}},
            "spec": {"containers": gpu("1", "1")}}),
        job("vision", json!({"containers": gpu("2", "1")})),
        job("speech", json!({"containers": [{"name": "c", "image": "busybox:latest"}]})),
        job("nlp", json!({"priorityClassName": "high-priority", "containers": gpu("1", "1")})),
    ]
}

fn request(object: &Value) -> Request<'_> {
    crate::admission::engine::alices(RequestOperation::Create, object)
}

#[test]
fn the_report_of_the_policies_is_read_as_the_compiler_means_it() {
    let split = NativeSplit::from_sources(&sources()).expect("split");
    let c = &split.covered;
    assert_eq!(
        c.checks,
        BTreeSet::from([Check::RequestsEqualLimits, Check::WholeNumbers, Check::InitContainers, Check::MaxPerPod]),
        "every accelerator check the shipped policies hold is compiled"
    );
    assert!(c.rules.contains("speech-pins-images") && c.rules.contains("pinned-images-on-gpus"), "{c:?}");
    assert!(c.rules.contains("gpu-pods-belong-to-a-team"), "accelerators(object) is expanded: {c:?}");
    assert!(!c.rules.contains("speech-one-accelerator-kind"), "a helper's whole map is not expanded: {c:?}");
    assert!(c.placements.contains("speech-pool") && c.placements.contains("nvidia-gpu"), "{c:?}");
    assert!(c.default_priority && c.team_priority_classes);
    // Every covered part is one the report calls compiled, and the other way round for Rules
    // and Placements: nothing the compiler compiled whole is left unrecognised.
    let full = policy::compile(&sources()).expect("policies");
    let compiled = crate::admission::native::compile(&full);
    for coverage in &compiled.coverage {
        let whole = coverage.status() == "compiled";
        match &coverage.policy {
            Subject::Rule(rule) => assert_eq!(c.rules.contains(rule), whole, "{}", coverage.policy),
            // (A reserveTolerations line keeps the status "partly compiled" and the placement
            // covered: the reservation alone stays with the webhook.)
            Subject::Placement(p) => {
                let reserving = coverage.webhook_only.iter().all(|l| l.part == Part::ReserveTolerations);
                assert_eq!(c.placements.contains(p), whole || (reserving && !coverage.compiled.is_empty()), "{p}")
            }
            _ => {}
        }
    }
    assert_eq!(split.fingerprint, fingerprint(&compiled).expect("fingerprint"), "the same sources, the same objects");
    assert_eq!(split.fingerprint.len(), 12);
}

#[test]
fn what_the_lines_are_about_decides_not_their_text() {
    let line = |part: Part, text: &str| Line::new(part, text);
    let coverage = |compiled: Vec<Line>, webhook_only: Vec<Line>| Coverage {
        policy: Subject::AcceleratorChecks,
        compiled,
        webhook_only,
    };
    let policies = policy::compile(&sources()).expect("policies");
    let read = |c: Coverage| Covered::from_coverage(&[c], &policies).checks;
    let both = || {
        vec![
            line(Part::Check(Check::WholeNumbers), "whole-numbers (deny) on Pods and Pod templates"),
            line(Part::Check(Check::MaxPerPod), "max-per-pod (deny) on Pods and Pod templates"),
        ]
    };
    assert_eq!(read(coverage(both(), vec![])), BTreeSet::from([Check::WholeNumbers, Check::MaxPerPod]));
    // A check reported both ways stays in the webhook.
    assert_eq!(
        read(coverage(both(), vec![line(Part::Check(Check::MaxPerPod), "max-per-pod: not yet")])),
        BTreeSet::from([Check::WholeNumbers])
    );
    // A template kind the compiler could not express: no check holds everywhere.
    assert!(read(coverage(both(), vec![Line::whole("template apps/Foo: no path")])).is_empty());
    // Text that reads like a check but is about none: not covered.
    assert!(read(coverage(vec![Line::whole("whole-numbers (deny) on Pods and Pod templates")], vec![])).is_empty());
    // A placement whose report misses one of its tolerations is not covered.
    let placement = |compiled: Vec<Line>| Coverage {
        policy: Subject::Placement("speech-pool".into()),
        compiled,
        webhook_only: vec![],
    };
    let selector = || {
        vec![
            line(Part::NodeSelector, "nodeSelector example.com/pool=a100"),
            line(Part::SelectorConflicts, "nodeSelector conflicts (deny)"),
        ]
    };
    assert!(Covered::from_coverage(&[placement(selector())], &policies).placements.is_empty());
    // With it (whatever its text says), it is.
    let whole = [selector(), vec![line(Part::Toleration, "a toleration")]].concat();
    let speech = policies.placements.iter().find(|p| p.name == "speech-pool").expect("speech-pool");
    assert_eq!(speech.spec.tolerations.len(), 1, "the fixture's speech-pool has one toleration");
    assert!(Covered::from_coverage(&[placement(whole)], &policies).placements.contains("speech-pool"));
}

/// The split's validation is the full one without exactly the covered findings; its mutation
/// adds nothing to what the full mutation made (no patch op repeats) and leaves out only what
/// covered parts add.
#[test]
fn covered_checks_are_skipped_and_the_rest_evaluated() {
    let split = NativeSplit::from_sources(&sources()).expect("split");
    let full = policy::compile(&sources()).expect("policies");
    let engine = Engine::new(&full, &NoNamespaces);
    let (mutate, validate) = (Engine::new(&split.mutate, &NoNamespaces), Engine::new(&split.validate, &NoNamespaces));
    let (mut skipped, mut kept, mut mutations_left_out) = (0, 0, 0);
    for object in objects() {
        let req = request(&object);
        let whole = engine.validate(&req);
        let share = validate.validate(&req);
        let expected: Vec<_> = whole.findings.iter().filter(|f| !split.covered.covers(&f.rule)).cloned().collect();
        assert_eq!(share.findings, expected, "{object}");
        skipped += whole.findings.len() - expected.len();
        kept += expected.len();

        let whole = engine.mutate(&req);
        let share = mutate.mutate(&req);
        for op in &share.patch {
            assert!(whole.patch.contains(op), "{object}: {op:?} is not the full mutation's");
        }
        mutations_left_out += whole.patch.len() - share.patch.len();
        // On the object the native policies and the webhook made, the webhook's share adds
        // nothing more: no toleration or selector twice.
        if whole.patch.is_empty() {
            continue;
        }
        let mutated = patch::apply(&object, &whole.patch).expect("applies");
        let again = mutate.mutate(&request(&mutated));
        assert!(again.patch.is_empty(), "{object}: {:?}", again.patch);
        // What the share left out is what covered placements and the default class add.
        for op in whole.patch.iter().filter(|op| !share.patch.contains(op)) {
            let path = serde_json::to_value(op).expect("op")["path"].as_str().unwrap_or_default().to_string();
            assert!(
                ["/spec/tolerations", "/spec/nodeSelector", "/spec/priorityClassName", "/spec/priority"]
                    .iter()
                    .any(|p| path.starts_with(p)),
                "{object}: left out {path}"
            );
        }
    }
    assert!(skipped >= 8 && kept >= 1 && mutations_left_out >= 4, "{skipped} {kept} {mutations_left_out}");
}

/// Webhook-only parts still answer in the share: a Rule reading a helper's whole map, the gang
/// gate.
#[test]
fn webhook_only_parts_still_answer() {
    let split = NativeSplit::from_sources(&sources()).expect("split");
    let (mutate, validate) = (Engine::new(&split.mutate, &NoNamespaces), Engine::new(&split.validate, &NoNamespaces));
    let two = two_kinds("speech");
    let found = validate.validate(&request(&two));
    assert!(found.findings.iter().any(|f| f.rule == "speech-one-accelerator-kind"), "{:?}", found.findings);
    // Covered ones do not: the native policies answer them.
    let stray = pod("scratch", json!({"containers": gpu("1", "1")}));
    assert!(validate.validate(&request(&stray)).findings.is_empty());
    let objects = objects();
    let gang = objects.iter().find(|o| o["metadata"]["name"] == "g").expect("the gang member");
    let patch = serde_json::to_string(&mutate.mutate(&request(gang)).patch).expect("json");
    assert!(patch.contains("schedulingGates") && patch.contains("allot.dev/gang"), "{patch}");
    assert!(!patch.contains("nvidia.com/gpu"), "the toleration is the native policy's: {patch}");
    // The placement is covered, its reserveTolerations is not: a CPU pod tolerating the GPU
    // taint is still denied by the webhook's share.
    let squatter = pod(
        "vision",
        json!({"containers": [{"name": "c", "image": "i"}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
    );
    let out = mutate.mutate(&request(&squatter));
    assert!(
        out.findings.iter().any(|f| f.rule == "tenant/tolerations" && f.action == crate::model::policy::Action::Deny),
        "{:?}",
        out.findings
    );
}

#[test]
fn a_split_applies_only_to_its_version_and_fingerprint() {
    let split = NativeSplit::from_sources(&sources()).expect("split");
    assert!(split.applies(&split.version.clone(), &split.fingerprint.clone()));
    assert!(!split.applies("other", &split.fingerprint));
    assert!(!split.applies(&split.version, "000000000000"));
    // Another Rule changes the compiled objects: the fingerprint moves.
    let mut more = sources();
    more.push(Source {
        name: "zz-more.yaml".into(),
        text: "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: no-host-network}\nspec:\n  \
               expression: \"!has(object.spec.hostNetwork) || !object.spec.hostNetwork\"\n  message: no host network\n"
            .into(),
    });
    let other = NativeSplit::from_sources(&more).expect("split");
    assert_ne!(other.fingerprint, split.fingerprint);
    assert_ne!(other.version, split.version);
}

/// The compiled policies see a claim Pod as asking nothing (a ValidatingAdmissionPolicy cannot
/// read its ResourceClaims), so while the policies map DeviceClasses a review that names
/// `resourceClaims` is answered in full, and the compiler says so.
#[test]
fn a_review_naming_claims_is_answered_in_full_while_the_policies_count_claims() {
    let split = NativeSplit::from_sources(&sources()).expect("split");
    let full = policy::compile(&sources()).expect("policies");
    assert!(!full.device_classes.is_empty(), "the shipped Cluster policy maps gpu.nvidia.com");
    assert!(split.claims_to_webhook);
    let report = crate::admission::native::compile(&full);
    let dra = report.coverage.iter().find(|c| c.policy == Subject::Dra).expect("a DRA line in the report");
    assert_eq!(dra.status(), "webhook-only");

    let plain = serde_json::to_vec(&pod("scratch", json!({"containers": gpu("1", "1")}))).expect("json");
    assert!(split.takes(&plain));
    let claims = pod(
        "scratch",
        json!({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "c", "image": "busybox:1.36", "resources": {"claims": [{"name": "gpu"}]}}]}),
    );
    let body = serde_json::to_vec(&json!({"request": {"object": claims}})).expect("json");
    assert!(!split.takes(&body), "a claim Pod is the webhook's in full");

    // Without a DeviceClass mapping a claim counts nothing anywhere: the split stands.
    let without: Vec<Source> = sources()
        .into_iter()
        .map(|mut s| {
            if s.text.contains("kind: Cluster") {
                // The shipped block runs from `  dra:` to the next key of spec, `  priority:`.
                let at = s.text.find("  dra:").expect("the shipped Cluster policy has a dra block");
                let end = at + s.text[at..].find("  priority:").expect("priority follows dra");
                s.text.replace_range(at..end, "");
            }
            s
        })
        .collect();
    let plain_split = NativeSplit::from_sources(&without).expect("split");
    assert!(policy::compile(&without).expect("policies").device_classes.is_empty());
    assert!(!plain_split.claims_to_webhook && plain_split.takes(&body));
}
