//! How a ledger is stored in its ConfigMap: the data keys (one per pending charge, per
//! namespace's folded totals, per replica's allowance, and the drain request) and their values,
//! compact JSON. A value that does not decode is kept aside as unreadable, with the
//! [`WireError`] that says why ([`super::Ledger::from_data`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{Allowance, Entry, Folded, MAX_FOLDED_MEMBERS};
use crate::admission::quota::QuotaRequest;
use crate::model::dra::SharedClaims;
use crate::model::quantity::{Quantity, QuantityError};
use crate::model::resources::ResourceList;

/// Why a stored value does not decode (someone edited the object, or an older or newer Allot
/// wrote it).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("pod {0:?} is not NAMESPACE/NAME")]
    PodKey(String),
    #[error("{field}: {source}")]
    Quantity { field: String, source: QuantityError },
    /// A negative amount would hide usage.
    #[error("{field}: a negative amount")]
    Negative { field: String },
    #[error("gang {gang:?}: no shape {shape}")]
    NoShape { gang: String, shape: usize },
    #[error("gang {gang:?}: {terminating} terminating of {count} members")]
    TerminatingMembers { gang: String, terminating: u32, count: u32 },
    #[error("more than {MAX_FOLDED_MEMBERS} gang members")]
    TooManyMembers,
    #[error("drain: {0}")]
    Drain(std::num::ParseIntError),
}

