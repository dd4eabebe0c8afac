//! Node feasibility, as the kube-scheduler's filters see it for the cases that decide whether a
//! gang fits: resources (effective requests, incl. accelerators and the pod count), nodeSelector,
//! required node affinity, taints vs tolerations, cordoned nodes.
//!
//! Pure data in, answers out: [`NodeInfo`] and [`PodShape`] come from the cluster view.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Taint, Toleration};

use crate::control::cluster::records::{NodeInfo, PodShape};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let key_ok = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(k) => k == taint.key,
        };
        let effect_ok = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
        let value_ok = t.operator.as_deref() == Some("Exists")
            || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
        key_ok && effect_ok && value_ok
    })
}

fn requirement_matches(labels: &BTreeMap<String, String>, key: &str, operator: &str, values: &[String]) -> bool {
    let value = labels.get(key);
    match operator {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) =
                (value.and_then(|v| v.parse::<i64>().ok()), values.first().and_then(|b| b.parse::<i64>().ok()))
            else {
                return false;
            };
            if operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

fn term_matches(node: &NodeInfo, term: &NodeSelectorTerm) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false; // an empty term matches nothing
    }
    let name_labels = BTreeMap::from([("metadata.name".to_string(), node.name.clone())]);
    exprs
        .iter()
        .all(|r| requirement_matches(&node.labels, &r.key, &r.operator, r.values.as_deref().unwrap_or_default()))
        && fields
            .iter()
            .all(|r| requirement_matches(&name_labels, &r.key, &r.operator, r.values.as_deref().unwrap_or_default()))
}

/// Why a node's static filters turn a pod away (the first filter that does, in the order the
/// kube-scheduler's plugins report them): what `allot explain` shows per node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum NodeRefusal {
    /// Cordoned (`spec.unschedulable`), and the pod does not tolerate it.
    Cordoned,
    /// A NoSchedule/NoExecute taint the pod does not tolerate.
    Taint { key: String, value: Option<String>, effect: String },
    /// A nodeSelector entry the node's labels do not satisfy (`actual`: the node's value).
    Selector { key: String, wanted: String, actual: Option<String> },
    /// No term of the pod's required node affinity matches the node.
    Affinity,
}

impl std::fmt::Display for NodeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeRefusal::Cordoned => write!(f, "cordoned"),
            NodeRefusal::Taint { key, value, effect } => match value {
                Some(v) if !v.is_empty() => write!(f, "taint {key}={v}:{effect} not tolerated"),
                _ => write!(f, "taint {key}:{effect} not tolerated"),
            },
            NodeRefusal::Selector { key, wanted, actual } => match actual {
                Some(a) => write!(f, "nodeSelector {key}={wanted}, node has {key}={a}"),
                None => write!(f, "nodeSelector {key}={wanted}, node has no {key} label"),
            },
            NodeRefusal::Affinity => write!(f, "required node affinity does not match"),
        }
    }
}

/// The filters that do not depend on what else runs on the node: `None` when the node admits
/// the pod, else the first reason it does not.
pub fn node_refusal(node: &NodeInfo, shape: &PodShape) -> Option<NodeRefusal> {
    if node.unschedulable {
        let cordon =
            Taint { key: "node.kubernetes.io/unschedulable".into(), effect: "NoSchedule".into(), ..Default::default() };
        if !tolerates(shape.tolerations(), &cordon) {
            return Some(NodeRefusal::Cordoned);
        }
    }
    if let Some(t) = node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerates(shape.tolerations(), t))
    {
        return Some(NodeRefusal::Taint { key: t.key.clone(), value: t.value.clone(), effect: t.effect.clone() });
    }
    if let Some((k, v)) = shape.node_selector().iter().find(|(k, v)| node.labels.get(*k) != Some(*v)) {
        return Some(NodeRefusal::Selector { key: k.clone(), wanted: v.clone(), actual: node.labels.get(k).cloned() });
    }
    match shape.affinity() {
        Some(terms) if !terms.iter().any(|t| term_matches(node, t)) => Some(NodeRefusal::Affinity),
        _ => None,
    }
}

