//! `--native-covers` in process: the webhook paths that carry the native policies'
//! fingerprint leave out exactly what those policies do (a GPU Pod's toleration, a request
//! above its limit), still answer what only the webhook does (a GPU Pod outside every team),
//! and evaluate everything when the fingerprint is not the policy set's (native objects of
//! another compile); `allot webhooks --native-covers` renders those paths, and the CLI doors
//! (`--native-covers`, `allot test --server`) answer bad input with exit 2.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use allot::admission::covers::NativeSplit;
use allot::cli::webhooks::{Endpoint, WebhookOptions, render};
use allot::model::namespaces::NoNamespaces;
use allot::server::{AppState, metrics_router, router};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const LIMIT: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);

fn sources() -> Vec<allot::model::policy::Source> {
    allot::model::policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies"))
        .expect("shipped policies")
}

/// A server state over the shipped policies with its native split, and the fingerprint.
fn state() -> (Arc<AppState>, String) {
    let sources = sources();
    let state = AppState::new(allot::model::policy::compile(&sources).expect("policies"), Arc::new(NoNamespaces));
    state.set_native_split(&sources);
    let fingerprint = NativeSplit::from_sources(&sources).expect("split").fingerprint;
    (state, fingerprint)
}

fn review(namespace: &str, containers: Value) -> Vec<u8> {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace},
        "spec": {"containers": containers}});
    serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "p", "namespace": namespace, "operation": "CREATE",
        "userInfo": {"username": "alice"}, "object": pod, "dryRun": false}}))
    .expect("json")
}

/// A Pod CREATE whose one GPU comes from the claim template `one-gpu` (class gpu.nvidia.com in
/// the shipped Cluster policy's `dra` block).
fn claim_review(namespace: &str) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&review(namespace, json!([]))).expect("json");
    review["request"]["object"]["spec"] = json!({
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        "containers": [{"name": "c", "image": "busybox:1.36", "resources": {"claims": [{"name": "gpu"}]}}]});
    serde_json::to_vec(&review).expect("json")
}

fn gpu(request: &str, limit: &str) -> Value {
    json!([{"name": "c", "image": "busybox:1.36",
        "resources": {"requests": {"nvidia.com/gpu": request}, "limits": {"nvidia.com/gpu": limit}}}])
}

