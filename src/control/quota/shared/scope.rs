//! Which ledger object a team's admissions commit to: its own (`allot-quota-TEAM`), or, for a
//! team of a cohort, its part of the cohort's ([`ledger::parts`]), decided with what the other
//! teams' parts say they use.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::ledger::{self, Ledger, parts};
use crate::model::policy::cohort::Cohort;
use crate::model::resources::ResourceList;

/// Where one team's ledger is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Scope {
    /// The ledger object's name.
    pub(super) object: String,
    /// For a team of a cohort: its part's key prefix, and each other team's (team, prefix).
    pub(super) part: Option<Part>,
    /// The label value naming what the object covers (a team, or `cohort.NAME`).
    pub(super) label: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Part {
    /// The cohort's name.
    pub(super) cohort: String,
    pub(super) prefix: String,
    pub(super) others: Vec<(String, String)>,
}

/// A team's ledger as read from its object.
#[derive(Debug, Clone, Default)]
pub(super) struct Parsed {
    pub(super) ledger: Ledger,
    /// What the cohort's other teams use (their parts' usage), by team.
    pub(super) others: BTreeMap<String, ResourceList>,
    /// The team's own part carries the reconciler's marker (always true for a team's own
    /// object: its annotations say it).
    pub(super) marked: bool,
}

impl Scope {
    /// The scope of `team`, in `cohort` when it is in one.
    pub(super) fn of(team: &str, cohort: Option<&Cohort>) -> Scope {
        match cohort {
            None => Scope { object: ledger::object_name(team), part: None, label: super::label_value(team) },
            Some(c) => Scope {
                object: parts::cohort_object_name(&c.name),
                part: Some(Part {
                    cohort: c.name.clone(),
                    prefix: parts::part_prefix(team),
                    others: c
                        .members
                        .iter()
                        .filter(|m| m.team != team)
                        .map(|m| (m.team.clone(), parts::part_prefix(&m.team)))
                        .collect(),
                }),
                label: super::label_value(&format!("cohort.{}", c.name)),
            },
        }
    }

    /// Whether this is already the scope of `team` in `cohort` ([`Scope::of`] would build the
    /// same): checked without allocating, since every admission asks it.
    pub(super) fn serves(&self, team: &str, cohort: Option<&Cohort>) -> bool {
        match (&self.part, cohort) {
            (None, None) => true,
            (Some(part), Some(c)) => {
                let mut others = c.members.iter().filter(|m| m.team != team);
                part.cohort == c.name
                    && part.others.len() + 1 == c.members.len()
                    && part.others.iter().all(|(t, _)| others.next().is_some_and(|m| &m.team == t))
            }
            _ => false,
        }
    }

    /// The team's ledger in `object`. A team of a cohort whose other parts are not all
    /// reconciled and readable cannot be decided (what they use is not known): its ledger then
    /// reads as not reconciled, and admission refuses until the leader has reconciled them.
    pub(super) fn parse(&self, object: &ConfigMap) -> Parsed {
        let annotation = |key: &str| object.metadata.annotations.as_ref().and_then(|a| a.get(key));
        let reconciled = annotation(ledger::RECONCILED_ANNOTATION);
        let empty = BTreeMap::new();
        let data = object.data.as_ref().unwrap_or(&empty);
        let decode = |data: &BTreeMap<String, String>, marked: bool| {
            let mut ledger = Ledger::from_data(data, reconciled.is_some() && marked);
            ledger.allowances_known = reconciled.is_some() && reconciled == annotation(ledger::ALLOWANCES_ANNOTATION);
            ledger.claims_known = reconciled.is_some() && reconciled == annotation(ledger::CLAIMS_ANNOTATION);
            ledger
        };
        let Some(part) = &self.part else {
            return Parsed { ledger: decode(data, true), others: BTreeMap::new(), marked: true };
        };
        let (own, marked) = parts::part_of(data, &part.prefix);
        let mut ledger = decode(&own, marked);
        ledger.sharing = part.others.len() + 1;
        let mut others = BTreeMap::new();
        for (team, prefix) in &part.others {
            let (theirs, their_mark) = parts::part_of(data, prefix);
            let theirs = decode(&theirs, their_mark);
            if !theirs.reconciled || !theirs.readable() {
                ledger.reconciled = false;
            }
            others.insert(team.clone(), theirs.usage().0);
        }
        Parsed { ledger, others, marked }
    }

