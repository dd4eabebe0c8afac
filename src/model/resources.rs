//! Resource accounting over raw Pod JSON: which resource names are accelerators, what a
//! container asks for, and a Pod's effective request with the kube-scheduler's formula.
//!
//! Works on `serde_json::Value` rather than typed k8s-openapi structs: admission sees whatever
//! the API server sends (and the CLI whatever a user wrote), and a typed parse would both cost
//! time on the hot path and reject objects the API server would still accept.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::quantity::{Quantity, QuantityError};

/// Per-resource-name amounts.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A set of resource names: exact names (`nvidia.com/gpu`) and prefixes written with a
/// trailing `*` (`nvidia.com/mig-*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceMatcher {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl ResourceMatcher {
    /// Builds a matcher from patterns; a pattern ending in `*` is a prefix.
    pub fn new<I, S>(patterns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut matcher = ResourceMatcher::default();
        for pattern in patterns {
            let pattern = pattern.as_ref();
            match pattern.strip_suffix('*') {
                Some(prefix) => matcher.prefixes.push(prefix.to_string()),
                None => matcher.exact.push(pattern.to_string()),
            }
        }
        matcher
    }

    /// The exact names and the prefixes (`allot compile` turns them into CEL).
    pub fn patterns(&self) -> (&[String], &[String]) {
        (&self.exact, &self.prefixes)
    }

    /// True when `name` is in the set.
    pub fn matches(&self, name: &str) -> bool {
        self.exact.iter().any(|e| e == name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// The accelerator resource names Allot knows without configuration.
pub const DEFAULT_ACCELERATORS: &[&str] = &[
    "nvidia.com/gpu",
    "nvidia.com/mig-*",
    "nvidia.com/gpu.shared",
    "amd.com/gpu",
    "gpu.intel.com/*",
    "habana.ai/gaudi",
    "aws.amazon.com/neuron*",
    "google.com/tpu",
];

/// One resource entry that could not be parsed, with its JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadQuantity {
    pub path: String,
    pub error: QuantityError,
}

/// The `requests` and `limits` of one container, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub requests: ResourceList,
    pub limits: ResourceList,
}

impl ContainerResources {
    /// Reads `container.resources`; unparsable entries are reported in `bad` and skipped.
    pub fn from_container(container: &Value, path: &str, bad: &mut Vec<BadQuantity>) -> Self {
        let resources = container.get("resources");
        let read = |field: &str, bad: &mut Vec<BadQuantity>| {
            let mut list = ResourceList::new();
            if let Some(Value::Object(map)) = resources.and_then(|r| r.get(field)) {
                for (name, raw) in map {
                    match Quantity::from_json(raw) {
                        Ok(q) => {
                            list.insert(name.clone(), q);
                        }
                        Err(error) => {
                            bad.push(BadQuantity { path: format!("{path}.resources.{field}[{name}]"), error })
                        }
                    }
                }
            }
            list
        };
        ContainerResources { requests: read("requests", bad), limits: read("limits", bad) }
    }

    /// What the container asks for: its requests, with limits standing in for absent requests
    /// (the API server defaults a missing request to the limit).
    pub fn effective_requests(&self) -> ResourceList {
        let mut out = self.requests.clone();
        for (name, limit) in &self.limits {
            out.entry(name.clone()).or_insert(*limit);
        }
        out
    }

    /// One resource of [`ContainerResources::effective_requests`], without building the list.
    pub fn effective_request(&self, name: &str) -> Option<&Quantity> {
        self.requests.get(name).or_else(|| self.limits.get(name))
    }
}

/// Adds `other` into `total` (saturating).
pub fn add_into(total: &mut ResourceList, other: &ResourceList) {
    for (name, q) in other {
        let slot = total.entry(name.clone()).or_default();
        *slot = slot.saturating_add(*q);
    }
}

fn max_into(total: &mut ResourceList, other: &ResourceList) {
    for (name, q) in other {
        let slot = total.entry(name.clone()).or_default();
        if *q > *slot {
            *slot = *q;
        }
    }
}

/// Iterates `(list, index, container)` over the containers of a pod spec held in `lists` (of
/// [`CONTAINER_LISTS`]), list by list in the order given.
pub fn containers<'a>(
    spec: &'a Value,
    lists: &'a [&'static str],
) -> impl Iterator<Item = (&'static str, usize, &'a Value)> + 'a {
    lists.iter().flat_map(move |&list| {
        spec.get(list).and_then(Value::as_array).into_iter().flatten().enumerate().map(move |(i, c)| (list, i, c))
    })
}

/// True for an init container that keeps running beside the app (a native sidecar).
pub fn is_sidecar(init_container: &Value) -> bool {
    init_container.get("restartPolicy").and_then(Value::as_str) == Some("Always")
}

