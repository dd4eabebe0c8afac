use proptest::prelude::*;

use super::usage::at;
use super::*;
use crate::model::policy::{Source, compile as compile_set};

const GPU: &str = "nvidia.com/gpu";

fn team(name: &str, quota: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: {name}}}\nspec:\n  namespaces: {{names: [{name}]}}\n  quota: {quota}\n"
    )
}

fn set(teams: &[String]) -> Result<crate::model::policy::PolicySet, Vec<String>> {
    let text = teams.join("---\n");
    compile_set(&[Source { name: "teams.yaml".into(), text }]).map_err(|e| e.0)
}

/// GPUs in the cohort's units.
fn gpus(cohort: &Cohort, n: i128) -> i128 {
    n * 1_000_000_000 * cohort.denominator
}

fn charge(quota_denominator: i128, n: i128) -> Charge {
    Charge::from([(GPU.to_string(), n * 1_000_000_000 * quota_denominator)])
}

/// The cluster: vision and nlp, 4 GPUs each, in cohort research.
fn research() -> crate::model::policy::PolicySet {
    set(&[
        team("vision", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}"),
        team("nlp", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}}"),
    ])
    .unwrap()
}

#[test]
fn an_idle_teams_quota_is_lent_and_the_borrower_is_told_the_cohorts_numbers() {
    let policies = research();
    let cohort = policies.cohorts.of_team("vision").unwrap();
    let mut usage = CohortUsage::new(cohort, &mut |_| None);
    for _ in 0..6 {
        let take = usage.check("vision", &charge(1, 1)).unwrap();
        usage.take("vision", &charge(1, 1));
        assert_eq!(take.borrows, at(&usage.used("vision"), GPU) > gpus(cohort, 4));
    }
    assert_eq!(usage.borrowed("vision"), Charge::from([(GPU.into(), gpus(cohort, 2))]));
    assert_eq!(usage.lent()["nlp"], Charge::from([(GPU.into(), gpus(cohort, 2))]));
    let over = usage.check("vision", &charge(1, 3)).unwrap_err();
    assert_eq!(
        over.message("vision", "research"),
        "team vision uses 6 of 4 nvidia.com/gpu (2 borrowed from cohort research); this asks 3; the cohort has 2 unused"
    );
    // nlp asks within its nominal: 2 fit, the next 2 are on loan.
    usage.take("nlp", &charge(1, 2));
    let lent = usage.check("nlp", &charge(1, 1)).unwrap_err();
    assert!(matches!(*lent, Shortfall::Cohort { within_nominal: true, .. }), "{lent:?}");
    assert!(lent.message("nlp", "research").contains("within team nlp's nominal quota, which is lent"));
}

#[test]
fn limits_bound_the_exchange() {
    let policies = set(&[
        team(
            "vision",
            "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}, borrowingLimit: {nvidia.com/gpu: 1}}",
        ),
        team("nlp", "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 4}, lendingLimit: {nvidia.com/gpu: 3}}"),
        team(
            "audio",
            "{mode: Queue, cohort: research, limits: {nvidia.com/gpu: 2}, lendingLimit: {nvidia.com/gpu: 0}}",
        ),
    ])
    .unwrap();
    let cohort = policies.cohorts.of_team("nlp").unwrap();
    let mut usage = CohortUsage::new(cohort, &mut |_| None);
    usage.take("vision", &charge(1, 5));
    let refused = usage.check("vision", &charge(1, 1)).unwrap_err();
    assert_eq!(
        refused.message("vision", "research"),
        "team vision uses 5 of 4 nvidia.com/gpu (1 borrowed from cohort research, borrowing limit 1); this asks 1"
    );
    // audio lends nothing: nlp may use its 4 and vision's 4; vision its 4 and 1 borrowed.
    assert_eq!(usage.never_fits("nlp", &charge(1, 8)), None);
    assert_eq!(usage.never_fits("nlp", &charge(1, 9)), Some((GPU.into(), "9".into(), "8".into())));
    assert_eq!(usage.never_fits("vision", &charge(1, 6)), Some((GPU.into(), "6".into(), "5".into())));
    // audio keeps its 2 whatever the others borrow.
    let mut usage = CohortUsage::new(cohort, &mut |_| None);
    usage.take("nlp", &charge(1, 4));
    usage.take("vision", &charge(1, 4));
    assert!(usage.check("vision", &charge(1, 1)).is_err());
    assert!(usage.check("audio", &charge(1, 2)).is_ok());
}

