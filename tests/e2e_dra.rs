//! DRA claim accounting end to end on a real control plane (skipped without the envtest
//! binaries): the API server serves `resource.k8s.io/v1`; a tenant (alice, impersonated, with a
//! namespaced Role on pods and claims only) whose team has a deny-mode quota of 4 GPUs gets her
//! claim-based GPU pods placed (the shipped GPU toleration) and counted: the 5th GPU is denied
//! with the numbers, and hostile claims do not dodge the count (`allocationMode: All`, a
//! firstAvailable with a huge option, a shared claim, a claim in another namespace, a template
//! that does not exist).

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use support::cluster::{Assets, Cluster};

const TENANT: &str = "alice";
const NS: &str = "dra-team";
const OTHER_NS: &str = "dra-other";

const TEAM: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: dra-team}
spec:
  namespaces: {names: [dra-team]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}
"#;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn template(name: &str, requests: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests}}}
    }))
    .unwrap()
}

fn claim(name: &str, requests: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": requests}}
    }))
    .unwrap()
}

fn gpus(count: u32) -> Value {
    json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": count}}])
}

/// A pod whose GPUs all come from `claims` (pod-level `resourceClaims` entries).
fn claim_pod(name: &str, claims: Value) -> Pod {
    let names: Vec<Value> =
        claims.as_array().into_iter().flatten().map(|c| json!({"name": c["name"].clone()})).collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": claims,
            "containers": [{"name": "w", "image": "busybox:1.36", "resources": {"claims": names}}]
        }
    }))
    .unwrap()
}

fn from_template(template: &str) -> Value {
    json!([{"name": "gpus", "resourceClaimTemplateName": template}])
}

/// The admin's kubeconfig, impersonating alice (`kubectl --as=alice`).
async fn alice_client(cluster: &Cluster) -> kube::Client {
    support::cluster::impersonating(&cluster.dir.path().join("kubeconfig"), TENANT).await
}

/// The namespace, alice's Role (pods, claims and claim templates) and the default
/// ServiceAccount pods need.
async fn prepare_namespace(admin: &kube::Client, ns: &str) {
    let rules = json!([
        {"apiGroups": [""], "verbs": ["*"], "resources": ["pods"]},
        {"apiGroups": ["resource.k8s.io"], "verbs": ["*"], "resources": ["resourceclaims", "resourceclaimtemplates"]}
    ]);
    support::cluster::tenant_namespace(admin, ns, TENANT, rules).await;
}

