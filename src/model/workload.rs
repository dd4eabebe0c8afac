//! Where Pods hide inside workload objects: one table of (group, kind) → template paths, so a
//! new CRD is one row, not one code path.
//!
//! A template path is a sequence of steps from the object root to a `PodTemplateSpec`-shaped
//! value (`{metadata, spec}`). `Each` walks every element of a list, `Values` every value of a
//! map (Kubeflow's `pytorchReplicaSpecs: {Master: …, Worker: …}`). Paths are printed the way
//! users read them: `spec.replicatedJobs[1].template.spec.template`.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::model::json::Fields;
use crate::model::resources::{self, ParsedContainer, ResourceList};

/// One step of a template path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A named field.
    Field(&'static str),
    /// Every element of a list.
    Each,
    /// Every value of a map.
    Values,
}

use Step::{Each, Field, Values};

/// How a workload kind carries its Pods.
#[derive(Debug, Clone, Copy)]
pub struct WorkloadKind {
    /// API group; `""` for the core group.
    pub group: &'static str,
    pub kind: &'static str,
    /// Paths to `PodTemplateSpec`s. Empty for `Pod` itself (the object is the Pod).
    pub templates: &'static [&'static [Step]],
    /// For kinds that carry bare container resources instead of templates (TrainJob's
    /// `spec.trainer.resourcesPerNode`): path to the container-like object and the field that
    /// holds its `ResourceRequirements`. The object's [`CONTAINER_FIELDS`] are the container's
    /// too; what it leaves out (TrainJob's image, from its runtime) stays absent.
    pub container_resources: Option<(&'static [Step], &'static str)>,
}

/// Fields a container-like object (TrainJob's `spec.trainer`) shares with the container it
/// becomes, copied into its Pod view so rules read them as in any Pod.
pub const CONTAINER_FIELDS: &[&str] = &["image", "command", "args", "env"];

const fn kind(group: &'static str, kind: &'static str, templates: &'static [&'static [Step]]) -> WorkloadKind {
    WorkloadKind { group, kind, templates, container_resources: None }
}

/// Every kind Allot looks into. Kubeflow kinds are listed under `kubeflow.org`; Volcano's Job
/// under `batch.volcano.sh`.
pub const WORKLOAD_KINDS: &[WorkloadKind] = &[
    kind("", "Pod", &[]),
    kind("", "PodTemplate", &[&[Field("template")]]),
    kind("", "ReplicationController", &[&[Field("spec"), Field("template")]]),
    kind("batch", "Job", &[&[Field("spec"), Field("template")]]),
    kind("batch", "CronJob", &[&[Field("spec"), Field("jobTemplate"), Field("spec"), Field("template")]]),
    kind("apps", "Deployment", &[&[Field("spec"), Field("template")]]),
    kind("apps", "StatefulSet", &[&[Field("spec"), Field("template")]]),
    kind("apps", "DaemonSet", &[&[Field("spec"), Field("template")]]),
    kind("apps", "ReplicaSet", &[&[Field("spec"), Field("template")]]),
    kind(
        "jobset.x-k8s.io",
        "JobSet",
        &[&[Field("spec"), Field("replicatedJobs"), Each, Field("template"), Field("spec"), Field("template")]],
    ),
    kind("kubeflow.org", "PyTorchJob", &[&[Field("spec"), Field("pytorchReplicaSpecs"), Values, Field("template")]]),
    kind("kubeflow.org", "TFJob", &[&[Field("spec"), Field("tfReplicaSpecs"), Values, Field("template")]]),
    kind("kubeflow.org", "MPIJob", &[&[Field("spec"), Field("mpiReplicaSpecs"), Values, Field("template")]]),
    kind("kubeflow.org", "XGBoostJob", &[&[Field("spec"), Field("xgbReplicaSpecs"), Values, Field("template")]]),
    kind("kubeflow.org", "JAXJob", &[&[Field("spec"), Field("jaxReplicaSpecs"), Values, Field("template")]]),
    kind("kubeflow.org", "PaddleJob", &[&[Field("spec"), Field("paddleReplicaSpecs"), Values, Field("template")]]),
    WorkloadKind {
        group: "trainer.kubeflow.org",
        kind: "TrainJob",
        templates: &[],
        container_resources: Some((&[Field("spec"), Field("trainer")], "resourcesPerNode")),
    },
    kind(
        "ray.io",
        "RayCluster",
        &[
            &[Field("spec"), Field("headGroupSpec"), Field("template")],
            &[Field("spec"), Field("workerGroupSpecs"), Each, Field("template")],
        ],
    ),
    kind(
        "ray.io",
        "RayJob",
        &[
            &[Field("spec"), Field("rayClusterSpec"), Field("headGroupSpec"), Field("template")],
            &[Field("spec"), Field("rayClusterSpec"), Field("workerGroupSpecs"), Each, Field("template")],
            &[Field("spec"), Field("submitterPodTemplate")],
        ],
    ),
    kind(
        "leaderworkerset.x-k8s.io",
        "LeaderWorkerSet",
        &[
            &[Field("spec"), Field("leaderWorkerTemplate"), Field("leaderTemplate")],
            &[Field("spec"), Field("leaderWorkerTemplate"), Field("workerTemplate")],
        ],
    ),
    kind("batch.volcano.sh", "Job", &[&[Field("spec"), Field("tasks"), Each, Field("template")]]),
];

