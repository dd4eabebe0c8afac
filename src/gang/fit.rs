//! Node feasibility, as the kube-scheduler's filters see it for the cases that decide whether a
//! gang fits: resources (effective requests, incl. accelerators and the pod count), nodeSelector,
//! required node affinity, taints vs tolerations, cordoned nodes.
//!
//! Pure data in, answers out: [`NodeInfo`] and [`PodShape`] come from the cluster view.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Taint, Toleration};

use crate::cluster::records::{NodeInfo, PodShape};
use crate::quantity::Quantity;
use crate::resources::ResourceList;

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

/// The filters that do not depend on what else runs on the node.
pub fn node_admits(node: &NodeInfo, shape: &PodShape) -> bool {
    if node.unschedulable {
        let cordon =
            Taint { key: "node.kubernetes.io/unschedulable".into(), effect: "NoSchedule".into(), ..Default::default() };
        if !tolerates(&shape.tolerations, &cordon) {
            return false;
        }
    }
    if node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|t| !tolerates(&shape.tolerations, t))
    {
        return false;
    }
    if !shape.node_selector.iter().all(|(k, v)| node.labels.get(k) == Some(v)) {
        return false;
    }
    match &shape.affinity {
        Some(terms) => terms.iter().any(|t| term_matches(node, t)),
        None => true,
    }
}

/// True when `requests` fit in `free` (resources the node does not offer have zero free).
pub fn fits(free: &ResourceList, requests: &ResourceList) -> bool {
    requests.iter().all(|(name, q)| *q <= Quantity::ZERO || free.get(name).is_some_and(|f| f >= q))
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
        PodShape {
            tolerations: vec![Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some("Exists".into()),
                ..Default::default()
            }],
            ..Default::default()
        }
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
        shape.node_selector.insert("node-type".into(), "cheap".into());
        assert!(!node_admits(&gpu_node(), &shape));
        let mut shape = tolerating();
        let req = |key: &str, op: &str, values: &[&str]| NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|s| s.to_string()).collect()),
        };
        shape.affinity = Some(vec![NodeSelectorTerm {
            match_expressions: Some(vec![req("gen", "Gt", &["8"])]),
            match_fields: None,
        }]);
        assert!(node_admits(&gpu_node(), &shape));
        shape.affinity = Some(vec![
            NodeSelectorTerm { match_expressions: Some(vec![req("gen", "Lt", &["8"])]), match_fields: None },
            NodeSelectorTerm { match_expressions: None, match_fields: Some(vec![req("metadata.name", "In", &["n1"])]) },
        ]);
        assert!(node_admits(&gpu_node(), &shape), "terms are ORed");
        shape.affinity = Some(vec![NodeSelectorTerm::default()]);
        assert!(!node_admits(&gpu_node(), &shape), "an empty term matches nothing");
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
