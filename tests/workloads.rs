//! The shipped policies on realistic manifests of every workload kind Allot reads
//! (`tests/fixtures/workloads/`): each is admitted with no finding and no note. A shipped rule
//! that cannot evaluate a valid object ("could not be evaluated", "No such key") fails here,
//! as `pinned-images-on-gpus` did on a TrainJob whose image comes from its runtime.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;

use allot::admission::engine::{Engine, group_kind};
use allot::admission::quota::StaticUsage;
use allot::cli::check::{self, Manifest, Report};
use allot::model::namespaces::{self, StaticNamespaces};
use allot::model::policy::{Action, PolicySet};
use allot::model::workload::{WORKLOAD_KINDS, pods_of};
use serde_json::Value;
use support::root;

fn fixtures() -> Vec<PathBuf> {
    allot::model::files::yaml_files(&root().join("tests/fixtures/workloads")).expect("fixtures")
}

fn policies() -> PolicySet {
    allot::model::policy::load_dir(&root().join("policies")).unwrap_or_else(|e| panic!("shipped policies: {e}"))
}

fn namespace_labels() -> StaticNamespaces {
    let path = root().join("examples/cluster/namespaces.yaml");
    let text = std::fs::read_to_string(&path).expect("namespaces");
    namespaces::from_manifests(&path.display().to_string(), &text).expect("namespaces parse")
}

/// `allot check` on some manifests, with no usage but theirs (each file is its own run, so the
/// teams' quotas are not summed over every fixture).
fn check(policies: &PolicySet, labels: &StaticNamespaces, manifests: &[Manifest]) -> Report {
    let usage = StaticUsage::default();
    let engine = Engine::new(policies, labels).with_quota(&usage);
    check::run(&engine, manifests)
}

fn all_manifests() -> Vec<Manifest> {
    check::read_manifests(&fixtures()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_workload_kind_has_realistic_fixtures() {
    let manifests = all_manifests();
    let mut missing = Vec::new();
    for row in WORKLOAD_KINDS {
        let of_kind: Vec<&Manifest> =
            manifests.iter().filter(|m| group_kind(&m.object) == (row.group, row.kind)).collect();
        // Each kind's fixtures put at least one container where the table looks for it.
        let with_containers = of_kind.iter().any(|m| {
            pods_of(&m.object, row.group, row.kind).iter().any(|p| p.pod.pointer("/spec/containers/0").is_some())
        });
        if !with_containers || of_kind.len() < 2 {
            missing.push(format!("{}/{} ({} objects)", row.group, row.kind, of_kind.len()));
        }
    }
    assert!(
        missing.is_empty(),
        "kinds without two fixtures (minimal and full), one with Pods Allot finds: {missing:?}"
    );

    // The shapes the issue names are all there.
    let views: Vec<Value> = manifests
        .iter()
        .flat_map(|m| {
            let (group, kind) = group_kind(&m.object);
            pods_of(&m.object, group, kind).into_iter().map(|p| p.pod.into_owned()).collect::<Vec<_>>()
        })
        .collect();
    let containers =
        |field: &'static str| views.iter().flat_map(move |v| v["spec"][field].as_array().cloned().unwrap_or_default());
    let has = |what: &str, found: bool| assert!(found, "no fixture with {what}");
    has("a native sidecar", containers("initContainers").any(|c| c["restartPolicy"] == "Always"));
    has("an init container", containers("initContainers").any(|c| c.get("restartPolicy").is_none()));
    has("a container without resources", containers("containers").any(|c| c.get("resources").is_none()));
    has(
        "a CPU-only container",
        containers("containers").any(|c| {
            c["resources"]["requests"]["cpu"].is_string() && c["resources"]["limits"].get("nvidia.com/gpu").is_none()
        }),
    );
    has(
        "a GPU TrainJob whose image comes from its runtime",
        manifests.iter().any(|m| {
            m.object["kind"] == "TrainJob"
                && m.object["spec"]["trainer"]["resourcesPerNode"]["limits"].get("nvidia.com/gpu").is_some()
                && m.object["spec"]["trainer"].get("image").is_none()
        }),
    );
    let kinds: BTreeSet<(&str, &str)> = manifests.iter().map(|m| group_kind(&m.object)).collect();
    assert_eq!(kinds.len(), WORKLOAD_KINDS.len(), "a fixture of a kind Allot does not read: {kinds:?}");
}

#[test]
fn shipped_policies_pass_every_fixture_without_a_note() {
    let policies = policies();
    let labels = namespace_labels();
    let mut problems = Vec::new();
    let mut objects = 0;
    for file in fixtures() {
        let manifests = check::read_manifests(std::slice::from_ref(&file)).unwrap_or_else(|e| panic!("{e}"));
        let report = check(&policies, &labels, &manifests);
        for r in &report.results {
            objects += 1;
            let at = format!("{}:{} {} {}/{}", r.source, r.line, r.kind, r.namespace, r.name);
            if !r.allowed {
                problems.push(format!("{at}: denied"));
            }
            for f in &r.findings {
                problems.push(format!("{at}: {} [{}] {}", f.action.label(), f.rule, f.describe()));
            }
            for n in &r.notes {
                problems.push(format!("{at}: note {n}"));
            }
        }
    }
    assert!(objects >= 2 * WORKLOAD_KINDS.len(), "only {objects} fixtures");
    assert!(problems.is_empty(), "the shipped policies on valid objects:\n{}", problems.join("\n"));
}

/// The fix keeps the rule a rule: an unpinned image on GPUs still warns, on a TrainJob that
/// names it and on a Pod, with the rule's message rather than an evaluation error.
#[test]
fn pinned_images_still_warns_where_an_image_is_given() {
    let policies = policies();
    let labels = namespace_labels();
    let mut manifests = all_manifests();
    manifests.retain(|m| {
        ["llama-finetune", "cuda-vector-add"].contains(&m.object["metadata"]["name"].as_str().unwrap_or(""))
    });
    assert_eq!(manifests.len(), 2);
    for m in &mut manifests {
        if m.object["kind"] == "TrainJob" {
            m.object["spec"]["trainer"]["image"] = "ghcr.io/example/llama-finetune:latest".into();
        } else {
            m.object["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/cuda-sample".into();
        }
    }
    let report = check(&policies, &labels, &manifests);
    for r in &report.results {
        let warned: Vec<_> = r.findings.iter().filter(|f| f.rule == "pinned-images-on-gpus").collect();
        assert_eq!(warned.len(), 1, "{}: {:?}", r.name, r.findings);
        assert_eq!(warned[0].action, Action::Warn);
        assert!(warned[0].message.starts_with("GPU containers should pin an image tag"), "{}", warned[0].message);
        assert!(r.notes.is_empty(), "{:?}", r.notes);
    }
}
