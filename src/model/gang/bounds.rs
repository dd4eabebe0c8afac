//! How large a placement (nodeSelector, required node affinity, tolerations) Allot keeps for a
//! pod it holds, and the one measure admission and the cluster view both apply.
//!
//! Kubernetes bounds none of these lists: a Pod may carry ~27,000 tolerations (`{key: kN,
//! operator: Exists}`) within its 1.5 MiB. Every replica keeps the placement of each gang member
//! it may release (`cluster::records`: the gang fit reads it), so an unbounded one would let a
//! tenant's few dozen pods cost every replica gigabytes, again at each relist. Admission denies
//! a pod Allot will gate whose placement is over these bounds (`tenant::check_placement_size`,
//! `tenant/placement-size`); a record of such a pod admitted anyway (before this check, or while
//! the webhook was bypassed) keeps only a small marker ([`PlacementExcess`]), and the gang
//! controller explains that its gang can never be placed.
//!
//! The numbers are far above what training jobs carry (a handful of tolerations: the
//! accelerator taint and the API server's two `NoExecute` defaults; a few selector keys; one or
//! two affinity terms listing zones, pools or, at most, some hundreds of host names) and small
//! enough that the worst placement kept costs a replica tens of kilobytes, not megabytes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Toleration};
use serde_json::Value;

/// Tolerations of one pod.
pub const MAX_TOLERATIONS: usize = 64;
/// nodeSelector keys of one pod.
pub const MAX_NODE_SELECTOR: usize = 64;
/// Required node-affinity terms (ORed) of one pod.
pub const MAX_AFFINITY_TERMS: usize = 16;
/// Requirements (matchExpressions and matchFields) in all its terms.
pub const MAX_AFFINITY_REQUIREMENTS: usize = 64;
/// Values in all those requirements (a host-name list of a thousand nodes fits).
pub const MAX_AFFINITY_VALUES: usize = 1024;
/// The three fields together as JSON: every string the others do not count.
pub const MAX_PLACEMENT_BYTES: usize = 16 * 1024;

/// Which part of a placement is over its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlacementPart {
    Tolerations,
    NodeSelector,
    AffinityTerms,
    AffinityRequirements,
    AffinityValues,
    Bytes,
}

/// A placement over one of the bounds: which part, how much it holds (for bytes: at least this
/// much; counting stops at the bound) and the bound. Small and `Copy`: it is what a record keeps
/// instead of such a placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlacementExcess {
    pub part: PlacementPart,
    pub found: usize,
    pub limit: usize,
}

const AFFINITY: &str = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";

impl PlacementExcess {
    /// The field it names, as a path below the pod.
    pub fn field(&self) -> &'static str {
        match self.part {
            PlacementPart::Tolerations => "spec.tolerations",
            PlacementPart::NodeSelector => "spec.nodeSelector",
            PlacementPart::AffinityTerms => AFFINITY,
            PlacementPart::AffinityRequirements => "spec.affinity.nodeAffinity (matchExpressions and matchFields)",
            PlacementPart::AffinityValues => "spec.affinity.nodeAffinity (values)",
            PlacementPart::Bytes => "spec.nodeSelector, spec.tolerations and required node affinity",
        }
    }

    fn unit(&self) -> &'static str {
        match self.part {
            PlacementPart::Tolerations => "tolerations",
            PlacementPart::NodeSelector => "keys",
            PlacementPart::AffinityTerms => "terms",
            PlacementPart::AffinityRequirements => "requirements",
            PlacementPart::AffinityValues => "values",
            PlacementPart::Bytes => "bytes as JSON",
        }
    }
}

impl PlacementExcess {
    /// "spec.tolerations has 27000 tolerations; at most 64", with `spec` the path of the spec
    /// it was found in (`spec.template.spec` in a workload).
    pub fn in_spec(&self, spec: &str) -> String {
        let over = if self.part == PlacementPart::Bytes { "more than " } else { "" };
        let field = self.field().replace("spec.", &format!("{spec}."));
        format!("{field} has {over}{} {}; at most {}", self.found, self.unit(), self.limit)
    }
}

impl std::fmt::Display for PlacementExcess {
    /// "spec.tolerations has 27000 tolerations; at most 64".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.in_spec("spec"))
    }
}

/// Counts, in order, with the first over its bound.
fn first_over(counts: [(PlacementPart, usize, usize); 5]) -> Option<PlacementExcess> {
    counts.into_iter().find(|(_, found, limit)| found > limit).map(|(part, found, limit)| PlacementExcess {
        part,
        found,
        limit,
    })
}

