//! The JSON Schema of policy files (`allot schema`), generated from the very types the parser
//! deserialises ([`super::model`], via schemars, which reads their serde attributes), so the
//! schema cannot drift from what `allot serve` and `allot check` accept.
//!
//! An editor (yaml-language-server, through its `yaml.schemas` mapping) applies one schema to
//! every document of a file, so the combined schema dispatches on `kind`: each `if kind == X` selects that kind's document
//! schema. Draft-07, the dialect every YAML/JSON editor plugin understands.
//!
//! The schema accepts every document the parser accepts; it refuses most of what the parser
//! refuses (unknown fields, wrong types, missing fields, enum values, and what the patterns and
//! conditions below express). What it cannot express — CEL syntax, glob syntax, quantities too
//! large, a default priority class missing from `allowed`, teams that do not exist, one Cluster
//! per directory, unique names — the field descriptions say, and only the parser checks.

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::transform::transform_subschemas;
use schemars::{Schema, json_schema};
use serde_json::{Map, Value, json};

use super::model::{API_VERSION, ClusterSpec, GangPolicySpec, Metadata, PlacementSpec, RuleSpec, TeamSpec};

pub use super::fields::{DNS_SUBDOMAIN_PATTERN, DURATION_PATTERN, QUANTITY_PATTERN, WEIGHT_PATTERN};

/// One policy kind: its `kind:` value and the schema of its `spec`.
struct Kind {
    name: &'static str,
    spec: fn(&mut SchemaGenerator) -> Schema,
    /// The parser refuses a document of this kind without `spec` (it reads a missing or null
    /// spec as `{}`, which this kind's spec does not satisfy).
    spec_required: bool,
}

/// Every kind, in the order the parser lists them.
const KINDS: &[Kind] = &[
    Kind { name: "Cluster", spec: SchemaGenerator::subschema_for::<ClusterSpec>, spec_required: false },
    Kind { name: "Team", spec: SchemaGenerator::subschema_for::<TeamSpec>, spec_required: true },
    Kind { name: "Placement", spec: SchemaGenerator::subschema_for::<PlacementSpec>, spec_required: true },
    Kind { name: "Rule", spec: SchemaGenerator::subschema_for::<RuleSpec>, spec_required: true },
    Kind { name: "GangPolicy", spec: SchemaGenerator::subschema_for::<GangPolicySpec>, spec_required: false },
];

/// The names of every policy kind the schema describes (`Cluster`, `Team`, …).
pub fn kind_names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name).collect()
}

/// An unknown kind asked of [`kind_schema`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown kind {kind:?}; expected one of {}", kind_names().join(", "))]
pub struct UnknownKind {
    pub kind: String,
}

/// The generator every Allot schema is made with (draft-07, editor-friendly descriptions);
/// `suite` uses it for the test-file schema.
pub fn generator() -> SchemaGenerator {
    SchemaSettings::draft07()
        .with_transform(nullable_as_if_else as fn(&mut Schema))
        .with_transform(defaults_without_nulls as fn(&mut Schema))
        .with_transform(descriptions_unwrapped as fn(&mut Schema))
        .into_generator()
}

