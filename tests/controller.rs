//! The gang controller (`allot::control::gang::controller::spawn`) against the scenario fake API server
//! (tests/support/fake_api.rs): each scenario asserts the exact calls it makes — gate patches,
//! pod conditions, Events, deletions, Lease updates.
//!
//! Waits poll the request log with a timeout (never a fixed sleep that assumes a fast machine);
//! where a test asserts that nothing happens, it first waits for a witness that the controller
//! kept working through the period (Lease renewals or resync passes seen as requests).

mod support;

use std::sync::Arc;
use std::time::Duration;

use allot::control::gang::controller::{ControllerConfig, ControllerHandle, InitialList};
use allot::control::gang::metrics::ControllerMetrics;
use serde_json::{Value, json};
use support::fake_api::{FakeApi, Request, dump, gated_pod, gpu_node, namespace};

const LEASE_NAMESPACE: &str = "allot-system";
const LEASE: &str = "allot-gang-controller";
/// Generous: the machine running the tests may be heavily loaded.
const PATIENCE: Duration = Duration::from_secs(60);

fn policies(text: &str) -> allot::model::policy::PolicySet {
    let sources = if text.is_empty() {
        Vec::new()
    } else {
        vec![allot::model::policy::Source { name: "scenario.yaml".into(), text: text.into() }]
    };
    allot::model::policy::compile(&sources).unwrap_or_else(|e| panic!("scenario policies: {e}"))
}

/// A world with the Lease's namespace, the given namespaces and nodes.
fn world(namespaces: &[&str], nodes: &[(&str, u32)]) -> FakeApi {
    let fake = FakeApi::new();
    fake.add(namespaces.iter().chain([&LEASE_NAMESPACE]).map(|n| namespace(n)));
    fake.add(nodes.iter().map(|(n, gpus)| gpu_node(n, *gpus)));
    fake
}

/// A member of an explicit gang (`allot.dev/gang-name` + `allot.dev/gang-size`).
fn member(ns: &str, gang: &str, size: u32, index: u32, created: &str) -> Value {
    gated_pod(
        ns,
        &format!("{gang}-{index}"),
        "allot.dev/gang",
        created,
        json!({"allot.dev/gang-name": gang}),
        json!({"allot.dev/gang-size": size.to_string()}),
        None,
    )
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Starts a controller as replica `identity`, with its own client and cluster state.
fn start(fake: &FakeApi, identity: &str, resync: Duration, policy_text: &str) -> (ControllerHandle, ControllerMetrics) {
    start_listing(fake, identity, resync, policy_text, InitialList::Streaming)
}

/// The same, with the Pod cache filled the way `initial_list` says.
fn start_listing(
    fake: &FakeApi,
    identity: &str,
    resync: Duration,
    policy_text: &str,
    initial_list: InitialList,
) -> (ControllerHandle, ControllerMetrics) {
    let client = fake.client(identity);
    let caches = Arc::new(allot::server::startup::Caches::default());
    let namespaces = allot::server::reload::watch_namespaces(client.clone(), caches);
    let metrics = ControllerMetrics::default();
    let handle = allot::control::gang::controller::spawn(
        client,
        Arc::new(allot::control::cluster::ClusterState::default()),
        Arc::new(arc_swap::ArcSwap::from_pointee(policies(policy_text))),
        namespaces,
        ControllerConfig {
            lease_namespace: LEASE_NAMESPACE.into(),
            lease_name: LEASE.into(),
            identity: identity.into(),
            resync,
            initial_list,
        },
        metrics.clone(),
        Box::new(|| {}),
    );
    (handle, metrics)
}

// --- reading the log ---------------------------------------------------------------------------

fn is(r: &Request, client: &str, verb: &str, resource: &str) -> bool {
    r.client == client && r.call.verb == verb && r.call.resource == resource
}

fn gate_patches<'a>(requests: &'a [Request], client: &str) -> Vec<&'a Request> {
    requests.iter().filter(|r| is(r, client, "patch", "pods")).collect()
}

fn condition_patches<'a>(requests: &'a [Request], client: &str) -> Vec<&'a Request> {
    requests.iter().filter(|r| is(r, client, "patch", "pods/status")).collect()
}

fn event_writes<'a>(requests: &'a [Request], client: &str) -> Vec<&'a Request> {
    requests.iter().filter(|r| r.client == client && r.call.resource == "events" && r.is_write()).collect()
}

fn pod_name(r: &Request) -> &str {
    r.call.name.as_deref().unwrap_or_default()
}

/// Writes other than the Lease's.
fn writes<'a>(requests: &'a [Request], client: &str) -> Vec<&'a Request> {
    requests.iter().filter(|r| r.client == client && r.is_write() && r.call.resource != "leases").collect()
}

/// The Lease renewals `client` made (a patch of `renewTime` only): each is a witness that
/// `duration - grace` (10 s) of controller time went by.
fn renewals(requests: &[Request], client: &str) -> usize {
    requests
        .iter()
        .filter(|r| is(r, client, "patch", "leases") && r.body["spec"].get("holderIdentity").is_none())
        .filter(|r| r.body["spec"]["renewTime"].is_string())
        .count()
}

