//! Which team owns a namespace. Teams name namespaces by glob or by label selector; labels come
//! from a [`NamespaceLabels`] source: a Namespace watch in the server, `--namespaces FILE` in the
//! CLI, or nothing (then only name-based matching works, and the result says what it could not
//! evaluate).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::model::json::Fields;
use crate::model::policy::{LabelSelector, PolicySet, SelectorOperator, Team};

/// Labels of a namespace.
pub type Labels = BTreeMap<String, String>;

/// A source of namespace labels.
pub trait NamespaceLabels: Send + Sync {
    /// The labels of `namespace`, or `None` if this source does not know it.
    fn labels(&self, namespace: &str) -> Option<Labels>;
}

/// No namespace information at all.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoNamespaces;

impl NamespaceLabels for NoNamespaces {
    fn labels(&self, _: &str) -> Option<Labels> {
        None
    }
}

/// A fixed table (the CLI's `--namespaces FILE`, tests).
#[derive(Debug, Default, Clone)]
pub struct StaticNamespaces(pub HashMap<String, Labels>);

impl NamespaceLabels for StaticNamespaces {
    fn labels(&self, namespace: &str) -> Option<Labels> {
        self.0.get(namespace).cloned()
    }
}

/// The team of a namespace, and what could not be decided.
#[derive(Debug, Clone, Copy)]
pub struct TeamLookup<'a> {
    pub team: Option<&'a Team>,
    /// A team with a label selector came before the match (or there was no match) and the
    /// namespace's labels were unknown: the answer may be wrong.
    pub undecided: Option<&'a Team>,
}

/// The team of each namespace, resolved once per pass over many pods (a lookup may clone the
/// namespace's labels and walk every Team's selector).
pub struct TeamsByNamespace<'p> {
    policies: &'p PolicySet,
    labels: &'p dyn NamespaceLabels,
    cache: HashMap<Arc<str>, Option<&'p Team>>,
}

impl<'p> TeamsByNamespace<'p> {
    pub fn new(policies: &'p PolicySet, labels: &'p dyn NamespaceLabels) -> Self {
        TeamsByNamespace { policies, labels, cache: HashMap::new() }
    }

    /// The namespace's team, if any (looked up once).
    pub fn get(&mut self, namespace: &str) -> Option<&'p Team> {
        if let Some(team) = self.cache.get(namespace) {
            return *team;
        }
        let team = team_of(self.policies, namespace, self.labels).team;
        self.cache.insert(Arc::from(namespace), team);
        team
    }
}

/// Finds the first team (in policy load order) that owns `namespace`.
pub fn team_of<'a>(policies: &'a PolicySet, namespace: &str, labels: &dyn NamespaceLabels) -> TeamLookup<'a> {
    let mut cached: Option<Option<Labels>> = None;
    let mut undecided = None;
    for team in &policies.teams {
        if team.names.matches(namespace) {
            return TeamLookup { team: Some(team), undecided };
        }
        if let Some(selector) = &team.selector {
            let known = cached.get_or_insert_with(|| labels.labels(namespace));
            match known {
                Some(l) if selector_matches(selector, l) => {
                    return TeamLookup { team: Some(team), undecided };
                }
                Some(_) => {}
                None => {
                    undecided.get_or_insert(team);
                }
            }
        }
    }
    TeamLookup { team: None, undecided }
}

/// Kubernetes label-selector semantics.
pub fn selector_matches(selector: &LabelSelector, labels: &Labels) -> bool {
    selector.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|req| {
            let value = labels.get(&req.key);
            match req.operator {
                SelectorOperator::In => value.is_some_and(|v| req.values.contains(v)),
                SelectorOperator::NotIn => value.is_none_or(|v| !req.values.contains(v)),
                SelectorOperator::Exists => value.is_some(),
                SelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

/// Why a file of Namespace manifests (`allot check --namespaces`, a test's `namespaces`) cannot
/// be read; each names the file and document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespacesError {
    /// Not YAML or JSON (the message names the file).
    #[error("{0}")]
    Parse(crate::model::documents::DocumentError),
    #[error("{file}: document {index}: expected kind Namespace")]
    NotANamespace { file: String, index: usize },
    #[error("{file}: document {index}: metadata.name is missing")]
    MissingName { file: String, index: usize },
}

/// Reads Namespace manifests (YAML/JSON, multi-document, or a `List`) into a label table.
pub fn from_manifests(name: &str, text: &str) -> Result<StaticNamespaces, NamespacesError> {
    let mut table = HashMap::new();
    for (index, doc) in crate::model::policy::parse_documents(name, text).map_err(NamespacesError::Parse)? {
        let items = match doc.get("kind").and_then(|k| k.as_str()) {
            Some("List" | "NamespaceList") => doc.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default(),
            _ => vec![doc],
        };
        for item in items {
            if item.get("kind").and_then(|k| k.as_str()) != Some("Namespace") {
                return Err(NamespacesError::NotANamespace { file: name.to_string(), index });
            }
            let Some(ns) = item.field(&["metadata", "name"]).and_then(|n| n.as_str()) else {
                return Err(NamespacesError::MissingName { file: name.to_string(), index });
            };
            let labels: Labels = item
                .field(&["metadata", "labels"])
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            table.insert(ns.to_string(), labels);
        }
    }
    Ok(StaticNamespaces(table))
}
