//! A Team's compiled `quota:` block: exact accounting with GPU-equivalent weights. Part of the
//! compiled policy; the books that count usage against it are in [`crate::admission::quota`].
//!
//! A charge is kept as an integer number of `1 / (1e9 × D)` units, where `D` is the least common
//! multiple of the quota's weight denominators, so seven `1/7` MIG slices are exactly one GPU —
//! no rounding lets the eighth slip through or the seventh be refused.

use std::collections::BTreeMap;
use std::fmt;

use super::{QuotaMode, QuotaSpec};
use crate::model::dra::DeviceClasses;
use crate::model::quantity::{Quantity, QuantityError};
use crate::model::resources::ResourceList;

/// A compiled team quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    pub mode: QuotaMode,
    /// Limited name → limit, in charge units.
    pub limits: BTreeMap<String, i128>,
    /// Other name → (limited name, numerator, denominator).
    pub equivalents: BTreeMap<String, (String, i128, i128)>,
    /// Common denominator of all weights.
    pub denominator: i128,
    /// Its terms in a cohort (`quota.cohort`): `limits` is then its nominal quota.
    pub cohort: Option<CohortTerms>,
}

/// Amounts per limited resource, in charge units of one [`Quota`].
pub type Charge = BTreeMap<String, i128>;

/// Why a weight (`1/7`, `0.5`) is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    /// Neither a string nor a number (a list, a mapping, a boolean, null).
    #[error("weight must be a number or a fraction like 1/7, got {0}")]
    NotANumber(serde_json::Value),
    /// A string that is no number or fraction.
    #[error("weight must be a positive number or a fraction like 1/7, got {0:?}")]
    Unreadable(String),
    /// Zero, negative, or a denominator over a billion.
    #[error("weight must be a positive number or a fraction like 1/7, got {0:?}")]
    OutOfRange(String),
}

impl WeightError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            WeightError::NotANumber(_) => "not_a_number",
            WeightError::Unreadable(_) => "unreadable",
            WeightError::OutOfRange(_) => "out_of_range",
        }
    }
}

/// Why a `quota:` block is refused; each message starts with its field path below `spec.`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaSpecError {
    #[error("quota.limits: name at least one resource")]
    NoLimits,
    /// An equivalent counts as a resource the quota does not limit.
    #[error("quota.equivalents.{name}.countsAs: {counts_as:?} has no limit")]
    UnlimitedTarget { name: String, counts_as: String },
    #[error("quota.equivalents.{name}.weight: {source}")]
    Weight { name: String, source: WeightError },
    /// The common denominator of the equivalents' weights would pass 10¹².
    #[error("quota.equivalents.{name}.weight: the weights' denominators are too large together")]
    DenominatorsTooLarge { name: String },
    /// The same, once a DeviceClass's weight is added.
    #[error(
        "quota: the weights of DeviceClass {class} and the quota's equivalents have denominators too large together"
    )]
    ClassDenominatorsTooLarge { class: String },
    #[error("quota.limits.{name}: {source}")]
    Limit { name: String, source: QuantityError },
    #[error("quota.limits.{name}: must not be negative")]
    NegativeLimit { name: String },
    /// `borrowingLimit`, `lendingLimit` or `weight` without `cohort`.
    #[error("quota.{field}: only a team in a cohort borrows or lends; name the cohort in quota.cohort")]
    NoCohort { field: &'static str },
    #[error("quota.cohort: {name:?} must be a DNS label (lower-case letters, digits and '-', at most 63)")]
    CohortName { name: String },
    /// A borrowing or lending limit for a resource the quota does not limit.
    #[error("quota.{field}.{name}: {name:?} has no limit in quota.limits")]
    CohortUnlimited { field: &'static str, name: String },
    #[error("quota.{field}.{name}: {source}")]
    CohortLimit { field: &'static str, name: String, source: QuantityError },
    #[error("quota.{field}.{name}: must not be negative")]
    CohortNegative { field: &'static str, name: String },
    #[error("quota.weight: {0}")]
    FairShareWeight(WeightError),
}

impl QuotaSpecError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            QuotaSpecError::NoLimits => "no_limits",
            QuotaSpecError::UnlimitedTarget { .. } => "unlimited_target",
            QuotaSpecError::Weight { .. } => "weight",
            QuotaSpecError::DenominatorsTooLarge { .. } => "denominators_too_large",
            QuotaSpecError::ClassDenominatorsTooLarge { .. } => "class_denominators_too_large",
            QuotaSpecError::Limit { .. } => "limit",
            QuotaSpecError::NegativeLimit { .. } => "negative_limit",
            QuotaSpecError::NoCohort { .. } => "no_cohort",
            QuotaSpecError::CohortName { .. } => "cohort_name",
            QuotaSpecError::CohortUnlimited { .. } => "cohort_unlimited",
            QuotaSpecError::CohortLimit { .. } => "cohort_limit",
            QuotaSpecError::CohortNegative { .. } => "cohort_negative",
            QuotaSpecError::FairShareWeight(_) => "fair_share_weight",
        }
    }
}

