//! The ledger's pure logic: charging, re-sent admissions, expiry, reconcile, a conflict's
//! re-decision, gangs, bounds and the stored form.

use super::wire::{folded_key, valid_key};
use super::*;
use crate::model::policy::{PolicySet, Source, compile};
use crate::model::quantity::Quantity;

fn policies(limit: u32) -> PolicySet {
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: {limit}}}}}\n"
    );
    compile(&[Source { name: "teams.yaml".into(), text }]).unwrap()
}

fn quota(limit: u32) -> Quota {
    policies(limit).teams.iter().find_map(|t| t.quota.clone()).unwrap()
}

fn gpus(n: i64) -> ResourceList {
    ResourceList::from([
        ("nvidia.com/gpu".to_string(), Quantity::from_units(n)),
        ("cpu".to_string(), Quantity::from_units(2)),
    ])
}

/// An admission of pod `name` (UID `uid-NAME`) asking `n` GPUs, in gang `(name, size)` if any.
fn request<'a>(q: &Quota, name: &'a str, uid: &'a str, n: i64, gang: Option<(&'a str, u32)>) -> QuotaRequest<'a> {
    QuotaRequest {
        uid: "review-uid",
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: uid,
        created: 1_000,
        charge: q.charge(&gpus(n)),
        requests: gpus(n),
        gang,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: None,
    }
}

fn reconciled() -> Ledger {
    Ledger { reconciled: true, claims_known: true, ..Ledger::default() }
}

fn charge(l: &mut Ledger, q: &Quota, name: &str, n: i64, gang: Option<(&str, u32)>) -> Result<Charged, Refusal> {
    let uid = format!("uid-{name}");
    let r = request(q, name, &uid, n, gang);
    l.charge(q, &r, &admission_key(&r), 1_000)
}

fn seen(name: &str, n: i64, gang: Option<(&str, u32)>) -> SeenPod {
    SeenPod {
        namespace: "vision".into(),
        name: name.into(),
        created: 1_000,
        finished: false,
        terminating: false,
        requests: counted(&quota(8), &gpus(n)),
        gang: gang.map(|(g, s)| (g.to_string(), Some(s))),
        claims: Default::default(),
    }
}

fn gpu_usage(l: &Ledger) -> i64 {
    l.usage().0.get("nvidia.com/gpu").map_or(0, |q| q.ceil_units())
}

#[test]
fn charges_up_to_the_limit_and_refuses_with_the_numbers() {
    let q = quota(3);
    let mut l = reconciled();
    assert_eq!(charge(&mut l, &q, "a", 2, None), Ok(Charged::New));
    assert_eq!(charge(&mut l, &q, "b", 1, None), Ok(Charged::New));
    let refusal = charge(&mut l, &q, "c", 1, None).unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 3 of 3 nvidia.com/gpu in namespaces vision; this pod asks 1"
    );
    assert_eq!(l.len(), 2, "a refused pod is not charged");
    // Only what the quota counts is kept (no cpu).
    let (_, entry) = l.entries().next().unwrap();
    assert_eq!(entry.requests.keys().collect::<Vec<_>>(), vec!["nvidia.com/gpu"]);
}

#[test]
fn a_resent_admission_is_not_charged_twice() {
    let q = quota(2);
    let mut l = reconciled();
    assert_eq!(charge(&mut l, &q, "a", 2, None), Ok(Charged::New));
    // The same pod (same UID) again: already charged, even though the team is full now.
    assert_eq!(charge(&mut l, &q, "a", 2, None), Ok(Charged::Already));
    assert_eq!(gpu_usage(&l), 2);
    // Without a pod UID the key is namespace/name + the review's uid: stable for a re-send.
    let r = request(&q, "b", "", 1, None);
    let key = admission_key(&r);
    assert!(key.starts_with("r.") && valid_key(&key), "{key}");
    assert_eq!(key, admission_key(&request(&q, "b", "", 1, None)));
    assert_ne!(key, admission_key(&request(&q, "c", "", 1, None)));
}

