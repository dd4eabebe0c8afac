//! The monitoring that ships in deploy/ (issue 16): Prometheus rules, their PrometheusRule copy,
//! the ServiceMonitor and the Grafana dashboard, tested as a platform team uses them.
//!
//! - `promtool check rules` and `promtool test rules deploy/monitoring/tests/*.yaml` pass, and
//!   every dashboard query parses as PromQL (promtool from `$ALLOT_PROMTOOL` or PATH; `.ci/run`
//!   installs Debian's; without one these print SKIPPED);
//! - every alert has a unit test where it fires and one where it does not; every recording rule
//!   is tested;
//! - the PrometheusRule is the rules file (deploy/sync.sh writes it), the ServiceMonitor scrapes
//!   the metrics Service under the job name the alerts use;
//! - a real `allot serve`, driven a little (a mutate, a denial, a panicking rule, a broken policy
//!   reload, a broken certificate), exports every metric name the rules and the dashboard use,
//!   with every label they match or group on: renaming a metric or a label fails here.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{KilledOnDrop, root, skipped};

const RULES: &str = "deploy/monitoring/rules.yaml";
const RULE_TESTS: &str = "deploy/monitoring/tests";
const DASHBOARD: &str = "deploy/monitoring/dashboard.json";
const PROMETHEUS_RULE: &str = "deploy/components/monitoring/prometheusrule.yaml";
const SERVICE_MONITOR: &str = "deploy/components/monitoring/servicemonitor.yaml";
/// The scrape job the alerts on `up` name (the ServiceMonitor's: the metrics Service's name).
const JOB: &str = "allot-metrics";
/// Metrics the queries may use that Allot does not export: Prometheus's own `up`, and the
/// kubelet's cAdvisor memory of the container. Their labels are not checked.
const EXTERNAL_METRICS: [&str; 2] = ["up", "container_memory_working_set_bytes"];
/// Families a replica reports only from a cluster's pods (no series, and so no name, without
/// one): their names and labels are read from the server's `Metrics` filled in process.
const FILLED_BY_A_CLUSTER: [&str; 1] = ["allot_team_accelerators"];
/// Labels Prometheus adds to every scraped series.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

fn yaml(relative: &str) -> Value {
    serde_saphyr::from_str(&read(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The rules and the dashboard, as data

struct Rules {
    /// Alert names, in file order.
    alerts: Vec<String>,
    /// Recording rule name → the labels its expression keeps (its `by (…)` labels).
    recorded: BTreeMap<String, BTreeSet<String>>,
    /// Every expression, with where it comes from.
    exprs: Vec<(String, String)>,
}

fn rules() -> Rules {
    let doc = yaml(RULES);
    let mut rules = Rules { alerts: Vec::new(), recorded: BTreeMap::new(), exprs: Vec::new() };
    for group in doc["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr").to_string();
            if let Some(alert) = rule["alert"].as_str() {
                rules.alerts.push(alert.to_string());
                rules.exprs.push((format!("alert {alert}"), expr));
            } else {
                let record = rule["record"].as_str().expect("record or alert").to_string();
                let kept = parse_promql(&expr).grouping;
                rules.recorded.insert(record.clone(), kept);
                rules.exprs.push((format!("record {record}"), expr));
            }
        }
    }
    rules
}

/// Every query of the dashboard, with its panel's title.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("dashboard.json is JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?");
            out.push((format!("panel {title:?}"), target["expr"].as_str().expect("expr").to_string()));
        }
    }
    assert!(out.len() >= 20, "the dashboard has {} queries", out.len());
    out
}

/// A dashboard query as Prometheus sees it: Grafana's variables replaced.
fn as_prometheus_sees_it(query: &str) -> String {
    query.replace("$__rate_interval", "5m").replace("$job", JOB)
}

// ---------------------------------------------------------------------------------------------
// A loose PromQL reader: enough to find metric selectors, their label matchers, and grouping

/// What an expression reads.
#[derive(Debug, Default)]
struct Query {
    /// Each selector: metric name and the label names it matches on.
    selectors: Vec<(String, Vec<String>)>,
    /// Labels named in `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`.
    grouping: BTreeSet<String>,
}

