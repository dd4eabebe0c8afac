use serde_json::json;

use super::*;
use crate::model::gang::membership::{COSCHEDULING_LABEL, KUEUE_GATE, KUEUE_MANAGED, VOLCANO_GROUP};

use crate::model::gang::membership::test_facts as facts;

#[test]
fn a_service_account_name_is_written_in_parts_an_overlay_can_replace() {
    use kube::core::cel::cel::{Context, Program, Value as CelValue};
    let cel = username_cel(DEFAULT_ALLOT_USERNAME, '\'');
    assert_eq!(cel, "'system:serviceaccount:' + 'allot-system' + ':' + 'allot'");
    let parts: Vec<&str> = cel.split('\'').collect();
    assert_eq!((parts[3], parts[7]), ("allot-system", "allot"), "deploy/identity replaces these parts");
    for (username, quote) in [
        (DEFAULT_ALLOT_USERNAME, '\''),
        ("system:serviceaccount:platform:gpu-allot", '"'),
        ("ad'm\"in\\", '\''),
        ("ad'm\"in", '"'),
    ] {
        let program = Program::compile(&username_cel(username, quote)).expect("compiles");
        let value = program.execute(&Context::default()).expect("evaluates");
        assert_eq!(value, CelValue::String(std::sync::Arc::new(username.to_string())), "{username}");
    }
    assert_eq!(service_account_of("system:serviceaccount:a:b"), Some(("a", "b")));
    assert_eq!(service_account_of("system:serviceaccount:a:b:c"), None);
    assert_eq!(service_account_of("admin"), None);
}

#[test]
fn pods_that_are_never_gated() {
    let tenant = Requester::User("alice");
    let none = TenantPolicy::default();
    let gate = |meta: Value, spec: Value, tenancy: &TenantPolicy, who| never_gate(&facts(meta, spec), tenancy, who);
    assert!(gate(json!({}), json!({"nodeName": "n1"}), &none, tenant).is_some());
    let mirror = json!({"annotations": {"kubernetes.io/config.mirror": "x"}});
    assert!(gate(mirror.clone(), json!({}), &none, Requester::User("system:node:n1")).is_some());
    assert!(gate(mirror, json!({}), &none, tenant).is_none(), "a tenant cannot claim to be a mirror pod");
    let daemon = json!({"ownerReferences": [{"kind": "DaemonSet", "name": "d"}]});
    let ds_controller = Requester::User("system:serviceaccount:kube-system:daemon-set-controller");
    assert!(gate(daemon.clone(), json!({}), &none, ds_controller).is_some());
    assert!(gate(daemon.clone(), json!({}), &none, tenant).is_none(), "an ownerReference alone is not trust");
    assert!(gate(daemon, json!({}), &none, Requester::Unknown).is_none());

    // Foreign managers count only where the cluster runs them.
    let kueue_gate = json!({"schedulingGates": [{"name": KUEUE_GATE}]});
    let kueue_label = json!({"labels": {KUEUE_MANAGED: "true"}});
    let volcano = json!({"schedulerName": "volcano"});
    let volcano_group = json!({"annotations": {VOLCANO_GROUP: "pg"}});
    let cosched = json!({"labels": {COSCHEDULING_LABEL: "pg"}});
    for (meta, spec) in [
        (json!({}), kueue_gate.clone()),
        (kueue_label.clone(), json!({})),
        (json!({}), volcano.clone()),
        (volcano_group.clone(), json!({})),
        (cosched.clone(), json!({})),
    ] {
        assert!(gate(meta.clone(), spec.clone(), &none, tenant).is_none(), "{meta} {spec}");
    }
    let all = TenantPolicy {
        external_schedulers: vec![
            ExternalScheduler::Kueue,
            ExternalScheduler::Volcano,
            ExternalScheduler::Coscheduling,
        ],
        ..TenantPolicy::default()
    };
    assert!(gate(json!({}), kueue_gate, &all, tenant).is_some());
    assert!(gate(json!({}), volcano, &all, tenant).is_some());
    let plugins = json!({"schedulerName": "scheduler-plugins-scheduler"});
    assert!(gate(cosched.clone(), plugins, &all, tenant).is_some());
    // The pod-group label on a pod the default scheduler places (without the plugin).
    assert!(gate(cosched.clone(), json!({}), &all, tenant).is_none());
    // Where the plugin runs in the default scheduler, the Cluster policy says so.
    let in_default = TenantPolicy { coscheduling_schedulers: vec!["default-scheduler".into()], ..all.clone() };
    assert!(gate(cosched, json!({}), &in_default, tenant).is_some());
    // Markers that hold nothing: Kueue's label without its gate (the pod would run at
    // once), Volcano's group on a pod the default scheduler places.
    assert!(gate(kueue_label, json!({}), &all, tenant).is_none());
    assert!(gate(volcano_group.clone(), json!({}), &all, tenant).is_none());
    assert!(gate(volcano_group, json!({"schedulerName": "default-scheduler"}), &all, tenant).is_none());
    assert!(gate(json!({}), json!({"schedulerName": "default-scheduler"}), &all, tenant).is_none());
}

/// Where the cluster runs Kueue, its gate exempts a pod from Allot's gates: only Kueue's
/// identities may lift it (a tenant lifting her own would have skipped every gate).
#[test]
fn only_kueue_lifts_kueues_gate_where_kueue_exempts() {
    let kueue = "system:serviceaccount:kueue-system:kueue-controller-manager";
    let allot = DEFAULT_ALLOT_USERNAME;
    let gated = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"schedulingGates": [{"name": KUEUE_GATE}], "containers": [{"name": "c", "image": "i"}]}});
    let mut lifted = gated.clone();
    lifted["spec"]["schedulingGates"] = json!([]);
    let with = |schedulers: &str| {
        crate::model::policy::compile(&[crate::model::policy::Source {
                name: "cluster.yaml".into(),
                text: format!("apiVersion: allot.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: c}}\nspec:\n  externalSchedulers: {schedulers}\n"),
            }])
            .expect("a Cluster policy")
    };
    let runs_kueue = with("[Kueue]");
    let denied = check_pod_update(&runs_kueue, &gated, &lifted, "alice", allot);
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(
        denied[0].message.contains(&format!("only Kueue ({kueue}) may lift it, not alice")),
        "{}",
        denied[0].message
    );
    assert!(check_pod_update(&runs_kueue, &gated, &lifted, kueue, allot).is_empty());
    assert!(check_pod_update(&runs_kueue, &gated, &lifted, allot, allot).is_empty());
    // Where Kueue is not listed its gate exempts nothing: hers to lift.
    assert!(check_pod_update(&with("[]"), &gated, &lifted, "alice", allot).is_empty());
    // Other edits of a Kueue-gated pod pass.
    let mut labelled = gated.clone();
    labelled["metadata"]["labels"] = json!({"tier": "web"});
    assert!(check_pod_update(&runs_kueue, &gated, &labelled, "alice", allot).is_empty());
}
