//! In-process benchmarks of the engine, against the shipped `policies/`.
//!
//! Run with `cargo bench --bench engine`; `scripts/bench-summary.sh` then prints every result as
//! a ratio to `baseline/parse-json-value` measured in the same run (this machine is shared and
//! noisy: compare ratios, not absolute times, between runs).
//!
//! - `baseline/parse-json-value`: `serde_json::from_slice::<Value>` of fixture 010's body, the
//!   least any webhook must do with it.
//! - `baseline/parse-arena-value`: the same body into `sonic_rs::Value`, an arena-allocated
//!   tree: how much of decoding is building serde_json's tree (a String per key and string, a
//!   BTreeMap per object), which the engine reads.
//! - `review/mutate-010`, `review/validate-010`: `admission::review` of fixture 010 (a Pod asking
//!   for one `nvidia.com/gpu` in team namespace `vision`), decode → engine → encode, exactly what
//!   `POST /mutate` and `POST /validate` run. Target: < 20 µs.
//! - `review/decode-010`: decoding that review whole but for `managedFields` (`admission::decode`,
//!   the id's meaning since 2026-11-26); `review/decode-served-010`: as the server decodes it
//!   (`admission::decode_for`, leaving out what the shipped policies leave unread: the Pod's
//!   volumes and last-applied copy).
//! - `engine/mutate-pod-010`: `Engine::mutate` on the decoded Pod (evaluation alone).
//! - `engine/admit-pod-010`: `Engine::admit` (mutate, apply the patch, validate; what
//!   `allot check` runs) on the same Pod object, already decoded.
//! - `engine/validate-pytorchjob`, `engine/validate-jobset`: `Engine::validate` of the workloads
//!   in `examples/workloads/` (each Pod template mutated as it will be, then checked).
//! - `policy/load-dir`: reading and compiling `policies/` (what a reload costs).
//! - `baseline/decode-NNN`, `review/validate-NNN` (NNN = 011 GPU Pod, 002 MNIST Job, 019 gated
//!   gang worker): the validating reviews of issue 13, each with its own decoding baseline
//!   (`serde_json::from_slice::<Value>` of the same body).
//! - `engine/validate-pod-011`: `Engine::validate` on the already decoded request of fixture 011
//!   (issue 13's target: within 2× of `baseline/decode-011`).
//! - `cel/bind-pod-011`: converting pod 011 for the shipped Rules and opening their scope (what
//!   one rule set costs before any rule runs).
//! - `cel/rules-direct-011`, `cel/rules-interpreter-011`: every shipped Rule on pod 011, by direct
//!   evaluation over its JSON (`expression::direct`, what a review runs) and by the interpreter on
//!   bindings converted for them (what a review ran before; still the fallback).
//! - `cel/rules-contained`, `cel/rules-uncontained`: every shipped Rule's expression evaluated on
//!   pod 010, through `Expression::eval_bool` (under the panic boundary, `catch_unwind`) and
//!   through the same program run directly; their ratio is what containing panics costs.

use std::hint::black_box;

/// The allocator of the `allot` binary (src/main.rs): the engine is measured as it runs in
/// production, where glibc malloc would add ~30 % to the allocation-heavy paths.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::path::Path;
use std::time::Duration;

use allot::admission::engine::{Engine, Request, RequestOperation, group_kind};
use allot::admission::{self, Phase};
use allot::cli::check::{self, Manifest};
use allot::model::expression::{Bindings, Evaluator, Inputs, json_to_cel};
use allot::model::namespaces::{self, StaticNamespaces};
use allot::model::policy::{self, PolicySet};
use criterion::{Criterion, criterion_group, criterion_main};
use kube::core::cel::cel::{Program, Value as CelValue};
use serde_json::Value;

const FIXTURE_010: &str = "tests/fixtures/admission-reviews/010-mutate-create-pod-my-gpu-pod.json";
/// The validating reviews of issue 13's load targets.
const VALIDATE_FIXTURES: &[(&str, &str)] = &[
    ("011", "tests/fixtures/admission-reviews/011-validate-create-pod-my-gpu-pod.json"),
    ("002", "tests/fixtures/admission-reviews/002-validate-create-job-mnist-demo.json"),
    ("019", "tests/fixtures/admission-reviews/019-validate-create-pod-gated-worker-0.json"),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn policies() -> PolicySet {
    policy::load_dir(&repo().join("policies")).unwrap_or_else(|e| panic!("policies/: {e}"))
}

/// Namespace labels as a server with the Namespace watch would know them.
fn namespaces() -> StaticNamespaces {
    let path = repo().join("examples/cluster/namespaces.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    namespaces::from_manifests(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"))
}