pub(super) fn parse_weight(raw: &serde_json::Value) -> Result<(i128, i128), WeightError> {
    let text = match raw {
        serde_json::Value::String(s) => s.trim().to_string(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(WeightError::NotANumber(other.clone())),
    };
    let unreadable = || WeightError::Unreadable(text.clone());
    let (num, den) = match text.split_once('/') {
        Some((n, d)) => {
            (n.trim().parse::<i128>().map_err(|_| unreadable())?, d.trim().parse::<i128>().map_err(|_| unreadable())?)
        }
        None => {
            // A decimal: scale by its digits after the point.
            let q = Quantity::parse(&text).map_err(|_| unreadable())?;
            (q.nanos(), 1_000_000_000)
        }
    };
    if num <= 0 || den <= 0 || den > 1_000_000_000 {
        return Err(WeightError::OutOfRange(text));
    }
    let g = gcd(num, den);
    Ok((num / g, den / g))
}

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 { a.abs() } else { gcd(b, a % b) }
}

impl Quota {
    /// Compiles a `quota:` block; errors name the field.
    pub fn compile(spec: &QuotaSpec) -> Result<Quota, QuotaSpecError> {
        Quota::compile_with_classes(spec, &DeviceClasses::default())
    }

    /// Compiles a `quota:` block, also weighing the devices of the Cluster's DRA DeviceClasses
    /// (charged under [`crate::model::dra::class_resource`] names) against the limit their `countsAs`
    /// resource falls under, directly or through one of the quota's equivalents.
    pub fn compile_with_classes(spec: &QuotaSpec, classes: &DeviceClasses) -> Result<Quota, QuotaSpecError> {
        if spec.limits.is_empty() {
            return Err(QuotaSpecError::NoLimits);
        }
        let mut equivalents = BTreeMap::new();
        let mut denominator: i128 = 1;
        for (name, eq) in &spec.equivalents {
            if !spec.limits.contains_key(&eq.counts_as) {
                return Err(QuotaSpecError::UnlimitedTarget { name: name.clone(), counts_as: eq.counts_as.clone() });
            }
            let (num, den) =
                parse_weight(&eq.weight).map_err(|source| QuotaSpecError::Weight { name: name.clone(), source })?;
            denominator = (denominator / gcd(denominator, den))
                .checked_mul(den)
                .filter(|d| *d <= 1_000_000_000_000)
                .ok_or_else(|| QuotaSpecError::DenominatorsTooLarge { name: name.clone() })?;
            equivalents.insert(name.clone(), (eq.counts_as.clone(), num, den));
        }
        for (class, weight) in classes.iter() {
            let name = crate::model::dra::class_resource(class);
            let direct = spec.limits.contains_key(&weight.counts_as).then(|| (weight.counts_as.clone(), 1, 1));
            let Some((target, num, den)) = direct.or_else(|| equivalents.get(&weight.counts_as).cloned()) else {
                continue;
            };
            let (num, den) = (num.saturating_mul(weight.numerator), den.saturating_mul(weight.denominator));
            let g = gcd(num, den).max(1);
            let (num, den) = (num / g, den / g);
            denominator = (denominator / gcd(denominator, den))
                .checked_mul(den)
                .filter(|d| *d <= 1_000_000_000_000)
                .ok_or_else(|| QuotaSpecError::ClassDenominatorsTooLarge { class: class.to_string() })?;
            equivalents.entry(name).or_insert((target, num, den));
        }
        let mut limits = BTreeMap::new();
        for (name, raw) in &spec.limits {
            let q = Quantity::from_json(raw).map_err(|source| QuotaSpecError::Limit { name: name.clone(), source })?;
            if q.nanos() < 0 {
                return Err(QuotaSpecError::NegativeLimit { name: name.clone() });
            }
            limits.insert(name.clone(), q.nanos().saturating_mul(denominator));
        }
        let cohort = cohort_terms(spec, &limits, denominator)?;
        Ok(Quota { mode: spec.mode, limits, equivalents, denominator, cohort })
    }

