//! Allot's identity on a real control plane (skipped without the envtest binaries): `allot
//! serve` with the test cluster's admin kubeconfig and no `--allot-username` knows it is `admin`
//! (the API server says so) and releases gangs; where a webhook replica allows another identity
//! than the one the controller writes as, the refused lift is counted and told on every member
//! (not retried in silence), and the gang is released once the webhook agrees again.
//! (The install in another namespace, as its own ServiceAccount: tests/deploy.rs.)

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::cluster::{
    Assets, Cluster, gang_condition, gang_gated as gated, gang_member as member, impersonating, metric,
    point_webhooks_at, tenant_namespace, wait_for,
};

/// A webhook-only `allot serve` (`--no-kube`) that allows `username` to move Allot's gates, on
/// the cluster's certificates and policies: (process, https address).
fn webhook_replica(cluster: &Cluster, username: &str) -> (support::KilledOnDrop, String) {
    let d = cluster.dir.path();
    let certs = d.join("allot-certs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["serve", "--no-kube", "--allot-username", username])
        .args(["--policies", d.join("policies").to_str().unwrap()])
        .args([
            "--tls-cert",
            certs.join("tls.crt").to_str().unwrap(),
            "--tls-key",
            certs.join("tls.key").to_str().unwrap(),
        ])
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("allot-webhook-only.log")).unwrap())
        .spawn()
        .expect("allot serve --no-kube");
    let stdout = child.stdout.take().unwrap();
    let child = support::KilledOnDrop::new(child);
    let line = support::first_line(stdout, Duration::from_secs(30)).expect("the replica serves");
    let (https, metrics) = support::serving_addresses(&line).expect("address line");
    let info = metric(&metrics, &format!("allot_identity_info{{username=\"{username}\",source=\"flag\"}}"));
    assert_eq!(info, Some(1.0), "without an API the flag is the identity");
    (child, https)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allot_knows_who_it_is_and_says_so_when_its_own_webhook_refuses_it() {
    allot::install_crypto_provider();
    let Some(assets) = Assets::from_env("allot_knows_who_it_is_and_says_so_when_its_own_webhook_refuses_it") else {
        return;
    };
    let cluster = Cluster::start(&assets).await;
    // No --allot-username: the API server says who the admin kubeconfig is.
    let info = metric(&cluster.allot_metrics, "allot_identity_info{username=\"admin\",source=\"api-server\"}");
    assert_eq!(info, Some(1.0));
    tenant_namespace(
        &cluster.client,
        "vision",
        "alice",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]}]),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(impersonating(&cluster.kubeconfig, "alice").await, "vision");

    // The webhooks now answer from a replica that allows the shipped default identity, not the
    // `admin` the controller writes as: every lift is refused.
    let (_replica, replica_addr) = webhook_replica(&cluster, allot::admission::tenant::DEFAULT_ALLOT_USERNAME);
    point_webhooks_at(&cluster.client, &cluster.allot_addr, &replica_addr).await;
    for name in ["train-0", "train-1"] {
        pods.create(&PostParams::default(), &member(name, "train", 2)).await.expect("alice creates a member");
    }
    let refused =
        |p: &Pod| gang_condition(p).is_some_and(|(status, reason, _)| status == "False" && reason == "ReleaseRefused");
    wait_for("both members told their release was refused", Duration::from_secs(60), || async {
        let (a, b) = (pods.get("train-0").await.unwrap(), pods.get("train-1").await.unwrap());
        refused(&a) && refused(&b) && gated(&a) && gated(&b)
    })
    .await;
    let (_, _, message) = gang_condition(&pods.get("train-0").await.unwrap()).unwrap();
    assert!(message.contains("tenant/allot-gates") && message.contains("allot_identity_info"), "{message}");
    let counted = metric(&cluster.allot_metrics, "allot_gang_controller_refused_lifts_total{kind=\"gate\"}");
    assert!(counted.is_some_and(|n| n >= 1.0), "refused lifts counted: {counted:?}");

    // The webhooks agree with the controller again: the next retry releases the gang, and the
    // members are told.
    point_webhooks_at(&cluster.client, &replica_addr, &cluster.allot_addr).await;
    wait_for("the gang released after the webhook agrees", Duration::from_secs(60), || async {
        let (a, b) = (pods.get("train-0").await.unwrap(), pods.get("train-1").await.unwrap());
        let released = |p: &Pod| !gated(p) && gang_condition(p).is_some_and(|(status, _, _)| status == "True");
        released(&a) && released(&b)
    })
    .await;
}
