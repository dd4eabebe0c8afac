//! The `allot` binary's offline commands: `check`, `certs`, `webhooks`.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use serde_json::Value;
use support::{allot, root, stderr, stdout};

#[test]
fn check_on_the_examples_reports_mutations_and_denials() {
    let out =
        allot(&["check", "--policies", "policies", "--namespaces", "examples/cluster/namespaces.yaml", "examples"]);
    assert_eq!(out.status.code(), Some(1), "examples include denials on purpose\n{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "examples/pods/gpu-pod.yaml#1 Pod vision/my-gpu-pod: admitted, mutated",
        "~ placement/nvidia-gpu: add toleration nvidia.com/gpu:NoSchedule",
        r#"add     /spec/tolerations [{"effect":"NoSchedule","key":"nvidia.com/gpu","operator":"Exists"}]"#,
        "examples/pods/mig-fraction.yaml#1 Pod vision/half-a-slice: DENIED",
        "deny  [accelerators/whole-numbers] spec.containers[0]",
        "PyTorchJob nlp-research/bert-finetune: DENIED",
        "[accelerators/requests-equal-limits] spec.pytorchReplicaSpecs.Worker.template.spec.containers[0]",
        "warn  [pinned-images-on-gpus]",
        "Job vision/mnist-ddp: admitted",
        "object(s):",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // With the namespace labels, nlp-research belongs to team nlp: no "no team" denial.
    assert!(!text.contains("namespace nlp-research belongs to no team"), "{text}");
}

#[test]
fn check_json_output_is_complete() {
    let out = allot(&["check", "--policies", "policies", "--output", "json", "examples/pods", "examples/workloads"]);
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let results = report["results"].as_array().unwrap();
    assert_eq!(report["summary"]["objects"], results.len());
    let gpu = results.iter().find(|r| r["name"] == "my-gpu-pod").unwrap();
    assert_eq!(gpu["allowed"], true);
    assert_eq!(gpu["mutated"], true);
    assert_eq!(gpu["patch"][0]["op"], "add");
    assert_eq!(gpu["patch"][0]["path"], "/spec/tolerations");
    let denied = results.iter().find(|r| r["name"] == "half-a-slice").unwrap();
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["findings"][0]["action"], "Deny");
    assert_eq!(denied["findings"][0]["path"], "spec.containers[0]");
    assert!(report["policyVersion"].as_str().unwrap().len() == 12);
    // Without --namespaces the CLI says what it could not evaluate.
    let pt = results.iter().find(|r| r["name"] == "bert-finetune").unwrap();
    assert!(pt["notes"][0].as_str().unwrap().contains("labels of namespace \"nlp-research\" are unknown"), "{pt}");
}

#[test]
fn check_junit_output() {
    let out = allot(&["check", "--policies", "policies", "--output", "junit", "examples/pods"]);
    assert_eq!(out.status.code(), Some(1));
    let xml = stdout(&out);
    assert!(xml.starts_with("<?xml"));
    assert_eq!(xml.matches("<testcase ").count(), 4, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 2, "{xml}");
    assert!(xml.contains("tests=\"4\" failures=\"2\""), "{xml}");
    assert!(xml.contains("&apos;:latest&apos;"), "messages are escaped: {xml}");
}