/// Finds the table row for a (group, kind).
pub fn lookup(group: &str, kind: &str) -> Option<&'static WorkloadKind> {
    WORKLOAD_KINDS.iter().find(|w| w.group == group && w.kind == kind)
}

/// The API group of an `apiVersion` (`batch/v1` → `batch`, `v1` → ``).
pub fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// A Pod as it is, or as a workload's template will make it.
#[derive(Debug, Clone)]
pub struct PodView<'a> {
    /// Where it sits in the object (`""` for a Pod; `spec.template` for a Job).
    pub path: String,
    /// A Pod-shaped object: `{apiVersion: v1, kind: Pod, metadata, spec}`. A Pod under review
    /// is borrowed, not copied: it is the largest object on the hot path.
    pub pod: Cow<'a, Value>,
    /// Its effective requests, worked out once: the per-pod maximum, `maxAmount`, the queue and
    /// the quota all read them.
    requests: std::cell::OnceCell<ResourceList>,
    /// Its containers' resources, parsed once: the accelerator checks, the tenant's amount
    /// check and the requests above all read them.
    containers: std::cell::OnceCell<Vec<ParsedContainer>>,
}

impl PartialEq for PodView<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.pod == other.pod
    }
}

impl<'a> PodView<'a> {
    pub fn new(path: String, pod: Cow<'a, Value>) -> PodView<'a> {
        PodView { path, pod, requests: std::cell::OnceCell::new(), containers: std::cell::OnceCell::new() }
    }

    /// The pod's effective requests ([`crate::model::resources::pod_requests`] of its spec; none
    /// without one). Do not change `pod` after calling this.
    pub fn requests(&self) -> &ResourceList {
        self.requests.get_or_init(|| {
            let Some(spec) = self.pod.get("spec") else {
                return ResourceList::new();
            };
            let asking = self.containers_with_json().filter(|(parsed, _)| !parsed.is_ephemeral());
            crate::model::resources::pod_requests_of(
                spec,
                asking.map(|(parsed, c)| (c, parsed.is_init(), &parsed.resources)),
            )
        })
    }

    /// Its containers (init, app, ephemeral) with their resources parsed, paths under
    /// [`PodView::spec_path`]. Do not change `pod` after calling this.
    pub fn containers(&self) -> &[ParsedContainer] {
        self.containers.get_or_init(|| {
            self.pod.get("spec").map(|spec| resources::parse_containers(spec, &self.spec_path())).unwrap_or_default()
        })
    }

    /// The parsed container whose JSON is `json` itself (the very value in this view's Pod, not
    /// an equal one elsewhere).
    pub fn container_of(&self, json: &Value) -> Option<&ParsedContainer> {
        self.containers_with_json().find(|(_, c)| std::ptr::eq(*c, json)).map(|(parsed, _)| parsed)
    }

    /// [`PodView::containers`], each with its JSON.
    pub fn containers_with_json(&self) -> impl Iterator<Item = (&ParsedContainer, &Value)> {
        let spec = self.pod.get("spec");
        self.containers().iter().filter_map(move |parsed| Some((parsed, parsed.json(spec?)?)))
    }

    /// Prefix for paths inside this pod (`spec.template.spec` or `spec`).
    pub fn spec_path(&self) -> String {
        if self.path.is_empty() { "spec".to_string() } else { format!("{}.spec", self.path) }
    }
}

/// False for a template of `object` (at `path`, as [`pods_of`] names it) that makes no pods as
/// written: a JobSet's replicated job with `replicas: 0` or `parallelism: 0`, a
/// LeaderWorkerSet's worker template where its groups are their leader alone (`size: 1` beside
/// a `leaderTemplate`). True otherwise, and for every other kind.
pub fn template_makes_pods(object: &Value, group: &str, kind: &str, path: &str) -> bool {
    let count = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(1);
    match (group, kind) {
        ("jobset.x-k8s.io", "JobSet") => {
            let index = path
                .strip_prefix("spec.replicatedJobs[")
                .and_then(|rest| rest.split(']').next())
                .and_then(|i| i.parse::<usize>().ok());
            let Some(job) = index.and_then(|i| object.field(&["spec", "replicatedJobs"])?.get(i)) else {
                return true;
            };
            count(job.get("replicas")) > 0 && count(job.field(&["template", "spec", "parallelism"])) > 0
        }
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet") if path.ends_with(".workerTemplate") => {
            let lws = object.field(&["spec", "leaderWorkerTemplate"]);
            lws.and_then(|l| l.get("leaderTemplate")).is_none() || count(lws.and_then(|l| l.get("size"))) > 1
        }
        _ => true,
    }
}

