//! The allowance bookkeeping of one replica ([`Headroom`]), without an API server: what it
//! admits, how a round resizes it, and that `consumed ≤ cap ≤ the ledger's allowance` holds
//! whether a write succeeds, conflicts or ends unknown.

use super::*;
use crate::control::quota::ledger::Allowance;
use crate::model::policy::{Source, compile};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

fn quota(limit: u32) -> Quota {
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: {limit}}}}}\n"
    );
    let p = compile(&[Source { name: "teams.yaml".into(), text }]).unwrap();
    p.teams.iter().find_map(|t| t.quota.clone()).unwrap()
}

fn gpus(n: i64) -> ResourceList {
    ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(n))])
}

fn request<'a>(q: &Quota, name: &'a str, n: i64) -> QuotaRequest<'a> {
    QuotaRequest {
        uid: "review",
        team: "vision",
        namespace: "vision",
        pod: name,
        pod_uid: name,
        created: 1_000,
        charge: q.charge(&gpus(n)),
        requests: gpus(n),
        gang: None,
        shared_claims: Default::default(),
        dry_run: false,
        cohort: None,
    }
}

fn n(list: &ResourceList) -> i64 {
    list.get("nvidia.com/gpu").map_or(0, |q| q.ceil_units())
}

/// A ledger of `limit` with `used` GPUs charged and `ours` held by this replica.
fn ledger(q: &Quota, used: i64, ours: &ResourceList) -> Ledger {
    let mut l = Ledger::from_data(&BTreeMap::new(), true);
    for i in 0..used {
        let name = format!("used-{i}");
        let r = request(q, &name, 1);
        l.charge(q, &r, &ledger::admission_key(&r), 1_000).unwrap();
    }
    l.set_allowance("a.me", Some(Allowance { reserved: ours.clone(), until: i64::MAX }));
    l
}

/// A headroom holding `cap` GPUs, sized for one-GPU pods of `q`, in use now.
fn holding(q: &Quota, cap: i64) -> Headroom {
    Headroom {
        cap: gpus(cap),
        usable_until: Some(Instant::now() + Duration::from_secs(60)),
        sized_for: Some((q.clone(), gpus(1))),
        last_used: Some(Instant::now()),
        may_hold: true,
        ..Headroom::default()
    }
}

#[test]
fn admits_plain_pods_up_to_its_cap_and_each_pod_once() {
    let q = quota(100);
    let mut h = holding(&q, 3);
    let now = Instant::now();
    assert!(h.admit(&q, &request(&q, "a", 2), "u.a", now));
    assert!(h.admit(&q, &request(&q, "a", 2), "u.a", now), "a re-sent admission");
    assert!(!h.admit(&q, &request(&q, "b", 2), "u.b", now), "2 more do not fit in 3");
    assert!(h.admit(&q, &request(&q, "c", 1), "u.c", now));
    assert_eq!((n(&h.consumed), h.unsettled.len()), (3, 2));
    // Never: gang members, dry runs, pods without a creationTimestamp, another quota, an
    // allowance past its usable time, or one asked back.
    let mut h = holding(&q, 10);
    let mut gang = request(&q, "g", 1);
    gang.gang = Some(("ddp", 2));
    let mut dry = request(&q, "d", 1);
    dry.dry_run = true;
    let mut unborn = request(&q, "u", 1);
    unborn.created = 0;
    for (r, key) in [(&gang, "u.g"), (&dry, "u.d"), (&unborn, "u.u")] {
        assert!(!h.admit(&q, r, key, now), "{key}");
    }
    assert!(!h.admit(&quota(99), &request(&quota(99), "e", 1), "u.e", now));
    assert!(!h.admit(&q, &request(&q, "f", 1), "u.f", now + Duration::from_secs(61)));
    assert!(h.note_drain(5));
    assert!(!h.admit(&q, &request(&q, "h", 1), "u.h", now));
    assert!(!h.note_drain(5), "the same drain request once");
    assert_eq!(n(&h.consumed), 0);
}