/// A ConfigMap data key: `[-._a-zA-Z0-9]+`, at most 253 characters.
pub(super) fn valid_key(key: &str) -> bool {
    !key.is_empty() && key.len() <= 253 && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

fn hashed(prefix: &str, text: &str) -> String {
    let digest = sha2::Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// The key admission charges a pod under: its UID (`u.UID`) when the API server gave one (it
/// has by the time validating webhooks run), else namespace, name and the AdmissionRequest uid
/// (`r.HASH`: the API server re-sends a review with the same uid).
pub fn admission_key(request: &QuotaRequest<'_>) -> String {
    if !request.pod_uid.is_empty() {
        let key = format!("u.{}", request.pod_uid);
        if valid_key(&key) {
            return key;
        }
        return hashed("u.", request.pod_uid);
    }
    hashed("r.", &format!("{}/{}/{}", request.namespace, request.pod, request.uid))
}

/// What starts the data key of a namespace's [`Folded`] totals.
pub(super) const FOLDED_PREFIX: &str = "n.";

/// What starts the data key of a replica's [`Allowance`].
pub(super) const ALLOWANCE_PREFIX: &str = "a.";

/// The data key of the drain request (unix milliseconds).
pub(super) const DRAIN_KEY: &str = "drain";

/// The drain request as stored (unix milliseconds).
pub(super) fn parse_drain(value: &str) -> Result<i64, WireError> {
    value.parse::<i64>().map_err(WireError::Drain)
}

/// The drain request in a ledger object's data (unix ms), without decoding the rest: what a
/// replica's watch looks at on every delivery.
pub fn drain_requested_in(data: &BTreeMap<String, String>) -> Option<i64> {
    data.get(DRAIN_KEY).and_then(|v| parse_drain(v).ok())
}

/// The data key of the allowance held by `holder`.
pub fn allowance_key(holder: &str) -> String {
    let key = format!("{ALLOWANCE_PREFIX}{holder}");
    if valid_key(&key) { key } else { hashed(ALLOWANCE_PREFIX, holder) }
}

/// The data key of `namespace`'s [`Folded`] totals.
pub(super) fn folded_key(namespace: &str) -> String {
    let key = format!("{FOLDED_PREFIX}{namespace}");
    if valid_key(&key) { key } else { hashed(FOLDED_PREFIX, namespace) }
}

/// The ConfigMap that holds `team`'s ledger: `allot-quota-TEAM` when that is a valid object
/// name, else `allot-quota-` and a hash of the team name.
pub fn object_name(team: &str) -> String {
    let name = format!("allot-quota-{team}");
    let valid = name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= 63
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if valid { name } else { hashed("allot-quota-", team) }
}

/// An [`Allowance`] as stored.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllowanceWire {
    res: BTreeMap<String, String>,
    until: i64,
}

impl Allowance {
    pub(super) fn encode(&self) -> String {
        serde_json::to_string(&AllowanceWire { res: wire_list(&self.reserved), until: self.until }).unwrap_or_default()
    }

    pub(super) fn decode(text: &str) -> Result<Allowance, WireError> {
        let wire: AllowanceWire = serde_json::from_str(text)?;
        let reserved = parse_list("res", &wire.res)?;
        if reserved.values().any(|q| q.nanos() < 0) {
            return Err(WireError::Negative { field: "res".into() });
        }
        Ok(Allowance { reserved, until: wire.until })
    }
}

/// An entry as stored: compact JSON, one ConfigMap data value.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    pod: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    created: i64,
    at: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    req: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gang: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    seen: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    terminating: bool,
    /// Shared claims: name → counted devices.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    cl: BTreeMap<String, BTreeMap<String, String>>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Entry {
    pub(super) fn encode(&self) -> String {
        let wire = Wire {
            pod: format!("{}/{}", self.namespace, self.name),
            created: self.created,
            at: self.at,
            req: self.requests.iter().map(|(k, v)| (k.clone(), v.to_string())).collect(),
            gang: self.gang.as_ref().map(|(g, _)| g.clone()),
            size: self.gang.as_ref().and_then(|(_, s)| *s),
            seen: self.seen,
            terminating: self.terminating,
            cl: self.claims.iter().map(|(k, v)| (k.clone(), wire_list(v))).collect(),
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    pub(super) fn decode(text: &str) -> Result<Entry, WireError> {
        let wire: Wire = serde_json::from_str(text)?;
        let (namespace, name) = wire.pod.split_once('/').ok_or_else(|| WireError::PodKey(wire.pod.clone()))?;
        let requests = parse_list("req", &wire.req)?;
        Ok(Entry {
            namespace: namespace.to_string(),
            name: name.to_string(),
            created: wire.created,
            at: wire.at,
            requests,
            gang: wire.gang.map(|g| (g, wire.size)),
            claims: parse_claims(&wire.cl)?,
            seen: wire.seen,
            terminating: wire.terminating,
        })
    }
}

/// A group of [`GangMembers`] as stored: `[shape index, declared size, members, terminating]`.
type WireGroup = (usize, Option<u32>, u32, u32);

/// A [`Folded`] as stored: compact JSON; request shapes are listed once and gang members refer
/// to them by index (`[shape, declared size, members, terminating]`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FoldedWire {
    ns: String,
    pods: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    req: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    shapes: Vec<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    gangs: BTreeMap<String, Vec<WireGroup>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    cl: BTreeMap<String, BTreeMap<String, String>>,
}

pub(super) fn wire_list(list: &ResourceList) -> BTreeMap<String, String> {
    list.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
}

fn parse_list(field: &str, list: &BTreeMap<String, String>) -> Result<ResourceList, WireError> {
    list.iter()
        .map(|(k, v)| {
            Quantity::parse(v)
                .map(|q| (k.clone(), q))
                .map_err(|source| WireError::Quantity { field: format!("{field}.{k}"), source })
        })
        .collect()
}

/// Stored shared claims (`cl`); a negative amount is refused (it would hide usage).
fn parse_claims(wire: &BTreeMap<String, BTreeMap<String, String>>) -> Result<SharedClaims, WireError> {
    wire.iter()
        .map(|(claim, list)| {
            let devices = parse_list(&format!("cl.{claim}"), list)?;
            if devices.values().any(|q| q.nanos() < 0) {
                return Err(WireError::Negative { field: format!("cl.{claim}") });
            }
            Ok((claim.clone(), devices))
        })
        .collect()
}

impl Folded {
    pub(super) fn encode(&self) -> String {
        let mut shapes: Vec<&ResourceList> = Vec::new();
        let mut gangs = BTreeMap::new();
        for (gang, members) in &self.gangs {
            let groups = members
                .iter()
                .map(|((requests, size), (count, terminating))| {
                    let shape = shapes.iter().position(|s| *s == requests).unwrap_or_else(|| {
                        shapes.push(requests);
                        shapes.len() - 1
                    });
                    (shape, *size, *count, *terminating)
                })
                .collect();
            gangs.insert(gang.clone(), groups);
        }
        let wire = FoldedWire {
            ns: self.namespace.clone(),
            pods: self.pods,
            req: wire_list(&self.plain),
            shapes: shapes.into_iter().map(wire_list).collect(),
            gangs,
            cl: self.claims.iter().map(|(k, v)| (k.clone(), wire_list(v))).collect(),
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Decodes a stored value; `members` counts the gang members decoded so far (bounded by
    /// [`MAX_FOLDED_MEMBERS`]).
    pub(super) fn decode(text: &str, members: &mut u64) -> Result<Folded, WireError> {
        let wire: FoldedWire = serde_json::from_str(text)?;
        let shapes = wire
            .shapes
            .iter()
            .enumerate()
            .map(|(i, s)| parse_list(&format!("shapes[{i}]"), s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut gangs = BTreeMap::new();
        for (gang, groups) in wire.gangs {
            let mut members_of = BTreeMap::new();
            for (shape, size, count, terminating) in groups {
                let requests = shapes.get(shape).ok_or_else(|| WireError::NoShape { gang: gang.clone(), shape })?;
                if terminating > count {
                    return Err(WireError::TerminatingMembers { gang, terminating, count });
                }
                *members = members.saturating_add(u64::from(count));
                if *members > MAX_FOLDED_MEMBERS {
                    return Err(WireError::TooManyMembers);
                }
                members_of.insert((requests.clone(), size), (count, terminating));
            }
            gangs.insert(gang, members_of);
        }
        Ok(Folded {
            namespace: wire.ns,
            pods: wire.pods,
            plain: parse_list("req", &wire.req)?,
            gangs,
            claims: parse_claims(&wire.cl)?,
        })
    }
}
