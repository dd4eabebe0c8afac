//! The API server's own validation rules for the fields Allot reads and writes, so that neither a
//! policy nor a dry run can promise what the API server will refuse.
//!
//! Ported from `k8s.io/apimachinery/pkg/api/validate/content` (label keys and values, DNS-1123
//! subdomains), `k8s.io/apimachinery/pkg/api/validation` (annotations) and
//! `pkg/apis/core/validation` (tolerations, node affinity, scheduling gates, priority class
//! names, `nodeName` with gates at CREATE), Kubernetes 1.36. Messages are the API server's own
//! words, so what `allot check` prints is what `kubectl apply` would print.
//!
//! Only the subset of Pod validation that touches what Allot mutates or trusts is here: metadata
//! labels and annotations, `nodeSelector`, `tolerations`, node affinity, `priorityClassName` and
//! `schedulingGates`. Pure functions over JSON; no allocation unless something is wrong.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value};

/// Longest name part of a label key (qualified name), and longest label value.
pub const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (label key prefixes, priority class names).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// Largest total size of an object's annotations (keys and values, in bytes).
pub const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

const LABEL_KEY_MSG: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

/// Go's `RegexError`: the rule, examples, and the regex itself.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let examples: String = examples.iter().enumerate().fold(String::new(), |mut out, (i, e)| {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
        out
    });
    format!("{msg} (e.g. {examples}regex used for validation is '{fmt}')")
}