/// The filters that do not depend on what else runs on the node.
pub fn node_admits(node: &NodeInfo, shape: &PodShape) -> bool {
    node_refusal(node, shape).is_none()
}

/// True when the fit cannot judge `name` on a node offering `free`: a DeviceClass's claim
/// devices where the ResourceSlices have not been read (the node then has no entry for it at
/// all; read, it has one, 0 where it offers none). Such a request is left out of the fit.
pub(super) fn unjudged(free: &ResourceList, name: &str) -> bool {
    name.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX) && !free.contains_key(name)
}

/// How many pods asking `requests` fit in `free` at once (resources asked as zero are free;
/// a pod asking nothing is bounded by `cap`).
pub fn copies_that_fit(free: &ResourceList, requests: &ResourceList, cap: u64) -> u64 {
    requests
        .iter()
        .filter(|(name, q)| **q > Quantity::ZERO && !unjudged(free, name))
        .map(|(name, q)| {
            let f = free.get(name).map_or(0, |f| f.nanos().max(0));
            u64::try_from(f / q.nanos()).unwrap_or(u64::MAX)
        })
        .fold(cap, u64::min)
}

/// What `requests` asks beyond `free`: `(resource, asked, free)` per resource short.
pub fn shortfall(free: &ResourceList, requests: &ResourceList) -> Vec<(String, Quantity, Quantity)> {
    requests
        .iter()
        .filter(|(name, q)| **q > Quantity::ZERO && !unjudged(free, name))
        .filter_map(|(name, q)| {
            let f = free.get(name).copied().unwrap_or(Quantity::ZERO);
            (f < *q).then(|| (name.clone(), *q, f))
        })
        .collect()
}

/// True when `requests` fit in `free` (resources the node does not offer have zero free).
pub fn fits(free: &ResourceList, requests: &ResourceList) -> bool {
    requests
        .iter()
        .all(|(name, q)| *q <= Quantity::ZERO || unjudged(free, name) || free.get(name).is_some_and(|f| f >= q))
}

