use super::*;
use crate::admission::request::RequestOperation;
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::{load_dir, read_sources};

/// The shipped `policies/`.
fn shipped() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")
}

/// Describing the changes is only that: the same patch, findings and notes either way, and
/// descriptions exactly when asked for and something changed.
#[test]
fn change_descriptions_change_nothing_else() {
    let policies = load_dir(&shipped()).expect("shipped policies");
    let described = Engine::new(&policies, &NoNamespaces);
    let silent = described.with_change_descriptions(false);
    let mut mutated = 0;
    for name in [
        "010-mutate-create-pod-my-gpu-pod.json",
        "008-mutate-create-job-gang-a.json",
        "012-mutate-create-pod-plain-cpu-pod.json",
    ] {
        let object = crate::model::fixtures::object(name);
        let req = alices(RequestOperation::Create, &object);
        let (with, without) = (described.mutate(&req), silent.mutate(&req));
        assert_eq!(with.patch, without.patch, "{name}");
        assert_eq!(with.findings, without.findings, "{name}");
        assert_eq!(with.notes, without.notes, "{name}");
        assert!(without.changes.is_empty(), "{name}: {:?}", without.changes);
        assert_eq!(with.changes.is_empty(), with.patch.is_empty(), "{name}: {:?} for {:?}", with.changes, with.patch);
        mutated += usize::from(!with.patch.is_empty());
        // Validation previews templates without descriptions: its outcome is the engine's either way.
        assert_eq!(described.validate(&req).findings, silent.validate(&req).findings, "{name}");
    }
    assert!(mutated >= 1, "at least one fixture is mutated by the shipped policies");
}

/// The shipped policies with each `(from, to)` replaced in their text.
fn shipped_with(replacements: &[(&str, &str)]) -> PolicySet {
    let sources = read_sources(&shipped()).expect("shipped policies");
    let sources: Vec<_> = sources
        .iter()
        .map(|s| crate::model::policy::Source {
            name: s.name.clone(),
            text: replacements.iter().fold(s.text.clone(), |text, (from, to)| text.replace(from, to)),
        })
        .collect();
    crate::model::policy::compile(&sources).expect("policies")
}

