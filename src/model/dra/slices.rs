//! What DRA devices each node offers, from the cluster's ResourceSlices and DeviceClasses, so
//! that the gang controller's fit counts claim devices as it counts `nvidia.com/gpu` in node
//! allocatable: a gang whose GPUs come from claims is released only when its devices are there.
//!
//! Pure: typed objects in, counts out; the controller's watches feed it.
//!
//! Which devices count:
//! - a device belongs to a DeviceClass when every selector of the class evaluates to true for
//!   it, as the scheduler decides (CEL over `device.driver`, `device.attributes`,
//!   `device.capacity`, `device.allowMultipleAllocations`); a class without selectors takes
//!   every device; a selector that does not compile or errors on a device does not match it
//!   (the scheduler does not allocate it either), and the reason is reported once;
//! - only slices published for one node (`spec.nodeName`) count: devices reachable from
//!   several nodes (`nodeSelector`, `allNodes`, per-device node selection) are not node
//!   capacity the simulation can place a pod against;
//! - a pool whose slices have different generations is being republished: only its newest
//!   generation counts, as the scheduler reads it;
//! - a device tainted `NoSchedule` or `NoExecute` is left out: pods are not placed on it
//!   unless their claims tolerate the taint, which the simulation does not read, so it would
//!   rather wait than release a gang onto devices it may not get;
//! - partitionable devices (DRAPartitionableDevices: MIG profiles published as devices that
//!   consume a physical GPU's `sharedCounters`, which another slice of the same pool declares)
//!   count as many of a class as fit those counters together, not one each: a GPU published as
//!   seven 1g, three 2g and one 7g partitions offers seven, not eleven. Each class is fitted
//!   alone, smallest consumers first (a feasible set: never more than the node can hold of
//!   that class); a device consuming a counter set or counter its pool does not declare counts
//!   nothing (the scheduler cannot allocate it either).
//!
//! What a node offers is then added to its allocatable ([`add_node_devices`]): under the quota
//! name of each DeviceClass the Cluster policy maps (`deviceclass.allot.dev/<class>`, the name
//! a pod's claim devices are recorded under), and, for a DeviceClass with
//! `spec.extendedResourceName`, under that name on nodes whose own allocatable lacks it
//! (DRAExtendedResource: the scheduler serves `nvidia.com/gpu: 1` in a container's resources
//! from the class's devices where no device plugin offers it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceSlice};
use kube::core::cel::cel::objects::{Key, Map};
use kube::core::cel::cel::{Context, Value as CelValue};

use super::{ClassCounts, DeviceClasses, add_counts, class_resource};
use crate::model::expression::{self, ExpressionError, ForeignExpression};
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;

/// The DeviceClasses of the cluster, their selectors compiled.
pub struct DeviceClassMatcher {
    classes: Vec<CompiledClass>,
    root: Context<'static>,
}

impl std::fmt::Debug for DeviceClassMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.classes.iter().map(|c| &c.name)).finish()
    }
}

struct CompiledClass {
    name: String,
    /// `DeviceClass NAME`: what a panic of its selectors is counted and logged under.
    owner: String,
    extended_resource: Option<String>,
    /// The selectors; `Err` when one of them cannot be evaluated (the class then takes no
    /// device, as the scheduler allocates none from it).
    selectors: Result<Vec<ForeignExpression>, SelectorError>,
}

/// A DeviceClass selector that cannot be evaluated, named by class and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("DeviceClass {class}: spec.selectors[{index}].cel.expression: {source}")]
pub struct SelectorError {
    pub class: String,
    pub index: usize,
    pub source: ExpressionError,
}

impl SelectorError {
    /// A short, fixed label for logs and metrics: why the expression does not compile.
    pub fn metric_label(&self) -> &'static str {
        self.source.metric_label()
    }
}