#[test]
fn dry_runs_and_unreconciled_or_unreadable_ledgers_charge_nothing() {
    let q = quota(2);
    let mut l = reconciled();
    let mut r = request(&q, "a", "uid-a", 1, None);
    r.dry_run = true;
    assert_eq!(l.charge(&q, &r, "u.uid-a", 1_000), Ok(Charged::WouldFit));
    assert!(l.is_empty());

    let mut fresh = Ledger::default();
    let refusal = charge(&mut fresh, &q, "a", 1, None).unwrap_err();
    assert!(refusal.message("vision").contains("has not been reconciled"), "{refusal:?}");

    let data = BTreeMap::from([("u.x".to_string(), "{not json".to_string())]);
    let mut broken = Ledger::from_data(&data, true);
    let refusal = charge(&mut broken, &q, "a", 1, None).unwrap_err();
    assert!(refusal.message("vision").contains("unreadable charge \"u.x\""), "{refusal:?}");
    // The reconciler drops it (and counts the pods it sees).
    let report = broken.reconcile(&[seen("a", 1, None)], 1_000);
    assert_eq!((report.dropped_unreadable, report.refolded), (1, true));
    assert_eq!(broken.to_data().keys().collect::<Vec<_>>(), vec!["n.vision"]);
    assert_eq!(broken.bytes(), broken.to_data().iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    assert_eq!(charge(&mut broken, &q, "b", 1, None), Ok(Charged::New));
}

#[test]
fn stored_form_round_trips() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "a", 2, None).unwrap();
    charge(&mut l, &q, "m0", 1, Some(("ddp", 4))).unwrap();
    let mut m1 = seen("m1", 1, Some(("ddp", 4)));
    m1.terminating = true;
    l.reconcile(&[seen("a", 2, None), seen("m2", 1, Some(("ddp", 4))), m1], 1_001);
    let data = l.to_data();
    // (Whether the leader knows shared claims is an annotation, not data.)
    let back = Ledger { claims_known: true, ..Ledger::from_data(&data, true) };
    assert_eq!(back, l);
    assert_eq!(back.bytes(), data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    let stored = &data["u.uid-m0"];
    assert_eq!(
        stored,
        r#"{"pod":"vision/m0","created":1000,"at":1000,"req":{"nvidia.com/gpu":"1"},"gang":"ddp","size":4}"#
    );
    // a is folded into the namespace's totals; m1 and m2 into gang ddp's members (shape 0, size
    // 4, 2 members of which 1 terminating); m0 is still pending.
    assert_eq!(data.len(), 2);
    assert_eq!(
        data["n.vision"],
        r#"{"ns":"vision","pods":3,"req":{"nvidia.com/gpu":"2"},"shapes":[{"nvidia.com/gpu":"1"}],"gangs":{"ddp":[[0,4,2,1]]}}"#
    );
    // a (2) + gang ddp of 4 x 1 (m0 pending, m1, m2 folded, one placeholder).
    assert_eq!(gpu_usage(&back), 2 + 4);
    // Stored totals that lie about themselves are unreadable, never trusted.
    for bad in [
        r#"{"ns":"vision","pods":1,"shapes":[],"gangs":{"g":[[0,4,1,0]]}}"#,
        r#"{"ns":"vision","pods":1,"shapes":[{"nvidia.com/gpu":"1"}],"gangs":{"g":[[0,4,1,2]]}}"#,
        r#"{"ns":"vision","pods":1,"shapes":[{"nvidia.com/gpu":"1"}],"gangs":{"g":[[0,4,4000000000,0]]}}"#,
        r#"{"ns":"vision","pods":1,"req":{"nvidia.com/gpu":"lots"}}"#,
    ] {
        let data = BTreeMap::from([("n.vision".to_string(), bad.to_string())]);
        let mut read = Ledger::from_data(&data, true);
        let refusal = charge(&mut read, &q, "z", 1, None).unwrap_err();
        assert!(refusal.message("vision").contains("unreadable charge \"n.vision\""), "{bad}: {refusal:?}");
    }
}

#[test]
fn a_gang_is_charged_whole_at_its_first_member_and_never_in_part() {
    let q = quota(10);
    let mut l = reconciled();
    // Gang of 4 x 1 GPU: the first member charges 4; the others fill placeholders.
    assert_eq!(charge(&mut l, &q, "a0", 1, Some(("a", 4))), Ok(Charged::New));
    assert_eq!(gpu_usage(&l), 4);
    for m in ["a1", "a2", "a3"] {
        assert_eq!(charge(&mut l, &q, m, 1, Some(("a", 4))), Ok(Charged::New));
    }
    assert_eq!(gpu_usage(&l), 4);
    // A fifth member is beyond the declared size.
    assert!(matches!(charge(&mut l, &q, "a4", 1, Some(("a", 4))), Err(Refusal::GangFull { .. })));
    // Gang b of 4: its first member charges 4 (8 of 10); gang c does not fit.
    charge(&mut l, &q, "b0", 1, Some(("b", 4))).unwrap();
    let refusal = charge(&mut l, &q, "c0", 1, Some(("c", 4))).unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 8 of 10 nvidia.com/gpu in namespaces vision; gang c of 4 asks 4 in all"
    );
    // Placeholders are the largest member: a 3-GPU member of b raises b to 1 + 3 x 3 = 10.
    let refusal = charge(&mut l, &q, "b1", 3, Some(("b", 4))).unwrap_err();
    assert!(refusal.message("vision").contains("uses 8 of 10"), "{refusal:?}");
}

#[test]
fn reconcile_confirms_releases_keeps_terminating_and_adds_the_uncharged() {
    let q = quota(8);
    let mut l = reconciled();
    for name in ["a", "b", "c", "d"] {
        charge(&mut l, &q, name, 1, None).unwrap();
    }
    // a runs, b finished, c is being deleted, d not seen yet; e was admitted while Allot was
    // down (no charge).
    let mut b = seen("b", 1, None);
    b.finished = true;
    let mut c = seen("c", 1, None);
    c.terminating = true;
    let pods = [seen("a", 1, None), b, c, seen("e", 2, None)];
    let report = l.reconcile(&pods, 1_010);
    assert_eq!((report.seen, report.released, report.expired, report.refolded), (2, 1, 0, true), "{report:?}");
    assert_eq!(gpu_usage(&l), 1 + 1 + 1 + 2, "a, c (terminating: still holds its GPU), d (pending), e");
    assert_eq!(l.entries().map(|(_, e)| e.name.as_str()).collect::<Vec<_>>(), vec!["d"], "only d is pending");
    assert_eq!(l.folded().map(|f| f.pods).collect::<Vec<_>>(), vec![3], "a, c and e are folded");
    // Nothing changed: nothing to write.
    assert!(!l.reconcile(&pods, 1_011).changed());
    // c is gone now, a deleted: the recount no longer has them; d still within its TTL.
    let report = l.reconcile(&[seen("e", 2, None)], 1_020);
    assert_eq!((report.refolded, report.expired), (true, 0), "{report:?}");
    assert_eq!(gpu_usage(&l), 1 + 2);
    // Released exactly once: the same view again changes nothing.
    assert!(!l.reconcile(&[seen("e", 2, None)], 1_021).changed());
    assert_eq!(gpu_usage(&l), 1 + 2);
    // d never appears: it expires after the TTL, and only then.
    assert!(!l.reconcile(&[seen("e", 2, None)], 1_000 + PENDING_TTL_SECS).changed());
    let report = l.reconcile(&[seen("e", 2, None)], 1_001 + PENDING_TTL_SECS);
    assert_eq!(report.expired, 1);
    assert_eq!(gpu_usage(&l), 2);
}

