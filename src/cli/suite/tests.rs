use std::path::{Path, PathBuf};

use serde_json::Value;

use super::expect::*;
use super::load::*;
use super::*;
use crate::admission::engine::Engine;
use crate::cli::check::{self, Manifest};
use crate::model::namespaces::NoNamespaces;
use crate::model::policy;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(text: &str) -> Value {
    let mut docs = policy::parse_documents("test", text).expect("valid YAML");
    assert_eq!(docs.len(), 1, "one document");
    docs.remove(0).1
}

/// The engine's decision on one resource, as `allot check` makes it, with the shipped policies.
fn admit(resource: &str) -> check::Admitted {
    let policies = policy::load_dir(&repo().join("policies")).expect("the shipped policies load");
    let engine = Engine::new(&policies, &NoNamespaces);
    check::admit_manifest(&engine, &Manifest { source: "t.yaml".into(), document: 1, line: 0, object: yaml(resource) })
}

fn expectations(text: &str) -> Expectations {
    let expect: Expect = decode(yaml(text)).expect("a valid expect block");
    Expectations::new(expect).expect("consistent expectations")
}

/// The mismatches of `expect` (YAML) against the engine's decision on `resource`.
fn mismatches(resource: &str, expect: &str) -> Vec<String> {
    let admitted = admit(resource);
    expectations(expect).compare(&admitted.report, &admitted.mutated)
}

fn one(mismatches: Vec<String>) -> String {
    assert_eq!(mismatches.len(), 1, "{mismatches:#?}");
    mismatches.into_iter().next().unwrap_or_default()
}

/// Denied (no team), warned (`:latest`), audited (high-priority), mutated (toleration).
const STRAY: &str = "
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: scratch}
spec:
  priorityClassName: high-priority
  containers:
    - name: train
      image: pytorch/pytorch:latest
      resources: {limits: {nvidia.com/gpu: 2}}
";

/// Admitted, mutated: toleration and priority class.
const GPU_POD: &str = "
apiVersion: v1
kind: Pod
metadata: {name: gpu, namespace: vision}
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.1-runtime-ubuntu22.04
      resources: {limits: {nvidia.com/gpu: 1}}
";

#[test]
fn allowed() {
    assert_eq!(mismatches(GPU_POD, "allowed: true"), Vec::<String>::new());
    assert_eq!(mismatches(STRAY, "allowed: false"), Vec::<String>::new());
    assert_eq!(
        one(mismatches(STRAY, "allowed: true")),
        "allowed: expected true, got false (denied by [gpu-pods-belong-to-a-team])"
    );
    assert_eq!(one(mismatches(GPU_POD, "allowed: false")), "allowed: expected false, got true");
}

#[test]
fn rule_sets_are_exact_and_name_what_is_missing_and_unexpected() {
    let right = "{deniedBy: [gpu-pods-belong-to-a-team], warnedBy: [pinned-images-on-gpus], \
                     auditedBy: [high-priority-is-audited]}";
    assert_eq!(mismatches(STRAY, right), Vec::<String>::new());
    assert_eq!(mismatches(GPU_POD, "{deniedBy: [], warnedBy: [], auditedBy: []}"), Vec::<String>::new());

    let denied = one(mismatches(STRAY, "deniedBy: [team/quota]"));
    assert_eq!(
        denied,
        "deniedBy: expected [team/quota], got [gpu-pods-belong-to-a-team]\n  missing: team/quota\n  \
             unexpected: [gpu-pods-belong-to-a-team] namespace scratch belongs to no team; GPU workloads run in \
             team namespaces"
    );
    // A subset is not the set.
    let subset = one(mismatches(STRAY, "deniedBy: [gpu-pods-belong-to-a-team, accelerators/max-per-pod]"));
    assert!(subset.ends_with("\n  missing: accelerators/max-per-pod"), "{subset}");

    let warned = one(mismatches(STRAY, "warnedBy: []"));
    assert!(warned.starts_with("warnedBy: expected [], got [pinned-images-on-gpus]\n"), "{warned}");
    assert!(warned.contains("unexpected: [pinned-images-on-gpus] GPU containers should pin an image tag"));

    let audited = one(mismatches(GPU_POD, "auditedBy: [high-priority-is-audited]"));
    assert_eq!(audited, "auditedBy: expected [high-priority-is-audited], got []\n  missing: high-priority-is-audited");
}

