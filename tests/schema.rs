//! `allot schema`: the JSON Schema editors use for policy files.
//!
//! - The committed `schema/` files are exactly what `allot schema` prints, so they cannot drift.
//! - Every shipped policy document validates against the schema.
//! - Broken policies are refused by BOTH the parser (`allot::model::policy::compile`) and the schema.
//! - What only the parser catches is listed here, each asserted: the schema accepts it, the
//!   parser refuses it.
//! - The patterns standing in for the parser's own grammars (durations, quantities, weights)
//!   accept everything the parser accepts (property tests).
//!
//! Documents are read with the parser's own YAML reader (`allot::model::policy::parse_documents`) and
//! validated with the `jsonschema` crate (no remote or file references are ever resolved).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use allot::model::policy::{self, Source, schema};
use proptest::prelude::*;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the real binary; its stdout on success.
fn allot(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_allot")).args(args).current_dir(root()).output().expect("run allot");
    assert!(out.status.success(), "allot {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn combined() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let text = allot(&["schema"]);
        let value: Value = serde_json::from_str(&text).expect("allot schema prints JSON");
        jsonschema::draft7::new(&value).expect("a valid draft-07 schema")
    })
}

/// The schema's errors for one document, as `POINTER: message` lines.
fn schema_errors(doc: &Value) -> Vec<String> {
    combined().iter_errors(doc).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// The parser's verdict on one policy file.
fn parse(text: &str) -> Result<(), String> {
    policy::compile(&[Source { name: "case.yaml".into(), text: text.into() }]).map(|_| ()).map_err(|e| e.to_string())
}

/// Every document of a YAML text, as the parser reads it.
fn documents(text: &str) -> Vec<Value> {
    policy::parse_documents("case.yaml", text).expect("valid YAML").into_iter().map(|(_, d)| d).collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<_> = entries.map(|e| e.expect("directory entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json") {
            out.push(path);
        }
    }
}

// --- the committed files ------------------------------------------------------------------

#[test]
fn committed_schema_files_are_what_allot_schema_writes() {
    let committed = root().join("schema");
    let fresh = tempfile::tempdir().expect("temp dir");
    allot(&["schema", "--out", fresh.path().to_str().expect("utf-8 path")]);
    let names = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .map(|entries| entries.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    let regenerate = "regenerate with `cargo run --locked -- schema --out schema`";
    assert_eq!(
        names(&committed),
        names(fresh.path()),
        "schema/ holds other files than `allot schema --out`; {regenerate}"
    );
    for name in names(fresh.path()) {
        let want = std::fs::read_to_string(fresh.path().join(&name)).expect("generated file");
        let have = std::fs::read_to_string(committed.join(&name)).unwrap_or_default();
        assert!(have == want, "schema/{name} differs from `allot schema --out`; {regenerate}");
    }
    // The printed forms are the same text as the files.
    assert_eq!(allot(&["schema"]), std::fs::read_to_string(committed.join("allot.schema.json")).expect("combined"));
    assert_eq!(
        allot(&["schema", "--kind", "Rule"]),
        std::fs::read_to_string(committed.join("rule.schema.json")).expect("rule schema")
    );
}

#[test]
fn every_generated_schema_is_a_valid_draft_07_schema() {
    for (name, text) in schema::files() {
        let value: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value["$schema"], "http://json-schema.org/draft-07/schema#", "{name}");
        if let Err(e) = jsonschema::meta::validate(&value) {
            panic!("{name} is not a valid draft-07 schema: {e}");
        }
    }
}

#[test]
fn the_schema_names_exactly_the_kinds_the_parser_reads() {
    let schema: Value = serde_json::from_str(&allot(&["schema"])).expect("JSON");
    let listed: Vec<&str> =
        schema["properties"]["kind"]["enum"].as_array().expect("kind enum").iter().filter_map(Value::as_str).collect();
    assert_eq!(listed, schema::kind_names());
    // Each kind the schema lists is one the parser decodes (it names the rest as unknown).
    for kind in &listed {
        let err = parse(&format!(
            "apiVersion: allot.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: x}}\nspec: {{bogus: 1}}\n"
        ))
        .expect_err("unknown field");
        assert!(err.contains("bogus"), "{kind}: {err}");
        assert!(!err.contains("unknown kind"), "{kind}: {err}");
    }
    // A missing, null or empty spec: the schema agrees with the parser on every kind.
    for kind in &listed {
        for spec in ["", "spec:\n", "spec: {}\n"] {
            let text = format!("apiVersion: allot.dev/v1alpha1\nkind: {kind}\nmetadata: {{name: x}}\n{spec}");
            let errors = schema_errors(&documents(&text)[0]);
            assert_eq!(
                parse(&text).is_ok(),
                errors.is_empty(),
                "{text}: schema says {errors:?}, parser {:?}",
                parse(&text)
            );
        }
    }
    let err = parse("apiVersion: allot.dev/v1alpha1\nkind: Policy\nmetadata: {name: x}\n").expect_err("unknown kind");
    for kind in &listed {
        assert!(err.contains(kind), "the parser's list of kinds lacks {kind}: {err}");
    }
}

#[test]
fn a_kind_schema_accepts_only_its_own_kind() {
    let rule: Value = serde_json::from_str(&allot(&["schema", "--kind", "Rule"])).expect("JSON");
    let rule = jsonschema::draft7::new(&rule).expect("valid schema");
    let doc = json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Rule", "metadata": {"name": "r"},
                     "spec": {"expression": "true", "message": "m"}});
    assert!(rule.is_valid(&doc), "{:?}", rule.iter_errors(&doc).map(|e| e.to_string()).collect::<Vec<_>>());
    let team = json!({"apiVersion": "allot.dev/v1alpha1", "kind": "Team", "metadata": {"name": "t"},
                      "spec": {"namespaces": {"names": ["t"]}}});
    assert!(!rule.is_valid(&team));
    assert!(combined().is_valid(&team), "{:?}", schema_errors(&team));
    // An unknown kind is a usage error that names the kinds there are.
    let out = Command::new(env!("CARGO_BIN_EXE_allot")).args(["schema", "--kind", "Rules"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown kind \"Rules\"; expected one of Cluster, Team, Placement, Rule, GangPolicy"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

// --- shipped policies ---------------------------------------------------------------------

/// Kinds of `allot.dev/v1alpha1` that are not policies, and so not in the combined policy
/// schema: `allot test` files, which have their own (`allot schema --kind Test`, below).
const NOT_POLICY_KINDS: &[&str] = &["Test"];

#[test]
fn every_shipped_policy_document_validates() {
    let mut files = Vec::new();
    for dir in ["policies", "examples", "policy-tests", "deploy"] {
        yaml_files(&root().join(dir), &mut files);
    }
    let mut checked = 0;
    let mut kinds = BTreeSet::new();
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        // Manifests for `allot check` may hold anything; only our documents count.
        let Ok(docs) = policy::parse_documents(&file.display().to_string(), &text) else { continue };
        for (index, doc) in docs {
            let ours = doc.get("apiVersion").and_then(Value::as_str) == Some(policy::API_VERSION);
            let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
            if !ours || NOT_POLICY_KINDS.contains(&kind.as_str()) {
                continue;
            }
            checked += 1;
            kinds.insert(kind);
            for e in schema_errors(&doc) {
                failures.push(format!("{}#{index}: {e}", file.strip_prefix(root()).unwrap_or(file).display()));
            }
        }
    }
    assert!(failures.is_empty(), "shipped policies the schema refuses:\n{}", failures.join("\n"));
    // The walk found the shipped set: every kind, and the five policy files twice (deploy/).
    assert_eq!(kinds.iter().map(String::as_str).collect::<Vec<_>>(), {
        let mut all = schema::kind_names();
        all.sort();
        all
    });
    assert!(checked >= 20, "only {checked} policy documents found");
}

// --- refused by both ----------------------------------------------------------------------

const TEAM: &str = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\n";
const RULE: &str = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\n";
const PLACEMENT: &str = "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: p}\n";
const GANG: &str = "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\n";
const CLUSTER: &str = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\n";

/// A broken policy: its text, where the schema reports it (JSON pointer prefix), and a piece
/// of the parser's error.
struct Broken {
    what: &'static str,
    text: String,
    schema_at: &'static str,
    parser_says: &'static str,
}

fn broken(what: &'static str, head: &str, body: &str, schema_at: &'static str, parser_says: &'static str) -> Broken {
    Broken { what, text: format!("{head}{body}"), schema_at, parser_says }
}

fn broken_policies() -> Vec<Broken> {
    vec![
        // Unknown fields, at every level.
        broken("unknown top-level field", TEAM, "spec: {namespaces: {names: [a]}}\nspecs: {}\n", "", "specs"),
        broken(
            "unknown metadata field",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r, namespace: x}\n",
            "spec: {expression: 'true', message: m}\n",
            "/metadata",
            "namespace",
        ),
        broken(
            "unknown spec field",
            RULE,
            "spec: {expression: 'true', message: m, severity: high}\n",
            "/spec",
            "severity",
        ),
        broken(
            "misspelled nested field",
            PLACEMENT,
            "spec:\n  tolerations: [{key: a, operator: Exists, effect: NoExecute, tolerationSecond: 5}]\n",
            "/spec/tolerations/0",
            "tolerationSecond",
        ),
        broken(
            "misspelled check",
            CLUSTER,
            "spec: {accelerators: {checks: {wholeNumber: Deny}}}\n",
            "/spec/accelerators/checks",
            "wholeNumber",
        ),
        // Wrong types.
        broken(
            "metadata is a list (serde would read it as its fields in order)",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: [r]\n",
            "spec: {expression: 'true', message: m}\n",
            "/metadata",
            "metadata: invalid type: sequence, expected a mapping",
        ),
        broken(
            "a toleration written as a list",
            PLACEMENT,
            "spec: {tolerations: [[nvidia.com/gpu, Exists]]}\n",
            "/spec/tolerations/0",
            "spec.tolerations[0]: invalid type: sequence, expected a mapping",
        ),
        broken(
            "a spec written as a list",
            GANG,
            "spec: [[], [Job]]\n",
            "/spec",
            "spec: invalid length 2, expected struct GangPolicySpec",
        ),
        broken(
            "names is a string",
            TEAM,
            "spec: {namespaces: {names: vision}}\n",
            "/spec/namespaces/names",
            "spec.namespaces.names",
        ),
        broken(
            "expression is a number",
            RULE,
            "spec: {expression: 42, message: m}\n",
            "/spec/expression",
            "spec.expression",
        ),
        broken("maxGangSize is a word", GANG, "spec: {maxGangSize: ten}\n", "/spec/maxGangSize", "spec.maxGangSize"),
        broken(
            "max per pod is negative",
            CLUSTER,
            "spec: {accelerators: {checks: {maxPerPod: {limits: {nvidia.com/gpu: -1}}}}}\n",
            "/spec/accelerators/checks/maxPerPod/limits/nvidia.com~1gpu",
            "maxPerPod.limits",
        ),
        broken(
            "metadata is a string",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: r\n",
            "spec: {expression: 'true', message: m}\n",
            "/metadata",
            "metadata",
        ),
        // Missing required fields.
        broken("rule without expression", RULE, "spec: {message: m}\n", "/spec", "expression"),
        broken("team without namespaces", TEAM, "spec: {priority: {default: low}}\n", "/spec", "namespaces"),
        broken("team without spec", TEAM, "", "", "namespaces"),
        broken(
            "document without metadata",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\n",
            "spec: {expression: 'true', message: m}\n",
            "",
            "metadata",
        ),
        broken(
            "metadata without name",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {labels: {a: b}}\n",
            "spec: {expression: 'true', message: m}\n",
            "/metadata",
            "name",
        ),
        broken(
            "empty name",
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: ''}\n",
            "spec: {expression: 'true', message: m}\n",
            "/metadata/name",
            "metadata.name",
        ),
        broken(
            "equivalent without countsAs",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: 8}, equivalents: {nvidia.com/mig-1g.10gb: {weight: 1/7}}}}\n",
            "/spec/quota/equivalents/nvidia.com~1mig-1g.10gb",
            "countsAs",
        ),
        broken(
            "quota without limits",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {mode: Deny}}\n",
            "/spec/quota",
            "limits",
        ),
        // Bad enum values (misspelled actions and modes among them).
        broken(
            "misspelled action",
            RULE,
            "spec: {expression: 'true', message: m, action: Block}\n",
            "/spec/action",
            "Block",
        ),
        broken(
            "lower-case action",
            RULE,
            "spec: {expression: 'true', message: m, action: deny}\n",
            "/spec/action",
            "deny",
        ),
        broken(
            "lower-case quota mode",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {mode: queue, limits: {nvidia.com/gpu: 8}}}\n",
            "/spec/quota/mode",
            "queue",
        ),
        broken(
            "check turned On",
            CLUSTER,
            "spec: {accelerators: {checks: {wholeNumbers: Enabled}}}\n",
            "/spec/accelerators/checks/wholeNumbers",
            "Enabled",
        ),
        broken(
            "unknown operation",
            RULE,
            "spec: {expression: 'true', message: m, match: {operations: [DELETE]}}\n",
            "/spec/match/operations/0",
            "DELETE",
        ),
        broken(
            "unknown onConflict",
            PLACEMENT,
            "spec: {nodeSelector: {a: b}, onConflict: Override}\n",
            "/spec/onConflict",
            "Override",
        ),
        broken(
            "unknown appliesTo",
            PLACEMENT,
            "spec: {nodeSelector: {a: b}, appliesTo: GpuPods}\n",
            "/spec/appliesTo",
            "GpuPods",
        ),
        broken(
            "misspelled taint effect",
            PLACEMENT,
            "spec: {tolerations: [{key: a, operator: Exists, effect: NoScheduled}]}\n",
            "/spec/tolerations/0/effect",
            "NoScheduled",
        ),
        broken("unknown inferred kind", GANG, "spec: {infer: [Deployment]}\n", "/spec/infer/0", "Deployment"),
        broken("unknown onTimeout", GANG, "spec: {onTimeout: Retry}\n", "/spec/onTimeout", "Retry"),
        broken(
            "unknown external scheduler",
            CLUSTER,
            "spec: {externalSchedulers: [Slurm]}\n",
            "/spec/externalSchedulers/0",
            "Slurm",
        ),
        broken(
            "unknown selector operator",
            TEAM,
            "spec: {namespaces: {selector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}}}\n",
            "/spec/namespaces/selector/matchExpressions/0/operator",
            "Equals",
        ),
        // Wrong kind or version.
        broken(
            "unknown kind",
            "apiVersion: allot.dev/v1alpha1\nkind: Rules\nmetadata: {name: r}\n",
            "spec: {expression: 'true', message: m}\n",
            "/kind",
            "unknown kind",
        ),
        broken(
            "a Kubernetes kind",
            "apiVersion: allot.dev/v1alpha1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: r}\n",
            "spec: {}\n",
            "/kind",
            "unknown kind",
        ),
        broken(
            "other apiVersion",
            "apiVersion: allot.dev/v1\nkind: Rule\nmetadata: {name: r}\n",
            "spec: {expression: 'true', message: m}\n",
            "/apiVersion",
            "apiVersion",
        ),
        broken(
            "no kind",
            "apiVersion: allot.dev/v1alpha1\nmetadata: {name: r}\n",
            "spec: {expression: 'true', message: m}\n",
            "",
            "kind",
        ),
        broken("a spec of another kind", RULE, "spec: {namespaces: {names: [a]}}\n", "/spec", "namespaces"),
        // What the parser checks beyond types, which the schema expresses too.
        broken("rule without any message", RULE, "spec: {expression: 'true'}\n", "/spec", "message"),
        broken(
            "rule matching no kinds",
            RULE,
            "spec: {expression: 'true', message: m, match: {kinds: []}}\n",
            "/spec/match/kinds",
            "spec.match.kinds",
        ),
        broken("placement placing nothing", PLACEMENT, "spec: {appliesTo: AllPods}\n", "/spec", "needs tolerations"),
        broken(
            "team with no namespaces",
            TEAM,
            "spec: {namespaces: {names: []}}\n",
            "/spec/namespaces",
            "spec.namespaces",
        ),
        broken(
            "In without values",
            TEAM,
            "spec: {namespaces: {selector: {matchExpressions: [{key: a, operator: In}]}}}\n",
            "/spec/namespaces/selector/matchExpressions/0",
            "needs values",
        ),
        broken(
            "Exists with values",
            TEAM,
            "spec: {namespaces: {selector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}}}\n",
            "/spec/namespaces/selector/matchExpressions/0/values",
            "takes no values",
        ),
        broken(
            "Gt with two values",
            PLACEMENT,
            "spec: {nodeAffinity: [{key: gpus, operator: Gt, values: ['1', '2']}]}\n",
            "/spec/nodeAffinity/0/values",
            "single value",
        ),
        broken(
            "Gt with a word",
            PLACEMENT,
            "spec: {nodeAffinity: [{key: gpus, operator: Gt, values: [many]}]}\n",
            "/spec/nodeAffinity/0/values/0",
            "must be an integer",
        ),
        broken(
            "NotIn without values",
            PLACEMENT,
            "spec: {nodeAffinity: [{key: pool, operator: NotIn}]}\n",
            "/spec/nodeAffinity/0",
            "Required value",
        ),
        broken(
            "toleration without key, not Exists",
            PLACEMENT,
            "spec: {tolerations: [{operator: Equal, value: x}]}\n",
            "/spec/tolerations/0",
            "operator must be Exists",
        ),
        broken(
            "Exists toleration with a value",
            PLACEMENT,
            "spec: {tolerations: [{key: a, operator: Exists, value: x}]}\n",
            "/spec/tolerations/0/value",
            "value must be empty",
        ),
        broken(
            "tolerationSeconds without NoExecute",
            PLACEMENT,
            "spec: {tolerations: [{key: a, operator: Exists, effect: NoSchedule, tolerationSeconds: 60}]}\n",
            "/spec/tolerations/0/effect",
            "NoExecute",
        ),
        broken(
            "priority class with capitals",
            TEAM,
            "spec: {namespaces: {names: [a]}, priority: {default: High_Priority}}\n",
            "/spec/priority/default",
            "spec.priority.default",
        ),
        broken(
            "allowed class with a space",
            TEAM,
            "spec: {namespaces: {names: [a]}, priority: {allowed: ['low priority']}}\n",
            "/spec/priority/allowed/0",
            "spec.priority.allowed[0]",
        ),
        broken(
            "priority class over 253 characters",
            TEAM,
            &format!("spec: {{namespaces: {{names: [a]}}, priority: {{default: {}}}}}\n", "a".repeat(254)),
            "/spec/priority/default",
            "spec.priority.default",
        ),
        broken(
            "cluster default class",
            CLUSTER,
            "spec: {priority: {globalDefault: Low}}\n",
            "/spec/priority/globalDefault",
            "spec.priority.globalDefault",
        ),
        broken("gang size zero", GANG, "spec: {maxGangSize: 0}\n", "/spec/maxGangSize", "positive"),
        broken("coscheduling size zero", GANG, "spec: {coschedulingSize: 0}\n", "/spec/coschedulingSize", "positive"),
        broken(
            "duration in words",
            GANG,
            "spec: {assemblyTimeout: ten minutes}\n",
            "/spec/assemblyTimeout",
            "invalid duration",
        ),
        broken(
            "duration without unit",
            GANG,
            "spec: {starvationTimeout: '30'}\n",
            "/spec/starvationTimeout",
            "invalid duration",
        ),
        broken(
            "duration with a bad unit",
            GANG,
            "spec: {assemblyTimeout: 10mins30}\n",
            "/spec/assemblyTimeout",
            "invalid duration",
        ),
        broken(
            "negative quota",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: -4}}}\n",
            "/spec/quota/limits/nvidia.com~1gpu",
            "negative",
        ),
        broken(
            "quota in words",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: eight}}}\n",
            "/spec/quota/limits/nvidia.com~1gpu",
            "invalid quantity",
        ),
        broken(
            "quota with a bad suffix",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: 8gb}}}\n",
            "/spec/quota/limits/nvidia.com~1gpu",
            "invalid quantity",
        ),
        broken(
            "quota as a list",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: [8]}}}\n",
            "/spec/quota/limits/nvidia.com~1gpu",
            "not a string or number",
        ),
        broken(
            "empty quota",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {}}}\n",
            "/spec/quota/limits",
            "at least one",
        ),
        broken(
            "zero weight",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: 8}, equivalents: {m: {countsAs: nvidia.com/gpu, weight: 0/7}}}}\n",
            "/spec/quota/equivalents/m/weight",
            "weight",
        ),
        broken(
            "negative weight",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: 8}, equivalents: {m: {countsAs: nvidia.com/gpu, weight: -0.5}}}}\n",
            "/spec/quota/equivalents/m/weight",
            "weight",
        ),
        broken(
            "weight in words",
            TEAM,
            "spec: {namespaces: {names: [a]}, quota: {limits: {nvidia.com/gpu: 8}, equivalents: {m: {countsAs: nvidia.com/gpu, weight: a seventh}}}}\n",
            "/spec/quota/equivalents/m/weight",
            "weight",
        ),
    ]
}