/// A round: the consumed pods become charges, the allowance becomes what was admitted during
/// the round plus a grant of 1/8 of what is free (whole pods, at most 64), and admissions made
/// while the write is in flight stay inside what the write leaves.
#[test]
fn a_round_settles_resizes_and_keeps_the_invariant() {
    let q = quota(100);
    let mut h = holding(&q, 10);
    let now = Instant::now();
    for i in 0..4 {
        assert!(h.admit(&q, &request(&q, &format!("p{i}"), 1), &format!("u.p{i}"), now));
    }
    let (settling, settled) = h.start_round();
    assert_eq!((settling.len(), n(&settled)), (4, 4));
    let kept = h.kept(&settled);
    assert_eq!(n(&kept), 6, "the unused 6 are still held while the round writes");
    // The round's copy: 40 charged elsewhere, the 4 settled, 6 held: 50 free.
    let mut next = ledger(&q, 40, &kept);
    for (key, entry) in &settling {
        next.settle(key, entry);
    }
    // One more pod admitted from the allowance while the round decides.
    assert!(h.admit(&q, &request(&q, "late", 1), "u.late", now));
    let ours = h.resize(&next, &kept, &settled, true);
    // Pool: 50 free + 5 unused = 55; 55/8 = 6 pods; plus the 1 admitted meanwhile.
    assert_eq!(n(&ours), 7);
    assert!(n(&h.consumed) <= n(&h.cap) && n(&h.cap) <= n(&ours) + n(&settled));
    h.committed(&settling, &settled, ours.clone(), now);
    assert_eq!((n(&h.consumed), n(&h.cap), h.unsettled.len()), (1, 7, 1));
    assert!(h.keys.contains("u.late") && !h.keys.contains("u.p0"));

    // Without a grant (asked back, idle, frozen): only what was admitted during the round.
    let (settling, settled) = h.start_round();
    let kept = h.kept(&settled);
    let ours = h.resize(&ledger(&q, 40, &kept), &kept, &settled, false);
    assert_eq!(n(&ours), 0);
    h.committed(&settling, &settled, ours, now);
    assert_eq!((n(&h.consumed), n(&h.cap), h.may_hold), (0, 0, false));
}

#[test]
fn grants_are_capped_at_64_pods_and_never_cover_less_than_one() {
    let q = quota(100_000);
    let mut h = holding(&q, 0);
    let (_, settled) = h.start_round();
    assert_eq!(n(&h.resize(&ledger(&q, 0, &ResourceList::new()), &ResourceList::new(), &settled, true)), 64);
    let q = quota(10);
    let mut h = holding(&q, 0);
    assert_eq!(n(&h.resize(&ledger(&q, 3, &ResourceList::new()), &ResourceList::new(), &settled, true)), 0);
    // Idle: nothing granted, whatever is free.
    let q = quota(1_000);
    let mut h = holding(&q, 0);
    h.last_used = Some(Instant::now() - ALLOWANCE_IDLE);
    assert_eq!(n(&h.resize(&ledger(&q, 0, &ResourceList::new()), &ResourceList::new(), &settled, true)), 0);
}

/// A write whose outcome is unknown: the charges are written again next round and nothing more
/// is admitted until one succeeds; the invariant holds against the old and the new allowance.
#[test]
fn a_failed_round_freezes_the_allowance_and_settles_again() {
    let q = quota(100);
    let mut h = holding(&q, 5);
    let now = Instant::now();
    assert!(h.admit(&q, &request(&q, "a", 2), "u.a", now));
    let (settling, settled) = h.start_round();
    let kept = h.kept(&settled);
    let ours = h.resize(&ledger(&q, 0, &kept), &kept, &settled, true);
    assert!(n(&ours) >= 3);
    h.failed(settling);
    assert_eq!((h.unsettled.len(), n(&h.consumed), n(&h.cap)), (1, 2, 2));
    assert!(!h.admit(&q, &request(&q, "b", 1), "u.b", now), "frozen until a round succeeds");
    assert!(h.wants_round(now));
    let (settling, settled) = h.start_round();
    assert_eq!((settling.len(), n(&h.kept(&settled))), (1, 0));
}

fn waiting(q: &Quota, r: &QuotaRequest<'_>) -> Waiting {
    Waiting {
        quota: q.clone(),
        request: OwnedQuotaRequest::of(r),
        key: ledger::admission_key(r),
        deadline: Instant::now() + Duration::from_secs(4),
        answer: tokio::sync::oneshot::channel().0,
    }
}