#[test]
fn reconcile_tells_pods_of_the_same_name_apart_and_counts_each_pod_once() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "a", 1, None).unwrap();
    l.reconcile(&[seen("a", 1, None)], 1_001);
    // a was deleted and re-created under the same name (new creationTimestamp), and the new
    // one was admitted: the old charge goes, the new one stays.
    let uid = "uid-a2".to_string();
    let mut r = request(&q, "a", &uid, 1, None);
    r.created = 2_000;
    l.charge(&q, &r, &admission_key(&r), 2_000).unwrap();
    let mut again = seen("a", 1, None);
    again.created = 2_000;
    assert_eq!(gpu_usage(&l), 2, "the old a (folded, not yet gone from the view) and the new one");
    let report = l.reconcile(&[again.clone()], 2_001);
    assert_eq!((report.released, report.seen), (0, 1), "{report:?}");
    assert!(l.is_empty());
    assert_eq!(gpu_usage(&l), 1);
    // A pending duplicate for a pod already counted (say, charged again under another key) is
    // dropped: one count per pod.
    let uid = "uid-other".to_string();
    let mut dup = request(&q, "a", &uid, 1, None);
    dup.created = 2_000;
    l.charge(&q, &dup, &admission_key(&dup), 2_002).unwrap();
    assert_eq!(gpu_usage(&l), 2);
    let report = l.reconcile(&[again], 2_003);
    assert_eq!((report.seen, report.refolded), (1, false), "{report:?}");
    assert_eq!(gpu_usage(&l), 1);
}

#[test]
fn a_conflict_re_decides_against_what_the_other_writer_committed() {
    // Two replicas start from the same copy with 1 GPU left; both would admit. The second
    // write gets 409, re-reads the first one's ledger and must now refuse.
    let q = quota(3);
    let mut base = reconciled();
    charge(&mut base, &q, "a", 2, None).unwrap();
    let mut first = base.clone();
    let mut second = base.clone();
    assert_eq!(charge(&mut first, &q, "x", 1, None), Ok(Charged::New));
    assert_eq!(charge(&mut second, &q, "y", 1, None), Ok(Charged::New));
    // The API server took `first`; the second replica re-reads it and decides again.
    let mut reread = Ledger::from_data(&first.to_data(), true);
    let refusal = charge(&mut reread, &q, "y", 1, None).unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 3 of 3 nvidia.com/gpu in namespaces vision; this pod asks 1"
    );
    // A re-sent x on the second replica finds x's charge there: admitted, not charged twice.
    assert_eq!(charge(&mut reread, &q, "x", 1, None), Ok(Charged::Already));
}

#[test]
fn reconcile_keeps_gang_members_consistent_with_the_store_tally() {
    let q = quota(10);
    let mut l = reconciled();
    // A gang of 4 whose members exist but were never charged (admitted before the ledger).
    let pods: Vec<SeenPod> = (0..2).map(|i| seen(&format!("m{i}"), 2, Some(("g", 4)))).collect();
    l.reconcile(&pods, 1_000);
    // Two members of 2 GPUs present, two missing: charged 4 x 2 = 8.
    assert_eq!(gpu_usage(&l), 8);
    // The third member fills a placeholder: no more usage; a 3-GPU fourth would add 1 + 3 - 2.
    assert_eq!(charge(&mut l, &q, "m2", 2, Some(("g", 4))), Ok(Charged::New));
    assert_eq!(gpu_usage(&l), 8);
    // A terminating member still counts its devices.
    let mut gone = pods.clone();
    gone[0].terminating = true;
    l.reconcile(&gone, 1_001);
    assert_eq!(gpu_usage(&l), 8);
}

#[test]
fn a_full_ledger_refuses_instead_of_dropping_charges() {
    let q = quota(1_000_000);
    let mut l = reconciled();
    for i in 0..MAX_ENTRIES {
        charge(&mut l, &q, &format!("p{i}"), 1, None).unwrap();
    }
    assert!(l.bytes() < MAX_BYTES, "{} bytes for {MAX_ENTRIES} charges", l.bytes());
    let refusal = charge(&mut l, &q, "one-more", 1, None).unwrap_err();
    assert!(refusal.message("vision").contains("quota ledger is full (4096 pending charges"), "{refusal:?}");
    assert_eq!(l.len(), MAX_ENTRIES);
    // Names at their longest reach the byte bound first.
    let mut long = reconciled();
    let name = "n".repeat(253);
    let mut refused = false;
    for i in 0..MAX_ENTRIES {
        let uid = format!("uid-{i}");
        let r = request(&q, &name, &uid, 1, None);
        if long.charge(&q, &r, &admission_key(&r), 1_000).is_err() {
            refused = true;
            break;
        }
    }
    assert!(refused && long.bytes() <= MAX_BYTES, "{} bytes", long.bytes());
}