/// Go's `MaxLenError`. The newer `validate/content` package (label keys and values, the DNS
/// prefix of a key) counts bytes; `util/validation` (object names) still says characters.
fn max_len_error(n: usize, unit: &str) -> String {
    format!("must be no more than {n} {unit}")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: a label key's name part, or a non-empty label value.
fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` joined by dots.
fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            match (b.first(), b.last()) {
                (Some(first), Some(last)) => alnum(first) && alnum(last) && b.iter().all(|c| alnum(c) || *c == b'-'),
                _ => false,
            }
        })
}

/// Go's `IsDNS1123Subdomain`: problems with `value`, none when valid.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    dns1123_subdomain_in(value, "characters")
}

fn dns1123_subdomain_in(value: &str, unit: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX, unit));
    }
    if !is_dns1123_subdomain(value) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_MSG, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errs
}

/// Go's `IsQualifiedName` / `IsLabelKey`: label and annotation keys, toleration keys,
/// scheduling gate names. An optional DNS-1123 subdomain prefix and `/`, then a name of at
/// most 63 characters.
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(dns1123_subdomain_in(prefix, "bytes").into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > LABEL_MAX {
        errs.push(format!("name part {}", max_len_error(LABEL_MAX, "bytes")));
    }
    if !is_label_token(name) {
        errs.push(format!(
            "name part {}",
            regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// Go's `IsValidLabelValue`: empty, or at most 63 characters of the label charset.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_MAX {
        errs.push(max_len_error(LABEL_MAX, "bytes"));
    }
    if !value.is_empty() && !is_label_token(value) {
        errs.push(regex_error(LABEL_VALUE_MSG, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errs
}

/// One field the API server would refuse, as its `field.Error` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `spec.nodeSelector`, `spec.tolerations[0].key`, `metadata.labels[team]`.
    pub path: String,
    /// `Invalid value: "x": ...`, `Required value: ...`, `Unsupported value: ...`.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() { f.write_str(&self.message) } else { write!(f, "{}: {}", self.path, self.message) }
    }
}

fn join(path: &str, child: &str) -> String {
    if path.is_empty() { child.to_string() } else { format!("{path}.{child}") }
}

fn invalid(path: String, value: &str, detail: &str) -> FieldError {
    FieldError { path, message: format!("Invalid value: {value:?}: {detail}") }
}

fn invalid_each(out: &mut Vec<FieldError>, path: &str, value: &str, details: Vec<String>) {
    out.extend(details.iter().map(|d| invalid(path.to_string(), value, d)));
}

fn wrong_type(path: String, want: &str) -> FieldError {
    FieldError { path, message: format!("Invalid value: must be {want}") }
}

/// Go's `ValidateLabels`: every key a qualified name, every value a label value. `map` is the
/// JSON object at `path` (`metadata.labels`, `spec.nodeSelector`); like the API server, errors
/// of keys and of values are both reported at `path`, the message quoting the offender.
pub fn labels(map: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(map) = object_or_report(map, path, &mut out) else { return out };
    for (key, value) in map {
        invalid_each(&mut out, path, key, qualified_name(key));
        match value.as_str() {
            Some(v) => invalid_each(&mut out, path, v, label_value(v)),
            None => out.push(wrong_type(format!("{path}[{key}]"), "a string")),
        }
    }
    out
}

/// Go's `ValidateAnnotations`: keys are qualified names (compared in lower case), and keys plus
/// values total at most 256 KiB.
pub fn annotations(map: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(map) = object_or_report(map, path, &mut out) else { return out };
    let mut total = 0usize;
    for (key, value) in map {
        invalid_each(&mut out, path, key, qualified_name(&key.to_lowercase()));
        total = total.saturating_add(key.len()).saturating_add(value.as_str().map_or(0, str::len));
        if !value.is_string() {
            out.push(wrong_type(format!("{path}[{key}]"), "a string"));
        }
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        out.push(FieldError {
            path: path.to_string(),
            message: format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT} bytes"),
        });
    }
    out
}

/// `null` (absent) is fine; anything but an object is a type error.
fn object_or_report<'v>(value: &'v Value, path: &str, out: &mut Vec<FieldError>) -> Option<&'v Map<String, Value>> {
    match value {
        Value::Object(map) => Some(map),
        Value::Null => None,
        _ => {
            out.push(wrong_type(path.to_string(), "an object"));
            None
        }
    }
}

fn array_or_report<'v>(value: &'v Value, path: &str, out: &mut Vec<FieldError>) -> Option<&'v Vec<Value>> {
    match value {
        Value::Array(list) => Some(list),
        Value::Null => None,
        _ => {
            out.push(wrong_type(path.to_string(), "a list"));
            None
        }
    }
}

/// A string field: absent and `null` read as `""` (Go's zero value).
fn string_field<'v>(object: &'v Value, field: &str, path: &str, out: &mut Vec<FieldError>) -> &'v str {
    match object.get(field) {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(_) => {
            out.push(wrong_type(join(path, field), "a string"));
            ""
        }
    }
}

/// Taint effects a toleration may name (empty: every effect).
const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Go's `ValidateTolerations` for one toleration at `path` (`spec.tolerations[0]`).
pub fn toleration(t: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    if !t.is_object() {
        out.push(wrong_type(path.to_string(), "an object"));
        return out;
    }
    let key = string_field(t, "key", path, &mut out);
    let operator = string_field(t, "operator", path, &mut out);
    let value = string_field(t, "value", path, &mut out);
    let effect = string_field(t, "effect", path, &mut out);
    let operator_path = join(path, "operator");
    if !key.is_empty() {
        invalid_each(&mut out, &join(path, "key"), key, qualified_name(key));
    } else if operator != "Exists" {
        out.push(invalid(
            operator_path.clone(),
            operator,
            "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
        ));
    }
    if t.get("tolerationSeconds").is_some_and(|s| !s.is_null()) && effect != "NoExecute" {
        out.push(invalid(join(path, "effect"), effect, "effect must be 'NoExecute' when `tolerationSeconds` is set"));
    }
    match operator {
        // Empty means Equal.
        "" | "Equal" => {
            let details = label_value(value);
            if !details.is_empty() {
                out.push(invalid(operator_path, value, &details.join(";")));
            }
        }
        "Exists" if !value.is_empty() => {
            out.push(invalid(operator_path, value, "value must be empty when `operator` is 'Exists'"));
        }
        "Exists" => {}
        // Comparison operators (TaintTolerationComparisonOperators, alpha): the API server
        // accepts them where the gate is on; only an integer value can ever be valid.
        "Lt" | "Gt" if value.parse::<i64>().is_err() => {
            out.push(invalid(join(path, "value"), value, "value must be an integer when `operator` is 'Lt' or 'Gt'"));
        }
        "Lt" | "Gt" => {}
        other => out.push(FieldError {
            path: operator_path,
            message: format!("Unsupported value: {other:?}: supported values: \"Equal\", \"Exists\""),
        }),
    }
    if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
        out.push(FieldError {
            path: join(path, "effect"),
            message: format!(
                "Unsupported value: {effect:?}: supported values: \"NoExecute\", \"NoSchedule\", \"PreferNoSchedule\""
            ),
        });
    }
    out
}

/// Go's `ValidateTolerations` over a list at `path` (`spec.tolerations`).
pub fn tolerations(list: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    if let Some(list) = array_or_report(list, path, &mut out) {
        for (i, t) in list.iter().enumerate() {
            out.extend(toleration(t, &format!("{path}[{i}]")));
        }
    }
    out
}

/// The operator's demand on the number of values (Go's `ValidateNodeSelectorRequirement`,
/// first half), or the operator is unknown.
pub fn requirement_operator(operator: &str, values: usize, path: &str) -> Option<FieldError> {
    let values_path = join(path, "values");
    match operator {
        "In" | "NotIn" if values == 0 => Some(FieldError {
            path: values_path,
            message: "Required value: must be specified when `operator` is 'In' or 'NotIn'".to_string(),
        }),
        "Exists" | "DoesNotExist" if values > 0 => Some(FieldError {
            path: values_path,
            message: "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".to_string(),
        }),
        "Gt" | "Lt" if values != 1 => Some(FieldError {
            path: values_path,
            message: "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'".to_string(),
        }),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => None,
        other => Some(invalid(join(path, "operator"), other, "not a valid selector operator")),
    }
}

/// The key a label key, and (`values_are_labels`: required node affinity since Kubernetes
/// 1.31) every value a label value. Go's `ValidateNodeSelectorRequirement`, second half.
pub fn requirement_key_and_values<'v>(
    key: &str,
    values: impl IntoIterator<Item = &'v str>,
    values_are_labels: bool,
    path: &str,
) -> Vec<FieldError> {
    let mut out = Vec::new();
    invalid_each(&mut out, &join(path, "key"), key, qualified_name(key));
    if values_are_labels {
        for (i, v) in values.into_iter().enumerate() {
            invalid_each(&mut out, &format!("{path}.values[{i}]"), v, label_value(v));
        }
    }
    out
}

/// Go's `ValidateNodeSelectorRequirement` for one `matchExpressions` entry.
pub fn node_selector_requirement(req: &Value, values_are_labels: bool, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    if !req.is_object() {
        out.push(wrong_type(path.to_string(), "an object"));
        return out;
    }
    let key = string_field(req, "key", path, &mut out);
    let operator = string_field(req, "operator", path, &mut out);
    let values_path = join(path, "values");
    let values: Vec<&str> = match req.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            out.push(wrong_type(values_path, "a list of strings"));
            Vec::new()
        }
    };
    out.extend(requirement_operator(operator, values.len(), path));
    out.extend(requirement_key_and_values(key, values, values_are_labels, path));
    out
}

fn node_selector_term(term: &Value, values_are_labels: bool, path: &str, out: &mut Vec<FieldError>) {
    let exprs_path = join(path, "matchExpressions");
    if let Some(list) = array_or_report(term.get("matchExpressions").unwrap_or(&Value::Null), &exprs_path, out) {
        for (i, req) in list.iter().enumerate() {
            out.extend(node_selector_requirement(req, values_are_labels, &format!("{exprs_path}[{i}]")));
        }
    }
}

/// Go's `validateNodeAffinity`: required terms (at least one; values are label values) and
/// preferred terms (weight 1-100; any values). `affinity` is `spec.affinity`.
pub fn node_affinity(affinity: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(na) = affinity.get("nodeAffinity").filter(|v| !v.is_null()) else { return out };
    let na_path = join(path, "nodeAffinity");
    let required_path = join(&na_path, "requiredDuringSchedulingIgnoredDuringExecution");
    if let Some(required) = na.get("requiredDuringSchedulingIgnoredDuringExecution").filter(|v| !v.is_null()) {
        let terms_path = join(&required_path, "nodeSelectorTerms");
        match required.get("nodeSelectorTerms") {
            Some(Value::Array(terms)) if !terms.is_empty() => {
                for (i, term) in terms.iter().enumerate() {
                    node_selector_term(term, true, &format!("{terms_path}[{i}]"), &mut out);
                }
            }
            _ => out.push(FieldError {
                path: terms_path,
                message: "Required value: must have at least one node selector term".to_string(),
            }),
        }
    }
    let preferred_path = join(&na_path, "preferredDuringSchedulingIgnoredDuringExecution");
    let preferred = na.get("preferredDuringSchedulingIgnoredDuringExecution").unwrap_or(&Value::Null);
    if let Some(list) = array_or_report(preferred, &preferred_path, &mut out) {
        for (i, term) in list.iter().enumerate() {
            let term_path = format!("{preferred_path}[{i}]");
            let weight = term.get("weight").and_then(Value::as_i64).unwrap_or(0);
            if !(1..=100).contains(&weight) {
                out.push(FieldError {
                    path: join(&term_path, "weight"),
                    message: format!("Invalid value: {weight}: must be in the range 1-100"),
                });
            }
            let preference = term.get("preference").unwrap_or(&Value::Null);
            node_selector_term(preference, false, &join(&term_path, "preference"), &mut out);
        }
    }
    out
}

/// Go's `ValidatePriorityClassName` for a Pod's `priorityClassName`: a DNS-1123 subdomain.
/// (The `system-` prefix rule applies to PriorityClass objects, not to references.)
pub fn priority_class_name(name: &str, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    invalid_each(&mut out, path, name, dns1123_subdomain(name));
    out
}

/// Go's `validateSchedulingGates`: qualified names, no duplicates.
pub fn scheduling_gates(gates: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let Some(list) = array_or_report(gates, path, &mut out) else { return out };
    let mut seen = HashSet::new();
    for (i, gate) in list.iter().enumerate() {
        let gate_path = format!("{path}[{i}]");
        let name = string_field(gate, "name", &gate_path, &mut out);
        invalid_each(&mut out, &gate_path, name, qualified_name(name));
        if !seen.insert(name) {
            out.push(FieldError { path: gate_path, message: format!("Duplicate value: {name:?}") });
        }
    }
    out
}

/// Labels and annotations of an object's (or a template's) `metadata` at `path`.
pub fn object_meta(metadata: &Value, path: &str) -> Vec<FieldError> {
    let mut out = labels(metadata.get("labels").unwrap_or(&Value::Null), &join(path, "labels"));
    out.extend(annotations(metadata.get("annotations").unwrap_or(&Value::Null), &join(path, "annotations")));
    out
}

/// The Allot-relevant part of Pod validation on a Pod-shaped object (a Pod, or a template seen
/// as one) whose `metadata` and `spec` sit under `path` (`""` for a Pod, `spec.template`).
/// `create`: a real Pod at CREATE, where `nodeName` and scheduling gates exclude each other.
pub fn pod(pod: &Value, path: &str, create: bool) -> Vec<FieldError> {
    // A template's labels are `spec.template.labels` to the API server (ObjectMeta inlined).
    let meta_path = if path.is_empty() { "metadata" } else { path };
    let mut out = object_meta(pod.get("metadata").unwrap_or(&Value::Null), meta_path);
    let spec_path = join(path, "spec");
    let Some(spec) = pod.get("spec").filter(|s| s.is_object()) else { return out };
    let field = |name: &str| spec.get(name).unwrap_or(&Value::Null);
    out.extend(labels(field("nodeSelector"), &join(&spec_path, "nodeSelector")));
    out.extend(tolerations(field("tolerations"), &join(&spec_path, "tolerations")));
    out.extend(node_affinity(field("affinity"), &join(&spec_path, "affinity")));
    match field("priorityClassName") {
        Value::String(name) if !name.is_empty() => {
            out.extend(priority_class_name(name, &join(&spec_path, "priorityClassName")))
        }
        Value::String(_) | Value::Null => {}
        _ => out.push(wrong_type(join(&spec_path, "priorityClassName"), "a string")),
    }
    let gates = field("schedulingGates");
    out.extend(scheduling_gates(gates, &join(&spec_path, "schedulingGates")));
    let has_gates = gates.as_array().is_some_and(|g| !g.is_empty());
    let has_node = field("nodeName").as_str().is_some_and(|n| !n.is_empty());
    if create && has_gates && has_node {
        out.push(FieldError {
            path: join(&spec_path, "nodeName"),
            message: "Forbidden: cannot be set until all schedulingGates have been cleared".to_string(),
        });
    }
    out
}

#[cfg(test)]
mod tests;
