//! The JSON Schema of single policy fields whose Rust type is wider than what the parser
//! accepts: the patterns and the `#[schemars(schema_with = ...)]` functions the model's types
//! name. The schema of whole documents, built from the model, is [`super::schema`].

use schemars::generate::SchemaGenerator;
use schemars::{Schema, json_schema};
use serde_json::{Value, json};

/// A non-negative Kubernetes quantity as [`crate::model::quantity::Quantity::parse`] reads it
/// (`8`, `500m`, `1.5`, `2Ki`, `1e3`; `-0` is zero, so it passes too).
pub const QUANTITY_PATTERN: &str =
    r"^\s*(\+?([0-9]+\.?[0-9]*|\.[0-9]+)|-(0+\.?0*|\.0+))([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?\s*$";

/// A positive weight: a fraction of positive integers (`1/7`) or a positive quantity (`0.5`).
pub const WEIGHT_PATTERN: &str = r"^\s*(\+?0*[1-9][0-9]*\s*/\s*\+?0*[1-9][0-9]*|\+?([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?)\s*$";

/// A duration as humantime reads it (`90s`, `10m`, `1h 30m`, `1.5h`, or `0`).
pub const DURATION_PATTERN: &str = concat!(
    r"^(0|\s*([0-9][0-9\s]*(\.\s*[0-9][0-9\s]*)?",
    r"(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m",
    r"|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)\s*)+)$"
);

/// A DNS-1123 subdomain (a PriorityClass name): at most 253 characters.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

// Field schemas the model's `#[schemars(schema_with = ...)]` attributes use, for fields whose
// Rust type is wider than what the parser accepts. `patternErrorMessage` is yaml-language-server's
// keyword for a readable message instead of the pattern itself; other validators ignore it.

/// `quota.limits`: resource name → non-negative quantity, at least one.
pub(super) fn quota_limits(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "minProperties": 1,
        "additionalProperties": {
            "description": "A non-negative quantity: a number or a string such as `8`, `500m`, `1.5` (at most about 9.2e18).",
            // `minimum` applies to numbers only, `pattern` to strings only.
            "type": ["number", "string"],
            "minimum": 0,
            "pattern": QUANTITY_PATTERN,
            "patternErrorMessage": "a non-negative quantity such as 8, 500m, 1.5 or 2Ki",
        },
    })
}

/// `quota.borrowingLimit`, `quota.lendingLimit`: resource name → non-negative quantity.
pub(super) fn optional_quota_limits(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = quota_limits(generator);
    schema.remove("minProperties");
    schema
}

/// An equivalent's `weight`: a positive number or a fraction.
pub(super) fn weight(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["number", "string"],
        "exclusiveMinimum": 0,
        "pattern": WEIGHT_PATTERN,
        "patternErrorMessage": "a positive number or fraction such as 1/7, 0.5 or 2",
    })
}

/// A DeviceClass mapping's optional `weight`: a positive number or a fraction.
pub(super) fn optional_weight(generator: &mut SchemaGenerator) -> Schema {
    weight(generator)
}

/// An optional duration (`10m`).
pub(super) fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["string", "null"],
        "pattern": DURATION_PATTERN,
        "patternErrorMessage": "a duration such as 90s, 10m or 1h 30m",
    })
}

fn priority_class_name() -> Value {
    json!({
        "type": "string",
        "pattern": DNS_SUBDOMAIN_PATTERN,
        "maxLength": 253,
        "patternErrorMessage": "a PriorityClass name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit",
    })
}

/// An optional PriorityClass name.
pub(super) fn priority_class(_: &mut SchemaGenerator) -> Schema {
    let mut schema = Schema::try_from(priority_class_name()).unwrap_or_default();
    schema.insert("type".into(), json!(["string", "null"]));
    schema
}

/// An optional list of PriorityClass names.
pub(super) fn priority_classes(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": ["array", "null"], "items": priority_class_name()})
}