/// Creates `pod`, retrying while Allot's claim watch has not seen its claims yet; the final
/// answer (admitted pod or the refusal's message).
async fn create_when_claims_known(pods: &Api<Pod>, pod: &Pod) -> Result<Pod, String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Ok(p) => return Ok(p),
            Err(e) => {
                let message = e.to_string();
                if !message.contains("does not exist") || std::time::Instant::now() > deadline {
                    return Err(message);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_gpus_are_placed_and_counted_on_a_real_control_plane() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("claim_gpus_are_placed_and_counted_on_a_real_control_plane") else { return };
    let mut cluster = Cluster::start_with(&assets, &[("dra-team.yaml", TEAM)]).await;
    let admin = cluster.client.clone();

    // DRA is on by default in 1.36: the API server serves resource.k8s.io/v1.
    let groups = admin.list_api_group_resources("resource.k8s.io/v1").await.expect("resource.k8s.io/v1 is served");
    let served: Vec<&str> = groups.resources.iter().map(|r| r.name.as_str()).collect();
    assert!(served.contains(&"resourceclaims") && served.contains(&"resourceclaimtemplates"), "{served:?}");

    prepare_namespace(&admin, NS).await;
    prepare_namespace(&admin, OTHER_NS).await;
    let alice = alice_client(&cluster).await;
    let templates: Api<DynamicObject> =
        Api::namespaced_with(alice.clone(), NS, &resource("ResourceClaimTemplate", "resourceclaimtemplates"));
    let claims: Api<DynamicObject> =
        Api::namespaced_with(alice.clone(), NS, &resource("ResourceClaim", "resourceclaims"));
    let pp = PostParams::default();
    templates.create(&pp, &template("one-gpu", gpus(1))).await.expect("template one-gpu");
    templates
        .create(
            &pp,
            &template(
                "all-gpus",
                json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]),
            ),
        )
        .await
        .expect("template all-gpus");
    templates
        .create(
            &pp,
            &template(
                "small-or-huge",
                json!([{"name": "gpus", "firstAvailable": [
                    {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1},
                    {"name": "huge", "deviceClassName": "gpu.nvidia.com", "count": 6}
                ]}]),
            ),
        )
        .await
        .expect("template small-or-huge");
    claims.create(&pp, &claim("shared-two", gpus(2))).await.expect("shared claim");
    Api::<DynamicObject>::namespaced_with(
        alice.clone(),
        OTHER_NS,
        &resource("ResourceClaimTemplate", "resourceclaimtemplates"),
    )
    .create(&pp, &template("elsewhere", gpus(1)))
    .await
    .expect("template in another namespace");

    let pods: Api<Pod> = Api::namespaced(alice.clone(), NS);
    let create = |name: &str, claims: Value| {
        let pods = pods.clone();
        let pod = claim_pod(name, claims);
        async move { pods.create(&PostParams::default(), &pod).await.map_err(|e| e.to_string()) }
    };

    // Two pods of one GPU each from a template, placed like any GPU pod (the first waits for
    // Allot's claim watch to have the templates).
    for i in 0..2 {
        let pod = create_when_claims_known(&pods, &claim_pod(&format!("one-{i}"), from_template("one-gpu")))
            .await
            .unwrap_or_else(|e| panic!("one-{i} within quota: {e}"));
        let tolerations = pod.spec.and_then(|s| s.tolerations).unwrap_or_default();
        assert!(
            tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some("nvidia.com/gpu") && t.effect.as_deref() == Some("NoSchedule")),
            "the shipped nvidia-gpu placement: {tolerations:?}"
        );
    }

    // A claim template in another namespace is not hers to use here, and not free either.
    let err = create("borrowed", from_template("elsewhere")).await.expect_err("a template of another namespace");
    assert!(err.contains("references ResourceClaimTemplate \"elsewhere\""), "{err}");

    // allocationMode All counts 32 devices: over the shipped per-pod maximum of 8.
    let err = create("all", from_template("all-gpus")).await.expect_err("All");
    assert!(err.contains("pod asks 32 nvidia.com/gpu in all"), "{err}");

    // firstAvailable counts its largest option (6): more than the 2 the team has left.
    let err = create("huge", from_template("small-or-huge")).await.expect_err("huge");
    assert!(err.contains("team dra-team uses 2 of 4 nvidia.com/gpu") && err.contains("this pod asks 6"), "{err}");

    // The shared claim of 2, named twice by one pod, is charged once: 2 + 2 = 4.
    create(
        "shared-user",
        json!([{"name": "a", "resourceClaimName": "shared-two"}, {"name": "b", "resourceClaimName": "shared-two"}]),
    )
    .await
    .expect("the shared claim counted once: 4 of 4");
    // Another pod sharing that claim takes no further GPU: a shared claim is charged once per
    // claim, not once per pod (before: 6 of 4, refused).
    create("shared-user-2", json!([{"name": "gpus", "resourceClaimName": "shared-two"}]))
        .await
        .expect("a second pod of the shared claim: still 4 of 4");

    // The 5th GPU is denied with the numbers.
    let err = create("fifth", from_template("one-gpu")).await.expect_err("the 5th claim GPU");
    assert!(err.contains("team dra-team uses 4 of 4 nvidia.com/gpu") && err.contains("this pod asks 1"), "{err}");

    // A claim alice annotates as the scheduler's extended-resource claim (the API server lets
    // her) is hers all the same: counted by its devices. Before, the annotation alone made its
    // 8 GPUs free.
    let mut forged = claim("free", gpus(8));
    forged.metadata.annotations =
        Some([("resource.kubernetes.io/extended-resource-claim".to_string(), "true".to_string())].into());
    claims.create(&pp, &forged).await.expect("alice annotates her own claim");
    let err =
        create_when_claims_known(&pods, &claim_pod("forged", json!([{"name": "gpus", "resourceClaimName": "free"}])))
            .await
            .expect_err("a claim with a forged extended-resource annotation");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu") && err.contains("this pod asks 8"), "{err}");

    // A template that does not exist is denied by name, never free.
    let err = create("ghost", from_template("no-such-template")).await.expect_err("a missing template");
    assert!(err.contains("references ResourceClaimTemplate \"no-such-template\""), "{err}");

    // The usage survives the pods' arrival in Allot's Pod watch (the watch counts claim devices
    // as admission did): after a while, still denied.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let err = create("sixth", from_template("one-gpu")).await.expect_err("still over once the watch has the pods");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu"), "{err}");

    // Alice deletes the template her running pods were made from and touches the pods (any
    // update re-records them): their claim devices stay charged, so she gains no room.
    templates.delete("one-gpu", &Default::default()).await.expect("alice deletes her template");
    for name in ["one-0", "one-1"] {
        let touch = json!({"metadata": {"labels": {"touched": "yes"}}});
        pods.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(touch))
            .await
            .unwrap_or_else(|e| panic!("alice relabels {name}: {e}"));
    }
    templates.create(&pp, &template("one-more", gpus(1))).await.expect("template one-more");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let err = create_when_claims_known(&pods, &claim_pod("after-delete", from_template("one-more")))
        .await
        .expect_err("deleting a template frees nothing");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu"), "{err}");

    // Allot restarts (an upgrade, an eviction) after the template is gone: it never saw the
    // template, so it counts those pods from the claims Kubernetes made from it (named in their
    // status, controlled by them). Before, they counted nothing and the team had 2 GPUs free.
    for name in ["one-0", "one-1"] {
        let made = pods
            .get(name)
            .await
            .ok()
            .and_then(|p| p.status)
            .and_then(|s| s.resource_claim_statuses)
            .is_some_and(|s| s.iter().any(|c| c.resource_claim_name.is_some()));
        assert!(made, "{name}: the resourceclaim controller named its claim");
    }
    cluster.stop_allot();
    cluster.start_allot();
    // The new leader recounts the team's ledger from its own watch (within a second or two):
    // what it counts now is what decides.
    support::cluster::wait_for("the restarted replica to lead", Duration::from_secs(30), || async {
        support::cluster::metric(&cluster.allot_metrics, "allot_gang_controller_leader") == Some(1.0)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let err = create_when_claims_known(&pods, &claim_pod("after-restart", from_template("one-more")))
        .await
        .expect_err("a restart after the template's deletion frees nothing");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu"), "{err}");

    // Alice deletes the shared claim (no pod has it reserved: they are not scheduled) and makes
    // a larger one under the same name, for the pods admitted with the small one to run with:
    // refused while they live.
    claims.delete("shared-two", &Default::default()).await.expect("alice deletes the shared claim");
    // (The old claim may still be going: its finalizer answers "already exists" meanwhile.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match claims.create(&pp, &claim("shared-two", gpus(8))).await {
            Err(e) if e.to_string().contains("already exists") => {
                assert!(std::time::Instant::now() < deadline, "the old claim was never gone: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => break e.to_string(),
            Ok(_) => panic!("a larger claim under the name admitted pods name was accepted"),
        }
    };
    assert!(
        refused.contains("accelerators/claims")
            && refused.contains("names ResourceClaim \"shared-two\" and was admitted with an earlier claim"),
        "{refused}"
    );

    // The shared claim stays charged while any pod names it: deleting one of its two pods
    // frees nothing; deleting the other frees its 2 GPUs (once, not 4).
    let now = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    pods.delete("shared-user", &now).await.expect("alice deletes one sharer");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let err = create("one-sharer-left", from_template("one-more")).await.expect_err("the other still holds the claim");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu"), "{err}");
    pods.delete("shared-user-2", &now).await.expect("alice deletes the last sharer");
    // The leader releases the claim at its next recount (about a second).
    let two = json!([{"name": "a", "resourceClaimTemplateName": "one-more"},
                     {"name": "b", "resourceClaimTemplateName": "one-more"}]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while let Err(e) = create("after-sharers", two.clone()).await {
        assert!(e.contains("uses 4 of 4 nvidia.com/gpu"), "{e}");
        assert!(std::time::Instant::now() < deadline, "the claim's 2 GPUs were never freed: {e}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let err = create("over-again", from_template("one-more")).await.expect_err("2 freed, not 4");
    assert!(err.contains("uses 4 of 4 nvidia.com/gpu"), "{err}");
}

const AMD_NS: &str = "dra-amd";

const AMD_TEAM: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: dra-amd}
spec:
  namespaces: {names: [dra-amd]}
  quota: {mode: Deny, limits: {amd.com/gpu: 2}}
"#;

/// Issue 15: a DeviceClass whose `extendedResourceName` is an accelerator (DRAExtendedResource,
/// beta and on in 1.36) counts as that accelerator with no mapping in the Cluster policy. The
/// class appears after a tenant's pod asked for two of its devices: until then they count
/// nothing; once Allot reads the class it recompiles its policies and makes its Pod records
/// anew, so the earlier pod's two AMD GPUs count and the team's quota of 2 refuses two more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_class_standing_for_an_accelerator_counts_without_a_mapping() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("a_device_class_standing_for_an_accelerator_counts_without_a_mapping") else {
        return;
    };
    let mut cluster = Cluster::start_with(&assets, &[("dra-amd.yaml", AMD_TEAM)]).await;
    let admin = cluster.client.clone();
    prepare_namespace(&admin, AMD_NS).await;
    let alice = alice_client(&cluster).await;
    let templates: Api<DynamicObject> =
        Api::namespaced_with(alice.clone(), AMD_NS, &resource("ResourceClaimTemplate", "resourceclaimtemplates"));
    let two_amd = json!([{"name": "gpus", "exactly": {"deviceClassName": "gpu.amd.com", "count": 2}}]);
    templates.create(&PostParams::default(), &template("two-amd", two_amd)).await.expect("template two-amd");
    let pods: Api<Pod> = Api::namespaced(alice.clone(), AMD_NS);

    // No such class yet: its devices count nothing (admitted, no AMD toleration).
    let early = create_when_claims_known(&pods, &claim_pod("early", from_template("two-amd")))
        .await
        .expect("an unknown class counts nothing");
    let tolerations = early.spec.and_then(|s| s.tolerations).unwrap_or_default();
    assert!(!tolerations.iter().any(|t| t.key.as_deref() == Some("amd.com/gpu")), "{tolerations:?}");

    // The admin installs AMD's DeviceClass, standing for amd.com/gpu.
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.amd.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.amd.com'"}}],
                 "extendedResourceName": "amd.com/gpu"}
    }))
    .unwrap();
    let created = Api::<DynamicObject>::all_with(admin.clone(), &resource("DeviceClass", "deviceclasses"))
        .create(&PostParams::default(), &class)
        .await
        .expect("DeviceClass gpu.amd.com");
    assert_eq!(
        created.data.pointer("/spec/extendedResourceName").and_then(Value::as_str),
        Some("amd.com/gpu"),
        "the API server kept extendedResourceName (DRAExtendedResource on)"
    );

    // Dry runs until Allot has read the class and recounted the early pod: two more AMD GPUs
    // are then over (2 of 2 used by the early pod), and the pod would get the AMD toleration.
    let dry = PostParams { dry_run: true, ..Default::default() };
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let refusal = loop {
        match pods.create(&dry, &claim_pod("late", from_template("two-amd"))).await {
            Err(e) => break e.to_string(),
            Ok(_) => {
                assert!(std::time::Instant::now() < deadline, "the class was never counted (late still admitted)");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    assert!(
        refusal.contains("team dra-amd uses 2 of 2 amd.com/gpu") && refusal.contains("this pod asks 2"),
        "{refusal}"
    );

    // Allot restarts with the class already there: it is read before the first Pod list (and
    // before deny-mode quota answers), not only when it changes.
    cluster.stop_allot();
    cluster.start_allot();
    support::cluster::wait_for("the restarted replica to lead", Duration::from_secs(30), || async {
        support::cluster::metric(&cluster.allot_metrics, "allot_gang_controller_leader") == Some(1.0)
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        match pods.create(&dry, &claim_pod("late", from_template("two-amd"))).await {
            Err(e) if e.to_string().contains("uses 2 of 2") => break e.to_string(),
            // Refused while Allot starts (quota fails closed until its caches are in).
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "no quota answer after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok(_) => panic!("after a restart the class counted nothing: the late pod was admitted"),
        }
    };
    assert!(refusal.contains("team dra-amd uses 2 of 2 amd.com/gpu"), "{refusal}");

    // The early pod goes: its 2 are freed (once the leader recounts), and a pod of the class is
    // placed on the AMD pool like one asking amd.com/gpu in its limits.
    let now = kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    pods.delete("early", &now).await.expect("alice deletes the early pod");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let admitted = loop {
        match pods.create(&dry, &claim_pod("late", from_template("two-amd"))).await {
            Ok(pod) => break pod,
            Err(e) => {
                assert!(e.to_string().contains("uses 2 of 2"), "{e}");
                assert!(std::time::Instant::now() < deadline, "the early pod's GPUs were never freed: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    };
    let tolerations = admitted.spec.and_then(|s| s.tolerations).unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("amd.com/gpu") && t.effect.as_deref() == Some("NoSchedule")),
        "the shipped amd-gpu placement: {tolerations:?}"
    );
}

const GANG_NS: &str = "dra-gang";

const GANG_TEAM: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: dra-gang}
spec:
  namespaces: {names: [dra-gang]}
"#;

/// Each member's `allot.dev/GangReady` message (empty when it has none) and whether it is
/// still behind Allot's gang gate.
async fn members(pods: &Api<Pod>, names: &[String]) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for name in names {
        let pod = pods.get(name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let gated = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == "allot.dev/gang"));
        let message = support::cluster::gang_condition(&pod).map(|(_, _, message)| message).unwrap_or_default();
        out.push((gated, message));
    }
    out
}

/// Waits until every member's state satisfies `done`, asserting at every look that the gang
/// is never released in part.
async fn watch_members(pods: &Api<Pod>, names: &[String], what: &str, done: impl Fn(&[(bool, String)]) -> bool) {
    watch(pods, names, what, done, true).await
}

/// Waits until the gang is released (every gate gone). The controller lifts each member's gate
/// with its own request, so a look in between sees some gated: not a partial release.
async fn wait_released(pods: &Api<Pod>, names: &[String]) {
    watch(pods, names, "the release", |m| m.iter().all(|(gated, _)| !*gated), false).await
}

async fn watch(pods: &Api<Pod>, names: &[String], what: &str, done: impl Fn(&[(bool, String)]) -> bool, whole: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    loop {
        let seen = members(pods, names).await;
        let gated = seen.iter().filter(|(g, _)| *g).count();
        assert!(!whole || gated == 0 || gated == names.len(), "a gang released in part: {seen:?}");
        if done(&seen) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A ResourceSlice of `devices` GPUs on `node`, as NVIDIA's DRA driver publishes them.
fn gpu_slice(node: &str, devices: usize) -> DynamicObject {
    let devices: Vec<Value> =
        (0..devices).map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}}})).collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}

