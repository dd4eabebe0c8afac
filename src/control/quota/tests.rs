//! Deny-mode quota through gangs, on the real [`LiveQuota`] over the real cluster store.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::admission::directory::GangDirectory;
use crate::admission::quota::{NoUsage, QuotaBook, QuotaRequest, StaticUsage};
use crate::control::cluster::fixtures::dra_policies;
use crate::control::cluster::{ClusterState, PodRecord};
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::quota::Quota;
use crate::model::policy::{PolicySet, Source, compile};

fn policies(limit: u32) -> PolicySet {
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: {limit}}}}}\n"
    );
    compile(&[Source { name: "teams.yaml".into(), text }]).unwrap()
}

fn quota_of(p: &PolicySet) -> Quota {
    p.teams.iter().find_map(|t| t.quota.clone()).unwrap()
}

/// A pod of team vision asking `gpus`, in gang `(name, declared)` if any.
fn pod(name: &str, gpus: u32, gang: Option<(&str, u32)>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision", "creationTimestamp": "2026-11-22T01:00:00Z"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Pending"}
    });
    if let Some((g, n)) = gang {
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": g});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": n.to_string()});
    }
    pod
}

fn record(pod: &Value, p: &PolicySet) -> PodRecord {
    let pod: Pod = serde_json::from_value(pod.clone()).unwrap();
    PodRecord::from_pod(&pod, p, &NoNamespaces).unwrap()
}

/// What the validating webhook does for one pod (`validate::check_quota`): CPU-only pods reach
/// the book only as gang members.
fn admit(book: &dyn QuotaBook, quota: &Quota, pod: &Value, uid: &str) -> Result<(), String> {
    let requests = crate::model::resources::pod_requests(&pod["spec"]);
    let charge = quota.charge(&requests);
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let gang_name = pod.pointer("/metadata/labels/allot.dev~1gang-name").and_then(Value::as_str);
    let size = pod.pointer("/metadata/annotations/allot.dev~1gang-size").and_then(Value::as_str);
    let gang = gang_name.zip(size.and_then(|s| s.parse().ok()));
    if charge.is_empty() && gang.is_none() {
        return Ok(());
    }
    let request = QuotaRequest {
        uid,
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: "",
        created: 0,
        charge,
        requests,
        gang,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: None,
    };
    book.admit(quota, &request).map_err(|r| r.message("vision"))
}

fn live(p: &PolicySet) -> (Arc<ClusterState>, LiveQuota) {
    let state = Arc::new(ClusterState::default());
    let limit = quota_of(p).limits["nvidia.com/gpu"] / 1_000_000_000 / quota_of(p).denominator;
    let policies = Arc::new(ArcSwap::from_pointee(policies(limit as u32)));
    let book = LiveQuota::new(state.clone(), policies, Arc::new(NoNamespaces));
    (state, book)
}

fn gpus_used(state: &ClusterState) -> i128 {
    state.usage_where(&mut |ns| ns == "vision").0.get("nvidia.com/gpu").map_or(0, |q| q.nanos() / 1_000_000_000)
}

/// The measurement: 8 one-GPU members of a gang declared 2, quota 4. Today all 8 were
/// admitted (later members were free); now the third is refused with the numbers.
#[test]
fn members_beyond_the_declared_size_are_refused() {
    let p = policies(4);
    let quota = quota_of(&p);
    let (_, book) = live(&p);
    for i in 0..2 {
        admit(&book, &quota, &pod(&format!("w-{i}"), 1, Some(("g", 2))), &format!("u{i}")).unwrap();
    }
    let denied = admit(&book, &quota, &pod("w-2", 1, Some(("g", 2))), "u2").unwrap_err();
    assert!(denied.starts_with("gang g declares 2 members; 2 exist already"), "{denied}");
    // Every member was charged: 2 of 4 used, so a 3-GPU pod does not fit.
    let denied = admit(&book, &quota, &pod("big", 3, None), "u3").unwrap_err();
    assert!(denied.contains("team vision uses 2 of 4 nvidia.com/gpu"), "{denied}");
}