    /// Whether this quota counts `amount` of `resource`: a limited or weighted resource, and not
    /// zero (what [`Quota::charge`] leaves a charge for).
    pub fn counts(&self, resource: &str, amount: Quantity) -> bool {
        self.counts_resource(resource) && amount.nanos() != 0
    }

    /// Whether a nonzero amount of `resource` counts: it is limited or has an equivalent.
    pub fn counts_resource(&self, resource: &str) -> bool {
        self.limits.contains_key(resource) || self.equivalents.contains_key(resource)
    }

    /// What `requests` count against each limit. Empty when nothing limited is requested.
    pub fn charge(&self, requests: &ResourceList) -> Charge {
        let mut out = Charge::new();
        for (name, q) in requests {
            if self.limits.contains_key(name) {
                let slot = out.entry(name.clone()).or_default();
                *slot = slot.saturating_add(q.nanos().saturating_mul(self.denominator));
            } else if let Some((target, num, den)) = self.equivalents.get(name) {
                let slot = out.entry(target.clone()).or_default();
                *slot = slot.saturating_add(q.nanos().saturating_mul(*num).saturating_mul(self.denominator / den));
            }
        }
        out.retain(|_, v| *v != 0);
        out
    }

    /// Renders an amount of charge units as a resource quantity (`6`, `1.5`, `0.142857`).
    pub fn show(&self, units: i128) -> String {
        show_units(units, self.denominator)
    }

    /// The first limit that `used + charge` would exceed, as (resource, used, limit, asked).
    pub fn exceeded(&self, used: &Charge, charge: &Charge) -> Option<Exceeded> {
        for (name, asked) in charge {
            let limit = self.limits.get(name).copied().unwrap_or(0);
            let now = used.get(name).copied().unwrap_or(0);
            if now.saturating_add(*asked) > limit {
                return Some(Exceeded {
                    resource: name.clone(),
                    used: self.show(now),
                    limit: self.show(limit),
                    asked: self.show(*asked),
                });
            }
        }
        None
    }
}

/// Renders `units` of `1 / (1e9 × denominator)` as a resource quantity (`6`, `1.5`, `0.142857`).
pub fn show_units(units: i128, denominator: i128) -> String {
    let nanos = units / denominator;
    let exact = units % denominator == 0;
    let q = Quantity::from_nanos(nanos);
    if q.is_whole() {
        format!("{}{}", q.nanos() / 1_000_000_000, if exact { "" } else { "+" })
    } else {
        format!("{:.3}", nanos as f64 / 1e9)
    }
}

/// A quota's terms in its cohort, in the quota's own charge units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CohortTerms {
    pub cohort: String,
    /// Limited name → the most used beyond the nominal; a name absent: no bound but the cohort's.
    pub borrowing_limit: Charge,
    /// Limited name → the most of the unused nominal others may use; a name absent: all of it.
    pub lending_limit: Charge,
    /// The fair-share weight, as (numerator, denominator).
    pub weight: (i128, i128),
}