#[test]
fn mutated() {
    assert_eq!(mismatches(GPU_POD, "mutated: true"), Vec::<String>::new());
    assert_eq!(one(mismatches(GPU_POD, "mutated: false")), "mutated: expected false, got true");
    let job = "{apiVersion: batch/v1, kind: Job, metadata: {name: j, namespace: vision}, spec: {template: {spec: {containers: []}}}}";
    assert_eq!(one(mismatches(job, "mutated: true")), "mutated: expected true, got false");
}

#[test]
fn patch_is_exact_and_in_order() {
    let right = "
patch:
  - {op: add, path: /spec/tolerations, value: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]}
  - {op: add, path: /spec/priorityClassName, value: low-priority}
";
    assert_eq!(mismatches(GPU_POD, right), Vec::<String>::new());

    let wrong_value = right.replace("value: low-priority", "value: high-priority");
    assert_eq!(
        one(mismatches(GPU_POD, &wrong_value)),
        "patch: op 2 differs (expected 2 op(s), got 2)\n  \
             expected: add     /spec/priorityClassName \"high-priority\"\n  \
             got:      add     /spec/priorityClassName \"low-priority\""
    );
    let missing = format!("{right}  - {{op: remove, path: /spec/priority}}\n");
    assert_eq!(
        one(mismatches(GPU_POD, &missing)),
        "patch: expected 3 op(s), got 2; missing:\n  remove  /spec/priority"
    );
    let only_class = "patch: [{op: add, path: /spec/priorityClassName, value: low-priority}]";
    let extra = one(mismatches(GPU_POD, only_class));
    assert!(extra.starts_with("patch: op 1 differs (expected 1 op(s), got 2)\n"), "{extra}");
    let cpu = "{apiVersion: v1, kind: Pod, metadata: {name: c, namespace: vision}, spec: {containers: [{name: a, image: a:1}]}}";
    assert_eq!(mismatches(cpu, only_class), Vec::<String>::new());
    let none = "patch: []";
    assert_eq!(
        one(mismatches(cpu, none)),
        "patch: expected 0 op(s), got 1; unexpected:\n  add     /spec/priorityClassName \"low-priority\""
    );
}

#[test]
fn fields_read_the_mutated_object_and_null_means_absent() {
    let right = "fields: {/spec/priorityClassName: low-priority, /spec/tolerations/0/key: nvidia.com/gpu, \
                     /spec/schedulingGates: null, /metadata/name: gpu}";
    assert_eq!(mismatches(GPU_POD, right), Vec::<String>::new());
    assert_eq!(
        one(mismatches(GPU_POD, "fields: {/spec/priorityClassName: high-priority}")),
        "fields /spec/priorityClassName: expected \"high-priority\", got \"low-priority\""
    );
    assert_eq!(
        one(mismatches(GPU_POD, "fields: {/spec/tolerations: null}")),
        "fields /spec/tolerations: expected absent, got \
             [{\"effect\":\"NoSchedule\",\"key\":\"nvidia.com/gpu\",\"operator\":\"Exists\"}]"
    );
    assert_eq!(
        one(mismatches(GPU_POD, "fields: {/spec/schedulingGates/0/name: allot.dev/gang}")),
        "fields /spec/schedulingGates/0/name: expected \"allot.dev/gang\", got absent"
    );
}

#[test]
fn message_contains_searches_every_finding() {
    let right = "messageContains: [\"namespace scratch belongs to no team\", \"requesting 2 accelerator(s)\"]";
    assert_eq!(mismatches(STRAY, right), Vec::<String>::new());
    let wrong = one(mismatches(STRAY, "messageContains: [\"16/16\"]"));
    assert!(wrong.starts_with("messageContains: no finding message contains \"16/16\"\n"), "{wrong}");
    assert!(wrong.contains("\n  finding: [gpu-pods-belong-to-a-team] namespace scratch belongs to no team"));
    assert_eq!(
        one(mismatches(GPU_POD, "messageContains: [quota]")),
        "messageContains: no finding message contains \"quota\"\n  (there are no findings)"
    );
}