impl DeviceClassMatcher {
    /// Compiles the selectors of `classes`.
    pub fn new(classes: &[DeviceClass]) -> DeviceClassMatcher {
        let compiled = classes
            .iter()
            .filter_map(|class| {
                let name = class.metadata.name.clone()?;
                let spec = class.spec.as_ref();
                let selectors = spec
                    .and_then(|s| s.selectors.as_ref())
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.cel.as_ref())
                    .enumerate()
                    .map(|(i, cel)| {
                        ForeignExpression::compile(&cel.expression).map_err(|source| SelectorError {
                            class: name.clone(),
                            index: i,
                            source,
                        })
                    })
                    .collect();
                let extended_resource = spec.and_then(|s| s.extended_resource_name.clone());
                Some(CompiledClass { extended_resource, owner: format!("DeviceClass {name}"), name, selectors })
            })
            .collect();
        DeviceClassMatcher { classes: compiled, root: expression::library_context() }
    }

    /// Selectors that cannot be evaluated, one line each.
    pub fn problems(&self) -> Vec<String> {
        self.classes.iter().filter_map(|c| c.selectors.as_ref().err().map(ToString::to_string)).collect()
    }

    /// The classes (by index) `device` of `driver` belongs to; evaluation errors go to `errors`.
    fn classes_of(&self, driver: &str, device: &Device, errors: &mut Vec<String>) -> Vec<usize> {
        let mut bound: Option<CelValue> = None;
        let mut matched = Vec::new();
        for (i, class) in self.classes.iter().enumerate() {
            let Ok(selectors) = &class.selectors else { continue };
            let mut all = true;
            for selector in selectors {
                let value = bound.get_or_insert_with(|| device_value(driver, device, &self.root));
                let mut scope = self.root.new_inner_scope();
                scope.add_variable_from_value("device", value.clone());
                match selector.eval_bool(&scope, &class.owner) {
                    Ok(true) => {}
                    Ok(false) => {
                        all = false;
                        break;
                    }
                    Err(e) => {
                        errors.push(format!("{} on device {driver}/{}: {e}", class.owner, device.name));
                        all = false;
                        break;
                    }
                }
            }
            if all {
                matched.push(i);
            }
        }
        matched
    }
}

/// What one ResourceSlice offers: on which node, in which pool, how many devices per class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDevices {
    /// `None`: not published for one node (see the module doc); counts nothing.
    pub node: Option<String>,
    pub driver: String,
    pub pool: String,
    pub generation: i64,
    /// DeviceClass name → devices of the slice that belong to it (those consuming no shared
    /// counters).
    pub per_class: ClassCounts,
    /// DeviceClass name → what each of its partitionable devices here consumes.
    pub partitions: BTreeMap<String, Vec<Consumption>>,
    /// The counter sets this slice declares (`sharedCounters`): set → counter → nano-units.
    pub counters: Counters,
    /// Selector errors met on this slice's devices (the device did not match that class).
    pub errors: Vec<String>,
}

/// Shared counters: counter set → counter → amount (nano-units).
pub type Counters = BTreeMap<String, BTreeMap<String, i128>>;

/// What one partitionable device consumes: (counter set, counter, nano-units).
pub type Consumption = Vec<(String, String, i128)>;

/// Counts the devices of `slice` per DeviceClass.
pub fn slice_devices(slice: &ResourceSlice, matcher: &DeviceClassMatcher) -> SliceDevices {
    let spec = &slice.spec;
    let node = spec.node_name.clone().filter(|n| !n.is_empty());
    let mut per_class = ClassCounts::new();
    let mut partitions: BTreeMap<String, Vec<Consumption>> = BTreeMap::new();
    let mut errors = Vec::new();
    if node.is_some() {
        for device in spec.devices.iter().flatten() {
            if is_tainted(device) || device.node_name.is_some() || device.node_selector.is_some() {
                continue;
            }
            let consumption = consumption_of(device);
            for i in matcher.classes_of(&spec.driver, device, &mut errors) {
                let class = matcher.classes[i].name.clone();
                match &consumption {
                    Some(c) => partitions.entry(class).or_default().push(c.clone()),
                    None => *per_class.entry(class).or_insert(0u64) += 1,
                }
            }
        }
    }
    let counters = spec
        .shared_counters
        .iter()
        .flatten()
        .map(|set| (set.name.clone(), set.counters.iter().map(|(k, c)| (k.clone(), nanos(&c.value.0))).collect()))
        .collect();
    errors.truncate(MAX_ERRORS_PER_SLICE);
    SliceDevices {
        node,
        driver: spec.driver.clone(),
        pool: spec.pool.name.clone(),
        generation: spec.pool.generation,
        per_class,
        partitions,
        counters,
        errors,
    }
}

/// What `device` consumes of its pool's shared counters, if anything.
fn consumption_of(device: &Device) -> Option<Consumption> {
    let consumed: Consumption = device
        .consumes_counters
        .iter()
        .flatten()
        .flat_map(|c| c.counters.iter().map(|(name, v)| (c.counter_set.clone(), name.clone(), nanos(&v.value.0))))
        .collect();
    (!consumed.is_empty()).then_some(consumed)
}