#[test]
fn what_cannot_hold_is_refused_at_load() {
    let cases = [
        (
            vec![team("a", "{mode: Queue, limits: {nvidia.com/gpu: 4}, borrowingLimit: {nvidia.com/gpu: 1}}")],
            "spec.quota.borrowingLimit: only a team in a cohort borrows or lends",
        ),
        (
            vec![team("a", "{mode: Queue, limits: {nvidia.com/gpu: 4}, weight: 2}")],
            "spec.quota.weight: only a team in a cohort",
        ),
        (
            vec![team("a", "{mode: Queue, cohort: Research, limits: {nvidia.com/gpu: 4}}")],
            "spec.quota.cohort: \"Research\" must be a DNS label",
        ),
        (
            vec![team("a", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 4}, lendingLimit: {amd.com/gpu: 1}}")],
            "spec.quota.lendingLimit.amd.com/gpu: \"amd.com/gpu\" has no limit in quota.limits",
        ),
        (
            vec![team("a", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 4}, weight: 0}")],
            "spec.quota.weight: weight must be a positive number",
        ),
        (
            vec![
                team("a", "{mode: Deny, cohort: r, limits: {nvidia.com/gpu: 4}}"),
                team("b", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 4}}"),
            ],
            "spec.quota.mode: the teams of cohort r must share one quota mode (team b is mode: Queue; team a is mode: Deny)",
        ),
        (
            vec![
                team("a", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 4}}"),
                team("b", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 4, amd.com/gpu: 2}}"),
            ],
            "spec.quota.limits: the teams of cohort r must limit the same resources (team b limits amd.com/gpu, nvidia.com/gpu; team a limits nvidia.com/gpu)",
        ),
    ];
    for (teams, wanted) in cases {
        let errors = set(&teams).expect_err(wanted);
        assert!(errors.iter().any(|e| e.contains(wanted) && e.starts_with("teams.yaml")), "{wanted}\n{errors:#?}");
    }
}

#[test]
fn teams_weighing_slices_differently_add_up_exactly() {
    let policies = set(&[
        team("a", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 1}, equivalents: {nvidia.com/mig-1g.10gb: {countsAs: nvidia.com/gpu, weight: 1/7}}}"),
        team("b", "{mode: Queue, cohort: r, limits: {nvidia.com/gpu: 1}, equivalents: {nvidia.com/mig-1g.10gb: {countsAs: nvidia.com/gpu, weight: 1/3}}}"),
    ])
    .unwrap();
    let cohort = policies.cohorts.of_team("a").unwrap();
    assert_eq!(cohort.denominator, 21);
    let quota_a = policies.teams.iter().find(|t| t.name == "a").unwrap().quota.as_ref().unwrap();
    let slice: crate::model::resources::ResourceList =
        [("nvidia.com/mig-1g.10gb".to_string(), crate::model::quantity::Quantity::parse("1").unwrap())].into();
    let mut usage = CohortUsage::new(cohort, &mut |_| None);
    // Fourteen 1/7 slices are exactly the cohort's 2 GPUs; the fifteenth is refused.
    for _ in 0..14 {
        usage.check("a", &quota_a.charge(&slice)).unwrap();
        usage.take("a", &quota_a.charge(&slice));
    }
    assert!(usage.check("a", &quota_a.charge(&slice)).is_err());
}

/// One team's terms in a generated cohort, in whole GPUs.
#[derive(Debug, Clone)]
struct Terms {
    nominal: i128,
    borrowing: Option<i128>,
    lending: Option<i128>,
}

fn terms() -> impl Strategy<Value = Terms> {
    (0i128..6, proptest::option::of(0i128..5), proptest::option::of(0i128..6))
        .prop_map(|(nominal, borrowing, lending)| Terms { nominal, borrowing, lending })
}

fn generated(teams: &[Terms]) -> crate::model::policy::PolicySet {
    let docs: Vec<String> = teams
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut quota = format!("{{mode: Queue, cohort: c, limits: {{nvidia.com/gpu: {}}}", t.nominal);
            if let Some(b) = t.borrowing {
                quota.push_str(&format!(", borrowingLimit: {{nvidia.com/gpu: {b}}}"));
            }
            if let Some(l) = t.lending {
                quota.push_str(&format!(", lendingLimit: {{nvidia.com/gpu: {l}}}"));
            }
            quota.push('}');
            team(&format!("t{i}"), &quota)
        })
        .collect();
    set(&docs).unwrap()
}

/// What team `t` keeps of its nominal quota (lends none of it), in GPUs.
fn kept(t: &Terms) -> i128 {
    t.nominal - t.lending.unwrap_or(t.nominal).min(t.nominal)
}