/// A gang of 4 whose GPUs all come from claims, on the two fake GPU nodes: it waits whole while
/// the ResourceSlices offer fewer than 4 GPU devices of the DeviceClass (saying how many are
/// free), and is released whole once they offer 4 (issue 15). The tenant creates the pods; the
/// capacity comes from cluster-scoped slices she cannot write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_gang_waits_whole_until_the_resource_slices_offer_its_gpus() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("a_dra_gang_waits_whole_until_the_resource_slices_offer_its_gpus") else {
        return;
    };
    let cluster = Cluster::start_with(&assets, &[("dra-gang.yaml", GANG_TEAM)]).await;
    let admin = cluster.client.clone();
    let pp = PostParams::default();
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}
    }))
    .unwrap();
    Api::<DynamicObject>::all_with(admin.clone(), &resource("DeviceClass", "deviceclasses"))
        .create(&pp, &class)
        .await
        .expect("DeviceClass gpu.nvidia.com");
    let slices = Api::<DynamicObject>::all_with(admin.clone(), &resource("ResourceSlice", "resourceslices"));

    prepare_namespace(&admin, GANG_NS).await;
    let alice = alice_client(&cluster).await;
    Api::<DynamicObject>::namespaced_with(
        alice.clone(),
        GANG_NS,
        &resource("ResourceClaimTemplate", "resourceclaimtemplates"),
    )
    .create(&pp, &template("one-gpu", gpus(1)))
    .await
    .expect("template one-gpu");
    // A tenant cannot publish capacity for her own gang.
    let forged = Api::<DynamicObject>::all_with(alice.clone(), &resource("ResourceSlice", "resourceslices"))
        .create(&pp, &gpu_slice("gpu-node-1", 8))
        .await
        .expect_err("alice may not write ResourceSlices");
    assert!(forged.to_string().contains("forbidden"), "{forged}");
    // Nor widen a class's selectors so that it takes devices it should not.
    let mut wide = class.clone();
    wide.metadata.name = Some("anything-goes".into());
    let forged = Api::<DynamicObject>::all_with(alice.clone(), &resource("DeviceClass", "deviceclasses"))
        .create(&pp, &wide)
        .await
        .expect_err("alice may not write DeviceClasses");
    assert!(forged.to_string().contains("forbidden"), "{forged}");

    let pods: Api<Pod> = Api::namespaced(alice.clone(), GANG_NS);
    let names: Vec<String> = (0..4).map(|i| format!("train-{i}")).collect();
    for name in &names {
        let mut pod = claim_pod(name, from_template("one-gpu"));
        pod.metadata.labels = Some([("allot.dev/gang-name".to_string(), "train".to_string())].into());
        pod.metadata.annotations = Some([("allot.dev/gang-size".to_string(), "4".to_string())].into());
        let created = create_when_claims_known(&pods, &pod).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let gates = created.spec.and_then(|s| s.scheduling_gates).unwrap_or_default();
        assert!(gates.iter().any(|g| g.name == "allot.dev/gang"), "{name} is gated: {gates:?}");
    }

    // No slice yet: the nodes offer no GPU device (their device-plugin GPUs are another
    // resource), so the gang waits, and says so.
    watch_members(&pods, &names, "the explanation with 0 free", |m| {
        m.iter()
            .all(|(gated, msg)| *gated && msg.contains("needs 4 gpu.nvidia.com devices") && msg.ends_with(", 0 free"))
    })
    .await;

    // 2 GPUs on one node: still waiting, whole.
    slices.create(&pp, &gpu_slice("gpu-node-1", 2)).await.expect("slice on gpu-node-1");
    watch_members(&pods, &names, "the explanation with 2 free", |m| {
        m.iter()
            .all(|(gated, msg)| *gated && msg.contains("needs 4 gpu.nvidia.com devices") && msg.ends_with(", 2 free"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(members(&pods, &names).await.iter().all(|(gated, _)| *gated), "2 devices do not hold 4 members");
    // `allot explain` reads the slices as the controller does, and agrees.
    let explained = std::process::Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["explain", "gang", "train", "-n", GANG_NS, "--policies"])
        .arg(cluster.dir.path().join("policies"))
        .env("KUBECONFIG", cluster.dir.path().join("kubeconfig"))
        .env("RUST_LOG", "error")
        .output()
        .expect("allot explain");
    let text = String::from_utf8_lossy(&explained.stdout);
    assert!(
        explained.status.success() && text.contains("needs 4 gpu.nvidia.com devices") && text.contains(", 2 free"),
        "{explained:?}"
    );

    // 2 more on the other node: released, all 4 together.
    let asked = std::time::Instant::now();
    slices.create(&pp, &gpu_slice("gpu-node-2", 2)).await.expect("slice on gpu-node-2");
    wait_released(&pods, &names).await;
    eprintln!("released whole {:?} after the second slice", asked.elapsed());
}

/// The two slices NVIDIA's driver publishes for one GPU cut into MIG profiles on `node`
/// (DRAPartitionableDevices): one declaring the GPU's shared counters, one with every partition
/// it can be cut into (seven 1g, three 2g, one 7g), each consuming those counters.
fn mig_slices(node: &str) -> [DynamicObject; 2] {
    let partition = |name: String, compute: u32, memory: u32| {
        json!({"name": name, "attributes": {"type": {"string": "mig"}},
               "consumesCounters": [{"counterSet": "gpu-0", "counters": {
                   "compute": {"value": compute.to_string()}, "memory": {"value": format!("{memory}Gi")}}}]})
    };
    let mut devices: Vec<Value> = (0..7).map(|i| partition(format!("mig-1g-{i}"), 1, 10)).collect();
    devices.extend((0..3).map(|i| partition(format!("mig-2g-{i}"), 2, 20)));
    devices.push(partition("mig-7g".into(), 7, 80));
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    let counters = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-counters")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": pool,
                 "sharedCounters": [{"name": "gpu-0", "counters": {"compute": {"value": "7"}, "memory": {"value": "80Gi"}}}]}
    });
    let partitions = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-migs")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": pool, "devices": devices}
    });
    [serde_json::from_value(counters).unwrap(), serde_json::from_value(partitions).unwrap()]
}