/// A counter's amount; one that does not parse is taken as more than any capacity.
fn nanos(quantity: &str) -> i128 {
    Quantity::parse(quantity).map_or(i128::MAX, |q| q.nanos())
}

/// How many of `devices` fit `capacity` together: smallest consumers first (by their largest
/// share of a counter), each taken while every counter it consumes has room. A feasible set,
/// so never more than the pool can hold; a consumer of an undeclared counter never fits.
pub fn fitting_partitions(devices: &[Consumption], capacity: &Counters) -> u64 {
    let share = |c: &Consumption| -> f64 {
        c.iter()
            .map(|(set, counter, n)| match capacity.get(set).and_then(|s| s.get(counter)) {
                Some(cap) if *cap > 0 => *n as f64 / *cap as f64,
                _ => f64::INFINITY,
            })
            .fold(0.0, f64::max)
    };
    let mut order: Vec<(f64, &Consumption)> = devices.iter().map(|c| (share(c), c)).collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut left = capacity.clone();
    let mut fitted = 0u64;
    for (_, consumption) in order {
        let fits = consumption.iter().all(|(set, counter, n)| {
            left.get(set).and_then(|s| s.get(counter)).is_some_and(|room| *n >= 0 && *room >= *n)
        });
        if !fits {
            continue;
        }
        for (set, counter, n) in consumption {
            if let Some(room) = left.get_mut(set).and_then(|s| s.get_mut(counter)) {
                *room -= n;
            }
        }
        fitted += 1;
    }
    fitted
}

/// Selector errors kept per slice (the first ones say enough).
const MAX_ERRORS_PER_SLICE: usize = 4;

fn is_tainted(device: &Device) -> bool {
    device.taints.iter().flatten().any(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
}

/// Devices per node and DeviceClass, and which classes stand for an extended resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDevices {
    /// node → DeviceClass → devices.
    pub per_node: BTreeMap<String, ClassCounts>,
    /// DeviceClass → its `spec.extendedResourceName`.
    pub extended: BTreeMap<String, String>,
}

impl NodeDevices {
    /// Adds up `slices` (each counted by [`slice_devices`]), keeping only the newest
    /// generation of each pool; `matcher` says which classes stand for extended resources.
    pub fn from_slices<'a>(
        slices: impl IntoIterator<Item = &'a SliceDevices> + Clone,
        matcher: &DeviceClassMatcher,
    ) -> NodeDevices {
        let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
        for s in slices.clone() {
            let g = newest.entry((s.driver.as_str(), s.pool.as_str())).or_insert(s.generation);
            *g = (*g).max(s.generation);
        }
        let current = |s: &&SliceDevices| newest.get(&(s.driver.as_str(), s.pool.as_str())) == Some(&s.generation);
        // The pool's shared counters (declared in slices of their own).
        let mut pool_counters: HashMap<(&str, &str), Counters> = HashMap::new();
        for s in slices.clone().into_iter().filter(current) {
            let counters = pool_counters.entry((s.driver.as_str(), s.pool.as_str())).or_default();
            for (set, values) in &s.counters {
                counters.entry(set.clone()).or_insert_with(|| values.clone());
            }
        }
        let mut per_node: BTreeMap<String, ClassCounts> = BTreeMap::new();
        // (node, driver, pool) → class → partitionable devices, fitted to the pool's counters.
        let mut partitions: BTreeMap<(&str, &str, &str), BTreeMap<&str, Vec<&Consumption>>> = BTreeMap::new();
        for s in slices.into_iter().filter(current) {
            let Some(node) = &s.node else { continue };
            add_counts(per_node.entry(node.clone()).or_default(), &s.per_class);
            for (class, devices) in &s.partitions {
                let slot = partitions.entry((node.as_str(), s.driver.as_str(), s.pool.as_str())).or_default();
                slot.entry(class.as_str()).or_default().extend(devices);
            }
        }
        let no_counters = Counters::new();
        for ((node, driver, pool), classes) in partitions {
            let capacity = pool_counters.get(&(driver, pool)).unwrap_or(&no_counters);
            let counts = per_node.entry(node.to_string()).or_default();
            for (class, devices) in classes {
                let devices: Vec<Consumption> = devices.into_iter().cloned().collect();
                let slot = counts.entry(class.to_string()).or_default();
                *slot = slot.saturating_add(fitting_partitions(&devices, capacity));
            }
        }
        let extended = matcher
            .classes
            .iter()
            .filter_map(|c| c.extended_resource.clone().filter(|e| !e.is_empty()).map(|e| (c.name.clone(), e)))
            .collect();
        NodeDevices { per_node, extended }
    }
}