#[test]
fn keys_and_object_names_are_valid_whatever_the_input() {
    assert_eq!(object_name("vision"), "allot-quota-vision");
    for team in ["Vision", "a_b", &"x".repeat(300), "a/b", ""] {
        let name = object_name(team);
        assert!(name.starts_with("allot-quota-") && name.len() <= 63, "{name}");
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'), "{name}");
    }
    assert_eq!(folded_key("ns"), "n.ns");
    for ns in ["a/b", &*"y".repeat(260)] {
        let key = folded_key(ns);
        assert!(valid_key(&key) && key.starts_with(FOLDED_PREFIX), "{ns}");
    }
    let q = quota(1);
    let r = request(&q, "a", "not a uid/../", 1, None);
    assert!(valid_key(&admission_key(&r)));
}

#[test]
fn a_pod_seen_deleted_before_the_leader_looked_releases_its_charge_at_once() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "quick", 1, None).unwrap();
    charge(&mut l, &q, "slow", 1, None).unwrap();
    let report = l.reconcile_with(&Recount::from_pods(&[]), 1_005, &|e| e.name == "quick");
    assert_eq!((report.released, report.expired), (1, 0), "{report:?}");
    assert_eq!(gpu_usage(&l), 1, "the other pending charge waits for its pod or its expiry");
}

/// `n` pods of the team the way a large team looks: spread over 8 namespaces with names of
/// typical length; `gang_share` of them in gangs of `gang_size` (mixed requests), the rest plain.
fn large_team(n: usize, gang_share: f64, gang_size: u32) -> Vec<SeenPod> {
    let gang_members = ((n as f64) * gang_share) as usize;
    let q = quota(8);
    (0..n)
        .map(|i| {
            let namespace = format!("vision-research-{}", (i / 1_000) % 8);
            let gpus = [1, 2, 4, 8][i % 4];
            let gang = (i < gang_members)
                .then(|| (format!("train-llama-finetune-{}", i / gang_size as usize), Some(gang_size)));
            let requests = counted(&q, &gpus_of(if gang.is_some() { 8 } else { gpus }));
            SeenPod {
                namespace,
                name: format!("train-llama-finetune-worker-{i:06}-abcde"),
                created: 1_000,
                finished: false,
                terminating: i % 97 == 0,
                requests,
                gang,
                claims: Default::default(),
            }
        })
        .collect()
}

fn gpus_of(n: i64) -> ResourceList {
    ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(n))])
}

/// GPUs the pods request (terminating ones too), plus each gang's placeholders: what the
/// ledger must count for them.
fn expected_gpus(pods: &[SeenPod]) -> i64 {
    let mut tallies: HashMap<(String, String), GangTally> = HashMap::new();
    let mut plain = ResourceList::new();
    for p in pods.iter().filter(|p| !p.finished) {
        match &p.gang {
            Some((g, size)) => tallies.entry((p.namespace.clone(), g.clone())).or_default().add(
                p.requests.iter().map(|(k, v)| (k.as_str(), *v)),
                *size,
                p.terminating,
            ),
            None => add_to(&mut plain, &p.requests, 1),
        }
    }
    for t in tallies.values() {
        add_to(&mut plain, &t.total(), 1);
    }
    plain.get("nvidia.com/gpu").map_or(0, |q| q.ceil_units())
}

/// Issue 12's size bound: 20,000 pods counted at once in one team fit in one ledger object
/// (the pods are folded into per-namespace totals), the numbers are exact, admission still
/// charges and refuses on top of them, and the recount releases what went, once.
#[test]
fn twenty_thousand_pods_fit_in_one_ledger_with_exact_numbers() {
    for (gang_share, gang_size) in [(0.0, 8), (0.5, 8), (1.0, 8), (1.0, 2)] {
        let pods = large_team(20_000, gang_share, gang_size);
        let mut l = reconciled();
        l.reconcile(&pods, 1_000);
        let bytes = l.bytes();
        eprintln!("20,000 pods, {:.0}% in gangs of {gang_size}: {bytes} bytes", gang_share * 100.0);
        assert!(bytes <= MAX_BYTES, "{bytes} bytes");
        assert_eq!(l.folded().map(|f| u64::from(f.pods)).sum::<u64>(), 20_000);
        let used = expected_gpus(&pods);
        assert_eq!(gpu_usage(&l), used);
        // Read back from the stored form: the same numbers.
        let back = Ledger::from_data(&l.to_data(), true);
        assert_eq!(gpu_usage(&back), used);
        // Admission on top: exactly the room left.
        let q = quota(u32::try_from(used + 3).unwrap());
        assert_eq!(charge(&mut l, &q, "extra-a", 3, None), Ok(Charged::New));
        assert!(matches!(charge(&mut l, &q, "extra-b", 1, None), Err(Refusal::Exceeded { .. })));
        // A tenth of the pods go (whole gangs and parts of gangs): the recount releases exactly them.
        let rest: Vec<SeenPod> = pods.iter().filter(|p| !p.name.ends_with("0-abcde")).cloned().collect();
        l.reconcile(&rest, 1_001);
        assert_eq!(gpu_usage(&l), expected_gpus(&rest) + 3, "the remaining pods and extra-a (pending)");
        assert!(!l.reconcile(&rest, 1_002).changed());
    }
}

