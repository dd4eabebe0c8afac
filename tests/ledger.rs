//! The shared deny-mode ledger ([`allot::control::quota::SharedLedger`]) against a fake API server that
//! enforces resourceVersion preconditions: two replicas admitting at once never pass the limit
//! together, a 409 is re-read and re-decided, a re-sent admission is not charged twice, and an
//! API server that errs, refuses connections or stays silent makes admission fail closed within
//! its budget.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use allot::admission::quota::{QuotaRequest, Refusal};
use allot::control::quota::SharedLedger;
use allot::control::quota::ledger::SeenPod;
use allot::model::policy::quota::Quota;
use allot::model::quantity::Quantity;
use allot::model::resources::ResourceList;
use serde_json::json;
use support::fake_api::FakeApi;

const NS: &str = "allot-system";

fn quota(limit: u32) -> Quota {
    let text = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  \
         quota: {{mode: Deny, limits: {{nvidia.com/gpu: {limit}}}}}\n"
    );
    let p = allot::model::policy::compile(&[allot::model::policy::Source { name: "teams.yaml".into(), text }]).unwrap();
    p.teams.iter().find_map(|t| t.quota.clone()).unwrap()
}

/// What the validating webhook hands the book for pod `name` (UID `uid-NAME`) asking one GPU.
struct Pod {
    name: String,
    uid: String,
    requests: ResourceList,
}

impl Pod {
    fn new(name: &str) -> Pod {
        Pod {
            name: name.into(),
            uid: format!("uid-{name}"),
            requests: ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(1))]),
        }
    }

    fn request<'a>(&'a self, q: &Quota) -> QuotaRequest<'a> {
        QuotaRequest {
            uid: "review",
            team: "vision",
            namespace: "vision",
            pod: &self.name,
            pod_uid: &self.uid,
            created: 1_000,
            charge: q.charge(&self.requests),
            requests: self.requests.clone(),
            gang: None,
            shared_claims: Default::default(),
            dry_run: false,
            cohort: None,
        }
    }
}

async fn admit(book: &SharedLedger, q: &Quota, name: &str) -> Result<(), Refusal> {
    let pod = Pod::new(name);
    book.admit_async(q, &pod.request(q)).await
}

/// `n` one-GPU admissions (`p0`, `p1`, …) alternating between replicas `a` and `b`, `at_once`
/// of them every 5 ms; every refusal must say the team uses `limit` of `limit`. Returns how many
/// were admitted.
async fn admit_spread(
    a: &Arc<SharedLedger>,
    b: &Arc<SharedLedger>,
    q: &Quota,
    n: u64,
    at_once: u64,
    limit: u32,
) -> usize {
    let mut tasks = Vec::new();
    for i in 0..n {
        let (book, q) = (if i % 2 == 0 { a.clone() } else { b.clone() }, q.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5 * (i / at_once))).await;
            admit(&book, &q, &format!("p{i}")).await
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => admitted += 1,
            Err(r) => assert_eq!(
                r.message("vision"),
                format!("team vision uses {limit} of {limit} nvidia.com/gpu in namespaces vision; this pod asks 1")
            ),
        }
    }
    admitted
}

/// Pending charges in the ledger (admission's keys: `u.POD-UID`).
fn charges(fake: &FakeApi) -> usize {
    fake.get("configmaps", NS, "allot-quota-vision")
        .and_then(|cm| cm["data"].as_object().map(|d| d.keys().filter(|k| k.starts_with("u.")).count()))
        .unwrap_or(0)
}

/// Pods the leader's reconcile folded into the ledger's per-namespace totals.
fn folded(fake: &FakeApi) -> u64 {
    let Some(cm) = fake.get("configmaps", NS, "allot-quota-vision") else { return 0 };
    let data = cm["data"].as_object().cloned().unwrap_or_default();
    data.iter()
        .filter(|(k, _)| k.starts_with("n."))
        .filter_map(|(_, v)| serde_json::from_str::<serde_json::Value>(v.as_str()?).ok()?["pods"].as_u64())
        .sum()
}

