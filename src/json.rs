//! Reading fixed fields of JSON objects: a leaf module every check can use.

use serde_json::Value;

/// The value at `path` (object keys) under `value`: what `Value::pointer` finds for a path
/// without `~` escapes, without its allocation per segment (it unescapes each one), which
/// showed in profiles of `Engine::validate`.
pub fn field<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, key| v.as_object()?.get(*key))
}

#[cfg(test)]
mod tests {
    use super::field;
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
            let pointer = format!("/{}", path.join("/"));
            let pointer = if path.is_empty() { String::new() } else { pointer };
            assert_eq!(field(&v, path), v.pointer(&pointer), "{pointer}");
        }
        assert_eq!(field(&v, &["metadata", "labels", "x/y"]), Some(&json!("1")), "no escapes to undo");
        assert_eq!(field(&v, &["spec", "containers", "0"]), None, "object keys only");
    }
}