    /// The object's data with the team's ledger replaced by `ledger`; its part is marked
    /// reconciled at `reconciled` when given (the reconciler), else keeps its mark.
    pub(super) fn data(
        &self,
        object: Option<&ConfigMap>,
        ledger: &Ledger,
        reconciled: Option<&str>,
    ) -> BTreeMap<String, String> {
        match &self.part {
            None => ledger.to_data(),
            Some(part) => {
                let empty = BTreeMap::new();
                let data = object.and_then(|o| o.data.as_ref()).unwrap_or(&empty);
                parts::with_part(data, &part.prefix, ledger.to_data(), reconciled)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::quota::{QuotaRequest, Refusal};
    use crate::control::quota::ledger::Charged;
    use crate::model::policy::cohort::Member;
    use crate::model::policy::{PolicySet, Source, compile};
    use crate::model::quantity::Quantity;

    const GPU: &str = "nvidia.com/gpu";

    /// vision and nlp, 4 GPUs each, in cohort research (deny mode).
    fn research() -> PolicySet {
        let team = |name: &str| {
            format!(
                "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: \
                 [{name}]}}\n  quota: {{mode: Deny, cohort: research, limits: {{nvidia.com/gpu: 4}}}}\n"
            )
        };
        let text = format!("{}---\n{}", team("vision"), team("nlp"));
        compile(&[Source { name: "teams.yaml".into(), text }]).unwrap()
    }

    fn gpus(n: i64) -> ResourceList {
        ResourceList::from([(GPU.to_string(), Quantity::from_units(n))])
    }

    /// Charges one-GPU pod `pod` of `team` on its copy of `object`, as a round does, and
    /// writes the copy back into `object`.
    fn charge(policies: &PolicySet, object: &mut ConfigMap, team: &str, pod: &str) -> Result<Charged, Refusal> {
        let cohort = policies.cohorts.of_team(team);
        let quota = policies.teams.iter().find(|t| t.name == team).and_then(|t| t.quota.clone()).unwrap();
        let scope = Scope::of(team, cohort);
        let Parsed { mut ledger, others, .. } = scope.parse(object);
        let request = QuotaRequest {
            uid: pod,
            team,
            namespace: team,
            pod,
            pod_uid: pod,
            created: 1_000,
            charge: quota.charge(&gpus(1)),
            requests: gpus(1),
            gang: None,
            shared_claims: Default::default(),
            dry_run: false,
            cohort,
        };
        let charged = ledger.charge_in(&quota, &request, &format!("u.{pod}"), 1_000, &others)?;
        object.data = Some(scope.data(Some(object), &ledger, None));
        Ok(charged)
    }

    /// A cohort ledger as the reconciler leaves it: every team's part marked.
    fn reconciled(policies: &PolicySet, teams: &[&str]) -> ConfigMap {
        let mut object = ConfigMap::default();
        let at = "2026-12-07T00:00:00Z".to_string();
        for key in [ledger::RECONCILED_ANNOTATION, ledger::ALLOWANCES_ANNOTATION, ledger::CLAIMS_ANNOTATION] {
            object.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.to_string(), at.clone());
        }
        for team in teams {
            let scope = Scope::of(team, policies.cohorts.of_team(team));
            object.data = Some(scope.data(Some(&object), &Ledger::default(), Some(&at)));
        }
        object
    }

    #[test]
    fn a_scope_serves_its_cohort_until_the_cohort_changes() {
        let policies = research();
        let research = policies.cohorts.of_team("vision").unwrap();
        let scope = Scope::of("vision", Some(research));
        assert!(scope.serves("vision", Some(research)));
        assert!(!scope.serves("vision", None));
        assert!(!Scope::of("vision", None).serves("vision", Some(research)));
        assert!(Scope::of("vision", None).serves("vision", None));
        let mut renamed = research.clone();
        renamed.name = "labs".into();
        assert!(!scope.serves("vision", Some(&renamed)));
        let mut grown = research.clone();
        let mut speech = grown.members[0].clone();
        speech.team = "speech".into();
        grown.members.push(speech);
        assert!(!scope.serves("vision", Some(&grown)));
        assert!(Scope::of("vision", Some(&grown)).serves("vision", Some(&grown)));
        let mut swapped = grown.clone();
        swapped.members.retain(|m| m.team != "nlp");
        swapped.members.push(Member { team: "audio".into(), ..grown.members[0].clone() });
        assert!(!Scope::of("vision", Some(&grown)).serves("vision", Some(&swapped)));
    }

    #[test]
    fn one_object_holds_the_cohort_and_each_team_decides_with_the_others_usage() {
        let policies = research();
        let scope = Scope::of("vision", policies.cohorts.of_team("vision"));
        assert_eq!(scope.object, "allot-cohort-research");
        assert_eq!(scope.label, "cohort.research");
        let mut object = reconciled(&policies, &["vision", "nlp"]);
        // vision borrows nlp's idle 4 and no more.
        for i in 0..8 {
            assert_eq!(charge(&policies, &mut object, "vision", &format!("v{i}")), Ok(Charged::New));
        }
        let refused = charge(&policies, &mut object, "vision", "v8").unwrap_err();
        assert_eq!(
            refused.message("vision"),
            "team vision uses 8 of 4 nvidia.com/gpu (4 borrowed from cohort research); this asks 1; the cohort has 0 \
             unused"
        );
        // nlp's own pods are admitted: its quota is on loan, and comes back by reclaim.
        assert_eq!(charge(&policies, &mut object, "nlp", "n0"), Ok(Charged::New));
        let nlp = Scope::of("nlp", policies.cohorts.of_team("nlp")).parse(&object);
        assert_eq!(nlp.others["vision"], gpus(8));
        assert_eq!(nlp.ledger.usage().0, gpus(1));
        // The parts stay apart: vision's part holds its 8 charges, nlp's its one.
        let vision = scope.parse(&object);
        assert_eq!((vision.ledger.len(), nlp.ledger.len()), (8, 1));
        // Two teams share the object's size: each part may fill half of what one ledger may.
        assert_eq!(vision.ledger.bounds(), (ledger::MAX_ENTRIES / 2, ledger::MAX_BYTES / 2));
    }

    #[test]
    fn a_team_is_not_decided_while_another_part_is_unknown() {
        let policies = research();
        // Only vision's part is reconciled (nlp just joined): what nlp uses is not known.
        let mut object = reconciled(&policies, &["vision"]);
        let refused = charge(&policies, &mut object, "vision", "v0").unwrap_err();
        assert!(matches!(refused, Refusal::Unknown { .. }), "{refused:?}");
        assert!(!Scope::of("nlp", policies.cohorts.of_team("nlp")).parse(&object).marked);
        // An edited, unreadable value in nlp's part: the same.
        let mut object = reconciled(&policies, &["vision", "nlp"]);
        let prefix = parts::part_prefix("nlp");
        object.data.as_mut().unwrap().insert(format!("{prefix}u.x"), "{not json".into());
        assert!(matches!(charge(&policies, &mut object, "vision", "v0"), Err(Refusal::Unknown { .. })));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// Any sequence of one-GPU admissions of the two teams, each decided on its own part of
        /// the one object as the rounds do (parse, charge with the other's usage, write back),
        /// admits exactly what the cohort's arithmetic admits on the same usage: the cohort never
        /// passes 8 but by a lender's own pods, and vision never borrows past nlp's 4.
        #[test]
        fn the_parts_decide_as_the_cohort_does(asks in proptest::collection::vec(proptest::bool::ANY, 0..24)) {
            let policies = research();
            let cohort = policies.cohorts.of_team("vision").unwrap();
            let mut object = reconciled(&policies, &["vision", "nlp"]);
            let mut model = crate::model::policy::cohort::CohortUsage::new(cohort, &mut |_| None);
            for (i, vision) in asks.into_iter().enumerate() {
                let team = if vision { "vision" } else { "nlp" };
                let quota = &cohort.members.iter().find(|m| m.team == team).unwrap().quota;
                let one = quota.charge(&gpus(1));
                let expected = model.check_admission(team, &one).is_ok();
                let charged = charge(&policies, &mut object, team, &format!("p{i}"));
                proptest::prop_assert_eq!(charged.is_ok(), expected, "{} pod {}: {:?}", team, i, charged);
                if expected {
                    model.take(team, &one);
                }
                let used = |t: &str| Scope::of(t, Some(cohort)).parse(&object).ledger.usage().0;
                let n = |l: ResourceList| l.get(GPU).map_or(0, |q| q.ceil_units());
                proptest::prop_assert!(n(used("vision")) <= 8, "vision never borrows past nlp's 4");
            }
        }
    }
}
