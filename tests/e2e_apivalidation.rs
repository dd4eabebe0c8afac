//! `allot::model::apivalidation` against the real kube-apiserver (skipped without the envtest binaries):
//! for a table of Pods and Pod templates, server-side dry-run creates must be refused exactly
//! when Allot's port of the API server's rules reports a problem, and the API server's message
//! must name the field Allot names. This keeps `allot check`'s `api-server/validation` and the
//! policy loader honest about what the API server really does (issue #11).

mod support;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::cluster::{ControlPlane, binaries_from_env};

/// A Pod in `default` with one container and these extra `spec` fields / `metadata`.
fn pod(name: &str, metadata: Value, spec: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]},
    });
    for (k, v) in metadata.as_object().into_iter().flatten() {
        pod["metadata"][k] = v.clone();
    }
    for (k, v) in spec.as_object().into_iter().flatten() {
        pod["spec"][k] = v.clone();
    }
    pod
}

fn required(expressions: Value) -> Value {
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}})
}

/// (name, metadata, spec): accepted by the API server iff Allot finds nothing.
fn cases() -> Vec<(&'static str, Value, Value)> {
    let long = "a".repeat(70);
    let huge = "x".repeat(256 * 1024);
    vec![
        (
            "valid-everything",
            json!({"labels": {"app": "a".repeat(63)}, "annotations": {"Example.COM/Note": "x"}}),
            json!({
                "nodeSelector": {"example.com/pool": "a100", "node-type": ""},
                "tolerations": [{"operator": "Exists"}, {"key": "a", "operator": "Equal", "value": "b", "effect": "NoExecute", "tolerationSeconds": 5}, {"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                "affinity": required(json!([{"key": "zone", "operator": "In", "values": ["a"]}, {"key": "mem", "operator": "Gt", "values": ["80"]}, {"key": "gpu", "operator": "Exists"}])),
                "schedulingGates": [{"name": "allot.dev/gang"}, {"name": "example.com/wait"}],
                "priorityClassName": "low-priority",
            }),
        ),
        ("bad-selector-key", json!({}), json!({"nodeSelector": {"example.com/pool~x": "a100"}})),
        ("long-selector-value", json!({}), json!({"nodeSelector": {"pool": long}})),
        ("bad-class", json!({}), json!({"priorityClassName": "Low_Priority"})),
        ("exists-with-value", json!({}), json!({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]})),
        ("empty-key-equal", json!({}), json!({"tolerations": [{"operator": "Equal", "value": "b"}]})),
        (
            "seconds-not-noexecute",
            json!({}),
            json!({"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]}),
        ),
        ("bad-toleration-value", json!({}), json!({"tolerations": [{"key": "a", "value": "not ok"}]})),
        ("bad-toleration-key", json!({}), json!({"tolerations": [{"key": "a~b", "operator": "Exists"}]})),
        (
            "bad-affinity-value",
            json!({}),
            json!({"affinity": required(json!([{"key": "zone", "operator": "In", "values": ["not ok"]}]))}),
        ),
        (
            "bad-affinity-key",
            json!({}),
            json!({"affinity": required(json!([{"key": "bad key", "operator": "Exists"}]))}),
        ),
        ("in-without-values", json!({}), json!({"affinity": required(json!([{"key": "zone", "operator": "In"}]))})),
        (
            "gt-two-values",
            json!({}),
            json!({"affinity": required(json!([{"key": "mem", "operator": "Gt", "values": ["1", "2"]}]))}),
        ),
        (
            "no-terms",
            json!({}),
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
        ),
        (
            "preferred-weight-0",
            json!({}),
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["not ok"]}]}}]}}}),
        ),
        (
            "duplicate-gate",
            json!({}),
            json!({"schedulingGates": [{"name": "allot.dev/gang"}, {"name": "allot.dev/gang"}]}),
        ),
        ("bad-gate", json!({}), json!({"schedulingGates": [{"name": "a b"}]})),
        ("gated-with-node", json!({}), json!({"nodeName": "node-1", "schedulingGates": [{"name": "allot.dev/gang"}]})),
        ("bad-label", json!({"labels": {"app": "-x"}}), json!({})),
        ("long-label-key", json!({"labels": {"k".repeat(64): "x"}}), json!({})),
        ("long-label-key-prefix", json!({"labels": {format!("{}/x", "p".repeat(254)): "x"}}), json!({})),
        ("bad-label-key-prefix", json!({"labels": {"Example.com/x": "x"}}), json!({})),
        ("bad-annotation-key", json!({"annotations": {"a/b/c": "x"}}), json!({})),
        ("huge-annotations", json!({"annotations": {"a": huge}}), json!({})),
    ]
}

