//! What one controller pass reads at 100,000 watched pods with 1,000 incomplete gangs waiting
//! (issue 49): the gang snapshot from the pods the view keeps in play, the gangs' members and
//! the nodes' kept loads, against the walk over every pod it replaced (kept as the reference,
//! `snapshot_by_walking`), and the quota queue's plan with 100 pods queued, alone and in a cohort of 4
//! teams, in the same run; and a deny-mode cohort nobody borrows in: the pass that reads the kept
//! sums against the walk over every pod it skips; and the deny-mode reconciler's recount read
//! from the groups the watch keeps against the walk over every pod it replaced.

use std::collections::HashMap;

use allot::control::cluster::ControllerAction;
use allot::control::cluster::{ClusterState, PodRecord, node_info};
use allot::control::gang::snapshot::{GangSnapshot, snapshot_by_walking};
use allot::control::gang::victims::{running_units, running_units_by_walking};
use allot::control::quota::queue::QuotaQueue;
use allot::control::quota::reclaim::{Memory, deny, deny_pass};
use allot::control::quota::shared::{recount_by_team_at, recount_kept};
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::{self, PolicySet, Source};
use criterion::{Criterion, criterion_group, criterion_main};

const RUNNING: usize = 100_000;
const GANGS: usize = 1_000;
const NODES: usize = 5_000;
const QUEUED: usize = 100;
const NOW: i64 = 1_795_000_000;

const POLICIES: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: queue}\nspec:\n  namespaces: {names: [queue]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 8}}\n";

/// The same team in a cohort with two teams of the cluster's busy namespaces and an idle one:
/// it borrows the idle team's 8 GPUs, and the pass decides the four teams' lines together.
const COHORT_POLICIES: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: queue}\nspec:\n  namespaces: {names: [queue]}\n  quota: {mode: Queue, cohort: lab, limits: {nvidia.com/gpu: 8}}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: busy-0}\nspec:\n  namespaces: {names: [team-0]}\n  quota: {mode: Queue, cohort: lab, limits: {nvidia.com/gpu: 1000}}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: busy-1}\nspec:\n  namespaces: {names: [team-1]}\n  quota: {mode: Queue, cohort: lab, limits: {nvidia.com/gpu: 1000}}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: idle}\nspec:\n  namespaces: {names: [idle]}\n  quota: {mode: Queue, cohort: lab, limits: {nvidia.com/gpu: 8}, lendingLimit: {nvidia.com/gpu: 8}}\n";

/// Two busy teams in a deny-mode cohort, each within its nominal quota (its namespace runs 500
/// GPUs of 1,000): nobody borrows, so the pass reads the kept sums and skips the walk.
const DENY_COHORT_POLICIES: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: busy-0}\nspec:\n  namespaces: {names: [team-0]}\n  quota: {mode: Deny, cohort: lab, limits: {nvidia.com/gpu: 1000}}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: busy-1}\nspec:\n  namespaces: {names: [team-1]}\n  quota: {mode: Deny, cohort: lab, limits: {nvidia.com/gpu: 1000}}\n";

fn pod(namespace: &str, name: &str, extra: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    let mut pod = serde_json::json!({
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "2"}}}]}
    });
    json_patch::merge(&mut pod, &extra);
    serde_json::from_value(pod).expect("pod")
}

/// 100,000 pods on 5,000 nodes (a tenth of them pending, not Allot's), 1,000 gangs of 4 with
/// 3 members behind the gang gate, 100 pods behind the quota gate of a team with room for 8.
fn cluster(p: &PolicySet) -> ClusterState {
    cluster_with(p, &|_| 0)
}

/// [`cluster`], its 100,000 pods of priority `priority(i)`.
fn cluster_with(p: &PolicySet, priority: &dyn Fn(usize) -> i32) -> ClusterState {
    let state = ClusterState::default();
    let node = |n: usize| {
        let node = serde_json::json!({"metadata": {"name": format!("node-{n}")},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}}});
        node_info(&serde_json::from_value(node).expect("node")).expect("a node")
    };
    state.replace_nodes((0..NODES).map(node).collect());
    let mut records: Vec<PodRecord> = Vec::new();
    let mut add = |pod| records.push(PodRecord::from_pod(&pod, p, &NoNamespaces).expect("record"));
    for i in 0..RUNNING {
        let on_node = if i % 10 == 9 {
            serde_json::json!({"spec": {"priority": priority(i)}})
        } else {
            serde_json::json!({"spec": {"nodeName": format!("node-{}", (i / 10) % NODES), "priority": priority(i)}})
        };
        add(pod(&format!("team-{}", i % 200), &format!("run-{i}"), on_node));
    }
    for g in 0..GANGS {
        for m in 0..3 {
            let gated = serde_json::json!({
                "metadata": {"labels": {"allot.dev/gang-name": format!("g-{g}")}, "annotations": {"allot.dev/gang-size": "4"}},
                "spec": {"schedulingGates": [{"name": "allot.dev/gang"}]}
            });
            add(pod(&format!("team-{}", g % 200), &format!("g-{g}-{m}"), gated));
        }
    }
    for q in 0..QUEUED {
        add(pod(
            "queue",
            &format!("q-{q}"),
            serde_json::json!({"spec": {"schedulingGates": [{"name": "allot.dev/quota"}]}}),
        ));
    }
    state.replace_pods(records);
    state
}