/// A first member with 1 GPU and a second with 8: the gang is charged 9, not 2 × 1.
#[test]
fn every_member_is_charged_in_full() {
    let p = policies(16);
    let quota = quota_of(&p);
    let (state, book) = live(&p);
    let first = pod("w-0", 1, Some(("g", 2)));
    let second = pod("w-1", 8, Some(("g", 2)));
    admit(&book, &quota, &first, "u0").unwrap();
    admit(&book, &quota, &second, "u1").unwrap();
    let denied = admit(&book, &quota, &pod("p", 8, None), "u2").unwrap_err();
    assert!(denied.contains("team vision uses 9 of 16 nvidia.com/gpu"), "{denied}");
    // The watch counts the same once the pods show up.
    state.upsert_pod(record(&first, &p));
    assert_eq!(gpus_used(&state), 2, "one member of 2 seen: 1 + a placeholder of 1");
    state.upsert_pod(record(&second, &p));
    assert_eq!(gpus_used(&state), 9);
    let denied = admit(&book, &quota, &pod("p", 8, None), "u3").unwrap_err();
    assert!(denied.contains("team vision uses 9 of 16 nvidia.com/gpu"), "{denied}");
    // With a quota of 4, the 8-GPU member does not fit the gang's charge.
    let p = policies(4);
    let quota = quota_of(&p);
    let (_, book) = live(&p);
    admit(&book, &quota, &first, "u0").unwrap();
    let denied = admit(&book, &quota, &second, "u1").unwrap_err();
    assert!(denied.contains("team vision uses 2 of 4 nvidia.com/gpu"), "{denied}");
    assert!(denied.contains("gang g of 2 asks 9 in all, 7 more with this member"), "{denied}");
}

/// The first member of a gang is charged for the whole declared gang.
#[test]
fn a_gang_is_charged_whole_at_its_first_member() {
    let p = policies(8);
    let quota = quota_of(&p);
    let (_, book) = live(&p);
    let denied = admit(&book, &quota, &pod("w-0", 3, Some(("g", 3))), "u0").unwrap_err();
    assert!(denied.contains("uses 0 of 8 nvidia.com/gpu in namespaces vision; gang g of 3 asks 9 in all"), "{denied}");
    let denied = admit(&NoUsage, &quota, &pod("w-0", 3, Some(("g", 3))), "u0").unwrap_err();
    assert!(denied.contains("gang g of 3 asks 9 in all"), "{denied}");
}