/// The cohort terms of a `quota:` block whose limits (in charge units of `denominator`) are
/// compiled: `None` without `cohort`.
fn cohort_terms(
    spec: &QuotaSpec,
    limits: &BTreeMap<String, i128>,
    denominator: i128,
) -> Result<Option<CohortTerms>, QuotaSpecError> {
    let Some(cohort) = &spec.cohort else {
        let given = [
            ("borrowingLimit", !spec.borrowing_limit.is_empty()),
            ("lendingLimit", !spec.lending_limit.is_empty()),
            ("weight", spec.weight.is_some()),
        ];
        return match given.into_iter().find(|(_, given)| *given) {
            Some((field, _)) => Err(QuotaSpecError::NoCohort { field }),
            None => Ok(None),
        };
    };
    if !is_dns_label(cohort) {
        return Err(QuotaSpecError::CohortName { name: cohort.clone() });
    }
    let amounts = |field: &'static str, raw: &BTreeMap<String, serde_json::Value>| {
        raw.iter()
            .map(|(name, value)| {
                if !limits.contains_key(name) {
                    return Err(QuotaSpecError::CohortUnlimited { field, name: name.clone() });
                }
                let q = Quantity::from_json(value).map_err(|source| QuotaSpecError::CohortLimit {
                    field,
                    name: name.clone(),
                    source,
                })?;
                if q.nanos() < 0 {
                    return Err(QuotaSpecError::CohortNegative { field, name: name.clone() });
                }
                Ok((name.clone(), q.nanos().saturating_mul(denominator)))
            })
            .collect::<Result<Charge, _>>()
    };
    let weight = match &spec.weight {
        Some(raw) => parse_weight(raw).map_err(QuotaSpecError::FairShareWeight)?,
        None => (1, 1),
    };
    Ok(Some(CohortTerms {
        cohort: cohort.clone(),
        borrowing_limit: amounts("borrowingLimit", &spec.borrowing_limit)?,
        lending_limit: amounts("lendingLimit", &spec.lending_limit)?,
        weight,
    }))
}

/// A DNS label: it names the cohort in an annotation value and a metric label.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// A limit a request would exceed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub resource: String,
    pub used: String,
    pub limit: String,
    pub asked: String,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uses {} of {} {}", self.used, self.limit, self.resource)
    }
}

/// Adds `b` into `a` (saturating: absurd quantities must not wrap around below a limit).
pub fn add(a: &mut Charge, b: &Charge) {
    for (k, v) in b {
        let slot = a.entry(k.clone()).or_default();
        *slot = slot.saturating_add(*v);
    }
}

