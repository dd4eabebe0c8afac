//! What a case expects (`expect:`), checked for consistency at load, and compared with what
//! the engine decided.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::cli::check::{self, ObjectReport};
use crate::model::patch::PatchOp;
use crate::model::policy::Action;

/// What a case expects. Every key is optional; at least one must be given.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Expect {
    /// Admitted (true) or denied (false).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "bool")]
    pub allowed: Option<bool>,
    /// Exactly these rules deny (`[]`: none).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<String>")]
    pub denied_by: Option<Vec<String>>,
    /// Exactly these rules warn.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<String>")]
    pub warned_by: Option<Vec<String>>,
    /// Exactly these rules audit.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<String>")]
    pub audited_by: Option<Vec<String>>,
    /// The mutating webhook returns a patch (true) or none (false).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "bool")]
    pub mutated: Option<bool>,
    /// Exactly this patch, in order.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<ExpectedOp>")]
    pub patch: Option<Vec<ExpectedOp>>,
    /// JSON pointer into the mutated object → value; `null` means absent.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "BTreeMap<String, Value>")]
    pub fields: Option<BTreeMap<String, Value>>,
    /// Each string occurs in some finding (`path: message`).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Vec<String>")]
    pub message_contains: Option<Vec<String>>,
}

/// One expected JSON Patch operation.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExpectedOp {
    /// The operation.
    pub op: OpName,
    /// Its JSON pointer.
    pub path: String,
    /// Its value (add, replace, test).
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "Value")]
    pub value: Option<Value>,
}

/// RFC 6902 operations the engine emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OpName {
    Add,
    Replace,
    Remove,
    Test,
}

/// A field that, when written, must hold a value: `deniedBy:` with nothing after it is YAML
/// `null`, and must not quietly mean "no expectation".
pub(super) fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// A document that does not decode into its type: where (the field path), and what serde said.
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", path_prefix(.path))]
pub struct DecodeError {
    /// The field path (`cases[2].expect.denyBy`); empty at the top.
    pub path: String,
    pub message: String,
}

impl DecodeError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        "decode"
    }
}

/// `path: `, or nothing at the top of the document.
fn path_prefix(path: &str) -> String {
    if path.is_empty() { String::new() } else { format!("{path}: ") }
}

/// Decodes with the field path in the error (`cases[2].expect.denyBy: unknown field …`).
pub(super) fn decode<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        DecodeError { path: if path == "." { String::new() } else { path }, message: e.into_inner().to_string() }
    })
}

/// Why an expected patch operation is not one the engine could emit.
#[derive(Debug, thiserror::Error)]
pub enum PatchOpError {
    #[error("path: {0:?} is not a JSON pointer (write /spec/…)")]
    NotAPointer(String),
    #[error("value: a remove operation takes no value")]
    ValueOnRemove,
    #[error("value: a {} operation needs a value", op_label(*.0))]
    NoValue(OpName),
}

impl PatchOpError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PatchOpError::NotAPointer(_) => "not_a_pointer",
            PatchOpError::ValueOnRemove => "value_on_remove",
            PatchOpError::NoValue(_) => "no_value",
        }
    }
}

impl ExpectedOp {
    fn to_patch_op(&self) -> Result<PatchOp, PatchOpError> {
        let path = self.path.clone();
        if !(path.is_empty() || path.starts_with('/')) {
            return Err(PatchOpError::NotAPointer(path));
        }
        match (self.op, self.value.clone()) {
            (OpName::Remove, None) => Ok(PatchOp::Remove { path }),
            (OpName::Remove, Some(_)) => Err(PatchOpError::ValueOnRemove),
            (op, None) => Err(PatchOpError::NoValue(op)),
            (OpName::Add, Some(value)) => Ok(PatchOp::Add { path, value }),
            (OpName::Replace, Some(value)) => Ok(PatchOp::Replace { path, value }),
            (OpName::Test, Some(value)) => Ok(PatchOp::Test { path, value }),
        }
    }
}

pub(super) fn op_label(op: OpName) -> &'static str {
    match op {
        OpName::Add => "add",
        OpName::Replace => "replace",
        OpName::Remove => "remove",
        OpName::Test => "test",
    }
}

/// A case's expectations, checked for consistency.
#[derive(Debug, Clone)]
pub struct Expectations {
    pub(super) expect: Expect,
    pub(super) patch: Option<Vec<PatchOp>>,
}

