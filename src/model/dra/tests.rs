use super::*;
use proptest::prelude::*;
use serde_json::json;

fn classes() -> DeviceClasses {
    let mut map = BTreeMap::new();
    map.insert(
        "gpu.nvidia.com".to_string(),
        ClassWeight { counts_as: "nvidia.com/gpu".into(), numerator: 1, denominator: 1 },
    );
    map.insert(
        "mig.nvidia.com".to_string(),
        ClassWeight { counts_as: "nvidia.com/gpu".into(), numerator: 1, denominator: 7 },
    );
    DeviceClasses::new(map, DEFAULT_ALL_COUNT)
}

fn template(name: &str, requests: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": requests}}}
    })
}

fn claim(name: &str, requests: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": requests}}
    })
}

fn exactly(class: &str, count: u64) -> Value {
    json!({"name": "r", "exactly": {"deviceClassName": class, "allocationMode": "ExactCount", "count": count}})
}

fn pod(claims: Value) -> Value {
    json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"resourceClaims": claims, "containers": [{"name": "c"}]}})
}

fn source(objects: &[Value]) -> ClaimObjects {
    let mut s = ClaimObjects::new("not among the manifests");
    for o in objects {
        assert!(s.insert(o, "default"));
    }
    s
}

fn gpus(demand: &ClaimDemand) -> Option<Quantity> {
    demand.accelerators(&classes()).get("nvidia.com/gpu").copied()
}

#[test]
fn exact_count_counts_its_count_and_defaults_to_one() {
    let s = source(&[
        template("two", json!([exactly("gpu.nvidia.com", 2)])),
        template("one", json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}])),
    ]);
    let d = pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "two"}])), "ml", &classes(), &s);
    assert_eq!(d.own.get("gpu.nvidia.com"), Some(&2));
    assert_eq!(gpus(&d), Some(Quantity::from_units(2)));
    let d = pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "one"}])), "ml", &classes(), &s);
    assert_eq!(gpus(&d), Some(Quantity::from_units(1)));
}

#[test]
fn allocation_mode_all_counts_the_configured_number() {
    let all = template(
        "all",
        json!([{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]),
    );
    let s = source(&[all]);
    let p = pod(json!([{"name": "a", "resourceClaimTemplateName": "all"}]));
    assert_eq!(gpus(&pod_demand(&p, "ml", &classes(), &s)), Some(Quantity::from_units(32)));
    let mut eight = classes();
    eight.all_count = 8;
    assert_eq!(pod_demand(&p, "ml", &eight, &s).own.get("gpu.nvidia.com"), Some(&8));
}

#[test]
fn first_available_counts_its_largest_option() {
    let t = template(
        "fa",
        json!([{"name": "r", "firstAvailable": [
            {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1},
            {"name": "huge", "deviceClassName": "gpu.nvidia.com", "count": 1000},
            {"name": "slices", "deviceClassName": "mig.nvidia.com", "count": 7000},
            {"name": "unmapped", "deviceClassName": "nic.example.com", "count": 99999},
        ]}]),
    );
    let d =
        pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "fa"}])), "ml", &classes(), &source(&[t]));
    // 1000 whole GPUs and 7000 × 1/7 are equal: the first of the largest is kept.
    assert_eq!(d.per_class(), BTreeMap::from([("gpu.nvidia.com".to_string(), 1000)]));
    let t = template(
        "fa",
        json!([{"name": "r", "firstAvailable": [
            {"name": "a", "deviceClassName": "gpu.nvidia.com", "count": 1},
            {"name": "b", "deviceClassName": "mig.nvidia.com", "count": 8},
        ]}]),
    );
    let d =
        pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "fa"}])), "ml", &classes(), &source(&[t]));
    assert_eq!(d.per_class(), BTreeMap::from([("mig.nvidia.com".to_string(), 8)]));
}

#[test]
fn mig_weights_round_up_in_resource_terms_and_stay_exact_per_class() {
    let s = source(&[template("mig", json!([exactly("mig.nvidia.com", 3)]))]);
    let d = pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "mig"}])), "ml", &classes(), &s);
    // 3/7 GPU = 0.428571428571… → rounded up to the nano.
    assert_eq!(gpus(&d), Some(Quantity::from_nanos(428_571_429)));
    assert_eq!(d.quota_resources(), ResourceList::from([(class_resource("mig.nvidia.com"), Quantity::from_units(3))]));
}

#[test]
fn shared_claims_are_kept_apart_and_counted_once_per_claim() {
    let s = source(&[claim("shared", json!([exactly("gpu.nvidia.com", 4)]))]);
    let p = pod(json!([
        {"name": "a", "resourceClaimName": "shared"},
        {"name": "b", "resourceClaimName": "shared"},
    ]));
    let d = pod_demand(&p, "ml", &classes(), &s);
    assert!(d.own.is_empty());
    assert_eq!(d.shared.len(), 1);
    assert_eq!(gpus(&d), Some(Quantity::from_units(4)));
}