/// A terminating pod holds its devices until it is gone: it still counts for deny mode.
/// A member of native PodGroup `group` asking `gpus` (no Allot gang metadata).
fn native_member(name: &str, gpus: u32, group: &str) -> Value {
    let mut member = pod(name, gpus, None);
    member["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    member
}

/// What admission charges a native member: its group, sized from the PodGroup, as the engine
/// asks (`membership::native_group`).
fn admit_native(
    book: &dyn QuotaBook,
    quota: &Quota,
    member: &Value,
    objects: &crate::model::dra::ClaimObjects,
) -> Result<(), String> {
    let requests = crate::model::resources::pod_requests(&member["spec"]);
    let group = member.pointer("/spec/schedulingGroup/podGroupName").and_then(Value::as_str);
    let membership = crate::model::gang::membership::native_group(group, "vision", objects).expect("a native group");
    let name = member["metadata"]["name"].as_str().unwrap_or("");
    let request = QuotaRequest {
        uid: name,
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: "",
        created: 0,
        charge: quota.charge(&requests),
        requests,
        gang: membership.size.map(|n| (membership.name.as_str(), n)),
        shared_claims: Default::default(),
        dry_run: false,
        cohort: None,
    };
    book.admit(quota, &request).map_err(|r| r.message("vision"))
}

/// Issue 15: a native PodGroup's team is charged for its `minCount` from the first member on,
/// by admission and by the watch's records alike (the store's tally of `PodGroup/NAME`); the
/// members fill the group's places (charged once); `minCount` is a minimum, so a member beyond
/// it is charged in full, never refused as one too many.
#[test]
fn a_native_pod_group_is_charged_whole_and_min_count_is_no_maximum() {
    let p = policies(5);
    let quota = quota_of(&p);
    let (state, book) = live(&p);
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    let group = json!({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                       "metadata": {"name": "ddp", "namespace": "vision"},
                       "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}});
    assert!(objects.insert(&group, "vision"));
    let watched = |member: &Value| watched_with(member, &p, &objects);

    let first = native_member("ddp-0", 1, "ddp");
    admit_native(&book, &quota, &first, &objects).unwrap();
    let denied = admit(&book, &quota, &pod("solo", 2, None), "solo").unwrap_err();
    assert!(denied.contains("team vision uses 4 of 5 nvidia.com/gpu"), "{denied}");
    // The watch sees it: the store's record charges the group too (not 1 GPU).
    let record = watched(&first);
    let gang = record.gang.as_deref().expect("the record's quota group");
    assert_eq!((gang.name.as_str(), gang.size, gang.native), ("PodGroup/ddp", Some(4), true));
    state.upsert_pod(record);
    assert_eq!(gpus_used(&state), 4);

    for i in 1..4 {
        let member = native_member(&format!("ddp-{i}"), 1, "ddp");
        admit_native(&book, &quota, &member, &objects).unwrap();
        state.upsert_pod(watched(&member));
    }
    assert_eq!(gpus_used(&state), 4, "charged once, not once per member");
    admit_native(&book, &quota, &native_member("ddp-4", 1, "ddp"), &objects).unwrap();
    let over = admit_native(&book, &quota, &native_member("ddp-5", 1, "ddp"), &objects).unwrap_err();
    assert!(over.contains("team vision uses 5 of 5") && !over.contains("declares"), "{over}");

    // Unknown to the source (not created yet), a member is charged alone; a `basic` group is no
    // group at all.
    let none = crate::model::dra::ClaimObjects::new("not found");
    let alone = watched_with(&native_member("other-0", 1, "other"), &p, &none);
    assert_eq!(alone.gang.as_deref().map(|g| (g.name.as_str(), g.size)), Some(("PodGroup/other", None)));
    let mut basic = crate::model::dra::ClaimObjects::new("not found");
    let spec = json!({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                      "metadata": {"name": "b", "namespace": "vision"}, "spec": {"schedulingPolicy": {"basic": {}}}});
    assert!(basic.insert(&spec, "vision"));
    assert_eq!(watched_with(&native_member("b-0", 1, "b"), &p, &basic).gang, None);
}

/// The watch's record of `member`, its claims and PodGroup looked up in `objects`.
fn watched_with(member: &Value, p: &PolicySet, objects: &dyn crate::model::dra::ClaimSource) -> PodRecord {
    let pod: Pod = serde_json::from_value(member.clone()).unwrap();
    PodRecord::from_pod_with_claims(&pod, p, &NoNamespaces, objects).unwrap()
}

#[test]
fn a_terminating_pod_counts_until_it_is_gone() {
    let p = policies(4);
    let quota = quota_of(&p);
    let (state, book) = live(&p);
    let mut leaving = pod("leaving", 4, None);
    leaving["spec"]["nodeName"] = json!("n1");
    leaving["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
    state.upsert_pod(record(&leaving, &p));
    let denied = admit(&book, &quota, &pod("next", 1, None), "u0").unwrap_err();
    assert!(denied.contains("team vision uses 4 of 4"), "{denied}");
    state.remove_pod("vision", "leaving");
    admit(&book, &quota, &pod("next", 1, None), "u1").unwrap();
}

/// A reservation whose pod came and went before the next admission is dropped, not kept
/// until it expires.
#[test]
fn a_pod_that_came_and_went_releases_its_reservation() {
    let p = policies(4);
    let quota = quota_of(&p);
    let (state, book) = live(&p);
    let short = pod("short", 4, None);
    admit(&book, &quota, &short, "u0").unwrap();
    state.upsert_pod(record(&short, &p));
    state.remove_pod("vision", "short");
    admit(&book, &quota, &pod("next", 4, None), "u1").unwrap();
}

/// One step of a tenant's interleaving.
#[derive(Debug, Clone)]
enum Step {
    /// Create a pod asking `gpus`, in gang `gang` (index into the case's gangs) if any.
    Create { gpus: u32, gang: Option<usize> },
    /// The watch delivers the current state of the n-th pod the API server holds.
    Deliver(usize),
    /// The n-th pod gets its deletionTimestamp.
    Terminate(usize),
    /// The n-th pod is gone from the API server; the watch hears of it now or later.
    Gone { pod: usize, delivered: bool },
    /// The watch delivers the n-th deletion it has not delivered yet.
    DeliverGone(usize),
}

fn arb_step(gangs: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0u32..4, prop::option::of(0..gangs)).prop_map(|(gpus, gang)| Step::Create { gpus, gang }),
        3 => any::<usize>().prop_map(Step::Deliver),
        1 => any::<usize>().prop_map(Step::Terminate),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(pod, delivered)| Step::Gone { pod, delivered }),
        1 => any::<usize>().prop_map(Step::DeliverGone),
    ]
}

fn arb_case() -> impl Strategy<Value = (u32, Vec<u32>, Vec<Step>)> {
    (1u32..8, prop::collection::vec(1u32..5, 1..4)).prop_flat_map(|(limit, sizes)| {
        let steps = prop::collection::vec(arb_step(sizes.len()), 1..60);
        (Just(limit), Just(sizes), steps)
    })
}

/// The team's usage as a watch that has seen everything would count it: the same store,
/// filled with every pod the API server holds.
fn eventual_usage(api: &BTreeMap<String, Value>, p: &PolicySet) -> i128 {
    let state = ClusterState::default();
    state.replace_pods(api.values().map(|pod| record(pod, p)).collect());
    gpus_used(&state)
}

/// GPUs the team's pods hold or will hold: every pod that exists (terminating ones too).
fn held(api: &BTreeMap<String, Value>) -> i128 {
    api.values()
        .map(|pod| {
            crate::model::resources::pod_requests(&pod["spec"])
                .get("nvidia.com/gpu")
                .map_or(0, |q| q.nanos() / 1_000_000_000)
        })
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Over any interleaving of creates (plain pods and gang members of various sizes and
    /// requests), terminations, deletions and watch deliveries, driven through the real
    /// LiveQuota over the real store:
    /// - what the team's pods request (terminating ones included), as the watch will count
    ///   them once it has seen everything, never exceeds the deny limit, after any step;
    /// - no create the book admits takes the team's charge as the watch will eventually count
    ///   it (gang placeholders included) past the limit, or raises it while it is past the
    ///   limit, whenever the watch has delivered every deletion. (A deleted member of an incomplete gang is replaced by a
    ///   placeholder of the gang's largest request, so a deletion may raise the charge of the
    ///   placeholders — never what pods request — and while the watch still shows the deleted
    ///   member the book counts that gang's placeholders at the old, lower value; further
    ///   admissions of the team then wait for the gang's replacement member or its end.)
    /// - once the watch has delivered everything, the book and the watch agree.
    #[test]
    fn a_team_never_exceeds_its_deny_limit((limit, sizes, steps) in arb_case()) {
        let p = policies(limit);
        let quota = quota_of(&p);
        let (state, book) = live(&p);
        let mut api: BTreeMap<String, Value> = BTreeMap::new();
        let mut gone_undelivered: Vec<String> = Vec::new();
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::Create { gpus, gang } => {
                    let gang = gang.map(|g| (format!("g{g}"), sizes[g]));
                    let name = format!("p{n}");
                    let new = pod(&name, gpus, gang.as_ref().map(|(g, s)| (g.as_str(), *s)));
                    let before = eventual_usage(&api, &p);
                    if admit(&book, &quota, &new, &format!("uid-{n}")).is_ok() {
                        api.insert(name, new);
                        // CPU-only plain pods never reach the book: they take no GPU.
                        if (gpus > 0 || gang.is_some()) && gone_undelivered.is_empty() {
                            let eventual = eventual_usage(&api, &p);
                            prop_assert!(
                                eventual <= i128::from(limit).max(before),
                                "admitting p{n} took the charge from {before} to {eventual}, limit {limit}"
                            );
                        }
                    }
                }
                Step::Deliver(i) => {
                    if let Some(pod) = api.values().nth(i % api.len().max(1)) {
                        state.upsert_pod(record(pod, &p));
                    }
                }
                Step::Terminate(i) => {
                    let len = api.len().max(1);
                    if let Some(pod) = api.values_mut().nth(i % len) {
                        pod["metadata"]["deletionTimestamp"] = json!("2026-11-22T01:05:00Z");
                    }
                }
                Step::Gone { pod, delivered } => {
                    if let Some(name) = api.keys().nth(pod % api.len().max(1)).cloned() {
                        api.remove(&name);
                        if delivered {
                            state.remove_pod("vision", &name);
                        } else {
                            gone_undelivered.push(name);
                        }
                    }
                }
                Step::DeliverGone(i) => {
                    if !gone_undelivered.is_empty() {
                        let name = gone_undelivered.remove(i % gone_undelivered.len());
                        state.remove_pod("vision", &name);
                    }
                }
            }
            let held = held(&api);
            prop_assert!(held <= i128::from(limit), "the team holds {held} GPUs, limit {limit}");
        }
        // Everything delivered: the book's view is the watch's.
        for name in gone_undelivered.drain(..) {
            state.remove_pod("vision", &name);
        }
        state.replace_pods(api.values().map(|pod| record(pod, &p)).collect());
        let watch = gpus_used(&state);
        prop_assert_eq!(watch, eventual_usage(&api, &p));
        let room = i128::from(limit) - watch;
        if room >= 0 {
            // Exactly the room left is admitted, one more GPU is not (dry run: nothing kept).
            let probe = |gpus: i128| {
                let requests = BTreeMap::from([("nvidia.com/gpu".to_string(), crate::model::quantity::Quantity::from_units(gpus as i64))]);
                let charge = quota.charge(&requests);
                let request = QuotaRequest { uid: "probe", team: "vision", namespace: "vision", pod: "probe", pod_uid: "", created: 0, charge, requests, gang: None, shared_claims: Default::default(), dry_run: true, cohort: None };
                book.admit(&quota, &request).is_ok()
            };
            prop_assert!(probe(room), "the book refuses the {room} GPUs the watch says are free");
            prop_assert!(!probe(room + 1), "the book admits more than the watch says is free");
        }
    }
}

