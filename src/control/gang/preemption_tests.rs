//! Preemption around the decision: running units read from the view, the snapshot's preemptor
//! rights, the leader's memory, and the eviction sequence against a recording API.

use std::cell::RefCell;

use serde_json::{Value, json};

use super::*;
use crate::control::cluster::fixtures::{cluster, member, policies, team_pod};
use crate::control::gang::decision::{GangKey, RunningPod, Verdict, decide};
use crate::control::gang::snapshot::GangSnapshot;
use crate::control::gang::victims::{preemptions_shown, running_units};
use crate::model::namespaces::NoNamespaces;

const NOW: i64 = 1_795_300_000; // 2026-11-20T21:06Z

const TEAM: &str =
    "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: ml}\nspec:\n  namespaces: {names: [ml]}\n";

/// A running member of gang `gang` on `node`, released at 10:00 (created at 09:00).
fn running_member(name: &str, gang: &str, node: &str, priority: i32) -> Value {
    let extra = json!({
        "metadata": {"annotations": {"allot.dev/gang-released": "2026-11-20T10:00:00Z"}},
        "spec": {"nodeName": node, "schedulingGates": null, "priority": priority},
        "status": {"phase": "Running"}
    });
    member(name, gang, 2, "2026-11-20T09:00:00Z", extra)
}

fn plain_on(name: &str, node: &str, priority: i32) -> Value {
    let mut pod = team_pod(name, 1, false, "2026-11-20T09:30:00Z");
    pod["spec"]["nodeName"] = json!(node);
    pod["spec"]["priority"] = json!(priority);
    pod
}

fn seconds(rfc3339: &str) -> i64 {
    rfc3339.parse::<k8s_openapi::jiff::Timestamp>().unwrap().as_second()
}

#[test]
fn running_work_is_read_as_plain_pods_and_whole_gangs_below_the_preemptor() {
    let p = policies(TEAM);
    let pods = [
        running_member("g-0", "g", "n1", 10),
        running_member("g-1", "g", "n2", 20),
        plain_on("solo", "n1", 5),
        plain_on("important", "n2", 900),
    ];
    let state = cluster(&p, &pods);
    let mut units = running_units(&state.view(), &p, &NoNamespaces, 100, &|_| true, NOW);
    units.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<String> = units.iter().map(|u| u.key.to_string()).collect();
    assert_eq!(keys, ["pod ml/solo", "gang ml/g"]);
    let gang = &units[1];
    assert_eq!(gang.pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["g-0", "g-1"]);
    // A gang's priority is its highest member's; it started when it was released.
    assert_eq!((gang.priority, gang.started), (20, seconds("2026-11-20T10:00:00Z")));
    assert_eq!(gang.team.as_deref(), Some("ml"));
    assert_eq!(units[0].started, seconds("2026-11-20T09:30:00Z"));
}

#[test]
fn a_gang_starting_or_going_is_no_victim_and_min_runtime_protects_the_new() {
    let p = policies(&format!("{TEAM}  preemption: {{minRuntime: 1h}}\n"));
    let mut starting = running_member("s-1", "s", "n2", 0);
    starting["spec"]["nodeName"] = Value::Null;
    let mut going = running_member("d-1", "d", "n2", 0);
    going["metadata"]["deletionTimestamp"] = json!("2026-11-20T11:00:00Z");
    going["status"]["conditions"] =
        json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]);
    // Its owner deleting a member (a finalizer may keep it terminating) protects the rest.
    let mut deleted = running_member("x-1", "x", "n2", 0);
    deleted["metadata"]["deletionTimestamp"] = json!("2026-11-20T11:00:00Z");
    let pods = [
        running_member("s-0", "s", "n1", 0),
        starting,
        running_member("d-0", "d", "n1", 0),
        going,
        running_member("ok-0", "ok", "n1", 0),
        running_member("ok-1", "ok", "n2", 0),
        running_member("x-0", "x", "n1", 0),
        deleted,
    ];
    let state = cluster(&p, &pods);
    let mut units = running_units(&state.view(), &p, &NoNamespaces, 100, &|_| true, NOW);
    units.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(units.iter().map(|u| u.key.to_string()).collect::<Vec<_>>(), ["gang ml/ok", "gang ml/x"]);
    assert_eq!(units[0].evictable_from, seconds("2026-11-20T10:00:00Z") + 3600);
    assert_eq!(units[1].pods.len(), 1, "the member still running");
}