/// Why an `expect` block cannot be checked: it expects nothing, contradicts itself, or holds
/// an invalid pointer or patch operation. Each names the field under `expect`.
#[derive(Debug, thiserror::Error)]
pub enum ExpectError {
    #[error(
        "expect: expects nothing; give allowed, deniedBy, warnedBy, auditedBy, mutated, patch, fields or \
         messageContains"
    )]
    Nothing,
    #[error("expect: allowed: true contradicts deniedBy: [{}]", .0.join(", "))]
    AllowedButDenied(Vec<String>),
    #[error("expect: allowed: false contradicts deniedBy: [] (denied by no rule)")]
    DeniedByNoRule,
    #[error("expect: mutated: false contradicts a non-empty patch")]
    PatchWithoutMutation,
    #[error("expect: mutated: true contradicts patch: []")]
    MutationWithoutPatch,
    #[error("expect.{field}[{index}]: empty rule name")]
    EmptyRuleName { field: &'static str, index: usize },
    #[error("expect.fields: empty; name at least one JSON pointer, or leave fields out")]
    NoFields,
    #[error("expect.fields.{0}: not a JSON pointer (write /spec/…)")]
    FieldNotAPointer(String),
    #[error("expect.messageContains: empty; give a substring, or leave messageContains out")]
    NoWords,
    #[error("expect.messageContains[{0}]: empty string (it is in every message)")]
    EmptyWord(usize),
    #[error("expect.patch[{index}].{source}")]
    PatchOp {
        index: usize,
        #[source]
        source: PatchOpError,
    },
}

impl ExpectError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ExpectError::Nothing => "expects_nothing",
            ExpectError::AllowedButDenied(_) => "allowed_but_denied",
            ExpectError::DeniedByNoRule => "denied_by_no_rule",
            ExpectError::PatchWithoutMutation => "patch_without_mutation",
            ExpectError::MutationWithoutPatch => "mutation_without_patch",
            ExpectError::EmptyRuleName { .. } => "empty_rule_name",
            ExpectError::NoFields => "no_fields",
            ExpectError::FieldNotAPointer(_) => "field_not_a_pointer",
            ExpectError::NoWords => "no_words",
            ExpectError::EmptyWord(_) => "empty_word",
            ExpectError::PatchOp { .. } => "patch_op",
        }
    }
}

impl Expectations {
    /// Checks an `expect` block: it must expect something, not contradict itself, and hold valid
    /// pointers and patch operations. Errors name the field under `expect`.
    pub fn new(expect: Expect) -> Result<Expectations, Vec<ExpectError>> {
        let mut errors = Vec::new();
        let e = &expect;
        let nothing = e.allowed.is_none()
            && e.denied_by.is_none()
            && e.warned_by.is_none()
            && e.audited_by.is_none()
            && e.mutated.is_none()
            && e.patch.is_none()
            && e.fields.is_none()
            && e.message_contains.is_none();
        if nothing {
            errors.push(ExpectError::Nothing);
        }
        match (e.allowed, &e.denied_by) {
            (Some(true), Some(rules)) if !rules.is_empty() => errors.push(ExpectError::AllowedButDenied(rules.clone())),
            (Some(false), Some(rules)) if rules.is_empty() => errors.push(ExpectError::DeniedByNoRule),
            _ => {}
        }
        match (e.mutated, &e.patch) {
            (Some(false), Some(ops)) if !ops.is_empty() => errors.push(ExpectError::PatchWithoutMutation),
            (Some(true), Some(ops)) if ops.is_empty() => errors.push(ExpectError::MutationWithoutPatch),
            _ => {}
        }
        for (field, rules) in [("deniedBy", &e.denied_by), ("warnedBy", &e.warned_by), ("auditedBy", &e.audited_by)] {
            for (index, rule) in rules.iter().flatten().enumerate() {
                if rule.trim().is_empty() {
                    errors.push(ExpectError::EmptyRuleName { field, index });
                }
            }
        }
        if let Some(fields) = &e.fields {
            if fields.is_empty() {
                errors.push(ExpectError::NoFields);
            }
            for pointer in fields.keys().filter(|p| !p.starts_with('/')) {
                errors.push(ExpectError::FieldNotAPointer(pointer.clone()));
            }
        }
        if let Some(words) = &e.message_contains {
            if words.is_empty() {
                errors.push(ExpectError::NoWords);
            }
            for (i, _) in words.iter().enumerate().filter(|(_, w)| w.is_empty()) {
                errors.push(ExpectError::EmptyWord(i));
            }
        }
        let mut patch = None;
        if let Some(ops) = &e.patch {
            let mut converted = Vec::with_capacity(ops.len());
            for (index, op) in ops.iter().enumerate() {
                match op.to_patch_op() {
                    Ok(op) => converted.push(op),
                    Err(source) => errors.push(ExpectError::PatchOp { index, source }),
                }
            }
            patch = Some(converted);
        }
        if errors.is_empty() { Ok(Expectations { expect, patch }) } else { Err(errors) }
    }

