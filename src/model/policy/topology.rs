//! A GangPolicy's `topology`: the node-label levels (a rack, an NVLink clique, a zone) a gang
//! must or should land wholly inside, and what a gang may ask of them by annotation.
//!
//! Levels are node label keys, innermost first. `required: K` means every member in one domain
//! (one value of `K`) and never anywhere else; `preferred: [K1, K2, …]` means the tightest of
//! them that fits now, falling back outward, then (without `required`) anywhere. With both,
//! `required` must be one of `preferred`: its place in the list is where the fallback stops,
//! and a preferred level after it would be looser than what is required, so it is refused.
//!
//! A gang may ask for a tighter level with the annotation [`TOPOLOGY_ANNOTATION`] on its
//! members, naming one of the policy's levels: it then needs that level (or a tighter one that
//! fits first). Never a looser one: a key that is not among the levels is refused at admission,
//! so a tenant cannot opt out of the rack her platform requires.

use serde::{Deserialize, Serialize};

/// The annotation a gang's members name a tighter level with.
pub const TOPOLOGY_ANNOTATION: &str = "allot.dev/topology";

/// `spec.topology` of a GangPolicy, as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TopologySpec {
    /// A node label key: every member of a gang in one domain (one value) of it, e.g.
    /// `topology.kubernetes.io/rack`. Nodes without the key are in no domain of it.
    pub required: Option<String>,
    /// Node label keys, innermost first (e.g. `[nvidia.com/gpu.clique,
    /// topology.kubernetes.io/rack, topology.kubernetes.io/zone]`): the tightest level whose
    /// domain can hold the gang now, falling back outward. With `required`, it must be listed
    /// here, and nothing after it.
    #[serde(default)]
    pub preferred: Vec<String>,
}

/// A compiled `topology`: the levels to try, innermost first, and how far the fallback goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Innermost first; ends at the required level where there is one.
    pub levels: Vec<String>,
    /// The last level is required: a gang that fits none of them waits.
    pub required: bool,
}

/// The levels one gang is placed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangTopology {
    /// Innermost first.
    pub levels: Vec<String>,
    /// No domain of any level holds it: it waits (else it goes anywhere).
    pub required: bool,
}

impl GangTopology {
    /// The level a gang that fits nowhere is told about: the loosest it may use.
    pub fn outermost(&self) -> &str {
        self.levels.last().map_or("", String::as_str)
    }
}

/// What is wrong with a `topology` block; each message starts with its field path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologySpecError {
    /// `detail` is the API server's own rule for a qualified name.
    #[error("{field}: {key:?} is not a node label key: {detail}")]
    NotALabelKey { field: String, key: String, detail: String },
    #[error("spec.topology.preferred[{index}]: {key:?} is listed twice")]
    ListedTwice { index: usize, key: String },
    #[error("spec.topology: name a `required` level, `preferred` levels, or both")]
    NoLevels,
    #[error(
        "spec.topology.preferred: {looser:?} is listed after the required {required:?}, so it is looser than what \
         is required: a gang never leaves its required level"
    )]
    LooserThanRequired { looser: String, required: String },
    #[error(
        "spec.topology.required: {required:?} is not among `preferred`: list it there, where the fallback stops \
         (innermost first)"
    )]
    RequiredNotPreferred { required: String },
}

impl TopologySpecError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TopologySpecError::NotALabelKey { .. } => "not_a_label_key",
            TopologySpecError::ListedTwice { .. } => "listed_twice",
            TopologySpecError::NoLevels => "no_levels",
            TopologySpecError::LooserThanRequired { .. } => "looser_than_required",
            TopologySpecError::RequiredNotPreferred { .. } => "required_not_preferred",
        }
    }
}

/// Why a gang may not ask for the topology level it names ([`TOPOLOGY_ANNOTATION`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyRefusal {
    /// `asked` is none of its GangPolicy's `levels` (asking is for a tighter one only).
    #[error(
        "{TOPOLOGY_ANNOTATION}: {asked:?} is not one of the topology levels its GangPolicy allows ({}); a gang \
         may ask for one of them (a tighter level), never for another",
        levels.join(", ")
    )]
    NotALevel { asked: String, levels: Vec<String> },
    /// Its GangPolicy has no `topology`.
    #[error("{TOPOLOGY_ANNOTATION}: {asked:?}: the gang's GangPolicy names no topology levels to choose from")]
    NoLevels { asked: String },
}

impl TopologyRefusal {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TopologyRefusal::NotALevel { .. } => "not_a_level",
            TopologyRefusal::NoLevels { .. } => "no_levels",
        }
    }
}