/// The Pods an object describes: itself for a Pod, one per template for a workload, none for a
/// kind not in the table.
pub fn pods_of<'a>(object: &'a Value, group: &str, kind_name: &str) -> Vec<PodView<'a>> {
    let Some(row) = lookup(group, kind_name) else {
        return Vec::new();
    };
    if row.kind == "Pod" && row.group.is_empty() {
        return vec![PodView::new(String::new(), Cow::Borrowed(object))];
    }
    let namespace = object.field(&["metadata", "namespace"]).cloned();
    let mut out = Vec::new();
    for steps in row.templates {
        walk(object, steps, String::new(), &mut |path, template| {
            out.push(PodView::new(path, Cow::Owned(template_as_pod(template, namespace.clone()))));
        });
    }
    if let Some((steps, field)) = row.container_resources {
        walk(object, steps, String::new(), &mut |path, holder| {
            let mut container = Map::new();
            container.insert("name".into(), Value::String("trainer".into()));
            if let Some(resources) = holder.get(field) {
                container.insert("resources".into(), resources.clone());
            }
            for name in CONTAINER_FIELDS {
                if let Some(value) = holder.get(*name) {
                    container.insert((*name).into(), value.clone());
                }
            }
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"namespace": namespace.clone().unwrap_or(Value::Null)},
                "spec": {"containers": [Value::Object(container)]},
            });
            out.push(PodView::new(path, Cow::Owned(pod)));
        });
    }
    out
}

