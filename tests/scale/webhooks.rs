//! Registering Allot's webhooks (or pointing them at another server) and waiting until the API
//! server acts on the change, with a probe pod Allot denies and an allow-everything webhook admits.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{PROBE_NAMESPACE, Settings, create_pods};

/// The webhook configurations `allot webhooks` prints for an Allot at `url`.
pub(crate) fn webhook_configs(
    bin: &Path,
    ca: &Path,
    url: &str,
) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let out =
        Command::new(bin).arg("webhooks").arg("--ca-bundle").arg(ca).args(["--url", url]).output().expect("webhooks");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("webhook yaml");
    (
        serde_json::from_value(docs[0].clone()).expect("mutating"),
        serde_json::from_value(docs[1].clone()).expect("validating"),
    )
}

/// Registers or removes Allot's webhooks and waits until the API server acts on the change
/// (a team-less GPU pod in the probe namespace is denied with them, admitted without).
pub(crate) async fn set_webhooks(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    on: bool,
) {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let (m_name, v_name) =
        (configs.0.metadata.name.clone().unwrap_or_default(), configs.1.metadata.name.clone().unwrap_or_default());
    // Idempotent: already there (409) or already gone (404) is what was asked for.
    let settled = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
        other => other.unwrap_or_else(|e| panic!("{what}: {e}")),
    };
    if on {
        settled(m.create(&PostParams::default(), &configs.0).await.map(drop), "mutating webhook");
        settled(v.create(&PostParams::default(), &configs.1).await.map(drop), "validating webhook");
    } else {
        settled(m.delete(&m_name, &DeleteParams::default()).await.map(drop), "delete mutating webhook");
        settled(v.delete(&v_name, &DeleteParams::default()).await.map(drop), "delete validating webhook");
    }
    wait_for_probe(client, !on, &format!("the API server picks up the webhook change (on = {on})")).await;
}

/// Creates/s with Allot as a ratio to no webhook: `rounds` alternations of one batch each way.
/// Leaves the webhooks registered. Returns (ratio, with/s, without/s) and advances `next`.
pub(crate) async fn create_ratio(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    settings: &Settings,
    next: &mut usize,
) -> (f64, f64, f64) {
    let (mut with, mut without) = ((0.0, 0usize), (0.0, 0usize));
    for _ in 0..settings.rounds {
        for on in [true, false] {
            set_webhooks(client, configs, on).await;
            let (secs, failures) = create_pods(client, *next, settings.batch, settings.clients).await;
            assert!(failures.is_empty(), "{} creates failed, first: {}", failures.len(), failures[0]);
            *next += settings.batch;
            let slot = if on { &mut with } else { &mut without };
            slot.0 += secs;
            slot.1 += settings.batch;
        }
    }
    set_webhooks(client, configs, true).await;
    let rate = |(secs, n): (f64, usize)| n as f64 / secs.max(1e-9);
    (rate(with) / rate(without), rate(with), rate(without))
}

/// A team-less one-GPU pod: Allot denies it, an allow-everything webhook admits it.
pub(crate) fn probe(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("probe pod")
}

/// Creates the probe until the API server admits it (`admitted`) or refuses it, deleting it
/// each time it got in; fails after 60 s, saying what it waited for.
pub(crate) async fn wait_for_probe(client: &kube::Client, admitted: bool, what: &str) {
    let probes: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), PROBE_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got_in = probes.create(&PostParams::default(), &probe("probe")).await.is_ok();
        if got_in {
            let _ = probes.delete("probe", &DeleteParams::default().grace_period(0)).await;
            // Wait for it to be gone, so the next probe's create does not collide.
            while probes.get_opt("probe").await.ok().flatten().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if got_in == admitted {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Points the registered webhook configurations (same names) at another server by replacing
/// their webhook lists, then waits until the API server acts on it: the probe (a team-less GPU
/// pod) is denied while Allot answers and admitted once the allow-everything baseline does.
pub(crate) async fn point_webhooks(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    allot_answers: bool,
) {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name =
        |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| meta.name.clone().unwrap_or_default();
    m.patch(&name(&configs.0.metadata), &PatchParams::default(), &Patch::Merge(&configs.0))
        .await
        .expect("patch mutating");
    v.patch(&name(&configs.1.metadata), &PatchParams::default(), &Patch::Merge(&configs.1))
        .await
        .expect("patch validating");
    wait_for_probe(
        client,
        !allot_answers,
        &format!("the API server switches webhook servers (to allot = {allot_answers})"),
    )
    .await;
}
