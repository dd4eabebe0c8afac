use std::path::Path;

use super::*;

fn src(text: &str) -> Vec<Source> {
    vec![Source { name: "p.yaml".into(), text: text.into() }]
}

fn errors(text: &str) -> Vec<String> {
    match compile(&src(text)) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(e) => e.0,
    }
}

const TEAM: &str =
    "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\nspec:\n  namespaces: {names: [vision]}\n";

#[test]
fn shipped_policies_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let set = load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(!set.placements.is_empty());
    assert!(!set.rules.is_empty());
    assert_eq!(set.version.len(), 12);
    assert_eq!(set.priority.global_default.as_deref(), Some("low-priority"));
}

#[test]
fn unknown_field_names_file_document_and_path() {
    let text = format!(
        "{TEAM}---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: nlp}}\nspec:\n  namespaces: {{names: [nlp]}}\n  priority: {{defualt: low}}\n"
    );
    let errs = errors(&text);
    assert_eq!(errs.len(), 1, "{errs:?}");
    let e = &errs[0];
    assert!(e.starts_with("p.yaml: document 2 (Team): spec.priority.defualt"), "{e}");
    assert!(e.contains("unknown field `defualt`"), "{e}");
}

#[test]
fn unknown_top_level_field_and_kind_and_api_version() {
    let e = errors("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: a}\nspce: {}\n");
    assert!(e[0].contains("unknown field `spce`"), "{e:?}");
    let e = errors("apiVersion: allot.dev/v1alpha1\nkind: Quota\nmetadata: {name: a}\n");
    assert!(e[0].contains("unknown kind \"Quota\""), "{e:?}");
    let e = errors("apiVersion: allot.dev/v1\nkind: Team\nmetadata: {name: a}\nspec: {namespaces: {names: [a]}}\n");
    assert!(e[0].contains("apiVersion"), "{e:?}");
}

#[test]
fn broken_yaml_names_the_file() {
    let e = errors("apiVersion: [unclosed\n");
    assert!(e[0].starts_with("p.yaml: invalid YAML"), "{e:?}");
}

#[test]
fn broken_cel_is_a_load_error() {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  expression: 'object.spec.('\n  message: m\n";
    let e = errors(text);
    assert!(e[0].contains("document 1 (Rule r): spec.expression: CEL syntax error"), "{e:?}");
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  expression: 'true'\n  messageExpression: 'objct.x'\n";
    assert!(errors(text)[0].contains("spec.messageExpression"));
}

#[test]
fn every_error_is_reported_at_once() {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: r}\nspec:\n  expression: '('\n  message: m\n---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: p}\nspec:\n  tolerations: []\n";
    assert_eq!(errors(text).len(), 2);
}

#[test]
fn cross_references_and_duplicates() {
    let text = format!(
        "{TEAM}---\n{TEAM}---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: r}}\nspec:\n  match: {{teams: [nobody]}}\n  expression: 'true'\n  message: m\n"
    );
    let e = errors(&text);
    assert!(e.iter().any(|e| e.contains("already defined")), "{e:?}");
    assert!(e.iter().any(|e| e.contains("no Team named \"nobody\"")), "{e:?}");
}

#[test]
fn semantic_checks() {
    let e = errors("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: t}\nspec:\n  namespaces: {}\n");
    assert!(e[0].contains("give names, a selector, or both"), "{e:?}");
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: t}\nspec:\n  namespaces: {names: [t]}\n  priority: {default: a, allowed: [b]}\n",
    );
    assert!(e[0].contains("not in spec.priority.allowed"), "{e:?}");
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: p}\nspec:\n  nodeAffinity: [{key: k, operator: In}]\n",
    );
    assert!(
        e[0].contains(
            "spec.nodeAffinity[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
        ),
        "{e:?}"
    );
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: a}\n---\napiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: b}\n",
    );
    assert!(e[0].contains("only one Cluster"), "{e:?}");
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec:\n  accelerators:\n    checks: {wholeNumbers: Maybe}\n",
    );
    assert!(e[0].contains("spec.accelerators.checks.wholeNumbers"), "{e:?}");
}