/// The shared ResourceClaim `name` in vision asking `gpus` devices of `gpu.nvidia.com`.
fn shared_claim(objects: &mut crate::model::dra::ClaimObjects, name: &str, gpus: u32) {
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": name, "namespace": "vision"},
                       "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}}});
    assert!(objects.insert(&claim, "vision"));
}

/// A CPU-only pod of vision that names the shared claims `claims`.
fn sharer(name: &str, claims: &[&str]) -> Value {
    let mut p = pod(name, 0, None);
    p["spec"]["containers"][0]["resources"] = json!({});
    p["spec"]["resourceClaims"] =
        claims.iter().enumerate().map(|(i, c)| json!({"name": format!("c{i}"), "resourceClaimName": c})).collect();
    p
}

/// What `validate::check_quota` asks the book for `pod`, its claims resolved in `objects`.
fn admit_with_claims(
    book: &dyn QuotaBook,
    p: &PolicySet,
    pod: &Value,
    objects: &dyn crate::model::dra::ClaimSource,
    uid: &str,
) -> Result<(), String> {
    let quota = quota_of(p);
    let demand = crate::model::dra::pod_demand(pod, "vision", &p.device_classes, objects);
    let requests = crate::model::dra::quota_requests(&crate::model::resources::pod_requests(&pod["spec"]), &demand);
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let request = QuotaRequest {
        uid,
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: uid,
        created: 0,
        charge: quota.charge(&requests),
        requests,
        gang: None,
        shared_claims: demand.shared_quota_resources(),
        dry_run: false,
        cohort: None,
    };
    book.admit(&quota, &request).map_err(|r| r.message("vision"))
}

