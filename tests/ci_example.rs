//! The CI example of `examples/ci/` and the pre-commit hooks, run as a policy repository runs
//! them: a scratch Git repository with policies, tests and manifests, a pull-request branch that
//! changes some manifests, and the real `allot` binary on PATH.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{root, stderr, stdout};

/// `git` in `dir`, isolated from the machine's Git configuration.
fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().expect("a parent")).unwrap();
    std::fs::write(path, text).unwrap();
}

/// PATH with the `allot` under test first.
fn path_with_allot() -> String {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_allot"));
    let dir = bin.parent().expect("bin dir").display().to_string();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

fn gpu_pod(name: &str, gpus: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: vision\nspec:\n  containers:\n    - name: c\n      image: ghcr.io/example/train:1.0\n      resources:\n        limits:\n          nvidia.com/gpu: {gpus}\n"
    )
}

/// 1-based line of the `apiVersion:` of the object named `name` in `text` (its first key).
fn object_line(text: &str, name: &str) -> usize {
    let name_line = text.lines().position(|l| l == format!("  name: {name}")).expect("the object");
    let lines: Vec<&str> = text.lines().collect();
    (0..name_line).rev().find(|&i| lines[i].starts_with("apiVersion:")).expect("its apiVersion") + 1
}

/// A policy repository laid out as the example expects, with the shipped policies, one test
/// suite, the example namespaces, and two manifests on `main`.
fn policy_repository() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    git(repo, &["init", "-q", "-b", "main"]);
    for file in allot::model::files::yaml_files(&root().join("policies")).unwrap() {
        let name = file.file_name().unwrap().to_str().unwrap().to_string();
        std::fs::create_dir_all(repo.join("policies")).unwrap();
        std::fs::copy(&file, repo.join("policies").join(name)).unwrap();
    }
    write(
        repo,
        "cluster/namespaces.yaml",
        &std::fs::read_to_string(root().join("examples/cluster/namespaces.yaml")).unwrap(),
    );
    write(
        repo,
        "policy-tests/rules.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata:\n  name: rules\npolicies: ../policies\nnamespaceLabels:\n  vision: {}\ncases:\n  - name: a pinned GPU pod in a team namespace is admitted\n    resource:\n      apiVersion: v1\n      kind: Pod\n      metadata: {name: p, namespace: vision}\n      spec:\n        containers:\n          - name: c\n            image: ghcr.io/example/train:1.0\n            resources: {limits: {nvidia.com/gpu: 1}}\n    expect:\n      allowed: true\n      warnedBy: []\n",
    );
    write(repo, "manifests/team/a.yaml", &format!("# The team's trainer.\n{}", gpu_pod("trainer", "1")));
    write(repo, "manifests/old.yaml", &gpu_pod("old", "1"));
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "base"]);
    dir
}

/// Runs the example's dry-run script in `repo` against `base`.
fn dry_run_changed(repo: &Path, base: &str) -> Output {
    Command::new("bash")
        .arg(root().join("examples/ci/dry-run-changed.sh"))
        .args([base, "manifests/"])
        .current_dir(repo)
        .env("ALLOT", env!("CARGO_BIN_EXE_allot"))
        .env("POLICIES", "policies/")
        .env("NAMESPACES", "cluster/namespaces.yaml")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("OUTPUT")
        .output()
        .expect("bash runs")
}

/// The (command, file, line) of each annotation in `--output github`.
fn annotations(text: &str) -> Vec<(String, String, usize)> {
    text.lines()
        .filter(|l| l.starts_with("::error ") || l.starts_with("::warning "))
        .map(|l| {
            let (head, _) = l[2..].split_once("::").expect("a message");
            let (command, properties) = head.split_once(' ').expect("properties");
            let property = |key: &str| {
                properties.split(',').find_map(|p| p.strip_prefix(&format!("{key}="))).unwrap_or_default().to_string()
            };
            (command.to_string(), property("file"), property("line").parse().unwrap_or(0))
        })
        .collect()
}