/// Adds what node `node` offers through DRA to its `allocatable`: every class `mapping` names,
/// under its quota name (0 where the node has none of its devices, so a claim pod is known not
/// to fit there), and each extended-resource class's devices under that resource's name where
/// the node's own allocatable (a device plugin) does not offer it already.
pub fn add_node_devices(allocatable: &mut ResourceList, node: &str, devices: &NodeDevices, mapping: &DeviceClasses) {
    let counts = devices.per_node.get(node);
    let count = |class: &str| counts.and_then(|c| c.get(class)).copied().unwrap_or(0);
    let mut extended: BTreeMap<&str, u64> = BTreeMap::new();
    for (class, resource) in &devices.extended {
        if !allocatable.contains_key(resource) {
            let slot = extended.entry(resource.as_str()).or_insert(0);
            *slot = slot.saturating_add(count(class));
        }
    }
    for (resource, n) in extended {
        allocatable.insert(resource.to_string(), units(n));
    }
    for (class, _) in mapping.iter() {
        allocatable.insert(class_resource(class), units(count(class)));
    }
}

fn units(n: u64) -> Quantity {
    Quantity::from_units(i64::try_from(n).unwrap_or(i64::MAX))
}

/// `device` as DRA's CEL sees it: `driver`, `attributes` and `capacity` by domain (a name
/// without a domain is the driver's), `allowMultipleAllocations`.
fn device_value(driver: &str, device: &Device, root: &Context<'static>) -> CelValue {
    let mut attributes: HashMap<String, HashMap<Key, CelValue>> = HashMap::new();
    for (name, a) in device.attributes.iter().flatten() {
        let (domain, id) = qualified(driver, name);
        let value = if let Some(i) = a.int {
            CelValue::Int(i)
        } else if let Some(b) = a.bool {
            CelValue::Bool(b)
        } else if let Some(s) = &a.string {
            CelValue::String(Arc::new(s.clone()))
        } else if let Some(v) = &a.version {
            version_value(v, root)
        } else {
            continue;
        };
        attributes.entry(domain).or_default().insert(Key::String(Arc::new(id)), value);
    }
    let mut capacity: HashMap<String, HashMap<Key, CelValue>> = HashMap::new();
    for (name, c) in device.capacity.iter().flatten() {
        let Ok(q) = Quantity::parse(&c.value.0) else { continue };
        let (domain, id) = qualified(driver, name);
        capacity
            .entry(domain)
            .or_default()
            .insert(Key::String(Arc::new(id)), CelValue::Opaque(Arc::new(expression::quantity::CelQuantity(q))));
    }
    let by_domain = |m: HashMap<String, HashMap<Key, CelValue>>| {
        let map: HashMap<Key, CelValue> = m
            .into_iter()
            .map(|(domain, ids)| (Key::String(Arc::new(domain)), CelValue::Map(Map { map: Arc::new(ids) })))
            .collect();
        CelValue::Map(Map { map: Arc::new(map) })
    };
    let fields: HashMap<Key, CelValue> = [
        ("driver", CelValue::String(Arc::new(driver.to_string()))),
        ("attributes", by_domain(attributes)),
        ("capacity", by_domain(capacity)),
        ("allowMultipleAllocations", CelValue::Bool(device.allow_multiple_allocations.unwrap_or(false))),
    ]
    .into_iter()
    .map(|(k, v)| (Key::String(Arc::new(k.to_string())), v))
    .collect();
    CelValue::Map(Map { map: Arc::new(fields) })
}

/// `domain/id`, or `id` of the driver's own domain.
fn qualified(driver: &str, name: &str) -> (String, String) {
    match name.split_once('/') {
        Some((domain, id)) => (domain.to_string(), id.to_string()),
        None => (driver.to_string(), name.to_string()),
    }
}

/// A version attribute as a semantic version (kube-cel's `semver()`), so selectors can compare
/// it; a value that is not one stays a string.
fn version_value(version: &str, root: &Context<'static>) -> CelValue {
    static TO_SEMVER: LazyLock<Option<ForeignExpression>> =
        LazyLock::new(|| ForeignExpression::compile("semver(v)").ok());
    let text = CelValue::String(Arc::new(version.to_string()));
    let Some(program) = TO_SEMVER.as_ref() else { return text };
    let mut scope = root.new_inner_scope();
    scope.add_variable_from_value("v", text.clone());
    match program.value(&scope) {
        Some(v) => v,
        None => text,
    }
}

#[cfg(test)]
mod tests;
