//! The ledger's pure logic: charging, re-sent admissions, expiry, reconcile, a conflict's
//! re-decision, gangs, bounds and the stored form.

use super::*;
use crate::policy::{PolicySet, Source, compile};

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
    let requests = gpus(n);
    QuotaRequest {
        uid: "review-uid",
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: uid,
        created: 1_000,
        charge: q.charge(&requests),
        requests,
        gang,
        dry_run: false,
    }
}

fn reconciled() -> Ledger {
    Ledger { reconciled: true, ..Ledger::default() }
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
    // The reconciler drops it (and re-adds from the pods it sees).
    let report = broken.reconcile(&[seen("a", 1, None)], 1_000);
    assert_eq!((report.dropped_unreadable, report.added), (1, 1));
    assert_eq!(charge(&mut broken, &q, "b", 1, None), Ok(Charged::New));
}

#[test]
fn stored_form_round_trips() {
    let q = quota(8);
    let mut l = reconciled();
    charge(&mut l, &q, "a", 2, None).unwrap();
    charge(&mut l, &q, "m0", 1, Some(("ddp", 4))).unwrap();
    l.reconcile(&[seen("a", 2, None)], 1_001);
    let data = l.to_data();
    let back = Ledger::from_data(&data, true);
    assert_eq!(back, l);
    assert_eq!(back.bytes(), data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>());
    let stored = &data["u.uid-m0"];
    assert_eq!(
        stored,
        r#"{"pod":"vision/m0","created":1000,"at":1000,"req":{"nvidia.com/gpu":"1"},"gang":"ddp","size":4}"#
    );
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
    assert_eq!((report.seen, report.released, report.added, report.expired), (2, 1, 1, 0), "{report:?}");
    assert_eq!(gpu_usage(&l), 1 + 1 + 1 + 2, "a, c (terminating: still holds its GPU), d (pending), e");
    // Nothing changed: nothing to write.
    assert!(!l.reconcile(&pods, 1_011).changed());
    // c is gone now, a deleted: their charges are released; d still within its TTL.
    let report = l.reconcile(&[seen("e", 2, None)], 1_020);
    assert_eq!((report.released, report.expired), (2, 0), "{report:?}");
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
    let report = l.reconcile(&[again.clone()], 2_001);
    assert_eq!((report.released, report.seen), (1, 1), "{report:?}");
    assert_eq!(l.len(), 1);
    assert!(l.contains("u.uid-a2"));
    // A pending duplicate for a pod already charged (say, added by the reconciler while its
    // admission was in flight) is dropped: one charge per pod.
    let uid = "uid-other".to_string();
    let mut dup = request(&q, "a", &uid, 1, None);
    dup.created = 2_000;
    l.charge(&q, &dup, &admission_key(&dup), 2_002).unwrap();
    assert_eq!(gpu_usage(&l), 2);
    let report = l.reconcile(&[again], 2_003);
    assert_eq!(report.expired, 1);
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
    assert!(refusal.message("vision").contains("quota ledger is full (4096 charges"), "{refusal:?}");
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
    assert_eq!(watch_key("ns", "pod-1"), "p.ns.pod-1");
    for (ns, name) in [("ns", "a/b"), ("ns", &*"y".repeat(260))] {
        assert!(valid_key(&watch_key(ns, name)), "{ns}/{name}");
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
    let report = l.reconcile_with(&[], 1_005, &|e| e.name == "quick");
    assert_eq!((report.released, report.expired), (1, 0), "{report:?}");
    assert_eq!(gpu_usage(&l), 1, "the other pending charge waits for its pod or its expiry");
}