#[test]
fn the_dry_run_script_checks_only_the_manifests_a_branch_changes() {
    let dir = policy_repository();
    let repo = dir.path();
    git(repo, &["checkout", "-q", "-b", "change"]);
    // A second, denied document after a comment in a changed file; a new file (with a space in
    // its name) denied in its first document; a deleted manifest; a text file; YAML elsewhere
    // that is no manifest (allot would exit 2 on it).
    let a =
        format!("# The team's trainer.\n{}---\n# Half a GPU.\n\n{}", gpu_pod("trainer", "1"), gpu_pod("half", "500m"));
    write(repo, "manifests/team/a.yaml", &a);
    let new_job = format!("# sixteen GPUs in one pod\n---\n{}", gpu_pod("big", "16"));
    write(repo, "manifests/new job.yaml", &new_job);
    std::fs::remove_file(repo.join("manifests/old.yaml")).unwrap();
    write(repo, "manifests/notes.txt", "not a manifest\n");
    write(repo, "other/settings.yaml", "just: settings\n");
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "change"]);
    // main moves on after the branch: its own change is not the branch's to check.
    git(repo, &["checkout", "-q", "main"]);
    write(repo, "manifests/main-only.yaml", &gpu_pod("main-only", "0.5"));
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "main moves"]);
    git(repo, &["checkout", "-q", "change"]);

    let out = dry_run_changed(repo, "main");
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "a denial exits 1\n{text}\n{}", stderr(&out));
    assert!(stderr(&out).contains("checking 2 changed manifest file(s)"), "{}", stderr(&out));
    let found = annotations(&text);
    assert!(
        found.contains(&("error".into(), "manifests/team/a.yaml".into(), object_line(&a, "half"))),
        "{found:?}\n{text}"
    );
    assert!(
        found.contains(&("error".into(), "manifests/new job.yaml".into(), object_line(&new_job, "big"))),
        "{found:?}\n{text}"
    );
    assert_eq!(object_line(&a, "half"), 17, "the test's own arithmetic");
    assert!(found.iter().all(|(_, _, line)| *line != object_line(&a, "trainer")), "{found:?}");
    for absent in ["old.yaml", "main-only", "notes.txt", "settings.yaml"] {
        assert!(!text.contains(absent), "{absent} was checked:\n{text}");
    }
    assert!(text.contains("allot check: 3 object(s), 1 admitted"), "{text}");

    // From a subdirectory, git's names would not resolve: a clear error.
    let out = Command::new("bash")
        .arg(root().join("examples/ci/dry-run-changed.sh"))
        .arg("main")
        .current_dir(repo.join("manifests"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("run from the repository's top directory"), "{}", stderr(&out));
}

#[test]
fn the_dry_run_script_passes_a_branch_without_denials() {
    let dir = policy_repository();
    let repo = dir.path();
    // Only a deletion: nothing to check.
    git(repo, &["checkout", "-q", "-b", "delete"]);
    std::fs::remove_file(repo.join("manifests/old.yaml")).unwrap();
    git(repo, &["commit", "-q", "-am", "delete"]);
    let out = dry_run_changed(repo, "main");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("no manifest changed"), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));

    // An admitted change: exit 0, no annotation, the report in its log group.
    write(repo, "manifests/b.yaml", &gpu_pod("b", "2"));
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "add b"]);
    let out = dry_run_changed(repo, "main");
    assert_eq!(out.status.code(), Some(0), "{}\n{}", stdout(&out), stderr(&out));
    assert!(annotations(&stdout(&out)).is_empty(), "{}", stdout(&out));
    assert!(stdout(&out).contains("::group::allot check report"), "{}", stdout(&out));
}

fn hooks() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(".pre-commit-hooks.yaml")).unwrap();
    let hooks: Value = serde_saphyr::from_str(&text).expect("hooks parse");
    hooks.as_array().expect("a list of hooks").clone()
}

/// Runs a hook's command as pre-commit does: `entry`, then `args`, then the matching files
/// unless `pass_filenames: false`.
fn run_hook(repo: &Path, hook: &Value, files: &[&str]) -> Output {
    let entry: Vec<&str> = hook["entry"].as_str().expect("entry").split_whitespace().collect();
    let args = hook["args"].as_array().into_iter().flatten().filter_map(Value::as_str);
    let pass_files = hook.get("pass_filenames").and_then(Value::as_bool).unwrap_or(true);
    Command::new(entry[0])
        .args(&entry[1..])
        .args(args)
        .args(if pass_files { files } else { &[] })
        .current_dir(repo)
        .env("PATH", path_with_allot())
        .output()
        .expect("the hook runs")
}

