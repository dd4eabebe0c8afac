use super::*;
use crate::model::dra::ClassWeight;
use serde_json::{Value, json};

fn class(name: &str, selectors: &[&str]) -> DeviceClass {
    let selectors: Vec<Value> = selectors.iter().map(|s| json!({"cel": {"expression": s}})).collect();
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"selectors": selectors}})).unwrap()
}

fn extended_class(name: &str, selector: &str, resource: &str) -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": selector}}], "extendedResourceName": resource}
    }))
    .unwrap()
}

fn slice(driver: &str, node: Option<&str>, pool: &str, generation: i64, devices: Value) -> ResourceSlice {
    let mut spec = json!({
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
        "devices": devices
    });
    match node {
        Some(n) => spec["nodeName"] = json!(n),
        None => spec["allNodes"] = json!(true),
    }
    serde_json::from_value(json!({"metadata": {"name": format!("{pool}-{generation}")}, "spec": spec})).unwrap()
}

fn gpu(name: &str, kind: &str) -> Value {
    json!({
        "name": name,
        "attributes": {
            "type": {"string": kind},
            "index": {"int": 0},
            "driverVersion": {"version": "550.54.15"},
            "example.com/healthy": {"bool": true}
        },
        "capacity": {"memory": {"value": "80Gi"}}
    })
}

/// The two classes NVIDIA's driver publishes, told apart by the `type` attribute.
fn nvidia() -> DeviceClassMatcher {
    DeviceClassMatcher::new(&[
        class(
            "gpu.nvidia.com",
            &["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"],
        ),
        class(
            "mig.nvidia.com",
            &["device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"],
        ),
    ])
}

fn counts(s: &SliceDevices) -> Vec<(&str, u64)> {
    s.per_class.iter().map(|(c, n)| (c.as_str(), *n)).collect()
}

#[test]
fn devices_are_counted_per_class_by_the_class_selectors() {
    let s = slice(
        "gpu.nvidia.com",
        Some("node-a"),
        "node-a",
        1,
        json!([gpu("gpu-0", "gpu"), gpu("gpu-1", "gpu"), gpu("mig-0", "mig"), gpu("other", "nic")]),
    );
    let counted = slice_devices(&s, &nvidia());
    assert_eq!(counts(&counted), [("gpu.nvidia.com", 2), ("mig.nvidia.com", 1)]);
    assert_eq!(counted.node.as_deref(), Some("node-a"));
    assert!(counted.errors.is_empty(), "{:?}", counted.errors);
}

#[test]
fn selectors_read_attributes_capacity_and_versions_as_the_scheduler_binds_them() {
    let m = DeviceClassMatcher::new(&[
        class("big", &["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0"]),
        class("small", &["device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('40Gi'))"]),
        class("recent", &["device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('500.0.0'))"]),
        class("healthy", &["device.attributes['example.com'].healthy"]),
        class("everything", &[]),
        class("both", &["device.driver == 'gpu.nvidia.com'", "device.attributes['gpu.nvidia.com'].index == 0"]),
        class("one-fails", &["device.driver == 'gpu.nvidia.com'", "device.attributes['gpu.nvidia.com'].index == 1"]),
    ]);
    let counted = slice_devices(&slice("gpu.nvidia.com", Some("n"), "n", 1, json!([gpu("gpu-0", "gpu")])), &m);
    assert_eq!(counts(&counted), [("big", 1), ("both", 1), ("everything", 1), ("healthy", 1), ("recent", 1)]);
}

#[test]
fn a_selector_that_errors_or_does_not_compile_matches_nothing_and_says_why() {
    let m = DeviceClassMatcher::new(&[
        class("missing-attribute", &["device.attributes['gpu.nvidia.com'].nonexistent == 'x'"]),
        class("not-a-bool", &["device.driver"]),
        class("broken", &["device.driver =="]),
    ]);
    assert_eq!(m.problems().len(), 1, "{:?}", m.problems());
    assert!(m.problems()[0].contains("DeviceClass broken: spec.selectors[0].cel.expression: CEL syntax error"));
    let counted = slice_devices(&slice("gpu.nvidia.com", Some("n"), "n", 1, json!([gpu("gpu-0", "gpu")])), &m);
    assert!(counted.per_class.is_empty(), "{:?}", counted.per_class);
    assert_eq!(counted.errors.len(), 2, "{:?}", counted.errors);
    assert!(counted.errors.iter().any(|e| e.contains("DeviceClass not-a-bool on device gpu.nvidia.com/gpu-0")));
}

