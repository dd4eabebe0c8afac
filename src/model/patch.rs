//! Minimal RFC 6902 JSON Patches, built against the document as the previous operations left it
//! (the fields they changed, over the object's own), so that each operation is valid for it.
//!
//! Rules the API server holds us to: keys are escaped (`~` → `~0`, `/` → `~1`), and `add` needs
//! an existing parent — so [`Builder::ensure`] adds at the highest missing level instead of
//! assuming parents exist.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

/// One patch operation. Serialises to RFC 6902 JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum PatchOp {
    Add { path: String, value: Value },
    Replace { path: String, value: Value },
    Remove { path: String },
    Test { path: String, value: Value },
}

impl PatchOp {
    /// The operation's JSON pointer.
    pub fn path(&self) -> &str {
        match self {
            PatchOp::Add { path, .. }
            | PatchOp::Replace { path, .. }
            | PatchOp::Remove { path }
            | PatchOp::Test { path, .. } => path,
        }
    }
}

/// Escapes one JSON-pointer reference token.
pub fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

impl PatchOp {
    /// The same operation as the json-patch crate's type (no round trip through JSON text).
    fn to_json_patch(&self) -> Result<json_patch::PatchOperation, PatchError> {
        use json_patch::jsonptr::PointerBuf;
        use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation};
        let path = PointerBuf::parse(self.path())
            .map_err(|e| PatchError::Pointer { path: self.path().to_string(), message: e.to_string() })?;
        Ok(match self {
            PatchOp::Add { value, .. } => PatchOperation::Add(AddOperation { path, value: value.clone() }),
            PatchOp::Replace { value, .. } => PatchOperation::Replace(ReplaceOperation { path, value: value.clone() }),
            PatchOp::Remove { .. } => PatchOperation::Remove(RemoveOperation { path }),
            PatchOp::Test { value, .. } => PatchOperation::Test(TestOperation { path, value: value.clone() }),
        })
    }
}

/// Why a patch does not apply. Allot's own patches always should; seeing one of these means the
/// object changed under a patch computed for another version (or a bug), and callers report it
/// as a note rather than failing the request.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// An operation's path is not a JSON Pointer.
    #[error("{path}: {message}")]
    Pointer { path: String, message: String },
    /// An operation failed on the document (a missing parent, a failed `test`).
    #[error(transparent)]
    Apply(#[from] json_patch::PatchError),
}

/// Applies operations to a document with the json-patch crate (the same semantics the API
/// server applies), returning the patched copy.
pub fn apply(document: &Value, ops: &[PatchOp]) -> Result<Value, PatchError> {
    let mut out = document.clone();
    apply_in_place(&mut out, ops)?;
    Ok(out)
}

/// [`apply`] to a document the caller owns, without copying it; on an error the document is
/// left as it was (json-patch reverts the operations it applied).
pub fn apply_in_place(document: &mut Value, ops: &[PatchOp]) -> Result<(), PatchError> {
    let patch = json_patch::Patch(ops.iter().map(PatchOp::to_json_patch).collect::<Result<_, _>>()?);
    json_patch::patch(document, &patch)?;
    Ok(())
}

/// Accumulates operations under a base pointer (e.g. `/spec`), or only the fields they change
/// ([`Builder::fields_only`]), reading the object's own fields until an operation changes one:
/// only a changed field is copied (a Pod's tolerations, say), once, the first time it changes.
#[derive(Debug)]
pub struct Builder<'a> {
    base: String,
    /// The fields as the object has them.
    original: &'a Map<String, Value>,
    /// The fields operations changed: their value now, `None` once removed.
    changed: ChangedFields,
    /// The operations; `None` for a builder of [`Builder::fields_only`].
    ops: Option<Vec<PatchOp>>,
}

/// The top-level fields a [`Builder`]'s operations changed, with their value after them (`None`:
/// removed). Written over the fields it read ([`overlay`]), they give what applying its
/// operations gives.
pub type ChangedFields = BTreeMap<String, Option<Value>>;

