//! YAML (and JSON) streams read as documents that remember where they start, so a finding can
//! point at the line of its object: `allot check --output github` annotates that line. The YAML
//! parser (serde-saphyr's `Spanned`) reports the positions; nothing here reads YAML by hand.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_saphyr::Spanned;

/// One document of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// 1-based number among the stream's non-empty documents (as [`crate::model::policy::parse_documents`]
    /// counts them).
    pub index: usize,
    /// 1-based line where the document's root node starts: for a mapping, its first key (after
    /// any `---` and leading comments); for a JSON object, its `{`.
    pub line: usize,
    /// For a `List` (`items: [...]`), the line each item starts on, in order; empty otherwise.
    pub item_lines: Vec<usize>,
    pub value: Value,
}

/// Why a YAML (or JSON) stream cannot be read as documents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// The parser's refusal; `name` is the stream's (a path), `detail` the parser's text.
    #[error("{name}: invalid YAML: {detail}")]
    InvalidYaml { name: String, detail: String },
}

impl DocumentError {
    /// The parser's error on the stream `name`.
    pub fn invalid_yaml(name: &str, error: impl std::fmt::Display) -> DocumentError {
        DocumentError::InvalidYaml { name: name.to_string(), detail: error.to_string() }
    }

    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DocumentError::InvalidYaml { .. } => "invalid_yaml",
        }
    }
}

/// Parses every non-empty document of `text`; `name` prefixes the error.
pub fn parse(name: &str, text: &str) -> Result<Vec<Document>, DocumentError> {
    let docs: Vec<Spanned<Value>> =
        serde_saphyr::from_multiple(text).map_err(|e| DocumentError::invalid_yaml(name, e))?;
    let mut out: Vec<Document> = docs
        .into_iter()
        .enumerate()
        .filter(|(_, d)| !d.value.is_null())
        .map(|(i, d)| Document { index: i + 1, line: line_of(&d), item_lines: Vec::new(), value: d.value })
        .collect();
    if out.iter().any(|d| d.value.get("items").is_some_and(Value::is_array)) {
        add_item_lines(text, &mut out);
    }
    Ok(out)
}

/// The line of a node; 0 (unknown) cannot come from a string source, but is kept rather than
/// made up.
fn line_of<T>(node: &Spanned<T>) -> usize {
    usize::try_from(node.referenced.line()).unwrap_or(0)
}

/// The shape of a `List` document as far as item positions go; any other field is ignored.
#[derive(Deserialize)]
struct ListShape {
    #[serde(default)]
    items: Option<Vec<Spanned<IgnoredAny>>>,
}

/// Second pass, only for streams that hold a list: the line of each item. When the stream does
/// not have that shape (a document that is not a mapping), items keep their list's line.
fn add_item_lines(text: &str, docs: &mut [Document]) {
    let Ok(shapes) = serde_saphyr::from_multiple::<Option<ListShape>>(text) else {
        return;
    };
    for doc in docs.iter_mut() {
        let items = shapes.get(doc.index - 1).and_then(Option::as_ref).and_then(|s| s.items.as_ref());
        if let Some(items) = items {
            doc.item_lines = items.iter().map(line_of).collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<(usize, usize)> {
        parse("t", text).unwrap().iter().map(|d| (d.index, d.line)).collect()
    }

    #[test]
    fn lines_of_documents_after_comments_and_separators() {
        let text =
            "# a comment\n# another\n---\napiVersion: v1\nkind: Pod\n---\n# second\n\nkind: Job\n---\napiVersion: v1\n";
        assert_eq!(lines(text), [(1, 4), (2, 9), (3, 11)]);
        // No leading separator; the first key on line 1.
        assert_eq!(lines("a: 1\n---\nb: 2\n"), [(1, 1), (2, 3)]);
        // A document that starts on the `---` line itself.
        assert_eq!(lines("a: 1\n--- {b: 2}\n"), [(1, 1), (2, 2)]);
    }

    #[test]
    fn empty_documents_are_skipped_and_not_counted() {
        let text = "---\n---\n# only a comment\n---\nkind: Pod\n";
        let docs = parse("t", text).unwrap();
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].line, 5);
        assert_eq!(docs.iter().map(|d| d.index).collect::<Vec<_>>(), [1]);
        assert_eq!(
            crate::model::policy::parse_documents("t", text).unwrap().iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [1],
            "numbered as the policy loader numbers them"
        );
    }

    #[test]
    fn json_objects_and_list_items() {
        let json = "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": [\n    {\"kind\": \"Pod\"},\n\n    {\n      \"kind\": \"Job\"\n    }\n  ]\n}\n";
        let docs = parse("t.json", json).unwrap();
        assert_eq!(docs[0].line, 1);
        assert_eq!(docs[0].item_lines, [5, 7]);
        let yaml = "# list\napiVersion: v1\nkind: List\nitems:\n  - kind: Pod\n    apiVersion: v1\n  - kind: Job\n";
        let docs = parse("t", yaml).unwrap();
        assert_eq!((docs[0].line, docs[0].item_lines.clone()), (2, vec![5, 7]));
    }

    #[test]
    fn a_stream_that_is_not_all_mappings_keeps_list_lines_unknown_not_wrong() {
        let text = "kind: List\nitems:\n  - a: 1\n---\n- just\n- a list\n";
        let docs = parse("t", text).unwrap();
        assert_eq!(docs.len(), 2);
        assert!(docs[0].item_lines.is_empty());
    }

    #[test]
    fn invalid_yaml_is_an_error_with_the_name() {
        let err = parse("bad.yaml", "a: [1, 2\n").unwrap_err();
        assert_eq!(err.metric_label(), "invalid_yaml");
        let err = err.to_string();
        assert!(err.starts_with("bad.yaml: invalid YAML"), "{err}");
    }
}