/// Multiplies a charge (a gang charged as `size` members).
pub fn times(c: &Charge, n: u32) -> Charge {
    c.iter().map(|(k, v)| (k.clone(), v.saturating_mul(i128::from(n)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(limits: serde_json::Value, equivalents: serde_json::Value) -> Quota {
        let spec: QuotaSpec = serde_json::from_value(json!({"limits": limits, "equivalents": equivalents})).unwrap();
        Quota::compile(&spec).unwrap()
    }

    fn req(pairs: &[(&str, &str)]) -> ResourceList {
        pairs.iter().map(|(k, v)| (k.to_string(), Quantity::parse(v).unwrap())).collect()
    }

    #[test]
    fn mig_slices_are_exact_fractions_of_a_gpu() {
        let q = quota(
            json!({"nvidia.com/gpu": 1}),
            json!({"nvidia.com/mig-1g.10gb": {"countsAs": "nvidia.com/gpu", "weight": "1/7"}}),
        );
        let slice = q.charge(&req(&[("nvidia.com/mig-1g.10gb", "1")]));
        let mut used = Charge::new();
        for _ in 0..7 {
            assert_eq!(q.exceeded(&used, &slice), None);
            add(&mut used, &slice);
        }
        let e = q.exceeded(&used, &slice).expect("the eighth slice exceeds");
        assert_eq!((e.used.as_str(), e.limit.as_str()), ("1", "1"));
    }

    #[test]
    fn charges_ignore_unlimited_resources_and_weights_parse() {
        let q = quota(
            json!({"nvidia.com/gpu": "8"}),
            json!({"amd.com/gpu": {"countsAs": "nvidia.com/gpu", "weight": 0.5}}),
        );
        assert!(q.charge(&req(&[("cpu", "4"), ("memory", "1Gi")])).is_empty());
        let c = q.charge(&req(&[("nvidia.com/gpu", "2"), ("amd.com/gpu", "4")]));
        assert_eq!(q.show(c["nvidia.com/gpu"]), "4");
        let e = q.exceeded(&times(&c, 2), &c).unwrap();
        assert_eq!(e.to_string(), "uses 8 of 8 nvidia.com/gpu");
        assert_eq!(e.asked, "4");
    }

    #[test]
    fn bad_quotas_are_errors() {
        for (limits, eq, field, label) in [
            (json!({}), json!({}), "quota.limits", "no_limits"),
            (json!({"nvidia.com/gpu": "x"}), json!({}), "quota.limits.nvidia.com/gpu", "limit"),
            (
                json!({"nvidia.com/gpu": 1}),
                json!({"a": {"countsAs": "b", "weight": 1}}),
                "quota.equivalents.a.countsAs",
                "unlimited_target",
            ),
            (
                json!({"nvidia.com/gpu": 1}),
                json!({"a": {"countsAs": "nvidia.com/gpu", "weight": "0/7"}}),
                "weight",
                "weight",
            ),
            (json!({"nvidia.com/gpu": -1}), json!({}), "must not be negative", "negative_limit"),
            (
                json!({"nvidia.com/gpu": 1}),
                json!({
                    "a": {"countsAs": "nvidia.com/gpu", "weight": "1/999999937"},
                    "b": {"countsAs": "nvidia.com/gpu", "weight": "1/999999929"},
                }),
                "too large",
                "denominators_too_large",
            ),
        ] {
            let spec: QuotaSpec = serde_json::from_value(json!({"limits": limits, "equivalents": eq})).unwrap();
            let err = Quota::compile(&spec).unwrap_err();
            assert_eq!(err.metric_label(), label, "{err}");
            let err = err.to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn weights_say_why_they_are_refused() {
        let label = |raw: serde_json::Value| parse_weight(&raw).map_err(|e| e.metric_label());
        assert_eq!(label(json!("1/7")), Ok((1, 7)));
        assert_eq!(label(json!(true)), Err("not_a_number"));
        assert_eq!(label(json!("a/7")), Err("unreadable"));
        assert_eq!(label(json!("0/7")), Err("out_of_range"));
        let err = parse_weight(&json!("0/7")).unwrap_err().to_string();
        assert_eq!(err, "weight must be a positive number or a fraction like 1/7, got \"0/7\"");
    }

    proptest::proptest! {
        #[test]
        fn accounting_never_panics(limit in ".{0,12}", weight in ".{0,12}", amount in ".{0,14}", n in 0u32..100_000) {
            let spec: Result<QuotaSpec, _> = serde_json::from_value(json!({
                "limits": {"nvidia.com/gpu": limit},
                "equivalents": {"x/y": {"countsAs": "nvidia.com/gpu", "weight": weight}}
            }));
            if let Ok(Ok(q)) = spec.map(|s| Quota::compile(&s))
                && let Ok(a) = Quantity::parse(&amount)
            {
                let c = q.charge(&BTreeMap::from([("x/y".to_string(), a), ("nvidia.com/gpu".to_string(), a)]));
                let big = times(&c, n);
                let _ = q.exceeded(&big, &c);
                for v in big.values() {
                    let _ = q.show(*v);
                }
            }
        }
    }
}