#[test]
fn a_release_time_forged_into_the_future_does_not_protect_a_gang() {
    let p = policies(&format!("{TEAM}  preemption: {{minRuntime: 1h}}\n"));
    let mut forged = running_member("f-0", "f", "n1", 0);
    forged["metadata"]["annotations"]["allot.dev/gang-released"] = json!("2099-01-01T00:00:00Z");
    let state = cluster(&p, &[forged]);
    let units = running_units(&state.view(), &p, &NoNamespaces, 100, &|_| true, NOW);
    // Counted from its creation, which the API server set.
    assert_eq!(units[0].started, seconds("2026-11-20T09:00:00Z"));
}

#[test]
fn the_snapshot_gives_a_waiting_gang_its_teams_rights_and_preemption_policy_never_takes_them() {
    let p = policies(&format!("{TEAM}  preemption: {{otherTeams: Never}}\n"));
    let waiting = |name: &str, extra: Value| member(name, "w", 2, "2026-11-20T11:00:00Z", extra);
    let pods = [waiting("w-0", json!({})), waiting("w-1", json!({})), running_member("r-0", "r", "n1", 0)];
    let state = cluster(&p, &pods);
    let (s, _) = state.snapshot(&p, &NoNamespaces, NOW);
    let rights = s.gangs[0].preemptor.clone().unwrap();
    assert_eq!((rights.team.as_deref(), rights.within_team, rights.other_teams), (Some("ml"), true, false));
    let never = [waiting("w-0", json!({})), waiting("w-1", json!({"spec": {"preemptionPolicy": "Never"}}))];
    let (s, _) = cluster(&p, &never).snapshot(&p, &NoNamespaces, NOW);
    assert_eq!(s.gangs[0].preemptor, None);
    assert!(s.running.is_empty(), "nobody may evict: running work is not even read");
}

#[test]
fn victims_of_allots_preemption_still_terminating_keep_their_nodes_busy() {
    let p = policies(TEAM);
    let mut victim = plain_on("v", "n2", 0);
    victim["metadata"]["deletionTimestamp"] = json!("2026-11-20T11:00:00Z");
    victim["status"] = json!({"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": PREEMPTED_REASON}]});
    let state = cluster(&p, &[victim, plain_on("other", "n1", 0)]);
    let shown = preemptions_shown(&state.view());
    assert_eq!(shown.len(), 1);
    assert_eq!((shown[0].preemptor.as_ref(), shown[0].nodes.as_slice()), (None, ["n2".to_string()].as_slice()));
}

/// The issue's scenario through the snapshot: 2 nodes × 2 GPUs full of low-priority pods, a
/// high-priority gang of 2 × 1 GPU: exactly two victims, and the memory holds the room.
#[test]
fn from_pods_to_victims_to_release() {
    let p = policies(TEAM);
    let high = |name: &str| member(name, "high", 2, "2026-11-20T11:00:00Z", json!({"spec": {"priority": 1000}}));
    let mut pods = vec![high("high-0"), high("high-1")];
    for (i, node) in ["n1", "n1", "n2", "n2"].iter().enumerate() {
        pods.push(plain_on(&format!("low-{i}"), node, 100));
    }
    let state = cluster(&p, &pods);
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW);
    let mut memory = Memory::default();
    memory.apply(&mut s, &state.view());
    let d = decide(&s);
    let Verdict::Preempt { victims, placements, domain } = &d[0].verdict else { panic!("{:?}", d[0]) };
    assert_eq!(victims.len(), 2);
    let preemption = Preemption {
        preemptor: d[0].gang.clone(),
        team: Some("ml".into()),
        priority: 1000,
        first_member: Some("high-0".into()),
        victims: victims.clone(),
        placements: placements.clone(),
        domain: domain.clone(),
    };
    memory.carried_out(&preemption, NOW);
    // Next pass: the victims are still there (terminating or not): it waits, nothing more goes.
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW + 1);
    memory.apply(&mut s, &state.view());
    assert_eq!(decide(&s)[0].verdict, Verdict::Preempting);
    // They are gone: released where the search placed it.
    for v in victims.iter().flat_map(|v| v.pods.iter()) {
        state.remove_pod(&v.namespace, &v.name);
    }
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW + 2);
    memory.apply(&mut s, &state.view());
    assert!(matches!(decide(&s)[0].verdict, Verdict::Release { .. }), "{:?}", decide(&s)[0]);
    memory.released(&d[0].gang);
    assert!(memory.in_flight.is_empty());
}