/// The shipped policies are linear, so small reviews are evaluated in place: a rule with a
/// nested walk sends every review to the blocking pool (two thread wake-ups each, and a thread
/// per concurrent review: the scale test saw 6 → 21 threads at 32 clients).
#[test]
fn the_shipped_policies_are_evaluated_in_place() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let set = compile(&read_sources(&dir).expect("shipped")).unwrap_or_else(|e| panic!("{e}"));
    let nested: Vec<&str> =
        set.rules.iter().flat_map(|r| r.expressions()).filter(|e| !e.is_linear()).map(|e| e.source()).collect();
    assert!(set.linear && nested.is_empty(), "{nested:?}");
}

/// `Off` is what the docs and the shipped files say turns a check off; YAML 1.1 reads it
/// unquoted as `false`, which no check accepted.
#[test]
fn checks_written_off_unquoted_are_off() {
    let set = compile(&src(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec:\n  accelerators:\n    \
         checks: {wholeNumbers: Off, requestsEqualLimits: Deny}\n",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.checks.whole_numbers, Some(crate::model::policy::CheckAction::Off));
    assert_eq!(set.checks.requests_equal_limits, Some(crate::model::policy::CheckAction::Deny));
    // Only the exact spelling is a value; a lower-case `off` is an error naming the field.
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: a}\nspec:\n  accelerators:\n    checks: {initContainers: off}\n",
    );
    assert!(e[0].contains("spec.accelerators.checks.initContainers"), "{e:?}");
}

#[test]
fn empty_documents_and_empty_dirs() {
    let set = compile(&src("---\n---\n")).unwrap();
    assert!(set.rules.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let e = load_dir(dir.path()).unwrap_err();
    assert!(e.to_string().contains("no policy files"), "{e}");
    let e = load_dir(&dir.path().join("missing")).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn version_changes_with_content() {
    let a = compile(&src(TEAM)).unwrap();
    let b = compile(&src(&TEAM.replace("[vision]", "[vision, cv]"))).unwrap();
    assert_ne!(a.version, b.version);
    assert_eq!(a.version, version_of(&src(TEAM)));
}

proptest::proptest! {
    #[test]
    fn compile_never_panics(text in "(apiVersion: allot.dev/v1alpha1\nkind: (Team|Rule|Placement|Cluster)\nmetadata: \\{name: x\\}\nspec: )?.{0,200}") {
        let _ = compile(&src(&text));
    }
}

/// Issue #11: values the API server refuses in every Pod they would be written into are refused
/// at load, with file, document and field.
#[test]
fn values_the_api_server_refuses_are_load_errors() {
    let placement = |spec: &str| {
        format!("{TEAM}---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {{name: gpu}}\nspec:\n{spec}")
    };
    let e = errors(&placement("  nodeSelector: {example.com/pool~x: a100}\n"));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with(
            "p.yaml: document 2 (Placement gpu): spec.nodeSelector: Invalid value: \"example.com/pool~x\": name part must consist of alphanumeric characters"
        ),
        "{e:?}"
    );
    let long = "a".repeat(70);
    let e = errors(&placement(&format!("  nodeSelector: {{pool: {long}}}\n")));
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(
        e[0],
        format!(
            "p.yaml: document 2 (Placement gpu): spec.nodeSelector: Invalid value: \"{long}\": must be no more than 63 bytes"
        )
    );
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\nspec:\n  namespaces: {names: [vision]}\n  priority: {default: Low_Priority, allowed: [Low_Priority, high]}\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with(
            "p.yaml: document 1 (Team vision): spec.priority.default: Invalid value: \"Low_Priority\": a lowercase RFC 1123 subdomain"
        ),
        "{e:?}"
    );
    assert!(e[1].contains("(Team vision): spec.priority.allowed[0]: Invalid value: \"Low_Priority\""), "{e:?}");
}