#[test]
fn every_failed_expectation_is_reported() {
    let all_wrong =
        mismatches(STRAY, "{allowed: true, deniedBy: [], mutated: false, fields: {/spec/priorityClassName: x}}");
    assert_eq!(all_wrong.len(), 4, "{all_wrong:#?}");
}

fn invalid(text: &str) -> Vec<String> {
    let expect: Expect = decode(yaml(text)).expect("decodes");
    Expectations::new(expect).expect_err("invalid expectations").iter().map(ToString::to_string).collect()
}

#[test]
fn expectations_must_expect_something_consistent() {
    assert!(invalid("{}")[0].starts_with("expect: expects nothing; give allowed, deniedBy"), "{:?}", invalid("{}"));
    assert_eq!(invalid("{allowed: true, deniedBy: [r]}"), ["expect: allowed: true contradicts deniedBy: [r]"]);
    assert_eq!(
        invalid("{allowed: false, deniedBy: []}"),
        ["expect: allowed: false contradicts deniedBy: [] (denied by no rule)"]
    );
    assert_eq!(
        invalid("{mutated: false, patch: [{op: remove, path: /spec/x}]}"),
        ["expect: mutated: false contradicts a non-empty patch"]
    );
    assert_eq!(invalid("{fields: {spec.x: 1}}"), ["expect.fields.spec.x: not a JSON pointer (write /spec/…)"]);
    assert_eq!(
        invalid("{patch: [{op: remove, path: /a, value: 1}]}"),
        ["expect.patch[0].value: a remove operation takes no value"]
    );
    assert_eq!(invalid("{patch: [{op: add, path: /a}]}"), ["expect.patch[0].value: a add operation needs a value"]);
    assert_eq!(invalid("{messageContains: []}").len(), 1);
    // `value: null` is a value (add null), not a missing one.
    let expect: Expect = decode(yaml("{patch: [{op: add, path: /a, value: null}]}")).unwrap();
    assert!(Expectations::new(expect).is_ok());
}

#[test]
fn decoding_is_strict_and_names_the_field() {
    let DecodeError { path, message } = decode::<Expect>(yaml("{denyBy: [r]}")).unwrap_err();
    assert_eq!(path, "denyBy");
    assert!(message.starts_with("unknown field `denyBy`, expected one of `allowed`, `deniedBy`"), "{message}");
    // `deniedBy:` with nothing after it is null: an error, not "no expectation".
    let DecodeError { path, message } = decode::<Expect>(yaml("{deniedBy: null}")).unwrap_err();
    assert_eq!(path, "deniedBy");
    assert!(message.contains("invalid type: null"), "{message}");
    let DecodeError { path, message } = decode::<Expect>(yaml("{patch: [{op: move, path: /a}]}")).unwrap_err();
    assert_eq!(path, "patch[0].op");
    assert!(message.starts_with("unknown variant `move`"), "{message}");
}

// --- loading files ----------------------------------------------------------------------

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&path, text).expect("write");
    path
}

/// A test document using the shipped policies, with `cases` (YAML, indented by 2).
fn test_file(cases: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: demo}}\npolicies: {}\ncases:\n{cases}",
        repo().join("policies").display()
    )
}

const GPU_CASE: &str = "
  - name: gpu pod
    resource: {apiVersion: v1, kind: Pod, metadata: {name: gpu, namespace: vision}, spec: {containers: [{name: c, image: 'i:1', resources: {limits: {nvidia.com/gpu: 1}}}]}}
";

fn problems(paths: &[PathBuf]) -> Vec<String> {
    match load(paths, None) {
        Err(SuiteError::Invalid(p)) => p,
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("expected problems"),
    }
}

#[test]
fn unknown_fields_name_file_document_field_and_case() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = format!("{GPU_CASE}    expect: {{denyBy: [x]}}\n");
    let file = write(dir.path(), "t.yaml", &format!("---\n{}", test_file(&cases)));
    let p = problems(std::slice::from_ref(&file));
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with(&format!(
            "{}: document 1 (Test demo): cases[0].expect.denyBy: unknown field `denyBy`",
            file.display()
        )),
        "{}",
        p[0]
    );
    assert!(p[0].ends_with("(case \"gpu pod\")"), "{}", p[0]);

    let file = write(
        dir.path(),
        "top.yaml",
        &format!("{}polices: x\n", test_file(&format!("{GPU_CASE}    expect: {{allowed: true}}\n"))),
    );
    let p = problems(&[file]);
    assert!(p[0].contains("document 1 (Test demo): polices: unknown field `polices`"), "{p:?}");
}