/// A doc comment's text as one line per paragraph: editors show each newline of a description
/// as a paragraph break, which would cut sentences at the source's 100-column wrap.
fn unwrapped(text: &str) -> String {
    text.split("\n\n")
        .map(|paragraph| paragraph.split('\n').collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn descriptions_unwrapped(schema: &mut Schema) {
    transform_subschemas(&mut (descriptions_unwrapped as fn(&mut Schema)), schema);
    if let Some(Value::String(text)) = schema.get_mut("description") {
        *text = unwrapped(text);
    }
}

/// Drops a `default: null` (a field that may be left out but never written as null) and the
/// unset (`null`) fields from a struct's `default` (`priority: {default: null,
/// allowed: null}` becomes `{}`): an editor inserts a default as it stands, and a policy
/// author never writes `null` for "unset".
fn defaults_without_nulls(schema: &mut Schema) {
    fn strip(value: &mut Value) {
        if let Value::Object(fields) = value {
            fields.retain(|_, v| !v.is_null());
            fields.values_mut().for_each(strip);
        }
    }
    transform_subschemas(&mut (defaults_without_nulls as fn(&mut Schema)), schema);
    if schema.get("default").is_some_and(Value::is_null) {
        schema.remove("default");
    }
    if let Some(default) = schema.get_mut("default") {
        strip(default);
    }
}

/// Rewrites schemars' `anyOf: [X, {type: null}]` (an `Option<T>` field) as `if: {type: null},
/// else: X`: the same documents pass, but a validator reports what is wrong inside X instead
/// of "no branch of anyOf matched" (editors complete through either form).
fn nullable_as_if_else(schema: &mut Schema) {
    transform_subschemas(&mut (nullable_as_if_else as fn(&mut Schema)), schema);
    let Some(object) = schema.as_object_mut() else { return };
    if object.contains_key("if") {
        return;
    }
    let null = json!({"type": "null"});
    let other = match object.get("anyOf") {
        Some(Value::Array(branches)) if branches.len() == 2 => match (&branches[0], &branches[1]) {
            (x, n) | (n, x) if *n == null && *x != null => x.clone(),
            _ => return,
        },
        _ => return,
    };
    object.remove("anyOf");
    object.insert("if".into(), null);
    object.insert("else".into(), other);
}

/// The description schemars took from a type's doc comment, looked up through its `$ref`.
fn description_of(generator: &SchemaGenerator, reference: &Schema) -> Option<Value> {
    let name = reference.get("$ref")?.as_str()?.rsplit('/').next()?;
    let text = generator.definitions().get(name)?.get("description")?.as_str()?;
    Some(Value::String(unwrapped(text)))
}

/// The schema of a whole document of one kind (`apiVersion`, `kind`, `metadata`, `spec`),
/// its definitions added to `generator`.
fn document(kind: &Kind, generator: &mut SchemaGenerator) -> Schema {
    let spec = (kind.spec)(generator);
    let description = description_of(generator, &spec);
    let metadata = generator.subschema_for::<Metadata>();
    // A spec the parser may also read as null (`spec:` with nothing after it). Not `anyOf`:
    // a validator then reports only "no branch matched", where `else` keeps the spec's errors.
    let mut spec_schema =
        if kind.spec_required { json!({"allOf": [spec]}) } else { json!({"if": {"type": "null"}, "else": spec}) };
    if let Some(description) = &description {
        spec_schema["description"] = description.clone();
    }
    let mut required = vec!["apiVersion", "kind", "metadata"];
    if kind.spec_required {
        required.push("spec");
    }
    let mut schema = json_schema!({
        "title": format!("{} ({API_VERSION})", kind.name),
        "type": "object",
        "required": required,
        "properties": {
            "apiVersion": {"description": "The policy format's version.", "const": API_VERSION},
            "kind": {"const": kind.name},
            "metadata": metadata,
            "spec": spec_schema,
        },
        "additionalProperties": false,
    });
    if let Some(description) = description {
        schema.insert("description".into(), description);
    }
    schema
}

/// A root schema: `body` with the draft-07 `$schema` first and the definitions it uses.
fn root(mut generator: SchemaGenerator, body: Schema) -> Schema {
    let mut out = Map::new();
    out.insert("$schema".into(), json!("http://json-schema.org/draft-07/schema#"));
    if let Value::Object(fields) = body.to_value() {
        out.extend(fields);
    }
    out.insert("definitions".into(), Value::Object(generator.take_definitions(true)));
    Schema::from(out)
}

fn definition_name(kind: &str) -> String {
    format!("{kind}Document")
}

/// The schema of every policy document: `apiVersion`, `kind`, `metadata` and a `spec` chosen
/// by `kind`. Point an editor at it for files that mix kinds.
pub fn combined() -> Schema {
    let mut generator = generator();
    let mut documents = Map::new();
    for kind in KINDS {
        documents.insert(definition_name(kind.name), document(kind, &mut generator).to_value());
    }
    let metadata = generator.subschema_for::<Metadata>();
    let dispatch: Vec<Value> = KINDS
        .iter()
        .map(|k| {
            json!({
                "if": {"properties": {"kind": {"const": k.name}}, "required": ["kind"]},
                "then": {"$ref": format!("#/definitions/{}", definition_name(k.name))},
            })
        })
        .collect();
    let body = json_schema!({
        "title": format!("Allot policy ({API_VERSION})"),
        "description": "An Allot policy document. Its `kind` chooses what `spec` holds.",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"description": "The policy format's version.", "const": API_VERSION},
            "kind": {"description": "What the document is.", "enum": kind_names()},
            "metadata": metadata,
            "spec": {},
        },
        "additionalProperties": false,
        "allOf": dispatch,
    });
    let mut schema = root(generator, body);
    if let Some(Value::Object(definitions)) = schema.get_mut("definitions") {
        definitions.extend(documents);
    }
    schema
}

/// The schema of documents of one kind (`Rule`, …) only.
pub fn kind_schema(name: &str) -> Result<Schema, UnknownKind> {
    let kind = KINDS.iter().find(|k| k.name == name).ok_or_else(|| UnknownKind { kind: name.to_string() })?;
    let mut generator = generator();
    let body = document(kind, &mut generator);
    Ok(root(generator, body))
}

/// The file name of a kind's schema in `allot schema --out DIR` (`rule.schema.json`).
pub fn kind_file_name(kind: &str) -> String {
    format!("{}.schema.json", kind.to_ascii_lowercase())
}

/// The file name of the combined schema in `allot schema --out DIR`.
pub const COMBINED_FILE_NAME: &str = "allot.schema.json";

/// Every schema file `allot schema --out DIR` writes, with its text: the combined schema, then
/// one per kind.
pub fn files() -> Vec<(String, String)> {
    let mut out = vec![(COMBINED_FILE_NAME.to_string(), render(&combined()))];
    for kind in KINDS {
        // Every name in KINDS has a schema.
        if let Ok(schema) = kind_schema(kind.name) {
            out.push((kind_file_name(kind.name), render(&schema)));
        }
    }
    out
}

/// Pretty JSON with a final newline, as the committed files hold it.
pub fn render(schema: &Schema) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_else(|_| "{}".to_string());
    text.push('\n');
    text
}