/// A claim named in `spec.resourceClaims` counts by its devices whatever its annotations: the
/// extended-resource annotation on it is a tenant's forgery (the scheduler's claim is never
/// named there). Before, it was skipped, and its 8 GPUs were free.
#[test]
fn a_claim_named_in_the_spec_counts_even_with_the_extended_resource_annotation() {
    for value in ["true", "", "yes"] {
        let mut c = claim("free", json!([exactly("gpu.nvidia.com", 8)]));
        c["metadata"]["annotations"] = json!({EXTENDED_RESOURCE_CLAIM_ANNOTATION: value});
        let p = pod(json!([{"name": "g", "resourceClaimName": "free"}]));
        let d = pod_demand(&p, "ml", &classes(), &source(&[c]));
        assert_eq!(gpus(&d), Some(Quantity::from_units(8)), "{value:?}: {d:?}");
        assert_eq!(d.shared.len(), 1, "charged once per claim, as any shared claim");
    }
}

/// The scheduler's own extended-resource claim is named in the pod's status, not its spec: it
/// stands for the containers' `nvidia.com/gpu` and is not counted again.
#[test]
fn the_schedulers_extended_resource_claim_is_not_counted_again() {
    let mut c = claim("p-extended-resources-x7k2q", json!([exactly("gpu.nvidia.com", 1)]));
    c["metadata"]["annotations"] = json!({EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"});
    let mut p = pod(json!([]));
    p["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}});
    p["status"] = json!({"extendedResourceClaimStatus": {
        "resourceClaimName": "p-extended-resources-x7k2q",
        "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]
    }});
    let d = pod_demand(&p, "ml", &classes(), &source(&[c]));
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn missing_claims_and_templates_are_reported_by_name_never_free() {
    let p = pod(json!([
        {"name": "a", "resourceClaimTemplateName": "gone"},
        {"name": "b", "resourceClaimName": "also-gone"},
    ]));
    let d = pod_demand(&p, "ml", &classes(), &NoClaims);
    assert_eq!(
        d.missing,
        vec![
            MissingClaim { kind: "ResourceClaimTemplate", name: "gone".into(), path: "spec.resourceClaims[0]".into() },
            MissingClaim { kind: "ResourceClaim", name: "also-gone".into(), path: "spec.resourceClaims[1]".into() },
        ]
    );
    assert!(!d.is_empty());
}

/// A pod whose template is gone holds the claim Kubernetes made from it: counted from that
/// claim, found through the pod's status and trusted only when the pod controls it.
#[test]
fn a_deleted_template_is_counted_from_the_claim_made_from_it() {
    let mut p = pod(json!([{"name": "gpus", "resourceClaimTemplateName": "gone"}]));
    p["metadata"]["uid"] = json!("pod-uid");
    p["status"] = json!({"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x7k2q"}]});
    let generated = |owner_uid: &str, controller: bool| {
        let mut c = claim("p-gpus-x7k2q", json!([exactly("gpu.nvidia.com", 3)]));
        c["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": owner_uid, "controller": controller}]);
        c
    };
    let d = pod_demand(&p, "ml", &classes(), &source(&[generated("pod-uid", true)]));
    assert_eq!((gpus(&d), d.missing.len()), (Some(Quantity::from_units(3)), 0), "{d:?}");
    // A claim another pod controls, or one merely pointing at this pod, is not this pod's.
    for (uid, controller) in [("other-pod", true), ("pod-uid", false)] {
        let d = pod_demand(&p, "ml", &classes(), &source(&[generated(uid, controller)]));
        assert_eq!((gpus(&d), d.missing.len()), (None, 1), "{uid} {controller}: {d:?}");
    }
    // At admission (CREATE) a pod has no status: a missing template is missing.
    let mut created = p.clone();
    created.as_object_mut().unwrap().remove("status");
    let d = pod_demand(&created, "ml", &classes(), &source(&[generated("pod-uid", true)]));
    assert_eq!(d.missing.len(), 1);
}