/// Updates of a ledger the fake API server accepted.
fn updates(fake: &FakeApi) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.call.verb == "update" && r.call.resource == "configmaps" && r.status == 200)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_pass_the_limit_together() {
    let fake = FakeApi::new();
    let q = quota(3);
    let a = Arc::new(SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5)));
    let b = Arc::new(SharedLedger::new(fake.client("replica-b"), NS, Duration::from_secs(5)));

    // No ledger yet: usage is unknown, so the pod is refused and nothing is written.
    let refusal = admit(&a, &q, "early").await.unwrap_err();
    assert!(refusal.message("vision").contains("has not been reconciled"), "{refusal:?}");
    assert!(fake.get("configmaps", NS, "allot-quota-vision").is_none());

    // The leader creates it, counting a pod admitted while Allot was down.
    let running = SeenPod {
        namespace: "vision".into(),
        name: "running".into(),
        created: 900,
        finished: false,
        terminating: false,
        requests: Pod::new("running").requests,
        gang: None,
        claims: Default::default(),
    };
    let report = a.reconcile("vision", std::slice::from_ref(&running)).await.unwrap();
    assert!(report.refolded, "{report:?}");
    assert_eq!((charges(&fake), folded(&fake)), (0, 1));

    // Twelve admissions at once, spread over both replicas: 2 GPUs are left, 2 are admitted.
    assert_eq!(admit_spread(&a, &b, &q, 12, 12, 3).await, 2);
    assert_eq!((charges(&fake), folded(&fake)), (2, 1));

    // A re-sent admission of a charged pod is admitted without a write.
    let admitted_name = fake.get("configmaps", NS, "allot-quota-vision").unwrap()["data"]
        .as_object()
        .unwrap()
        .keys()
        .find_map(|k| k.strip_prefix("u.uid-").map(str::to_string))
        .unwrap();
    let before = updates(&fake);
    admit(&b, &q, &admitted_name).await.expect("a re-sent admission");
    assert_eq!(updates(&fake), before, "nothing written for a re-sent admission");
    assert_eq!(charges(&fake), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_read_again_and_decided_again() {
    let fake = FakeApi::new();
    let q = quota(2);
    let book = SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5));
    let other = SharedLedger::new(fake.client("replica-b"), NS, Duration::from_secs(5));
    book.reconcile("vision", &[]).await.unwrap();
    admit(&book, &q, "a").await.unwrap();
    // The other replica takes the last GPU; this replica's cached copy does not know: its
    // optimistic write meets 409, it reads the ledger again and refuses.
    admit(&other, &q, "b").await.unwrap();
    let before = updates(&fake);
    let refusal = admit(&book, &q, "c").await.unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 2 of 2 nvidia.com/gpu in namespaces vision; this pod asks 1"
    );
    assert_eq!(charges(&fake), 2);
    assert_eq!(updates(&fake), before, "a refusal commits nothing");
    let conflicts = fake.requests().iter().filter(|r| r.call.verb == "update" && r.status == 409).count();
    assert_eq!(conflicts, 1, "the stale copy's write was refused by its resourceVersion");

    // A scripted 409 on the write: read again, decide again, write again.
    let fake = FakeApi::new();
    let book = SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5));
    book.reconcile("vision", &[]).await.unwrap();
    fake.fail(1, 409, |r| r.call.verb == "update" && r.call.resource == "configmaps");
    admit(&book, &q, "a").await.expect("admitted after the conflict");
    let statuses: Vec<u16> = fake.requests().iter().filter(|r| r.call.verb == "update").map(|r| r.status).collect();
    assert_eq!(statuses, vec![409, 200]);
    assert_eq!(charges(&fake), 1);
}