/// The condition `client` set on a pod in `r` (a pods/status strategic merge patch).
fn condition(r: &Request) -> &Value {
    assert_eq!(r.content_type, "application/strategic-merge-patch+json", "{}", r.line());
    let conditions = r.body["status"]["conditions"].as_array().unwrap_or_else(|| panic!("{}", r.line()));
    assert_eq!(conditions.len(), 1, "{}", r.line());
    &conditions[0]
}

/// Checks a condition patch: Allot's condition with this status, reason and message.
fn assert_condition(r: &Request, status: &str, reason: &str, message: &str) {
    let c = condition(r);
    assert_eq!(c["type"], "allot.dev/GangReady", "{}", r.line());
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some(status), Some(reason)), "{}", r.line());
    assert_eq!(c["message"], message, "{}", r.line());
    assert!(c["lastTransitionTime"].as_str().is_some_and(|t| t.parse::<k8s_openapi::jiff::Timestamp>().is_ok()));
}

/// Checks an Event creation: about `pod` (by name; a deletion's Event names its uid too), of
/// this type, reason and note, from replica `client`.
fn assert_event(r: &Request, pod: &str, type_: &str, reason: &str, note: &str) {
    assert_eq!(r.call.group, "events.k8s.io", "{}", r.line());
    let e = &r.body;
    let mut regarding = e["regarding"].clone();
    regarding.as_object_mut().map(|o| o.remove("uid"));
    assert_eq!(regarding, json!({"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": r.call.namespace}));
    assert_eq!((e["type"].as_str(), e["reason"].as_str(), e["note"].as_str()), (Some(type_), Some(reason), Some(note)));
    assert_eq!(e["action"], "GangScheduling");
    assert_eq!(
        (e["reportingController"].as_str(), e["reportingInstance"].as_str()),
        (Some("allot"), Some(r.client.as_str()))
    );
}

