//! In-process router tests: the HTTP layer (status codes, limits, probes, metrics) without
//! sockets or TLS.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use allot::namespaces::NoNamespaces;
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
    let policies = allot::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
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
    let (status, _) =
        call(router(state(), LIMIT, TIMEOUT), "POST", "/mutate", serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
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
    use allot::gang::state::{ClusterState, PodRecord};
    let policies = allot::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
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

/// Fixture 021 (a gated gang worker whose `allot.dev/gang` gate is removed), sent as `username`
/// to a server that knows Allot as `allot_username`.
async fn remove_gate_as(username: &str, allot_username: &str) -> Value {
    let policies = allot::policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let state = AppState::with_identity(
        policies,
        Arc::new(NoNamespaces),
        Arc::new(allot::gang::state::ClusterState::default()),
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