fn manifest(path: &str) -> Manifest {
    let mut manifests = check::read_manifests(&[repo().join(path)]).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(manifests.len(), 1, "{path}: expected one object");
    manifests.remove(0)
}

/// A CREATE request for a manifest, as `allot check` builds it.
fn create_request<'a>(object: &'a Value, groups: &'a [String]) -> Request<'a> {
    let (group, kind) = group_kind(object);
    Request {
        uid: "test",
        operation: RequestOperation::Create,
        group,
        kind,
        namespace: object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default"),
        object,
        old_object: None,
        dry_run: false,
        username: "admin",
        groups,
    }
}

fn benches(c: &mut Criterion) {
    let policies = policies();
    let namespaces = namespaces();
    let engine = Engine::new(&policies, &namespaces);
    let body = std::fs::read(repo().join(FIXTURE_010)).unwrap_or_else(|e| panic!("{FIXTURE_010}: {e}"));

    // Make sure each benchmark measures the real work, not an early exit.
    let mutated = admission::review(&body, Phase::Mutate, &engine).expect("fixture 010 is a valid review");
    assert!(mutated.allowed && mutated.mutated, "fixture 010 should be admitted with a patch");
    let validated = admission::review(&body, Phase::Validate, &engine).expect("fixture 010 is a valid review");
    assert!(validated.allowed, "fixture 010 should pass validation: {:?}", validated.outcome.findings);

    let review: Value = serde_json::from_slice(&body).expect("fixture 010 is JSON");
    let pod = review.pointer("/request/object").expect("fixture 010 has request.object").clone();
    let groups: Vec<String> = vec!["system:authenticated".into()];
    let pod_request = Request { namespace: "vision", ..create_request(&pod, &groups) };
    let admitted = engine.admit(&pod_request);
    assert!(admitted.allowed() && !admitted.mutation.patch.is_empty(), "pod 010 should be admitted with a patch");

    let pytorchjob = manifest("examples/workloads/pytorchjob.yaml");
    let pytorch_request = create_request(&pytorchjob.object, &groups);
    assert!(!engine.validate(&pytorch_request).allowed(), "the example PyTorchJob should be denied");
    let jobset = manifest("examples/workloads/jobset.yaml");
    let jobset_request = create_request(&jobset.object, &groups);
    assert!(!engine.validate(&jobset_request).allowed(), "the example JobSet should be denied");

    c.bench_function("baseline/parse-json-value", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).expect("JSON"))
    });
    // The same body into an arena-allocated tree (one allocation per page, not per string and
    // map): what decoding costs when building the tree is not the cost.
    c.bench_function("baseline/parse-arena-value", |b| {
        b.iter(|| sonic_rs::from_slice::<sonic_rs::Value>(black_box(&body)).expect("JSON"))
    });
    c.bench_function("baseline/skim-010", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).expect("JSON"))
    });
    c.bench_function("review/decode-010", |b| b.iter(|| admission::decode(black_box(&body)).expect("valid review")));
    c.bench_function("review/decode-served-010", |b| {
        b.iter(|| admission::decode_for(black_box(&body), policies.unread).expect("valid review"))
    });
    c.bench_function("review/mutate-010", |b| {
        b.iter(|| admission::review(black_box(&body), Phase::Mutate, &engine).expect("valid review"))
    });
    c.bench_function("review/validate-010", |b| {
        b.iter(|| admission::review(black_box(&body), Phase::Validate, &engine).expect("valid review"))
    });
    // Evaluation alone, on the already decoded Pod: what the "< 20 µs" is about.
    c.bench_function("engine/mutate-pod-010", |b| b.iter(|| engine.mutate(black_box(&pod_request))));
    c.bench_function("engine/admit-pod-010", |b| b.iter(|| engine.admit(black_box(&pod_request))));
    c.bench_function("engine/validate-pytorchjob", |b| b.iter(|| engine.validate(black_box(&pytorch_request))));
    c.bench_function("engine/validate-jobset", |b| b.iter(|| engine.validate(black_box(&jobset_request))));
    // The panic boundary's cost: the same programs, contained and not, on the same scope.
    let bindings = Bindings {
        vars: u8::MAX,
        object: json_to_cel(&pod),
        old_object: CelValue::Null,
        workload: json_to_cel(&pod),
        namespace: "vision".into(),
        team: "vision".into(),
        request: json_to_cel(&serde_json::json!({"operation": "CREATE", "dryRun": false})),
        object_accelerators: None,
    };
    let scope = policies.env.scope(&bindings);
    let programs: Vec<Program> = policies
        .rules
        .iter()
        .map(|r| Program::compile(r.expression.source()).expect("a shipped rule compiles"))
        .collect();
    assert!(!programs.is_empty(), "policies/ should hold Rules");
    c.bench_function("cel/rules-contained", |b| {
        b.iter(|| {
            policies
                .rules
                .iter()
                .filter(|r| matches!(r.expression.eval_bool(black_box(&scope), &r.name), Ok(true)))
                .count()
        })
    });
    c.bench_function("cel/rules-uncontained", |b| {
        b.iter(|| programs.iter().filter(|p| matches!(p.execute(black_box(&scope)), Ok(CelValue::Bool(true)))).count())
    });
    for (id, path) in VALIDATE_FIXTURES {
        let body = std::fs::read(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let answer = admission::review(&body, Phase::Validate, &engine).expect("a valid review");
        assert!(answer.allowed, "fixture {id} should pass validation: {:?}", answer.outcome.findings);
        c.bench_function(&format!("baseline/decode-{id}"), |b| {
            b.iter(|| serde_json::from_slice::<Value>(black_box(&body)).expect("JSON"))
        });
        c.bench_function(&format!("review/validate-{id}"), |b| {
            b.iter(|| admission::review(black_box(&body), Phase::Validate, &engine).expect("valid review"))
        });
    }
    // Issue 13: `Engine::validate` of pod 011 within 2× of decoding its review.
    let body_011 = std::fs::read(repo().join(VALIDATE_FIXTURES[0].1)).expect("fixture 011");
    let review_011: Value = serde_json::from_slice(&body_011).expect("fixture 011 is JSON");
    let pod_011 = review_011.pointer("/request/object").expect("fixture 011 has request.object");
    let request_011 = Request { namespace: "vision", ..create_request(pod_011, &groups) };
    let validated_011 = engine.validate(&request_011);
    assert!(
        validated_011.allowed() && validated_011.findings.is_empty(),
        "pod 011 should pass every check: {:?}",
        validated_011.findings
    );
    c.bench_function("engine/validate-pod-011", |b| b.iter(|| engine.validate(black_box(&request_011))));
    // The CEL layer on pod 011, every shipped Rule: direct evaluation over the JSON against the
    // interpreter on bindings converted for them (what each review paid before direct evaluation).
    let rules: Vec<_> = policies.rules.iter().collect();
    let inputs = Inputs {
        needs: allot::admission::validate::rule_needs(&rules),
        object: Some(pod_011),
        workload: Some(pod_011),
        namespace: "vision",
        team: "vision",
        object_accelerators: allot::model::expression::object_accelerators(pod_011, None, &policies.accelerators),
        ..Inputs::default()
    };
    let evaluator = Evaluator::new(&policies.env, &inputs);
    assert!(rules.iter().all(|r| r.expression.is_direct()), "the shipped rules are evaluated directly");
    assert!(rules.iter().all(|r| evaluator.eval_bool(&r.expression, &r.name) == Ok(true)), "pod 011 passes every rule");
    c.bench_function("cel/rules-direct-011", |b| {
        b.iter(|| {
            let evaluator = Evaluator::new(&policies.env, black_box(&inputs));
            rules.iter().filter(|r| evaluator.eval_bool(&r.expression, &r.name) == Ok(true)).count()
        })
    });
    c.bench_function("cel/rules-interpreter-011", |b| {
        b.iter(|| {
            let scope = policies.env.scope(&black_box(&inputs).bindings());
            rules.iter().filter(|r| r.expression.eval_bool(&scope, &r.name) == Ok(true)).count()
        })
    });
    c.bench_function("cel/bind-pod-011", |b| {
        b.iter(|| {
            let bindings = Bindings { object: json_to_cel(black_box(pod_011)), ..bindings.clone() };
            policies.env.scope(&bindings).get_variable("object").is_some()
        })
    });
    c.bench_function("policy/load-dir", |b| {
        b.iter(|| policy::load_dir(black_box(&repo().join("policies"))).expect("policies"))
    });
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(5))
}

criterion_group! {
    name = engine;
    config = config();
    targets = benches
}
criterion_main!(engine);