/// Operators and aggregations: never metric names, whether or not a `(` follows at once
/// (`sum by (x) (…)`).
const KEYWORDS: [&str; 20] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
];
const GROUPING: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

fn parse_promql(expr: &str) -> Query {
    let chars: Vec<char> = expr.chars().collect();
    let mut q = Query::default();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let read_string = |mut i: usize| {
        // At an opening quote: returns the index after the closing one.
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            if chars[i] == '\\' {
                i += 1;
            }
            i += 1;
        }
        i + 1
    };
    let read_ident = |mut i: usize| {
        let start = i;
        while i < chars.len() && ident_char(chars[i]) {
            i += 1;
        }
        (chars[start..i].iter().collect::<String>(), i)
    };
    // `( a, b )` → the names, and the index after `)`.
    let read_label_list = |i: usize| {
        let mut names = Vec::new();
        let mut i = skip_ws(i);
        if i >= chars.len() || chars[i] != '(' {
            return (names, i);
        }
        i += 1;
        while i < chars.len() && chars[i] != ')' {
            if ident_start(chars[i]) {
                let (name, next) = read_ident(i);
                names.push(name);
                i = next;
            } else {
                i += 1;
            }
        }
        (names, i + 1)
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = read_string(i);
        } else if c == '[' {
            // A range or subquery duration.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c == '$' {
            // A Grafana variable.
            let (_, next) = read_ident(i + 1);
            i = next;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number (1e6, 0.99, 0x1f).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if ident_start(c) {
            let (name, next) = read_ident(i);
            let after = skip_ws(next);
            if GROUPING.contains(&name.as_str()) {
                let (names, next) = read_label_list(after);
                q.grouping.extend(names);
                i = next;
            } else if KEYWORDS.contains(&name.to_lowercase().as_str()) || chars.get(after) == Some(&'(') {
                // An operator, or a function or aggregation called here.
                i = next;
            } else {
                let mut labels = Vec::new();
                i = next;
                if chars.get(after) == Some(&'{') {
                    i = after + 1;
                    while i < chars.len() && chars[i] != '}' {
                        if chars[i] == '"' || chars[i] == '\'' || chars[i] == '`' {
                            i = read_string(i);
                        } else if ident_start(chars[i]) {
                            let (label, next) = read_ident(i);
                            labels.push(label);
                            i = next;
                        } else {
                            i += 1;
                        }
                    }
                    i += 1;
                }
                q.selectors.push((name, labels));
            }
        } else {
            i += 1;
        }
    }
    q
}

#[test]
fn the_promql_reader_finds_selectors_labels_and_grouping() {
    let q = parse_promql(
        r#"sum by (rule, action) (rate(allot_x_total{job="$job",action=~"warn|audit",msg="a{b}"}[$__rate_interval]))
           / on(instance) group_left max without(le) (allot:y{ team = 'v' }) > 0.5e3 and up"#,
    );
    assert_eq!(
        q.selectors,
        [
            ("allot_x_total".to_string(), vec!["job".to_string(), "action".into(), "msg".into()]),
            ("allot:y".to_string(), vec!["team".to_string()]),
            ("up".to_string(), vec![]),
        ]
    );
    let grouping: Vec<&str> = q.grouping.iter().map(String::as_str).collect();
    assert_eq!(grouping, ["action", "instance", "le", "rule"]);
}

// ---------------------------------------------------------------------------------------------
// promtool

fn promtool(test: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ALLOT_PROMTOOL").map(PathBuf::from) {
        assert!(p.is_file(), "ALLOT_PROMTOOL={} is not a file", p.display());
        return Some(p);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    if on_path.is_none() {
        skipped(
            test,
            "no promtool: set ALLOT_PROMTOOL or put promtool on PATH (Debian's `prometheus` package; .ci/run installs it)",
        );
    }
    on_path
}

fn run_promtool(promtool: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", promtool.display()));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {} failed ({}):\n{text}", args.join(" "), out.status);
    text
}