#[test]
fn broken_policies_are_refused_by_the_parser_and_the_schema() {
    let mut problems = Vec::new();
    for case in broken_policies() {
        match parse(&case.text) {
            Ok(()) => problems.push(format!("{}: the parser accepts it", case.what)),
            Err(e) if !e.contains(case.parser_says) => {
                problems.push(format!("{}: the parser's error lacks {:?}: {e}", case.what, case.parser_says))
            }
            Err(_) => {}
        }
        let docs = documents(&case.text);
        assert_eq!(docs.len(), 1, "{}", case.what);
        let errors = schema_errors(&docs[0]);
        if errors.is_empty() {
            problems.push(format!("{}: the schema accepts it", case.what));
        } else if !errors.iter().any(|e| e.split_once(": ").is_some_and(|(at, _)| at.starts_with(case.schema_at))) {
            problems.push(format!("{}: no schema error at {:?}: {errors:?}", case.what, case.schema_at));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// --- refused by the parser only -------------------------------------------------------------

/// What JSON Schema cannot say, and only the parser checks: each case's documents pass the
/// schema, and the parser refuses them with the error given.
fn parser_only() -> Vec<(&'static str, String, &'static str)> {
    let team = format!("{TEAM}spec: {{namespaces: {{names: [vision]}}}}\n---\n");
    vec![
        (
            "CEL syntax in expression",
            format!("{RULE}spec: {{expression: 'object.spec.(', message: m}}\n"),
            "spec.expression",
        ),
        (
            "CEL syntax in messageExpression",
            format!("{RULE}spec: {{expression: 'true', messageExpression: '\"a\" +'}}\n"),
            "spec.messageExpression",
        ),
        (
            "CEL syntax in a Placement's when",
            format!("{PLACEMENT}spec: {{nodeSelector: {{a: b}}, when: 'object.metadata.'}}\n"),
            "spec.when",
        ),
        (
            "glob syntax in a Team's names",
            format!("{TEAM}spec: {{namespaces: {{names: ['vision-[']}}}}\n"),
            "invalid glob",
        ),
        (
            "glob syntax in a Rule's namespaces",
            format!("{RULE}spec: {{expression: 'true', message: m, match: {{namespaces: ['{{a,b']}}}}\n"),
            "invalid glob",
        ),
        (
            "a team that does not exist",
            format!("{team}{RULE}spec: {{expression: 'true', message: m, match: {{teams: [nlp]}}}}\n"),
            "no Team named \"nlp\"",
        ),
        (
            "a default class not allowed",
            format!("{TEAM}spec: {{namespaces: {{names: [a]}}, priority: {{default: high, allowed: [low]}}}}\n"),
            "is not in spec.priority.allowed",
        ),
        ("two documents of one kind and name", format!("{team}{team}"), "already defined"),
        (
            "two Cluster documents",
            format!("{CLUSTER}---\napiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: c2}}\n"),
            "only one Cluster",
        ),
        (
            "countsAs a resource without a limit",
            format!(
                "{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{limits: {{nvidia.com/gpu: 8}}, equivalents: {{m: {{countsAs: amd.com/gpu, weight: 1}}}}}}}}\n"
            ),
            "has no limit",
        ),
        (
            "a quantity too large",
            format!("{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{limits: {{nvidia.com/gpu: '1e30'}}}}}}\n"),
            "too large",
        ),
        (
            "an exponent out of range",
            format!("{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{limits: {{nvidia.com/gpu: '1e31'}}}}}}\n"),
            "exponent out of range",
        ),
        (
            "a weight's denominator over 1e9",
            format!(
                "{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{limits: {{nvidia.com/gpu: 8}}, equivalents: {{m: {{countsAs: nvidia.com/gpu, weight: 1/2000000000}}}}}}}}\n"
            ),
            "weight",
        ),
        (
            "a duration that overflows",
            format!("{GANG}spec: {{assemblyTimeout: 99999999999999999999h}}\n"),
            "invalid duration",
        ),
        (
            "a nodeSelector key the API server refuses",
            format!("{PLACEMENT}spec: {{nodeSelector: {{'bad key!': x}}}}\n"),
            "spec.nodeSelector",
        ),
        (
            "a nodeSelector value the API server refuses",
            format!("{PLACEMENT}spec: {{nodeSelector: {{pool: 'a b'}}}}\n"),
            "spec.nodeSelector",
        ),
        (
            "a toleration key the API server refuses",
            format!("{PLACEMENT}spec: {{tolerations: [{{key: 'a/b/c', operator: Exists}}]}}\n"),
            "spec.tolerations[0].key",
        ),
        (
            "a Gt value over 63 digits",
            format!(
                "{PLACEMENT}spec: {{nodeAffinity: [{{key: gpus, operator: Gt, values: ['{}']}}]}}\n",
                "1".repeat(64)
            ),
            "spec.nodeAffinity[0].values[0]",
        ),
    ]
}

#[test]
fn what_only_the_parser_refuses_passes_the_schema() {
    let mut problems = Vec::new();
    for (what, text, parser_says) in parser_only() {
        for (i, doc) in documents(&text).iter().enumerate() {
            let errors = schema_errors(doc);
            if !errors.is_empty() {
                problems.push(format!("{what}: the schema refuses document {}: {errors:?}", i + 1));
            }
        }
        match parse(&text) {
            Ok(()) => problems.push(format!("{what}: the parser accepts it")),
            Err(e) if !e.contains(parser_says) => {
                problems.push(format!("{what}: the parser's error lacks {parser_says:?}: {e}"))
            }
            Err(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Documents the parser accepts at the edges of what the schema's conditions express.
#[test]
fn valid_edge_cases_pass_both() {
    let cases = [
        CLUSTER.to_string(),
        format!("{CLUSTER}spec:\n"),
        format!("{GANG}spec: {{assemblyTimeout: '0', starvationTimeout: 1h 30m, coschedulingSize: 1}}\n"),
        format!("{GANG}spec: {{assemblyTimeout: 1.5h, starvationTimeout: 2days}}\n"),
        format!("{TEAM}spec: {{namespaces: {{selector: {{matchLabels: {{team: a}}}}}}}}\n"),
        format!(
            "{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{mode: Queue, limits: {{nvidia.com/gpu: 8, memory: 64Gi, cpu: '500m', x: 0.5, y: 0}}, equivalents: {{m: {{countsAs: nvidia.com/gpu, weight: ' 1 / 7 '}}, n: {{countsAs: nvidia.com/gpu, weight: 0.25}}, o: {{countsAs: nvidia.com/gpu, weight: '2'}}}}}}}}\n"
        ),
        format!("{RULE}spec: {{expression: 'true', messageExpression: '\"m\"'}}\n"),
        format!("{PLACEMENT}spec: {{tolerations: [{{operator: Exists}}]}}\n"),
        format!("{PLACEMENT}spec: {{tolerations: [{{key: a, value: b, effect: NoExecute, tolerationSeconds: 30}}]}}\n"),
        format!(
            "{PLACEMENT}spec: {{nodeAffinity: [{{key: gpus, operator: Lt, values: ['3']}}, {{key: pool, operator: Exists}}]}}\n"
        ),
        format!("{PLACEMENT}spec: {{nodeSelector: {{pool: a}}, match: {{namespaces: ['*']}}}}\n"),
    ];
    for text in cases {
        assert_eq!(parse(&text), Ok(()), "{text}");
        for doc in documents(&text) {
            assert!(schema_errors(&doc).is_empty(), "{text}: {:?}", schema_errors(&doc));
        }
    }
}

// --- the patterns accept what the parser accepts --------------------------------------------

fn matches(pattern: &str, text: &str) -> bool {
    jsonschema::is_valid(&json!({"type": "string", "pattern": pattern}), &json!(text))
}

fn weight_parses(weight: &str) -> bool {
    let text = format!(
        "{TEAM}spec: {{namespaces: {{names: [a]}}, quota: {{limits: {{g: 1}}, equivalents: {{m: {{countsAs: g, weight: {}}}}}}}}}\n",
        serde_json::to_string(weight).expect("a JSON string is YAML")
    );
    parse(&text).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_duration_the_parser_reads_matches_the_pattern(text in "[0-9 .]{0,4}(s|m|h|ms|d|days|min|x|M|µs)?[0-9 ]{0,3}(s|h|m|wk)?") {
        if humantime::parse_duration(&text).is_ok() {
            prop_assert!(matches(schema::DURATION_PATTERN, &text), "{text:?}");
        }
    }

    #[test]
    fn every_quantity_the_parser_reads_matches_the_pattern(text in " ?[-+]?[0-9.]{0,4}(m|k|Ki|Mi|e|E|e-|e+|n|i)?[0-9]{0,2} ?") {
        if allot::model::quantity::Quantity::parse(&text).is_ok_and(|q| q.nanos() >= 0) {
            prop_assert!(matches(schema::QUANTITY_PATTERN, &text), "{text:?}");
        }
    }

    #[test]
    fn every_weight_the_parser_reads_matches_the_pattern(text in " ?[-+]?[0-9.]{0,3}( ?/ ?)?[-+]?[0-9.]{0,3}(m|k|e|E-)?[0-9]? ?") {
        if weight_parses(&text) {
            prop_assert!(matches(schema::WEIGHT_PATTERN, &text), "{text:?}");
        }
    }
}

#[test]
fn the_patterns_refuse_what_the_parser_refuses() {
    for bad in ["", "10", "ten minutes", "1.h", "10 parsecs", "5m x"] {
        assert!(humantime::parse_duration(bad).is_err(), "{bad:?}");
        assert!(!matches(schema::DURATION_PATTERN, bad), "{bad:?}");
    }
    for good in ["0", "10m", "1h30m", " 1h 30m ", "1.5h", "2 days", "100ms", "3µs"] {
        assert!(humantime::parse_duration(good).is_ok(), "{good:?}");
        assert!(matches(schema::DURATION_PATTERN, good), "{good:?}");
    }
    for bad in ["", "-1", "1.2.3", "8gb", "e3", ".", "1e"] {
        assert!(!allot::model::quantity::Quantity::parse(bad).is_ok_and(|q| q.nanos() >= 0), "{bad:?}");
        assert!(!matches(schema::QUANTITY_PATTERN, bad), "{bad:?}");
    }
}

// --- in a real editor -------------------------------------------------------------------------

/// Says on the process's real stderr (not captured by the harness) that a test is skipped.
fn skipped(test: &str, why: &str) {
    use std::io::Write as _;
    let line = format!("SKIPPED {test}: {why}\n");
    match std::fs::OpenOptions::new().write(true).open("/dev/stderr") {
        Ok(mut stderr) => {
            let _ = stderr.write_all(line.as_bytes());
        }
        Err(_) => eprint!("{line}"),
    }
}

/// yaml-language-server's entry script: `$ALLOT_YAML_LANGUAGE_SERVER`, else the copy
/// `npm install --prefix target/ci-tools yaml-language-server` puts in target/.
fn yaml_language_server() -> Option<PathBuf> {
    let path = std::env::var_os("ALLOT_YAML_LANGUAGE_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target/ci-tools/node_modules/yaml-language-server/bin/yaml-language-server"));
    let node = Command::new("node").arg("--version").output().is_ok_and(|o| o.status.success());
    (node && path.is_file()).then_some(path)
}

/// The editor's view: yaml-language-server, driven over LSP by `tests/editor/lsp.js`, on a
/// workspace holding the committed schema, the shipped policies and a broken file.
#[test]
fn yaml_language_server_shows_the_schema_in_an_editor() {
    const TEST: &str = "yaml_language_server_shows_the_schema_in_an_editor";
    let Some(server) = yaml_language_server() else {
        return skipped(
            TEST,
            "needs node and yaml-language-server (set ALLOT_YAML_LANGUAGE_SERVER, or \
             `npm install --prefix target/ci-tools yaml-language-server`)",
        );
    };
    // Not a hidden directory (tempfile's default `.tmp…`): the server's globs skip those.
    let workspace = tempfile::Builder::new().prefix("allot-editor-").tempdir().expect("temp dir");
    let schema_dir = workspace.path().join("schema");
    std::fs::create_dir_all(&schema_dir).expect("schema dir");
    for (name, text) in schema::files() {
        std::fs::write(schema_dir.join(name), text).expect("write schema");
    }
    let modeline = "# yaml-language-server: $schema=../schema/allot.schema.json\n";
    let mut files = serde_json::Map::new();
    // The shipped policies, through the settings mapping (every document of a file).
    for name in ["cluster", "gangs", "placement", "rules", "teams"] {
        let text = std::fs::read_to_string(root().join(format!("policies/{name}.yaml"))).expect("policy");
        files.insert(format!("policies/{name}.yaml"), json!(text));
    }
    // A broken file; its documents and the line of each mistake (1-based).
    let broken = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  expression: 'true'\n  message: m\n  action: Block\n---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: t}\nspec:\n  namespaces: {names: [a]}\n  quota:\n    mode: queue\n    limits: {nvidia.com/gpu: eight}\n---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: p}\nspec:\n  tolerations:\n    - {key: a, operator: Exists, effect: NoExecute, tolerationSecond: 5}\n---\napiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  assemblyTimeout: ten minutes\n  maxGangSize: 0\n---\napiVersion: allot.dev/v1alpha1\nkind: Rules\nmetadata: {name: x}\n";
    files.insert("policies/broken.yaml".into(), json!(broken));
    // The same file outside the mapping, with a modeline in each document.
    files.insert(
        "other/broken.yaml".into(),
        json!(format!("{modeline}{}", broken.replace("---\n", &format!("---\n{modeline}")))),
    );
    // A Rule being written: completion inside `spec`, hover on `expression`.
    let draft = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata:\n  name: r\nspec:\n  expression: 'true'\n  message: m\n  \n";
    files.insert("policies/draft.yaml".into(), json!(draft));
    let request = json!({
        "settings": {"validate": true, "completion": true, "hover": true, "schemaStore": {"enable": false},
                     "schemas": {"./schema/allot.schema.json": ["policies/*.yaml"]}},
        "files": files,
        "queries": [
            {"kind": "completion", "file": "policies/draft.yaml", "line": 7, "character": 2},
            {"kind": "hover", "file": "policies/draft.yaml", "line": 5, "character": 4},
        ],
    });
    let request_file = workspace.path().join("request.json");
    std::fs::write(&request_file, request.to_string()).expect("write request");
    let out = Command::new("node")
        .arg(root().join("tests/editor/lsp.js"))
        .arg(&server)
        .arg(workspace.path())
        .arg(&request_file)
        .output()
        .expect("run node");
    assert!(out.status.success(), "lsp.js failed: {}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).expect("lsp.js prints JSON");
    let shown = |file: &str| -> Vec<(u64, String)> {
        result["diagnostics"][file]
            .as_array()
            .expect("diagnostics")
            .iter()
            .map(|d| (d["line"].as_u64().unwrap_or(0), d["message"].as_str().unwrap_or_default().to_string()))
            .collect()
    };
    for name in ["cluster", "gangs", "placement", "rules", "teams"] {
        let file = format!("policies/{name}.yaml");
        assert_eq!(shown(&file), vec![], "{file}");
    }
    let expected = [
        (7, "\"Deny\" | \"Warn\" | \"Audit\""),
        (15, "\"Deny\" | \"Queue\""),
        (16, "a non-negative quantity"),
        (23, "tolerationSecond is not allowed"),
        (29, "a duration such as 90s"),
        (30, "minimum of 1"),
        (33, "\"Cluster\", \"Team\", \"Placement\", \"Rule\", \"GangPolicy\""),
    ];
    let mapped = shown("policies/broken.yaml");
    // With a modeline, the lines move down: one line for the first document's modeline, and one
    // more for each `---` passed.
    let with_modelines = shown("other/broken.yaml");
    for (line, text) in expected {
        assert!(mapped.iter().any(|(l, m)| *l == line && m.contains(text)), "no {text:?} on line {line}: {mapped:?}");
        let documents_before = broken.lines().take(line as usize).filter(|l| *l == "---").count() as u64;
        let moved = line + 1 + documents_before;
        assert!(
            with_modelines.iter().any(|(l, m)| *l == moved && m.contains(text)),
            "modelines: no {text:?} on line {moved}: {with_modelines:?}"
        );
    }
    assert_eq!(mapped.len(), expected.len(), "{mapped:?}");
    assert_eq!(shown("policies/draft.yaml"), vec![]);
    let completion: Vec<&str> =
        result["answers"][0].as_array().expect("completion").iter().filter_map(Value::as_str).collect();
    for field in ["action", "match", "messageExpression"] {
        assert!(completion.contains(&field), "completion lacks {field}: {completion:?}");
    }
    let hover = result["answers"][1].as_str().expect("hover text");
    assert!(hover.contains("CEL that must evaluate to"), "{hover}");
}

// --- test files (`kind: Test`) ----------------------------------------------------------------

fn test_schema() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let value: Value = serde_json::from_str(&allot(&["schema", "--kind", "Test"])).expect("JSON");
        jsonschema::draft7::new(&value).expect("a valid draft-07 schema")
    })
}

fn test_schema_errors(doc: &Value) -> Vec<String> {
    test_schema().iter_errors(doc).map(|e| format!("{}: {e}", e.instance_path())).collect()
}

/// `allot test` on one test file written next to the shipped policies: its exit code and output.
fn run_test_file(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("case.yaml");
    std::fs::write(&file, text.replace("POLICIES", &root().join("policies").display().to_string())).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_allot")).arg("test").arg(&file).output().expect("run allot test");
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn every_shipped_test_file_validates_against_the_test_schema() {
    let mut files = Vec::new();
    yaml_files(&root().join("policy-tests"), &mut files);
    let (mut checked, mut failures) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let Ok(docs) = policy::parse_documents(&file.display().to_string(), &text) else { continue };
        for (index, doc) in docs {
            if doc.get("kind").and_then(Value::as_str) != Some("Test") {
                continue;
            }
            checked += 1;
            for e in test_schema_errors(&doc) {
                failures.push(format!("{}#{index}: {e}", file.strip_prefix(root()).unwrap_or(file).display()));
            }
        }
    }
    assert!(failures.is_empty(), "shipped test files the schema refuses:\n{}", failures.join("\n"));
    assert!(checked >= 9, "only {checked} test documents found");
}

/// Broken test files: `allot test` refuses each (exit 2, naming the field), and so does the
/// schema, at the same place.
#[test]
fn broken_test_files_are_refused_by_allot_test_and_the_schema() {
    const HEAD: &str = "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {name: t}\npolicies: POLICIES\n";
    const POD: &str = "{apiVersion: v1, kind: Pod, metadata: {name: p, namespace: vision}, spec: {containers: [{name: c, image: 'busybox:1.36'}]}}";
    let good = format!("{HEAD}cases:\n  - name: c\n    resource: {POD}\n    expect: {{allowed: true}}\n");
    let (code, out) = run_test_file(&good);
    assert_eq!(code, Some(0), "the well-formed file passes: {out}");
    assert!(test_schema_errors(&documents(&good)[0]).is_empty(), "{:?}", test_schema_errors(&documents(&good)[0]));
    // (file text, the parser's words, the schema's instance pointer)
    let cases: Vec<(String, &str, &str)> = vec![
        (format!("{HEAD}cases: []\nextra: 1\n"), "extra", ""),
        (format!("{HEAD}\n"), "cases", ""),
        (
            format!("{HEAD}cases:\n  - name: c\n    resource: {POD}\n    expect: {{allowed: maybe}}\n"),
            "allowed",
            "/cases/0/expect/allowed",
        ),
        (
            format!("{HEAD}cases:\n  - name: c\n    resource: {POD}\n    expect: {{denyBy: []}}\n"),
            "denyBy",
            "/cases/0/expect",
        ),
        (
            format!("{HEAD}cases:\n  - name: c\n    resource: {POD}\n    expect: {{deniedBy:}}\n"),
            "deniedBy",
            "/cases/0/expect/deniedBy",
        ),
        (
            format!(
                "{HEAD}cases:\n  - name: c\n    resource: {POD}\n    expect: {{patch: [{{op: move, path: /a}}]}}\n"
            ),
            "move",
            "/cases/0/expect/patch/0/op",
        ),
        (format!("{HEAD}cases:\n  - resource: {POD}\n    expect: {{allowed: true}}\n"), "name", "/cases/0"),
        (
            format!(
                "{HEAD}cases:\n  - name: c\n    path: x.yaml\n    select: {{document: first}}\n    expect: {{allowed: true}}\n"
            ),
            "document",
            "/cases/0/select/document",
        ),
        (
            format!(
                "{HEAD}cases:\n  - name: c\n    resource: {POD}\n    usage: {{vision: {{nvidia.com/gpu: 1}}}}\n    expect: {{allowed: true}}\n"
            ),
            "vision",
            "/cases/0/usage",
        ),
        (
            "apiVersion: allot.dev/v1alpha1\nkind: Test\nmetadata: {name: t, labels: {a: b}}\ncases: []\n".to_string(),
            "labels",
            "/metadata",
        ),
    ];
    for (text, words, pointer) in &cases {
        let (code, out) = run_test_file(text);
        assert_eq!(code, Some(2), "allot test must refuse:\n{text}\n{out}");
        assert!(out.contains(words), "allot test's message names {words:?}:\n{text}\n{out}");
        let errors = test_schema_errors(&documents(text)[0]);
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{pointer}: "))),
            "the schema must refuse at {pointer:?}:\n{text}\n{errors:?}"
        );
    }
}