#[test]
fn a_hostile_selector_cannot_crash_the_count() {
    // Nesting past the parser's limit is refused before cel's parser sees it.
    let deep = format!("{}true{}", "(".repeat(200), ")".repeat(200));
    let m = DeviceClassMatcher::new(&[class("deep", &[&deep]), class("twice-not", &["!!true"])]);
    assert_eq!(m.problems().len(), 2, "{:?}", m.problems());
    let counted = slice_devices(&slice("d", Some("n"), "n", 1, json!([gpu("gpu-0", "gpu")])), &m);
    assert!(counted.per_class.is_empty());
}

#[test]
fn only_devices_of_one_node_untainted_count() {
    let m = DeviceClassMatcher::new(&[class("any", &[])]);
    let shared = slice_devices(&slice("d", None, "fabric", 1, json!([gpu("gpu-0", "gpu")])), &m);
    assert_eq!((shared.node.as_deref(), shared.per_class.len()), (None, 0), "allNodes devices are no node's capacity");
    let tainted = json!([
        gpu("ok", "gpu"),
        {"name": "draining", "taints": [{"key": "maintenance", "effect": "NoSchedule"}]},
        {"name": "evicting", "taints": [{"key": "broken", "effect": "NoExecute"}]}
    ]);
    let counted = slice_devices(&slice("d", Some("n"), "n", 1, tainted), &m);
    assert_eq!(counts(&counted), [("any", 1)]);
}

#[test]
fn only_the_newest_generation_of_a_pool_counts() {
    let m = DeviceClassMatcher::new(&[class("any", &[])]);
    let old = slice_devices(&slice("d", Some("n"), "pool", 1, json!([gpu("a", "gpu"), gpu("b", "gpu")])), &m);
    let new = slice_devices(&slice("d", Some("n"), "pool", 2, json!([gpu("a", "gpu")])), &m);
    let other = slice_devices(&slice("d", Some("m"), "other", 7, json!([gpu("a", "gpu")])), &m);
    let devices = NodeDevices::from_slices([&old, &new, &other], &m);
    assert_eq!(devices.per_node["n"]["any"], 1, "generation 1 is being replaced");
    assert_eq!(devices.per_node["m"]["any"], 1);
}

fn mapping(classes: &[&str]) -> DeviceClasses {
    DeviceClasses::new(
        classes
            .iter()
            .map(|c| (c.to_string(), ClassWeight { counts_as: "nvidia.com/gpu".into(), numerator: 1, denominator: 1 }))
            .collect(),
        32,
    )
}

#[test]
fn node_allocatable_gets_every_mapped_class_and_extended_resources_a_device_plugin_does_not_offer() {
    let m = DeviceClassMatcher::new(&[
        class("gpu.nvidia.com", &["device.attributes['gpu.nvidia.com'].type == 'gpu'"]),
        extended_class("gpu-extended", "device.attributes['gpu.nvidia.com'].type == 'gpu'", "nvidia.com/gpu"),
    ]);
    let a = slice_devices(&slice("gpu.nvidia.com", Some("a"), "a", 1, json!([gpu("0", "gpu"), gpu("1", "gpu")])), &m);
    let devices = NodeDevices::from_slices([&a], &m);
    let map = mapping(&["gpu.nvidia.com", "mig.nvidia.com"]);

    let mut dra_node = ResourceList::from([("cpu".to_string(), Quantity::from_units(8))]);
    add_node_devices(&mut dra_node, "a", &devices, &map);
    assert_eq!(dra_node[&class_resource("gpu.nvidia.com")], Quantity::from_units(2));
    assert_eq!(dra_node[&class_resource("mig.nvidia.com")], Quantity::ZERO, "mapped, none here: known to be 0");
    assert_eq!(dra_node["nvidia.com/gpu"], Quantity::from_units(2), "DRAExtendedResource: served from the class");

    // A device-plugin node keeps its own count of the extended resource.
    let mut plugin_node = ResourceList::from([("nvidia.com/gpu".to_string(), Quantity::from_units(8))]);
    add_node_devices(&mut plugin_node, "a", &devices, &map);
    assert_eq!(plugin_node["nvidia.com/gpu"], Quantity::from_units(8));

    // A node without slices offers 0 of every mapped class.
    let mut empty = ResourceList::new();
    add_node_devices(&mut empty, "z", &devices, &map);
    assert_eq!(empty[&class_resource("gpu.nvidia.com")], Quantity::ZERO);
    assert_eq!(empty["nvidia.com/gpu"], Quantity::ZERO);
}

