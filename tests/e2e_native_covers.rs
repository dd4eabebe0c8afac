//! `--native-covers` on a real kube-apiserver (skipped without the envtest binaries): the
//! native policies from `allot compile` and the webhooks from `allot webhooks --native-covers`
//! (failurePolicy Ignore), both rendered from the policy directory `allot serve` reads.
//! Each covered check answers once (one warning, one toleration, the VAP's denial), webhook-only
//! checks (quota, the gang gate) still answer; an Audit rule is recorded in the API server's audit
//! log once, by Allot with the plain webhooks and by the native policy with both halves; a hot
//! reload that changes the
//! native half makes the webhook evaluate everything again (the old native objects lack the new
//! rule, so the webhook must not skip it); with Allot stopped the native checks still deny.
//! Also prints the pod-create throughput with the plain webhooks and with both halves (one run).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};
use support::cluster::{Assets, Cluster, metric};
use support::native::create_all;

/// A team with a small deny-mode quota, so the webhook-only quota check is reachable.
const QUOTA_TEAM: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Team
metadata: {name: small}
spec:
  namespaces: {names: [quota-deny]}
  quota: {mode: Deny, limits: {nvidia.com/gpu: 2}}
"#;

/// Added by hot reload: not among the installed native objects.
const NEW_RULE: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Rule
metadata: {name: no-host-network}
spec:
  expression: "!has(object.spec.hostNetwork) || !object.spec.hostNetwork"
  message: host networking is not allowed here
"#;

fn pod(name: &str, namespace: &str, spec: Value) -> Value {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "busybox:1.36"}]);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn gpu(image: &str, request: &str, limit: &str) -> Value {
    json!([{"name": "c", "image": image,
        "resources": {"requests": {"nvidia.com/gpu": request}, "limits": {"nvidia.com/gpu": limit}}}])
}

/// A server-side dry-run create of a Pod: the admitted object and the warnings, or the refusal.
async fn dry_run(client: &kube::Client, pod: &Value) -> Result<(Value, Vec<String>), String> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let request = axum::http::Request::post(format!("/api/v1/namespaces/{namespace}/pods?dryRun=All"))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(pod).map_err(|e| e.to_string())?))
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let warnings: Vec<String> =
        response.headers().get_all("warning").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    let bytes = http_body_util::BodyExt::collect(response.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    let body: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if status.is_success() { Ok((body, warnings)) } else { Err(body["message"].as_str().unwrap_or("?").to_string()) }
}

/// The audit annotations the API server recorded for the create of pod `name` (waits for the
/// event: it is written when the request completes).
async fn audit_annotations(cluster: &Cluster, name: &str) -> std::collections::BTreeMap<String, String> {
    eventually(&format!("the audit event of pod {name}"), || async {
        support::cluster::audit_events(cluster.dir.path())
            .into_iter()
            .find(|e| e["objectRef"]["name"] == name && e["stage"] == "ResponseComplete")
            .map(|e| serde_json::from_value(e["annotations"].clone()).unwrap_or_default())
            .ok_or_else(|| "not yet".to_string())
    })
    .await
}

fn count(haystack: &[String], needle: &str) -> usize {
    haystack.iter().map(|w| w.matches(needle).count()).sum()
}

/// `count` sequential server-side dry-run creates of a GPU Pod in `vision`: the time taken.
async fn time_creates(client: &kube::Client, count: usize) -> Duration {
    let start = Instant::now();
    for i in 0..count {
        let object = pod(&format!("t{i}"), "vision", json!({"containers": gpu("busybox:1.36", "1", "1")}));
        dry_run(client, &object).await.expect("a GPU pod in vision is admitted");
    }
    start.elapsed()
}

fn gpu_tolerations(pod: &Value) -> usize {
    pod["spec"]["tolerations"].as_array().into_iter().flatten().filter(|t| t["key"] == "nvidia.com/gpu").count()
}

