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

impl TopologySpec {
    /// The compiled form, or what is wrong with it (each with its field path).
    pub fn compile(&self) -> Result<Topology, Vec<String>> {
        let mut problems = Vec::new();
        let check_key = |field: String, key: &str| {
            crate::model::apivalidation::qualified_name(key)
                .into_iter()
                .map(move |e| format!("{field}: {key:?} is not a node label key: {e}"))
                .collect::<Vec<_>>()
        };
        if let Some(required) = &self.required {
            problems.extend(check_key("spec.topology.required".into(), required));
        }
        for (i, key) in self.preferred.iter().enumerate() {
            problems.extend(check_key(format!("spec.topology.preferred[{i}]"), key));
            if self.preferred[..i].contains(key) {
                problems.push(format!("spec.topology.preferred[{i}]: {key:?} is listed twice"));
            }
        }
        let levels = match (&self.required, self.preferred.is_empty()) {
            (None, true) => {
                problems.push("spec.topology: name a `required` level, `preferred` levels, or both".into());
                Vec::new()
            }
            (Some(required), true) => vec![required.clone()],
            (None, false) => self.preferred.clone(),
            (Some(required), false) => match self.preferred.iter().position(|k| k == required) {
                Some(at) => {
                    for looser in &self.preferred[at + 1..] {
                        problems.push(format!(
                            "spec.topology.preferred: {looser:?} is listed after the required {required:?}, so it is \
                             looser than what is required: a gang never leaves its required level"
                        ));
                    }
                    self.preferred[..=at].to_vec()
                }
                None => {
                    problems.push(format!(
                        "spec.topology.required: {required:?} is not among `preferred`: list it there, where the \
                         fallback stops (innermost first)"
                    ));
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
    pub fn for_gang(&self, asked: Option<&str>) -> Result<GangTopology, String> {
        let Some(asked) = asked else {
            return Ok(GangTopology { levels: self.levels.clone(), required: self.required });
        };
        match self.levels.iter().position(|k| k == asked) {
            Some(at) => Ok(GangTopology { levels: self.levels[..=at].to_vec(), required: true }),
            None => Err(self.refusal(asked)),
        }
    }

    fn refusal(&self, asked: &str) -> String {
        format!(
            "{TOPOLOGY_ANNOTATION}: {asked:?} is not one of the topology levels its GangPolicy allows ({}); a gang \
             may ask for one of them (a tighter level), never for another",
            self.levels.join(", ")
        )
    }
}

/// What a gang asking for `asked` is refused for where its GangPolicy has no topology.
pub fn no_levels(asked: &str) -> String {
    format!("{TOPOLOGY_ANNOTATION}: {asked:?}: the gang's GangPolicy names no topology levels to choose from")
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
        let looser = spec(Some(RACK), &[CLIQUE, RACK, ZONE]).compile().unwrap_err();
        assert!(looser[0].contains("looser") && looser[0].contains(ZONE), "{looser:?}");
        let missing = spec(Some(RACK), &[CLIQUE]).compile().unwrap_err();
        assert!(missing[0].starts_with("spec.topology.required"), "{missing:?}");
        assert!(spec(None, &[]).compile().is_err());
        let bad = spec(Some("not a key!"), &[]).compile().unwrap_err();
        assert!(bad[0].starts_with("spec.topology.required: \"not a key!\""), "{bad:?}");
        let twice = spec(None, &[RACK, RACK]).compile().unwrap_err();
        assert!(twice[0].contains("twice"), "{twice:?}");
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
        assert!(looser.contains(ZONE) && looser.contains("never"), "{looser}");
        assert!(no_levels(RACK).contains("names no topology"));
    }
}
