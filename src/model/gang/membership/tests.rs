use super::*;
use serde_json::json;

const MAX: u32 = DEFAULT_MAX_GANG_SIZE;

#[test]
fn facts_read_labels_in_place_the_same_from_json_and_from_a_typed_pod() {
    let json = json!({
        "metadata": {"labels": {"b": "2", "a": "1", "n": 3, "empty": ""}, "annotations": {"x": "y"}},
        "spec": {}
    });
    let from_json = PodFacts::from_json(&json);
    assert_eq!(from_json.labels.get("a"), Some("1"));
    assert_eq!(from_json.labels.get("empty"), Some(""));
    // A value that is not a string is not a label value: absent, as the API server would
    // never have stored it.
    assert_eq!(from_json.labels.get("n"), None);
    assert!(!from_json.labels.contains_key("n"));
    assert_eq!(from_json.labels.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "2"), ("empty", "")]);

    let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"labels": {"a": "1", "b": "2", "empty": ""}, "annotations": {"x": "y"}}
    }))
    .expect("pod");
    let from_pod = PodFacts::from_pod(&typed);
    assert_eq!(from_pod.labels.get("b"), Some("2"));
    assert_eq!(from_pod, PodFacts { node_name: None, scheduler_name: None, ..from_json.clone() });
    assert_ne!(from_pod.annotations, from_json.labels);
    assert_eq!(StrMap::default().get("a"), None);
    assert_eq!(StrMap::Json(None), StrMap::Typed(None));
}

use super::test_facts as facts;

/// The labels a template is given are those its pods' inference reads, for the two kinds
/// compared at apply; other kinds get none.
#[test]
fn controller_labels_are_those_inference_reads() {
    let infer = [InferredKind::JobSet, InferredKind::LeaderWorkerSet];
    let gang_of = |group: &str, kind: &str, path: &str| {
        let labels = controller_labels(group, kind, "w", path)?;
        let labels: serde_json::Map<String, Value> =
            labels.into_iter().map(|(k, v)| (k.to_string(), Value::String(v))).collect();
        let pod = json!({"metadata": {"labels": labels}});
        membership(&PodFacts::from_json(&pod), &infer, None, MAX).ok()?.map(|g| g.name)
    };
    let js = ("jobset.x-k8s.io", "JobSet", "spec.replicatedJobs[0].template.spec.template");
    assert_eq!(gang_of(js.0, js.1, js.2).as_deref(), Some("jobset-w"));
    for path in ["spec.leaderWorkerTemplate.leaderTemplate", "spec.leaderWorkerTemplate.workerTemplate"] {
        assert_eq!(gang_of("leaderworkerset.x-k8s.io", "LeaderWorkerSet", path).as_deref(), Some("lws-w-0"), "{path}");
    }
    for (group, kind) in
        [("kubeflow.org", "PyTorchJob"), ("kubeflow.org", "MPIJob"), ("batch", "Job"), ("apps", "Deployment")]
    {
        assert_eq!(controller_labels(group, kind, "w", "spec.template"), None, "{kind}");
    }
}

/// Issue 15: a native PodGroup's quota group, sized by its `minCount`; no other source can
/// take its name (Kueue's annotation, the one source a `/` fits in, may not use the prefix).
#[test]
fn a_native_pod_groups_quota_group_is_sized_by_its_min_count() {
    let mut objects = crate::model::dra::ClaimObjects::new("not found");
    for (name, policy) in [("gang", json!({"gang": {"minCount": 3}})), ("basic", json!({"basic": {}}))] {
        let group = json!({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "PodGroup",
                               "metadata": {"name": name}, "spec": {"schedulingPolicy": policy}});
        assert!(objects.insert(&group, "ml"));
    }
    let group = |name: &str, ns: &str| native_group(Some(name), ns, &objects);
    let gang = group("gang", "ml").expect("a group");
    assert_eq!((gang.name.as_str(), gang.size, gang.source), ("PodGroup/gang", Some(3), Source::NativePodGroup));
    assert!(is_native_group(&gang.name));
    assert_eq!(group("basic", "ml"), None, "each pod of a basic group goes alone");
    // Not found (another namespace, not created yet): a group of unknown size.
    assert_eq!(group("gang", "other").map(|g| g.size), Some(None));
    assert_eq!(native_group(None, "ml", &objects), None);
    assert_eq!(native_group(Some(""), "ml", &objects), None);
    let forged = facts(json!({"annotations": {KUEUE_GROUP: "PodGroup/gang", KUEUE_TOTAL: "1"}}), json!({}));
    let refused = membership(&forged, &[], None, MAX).expect_err("a native group's name");
    assert!(matches!(refused, GangMetadataError::NativeGroupName(_)), "{refused:?}");
    assert!(refused.to_string().contains("native PodGroups'"), "{refused}");
    for name in ["a", "lws-x-0", "train"] {
        assert!(!is_native_group(name));
    }
}