/// Runs `allot` and returns stdout (stderr on failure).
fn allot(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot")).args(args).output().expect("run allot");
    assert!(out.status.success(), "allot {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Retries `check` until it returns `Ok`, for a minute (the API server loads policies and
/// webhook configurations asynchronously); panics with the last error.
async fn eventually<F, Fut, T>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match check().await {
            Ok(value) => return value,
            Err(e) => assert!(Instant::now() < deadline, "{what}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_is_answered_once_and_native_checks_outlive_the_webhook() {
    let test = "e2e_native_covers::each_check_is_answered_once_and_native_checks_outlive_the_webhook";
    let Some(assets) = Assets::from_env(test) else {
        return;
    };
    allot::install_crypto_provider();
    let mut cluster = Cluster::start_with(&assets, &[("zz-small.yaml", QUOTA_TEAM)]).await;
    let client = cluster.client.clone();
    let policies = cluster.dir.path().join("policies");
    let policies = policies.to_str().expect("utf-8 path");

    // An Audit rule with the plain webhooks: admitted, and the API server records Allot's
    // audit annotation (keyed by the webhook's name) with the rule's message.
    let audited = pod(
        "audited",
        "vision",
        json!({"priorityClassName": "high-priority", "containers": gpu("busybox:1.36", "1", "1")}),
    );
    dry_run(&client, &audited).await.expect("an Audit rule admits");
    let webhook_audit = audit_annotations(&cluster, "audited").await;
    assert_eq!(
        webhook_audit.get("validate.allot.dev/high-priority-is-audited").map(String::as_str),
        Some("high-priority pod requesting 1 accelerator(s)"),
        "{webhook_audit:?}"
    );

    // Pod-create throughput with the plain webhooks first (the figure printed at the end).
    const CREATES: usize = 60;
    time_creates(&client, 5).await; // warm-up: connections, caches
    let webhook_only = time_creates(&client, CREATES).await;

    // Both halves, rendered from the directory Allot serves: the native objects, then the
    // webhooks with the native policies' fingerprint in their paths (instead of the plain ones).
    // Compiled for the default identity, not this test's Allot's (`admin`): the test's own client
    // is `admin` too, and the native policies skip Allot's identity (the fingerprint does not
    // depend on it: `src/admission/native/tests.rs`).
    create_all(&client, &allot(&["compile", "--policies", policies])).await;
    let dp = DeleteParams::default();
    Api::<MutatingWebhookConfiguration>::all(client.clone()).delete("allot", &dp).await.expect("delete mutating");
    Api::<ValidatingWebhookConfiguration>::all(client.clone()).delete("allot", &dp).await.expect("delete validating");
    let ca = cluster.dir.path().join("allot-certs/ca.crt");
    let url = format!("https://{}", cluster.allot_addr);
    let webhooks = allot(&[
        "webhooks",
        "--ca-bundle",
        ca.to_str().expect("path"),
        "--url",
        &url,
        "--failure-policy",
        "Ignore",
        "--native-covers",
        policies,
    ]);
    assert!(webhooks.contains("/validate/native/"), "{webhooks}");
    create_all(&client, &webhooks).await;

    let message = "GPU containers should pin an image tag";
    let unpinned = pod("w", "vision", json!({"containers": gpu("busybox:latest", "1", "1")}));
    // Ready when the native warning shows and the webhook has answered on its native path.
    eventually("the native policies and the native-covers webhooks in force", || async {
        let (_, warnings) = dry_run(&client, &unpinned).await?;
        let split = metric(&cluster.allot_metrics, "allot_native_covers_requests_total{result=\"split\"}");
        if count(&warnings, message) == 1 && split.is_some_and(|n| n > 0.0) {
            Ok(())
        } else {
            Err(format!("warnings {warnings:?}, split requests {split:?}"))
        }
    })
    .await;

    // The API server loads each policy on its own: the Audit rule's may come into force after
    // the warning's (seen once in CI). In force once a probe of its own is audited natively.
    let mut probes = 0;
    eventually("the native Audit policy in force", || {
        probes += 1;
        let mut probe = audited.clone();
        probe["metadata"]["name"] = json!(format!("audit-probe-{probes}"));
        let (client, cluster) = (&client, &cluster);
        async move {
            dry_run(client, &probe).await?;
            let annotations = audit_annotations(cluster, probe["metadata"]["name"].as_str().unwrap_or_default()).await;
            match annotations.get("validation.policy.admission.k8s.io/validation_failure") {
                Some(_) => Ok(()),
                None => Err(format!("not audited natively yet: {annotations:?}")),
            }
        }
    })
    .await;

    // The same pod with both halves: the native policy audits it, the webhook does not again.
    let mut audited = audited;
    audited["metadata"]["name"] = json!("audited-native");
    dry_run(&client, &audited).await.expect("an Audit rule admits");
    let native_audit = audit_annotations(&cluster, "audited-native").await;
    let failure =
        native_audit.get("validation.policy.admission.k8s.io/validation_failure").cloned().unwrap_or_default();
    let failures: Vec<Value> = serde_json::from_str(&failure).unwrap_or_default();
    assert_eq!(failures.len(), 1, "one native audit: {native_audit:?}");
    assert_eq!(failures[0]["message"], "high-priority pod requesting 1 accelerator(s)", "{failures:?}");
    assert_eq!(failures[0]["validationActions"], json!(["Audit"]), "{failures:?}");
    assert!(failures[0]["policy"].as_str().is_some_and(|p| p.contains("high-priority-is-audited")), "{failures:?}");
    assert!(
        !native_audit.keys().any(|k| k.starts_with("validate.allot.dev/")),
        "the webhook leaves the compiled Audit rule to the native policy: {native_audit:?}"
    );

    let covered = time_creates(&client, CREATES).await;
    let rate = |d: Duration| CREATES as f64 / d.as_secs_f64();
    println!(
        "pod-create (server-side dry-run, {CREATES} sequential GPU Pods) per second: plain webhooks {:.1}, native \
         policies + --native-covers webhooks {:.1}; ratio {:.2}",
        rate(webhook_only),
        rate(covered),
        rate(covered) / rate(webhook_only)
    );

    // The Warn rule: one warning (the VAP's), not one from each.
    let (_, warnings) = dry_run(&client, &unpinned).await.expect("admitted");
    assert_eq!(count(&warnings, message), 1, "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("ValidatingAdmissionPolicy")), "the native policy's: {warnings:?}");
    // The toleration: once, and the webhook, consulted, did not add it ("allowed", not "mutated").
    let mutate = |result: &str| {
        metric(
            &cluster.allot_metrics,
            &format!("allot_admission_requests_total{{webhook=\"mutate\",result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (allowed_before, mutated_before) = (mutate("allowed"), mutate("mutated"));
    let (admitted, _) = dry_run(&client, &pod("t", "vision", json!({"containers": gpu("busybox:1.36", "1", "1")})))
        .await
        .expect("admitted");
    assert_eq!(gpu_tolerations(&admitted), 1, "{}", admitted["spec"]["tolerations"]);
    assert!(mutate("allowed") > allowed_before, "the mutating webhook was consulted");
    assert_eq!(mutate("mutated"), mutated_before, "the webhook patched a Pod the native policy had placed");
    // A covered denial: the VAP's message, once.
    // (A request above its limit or a fraction never gets that far: the API server's own
    // validation refuses extended resources like that.)
    let over = pod(
        "o",
        "vision",
        json!({"initContainers": [{"name": "init", "image": "busybox:1.36",
        "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]}),
    );
    let refused = dry_run(&client, &over).await.expect_err("denied");
    assert!(
        refused.contains("ValidatingAdmissionPolicy") && refused.matches("init-containers").count() == 1,
        "{refused}"
    );
    let decisions = |rule: &str| {
        metric(
            &cluster.allot_metrics,
            &format!("allot_admission_decisions_total{{webhook=\"validate\",rule=\"{rule}\",action=\"warn\"}}"),
        )
    };
    assert_eq!(decisions("pinned-images-on-gpus"), None, "the webhook evaluated a covered rule");

    // A GPU Pod of no team is refused (natively since accelerators(object) is expanded);
    // webhook-only checks still answer: quota, the gang gate.
    let stray = dry_run(&client, &pod("s", "quota-queue", json!({"containers": gpu("busybox:1.36", "1", "1")}))).await;
    assert!(stray.as_ref().is_err_and(|e| e.contains("gpu-pods-belong-to-a-team")), "{stray:?}");
    let quota = dry_run(&client, &pod("q", "quota-deny", json!({"containers": gpu("busybox:1.36", "3", "3")}))).await;
    assert!(quota.as_ref().is_err_and(|e| e.contains("team small uses")), "{quota:?}");
    let mut gang = pod("g", "vision", json!({"containers": gpu("busybox:1.36", "1", "1")}));
    gang["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
    gang["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
    let (gated, _) = dry_run(&client, &gang).await.expect("gang member admitted");
    assert!(gated["spec"]["schedulingGates"].to_string().contains("allot.dev/gang"), "{}", gated["spec"]);
    assert_eq!(gpu_tolerations(&gated), 1, "{}", gated["spec"]["tolerations"]);

    // Hot reload adds a rule the installed native objects do not have: the fingerprint no longer
    // matches, so the webhook evaluates everything — the new rule denies, and the covered Warn
    // rule is answered by both again (twice is the safe side of the trade-off).
    std::fs::write(cluster.dir.path().join("policies/zz-new.yaml"), NEW_RULE).expect("new rule");
    let host = pod("h", "vision", json!({"hostNetwork": true}));
    let refused = eventually("the reloaded rule enforced by the webhook", || async {
        match dry_run(&client, &host).await {
            Err(e) if e.contains("host networking") => Ok(e),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(!refused.contains("ValidatingAdmissionPolicy"), "{refused}");
    let (_, warnings) = dry_run(&client, &unpinned).await.expect("admitted");
    assert_eq!(count(&warnings, message), 2, "{warnings:?}");
    assert!(decisions("pinned-images-on-gpus").is_some_and(|n| n > 0.0), "the webhook evaluates the rule again");
    assert!(
        metric(&cluster.allot_metrics, "allot_native_covers_requests_total{result=\"full\"}").is_some_and(|n| n > 0.0)
    );
    std::fs::remove_file(cluster.dir.path().join("policies/zz-new.yaml")).expect("remove");
    eventually("back to the split after the rule is removed", || async {
        let (_, warnings) = dry_run(&client, &unpinned).await?;
        if count(&warnings, message) == 1 { Ok(()) } else { Err(format!("{warnings:?}")) }
    })
    .await;

    // Allot stopped (failurePolicy Ignore): the native checks still deny and place; the
    // webhook-only rule no longer does.
    cluster.stop_allot();
    let refused = dry_run(&client, &over).await.expect_err("still denied");
    assert!(refused.contains("ValidatingAdmissionPolicy"), "{refused}");
    let nlp_high = pod("n", "nlp", json!({"priorityClassName": "high-priority"}));
    let refused = dry_run(&client, &nlp_high).await.expect_err("still denied");
    assert!(refused.contains("team nlp may use priority classes"), "{refused}");
    let (placed, warnings) = dry_run(&client, &unpinned).await.expect("admitted");
    assert_eq!(gpu_tolerations(&placed), 1);
    assert_eq!(count(&warnings, message), 1, "{warnings:?}");
    // `gpu-pods-belong-to-a-team` (accelerators(object), expanded) still refuses natively; the
    // gang gate, webhook-only, is gone.
    let stray = dry_run(&client, &pod("s2", "quota-queue", json!({"containers": gpu("busybox:1.36", "1", "1")}))).await;
    assert!(stray.as_ref().is_err_and(|e| e.contains("ValidatingAdmissionPolicy")), "{stray:?}");
    let (ungated, _) = dry_run(&client, &gang).await.expect("gang member admitted");
    assert!(!ungated["spec"]["schedulingGates"].to_string().contains("allot.dev/gang"), "{}", ungated["spec"]);
}