/// What team `ti` uses in `u`, in GPUs (`one`: a GPU in cohort units).
fn used_gpus(u: &CohortUsage<'_>, i: usize, one: i128) -> i128 {
    at(&u.used(&format!("t{i}")), GPU) / one
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever teams ask, in any order: the cohort never uses more than its nominal quotas
    /// together, no team borrows past its limit, no team's kept part is used by the others, and
    /// `check` refuses only what would break one of these.
    #[test]
    fn the_cohort_never_passes_its_quotas(
        teams in proptest::collection::vec(terms(), 1..4),
        asks in proptest::collection::vec((0usize..3, 1i128..4), 0..30),
    ) {
        let policies = generated(&teams);
        let cohort = policies.cohorts.of_team("t0").unwrap();
        let mut usage = CohortUsage::new(cohort, &mut |_| None);
        let one = gpus(cohort, 1);
        let total_nominal: i128 = teams.iter().map(|t| t.nominal).sum();
        for (who, n) in asks {
            let who = who % teams.len();
            let name = format!("t{who}");
            let asked = charge(1, n);
            let verdict = usage.check(&name, &asked);
            // What taking it would give, checked directly.
            let mut after = usage.clone();
            after.take(&name, &asked);
            let used = |u: &CohortUsage<'_>, i: usize| used_gpus(u, i, one);
            let kept = |i: usize| kept(&teams[i]);
            let total: i128 = (0..teams.len()).map(|i| used(&after, i).max(kept(i))).sum();
            let borrowed = used(&after, who) - teams[who].nominal;
            let holds = total <= total_nominal && teams[who].borrowing.is_none_or(|b| borrowed <= b);
            prop_assert_eq!(verdict.is_ok(), holds, "{} asks {}: {:?}", name, n, verdict);
            if verdict.is_ok() {
                prop_assert_eq!(verdict.unwrap().borrows, borrowed > 0);
                usage = after;
            }
            let sum: i128 = (0..teams.len()).map(|i| used(&usage, i)).sum();
            prop_assert!(sum <= total_nominal);
            for (i, t) in teams.iter().enumerate() {
                let others: i128 = (0..teams.len()).filter(|j| *j != i).map(|j| used(&usage, j)).sum();
                prop_assert!(others <= total_nominal - kept(i), "team {} keeps {}", i, kept(i));
                if let Some(b) = t.borrowing {
                    prop_assert!(used(&usage, i) - t.nominal <= b);
                }
            }
            // What is lent covers exactly what is borrowed.
            let lent: i128 = usage.lent().values().map(|c| at(c, GPU)).sum();
            let borrowed_all: i128 = (0..teams.len()).map(|i| at(&usage.borrowed(&format!("t{i}")), GPU)).sum();
            prop_assert_eq!(lent, borrowed_all);
        }
    }

    /// At admission (`mode: Deny`), whatever teams ask, in any order: what a team asks within
    /// its nominal quota is always admitted (what it lent is reclaimed, not refused); a pod that
    /// borrows is admitted exactly when its team stays within its borrowing limit and the
    /// cohort's draws stay within what its teams lend, so the cohort passes its nominal quotas
    /// together only by what lenders took back.
    #[test]
    fn admission_never_refuses_a_lender_and_never_lends_twice(
        teams in proptest::collection::vec(terms(), 1..4),
        asks in proptest::collection::vec((0usize..3, 1i128..4), 0..30),
    ) {
        let policies = generated(&teams);
        let cohort = policies.cohorts.of_team("t0").unwrap();
        let mut usage = CohortUsage::new(cohort, &mut |_| None);
        let one = gpus(cohort, 1);
        let kept = |i: usize| kept(&teams[i]);
        let pool: i128 = (0..teams.len()).map(|i| teams[i].nominal - kept(i)).sum();
        let used = |u: &CohortUsage<'_>, i: usize| used_gpus(u, i, one);
        for (who, n) in asks {
            let who = who % teams.len();
            let name = format!("t{who}");
            let asked = charge(1, n);
            let verdict = usage.check_admission(&name, &asked);
            let mut after = usage.clone();
            after.take(&name, &asked);
            let within = used(&after, who) <= teams[who].nominal;
            let drawn: i128 = (0..teams.len()).map(|i| (used(&after, i) - kept(i)).max(0)).sum();
            let borrowed = used(&after, who) - teams[who].nominal;
            let fits = drawn <= pool && teams[who].borrowing.is_none_or(|b| borrowed <= b);
            prop_assert_eq!(verdict.is_ok(), within || fits, "{} asks {}: {:?}", name, n, verdict);
            if let Ok(take) = verdict {
                prop_assert_eq!(take.borrows, !within);
                usage = after;
            }
            for (i, t) in teams.iter().enumerate() {
                if let Some(b) = t.borrowing {
                    prop_assert!(used(&usage, i) - t.nominal <= b);
                }
            }
        }
    }
}