// ---- the eviction sequence ----

/// Records every call; refuses the pods named in `refuse` (dry run or not, per `dry`).
#[derive(Default)]
struct Recording {
    calls: RefCell<Vec<String>>,
    refuse: Vec<(&'static str, bool)>,
}

impl Evictor for Recording {
    async fn evict(&self, _: &str, pod: &str, uid: Option<&str>, dry_run: bool) -> Result<(), EvictionError> {
        self.calls.borrow_mut().push(format!("{} {pod} {}", if dry_run { "dry" } else { "evict" }, uid.unwrap_or("-")));
        if self.refuse.iter().any(|(p, dry)| *p == pod && *dry == dry_run) {
            let message = "Cannot evict pod as it would violate the pod's disruption budget.".to_string();
            return Err(EvictionError::Refused { code: 429, message });
        }
        Ok(())
    }
    async fn tell_victim(&self, _: &str, pod: &str, _: Option<&str>, message: &str) {
        self.calls.borrow_mut().push(format!("tell {pod}: {message}"));
    }
    async fn tell_preemptor(&self, _: &str, pod: &str, reason: &str, message: &str) {
        self.calls.borrow_mut().push(format!("preemptor {pod} {reason}: {message}"));
    }
}

fn unit(key: UnitKey, pods: &[&str]) -> RunningUnit {
    RunningUnit {
        key,
        team: Some("ml".into()),
        priority: 100,
        started: 0,
        evictable_from: 0,
        pods: pods
            .iter()
            .map(|name| RunningPod {
                namespace: "ml".into(),
                name: name.to_string(),
                uid: Some(format!("u-{name}").into()),
                node: "n1".into(),
                requests: Default::default(),
            })
            .collect(),
    }
}

fn preemption() -> Preemption {
    let gang = GangKey { namespace: "ml".into(), name: "old".into() };
    Preemption {
        preemptor: GangKey { namespace: "ml".into(), name: "high".into() },
        team: Some("ml".into()),
        priority: 1000,
        first_member: Some("high-0".into()),
        victims: vec![
            unit(UnitKey::Pod { namespace: "ml".into(), name: "solo".into() }, &["solo"]),
            unit(UnitKey::Gang(gang), &["old-0", "old-1"]),
        ],
        placements: vec![("high-0".into(), "n1".into()), ("high-1".into(), "n1".into())],
        domain: None,
    }
}

fn run(api: &Recording, memory: &mut Memory) -> Outcome {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(evict(&preemption(), api, memory, 100))
}

#[test]
fn every_victim_is_asked_first_then_evicted_then_told() {
    let api = Recording::default();
    let mut memory = Memory::default();
    assert_eq!(run(&api, &mut memory), Outcome::Evicted { pods: 3 });
    let calls = api.calls.borrow();
    assert_eq!(
        calls[..6],
        [
            "dry solo u-solo",
            "dry old-0 u-old-0",
            "dry old-1 u-old-1",
            "evict solo u-solo",
            "evict old-0 u-old-0",
            "evict old-1 u-old-1"
        ]
    );
    assert_eq!(
        calls[7],
        "tell old-0: preempted by gang ml/high (team ml, priority 1000) to make room for its 2 pods: gang ml/old is \
         evicted whole (priority 100, lower)"
    );
    assert!(memory.in_flight.contains_key(&GangKey { namespace: "ml".into(), name: "high".into() }));
    // Both units are spared for the back-off.
    assert_eq!(memory.spared.len(), 2);
    assert!(memory.spared.values().all(|until| *until == 100 + BACKOFF_SECS));
}

#[test]
fn a_budget_refusing_in_the_dry_run_evicts_nothing_and_says_so() {
    let api = Recording { refuse: vec![("old-1", true)], ..Default::default() };
    let mut memory = Memory::default();
    let outcome = run(&api, &mut memory);
    assert!(matches!(&outcome, Outcome::Refused { pod, evicted: 0, .. } if pod == "old-1"), "{outcome:?}");
    if let Outcome::Refused { why, .. } = &outcome {
        assert_eq!(why.metric_label(), "disruption_budget");
    }
    let calls = api.calls.borrow();
    assert!(calls.iter().all(|c| !c.starts_with("evict") && !c.starts_with("tell")), "{calls:?}");
    let told = calls.last().unwrap();
    assert!(told.starts_with("preemptor high-0 PreemptionRefused: evicting pod ml/old-1 of gang ml/old"));
    assert!(
        told.contains("was refused (429 Cannot evict pod as it would violate the pod's disruption budget.)"),
        "{told}"
    );
    // Nothing in flight; the refused unit alone is spared, for the retry time.
    assert!(memory.in_flight.is_empty());
    let gang = UnitKey::Gang(GangKey { namespace: "ml".into(), name: "old".into() });
    assert_eq!(memory.spared.get(&gang), Some(&(100 + REFUSAL_RETRY_SECS)));
    assert_eq!(memory.spared.len(), 1);
}

#[test]
fn a_refusal_after_the_dry_run_keeps_what_was_evicted_in_flight() {
    let api = Recording { refuse: vec![("old-0", false)], ..Default::default() };
    let mut memory = Memory::default();
    let outcome = run(&api, &mut memory);
    assert!(matches!(&outcome, Outcome::Refused { evicted: 1, .. }), "{outcome:?}");
    assert!(memory.in_flight.contains_key(&GangKey { namespace: "ml".into(), name: "high".into() }));
}

#[test]
fn what_the_pods_show_in_flight_counts_only_early_in_a_leadership() {
    let p = policies(TEAM);
    let mut victim = plain_on("v", "n2", 0);
    victim["metadata"]["deletionTimestamp"] = json!("2026-11-20T11:00:00Z");
    victim["status"] = json!({"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": PREEMPTED_REASON}]});
    let state = cluster(&p, &[victim]);
    let mut memory = Memory::default();
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW);
    memory.apply(&mut s, &state.view());
    assert_eq!(s.preemptions.len(), 1, "a new leader keeps the previous leader's victims' nodes busy");
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW + IN_FLIGHT_MAX_SECS);
    memory.apply(&mut s, &state.view());
    assert!(s.preemptions.is_empty(), "a condition on a pod this leader never evicted holds nothing for ever");
    memory.clear();
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, NOW + IN_FLIGHT_MAX_SECS + 1);
    memory.apply(&mut s, &state.view());
    assert_eq!(s.preemptions.len(), 1, "a leadership begins again");
}

#[test]
fn the_memory_forgets_gangs_that_no_longer_wait_and_preemptions_past_their_time() {
    let p = policies(TEAM);
    let state = cluster(&p, &[]);
    let mut memory = Memory::default();
    memory.carried_out(&preemption(), 100);
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, 200);
    memory.apply(&mut s, &state.view());
    assert!(memory.in_flight.is_empty(), "its gang no longer waits");
    assert_eq!(memory.spared.len(), 2, "spared until the back-off ends");
    let (mut s, _) = state.snapshot(&p, &NoNamespaces, 100 + BACKOFF_SECS);
    memory.apply(&mut s, &state.view());
    assert!(memory.spared.is_empty());
}
