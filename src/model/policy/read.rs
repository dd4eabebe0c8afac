//! Reading policy files: the directory's files, their YAML/JSON documents (with the line each
//! starts on), and each document decoded into its kind's spec, strictly (unknown fields are
//! errors, and a list where a mapping belongs is named).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::documents::DocumentError;

use super::{
    API_VERSION, ClusterSpec, GangPolicySpec, LoadErrors, Metadata, PlacementSpec, PolicySet, RuleSpec, TeamSpec,
    compile,
};

/// One policy source: a display name (usually a path) and its text.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    pub text: String,
}

/// Lists the policy files of a directory (recursively, `.yaml`/`.yml`/`.json`, sorted, hidden
/// entries such as Kubernetes' `..data` symlink farm skipped).
pub fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, LoadErrors> {
    let files =
        crate::model::files::yaml_files(dir).map_err(|e| LoadErrors(vec![format!("{}: {e}", dir.display())]))?;
    if files.is_empty() {
        return Err(LoadErrors(vec![format!("{}: no policy files (*.yaml, *.yml, *.json) found", dir.display())]));
    }
    Ok(files)
}

/// Reads every policy file under `dir`.
pub fn read_sources(dir: &Path) -> Result<Vec<Source>, LoadErrors> {
    let files = policy_files(dir)?;
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for path in &files {
        match std::fs::read_to_string(path) {
            Ok(text) => sources.push(Source { name: path.display().to_string(), text }),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    if errors.is_empty() { Ok(sources) } else { Err(LoadErrors(errors)) }
}

/// Loads and compiles every policy file under `dir`.
pub fn load_dir(dir: &Path) -> Result<PolicySet, LoadErrors> {
    compile(&read_sources(dir)?)
}

/// A set's version: its sources' version, and the classes read from the cluster if any.
pub(super) fn versioned(version: String, discovered: &BTreeMap<String, String>) -> String {
    if discovered.is_empty() {
        return version;
    }
    let mut hasher = Sha256::new();
    for (class, resource) in discovered {
        hasher.update(class.as_bytes());
        hasher.update([0]);
        hasher.update(resource.as_bytes());
        hasher.update([0]);
    }
    let hash = hasher.finalize();
    let short: String = hash.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{version}+dc-{short}")
}

/// The version a set compiled from `sources` would have: a short hash of names and contents.
/// Lets a reloader skip recompiling files that did not change.
pub fn version_of(sources: &[Source]) -> String {
    let mut hasher = Sha256::new();
    for source in sources {
        hasher.update(source.name.as_bytes());
        hasher.update([0]);
        hasher.update(source.text.as_bytes());
        hasher.update([0]);
    }
    hasher.finalize().iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Parses every document of a YAML/JSON text into JSON values (empty documents skipped), with
/// their 1-based document numbers. YAML 1.1 booleans, as kubectl reads manifests (test suites,
/// namespaces and state files hold Kubernetes objects).
pub fn parse_documents(name: &str, text: &str) -> Result<Vec<(usize, Value)>, DocumentError> {
    parse_documents_with(name, text, serde_saphyr::Options::default())
}

/// [`parse_documents`] for policy files: booleans are YAML 1.2's `true` and `false` only. In
/// YAML 1.1 an unquoted `Off` (the value that turns a check off), `no` or `on` is a boolean,
/// and a documented `wholeNumbers: Off` failed to load as "invalid type: boolean".
pub fn parse_policy_documents(name: &str, text: &str) -> Result<Vec<(usize, Value)>, DocumentError> {
    parse_documents_with(name, text, serde_saphyr::options! { strict_booleans: true })
}

fn parse_documents_with(
    name: &str,
    text: &str,
    options: serde_saphyr::Options,
) -> Result<Vec<(usize, Value)>, DocumentError> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| DocumentError::invalid_yaml(name, e))?;
    Ok(docs.into_iter().enumerate().filter(|(_, d)| !d.is_null()).map(|(i, d)| (i + 1, d)).collect())
}

/// Why a policy document does not decode into its kind's spec; each message starts with the
/// field path (none for the document itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("a policy document must be a mapping with apiVersion, kind, metadata and spec")]
    NotAMapping,
    /// serde's refusal at `path` (a missing or unknown field, a wrong type).
    #[error("{path}: {detail}")]
    Field { path: String, detail: String },
    /// The decoded spec could not be serialised back for the list-as-mapping check.
    #[error("{path}: {detail}")]
    Reencode { path: String, detail: String },
    /// A list in the document where a mapping belongs (serde would read it as the fields in order).
    #[error("{path}: invalid type: sequence, expected a mapping")]
    SequenceAsMapping { path: String },
    #[error("apiVersion: {found:?} is not supported; use {API_VERSION}")]
    ApiVersion { found: String },
    #[error("metadata.name: must not be empty")]
    EmptyName,
    #[error("kind: unknown kind {found:?}; expected one of Cluster, Team, Placement, Rule, GangPolicy")]
    UnknownKind { found: String },
}

impl DecodeError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::NotAMapping => "not_a_mapping",
            DecodeError::Field { .. } => "field",
            DecodeError::Reencode { .. } => "reencode",
            DecodeError::SequenceAsMapping { .. } => "sequence_as_mapping",
            DecodeError::ApiVersion { .. } => "api_version",
            DecodeError::EmptyName => "empty_name",
            DecodeError::UnknownKind { .. } => "unknown_kind",
        }
    }
}