/// The JSON Patch that releases a member whose `allot.dev/gang` gate is at `index` and that has
/// annotations: test of the pod's uid (the fake's `uid-NS-NAME`), test + remove of the gate, the
/// released annotation.
fn assert_release_patch(r: &Request, index: usize) -> String {
    assert_eq!(r.content_type, "application/json-patch+json", "{}", r.line());
    let ops = r.body.as_array().unwrap_or_else(|| panic!("{}", r.line()));
    assert_eq!(ops.len(), 4, "{}", r.line());
    let uid = format!("uid-{}-{}", r.call.namespace.as_deref().unwrap_or_default(), pod_name(r));
    assert_eq!(ops[0], json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    assert_eq!(
        ops[1],
        json!({"op": "test", "path": format!("/spec/schedulingGates/{index}/name"), "value": "allot.dev/gang"})
    );
    assert_eq!(ops[2], json!({"op": "remove", "path": format!("/spec/schedulingGates/{index}")}));
    assert_eq!(
        (ops[3]["op"].as_str(), ops[3]["path"].as_str()),
        (Some("add"), Some("/metadata/annotations/allot.dev~1gang-released"))
    );
    let at = ops[3]["value"].as_str().unwrap_or_else(|| panic!("{}", r.line()));
    assert!(at.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{at}");
    at.to_string()
}

fn gates(pod: &Value) -> Vec<String> {
    pod["spec"]["schedulingGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["name"].as_str().map(str::to_string))
        .collect()
}

fn names<'a>(requests: impl IntoIterator<Item = &'a &'a Request>) -> Vec<&'a str> {
    let mut n: Vec<&str> = requests.into_iter().map(|r| pod_name(r)).collect();
    n.sort();
    n
}

/// The pods the Events are about, sorted.
fn regarding(events: &[&Request]) -> Vec<String> {
    let mut n: Vec<String> =
        events.iter().map(|r| r.body["regarding"]["name"].as_str().unwrap_or_default().to_string()).collect();
    n.sort();
    n
}

// --- scenarios ---------------------------------------------------------------------------------

/// The Pod cache fills from a streaming list (a watch that begins with every Pod, no LIST);
/// where the API server refuses those (its WatchList feature off: 422) the controller lists in
/// pages instead, and works the same. `--initial-list paged` asks for pages from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_cache_fills_by_streaming_and_falls_back_to_pages_where_streaming_is_refused() {
    for (mode, refused) in
        [(InitialList::Streaming, false), (InitialList::Streaming, true), (InitialList::Paged, false)]
    {
        let fake = world(&["ml"], &[("gpu-1", 8)]);
        let created = now();
        fake.add((0..2).map(|i| member("ml", "train", 2, i, &created)));
        let streaming = |r: &Request| r.call.request.split(['?', '&']).any(|kv| kv == "sendInitialEvents=true");
        if refused {
            fake.fail(usize::MAX, 422, move |r| r.call.verb == "watch" && r.call.resource == "pods" && streaming(r));
        }
        let (handle, _) = start_listing(&fake, "allot-0", Duration::from_secs(3600), "", mode);
        let requests = fake.wait_for("the gang's release", PATIENCE, |r| gate_patches(r, "allot-0").len() >= 2).await;
        handle.shutdown(Duration::from_secs(5)).await;
        let log = dump(&requests);
        assert_eq!(names(&gate_patches(&requests, "allot-0")), ["train-0", "train-1"], "{log}");
        let pod_reads: Vec<(&str, bool, u16)> = requests
            .iter()
            .filter(|r| {
                r.client == "allot-0" && r.call.resource == "pods" && ["list", "watch"].contains(&&*r.call.verb)
            })
            .map(|r| (&*r.call.verb, streaming(r), r.status))
            .collect();
        let listed = pod_reads.iter().any(|&(verb, _, status)| verb == "list" && status == 200);
        let streamed = pod_reads.iter().any(|&(verb, s, status)| verb == "watch" && s && status == 200);
        match (mode, refused) {
            (InitialList::Streaming, false) => {
                assert!(streamed && !listed, "a streaming list and no LIST: {pod_reads:?}\n{log}");
            }
            (InitialList::Streaming, true) => {
                assert_eq!(pod_reads.first().map(|r| (r.0, r.1, r.2)), Some(("watch", true, 422)), "{log}");
                assert!(listed && !streamed, "pages after the refusal: {pod_reads:?}\n{log}");
            }
            (InitialList::Paged, _) => {
                assert!(listed && !pod_reads.iter().any(|r| r.1), "pages only: {pod_reads:?}\n{log}");
            }
        }
    }
}

/// A complete gang that fits: one JSON Patch per member (the gate at its own index), one
/// condition and one Event per member, and nothing more through a Lease renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fitting_gang_is_released_with_one_patch_condition_and_event_per_member() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    let created = now();
    fake.add((0..3).map(|i| member("ml", "train", 3, i, &created)));
    let (handle, metrics) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    let requests = fake
        .wait_for("the release and a Lease renewal after it", PATIENCE, |r| {
            event_writes(r, "allot-0").len() >= 3 && renewals(r, "allot-0") >= 1
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);

    let patches = gate_patches(&requests, "allot-0");
    assert_eq!(names(&patches), ["train-0", "train-1", "train-2"], "{log}");
    let stamps: Vec<String> = patches.iter().map(|r| assert_release_patch(r, 0)).collect();
    assert!(stamps.iter().all(|s| *s == stamps[0]), "one release time for the gang: {stamps:?}");
    for i in 0..3 {
        let pod = fake.get("pods", "ml", &format!("train-{i}")).unwrap();
        assert!(gates(&pod).is_empty(), "{pod}");
        assert_eq!(pod["metadata"]["annotations"]["allot.dev/gang-released"], stamps[0].as_str());
        assert_eq!(pod["metadata"]["annotations"]["allot.dev/gang-size"], "3", "other annotations stay");
    }

    let message = "3/3 members present; the whole gang fits, releasing";
    let conditions = condition_patches(&requests, "allot-0");
    assert_eq!(names(&conditions), ["train-0", "train-1", "train-2"], "{log}");
    for r in &conditions {
        assert_condition(r, "True", "Released", message);
    }
    let events = event_writes(&requests, "allot-0");
    assert_eq!(regarding(&events), ["train-0", "train-1", "train-2"], "{log}");
    for r in &events {
        assert_event(r, r.body["regarding"]["name"].as_str().unwrap(), "Normal", "Released", message);
    }
    // The pods' own MODIFIED events (echoes of these writes) cause no further write.
    assert_eq!(writes(&requests, "allot-0").len(), 9, "{log}");
    assert_eq!(metrics.gang_releases.get(), 1);
}

const LONG_AGO: &str = "2020-01-01T00:00:00Z";

fn timeout_policy(on_timeout: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {{name: timeout}}\nspec:\n  match: {{namespaces: [ml]}}\n  assemblyTimeout: 1m\n  onTimeout: {on_timeout}\n"
    )
}

/// A gang that never assembled, under `onTimeout: Warn`: a Warning Event and an
/// `AssemblyTimeout` condition on each member, once; nothing deleted or released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assembly_timeout_under_warn_explains_with_a_warning() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    fake.add((0..2).map(|i| member("ml", "lonely", 3, i, LONG_AGO)));
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), &timeout_policy("Warn"));
    let requests = fake
        .wait_for("the explanation and a Lease renewal", PATIENCE, |r| {
            event_writes(r, "allot-0").len() >= 2 && renewals(r, "allot-0") >= 1
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let message = "2/3 members present; needs 3 nvidia.com/gpu on any node, 8 free; not assembled within 60s";
    let conditions = condition_patches(&requests, "allot-0");
    assert_eq!(names(&conditions), ["lonely-0", "lonely-1"], "{log}");
    for r in &conditions {
        assert_condition(r, "False", "AssemblyTimeout", message);
    }
    let events = event_writes(&requests, "allot-0");
    assert_eq!(regarding(&events), ["lonely-0", "lonely-1"], "{log}");
    for r in &events {
        assert_event(r, r.body["regarding"]["name"].as_str().unwrap(), "Warning", "AssemblyTimeout", message);
    }
    assert_eq!(writes(&requests, "allot-0").len(), 4, "{log}");
    assert_eq!(fake.all("pods").len(), 2);
}

/// The same gang under `onTimeout: Fail`: every member is deleted, each after a Warning Event
/// that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assembly_timeout_under_fail_deletes_every_member() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    fake.add((0..2).map(|i| member("ml", "lonely", 3, i, LONG_AGO)));
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), &timeout_policy("Fail"));
    let requests = fake
        .wait_for("the deletions and a Lease renewal", PATIENCE, |r| {
            r.iter().filter(|r| is(r, "allot-0", "delete", "pods")).count() >= 2 && renewals(r, "allot-0") >= 1
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let message = "2/3 members present; needs 3 nvidia.com/gpu on any node, 8 free; not assembled within 60s; \
                   deleting the members (bare pods are not recreated)";
    let deletes: Vec<&Request> = requests.iter().filter(|r| is(r, "allot-0", "delete", "pods")).collect();
    assert_eq!(names(&deletes), ["lonely-0", "lonely-1"], "{log}");
    assert!(fake.all("pods").is_empty());
    for d in &deletes {
        // The Warning Event about a member comes before its deletion.
        let warned = requests.iter().take_while(|r| r.at <= d.at && !std::ptr::eq(*r, *d)).any(|r| {
            r.call.resource == "events"
                && r.body["regarding"]["name"] == pod_name(d)
                && r.body["reason"] == "AssemblyTimeout"
        });
        assert!(warned, "no Warning Event before deleting {}:\n{log}", pod_name(d));
    }
    let events = event_writes(&requests, "allot-0");
    for r in &events {
        assert_event(r, r.body["regarding"]["name"].as_str().unwrap(), "Warning", "AssemblyTimeout", message);
        // The uid of the pod deleted: a pod made again under the name does not show the Event.
        let uid = format!("uid-ml-{}", r.body["regarding"]["name"].as_str().unwrap());
        assert_eq!(r.body["regarding"]["uid"], json!(uid), "{}", r.line());
    }
    // A member being deleted gets its Warning Event and nothing more: no condition patch on a
    // pod about to go, no second Event.
    assert!(condition_patches(&requests, "allot-0").is_empty(), "{log}");
    assert_eq!(regarding(&events), ["lonely-0", "lonely-1"], "{log}");
    assert_eq!(writes(&requests, "allot-0").len(), 4, "{log}");
}

/// Two gangs that each fit alone but not together: the first (older) is released and its
/// unbound members hold their room; the second waits, stays waiting once the first is bound
/// (the room is now used), and goes when the first's pods are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_gang_reserves_its_room_until_its_pods_leave() {
    let fake = world(&["ml"], &[("gpu-1", 5)]);
    fake.add((0..3).map(|i| member("ml", "first", 3, i, "2026-01-01T00:00:00Z")));
    fake.add((0..3).map(|i| member("ml", "second", 3, i, "2026-01-01T00:01:00Z")));
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    let requests = fake
        .wait_for("the first gang's release and the second's explanation", PATIENCE, |r| {
            condition_patches(r, "allot-0").len() >= 6
        })
        .await;
    let log = dump(&requests);
    let patches = gate_patches(&requests, "allot-0");
    assert_eq!(names(&patches), ["first-0", "first-1", "first-2"], "{log}");
    let waiting: Vec<&Request> =
        condition_patches(&requests, "allot-0").into_iter().filter(|r| pod_name(r).starts_with("second")).collect();
    assert_eq!(names(&waiting), ["second-0", "second-1", "second-2"], "{log}");
    for r in &waiting {
        assert_eq!(condition(r)["reason"], "InsufficientResources", "{}", r.line());
        assert_eq!(condition(r)["status"], "False", "{}", r.line());
    }
    let waiting_message = condition(waiting[0])["message"].as_str().unwrap_or_default().to_string();

    // The scheduler binds the first gang.
    for i in 0..3 {
        fake.update("pods", "ml", &format!("first-{i}"), |p| {
            p["spec"]["nodeName"] = json!("gpu-1");
            p["status"]["phase"] = json!("Running");
        });
    }
    let bound = fake.requests().len();
    let requests =
        fake.wait_for("a Lease renewal after the binding", PATIENCE, |r| renewals(&r[bound..], "allot-0") >= 1).await;
    assert_eq!(
        gate_patches(&requests, "allot-0").len(),
        3,
        "the second gang went while the first runs:\n{}",
        dump(&requests)
    );

    // The first gang finishes and its pods are deleted: the second goes.
    for i in 0..3 {
        fake.delete("pods", "ml", &format!("first-{i}"));
    }
    let requests =
        fake.wait_for("the second gang's release", PATIENCE, |r| gate_patches(r, "allot-0").len() >= 6).await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let second: Vec<&Request> = gate_patches(&requests, "allot-0").into_iter().skip(3).collect();
    assert_eq!(names(&second), ["second-0", "second-1", "second-2"], "{log}");
    for r in &second {
        assert_release_patch(r, 0);
    }
    assert!(!waiting_message.is_empty());
}