/// GPUs (charge units) the store counts for vision, claim devices included.
fn charged_gpus(state: &ClusterState, p: &PolicySet) -> i128 {
    let quota = quota_of(p);
    let used = quota.charge(&state.usage_where(&mut |ns| ns == "vision").0);
    used.get("nvidia.com/gpu").copied().unwrap_or(0) / quota.denominator / 1_000_000_000
}

/// Issue 15: a shared ResourceClaim is charged once per claim, not once per pod that names it —
/// at admission (reservations not yet in the watch included), in the watch's usage, and until
/// the last pod that names it is gone; a pod whose shared claim was deleted keeps it counted.
#[test]
fn a_shared_claim_is_charged_once_while_any_pod_names_it() {
    let p = dra_policies(4);
    let state = Arc::new(ClusterState::default());
    let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(dra_policies(4))), Arc::new(NoNamespaces));
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    shared_claim(&mut objects, "pair", 2);
    let watched = |pod: &Value, objects: &crate::model::dra::ClaimObjects| watched_with(pod, &p, objects);

    // Two sharers admitted before the watch sees either: the claim's 2 GPUs count once.
    admit_with_claims(&book, &p, &sharer("a", &["pair"]), &objects, "ua").unwrap();
    admit_with_claims(&book, &p, &sharer("b", &["pair", "pair"]), &objects, "ub").unwrap();
    admit(&book, &quota_of(&p), &pod("plain", 2, None), "uplain").unwrap();
    let over = admit(&book, &quota_of(&p), &pod("over", 1, None), "uover").unwrap_err();
    assert!(over.contains("team vision uses 4 of 4 nvidia.com/gpu"), "{over}");

    // The watch counts the same: 2 (claim, once) + 2 (plain).
    let record = watched(&sharer("a", &["pair"]), &objects);
    assert_eq!(record.requests.iter().filter(|(r, _)| r.starts_with("deviceclass")).count(), 0, "not in requests");
    assert_eq!(record.held_claims().len(), 1);
    state.upsert_pod(record);
    state.upsert_pod(watched(&sharer("b", &["pair", "pair"]), &objects));
    state.upsert_pod(watched(&pod("plain", 2, None), &objects));
    assert_eq!(charged_gpus(&state, &p), 4);
    assert_eq!(state.pods_naming_claim("vision", "pair"), ["a", "b"]);

    // A third sharer is admitted (the claim is counted already); a new claim of 1 is not.
    admit_with_claims(&book, &p, &sharer("c", &["pair"]), &objects, "uc").unwrap();
    shared_claim(&mut objects, "single", 1);
    let denied = admit_with_claims(&book, &p, &sharer("d", &["single"]), &objects, "ud").unwrap_err();
    assert!(denied.contains("uses 4 of 4") && denied.contains("this pod asks 1"), "{denied}");

    // The claim is deleted (a tenant freeing quota that way): the sharer still counts it.
    let gone = crate::model::dra::ClaimObjects::new("not found");
    state.upsert_pod(watched(&sharer("a", &["pair"]), &gone));
    assert_eq!(charged_gpus(&state, &p), 4, "a deleted shared claim still counts while pods name it");

    // One sharer goes: nothing is freed; the last goes: its 2 GPUs, once.
    state.remove_pod("vision", "a");
    assert_eq!(charged_gpus(&state, &p), 4);
    state.remove_pod("vision", "b");
    assert_eq!(charged_gpus(&state, &p), 2);
    assert!(state.pods_naming_claim("vision", "pair").is_empty());
}

