//! `allot compile` as a user runs it: YAML objects on stdout (or `--out`), the per-policy report
//! on stderr, exit 1 under `--strict` when something stays webhook-only, 2 for a bad policy.

use std::process::Command;

use serde_json::Value;

fn allot(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_allot")).args(args).output().expect("allot runs");
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn shipped() -> String {
    format!("{}/policies", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn shipped_policies_compile_with_a_report() {
    let (code, stdout, stderr) = allot(&["compile", "--policies", &shipped()]);
    assert_eq!(code, 0, "{stderr}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).expect("YAML on stdout");
    assert!(docs.iter().any(|d| d["kind"] == "MutatingAdmissionPolicy"));
    assert!(docs.iter().any(|d| d["kind"] == "ValidatingAdmissionPolicyBinding"));
    assert!(docs.iter().all(|d| d["apiVersion"] == "admissionregistration.k8s.io/v1"));
    // Its reserveTolerations stays with the webhook (a node's taints are cluster state).
    assert!(stderr.contains("Placement/nvidia-gpu: partly compiled"), "{stderr}");
    assert!(stderr.contains("webhook  reserveTolerations (deny)"), "{stderr}");
    assert!(stderr.contains("Rule/gpu-pods-belong-to-a-team: compiled"), "{stderr}");
    assert!(stderr.contains("Cluster/accelerators.checks: compiled"), "{stderr}");
    assert!(stderr.contains("Team/vision: webhook-only"), "{stderr}");
}

#[test]
fn strict_fails_when_something_stays_in_the_webhook_and_passes_when_nothing_does() {
    let (code, stdout, _) = allot(&["compile", "--policies", &shipped(), "--strict"]);
    assert_eq!(code, 1);
    assert!(!stdout.is_empty(), "the objects are still printed");

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("p.yaml"),
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: no-latest}\nspec:\n  expression: \"object.spec.containers.all(c, !c.image.endsWith(':latest'))\"\n  message: pin images\n",
    )
    .expect("policy");
    let out = dir.path().join("native.yaml");
    let (code, stdout, stderr) = allot(&[
        "compile",
        "--policies",
        dir.path().to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
        "--strict",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.is_empty());
    let written = std::fs::read_to_string(&out).expect("--out written");
    assert!(written.contains("allot-rule-no-latest-pod"), "{written}");
}

#[test]
fn a_bad_policy_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("p.yaml"),
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: x}\nspec: {expresion: 'true'}\n",
    )
    .expect("policy");
    let (code, stdout, stderr) = allot(&["compile", "--policies", dir.path().to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("expresion"), "{stderr}");
}