/// Leader loss in the middle of a release: the first leader lifts one member's gate, the other
/// member's patch fails, and another replica takes the Lease. Once the old leader has seen the
/// loss (at its next renewal) it writes nothing, even on a new event; the new leader finishes
/// the gang from the API alone (the released annotation), patching only the member still gated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_half_released_by_a_lost_leader_is_finished_by_the_next_without_double_patches() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    let created = now();
    fake.add((0..2).map(|i| member("ml", "train", 2, i, &created)));
    // The old leader's patches of train-1 fail (an API server in trouble), every time.
    fake.fail(usize::MAX, 500, |r| {
        r.client == "allot-0" && r.call.verb == "patch" && r.call.resource == "pods" && pod_name(r) == "train-1"
    });
    let (old, old_metrics) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    fake.wait_for("the half release", PATIENCE, |r| {
        let patches = gate_patches(r, "allot-0");
        patches.iter().any(|p| p.status == 200) && patches.iter().any(|p| p.status == 500)
    })
    .await;
    let train0 = fake.get("pods", "ml", "train-0").unwrap();
    assert!(gates(&train0).is_empty());
    let released_at = train0["metadata"]["annotations"]["allot.dev/gang-released"].clone();
    assert!(released_at.is_string(), "{train0}");
    assert_eq!(gates(&fake.get("pods", "ml", "train-1").unwrap()), ["allot.dev/gang"]);

    // Another replica takes the Lease; the old leader sees it at its next renewal.
    fake.take_lease(LEASE_NAMESPACE, LEASE, "allot-1");
    let taken = std::time::Instant::now();
    let deadline = taken + PATIENCE;
    while old_metrics.leader.get() != 0 {
        assert!(std::time::Instant::now() < deadline, "the old leader never saw the loss:\n{}", dump(&fake.requests()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost = std::time::Instant::now();
    // An event the old leader would act on if it still led.
    fake.update("pods", "ml", "train-1", |p| p["metadata"]["labels"]["touched"] = json!("yes"));
    let (new, _) = start(&fake, "allot-1", Duration::from_secs(3600), "");
    let seen = fake.requests().len();
    let requests = fake
        .wait_for("the new leader's release of train-1 and a renewal after it", PATIENCE, |r| {
            gate_patches(r, "allot-1").iter().any(|p| p.status == 200) && renewals(&r[seen..], "allot-1") >= 1
        })
        .await;
    let holder = fake.lease_holder(LEASE_NAMESPACE, LEASE);
    old.shutdown(Duration::from_secs(5)).await;
    new.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);

    let new_patches = gate_patches(&requests, "allot-1");
    assert_eq!(names(&new_patches), ["train-1"], "the new leader patches only the member still gated:\n{log}");
    assert_release_patch(new_patches[0], 0);
    assert!(gates(&fake.get("pods", "ml", "train-1").unwrap()).is_empty());
    assert_eq!(
        fake.get("pods", "ml", "train-0").unwrap()["metadata"]["annotations"]["allot.dev/gang-released"],
        released_at
    );
    // Pinned (a defect, reported): the old leader explained train-1 as released although its
    // patch failed — the explanation is planned with the release, not after its outcome.
    let misleading: Vec<&Request> = condition_patches(&requests, "allot-0")
        .into_iter()
        .filter(|r| pod_name(r) == "train-1" && condition(r)["reason"] == "Released")
        .collect();
    assert!(!misleading.is_empty(), "{log}");
    // The new leader's explanation (the released member counts as present, the bar is
    // lowered) is the one train-1 carries already: the new leader starts from the pods, not from
    // an empty memory, and writes no condition.
    assert!(condition_patches(&requests, "allot-1").is_empty(), "{log}");
    let carried = &fake.get("pods", "ml", "train-1").unwrap()["status"]["conditions"][0];
    assert_eq!(carried["message"], "1/1 members present; the whole gang fits, releasing", "{log}");
    let after_loss: Vec<Request> = writes(&requests, "allot-0").into_iter().filter(|r| r.at > lost).cloned().collect();
    assert!(after_loss.is_empty(), "the old leader wrote after seeing the loss:\n{}", dump(&after_loss));
    // Its renewal after the takeover did not take the Lease back (a renewTime-only patch).
    assert_eq!(holder.as_deref(), Some("allot-1"));
    let old_lease_writes: Vec<&Request> =
        requests.iter().filter(|r| is(r, "allot-0", "patch", "leases") && r.at > taken).collect();
    assert!(!old_lease_writes.is_empty(), "{log}");
    assert!(old_lease_writes.iter().all(|r| r.body["spec"].get("holderIdentity").is_none()), "{log}");
}

/// Gated pods that do not fit and nothing happening: with a long resync the controller writes
/// its explanation once and nothing after (the echoes of its own writes change nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_written_when_nothing_changes() {
    let fake = world(&["ml"], &[("gpu-1", 2)]);
    fake.add((0..3).map(|i| member("ml", "big", 3, i, &now())));
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    let requests = fake.wait_for("two Lease renewals", PATIENCE * 2, |r| renewals(r, "allot-0") >= 2).await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let conditions = condition_patches(&requests, "allot-0");
    assert_eq!(names(&conditions), ["big-0", "big-1", "big-2"], "{log}");
    for r in &conditions {
        assert_eq!(condition(r)["reason"], "InsufficientResources");
    }
    assert_eq!(writes(&requests, "allot-0").len(), 6, "{log}");
}