/// Only admissions an allowance could serve keep it in use, and only a round deciding one (or
/// the flusher's) grants. Before, a burst of gang members kept each replica granting itself
/// 1/8 of the free GPUs for plain pods that never came; the members were deferred behind those
/// allowances, and one refused at its deadline left its gang a member short. A plain pod in the
/// batch renews the use and sizes the next grant.
#[test]
fn only_pods_an_allowance_could_serve_keep_it_in_use() {
    let q = quota(100);
    let idle_since = Instant::now() - ALLOWANCE_IDLE;
    let mut h = Headroom { sized_for: Some((q.clone(), gpus(1))), last_used: Some(idle_since), ..Headroom::default() };
    let free = ledger(&q, 0, &ResourceList::new());
    let (mut member, mut dry) = (request(&q, "m", 4), request(&q, "d", 2));
    member.gang = Some(("ddp", 5));
    dry.dry_run = true;
    h.note_demand(&[waiting(&q, &member), waiting(&q, &dry)], Instant::now());
    assert_eq!(h.last_used, Some(idle_since), "gang members and dry runs are no demand for an allowance");
    assert_eq!(h.sized_for.as_ref().map(|(_, shape)| n(shape)), Some(1));
    let (_, settled) = h.start_round();
    assert_eq!(n(&h.resize(&free, &ResourceList::new(), &settled, true)), 0, "nothing granted");
    // Whatever the time since the last plain pod, a round of members and dry runs alone grants
    // nothing (and so gives back what this replica holds unused); the flusher's may renew.
    assert!(!Headroom::demands_allowance(&[waiting(&q, &member), waiting(&q, &dry)]));
    assert!(Headroom::demands_allowance(&[waiting(&q, &member), waiting(&q, &request(&q, "p", 1))]));
    assert!(Headroom::demands_allowance(&[]));

    let now = Instant::now();
    h.note_demand(&[waiting(&q, &request(&q, "a", 1)), waiting(&q, &member), waiting(&q, &request(&q, "b", 2))], now);
    assert_eq!(h.last_used, Some(now));
    assert_eq!(h.sized_for.as_ref().map(|(_, shape)| n(shape)), Some(2), "sized for the last plain pod");
    assert_eq!(n(&h.resize(&free, &ResourceList::new(), &settled, true)), 12, "100 free / 8, in pods of 2");
}

/// A charge the recount did not find is released as a deleted pod's only once it is older than
/// the fold delay: before that, a removal of its name may be its predecessor's (a tenant
/// deleting `x` and creating `x` again asking more), whose new pod the leader's watch may not
/// show yet.
#[test]
fn a_charge_is_released_as_a_deleted_pods_only_after_the_fold_delay() {
    let charge = ledger::Entry {
        namespace: "vision".into(),
        name: "x".into(),
        created: 1_000,
        at: 1_000,
        requests: gpus(8),
        gang: None,
        claims: Default::default(),
        seen: false,
        terminating: false,
    };
    let now = Instant::now();
    // Charged at 1000.7 s; a pod named x removed at 1000.2 s (its predecessor), or at 1000.9 s
    // (the charged pod itself, deleted before the leader looked).
    let removed = |wall_now: f64, removed_at_wall: f64| {
        let removed_at = now - Duration::from_secs_f64(wall_now - removed_at_wall);
        move |since: Instant| removed_at >= since
    };
    // A reconcile at 1001.0 s: too early to tell the two apart; nothing released yet.
    assert_eq!(charge_of_a_deleted_pod(&charge, 1_001, now, removed(1_001.0, 1_000.2)), None);
    assert_eq!(charge_of_a_deleted_pod(&charge, 1_001, now, removed(1_001.0, 1_000.9)), None);
    // At 1004.5 s a pod created under the charge would be in the watch (the recount would have
    // found it): a removal means the charged pod is gone.
    assert_eq!(charge_of_a_deleted_pod(&charge, 1_004, now, removed(1_004.5, 1_000.9)), Some(true));
    // No removal of the name: not released (it expires, or its pod is found).
    assert_eq!(charge_of_a_deleted_pod(&charge, 1_004, now, |_| false), Some(false));
    assert_eq!(charge_of_a_deleted_pod(&charge, 1_001, now, |_| false), Some(false));
}