#[test]
fn placement_tolerations_and_affinity_are_checked_like_the_pods_they_go_into() {
    let placement =
        |spec: &str| format!("apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {{name: gpu}}\nspec:\n{spec}");
    let cases = [
        ("  tolerations: [{key: nvidia.com/gpu~x, operator: Exists}]\n", "spec.tolerations[0].key: Invalid value"),
        (
            "  tolerations: [{operator: Equal, value: x}]\n",
            "spec.tolerations[0].operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty",
        ),
        (
            "  tolerations: [{key: a, operator: Exists, value: b}]\n",
            "spec.tolerations[0].operator: Invalid value: \"b\": value must be empty",
        ),
        (
            "  tolerations: [{key: a, operator: Exists, effect: NoSchedule, tolerationSeconds: 30}]\n",
            "spec.tolerations[0].effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute'",
        ),
        (
            "  tolerations: [{key: a, value: not a label}]\n",
            "spec.tolerations[0].operator: Invalid value: \"not a label\"",
        ),
        (
            "  nodeAffinity: [{key: 'bad key', operator: Exists}]\n",
            "spec.nodeAffinity[0].key: Invalid value: \"bad key\"",
        ),
        (
            "  nodeAffinity: [{key: pool, operator: In, values: [ok, 'not ok']}]\n",
            "spec.nodeAffinity[0].values[1]: Invalid value: \"not ok\"",
        ),
        (
            "  nodeAffinity: [{key: mem, operator: Gt, values: ['1', '2']}]\n",
            "spec.nodeAffinity[0].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
        ),
        (
            "  nodeAffinity: [{key: mem, operator: Exists, values: ['1']}]\n",
            "spec.nodeAffinity[0].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        ),
        (
            "  nodeAffinity: [{key: mem, operator: Gt, values: [lots]}]\n",
            "spec.nodeAffinity[0].values[0]: Invalid value: \"lots\": must be an integer",
        ),
    ];
    for (spec, want) in cases {
        let e = errors(&placement(spec));
        assert_eq!(e.len(), 1, "{spec}: {e:?}");
        assert!(e[0].starts_with(&format!("p.yaml: document 1 (Placement gpu): {want}")), "{spec}: {e:?}");
    }
    let fine = placement(
        "  tolerations: [{operator: Exists}, {key: a, value: b, effect: NoExecute, tolerationSeconds: 30}]\n  nodeSelector: {node-type: my-precious}\n  nodeAffinity: [{key: mem, operator: Gt, values: ['80']}]\n",
    );
    compile(&src(&fine)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn cluster_priority_names_are_dns_subdomains() {
    let e = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  priority: {default: ok, globalDefault: Low_Priority}\n",
    );
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(
        e[0].starts_with(
            "p.yaml: document 1 (Cluster c): spec.priority.globalDefault: Invalid value: \"Low_Priority\""
        ),
        "{e:?}"
    );
}

const DRA_CLUSTER: &str = "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      gpu.nvidia.com: {countsAs: nvidia.com/gpu}\n      mig.nvidia.com: {countsAs: nvidia.com/gpu, weight: 1/7}\n    allocationModeAllCount: 8\n";

#[test]
fn dra_device_classes_compile_and_weigh_exactly_in_team_quotas() {
    let text = format!(
        "{DRA_CLUSTER}---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  quota:\n    limits: {{nvidia.com/gpu: 1}}\n"
    );
    let set = compile(&src(&text)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.device_classes.all_count(), 8);
    let mig = set.device_classes.get("mig.nvidia.com").expect("mig mapped");
    assert_eq!((mig.numerator, mig.denominator), (1, 7));
    let quota = set.teams[0].quota.as_ref().expect("quota");
    let slices = |n: i64| {
        crate::model::resources::ResourceList::from([(
            crate::model::dra::class_resource("mig.nvidia.com"),
            crate::model::quantity::Quantity::from_units(n),
        )])
    };
    // Seven 1/7 slices are exactly the one GPU; the eighth is over.
    assert_eq!(quota.exceeded(&quota.charge(&slices(6)), &quota.charge(&slices(1))), None);
    assert!(quota.exceeded(&quota.charge(&slices(7)), &quota.charge(&slices(1))).is_some());
    let whole = crate::model::resources::ResourceList::from([(
        crate::model::dra::class_resource("gpu.nvidia.com"),
        crate::model::quantity::Quantity::from_units(1),
    )]);
    assert_eq!(quota.charge(&whole), quota.charge(&slices(7)));
}

/// Issue 15: a DeviceClass of the cluster whose extended resource is an accelerator counts as
/// one of it per device without a mapping — in placement's terms and in team quotas — unless
/// the policy maps the class itself or turns reading classes off; a class standing for a
/// resource that is no accelerator counts nothing; the version says what was read.
#[test]
fn device_classes_with_an_accelerator_extended_resource_count_without_a_mapping() {
    let text = format!(
        "{DRA_CLUSTER}---\napiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: vision}}\nspec:\n  namespaces: {{names: [vision]}}\n  quota:\n    limits: {{amd.com/gpu: 2}}\n"
    );
    let facts = ClusterFacts {
        extended_resource_names: BTreeMap::from([
            ("gpu.amd.com".to_string(), "amd.com/gpu".to_string()),
            // Mapped by the policy (1/7 of an nvidia.com/gpu): the policy wins.
            ("mig.nvidia.com".to_string(), "nvidia.com/mig-1g.10gb".to_string()),
            ("fpga.example.com".to_string(), "example.com/fpga".to_string()),
        ]),
    };
    let plain = compile(&src(&text)).unwrap_or_else(|e| panic!("{e}"));
    let set = compile_with(&src(&text), &facts).unwrap_or_else(|e| panic!("{e}"));
    let amd = set.device_classes.get("gpu.amd.com").expect("read from the cluster");
    assert_eq!((amd.counts_as.as_str(), amd.numerator, amd.denominator), ("amd.com/gpu", 1, 1));
    assert_eq!(set.device_classes.get("mig.nvidia.com").map(|w| w.denominator), Some(7));
    assert!(set.device_classes.get("fpga.example.com").is_none(), "not an accelerator");
    assert_eq!(set.discovered_classes, BTreeMap::from([("gpu.amd.com".to_string(), "amd.com/gpu".to_string())]));
    assert!(set.version.starts_with(&format!("{}+dc-", plain.version)), "{}", set.version);
    assert_eq!(set.version, compile_with(&src(&text), &facts).unwrap().version, "stable");
    let quota = set.teams[0].quota.as_ref().expect("quota");
    let devices = |n: i64| {
        crate::model::resources::ResourceList::from([(
            crate::model::dra::class_resource("gpu.amd.com"),
            crate::model::quantity::Quantity::from_units(n),
        )])
    };
    assert!(quota.exceeded(&quota.charge(&devices(2)), &quota.charge(&devices(1))).is_some(), "3 of 2 AMD GPUs");
    assert!(plain.teams[0].quota.as_ref().unwrap().charge(&devices(1)).is_empty(), "without the facts: nothing");

    let off = text.replace("allocationModeAllCount: 8", "allocationModeAllCount: 8\n    fromDeviceClasses: false");
    let set = compile_with(&src(&off), &facts).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.device_classes.get("gpu.amd.com").is_none() && set.discovered_classes.is_empty());
    // Without a Cluster document the default accelerators decide.
    let team_only = compile_with(
        &src("apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: t}\nspec: {namespaces: {names: [t]}}\n"),
        &facts,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(team_only.device_classes.get("gpu.amd.com").is_some());
}

/// `allot check` reads DeviceClasses among its manifests (any `resource.k8s.io` version).
#[test]
fn cluster_facts_come_from_device_class_manifests() {
    let objects = [
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "a"},
                           "spec": {"extendedResourceName": "amd.com/gpu"}}),
        serde_json::json!({"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceClass", "metadata": {"name": "b"},
                           "spec": {"extendedResourceName": "nvidia.com/gpu"}}),
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "c"}, "spec": {}}),
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"},
                           "spec": {"extendedResourceName": "nvidia.com/gpu"}}),
    ];
    let facts = ClusterFacts::from_objects(&objects);
    assert_eq!(
        facts.extended_resource_names,
        BTreeMap::from([("a".to_string(), "amd.com/gpu".to_string()), ("b".to_string(), "nvidia.com/gpu".to_string())])
    );
}

