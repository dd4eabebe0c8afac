//! `allot test --server KUBECONFIG` on a real kube-apiserver (skipped without the envtest
//! binaries): before the native policies are installed every case fails and says so; once
//! `allot compile`'s objects are applied, covered cases pass on the server (a native denial, a
//! native warning, a native toleration), a wrong expectation fails with what the server did,
//! and a case only the webhook can answer is skipped with the reason, never passed. The shipped
//! `policy-tests/` run too: the cases the server answers agree with the engine's expectations.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use support::cluster::{ControlPlane, binaries_from_env};

const SUITE: &str = r#"
apiVersion: allot.dev/v1alpha1
kind: Test
metadata: {name: native on the server}
policies: POLICIES
namespaces: [NAMESPACES]
cases:
  - name: covered-deny
    resource:
      apiVersion: v1
      kind: Pod
      metadata: {name: init-gpu, namespace: vision}
      spec:
        initContainers: [{name: init, image: busybox:1.36, resources: {limits: {nvidia.com/gpu: 1}}}]
        containers: [{name: c, image: busybox:1.36}]
    expect: {allowed: false, deniedBy: [accelerators/init-containers]}
  - name: covered-warn
    resource:
      apiVersion: v1
      kind: Pod
      metadata: {name: unpinned, namespace: vision}
      spec:
        containers: [{name: c, image: busybox:latest, resources: {limits: {nvidia.com/gpu: 1}}}]
    expect:
      allowed: true
      warnedBy: [pinned-images-on-gpus]
      messageContains: [pin an image tag]
  - name: covered-toleration
    resource:
      apiVersion: v1
      kind: Pod
      metadata: {name: placed, namespace: vision}
      spec:
        containers: [{name: c, image: busybox:1.36, resources: {limits: {nvidia.com/gpu: 1}}}]
    expect:
      allowed: true
      warnedBy: []
      fields:
        /spec/tolerations/0/key: nvidia.com/gpu
        /spec/tolerations/1: null
        /spec/priorityClassName: low-priority
  - name: wrong-expectation
    resource:
      apiVersion: v1
      kind: Pod
      metadata: {name: denied-anyway, namespace: vision}
      spec:
        initContainers: [{name: init, image: busybox:1.36, resources: {limits: {nvidia.com/gpu: 1}}}]
        containers: [{name: c, image: busybox:1.36}]
    expect: {allowed: true}
  - name: claim-gpu
    resource:
      apiVersion: v1
      kind: Pod
      metadata: {name: claim, namespace: vision}
      spec:
        resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]
        containers: [{name: c, image: busybox:1.36, resources: {claims: [{name: gpu}]}}]
    expect: {allowed: false, deniedBy: [accelerators/claims]}
"#;

fn allot(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_allot")).args(args).output().expect("run allot");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn set_up(client: &kube::Client) {
    let pp = PostParams::default();
    // The values the shipped suites assume (a Pod that states `priority: 0` for low-priority).
    for (name, value, global) in [("low-priority", 0, true), ("high-priority", 1_000_000, false)] {
        let class: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "value": value, "globalDefault": global}))
                .expect("class");
        Api::<PriorityClass>::all(client.clone()).create(&pp, &class).await.expect("priority class");
    }
    // As examples/cluster/namespaces.yaml, which the suites name (and teams.yaml's vision-dev).
    for ns in ["vision", "vision-dev", "nlp", "nlp-research", "scratch", "default"] {
        let labels = if ns == "nlp-research" { json!({"team": "nlp"}) } else { json!({}) };
        if ns != "default" {
            let namespace: Namespace =
                serde_json::from_value(json!({"metadata": {"name": ns, "labels": labels}})).expect("namespace");
            Api::<Namespace>::all(client.clone()).create(&pp, &namespace).await.expect("namespace");
        }
        // No controller-manager here: the ServiceAccount admission plugin needs `default`.
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa");
        Api::<ServiceAccount>::namespaced(client.clone(), ns).create(&pp, &sa).await.expect("service account");
    }
}