fn rule_test_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root().join(RULE_TESTS))
        .expect("deploy/monitoring/tests")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .map(|f| format!("tests/{f}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool unit tests in {RULE_TESTS}");
    files
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let Some(promtool) = promtool("promtool_checks_the_rules_and_passes_their_unit_tests") else { return };
    let dir = root().join("deploy/monitoring");
    let checked = run_promtool(&promtool, &dir, &["check", "rules", "rules.yaml"]);
    let rules = rules();
    let count = rules.alerts.len() + rules.recorded.len();
    assert!(checked.contains(&format!("SUCCESS: {count} rules found")), "{checked}");
    let files = rule_test_files();
    let mut args = vec!["test", "rules"];
    args.extend(files.iter().map(String::as_str));
    let tested = run_promtool(&promtool, &dir, &args);
    assert_eq!(tested.matches("SUCCESS").count(), files.len(), "{tested}");
    assert!(!tested.contains("FAILED"), "{tested}");
}

/// promtool has no PromQL-only check: the dashboard's queries, with Grafana's variables
/// replaced, are checked as recording rules.
#[test]
fn every_dashboard_query_is_valid_promql() {
    let Some(promtool) = promtool("every_dashboard_query_is_valid_promql") else { return };
    let queries = dashboard_queries();
    let rules: Vec<Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, q))| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": as_prometheus_sees_it(q)}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("dashboard-rules.json"), file.to_string()).expect("write");
    let out = run_promtool(&promtool, dir.path(), &["check", "rules", "dashboard-rules.json"]);
    assert!(out.contains(&format!("SUCCESS: {} rules found", queries.len())), "{out}");
}

