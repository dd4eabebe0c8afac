//! Tenants are adversaries: engine tests with the AdmissionReview's userInfo for every rule of
//! `allot::admission::tenant` — who may move Allot's gates and keys, exemptions by trust, bound pods,
//! bounded numbers, resizes and ephemeral containers — and a property test over random edits.

use std::path::Path;

use allot::admission::engine::{Engine, Outcome, Request, RequestOperation, group_kind};
use allot::admission::finding::Finding;
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::Action;
use allot::model::policy::{self, PolicySet, Source};
use serde_json::{Value, json};

const ALLOT: &str = "system:serviceaccount:allot-system:allot";
const DS_CONTROLLER: &str = "system:serviceaccount:kube-system:daemon-set-controller";

fn sources() -> Vec<Source> {
    policy::read_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap()
}

fn shipped() -> PolicySet {
    policy::compile(&sources()).unwrap()
}

/// The shipped policies with `old` replaced by `new` in the document of `kind`.
fn with_spec(kind: &str, old: &str, new: &str) -> PolicySet {
    with_specs(&[(kind, old, new)])
}

/// [`with_spec`], for several edits.
fn with_specs(edits: &[(&str, &str, &str)]) -> PolicySet {
    let mut sources = sources();
    for (kind, old, new) in edits {
        let doc = sources.iter_mut().find(|s| s.text.contains(&format!("kind: {kind}"))).expect("document");
        assert!(doc.text.contains(old), "{old:?} not in the shipped {kind}");
        doc.text = doc.text.replacen(old, new, 1);
    }
    policy::compile(&sources).unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/admission-reviews").join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The gated gang worker of fixture 021 as it was before the UPDATE (gate present).
fn gated_worker() -> Value {
    fixture("021-validate-update-pod-gated-worker-0.json")["request"]["oldObject"].clone()
}

fn gpu_pod(gpus: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "vision"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}})
}

fn request<'a>(
    operation: RequestOperation,
    object: &'a Value,
    old: Option<&'a Value>,
    username: &'a str,
) -> Request<'a> {
    let (group, kind) = group_kind(object);
    Request {
        uid: "u1",
        operation,
        group,
        kind,
        namespace: "vision",
        object,
        old_object: old,
        dry_run: false,
        username,
        groups: &[],
    }
}

fn update(policies: &PolicySet, old: &Value, new: &Value, username: &str) -> Outcome {
    Engine::new(policies, &NoNamespaces).validate(&request(RequestOperation::Update, new, Some(old), username))
}

fn create(policies: &PolicySet, object: &Value, username: &str) -> (Outcome, Outcome) {
    let engine = Engine::new(policies, &NoNamespaces);
    let admission = engine.admit(&request(RequestOperation::Create, object, None, username));
    (admission.mutation, admission.validation)
}

fn denials<'o>(outcome: &'o Outcome, rule: &str) -> Vec<&'o Finding> {
    outcome.findings.iter().filter(|f| f.action == Action::Deny && f.rule == rule).collect()
}

fn gated(mutation: &Outcome) -> bool {
    mutation.patch.iter().any(|op| serde_json::to_string(op).unwrap().contains("allot.dev/gang"))
}

mod updates {
    use super::*;

