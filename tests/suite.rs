//! `allot test`, run as the binary: the shipped suites pass, a wrong expectation fails with what
//! differed, a broken test file is an error, `--junit` writes one test case per case. Also: the
//! shipped suites cover every policy in policies/, and the CI examples run the documented commands.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{allot, root, stderr, stdout};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `(passed, failed)` from the summary line `N case(s) in M test(s): P passed, F failed`.
fn summary(text: &str) -> (usize, usize) {
    let line = text.lines().find(|l| l.contains(" case(s) in ")).unwrap_or_else(|| panic!("no summary in:\n{text}"));
    let number = |word: &str| {
        let before = line.split(word).next().unwrap_or("");
        before.trim_end().rsplit(' ').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    (number(" passed"), number(" failed"))
}

#[test]
fn the_shipped_policy_tests_pass() {
    let out = allot(&["test", "policy-tests/"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    let (passed, failed) = summary(&text);
    assert_eq!(failed, 0, "{text}");
    assert!(passed >= 60, "the shipped suites have fallen to {passed} cases:\n{text}");
    assert!(!text.contains("FAIL"), "{text}");
    // Fixtures in the directory (a GangPolicy, a Pod) are not test files.
    assert!(!text.lines().any(|l| l.starts_with("policy-tests/fixtures/")), "{text}");
}

/// What a test of each shipped policy must mention: a Rule's name; the rule name of each Cluster
/// check that is on; a Placement's toleration keys (its changes are patches, not findings); a
/// Team's name in a message, `team/priority-class` and `team/quota` when it sets them; the gang
/// gate and `gang/consistency` for a GangPolicy.
fn shipped_policy_markers() -> Vec<(String, String)> {
    let mut markers = Vec::new();
    for entry in std::fs::read_dir(root().join("policies")).expect("policies/") {
        let path = entry.expect("entry").path();
        for doc in documents(&path) {
            let name = doc["metadata"]["name"].as_str().unwrap_or("").to_string();
            let what = format!("{} {name} ({})", doc["kind"].as_str().unwrap_or(""), path.display());
            match doc["kind"].as_str() {
                Some("Rule") => markers.push((what, name)),
                Some("Placement") => {
                    for t in doc["spec"]["tolerations"].as_array().into_iter().flatten() {
                        let key = t["key"].as_str().unwrap_or("").to_string();
                        markers.push((what.clone(), format!("key: {key}")));
                    }
                }
                Some("Cluster") => {
                    for (check, setting) in doc["spec"]["accelerators"]["checks"].as_object().into_iter().flatten() {
                        let off = setting.as_str() == Some("Off") || setting["action"].as_str() == Some("Off");
                        if !off {
                            let kebab: String = check
                                .chars()
                                .flat_map(|c| {
                                    if c.is_ascii_uppercase() { vec!['-', c.to_ascii_lowercase()] } else { vec![c] }
                                })
                                .collect();
                            markers.push((format!("{what} check {check}"), format!("accelerators/{kebab}")));
                        }
                    }
                }
                Some("Team") => {
                    markers.push((what.clone(), format!("team {name} ")));
                    if doc["spec"]["priority"]["allowed"].is_array() {
                        markers.push((what.clone(), "team/priority-class".into()));
                    }
                    if doc["spec"]["quota"].is_object() {
                        markers.push((format!("{what} quota"), "team/quota".into()));
                    }
                }
                Some("GangPolicy") => {
                    markers.push((what.clone(), "allot.dev/gang".into()));
                    markers.push((what, "gang/consistency".into()));
                }
                _ => {}
            }
        }
    }
    markers
}

#[test]
fn the_shipped_policy_tests_cover_every_shipped_policy() {
    let mut tests = String::new();
    for entry in std::fs::read_dir(root().join("policy-tests")).expect("policy-tests/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            tests.push_str(&std::fs::read_to_string(&path).expect("read"));
        }
    }
    let markers = shipped_policy_markers();
    assert!(markers.len() >= 12, "the shipped policies hold fewer things to test than expected: {markers:#?}");
    let uncovered: BTreeSet<String> = markers
        .into_iter()
        .filter(|(_, marker)| !tests.contains(marker.as_str()))
        .map(|(what, marker)| format!("{what}: no test mentions {marker:?}"))
        .collect();
    assert!(uncovered.is_empty(), "policies without a test in policy-tests/:\n{uncovered:#?}");
}

fn suite_with_one_wrong_case(dir: &Path) -> PathBuf {
    let policies = root().join("policies");
    let gpu_pod = root().join("examples/pods/gpu-pod.yaml");
    write(
        dir,
        "wrong.yaml",
        &format!(
            "apiVersion: allot.dev/v1alpha1
kind: Test
metadata: {{name: one-wrong}}
policies: {policies}
cases:
  - name: the GPU pod is admitted
    path: {gpu_pod}
    expect: {{allowed: true, deniedBy: []}}
  - name: the GPU pod gets high-priority
    path: {gpu_pod}
    expect:
      fields: {{/spec/priorityClassName: high-priority}}
      warnedBy: []
",
            policies = policies.display(),
            gpu_pod = gpu_pod.display()
        ),
    )
}

#[test]
fn a_wrong_expectation_exits_one_and_says_what_differed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = suite_with_one_wrong_case(dir.path());
    let out = allot(&["test", file.to_str().expect("utf-8 path")]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    for expected in [
        "  ok    the GPU pod is admitted\n",
        "  FAIL  the GPU pod gets high-priority\n",
        "        fields /spec/priorityClassName: expected \"high-priority\", got \"low-priority\"\n",
        "        the engine decided:\n",
        "gpu-pod.yaml#1 Pod vision/my-gpu-pod: admitted, mutated",
        "add     /spec/priorityClassName \"low-priority\"",
        "2 case(s) in 1 test(s): 1 passed, 1 failed",
        "FAILED  ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert_eq!(summary(&text), (1, 1));
}

#[test]
fn broken_test_files_policies_and_resources_exit_two() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policies = root().join("policies");
    let header = format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: broken}}\npolicies: {}\n",
        policies.display()
    );
    let pod = "{apiVersion: v1, kind: Pod, metadata: {name: p, namespace: vision}, spec: {containers: []}}";

    // An unknown field: file, document, field path and case in the message.
    let typo = write(
        dir.path(),
        "typo.yaml",
        &format!("{header}cases:\n  - name: typo\n    resource: {pod}\n    expect: {{allowd: true}}\n"),
    );
    let out = allot(&["test", typo.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "{}: document 1 (Test broken): cases[0].expect.allowd: unknown field `allowd`",
            typo.display()
        )),
        "{err}"
    );
    assert!(err.contains("(case \"typo\")"), "{err}");
    assert!(stdout(&out).is_empty(), "no case runs when a test file is broken: {}", stdout(&out));

    // A case that expects nothing; a resource that cannot be read; a broken policy directory.
    let bad_policies = tempfile::tempdir().expect("tempdir");
    write(
        bad_policies.path(),
        "r.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec: {expression: 'object.(', message: m}\n",
    );
    let nothing = write(dir.path(), "nothing.yaml", &format!("{header}cases:\n  - name: idle\n    resource: {pod}\n"));
    let missing = write(
        dir.path(),
        "missing.yaml",
        &format!("{header}cases:\n  - name: gone\n    path: no/such/pod.yaml\n    expect: {{allowed: true}}\n"),
    );
    let uses_bad_policies = write(
        dir.path(),
        "bad-policies.yaml",
        &format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: bp}}\npolicies: {}\ncases:\n  - name: any\n    resource: {pod}\n    expect: {{allowed: true}}\n",
            bad_policies.path().display()
        ),
    );
    for (file, message) in [
        (&nothing, "cases[0] (\"idle\"): expect: expects nothing".to_string()),
        (&missing, format!("{}/no/such/pod.yaml", dir.path().display())),
        (&uses_bad_policies, "policies: ".to_string() + &bad_policies.path().join("r.yaml").display().to_string()),
        (&uses_bad_policies, "spec.expression: CEL syntax error".to_string()),
    ] {
        let out = allot(&["test", file.to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(2), "{}: {}", file.display(), stdout(&out));
        assert!(stderr(&out).contains(&message), "{message:?} not in:\n{}", stderr(&out));
    }

    // A directory with a broken test file next to a good one: every problem, nothing runs.
    let out = allot(&["test", dir.path().to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("problem(s) in the test files"), "{err}");
    for file in [&typo, &nothing, &missing, &uses_bad_policies] {
        assert!(err.contains(&file.display().to_string()), "{} not in:\n{err}", file.display());
    }
}

#[test]
fn junit_has_a_test_case_per_case_and_a_failure_per_failed_case() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = dir.path().join("shipped.xml");
    let out = allot(&["test", "policy-tests", "--junit", report.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let (passed, _) = summary(&stdout(&out));
    let xml = std::fs::read_to_string(&report).expect("--junit writes the report");
    assert!(xml.starts_with("<?xml"), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), passed, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 0, "{xml}");
    assert!(xml.contains(&format!("<testsuites name=\"allot test\" tests=\"{passed}\" failures=\"0\">")), "{xml}");
    assert_eq!(xml.matches("<testsuite ").count(), xml.matches("</testsuite>").count());

    let file = suite_with_one_wrong_case(dir.path());
    let report = dir.path().join("wrong.xml");
    let out = allot(&["test", file.to_str().expect("utf-8"), "--junit", report.to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1));
    let xml = std::fs::read_to_string(&report).expect("written on failures too");
    assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(
        xml.contains("<failure message=\"fields /spec/priorityClassName: expected &quot;high-priority&quot;, got &quot;low-priority&quot;\""),
        "{xml}"
    );
    assert!(xml.contains("name=\"the GPU pod gets high-priority\""), "{xml}");

    // An unwritable report path is an error after the run.
    let out = allot(&["test", "policy-tests", "--junit", "/nonexistent-dir/report.xml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent-dir/report.xml"), "{}", stderr(&out));
}

#[test]
fn policies_flag_replaces_the_policies_each_test_names() {
    // gang-inference.yaml adds a GangPolicy to the shipped ones; with the shipped ones alone its
    // inferred gangs are not gated, and the suite says so.
    let out = allot(&["test", "--policies", "policies", "policy-tests/gang-inference.yaml"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(text.contains("[policies: policies, version"), "{text}");
    assert!(text.contains("fields /spec/schedulingGates/0/name: expected \"allot.dev/gang\", got absent"), "{text}");
    assert!(
        text.contains("patch: expected 3 op(s), got 2; missing:\n          add     /spec/schedulingGates"),
        "{text}"
    );
    assert_eq!(summary(&text), (3, 5), "{text}");
}

#[test]
fn the_ci_examples_run_the_documented_commands() {
    let hooks = documents(&root().join(".pre-commit-hooks.yaml"));
    let hooks = hooks[0].as_array().expect("a list of hooks");
    let command = |id: &str| {
        let hook = hooks.iter().find(|h| h["id"] == id).unwrap_or_else(|| panic!("hook {id}"));
        let args: Vec<&str> = hook["args"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        format!("{} {}", hook["entry"].as_str().unwrap_or(""), args.join(" "))
    };
    assert_eq!(command("allot-test"), "allot test policy-tests/");
    assert!(command("allot-check").starts_with("allot check --policies policies/"));

    let workflow = documents(&root().join("examples/ci/github-actions.yml.example"));
    let steps = workflow[0]["jobs"]["policies"]["steps"].as_array().expect("steps");
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    let has = |needle: &str| runs.iter().any(|r| r.contains(needle));
    assert!(has("cargo install --locked --path"), "{runs:?}");
    assert!(has("allot test \"$TESTS\" --junit allot-test.xml"), "{runs:?}");
    assert!(has("allot check ") && has("--output junit"), "{runs:?}");
    assert!(steps.iter().any(|s| s["uses"].as_str().is_some_and(|u| u.starts_with("actions/upload-artifact"))));
}
