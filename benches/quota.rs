//! Admission latency with deny-mode quota checks vs without, in the same run: the validating
//! review of fixture 011 (a 1-GPU pod in `vision`) against the shipped policies, whose `vision`
//! team has a deny-mode quota, and against the same policies with the quota removed. The live
//! book watches 10,000 pods in 50 other namespaces. Dry-run reviews, so nothing is reserved.
//! And admission in a queue-mode team alone and in a cohort ([`cohort`]).

use std::path::Path;
use std::sync::Arc;

use allot::admission::engine::Engine;
use allot::admission::{self, Phase};
use allot::control::cluster::{ClusterState, PodRecord};
use allot::control::gang::snapshot::GangSnapshot;
use allot::control::quota::LiveQuota;
use allot::model::namespaces::{NamespaceLabels, NoNamespaces};
use allot::model::policy::{self, PolicySet};
use arc_swap::ArcSwap;
use criterion::{Criterion, criterion_group, criterion_main};

fn policies(with_quota: bool) -> PolicySet {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let mut sources = policy::read_sources(&dir).expect("policies");
    if !with_quota {
        for s in &mut sources {
            if let Some(i) = s.text.find("  quota:") {
                let end = s.text[i..].find("\n---").map_or(s.text.len(), |e| i + e);
                s.text.replace_range(i..end, "");
            }
        }
    }
    let set = policy::compile(&sources).expect("compile");
    assert_eq!(set.teams.iter().any(|t| t.quota.is_some()), with_quota);
    set
}

fn cluster(p: &PolicySet) -> Arc<ClusterState> {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x", "namespace": "vision", "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let base = PodRecord::from_pod(&pod, p, &allot::model::namespaces::NoNamespaces).unwrap();
    let state = ClusterState::default();
    for i in 0..10_000 {
        let mut r = base.clone();
        r.name = format!("pod-{i}").into();
        r.namespace = format!("ns-{}", i % 50).into();
        state.upsert_pod(r);
    }
    Arc::new(state)
}

fn bench(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission-reviews/011-validate-create-pod-my-gpu-pod.json");
    let mut review: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    review["request"]["dryRun"] = serde_json::json!(true);
    let body = serde_json::to_vec(&review).unwrap();
    let labels: Arc<dyn NamespaceLabels> = Arc::new(NoNamespaces);

    let mut group = c.benchmark_group("quota");
    for with_quota in [false, true] {
        let p = policies(with_quota);
        let state = cluster(&p);
        let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(policies(with_quota))), labels.clone());
        let engine = Engine::new(&p, labels.as_ref()).with_gangs(state.as_ref()).with_quota(&book);
        let answer = admission::review(&body, Phase::Validate, &engine).unwrap();
        assert!(answer.allowed);
        if with_quota {
            let quota = p.teams.iter().find_map(|t| t.quota.clone()).unwrap();
            let requests = std::collections::BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                allot::model::quantity::Quantity::from_units(1),
            )]);
            let charge = quota.charge(&requests);
            let request = allot::admission::quota::QuotaRequest {
                uid: "u",
                team: "vision",
                namespace: "vision",
                pod: "p",
                pod_uid: "",
                created: 0,
                charge,
                requests,
                gang: None,
                shared_claims: Default::default(),
                dry_run: true,
                cohort: None,
            };
            use allot::admission::quota::QuotaBook as _;
            group.bench_function("live_book_admit", |b| b.iter(|| book.admit(&quota, std::hint::black_box(&request))));
        }
        let name = if with_quota { "validate_with_deny_quota" } else { "validate_without_quota" };
        group.bench_function(name, |b| {
            b.iter(|| admission::review(std::hint::black_box(&body), Phase::Validate, &engine))
        });
    }
    group.finish();
}

/// The per-scrape cost of the team and quota gauges over 100,000 watched pods, next to the
/// controller's snapshot of the same state (what every decision pass already pays).
fn gauges(c: &mut Criterion) {
    let p = policies(true);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "x", "namespace": "vision", "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap();
    let base = PodRecord::from_pod(&pod, &p, &NoNamespaces).unwrap();
    let state = ClusterState::default();
    for i in 0..100_000 {
        let mut r = base.clone();
        r.name = format!("pod-{i}").into();
        r.namespace = if i % 2 == 0 { "vision".into() } else { format!("ns-{}", i % 50).into() };
        state.upsert_pod(r);
    }
    let usage = state.accelerator_usage(&p, &NoNamespaces);
    assert!(usage.quotas.iter().any(|q| q.team == "vision" && q.used == 50_000.0), "{:?}", usage.quotas);
    let mut group = c.benchmark_group("gauges_100k_pods");
    group.sample_size(20);
    group.bench_function("accelerator_usage", |b| b.iter(|| state.accelerator_usage(&p, &NoNamespaces)));
    group.bench_function("baseline_controller_snapshot", |b| b.iter(|| state.snapshot(&p, &NoNamespaces, 0)));
    group.finish();
}