/// `allot check`'s book: two manifests sharing a claim take its devices once.
#[test]
fn the_dry_run_charges_a_shared_claim_once() {
    let p = dra_policies(2);
    let mut objects = crate::model::dra::ClaimObjects::new("not among the manifests");
    shared_claim(&mut objects, "pair", 2);
    let book = StaticUsage::default();
    admit_with_claims(&book, &p, &sharer("a", &["pair"]), &objects, "a").unwrap();
    admit_with_claims(&book, &p, &sharer("b", &["pair"]), &objects, "b").unwrap();
    let over = admit(&book, &quota_of(&p), &pod("c", 1, None), "c").unwrap_err();
    assert!(over.contains("uses 2 of 2"), "{over}");
    // Without usage, a pod naming a claim larger than the quota is refused on its own.
    shared_claim(&mut objects, "big", 3);
    let big = admit_with_claims(&NoUsage, &p, &sharer("big", &["big"]), &objects, "big").unwrap_err();
    assert!(big.contains("this pod asks 3"), "{big}");
}

/// A tenant's ResourceClaim carrying the scheduler's extended-resource annotation, named by her
/// pod: charged like any shared claim, at admission and in the watch's records (before: skipped
/// for the annotation alone, 8 GPUs held and none counted).
#[test]
fn a_claim_with_a_forged_extended_resource_annotation_is_charged() {
    let p = dra_policies(4);
    let state = Arc::new(ClusterState::default());
    let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(dra_policies(4))), Arc::new(NoNamespaces));
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    let forged = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": "free", "namespace": "vision", "uid": "u-free",
                                     "annotations": {crate::model::dra::EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}},
                        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}]}}});
    assert!(objects.insert(&forged, "vision"));
    let denied = admit_with_claims(&book, &p, &sharer("a", &["free"]), &objects, "ua").unwrap_err();
    assert!(denied.contains("this pod asks 8"), "{denied}");
    // A pod admitted before (another replica, the webhook bypassed) is counted by the watch.
    state.upsert_pod(watched_with(&sharer("a", &["free"]), &p, &objects));
    assert_eq!(charged_gpus(&state, &p), 8);
    let over = admit(&book, &quota_of(&p), &pod("next", 1, None), "unext").unwrap_err();
    assert!(over.contains("team vision uses 8 of 4"), "{over}");
}