#[test]
fn dra_device_class_problems_name_the_field() {
    let errs = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      a.example.com: {countsAs: cpu}\n      b.example.com: {countsAs: nvidia.com/gpu, weight: 0/3}\n",
    );
    assert!(errs.iter().any(|e| e.contains("spec.dra.deviceClasses.a.example.com.countsAs")), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("spec.dra.deviceClasses.b.example.com.weight")), "{errs:?}");
    let errs = errors(
        "apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  dra:\n    deviceClasses:\n      g: {countsAs: nvidia.com/gpu, wieght: 1}\n",
    );
    assert!(errs.iter().any(|e| e.contains("unknown field `wieght`")), "{errs:?}");
}

/// What a set with this one Rule expression (or, with `placement`, Placement `when`) leaves
/// unread of an object under review.
fn unread_with(expression: &str, placement: bool) -> Unread {
    let text = if placement {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {{name: p}}\nspec:\n  tolerations: [{{key: k, operator: Exists}}]\n  when: {expression:?}\n"
        )
    } else {
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: r}}\nspec:\n  match: {{kinds: [Pod]}}\n  expression: {expression:?}\n  message: m\n"
        )
    };
    compile(&src(&text)).unwrap_or_else(|e| panic!("{expression}: {e}")).unread
}