#[test]
fn a_case_that_expects_nothing_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(dir.path(), "t.yaml", &test_file(GPU_CASE));
    let p = problems(std::slice::from_ref(&file));
    assert_eq!(
        p,
        [format!(
            "{}: document 1 (Test demo): cases[0] (\"gpu pod\"): expect: expects nothing; give allowed, deniedBy, \
                 warnedBy, auditedBy, mutated, patch, fields or messageContains",
            file.display()
        )]
    );
}

#[test]
fn resources_policies_and_usage_are_checked_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "pods.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n",
    );
    let cases = "
  - name: two objects
    path: pods.yaml
    expect: {allowed: true}
  - name: nothing selected
    path: pods.yaml
    select: {name: c}
    expect: {allowed: true}
  - name: missing file
    path: nope.yaml
    expect: {allowed: true}
  - name: both
    path: pods.yaml
    resource: {apiVersion: v1, kind: Pod}
    expect: {allowed: true}
  - name: unknown team
    usage: {teams: {visoin: {nvidia.com/gpu: 1}}}
    path: pods.yaml
    select: {document: 2}
    expect: {allowed: true}
";
    let file = write(dir.path(), "t.yaml", &test_file(cases));
    let p = problems(&[file]);
    assert_eq!(p.len(), 5, "{p:#?}");
    assert!(p[0].contains("cases[0] (\"two objects\"): path: 2 objects of"), "{}", p[0]);
    assert!(
        p[0].contains("(Pod default/a (document 1), Pod default/b (document 2)); pick one with select"),
        "{}",
        p[0]
    );
    assert!(p[1].contains("select: no object of") && p[1].contains("matches; it holds Pod default/a"), "{}", p[1]);
    assert!(p[2].contains("cases[2] (\"missing file\"): path: ") && p[2].contains("nope.yaml"), "{}", p[2]);
    assert!(p[3].ends_with("give resource or path, not both"), "{}", p[3]);
    assert!(
        p[4].contains("usage.teams.visoin: no Team named \"visoin\" in the policies (teams: nlp, vision)"),
        "{}",
        p[4]
    );

    let no_policies = write(
        dir.path(),
        "np.yaml",
        &format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {{name: np}}\ncases:\n{GPU_CASE}    expect: {{allowed: true}}\n"
        ),
    );
    let p = problems(std::slice::from_ref(&no_policies));
    assert!(
        p[0].ends_with("policies: not set; name the policy directory (relative to this file) or pass --policies"),
        "{p:?}"
    );
    // --policies fills it in.
    let suite = load(&[no_policies], Some(&repo().join("policies"))).expect("loads with --policies");
    assert!(suite.run().all_passed());
}

#[test]
fn directories_hold_test_files_and_fixtures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = test_file(&format!("{GPU_CASE}    expect: {{allowed: true}}\n"));
    write(dir.path(), "a/t.yaml", &good);
    write(dir.path(), "a/pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n");
    write(dir.path(), "a/policy.yaml", "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\n");
    write(dir.path(), "a/notes.txt", "not YAML at all: [");
    write(dir.path(), "a/.hidden/broken.yaml", "kind: [");
    let suite = load(&[dir.path().to_path_buf()], None).expect("fixtures are skipped");
    assert_eq!(suite.cases(), 1);

    // A mistyped kind in the allot.dev group is not skipped silently.
    write(dir.path(), "a/typo.yaml", "apiVersion: allot.dev/v1alpha1\nkind: Tset\nmetadata: {name: t}\n");
    let p = problems(&[dir.path().to_path_buf()]);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].ends_with("typo.yaml: document 1: kind: \"Tset\" is neither Test nor a policy kind (Cluster, Team, Placement, Rule, GangPolicy)"), "{}", p[0]);

    // A test file holds only Test documents; a file named explicitly must be a test file.
    let mixed =
        write(dir.path(), "b/mixed.yaml", &format!("{good}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\n"));
    let p = problems(&[mixed]);
    assert!(p[0].contains("document 2: a test file holds only Test documents, this one is Pod"), "{p:?}");
    let p = problems(&[dir.path().join("a/pod.yaml")]);
    assert!(p[0].ends_with("pod.yaml: no Test documents (apiVersion: allot.dev/v1alpha1, kind: Test)"), "{p:?}");
    let empty = tempfile::tempdir().expect("tempdir");
    let p = problems(&[empty.path().to_path_buf()]);
    assert!(p[0].contains("no test files"), "{p:?}");
    let p = problems(&[dir.path().join("missing")]);
    assert!(p[0].contains("missing"), "{p:?}");
    let other_group = write(dir.path(), "c/t.yaml", &good.replace("allot.dev/v1alpha1", "allot.dev/v1"));
    let p = problems(&[other_group]);
    assert!(p[0].contains("apiVersion: \"allot.dev/v1\" is not supported; use allot.dev/v1alpha1"), "{p:?}");
}