/// The container lists of a pod spec, in the order [`parse_containers`] reads them.
pub const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// The lists whose containers ask for resources (ephemeral containers cannot), init first.
pub const ASKING_LISTS: [&str; 2] = ["initContainers", "containers"];

/// One container of a pod spec with its resources parsed: a Pod view parses each container
/// once ([`crate::model::workload::PodView::containers`]) for every check that reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedContainer {
    /// Where it is, `spec.containers[0]` (after the view's prefix): findings point there.
    pub path: String,
    /// Which of [`CONTAINER_LISTS`] holds it, and where in that list.
    pub list: &'static str,
    pub index: usize,
    pub resources: ContainerResources,
    /// Entries of its requests and limits that do not parse, with their paths.
    pub bad: Vec<BadQuantity>,
}

impl ParsedContainer {
    pub fn is_init(&self) -> bool {
        self.list == "initContainers"
    }

    pub fn is_ephemeral(&self) -> bool {
        self.list == "ephemeralContainers"
    }

    /// Its JSON in `spec`.
    pub fn json<'v>(&self, spec: &'v Value) -> Option<&'v Value> {
        spec.get(self.list)?.get(self.index)
    }
}

/// Every container of a pod spec (init, app, then ephemeral containers) with its resources.
pub fn parse_containers(spec: &Value, spec_path: &str) -> Vec<ParsedContainer> {
    containers(spec, &CONTAINER_LISTS)
        .map(|(list, index, container)| {
            let path = format!("{spec_path}.{list}[{index}]");
            let mut bad = Vec::new();
            let resources = ContainerResources::from_container(container, &path, &mut bad);
            ParsedContainer { path, list, index, resources, bad }
        })
        .collect()
}

/// A Pod's effective request per resource, as the kube-scheduler computes it:
/// `max(Σ app containers + Σ sidecars, max over init containers of (init + sidecars started
/// before it)) + overhead`, where a pod-level request (`spec.resources`, cpu, memory and huge
/// pages) replaces the containers' sum of that resource.
pub fn pod_requests(spec: &Value) -> ResourceList {
    let mut ignored = Vec::new();
    let parsed: Vec<_> = containers(spec, &ASKING_LISTS)
        .map(|(list, _, c)| (c, list == "initContainers", ContainerResources::from_container(c, "", &mut ignored)))
        .collect();
    pod_requests_of(spec, parsed.iter().map(|(c, is_init, r)| (*c, *is_init, r)))
}

/// [`pod_requests`] over containers already parsed: `(container, is_init, its resources)` for
/// the init containers (in order) and the app containers; ephemeral containers ask nothing.
pub fn pod_requests_of<'c>(
    spec: &Value,
    containers: impl Iterator<Item = (&'c Value, bool, &'c ContainerResources)>,
) -> ResourceList {
    let mut app = ResourceList::new();
    let mut sidecars = ResourceList::new();
    let mut init_peak = ResourceList::new();
    for (c, is_init, resources) in containers {
        let reqs = resources.effective_requests();
        if !is_init {
            add_into(&mut app, &reqs);
        } else if is_sidecar(c) {
            add_into(&mut sidecars, &reqs);
            max_into(&mut init_peak, &sidecars);
        } else {
            let mut during = reqs;
            add_into(&mut during, &sidecars);
            max_into(&mut init_peak, &during);
        }
    }
    add_into(&mut app, &sidecars);
    max_into(&mut app, &init_peak);
    app.extend(pod_level_requests(spec));
    if let Some(Value::Object(overhead)) = spec.get("overhead") {
        let mut extra = ResourceList::new();
        for (name, raw) in overhead {
            if let Ok(q) = Quantity::from_json(raw) {
                extra.insert(name.clone(), q);
            }
        }
        add_into(&mut app, &extra);
    }
    app.retain(|_, q| *q != Quantity::ZERO);
    app
}

/// The pod-level requests of `spec.resources` (Kubernetes 1.34+, PodLevelResources), which the
/// scheduler uses instead of the containers' sum for the resources a pod may set there (cpu,
/// memory, huge pages; the API server refuses others). A limit without a request is the request,
/// as the API server defaults it (an undefaulted manifest in `allot check` counts the same).
fn pod_level_requests(spec: &Value) -> ResourceList {
    let Some(Value::Object(resources)) = spec.get("resources") else { return ResourceList::new() };
    let pod_level = |name: &str| name == "cpu" || name == "memory" || name.starts_with("hugepages-");
    let mut out = ResourceList::new();
    for list in ["limits", "requests"] {
        let Some(Value::Object(entries)) = resources.get(list) else { continue };
        for (name, raw) in entries.iter().filter(|(name, _)| pod_level(name)) {
            if let Ok(q) = Quantity::from_json(raw) {
                out.insert(name.clone(), q);
            }
        }
    }
    out
}