/// The promtool tests would pass with an alert nobody tested: every alert must be expected to
/// fire somewhere and to stay quiet somewhere, and every recording rule be evaluated.
#[test]
fn every_alert_is_tested_firing_and_quiet_and_every_recording_rule_is_tested() {
    let rules = rules();
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let mut evaluated = String::new();
    for file in rule_test_files() {
        let doc = yaml(&format!("deploy/monitoring/{file}"));
        assert_eq!(doc["rule_files"][0], "../rules.yaml", "{file} tests the shipped rules");
        for test in doc["tests"].as_array().expect("tests") {
            for t in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = t["alertname"].as_str().expect("alertname").to_string();
                assert!(rules.alerts.contains(&name), "{file} tests {name}, which is no alert in {RULES}");
                let expected = t["exp_alerts"].as_array().map_or(0, Vec::len);
                if expected == 0 {
                    quiet.insert(name)
                } else {
                    firing.insert(name)
                };
            }
            for t in test["promql_expr_test"].as_array().into_iter().flatten() {
                evaluated.push_str(t["expr"].as_str().expect("expr"));
                evaluated.push('\n');
            }
        }
    }
    for alert in &rules.alerts {
        assert!(firing.contains(alert), "no promtool test expects {alert} to fire");
        assert!(quiet.contains(alert), "no promtool test expects {alert} to stay quiet");
    }
    for record in rules.recorded.keys() {
        assert!(evaluated.contains(record.as_str()), "no promql_expr_test evaluates {record}");
    }
    // Every alert says how bad it is, and what it means.
    for rule in yaml(RULES)["groups"][1]["rules"].as_array().expect("alerts") {
        let severity = rule["labels"]["severity"].as_str().unwrap_or("");
        assert!(["critical", "warning", "info"].contains(&severity), "{}: severity {severity:?}", rule["alert"]);
        for annotation in ["summary", "description"] {
            assert!(rule["annotations"][annotation].is_string(), "{}: no {annotation}", rule["alert"]);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The prometheus-operator component

#[test]
fn the_prometheus_rule_is_the_rules_file() {
    let rule = yaml(PROMETHEUS_RULE);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["metadata"]["namespace"], "allot-system");
    let plain = yaml(RULES);
    assert!(
        rule["spec"] == plain,
        "{PROMETHEUS_RULE} is not {RULES}: edit {RULES}, then run deploy/sync.sh to regenerate it"
    );
    let kustomization = yaml("deploy/components/monitoring/kustomization.yaml");
    assert_eq!(kustomization["kind"], "Component");
    let resources: Vec<&str> =
        kustomization["resources"].as_array().expect("resources").iter().filter_map(Value::as_str).collect();
    assert_eq!(resources, ["servicemonitor.yaml", "prometheusrule.yaml"]);
}

#[test]
fn the_service_monitor_scrapes_the_metrics_service_under_the_job_the_alerts_name() {
    let monitor = yaml(SERVICE_MONITOR);
    assert_eq!(
        (monitor["apiVersion"].as_str(), monitor["kind"].as_str()),
        (Some("monitoring.coreos.com/v1"), Some("ServiceMonitor"))
    );
    let services: Vec<Value> = serde_saphyr::from_multiple(&read("deploy/base/service.yaml")).expect("services");
    let wanted = monitor["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
    let selected: Vec<&Value> =
        services.iter().filter(|s| wanted.iter().all(|(k, v)| &s["metadata"]["labels"][k] == v)).collect();
    let names: Vec<&str> = selected.iter().filter_map(|s| s["metadata"]["name"].as_str()).collect();
    // Prometheus names the job after the Service: the alerts on `up` expect exactly this one.
    assert_eq!(names, [JOB], "the ServiceMonitor must select the metrics Service only");
    assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"][0], selected[0]["metadata"]["namespace"]);
    let port = monitor["spec"]["endpoints"][0]["port"].as_str().expect("endpoint port");
    assert!(
        selected[0]["spec"]["ports"].as_array().expect("ports").iter().any(|p| p["name"] == port),
        "the Service has no port named {port}"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    let up_selectors: Vec<String> =
        rules().exprs.iter().filter(|(_, e)| e.contains("up{")).map(|(_, e)| e.clone()).collect();
    assert!(!up_selectors.is_empty());
    for e in up_selectors {
        assert!(e.contains(&format!("job=\"{JOB}\"")), "{e} does not name the job {JOB}");
    }
}

/// `$KUBECTL`, or `kubectl` on PATH (with built-in kustomize); `None` after a SKIPPED line.
fn kubectl(test: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBECTL").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file());
    if found.is_none() {
        skipped(
            test,
            "needs kubectl with built-in kustomize: set KUBECTL or put kubectl on PATH (.ci/run installs one)",
        );
    }
    found
}

/// `to` relative to the directory `from` (kustomize accepts no absolute paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

/// deploy/ with the monitoring component, as a user's kustomization adds it.
#[test]
fn the_monitoring_component_renders_with_the_install() {
    let Some(kubectl) = kubectl("the_monitoring_component_renders_with_the_install") else { return };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let deploy = root().join("deploy").canonicalize().expect("deploy/");
    let base = dir.path().canonicalize().expect("tempdir");
    let to_deploy = relative(&base, &deploy);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
            to_deploy.display(),
            to_deploy.join("components/monitoring").display()
        ),
    )
    .expect("kustomization");
    let out = Command::new(&kubectl).arg("kustomize").arg(dir.path()).output().expect("run kubectl kustomize");
    let rendered = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kubectl kustomize failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<Value> = serde_saphyr::from_multiple(&rendered).expect("rendered YAML");
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the render:\n{rendered}"))
    };
    let rule = find("PrometheusRule", "allot");
    assert_eq!(rule["metadata"]["namespace"], "allot-system");
    assert!(rule["spec"] == yaml(RULES), "the rendered PrometheusRule is not {RULES}");
    let monitor = find("ServiceMonitor", "allot");
    let service = find("Service", JOB);
    assert_eq!(monitor["metadata"]["namespace"], service["metadata"]["namespace"]);
    for (k, v) in monitor["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels") {
        assert_eq!(&service["metadata"]["labels"][k], v, "the ServiceMonitor does not select {JOB} by {k}");
    }
    // The install itself is all there: the component adds, it does not replace.
    find("Deployment", "allot");
    find("ValidatingWebhookConfiguration", "allot");
}

// ---------------------------------------------------------------------------------------------
// The exposition of a real `allot serve`

/// Metric names and the label names seen on their series.
#[derive(Debug, Default)]
struct Exposition {
    /// Every sample name a `# TYPE` line announces (counters `_total`, histograms
    /// `_bucket`/`_sum`/`_count`), also for families with no series yet.
    names: BTreeSet<String>,
    /// Sample name → label names of its series.
    labels: BTreeMap<String, BTreeSet<String>>,
}