/// A template deleted and made again smaller under the same name changes nothing for a pod
/// whose claim was made from the old one: once its status names that claim, the claim (what it
/// holds, immutable) is counted, not the template. Before: 1 GPU counted while 8 were held.
#[test]
fn the_claim_made_from_a_template_counts_rather_than_the_template_made_again() {
    let mut p = pod(json!([{"name": "gpus", "resourceClaimTemplateName": "t"}]));
    p["metadata"]["uid"] = json!("pod-uid");
    p["status"] = json!({"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x7k2q"}]});
    let mut generated = claim("p-gpus-x7k2q", json!([exactly("gpu.nvidia.com", 8)]));
    generated["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true}]);
    let remade = template("t", json!([exactly("gpu.nvidia.com", 1)]));
    let s = source(&[remade, generated]);
    let d = pod_demand(&p, "ml", &classes(), &s);
    assert_eq!((gpus(&d), d.missing.len()), (Some(Quantity::from_units(8)), 0), "{d:?}");
    // Before the claim exists (not made yet, not in the cache yet): the template.
    let d = pod_demand(&p, "ml", &classes(), &source(&[template("t", json!([exactly("gpu.nvidia.com", 1)]))]));
    assert_eq!(gpus(&d), Some(Quantity::from_units(1)));
    // At CREATE the status is the requester's: not read, the template counts, whatever claim
    // that status names and however it is owned.
    let d = created_pod_demand(&p, "ml", &classes(), &s);
    assert_eq!(gpus(&d), Some(Quantity::from_units(1)));
    // A status naming a smaller claim of a tenant's own (one whose Role reaches pods/status,
    // the claim made with an ownerReference to the pod) does not stand for the template: the
    // larger of the two counts.
    let mut forged = claim("p-gpus-x7k2q", json!([exactly("gpu.nvidia.com", 1)]));
    forged["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": true}]);
    let d = pod_demand(&p, "ml", &classes(), &source(&[template("t", json!([exactly("gpu.nvidia.com", 8)])), forged]));
    assert_eq!(gpus(&d), Some(Quantity::from_units(8)), "{d:?}");
}

#[test]
fn claims_in_another_namespace_are_not_found() {
    let mut other = template("t", json!([exactly("gpu.nvidia.com", 1)]));
    other["metadata"]["namespace"] = json!("other-team");
    let d =
        pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "t"}])), "ml", &classes(), &source(&[other]));
    assert_eq!(d.missing.len(), 1);
    assert!(d.own.is_empty());
}

#[test]
fn unmapped_classes_count_nothing_and_no_mapping_looks_nothing_up() {
    let s = source(&[template("nic", json!([exactly("nic.example.com", 4)]))]);
    let p = pod(json!([{"name": "a", "resourceClaimTemplateName": "nic"}]));
    assert!(pod_demand(&p, "ml", &classes(), &s).is_empty());
    let missing = pod(json!([{"name": "a", "resourceClaimTemplateName": "gone"}]));
    assert!(pod_demand(&missing, "ml", &DeviceClasses::default(), &NoClaims).is_empty());
}

#[test]
fn only_resource_k8s_io_claims_and_templates_are_kept() {
    let mut s = ClaimObjects::new("x");
    assert!(!s.insert(&json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}), "ml"));
    assert!(!s.insert(&json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}), "ml"));
    assert!(s.insert(&claim("c", json!([])), "ml"));
    assert!(s.claim("ml", "c").is_some());
}