/// A tenant deletes a shared claim no pod has reserved yet and creates a larger one under the
/// same name: the new claim is another claim (its UID), charged in full, never "counted already"
/// at the old size; once the first pod's record reads the new claim too, it is counted once.
#[test]
fn a_shared_claim_recreated_larger_is_a_new_claim() {
    let p = dra_policies(4);
    let state = Arc::new(ClusterState::default());
    let book = LiveQuota::new(state.clone(), Arc::new(ArcSwap::from_pointee(dra_policies(4))), Arc::new(NoNamespaces));
    let claim = |uid: &str, gpus: u32| {
        let mut objects = crate::model::dra::ClaimObjects::new("not found");
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": {"name": "grow", "namespace": "vision", "uid": uid},
                           "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}}});
        assert!(objects.insert(&claim, "vision"));
        objects
    };
    let (small, large) = (claim("uid-1", 1), claim("uid-2", 4));
    admit_with_claims(&book, &p, &sharer("a", &["grow"]), &small, "ua").unwrap();
    state.upsert_pod(watched_with(&sharer("a", &["grow"]), &p, &small));
    let denied = admit_with_claims(&book, &p, &sharer("b", &["grow"]), &large, "ub").unwrap_err();
    assert!(denied.contains("uses 1 of 4") && denied.contains("this pod asks 4"), "{denied}");
    // Pod a's next event resolves the new claim: one claim of 4, counted once.
    state.upsert_pod(watched_with(&sharer("a", &["grow"]), &p, &large));
    assert_eq!(charged_gpus(&state, &p), 4);
}