#[test]
fn the_api_server_refuses_exactly_what_apivalidation_reports() {
    const TEST: &str = "the_api_server_refuses_exactly_what_apivalidation_reports";
    let Some([etcd, apiserver]) = binaries_from_env(TEST, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    allot::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let server = ControlPlane::start(&etcd, &apiserver).await;
        let classes: Api<PriorityClass> = Api::all(server.client.clone());
        let class = serde_json::from_value(json!({"metadata": {"name": "low-priority"}, "value": 100})).unwrap();
        classes.create(&PostParams::default(), &class).await.expect("PriorityClass low-priority");
        // No controller-manager here: the ServiceAccount admission plugin needs `default`.
        let accounts: Api<ServiceAccount> = Api::namespaced(server.client.clone(), "default");
        let account = serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        accounts.create(&PostParams::default(), &account).await.expect("ServiceAccount default");
        let pods: Api<Pod> = Api::namespaced(server.client.clone(), "default");
        let dry_run = PostParams { dry_run: true, ..PostParams::default() };
        let mut disagreements = Vec::new();
        for (name, metadata, spec) in cases() {
            let object = pod(name, metadata, spec);
            let ours = allot::model::apivalidation::pod(&object, "", true);
            let typed: Pod = serde_json::from_value(object).expect("a Pod");
            let theirs = pods.create(&dry_run, &typed).await;
            match (&theirs, ours.is_empty()) {
                (Ok(_), true) => {}
                (Err(kube::Error::Api(status)), false) => {
                    // The Priority plugin refuses an unknown class before validation runs; any
                    // refusal is agreement there. Elsewhere the API server must say, word for
                    // word, what Allot says: field path and message.
                    let named = ours.iter().all(|e| status.message.contains(&e.to_string()));
                    if !named && name != "bad-class" {
                        disagreements.push(format!("{name}: we say {ours:?}; the API server says {}", status.message));
                    }
                }
                (theirs, _) => {
                    disagreements.push(format!("{name}: we say {ours:?}; the API server says {theirs:?}"));
                }
            }
        }
        assert!(disagreements.is_empty(), "disagreements:\n  {}", disagreements.join("\n  "));

        // Priority class names: the Priority plugin refuses a Pod's unknown class before
        // validation, so the words are compared where the same rule names PriorityClasses.
        for name in ["Low_Priority".to_string(), "p".repeat(254)] {
            let ours = allot::model::apivalidation::dns1123_subdomain(&name);
            assert!(!ours.is_empty(), "{name}");
            let class = serde_json::from_value(json!({"metadata": {"name": name}, "value": 1})).unwrap();
            match classes.create(&dry_run, &class).await {
                Err(kube::Error::Api(status)) => {
                    for msg in &ours {
                        assert!(status.message.contains(msg.as_str()), "{msg} vs {}", status.message);
                    }
                }
                other => panic!("the API server should refuse PriorityClass {name}: {other:?}"),
            }
        }

        // A Pod template: the API server refuses the Job; Allot names the same field.
        let jobs: Api<Job> = Api::namespaced(server.client.clone(), "default");
        let job = json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "typo", "namespace": "default"},
            "spec": {"template": {
                "metadata": {"labels": {"run": "two words"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]},
            }},
        });
        let template =
            json!({"metadata": job["spec"]["template"]["metadata"], "spec": job["spec"]["template"]["spec"]});
        let ours = allot::model::apivalidation::pod(&template, "spec.template", false);
        assert_eq!(ours.len(), 1, "{ours:?}");
        let refused = jobs.create(&dry_run, &serde_json::from_value(job).unwrap()).await;
        match refused {
            Err(kube::Error::Api(status)) => {
                assert!(status.message.contains(&ours[0].to_string()), "{} vs {}", ours[0], status.message)
            }
            other => panic!("the API server should refuse the Job: {other:?}"),
        }
    });
}