fn passes(c: &mut Criterion) {
    let p = policy::compile(&[Source { name: "teams.yaml".into(), text: POLICIES.into() }]).expect("policies");
    let state = cluster(&p);
    // Both sides build the same snapshot: 1,000 waiting gangs, every node's load.
    let (kept, _) = state.snapshot(&p, &NoNamespaces, NOW);
    let (walked, _) = snapshot_by_walking(&state, &p, &NoNamespaces, NOW);
    assert_eq!((kept.gangs.len(), kept.bound.len()), (GANGS, NODES), "waiting gangs, loaded nodes");
    assert_eq!(format!("{:?}", kept.bound), format!("{:?}", walked.bound));
    assert_eq!(format!("{:?}", kept.gangs), format!("{:?}", walked.gangs));
    let released = state.quota_plan(&p, &NoNamespaces, &mut HashMap::new(), NOW).len();
    assert!(released >= 8, "the quota pass releases what fits and tells the rest: {released} actions");

    let mut group = c.benchmark_group("passes");
    group.sample_size(20);
    group.bench_function("gang-snapshot-kept-100000-pods-1000-gangs", |b| {
        b.iter(|| state.snapshot(&p, &NoNamespaces, std::hint::black_box(NOW)))
    });
    group.bench_function("gang-snapshot-walked-100000-pods-1000-gangs", |b| {
        b.iter(|| snapshot_by_walking(&state, &p, &NoNamespaces, std::hint::black_box(NOW)))
    });
    group.bench_function("quota-plan-100000-pods-100-queued", |b| {
        b.iter(|| state.quota_plan(&p, &NoNamespaces, &mut HashMap::new(), std::hint::black_box(NOW)))
    });
    let cohort =
        policy::compile(&[Source { name: "teams.yaml".into(), text: COHORT_POLICIES.into() }]).expect("cohort");
    let in_cohort = cluster(&cohort);
    let borrowed = in_cohort
        .quota_plan(&cohort, &NoNamespaces, &mut HashMap::new(), NOW)
        .iter()
        .filter(|a| matches!(a, ControllerAction::ReleaseQuota { borrowed_from: Some(_), .. }))
        .count();
    assert!(borrowed >= 8, "the team borrows the idle team's 8 GPUs, and more the busy teams leave: {borrowed}");
    group.bench_function("quota-plan-100000-pods-100-queued-cohort-of-4", |b| {
        b.iter(|| in_cohort.quota_plan(&cohort, &NoNamespaces, &mut HashMap::new(), std::hint::black_box(NOW)))
    });
    deny_cohort(&mut group);
    deny_recount(&mut group);
    victims(&mut group, &p);
    group.finish();
}