/// What refuses a shared claim made again under a name live pods name
/// (`validate::check_claim_create`): the pods the cluster view knows name it, also after a
/// restart of Allot that never saw the earlier claim (the record names the missing claim,
/// counting nothing for it).
#[test]
fn the_pods_naming_a_shared_claim_are_known_also_after_a_restart() {
    let p = dra_policies(4);
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    shared_claim(&mut objects, "pair", 2);
    let state = ClusterState::default();
    state.upsert_pod(watched_with(&sharer("a", &["pair"]), &p, &objects));
    state.upsert_pod(watched_with(&pod("plain", 1, None), &p, &objects));
    assert_eq!(state.pods_naming_claim("vision", "pair"), ["a"]);
    assert!(state.pods_naming_claim("vision", "other").is_empty());
    assert!(state.pods_naming_claim("elsewhere", "pair").is_empty());

    // Allot restarts after the claim was deleted: the pod still names it (no devices counted:
    // it cannot run without its claim), and the name stays taken.
    let gone = crate::model::dra::ClaimObjects::new("not found");
    let restarted = ClusterState::default();
    restarted.upsert_pod(watched_with(&sharer("a", &["pair"]), &p, &gone));
    assert_eq!(restarted.pods_naming_claim("vision", "pair"), ["a"]);
    assert_eq!(charged_gpus(&restarted, &p), 0);
    // Once the pod goes, the name is free again.
    restarted.remove_pod("vision", "a");
    assert!(restarted.pods_naming_claim("vision", "pair").is_empty());
}

/// The index a ResourceClaim CREATE reads (instead of walking every pod of the cluster, which
/// any user's dry-run claim create made the request path do) follows pods as they come, finish
/// and go.
#[test]
fn the_pods_naming_a_claim_are_indexed_as_they_come_finish_and_go() {
    let p = dra_policies(8);
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    shared_claim(&mut objects, "pair", 1);
    let state = ClusterState::default();
    for name in ["a", "b", "c"] {
        state.upsert_pod(watched_with(&sharer(name, &["pair"]), &p, &objects));
    }
    state.upsert_pod(watched_with(&sharer("a", &["pair"]), &p, &objects));
    assert_eq!(state.pods_naming_claim("vision", "pair"), ["a", "b", "c"]);
    let mut done = sharer("b", &["pair"]);
    done["status"] = serde_json::json!({"phase": "Succeeded"});
    state.upsert_pod(watched_with(&done, &p, &objects));
    assert_eq!(state.pods_naming_claim("vision", "pair"), ["a", "c"], "a finished pod holds nothing");
    state.remove_pod("vision", "c");
    assert_eq!(state.pods_naming_claim("vision", "pair"), ["a"]);
    state.remove_pod("vision", "a");
    assert!(state.pods_naming_claim("vision", "pair").is_empty());
}

/// The leader's recount counts each deny-mode team's pods as admission charges them: pods asking
/// what the quota counts, and gang members whatever they ask; not CPU-only pods, not pods of
/// namespaces outside the team. Without a deny-mode team it counts nothing.
#[test]
fn the_recount_counts_what_admission_charges() {
    let p = policies(8);
    let state = ClusterState::default();
    let mut other = pod("elsewhere", 2, None);
    other["metadata"]["namespace"] = json!("unowned");
    let mut cpu_only = pod("cpu-only", 0, None);
    cpu_only["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "2"}});
    let mut finished = pod("done", 1, None);
    finished["status"]["phase"] = json!("Succeeded");
    let pods = [pod("gpu", 2, None), pod("member", 0, Some(("g", 2))), cpu_only, finished, other];
    state.replace_pods(pods.iter().map(|pod| record(pod, &p)).collect());
    let teams = super::shared::recount_by_team(&state.view(), &p, &NoNamespaces);
    assert_eq!(teams.keys().collect::<Vec<_>>(), ["vision"]);
    let vision = &teams["vision"];
    assert_eq!(vision.pods(), 3, "the GPU pod, the gang member and the finished pod");
    assert!(vision.find("vision", "gpu").is_some_and(|s| !s.finished));
    assert!(vision.find("vision", "member").is_some());
    assert!(vision.find("vision", "done").is_some_and(|s| s.finished));
    assert!(vision.find("vision", "cpu-only").is_none(), "asks nothing the quota counts");
    assert!(vision.find("unowned", "elsewhere").is_none(), "not the team's namespace");

    let queue = compile(&[Source {
        name: "q.yaml".into(),
        text: "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\nspec:\n  namespaces: {names: [vision]}\n  \
               quota: {mode: Queue, limits: {nvidia.com/gpu: 8}}\n"
            .into(),
    }])
    .unwrap();
    assert!(super::shared::recount_by_team(&state.view(), &queue, &NoNamespaces).is_empty());
}