#[test]
fn cases_share_gang_members_but_not_quota_usage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let member = |name: &str, size: u32| {
        format!(
            "{{apiVersion: v1, kind: Pod, metadata: {{name: {name}, namespace: vision, labels: {{allot.dev/gang-name: g}}, \
                 annotations: {{allot.dev/gang-size: '{size}'}}}}, spec: {{containers: [{{name: c, image: 'i:1', \
                 resources: {{limits: {{nvidia.com/gpu: 4}}}}}}]}}}}"
        )
    };
    let cases = format!(
        "
  - name: disagrees with m1
    resource: {}
    expect: {{deniedBy: [gang/consistency], messageContains: ['member m1 has 2']}}
  - name: disagrees with m0
    resource: {}
    expect: {{deniedBy: [gang/consistency]}}
  - name: four of sixteen, from the test's usage of twelve
    resource: {GPU_POD_INLINE}
    expect: {{allowed: true}}
  - name: again four, not charged by the case before
    resource: {GPU_POD_INLINE}
    expect: {{allowed: true}}
  - name: one more in use
    usage: {{teams: {{vision: {{nvidia.com/gpu: 13}}}}}}
    resource: {GPU_POD_INLINE}
    expect: {{deniedBy: [team/quota], messageContains: ['uses 13 of 16']}}
",
        member("m0", 4),
        member("m1", 2)
    );
    let text = test_file(&cases).replace("cases:\n", "usage: {teams: {vision: {nvidia.com/gpu: 12}}}\ncases:\n");
    let file = write(dir.path(), "t.yaml", &text);
    let report = load(&[file], None).expect("loads").run();
    let failures: Vec<_> = report.tests[0].cases.iter().filter(|c| !c.passed()).collect();
    assert!(failures.is_empty(), "{}", report.render_text());
    assert_eq!((report.passed(), report.failed()), (5, 0));
}

const GPU_POD_INLINE: &str = "{apiVersion: v1, kind: Pod, metadata: {name: four, namespace: vision}, spec: {containers: [{name: c, image: 'i:1', resources: {limits: {nvidia.com/gpu: 4}}}]}}";

#[test]
fn reports_say_what_failed_in_text_and_junit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = format!(
        "{GPU_CASE}    expect: {{allowed: true}}\n{}    expect: {{deniedBy: [team/quota]}}\n",
        GPU_CASE.replace("gpu pod", "wrong <one>")
    );
    let file = write(dir.path(), "t.yaml", &test_file(&cases));
    let report = load(std::slice::from_ref(&file), None).expect("loads").run();
    assert!(!report.all_passed());
    let text = report.render_text();
    assert!(text.contains("  ok    gpu pod\n"), "{text}");
    assert!(text.contains("  FAIL  wrong <one>\n        deniedBy: expected [team/quota], got []\n"), "{text}");
    assert!(text.contains("        the engine decided:\n          "), "{text}");
    assert!(text.contains("2 case(s) in 1 test(s): 1 passed, 1 failed\n"), "{text}");
    assert!(text.contains(&format!("FAILED  {} › wrong <one>", file.display())), "{text}");
    let xml = report.render_junit();
    assert_eq!(xml.matches("<testcase ").count(), 2, "{xml}");
    assert_eq!(xml.matches("<failure ").count(), 1, "{xml}");
    assert!(xml.contains("<testsuites name=\"allot test\" tests=\"2\" failures=\"1\">"), "{xml}");
    assert!(xml.contains("name=\"wrong &lt;one&gt;\""), "{xml}");
    assert!(xml.contains("<failure message=\"deniedBy: expected [team/quota], got []\" type=\"mismatch\">"), "{xml}");
}