/// The same with a 1 s resync: the resync re-decides (its passes are counted) but writes
/// nothing, because every member already carries its explanation. Before issue 12 each resync
/// rewrote every waiting member's condition and Event: 10,000 gated pods and a 30 s resync were
/// 333 writes/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_rewrites_nothing_the_pods_already_say() {
    let fake = world(&["ml"], &[("gpu-1", 2)]);
    fake.add((0..3).map(|i| member("ml", "big", 3, i, &now())));
    let resync = Duration::from_secs(1);
    let (handle, metrics) = start(&fake, "allot-0", resync, "");
    let deadline = std::time::Instant::now() + PATIENCE;
    // The witness that resyncs ran: at least four passes (the first, then resyncs).
    while metrics.passes.get() < 4 {
        assert!(std::time::Instant::now() < deadline, "no resync passes:\n{}", dump(&fake.requests()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let requests = fake.requests();
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let conditions = condition_patches(&requests, "allot-0");
    assert_eq!(names(&conditions), ["big-0", "big-1", "big-2"], "{log}");
    let events = event_writes(&requests, "allot-0");
    assert_eq!(events.len(), 3, "{log}");
    assert_eq!(writes(&requests, "allot-0").len(), 6, "{log}");
}

/// A new leader starts from the pods: members that already carry their explanation (written
/// by the previous leader) get no condition patch and no Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_does_not_rewrite_what_the_pods_say() {
    let fake = world(&["ml"], &[("gpu-1", 2)]);
    let message = "3/3 members present; needs 3 nvidia.com/gpu on any node, 2 free";
    fake.add((0..3).map(|i| {
        let mut pod = member("ml", "big", 3, i, &now());
        pod["status"]["conditions"] = json!([{"type": "allot.dev/GangReady", "status": "False",
            "reason": "InsufficientResources", "message": message}]);
        pod
    }));
    let (handle, metrics) = start(&fake, "allot-0", Duration::from_secs(1), "");
    let deadline = std::time::Instant::now() + PATIENCE;
    while metrics.passes.get() < 3 {
        assert!(std::time::Instant::now() < deadline, "no passes:\n{}", dump(&fake.requests()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let requests = fake.requests();
    handle.shutdown(Duration::from_secs(5)).await;
    assert!(writes(&requests, "allot-0").is_empty(), "{}", dump(&requests));
}

/// Handover on SIGTERM: the leader gives the Lease up and the follower, which reads the Lease
/// twice a second, leads within about a second (kube-lease-manager's follower slept until the
/// old Lease's expiry: ~14 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_over_within_seconds() {
    let fake = world(&["ml"], &[("gpu-1", 2)]);
    let (first, first_metrics) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    let deadline = std::time::Instant::now() + PATIENCE;
    while first_metrics.leader.get() != 1 {
        assert!(std::time::Instant::now() < deadline, "no leader:\n{}", dump(&fake.requests()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (second, second_metrics) = start(&fake, "allot-1", Duration::from_secs(3600), "");
    fake.wait_for("the follower to read the Lease", PATIENCE, |r| is_lease_read(r, "allot-1")).await;
    assert_eq!(second_metrics.leader.get(), 0);
    let stopped = std::time::Instant::now();
    first.shutdown(Duration::from_secs(5)).await;
    assert_eq!(fake.lease_holder(LEASE_NAMESPACE, LEASE), None, "the leader gave the Lease up");
    while second_metrics.leader.get() != 1 {
        assert!(stopped.elapsed() < Duration::from_secs(5), "no takeover:\n{}", dump(&fake.requests()));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let handover = stopped.elapsed();
    eprintln!("handover after the leader's shutdown: {handover:?}");
    assert_eq!(fake.lease_holder(LEASE_NAMESPACE, LEASE).as_deref(), Some("allot-1"));
    second.shutdown(Duration::from_secs(5)).await;
}

fn is_lease_read(requests: &[Request], client: &str) -> bool {
    requests.iter().any(|r| is(r, client, "get", "leases"))
}

const QUEUE_TEAM: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: queue}\nspec:\n  namespaces: {names: [ml]}\n  quota: {mode: Queue, limits: {nvidia.com/gpu: 4}}\n";

/// A gang queued behind its team's quota, its gates in the order `order`: the quota gate is
/// lifted first (test + remove at its index), then the gang gate at the index it has *then*.
/// The watch is slow (events held until both kinds of patch were tried), so the controller
/// works from what it knows itself, not from the echo of its own patches.
async fn quota_then_gang(order: [&str; 2]) -> Vec<Request> {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    let created = now();
    fake.add((0..2).map(|i| {
        let mut pod = member("ml", "train", 2, i, &created);
        pod["spec"]["schedulingGates"] = json!([{"name": order[0]}, {"name": order[1]}]);
        pod
    }));
    fake.hold_watches();
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), QUEUE_TEAM);
    fake.wait_for("both kinds of patch tried on both members", PATIENCE, |r| {
        let patches = gate_patches(r, "allot-0");
        // Each lift tests the pod's uid first, then the gate's name.
        let tried = |gate: &str| patches.iter().filter(|p| p.body[1]["value"] == gate).count() >= 2;
        tried("allot.dev/quota") && tried("allot.dev/gang")
    })
    .await;
    fake.release_watches();
    let requests = fake
        .wait_for("both gates lifted on both members", PATIENCE, |r| {
            gate_patches(r, "allot-0").iter().filter(|p| p.status == 200).count() >= 4
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    for i in 0..2 {
        assert!(gates(&fake.get("pods", "ml", &format!("train-{i}")).unwrap()).is_empty());
    }
    requests
}

/// A lift of `gate` at `index` from the pod the pass saw: its uid tested first.
fn assert_lift(r: &Request, gate: &str, index: usize) {
    assert_eq!(r.status, 200, "{}", r.line());
    let uid = format!("uid-{}-{}", r.call.namespace.as_deref().unwrap_or_default(), pod_name(r));
    assert_eq!(r.body[0], json!({"op": "test", "path": "/metadata/uid", "value": uid}));
    assert_eq!(r.body[1], json!({"op": "test", "path": format!("/spec/schedulingGates/{index}/name"), "value": gate}));
    assert_eq!(r.body[2], json!({"op": "remove", "path": format!("/spec/schedulingGates/{index}")}));
}

/// The webhook's order (gang gate first): quota gate at 1, then the gang gate at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_gang_is_released_from_the_quota_gate_then_the_gang_gate() {
    let requests = quota_then_gang(["allot.dev/gang", "allot.dev/quota"]).await;
    let log = dump(&requests);
    let patches = gate_patches(&requests, "allot-0");
    assert_eq!(patches.len(), 4, "{log}");
    for r in &patches[..2] {
        assert_lift(r, "allot.dev/quota", 1);
        // …and says when: its gang's order and starvation clock start no earlier.
        assert_eq!(r.body.as_array().map(Vec::len), Some(4), "{}", r.line());
        assert_eq!(
            (r.body[3]["op"].as_str(), r.body[3]["path"].as_str()),
            (Some("add"), Some("/metadata/annotations/allot.dev~1quota-released")),
            "{}",
            r.line()
        );
        let at = r.body[3]["value"].as_str().unwrap_or_default();
        assert!(at.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{}", r.line());
    }
    for r in &patches[2..] {
        assert_release_patch(r, 0);
    }
}

/// The other order (quota gate first, as a pod created with both gates may have them): after
/// the quota gate at 0 is lifted the gang gate is at 0, and its patch says so the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_gate_behind_the_quota_gate_is_lifted_at_its_new_index() {
    let requests = quota_then_gang(["allot.dev/quota", "allot.dev/gang"]).await;
    let log = dump(&requests);
    let patches = gate_patches(&requests, "allot-0");
    assert_eq!(patches.len(), 4, "no failed patch:\n{log}");
    for r in &patches[..2] {
        assert_lift(r, "allot.dev/quota", 0);
    }
    for r in &patches[2..] {
        assert_release_patch(r, 0);
    }
}

/// `writes` (of one kind, to one pod) were one refusal, then one try after the retry backoff:
/// about a second later, not at once in a loop, not at the next resync.
fn assert_one_retry_after_the_backoff(writes: &[&Request], log: &str) {
    let statuses: Vec<u16> = writes.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [500, 200], "one refusal, then one try after the backoff:\n{log}");
    let waited = writes[1].at.duration_since(writes[0].at);
    assert!(waited >= Duration::from_millis(900), "tried again after {waited:?}, before the backoff:\n{log}");
    assert!(waited < Duration::from_secs(10), "tried again only after {waited:?}:\n{log}");
}

/// Fails every write to pod `name` (gate patches, conditions, stamps) until the returned flag
/// is set: an API server in trouble for a moment, whose refusals leave no watch event behind.
fn refuse_writes_to(fake: &FakeApi, name: &'static str) -> Arc<std::sync::atomic::AtomicBool> {
    let recovered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = recovered.clone();
    fake.fail(usize::MAX, 500, move |r| {
        !flag.load(std::sync::atomic::Ordering::SeqCst)
            && r.is_write()
            && r.call.resource.starts_with("pods")
            && pod_name(r) == name
    });
    recovered
}

/// The API server refuses the gate lift of a fitting gang's only member, then recovers; nothing
/// else happens in the cluster (the member already carries the explanation the pass plans, so
/// no condition is written whose echo would wake the loop). The controller tries again after a
/// backoff of about a second — not at once in a loop, not at the next resync (an hour here):
/// before, a refused lift left the member gated until some unrelated event or the resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_gate_lift_is_tried_again_after_a_backoff() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    let mut solo = member("ml", "solo", 1, 0, &now());
    let message = "1/1 members present; the whole gang fits, releasing";
    solo["status"]["conditions"] =
        json!([{"type": "allot.dev/GangReady", "status": "True", "reason": "Released", "message": message}]);
    fake.add([solo]);
    let recovered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = recovered.clone();
    fake.fail(usize::MAX, 500, move |r| {
        !flag.load(std::sync::atomic::Ordering::SeqCst)
            && r.content_type == "application/json-patch+json"
            && pod_name(r) == "solo-0"
    });
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    fake.wait_for("the refused lift", PATIENCE, |r| gate_patches(r, "allot-0").iter().any(|p| p.status == 500)).await;
    recovered.store(true, std::sync::atomic::Ordering::SeqCst);
    let requests = fake
        .wait_for("the lift tried again", PATIENCE, |r| gate_patches(r, "allot-0").iter().any(|p| p.status == 200))
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    assert_one_retry_after_the_backoff(&gate_patches(&requests, "allot-0"), &log);
    assert!(gates(&fake.get("pods", "ml", "solo-0").unwrap()).is_empty());
    assert!(condition_patches(&requests, "allot-0").is_empty(), "the pod already said it:\n{log}");
}

/// The same for an explanation alone: a gang member waiting for its peers is told so; the API
/// server refuses the condition once. No other write or event follows, yet the condition is
/// written after the backoff (before, at the next resync).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_condition_is_written_after_a_backoff() {
    let fake = world(&["ml"], &[("gpu-1", 8)]);
    fake.add([member("ml", "pair", 2, 0, &now())]);
    let recovered = refuse_writes_to(&fake, "pair-0");
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), "");
    fake.wait_for("the refused condition", PATIENCE, |r| {
        condition_patches(r, "allot-0").iter().any(|p| p.status == 500)
    })
    .await;
    recovered.store(true, std::sync::atomic::Ordering::SeqCst);
    let requests = fake
        .wait_for("the condition written", PATIENCE, |r| {
            condition_patches(r, "allot-0").iter().any(|p| p.status == 200) && event_writes(r, "allot-0").len() == 1
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    let conditions = condition_patches(&requests, "allot-0");
    assert_one_retry_after_the_backoff(&conditions, &log);
    assert_eq!(condition(conditions[1])["reason"], "WaitingForMembers", "{log}");
}

/// Gang inference for JobSets: a JobSet's pods form a gang sized from the JobSet.
const INFER_JOBSET: &str =
    "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: infer}\nspec:\n  infer: [JobSet]\n";

/// A tenant's bare pod, gated, labelled as a pod of JobSet `r{index}` — which does not exist:
/// the label alone names the owner its gang is sized from.
fn pod_naming_a_jobset(index: u32) -> Value {
    gated_pod(
        "ml",
        &format!("bare-{index}"),
        "allot.dev/gang",
        &now(),
        json!({"jobset.sigs.k8s.io/jobset-name": format!("r{index}")}),
        json!({}),
        None,
    )
}

/// The owner lookups (GETs of JobSets) `client` made, by JobSet name.
fn owner_lookups<'a>(requests: &'a [Request], client: &str) -> Vec<&'a str> {
    requests.iter().filter(|r| is(r, client, "get", "jobsets")).map(pod_name).collect()
}