/// One step of the ledger's world: admissions, the API server, the leader's lagging watch.
#[derive(Debug, Clone)]
enum Step {
    /// An admission of a new pod asking `gpus`, in gang `gang` (index into the case's sizes);
    /// `stored`: the API server stores the pod (else a later webhook refused it).
    Admit {
        gpus: i64,
        gang: Option<usize>,
        stored: bool,
    },
    /// The same admission re-sent (the n-th admitted pod's).
    Resend(usize),
    /// The watch delivers the n-th stored pod's current state.
    Deliver(usize),
    /// The n-th stored pod finishes / starts terminating / is gone.
    Finish(usize),
    Terminate(usize),
    Gone(usize),
    /// The watch delivers everything it lags behind.
    CatchUp,
    /// The leader reconciles against its watch.
    Reconcile,
    /// Time passes beyond the pending TTL (after the watch caught up, as the TTL assumes).
    Expire,
}

fn arb_step(gangs: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0i64..4, prop::option::of(0..gangs), prop::bool::weighted(0.9))
            .prop_map(|(gpus, gang, stored)| Step::Admit { gpus, gang, stored }),
        1 => any::<usize>().prop_map(Step::Resend),
        3 => any::<usize>().prop_map(Step::Deliver),
        1 => any::<usize>().prop_map(Step::Finish),
        1 => any::<usize>().prop_map(Step::Terminate),
        2 => any::<usize>().prop_map(Step::Gone),
        1 => Just(Step::CatchUp),
        3 => Just(Step::Reconcile),
        1 => Just(Step::Expire),
    ]
}

use proptest::prelude::*;

/// A pod's gang: (name, declared size).
type Gang = Option<(String, u32)>;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Over any interleaving of admissions (plain pods and gang members), re-sent admissions,
    /// pods the API server never stores, finishing, terminating and deleted pods, a watch that
    /// lags, reconciles and expiry, all through the folded ledger (read back from its stored
    /// form after every write, as a replica would):
    /// - the GPUs the stored pods request never exceed the limit;
    /// - once the watch has caught up and the pending charges are folded or expired, the ledger
    ///   counts exactly what a fresh recount of the stored pods counts: nothing released twice,
    ///   nothing forgotten.
    #[test]
    fn the_folded_ledger_never_passes_the_limit_and_recounts_exactly(
        (limit, sizes, steps) in (1u32..10, prop::collection::vec(1u32..5, 1..4))
            .prop_flat_map(|(l, s)| { let n = s.len(); (Just(l), Just(s), prop::collection::vec(arb_step(n), 1..80)) })
    ) {
        let q = quota(limit);
        let mut l = reconciled();
        // Pods in the API server and as the watch last saw them, by name.
        let mut api: BTreeMap<String, SeenPod> = BTreeMap::new();
        let mut watch: BTreeMap<String, SeenPod> = BTreeMap::new();
        // Admitted pods: name, GPUs, gang (to re-send their admission).
        let mut admitted: Vec<(String, i64, Gang)> = Vec::new();
        let mut now = 1_000;
        for (n, step) in steps.into_iter().enumerate() {
            now += 1;
            match step {
                Step::Admit { gpus, gang, stored } => {
                    let name = format!("p{n}");
                    let gang = gang.map(|g| (format!("g{g}"), sizes[g]));
                    let uid = format!("uid-{name}");
                    let mut r = request(&q, &name, &uid, gpus, gang.as_ref().map(|(g, s)| (g.as_str(), *s)));
                    r.created = now;
                    if gpus == 0 && gang.is_none() {
                        continue; // asks nothing the quota counts: never reaches the book
                    }
                    if l.charge(&q, &r, &admission_key(&r), now).is_ok() {
                        l = Ledger::from_data(&l.to_data(), true);
                        admitted.push((name.clone(), gpus, gang.clone()));
                        if stored {
                            let mut pod = seen(&name, gpus, None);
                            pod.created = now;
                            pod.gang = gang.map(|(g, s)| (g, Some(s)));
                            api.insert(name, pod);
                        }
                    }
                }
                Step::Resend(i) => {
                    if let Some((name, gpus, gang)) = admitted.get(i % admitted.len().max(1)).cloned() {
                        let uid = format!("uid-{name}");
                        let r = request(&q, &name, &uid, gpus, gang.as_ref().map(|(g, s)| (g.as_str(), *s)));
                        let (before, pending) = (gpu_usage(&l), l.contains(&admission_key(&r)));
                        let again = l.charge(&q, &r, &admission_key(&r), now);
                        // Still pending: admitted again, not charged twice. (A re-send after the
                        // pod was folded is charged again until the next reconcile finds it:
                        // over-counts, never under-counts.)
                        if pending {
                            prop_assert_eq!(again, Ok(Charged::Already));
                            prop_assert_eq!(gpu_usage(&l), before);
                        }
                        l = Ledger::from_data(&l.to_data(), true);
                    }
                }
                Step::Deliver(i) => {
                    if let Some(pod) = api.values().nth(i % api.len().max(1)) {
                        watch.insert(pod.name.clone(), pod.clone());
                    }
                }
                Step::Finish(i) => {
                    let len = api.len().max(1);
                    if let Some(pod) = api.values_mut().nth(i % len) {
                        pod.finished = true;
                    }
                }
                Step::Terminate(i) => {
                    let len = api.len().max(1);
                    if let Some(pod) = api.values_mut().nth(i % len) {
                        pod.terminating = true;
                    }
                }
                Step::Gone(i) => {
                    if let Some(name) = api.keys().nth(i % api.len().max(1)).cloned() {
                        api.remove(&name);
                    }
                }
                Step::CatchUp => watch = api.clone(),
                Step::Reconcile => {
                    let pods: Vec<SeenPod> = watch.values().cloned().collect();
                    l.reconcile(&pods, now);
                    l = Ledger::from_data(&l.to_data(), true);
                }
                Step::Expire => {
                    watch = api.clone();
                    let pods: Vec<SeenPod> = watch.values().cloned().collect();
                    l.reconcile(&pods, now);
                    now += PENDING_TTL_SECS + 1;
                    l.reconcile(&pods, now);
                    l = Ledger::from_data(&l.to_data(), true);
                }
            }
            let held: i64 = api.values().filter(|p| !p.finished).map(|p| p.requests.get("nvidia.com/gpu").map_or(0, |q| q.ceil_units())).sum();
            prop_assert!(held <= i64::from(limit), "the team holds {held} GPUs, limit {limit}");
        }
        // The watch catches up; pending charges are folded or expire.
        let pods: Vec<SeenPod> = api.values().cloned().collect();
        l.reconcile(&pods, now);
        l.reconcile(&pods, now + PENDING_TTL_SECS + 1);
        prop_assert!(l.is_empty(), "pending left: {:?}", l.entries().collect::<Vec<_>>());
        prop_assert_eq!(gpu_usage(&l), expected_gpus(&pods));
        let mut fresh = reconciled();
        fresh.reconcile(&pods, now);
        prop_assert_eq!(l.to_data(), fresh.to_data());
    }
}

