//! Reading fixed fields of JSON objects: a leaf module every check can use.

use serde_json::Value;

/// The value at a path of object keys, what `Value::pointer` finds for a path without `~`
/// escapes or array indices, without its allocation per segment (it unescapes each one), which
/// showed in profiles of `Engine::validate`.
pub trait Fields {
    fn field(&self, path: &[&str]) -> Option<&Value>;

    /// The string at `path`, Kubernetes-style: empty, absent or not a string all mean unset.
    fn text(&self, path: &[&str]) -> Option<&str> {
        self.field(path).and_then(Value::as_str).filter(|s| !s.is_empty())
    }
}

impl Fields for Value {
    fn field(&self, path: &[&str]) -> Option<&Value> {
        path.iter().try_fold(self, |v, key| v.as_object()?.get(*key))
    }
}

#[cfg(test)]
mod tests {
    use super::Fields;
    use serde_json::json;

    #[test]
    fn finds_what_pointer_finds_on_object_paths() {
        let v = json!({"metadata": {"name": "a", "labels": {"x/y": "1"}}, "spec": {"containers": [{"name": "c"}]}});
        for path in [
            &["metadata", "name"][..],
            &["metadata"],
            &[],
            &["spec", "containers"],
            &["metadata", "nope"],
            &["metadata", "name", "deeper"],
        ] {
            let pointer = if path.is_empty() { String::new() } else { format!("/{}", path.join("/")) };
            assert_eq!(v.field(path), v.pointer(&pointer), "{pointer}");
        }
        assert_eq!(v.field(&["metadata", "labels", "x/y"]), Some(&json!("1")), "no escapes to undo");
        assert_eq!(v.field(&["spec", "containers", "0"]), None, "object keys only");
    }

    #[test]
    fn text_is_a_non_empty_string() {
        let v = json!({"spec": {"a": "x", "empty": "", "number": 7, "null": null}});
        assert_eq!(v.text(&["spec", "a"]), Some("x"));
        for unset in ["empty", "number", "null", "absent"] {
            assert_eq!(v.text(&["spec", unset]), None, "{unset}");
        }
    }
}
