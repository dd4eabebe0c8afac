//! Values a policy writes into Pods, checked at load with the API server's own rules
//! ([`crate::model::apivalidation`]). A Placement whose nodeSelector key the API server refuses would
//! otherwise make every Pod it mutates fail at `kubectl apply`; refusing the policy instead
//! keeps the last good set in force and names the file, document and field to fix.
//!
//! Each function returns `field: problem` strings; the caller prefixes its document location.

use super::model::{ClusterPrioritySpec, NodeSelectorOperator, PlacementSpec, TeamPrioritySpec};
use crate::model::apivalidation::{self, FieldError};

fn render(errors: Vec<FieldError>) -> impl Iterator<Item = String> {
    errors.into_iter().map(|e| e.to_string())
}

/// Tolerations, nodeSelector and node-affinity requirements of a Placement.
pub fn placement(spec: &PlacementSpec) -> Vec<String> {
    let mut out = Vec::new();
    for (i, toleration) in spec.tolerations.iter().enumerate() {
        let value = serde_json::to_value(toleration).unwrap_or_default();
        out.extend(render(apivalidation::toleration(&value, &format!("spec.tolerations[{i}]"))));
    }
    let selector = serde_json::to_value(&spec.node_selector).unwrap_or_default();
    out.extend(render(apivalidation::labels(&selector, "spec.nodeSelector")));
    for (i, req) in spec.node_affinity.iter().enumerate() {
        let path = format!("spec.nodeAffinity[{i}]");
        // Placements add required terms, whose values the API server checks as label values;
        // operator and value count exactly as the API server checks them (`Gt`/`Lt`: one value).
        let operator = serde_json::to_value(req.operator).unwrap_or_default();
        let count = apivalidation::requirement_operator(operator.as_str().unwrap_or_default(), req.values.len(), &path);
        out.extend(count.map(|e| e.to_string()));
        let values = req.values.iter().map(String::as_str);
        out.extend(render(apivalidation::requirement_key_and_values(&req.key, values, true, &path)));
        // The API server takes any single value; the scheduler compares integers only, so
        // anything else would keep every mutated Pod Pending.
        if matches!(req.operator, NodeSelectorOperator::Gt | NodeSelectorOperator::Lt) {
            for (j, v) in req.values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    out.push(format!(
                        "{path}.values[{j}]: Invalid value: {v:?}: must be an integer when `operator` is 'Gt' or 'Lt'"
                    ));
                }
            }
        }
    }
    out
}

fn class_name(name: &str, path: &str) -> Vec<String> {
    render(apivalidation::priority_class_name(name, path)).collect()
}

/// A Team's default and allowed priority class names.
pub fn team_priority(priority: &TeamPrioritySpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(default) = &priority.default {
        out.extend(class_name(default, "spec.priority.default"));
    }
    for (i, name) in priority.allowed.iter().flatten().enumerate() {
        out.extend(class_name(name, &format!("spec.priority.allowed[{i}]")));
    }
    out
}

/// The Cluster's default and globalDefault priority class names.
pub fn cluster_priority(priority: &ClusterPrioritySpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(default) = &priority.default {
        out.extend(class_name(default, "spec.priority.default"));
    }
    if let Some(global) = &priority.global_default {
        out.extend(class_name(global, "spec.priority.globalDefault"));
    }
    out
}