/// Keeps only the accelerator entries of a resource list.
pub fn accelerators_only(list: &ResourceList, matcher: &ResourceMatcher) -> ResourceList {
    accelerator_entries(list, matcher).map(|(n, q)| (n.to_string(), q)).collect()
}

/// The accelerator entries of a resource list, borrowed (for checks run on every review).
pub fn accelerator_entries<'l>(
    list: &'l ResourceList,
    matcher: &ResourceMatcher,
) -> impl Iterator<Item = (&'l str, Quantity)> {
    list.iter().filter(|(n, _)| matcher.matches(n)).map(|(n, q)| (n.as_str(), *q))
}

/// True when any container (init, sidecar or app) of the pod spec asks for an accelerator in
/// its requests or limits: names it with an amount other than zero. `nvidia.com/gpu: 0` asks
/// for nothing (the scheduler fits it on nodes without GPUs), so it neither gets a GPU
/// placement nor counts as asking for a GPU (it got the GPU toleration and the pool's nodes
/// while charged nothing). An amount that does not parse counts as asking: it is denied
/// elsewhere, and must not slip out of what accelerator pods get.
pub fn requests_any(spec: &Value, matcher: &ResourceMatcher) -> bool {
    let nonzero = |v: &Value| match v {
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => Quantity::parse(s).ok() != Some(Quantity::ZERO),
        _ => true,
    };
    containers(spec, &ASKING_LISTS).any(|(_, _, c)| {
        ["requests", "limits"].iter().any(|field| {
            c.get("resources")
                .and_then(|r| r.get(*field))
                .and_then(Value::as_object)
                .is_some_and(|m| m.iter().any(|(k, v)| matcher.matches(k) && nonzero(v)))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn matcher_exact_and_prefix() {
        let m = ResourceMatcher::new(["nvidia.com/gpu", "nvidia.com/mig-*"]);
        assert!(m.matches("nvidia.com/gpu"));
        assert!(m.matches("nvidia.com/mig-1g.10gb"));
        assert!(!m.matches("nvidia.com/gpu.shared"));
        assert!(!m.matches("cpu"));
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        let spec = json!({"containers": [{"resources": {"limits": {"nvidia.com/gpu": 2}}}]});
        assert_eq!(pod_requests(&spec).get("nvidia.com/gpu"), Some(&q("2")));
    }

    #[test]
    fn scheduler_formula_with_init_sidecars_and_overhead() {
        let spec = json!({
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "big-init", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}},
            ],
            "containers": [
                {"resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "2"}}},
                {"resources": {"requests": {"cpu": "500m"}}},
            ],
            "overhead": {"cpu": "100m"}
        });
        let r = pod_requests(&spec);
        // init phase peak: big-init 4 + sidecar 1 = 5; app phase: 1 + 0.5 + sidecar 1 = 2.5
        assert_eq!(r.get("cpu"), Some(&q("5.1")));
        // gpu: max(2, 1) = 2
        assert_eq!(r.get("nvidia.com/gpu"), Some(&q("2")));
    }

    /// Pod-level requests (`spec.resources`) replace the containers' sum of cpu and memory, as
    /// the scheduler counts them: a pod whose containers ask nothing but which asks 64 CPUs at
    /// the pod level holds 64 CPUs (a cpu quota must charge them).
    #[test]
    fn pod_level_requests_replace_the_containers_sum() {
        let spec = json!({
            "resources": {"requests": {"cpu": "64"}, "limits": {"memory": "256Gi", "nvidia.com/gpu": "8"}},
            "containers": [
                {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}},
                {"resources": {}}
            ],
            "overhead": {"cpu": "250m"}
        });
        let r = pod_requests(&spec);
        assert_eq!(r.get("cpu"), Some(&q("64.25")), "the pod-level request, plus the overhead");
        assert_eq!(r.get("memory"), Some(&q("256Gi")), "a pod-level limit without a request is the request");
        assert_eq!(r.get("nvidia.com/gpu"), Some(&q("1")), "not a pod-level resource: the containers' sum");
    }

    #[test]
    fn requests_any_sees_init_containers() {
        let m = ResourceMatcher::new(DEFAULT_ACCELERATORS);
        let spec = json!({"initContainers": [{"resources": {"limits": {"amd.com/gpu": 1}}}], "containers": [{}]});
        assert!(requests_any(&spec, &m));
        assert!(!requests_any(&json!({"containers": [{"resources": {"limits": {"cpu": 1}}}]}), &m));
        // Zero asks for nothing, however written; what does not parse counts as asking.
        for zero in [json!(0), json!("0"), json!("0m"), json!(0.0)] {
            let spec = json!({"containers": [{"resources": {"limits": {"nvidia.com/gpu": zero}}}]});
            assert!(!requests_any(&spec, &m), "{spec}");
        }
        assert!(requests_any(&json!({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "x"}}}]}), &m));
    }
}