fn template_as_pod(template: &Value, namespace: Option<Value>) -> Value {
    let mut metadata = template.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    if let Some(ns) = namespace {
        metadata.entry("namespace").or_insert(ns);
    }
    // Built as a map, not with `json!`: the macro serializes every value it interpolates, a
    // second deep copy of the template (5 % of a Job's validation in a profile).
    let pod: Map<String, Value> = [
        ("apiVersion", Value::from("v1")),
        ("kind", Value::from("Pod")),
        ("metadata", Value::Object(metadata)),
        ("spec", template.get("spec").cloned().unwrap_or_else(|| Value::Object(Map::new()))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Value::Object(pod)
}

fn walk(value: &Value, steps: &[Step], path: String, visit: &mut dyn FnMut(String, &Value)) {
    let Some((step, rest)) = steps.split_first() else {
        visit(path, value);
        return;
    };
    let join = |segment: &str| {
        if path.is_empty() { segment.to_string() } else { format!("{path}.{segment}") }
    };
    match step {
        Field(name) => {
            if let Some(next) = value.get(*name) {
                walk(next, rest, join(name), visit);
            }
        }
        Each => {
            for (i, next) in value.as_array().into_iter().flatten().enumerate() {
                walk(next, rest, format!("{path}[{i}]"), visit);
            }
        }
        Values => {
            for (key, next) in value.as_object().into_iter().flatten() {
                walk(next, rest, join(key), visit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A view parses each container once, init, app then ephemeral, with the paths findings
    /// use and what did not parse; its requests are [`resources::pod_requests`] of its spec.
    #[test]
    fn a_view_parses_its_containers_once_with_their_paths() {
        let job = json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
            "spec": {"template": {"spec": {
                "initContainers": [
                    {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "fetch", "resources": {"limits": {"cpu": "3", "nvidia.com/gpu": "x1"}}}
                ],
                "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "2"}}}],
                "ephemeralContainers": [{"name": "debug", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "overhead": {"cpu": "100m"}
            }}}
        });
        let views = pods_of(&job, "batch", "Job");
        let view = &views[0];
        let parsed = view.containers();
        let paths: Vec<_> = parsed.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.template.spec.initContainers[0]",
                "spec.template.spec.initContainers[1]",
                "spec.template.spec.containers[0]",
                "spec.template.spec.ephemeralContainers[0]"
            ]
        );
        assert!(parsed[0].is_init() && parsed[1].is_init() && !parsed[2].is_init() && parsed[3].is_ephemeral());
        let bad: Vec<_> = parsed[1].bad.iter().map(|b| b.path.as_str()).collect();
        assert_eq!(bad, ["spec.template.spec.initContainers[1].resources.limits[nvidia.com/gpu]"]);
        assert_eq!(parsed[1].resources.limits.get("cpu"), Some(&crate::model::quantity::Quantity::from_units(3)));
        let names: Vec<_> = view.containers_with_json().map(|(_, c)| c["name"].as_str().unwrap_or("?")).collect();
        assert_eq!(names, ["side", "fetch", "train", "debug"]);
        assert!(std::ptr::eq(view.containers(), parsed), "parsed once");
        // Ephemeral containers ask nothing; the sidecar runs beside the app; overhead is added.
        assert_eq!(view.requests(), &resources::pod_requests(&view.pod["spec"]));
        assert_eq!(view.requests().get("nvidia.com/gpu"), Some(&crate::model::quantity::Quantity::from_units(2)));
        assert_eq!(
            view.requests().get("cpu"),
            Some(&crate::model::quantity::Quantity::parse("4100m").expect("quantity"))
        );
    }

    /// The requests worked out from the parsed containers are `pod_requests` of the spec, for
    /// every Pod view of every captured review.
    #[test]
    fn view_requests_match_pod_requests_on_every_fixture() {
        let mut views = 0;
        for (_, review) in crate::model::fixtures::reviews() {
            let object = &review["request"]["object"];
            let group = group_of(object["apiVersion"].as_str().unwrap_or(""));
            let kind = object["kind"].as_str().unwrap_or("");
            for view in pods_of(object, group, kind) {
                assert_eq!(view.requests(), &resources::pod_requests(&view.pod["spec"]), "{}", view.path);
                views += 1;
            }
        }
        assert!(views >= 20, "{views} views");
    }

    #[test]
    fn jobset_paths_are_readable() {
        let jobset = json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js", "namespace": "vision"},
            "spec": {"replicatedJobs": [
                {"template": {"spec": {"template": {"spec": {"containers": [{"name": "a"}]}}}}},
                {"template": {"spec": {"template": {"spec": {"containers": [{"name": "b"}]}}}}},
            ]}
        });
        let pods = pods_of(&jobset, "jobset.x-k8s.io", "JobSet");
        let paths: Vec<_> = pods.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["spec.replicatedJobs[0].template.spec.template", "spec.replicatedJobs[1].template.spec.template"]
        );
        assert_eq!(pods[1].pod.field(&["metadata", "namespace"]), Some(&json!("vision")));
        assert_eq!(pods[1].pod.pointer("/spec/containers/0/name"), Some(&json!("b")));
    }

    #[test]
    fn templates_that_make_no_pods() {
        let jobset = json!({"spec": {"replicatedJobs": [
            {"replicas": 2, "template": {"spec": {"parallelism": 3, "template": {}}}},
            {"replicas": 0, "template": {"spec": {"template": {}}}},
            {"template": {"spec": {"parallelism": 0, "template": {}}}},
            {"template": {"spec": {"template": {}}}},
        ]}});
        let makes = |i: usize| {
            template_makes_pods(
                &jobset,
                "jobset.x-k8s.io",
                "JobSet",
                &format!("spec.replicatedJobs[{i}].template.spec.template"),
            )
        };
        assert_eq!((0..5).map(makes).collect::<Vec<_>>(), [true, false, false, true, true], "[4]: no such job");
        let lws = |leader: bool, size: Value| {
            let mut spec = json!({"size": size, "workerTemplate": {}});
            if leader {
                spec["leaderTemplate"] = json!({});
            }
            let lws = json!({"spec": {"leaderWorkerTemplate": spec}});
            let kind = ("leaderworkerset.x-k8s.io", "LeaderWorkerSet");
            let worker = template_makes_pods(&lws, kind.0, kind.1, "spec.leaderWorkerTemplate.workerTemplate");
            let leader = template_makes_pods(&lws, kind.0, kind.1, "spec.leaderWorkerTemplate.leaderTemplate");
            (leader, worker)
        };
        assert_eq!(lws(true, json!(1)), (true, false), "groups of their leader alone");
        assert_eq!(lws(true, json!(4)), (true, true));
        assert_eq!(lws(false, json!(1)), (true, true), "the worker template is the leader's too");
        assert!(template_makes_pods(&json!({}), "kubeflow.org", "PyTorchJob", "spec.x.Worker.template"));
    }

    #[test]
    fn kubeflow_replica_maps() {
        let job = json!({"spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": []}}},
            "Worker": {"replicas": 3, "template": {"spec": {"containers": []}}},
        }}});
        let paths: Vec<_> = pods_of(&job, "kubeflow.org", "PyTorchJob").into_iter().map(|p| p.path).collect();
        assert_eq!(paths, ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"]);
    }

    #[test]
    fn trainjob_resources_become_a_container() {
        let job = json!({"spec": {"trainer": {"resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}}}});
        let pods = pods_of(&job, "trainer.kubeflow.org", "TrainJob");
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].path, "spec.trainer");
        assert_eq!(pods[0].pod.pointer("/spec/containers/0/resources/limits/nvidia.com~1gpu"), Some(&json!(8)));
        assert_eq!(pods[0].pod.pointer("/spec/containers/0/image"), None, "the image comes from the runtime");
        let job = json!({"spec": {"trainer": {"image": "ghcr.io/x/t:1", "command": ["torchrun"], "numNodes": 2}}});
        let pods = pods_of(&job, "trainer.kubeflow.org", "TrainJob");
        assert_eq!(pods[0].pod.pointer("/spec/containers/0/image"), Some(&json!("ghcr.io/x/t:1")));
        assert_eq!(pods[0].pod.pointer("/spec/containers/0/command/0"), Some(&json!("torchrun")));
        assert_eq!(pods[0].pod.pointer("/spec/containers/0/numNodes"), None);
    }

    #[test]
    fn unknown_kinds_and_missing_fields_yield_nothing() {
        assert!(pods_of(&json!({}), "example.com", "Widget").is_empty());
        assert!(pods_of(&json!({"spec": {}}), "batch", "Job").is_empty());
        assert!(pods_of(&json!({"spec": {"tasks": "oops"}}), "batch.volcano.sh", "Job").is_empty());
    }

    #[test]
    fn every_kind_in_the_table_is_unique() {
        for (i, a) in WORKLOAD_KINDS.iter().enumerate() {
            for b in &WORKLOAD_KINDS[i + 1..] {
                assert!(!(a.group == b.group && a.kind == b.kind), "{}/{} twice", a.group, a.kind);
            }
        }
    }
}
