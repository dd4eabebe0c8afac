//! One object under review, as the engine and its checks see it: the parts of an
//! AdmissionRequest (or of a manifest in `allot check`) that decide the outcome. Its own module
//! so the checks (`validate`, `mutate`) and the engine that runs them share it without depending
//! on each other.

use serde::Serialize;
use serde_json::Value;

use crate::model::policy::Operation;

/// The admission operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RequestOperation {
    Create,
    Update,
    Delete,
    Connect,
}

impl RequestOperation {
    /// Parses the AdmissionRequest's `operation`.
    pub fn parse(s: &str) -> Option<RequestOperation> {
        Some(match s {
            "CREATE" => RequestOperation::Create,
            "UPDATE" => RequestOperation::Update,
            "DELETE" => RequestOperation::Delete,
            "CONNECT" => RequestOperation::Connect,
            _ => return None,
        })
    }

    pub(crate) fn as_rule_operation(self) -> Option<Operation> {
        match self {
            RequestOperation::Create => Some(Operation::Create),
            RequestOperation::Update => Some(Operation::Update),
            _ => None,
        }
    }
}

/// One object under review, as the engine needs it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The AdmissionRequest uid (quota reservations are keyed by it: retries are idempotent).
    pub uid: &'a str,
    pub operation: RequestOperation,
    /// API group of the object's kind (`""` for core).
    pub group: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub object: &'a Value,
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    pub username: &'a str,
    pub groups: &'a [String],
}

impl Request<'_> {
    /// Whether the object under review is a Pod itself (not a workload holding templates).
    pub fn is_pod(&self) -> bool {
        self.group.is_empty() && self.kind == "Pod"
    }
}