/// A tenant's 100 bare pods, each naming a JobSet that does not exist: a pass asks for at most
/// `LOOKUPS_PER_PASS` owners, the passes after it ask for the others, and once each was found
/// missing a pass asks for none (before, every pass asked for all 100, one after the other,
/// before any decision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_reads_few_owners_and_none_found_missing_before_a_backoff() {
    use allot::control::gang::owners::{LOOKUPS_PER_PASS, resolve_owner_sizes};
    let fake = world(&["ml"], &[]);
    let p = policies(INFER_JOBSET);
    let state = allot::control::cluster::ClusterState::default();
    state.replace_pods(
        (0..100)
            .map(|i| {
                let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod_naming_a_jobset(i)).unwrap();
                allot::control::cluster::PodRecord::from_pod(&pod, &p, &allot::model::namespaces::NoNamespaces)
                    .expect("a record")
            })
            .collect(),
    );
    let client = fake.client("allot-0");
    let lookups = || owner_lookups(&fake.requests(), "allot-0").len();

    assert!(resolve_owner_sizes(&client, &state, std::time::Instant::now()).await, "owners are left");
    assert_eq!(lookups(), LOOKUPS_PER_PASS, "{}", dump(&fake.requests()));
    let mut passes = 1;
    let mut left = true;
    while left {
        let before = lookups();
        left = resolve_owner_sizes(&client, &state, std::time::Instant::now()).await;
        assert!(lookups() - before <= LOOKUPS_PER_PASS);
        passes += 1;
        assert!(passes <= 100 / LOOKUPS_PER_PASS + 1, "{passes} passes");
    }
    let requests = fake.requests();
    let mut asked = owner_lookups(&requests, "allot-0");
    asked.sort();
    asked.dedup();
    assert_eq!((asked.len(), lookups()), (100, 100), "each owner once:\n{}", dump(&requests));

    // A pass right after: nothing is due.
    assert!(!resolve_owner_sizes(&client, &state, std::time::Instant::now()).await);
    assert_eq!(lookups(), 100);
}