/// The leader's recount answers what the per-pod list answered: each counted pod by name (its
/// creation time and whether it ended), nothing for others, and the same folded totals.
#[test]
fn a_recount_finds_pods_by_name_and_folds_like_the_list() {
    let mut pods = large_team(3_000, 0.3, 4);
    pods[7].finished = true;
    let recount = Recount::from_pods(&pods);
    assert_eq!(recount.pods(), 3_000);
    assert_eq!(
        recount.find(&pods[7].namespace, &pods[7].name),
        Some(Sighting { created: 1_000, finished: true, young: false })
    );
    assert_eq!(
        recount.find(&pods[8].namespace, &pods[8].name),
        Some(Sighting { created: 1_000, finished: false, young: false })
    );
    // Same name in another namespace, or an unknown name: not found.
    assert_eq!(recount.find("other", &pods[8].name), None);
    assert_eq!(recount.find(&pods[8].namespace, "train-llama-finetune-worker-999999-abcde"), None);
    // Streaming pod by pod gives the ledger the totals the whole list gave.
    let mut streamed = Recount::default();
    for p in &pods {
        let pod = CountedPod {
            namespace: &p.namespace,
            name: &p.name,
            created: p.created,
            finished: p.finished,
            terminating: p.terminating,
            gang: p.gang.as_ref().map(|(g, size)| (g.as_str(), *size)),
        };
        streamed.add(&pod, p.requests.clone(), p.claims.clone());
    }
    let (mut a, mut b) = (Ledger::default(), Ledger::default());
    a.reconcile(&pods, 1_000);
    b.reconcile_with(&streamed, 1_000, &|_| false);
    assert_eq!(a.to_data(), b.to_data());
    assert_eq!(gpu_usage(&b), expected_gpus(&pods));
}

fn allowance(n: i64, until: i64) -> Allowance {
    Allowance { reserved: ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(n))]), until }
}

/// An allowance is usage for everyone: charges and allowances together never pass the limit,
/// and a refusal can be told apart from one only allowances cause.
#[test]
fn allowances_count_as_usage_until_given_back() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "a", 2, None).unwrap();
    l.set_allowance("a.one", Some(allowance(3, 2_000)));
    l.set_allowance("a.two", Some(allowance(2, 2_000)));
    assert_eq!(gpu_usage(&l), 7);
    assert_eq!(l.free(&q)["nvidia.com/gpu"], q.charge(&gpus(1))["nvidia.com/gpu"]);
    let refusal = charge(&mut l.clone(), &q, "b", 2, None).unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 7 of 8 nvidia.com/gpu in namespaces vision; this pod asks 2"
    );
    assert_eq!(charge(&mut l.without_allowances(), &q, "b", 2, None), Ok(Charged::New));
    // Given back (or set to nothing): gone from the stored form too.
    l.set_allowance("a.one", None);
    l.set_allowance("a.two", Some(allowance(0, 2_000)));
    assert_eq!(gpu_usage(&l), 2);
    assert!(l.to_data().keys().all(|k| !k.starts_with("a.")));
    assert_eq!(l.bytes(), l.to_data().iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
}