/// The PodGroup a handed-off gang goes to must be a valid object name, or there is none.
#[test]
fn handed_off_gangs_name_valid_pod_groups_only() {
    assert_eq!(hand_off_name("job-train").as_deref(), Some("allot-job-train"));
    assert_eq!(hand_off_name("lws-serve.v2-0").as_deref(), Some("allot-lws-serve.v2-0"));
    for bad in ["Job_Train", "job-", "a..b", &"x".repeat(250)] {
        assert_eq!(hand_off_name(bad), None, "{bad}");
    }
    let gang = Membership { name: "job-train".into(), size: None, source: Source::Inferred(InferredKind::Job) };
    let named = |name: &str| facts(json!({}), json!({"schedulingGroup": {"podGroupName": name}}));
    assert!(handed_off(&named("allot-job-train"), &gang));
    assert!(!handed_off(&named("allot-job-other"), &gang), "another gang's PodGroup");
    assert!(!handed_off(&facts(json!({}), json!({})), &gang));
    let lws = Membership { source: Source::Inferred(InferredKind::LeaderWorkerSet), ..gang.clone() };
    assert!(!handed_off(&named("allot-job-train"), &lws), "a LeaderReady group would wait forever");
    let explicit = Membership { source: Source::Explicit, ..gang };
    assert!(!handed_off(&named("allot-job-train"), &explicit), "only inferred gangs are handed off");
}

#[test]
fn a_native_pod_group_member_is_in_no_allot_gang() {
    let labelled = json!({"labels": {NAME_LABEL: "a"}, "annotations": {SIZE_ANNOTATION: "4"},
            "ownerReferences": [{"kind": "Job", "name": "train"}]});
    let native = json!({"schedulingGroup": {"podGroupName": "train-group"}});
    assert_eq!(facts(labelled.clone(), native.clone()).native_pod_group, Some("train-group"));
    assert_eq!(membership(&facts(labelled.clone(), native), &[InferredKind::Job], None, MAX), Ok(None));
    // Without it, the same pod is in its explicit gang; an empty name is no PodGroup.
    assert!(membership(&facts(labelled.clone(), json!({})), &[], None, MAX).unwrap().is_some());
    let empty = json!({"schedulingGroup": {"podGroupName": ""}});
    assert!(membership(&facts(labelled, empty), &[], None, MAX).unwrap().is_some());
    // The watch's typed Pod reads the same field.
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [], "schedulingGroup": {"podGroupName": "g"}}
    }))
    .unwrap();
    assert_eq!(PodFacts::from_pod(&pod).native_pod_group, Some("g"));
}

#[test]
fn first_match_wins() {
    let f = facts(
        json!({"labels": {NAME_LABEL: "a", COSCHEDULING_LABEL: "b"}, "annotations": {SIZE_ANNOTATION: "4", KUEUE_GROUP: "c", KUEUE_TOTAL: "2"}}),
        json!({}),
    );
    assert_eq!(
        membership(&f, &[], None, MAX).unwrap(),
        Some(Membership { name: "a".into(), size: Some(4), source: Source::Explicit })
    );
    let f = facts(
        json!({"annotations": {KUEUE_GROUP: "c", KUEUE_TOTAL: "2"}, "labels": {COSCHEDULING_LABEL: "b"}}),
        json!({}),
    );
    assert_eq!(membership(&f, &[], None, MAX).unwrap().unwrap().source, Source::KueuePodGroup);
    let f = facts(json!({"labels": {COSCHEDULING_LABEL: "b"}}), json!({}));
    assert_eq!(membership(&f, &[], Some(3), MAX).unwrap().unwrap().size, Some(3));
}

#[test]
fn invalid_sizes_are_errors() {
    for size in ["0", "-1", "two", "1.5", ""] {
        let f = facts(json!({"labels": {NAME_LABEL: "a"}, "annotations": {SIZE_ANNOTATION: size}}), json!({}));
        let err = membership(&f, &[], None, MAX).unwrap_err();
        assert!(matches!(err, GangMetadataError::NotASize { .. }), "{size}: {err:?}");
        assert!(err.to_string().contains("positive integer"), "{size}: {err}");
    }
    let f = facts(json!({"labels": {NAME_LABEL: "a"}}), json!({}));
    let err = membership(&f, &[], None, MAX).unwrap_err();
    assert_eq!(err.to_string(), format!("label {NAME_LABEL}=a needs the annotation {SIZE_ANNOTATION}"));
}