/// Decodes a value into `T`, with the field path in the error (`spec.checks.wholeNumbers`).
///
/// serde's derived structs also read a list of their fields in declaration order
/// (`metadata: [r]` as `metadata: {name: r}`): no author means that, and the editor schema
/// (`allot schema`) refuses it, so the parser does too. A mapping in the decoded value that was
/// a list in the document is that case.
fn decode<T: DeserializeOwned + Serialize>(value: Value, prefix: &str) -> Result<T, DecodeError> {
    let decoded: T = serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        let path = e.path().to_string();
        let path = match (prefix.is_empty(), path == ".") {
            (_, true) => prefix.to_string(),
            (true, false) => path,
            (false, false) => format!("{prefix}.{path}"),
        };
        DecodeError::Field { path, detail: e.into_inner().to_string() }
    })?;
    let as_written = serde_json::to_value(&decoded)
        .map_err(|e| DecodeError::Reencode { path: prefix.to_string(), detail: e.to_string() })?;
    match list_read_as_mapping(&value, &as_written, prefix) {
        Some(path) => Err(DecodeError::SequenceAsMapping { path }),
        None => Ok(decoded),
    }
}

/// The path of the first place where `input` holds a list and `decoded` (the same document
/// decoded and serialised back) a mapping.
fn list_read_as_mapping(input: &Value, decoded: &Value, path: &str) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (input, decoded) {
        (Value::Array(_), Value::Object(_)) => Some(if path.is_empty() { ".".to_string() } else { path.to_string() }),
        (Value::Object(input), Value::Object(decoded)) => input
            .iter()
            .filter_map(|(key, value)| decoded.get(key).map(|d| (key, value, d)))
            .find_map(|(key, value, d)| list_read_as_mapping(value, d, &join(key))),
        (Value::Array(input), Value::Array(decoded)) => input
            .iter()
            .zip(decoded)
            .enumerate()
            .find_map(|(i, (value, d))| list_read_as_mapping(value, d, &format!("{path}[{i}]"))),
        _ => None,
    }
}

#[derive(serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Envelope {
    api_version: String,
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    spec: Value,
}

pub(super) enum Doc {
    Cluster(ClusterSpec),
    Team(TeamSpec),
    Placement(PlacementSpec),
    Rule(RuleSpec),
    GangPolicy(GangPolicySpec),
}

/// Every document of every source, decoded and named by its location
/// (`FILE: document N (KIND NAME)`); what does not parse or decode goes to `errors`.
pub(super) fn decode_sources(sources: &[Source], errors: &mut Vec<String>) -> Vec<(String, Metadata, Doc)> {
    let mut docs = Vec::new();
    for source in sources {
        let parsed = match parse_policy_documents(&source.name, &source.text) {
            Ok(p) => p,
            Err(e) => {
                errors.push(e.to_string());
                continue;
            }
        };
        for (index, value) in parsed {
            let kind_hint = value.get("kind").and_then(Value::as_str).unwrap_or("?").to_string();
            let location = format!("{}: document {index} ({kind_hint})", source.name);
            match decode_doc(value) {
                Ok((meta, doc)) => {
                    docs.push((format!("{}: document {index} ({kind_hint} {})", source.name, meta.name), meta, doc))
                }
                Err(e) => errors.push(format!("{location}: {e}")),
            }
        }
    }
    docs
}

fn decode_doc(value: Value) -> Result<(Metadata, Doc), DecodeError> {
    if !value.is_object() {
        return Err(DecodeError::NotAMapping);
    }
    let envelope: Envelope = decode(value, "")?;
    if envelope.api_version != API_VERSION {
        return Err(DecodeError::ApiVersion { found: envelope.api_version });
    }
    if envelope.metadata.name.is_empty() {
        return Err(DecodeError::EmptyName);
    }
    let spec = if envelope.spec.is_null() { Value::Object(Default::default()) } else { envelope.spec };
    let doc = match envelope.kind.as_str() {
        "Cluster" => Doc::Cluster(decode(spec, "spec")?),
        "Team" => Doc::Team(decode(spec, "spec")?),
        "Placement" => Doc::Placement(decode(spec, "spec")?),
        "Rule" => Doc::Rule(decode(spec, "spec")?),
        "GangPolicy" => Doc::GangPolicy(decode(spec, "spec")?),
        other => return Err(DecodeError::UnknownKind { found: other.to_string() }),
    };
    Ok((envelope.metadata, doc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(yaml: &str) -> (&'static str, String) {
        let value = serde_saphyr::from_str::<Value>(yaml).expect("valid YAML");
        let err = decode_doc(value).err().expect("refused");
        (err.metric_label(), err.to_string())
    }

    #[test]
    fn each_refusal_has_its_variant_and_field_path() {
        assert_eq!(refusal("[a]").0, "not_a_mapping");
        let (label, message) = refusal("apiVersion: v1\nkind: Team\nmetadata: {name: a}\n");
        assert_eq!(
            (label, message.as_str()),
            ("api_version", "apiVersion: \"v1\" is not supported; use allot.dev/v1alpha1")
        );
        let (label, message) = refusal("apiVersion: allot.dev/v1alpha1\nkind: Quota\nmetadata: {name: a}\n");
        assert!(label == "unknown_kind" && message.starts_with("kind: unknown kind \"Quota\""), "{message}");
        let (label, message) = refusal("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ''}\n");
        assert_eq!((label, message.as_str()), ("empty_name", "metadata.name: must not be empty"));
        let (label, message) = refusal("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: a}\nspce: {}\n");
        assert!(label == "field" && message.contains("spce"), "{message}");
        let (label, message) = refusal("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: [a]\n");
        assert_eq!(
            (label, message.as_str()),
            ("sequence_as_mapping", "metadata: invalid type: sequence, expected a mapping")
        );
    }
}