/// A replica that watches the ledgers starts each round from the newest copy: after another
/// replica's write it commits without a read and without a 409; a refusal is still confirmed
/// by a read of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_replica_starts_from_the_newest_copy_but_refuses_only_after_a_read() {
    let fake = FakeApi::new();
    let q = quota(3);
    let book = Arc::new(SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5)));
    let other = SharedLedger::new(fake.client("replica-b"), NS, Duration::from_secs(5));
    book.reconcile("vision", &[]).await.unwrap();
    book.watch();
    admit(&book, &q, "a").await.unwrap();
    admit(&other, &q, "b").await.unwrap();
    let version = |fake: &FakeApi| {
        fake.get("configmaps", NS, "allot-quota-vision").unwrap()["metadata"]["resourceVersion"].clone()
    };
    // The watch delivers the other replica's write (at once, from the fake).
    let written = version(&fake);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = |fake: &FakeApi, from: usize| -> Vec<(String, u16)> {
        fake.requests()[from..]
            .iter()
            .filter(|r| r.call.resource == "configmaps" && r.call.verb != "watch" && r.call.verb != "list")
            .map(|r| (r.call.verb.clone(), r.status))
            .collect()
    };
    let before = fake.requests().len();
    admit(&book, &q, "c").await.expect("the third GPU");
    assert_ne!(version(&fake), written);
    assert_eq!(calls(&fake, before), [("update".to_string(), 200)], "no read, no conflict");

    // At the limit: the watched copy says so, but only a read may refuse.
    let before = fake.requests().len();
    let refusal = admit(&book, &q, "d").await.unwrap_err();
    assert_eq!(
        refusal.message("vision"),
        "team vision uses 3 of 3 nvidia.com/gpu in namespaces vision; this pod asks 1"
    );
    assert_eq!(calls(&fake, before), [("get".to_string(), 200)], "refused from a read, nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_errs_refuses_or_stays_silent_fails_closed() {
    let q = quota(2);
    // Errors.
    let fake = FakeApi::new();
    let book = SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(2));
    book.reconcile("vision", &[]).await.unwrap();
    let fresh = SharedLedger::new(fake.client("replica-b"), NS, Duration::from_secs(2));
    fake.fail(1, 500, |r| r.call.verb == "get" && r.call.resource == "configmaps");
    let refusal = admit(&fresh, &q, "a").await.unwrap_err();
    let message = refusal.message("vision");
    assert!(message.contains("quota ledger in the API server could not be used"), "{message}");
    assert!(message.contains("fails closed"), "{message}");
    fake.fail(1, 503, |r| r.call.verb == "update" && r.call.resource == "configmaps");
    assert!(admit(&book, &q, "b").await.is_err());
    assert_eq!(charges(&fake), 0);

    // Nothing listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let book = SharedLedger::new(client_for(closed), NS, Duration::from_secs(2));
    let started = Instant::now();
    let refusal = admit(&book, &q, "c").await.unwrap_err();
    assert!(refusal.message("vision").contains("could not be used"), "{refusal:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

    // Something accepts and never answers: refused at the budget.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            open.push(s);
        }
    });
    let book = SharedLedger::new(client_for(addr), NS, Duration::from_millis(800));
    let started = Instant::now();
    let refusal = admit(&book, &q, "d").await.unwrap_err();
    assert!(refusal.message("vision").contains("within the request deadline"), "{refusal:?}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(700) && took < Duration::from_secs(2), "{took:?}");
    held.abort();
}

fn client_for(addr: std::net::SocketAddr) -> kube::Client {
    allot::install_crypto_provider();
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    kube::Client::try_from(config).unwrap()
}

/// Keys of replicas' allowances in the ledger.
fn allowance_keys(fake: &FakeApi) -> usize {
    fake.get("configmaps", NS, "allot-quota-vision")
        .and_then(|cm| cm["data"].as_object().map(|d| d.keys().filter(|k| k.starts_with("a.")).count()))
        .unwrap_or(0)
}

/// Waits (up to 10 s) until the ledger holds `pending` charges and `allowances` allowances: the
/// flushers' writes come in the background.
async fn settles_to(fake: &FakeApi, pending: usize, allowances: usize) {
    let started = Instant::now();
    while (charges(fake), allowance_keys(fake)) != (pending, allowances) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} charges, {} allowances; expected {pending}, {allowances}",
            charges(fake),
            allowance_keys(fake)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Far from the limit a replica admits from its allowance without a write per pod; near it the