#[test]
fn check_exits_zero_when_everything_is_admitted_and_reads_stdin() {
    let out = allot(&["check", "--policies", "policies", "examples/pods/gpu-pod.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));

    let manifest = std::fs::read(root().join("examples/pods/mig-fraction.yaml")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["check", "--policies", "policies", "-"])
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&manifest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("-#1 Pod vision/half-a-slice: DENIED"), "{}", stdout(&out));
}

#[test]
fn check_reads_lists_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "vision"},
         "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}}
    ]});
    let path = dir.path().join("list.json");
    std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    let out = allot(&["check", "--policies", "policies", "--output", "json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["summary"]["objects"], 2);
    assert_eq!(report["summary"]["mutated"], 1);
}

/// Gang members are compared as the API server will have them: one naming the default
/// scheduler and one naming none agree (the API server names it on both); another scheduler
/// does not.
#[test]
fn check_compares_gang_members_with_the_default_scheduler_filled_in() {
    let dir = tempfile::tempdir().unwrap();
    let member = |name: &str, scheduler: Option<&str>| {
        let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "vision", "labels": {"allot.dev/gang-name": "ring"},
                         "annotations": {"allot.dev/gang-size": "2"}},
            "spec": {"containers": [{"name": "c", "image": "i:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
        if let Some(s) = scheduler {
            pod["spec"]["schedulerName"] = s.into();
        }
        pod
    };
    let run = |second: Option<&str>| {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List",
            "items": [member("w-0", Some("default-scheduler")), member("w-1", second)]});
        let path = write(dir.path(), "gang.json", &list.to_string());
        allot(&["check", "--policies", "policies", path.to_str().unwrap()])
    };
    let out = run(None);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = run(Some("volcano"));
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("this pod has schedulerName volcano, member w-0 has default-scheduler"),
        "{}",
        stdout(&out)
    );
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn bad_input_and_bad_policies_exit_two_with_the_location() {
    let dir = tempfile::tempdir().unwrap();
    let good =
        write(dir.path(), "pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: []}\n");

    // A policy with a typo: file, document and field path in the message.
    let policies = tempfile::tempdir().unwrap();
    write(
        policies.path(),
        "teams.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: a}\nspec: {namespaces: {names: [a]}}\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: b}\nspec:\n  namespaces: {names: [b]}\n  priorty: {}\n",
    );
    let out = allot(&["check", "--policies", policies.path().to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("teams.yaml: document 2 (Team): spec.priorty: unknown field `priorty`"), "{err}");

    // Broken CEL.
    let cel = tempfile::tempdir().unwrap();
    write(
        cel.path(),
        "r.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec: {expression: 'object.(', message: m}\n",
    );
    let out = allot(&["check", "--policies", cel.path().to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("spec.expression: CEL syntax error"), "{}", stderr(&out));

    // A message literal (one stray pair of braces): refused at load, naming the rule, not a
    // crash with exit 101.
    let typo = tempfile::tempdir().unwrap();
    write(
        typo.path(),
        "typo.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: typo}\nspec:\n  expression: object.spec.containers.all(c, c.image{}.contains(':'))\n  message: pin your images\n  action: Warn\n",
    );
    let out = allot(&["check", "--policies", typo.path().to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("typo.yaml: document 1 (Rule typo): spec.expression: `c.image{}` (column 31)"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = allot(&["test", "--policies", typo.path().to_str().unwrap(), "policy-tests"]);
    assert_eq!(out.status.code(), Some(2), "allot test: {}", stderr(&out));
    assert!(stderr(&out).contains("(Rule typo): spec.expression: `c.image{}`"), "{}", stderr(&out));

    // Empty policy directory.
    let empty = tempfile::tempdir().unwrap();
    let out = allot(&["check", "--policies", empty.path().to_str().unwrap(), good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no policy files"), "{}", stderr(&out));

    // Bad manifests.
    for (name, text, message) in [
        ("broken.yaml", "kind: [oops\n", "invalid YAML"),
        ("nokind.yaml", "apiVersion: v1\nmetadata: {name: a}\n", "document 1: kind is missing"),
        ("scalar.yaml", "---\njust a string\n", "not a Kubernetes object"),
    ] {
        let path = write(dir.path(), name, text);
        let out = allot(&["check", "--policies", "policies", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(stderr(&out).contains(message), "{name}: {}", stderr(&out));
    }
    let out = allot(&["check", "--policies", "policies", "does/not/exist.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("does/not/exist.yaml"), "{}", stderr(&out));
}

fn certs(dir: &Path) -> PathBuf {
    let out = allot(&[
        "certs",
        "--out",
        dir.to_str().unwrap(),
        "--dns-name",
        "allot.allot-system.svc",
        "--dns-name",
        "127.0.0.1",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("created CA"), "{}", stdout(&out));
    for f in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(dir.join(f).exists(), "{f}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join("tls.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "private keys are not group/world readable");
    }
    dir.join("ca.crt")
}

#[test]
fn webhooks_render_valid_configurations() {
    let dir = tempfile::tempdir().unwrap();
    let ca = certs(dir.path());
    let out = allot(&["webhooks", "--ca-bundle", ca.to_str().unwrap(), "--service", "allot-system/allot"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout(&out)).expect("YAML");
    assert_eq!(docs.len(), 2);
    assert_eq!(docs[0]["kind"], "MutatingWebhookConfiguration");
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(docs[0].clone()).unwrap();
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(docs[1].clone()).unwrap();
    let m = &mutating.webhooks.unwrap()[0];
    assert_eq!(m.side_effects, "None");
    assert_eq!(m.admission_review_versions, vec!["v1"]);
    assert_eq!(m.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(m.client_config.ca_bundle.as_ref().unwrap().0, std::fs::read(&ca).unwrap());
    let service = m.client_config.service.as_ref().unwrap();
    assert_eq!(
        (service.namespace.as_str(), service.name.as_str(), service.path.as_deref()),
        ("allot-system", "allot", Some("/mutate"))
    );
    let excluded =
        m.namespace_selector.as_ref().unwrap().match_expressions.as_ref().unwrap()[0].values.clone().unwrap();
    assert_eq!(excluded, vec!["kube-system", "allot-system"]);
    assert!(m.match_conditions.as_ref().unwrap().iter().any(|c| c.name == "not-allot-itself"
        && c.expression == "request.userInfo.username != 'system:serviceaccount:' + 'allot-system' + ':' + 'allot'"));
    let v = &validating.webhooks.unwrap()[0];
    assert_eq!(v.side_effects, "None");
    let rules = v.rules.as_ref().unwrap();
    let covers = |group: &str, resource: &str| {
        rules.iter().any(|r| {
            r.api_groups.as_ref().unwrap().contains(&group.to_string())
                && r.resources.as_ref().unwrap().contains(&resource.to_string())
        })
    };
    for (group, resource) in [
        ("", "pods"),
        ("batch", "jobs"),
        ("jobset.x-k8s.io", "jobsets"),
        ("kubeflow.org", "pytorchjobs"),
        ("ray.io", "rayclusters"),
        ("batch.volcano.sh", "jobs"),
    ] {
        assert!(covers(group, resource), "{group}/{resource}");
    }

    let out = allot(&["webhooks", "--ca-bundle", ca.to_str().unwrap(), "--url", "https://10.0.0.1:8443/"]);
    assert!(out.status.success());
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout(&out)).unwrap();
    assert_eq!(docs[1]["webhooks"][0]["clientConfig"]["url"], "https://10.0.0.1:8443/validate");

    for bad in [vec!["--service", "no-slash"], vec!["--url", "http://plain"]] {
        let mut args = vec!["webhooks", "--ca-bundle", ca.to_str().unwrap()];
        args.extend(bad);
        let out = allot(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    }
}

/// Issue #11: a policy value the API server would refuse in every Pod it is written into is a
/// policy error (exit 2, with file, document and field) for `allot check` and `allot test`, not
/// a dry run that says "admitted, mutated".
#[test]
fn policy_values_the_api_server_refuses_exit_two_with_the_location() {
    let dir = tempfile::tempdir().unwrap();
    let pod = write(
        dir.path(),
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: vision}\nspec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: 1}}}]}\n",
    );
    let team = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\nspec:\n  namespaces: {names: [vision]}\n";
    let placement = |selector: &str| {
        format!(
            "{team}---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {{name: gpu}}\nspec:\n  nodeSelector: {{{selector}}}\n"
        )
    };
    let long = "a".repeat(70);
    let cases = [
        (
            placement("example.com/pool~x: a100"),
            "policy.yaml: document 2 (Placement gpu): spec.nodeSelector: Invalid value: \"example.com/pool~x\": name part must consist of alphanumeric characters".to_string(),
        ),
        (
            placement(&format!("pool: {long}")),
            format!("policy.yaml: document 2 (Placement gpu): spec.nodeSelector: Invalid value: \"{long}\": must be no more than 63 bytes"),
        ),
        (
            format!("{team}  priority: {{default: Low_Priority}}\n"),
            "policy.yaml: document 1 (Team vision): spec.priority.default: Invalid value: \"Low_Priority\": a lowercase RFC 1123 subdomain".to_string(),
        ),
    ];
    for (i, (policy, want)) in cases.iter().enumerate() {
        let policies = dir.path().join(format!("policies-{i}"));
        std::fs::create_dir(&policies).unwrap();
        write(&policies, "policy.yaml", policy);
        let out = allot(&["check", "--policies", policies.to_str().unwrap(), pod.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{policy}\n{}", stdout(&out));
        assert!(stderr(&out).contains(want.as_str()), "{}", stderr(&out));
        assert!(stdout(&out).is_empty(), "nothing is evaluated under a refused policy: {}", stdout(&out));

        let test = write(
            dir.path(),
            &format!("test-{i}.yaml"),
            &format!(
                "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: t}}\npolicies: {}\ncases:\n  - name: a GPU pod\n    path: {}\n    expect: {{allowed: true}}\n",
                policies.display(),
                pod.display()
            ),
        );
        let out = allot(&["test", test.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
        assert!(stderr(&out).contains(want.as_str()), "{}", stderr(&out));
    }
}

/// The dry run validates the object as the webhooks leave it with the API server's own rules:
/// what `kubectl apply` would fail on is a denial (exit 1) by `api-server/validation`.
#[test]
fn check_denies_what_the_api_server_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let pods = write(
        dir.path(),
        "pods.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: typo, namespace: vision}\nspec:\n  priorityClassName: Low_Priority\n  containers: [{name: c, image: 'i:1', resources: {limits: {nvidia.com/gpu: 1}}}]\n\
---\napiVersion: v1\nkind: Pod\nmetadata: {name: pinned, namespace: vision}\n\
spec:\n  nodeName: node-1\n  schedulingGates: [{name: example.com/wait}]\n  containers: [{name: c, image: 'i:1'}]\n",
    );
    let out = allot(&[
        "check",
        "--policies",
        "policies",
        "--namespaces",
        "examples/cluster/namespaces.yaml",
        pods.to_str().unwrap(),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}\n{}", stderr(&out));
    for expected in [
        "pods.yaml#1 Pod vision/typo: DENIED",
        "deny  [api-server/validation] spec.priorityClassName: Invalid value: \"Low_Priority\": a lowercase RFC 1123 subdomain",
        "pods.yaml#2 Pod vision/pinned: DENIED",
        // A gated Pod that names its node: the API server refuses the pair at CREATE.
        "deny  [api-server/validation] spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared",
        "0 admitted",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// The annotations `--output github` prints, as (command, file, line, title) of each
/// `::error`/`::warning` line.
fn annotations(text: &str) -> Vec<(String, String, usize, String)> {
    text.lines()
        .filter(|l| l.starts_with("::error ") || l.starts_with("::warning "))
        .map(|l| {
            let (head, _message) = l[2..].split_once("::").expect("a message");
            let (command, properties) = head.split_once(' ').expect("properties");
            let property = |key: &str| {
                properties.split(',').find_map(|p| p.strip_prefix(&format!("{key}="))).unwrap_or_default().to_string()
            };
            (command.to_string(), property("file"), property("line").parse().unwrap_or(0), property("title"))
        })
        .collect()
}

#[test]
fn check_github_output_annotates_the_line_of_each_object() {
    let dir = tempfile::tempdir().unwrap();
    let gpu_pod = |name: &str, gpus: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: vision\nspec:\n  containers:\n    - name: c\n      image: ghcr.io/example/train:1.0\n      resources:\n        limits:\n          nvidia.com/gpu: {gpus}\n"
        )
    };
    // Leading comments and separators; the 2nd document admitted, the 1st and 3rd denied.
    let yaml = format!(
        "# Three pods.\n# The first asks half a GPU.\n---\n{}---\n# fine\n{}---\n\n\n{}",
        gpu_pod("half", "500m"),
        gpu_pod("fine", "\"1\""),
        gpu_pod("latest", "\"1\"").replace("train:1.0", "train:latest").replace("\"1\"", "\"20\"")
    );
    let yaml_path = write(dir.path(), "pods.yaml", &yaml);
    let line_of = |text: &str, name: &str| {
        let name_line = text.lines().position(|l| l == format!("  name: {name}")).unwrap();
        // The object starts at its apiVersion, three lines above its name.
        name_line + 1 - 3
    };
    // A JSON file: one object, pretty-printed, starting at line 1.
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "i:1", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}]}}}
    }))
    .unwrap();
    let json_path = write(dir.path(), "job.json", &json);
    let out = allot(&[
        "check",
        "--policies",
        "policies",
        "--output",
        "github",
        yaml_path.to_str().unwrap(),
        json_path.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "exit codes as for the other outputs\n{}", stderr(&out));
    let text = stdout(&out);
    let found = annotations(&text);
    let yaml_file = yaml_path.display().to_string();
    let json_file = json_path.display().to_string();
    let expect = [
        ("error", &yaml_file, line_of(&yaml, "half"), "allot denied%3A accelerators/whole-numbers"),
        ("error", &yaml_file, line_of(&yaml, "latest"), "allot denied%3A accelerators/max-per-pod"),
        ("warning", &yaml_file, line_of(&yaml, "latest"), "allot warning%3A pinned-images-on-gpus"),
        ("error", &json_file, 1, "allot denied%3A accelerators/whole-numbers"),
    ];
    for (command, file, line, title) in expect {
        assert!(
            found.iter().any(|f| f.0 == command && &f.1 == file && f.2 == line && f.3 == title),
            "no {command} on {file}:{line} titled {title} in:\n{text}"
        );
    }
    assert_eq!(line_of(&yaml, "half"), 4, "the test's own arithmetic");
    assert!(found.iter().all(|f| f.2 != line_of(&yaml, "fine")), "the admitted pod has no annotation:\n{text}");
    assert!(text.contains("::group::allot check report\n"), "{text}");
    assert!(text.ends_with("allot check: 4 object(s), 1 admitted (1 mutated), 3 denied, 1 with warnings\n"), "{text}");

    // Everything admitted: exit 0, no annotation.
    let fine = write(dir.path(), "fine.yaml", &gpu_pod("fine", "\"1\""));
    let out = allot(&["check", "--policies", "policies", "--output", "github", fine.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(annotations(&stdout(&out)).is_empty(), "{}", stdout(&out));
}

#[test]
fn every_argument_of_every_command_has_help() {
    fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        let path = format!("{path} {}", command.get_name());
        if command.get_about().is_none() && command.get_long_about().is_none() {
            missing.push(format!("{path}: the command has no description"));
        }
        for arg in command.get_arguments() {
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path}: {}", arg.get_id()));
            }
            // A flag that takes one of a few values says what each one does.
            for value in arg.get_possible_values() {
                let is_bool = ["true", "false"].contains(&value.get_name());
                if value.get_help().is_none() && !is_bool {
                    missing.push(format!("{path}: {} {}", arg.get_id(), value.get_name()));
                }
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, &path, missing);
        }
    }
    let mut missing = Vec::new();
    walk(&allot::cli::command(), "", &mut missing);
    assert!(missing.is_empty(), "arguments without help text:\n{}", missing.join("\n"));
}

#[test]
fn usage_lines_list_only_what_is_required() {
    for verb in allot::cli::command().get_subcommands().map(|c| c.get_name().to_string()) {
        if verb == "help" {
            continue;
        }
        let help = stdout(&allot(&[verb.as_str(), "--help"]));
        let usage = help.lines().find(|l| l.starts_with("Usage: ")).expect("a usage line").to_string();
        assert!(!usage.contains("--log-format"), "{usage}");
        // The usage of the error for a missing argument, with --log-format given on the
        // command line and through the environment: the same line as --help shows.
        let out = Command::new(env!("CARGO_BIN_EXE_allot"))
            .args(["--log-format", "json", verb.as_str()])
            .env("ALLOT_LOG_FORMAT", "json")
            .current_dir(root())
            .output()
            .unwrap();
        let error = stderr(&out);
        if out.status.code() == Some(2) && error.contains("required arguments were not provided") {
            let error_usage = error.lines().find(|l| l.starts_with("Usage: ")).expect("usage in the error");
            assert_eq!(error_usage, usage, "{verb}: {error}");
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["check", "--log-format", "json", "examples/"])
        .current_dir(root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("Usage: allot check [OPTIONS] --policies <POLICIES> [PATHS]...\n"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn check_without_manifests_lints_the_policies() {
    let out = allot(&["check", "--policies", "policies"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("policies: 5 file(s), "), "{text}");
    assert!(text.ends_with("; no manifests given\n"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "rules.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  expression: object.spec.(\n",
    );
    let out = allot(&["check", "--policies", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("rules.yaml"), "{}", stderr(&out));

    // Other outputs: an empty report.
    let out = allot(&["check", "--policies", "policies", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["summary"]["objects"], 0);
}