    /// An inferred gang's size comes from the owner: repointing a held member at a smaller Job
    /// of one's own would shrink the gang Allot waits for and charges.
    #[test]
    fn owners_of_a_held_pod_are_for_allot_and_the_control_plane() {
        let policies = shipped();
        let mut old = gated_worker();
        old["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1", "controller": true}]);
        let mut new = old.clone();
        new["metadata"]["ownerReferences"][0]["name"] = json!("tiny");
        let out = update(&policies, &old, &new, "alice");
        let denied = denials(&out, "tenant/reserved-keys");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert_eq!(denied[0].path, "metadata.ownerReferences");
        assert!(denied[0].message.contains("not alice"), "{}", denied[0].message);
        let mut orphaned = old.clone();
        orphaned["metadata"].as_object_mut().unwrap().remove("ownerReferences");
        assert!(!update(&policies, &old, &orphaned, "alice").allowed(), "removing the owners is a change too");
        // Allot and the control plane's controllers (garbage collector orphaning, adoption).
        for who in
            [ALLOT, "system:serviceaccount:kube-system:generic-garbage-collector", "system:kube-controller-manager"]
        {
            assert!(update(&policies, &old, &orphaned, who).allowed(), "{who}");
        }
        // A pod Allot no longer holds (released and bound, no reservation) is the user's business.
        let mut free = old.clone();
        free["spec"].as_object_mut().unwrap().remove("schedulingGates");
        let mut free_new = free.clone();
        free_new["metadata"]["ownerReferences"][0]["name"] = json!("tiny");
        assert!(update(&policies, &free, &free_new, "alice").allowed());
        // ... but while its release reservation stands, it is still held.
        free["metadata"]["annotations"]["allot.dev/gang-released"] = json!("2026-11-23T12:00:00Z");
        free_new["metadata"]["annotations"]["allot.dev/gang-released"] = json!("2026-11-23T12:00:00Z");
        assert!(!update(&policies, &free, &free_new, "alice").allowed());
    }

    #[test]
    fn removing_either_gate_is_for_allot_alone() {
        let policies = shipped();
        let old = gated_worker();
        {
            let mut old = old.clone();
            old["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]);
            for keep in [json!([]), json!([{"name": "allot.dev/gang"}]), json!([{"name": "allot.dev/quota"}])] {
                let mut new = old.clone();
                new["spec"]["schedulingGates"] = keep.clone();
                let out = update(&policies, &old, &new, "alice");
                let denied = denials(&out, "tenant/allot-gates");
                assert_eq!(denied.len(), 1, "{keep}: {:?}", out.findings);
                assert!(
                    denied[0].message.contains(&format!("only Allot ({ALLOT}) may remove")),
                    "{}",
                    denied[0].message
                );
                assert!(denied[0].message.contains("not alice"), "{}", denied[0].message);
                assert!(update(&policies, &old, &new, ALLOT).allowed(), "{keep}");
            }
        }
        // Cluster admins too: the gate is Allot's bookkeeping, not an access control.
        let mut new = old.clone();
        new["spec"].as_object_mut().unwrap().remove("schedulingGates");
        assert!(!update(&policies, &old, &new, "kubernetes-admin").allowed());
        // Someone else's gate is not Allot's business.
        let mut old2 = old.clone();
        old2["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}, {"name": "allot.dev/gang"}]);
        let mut new2 = old2.clone();
        new2["spec"]["schedulingGates"] = json!([{"name": "allot.dev/gang"}]);
        assert!(update(&policies, &old2, &new2, "alice").allowed());
    }

    #[test]
    fn reserved_and_membership_keys_are_frozen_for_tenants() {
        let policies = shipped();
        let old = gated_worker();
        let edits: [(&str, &str, Option<&str>); 10] = [
            ("annotations", "allot.dev/gang-released", Some("2026-11-22T01:00:00Z")),
            // Writable at CREATE only: a gang pinned by its level must not move after.
            ("annotations", "allot.dev/topology", Some("topology.kubernetes.io/zone")),
            // An earlier arrival would move a queued pod ahead in its team's queue.
            ("annotations", "allot.dev/arrival", Some("2020-01-01T00:00:00Z")),
            ("labels", "allot.dev/gang-name", Some("other")),
            ("labels", "allot.dev/gang-name", None),
            ("annotations", "allot.dev/gang-size", Some("1")),
            ("labels", "kueue.x-k8s.io/pod-group-name", Some("pg")),
            ("annotations", "kueue.x-k8s.io/pod-group-total-count", Some("1")),
            ("labels", "scheduling.x-k8s.io/pod-group", Some("pg")),
            ("labels", "kueue.x-k8s.io/managed", Some("true")),
        ];
        for (field, key, value) in edits {
            let mut new = old.clone();
            match value {
                Some(v) => new["metadata"][field][key] = json!(v),
                None => {
                    new["metadata"][field].as_object_mut().unwrap().remove(key);
                }
            }
            let out = update(&policies, &old, &new, "alice");
            let denied = denials(&out, "tenant/reserved-keys");
            assert_eq!(denied.len(), 1, "{key}: {:?}", out.findings);
            assert!(denied[0].message.contains(key), "{}", denied[0].message);
            assert!(denied[0].message.contains(&format!("only Allot ({ALLOT})")), "{}", denied[0].message);
            assert!(update(&policies, &old, &new, ALLOT).allowed(), "{key} by Allot");
        }
        // Unrelated labels and annotations stay the tenant's.
        let mut new = old.clone();
        new["metadata"]["labels"]["app"] = json!("train");
        new["metadata"]["annotations"]["note"] = json!("hello");
        let out = update(&policies, &old, &new, "alice");
        assert!(
            out.findings.iter().all(|f| !f.rule.as_str().starts_with("tenant/")) && out.allowed(),
            "{:?}",
            out.findings
        );
    }

    #[test]
    fn resizes_keep_accelerators_and_ephemeral_containers_get_none() {
        let policies = shipped();
        let old = gated_worker();
        let mut more = old.clone();
        more["spec"]["containers"][0]["resources"] =
            json!({"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}});
        let out = update(&policies, &old, &more, "alice");
        let denied = denials(&out, "tenant/resize");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert!(denied[0].message.contains("accelerator requests/limits may not change"), "{}", denied[0].message);
        // CPU and memory may be resized in place.
        let mut cpu = old.clone();
        cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("2");
        cpu["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("2");
        assert!(update(&policies, &old, &cpu, "alice").allowed());
        // Unless the team's quota counts CPU: then the resize would change its charge.
        let cpu_quota = with_spec("Team", "      nvidia.com/gpu: 16\n", "      nvidia.com/gpu: 16\n      cpu: 64\n");
        let out = update(&cpu_quota, &old, &cpu, "alice");
        let denied = denials(&out, "tenant/resize");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert!(denied[0].message.contains("charged against its team's quota (cpu)"), "{}", denied[0].message);
        let mut memory = old.clone();
        memory["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("1Gi");
        assert!(update(&cpu_quota, &old, &memory, "alice").allowed());
        assert!(update(&cpu_quota, &old, &cpu, ALLOT).allowed());

        let mut debug = old.clone();
        debug["spec"]["ephemeralContainers"] =
            json!([{"name": "dbg", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
        let out = update(&policies, &old, &debug, "alice");
        let denied = denials(&out, "tenant/ephemeral-containers");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert!(denied[0].message.contains("ephemeral container dbg asks for nvidia.com/gpu"), "{}", denied[0].message);
        debug["spec"]["ephemeralContainers"] = json!([{"name": "dbg", "image": "busybox"}]);
        assert!(update(&policies, &old, &debug, "alice").allowed());
    }
}

mod creates {
    use super::*;

    #[test]
    fn reserved_keys_written_by_users_are_denied_on_pods_and_templates() {
        let policies = shipped();
        let mut pod = gpu_pod(json!(1));
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-released": "now"});
        let (_, validation) = create(&policies, &pod, "alice");
        let denied = denials(&validation, "tenant/reserved-keys");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert!(denied[0].message.contains("annotation allot.dev/gang-released is reserved for Allot"));
        // Nor may a pod claim an early place in its team's queue.
        pod["metadata"]["annotations"] = json!({"allot.dev/arrival": "2020-01-01T00:00:00Z"});
        let denied = denials(&create(&policies, &pod, "alice").1, "tenant/reserved-keys").len();
        assert_eq!(denied, 1);
        // The two keys users declare gangs with stay theirs.
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
        assert!(create(&policies, &pod, "alice").1.allowed());
        // Under the wrong kind of metadata they are reserved too.
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "g", "allot.dev/gang-size": "2"});
        assert!(!create(&policies, &pod, "alice").1.allowed());
        // A topology level: one of the GangPolicy's, never another (nor any, where it has none).
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
        let racks = with_spec(
            "GangPolicy",
            "nativeScheduling: false\n",
            "nativeScheduling: false\n  topology: {required: topology.kubernetes.io/rack, preferred: [nvidia.com/gpu.clique, topology.kubernetes.io/rack]}\n",
        );
        for (level, shipped_allows, racks_allows) in [
            ("nvidia.com/gpu.clique", false, true),
            ("topology.kubernetes.io/rack", false, true),
            ("topology.kubernetes.io/zone", false, false),
        ] {
            pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2", "allot.dev/topology": level});
            for (set, allows) in [(&policies, shipped_allows), (&racks, racks_allows)] {
                let (_, validation) = create(set, &pod, "alice");
                assert_eq!(validation.allowed(), allows, "{level}: {:?}", validation.findings);
                if !allows {
                    let denied = denials(&validation, "gang/metadata");
                    assert!(denied.len() == 1 && denied[0].message.contains(level), "{:?}", validation.findings);
                }
                // Judged at CREATE only: a member admitted before a policy change keeps its gang
                // in the controller's view (it gets the policy's own levels there).
                let mut existing = pod.clone();
                existing["metadata"]["name"] = json!("w-0");
                existing["metadata"]["namespace"] = json!("vision");
                let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_value(existing).unwrap();
                let record = allot::control::cluster::PodRecord::from_pod(&typed, set, &NoNamespaces).expect("record");
                assert!(record.gang.is_some(), "{level}: the member keeps its gang");
            }
        }

        let mut job = fixture("009-validate-create-job-gang-a.json")["request"]["object"].clone();
        job["spec"]["template"]["metadata"]["annotations"]["allot.dev/gang-released"] = json!("now");
        let out =
            Engine::new(&policies, &NoNamespaces).validate(&request(RequestOperation::Create, &job, None, "alice"));
        let denied = denials(&out, "tenant/reserved-keys");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert_eq!(denied[0].path, "spec.template.metadata.annotations");
    }

    #[test]
    fn foreign_markers_exempt_nothing_unless_the_cluster_runs_that_scheduler() {
        let shipped = shipped();
        let mut pod = gated_worker();
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        // Markers that hold the pod for their manager: Kueue's gate, Volcano's scheduler.
        let mut kueue_gated = pod.clone();
        kueue_gated["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        let mut volcano = pod.clone();
        volcano["spec"]["schedulerName"] = json!("volcano");
        let mut cosched = pod.clone();
        cosched["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = json!("pg");
        cosched["spec"]["schedulerName"] = json!("scheduler-plugins-scheduler");
        for (marked, scheduler) in [(&kueue_gated, "Kueue"), (&volcano, "Volcano"), (&cosched, "Coscheduling")] {
            assert!(gated(&create(&shipped, marked, "alice").0), "{scheduler} is not listed: no exemption");
            let runs = with_spec("Cluster", "externalSchedulers: []", &format!("externalSchedulers: [{scheduler}]"));
            assert!(!gated(&create(&runs, marked, "alice").0), "{scheduler} runs here");
        }
        // Markers that hold nothing exempt nothing, even where their manager runs: Kueue's label
        // without its gate (the pod would run at once), Volcano's group on a pod the default
        // scheduler places.
        let markers = [
            ("labels", "kueue.x-k8s.io/managed", "true", "Kueue"),
            ("annotations", "scheduling.k8s.io/group-name", "pg", "Volcano"),
            ("labels", "scheduling.x-k8s.io/pod-group", "pg", "Coscheduling"),
        ];
        for (field, key, value, scheduler) in markers {
            let mut marked = pod.clone();
            marked["metadata"][field][key] = json!(value);
            assert!(gated(&create(&shipped, &marked, "alice").0), "{key} alone must not exempt");
            let runs = with_spec("Cluster", "externalSchedulers: []", &format!("externalSchedulers: [{scheduler}]"));
            assert!(gated(&create(&runs, &marked, "alice").0), "{key} alone must not exempt where {scheduler} runs");
        }
    }

    /// The mirror-pod annotation exempts from placement and gates only a kubelet's pod: a
    /// tenant writing it on a gang member still gets the gang gate and the pool's toleration.
    #[test]
    fn a_mirror_pod_annotation_exempts_only_a_kubelets_pod() {
        let policies = shipped();
        let mut pod = gated_worker();
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        pod["spec"].as_object_mut().unwrap().remove("tolerations");
        pod["metadata"]["annotations"]["kubernetes.io/config.mirror"] = json!("forged");
        let mutation = create(&policies, &pod, "alice").0;
        assert!(gated(&mutation), "{:?}", mutation.patch);
        let patch = serde_json::to_string(&mutation.patch).unwrap();
        assert!(patch.contains("/spec/tolerations"), "placed like any GPU pod: {patch}");
        assert!(!gated(&create(&policies, &pod, "system:node:n1").0), "the kubelet's mirror pod");
    }

    #[test]
    fn daemon_set_pods_are_exempt_only_from_the_daemon_set_controller() {
        let policies = shipped();
        let mut pod = gated_worker();
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        pod["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "x", "controller": true}]);
        assert!(gated(&create(&policies, &pod, "alice").0), "an ownerReference alone is not trust");
        assert!(!gated(&create(&policies, &pod, DS_CONTROLLER).0));
        let custom = with_spec(
            "Cluster",
            "    daemonSetControllers:\n      - system:serviceaccount:kube-system:daemon-set-controller\n      - system:kube-controller-manager\n",
            "    daemonSetControllers: [system:serviceaccount:kube-system:ds]\n",
        );
        assert!(gated(&create(&custom, &pod, DS_CONTROLLER).0));
        assert!(!gated(&create(&custom, &pod, "system:serviceaccount:kube-system:ds").0));
    }

    /// An accelerator the team's quota does not count: denied in a Pod and in a workload's
    /// template at CREATE; on the workload's UPDATE only a warning (one admitted before the
    /// check must stay editable; its pods are denied when created).
    #[test]
    fn an_uncounted_accelerator_is_denied_at_create_and_warned_on_a_workload_update() {
        let policies = shipped();
        let job = |parallelism: u32| {
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
                "spec": {"parallelism": parallelism, "template": {"spec": {"restartPolicy": "Never", "containers": [
                    {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]}}}})
        };
        let findings = |outcome: &Outcome| -> Vec<(Action, String)> {
            outcome.findings.iter().filter(|f| f.rule == "team/quota").map(|f| (f.action, f.message.clone())).collect()
        };
        let created = create(&policies, &gpu_pod(json!(0)), "alice").1;
        assert!(findings(&created).is_empty(), "a pod asking nothing uncounted: {:?}", created.findings);
        let mut pod = gpu_pod(json!(0));
        pod["spec"]["containers"][0]["resources"]["limits"] = json!({"nvidia.com/mig-3g.40gb": 1});
        let denied = findings(&create(&policies, &pod, "alice").1);
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(denied[0].0, Action::Deny);
        assert!(denied[0].1.contains("does not count nvidia.com/mig-3g.40gb"), "{}", denied[0].1);
        assert_eq!(findings(&create(&policies, &job(1), "alice").1)[0].0, Action::Deny);
        let updated = findings(&update(&policies, &job(1), &job(2), "alice"));
        assert_eq!(updated.len(), 1, "{updated:?}");
        assert_eq!(updated[0].0, Action::Warn);
        assert!(updated[0].1.ends_with("its pods will be denied when created"), "{}", updated[0].1);
    }

    /// A queue-mode team's quota holds whatever scheduler the tenant names. Volcano's pods and
    /// coscheduling's of unknown group size are kept out of Allot's quota queue (it cannot hold
    /// them whole), so where they count against the quota they are denied: the tenant picks
    /// Volcano's queue herself, and a pod naming `schedulerName: volcano` ran past her team's
    /// quota. Kueue's pods (behind its gate) wait in the LocalQueues the admins set: admitted.
    /// A workload's template is denied at CREATE, warned about on UPDATE.
    #[test]
    fn a_foreign_scheduler_does_not_take_a_pod_past_a_queue_mode_quota() {
        let to_queue = ("Team", "mode: Deny                        # Deny | Queue", "mode: Queue");
        let lists =
            |scheduler: &str| ("Cluster", "externalSchedulers: []", format!("externalSchedulers: [{scheduler}]"));
        let policies = |edits: &[(&str, &str, &str)]| with_specs(edits);
        let queues = |mutation: &Outcome| serde_json::to_string(&mutation.patch).unwrap().contains("allot.dev/quota");
        let skip = |outcome: &Outcome| -> Vec<String> {
            denials(outcome, "team/quota").iter().map(|f| format!("{}: {}", f.path, f.message)).collect()
        };
        let (c, o, n) = lists("Volcano");
        let volcano_queue = policies(&[to_queue, (c, o, &n)]);
        let mut pod = gpu_pod(json!(8));
        pod["spec"]["schedulerName"] = json!("volcano");
        let (mutation, validation) = create(&volcano_queue, &pod, "alice");
        assert!(!queues(&mutation) && !gated(&mutation), "Volcano's pod is left to Volcano: {:?}", mutation.patch);
        let denied = skip(&validation);
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert!(denied[0].starts_with("spec.schedulerName: team "), "{}", denied[0]);
        assert!(
            denied[0].contains("placed by scheduler \"volcano\", would not wait in it: Volcano's queues"),
            "{}",
            denied[0]
        );
        // Asking nothing the quota counts, it goes.
        assert!(skip(&create(&volcano_queue, &gpu_pod(json!(0)), "alice").1).is_empty());
        // In a deny-mode team the pod is charged at admission like any other: this check is silent.
        assert!(skip(&create(&policies(&[(c, o, &n)]), &pod, "alice").1).is_empty());
        // Where the cluster does not run Volcano, its name exempts nothing: the pod queues.
        let (mutation, validation) = create(&policies(&[to_queue]), &pod, "alice");
        assert!(queues(&mutation));
        assert!(skip(&validation).is_empty(), "{:?}", validation.findings);

        // Coscheduling: denied where its group's size is unknown, queued where it is known.
        let (c, o, n) = lists("Coscheduling");
        let sized = ("GangPolicy", "name: default\nspec:\n", "name: default\nspec:\n  coschedulingSize: 2\n");
        let mut grouped = gpu_pod(json!(8));
        grouped["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": "mine"});
        grouped["spec"]["schedulerName"] = json!("scheduler-plugins-scheduler");
        let denied = skip(&create(&policies(&[to_queue, (c, o, &n)]), &grouped, "alice").1);
        assert_eq!(denied.len(), 1);
        assert!(denied[0].contains("cannot hold the group whole (set coschedulingSize"), "{}", denied[0]);
        let (mutation, validation) = create(&policies(&[to_queue, (c, o, &n), sized]), &grouped, "alice");
        assert!(queues(&mutation));
        assert!(skip(&validation).is_empty(), "{:?}", validation.findings);

        // Kueue's pods behind its gate are Kueue's to queue.
        let (c, o, n) = lists("Kueue");
        let mut managed = gpu_pod(json!(8));
        managed["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        managed["spec"]["schedulerName"] = json!("volcano");
        assert!(skip(&create(&policies(&[to_queue, (c, o, &n)]), &managed, "alice").1).is_empty());

        // A Job whose pods Volcano would place: denied at CREATE, a warning on UPDATE.
        let job = |parallelism: u32| {
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
                "spec": {"parallelism": parallelism, "template": {"spec": {"restartPolicy": "Never",
                    "schedulerName": "volcano", "containers": [
                    {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}})
        };
        let created = create(&volcano_queue, &job(1), "alice").1;
        let denied = skip(&created);
        assert_eq!(denied.len(), 1, "{:?}", created.findings);
        assert!(denied[0].starts_with("spec.template.spec.schedulerName: "), "{}", denied[0]);
        let updated = update(&volcano_queue, &job(1), &job(2), "alice");
        assert!(updated.allowed(), "{:?}", updated.findings);
        assert!(
            updated.findings.iter().any(|f| f.rule == "team/quota" && f.action == Action::Warn),
            "{:?}",
            updated.findings
        );

        // A Volcano Job names its scheduler once, for every task (Volcano's webhook fills in
        // `volcano` when it is left out): its tasks' templates name none, its pods will.
        let vcjob = |scheduler: Option<&str>| {
            let mut job = json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                "metadata": {"name": "vj", "namespace": "vision"},
                "spec": {"minAvailable": 1, "tasks": [{"name": "t", "replicas": 1, "template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}]}});
            if let Some(s) = scheduler {
                job["spec"]["schedulerName"] = json!(s);
            }
            job
        };
        for scheduler in [None, Some("volcano")] {
            let created = create(&volcano_queue, &vcjob(scheduler), "alice").1;
            let denied = skip(&created);
            assert_eq!(denied.len(), 1, "{scheduler:?}: {:?}", created.findings);
            assert!(denied[0].starts_with("spec.tasks[0].template.spec.schedulerName: "), "{}", denied[0]);
        }
        let created = create(&volcano_queue, &vcjob(Some("default-scheduler")), "alice").1;
        assert!(skip(&created).is_empty(), "{:?}", created.findings);
        // A DaemonSet's pods come from the trusted controller, which keeps them in the queue
        // (they get the quota gate): its template is not denied.
        let daemon_set = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d", "namespace": "vision"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {
                "schedulerName": "volcano",
                "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}});
        let created = create(&volcano_queue, &daemon_set, "alice").1;
        assert!(skip(&created).is_empty(), "{:?}", created.findings);
        let mut from_the_controller = gpu_pod(json!(1));
        from_the_controller["spec"]["schedulerName"] = json!("volcano");
        from_the_controller["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "x", "controller": true}]);
        let (mutation, validation) = create(&volcano_queue, &from_the_controller, DS_CONTROLLER);
        assert!(serde_json::to_string(&mutation.patch).unwrap().contains("allot.dev/quota"), "{:?}", mutation.patch);
        assert!(skip(&validation).is_empty(), "{:?}", validation.findings);
    }

    /// A trusted DaemonSet's pods are no gang, but in a queue-mode team what they ask counts
    /// like any pod's: they wait behind the quota gate (a tenant's own DaemonSet asking GPUs
    /// would otherwise run on every node past the queue).
    #[test]
    fn daemon_set_pods_queue_for_their_teams_quota() {
        let to_queue = ("Team", "mode: Deny                        # Deny | Queue", "mode: Queue");
        let queue = with_specs(&[to_queue]);
        let mut pod = gpu_pod(json!(8));
        pod["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "x", "controller": true}]);
        let queued = |mutation: &Outcome| serde_json::to_string(&mutation.patch).unwrap().contains("allot.dev/quota");
        let from_the_controller = create(&queue, &pod, DS_CONTROLLER).0;
        assert!(queued(&from_the_controller), "{:?}", from_the_controller.patch);
        assert!(queued(&create(&queue, &pod, "alice").0));
        // A pod behind Kueue's gate, where the cluster runs Kueue, is Kueue's to queue; its
        // label alone (no gate: the pod would run at once) exempts nothing.
        let kueue = with_specs(&[to_queue, ("Cluster", "externalSchedulers: []", "externalSchedulers: [Kueue]")]);
        let mut managed = gpu_pod(json!(8));
        managed["metadata"]["labels"] = json!({"kueue.x-k8s.io/managed": "true"});
        assert!(queued(&create(&queue, &managed, "alice").0), "a label alone exempts nothing");
        assert!(queued(&create(&kueue, &managed, "alice").0), "a label alone exempts nothing");
        managed["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        assert!(queued(&create(&queue, &managed, "alice").0), "Kueue is not listed");
        assert!(!queued(&create(&kueue, &managed, "alice").0));
        // Coscheduling gangs a pod but queues nothing: where its groups' size is known
        // (GangPolicy coschedulingSize) the group queues as one unit for its team's quota (a
        // one-member PodGroup of her own would otherwise skip the queue); where it is not, the
        // queue could release part of a group, which would hold the quota waiting for the rest
        // queued behind it: then the plugin's pods are left to it, as before.
        let cluster = ("Cluster", "externalSchedulers: []", "externalSchedulers: [Coscheduling]");
        let sized = ("GangPolicy", "name: default\nspec:\n", "name: default\nspec:\n  coschedulingSize: 2\n");
        let mut grouped = gpu_pod(json!(8));
        grouped["metadata"]["labels"] = json!({"scheduling.x-k8s.io/pod-group": "mine"});
        grouped["spec"]["schedulerName"] = json!("scheduler-plugins-scheduler");
        let mutation = create(&with_specs(&[to_queue, cluster, sized]), &grouped, "alice").0;
        assert!(queued(&mutation), "{:?}", mutation.patch);
        assert!(!gated(&mutation), "the plugin gangs it: {:?}", mutation.patch);
        let mutation = create(&with_specs(&[to_queue, cluster]), &grouped, "alice").0;
        assert!(!queued(&mutation) && !gated(&mutation), "{:?}", mutation.patch);
    }

    /// Allot's mutating webhook runs before Kueue's (configurations go by name): its first call
    /// gates a pod Kueue will manage; Kueue then adds its gate, and the API server calls Allot
    /// again (reinvocationPolicy IfNeeded), which takes its own gates back off. Before, every
    /// Kueue pod stayed behind Allot's gates as well, queued twice.
    #[test]
    fn a_reinvocation_after_kueue_gated_the_pod_takes_allots_gates_off() {
        let to_queue = ("Team", "mode: Deny                        # Deny | Queue", "mode: Queue");
        let kueue = with_specs(&[to_queue, ("Cluster", "externalSchedulers: []", "externalSchedulers: [Kueue]")]);
        let mut pod = gpu_pod(json!(8));
        pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "g"});
        pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
        let apply = |object: &Value, outcome: &Outcome| {
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::to_value(&outcome.patch).unwrap()).unwrap();
            let mut out = object.clone();
            json_patch::patch(&mut out, &patch).expect("the patch applies");
            out
        };
        let gate_names = |pod: &Value| -> Vec<String> {
            pod["spec"]["schedulingGates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g["name"].as_str().map(String::from))
                .collect()
        };
        let first = apply(&pod, &create(&kueue, &pod, "alice").0);
        assert_eq!(gate_names(&first), ["allot.dev/gang", "allot.dev/quota"]);
        let mut by_kueue = first.clone();
        by_kueue["spec"]["schedulingGates"].as_array_mut().unwrap().push(json!({"name": "kueue.x-k8s.io/admission"}));
        let again = apply(&by_kueue, &create(&kueue, &by_kueue, "alice").0);
        assert_eq!(gate_names(&again), ["kueue.x-k8s.io/admission"]);
        // Idempotent: a further call changes nothing.
        assert!(
            create(&kueue, &again, "alice")
                .0
                .patch
                .iter()
                .all(|op| !serde_json::to_string(op).unwrap().contains("schedulingGates"))
        );
    }

    #[test]
    fn bound_accelerator_pods_and_gang_members_need_a_trusted_creator() {
        let policies = shipped();
        let mut pod = gpu_pod(json!(1));
        pod["spec"]["nodeName"] = json!("gpu-node-1");
        let (_, validation) = create(&policies, &pod, "alice");
        let denied = denials(&validation, "tenant/bound-pod");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert!(denied[0].message.contains("requests accelerators and sets spec.nodeName"), "{}", denied[0].message);
        assert!(denied[0].message.contains(DS_CONTROLLER) && denied[0].message.contains("not alice"));
        assert!(create(&policies, &pod, DS_CONTROLLER).1.allowed());
        // The kubelet's mirror pods stay its own.
        assert!(create(&policies, &pod, "system:node:gpu-node-1").1.allowed());
        // A gang member that binds itself would skip the gang gate.
        let mut member = gated_worker();
        member["spec"]["containers"][0]["resources"] = json!({});
        member["spec"].as_object_mut().unwrap().remove("schedulingGates");
        member["spec"]["nodeName"] = json!("n1");
        assert_eq!(denials(&create(&policies, &member, "alice").1, "tenant/bound-pod").len(), 1);
        // A plain CPU pod may still pick its node.
        let mut cpu = gpu_pod(json!(1));
        cpu["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "1"}});
        cpu["spec"]["nodeName"] = json!("n1");
        assert!(create(&policies, &cpu, "alice").1.allowed());
        // Bound pods are checked like any other: a bad amount is still denied.
        pod["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "500m"}});
        assert!(!create(&policies, &pod, DS_CONTROLLER).1.allowed());
    }

    #[test]
    fn gang_sizes_are_bounded_at_admission() {
        let policies = shipped();
        let mut pod = gated_worker();
        pod["spec"].as_object_mut().unwrap().remove("schedulingGates");
        for size in ["4294967295", "1025", "100000000000000000000000"] {
            pod["metadata"]["annotations"]["allot.dev/gang-size"] = json!(size);
            let (mutation, validation) = create(&policies, &pod, "alice");
            assert!(!mutation.allowed(), "{size}");
            let denied = denials(&validation, "gang/metadata");
            assert_eq!(denied.len(), 1, "{size}: {:?}", validation.findings);
            assert!(
                denied[0].message.contains("at most 1024 members (GangPolicy maxGangSize)"),
                "{}",
                denied[0].message
            );
        }
        pod["metadata"]["annotations"]["allot.dev/gang-size"] = json!("1024");
        let (mutation, validation) = create(&policies, &pod, "alice");
        assert!(mutation.allowed() && denials(&validation, "gang/metadata").is_empty(), "{:?}", validation.findings);
        let small = with_spec("GangPolicy", "maxGangSize: 1024", "maxGangSize: 8");
        pod["metadata"]["annotations"]["allot.dev/gang-size"] = json!("9");
        assert!(!create(&small, &pod, "alice").1.allowed());

        // An inferred gang's size comes from its owner: a Job's parallelism.
        let jobs = {
            let mut s = sources();
            let doc = s.iter_mut().find(|s| s.text.contains("kind: GangPolicy")).unwrap();
            doc.text = doc.text.replace("infer: []", "infer: [Job]").replace("maxGangSize: 1024", "maxGangSize: 8");
            policy::compile(&s).unwrap()
        };
        let mut job = fixture("002-validate-create-job-mnist-demo.json")["request"]["object"].clone();
        job["spec"]["parallelism"] = json!(9);
        job["spec"]["completionMode"] = json!("Indexed");
        let out = Engine::new(&jobs, &NoNamespaces).validate(&request(RequestOperation::Create, &job, None, "alice"));
        let denied = denials(&out, "tenant/gang-size");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert!(
            denied[0].message.contains("makes a gang of 9 pods; gangs here have at most 8"),
            "{}",
            denied[0].message
        );
        job["spec"]["parallelism"] = json!(8);
        assert!(
            denials(
                &Engine::new(&jobs, &NoNamespaces).validate(&request(RequestOperation::Create, &job, None, "alice")),
                "tenant/gang-size"
            )
            .is_empty()
        );
    }

    #[test]
    fn absurd_accelerator_amounts_are_denied_without_overflow() {
        let policies = shipped();
        for (amount, rule) in [
            (json!("1e18"), "tenant/amount"),
            (json!(1_000_000_000_000_000_000u64), "tenant/amount"),
            (json!("8Ei"), "accelerators/quantity"),
            (json!("1Ei"), "tenant/amount"),
            (json!("1025"), "tenant/amount"),
            (json!("-1"), "tenant/amount"),
            (json!("1e30"), "accelerators/quantity"),
            (json!("1000000000000000000000000000000"), "accelerators/quantity"),
        ] {
            let pod = gpu_pod(amount.clone());
            let (_, validation) = create(&policies, &pod, "alice");
            assert!(!denials(&validation, rule).is_empty(), "{amount}: {:?}", validation.findings);
        }
        let denied = create(&policies, &gpu_pod(json!("1e18")), "alice").1;
        assert!(
            denials(&denied, "tenant/amount")[0].message.contains("a pod may ask between 0 and 1024"),
            "{:?}",
            denied.findings
        );
        // The bound is policy-settable.
        let big = with_spec("Cluster", "maxAmount: 1024", "maxAmount: 2048");
        assert!(denials(&create(&big, &gpu_pod(json!("1025")), "alice").1, "tenant/amount").is_empty());
        assert!(!denials(&create(&big, &gpu_pod(json!("2049")), "alice").1, "tenant/amount").is_empty());
    }
}

mod webhooks {
    #[test]
    fn pod_updates_and_guarded_subresources_reach_the_validating_webhook() {
        let opts = allot::cli::webhooks::WebhookOptions {
            endpoint: allot::cli::webhooks::Endpoint::Service {
                namespace: "allot-system".into(),
                name: "allot".into(),
            },
            ca_bundle: b"ca".to_vec(),
            name: "allot".into(),
            failure_policy: "Fail".into(),
            timeout_seconds: 5,
            exclude_namespaces: vec![],
            service_account: Some(super::ALLOT.into()),
            native_fingerprint: None,
        };
        let (_, validating) = allot::cli::webhooks::render(&opts);
        let webhooks = validating.webhooks.unwrap();
        let webhook = &webhooks[0];
        let core = webhook
            .rules
            .iter()
            .flatten()
            .find(|r| r.api_groups.as_deref() == Some(&["".to_string()]))
            .expect("a core rule");
        let resources = core.resources.clone().unwrap();
        for r in ["pods", "pods/resize", "pods/ephemeralcontainers"] {
            assert!(resources.iter().any(|x| x == r), "{r} not in {resources:?}");
        }
        assert!(core.operations.as_ref().unwrap().iter().any(|o| o == "UPDATE"));
        // Only the kubelet and Allot itself skip it; no condition looks at the object.
        for c in webhook.match_conditions.iter().flatten() {
            assert!(!c.expression.contains("object"), "{}", c.expression);
        }
        // pods/status can carry labels and annotations: its writes that change them reach Allot
        // too (the others, every kubelet status write among them, do not).
        let status = &webhooks[1];
        let rule = &status.rules.as_ref().unwrap()[0];
        assert_eq!(rule.resources.as_deref(), Some(&["pods/status".to_string()][..]));
        assert_eq!(rule.operations.as_deref(), Some(&["UPDATE".to_string()][..]));
        assert_eq!(status.client_config.service.as_ref().unwrap().path.as_deref(), Some("/validate"));
        let conditions: Vec<&str> = status.match_conditions.iter().flatten().map(|c| c.name.as_str()).collect();
        assert_eq!(conditions, ["not-kubelet", "not-allot-itself", "metadata-changed"]);
    }
}

mod property {
    use super::*;
    use proptest::prelude::*;

    const KEYS: &[&str] = &[
        "allot.dev/gang-name",
        "allot.dev/gang-size",
        "allot.dev/gang-released",
        "allot.dev/anything",
        "kueue.x-k8s.io/pod-group-name",
        "kueue.x-k8s.io/pod-group-total-count",
        "kueue.x-k8s.io/managed",
        "scheduling.x-k8s.io/pod-group",
        "scheduling.k8s.io/group-name",
        "batch.kubernetes.io/job-name",
        "app",
        "team",
        "example.com/note",
    ];
    const GATES: &[&str] = &["allot.dev/gang", "allot.dev/quota", "example.com/hold", "kueue.x-k8s.io/admission"];

    /// One edit of a Pod's metadata or gates.
    #[derive(Debug, Clone)]
    enum Edit {
        SetLabel(usize, String),
        RemoveLabel(usize),
        SetAnnotation(usize, String),
        RemoveAnnotation(usize),
        RemoveGate(usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let key = 0..KEYS.len();
        let value = "[a-z0-9]{0,3}";
        prop_oneof![
            (key.clone(), value).prop_map(|(k, v)| Edit::SetLabel(k, v)),
            key.clone().prop_map(Edit::RemoveLabel),
            (key.clone(), value).prop_map(|(k, v)| Edit::SetAnnotation(k, v)),
            key.prop_map(Edit::RemoveAnnotation),
            (0..GATES.len()).prop_map(Edit::RemoveGate),
        ]
    }

    fn apply(pod: &mut Value, edit: &Edit) {
        match edit {
            Edit::SetLabel(k, v) => pod["metadata"]["labels"][KEYS[*k]] = json!(v),
            Edit::RemoveLabel(k) => {
                pod["metadata"]["labels"].as_object_mut().map(|m| m.remove(KEYS[*k]));
            }
            Edit::SetAnnotation(k, v) => pod["metadata"]["annotations"][KEYS[*k]] = json!(v),
            Edit::RemoveAnnotation(k) => {
                pod["metadata"]["annotations"].as_object_mut().map(|m| m.remove(KEYS[*k]));
            }
            Edit::RemoveGate(g) => {
                if let Some(gates) = pod["spec"]["schedulingGates"].as_array_mut() {
                    gates.retain(|x| x["name"] != GATES[*g]);
                }
            }
        }
    }

    /// What only Allot may change: its gates, and every guarded label and annotation.
    fn guarded(pod: &Value) -> Value {
        let pick = |field: &str| -> serde_json::Map<String, Value> {
            pod["metadata"][field]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter(|(k, _)| allot::admission::tenant::is_guarded_key(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        };
        let gates: Vec<Value> = pod["spec"]["schedulingGates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["name"].as_str().is_some_and(|n| n.starts_with("allot.dev/")))
            .cloned()
            .collect();
        json!({"labels": pick("labels"), "annotations": pick("annotations"), "gates": gates})
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn no_tenant_update_changes_allots_gates_or_keys(
            edits in proptest::collection::vec(edit(), 1..6),
            user in prop_oneof![Just("alice"), Just("kubernetes-admin"), Just(""), Just(DS_CONTROLLER)],
        ) {
            let policies = shipped();
            let mut old = gated_worker();
            old["spec"]["schedulingGates"] = json!(GATES.iter().map(|g| json!({"name": g})).collect::<Vec<_>>());
            old["metadata"]["annotations"]["allot.dev/gang-released"] = json!("t");
            let mut new = old.clone();
            for e in &edits {
                apply(&mut new, e);
            }
            let changed = guarded(&old) != guarded(&new);
            let admitted = update(&policies, &old, &new, user).allowed();
            prop_assert_eq!(admitted, !changed, "edits {:?} by {:?}", edits, user);
            // Allot itself may make any of these edits.
            prop_assert!(update(&policies, &old, &new, ALLOT).allowed());
        }
    }
}

/// Placement `reserveTolerations`: the GPU taint keeps other pods off GPU nodes only while
/// tenants cannot write its toleration themselves.
mod tolerations {
    use super::*;
    use allot::admission::directory::NodeLookup;

    fn pod_in(namespace: &str, tolerations: Value, resources: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace},
            "spec": {"tolerations": tolerations,
                     "containers": [{"name": "c", "image": "i", "resources": resources}]}})
    }

    fn cpu_pod(tolerations: Value) -> Value {
        pod_in("vision", tolerations, json!({"requests": {"cpu": "16"}}))
    }

    fn in_namespace(policies: &PolicySet, object: &Value, namespace: &str) -> (Outcome, Outcome) {
        let engine = Engine::new(policies, &NoNamespaces);
        let request = Request { namespace, ..request(RequestOperation::Create, object, None, "alice") };
        let admission = engine.admit(&request);
        (admission.mutation, admission.validation)
    }

    const GPU_TAINT: &str = r#"{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}"#;

    fn toleration(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_cpu_pod_may_not_tolerate_the_gpu_taint_in_any_form_that_gets_it_there() {
        let policies = shipped();
        for t in [
            GPU_TAINT,
            r#"{"key": "nvidia.com/gpu", "operator": "Exists"}"#,
            r#"{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}"#,
            r#"{"key": "nvidia.com/gpu", "value": "present"}"#,
            r#"{"operator": "Exists"}"#,
            r#"{"key": "", "operator": "Exists", "effect": "NoSchedule"}"#,
        ] {
            let pod = cpu_pod(json!([{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}, toleration(t)]));
            let (mutation, _) = create(&policies, &pod, "alice");
            let denied = denials(&mutation, "tenant/tolerations");
            assert_eq!(denied.len(), 1, "{t}: {:?}", mutation.findings);
            assert_eq!(denied[0].path, "spec.tolerations[1]", "{t}");
            assert!(
                denied[0].message.contains("placement nvidia-gpu keeps for pods asking for nvidia.com/gpu"),
                "{}",
                denied[0].message
            );
            assert!(!mutation.allowed(), "{t}");
        }
    }

    #[test]
    fn tolerations_that_do_not_reach_past_the_taint_are_left_alone() {
        let policies = shipped();
        for t in [
            // The API server's defaults (DefaultTolerationSeconds) and unrelated taints.
            r#"{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}"#,
            r#"{"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}"#,
            // Another effect only: the NoSchedule taint still keeps the pod off.
            r#"{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "PreferNoSchedule"}"#,
            r#"{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}"#,
        ] {
            let (mutation, validation) = create(&policies, &cpu_pod(json!([toleration(t)])), "alice");
            assert!(
                mutation.allowed() && validation.allowed(),
                "{t}: {:?} {:?}",
                mutation.findings,
                validation.findings
            );
        }
    }

    #[test]
    fn pods_a_placement_applies_to_keep_their_own_tolerations() {
        let policies = shipped();
        // A GPU pod may write the toleration it would get anyway, or tolerate everything: the
        // AMD taint guards nodes without the NVIDIA GPUs it asks for.
        for t in [GPU_TAINT, r#"{"operator": "Exists"}"#] {
            let pod = pod_in("vision", json!([toleration(t)]), json!({"limits": {"nvidia.com/gpu": 1}}));
            let (mutation, validation) = create(&policies, &pod, "alice");
            assert!(
                mutation.allowed() && validation.allowed(),
                "{t}: {:?} {:?}",
                mutation.findings,
                validation.findings
            );
        }
        // An NVIDIA pod tolerating the AMD taint by name is fine too, for the same reason.
        let pod = pod_in(
            "vision",
            json!([{"key": "amd.com/gpu", "operator": "Exists"}]),
            json!({"limits": {"nvidia.com/gpu": 1}}),
        );
        assert!(create(&policies, &pod, "alice").0.allowed());
    }

    #[test]
    fn namespaces_of_no_team_are_the_platforms() {
        let policies = shipped();
        let plugin = pod_in("gpu-operator", json!([toleration(GPU_TAINT)]), json!({}));
        let (mutation, validation) = in_namespace(&policies, &plugin, "gpu-operator");
        assert!(mutation.allowed() && validation.allowed(), "{:?} {:?}", mutation.findings, validation.findings);
        // The same pod in a team namespace is a tenant's.
        let (mutation, _) = in_namespace(&policies, &plugin, "nlp");
        assert_eq!(denials(&mutation, "tenant/tolerations").len(), 1);
    }

    #[test]
    fn off_warn_and_audit_as_the_placement_says() {
        let pod = cpu_pod(json!([toleration(GPU_TAINT)]));
        let off = with_spec("Placement", "  reserveTolerations: Deny\n", "  reserveTolerations: Off\n");
        let (mutation, _) = create(&off, &pod, "alice");
        assert!(mutation.findings.iter().all(|f| f.rule != "tenant/tolerations"), "{:?}", mutation.findings);
        let warn = with_spec("Placement", "  reserveTolerations: Deny\n", "  reserveTolerations: Warn\n");
        let (mutation, _) = create(&warn, &pod, "alice");
        assert!(mutation.allowed());
        assert!(mutation.findings.iter().any(|f| f.rule == "tenant/tolerations" && f.action == Action::Warn));
    }

    /// A Placement scoped to one team's pool: another team's GPU pod tolerating that pool's
    /// taint would take the pool.
    #[test]
    fn another_teams_pool_is_not_for_the_taking() {
        let mut sources = sources();
        let doc = sources.iter_mut().find(|s| s.text.contains("kind: Placement")).expect("placements");
        doc.text.push_str(
            "---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: vision-pool}\nspec:\n  \
             match: {teams: [vision]}\n  resources: [nvidia.com/gpu]\n  \
             tolerations: [{key: example.com/pool, operator: Equal, value: vision, effect: NoSchedule}]\n  \
             nodeSelector: {example.com/pool: vision}\n  reserveTolerations: Deny\n",
        );
        let policies = policy::compile(&sources).unwrap_or_else(|e| panic!("{e}"));
        let pool = json!([{"key": "example.com/pool", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}]);
        let gpus = json!({"limits": {"nvidia.com/gpu": 1}});
        let (mutation, _) = in_namespace(&policies, &pod_in("nlp", pool.clone(), gpus.clone()), "nlp");
        let denied = denials(&mutation, "tenant/tolerations");
        assert_eq!(denied.len(), 1, "{:?}", mutation.findings);
        assert!(
            denied[0].message.contains("placement vision-pool keeps for pods asking for nvidia.com/gpu of team vision")
        );
        // Vision's own pod gets the pool, and may write its toleration.
        let (mutation, _) = in_namespace(&policies, &pod_in("vision", pool, gpus), "vision");
        assert!(mutation.allowed(), "{:?}", mutation.findings);
    }

    #[test]
    fn an_update_may_not_add_what_a_create_may_not_have() {
        let policies = shipped();
        let old = cpu_pod(json!([]));
        let mut new = old.clone();
        new["spec"]["tolerations"] = json!([toleration(GPU_TAINT)]);
        let out = update(&policies, &old, &new, "alice");
        let denied = denials(&out, "tenant/tolerations");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert_eq!(denied[0].path, "spec.tolerations[0]");
        // A pod that had it before (created before the policy said so) keeps its label edits.
        let mut relabelled = new.clone();
        relabelled["metadata"]["labels"] = json!({"tier": "web"});
        assert!(update(&policies, &new, &relabelled, "alice").allowed());
        // Adding an unrelated toleration next to it judges only the added one.
        let mut more = new.clone();
        more["spec"]["tolerations"].as_array_mut().unwrap().push(json!({"key": "spot", "operator": "Exists"}));
        assert!(update(&policies, &new, &more, "alice").allowed());
    }

    /// Where the cluster runs Kueue, Kueue lifts its gate and adds the tolerations of the flavor
    /// it admitted the pod to in one UPDATE: the admins' ResourceFlavors, let through; the
    /// same UPDATE by alice is not (nor may she lift Kueue's gate).
    #[test]
    fn kueue_may_add_its_flavors_tolerations_as_it_admits_a_pod() {
        const KUEUE: &str = "system:serviceaccount:kueue-system:kueue-controller-manager";
        let policies = with_spec("Cluster", "externalSchedulers: []", "externalSchedulers: [Kueue]");
        let mut old = cpu_pod(json!([]));
        old["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
        let mut new = old.clone();
        new["spec"]["schedulingGates"] = json!([]);
        new["spec"]["tolerations"] = json!([toleration(GPU_TAINT)]);
        assert!(update(&policies, &old, &new, KUEUE).allowed(), "{:?}", update(&policies, &old, &new, KUEUE).findings);
        let by_alice = update(&policies, &old, &new, "alice");
        assert_eq!(denials(&by_alice, "tenant/tolerations").len(), 1, "{:?}", by_alice.findings);
        assert_eq!(denials(&by_alice, "tenant/allot-gates").len(), 1, "{:?}", by_alice.findings);
        // Where Kueue is not listed, its identity is nobody special; nor is it on an UPDATE
        // that lifts no gate of its own.
        assert_eq!(denials(&update(&shipped(), &old, &new, KUEUE), "tenant/tolerations").len(), 1);
        let mut ungated = old.clone();
        ungated["spec"]["schedulingGates"] = json!([]);
        assert_eq!(denials(&update(&policies, &ungated, &new, KUEUE), "tenant/tolerations").len(), 1);
    }

    /// The cluster view's nodes, for `spec.nodeName`.
    struct Nodes;

    impl allot::admission::directory::GangDirectory for Nodes {
        fn peers(&self, _: &str, _: &str) -> Vec<allot::admission::directory::Peer> {
            Vec::new()
        }
        fn node(&self, name: &str) -> NodeLookup {
            let taint = |key: &str, value: Option<&str>, effect: &str| k8s_openapi::api::core::v1::Taint {
                key: key.into(),
                value: value.map(Into::into),
                effect: effect.into(),
                ..Default::default()
            };
            match name {
                "gpu-1" => NodeLookup::Taints(vec![taint("nvidia.com/gpu", Some("present"), "NoSchedule")]),
                "gpu-soft" => NodeLookup::Taints(vec![taint("nvidia.com/gpu", None, "PreferNoSchedule")]),
                "cpu-1" => NodeLookup::Taints(vec![taint("spot", Some("true"), "NoSchedule")]),
                _ => NodeLookup::Unknown,
            }
        }
    }

    fn bound(node: &str, namespace: &str, username: &str) -> Outcome {
        let policies = shipped();
        let mut pod = pod_in(namespace, json!([]), json!({"requests": {"cpu": "60"}}));
        pod["spec"]["nodeName"] = json!(node);
        let engine = Engine::new(&policies, &NoNamespaces).with_gangs(&Nodes);
        let request = Request { namespace, ..request(RequestOperation::Create, &pod, None, username) };
        engine.admit(&request).mutation
    }

    /// A node the view has listed no node by: the pod would wait for one of that name to join
    /// (the next GPU node, named predictably) and run there past its taints. Where nodes are
    /// not watched (`allot check`), nothing is said.
    #[test]
    fn a_cpu_pod_may_not_name_a_node_nobody_has_seen() {
        let out = bound("gpu-node-9", "vision", "alice");
        let denied = denials(&out, "tenant/tolerations");
        assert_eq!(denied.len(), 1, "{:?}", out.findings);
        assert_eq!(denied[0].path, "spec.nodeName");
        assert!(
            denied[0].message.starts_with("no node gpu-node-9 is known to Allot")
                && denied[0].message.contains("placement nvidia-gpu keeps"),
            "{}",
            denied[0].message
        );
        assert!(denials(&bound("gpu-node-9", "gpu-operator", "alice"), "tenant/tolerations").is_empty());
        let policies = shipped();
        let mut pod = pod_in("vision", json!([]), json!({"requests": {"cpu": "1"}}));
        pod["spec"]["nodeName"] = json!("gpu-node-9");
        let unwatched =
            Engine::new(&policies, &NoNamespaces).admit(&request(RequestOperation::Create, &pod, None, "alice"));
        assert!(denials(&unwatched.mutation, "tenant/tolerations").is_empty(), "{:?}", unwatched.mutation.findings);
    }

    /// The kubelet admits a pod bound by name past a NoSchedule taint: naming a GPU node is
    /// the toleration without writing it.
    #[test]
    fn a_cpu_pod_may_not_name_a_node_the_gpu_taint_guards() {
        for who in ["alice", DS_CONTROLLER] {
            let out = bound("gpu-1", "vision", who);
            let denied = denials(&out, "tenant/tolerations");
            assert_eq!(denied.len(), 1, "{who}: {:?}", out.findings);
            assert_eq!(denied[0].path, "spec.nodeName");
            assert!(
                denied[0].message.contains(
                    "node gpu-1 has the taint nvidia.com/gpu=present:NoSchedule, which placement nvidia-gpu keeps"
                ),
                "{}",
                denied[0].message
            );
        }
        // Other nodes, soft taints and the platform's namespaces.
        for (node, namespace) in [("cpu-1", "vision"), ("gpu-soft", "vision"), ("gpu-1", "gpu-operator")] {
            let out = bound(node, namespace, "alice");
            assert!(
                out.findings.iter().all(|f| f.rule != "tenant/tolerations"),
                "{node} {namespace}: {:?}",
                out.findings
            );
        }
    }

    /// `nvidia.com/gpu: 0` asks for nothing: no GPU placement from Allot, and no exemption as
    /// a pod of another accelerator (`amd.com/gpu: 0`) either.
    #[test]
    fn zero_of_an_accelerator_is_a_cpu_pod() {
        let policies = shipped();
        let zero = pod_in("vision", json!([]), json!({"limits": {"nvidia.com/gpu": 0}}));
        let (mutation, _) = create(&policies, &zero, "alice");
        let patch = serde_json::to_string(&mutation.patch).unwrap();
        assert!(!patch.contains("nvidia.com/gpu"), "no GPU toleration for zero GPUs: {patch}");
        let sneaky = pod_in("vision", json!([toleration(GPU_TAINT)]), json!({"limits": {"amd.com/gpu": "0"}}));
        let (mutation, _) = create(&policies, &sneaky, "alice");
        assert_eq!(denials(&mutation, "tenant/tolerations").len(), 1, "{:?}", mutation.findings);
    }

    /// Thousands of tolerations give one finding, and an UPDATE over them is judged in linear
    /// time (a list search per toleration was quadratic on the request path).
    #[test]
    fn many_tolerations_cost_one_finding_and_linear_time() {
        let policies = shipped();
        let many: Vec<Value> = (0..3_000).map(|_| toleration(GPU_TAINT)).collect();
        let (mutation, _) = create(&policies, &cpu_pod(json!(many)), "alice");
        let denied = denials(&mutation, "tenant/tolerations");
        assert_eq!(denied.len(), 1, "one finding per pod");
        assert!(denied[0].message.ends_with("(2999 more of its tolerations do the same)"), "{}", denied[0].message);

        let harmless: Vec<Value> = (0..30_000).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect();
        let old = cpu_pod(json!(harmless));
        let mut new = old.clone();
        new["spec"]["tolerations"].as_array_mut().unwrap().push(toleration(GPU_TAINT));
        let started = std::time::Instant::now();
        let out = update(&policies, &old, &new, "alice");
        assert_eq!(denials(&out, "tenant/tolerations")[0].path, "spec.tolerations[30000]");
        // (Quadratic was ~450 million comparisons: seconds even in a release build.)
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn workload_templates_are_denied_at_create_and_warned_at_update() {
        let policies = shipped();
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "i"}]}}}});
        let (_, validation) = create(&policies, &job, "alice");
        let denied = denials(&validation, "tenant/tolerations");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert_eq!(denied[0].path, "spec.template.spec.tolerations[0]");
        let out = update(&policies, &job, &job, "alice");
        assert!(out.allowed(), "{:?}", out.findings);
        assert!(out.findings.iter().any(|f| f.rule == "tenant/tolerations"
            && f.action == Action::Warn
            && f.message.ends_with("its pods will be denied when created")));
    }
}

/// A pod Allot holds keeps its placement in every replica, and Kubernetes bounds none of its
/// lists: a gang member (or a template whose pods will be) over `allot::model::gang::bounds` is denied
/// at admission, naming the field and the bound; a plain pod is not (the view keeps none of it).
mod placement_size {
    use super::*;

    fn tolerations(n: usize) -> Value {
        (0..n).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect()
    }

    fn pod(tolerations: Value, gang: bool) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "vision"},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "10m"}}}],
                "nodeSelector": {"nowhere": "x"}, "tolerations": tolerations}});
        if gang {
            pod["metadata"]["labels"] = json!({"allot.dev/gang-name": "ring"});
            pod["metadata"]["annotations"] = json!({"allot.dev/gang-size": "2"});
        }
        pod
    }

    #[test]
    fn a_gang_member_over_the_bound_is_denied_naming_the_field_and_the_bound() {
        let policies = shipped();
        let (mutation, validation) = create(&policies, &pod(tolerations(5_000), true), "alice");
        assert!(gated(&mutation), "a gang member: {:?}", mutation.patch);
        let denied = denials(&validation, "tenant/placement-size");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert_eq!(denied[0].path, "spec");
        assert!(
            denied[0].message.starts_with("spec.tolerations has 5000 tolerations; at most 64: Allot holds this pod"),
            "{}",
            denied[0].message
        );
        // At the bound it is admitted.
        let (_, validation) = create(&policies, &pod(tolerations(64), true), "alice");
        assert!(denials(&validation, "tenant/placement-size").is_empty(), "{:?}", validation.findings);
    }

    /// Kueue's pod-group name may come from an annotation, which nothing but the Pod's size
    /// bounds: a gang name longer than an object name is invalid gang metadata.
    #[test]
    fn a_gang_name_from_an_annotation_is_bounded() {
        let mut kueue = pod(json!([]), false);
        kueue["metadata"]["annotations"] = json!({"kueue.x-k8s.io/pod-group-name": "g".repeat(254),
            "kueue.x-k8s.io/pod-group-total-count": "2"});
        let (mutation, validation) = create(&shipped(), &kueue, "alice");
        let denied: Vec<&Finding> =
            denials(&mutation, "gang/metadata").into_iter().chain(denials(&validation, "gang/metadata")).collect();
        assert!(!denied.is_empty(), "{:?} {:?}", mutation.findings, validation.findings);
        assert!(denied[0].message.contains("is 254 bytes long; a gang name has at most 253"), "{}", denied[0].message);
        kueue["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-name"] = json!("g".repeat(253));
        let (mutation, validation) = create(&shipped(), &kueue, "alice");
        assert!(denials(&mutation, "gang/metadata").is_empty() && denials(&validation, "gang/metadata").is_empty());
    }

    #[test]
    fn a_plain_pod_is_not_held_to_it() {
        let (mutation, validation) = create(&shipped(), &pod(tolerations(5_000), false), "alice");
        assert!(!gated(&mutation));
        assert!(denials(&validation, "tenant/placement-size").is_empty(), "{:?}", validation.findings);
    }

    #[test]
    fn a_template_whose_pods_are_gang_members_is_denied_too() {
        let template = pod(tolerations(100), true);
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
            "spec": {"completions": 2, "parallelism": 2,
                "template": {"metadata": template["metadata"].clone(), "spec": template["spec"].clone()}}});
        let (_, validation) = create(&shipped(), &job, "alice");
        let denied = denials(&validation, "tenant/placement-size");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert_eq!(denied[0].path, "spec.template.spec");
        assert!(denied[0].message.starts_with("spec.template.spec.tolerations has 100 tolerations; at most 64"));
        // Affinity and selector are bounded alike.
        let mut affinity = pod(json!([]), true);
        let terms: Vec<Value> = (0..17)
            .map(|i| json!({"matchExpressions": [{"key": "k", "operator": "In", "values": [i.to_string()]}]}))
            .collect();
        affinity["spec"]["affinity"] =
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
        let (_, validation) = create(&shipped(), &affinity, "alice");
        let denied = denials(&validation, "tenant/placement-size");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert!(denied[0].message.contains("nodeSelectorTerms has 17 terms; at most 16"), "{}", denied[0].message);
    }
}

/// `tenant/resource-names`: Kubernetes bounds only the format of resource names; a pod asking
/// twenty thousand made-up ones never starts but cost every replica megabytes.
mod resource_names {
    use super::*;

    fn asking(n: usize) -> Value {
        let mut pod = gpu_pod(json!(1));
        let limits = pod["spec"]["containers"][0]["resources"]["limits"].as_object_mut().unwrap();
        for i in 1..n {
            limits.insert(format!("example.com/r{i}"), json!("1"));
        }
        pod
    }

    #[test]
    fn a_pod_or_template_asking_too_many_resources_is_denied() {
        let policies = shipped();
        let (_, validation) = create(&policies, &asking(64), "alice");
        assert!(denials(&validation, "tenant/resource-names").is_empty(), "{:?}", validation.findings);
        let (_, validation) = create(&policies, &asking(65), "alice");
        let denied = denials(&validation, "tenant/resource-names");
        assert_eq!(denied.len(), 1, "{:?}", validation.findings);
        assert!(denied[0].message.contains("asks 65 distinct resources"), "{}", denied[0].message);
        // Requests and limits count together; and a Job's template likewise.
        let mut split = asking(40);
        let c = &mut split["spec"]["containers"][0]["resources"];
        c["requests"] =
            json!((0..30).map(|i| (format!("example.com/q{i}"), json!("1"))).collect::<serde_json::Map<_, _>>());
        assert_eq!(denials(&create(&policies, &split, "alice").1, "tenant/resource-names").len(), 1);
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": asking(100)["spec"]["containers"]}}}});
        assert_eq!(denials(&create(&policies, &job, "alice").1, "tenant/resource-names").len(), 1);
    }
}

/// A team that lists no allowed priority classes may use any class but the system ones: at
/// `system-node-critical` (2,000,001,000, usable in any namespace since Kubernetes 1.17) its pods
/// would preempt every other team's on their way to a GPU.
mod system_priority {
    use super::*;

    fn at(class: Option<&str>) -> Value {
        let mut pod = gpu_pod(json!(1));
        if let Some(class) = class {
            pod["spec"]["priorityClassName"] = json!(class);
        }
        pod
    }

    fn open_vision() -> PolicySet {
        with_spec("Team", "    allowed: [low-priority, high-priority]\n", "")
    }

    #[test]
    fn a_team_without_a_list_may_not_use_a_system_class() {
        let policies = open_vision();
        for class in ["system-node-critical", "system-cluster-critical"] {
            let (_, validation) = create(&policies, &at(Some(class)), "alice");
            let denied = denials(&validation, "team/priority-class");
            assert_eq!(denied.len(), 1, "{class}: {:?}", validation.findings);
            assert_eq!(denied[0].path, "spec.priorityClassName");
            assert!(
                denied[0].message.contains(&format!("{class} is a system priority class"))
                    && denied[0].message.contains("team vision lists no allowed classes"),
                "{}",
                denied[0].message
            );
        }
        // Any other class, the default and the cluster's globalDefault (what asking nothing
        // gives) stay allowed; so does a template's system class in a Job, judged like a Pod's.
        for class in [Some("high-priority"), Some("anything-else"), Some("low-priority"), None] {
            let (_, validation) = create(&policies, &at(class), "alice");
            assert!(denials(&validation, "team/priority-class").is_empty(), "{class:?}: {:?}", validation.findings);
        }
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "vision"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "priorityClassName": "system-node-critical",
                "containers": at(None)["spec"]["containers"]}}}});
        let denied = create(&policies, &job, "alice").1;
        assert_eq!(denials(&denied, "team/priority-class").len(), 1, "{:?}", denied.findings);
        // A Job admitted before this check stays updatable (the garbage collector removing a
        // finalizer, Kueue toggling suspend): a warning; its pods are still denied.
        let mut edited = job.clone();
        edited["metadata"]["labels"] = json!({"tier": "batch"});
        let updated = update(&policies, &job, &edited, "alice");
        assert!(updated.allowed(), "{:?}", updated.findings);
        assert!(
            updated.findings.iter().any(|f| f.rule == "team/priority-class"
                && f.action == Action::Warn
                && f.message.ends_with("its pods will be denied when created")),
            "{:?}",
            updated.findings
        );
    }

    #[test]
    fn a_team_may_list_a_system_class_and_a_namespace_of_no_team_is_not_judged() {
        let listed = with_spec(
            "Team",
            "allowed: [low-priority, high-priority]",
            "allowed: [low-priority, high-priority, system-cluster-critical]",
        );
        let (_, validation) = create(&listed, &at(Some("system-cluster-critical")), "alice");
        assert!(denials(&validation, "team/priority-class").is_empty(), "{:?}", validation.findings);
        // Outside team namespaces (kube-system, the device plugins') Allot does not judge classes.
        let policies = open_vision();
        let mut pod = at(Some("system-node-critical"));
        pod["metadata"]["namespace"] = json!("kube-system");
        let engine = Engine::new(&policies, &NoNamespaces);
        let mut req = request(RequestOperation::Create, &pod, None, "system:serviceaccount:kube-system:x");
        req.namespace = "kube-system";
        let validation = engine.admit(&req).validation;
        assert!(denials(&validation, "team/priority-class").is_empty(), "{:?}", validation.findings);
    }

    #[test]
    fn a_system_default_without_a_list_is_refused_by_the_parser() {
        let mut sources = sources();
        let doc = sources.iter_mut().find(|s| s.text.contains("kind: Team")).expect("teams");
        doc.text = doc.text.replacen(
            "    default: low-priority             # pods that ask for no class get this one\n    allowed: [low-priority, high-priority]\n",
            "    default: system-node-critical\n",
            1,
        );
        let error = policy::compile(&sources).expect_err("a system default without a list").to_string();
        assert!(
            error.contains("spec.priority.default: \"system-node-critical\" is a system priority class"),
            "{error}"
        );
        // Nor may the Cluster's default or globalDefault be one.
        for field in ["globalDefault", "default"] {
            let old = format!("    {field}: low-priority\n");
            let mut sources = super::sources();
            let doc = sources.iter_mut().find(|s| s.text.contains("kind: Cluster")).expect("cluster");
            assert!(doc.text.contains(&old), "{old:?}");
            doc.text = doc.text.replacen(&old, &format!("    {field}: system-cluster-critical\n"), 1);
            let error = policy::compile(&sources).expect_err(field).to_string();
            assert!(
                error.contains(&format!(
                    "spec.priority.{field}: \"system-cluster-critical\" is a system priority class"
                )),
                "{error}"
            );
        }
    }
}