/// allowances are asked back, so two replicas still admit exactly the limit between them, and
/// every pod admitted from an allowance ends up charged in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowances_spare_the_round_trip_and_still_admit_exactly_the_limit() {
    let fake = FakeApi::new();
    let q = quota(64);
    let a = Arc::new(SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5)));
    let b = Arc::new(SharedLedger::new(fake.client("replica-b"), NS, Duration::from_secs(5)));
    a.reconcile("vision", &[]).await.unwrap();
    for book in [&a, &b] {
        book.watch();
        book.spawn_flusher();
    }
    // 100 admissions, 8 at a time as clients send them, spread over both replicas.
    let admitted = admit_spread(&a, &b, &q, 100, 8, 64).await;
    assert_eq!(admitted, 64, "exactly the limit");
    let spared = a.metrics.allowance_admissions.get() + b.metrics.allowance_admissions.get();
    assert!(spared > 0, "some admissions came from an allowance");
    assert!(updates(&fake) < 64, "fewer writes than admissions: {}", updates(&fake));
    // The flushers write every admitted pod's charge; idle allowances are given back.
    settles_to(&fake, 64, 0).await;
    eprintln!("{admitted} admitted, {spared} from allowances, {} ledger writes", updates(&fake));
}

/// On shutdown a replica hands its allowance back at once and writes what it admitted from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_back_returns_the_allowance_and_writes_its_pods() {
    let fake = FakeApi::new();
    let q = quota(1_000);
    let book = Arc::new(SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5)));
    book.reconcile("vision", &[]).await.unwrap();
    admit(&book, &q, "first").await.unwrap();
    assert_eq!((charges(&fake), allowance_keys(&fake)), (1, 1), "the first round took an allowance");
    let before = updates(&fake);
    for i in 0..10 {
        admit(&book, &q, &format!("p{i}")).await.unwrap();
    }
    assert_eq!(updates(&fake), before, "admitted from the allowance: no write");
    assert_eq!(book.metrics.allowance_admissions.get(), 10);
    book.give_back().await;
    assert_eq!((charges(&fake), allowance_keys(&fake)), (11, 0));
    // Stopping: nothing more from an allowance.
    admit(&book, &q, "after").await.unwrap();
    assert_eq!((charges(&fake), allowance_keys(&fake)), (12, 0));
}

/// During a rolling upgrade a leader of an older Allot may reconcile the ledger: it stamps only
/// `allot.dev/reconciled-at` (and would drop `a.` keys as unreadable). Replicas then give their
/// allowances back and grant none until a leader that knows them reconciles again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_allowance_while_an_older_leader_reconciles() {
    let fake = FakeApi::new();
    let q = quota(1_000);
    let book = Arc::new(SharedLedger::new(fake.client("replica-a"), NS, Duration::from_secs(5)));
    book.reconcile("vision", &[]).await.unwrap();
    admit(&book, &q, "first").await.unwrap();
    assert_eq!(allowance_keys(&fake), 1, "granted after a reconcile by a leader that knows allowances");
    // An older leader reconciles: its own timestamp only.
    fake.update("configmaps", NS, "allot-quota-vision", |cm| {
        cm["metadata"]["annotations"]["allot.dev/reconciled-at"] = json!("2030-01-01T00:00:00Z");
    });
    book.spawn_flusher();
    admit(&book, &q, "from-the-old-allowance").await.unwrap();
    settles_to(&fake, 2, 0).await;
    let spared = book.metrics.allowance_admissions.get();
    for i in 0..3 {
        admit(&book, &q, &format!("later-{i}")).await.unwrap();
    }
    assert_eq!(book.metrics.allowance_admissions.get(), spared, "each one through a round now");
    assert_eq!((charges(&fake), allowance_keys(&fake)), (5, 0));
    // A reconcile by a leader that knows allowances stamps both again: grants resume.
    book.reconcile("vision", &[]).await.unwrap();
    admit(&book, &q, "again").await.unwrap();
    assert_eq!(allowance_keys(&fake), 1);
}