impl<'a> Builder<'a> {
    /// `base` is the pointer of `fields`' parent; `fields` are its current fields.
    pub fn new(base: &str, fields: &'a Map<String, Value>) -> Builder<'a> {
        Builder { base: base.to_string(), original: fields, changed: BTreeMap::new(), ops: Some(Vec::new()) }
    }

    /// A builder that records no operations, only the fields they change
    /// ([`Builder::into_changed_fields`]): for a caller that wants the result, not a patch (a
    /// workload template's preview). No pointer is formatted and no value copied for an op.
    pub fn fields_only(fields: &'a Map<String, Value>) -> Builder<'a> {
        Builder { base: String::new(), original: fields, changed: BTreeMap::new(), ops: None }
    }

    /// Records the operation `make` builds, unless this builder records none.
    fn record(&mut self, make: impl FnOnce(&Self) -> PatchOp) {
        if self.ops.is_some() {
            let op = make(self);
            if let Some(ops) = &mut self.ops {
                ops.push(op);
            }
        }
    }

    /// The field `key` as the operations so far left it.
    fn field(&self, key: &str) -> Option<&Value> {
        match self.changed.get(key) {
            Some(now) => now.as_ref(),
            None => self.original.get(key),
        }
    }

    /// The field `key`, copied into `changed` first if no operation changed it yet.
    fn field_mut(&mut self, key: &str) -> Option<&mut Value> {
        if !self.changed.contains_key(key) {
            let copy = self.original.get(key)?.clone();
            self.changed.insert(key.to_string(), Some(copy));
        }
        self.changed.get_mut(key)?.as_mut()
    }

    /// The current value at `segments` (after earlier operations).
    pub fn get(&self, segments: &[&str]) -> Option<&Value> {
        let (first, rest) = segments.split_first()?;
        let mut cur = self.field(first)?;
        for s in rest {
            cur = match cur {
                Value::Object(m) => m.get(*s)?,
                Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    fn pointer(&self, segments: &[&str]) -> String {
        let mut p = self.base.clone();
        for s in segments {
            p.push('/');
            p.push_str(&escape(s));
        }
        p
    }

    /// Sets the value at `segments` (object keys, and indices into existing lists), creating
    /// missing parents with one `add` at the highest missing level. Replaces an existing value.
    pub fn ensure(&mut self, segments: &[&str], value: Value) {
        // Descend through existing objects, and through lists where the next segment is an
        // index into them (`nodeSelectorTerms/1/matchExpressions`).
        let container = |v: &Value, next: &str| match v {
            Value::Object(_) => true,
            Value::Array(items) => next.parse::<usize>().is_ok_and(|i| i < items.len()),
            _ => false,
        };
        let mut depth = 0;
        while depth < segments.len() - 1
            && self.get(&segments[..=depth]).is_some_and(|v| container(v, segments[depth + 1]))
        {
            depth += 1;
        }
        // segments[..depth] exist as objects; segments[depth] may or may not exist.
        let exists = self.get(&segments[..=depth]).is_some();
        let mut nested = value;
        for s in segments[depth + 1..].iter().rev() {
            let mut m = Map::new();
            m.insert((*s).to_string(), nested);
            nested = Value::Object(m);
        }
        // When it exists but is not the leaf, a non-object sits where a parent should be: it is
        // replaced whole.
        self.record(|b| {
            let path = b.pointer(&segments[..=depth]);
            if exists {
                PatchOp::Replace { path, value: nested.clone() }
            } else {
                PatchOp::Add { path, value: nested.clone() }
            }
        });
        self.set_changed(&segments[..=depth], nested);
    }

    /// Appends to the list at `segments`, creating it if absent.
    pub fn push(&mut self, segments: &[&str], item: Value) {
        match self.get(segments) {
            Some(Value::Array(_)) => {
                self.record(|b| PatchOp::Add { path: format!("{}/-", b.pointer(segments)), value: item.clone() });
                if let Some(Value::Array(list)) = self.get_mut(segments) {
                    list.push(item);
                }
            }
            _ => self.ensure(segments, Value::Array(vec![item])),
        }
    }

    /// Removes the field at `segments` if present.
    pub fn remove(&mut self, segments: &[&str]) {
        if self.get(segments).is_some() {
            self.record(|b| PatchOp::Remove { path: b.pointer(segments) });
            if let Some((last, parent)) = segments.split_last() {
                if parent.is_empty() {
                    self.changed.insert((*last).to_string(), None);
                } else {
                    match self.get_mut(parent) {
                        Some(Value::Object(m)) => {
                            m.remove(*last);
                        }
                        Some(Value::Array(items)) => {
                            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                                items.remove(i);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    fn get_mut(&mut self, segments: &[&str]) -> Option<&mut Value> {
        let (first, rest) = segments.split_first()?;
        let mut cur = self.field_mut(first)?;
        for s in rest {
            cur = match cur {
                Value::Object(m) => m.get_mut(*s)?,
                Value::Array(a) => a.get_mut(s.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    fn set_changed(&mut self, segments: &[&str], value: Value) {
        let Some((last, parent)) = segments.split_last() else {
            return;
        };
        if parent.is_empty() {
            self.changed.insert((*last).to_string(), Some(value));
            return;
        }
        match self.get_mut(parent) {
            Some(Value::Object(m)) => {
                m.insert((*last).to_string(), value);
            }
            Some(Value::Array(items)) => {
                if let Some(slot) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    *slot = value;
                }
            }
            _ => {}
        }
    }

    /// The operations, in order (none for a builder of [`Builder::fields_only`]).
    pub fn into_ops(self) -> Vec<PatchOp> {
        self.ops.unwrap_or_default()
    }

    /// The fields the operations changed, as they left them.
    pub fn into_changed_fields(self) -> ChangedFields {
        self.changed
    }
}

/// Writes `changed` over `fields`, the fields a [`Builder`] read: the object its operations
/// would make, without building or applying them.
pub fn overlay(fields: &mut Map<String, Value>, changed: ChangedFields) {
    for (key, value) in changed {
        match value {
            Some(value) => {
                fields.insert(key, value);
            }
            None => {
                fields.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    /// The operations of `build` on `spec`, after checking that a [`Builder::fields_only`]
    /// running the same calls, overlaid on `spec`, makes what applying them makes.
    fn ops_of(spec: &Map<String, Value>, build: impl Fn(&mut Builder<'_>)) -> Vec<PatchOp> {
        let mut recording = Builder::new("/spec", spec);
        build(&mut recording);
        let ops = recording.into_ops();
        let mut fields_only = Builder::fields_only(spec);
        build(&mut fields_only);
        let mut overlaid = spec.clone();
        overlay(&mut overlaid, fields_only.into_changed_fields());
        let applied = apply(&json!({"spec": spec}), &ops).unwrap();
        assert_eq!(Value::Object(overlaid), applied["spec"], "overlay of {ops:?}");
        ops
    }

    #[test]
    fn escapes_slashes_and_tildes() {
        assert_eq!(escape("nvidia.com/gpu"), "nvidia.com~1gpu");
        assert_eq!(escape("a~b/c"), "a~0b~1c");
    }

    #[test]
    fn ensure_creates_absent_parents_in_one_add() {
        let spec = fields(json!({}));
        let ops = ops_of(&spec, |b| {
            b.ensure(&["nodeSelector", "node-type"], json!("gpu"));
            b.ensure(&["nodeSelector", "kubernetes.io/arch"], json!("amd64"));
        });
        assert_eq!(
            ops,
            vec![
                PatchOp::Add { path: "/spec/nodeSelector".into(), value: json!({"node-type": "gpu"}) },
                PatchOp::Add { path: "/spec/nodeSelector/kubernetes.io~1arch".into(), value: json!("amd64") },
            ]
        );
        let pod = json!({"spec": {"containers": []}});
        let patched = apply(&pod, &ops).unwrap();
        assert_eq!(patched["spec"]["nodeSelector"], json!({"node-type": "gpu", "kubernetes.io/arch": "amd64"}));
    }

    #[test]
    fn push_creates_then_appends() {
        let spec = fields(json!({}));
        let ops = ops_of(&spec, |b| {
            b.push(&["tolerations"], json!({"key": "a"}));
            b.push(&["tolerations"], json!({"key": "b"}));
        });
        assert_eq!(ops[0].path(), "/spec/tolerations");
        assert_eq!(ops[1].path(), "/spec/tolerations/-");
        let patched = apply(&json!({"spec": {}}), &ops).unwrap();
        assert_eq!(patched["spec"]["tolerations"], json!([{"key": "a"}, {"key": "b"}]));
    }

    #[test]
    fn ensure_descends_through_list_indices() {
        let spec = fields(json!({"terms": [{"a": 1}, {"b": 2}]}));
        let ops = ops_of(&spec, |b| {
            b.push(&["terms", "1", "exprs"], json!("x"));
            b.push(&["terms", "1", "exprs"], json!("y"));
        });
        assert_eq!(ops[0], PatchOp::Add { path: "/spec/terms/1/exprs".into(), value: json!(["x"]) });
        assert_eq!(ops[1].path(), "/spec/terms/1/exprs/-");
        let patched = apply(&json!({"spec": {"terms": [{"a": 1}, {"b": 2}]}}), &ops).unwrap();
        assert_eq!(patched["spec"]["terms"], json!([{"a": 1}, {"b": 2, "exprs": ["x", "y"]}]));
    }

    #[test]
    fn remove_only_what_exists() {
        let spec = fields(json!({"priority": 0}));
        let ops = ops_of(&spec, |b| {
            b.remove(&["priority"]);
            b.remove(&["preemptionPolicy"]);
        });
        assert_eq!(ops, vec![PatchOp::Remove { path: "/spec/priority".into() }]);
    }

    /// Any sequence of builder calls, on specs with existing, absent, null and mistyped fields:
    /// the fields-only builder's overlay is what applying the recorded operations makes
    /// (checked inside [`ops_of`]).
    #[test]
    fn overlaid_fields_are_the_applied_patch() {
        let specs = [
            json!({}),
            json!({"tolerations": [{"key": "x"}], "nodeSelector": {"a": "b"}, "priority": 5, "schedulingGates": []}),
            json!({"tolerations": null, "nodeSelector": "not a map", "affinity": {"nodeAffinity": 3}}),
            json!({"affinity": {"nodeAffinity": {"required": {"terms": [{"e": []}, {}]}}}, "priorityClassName": "x"}),
            // What a tenant may write where objects belong.
            json!({"affinity": {"nodeAffinity": {"required": {"terms": [3, null]}}}, "tolerations": "x"}),
        ];
        type Call = fn(&mut Builder<'_>);
        let calls: [Call; 13] = [
            |b| b.push(&["tolerations"], json!({"key": "nvidia.com/gpu"})),
            |b| b.ensure(&["nodeSelector", "node-type"], json!("gpu")),
            |b| b.ensure(&["nodeSelector", "a~b/c"], json!("x")),
            |b| b.ensure(&["priorityClassName"], json!("low")),
            |b| b.remove(&["priority"]),
            |b| b.remove(&["nodeSelector", "a"]),
            |b| b.push(&["schedulingGates"], json!({"name": "allot.dev/gang"})),
            |b| b.push(&["affinity", "nodeAffinity", "required", "terms", "1", "e"], json!(1)),
            |b| b.ensure(&["affinity", "nodeAffinity", "required", "terms", "0", "f"], json!(2)),
            |b| b.remove(&["tolerations"]),
            |b| b.remove(&["affinity", "nodeAffinity", "required", "terms", "0"]),
            |b| b.ensure(&["affinity", "nodeAffinity", "required", "terms", "1"], json!({"e": [0]})),
            |b| b.ensure(&["affinity", "nodeAffinity", "required", "terms"], json!([{"e": []}])),
        ];
        // Every spec, every ordered pair and triple of calls (with repeats).
        for spec in &specs {
            let spec = fields(spec.clone());
            for i in 0..calls.len() {
                for j in 0..calls.len() {
                    for k in 0..calls.len() {
                        ops_of(&spec, |b| {
                            calls[i](b);
                            calls[j](b);
                            calls[k](b);
                        });
                    }
                }
            }
        }
    }
}