/// The same through the controller: the 100 owners are each asked for once (then they wait out
/// their backoff), a gang of another tenant that fits is released meanwhile, and no pass asks
/// again through a Lease renewal. Before, every pass (one after each burst of watch events, the
/// echoes of the explanations it wrote on the 100 pods among them) asked for all 100 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_found_missing_are_asked_for_once_through_the_controller() {
    let fake = world(&["ml", "other"], &[("gpu-1", 8)]);
    fake.add((0..100).map(pod_naming_a_jobset));
    let created = now();
    fake.add((0..2).map(|i| member("other", "train", 2, i, &created)));
    let (handle, _) = start(&fake, "allot-0", Duration::from_secs(3600), INFER_JOBSET);
    let requests = fake
        .wait_for("every owner asked for, the other gang released, a Lease renewal after", PATIENCE * 2, |r| {
            let Some(last) =
                r.iter().enumerate().filter(|(_, r)| is(r, "allot-0", "get", "jobsets")).nth(99).map(|(i, _)| i)
            else {
                return false;
            };
            gate_patches(r, "allot-0").len() >= 2 && renewals(&r[last..], "allot-0") >= 1
        })
        .await;
    handle.shutdown(Duration::from_secs(5)).await;
    let log = dump(&requests);
    assert_eq!(names(&gate_patches(&requests, "allot-0")), ["train-0", "train-1"], "{log}");
    let mut asked = owner_lookups(&requests, "allot-0");
    let total = asked.len();
    asked.sort();
    asked.dedup();
    assert_eq!((asked.len(), total), (100, 100), "each owner once:\n{log}");
}