/// Adds a pending gang of `members` gated members (1 GPU each, declaring `members`) in
/// namespace `ml`, and 100 nodes of 8 GPUs: the gang cannot fit, so every controller pass
/// considers all of it.
fn with_pending_gang(state: &ClusterState, p: &PolicySet, members: usize) {
    let pod = |i: usize| -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("huge-{i}"), "namespace": "ml", "creationTimestamp": "2026-11-22T01:00:00Z",
                "labels": {"allot.dev/gang-name": "huge"}, "annotations": {"allot.dev/gang-size": members.to_string()}},
            "spec": {"schedulingGates": [{"name": "allot.dev/gang"}],
                "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap()
    };
    for i in 0..members {
        state.upsert_pod(PodRecord::from_pod(&pod(i), p, &NoNamespaces).unwrap());
    }
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}}
    }))
    .unwrap();
    let template = allot::control::cluster::node_info(&node).unwrap();
    state.replace_nodes(
        (0..100).map(|i| allot::control::cluster::NodeInfo { name: format!("n{i}"), ..template.clone() }).collect(),
    );
}

/// Per-request latencies of `n` validating reviews: (mean, p99) in microseconds.
fn latencies(n: usize, mut review: impl FnMut()) -> (f64, f64) {
    let mut times: Vec<f64> = (0..n)
        .map(|_| {
            let t = std::time::Instant::now();
            review();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times.iter().sum::<f64>() / n as f64, times[n * 99 / 100])
}

/// Admission while a gang of 10,000 members is pending, against the same cluster without it,
/// in one run: the validating review of fixture 011 (deny-mode quota, live book, the watch as
/// gang directory), with the controller's pass (quota queue, snapshot, decision, plan) running
/// back to back on another thread over the state that holds the gang — the worst case of a
/// leader that re-plans on every change. Criterion reports the means; p99 and mean per request
/// are measured over 20,000 reviews and printed with their ratios.
fn pending_gang(c: &mut Criterion) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/admission-reviews/011-validate-create-pod-my-gpu-pod.json");
    let mut review: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    review["request"]["dryRun"] = serde_json::json!(true);
    let body = serde_json::to_vec(&review).unwrap();
    let labels: Arc<dyn NamespaceLabels> = Arc::new(NoNamespaces);
    let p = policies(true);
    let mut group = c.benchmark_group("pending_gang");
    let mut measured = Vec::new();
    // (pending gang, controller pass running): the pass alone separates the cost of sharing
    // the CPU with the controller from the cost of the gang.
    for (with_gang, with_pass) in [(false, false), (true, false), (false, true), (true, true)] {
        let state = cluster(&p);
        if with_gang {
            with_pending_gang(&state, &p, 10_000);
        }
        let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(policies(true))), labels.clone());
        let engine = Engine::new(&p, labels.as_ref()).with_gangs(state.as_ref()).with_quota(&book);
        assert!(admission::review(&body, Phase::Validate, &engine).unwrap().allowed);
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(0));
        let controller = with_pass.then(|| {
            let (state, stop, passes) = (state.clone(), stop.clone(), passes.clone());
            std::thread::spawn(move || {
                use allot::control::gang::plan::plan;
                use allot::control::quota::QuotaQueue;
                let p = policies(true);
                let (mut queued, mut explained) = (Default::default(), Default::default());
                while !stop.load(Ordering::Relaxed) {
                    let _ = state.quota_plan(&p, &NoNamespaces, &mut queued, 1_795_000_000);
                    let (snapshot, facts) = state.snapshot(&p, &NoNamespaces, 1_795_000_000);
                    let pass = plan(&snapshot, &facts, &mut explained);
                    assert!(!with_gang || pass.released.is_empty());
                    passes.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        let name = match (with_gang, with_pass) {
            (false, false) => "validate_baseline",
            (true, false) => "validate_with_pending_10k_gang",
            (false, true) => "validate_while_the_controller_passes",
            (true, true) => "validate_with_pending_10k_gang_while_the_controller_passes",
        };
        group.bench_function(name, |b| {
            b.iter(|| admission::review(std::hint::black_box(&body), Phase::Validate, &engine))
        });
        let (mean, p99) = latencies(20_000, || {
            std::hint::black_box(admission::review(&body, Phase::Validate, &engine).unwrap());
        });
        stop.store(true, Ordering::Relaxed);
        if let Some(t) = controller {
            t.join().unwrap();
        }
        measured.push((name, mean, p99, passes.load(Ordering::Relaxed)));
    }
    group.finish();
    for (name, mean, p99, passes) in &measured {
        println!(
            "pending_gang/{name}: mean {mean:.1} µs, p99 {p99:.1} µs per review ({passes} controller passes meanwhile)"
        );
    }
    let ratio = |with: usize, without: usize| {
        let ((_, with_mean, with_p99, _), (_, base_mean, base_p99, _)) = (measured[with], measured[without]);
        format!("mean {:.2}×, p99 {:.2}×", with_mean / base_mean, with_p99 / base_p99)
    };
    println!("pending_gang: with / without a pending 10,000-member gang, no pass running: {}", ratio(1, 0));
    println!("pending_gang: with / without a pending 10,000-member gang, pass running: {}", ratio(3, 2));
    println!("pending_gang: gang and pass / neither: {}", ratio(3, 0));
}

criterion_group!(benches, bench, gauges, pending_gang, cohort);
criterion_main!(benches);

/// Admission in a team with and without a cohort, in the same run (issue 48: within 10 %): the
/// mutating review of fixture 010 (which gates the pod) and the validating review of 011, for
/// the shipped `vision` team in `mode: Queue`, alone and in cohort `research`; and the
/// validating review in `mode: Deny` (the in-memory book), alone and in a cohort of three.
fn cohort(c: &mut Criterion) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews");
    let body = |name: &str| -> Vec<u8> {
        let mut review: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures.join(name)).unwrap()).unwrap();
        review["request"]["dryRun"] = serde_json::json!(true);
        serde_json::to_vec(&review).unwrap()
    };
    let (mutate, validate) =
        (body("010-mutate-create-pod-my-gpu-pod.json"), body("011-validate-create-pod-my-gpu-pod.json"));
    let labels: Arc<dyn NamespaceLabels> = Arc::new(NoNamespaces);
    let mut group = c.benchmark_group("cohort");
    for in_cohort in [false, true] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let mut sources = policy::read_sources(&dir).expect("policies");
        let queue = if in_cohort { "mode: Queue\n    cohort: research" } else { "mode: Queue" };
        for s in &mut sources {
            s.text = s.text.replacen("mode: Deny", queue, 1);
        }
        let p = policy::compile(&sources).expect("compile");
        assert_eq!(p.cohorts.of_team("vision").is_some(), in_cohort);
        let state = cluster(&p);
        let shared = Arc::new(ArcSwap::from_pointee(policy::compile(&sources).expect("compile")));
        let book = LiveQuota::new(state.clone(), shared, labels.clone());
        let engine = Engine::new(&p, labels.as_ref()).with_gangs(state.as_ref()).with_quota(&book);
        let gated = admission::review(&mutate, Phase::Mutate, &engine).unwrap();
        assert!(gated.allowed && gated.mutated, "the pod is gated");
        assert!(admission::review(&validate, Phase::Validate, &engine).unwrap().allowed);
        let name = if in_cohort { "in-cohort" } else { "no-cohort" };
        group.bench_function(format!("mutate-010-{name}"), |b| {
            b.iter(|| admission::review(std::hint::black_box(&mutate), Phase::Mutate, &engine))
        });
        group.bench_function(format!("validate-011-{name}"), |b| {
            b.iter(|| admission::review(std::hint::black_box(&validate), Phase::Validate, &engine))
        });
    }
    // Deny mode, where admission itself borrows: vision alone, and in a cohort of three teams
    // (each other team's usage is read too).
    for in_cohort in [false, true] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let mut sources = policy::read_sources(&dir).expect("policies");
        if in_cohort {
            for s in &mut sources {
                s.text = s.text.replacen("mode: Deny", "mode: Deny\n    cohort: research", 1);
            }
            let team = |name: &str| {
                format!(
                    "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: \
                     {{names: [{name}]}}\n  quota: {{mode: Deny, cohort: research, limits: {{nvidia.com/gpu: 16, \
                     amd.com/gpu: 8}}}}\n"
                )
            };
            let text = format!("{}---\n{}", team("speech"), team("audio"));
            sources.push(policy::Source { name: "cohort.yaml".into(), text });
        }
        let p = policy::compile(&sources).expect("compile");
        assert_eq!(p.cohorts.of_team("vision").map(|c| c.members.len()), in_cohort.then_some(3));
        let state = cluster(&p);
        let shared = Arc::new(ArcSwap::from_pointee(policy::compile(&sources).expect("compile")));
        let book = LiveQuota::new(state.clone(), shared, labels.clone());
        let engine = Engine::new(&p, labels.as_ref()).with_gangs(state.as_ref()).with_quota(&book);
        assert!(admission::review(&validate, Phase::Validate, &engine).unwrap().allowed);
        let name = if in_cohort { "deny-in-cohort-of-3" } else { "deny-no-cohort" };
        group.bench_function(format!("validate-011-{name}"), |b| {
            b.iter(|| admission::review(std::hint::black_box(&validate), Phase::Validate, &engine))
        });
    }
    group.finish();
}