/// `free -= requests`, never below what is there (callers check [`fits`] first).
pub fn take(free: &mut ResourceList, requests: &ResourceList) {
    for (name, q) in requests {
        if let Some(f) = free.get_mut(name) {
            *f = Quantity::from_nanos(f.nanos() - q.nanos());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::cluster::records::Placement;
    use k8s_openapi::api::core::v1::NodeSelectorRequirement;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn gpu_node() -> NodeInfo {
        NodeInfo {
            name: "n1".into(),
            labels: BTreeMap::from([("node-type".into(), "my-precious".into()), ("gen".into(), "9".into())]),
            taints: vec![Taint { key: "nvidia.com/gpu".into(), effect: "NoSchedule".into(), ..Default::default() }],
            unschedulable: false,
            allocatable: BTreeMap::from([("nvidia.com/gpu".into(), q("2")), ("pods".into(), q("110"))]),
        }
    }

    fn tolerating() -> PodShape {
        let tolerations = vec![Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        PodShape::new(ResourceList::new(), Placement { tolerations, ..Default::default() })
    }

    #[test]
    fn taints_need_tolerations() {
        assert!(!node_admits(&gpu_node(), &PodShape::default()));
        assert!(node_admits(&gpu_node(), &tolerating()));
        let mut cordoned = gpu_node();
        cordoned.unschedulable = true;
        assert!(!node_admits(&cordoned, &tolerating()));
    }

    #[test]
    fn selectors_and_affinity() {
        let mut shape = tolerating();
        shape.placement_mut().node_selector.insert("node-type".into(), "cheap".into());
        assert!(!node_admits(&gpu_node(), &shape));
        let mut shape = tolerating();
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        };
        shape.placement_mut().affinity = Some(vec![NodeSelectorTerm {
            match_expressions: Some(vec![req("gen", "Gt", &["8"])]),
            match_fields: None,
        }]);
        assert!(node_admits(&gpu_node(), &shape));
        shape.placement_mut().affinity = Some(vec![
            NodeSelectorTerm { match_expressions: Some(vec![req("gen", "Lt", &["8"])]), match_fields: None },
            NodeSelectorTerm { match_expressions: None, match_fields: Some(vec![req("metadata.name", "In", &["n1"])]) },
        ]);
        assert!(node_admits(&gpu_node(), &shape), "terms are ORed");
        shape.placement_mut().affinity = Some(vec![NodeSelectorTerm::default()]);
        assert!(!node_admits(&gpu_node(), &shape), "an empty term matches nothing");
    }

    #[test]
    fn refusals_name_the_filter_that_fails() {
        let node = gpu_node();
        assert_eq!(
            node_refusal(&node, &PodShape::default()),
            Some(NodeRefusal::Taint { key: "nvidia.com/gpu".into(), value: None, effect: "NoSchedule".into() })
        );
        assert_eq!(node_refusal(&node, &tolerating()), None);
        let mut shape = tolerating();
        shape.placement_mut().node_selector.insert("node-type".into(), "cheap".into());
        let refusal = node_refusal(&node, &shape);
        assert_eq!(
            refusal,
            Some(NodeRefusal::Selector {
                key: "node-type".into(),
                wanted: "cheap".into(),
                actual: Some("my-precious".into())
            })
        );
        assert_eq!(refusal.unwrap().to_string(), "nodeSelector node-type=cheap, node has node-type=my-precious");
        shape.placement_mut().node_selector = BTreeMap::from([("zone".into(), "a".into())]);
        assert_eq!(node_refusal(&node, &shape).unwrap().to_string(), "nodeSelector zone=a, node has no zone label");
        let mut shape = tolerating();
        shape.placement_mut().affinity = Some(vec![NodeSelectorTerm::default()]);
        assert_eq!(node_refusal(&node, &shape), Some(NodeRefusal::Affinity));
        let mut cordoned = gpu_node();
        cordoned.unschedulable = true;
        assert_eq!(node_refusal(&cordoned, &tolerating()), Some(NodeRefusal::Cordoned));
    }

    #[test]
    fn copies_and_shortfall() {
        let free = BTreeMap::from([("nvidia.com/gpu".to_string(), q("5")), ("pods".to_string(), q("3"))]);
        let two = BTreeMap::from([("nvidia.com/gpu".to_string(), q("2")), ("pods".to_string(), q("1"))]);
        assert_eq!(copies_that_fit(&free, &two, 100), 2);
        let one = BTreeMap::from([("nvidia.com/gpu".to_string(), q("1")), ("pods".to_string(), q("1"))]);
        assert_eq!(copies_that_fit(&free, &one, 100), 3, "the pod count bounds it");
        assert_eq!(copies_that_fit(&free, &BTreeMap::new(), 7), 7);
        let big = BTreeMap::from([("nvidia.com/gpu".to_string(), q("8")), ("cpu".to_string(), q("1"))]);
        assert_eq!(copies_that_fit(&free, &big, 100), 0);
        assert_eq!(
            shortfall(&free, &big),
            vec![("cpu".to_string(), q("1"), Quantity::ZERO), ("nvidia.com/gpu".to_string(), q("8"), q("5"))]
        );
        assert!(shortfall(&free, &two).is_empty());
    }

    #[test]
    fn resource_fit() {
        let mut free = gpu_node().allocatable;
        let one = BTreeMap::from([("nvidia.com/gpu".to_string(), q("1")), ("pods".to_string(), q("1"))]);
        assert!(fits(&free, &one));
        take(&mut free, &one);
        take(&mut free, &one);
        assert!(!fits(&free, &one));
        assert!(
            !fits(&free, &BTreeMap::from([("amd.com/gpu".to_string(), q("1"))])),
            "unknown resources have none free"
        );
    }
}