/// A JobSet whose two templates join one explicit gang: `pod` is merged into the second.
fn jobset(second: Value) -> Value {
    let template = |name: &str| {
        serde_json::json!({"name": name, "replicas": 1, "template": {"spec": {"parallelism": 2, "template": {
                "metadata": {"labels": {"allot.dev/gang-name": "ring"}, "annotations": {"allot.dev/gang-size": "4"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "ghcr.io/example/ddp:1.0.0",
                    "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}})
    };
    let mut object = serde_json::json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "default"},
        "spec": {"replicatedJobs": [template("driver"), template("workers")]}
    });
    json_patch::merge(&mut object["spec"]["replicatedJobs"][1]["template"]["spec"]["template"], &second);
    object
}

/// Templates whose pods join one gang must agree as those pods will have to: otherwise the
/// workload is denied at apply, naming both templates, instead of its pods one by one later.
#[test]
fn templates_joining_one_gang_must_agree() {
    let policies = load_dir(&shipped()).expect("shipped policies");
    let engine = Engine::new(&policies, &NoNamespaces);
    let consistency_at = |operation: RequestOperation, object: &Value| {
        let outcome = engine.validate(&alices(operation, object));
        outcome
            .findings
            .into_iter()
            .filter(|f| f.rule == RuleId::Check(Check::GangConsistency))
            .map(|f| (f.path, f.message))
            .collect::<Vec<_>>()
    };
    let consistency = |object: &Value| consistency_at(RequestOperation::Create, object);
    assert_eq!(consistency(&jobset(serde_json::json!({}))), [], "templates that agree");
    // A custom resource's template is not defaulted; its pods will be.
    let named = serde_json::json!({"spec": {"schedulerName": "default-scheduler"}});
    assert_eq!(consistency(&jobset(named)), [], "the default scheduler, named or not");
    // A workload admitted before the check stays updatable (its pods are checked as they come).
    let split = jobset(serde_json::json!({"spec": {"schedulerName": "volcano"}}));
    assert_eq!(consistency_at(RequestOperation::Update, &split), [], "UPDATE");
    let first = "spec.replicatedJobs[0].template.spec.template";
    let second = "spec.replicatedJobs[1].template.spec.template";
    for (odd, words) in [
        (
            serde_json::json!({"spec": {"schedulerName": "volcano"}}),
            "schedulerName volcano, those of FIRST default-scheduler",
        ),
        (
            serde_json::json!({"spec": {"priorityClassName": "high-priority"}}),
            "priorityClassName high-priority, those of FIRST low-priority",
        ),
        (serde_json::json!({"metadata": {"annotations": {"allot.dev/gang-size": "3"}}}), "size 3, those of FIRST 4"),
    ] {
        let found = consistency(&jobset(odd));
        let expected = format!(
            "gang default/ring: this template's pods would have {}; all members of a gang must agree",
            words.replace("FIRST", first)
        );
        assert_eq!(found, [(format!("{second}.metadata"), expected)], "{words}");
    }
}

/// A template naming no priority class makes pods naming the cluster's `globalDefault` (the
/// API server's Priority plugin fills it in): beside a template naming that class it agrees,
/// beside one naming another it does not. Under a Cluster policy with no `default` class,
/// so that Allot's own default does not decide.
#[test]
fn a_template_naming_no_priority_class_has_the_global_default() {
    // The Cluster's and the teams' default classes, commented out.
    let default = "default: low-priority";
    let shipped = read_sources(&shipped()).expect("shipped policies");
    assert_eq!(shipped.iter().map(|s| s.text.matches(default).count()).sum::<usize>(), 3, "default classes");
    let policies = shipped_with(&[(default, "# no default")]);
    assert_eq!(policies.priority.default, None);
    assert!(policies.teams.iter().all(|t| t.priority.default.is_none()));
    let global = policies.priority.global_default.clone().expect("the shipped Cluster names a globalDefault");
    let engine = Engine::new(&policies, &NoNamespaces);
    let consistency = |second: Value| {
        let outcome = engine.validate(&alices(RequestOperation::Create, &jobset(second)));
        outcome.findings.into_iter().filter(|f| f.rule == RuleId::Check(Check::GangConsistency)).collect::<Vec<_>>()
    };
    assert_eq!(consistency(serde_json::json!({"spec": {"priorityClassName": global}})), [], "unset and {global}");
    let denied = consistency(serde_json::json!({"spec": {"priorityClassName": "high-priority"}}));
    let first = "spec.replicatedJobs[0].template.spec.template";
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(
        denied[0].message.contains(&format!("priorityClassName high-priority, those of {first} {global};")),
        "{}",
        denied[0].message
    );
}

/// Templates whose pods the controller's labels put into one inferred gang (a JobSet, a
/// LeaderWorkerSet group) must agree too, where the GangPolicy infers that kind and keeps the
/// gangs its own; a template naming its own gang is compared under that one, and one that
/// makes no pods not at all. Kubeflow jobs are not compared: their operators may fill in an
/// empty `schedulerName`.
#[test]
fn templates_joining_one_inferred_gang_must_agree() {
    // The shipped set with `gangs.yaml`'s settings replaced.
    let all = "infer: [JobSet, KubeflowJob, MPIJob, LeaderWorkerSet]";
    let shipped = shipped_with(&[]);
    let only_jobsets = shipped_with(&[("infer: []", "infer: [JobSet]")]);
    let inferring = shipped_with(&[("infer: []", all)]);
    let native = shipped_with(&[("infer: []", all), ("nativeScheduling: false", "nativeScheduling: true")]);
    assert!(native.gang_policies.iter().any(|g| g.native_scheduling), "the shipped gangs.yaml names nativeScheduling");
    let consistency = |policies: &PolicySet, object: &Value| {
        Engine::new(policies, &NoNamespaces)
            .validate(&alices(RequestOperation::Create, object))
            .findings
            .into_iter()
            .filter(|f| f.rule == RuleId::Check(Check::GangConsistency))
            .map(|f| (f.path, f.message))
            .collect::<Vec<_>>()
    };
    let pod = |extra: Value| {
        let mut template = serde_json::json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "w",
                "image": "ghcr.io/example/ddp:1.0.0", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}});
        json_patch::merge(&mut template, &extra);
        template
    };
    let volcano = || serde_json::json!({"spec": {"schedulerName": "volcano"}});
    let high = || serde_json::json!({"spec": {"priorityClassName": "high-priority"}});
    let jobset = |second: Value| {
        let job = |t: Value| serde_json::json!({"replicas": 1, "template": {"spec": {"template": t}}});
        serde_json::json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "js", "namespace": "default"},
                "spec": {"replicatedJobs": [job(pod(serde_json::json!({}))), job(second)]}})
    };
    let message = |gang: &str, words: &str| {
        format!("gang default/{gang}: this template's pods would have {words}; all members of a gang must agree")
    };
    let split = jobset(pod(volcano()));
    assert_eq!(consistency(&shipped, &split), [], "not inferred: nothing to compare");
    assert_eq!(
        consistency(&inferring, &split),
        [(
            "spec.replicatedJobs[1].template.spec.template.metadata".to_string(),
            message(
                "jobset-js",
                "schedulerName volcano, those of spec.replicatedJobs[0].template.spec.template default-scheduler"
            )
        )]
    );
    assert_eq!(consistency(&native, &split), [], "handed to native gang scheduling: not compared");
    assert_eq!(consistency(&inferring, &jobset(pod(serde_json::json!({})))), [], "templates that agree");
    for none in [serde_json::json!({"replicas": 0}), serde_json::json!({"template": {"spec": {"parallelism": 0}}})] {
        let mut idle = split.clone();
        json_patch::merge(&mut idle["spec"]["replicatedJobs"][1], &none);
        assert_eq!(consistency(&inferring, &idle), [], "a replicated job making no pods: {none}");
    }
    // What a tenant writes there decides nothing else: no name (one gang, `jobset-`), replica
    // counts that are not counts (compared, as making pods), a huge one.
    let mut nameless = split.clone();
    nameless["metadata"].as_object_mut().expect("metadata").remove("name");
    assert!(consistency(&inferring, &nameless)[0].1.starts_with("gang default/jobset-: "));
    for replicas in
        [serde_json::json!("0"), serde_json::json!(-1), serde_json::json!(1e300), serde_json::json!(u64::MAX)]
    {
        let mut odd = split.clone();
        odd["spec"]["replicatedJobs"][1]["replicas"] = replicas.clone();
        assert_eq!(consistency(&inferring, &odd).len(), 1, "replicas {replicas}: compared");
    }
    // A template naming its own gang joins that one, not the JobSet's.
    let own = serde_json::json!({"metadata": {"labels": {"allot.dev/gang-name": "ring"},
            "annotations": {"allot.dev/gang-size": "2"}}, "spec": {"schedulerName": "volcano"}});
    assert_eq!(consistency(&inferring, &jobset(pod(own))), [], "another gang");

    assert_eq!(
        consistency(&inferring, &jobset(pod(high()))),
        [(
            "spec.replicatedJobs[1].template.spec.template.metadata".to_string(),
            message(
                "jobset-js",
                "priorityClassName high-priority, those of spec.replicatedJobs[0].template.spec.template low-priority"
            )
        )]
    );
    // Kubeflow jobs are not compared (their operators may fill in an empty scheduler).
    let pytorch = serde_json::json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "kf", "namespace": "default"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": pod(volcano())},
                                             "Worker": {"replicas": 2, "template": pod(serde_json::json!({}))}}}});
    assert_eq!(consistency(&inferring, &pytorch), [], "a Kubeflow job");

    let lws = serde_json::json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "l", "namespace": "default"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 4,
                "leaderTemplate": pod(volcano()), "workerTemplate": pod(serde_json::json!({}))}}});
    assert_eq!(
        consistency(&inferring, &lws),
        [(
            "spec.leaderWorkerTemplate.workerTemplate.metadata".to_string(),
            message(
                "lws-l-0",
                "schedulerName default-scheduler, those of spec.leaderWorkerTemplate.leaderTemplate volcano"
            )
        )]
    );
    assert_eq!(consistency(&only_jobsets, &lws), [], "LeaderWorkerSets not inferred");
    assert_eq!(consistency(&only_jobsets, &split).len(), 1, "JobSets inferred");
    let mut alone = lws.clone();
    alone["spec"]["leaderWorkerTemplate"]["size"] = serde_json::json!(1);
    assert_eq!(consistency(&inferring, &alone), [], "groups of their leader alone: no worker");

    // A GangPolicy scoped to a team compares that team's templates only.
    let visions = shipped_with(&[("infer: []", "match: {teams: [vision]}\n  infer: [JobSet]")]);
    assert_eq!(visions.gang_policies.len(), 1, "the shipped set has one GangPolicy");
    let mut in_vision = split.clone();
    in_vision["metadata"]["namespace"] = serde_json::json!("vision-train");
    let found = consistency(&visions, &in_vision);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].1.starts_with("gang vision-train/jobset-js: this template's pods would have schedulerName volcano")
    );
    assert_eq!(consistency(&visions, &split), [], "a namespace of no team: not compared");
    let mut in_nlp = split.clone();
    in_nlp["metadata"]["namespace"] = serde_json::json!("nlp");
    assert_eq!(consistency(&visions, &in_nlp), [], "another team: not compared");
}