/// `(group, version, kind)` of every custom resource the shipped suites create (JobSets,
/// PyTorchJobs, TrainJobs…): outside Kubernetes' own groups.
fn custom_kinds_of_the_suites(root: &std::path::Path) -> std::collections::BTreeSet<(String, String, String)> {
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(root.join("policy-tests")).expect("policy-tests") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("suite");
        let docs = allot::model::policy::parse_documents(&path.display().to_string(), &text).expect("yaml");
        for (_, doc) in docs {
            for case in doc["cases"].as_array().into_iter().flatten() {
                let resource = &case["resource"];
                let (Some(api_version), Some(kind)) = (resource["apiVersion"].as_str(), resource["kind"].as_str())
                else {
                    continue;
                };
                let Some((group, version)) = api_version.split_once('/') else { continue };
                let builtin = group.ends_with(".k8s.io") || ["batch", "apps", "policy"].contains(&group);
                if group.contains('.') && !builtin {
                    kinds.insert((group.to_string(), version.to_string(), kind.to_string()));
                }
            }
        }
    }
    kinds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allot_test_server_compares_native_answers_with_the_suite() {
    let test = "e2e_test_server::allot_test_server_compares_native_answers_with_the_suite";
    let Some([etcd, apiserver]) = binaries_from_env(test, ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"]) else {
        return;
    };
    allot::install_crypto_provider();
    let root = support::root();
    let dir = tempfile::tempdir().expect("tempdir");
    let suite = dir.path().join("suite.yaml");
    let text = SUITE
        .replace("POLICIES", &root.join("policies").display().to_string())
        .replace("NAMESPACES", &root.join("examples/cluster/namespaces.yaml").display().to_string());
    std::fs::write(&suite, text).expect("suite");
    let suite = suite.to_str().expect("path").to_string();
    // The engine agrees with the suite, the wrong expectation aside.
    let (code, out, _) = allot(&["test", &suite]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("4 passed, 1 failed"), "{out}");

    // Native gang scheduling on, so that the suites' PodGroups are served.
    let plane =
        ControlPlane::start_with_apiserver_args(&etcd, &apiserver, &support::cluster::native_gang_apiserver_args())
            .await;
    let client = plane.client.clone();
    set_up(&client).await;
    let kubeconfig = plane.kubeconfig.to_str().expect("path").to_string();

    // Nothing installed yet: every case fails, saying why.
    let (code, out, err) = allot(&["test", "--server", &kubeconfig, &suite]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("the native policies are not installed") && out.contains("0 passed, 5 failed"), "{out}");

    let (_, objects, _) = allot(&["compile", "--policies", root.join("policies").to_str().expect("path")]);
    support::native::create_all(&client, &objects).await;
    // The API server loads policies asynchronously: retry until the covered cases pass.
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = loop {
        let (code, out, err) = allot(&["test", "--server", &kubeconfig, &suite]);
        if out.contains("3 passed, 1 failed, 1 skipped") {
            assert_eq!(code, 1, "a failed case fails the run: {out}");
            break out;
        }
        assert!(Instant::now() < deadline, "{out}{err}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for case in ["covered-deny", "covered-warn", "covered-toleration"] {
        assert!(out.contains(&format!("  ok    {case}")), "{out}");
    }
    assert!(out.contains("  FAIL  wrong-expectation"), "{out}");
    assert!(out.contains("allowed: expected true, got false") && out.contains("ValidatingAdmissionPolicy"), "{out}");
    assert!(
        out.contains("  skip  claim-gpu (webhook-only: DRA claims: a Pod or template naming resourceClaims is placed"),
        "{out}"
    );

    // Every installed object carries the fingerprint of the policies it was compiled from.
    let installed = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list VAPs");
    let fingerprints: std::collections::BTreeSet<String> = installed
        .items
        .iter()
        .filter_map(|o| o.metadata.annotations.as_ref()?.get("allot.dev/compiled-from").cloned())
        .collect();
    assert_eq!(fingerprints.len(), 1, "one fingerprint on every object: {fingerprints:?}");

    // The policies change (a Rule's message) but the install does not: the run refuses to
    // compare, naming the stale objects, instead of passing or failing against old policies.
    let changed = dir.path().join("changed-policies");
    std::fs::create_dir_all(&changed).expect("dir");
    for entry in std::fs::read_dir(root.join("policies")).expect("policies") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("policy");
        let text = text.replace("makes a rerun train on different code", "makes reruns differ");
        std::fs::write(changed.join(path.file_name().expect("name")), text).expect("write");
    }
    let stale_suite = dir.path().join("stale-suite.yaml");
    std::fs::write(
        &stale_suite,
        SUITE
            .replace("POLICIES", &changed.display().to_string())
            .replace("NAMESPACES", &root.join("examples/cluster/namespaces.yaml").display().to_string()),
    )
    .expect("suite");
    let (code, out, _) = allot(&["test", "--server", &kubeconfig, stale_suite.to_str().expect("path")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("the native policies installed are not these policies'")
            && out.contains("apply `allot compile` for these policies again")
            && out.contains("0 passed, 5 failed"),
        "{out}"
    );

    // An object another compile left behind acts beside the policies: named, and refused.
    let mut extra = installed.items[0].clone();
    extra.metadata = kube::api::ObjectMeta {
        name: Some("allot-left-over".into()),
        annotations: extra.metadata.annotations.clone(),
        ..Default::default()
    };
    let vaps = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(client.clone());
    vaps.create(&PostParams::default(), &extra).await.expect("a left-over policy");
    let (code, out, _) = allot(&["test", "--server", &kubeconfig, &suite]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("1 object(s) another `allot compile` installed act beside these policies (allot-left-over)"),
        "{out}"
    );
    vaps.delete("allot-left-over", &Default::default()).await.expect("delete the left-over");

    // The shipped suites: what the server answers agrees with their expectations. The custom
    // workloads they create (JobSet, PyTorchJob, TrainJob, RayCluster…) are served, as their
    // operators' CRDs would, so the native policies answer for them too.
    let custom = custom_kinds_of_the_suites(&root);
    assert!(custom.len() >= 6, "the shipped suites create these custom kinds: {custom:?}");
    support::cluster::serve_custom_kinds(&client, &custom).await;
    let (_, out, err) = allot(&["test", "--server", &kubeconfig, root.join("policy-tests").to_str().expect("path")]);
    let summary = out.lines().rev().find(|l| l.contains("on the server")).unwrap_or_default().to_string();
    eprintln!("shipped policy-tests on the server: {summary}\n{out}{err}");
    // "N passed, N failed, N skipped (webhook-only) on the server"
    let number = |word: &str| {
        let words: Vec<&str> = summary.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        words.windows(2).find(|w| w[1] == word).and_then(|w| w[0].parse::<usize>().ok())
    };
    let passed = number("passed").unwrap_or(0);
    assert!(passed >= 10, "too few shipped cases answered natively: {summary}");
    // Every mismatch is one of the known differences of the native form, none a verdict the
    // native policies got wrong: the API server's own validation refuses first (a request that
    // differs from an extended resource's limit, with the TPU case's class then never set); a
    // map-keyed template is named with `*` and an Audit message goes to the audit log.
    let known: Vec<&str> = KNOWN_WITH_ITS_OWN_POLICIES
        .iter()
        .copied()
        // Suites whose policy set adds fixtures to ../policies compile to other objects than the
        // ones installed: refused here, rather than compared with another set's answers (each is
        // compared with its own set below).
        .chain(["the native policies installed are not these policies'"])
        .collect();
    let mismatches: Vec<&str> = out.lines().filter(|l| l.starts_with("        ")).map(str::trim).collect();
    let unknown: Vec<&&str> =
        mismatches.iter().filter(|m| !known.iter().any(|k| m.contains(k)) && !first_denial_only(m)).collect();
    assert!(unknown.is_empty(), "native answers that disagree with the shipped suites: {unknown:#?}");

    // The suites whose policy sets add fixtures to ../policies: each against its own compiled
    // set, installed in place of the shipped one, so that every shipped suite is compared.
    for (suite, policies) in suites_with_their_own_policies(&root.join("policy-tests")) {
        let set = dir.path().join(format!("set-{}", suite.file_stem().expect("name").to_string_lossy()));
        std::fs::create_dir_all(&set).expect("dir");
        for file in policies {
            std::fs::copy(&file, set.join(file.file_name().expect("name"))).expect("copy a policy file");
        }
        let (_, objects, err) = allot(&["compile", "--policies", set.to_str().expect("path")]);
        assert!(!objects.is_empty(), "{err}");
        support::native::delete_compiled(&client).await;
        support::native::create_all(&client, &objects).await;
        let suite = suite.to_str().expect("path");
        // The API server loads policies asynchronously: retry until what differs is known.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, out, err) = allot(&["test", "--server", &kubeconfig, suite]);
            let unknown: Vec<&str> = out
                .lines()
                .filter(|l| l.starts_with("        "))
                .map(str::trim)
                .filter(|m| !KNOWN_WITH_ITS_OWN_POLICIES.iter().any(|k| m.contains(k)) && !first_denial_only(m))
                .collect();
            if unknown.is_empty() {
                eprintln!("{suite} on the server with its own policies:\n{out}");
                break;
            }
            assert!(Instant::now() < deadline, "{suite} with its own policies: {unknown:#?}\n{out}{err}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The known differences of the native form (see the shipped run): a suite run with its own
/// compiled policies must be compared, not refused as "not these policies'".
const KNOWN_WITH_ITS_OWN_POLICIES: &[&str] = &[
    "got [api-server/validation]",
    "messageContains: neither the refusal nor a warning contains",
    "must be equal to google.com/tpu limit",
    "fields /spec/priorityClassName: expected \"low-priority\", got absent",
];

/// The shipped suites whose `policies:` is not just `../policies`, with the policy files each
/// loads (directories expanded).
fn suites_with_their_own_policies(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<std::path::PathBuf>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("policy-tests") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&std::fs::read_to_string(&path).expect("suite")).expect("yaml");
        let listed: Vec<String> = match &docs[0]["policies"] {
            Value::String(one) => vec![one.clone()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).map(String::from).collect(),
            _ => continue,
        };
        if listed == ["../policies"] {
            continue;
        }
        let files = listed
            .iter()
            .map(|p| dir.join(p))
            .flat_map(|p| {
                if p.is_dir() {
                    std::fs::read_dir(&p).expect("dir").map(|e| e.expect("entry").path()).collect()
                } else {
                    vec![p]
                }
            })
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        out.push((path, files));
    }
    out.sort();
    assert!(out.len() >= 2, "suites with fixture policies: {out:?}");
    out
}

/// `deniedBy: expected [a, b], got [a]`: the API server answers a request with the first
/// failing validation of the first denying policy only, so a native refusal names one check
/// where the engine names every one that failed. Known when what the server named is one of
/// the expected checks.
fn first_denial_only(mismatch: &str) -> bool {
    let Some(rest) = mismatch.strip_prefix("deniedBy: expected [") else { return false };
    let Some((expected, got)) = rest.split_once("], got [") else { return false };
    let got = got.trim_end_matches(']');
    let expected: Vec<&str> = expected.split(", ").collect();
    !got.is_empty() && !got.contains(", ") && expected.len() > 1 && expected.contains(&got)
}

#[test]
fn only_a_single_expected_check_counts_as_the_first_denial() {
    assert!(first_denial_only(
        "deniedBy: expected [accelerators/init-containers, accelerators/max-per-pod], got [accelerators/init-containers]"
    ));
    assert!(!first_denial_only(
        "deniedBy: expected [accelerators/init-containers, accelerators/max-per-pod], got [api-server/validation]"
    ));
    assert!(!first_denial_only("deniedBy: expected [accelerators/init-containers], got []"));
    assert!(!first_denial_only("deniedBy: expected [a], got [a, b]"));
    assert!(!first_denial_only("allowed: expected true, got false"));
}