fn parse_exposition(text: &str) -> Exposition {
    let mut e = Exposition::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            e.names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = line[..end].to_string();
            let mut labels = BTreeSet::new();
            if line[end..].starts_with('{') {
                // name{a="x",b="y"} value: label names are what precedes each `="`.
                let body = &line[end + 1..line.rfind('}').unwrap_or(line.len())];
                let mut rest = body;
                while let Some(eq) = rest.find("=\"") {
                    labels.insert(rest[..eq].trim_start_matches(',').trim().to_string());
                    // Skip the quoted value (escapes included).
                    let mut chars = rest[eq + 2..].char_indices();
                    let mut close = rest.len() - eq - 2;
                    while let Some((j, c)) = chars.next() {
                        if c == '\\' {
                            chars.next();
                        } else if c == '"' {
                            close = j;
                            break;
                        }
                    }
                    rest = &rest[(eq + 2 + close + 1).min(rest.len())..];
                }
            }
            e.names.insert(name.clone());
            e.labels.entry(name).or_default().extend(labels);
        }
    }
    e
}

/// A Warn rule whose evaluation panics (the test-hooks build's `allotTestPanic`): contained,
/// counted in `allot_rule_evaluation_panics_total`; and one that errors on an object without
/// that annotation, counted in `allot_rule_evaluation_errors_total`.
const PANICKING_WARN_RULE: &str = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: panics-warn}\nspec:\n  expression: allotTestPanic(object)\n  message: m\n  action: Warn\n---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: errors-warn}\nspec:\n  expression: \"object.metadata.annotations['allot-test/absent'] == 'x'\"\n  message: m\n  action: Warn\n";

/// `allot serve --no-kube` in a temporary directory with the shipped policies plus a Warn rule
/// that panics (the test-hooks build's `allotTestPanic`); killed on drop.
struct Serve {
    /// Held for its Drop: the server stops with the test.
    _child: KilledOnDrop,
    dir: tempfile::TempDir,
    https: String,
    metrics: String,
}