impl TopologySpec {
    /// The compiled form, or what is wrong with it (each with its field path).
    pub fn compile(&self) -> Result<Topology, Vec<TopologySpecError>> {
        let mut problems = Vec::new();
        let check_key = |field: String, key: &str| {
            crate::model::apivalidation::qualified_name(key)
                .into_iter()
                .map(move |detail| TopologySpecError::NotALabelKey {
                    field: field.clone(),
                    key: key.to_string(),
                    detail,
                })
                .collect::<Vec<_>>()
        };
        if let Some(required) = &self.required {
            problems.extend(check_key("spec.topology.required".into(), required));
        }
        for (i, key) in self.preferred.iter().enumerate() {
            problems.extend(check_key(format!("spec.topology.preferred[{i}]"), key));
            if self.preferred[..i].contains(key) {
                problems.push(TopologySpecError::ListedTwice { index: i, key: key.clone() });
            }
        }
        let levels = match (&self.required, self.preferred.is_empty()) {
            (None, true) => {
                problems.push(TopologySpecError::NoLevels);
                Vec::new()
            }
            (Some(required), true) => vec![required.clone()],
            (None, false) => self.preferred.clone(),
            (Some(required), false) => match self.preferred.iter().position(|k| k == required) {
                Some(at) => {
                    for looser in &self.preferred[at + 1..] {
                        problems.push(TopologySpecError::LooserThanRequired {
                            looser: looser.clone(),
                            required: required.clone(),
                        });
                    }
                    self.preferred[..=at].to_vec()
                }
                None => {
                    problems.push(TopologySpecError::RequiredNotPreferred { required: required.clone() });
                    Vec::new()
                }
            },
        };
        if problems.is_empty() { Ok(Topology { levels, required: self.required.is_some() }) } else { Err(problems) }
    }
}

impl Topology {
    /// The levels a gang whose members ask for `asked` (the annotation) is placed by, or why
    /// it may not ask that. Asking names a level the gang then requires; the tighter levels
    /// before it are still tried first.
    pub fn for_gang(&self, asked: Option<&str>) -> Result<GangTopology, TopologyRefusal> {
        let Some(asked) = asked else {
            return Ok(GangTopology { levels: self.levels.clone(), required: self.required });
        };
        match self.levels.iter().position(|k| k == asked) {
            Some(at) => Ok(GangTopology { levels: self.levels[..=at].to_vec(), required: true }),
            None => Err(TopologyRefusal::NotALevel { asked: asked.to_string(), levels: self.levels.clone() }),
        }
    }
}

/// What a gang asking for `asked` is refused for where its GangPolicy has no topology.
pub fn no_levels(asked: &str) -> TopologyRefusal {
    TopologyRefusal::NoLevels { asked: asked.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(required: Option<&str>, preferred: &[&str]) -> TopologySpec {
        TopologySpec {
            required: required.map(String::from),
            preferred: preferred.iter().map(|s| s.to_string()).collect(),
        }
    }

    const RACK: &str = "topology.kubernetes.io/rack";
    const ZONE: &str = "topology.kubernetes.io/zone";
    const CLIQUE: &str = "nvidia.com/gpu.clique";

    #[test]
    fn required_preferred_and_both_compile_to_levels_innermost_first() {
        assert_eq!(spec(Some(RACK), &[]).compile(), Ok(Topology { levels: vec![RACK.into()], required: true }));
        assert_eq!(
            spec(None, &[CLIQUE, RACK, ZONE]).compile(),
            Ok(Topology { levels: vec![CLIQUE.into(), RACK.into(), ZONE.into()], required: false })
        );
        assert_eq!(
            spec(Some(RACK), &[CLIQUE, RACK]).compile(),
            Ok(Topology { levels: vec![CLIQUE.into(), RACK.into()], required: true })
        );
    }

    #[test]
    fn what_cannot_hold_is_refused_with_its_field() {
        let first = |s: TopologySpec| s.compile().unwrap_err().first().map(|e| (e.metric_label(), e.to_string()));
        let (label, looser) = first(spec(Some(RACK), &[CLIQUE, RACK, ZONE])).unwrap();
        assert!(looser.contains("looser") && looser.contains(ZONE), "{looser:?}");
        assert_eq!(label, "looser_than_required");
        let (label, missing) = first(spec(Some(RACK), &[CLIQUE])).unwrap();
        assert!(missing.starts_with("spec.topology.required"), "{missing:?}");
        assert_eq!(label, "required_not_preferred");
        assert_eq!(spec(None, &[]).compile(), Err(vec![TopologySpecError::NoLevels]));
        let (label, bad) = first(spec(Some("not a key!"), &[])).unwrap();
        assert!(bad.starts_with("spec.topology.required: \"not a key!\""), "{bad:?}");
        assert_eq!(label, "not_a_label_key");
        let (label, twice) = first(spec(None, &[RACK, RACK])).unwrap();
        assert!(twice.contains("twice"), "{twice:?}");
        assert_eq!(label, "listed_twice");
    }

    #[test]
    fn a_gang_may_tighten_never_loosen() {
        let topology = spec(Some(ZONE), &[CLIQUE, RACK, ZONE]).compile().unwrap();
        assert_eq!(
            topology.for_gang(Some(RACK)),
            Ok(GangTopology { levels: vec![CLIQUE.into(), RACK.into()], required: true })
        );
        let preferred_only = spec(None, &[CLIQUE, RACK]).compile().unwrap();
        // Asking turns a preference into a requirement.
        assert_eq!(preferred_only.for_gang(Some(RACK)).map(|g| g.required), Ok(true));
        assert_eq!(preferred_only.for_gang(None).map(|g| g.required), Ok(false));
        let looser = spec(Some(RACK), &[CLIQUE, RACK]).compile().unwrap().for_gang(Some(ZONE)).unwrap_err();
        assert_eq!(looser.metric_label(), "not_a_level");
        let looser = looser.to_string();
        assert!(looser.contains(ZONE) && looser.contains("never"), "{looser}");
        assert!(no_levels(RACK).to_string().contains("names no topology"));
    }
}