/// A claim and a template padded the way a tenant can (a huge annotation map, managedFields,
/// opaque driver parameters, long selectors, a status) are kept as counting reads them: a lookup
/// hands out a few hundred bytes, not the padding, and counts exactly what the whole object does.
#[test]
fn claims_and_templates_are_kept_as_read_without_what_the_tenant_padded() {
    let annotations: serde_json::Map<String, Value> =
        (0..2000).map(|i| (format!("example.com/pad-{i}"), Value::from("x".repeat(200)))).collect();
    let pad = |object: &mut Value, devices: &str| {
        object["metadata"]["annotations"] = Value::Object(annotations.clone());
        object["metadata"]["managedFields"] = json!([{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}]);
        let devices = object.pointer_mut(devices).expect("devices");
        devices["config"] =
            json!([{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"blob": "y".repeat(100_000)}}}]);
        devices["requests"][0]["exactly"]["selectors"] = json!([{"cel": {"expression": "z".repeat(10_000)}}]);
    };
    let mut c = claim("big", json!([exactly("gpu.nvidia.com", 3)]));
    c["metadata"]["uid"] = json!("uid-big");
    c["status"] = json!({"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]});
    pad(&mut c, "/spec/devices");
    let mut t = template("big-t", json!([exactly("gpu.nvidia.com", 2)]));
    pad(&mut t, "/spec/spec/devices");
    let whole = serde_json::to_string(&c).unwrap().len();
    assert!(whole > 500_000, "{whole}");

    let s = source(&[c.clone(), t.clone()]);
    for (read, object) in [(s.claim("ml", "big").unwrap(), &c), (s.template("ml", "big-t").unwrap(), &t)] {
        let text = serde_json::to_string(&*read).unwrap();
        assert!(text.len() < 300, "{} bytes: {text}", text.len());
        for padded in ["annotations", "managedFields", "config", "selectors", "pad-", "status"] {
            assert!(!text.contains(padded), "{padded} in {text}");
        }
        let spec = |o: &Value| o.get("spec").and_then(|s| s.get("spec").or(Some(s))).cloned();
        assert_eq!(claim_devices(spec(&read).as_ref(), &classes()), claim_devices(spec(object).as_ref(), &classes()));
    }
    let p =
        pod(json!([{"name": "a", "resourceClaimName": "big"}, {"name": "b", "resourceClaimTemplateName": "big-t"}]));
    let d = pod_demand(&p, "ml", &classes(), &s);
    assert_eq!(gpus(&d), Some(Quantity::from_units(5)));
    assert_eq!(d.shared.keys().collect::<Vec<_>>(), ["big/uid-big"], "the UID is read");
}

fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![
            Just("gpu.nvidia.com"),
            Just("mig.nvidia.com"),
            Just("All"),
            Just("ExactCount"),
            Just("t"),
            Just("c"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("devices".to_string()),
                    Just("requests".to_string()),
                    Just("exactly".to_string()),
                    Just("firstAvailable".to_string()),
                    Just("deviceClassName".to_string()),
                    Just("allocationMode".to_string()),
                    Just("count".to_string()),
                    Just("resourceClaimTemplateName".to_string()),
                    Just("resourceClaimName".to_string()),
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// Whatever a tenant writes in claims and pods, counting never panics.
    #[test]
    fn counting_hostile_claims_never_panics(spec in hostile_value(), claims in hostile_value()) {
        let s = source(&[
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"}, "spec": {"spec": spec.clone()}}),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c"}, "spec": spec}),
        ]);
        let d = pod_demand(&json!({"spec": {"resourceClaims": claims}}), "default", &classes(), &s);
        let _ = d.accelerators(&classes());
        let _ = d.quota_resources();
    }

    /// What a claim or template is kept as ([`claim_as_read`], [`template_as_read`]) counts
    /// exactly as the object it is made from, whatever a tenant writes in it.
    #[test]
    fn kept_as_read_counts_as_the_whole_object(
        requests in hostile_value(),
        uid in hostile_value(),
        owners in prop_oneof![
            hostile_value(),
            prop::collection::vec((hostile_value(), hostile_value(), hostile_value()), 0..4).prop_map(|owners| {
                owners.into_iter().map(|(uid, controller, kind)| json!({"uid": uid, "controller": controller, "kind": kind})).collect()
            }),
            Just(json!([{"uid": "t", "controller": true, "name": "p"}])),
        ],
    ) {
        let claim = json!({"metadata": {"uid": uid, "ownerReferences": owners}, "spec": {"devices": {"requests": requests.clone()}}});
        let read = claim_as_read(&claim);
        prop_assert_eq!(claim_devices(read.get("spec"), &classes()), claim_devices(claim.get("spec"), &classes()));
        prop_assert_eq!(shared_claim_key("c", &read), shared_claim_key("c", &claim));
        prop_assert_eq!(controlled_by(&read, "t"), controlled_by(&claim, "t"));
        let template = json!({"spec": {"spec": {"devices": {"requests": requests}}}});
        let read = template_as_read(&template);
        prop_assert_eq!(
            claim_devices(read.field(&["spec", "spec"]), &classes()),
            claim_devices(template.field(&["spec", "spec"]), &classes())
        );
    }

    /// A pod's claim count is the sum of its requests, each at least one device and never more
    /// than the largest count a request could get.
    #[test]
    fn exact_counts_add_up(counts in prop::collection::vec(1u64..10_000, 1..6), mig in any::<bool>()) {
        let class = if mig { "mig.nvidia.com" } else { "gpu.nvidia.com" };
        let requests: Vec<Value> = counts.iter().map(|n| exactly(class, *n)).collect();
        let s = source(&[template("t", Value::Array(requests))]);
        let d = pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "t"}])), "ml", &classes(), &s);
        let total: u64 = counts.iter().sum();
        prop_assert_eq!(d.per_class().get(class).copied(), Some(total));
        let nanos = gpus(&d).map_or(0, Quantity::nanos);
        let exact = i128::from(total) * 1_000_000_000 / if mig { 7 } else { 1 };
        prop_assert!(nanos >= exact && nanos <= exact + 1, "{} vs {}", nanos, exact);
    }

    /// A firstAvailable request counts as much as its largest option, whatever their order.
    #[test]
    fn first_available_takes_the_maximum(counts in prop::collection::vec(1u64..1000, 1..6)) {
        let options: Vec<Value> = counts.iter().map(|n| json!({"deviceClassName": "gpu.nvidia.com", "count": n})).collect();
        let s = source(&[template("t", json!([{"name": "r", "firstAvailable": options}]))]);
        let d = pod_demand(&pod(json!([{"name": "a", "resourceClaimTemplateName": "t"}])), "ml", &classes(), &s);
        prop_assert_eq!(d.per_class().get("gpu.nvidia.com").copied(), counts.iter().max().copied());
    }
}