#[test]
fn paths_are_tidied_like_go_filepath_join() {
    assert_eq!(tidy(Path::new("policy-tests/../policies")), PathBuf::from("policies"));
    assert_eq!(tidy(Path::new("./a/./b/../c")), PathBuf::from("a/c"));
    assert_eq!(tidy(Path::new("../x")), PathBuf::from("../x"));
    assert_eq!(tidy(Path::new("a/..")), PathBuf::from("."));
    assert_eq!(tidy(Path::new("/a/../b")), PathBuf::from("/b"));
}

// --- typed errors -------------------------------------------------------------------------

#[test]
fn typed_errors_print_the_messages_they_replaced() {
    let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let missing = InstallError::Missing { missing: names(&["b", "a", "a", "c", "d"]), total: 7 };
    assert_eq!(
        missing.to_string(),
        "the native policies are not installed: 5 of 7 objects missing (a, b, c…); apply `allot compile` for these \
         policies first"
    );
    assert_eq!(missing.metric_label(), "missing");
    let stale = InstallError::Stale { stale: names(&["x"]), total: 2, fingerprint: "f1".into() };
    assert_eq!(
        stale.to_string(),
        "the native policies installed are not these policies' (1 of 2 objects compiled from other policies or by an \
         older allot, e.g. x; these compile to f1): apply `allot compile` for these policies again"
    );
    assert_eq!(stale.metric_label(), "stale");
    let leftovers = InstallError::Leftovers { leftovers: names(&["l"]) };
    assert_eq!(
        leftovers.to_string(),
        "1 object(s) another `allot compile` installed act beside these policies (l): delete them, or they answer too"
    );
    assert_eq!(leftovers.metric_label(), "leftovers");
    let ambiguous = SelectError::Ambiguous {
        path: "m.yaml".into(),
        matching: names(&["Pod d/a (document 1)", "Pod d/b (document 2)"]),
    };
    assert_eq!(
        ambiguous.to_string(),
        "path: 2 objects of m.yaml match (Pod d/a (document 1), Pod d/b (document 2)); pick one with select: {kind, \
         name, namespace, document}"
    );
    let case: CaseError = ambiguous.into();
    assert_eq!(case.metric_label(), "ambiguous");
    assert_eq!(SelectError::Empty { path: "m.yaml".into() }.to_string(), "path: m.yaml holds no object");
    let nothing = ExpectError::Nothing;
    assert_eq!(
        nothing.to_string(),
        "expect: expects nothing; give allowed, deniedBy, warnedBy, auditedBy, mutated, patch, fields or messageContains"
    );
    assert_eq!(nothing.metric_label(), "expects_nothing");
    let pointer = ExpectError::PatchOp { index: 1, source: PatchOpError::NotAPointer("spec".into()) };
    assert_eq!(pointer.to_string(), "expect.patch[1].path: \"spec\" is not a JSON pointer (write /spec/…)");
    assert_eq!(pointer.metric_label(), "patch_op");
    let top = DecodeError { path: String::new(), message: "m".into() };
    assert_eq!((top.to_string(), top.metric_label()), ("m".to_string(), "decode"));
}

#[test]
fn expectation_errors_name_their_cause() {
    let expect: Expect = decode(yaml("{allowed: true, deniedBy: [r], patch: [{op: add, path: /a}]}")).expect("decodes");
    let errors = Expectations::new(expect).expect_err("invalid expectations");
    let labels: Vec<&str> = errors.iter().map(ExpectError::metric_label).collect();
    assert_eq!(labels, ["allowed_but_denied", "patch_op"]);
    assert!(matches!(&errors[1], ExpectError::PatchOp { index: 0, source: PatchOpError::NoValue(OpName::Add) }));
}