    /// What differs between the expectations and what the engine decided: one entry per
    /// expectation that failed, each saying what was expected and what came out. Empty: pass.
    pub fn compare(&self, report: &ObjectReport, mutated: &Value) -> Vec<String> {
        let e = &self.expect;
        let mut out = Vec::new();
        if let Some(allowed) = e.allowed
            && allowed != report.allowed
        {
            let why = if report.allowed {
                String::new()
            } else {
                format!(" (denied by [{}])", join(&rules_with(report, Action::Deny)))
            };
            out.push(format!("allowed: expected {allowed}, got {}{why}", report.allowed));
        }
        for (field, action, expected) in [
            ("deniedBy", Action::Deny, &e.denied_by),
            ("warnedBy", Action::Warn, &e.warned_by),
            ("auditedBy", Action::Audit, &e.audited_by),
        ] {
            if let Some(expected) = expected {
                out.extend(compare_rules(field, action, expected, report));
            }
        }
        if let Some(want) = e.mutated
            && want != report.mutated
        {
            out.push(format!("mutated: expected {want}, got {}", report.mutated));
        }
        if let Some(expected) = &self.patch {
            out.extend(compare_patch(expected, &report.patch));
        }
        for (pointer, want) in e.fields.iter().flatten() {
            let got = mutated.pointer(pointer).filter(|v| !v.is_null());
            let show = |v: Option<&Value>| v.map_or_else(|| "absent".to_string(), compact);
            let want = (!want.is_null()).then_some(want);
            if want != got {
                out.push(format!("fields {pointer}: expected {}, got {}", show(want), show(got)));
            }
        }
        for word in e.message_contains.iter().flatten() {
            if !report.findings.iter().any(|f| f.describe().contains(word.as_str())) {
                let messages: Vec<String> =
                    report.findings.iter().map(|f| format!("[{}] {}", f.rule, f.describe())).collect();
                let seen = if messages.is_empty() {
                    "\n  (there are no findings)".to_string()
                } else {
                    messages.iter().map(|m| format!("\n  finding: {m}")).collect()
                };
                out.push(format!("messageContains: no finding message contains {word:?}{seen}"));
            }
        }
        out
    }
}

pub(super) fn rules_with(report: &ObjectReport, action: Action) -> BTreeSet<String> {
    report.findings.iter().filter(|f| f.action == action).map(|f| f.rule.to_string()).collect()
}

pub(super) fn join<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    items.into_iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

pub(super) fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The exact set of rules with `action`, compared by name; the messages of unexpected ones.
pub(super) fn compare_rules(field: &str, action: Action, expected: &[String], report: &ObjectReport) -> Option<String> {
    let want: BTreeSet<String> = expected.iter().cloned().collect();
    let got = rules_with(report, action);
    if want == got {
        return None;
    }
    let mut text = format!("{field}: expected [{}], got [{}]", join(&want), join(&got));
    let missing: Vec<&String> = want.difference(&got).collect();
    if !missing.is_empty() {
        text.push_str(&format!("\n  missing: {}", join(missing)));
    }
    for rule in got.difference(&want) {
        for f in report.findings.iter().filter(|f| f.action == action && f.rule == rule.as_str()) {
            text.push_str(&format!("\n  unexpected: [{rule}] {}", f.describe()));
        }
    }
    Some(text)
}

pub(super) fn compare_patch(expected: &[PatchOp], got: &[PatchOp]) -> Option<String> {
    if expected == got {
        return None;
    }
    let first = expected.iter().zip(got).take_while(|(a, b)| a == b).count();
    let counts = format!("expected {} op(s), got {}", expected.len(), got.len());
    Some(match (expected.get(first), got.get(first)) {
        (Some(want), Some(have)) => format!(
            "patch: op {} differs ({counts})\n  expected: {}\n  got:      {}",
            first + 1,
            check::describe_op(want),
            check::describe_op(have)
        ),
        (Some(_), None) => format!(
            "patch: {counts}; missing:\n  {}",
            expected[first..].iter().map(check::describe_op).collect::<Vec<_>>().join("\n  ")
        ),
        (None, _) => format!(
            "patch: {counts}; unexpected:\n  {}",
            got[first..].iter().map(check::describe_op).collect::<Vec<_>>().join("\n  ")
        ),
    })
}