/// Partitionable devices: a GPU published as eleven MIG partitions sharing its counters offers
/// seven 1g devices at most, not eleven. A gang of two pods asking four MIG devices each waits
/// on one such GPU (before: released on "11 devices", and the second pod could not be placed)
/// and goes whole once a second GPU is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_gang_is_fitted_to_the_gpus_shared_counters() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("a_mig_gang_is_fitted_to_the_gpus_shared_counters") else {
        return;
    };
    let cluster = Cluster::start_with(&assets, &[("dra-gang.yaml", GANG_TEAM)]).await;
    let admin = cluster.client.clone();
    let pp = PostParams::default();
    let class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}
    }))
    .unwrap();
    Api::<DynamicObject>::all_with(admin.clone(), &resource("DeviceClass", "deviceclasses"))
        .create(&pp, &class)
        .await
        .expect("DeviceClass mig.nvidia.com");
    let slices = Api::<DynamicObject>::all_with(admin.clone(), &resource("ResourceSlice", "resourceslices"));
    for slice in mig_slices("gpu-node-1") {
        let created = slices.create(&pp, &slice).await.expect("a MIG slice on gpu-node-1");
        let kept = created.data.pointer("/spec/sharedCounters").is_some()
            || created.data.pointer("/spec/devices/0/consumesCounters").is_some();
        assert!(kept, "the API server dropped the shared counters (DRAPartitionableDevices off?): {created:?}");
    }

    prepare_namespace(&admin, GANG_NS).await;
    let alice = alice_client(&cluster).await;
    let four_migs = json!([{"name": "migs", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 4}}]);
    Api::<DynamicObject>::namespaced_with(
        alice.clone(),
        GANG_NS,
        &resource("ResourceClaimTemplate", "resourceclaimtemplates"),
    )
    .create(&pp, &template("four-migs", four_migs))
    .await
    .expect("template four-migs");
    let pods: Api<Pod> = Api::namespaced(alice.clone(), GANG_NS);
    let names: Vec<String> = (0..2).map(|i| format!("mig-{i}")).collect();
    for name in &names {
        let mut pod = claim_pod(name, from_template("four-migs"));
        pod.metadata.labels = Some([("allot.dev/gang-name".to_string(), "mig".to_string())].into());
        pod.metadata.annotations = Some([("allot.dev/gang-size".to_string(), "2".to_string())].into());
        create_when_claims_known(&pods, &pod).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    // One GPU: seven 1g partitions fit its counters, not the eleven devices it lists.
    watch_members(&pods, &names, "the explanation with 7 free", |m| {
        m.iter()
            .all(|(gated, msg)| *gated && msg.contains("needs 8 mig.nvidia.com devices") && msg.ends_with(", 7 free"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(members(&pods, &names).await.iter().all(|(gated, _)| *gated), "7 partitions do not hold 8");

    // A second GPU on the other node: released whole.
    for slice in mig_slices("gpu-node-2") {
        slices.create(&pp, &slice).await.expect("a MIG slice on gpu-node-2");
    }
    wait_released(&pods, &names).await;
}