#[test]
fn parts_no_expression_reads_are_left_unread_and_any_read_keeps_them() {
    let nothing = Unread::NOTHING;
    let everything = Unread::EVERYTHING;
    let only_volumes = Unread { last_applied: false, volumes: true };
    let only_last_applied = Unread { last_applied: true, volumes: false };
    for (expression, unread) in [
        ("true", everything),
        ("object.spec.containers.all(c, has(c.image))", everything),
        ("has(object.metadata.annotations.foo)", everything),
        ("has(object.spec.template.spec.volumes)", everything),
        ("object.metadata.name != ''", everything),
        ("accelerators(object) == 0", everything),
        ("request.userInfo.username != '' && namespace != '' && team == ''", everything),
        // Read: through any bound object, by a select, an index or whole.
        ("!has(object.spec.volumes)", only_last_applied),
        ("size(oldObject.spec.volumes) == 0", only_last_applied),
        ("has(workload.spec.volumes)", only_last_applied),
        ("object.spec.size() > 0", only_last_applied),
        ("'kubectl.kubernetes.io/last-applied-configuration' in object.metadata.annotations", only_volumes),
        ("object.metadata.annotations['kubectl.kubernetes.io/last-applied-configuration'] != ''", only_volumes),
        ("has(oldObject.metadata)", only_volumes),
        ("object == oldObject", nothing),
        (
            "workload.kind == 'Pod' && object.spec.volumes.size() == 0 && object.metadata.annotations.size() == 0",
            nothing,
        ),
    ] {
        assert_eq!(unread_with(expression, false), unread, "Rule {expression}");
        assert_eq!(unread_with(expression, true), unread, "Placement when {expression}");
    }
    // The set's is what every expression leaves unread, messages included.
    let two = format!(
        "{TEAM}---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: a}}\nspec:\n  match: {{kinds: [Pod]}}\n  expression: 'true'\n  messageExpression: 'string(object.spec.volumes)'\n---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: b}}\nspec:\n  match: {{kinds: [Pod]}}\n  expression: 'has(object.metadata.annotations)'\n  message: m\n"
    );
    assert_eq!(compile(&src(&two)).expect("compiles").unread, nothing);
}

/// `startTimeout` defaults to 10 minutes and `onStartTimeout` to `Fail` (a released gang that
/// cannot start is deleted rather than raced by the next one); `0s` is refused, since the
/// reservation of a released gang lasts until it.
#[test]
fn start_timeout_defaults_to_ten_minutes_and_fail_and_is_never_zero() {
    let policy = |spec: &str| {
        let text = format!("apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {{name: g}}\nspec:\n{spec}");
        compile(&src(&text)).unwrap_or_else(|e| panic!("{e:?}")).gang_policy("ml", None).into_owned()
    };
    let default = policy("  assemblyTimeout: 5m\n");
    assert_eq!((default.start_timeout.as_secs(), default.on_start_timeout), (600, OnStartTimeout::Fail));
    assert_eq!(GangPolicy::default().on_start_timeout, OnStartTimeout::Fail);
    let warn = policy("  startTimeout: 90s\n  onStartTimeout: Warn\n");
    assert_eq!((warn.start_timeout.as_secs(), warn.on_start_timeout), (90, OnStartTimeout::Warn));
    let errs =
        errors("apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  startTimeout: 0s\n");
    assert!(errs.iter().any(|e| e.contains("spec.startTimeout: must be at least 1s")), "{errs:?}");
}