#[test]
fn allowances_and_drain_requests_round_trip_and_bad_ones_are_unreadable() {
    let q = quota(8);
    let mut l = reconciled();
    l.set_allowance(&allowance_key("replica-1"), Some(allowance(3, 2_000)));
    l.request_drain(1_000_500);
    let data = l.to_data();
    assert_eq!(data["a.replica-1"], r#"{"res":{"nvidia.com/gpu":"3"},"until":2000}"#);
    assert_eq!(data["drain"], "1000500");
    let back = Ledger { claims_known: true, ..Ledger::from_data(&data, true) };
    assert_eq!(back, l);
    assert_eq!(back.drain_requested(), Some(1_000_500));
    assert_eq!(back.bytes(), data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    for (key, bad) in [
        ("a.x", r#"{"res":{"nvidia.com/gpu":"-3"},"until":2000}"#),
        ("a.x", r#"{"res":{"nvidia.com/gpu":"lots"},"until":2000}"#),
        ("a.x", r#"{"res":{},"until":2000,"extra":1}"#),
        ("drain", "soon"),
    ] {
        let mut read = Ledger::from_data(&BTreeMap::from([(key.to_string(), bad.to_string())]), true);
        let refusal = charge(&mut read, &q, "z", 1, None).unwrap_err();
        assert!(refusal.message("vision").contains("unreadable charge"), "{bad}: {refusal:?}");
    }
    // Holder names that are not data keys are hashed into one.
    assert!(valid_key(&allowance_key(&"x/".repeat(200))));
}

/// The leader drops an allowance its holder stopped renewing, and an old drain request; a
/// live allowance stays whatever else changes.
#[test]
fn reconcile_drops_stale_allowances_and_old_drain_requests() {
    let mut l = reconciled();
    l.set_allowance("a.live", Some(allowance(2, 1_015)));
    l.set_allowance("a.dead", Some(allowance(3, 999)));
    l.request_drain(1_000 * 1_000);
    let report = l.reconcile(&[], 1_000);
    assert_eq!((report.allowances_expired, report.allowances_held, report.drain_dropped), (1, 1, false));
    assert!(report.changed());
    assert_eq!(l.allowances().map(|(k, _)| k).collect::<Vec<_>>(), ["a.live"]);
    let report = l.reconcile(&[], 1_000);
    assert!(!report.changed(), "an allowance held is not a change: {report:?}");
    let report = l.reconcile(&[], 1_061);
    assert_eq!((report.allowances_expired, report.drain_dropped), (1, true));
    assert_eq!((l.allowances().count(), l.drain_requested()), (0, None));
    assert_eq!(l.bytes(), l.to_data().iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
}

/// A pod younger than FOLD_DELAY_SECS is not folded: its pending charge stays (a charge
/// written after the pod appeared must not count it twice), and it is folded once old enough.
#[test]
fn young_pods_stay_pending_until_old_enough_to_fold() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "a", 2, None).unwrap();
    let pods = [seen("a", 2, None)];
    let recount_at = |now: i64| {
        let mut r = Recount::at(now);
        for p in &pods {
            let pod = CountedPod {
                namespace: &p.namespace,
                name: &p.name,
                created: p.created,
                finished: false,
                terminating: false,
                gang: None,
            };
            r.add(&pod, p.requests.clone(), p.claims.clone());
        }
        r
    };
    let young = recount_at(1_000 + FOLD_DELAY_SECS - 1);
    assert_eq!(young.young(), 1);
    let report = l.reconcile_with(&young, 1_002, &|_| false);
    assert_eq!((report.seen, report.refolded, l.len()), (0, false, 1));
    assert_eq!(gpu_usage(&l), 2, "counted once, by its charge");
    // Settling the same pod's charge again (a late write from an allowance) adds nothing.
    let uid = "uid-a".to_string();
    let r = request(&q, "a", &uid, 2, None);
    l.settle(&admission_key(&r), &Entry::admitted(&q, &r, 1_001));
    assert_eq!((l.len(), gpu_usage(&l)), (1, 2));
    let old = recount_at(1_000 + FOLD_DELAY_SECS + 1);
    assert_eq!(old.young(), 0);
    let report = l.reconcile_with(&old, 1_004, &|_| false);
    assert_eq!((report.seen, report.refolded, l.len()), (1, true, 0));
    assert_eq!(gpu_usage(&l), 2, "counted once, folded");
}

/// The shared claim `pair` with `n` devices of `gpu.nvidia.com`, as a request carries it.
fn pair(n: i64) -> SharedClaims {
    SharedClaims::from([(
        "pair".to_string(),
        ResourceList::from([(crate::model::dra::class_resource("gpu.nvidia.com"), Quantity::from_units(n))]),
    )])
}

/// A quota of `limit` GPUs that counts `gpu.nvidia.com` devices as GPUs.
fn dra_quota(limit: u32) -> Quota {
    crate::control::cluster::fixtures::dra_policies(limit).teams.iter().find_map(|t| t.quota.clone()).unwrap()
}

fn charged_gpus(l: &Ledger, q: &Quota) -> i128 {
    q.charge(&l.usage().0).get("nvidia.com/gpu").copied().unwrap_or(0) / q.denominator / 1_000_000_000
}

/// Issue 15: the ledger charges a shared claim once per namespace — pending charges that name it
/// share it, folded pods that name it share it, a pending sharer of a folded claim adds nothing —
/// and its stored form keeps the claims.
#[test]
fn a_shared_claim_is_charged_once_pending_folded_and_stored() {
    let q = dra_quota(4);
    let mut l = reconciled();
    let sharer = |name: &'static str, uid: &'static str| {
        let mut r = request(&q, name, uid, 0, None);
        r.shared_claims = pair(2);
        r
    };
    for (name, uid) in [("a", "uid-a"), ("b", "uid-b")] {
        let r = sharer(name, uid);
        assert_eq!(l.charge(&q, &r, &admission_key(&r), 1_000), Ok(Charged::New));
    }
    assert_eq!(charged_gpus(&l, &q), 2, "two pending sharers: the claim once");
    let plain = request(&q, "plain", "uid-plain", 2, None);
    assert_eq!(l.charge(&q, &plain, &admission_key(&plain), 1_000), Ok(Charged::New));
    let over = request(&q, "over", "uid-over", 1, None);
    let refused = l.charge(&q, &over, &admission_key(&over), 1_000).unwrap_err();
    assert!(refused.message("vision").contains("uses 4 of 4"), "{refused:?}");

    // Stored and read back: the same usage.
    let mut l = Ledger { claims_known: true, ..Ledger::from_data(&l.to_data(), true) };
    assert_eq!(charged_gpus(&l, &q), 4);

    // The leader folds a (seen), b is young: the claim is folded once, b's charge adds nothing.
    let seen_pod = |name: &str, claims: SharedClaims, created: i64| SeenPod {
        namespace: "vision".into(),
        name: name.into(),
        created,
        finished: false,
        terminating: false,
        requests: ResourceList::new(),
        gang: None,
        claims,
    };
    let mut recount = Recount::at(1_010);
    for pod in [seen_pod("a", pair(2), 1_000), seen_pod("b", pair(2), 1_009)] {
        let counted = CountedPod {
            namespace: &pod.namespace,
            name: &pod.name,
            created: pod.created,
            finished: false,
            terminating: false,
            gang: None,
        };
        recount.add(&counted, pod.requests.clone(), pod.claims.clone());
    }
    l.reconcile_with(&recount, 1_010, &|_| false);
    assert_eq!(l.folded().map(|f| f.claims.len()).sum::<usize>(), 1);
    assert_eq!(charged_gpus(&l, &q), 4, "folded a + pending b + pending plain: 2 + 2");
    let l = Ledger { claims_known: true, ..Ledger::from_data(&l.to_data(), true) };
    assert_eq!(charged_gpus(&l, &q), 4, "the folded claim survives its stored form");

    // Both sharers gone (b seen deleted): the claim is released with them.
    let mut l = l;
    let plain = SeenPod { requests: counted(&q, &gpus(2)), ..seen_pod("plain", SharedClaims::new(), 1_000) };
    l.reconcile_with(&Recount::from_pods(&[plain]), 1_020, &|e| e.name == "b");
    assert_eq!(charged_gpus(&l, &q), 2, "the plain pod's 2 only");
}

/// A stored shared claim with a negative amount (an edited ledger) is unreadable, not a credit.
#[test]
fn a_negative_shared_claim_is_unreadable() {
    let q = dra_quota(4);
    let mut l = reconciled();
    let mut r = request(&q, "a", "uid-a", 0, None);
    r.shared_claims = pair(2);
    l.charge(&q, &r, &admission_key(&r), 1_000).unwrap();
    let data: BTreeMap<String, String> =
        l.to_data().into_iter().map(|(k, v)| (k, v.replace("\"2\"", "\"-2\""))).collect();
    let mut broken = Ledger::from_data(&data, true);
    let refused = broken.charge(&q, &request(&q, "b", "uid-b", 1, None), "k", 1_000).unwrap_err();
    assert!(refused.message("vision").contains("unreadable"), "{refused:?}");
}

/// Rolling upgrade: on a ledger last reconciled by a leader that does not know shared claims,
/// a pod's shared claims are charged with the pod (no `cl` an older leader would drop): two
/// sharers count twice, over and never under, until a current leader reconciles.
#[test]
fn before_a_claims_aware_leader_shared_claims_are_charged_per_pod() {
    let q = dra_quota(4);
    let mut l = Ledger { reconciled: true, ..Ledger::default() };
    let mut a = request(&q, "a", "uid-a", 0, None);
    a.shared_claims = pair(2);
    assert_eq!(l.charge(&q, &a, &admission_key(&a), 1_000), Ok(Charged::New));
    assert!(l.entries().all(|(_, e)| e.claims.is_empty()), "no cl value written");
    assert!(!l.to_data().values().any(|v| v.contains("\"cl\"")));
    let mut b = request(&q, "b", "uid-b", 0, None);
    b.shared_claims = pair(2);
    assert_eq!(l.charge(&q, &b, &admission_key(&b), 1_000), Ok(Charged::New));
    assert_eq!(charged_gpus(&l, &q), 4, "each sharer counted: 2 + 2");
    let mut c = request(&q, "c", "uid-c", 0, None);
    c.shared_claims = pair(2);
    assert!(l.charge(&q, &c, &admission_key(&c), 1_000).is_err(), "a third would be 6 of 4");
}
