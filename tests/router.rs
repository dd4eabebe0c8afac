//! In-process router tests: the HTTP layer (status codes, limits, probes, metrics) without
//! sockets or TLS.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use allot::model::namespaces::NoNamespaces;
use allot::server::{AppState, metrics_router, router};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

const LIMIT: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_millis(300);

fn state() -> Arc<AppState> {
    let policies = allot::model::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    AppState::new(policies, Arc::new(NoNamespaces))
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews").join(name)).unwrap()
}

async fn call(app: axum::Router, method: &str, uri: &str, body: Vec<u8>) -> (StatusCode, String) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test]
async fn mutate_answers_with_a_base64_patch() {
    let (status, body) =
        call(router(state(), LIMIT, TIMEOUT), "POST", "/mutate", fixture("010-mutate-create-pod-my-gpu-pod.json"))
            .await;
    assert_eq!(status, StatusCode::OK);
    let review: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(review["response"]["uid"], "9c33c7d4-903e-4f90-9f4e-172b4de2dbe9");
    assert_eq!(review["response"]["allowed"], true);
    assert!(
        review["response"]["patch"].is_string(),
        "kube-rs/kube#1781: patch must be base64, got {}",
        review["response"]["patch"]
    );
}

#[tokio::test]
async fn malformed_input_is_a_400_with_a_reason() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "invalid JSON"),
        (b"".to_vec(), "invalid JSON"),
        (serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})).unwrap(), "request is missing"),
        (serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}})).unwrap(), "apiVersion must be admission.k8s.io/v1"),
        (serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"})).unwrap(), "kind must be AdmissionReview"),
        (
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "", "kind": {}, "operation": "CREATE"}})).unwrap(),
            "uid is empty",
        ),
        (
            serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "kind": {}, "operation": "PATCH"}})).unwrap(),
            "operation",
        ),
    ];
    for (body, reason) in cases {
        for path in ["/mutate", "/validate"] {
            let (status, text) = call(router(state(), LIMIT, TIMEOUT), "POST", path, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {text}");
            assert!(text.contains(reason), "{path}: expected {reason:?} in {text:?}");
        }
    }
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let mut review: Value = serde_json::from_slice(&fixture("010-mutate-create-pod-my-gpu-pod.json")).unwrap();
    review["request"]["object"]["metadata"]["annotations"]["padding"] = json!("x".repeat(LIMIT));
    for path in ["/mutate", "/validate"] {
        let (status, body) =
            call(router(state(), LIMIT, TIMEOUT), "POST", path, serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        // A metav1.Status the API server decodes and shows, not a bare status code.
        let status: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not a Status ({e}): {body}"));
        assert_eq!(status.code, Some(413));
        assert_eq!(status.reason.as_deref(), Some("RequestEntityTooLarge"));
        let message = status.message.unwrap_or_default();
        assert!(
            message.contains(&format!("larger than the {LIMIT} bytes")) && message.contains("--max-body-bytes"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn unknown_kinds_and_objectless_operations_are_allowed_untouched() {
    let mut review: Value = serde_json::from_slice(&fixture("010-mutate-create-pod-my-gpu-pod.json")).unwrap();
    review["request"]["kind"] = json!({"group": "example.com", "version": "v1", "kind": "Widget"});
    for path in ["/mutate", "/validate"] {
        let (status, body) =
            call(router(state(), LIMIT, TIMEOUT), "POST", path, serde_json::to_vec(&review).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        let out: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(out["response"]["allowed"], true);
        assert!(out["response"].get("patch").is_none());
    }
    let mut delete: Value = serde_json::from_slice(&fixture("011-validate-create-pod-my-gpu-pod.json")).unwrap();
    delete["request"]["operation"] = json!("DELETE");
    delete["request"]["oldObject"] = delete["request"]["object"].take();
    let (status, body) =
        call(router(state(), LIMIT, TIMEOUT), "POST", "/validate", serde_json::to_vec(&delete).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["response"]["allowed"], true);
}

#[tokio::test]
async fn wrong_methods_and_paths() {
    let (status, _) = call(router(state(), LIMIT, TIMEOUT), "GET", "/mutate", vec![]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = call(router(state(), LIMIT, TIMEOUT), "POST", "/nope", vec![]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn probes_report_the_policy_set_and_reload_errors() {
    let state = state();
    let version = state.policies.load().version.clone();
    let (status, body) = call(router(state.clone(), LIMIT, TIMEOUT), "GET", "/healthz", vec![]).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok\n"));
    let (status, body) = call(router(state.clone(), LIMIT, TIMEOUT), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(&version), "{body}");
    assert!(!body.contains("failed"));

    state.last_reload_error.store(Arc::new(Some("p.yaml: document 1: boom".into())));
    let (status, body) = call(metrics_router(state.clone()), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::OK, "the last good set still serves");
    assert!(body.contains("last reload failed") && body.contains("boom"), "{body}");

    state.shutting_down.store(true, Ordering::Relaxed);
    let (status, _) = call(router(state.clone(), LIMIT, TIMEOUT), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn metrics_count_requests_decisions_and_latency() {
    let state = state();
    call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/mutate", fixture("010-mutate-create-pod-my-gpu-pod.json"))
        .await;
    call(
        router(state.clone(), LIMIT, TIMEOUT),
        "POST",
        "/validate",
        fixture("015-validate-create-pod-tolerated-gpu-pod.json"),
    )
    .await;
    call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/validate", b"garbage".to_vec()).await;
    let (status, text) = call(metrics_router(state.clone()), "GET", "/metrics", vec![]).await;
    assert_eq!(status, StatusCode::OK);
    for expected in [
        r#"allot_admission_requests_total{webhook="mutate",result="mutated"} 1"#,
        r#"allot_admission_requests_total{webhook="validate",result="denied"} 1"#,
        r#"allot_admission_requests_total{webhook="validate",result="error"} 1"#,
        r#"allot_admission_decisions_total{webhook="validate",rule="team/priority-class",action="deny"} 1"#,
        r#"allot_admission_duration_seconds_count{webhook="mutate"} 1"#,
        "allot_policy_set_info{version=",
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
}

#[tokio::test]
async fn metrics_report_team_accelerators_and_quota_from_the_watch_at_scrape_time() {
    use allot::control::cluster::{ClusterState, PodRecord};
    let policies = allot::model::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let cluster = Arc::new(ClusterState::default());
    let state = AppState::with_cluster(policies, Arc::new(NoNamespaces), cluster.clone());
    let pod = |name: &str, limits: Value, node: Option<&str>| -> PodRecord {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "vision", "creationTimestamp": "2026-11-22T01:00:00Z"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}]},
        }))
        .unwrap();
        PodRecord::from_pod(&pod, &state.policies.load(), &NoNamespaces).unwrap()
    };
    cluster.upsert_pod(pod("a", json!({"nvidia.com/gpu": "4"}), Some("n1")));
    cluster.upsert_pod(pod("b", json!({"nvidia.com/mig-1g.10gb": "1"}), None));
    let (_, text) = call(metrics_router(state.clone()), "GET", "/metrics", vec![]).await;
    for expected in [
        r#"allot_team_accelerators{team="vision",resource="nvidia.com/gpu",state="bound"} 4.0"#,
        r#"allot_team_accelerators{team="vision",resource="nvidia.com/mig-1g.10gb",state="pending"} 1.0"#,
        r#"allot_quota_limit{team="vision",resource="nvidia.com/gpu"} 16.0"#,
        // 4 GPUs + one 1/7 MIG slice.
        r#"allot_quota_used{team="vision",resource="nvidia.com/gpu"} 4.142857142857143"#,
        "allot_gang_controller_leader 0",
        "allot_gang_releases_total 0",
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    // A pod that is gone disappears from the next scrape.
    cluster.remove_pod("vision", "b");
    let (_, text) = call(metrics_router(state.clone()), "GET", "/metrics", vec![]).await;
    assert!(!text.contains("mig-1g.10gb"), "{text}");
    assert!(text.contains(r#"allot_quota_used{team="vision",resource="nvidia.com/gpu"} 4.0"#), "{text}");
}

#[tokio::test]
async fn the_ready_gauge_says_what_readyz_says() {
    let state = state();
    let scrape = |state: Arc<AppState>| async move { call(metrics_router(state), "GET", "/metrics", vec![]).await.1 };
    assert!(scrape(state.clone()).await.contains("\nallot_ready 1\n"));
    // A failed reload keeps serving the last good set: still ready, as /readyz says.
    state.last_reload_error.store(Arc::new(Some("p.yaml: boom".into())));
    assert!(scrape(state.clone()).await.contains("\nallot_ready 1\n"));
    state.shutting_down.store(true, Ordering::Relaxed);
    let (status, _) = call(metrics_router(state.clone()), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let text = scrape(state.clone()).await;
    assert!(text.contains("\nallot_ready 0\n"), "{text}");
    // The ledger's counters exist (at 0) where no ledger runs, so every replica has the names.
    assert!(text.contains("\nallot_quota_ledger_failures_total 0\n"), "{text}");
}

#[tokio::test]
async fn gate_gauges_count_gated_pods_and_age_the_oldest_at_scrape_time() {
    use allot::control::cluster::{ClusterState, PodRecord};
    let policies = allot::model::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let cluster = Arc::new(ClusterState::default());
    let state = AppState::with_cluster(policies, Arc::new(NoNamespaces), cluster.clone());
    let (_, text) = call(metrics_router(state.clone()), "GET", "/metrics", vec![]).await;
    for expected in [
        r#"allot_gated_pods{gate="gang"} 0"#,
        r#"allot_gated_pods{gate="quota"} 0"#,
        r#"allot_gate_oldest_seconds{gate="gang"} 0"#,
    ] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
    // A gang member created an hour ago, still behind the gate.
    let created = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "m-0", "namespace": "vision", "creationTimestamp": created.to_string(),
            "labels": {"allot.dev/gang-name": "g"}, "annotations": {"allot.dev/gang-size": "2"}},
        "spec": {"schedulingGates": [{"name": "allot.dev/gang"}],
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .unwrap();
    cluster.upsert_pod(PodRecord::from_pod(&pod, &state.policies.load(), &NoNamespaces).unwrap());
    let (_, text) = call(metrics_router(state.clone()), "GET", "/metrics", vec![]).await;
    assert!(text.contains(r#"allot_gated_pods{gate="gang"} 1"#), "{text}");
    let age: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"allot_gate_oldest_seconds{gate="gang"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1);
    assert!((3600..3660).contains(&age), "oldest gang gate {age} s, expected about 3600\n{text}");
}

#[tokio::test]
async fn a_stalled_body_is_cut_off_at_the_deadline() {
    // Headers promise a body that never finishes arriving (a slow or stuck client).
    let stalled =
        futures::stream::once(async { Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{\"apiVersion\"")) })
            .chain(futures::stream::pending());
    let request = Request::builder().method("POST").uri("/mutate").body(Body::from_stream(stalled)).unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(5), router(state(), LIMIT, TIMEOUT).oneshot(request))
        .await
        .expect("the router must answer by itself")
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() >= TIMEOUT && started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

/// A Rule whose cost grows with the cube of a list in the object: hundreds of env entries make
/// one evaluation take seconds (direct evaluation, `expression::direct`, goes through 10⁶
/// iterations before it gives up to the interpreter, which takes seconds for as many; a square
/// is no longer expensive enough).
const EXPENSIVE_RULE: &str = r#"apiVersion: allot.dev/v1alpha1
kind: Rule
metadata:
  name: env-names-are-consistent
spec:
  match:
    kinds: [Pod]
  expression: >-
    object.spec.containers.all(c, !has(c.env) ||
      c.env.all(a, c.env.all(b, c.env.all(d, a.name != b.name || a.value == b.value || d.name == ''))))
  message: duplicate env names with different values
  action: Deny
"#;

fn state_with(extra: &[(&str, &str)]) -> Arc<AppState> {
    let dir = tempfile::tempdir().unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    for entry in std::fs::read_dir(&shipped).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let policies = allot::model::policy::load_dir(dir.path()).unwrap();
    AppState::new(policies, Arc::new(NoNamespaces))
}

/// The GPU pod of fixture 011 with `entries` env entries on its first container.
fn review_with_env(entries: usize) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&fixture("011-validate-create-pod-my-gpu-pod.json")).unwrap();
    let env: Vec<Value> = (0..entries).map(|i| json!({"name": format!("VAR_{i}"), "value": "x"})).collect();
    review["request"]["object"]["spec"]["containers"][0]["env"] = Value::Array(env);
    serde_json::to_vec(&review).unwrap()
}

/// Evaluation runs off the async workers: on a single-threaded runtime, a Rule that takes
/// seconds neither delays /healthz nor outlives the request deadline (503 at the deadline).
#[tokio::test(flavor = "current_thread")]
async fn an_expensive_rule_cannot_outlive_the_deadline_or_stall_other_requests() {
    let state = state_with(&[("expensive.yaml", EXPENSIVE_RULE)]);
    let app = router(state.clone(), 8 * 1024 * 1024, TIMEOUT);
    // The rule really is expensive here: small objects pass it quickly.
    let (status, body) = call(app.clone(), "POST", "/validate", review_with_env(10)).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let started = Instant::now();
    let slow = tokio::spawn(call(app.clone(), "POST", "/validate", review_with_env(400)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let probe = Instant::now();
    let (status, _) = call(app.clone(), "GET", "/healthz", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(probe.elapsed() < Duration::from_millis(200), "/healthz took {:?} during an evaluation", probe.elapsed());

    let (status, text) = slow.await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(elapsed < TIMEOUT + Duration::from_millis(400), "answered after {elapsed:?}, deadline {TIMEOUT:?}");
    assert!(text.contains("did not finish within"), "{text}");
    let (_, metrics) = call(metrics_router(state), "GET", "/metrics", vec![]).await;
    assert!(metrics.contains(r#"allot_admission_requests_total{webhook="validate",result="error"} 1"#), "{metrics}");
}

/// Until the Pod and Namespace caches have synced, deny-mode quota fails closed with
/// "Allot is starting" and /readyz is not ready (saying why); after, the same review is admitted.
#[tokio::test]
async fn quota_fails_closed_and_readyz_waits_until_the_caches_have_synced() {
    let state = state();
    state.caches.pods.expect();
    state.caches.namespaces.expect();
    let review = fixture("011-validate-create-pod-my-gpu-pod.json");

    let (status, body) = call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/validate", review.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let out: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(out["response"]["allowed"], false, "{body}");
    let message = out["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("Allot is starting"), "{message}");
    assert!(message.contains("Pod and Namespace cache"), "{message}");
    for app in [router(state.clone(), LIMIT, TIMEOUT), metrics_router(state.clone())] {
        let (status, body) = call(app, "GET", "/readyz", vec![]).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("not ready: Allot is starting") && body.contains("Pod and Namespace"), "{body}");
    }

    // One synced is not enough.
    state.caches.namespaces.mark_synced();
    let (_, body) = call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/validate", review.clone()).await;
    assert!(body.contains("Allot is starting") && body.contains("its Pod cache"), "{body}");
    let (status, body) = call(router(state.clone(), LIMIT, TIMEOUT), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    state.caches.pods.mark_synced();
    let (_, body) = call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/validate", review).await;
    let out: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(out["response"]["allowed"], true, "{body}");
    let (status, body) = call(router(state.clone(), LIMIT, TIMEOUT), "GET", "/readyz", vec![]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A team with a deny quota of 2 GPUs in namespace `alpha`, and another team (`beta`) whose
/// usage must never appear in alpha's denials.
const TWO_TEAMS: &str = r#"apiVersion: allot.dev/v1alpha1
kind: Team
metadata:
  name: alpha
spec:
  namespaces:
    names: [alpha]
  quota:
    mode: Deny
    limits:
      nvidia.com/gpu: 2
---
apiVersion: allot.dev/v1alpha1
kind: Team
metadata:
  name: beta
spec:
  namespaces:
    names: [beta-secret-project]
  quota:
    mode: Deny
    limits:
      nvidia.com/gpu: 64
"#;

/// A Pod CREATE review for `validate` in `namespace` asking `gpus` GPUs.
fn gpu_review(uid: &str, namespace: &str, name: &str, gpus: u32, dry_run: bool) -> Vec<u8> {
    let mut review: Value = serde_json::from_slice(&fixture("011-validate-create-pod-my-gpu-pod.json")).unwrap();
    review["request"]["uid"] = json!(uid);
    review["request"]["namespace"] = json!(namespace);
    review["request"]["name"] = json!(name);
    review["request"]["dryRun"] = json!(dry_run);
    review["request"]["object"]["metadata"]["namespace"] = json!(namespace);
    review["request"]["object"]["metadata"]["name"] = json!(name);
    let resources = json!({"nvidia.com/gpu": gpus.to_string()});
    review["request"]["object"]["spec"]["containers"] =
        json!([{"name": "c", "image": "i@sha256:0", "resources": {"requests": resources, "limits": resources}}]);
    serde_json::to_vec(&review).unwrap()
}

async fn validate_review(state: &Arc<AppState>, body: Vec<u8>) -> Value {
    let (status, text) = call(router(state.clone(), LIMIT, TIMEOUT), "POST", "/validate", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["response"].clone()
}

/// A dryRun review that would fill the quota reserves nothing: the real one after it is
/// admitted. Without dryRun the same pair is one admission and one denial.
#[tokio::test]
async fn dry_run_reviews_reserve_no_quota() {
    let state = state_with(&[("teams.yaml", TWO_TEAMS)]);
    let dry = validate_review(&state, gpu_review("dry-1", "alpha", "a", 2, true)).await;
    assert_eq!(dry["allowed"], true, "{dry}");
    let real = validate_review(&state, gpu_review("real-1", "alpha", "b", 2, false)).await;
    assert_eq!(real["allowed"], true, "a dry run reserved quota: {real}");
    // The real one did reserve: a third is over the limit.
    let over = validate_review(&state, gpu_review("real-2", "alpha", "c", 1, false)).await;
    assert_eq!(over["allowed"], false, "{over}");
}

/// A quota denial names the requesting team's usage, limit and namespaces only: nothing of
/// another team, even when that team has pods running.
#[tokio::test]
async fn quota_denials_name_only_the_requesting_teams_usage() {
    use allot::control::cluster::{ClusterState, PodRecord};
    let policies = {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        std::fs::write(dir.path().join("teams.yaml"), TWO_TEAMS).unwrap();
        allot::model::policy::load_dir(dir.path()).unwrap()
    };
    let cluster = Arc::new(ClusterState::default());
    let state = AppState::with_cluster(policies, Arc::new(NoNamespaces), cluster.clone());
    let pod = |namespace: &str, name: &str, gpus: &str| -> PodRecord {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-11-22T01:00:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        }))
        .unwrap();
        PodRecord::from_pod(&pod, &state.policies.load(), &NoNamespaces).unwrap()
    };
    cluster.upsert_pod(pod("beta-secret-project", "big", "37"));
    cluster.upsert_pod(pod("alpha", "running", "2"));

    let denied = validate_review(&state, gpu_review("u-1", "alpha", "more", 1, false)).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    let message = denied["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("team alpha uses 2 of 2 nvidia.com/gpu"), "{message}");
    for secret in ["beta", "37", "64"] {
        assert!(!message.contains(secret), "the denial reveals {secret:?}: {message}");
    }
}

/// Fixture 021 (a gated gang worker whose `allot.dev/gang` gate is removed), sent as `username`
/// to a server that knows Allot as `allot_username`.
async fn remove_gate_as(username: &str, allot_username: &str) -> Value {
    let policies = allot::model::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let state = AppState::with_identity(
        policies,
        Arc::new(NoNamespaces),
        Arc::new(allot::control::cluster::ClusterState::default()),
        allot_username.to_string(),
    );
    let mut review: Value = serde_json::from_slice(&fixture("021-validate-update-pod-gated-worker-0.json")).unwrap();
    assert_eq!(review["request"]["oldObject"]["spec"]["schedulingGates"], json!([{"name": "allot.dev/gang"}]));
    assert!(review["request"]["object"]["spec"].get("schedulingGates").is_none());
    review["request"]["userInfo"] = json!({"username": username, "groups": ["system:authenticated"]});
    let (status, body) =
        call(router(state, LIMIT, TIMEOUT), "POST", "/validate", review.to_string().into_bytes()).await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_str::<Value>(&body).unwrap()["response"].clone()
}

#[tokio::test]
async fn only_allots_identity_may_remove_its_gate() {
    const ALLOT: &str = "system:serviceaccount:allot-system:allot";
    let denied = remove_gate_as("alice", ALLOT).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    let message = denied["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "[tenant/allot-gates] spec.schedulingGates: only Allot ({ALLOT}) may remove or change the scheduling gate \
             allot.dev/gang, not alice"
        )),
        "{message}"
    );
    assert_eq!(remove_gate_as(ALLOT, ALLOT).await["allowed"], true);
    // The identity is configurable: another install's service account, and only that one.
    let other = "system:serviceaccount:gpu-admission:allot";
    assert_eq!(remove_gate_as(other, other).await["allowed"], true);
    assert_eq!(remove_gate_as(ALLOT, other).await["allowed"], false);
}

const VOLUME_RULE: &str = r#"apiVersion: allot.dev/v1alpha1
kind: Rule
metadata:
  name: no-projected-volumes
spec:
  match:
    kinds: [Pod]
  expression: "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.projected))"
  message: no projected volumes
"#;

const LAST_APPLIED_RULE: &str = r#"apiVersion: allot.dev/v1alpha1
kind: Rule
metadata:
  name: not-applied-by-kubectl
spec:
  match:
    kinds: [Pod]
  expression: >-
    !has(object.metadata.annotations) ||
    !('kubectl.kubernetes.io/last-applied-configuration' in object.metadata.annotations)
  message: apply through the pipeline, not kubectl
"#;

/// The server leaves out of the objects it decodes what no expression of its policy set reads
/// (a Pod's `spec.volumes`, the last-applied annotation). A set with a Rule reading one keeps
/// it: fixture 011 (kubectl-applied, with the service account token's projected volume) is
/// denied by each such rule, and admitted by the shipped set, which reads neither.
#[tokio::test]
async fn rules_that_read_volumes_or_the_last_applied_copy_see_them() {
    let body = || fixture("011-validate-create-pod-my-gpu-pod.json");
    let shipped = validate_review(&state(), body()).await;
    assert_eq!(shipped["allowed"], true, "{shipped}");
    for (file, rule, message) in [
        ("volumes.yaml", VOLUME_RULE, "no projected volumes"),
        ("applied.yaml", LAST_APPLIED_RULE, "apply through the pipeline, not kubectl"),
    ] {
        let state = state_with(&[(file, rule)]);
        assert_ne!(state.policies.load().unread, allot::model::policy::Unread::EVERYTHING, "{file}");
        let response = validate_review(&state, body()).await;
        assert_eq!(response["allowed"], false, "{file}: {response}");
        let said = response["status"]["message"].as_str().unwrap_or_default();
        assert!(said.contains(message), "{file}: {said}");
    }
}
