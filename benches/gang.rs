//! One gang-controller decision pass over 1,000 waiting gangs and 5,000 nodes (target < 50 ms),
//! next to a baseline measured in the same run: cloning the snapshot, i.e. touching every node
//! and member once. Also: counting one node's ResourceSlice (8 GPUs) against NVIDIA's two
//! DeviceClasses plus an extended-resource class, what the DRA watch does per slice, next to
//! decoding that slice from JSON. And what the Pod watch does per event: a pod's record
//! extracted, next to decoding the pod. And the same pass where the gangs may preempt, over a
//! full cluster of 50,000 running pods (target: the victim search < 100 ms a pass; the
//! snapshots are in `preemption.rs`).

use std::collections::BTreeMap;

use allot::control::cluster::{NodeInfo, Placement, PodShape};
use allot::control::gang::decision::{GangKey, Member, Snapshot, WaitingGang, decide};
use allot::model::quantity::Quantity;
use allot::model::resources::ResourceMatcher;
use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Taint, Toleration};

mod preemption;

fn q(n: i64) -> Quantity {
    Quantity::from_units(n)
}

/// 5,000 8-GPU nodes in 4 pools, 80% busy; 1,000 gangs of 2–8 members × 1–4 GPUs, mixed pools.
fn snapshot() -> Snapshot {
    let pools = ["a100", "h100", "l4", "t4"];
    let nodes: Vec<NodeInfo> = (0..5000)
        .map(|i| NodeInfo {
            name: format!("node-{i:05}"),
            labels: BTreeMap::from([
                ("node-type".to_string(), pools[i % 4].to_string()),
                ("kubernetes.io/hostname".to_string(), format!("node-{i:05}")),
            ]),
            taints: vec![Taint { key: "nvidia.com/gpu".into(), effect: "NoSchedule".into(), ..Default::default() }],
            unschedulable: i % 97 == 0,
            allocatable: BTreeMap::from([
                ("nvidia.com/gpu".to_string(), q(8)),
                ("cpu".to_string(), q(96)),
                ("memory".to_string(), q(1 << 40)),
                ("pods".to_string(), q(110)),
            ]),
        })
        .collect();
    let bound = (0..5000)
        .filter(|i| i % 5 != 0)
        .map(|i| {
            (
                format!("node-{i:05}"),
                BTreeMap::from([
                    ("nvidia.com/gpu".to_string(), q(7)),
                    ("cpu".to_string(), q(40)),
                    ("pods".to_string(), q(7)),
                ]),
            )
        })
        .collect();
    let gangs = (0..1000)
        .map(|g| {
            let members = 2 + g % 7;
            let gpus = 1 + (g % 4) as i64;
            let requests = BTreeMap::from([
                ("nvidia.com/gpu".to_string(), q(gpus)),
                ("cpu".to_string(), q(4)),
                ("pods".to_string(), q(1)),
            ]);
            let placement = Placement {
                node_selector: BTreeMap::from([("node-type".to_string(), pools[g % 4].to_string())]),
                tolerations: vec![Toleration {
                    key: Some("nvidia.com/gpu".into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }],
                ..Placement::default()
            };
            let shape = PodShape::new(requests, placement);
            WaitingGang {
                key: GangKey { namespace: format!("team-{}", g % 20), name: format!("gang-{g}") },
                expected: Some(members as u32),
                members: (0..members).map(|m| Member { name: format!("gang-{g}-{m}"), shape: shape.clone() }).collect(),
                priority: (g % 3) as i32,
                created: g as i64,
                ready: (g as i64, 0),
                held_by: None,
                disagreement: None,
                unplaceable: None,
                starvation_after: Some(1800),
                phantoms: None,
                topology: None,
                joins: None,
                preemptor: None,
            }
        })
        .collect();
    Snapshot {
        now: 10_000,
        nodes,
        bound,
        in_flight: Vec::new(),
        gangs,
        accelerators: ResourceMatcher::new(["nvidia.com/gpu"]),
        strays: Vec::new(),
        told_late: Vec::new(),
        running: Vec::new(),
        preemptions: Vec::new(),
        reclaiming: Vec::new(),
    }
}

/// [`snapshot`] with its nodes in 5 zones of 20 racks of 50 nodes, each rack 5 NVLink cliques of
/// 10 (three topology levels), and every gang placed by them: the even ones require their rack
/// (a clique first), the odd ones prefer a clique, then a rack, then a zone.
fn topology_snapshot() -> Snapshot {
    use allot::control::gang::decision::GangTopology;
    let mut s = labelled(snapshot());
    let levels = |n: usize| {
        ["nvidia.com/gpu.clique", "topology.kubernetes.io/rack", "topology.kubernetes.io/zone"][..n]
            .iter()
            .map(|l| l.to_string())
            .collect()
    };
    for (g, gang) in s.gangs.iter_mut().enumerate() {
        gang.topology = Some(if g % 2 == 0 {
            GangTopology { levels: levels(2), required: true }
        } else {
            GangTopology { levels: levels(3), required: false }
        });
    }
    s
}

/// `s` with its nodes in 5 zones of 20 racks of 50 nodes, each rack 5 NVLink cliques of 10.
fn labelled(mut s: Snapshot) -> Snapshot {
    for (i, node) in s.nodes.iter_mut().enumerate() {
        node.labels.insert("topology.kubernetes.io/zone".into(), format!("zone-{}", i / 1000));
        node.labels.insert("topology.kubernetes.io/rack".into(), format!("rack-{:03}", i / 50));
        node.labels.insert("nvidia.com/gpu.clique".into(), format!("clique-{:03}", i / 10));
    }
    s
}

fn released(s: &Snapshot) -> usize {
    decide(s).iter().filter(|d| matches!(d.verdict, allot::control::gang::decision::Verdict::Release { .. })).count()
}

fn bench(c: &mut Criterion) {
    let s = snapshot();
    let t = topology_snapshot();
    eprintln!("decision pass: {} gangs, {} nodes, {} released", s.gangs.len(), s.nodes.len(), released(&s));
    eprintln!("with 3 topology levels (100 racks): {} released", released(&t));
    let mut group = c.benchmark_group("gang");
    group.sample_size(20);
    group.bench_function("baseline_clone_snapshot", |b| b.iter(|| std::hint::black_box(s.clone())));
    group.bench_function("decide_1000_gangs_5000_nodes", |b| b.iter(|| std::hint::black_box(decide(&s))));
    group.bench_function("decide_1000_gangs_5000_nodes_100_racks_3_levels", |b| {
        b.iter(|| std::hint::black_box(decide(&t)))
    });
    let p = preemption::preempt_snapshot(snapshot());
    let r = preemption::preempt_required_snapshot(labelled(snapshot()));
    eprintln!("preemption, 50,000 running pods: {}", preemption::tally(&p));
    eprintln!("preemption, every gang requiring a clique or rack: {}", preemption::tally(&r));
    group
        .bench_function("preempt_1000_gangs_5000_nodes_50000_running", |b| b.iter(|| std::hint::black_box(decide(&p))));
    group.bench_function("preempt_1000_gangs_5000_nodes_50000_running_100_racks_required", |b| {
        b.iter(|| std::hint::black_box(decide(&r)))
    });
    group.finish();

    use allot::model::dra::slices::{DeviceClassMatcher, slice_devices};
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
    let class = |name: &str, kind: &str, extended: Option<&str>| -> DeviceClass {
        let mut spec = serde_json::json!({"selectors": [{"cel": {"expression": format!(
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == '{kind}'")}}]});
        if let Some(e) = extended {
            spec["extendedResourceName"] = serde_json::json!(e);
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let matcher = DeviceClassMatcher::new(&[
        class("gpu.nvidia.com", "gpu", None),
        class("mig.nvidia.com", "mig", None),
        class("gpu-extended", "gpu", Some("nvidia.com/gpu")),
    ]);
    let devices: Vec<_> = (0..8)
        .map(|i| {
            serde_json::json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"}, "index": {"int": i}, "uuid": {"string": format!("GPU-{i:08}")},
                "productName": {"string": "NVIDIA H100 80GB HBM3"}, "driverVersion": {"version": "550.54.15"}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    let json = serde_json::to_vec(&serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-0-gpus"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-0",
                 "pool": {"name": "node-0", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}))
    .unwrap();
    let slice: ResourceSlice = serde_json::from_slice(&json).unwrap();
    assert_eq!(slice_devices(&slice, &matcher).per_class.get("gpu.nvidia.com"), Some(&8));
    let mut group = c.benchmark_group("dra");
    group.bench_function("baseline_decode_slice_8_gpus", |b| {
        b.iter(|| std::hint::black_box(serde_json::from_slice::<ResourceSlice>(&json).unwrap()))
    });
    group.bench_function("count_slice_8_gpus_3_classes", |b| {
        b.iter(|| std::hint::black_box(slice_devices(&slice, &matcher)))
    });
    group.finish();
}

/// What the Pod watch does per event: decoding a Pod (the watcher's own cost) and extracting its
/// record. The pod is fixture 011's (as the API server stored it: defaulted, a service-account
/// volume, managedFields), with a status like a running pod's.
fn bench_records(c: &mut Criterion) {
    use allot::control::cluster::PodRecord;
    use k8s_openapi::api::core::v1::Pod;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let review: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("tests/fixtures/admission-reviews/011-validate-create-pod-my-gpu-pod.json")).unwrap(),
    )
    .unwrap();
    let mut pod = review["request"]["object"].clone();
    pod["status"] = serde_json::json!({"phase": "Running", "qosClass": "BestEffort",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-26T10:00:00Z"}],
        "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "nvcr.io/nvidia/cuda:12",
            "imageID": "sha256:abc", "containerID": "containerd://0123", "started": true,
            "state": {"running": {"startedAt": "2026-11-26T10:00:00Z"}}}]});
    let json = serde_json::to_vec(&pod).unwrap();
    let policies = allot::model::policy::load_dir(&root.join("policies")).unwrap();
    let decoded: Pod = serde_json::from_slice(&json).unwrap();
    let record = PodRecord::from_pod(&decoded, &policies, &allot::model::namespaces::NoNamespaces).unwrap();
    assert_eq!(record.request_pairs().find(|(k, _)| *k == "nvidia.com/gpu").map(|(_, v)| v), Some(q(1)));
    let mut group = c.benchmark_group("watch");
    group.bench_function("baseline_decode_pod_011", |b| {
        b.iter(|| std::hint::black_box(serde_json::from_slice::<Pod>(&json).unwrap()))
    });
    // What the Pod watch decodes: only the fields a record reads (issue 18).
    group.bench_function("decode_watched_pod_011", |b| {
        b.iter(|| std::hint::black_box(serde_json::from_slice::<allot::control::cluster::WatchedPod>(&json).unwrap()))
    });
    group.bench_function("record_of_pod_011", |b| {
        b.iter(|| {
            PodRecord::from_pod(std::hint::black_box(&decoded), &policies, &allot::model::namespaces::NoNamespaces)
        })
    });
    group.finish();
}

criterion_group!(benches, bench, bench_records);
criterion_main!(benches);
