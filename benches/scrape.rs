//! What a `/metrics` scrape costs at 100,000 watched pods (issue 49): the per-team accelerator
//! gauges and the gate gauges, read from the sums the store keeps as watch events arrive,
//! against the reference walks over every pod that the scrape used to do, in the same run.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use allot::control::cluster::records::{HeldClaim, HeldClaims};
use allot::control::cluster::usage::{recount_gate_gauges, recount_requests_by_state};
use allot::control::cluster::{ClusterState, PodRecord};
use allot::model::namespaces::StaticNamespaces;
use allot::model::policy::{self, PolicySet};
use allot::model::quantity::Quantity;
use criterion::{Criterion, criterion_group, criterion_main};

const PODS: usize = 100_000;
/// 500 namespaces of team `vision` (`vision-*`), 400 of `nlp` (by label), 100 of no team.
const NAMESPACES: usize = 1_000;
/// The oldest pod's creation (seconds since the epoch); the others an hour's spread after it.
const CREATED: i64 = 1_795_000_000;
const NOW: i64 = CREATED + 7_200;

fn policies() -> PolicySet {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    policy::compile(&policy::read_sources(&dir).expect("policies")).expect("compile")
}

fn namespace(n: usize) -> String {
    match n {
        0..500 => format!("vision-{n}"),
        500..900 => format!("nlp-{n}"),
        _ => format!("dev-{n}"),
    }
}

/// Pod `i`: half bound, a fifth pending (released or never gated), a fifth behind the gang
/// gate (gangs of 8), a tenth queued behind the quota gate; 1, 2, 4 or 8 GPUs, every 20th a
/// MIG slice instead.
fn pod(i: usize) -> k8s_openapi::api::core::v1::Pod {
    let (gpu, amount) =
        if i.is_multiple_of(20) { ("nvidia.com/mig-1g.10gb", 1) } else { ("nvidia.com/gpu", 1 << (i % 4)) };
    let mut pod = serde_json::json!({
        "metadata": {"name": format!("pod-{i}"), "namespace": namespace(i % NAMESPACES), "uid": format!("uid-{i}")},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {gpu: amount.to_string()}, "requests": {"cpu": "4"}}}]}
    });
    match i % 10 {
        0..5 => pod["spec"]["nodeName"] = format!("node-{}", i % 5_000).into(),
        5..7 => {}
        7..9 => {
            pod["metadata"]["labels"] = serde_json::json!({"allot.dev/gang-name": format!("g-{}", i / 80)});
            pod["metadata"]["annotations"] = serde_json::json!({"allot.dev/gang-size": "8"});
            pod["spec"]["schedulingGates"] = serde_json::json!([{"name": "allot.dev/gang"}]);
        }
        _ => pod["spec"]["schedulingGates"] = serde_json::json!([{"name": "allot.dev/quota"}]),
    }
    serde_json::from_value(pod).expect("pod")
}

/// The store at [`PODS`] pods, created over an hour; every 50th pod also holds a shared claim with the pod 1,000
/// after it (same namespace), counted once.
fn cluster(p: &PolicySet, labels: &StaticNamespaces) -> ClusterState {
    let state = ClusterState::default();
    for i in 0..PODS {
        let mut r = PodRecord::from_pod(&pod(i), p, labels).expect("record");
        r.created = CREATED + (i % 3_600) as i64;
        if i.is_multiple_of(50) {
            let claim = HeldClaim {
                name: format!("claim-{}/uid", i / 2_000).into(),
                devices: Box::new([(Arc::from("nvidia.com/gpu"), Quantity::from_units(1))]),
            };
            r.shared_claims = Some(Box::new(HeldClaims(vec![claim])));
        }
        state.upsert_pod(r);
    }
    state
}

fn scrape(c: &mut Criterion) {
    let p = policies();
    let nlp = allot::model::namespaces::Labels::from([("team".to_string(), "nlp".to_string())]);
    let labels = StaticNamespaces((500..900).map(|n| (namespace(n), nlp.clone())).collect::<HashMap<_, _>>());
    let state = cluster(&p, &labels);
    // Both sides do the same work: the kept figures equal the walks', and the gauges are real.
    let view = state.view();
    assert_eq!(view.requests_by_state(), recount_requests_by_state(&view));
    assert_eq!(state.gate_gauges(NOW), recount_gate_gauges(&view, NOW));
    drop(view);
    let gates = state.gate_gauges(NOW);
    assert_eq!((gates[0].pods, gates[1].pods), (20_000, 10_000), "{gates:?}");
    let usage = state.accelerator_usage(&p, &labels);
    let teams: std::collections::BTreeSet<&str> = usage.requested.iter().map(|g| g.team.as_str()).collect();
    assert_eq!(teams, ["", "nlp", "vision"].into(), "{usage:?}");

    let mut group = c.benchmark_group("scrape");
    group.bench_function("accelerator-usage-100000-pods", |b| {
        b.iter(|| (state.accelerator_usage(&p, &labels), state.gate_gauges(std::hint::black_box(NOW))))
    });
    group.bench_function("recount-100000-pods", |b| {
        b.iter(|| {
            let view = state.view();
            (recount_requests_by_state(&view), recount_gate_gauges(&view, std::hint::black_box(NOW)))
        })
    });
    group.finish();
}

criterion_group!(benches, scrape);
criterion_main!(benches);