impl Serve {
    fn start() -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).expect("policies");
        for entry in std::fs::read_dir(root().join("policies")).expect("policies/") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), policies.join(entry.file_name())).expect("copy policy");
        }
        std::fs::write(policies.join("zz-panics.yaml"), PANICKING_WARN_RULE).expect("panics.yaml");
        let certs = dir.path().join("certs");
        let out = Command::new(env!("CARGO_BIN_EXE_allot"))
            .args(["certs", "--out", certs.to_str().expect("utf-8"), "--dns-name", "localhost"])
            .output()
            .expect("allot certs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let log = std::fs::File::create(dir.path().join("allot.log")).expect("log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_allot"))
            .arg("serve")
            .arg("--policies")
            .arg(&policies)
            .arg("--tls-cert")
            .arg(certs.join("tls.crt"))
            .arg("--tls-key")
            .arg(certs.join("tls.key"))
            .args([
                "--addr",
                "127.0.0.1:0",
                "--metrics-addr",
                "127.0.0.1:0",
                "--no-kube",
                "--reload-interval-secs",
                "1",
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn allot serve");
        let stdout = child.stdout.take().expect("stdout");
        let mut serve = Serve { _child: KilledOnDrop::new(child), dir, https: String::new(), metrics: String::new() };
        let line = support::first_line(stdout, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("allot serve did not start:\n{}", serve.log()));
        (serve.https, serve.metrics) = support::serving_addresses(&line).expect("address");
        serve
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("allot.log")).unwrap_or_default()
    }

    /// POSTs a captured AdmissionReview over HTTPS (HTTP/1.1); returns status line and body.
    fn review(&self, path: &str, fixture: &str) -> (u16, String) {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        let body = std::fs::read(root().join("tests/fixtures/admission-reviews").join(fixture)).expect("fixture");
        let mut roots = rustls::RootCertStore::empty();
        let ca = rustls::pki_types::CertificateDer::from_pem_file(self.dir.path().join("certs/ca.crt")).expect("ca");
        roots.add(ca).expect("add ca");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let connection = rustls::ClientConnection::new(Arc::new(config), name).expect("tls");
        let tcp = TcpStream::connect(&self.https).expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        tcp.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut tls = rustls::StreamOwned::new(connection, tcp);
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).and_then(|()| tls.write_all(&body)).expect("send review");
        let mut answer = Vec::new();
        // A peer that closes without close_notify ends the read with an error after the body.
        let _ = tls.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, answer)
    }

    fn scrape(&self) -> String {
        scrape(&self.metrics)
    }

    /// Scrapes until `done` holds (at most 20 s).
    fn scrape_until(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = self.scrape();
            if done(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}; /metrics:\n{text}\nlog:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The value of an unlabelled gauge in a scrape (-1 when absent).
fn gauge(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(-1.0)
}

/// `GET /metrics` on a plain-HTTP metrics address: the whole response.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("metrics address");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).expect("GET");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read /metrics");
    assert!(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The exposition of the server's `Metrics` (the code `allot serve` encodes) with a gated GPU
/// pod of team vision in its cluster view: what [`FILLED_BY_A_CLUSTER`] is read from.
fn cluster_family_labels() -> Exposition {
    use allot::control::cluster::{ClusterState, PodRecord};
    use allot::model::namespaces::NoNamespaces;
    let policies = allot::model::policy::load_dir(&root().join("policies")).expect("shipped policies");
    let cluster = Arc::new(ClusterState::default());
    let state = allot::server::AppState::with_cluster(policies, Arc::new(NoNamespaces), cluster.clone());
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "m-0", "namespace": "vision", "creationTimestamp": "2026-11-22T01:00:00Z",
            "labels": {"allot.dev/gang-name": "g"}, "annotations": {"allot.dev/gang-size": "2"}},
        "spec": {"schedulingGates": [{"name": "allot.dev/gang"}],
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .expect("pod");
    cluster.upsert_pod(PodRecord::from_pod(&pod, &state.policies.load(), &NoNamespaces).expect("record"));
    state.metrics.set_usage(&cluster.accelerator_usage(&state.policies.load(), &NoNamespaces));
    parse_exposition(&state.metrics.encode())
}

/// Checks every metric, label matcher and grouping label of the rules and the dashboard against
/// a scrape of `allot serve` (`filled`, when given, for [`FILLED_BY_A_CLUSTER`]): the problems,
/// and which metrics were checked.
fn check_queries(exported: &Exposition, filled: Option<&Exposition>) -> (Vec<String>, BTreeSet<String>) {
    let rules = rules();
    let mut queries = rules.exprs.clone();
    queries.extend(dashboard_queries().into_iter().map(|(w, q)| (w, as_prometheus_sees_it(&q))));
    let mut problems = Vec::new();
    let mut checked = BTreeSet::new();
    for (place, expr) in &queries {
        let q = parse_promql(expr);
        assert!(!q.selectors.is_empty(), "{place}: no metric found in {expr}");
        // Labels each selector's metric has, to check the expression's grouping against.
        let mut available: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        // Grouping over a metric Allot does not export (cAdvisor's `pod`) is not checked.
        let mut external = false;
        for (metric, matchers) in &q.selectors {
            let labels: BTreeSet<String> = if let Some(kept) = rules.recorded.get(metric) {
                kept.clone()
            } else if metric.starts_with("allot_") {
                // Names and labels from the real server's scrape; a family only a cluster fills
                // from the same `Metrics`, filled in process.
                let (source, from) = match filled {
                    Some(filled) if FILLED_BY_A_CLUSTER.contains(&metric.as_str()) => {
                        (filled, "Metrics filled with a cluster's pods")
                    }
                    _ => (exported, "allot serve"),
                };
                if !source.names.contains(metric) {
                    problems.push(format!("{place}: {metric} is not exported by {from}"));
                    continue;
                }
                match source.labels.get(metric) {
                    Some(labels) => labels.clone(),
                    None => {
                        problems.push(format!("{place}: {metric} has no series in {from} to check its labels on"));
                        continue;
                    }
                }
            } else if EXTERNAL_METRICS.contains(&metric.as_str()) {
                external = true;
                continue;
            } else {
                problems.push(format!("{place}: unknown metric {metric}"));
                continue;
            };
            checked.insert(metric.clone());
            for label in matchers {
                if !labels.contains(label) && !TARGET_LABELS.contains(&label.as_str()) {
                    problems.push(format!("{place}: {metric} has no label {label} (it has {labels:?})"));
                }
            }
            available.extend(labels);
        }
        for label in &q.grouping {
            if !available.contains(label) && !external {
                problems.push(format!("{place}: groups on {label}, which none of its metrics has ({available:?})"));
            }
        }
    }
    (problems, checked)
}

#[test]
fn the_rules_and_the_dashboard_use_only_what_a_real_allot_serve_exports() {
    allot::install_crypto_provider();
    let serve = Serve::start();
    // Drive it: a mutation, a denial, a panicking Warn rule (contained and counted).
    let (status, body) = serve.review("/mutate", "010-mutate-create-pod-my-gpu-pod.json");
    assert_eq!(status, 200, "{body}");
    let (status, body) = serve.review("/validate", "015-validate-create-pod-tolerated-gpu-pod.json");
    assert!(status == 200 && body.contains("\"allowed\":false"), "{body}");
    // A rotated certificate valid for 5 days: reloaded, and its expiry is what the gauge says.
    let rotated = serve.dir.path().join("rotated");
    let out = Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(["certs", "--out", rotated.to_str().expect("utf-8"), "--dns-name", "localhost", "--days", "5"])
        .output()
        .expect("allot certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let certs = serve.dir.path().join("certs");
    for file in ["ca.crt", "tls.key", "tls.crt"] {
        std::fs::copy(rotated.join(file), certs.join(file)).expect("rotate");
    }
    let text = serve.scrape_until("the rotated certificate", |t| {
        t.contains("allot_certificate_reloads_total{result=\"success\"} 1")
    });
    let expiry = gauge(&text, "allot_certificate_expiry_timestamp_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    assert!((expiry - (now + 5.0 * 86400.0)).abs() < 600.0, "certificate expiry {expiry}, now {now}");
    // A broken policy file and a broken certificate: both refused, counted, the old ones kept.
    std::fs::write(serve.dir.path().join("policies/broken.yaml"), "apiVersion: allot.dev/v1alpha1\nkind: Nope\n")
        .expect("broken policy");
    std::fs::write(serve.dir.path().join("certs/tls.crt"), "not a certificate\n").expect("broken certificate");
    let text = serve.scrape_until("the failed reloads to be counted", |t| {
        t.contains("allot_policy_reloads_total{result=\"failure\"}")
            && t.contains("allot_certificate_reloads_total{result=\"failure\"}")
    });
    let exported = parse_exposition(&text);
    let filled = cluster_family_labels();

    let (problems, checked) = check_queries(&exported, Some(&filled));
    assert!(problems.is_empty(), "{}\n\n/metrics:\n{text}", problems.join("\n"));
    // The check covered the families that matter (a reader that found nothing would pass).
    for metric in [
        "allot_admission_requests_total",
        "allot_admission_decisions_total",
        "allot_admission_duration_seconds_bucket",
        "allot_rule_evaluation_panics_total",
        "allot_rule_evaluation_errors_total",
        "allot_policy_load_errors",
        "allot_certificate_reloads_total",
        "allot_certificate_expiry_timestamp_seconds",
        "allot_ready",
        "allot_gate_oldest_seconds",
        "allot_gangs_waiting",
        "allot_quota_used",
        "allot_team_accelerators",
        "allot_quota_ledger_failures_total",
        "allot:quota_used:ratio",
        "allot:admission_duration_seconds:p99_5m",
    ] {
        assert!(checked.contains(metric), "{metric} was not among the checked metrics: {checked:?}");
    }
    // The broken certificate changed nothing: the rotated one is still in force.
    assert_eq!(gauge(&text, "allot_certificate_expiry_timestamp_seconds"), expiry);
    // The exposition really is the server's: the panicking rule and the denial were counted.
    assert!(text.contains("allot_rule_evaluation_panics_total{rule=\"panics-warn\"}"), "{text}");
    assert!(text.contains("allot_rule_evaluation_errors_total{rule=\"errors-warn\"}"), "{text}");
    assert!(text.contains("allot_admission_requests_total{webhook=\"validate\",result=\"denied\"} 1"), "{text}");
}

#[test]
fn the_exposition_reader_sees_names_of_empty_families_and_labels_of_series() {
    let e = parse_exposition(
        "# HELP allot_x X.\n# TYPE allot_x counter\n# TYPE allot_h histogram\nallot_h_bucket{le=\"0.1\"} 1\n\
         # TYPE allot_g gauge\nallot_g{team=\"a\\\"b,c=\\\"d\",resource=\"r\"} 1.0\n# EOF\n",
    );
    let names: Vec<&str> = e.names.iter().map(String::as_str).collect();
    assert_eq!(names, ["allot_g", "allot_h_bucket", "allot_h_count", "allot_h_sum", "allot_x_total"]);
    let labels: Vec<&str> = e.labels["allot_g"].iter().map(String::as_str).collect();
    assert_eq!(labels, ["resource", "team"]);
    assert!(!e.labels.contains_key("allot_x_total"));
}

/// On a real control plane nothing is filled in process: with a gang member waiting in team
/// vision's namespace, the leader's scrape has a series, with its labels, for every metric the
/// rules and the dashboard use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_control_plane_every_metric_used_has_series_with_its_labels() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    use support::cluster::{Assets, Cluster, wait_for};
    allot::install_crypto_provider();
    let test = "on_a_real_control_plane_every_metric_used_has_series_with_its_labels";
    let Some(assets) = Assets::from_env(test) else { return };
    let cluster = Cluster::start(&assets).await;
    // A policy reload that adds a panicking Warn rule (counted on the next review).
    std::fs::write(cluster.dir.path().join("policies/zz-panics.yaml"), PANICKING_WARN_RULE).expect("panics.yaml");
    let addr = cluster.allot_metrics.clone();
    wait_for("the policy reload", Duration::from_secs(60), || {
        let addr = addr.clone();
        async move {
            let text = tokio::task::spawn_blocking(move || scrape(&addr)).await.expect("scrape");
            text.contains("allot_policy_reloads_total{result=\"success\"} 1")
        }
    })
    .await;
    // One member of a gang of two, asking for a GPU: gated, waiting for its peer, charged to vision.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "m-0", "labels": {"allot.dev/gang-name": "g"}, "annotations": {"allot.dev/gang-size": "2"}},
        "spec": {"containers": [{"name": "c", "image": "registry.example/train:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))
    .expect("pod");
    Api::<Pod>::namespaced(cluster.client.clone(), "vision")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create");
    // A broken certificate: refused and counted, the old one keeps serving.
    std::fs::write(cluster.dir.path().join("allot-certs/tls.crt"), "not a certificate\n").expect("broken certificate");
    let addr = cluster.allot_metrics.clone();
    wait_for("the leader to count the waiting gang and its accelerators", Duration::from_secs(60), || {
        let addr = addr.clone();
        async move {
            let text = tokio::task::spawn_blocking(move || scrape(&addr)).await.expect("scrape");
            text.contains("allot_certificate_reloads_total{result=\"failure\"}")
                && text.contains("allot_gangs_waiting{reason=\"WaitingForMembers\"} 1")
                && text.contains(
                    "allot_team_accelerators{team=\"vision\",resource=\"nvidia.com/gpu\",state=\"gang_gated\"} 1",
                )
        }
    })
    .await;
    let addr = cluster.allot_metrics.clone();
    let text = tokio::task::spawn_blocking(move || scrape(&addr)).await.expect("scrape");
    let (problems, checked) = check_queries(&parse_exposition(&text), None);
    assert!(problems.is_empty(), "{}\n\n/metrics:\n{text}", problems.join("\n"));
    for metric in
        FILLED_BY_A_CLUSTER.iter().chain(&["allot_gangs_waiting", "allot_gate_oldest_seconds", "allot_quota_used"])
    {
        assert!(checked.contains(*metric), "{metric} was not checked");
    }
    for expected in ["allot_gang_controller_leader 1", "allot_ready 1", "allot_gated_pods{gate=\"gang\"} 1"] {
        assert!(text.contains(expected), "missing {expected} in\n{text}");
    }
}