/// A deny-mode cohort nobody borrows in: the pass as it runs (the walk skipped) against the
/// walk over every pod it would otherwise make (which finds nothing to reclaim or mark).
fn deny_cohort(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let deny = policy::compile(&[Source { name: "teams.yaml".into(), text: DENY_COHORT_POLICIES.into() }])
        .expect("deny cohort");
    let state = cluster(&deny);
    let memory = Memory::default();
    assert!(!deny::walk_needed(&state.view(), &deny, &NoNamespaces), "nobody borrows");
    let (reclaims, marks) = deny_pass(&state.view(), &deny, &NoNamespaces, &memory, NOW);
    assert!(reclaims.is_empty() && marks.is_empty(), "the walk agrees: nothing to reclaim or mark");
    group.bench_function("deny-cohort-pass-100000-pods-nobody-borrows", |b| {
        b.iter(|| state.quota_plan(&deny, &NoNamespaces, &mut HashMap::new(), std::hint::black_box(NOW)))
    });
    group.bench_function("deny-cohort-walk-100000-pods-nobody-borrows", |b| {
        b.iter(|| deny_pass(&state.view(), &deny, &NoNamespaces, &memory, std::hint::black_box(NOW)))
    });
    // busy-0's nominal quota is 400 of the 515 GPUs its namespace asks (500 pods, 5 waiting
    // gangs' 15 members): it borrows 115 of busy-1's, and the pass walks the two teams'
    // namespaces (1,030 of the 103,100 pods).
    let text = DENY_COHORT_POLICIES.replacen("nvidia.com/gpu: 1000", "nvidia.com/gpu: 400", 1);
    let borrowing = policy::compile(&[Source { name: "teams.yaml".into(), text }]).expect("deny cohort");
    let state = cluster(&borrowing);
    assert!(deny::walk_needed(&state.view(), &borrowing, &NoNamespaces), "busy-0 borrows");
    let (_, marks) = deny_pass(&state.view(), &borrowing, &NoNamespaces, &memory, NOW);
    assert_eq!(marks.len(), 115, "busy-0's 115 pods past its nominal quota are marked");
    group.bench_function("deny-cohort-pass-100000-pods-one-borrows", |b| {
        b.iter(|| state.quota_plan(&borrowing, &NoNamespaces, &mut HashMap::new(), std::hint::black_box(NOW)))
    });
}

/// The deny-mode reconciler's recount, every team's namespaces in deny mode (the 200 busy
/// ones and the queue's), 100 pending charges looked up by name: read from the kept groups
/// against the walk over every pod.
fn deny_recount(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let names: Vec<String> = (0..200).map(|i| format!("team-{i}")).chain(["queue".to_string()]).collect();
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: all}}\nspec:\n  namespaces: {{names: [{}]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: 200000}}}}\n",
        names.join(", ")
    );
    let deny = policy::compile(&[Source { name: "teams.yaml".into(), text }]).expect("deny team");
    let state = cluster(&deny);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let pending: Vec<(String, String)> =
        (0..100).map(|i| (format!("team-{}", (i * 7) % 200), format!("run-{}", i * 7))).collect();
    let asked = std::collections::BTreeMap::from([("all".to_string(), pending.clone())]);
    let walked = recount_by_team_at(&state.view(), &deny, &NoNamespaces, now);
    let kept = recount_kept(&state.view(), &deny, &NoNamespaces, &asked, now);
    assert_eq!(walked["all"].by_namespace(), kept["all"].by_namespace(), "the same totals");
    assert_eq!(walked["all"].by_namespace().len(), 201, "every busy namespace counts, and the queue's");
    assert!(pending.iter().all(|(ns, n)| kept["all"].find(ns, n).is_some() && walked["all"].find(ns, n).is_some()));
    group.bench_function("deny-recount-kept-100000-pods-1000-gangs", |b| {
        b.iter(|| recount_kept(&state.view(), &deny, &NoNamespaces, &asked, std::hint::black_box(now)))
    });
    group.bench_function("deny-recount-walk-100000-pods-1000-gangs", |b| {
        b.iter(|| recount_by_team_at(&state.view(), &deny, &NoNamespaces, std::hint::black_box(now)))
    });
}

/// What a preemption may evict, read from the running pods the view keeps by namespace and
/// priority against the walk over every pod: a tenth of the 90,000 running pods below the
/// preemptor's priority, then all of them (a reclaim reads every running unit of its cohort).
fn victims(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, p: &PolicySet) {
    let state = cluster_with(p, &|i| if i % 10 == 0 { 0 } else { 1_000 });
    for (below, label) in [(500, "10000-below"), (i32::MAX, "90000-below")] {
        let view = state.view();
        let mut read = running_units(&view, p, &NoNamespaces, below, &|_| true, NOW);
        read.sort_by(|a, b| a.key.cmp(&b.key));
        let walked = running_units_by_walking(&view, p, &NoNamespaces, below, &|_| true, NOW);
        assert_eq!(read, walked, "the same units");
        assert_eq!(read.len(), if below == 500 { 10_000 } else { 90_000 }, "running pods below {below}");
        drop(view);
        group.bench_function(format!("victims-index-100000-pods-{label}"), |b| {
            b.iter(|| running_units(&state.view(), p, &NoNamespaces, std::hint::black_box(below), &|_| true, NOW))
        });
        group.bench_function(format!("victims-walk-100000-pods-{label}"), |b| {
            b.iter(|| {
                running_units_by_walking(&state.view(), p, &NoNamespaces, std::hint::black_box(below), &|_| true, NOW)
            })
        });
    }
}

criterion_group!(benches, passes);
criterion_main!(benches);
