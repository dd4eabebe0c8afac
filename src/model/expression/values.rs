//! Values between JSON and CEL: an object bound as CEL (whole, or cut to a [`super::Projection`]),
//! CEL values read back as JSON, and the accelerator helpers' arithmetic on requests.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use kube::core::cel::cel::objects::{Key, Map};
use kube::core::cel::cel::{ExecutionError, Value as CelValue};
use serde_json::Value;

use crate::model::resources::{self, ContainerResources, ResourceList, ResourceMatcher, accelerators_only};
use crate::model::workload::PodView;

use super::*;

/// `accelerators(x)` of a JSON value (a Pod, a pod spec or a container), as the CEL function
/// computes it; `None` when it is none of those or the total overflows. `view`: the Pod view
/// `value` may be or sit in ([`requests_of_json`]).
pub fn object_accelerators(value: &Value, view: Option<&PodView<'_>>, matcher: &ResourceMatcher) -> Option<i64> {
    total_units(&accelerators_only(&*requests_of_json(value, view)?, matcher))
}

/// Whole devices in all, `None` past `i64`.
pub(super) fn total_units(list: &ResourceList) -> Option<i64> {
    list.values().try_fold(0i64, |sum, q| sum.checked_add(q.ceil_units()))
}

pub(super) fn units_overflow(function: &str) -> ExecutionError {
    ExecutionError::function_error(function, "the total does not fit in an int")
}

/// Every resource a Pod, a pod spec or a container asks for. When `json` is `view`'s Pod or
/// one of its containers (the very value, not an equal one), what the view parsed already is
/// read instead of parsing the quantities again.
pub(super) fn requests_of_json<'v>(json: &Value, view: Option<&'v PodView<'_>>) -> Option<Cow<'v, ResourceList>> {
    if let Some(spec) = json.get("spec") {
        Some(match view.filter(|v| std::ptr::eq(json, &*v.pod)) {
            Some(view) => Cow::Borrowed(view.requests()),
            None => Cow::Owned(resources::pod_requests(spec)),
        })
    } else if json.get("containers").is_some() {
        Some(Cow::Owned(resources::pod_requests(json)))
    } else if json.is_object() {
        Some(Cow::Owned(match view.and_then(|v| v.container_of(json)) {
            Some(parsed) => parsed.resources.effective_requests(),
            None => ContainerResources::from_container(json, "", &mut Vec::new()).effective_requests(),
        }))
    } else {
        None
    }
}

pub(super) fn to_json(v: &CelValue, function: &str) -> Result<Value, ExecutionError> {
    cel_to_json(v).ok_or_else(|| ExecutionError::function_error(function, "argument cannot be read as JSON"))
}

/// Converts a CEL value back to JSON (maps with string keys, lists, scalars).
pub(super) fn cel_to_json(v: &CelValue) -> Option<Value> {
    Some(match v {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        CelValue::String(s) => Value::String(s.as_str().to_string()),
        CelValue::List(items) => Value::Array(items.iter().map(cel_to_json).collect::<Option<_>>()?),
        CelValue::Map(m) => Value::Object(
            m.map
                .iter()
                .map(|(k, v)| match k {
                    Key::String(s) => Some((s.as_str().to_string(), cel_to_json(v)?)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

pub(super) fn requests_of(
    v: &CelValue,
    matcher: &ResourceMatcher,
    function: &str,
) -> Result<ResourceList, ExecutionError> {
    let key = |name: &str| Key::String(Arc::new(name.to_string()));
    // A Pod: only its spec matters, so only the spec is converted back (not the metadata).
    if let CelValue::Map(m) = v
        && let Some(spec) = m.map.get(&key("spec"))
    {
        return Ok(accelerators_only(&resources::pod_requests(&to_json(spec, function)?), matcher));
    }
    // A container: only its `resources` are read, so only they are converted back.
    if let CelValue::Map(m) = v
        && !m.map.contains_key(&key("containers"))
    {
        let mut container = serde_json::Map::new();
        if let Some(resources) = m.map.get(&key("resources")) {
            container.insert("resources".to_string(), to_json(resources, function)?);
        }
        let all = ContainerResources::from_container(&Value::Object(container), "", &mut Vec::new());
        return Ok(accelerators_only(&all.effective_requests(), matcher));
    }
    let json = to_json(v, function)?;
    let all = requests_of_json(&json, None)
        .ok_or_else(|| ExecutionError::function_error(function, "expects a Pod, a pod spec or a container"))?;
    Ok(accelerators_only(&all, matcher))
}

pub(super) fn units_map(list: &ResourceList) -> CelValue {
    let map: HashMap<Key, CelValue> =
        list.iter().map(|(name, q)| (Key::String(Arc::new(name.clone())), CelValue::Int(q.ceil_units()))).collect();
    CelValue::Map(Map { map: Arc::new(map) })
}

/// Converts JSON to a CEL value. At the top level's `metadata`, `managedFields` is dropped.
pub fn json_to_cel(value: &Value) -> CelValue {
    convert(value, 0, false)
}

/// Converts the part of `value` that `projection` reads (see [`Projection`]); a field it reads
/// that the JSON lacks stays absent, so `has()` and a missing-field error answer as on the
/// whole value.
pub fn json_to_cel_projected(value: &Value, projection: &Projection) -> CelValue {
    project(value, projection, 0, false)
}

pub(super) fn project(value: &Value, projection: &Projection, depth: usize, in_metadata: bool) -> CelValue {
    match value {
        Value::Object(map) if !projection.whole => {
            let mut out = HashMap::with_capacity(projection.fields.len());
            for (k, sub) in &projection.fields {
                if in_metadata && k == "managedFields" {
                    continue;
                }
                if let Some(v) = map.get(k) {
                    let child_is_metadata = depth == 0 && k == "metadata";
                    out.insert(Key::String(Arc::new(k.clone())), project(v, sub, depth + 1, child_is_metadata));
                }
            }
            CelValue::Map(Map { map: Arc::new(out) })
        }
        _ => convert(value, depth, in_metadata),
    }
}

/// How a JSON number is read by CEL: an int when it fits, else a uint, else a double. One rule
/// for the interpreter's bindings and direct evaluation, which must agree.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JsonNumber {
    Int(i64),
    UInt(u64),
    Double(f64),
}

impl JsonNumber {
    pub(crate) fn of(n: &serde_json::Number) -> JsonNumber {
        if let Some(i) = n.as_i64() {
            JsonNumber::Int(i)
        } else if let Some(u) = n.as_u64() {
            JsonNumber::UInt(u)
        } else {
            JsonNumber::Double(n.as_f64().unwrap_or(f64::NAN))
        }
    }
}

pub(super) fn convert(value: &Value, depth: usize, in_metadata: bool) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match JsonNumber::of(n) {
            JsonNumber::Int(i) => CelValue::Int(i),
            JsonNumber::UInt(u) => CelValue::UInt(u),
            JsonNumber::Double(d) => CelValue::Float(d),
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(|v| convert(v, depth + 1, false)).collect())),
        Value::Object(map) => {
            let mut out = HashMap::with_capacity(map.len());
            for (k, v) in map {
                if in_metadata && k == "managedFields" {
                    continue;
                }
                let child_is_metadata = depth == 0 && k == "metadata";
                out.insert(Key::String(Arc::new(k.clone())), convert(v, depth + 1, child_is_metadata));
            }
            CelValue::Map(Map { map: Arc::new(out) })
        }
    }
}