#[test]
fn inference_is_opt_in_per_kind() {
    let job_pod = facts(
        json!({"labels": {JOB_NAME: "train", JOB_INDEX: "0"}, "ownerReferences": [{"kind": "Job", "name": "train"}]}),
        json!({}),
    );
    assert_eq!(membership(&job_pod, &[], None, MAX).unwrap(), None);
    assert_eq!(membership(&job_pod, &[InferredKind::Job], None, MAX).unwrap().unwrap().name, "job-train");
    let mpi_launcher = facts(
        json!({"labels": {KUBEFLOW_JOB: "m", KUBEFLOW_ROLE: "launcher"}, "ownerReferences": [{"kind": "MPIJob", "name": "m"}]}),
        json!({}),
    );
    assert_eq!(membership(&mpi_launcher, &[InferredKind::MPIJob], None, MAX).unwrap(), None);
    let jobset_pod = facts(
        json!({"labels": {JOBSET_NAME: "js", JOB_NAME: "js-w-0", JOB_INDEX: "0"}, "ownerReferences": [{"kind": "Job", "name": "js-w-0"}]}),
        json!({}),
    );
    assert_eq!(
        membership(&jobset_pod, &[InferredKind::Job, InferredKind::JobSet], None, MAX).unwrap().unwrap().name,
        "jobset-js"
    );
    assert_eq!(
        membership(&jobset_pod, &[InferredKind::Job], None, MAX).unwrap(),
        None,
        "a JobSet pod is not its Job's gang"
    );
}

#[test]
fn owner_sizes() {
    assert_eq!(owner_size(InferredKind::Job, &json!({"spec": {"parallelism": 4}})), Some(4));
    assert_eq!(owner_size(InferredKind::Job, &json!({"spec": {"parallelism": 0}})), None);
    let js = json!({"spec": {"replicatedJobs": [
        {"replicas": 2, "template": {"spec": {"parallelism": 4}}},
        {"template": {"spec": {}}}
    ]}});
    assert_eq!(owner_size(InferredKind::JobSet, &js), Some(9));
    let pt = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}, "runPolicy": {}}});
    assert_eq!(owner_size(InferredKind::KubeflowJob, &pt), Some(4));
    let mpi = json!({"spec": {"mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 8}}}});
    assert_eq!(owner_size(InferredKind::MPIJob, &mpi), Some(8));
}

#[test]
fn leader_worker_sets_are_one_gang_per_group() {
    let leader = facts(json!({"labels": {LWS_NAME: "llm", LWS_GROUP: "2", LWS_WORKER: "0"}}), json!({}));
    let worker = facts(json!({"labels": {LWS_NAME: "llm", LWS_GROUP: "2", LWS_WORKER: "3"}}), json!({}));
    assert_eq!(membership(&leader, &[], None, MAX).unwrap(), None, "opt-in");
    let infer = [InferredKind::LeaderWorkerSet];
    assert_eq!(membership(&leader, &infer, None, MAX).unwrap().unwrap().name, "lws-llm-2");
    assert_eq!(membership(&worker, &infer, None, MAX).unwrap().unwrap().name, "lws-llm-2");
    assert!(is_group_leader(&leader) && !is_group_leader(&worker));
    let lws = json!({"spec": {"startupPolicy": "LeaderReady", "leaderWorkerTemplate": {"size": 4,
            "workerTemplate": {"spec": {"containers": [{"name": "w"}]}}}}});
    let g = owner_gang(InferredKind::LeaderWorkerSet, &lws).unwrap();
    assert_eq!((g.size, g.leader_first), (4, true));
    assert!(g.worker_template.is_some());
    let created = json!({"spec": {"leaderWorkerTemplate": {"size": 4}}});
    assert!(!owner_gang(InferredKind::LeaderWorkerSet, &created).unwrap().leader_first);
}

#[test]
fn gang_sizes_are_bounded_without_overflow() {
    let sized =
        |size: &str| facts(json!({"labels": {NAME_LABEL: "g"}, "annotations": {SIZE_ANNOTATION: size}}), json!({}));
    assert_eq!(membership(&sized("1024"), &[], None, 1024).unwrap().unwrap().size, Some(1024));
    for huge in ["1025", "4294967295", "4294967296", "99999999999999999999999999999999999999999999"] {
        let err = membership(&sized(huge), &[], None, 1024).unwrap_err();
        assert!(matches!(err, GangMetadataError::TooLarge { max: 1024, .. }), "{huge}: {err:?}");
        assert!(err.to_string().contains("at most 1024 members (GangPolicy maxGangSize)"), "{huge}: {err}");
    }
    let kueue = facts(json!({"labels": {KUEUE_GROUP: "pg"}, "annotations": {KUEUE_TOTAL: "5000"}}), json!({}));
    let err = membership(&kueue, &[], None, 1024).unwrap_err().to_string();
    assert!(err.contains("kueue.x-k8s.io/pod-group-total-count is 5000"), "{err}");
    // Owner sizes saturate instead of overflowing (then fail the u32 conversion).
    let js = json!({"spec": {"replicatedJobs": [
            {"replicas": u64::MAX, "template": {"spec": {"parallelism": u64::MAX}}},
            {"replicas": u64::MAX}]}});
    assert_eq!(owner_size(InferredKind::JobSet, &js), None);
    let pt =
        json!({"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": u64::MAX}, "Worker": {"replicas": u64::MAX}}}});
    assert_eq!(owner_size(InferredKind::KubeflowJob, &pt), None);
}