/// A MIG partition of `compute` of a GPU's 7 compute slices and `memory` GiB, consuming the
/// counter set `set` (DRAPartitionableDevices).
fn partition(name: &str, set: &str, compute: u32, memory: u32) -> Value {
    let mut device = gpu(name, "mig");
    device["consumesCounters"] = json!([{"counterSet": set, "counters": {
        "compute": {"value": compute.to_string()}, "memory": {"value": format!("{memory}Gi")}}}]);
    device
}

/// The slice of a pool that declares its GPUs' shared counters (devices are in other slices).
fn counter_slice(node: &str, pool: &str, sets: &[&str]) -> ResourceSlice {
    let sets: Vec<Value> = sets
        .iter()
        .map(|s| json!({"name": s, "counters": {"compute": {"value": "7"}, "memory": {"value": "80Gi"}}}))
        .collect();
    let mut slice = slice("gpu.nvidia.com", Some(node), pool, 1, json!([]));
    slice.spec.devices = None;
    slice.spec.shared_counters = Some(serde_json::from_value(Value::Array(sets)).unwrap());
    slice.metadata.name = Some(format!("{pool}-counters"));
    slice
}

/// A GPU published as every MIG profile it can be cut into (seven 1g, three 2g, two 3g, one 7g)
/// offers seven MIG devices, not thirteen: the partitions share the GPU's counters. Two GPUs
/// offer fourteen; a partition whose counter set the pool does not declare offers nothing.
#[test]
fn partitionable_devices_count_as_many_as_fit_their_shared_counters() {
    let m = nvidia();
    let mut devices = Vec::new();
    for gpu in ["gpu-0", "gpu-1"] {
        for i in 0..7 {
            devices.push(partition(&format!("{gpu}-1g-{i}"), gpu, 1, 10));
        }
        for i in 0..3 {
            devices.push(partition(&format!("{gpu}-2g-{i}"), gpu, 2, 20));
        }
        for i in 0..2 {
            devices.push(partition(&format!("{gpu}-3g-{i}"), gpu, 3, 40));
        }
        devices.push(partition(&format!("{gpu}-7g"), gpu, 7, 80));
    }
    devices.push(partition("stray-1g", "gpu-9", 1, 10));
    let parts = slice_devices(&slice("gpu.nvidia.com", Some("node-a"), "node-a", 1, Value::Array(devices)), &m);
    assert!(parts.per_class.is_empty(), "partitions are not counted one each: {:?}", parts.per_class);
    let counters = slice_devices(&counter_slice("node-a", "node-a", &["gpu-0", "gpu-1"]), &m);
    assert_eq!(counters.counters.len(), 2);

    let devices = NodeDevices::from_slices([&parts, &counters], &m);
    assert_eq!(devices.per_node["node-a"].get("mig.nvidia.com"), Some(&14), "{devices:?}");
    // Without the counters' slice nothing is known to fit.
    let alone = NodeDevices::from_slices([&parts], &m);
    assert_eq!(alone.per_node["node-a"].get("mig.nvidia.com"), Some(&0));
}

proptest::proptest! {
    /// Whatever the partitions, the count is a set that fits: never more devices than the
    /// counters hold of the smallest one, and every chosen set within capacity.
    #[test]
    fn fitted_partitions_never_exceed_the_counters(
        sizes in proptest::collection::vec((0i128..9, 0i128..90), 0..40),
        compute in 0i128..20,
        memory in 0i128..200,
    ) {
        let capacity: Counters = [("g".to_string(), [("c".to_string(), compute), ("m".to_string(), memory)].into())].into();
        let devices: Vec<Consumption> = sizes
            .iter()
            .map(|(c, m)| vec![("g".to_string(), "c".to_string(), *c), ("g".to_string(), "m".to_string(), *m)])
            .collect();
        let n = fitting_partitions(&devices, &capacity) as usize;
        proptest::prop_assert!(n <= devices.len());
        // The n smallest by compute alone must fit compute (a necessary condition).
        let mut by_compute: Vec<i128> = sizes.iter().map(|(c, _)| *c).collect();
        by_compute.sort();
        proptest::prop_assert!(by_compute.iter().take(n).sum::<i128>() <= compute);
        let mut by_memory: Vec<i128> = sizes.iter().map(|(_, m)| *m).collect();
        by_memory.sort();
        proptest::prop_assert!(by_memory.iter().take(n).sum::<i128>() <= memory);
    }
}