#[test]
fn every_pre_commit_hook_runs_in_a_policy_repository() {
    let dir = policy_repository();
    let repo = dir.path();
    let hooks = hooks();
    let ids: Vec<&str> = hooks.iter().filter_map(|h| h["id"].as_str()).collect();
    for id in ["allot-test", "allot-check", "allot-lint"] {
        assert!(ids.contains(&id) && ids.contains(&format!("{id}-system").as_str()), "{id} in {ids:?}");
    }
    for hook in &hooks {
        let id = hook["id"].as_str().unwrap_or_default();
        let language = hook["language"].as_str().unwrap_or_default();
        assert!(["rust", "system"].contains(&language), "{id}: {language}");
        assert!(hook["name"].is_string() && hook["entry"].as_str().is_some_and(|e| e.starts_with("allot ")), "{id}");
        // allot-check gets the staged manifests; on main they are admitted.
        let out = run_hook(repo, hook, &["manifests/team/a.yaml", "manifests/old.yaml"]);
        assert_eq!(out.status.code(), Some(0), "{id}: {}\n{}", stdout(&out), stderr(&out));
        if id.starts_with("allot-check") {
            assert_eq!(hook["require_serial"], true, "{id}: one run for all files, so gangs across files are compared");
            assert!(stdout(&out).contains("2 object(s): 2 admitted"), "{id}: {}", stdout(&out));
            let denied = format!("{}---\n{}", gpu_pod("ok", "1"), gpu_pod("half", "500m"));
            write(repo, "manifests/denied.yaml", &denied);
            let out = run_hook(repo, hook, &["manifests/denied.yaml"]);
            assert_eq!(out.status.code(), Some(1), "{id}: {}", stdout(&out));
            assert!(stdout(&out).contains("manifests/denied.yaml#2 Pod vision/half: DENIED"), "{}", stdout(&out));
        }
        if id.starts_with("allot-lint") {
            assert!(stdout(&out).contains("no manifests given"), "{id}: {}", stdout(&out));
        }
        if id.starts_with("allot-test") {
            assert!(stdout(&out).contains("1 passed, 0 failed"), "{id}: {}", stdout(&out));
        }
    }
    // A policy that does not load fails the lint hooks.
    write(
        repo,
        "policies/broken.yaml",
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: b}\nspec: {expression: 'object.(' }\n",
    );
    for hook in hooks.iter().filter(|h| h["id"].as_str().is_some_and(|id| id.starts_with("allot-lint"))) {
        let out = run_hook(repo, hook, &[]);
        assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
        assert!(stderr(&out).contains("broken.yaml"), "{}", stderr(&out));
    }
}

/// The workflow runs the script under the name its comments tell users to copy it to, with the
/// environment the script reads.
#[test]
fn the_workflow_example_uses_the_dry_run_script_and_the_lint() {
    let text = std::fs::read_to_string(root().join("examples/ci/github-actions.yml.example")).unwrap();
    let workflow: Value = serde_saphyr::from_str(&text).expect("the workflow parses");
    let job = &workflow["jobs"]["policies"];
    let steps = job["steps"].as_array().expect("steps");
    let run = |needle: &str| steps.iter().find(|s| s["run"].as_str().is_some_and(|r| r.contains(needle)));
    let dry_run = run("ci/allot-dry-run-changed.sh").expect("a step runs the dry-run script");
    assert!(dry_run["run"].as_str().unwrap().contains("\"origin/$GITHUB_BASE_REF\" \"$MANIFESTS\""));
    assert!(dry_run["if"].as_str().unwrap().contains("pull_request"));
    assert!(text.contains("dry-run-changed.sh (next to this\n# file) to ci/allot-dry-run-changed.sh"));
    assert!(
        steps.iter().any(|s| s["run"].as_str().map(str::trim) == Some("allot check --policies \"$POLICIES\"")),
        "a lint step: allot check --policies with no manifests"
    );
    // The checkout fetches the history the merge base needs.
    assert_eq!(steps[0]["with"]["fetch-depth"], 0);
    // The script reads POLICIES and NAMESPACES; the workflow sets both.
    let script = std::fs::read_to_string(root().join("examples/ci/dry-run-changed.sh")).unwrap();
    for variable in ["POLICIES", "NAMESPACES"] {
        assert!(script.contains(&format!("${{{variable}")), "the script reads {variable}");
        assert!(workflow["env"][variable].is_string(), "the workflow sets {variable}");
    }
}