/// Counts bytes written and gives up (an error) once past `limit`: the size of a serialization
/// without building it, and without walking past the bound.
struct Counter {
    written: usize,
    limit: usize,
}

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written = self.written.saturating_add(buf.len());
        if self.written > self.limit {
            return Err(std::io::Error::other("over the bound"));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Over [`MAX_PLACEMENT_BYTES`] as JSON, given the three fields as anything serializable.
fn bytes_over(fields: &impl serde::Serialize) -> Option<PlacementExcess> {
    let mut counter = Counter { written: 0, limit: MAX_PLACEMENT_BYTES };
    serde_json::to_writer(&mut counter, fields).is_err().then_some(PlacementExcess {
        part: PlacementPart::Bytes,
        found: MAX_PLACEMENT_BYTES,
        limit: MAX_PLACEMENT_BYTES,
    })
}

/// The first bound a placement (as the cluster view reads it) is over, if any.
pub fn excess(
    node_selector: &BTreeMap<String, String>,
    affinity: Option<&[NodeSelectorTerm]>,
    tolerations: &[Toleration],
) -> Option<PlacementExcess> {
    let terms = affinity.unwrap_or_default();
    let requirements =
        || terms.iter().flat_map(|t| t.match_expressions.iter().flatten().chain(t.match_fields.iter().flatten()));
    let counted = first_over([
        (PlacementPart::Tolerations, tolerations.len(), MAX_TOLERATIONS),
        (PlacementPart::NodeSelector, node_selector.len(), MAX_NODE_SELECTOR),
        (PlacementPart::AffinityTerms, terms.len(), MAX_AFFINITY_TERMS),
        (PlacementPart::AffinityRequirements, requirements().count(), MAX_AFFINITY_REQUIREMENTS),
        (
            PlacementPart::AffinityValues,
            requirements().map(|r| r.values.as_ref().map_or(0, Vec::len)).sum(),
            MAX_AFFINITY_VALUES,
        ),
    ]);
    counted.or_else(|| bytes_over(&(node_selector, affinity, tolerations)))
}

/// An upper bound on the bytes `values` serialize to as JSON, and so on the bytes of any typed
/// value decoded from them (which keeps a subset of their fields, the same strings and
/// numbers): every string byte as a six-byte escape, every number at its longest, every
/// bracket, quote, colon and comma. `None` once past `limit`, where only the exact measure can
/// tell.
fn json_size_bound(values: &[Option<&Value>], limit: usize) -> Option<usize> {
    fn string(s: &str) -> usize {
        s.len().saturating_mul(6).saturating_add(3)
    }
    fn add(v: &Value, total: &mut usize, limit: usize) -> bool {
        *total = total.saturating_add(match v {
            Value::String(s) => string(s),
            Value::Number(_) => 25,
            Value::Bool(_) | Value::Null => 6,
            Value::Array(_) | Value::Object(_) => 3,
        });
        if *total > limit {
            return false;
        }
        match v {
            Value::Array(items) => items.iter().all(|item| add(item, total, limit)),
            Value::Object(map) => map.iter().all(|(key, item)| {
                *total = total.saturating_add(string(key) + 1);
                add(item, total, limit)
            }),
            _ => true,
        }
    }
    // The tuple's own brackets and commas, and what its parts write when absent (`[{},null,[]]`).
    let mut total = 16;
    values.iter().flatten().all(|v| add(v, &mut total, limit)).then_some(total)
}

/// The same measure over a Pod spec as JSON (admission, `allot check`): counts first, so a
/// hostile list is refused without being read into typed values.
pub fn excess_of_spec(spec: &Value) -> Option<PlacementExcess> {
    let len = |v: Option<&Value>| v.and_then(Value::as_array).map_or(0, Vec::len);
    let tolerations = spec.get("tolerations");
    let node_selector = spec.get("nodeSelector");
    let affinity = spec
        .get("affinity")
        .and_then(|a| a.get("nodeAffinity"))
        .and_then(|n| n.get("requiredDuringSchedulingIgnoredDuringExecution"))
        .and_then(|r| r.get("nodeSelectorTerms"));
    let terms = affinity.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let requirements = || terms.iter().flat_map(|t| [t.get("matchExpressions"), t.get("matchFields")]).flatten();
    let requirement_list = || requirements().filter_map(Value::as_array).flatten();
    let counted = first_over([
        (PlacementPart::Tolerations, len(tolerations), MAX_TOLERATIONS),
        (
            PlacementPart::NodeSelector,
            node_selector.and_then(Value::as_object).map_or(0, |m| m.len()),
            MAX_NODE_SELECTOR,
        ),
        (PlacementPart::AffinityTerms, terms.len(), MAX_AFFINITY_TERMS),
        (PlacementPart::AffinityRequirements, requirement_list().count(), MAX_AFFINITY_REQUIREMENTS),
        (PlacementPart::AffinityValues, requirement_list().map(|r| len(r.get("values"))).sum(), MAX_AFFINITY_VALUES),
    ]);
    if counted.is_some() {
        return counted;
    }
    // Most placements are a few short strings: a bound from the JSON alone says so without
    // decoding them into typed values and serializing those (13,000 instructions per review
    // of a held gang member, measured on fixture 019).
    if json_size_bound(&[node_selector, affinity, tolerations], MAX_PLACEMENT_BYTES).is_some() {
        return None;
    }
    // The bytes as the record measures them: from the typed fields (what the API server keeps
    // is what the watch decodes), so that a pod admitted here is never over the bound there.
    // Fields that do not decode are the API server's to refuse.
    fn typed(v: Option<&Value>) -> Option<&Value> {
        v.filter(|v| !v.is_null())
    }
    let selector: BTreeMap<String, String> =
        typed(node_selector).and_then(|v| serde::Deserialize::deserialize(v).ok()).unwrap_or_default();
    let affinity: Option<Vec<NodeSelectorTerm>> = typed(affinity).and_then(|v| serde::Deserialize::deserialize(v).ok());
    let tolerations: Vec<Toleration> =
        typed(tolerations).and_then(|v| serde::Deserialize::deserialize(v).ok()).unwrap_or_default();
    bytes_over(&(&selector, affinity.as_deref(), &tolerations))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_bound_is_named_with_its_field_and_limit() {
        let many = |n: usize| (0..n).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect::<Vec<_>>();
        let spec = json!({"tolerations": many(65)});
        let e = excess_of_spec(&spec).expect("over");
        assert_eq!(e.to_string(), "spec.tolerations has 65 tolerations; at most 64");
        assert_eq!(excess_of_spec(&json!({"tolerations": many(64)})), None);
        let selector: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert_eq!(
            excess_of_spec(&json!({"nodeSelector": selector})).map(|e| e.part),
            Some(PlacementPart::NodeSelector)
        );
        let term = json!({"matchExpressions": [{"key": "k", "operator": "In", "values": (0..600).map(|i| format!("h{i}")).collect::<Vec<_>>()}]});
        let affinity = |terms: Vec<Value>| json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}});
        assert_eq!(
            excess_of_spec(&affinity(vec![term.clone(); 17])).map(|e| e.part),
            Some(PlacementPart::AffinityTerms)
        );
        assert_eq!(
            excess_of_spec(&affinity(vec![term.clone(); 2])).map(|e| e.part),
            Some(PlacementPart::AffinityValues)
        );
        // 600 short host names fit in the counts; long ones go over the bytes.
        assert_eq!(excess_of_spec(&affinity(vec![term])), None);
        let long = json!({"matchExpressions": [{"key": "k", "operator": "In", "values": (0..600).map(|i| format!("{i:0>40}")).collect::<Vec<_>>()}]});
        let e = excess_of_spec(&affinity(vec![long])).expect("over in bytes");
        assert_eq!(e.part, PlacementPart::Bytes);
        assert!(e.to_string().contains("more than 16384 bytes as JSON; at most 16384"), "{e}");
    }

    /// The JSON measure (admission) and the typed one (the record) agree.
    #[test]
    fn admission_and_the_record_measure_alike() {
        for n in [3, 64, 65, 400] {
            let spec = json!({"tolerations": (0..n).map(|i| json!({"key": format!("{i:0>60}"), "operator": "Exists", "effect": "NoSchedule"})).collect::<Vec<_>>()});
            let typed: Vec<Toleration> = serde_json::from_value(spec["tolerations"].clone()).expect("tolerations");
            assert_eq!(excess_of_spec(&spec), excess(&BTreeMap::new(), None, &typed), "{n}");
        }
    }

    /// The quick bound is never below what the exact measure serializes, escapes included, so
    /// a placement it lets through is under the bound there too.
    #[test]
    fn the_json_size_bound_is_never_below_the_typed_size() {
        let specs = [
            serde_json::json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule",
                "tolerationSeconds": 300}], "nodeSelector": {"pool": "a\u{1}\"b\\"}}),
            serde_json::json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["é", "\n", "x"]}]}]}}}}),
            serde_json::json!({}),
        ];
        for spec in specs {
            let terms =
                spec.pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms");
            let bound = json_size_bound(&[spec.get("nodeSelector"), terms, spec.get("tolerations")], usize::MAX)
                .expect("no limit");
            let selector: BTreeMap<String, String> =
                spec.get("nodeSelector").map(|v| serde_json::from_value(v.clone()).unwrap()).unwrap_or_default();
            let affinity: Option<Vec<NodeSelectorTerm>> = terms.map(|v| serde_json::from_value(v.clone()).unwrap());
            let tolerations: Vec<Toleration> =
                spec.get("tolerations").map(|v| serde_json::from_value(v.clone()).unwrap()).unwrap_or_default();
            let exact = serde_json::to_vec(&(&selector, affinity.as_deref(), &tolerations)).unwrap().len();
            assert!(bound >= exact, "{bound} < {exact} for {spec}");
        }
        // Past the limit it gives up, and the exact measure decides.
        let long = serde_json::json!({"big": "x".repeat(3_000)});
        assert_eq!(json_size_bound(&[Some(&long)], MAX_PLACEMENT_BYTES), None);
    }
}