async fn call(app: axum::Router, path: &str, body: Vec<u8>) -> Value {
    let request = Request::post(path).header("content-type", "application/json").body(Body::from(body)).expect("req");
    let response = app.oneshot(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice::<Value>(&bytes).expect("AdmissionReview")["response"].clone()
}

/// The decoded JSON Patch of a response (empty when none).
fn patch(response: &Value) -> Vec<Value> {
    response["patch"]
        .as_str()
        .map(|p| base64::engine::general_purpose::STANDARD.decode(p).expect("base64"))
        .map(|bytes| serde_json::from_slice(&bytes).expect("patch json"))
        .unwrap_or_default()
}

#[tokio::test]
async fn the_native_path_leaves_out_what_the_native_policies_do() {
    let (state, fingerprint) = state();
    let app = || router(state.clone(), LIMIT, TIMEOUT);
    let (native_mutate, native_validate) =
        (format!("/mutate/native/{fingerprint}"), format!("/validate/native/{fingerprint}"));
    let tolerates = |p: &[Value]| p.iter().any(|op| op.to_string().contains("nvidia.com/gpu"));

    // The toleration: the full webhook adds it, the native path leaves it to the MAP.
    let pod = review("vision", gpu("1", "1"));
    let full = call(app(), "/mutate", pod.clone()).await;
    assert!(tolerates(&patch(&full)), "{full}");
    let split = call(app(), &native_mutate, pod.clone()).await;
    assert_eq!(split["allowed"], true);
    assert!(!tolerates(&patch(&split)), "{split}");
    // Native objects of another compile: everything is evaluated.
    let other = call(app(), "/mutate/native/0123456789ab", pod.clone()).await;
    assert_eq!(patch(&other), patch(&full));

    // A request above its limit: the VAP's to deny.
    let over = review("vision", gpu("2", "1"));
    let full = call(app(), "/validate", over.clone()).await;
    assert_eq!(full["allowed"], false, "{full}");
    assert!(full["status"]["message"].as_str().unwrap_or_default().contains("requests-equal-limits"), "{full}");
    let split = call(app(), &native_validate, over.clone()).await;
    assert_eq!(split["allowed"], true, "{split}");
    let other = call(app(), "/validate/native/0123456789ab", over).await;
    assert_eq!(other["allowed"], false, "{other}");

    // A Pod whose GPU comes from a DRA claim: the native policies see it as asking nothing, so
    // the native path answers it in full — the team's default class added (left to the MAP for
    // other Pods), and its claim checked (no claim source here: the template cannot be found,
    // a denial naming it).
    let defaults = |p: &[Value]| p.iter().any(|op| op["path"] == "/spec/priorityClassName");
    let plain = call(app(), &native_mutate, review("vision", gpu("1", "1"))).await;
    assert!(!defaults(&patch(&plain)), "{plain}");
    let claim = claim_review("vision");
    let full = call(app(), &native_mutate, claim.clone()).await;
    assert!(defaults(&patch(&full)), "{full}");
    let checked = call(app(), &native_validate, claim).await;
    assert_eq!(checked["allowed"], false, "{checked}");
    assert!(checked["status"]["message"].as_str().unwrap_or_default().contains("one-gpu"), "{checked}");

    let metrics = call_text(metrics_router(state.clone()), "/metrics").await;
    let count = |result: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("allot_native_covers_requests_total{{result=\"{result}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!((count("split"), count("full")), (Some(3.0), Some(4.0)), "{metrics}");
}

/// A state without a split (no sources given, or they failed to compile to a fingerprint)
/// evaluates everything on the native path.
#[tokio::test]
async fn no_split_means_everything_is_evaluated() {
    let policies = allot::model::policy::compile(&sources()).expect("policies");
    let state = AppState::new(policies, Arc::new(NoNamespaces));
    let (_, fingerprint) = self::state();
    let answer = call(
        router(state, LIMIT, TIMEOUT),
        &format!("/validate/native/{fingerprint}"),
        review("vision", gpu("2", "1")),
    )
    .await;
    assert_eq!(answer["allowed"], false, "{answer}");
}

async fn call_text(app: axum::Router, path: &str) -> String {
    let response = app.oneshot(Request::get(path).body(Body::empty()).expect("req")).await.expect("answer");
    String::from_utf8_lossy(&response.into_body().collect().await.expect("body").to_bytes()).into_owned()
}

#[test]
fn webhooks_carry_the_fingerprint_and_keep_subresources_whole() {
    let opts = |fingerprint: Option<&str>| WebhookOptions {
        endpoint: Endpoint::Url("https://allot.example:8443".into()),
        ca_bundle: b"ca".to_vec(),
        name: "allot".into(),
        failure_policy: "Ignore".into(),
        timeout_seconds: 5,
        exclude_namespaces: vec![],
        service_account: None,
        native_fingerprint: fingerprint.map(str::to_string),
    };
    let url = |c: &k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| c.url.clone().unwrap_or_default();
    let (m, v) = render(&opts(Some("0123456789ab")));
    let mutating = m.webhooks.unwrap_or_default();
    assert_eq!(url(&mutating[0].client_config), "https://allot.example:8443/mutate/native/0123456789ab");
    let validating = v.webhooks.unwrap_or_default();
    let by_name = |name: &str| validating.iter().find(|w| w.name == name).unwrap_or_else(|| panic!("{name}"));
    let main = by_name("validate.allot.dev");
    assert_eq!(url(&main.client_config), "https://allot.example:8443/validate/native/0123456789ab");
    let resources = |w: &k8s_openapi::api::admissionregistration::v1::ValidatingWebhook| -> Vec<String> {
        w.rules.iter().flatten().flat_map(|r| r.resources.clone().unwrap_or_default()).collect()
    };
    assert!(resources(main).contains(&"pods".to_string()));
    assert!(!resources(main).iter().any(|r| r.contains('/')), "{:?}", resources(main));
    // Native policies never see subresources: those keep the full check on the plain path.
    let subresources = by_name("validate-subresources.allot.dev");
    assert_eq!(url(&subresources.client_config), "https://allot.example:8443/validate");
    for sub in allot::cli::webhooks::POD_SUBRESOURCES {
        assert!(resources(subresources).contains(&sub.to_string()), "{sub}");
    }
    assert_eq!(url(&by_name("validate-metadata.allot.dev").client_config), "https://allot.example:8443/validate");
    // Without the flag: what deploy/ holds, unchanged.
    let (m, v) = render(&opts(None));
    assert_eq!(url(&m.webhooks.unwrap_or_default()[0].client_config), "https://allot.example:8443/mutate");
    assert_eq!(v.webhooks.unwrap_or_default().len(), 2);
}

/// The CLI doors: `allot webhooks --native-covers` names the fingerprint `allot serve` computes
/// and what is left to the native policies; `allot test --server` refuses a kubeconfig it
/// cannot read (exit 2, nothing run) and `--junit` beside it.
#[test]
fn the_command_line_doors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, "ca").expect("ca");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_allot")).args(args).current_dir(root).output().expect("allot")
    };
    let out = run(&[
        "webhooks",
        "--ca-bundle",
        ca.to_str().expect("path"),
        "--url",
        "https://a:1",
        "--native-covers",
        "policies",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, fingerprint) = state();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("url: https://a:1/validate/native/{fingerprint}")), "{stdout}");
    assert!(stderr.contains(&fingerprint) && stderr.contains("rule pinned-images-on-gpus"), "{stderr}");
    let out = run(&[
        "webhooks",
        "--ca-bundle",
        ca.to_str().expect("path"),
        "--url",
        "https://a:1",
        "--native-covers",
        "no-such-dir",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));

    let missing = dir.path().join("no-kubeconfig");
    let out = run(&["test", "--server", missing.to_str().expect("path"), "policy-tests/placement.yaml"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-kubeconfig"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["test", "--server", "k", "--junit", "j.xml", "policy-tests/placement.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
