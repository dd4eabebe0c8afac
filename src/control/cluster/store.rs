//! The cluster view's store: every [`PodRecord`] and [`NodeInfo`] the watches saw, indexed by
//! gang and with per-namespace usage kept up to date, behind one lock. Writers are the
//! controller's watches (and its local marks before the API confirms); readers are admission
//! (gang peers, deny-mode quota usage), the gang snapshot, the quota queue and the gauges.
//!
//! Everything here can be rebuilt from the API at any time: gates, gang labels and the
//! `allot.dev/gang-released` annotation are the only state, and they live on the Pods.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::records::{ClaimDevices, ClaimId, Key, NodeInfo, Owner, PodRecord, PodUid, key};
use crate::admission::directory::{GangDirectory, NodeLookup, Peer};
use crate::model::gang::membership::OwnerGang;
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;
use crate::model::tally::{GangTally, add_to};

/// The cluster view: written by the controller's watches, read by admission (as a
/// [`GangDirectory`] and for quota usage), the gang and quota passes and the gauges.
#[derive(Debug, Default)]
pub struct ClusterState {
    inner: RwLock<Inner>,
    /// Signalled on every change: wakes the controller's decision loop (one stored permit, so
    /// a burst of changes coalesces into one pass).
    wake: tokio::sync::Notify,
    /// Where the DRA claims of watched pods are resolved, so that usage counts their devices.
    claims: ClaimsCell,
    /// Signalled when records must be made again from a fresh list (what a record counts
    /// changed: the DRA DeviceClass mapping); the Pod watch restarts.
    relist: tokio::sync::Notify,
    /// Whether the policy set in force was compiled with the cluster's DeviceClasses:
    /// (expected, settled). The Pod watch waits for it (bounded), so that its first list
    /// records claims the way they count, rather than listing every pod twice.
    classes: (std::sync::atomic::AtomicBool, std::sync::atomic::AtomicBool),
}

/// The claim source of a [`ClusterState`], set once (`allot serve` sets its claim watches);
/// unset, claims count nothing in usage.
#[derive(Default)]
struct ClaimsCell(std::sync::OnceLock<Arc<dyn crate::model::dra::ClaimSource>>);

impl std::fmt::Debug for ClaimsCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "ClaimsCell(set)" } else { "ClaimsCell(unset)" })
    }
}

mod by_state;
pub use by_state::{RequestsByState, UsageState};
mod counts;
mod directory;
mod folds;
mod table;
pub use folds::{MemberShape, NamespaceFolds, PlainGroup, PlainShape, RECENT_SECS};
mod gates;
pub use gates::{Gate, GateGauge};
mod in_play;
pub use in_play::{preempted_on_node, queued, runs, takes_part};
mod marks;
mod owners;
mod relist;

use marks::Flight;

impl ClusterState {
    /// Resolves the DRA claims of pods recorded from now on in `claims` (the first call wins).
    pub fn set_claims(&self, claims: Arc<dyn crate::model::dra::ClaimSource>) {
        let _ = self.claims.0.set(claims);
    }

    /// The server reads the cluster's DeviceClasses: the Pod watch waits for them.
    pub fn expect_device_classes(&self) {
        self.classes.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The policy set in force is compiled with the cluster's DeviceClasses (or their wait ended).
    pub fn mark_device_classes_settled(&self) {
        self.classes.1.store(true, std::sync::atomic::Ordering::Release);
    }

    /// True while the Pod watch should wait for the DeviceClasses.
    pub fn device_classes_pending(&self) -> bool {
        self.classes.0.load(std::sync::atomic::Ordering::Acquire)
            && !self.classes.1.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Asks the Pod watch to list every pod again and make its record anew.
    pub fn request_relist(&self) {
        self.relist.notify_one();
    }

    /// Resolves when [`ClusterState::request_relist`] was called (one stored request).
    pub async fn relist_requested(&self) {
        self.relist.notified().await;
    }

    /// Where the DRA claims of watched pods are resolved.
    pub fn claims(&self) -> &dyn crate::model::dra::ClaimSource {
        self.claims.0.get().map_or(&crate::model::dra::NoClaims, |c| c.as_ref())
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// By namespace, then name ([`table`]).
    pods: table::PodTable,
    /// (namespace, gang) → member pod names
    gangs: HashMap<(Arc<str>, String), BTreeSet<Arc<str>>>,
    nodes: BTreeMap<String, NodeInfo>,
    /// What the owners of inferred gangs say about them. Only gangs with a pod in `gangs`: an
    /// entry goes with the gang's last pod.
    owner_gangs: HashMap<(String, String), OwnerGang>,
    /// When each owner an inferred gang's pods name was last asked for, and whether it could be
    /// read ([`ClusterState::owners_to_resolve`]); per owner, since a gang's pods may name
    /// several (each then waits out its own failures); pruned like `owner_gangs`.
    owner_lookups: HashMap<(String, String), HashMap<Owner, OwnerLookup>>,
    /// Requests of the non-finished pods of each namespace (gated and terminating ones
    /// included).
    ns_usage: HashMap<Arc<str>, ResourceList>,
    /// namespace → gang → what the gang counts against its team's quota, kept up to date on
    /// every change so that admission reads it in O(gangs of the team), never O(members).
    tallies: HashMap<Arc<str>, HashMap<String, GangTally>>,
    /// (namespace, shared ResourceClaim) → how many non-finished pods name it, and the devices
    /// it counted with the first of them: in `ns_usage` once while any pod names it.
    claim_holders: HashMap<ClaimId, (u32, ClaimDevices)>,
    /// (namespace, shared ResourceClaim name) → the non-finished pods naming it (and how many
    /// of their entries do): what a ResourceClaim CREATE asks, answered without walking the
    /// pods of the cluster (any user's dry-run claim create reaches it, on the request path).
    claim_pods: HashMap<ClaimId, BTreeMap<Arc<str>, u32>>,
    /// Requests per (namespace, state, resource), what `/metrics` reads ([`by_state`]).
    by_state: by_state::ByState,
    /// Pods the watch saw deleted recently, oldest first, and when: the deny-mode ledger drops
    /// a reservation whose pod came and went between two admissions (without this it would
    /// count a pod that no longer exists until the reservation expires).
    removed: std::collections::VecDeque<(std::time::Instant, Key)>,
    /// The same, by pod: the last time each was seen deleted.
    removed_at: HashMap<Key, std::time::Instant>,
    /// Conditions the controller has sent whose echo the watch has not delivered yet, `[gang,
    /// quota]`. A watch event of the pod meanwhile (the scheduler's `PodScheduled`, a label)
    /// carries the pod as it was before the write, also one the watch delivers after the
    /// write's response; without these the record would lose the mark and the next pass would
    /// tell the pod again (a duplicate write and Event). Only pods with such a write have an
    /// entry.
    conditions_in_flight: HashMap<Key, [Flight; 2]>,
    /// Pods the controller is deleting (their uid, and since when) whose deletion the watch has
    /// not shown yet: [`Inner::keep_deleting_mark`].
    deleting: HashMap<Key, (Option<PodUid>, std::time::Instant)>,
    /// Bumped on every change, so the loop knows when to look again.
    generation: u64,
    /// The last arrival assigned to a pod without an `allot.dev/arrival` stamp (nanoseconds):
    /// arrivals assigned here strictly increase, in the order the watch delivers pods.
    last_arrival: i64,
    /// The relist under way (or last done): records it has not seen are dropped when it ends.
    relist: u8,
    /// A relist is being applied: the view is partial (some pods not yet seen again, some new
    /// ones missing) until it ends, so nothing may decide on it.
    relisting: bool,
    /// A whole list of Pods, and one of Nodes, has been applied at least once: before that a
    /// gang looks incomplete and every node looks absent (a pass would explain "0 free").
    pods_listed: bool,
    nodes_listed: bool,
    /// Pods behind Allot's gang gate, and behind its quota gate: kept exact on every change, so
    /// the controller skips its passes over every pod when nothing waits (issue 18).
    gang_gated: usize,
    quota_gated: usize,
    /// Gang members Allot released that are not bound yet ([`PodRecord::awaits_bind`]): while
    /// there are any, the gang pass runs although nothing is gated (their reservations end and
    /// their start timeouts fire there).
    awaiting_bind: usize,
    /// Members of released gangs that a disruption is taking away ([`PodRecord::disrupts_gang`]).
    disrupted: usize,
    /// Bound gang members still told their gang did not start ([`PodRecord::told_late_and_bound`]).
    told_late: usize,
    /// What DRA devices the nodes offer (from ResourceSlices), if watched.
    devices: Devices,
}

/// What the view knows of the DRA devices nodes offer.
#[derive(Debug, Clone, Default)]
pub enum Devices {
    /// Not watched (no DeviceClass mapped, or the API does not serve them): claim devices are
    /// left out of the fit, as before slices were read.
    #[default]
    Unknown,
    /// Watched, first lists not in yet: no pass decides until they are (or the wait ends).
    Waiting,
    /// Counted from the ResourceSlices.
    Known(Arc<crate::model::dra::slices::NodeDevices>),
}

/// How many objects the view holds (memory grows with pods above all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tracked {
    pub pods: usize,
    pub gangs: usize,
    pub nodes: usize,
}

/// How long a deletion is remembered: as long as a reservation waits for its pod.
pub const REMOVED_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// How long after its write completed a condition stays marked without the watch echoing it.
/// The echo normally comes within milliseconds; past this the watch's view wins again (another
/// replica, leading after a fail-over, may have written the condition since).
pub const ECHO_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The first wait before the owner of an inferred gang that is not there or declares no usable
/// size is asked for again (a read that failed is not held against it: `gang::owners`); it
/// doubles each time, up to [`OWNER_RETRY_MOST`]. The pods naming an owner are a tenant's: bare pods labelled
/// `jobset.sigs.k8s.io/jobset-name: rN` name owners that never exist, and asking on every pass
/// cost one GET per such pod after every watch event.
pub const OWNER_RETRY_FIRST: std::time::Duration = std::time::Duration::from_secs(30);

/// The longest wait before an owner not there (or declaring no usable size) is asked for again.
pub const OWNER_RETRY_MOST: std::time::Duration = std::time::Duration::from_secs(600);

/// The last lookup of an inferred gang's owner.
#[derive(Debug, Clone, Copy)]
struct OwnerLookup {
    /// When it was asked for.
    at: std::time::Instant,
    /// It was not there or declared no usable size: not asked for again before the first, and
    /// the wait that led there (doubled at the next such lookup).
    retry: Option<(std::time::Instant, std::time::Duration)>,
}

impl Inner {
    /// The flight of `fingerprint` on the pod, unless a newer condition took its slot.
    fn flight(&mut self, key: &Key, quota: bool, fingerprint: u64) -> Option<&mut Flight> {
        let slot = &mut self.conditions_in_flight.get_mut(key)?[usize::from(quota)];
        (slot.fingerprint == fingerprint).then_some(slot)
    }

    /// Ends the flight of `fingerprint` (unless a newer condition is on its way).
    fn end_flight(&mut self, key: &Key, quota: bool, fingerprint: u64) {
        let Some(slot) = self.flight(key, quota, fingerprint) else { return };
        *slot = Flight::default();
        if self.conditions_in_flight.get(key) == Some(&[Flight::default(); 2]) {
            self.conditions_in_flight.remove(key);
        }
    }

    /// Now (nanoseconds since the epoch), but always after the last arrival assigned.
    fn next_arrival(&mut self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        self.last_arrival = now.max(self.last_arrival.saturating_add(1));
        self.last_arrival
    }

    fn usage_delta(&mut self, record: &PodRecord, sign: i128) {
        if record.finished {
            return;
        }
        self.by_state.delta(record, sign);
        if let Some(g) = &record.gang {
            let gangs = self.tallies.entry(record.namespace.clone()).or_default();
            let tally = gangs.entry(g.name.clone()).or_default();
            if sign > 0 {
                tally.add(record.request_pairs(), g.size, record.terminating);
            } else {
                tally.remove(record.request_pairs(), g.size, record.terminating);
            }
            if tally.members == 0 {
                gangs.remove(&g.name);
                if gangs.is_empty() {
                    self.tallies.remove(&record.namespace);
                }
            }
        }
        let usage = self.ns_usage.entry(record.namespace.clone()).or_default();
        // A name whose sum falls to zero goes: names a namespace asked once (and pods gone
        // since) would otherwise stay for good, one entry each.
        let add = |usage: &mut ResourceList, name: &str, q: &Quantity| {
            let sum = usage.get(name).map_or(0, |s| s.nanos()) + sign * q.nanos();
            if sum == 0 {
                usage.remove(name);
            } else {
                usage.insert(name.to_string(), Quantity::from_nanos(sum));
            }
        };
        for (name, q) in &record.requests {
            add(usage, name, q);
        }
        for claim in record.held_claims() {
            let by_name = (record.namespace.clone(), Arc::from(crate::model::dra::shared_claim_name(&claim.name)));
            let pods = self.claim_pods.entry(by_name.clone()).or_default();
            let entries = pods.entry(record.name.clone()).or_default();
            if sign > 0 {
                *entries += 1;
            } else {
                *entries = entries.saturating_sub(1);
                if *entries == 0 {
                    pods.remove(&record.name);
                }
            }
            if pods.is_empty() {
                self.claim_pods.remove(&by_name);
            }
            let id = (record.namespace.clone(), claim.name.clone());
            // A shared claim counts once: when its first holder comes, and until its last goes.
            let counted = if sign > 0 {
                let holders = self.claim_holders.entry(id).or_insert_with(|| (0, claim.devices.clone()));
                holders.0 += 1;
                (holders.0 == 1).then(|| holders.1.clone())
            } else {
                match self.claim_holders.get_mut(&id) {
                    Some(holders) if holders.0 > 1 => {
                        holders.0 -= 1;
                        None
                    }
                    Some(_) => self.claim_holders.remove(&id).map(|(_, devices)| devices),
                    None => None,
                }
            };
            for (name, q) in counted.iter().flatten() {
                add(usage, name, q);
            }
        }
    }

    fn count_gates(&mut self, record: &PodRecord, sign: isize) {
        if record.gate_index.is_some() {
            self.gang_gated = self.gang_gated.saturating_add_signed(sign);
        }
        if record.quota_gate_index.is_some() {
            self.quota_gated = self.quota_gated.saturating_add_signed(sign);
        }
        if record.awaits_bind() {
            self.awaiting_bind = self.awaiting_bind.saturating_add_signed(sign);
        }
        if record.told_late_and_bound() {
            self.told_late = self.told_late.saturating_add_signed(sign);
        }
        if record.disrupts_gang() {
            self.disrupted = self.disrupted.saturating_add_signed(sign);
        }
    }

    /// Takes a pod out of the indexes; returns its gang if it was the gang's last pod (see
    /// [`Inner::forget_owner_if_gone`]).
    fn unindex(&mut self, key: &Key) -> Option<(Arc<str>, String)> {
        let old = self.pods.remove(&key.0, &key.1)?;
        self.count_gates(&old, -1);
        self.usage_delta(&old, -1);
        let g = old.gang.as_ref()?;
        let gk = (old.namespace.clone(), g.name.clone());
        let set = self.gangs.get_mut(&gk)?;
        set.remove(&old.name);
        if !set.is_empty() {
            return None;
        }
        self.gangs.remove(&gk);
        Some(gk)
    }

    /// Forgets what was read of the owner of `gang` when the gang has no pod left: without
    /// this, every gang ever seen (one per label value a tenant wrote) stayed in memory.
    fn forget_owner_if_gone(&mut self, gang: Option<(Arc<str>, String)>) {
        let Some(gang) = gang.filter(|g| !self.gangs.contains_key(g)) else { return };
        let key = (gang.0.to_string(), gang.1);
        self.owner_gangs.remove(&key);
        self.owner_lookups.remove(&key);
    }

    /// Whether the gang has a pod the watch has seen.
    fn has_gang(&self, namespace: &str, gang: &str) -> bool {
        self.gangs.contains_key(&(Arc::from(namespace), gang.to_string()))
    }

    fn index(&mut self, mut record: PodRecord) {
        record.relist = self.relist;
        let key = record.key();
        if record.arrival.is_none() {
            // Kept across updates; a pod seen for the first time arrives now.
            // (Also whether it was stamped: an event older than the stamp may still arrive.)
            match self.pods.get_key(&key).and_then(|old| old.arrival.map(|a| (a, old.arrival_stamped))) {
                Some((seen, stamped)) => {
                    record.arrival = Some(seen);
                    record.arrival_stamped = stamped;
                }
                None => record.arrival = Some(self.next_arrival()),
            }
        }
        if let Some(old) = self.pods.get_key(&key) {
            if record.claims_unresolved {
                carry_claim_devices(old, &mut record);
            }
            match (&old.uid, &record.uid) {
                (Some(was), Some(is)) if was == is => raise_claim_devices(old, &mut record, true),
                // Another pod under the name (made again while the watch was away, no deletion
                // seen): what was written to its predecessor was not written to it.
                (Some(_), Some(_)) => {
                    self.conditions_in_flight.remove(&key);
                }
                _ => {}
            }
        }
        if let Some(flights) = self.conditions_in_flight.get_mut(&key) {
            let now = std::time::Instant::now();
            let [gang, quota] = flights;
            record.gang_condition = gang.follow(record.gang_condition, now);
            record.quota_condition = quota.follow(record.quota_condition, now);
            if *flights == [Flight::default(); 2] {
                self.conditions_in_flight.remove(&key);
            }
        }
        self.keep_deleting_mark(&key, &mut record);
        let emptied = self.unindex(&key);
        if let Some(g) = &record.gang {
            self.gangs.entry((record.namespace.clone(), g.name.clone())).or_default().insert(record.name.clone());
        }
        self.usage_delta(&record, 1);
        self.count_gates(&record, 1);
        self.pods.insert(Box::new(record));
        // A pod that moved to another gang may have been its old gang's last.
        self.forget_owner_if_gone(emptied);
    }
}

/// A pod's claims cannot change (`spec.resourceClaims` is immutable), so the claim devices an
/// earlier record of it counted stay counted when a later event cannot resolve them: its template
/// or claim deleted (a tenant freeing quota that way), or not in the claim cache yet. Shared
/// claims too.
fn carry_claim_devices(old: &PodRecord, record: &mut PodRecord) {
    // Keyed NAME/UID: a claim the new record resolves under its name (made again, another
    // UID) replaces the old one rather than counting beside it; one it no longer finds (named
    // alone, no devices) keeps the old one's devices.
    use crate::model::dra::shared_claim_name as name_of;
    let resolved = |name: &str| record.held_claims().iter().any(|n| !n.devices.is_empty() && name_of(&n.name) == name);
    let kept: Vec<_> =
        old.held_claims().iter().filter(|h| !h.devices.is_empty() && !resolved(name_of(&h.name))).cloned().collect();
    if !kept.is_empty() {
        let held = &mut record.shared_claims.get_or_insert_with(Default::default).0;
        held.retain(|n| !(n.devices.is_empty() && kept.iter().any(|k| name_of(&k.name) == name_of(&n.name))));
        held.extend(kept);
    }
    raise_claim_devices(old, record, false);
}

/// The claim devices (DeviceClass resources) `old` counted that `record` lacks are added to
/// it; with `up_to_old`, those it counts fewer of are raised to `old`'s count too.
///
/// Without `up_to_old`, for a record that cannot resolve its claims ([`carry_claim_devices`]).
/// With it, for a later record of the same pod (the same uid): its claims cannot change
/// (`spec.resourceClaims` is immutable), so what they counted never drops from one event to
/// the next, when a later one resolves them smaller (a template deleted and made again
/// smaller, a status naming another claim).
fn raise_claim_devices(old: &PodRecord, record: &mut PodRecord, up_to_old: bool) {
    let is_class = |name: &str| name.starts_with(crate::model::dra::CLASS_RESOURCE_PREFIX);
    let mut changed = false;
    let mut requests: Vec<(Arc<str>, Quantity)> = record.requests.to_vec();
    for (name, before) in old.requests.iter().filter(|(name, _)| is_class(name)) {
        match requests.iter_mut().find(|(n, _)| n == name) {
            Some((_, now)) if up_to_old && *now < *before => {
                *now = *before;
                changed = true;
            }
            Some(_) => {}
            None => {
                requests.push((name.clone(), *before));
                changed = true;
            }
        }
    }
    if changed {
        record.requests = requests.into_boxed_slice();
    }
}

/// What [`ClusterState::usage_where`] computes, over a state already read.
/// What the namespaces of each group use, and those of them that use anything, in one walk
/// (`group_of(ns)`: its group among `groups`, if any).
fn usage_by_group(
    inner: &Inner,
    group_of: &mut dyn FnMut(&str) -> Option<usize>,
    groups: usize,
) -> Vec<(ResourceList, Vec<String>)> {
    let mut out = vec![(ResourceList::new(), Vec::new()); groups];
    for (ns, usage) in &inner.ns_usage {
        let Some((total, namespaces)) = group_of(ns).and_then(|g| out.get_mut(g)) else { continue };
        if usage.values().any(|q| q.nanos() != 0) {
            namespaces.push(ns.to_string());
        }
        add_to(total, usage, 1);
        for tally in inner.tallies.get(ns).into_iter().flat_map(HashMap::values) {
            add_to(total, &tally.placeholders(), 1);
        }
    }
    for (_, namespaces) in &mut out {
        namespaces.sort();
    }
    out
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// One consistent read of the whole store, for the passes that walk it (the gang snapshot, the
/// quota queue, the gauges). Holds the read lock: keep it for one pass, not across awaits.
pub struct ClusterView<'a> {
    inner: RwLockReadGuard<'a, Inner>,
}

impl ClusterView<'_> {
    /// A relist is being applied: this view lacks pods it has not seen again yet.
    pub fn relisting(&self) -> bool {
        self.inner.relisting
    }

    /// Every Node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.inner.nodes.values()
    }

    /// Whether the watch has the Node `name`.
    pub fn has_node(&self, name: &str) -> bool {
        self.inner.nodes.contains_key(name)
    }

    /// The DRA devices each node offers, when the ResourceSlices have been read.
    pub fn node_devices(&self) -> Option<&crate::model::dra::slices::NodeDevices> {
        match &self.inner.devices {
            Devices::Known(d) => Some(d),
            _ => None,
        }
    }

    /// How many members of a gang are present (neither finished nor being deleted), whether a
    /// gate holds them or not.
    pub fn gang_present(&self, namespace: &str, gang: &str) -> u32 {
        self.inner.tallies.get(namespace).and_then(|g| g.get(gang)).map_or(0, |t| t.live)
    }

    /// What an inferred gang's owner declares, once resolved.
    pub fn owner_gang(&self, namespace: &str, gang: &str) -> Option<&OwnerGang> {
        self.inner.owner_gangs.get(&(namespace.to_string(), gang.to_string()))
    }
}

impl ClusterState {
    /// A consistent read of everything, for one pass.
    pub fn view(&self) -> ClusterView<'_> {
        ClusterView { inner: read(&self.inner) }
    }

    /// Adds or replaces a Pod.
    pub fn upsert_pod(&self, record: PodRecord) {
        let mut inner = write(&self.inner);
        inner.index(record);
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Sets the size of native PodGroup `pod_group`'s quota group (its `minCount`; `None` when
    /// the PodGroup is gone or `basic`) on the records of its members, so that its tally charges
    /// the whole group whether the PodGroup was seen before or after its pods.
    pub fn set_native_group_size(&self, namespace: &str, pod_group: &str, size: Option<u32>) {
        let mut inner = write(&self.inner);
        let group = format!("{}{pod_group}", crate::model::gang::membership::NATIVE_GROUP_PREFIX);
        let Some(members) = inner.gangs.get(&(Arc::from(namespace), group)) else { return };
        let keys: Vec<Key> = members.iter().map(|m| (Arc::from(namespace), m.clone())).collect();
        let mut changed = false;
        for key in keys {
            let resized =
                inner.pods.get_key(&key).and_then(|r| r.gang.as_ref()).is_some_and(|g| g.native && g.size != size);
            let Some(mut record) = inner.pods.remove(&key.0, &key.1).filter(|_| resized) else { continue };
            // In place (not `index`): only the tally changes; which relist saw it does not.
            inner.usage_delta(&record, -1);
            if let Some(gang) = record.gang.as_mut() {
                gang.size = size;
            }
            inner.usage_delta(&record, 1);
            inner.pods.insert(record);
            changed = true;
        }
        if changed {
            inner.generation += 1;
            self.wake.notify_one();
        }
    }

    /// Forgets a Pod.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        let mut inner = write(&self.inner);
        let key = key(namespace, name);
        let emptied = inner.unindex(&key);
        inner.forget_owner_if_gone(emptied);
        inner.conditions_in_flight.remove(&key);
        inner.deleting.remove(&key);
        let now = std::time::Instant::now();
        while let Some((at, old)) = inner.removed.front().cloned()
            && now.duration_since(at) >= REMOVED_TTL
        {
            inner.removed.pop_front();
            if inner.removed_at.get(&old) == Some(&at) {
                inner.removed_at.remove(&old);
            }
        }
        inner.removed.push_back((now, key.clone()));
        inner.removed_at.insert(key, now);
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Adds or replaces a Node.
    pub fn upsert_node(&self, node: NodeInfo) {
        let mut inner = write(&self.inner);
        inner.nodes.insert(node.name.clone(), node);
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Forgets a Node.
    pub fn remove_node(&self, name: &str) {
        let mut inner = write(&self.inner);
        inner.nodes.remove(name);
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Replaces every Node.
    pub fn replace_nodes(&self, nodes: Vec<NodeInfo>) {
        let mut inner = write(&self.inner);
        inner.nodes = nodes.into_iter().map(|n| (n.name.clone(), n)).collect();
        inner.nodes_listed = true;
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Sets what the view knows of the nodes' DRA devices.
    pub fn set_devices(&self, devices: Devices) {
        let mut inner = write(&self.inner);
        inner.devices = devices;
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// What the non-finished pods of the namespaces `include` accepts count against a quota,
    /// in resource terms: their requests (terminating pods included: they hold their devices
    /// until they are gone), plus, for each gang that has fewer members than it declares, its
    /// placeholders (see [`GangTally`]: a gang is charged whole). Also returns the namespaces
    /// that use anything. Costs O(namespaces + gangs), never O(members or declared sizes).
    pub fn usage_where(&self, include: &mut dyn FnMut(&str) -> bool) -> (ResourceList, Vec<String>) {
        usage_by_group(&read(&self.inner), &mut |ns| include(ns).then_some(0), 1).pop().unwrap_or_default()
    }

    /// [`ClusterState::usage_where`] for several groups of namespaces at once (`group_of`: a
    /// namespace's group among `groups`, if any: each team of a cohort), in one walk; and which
    /// of `claims` ((namespace, claim) pairs) the watch holds, read under the same lock: a usage
    /// without a claim and a "held" answer for it from a later state would count the claim
    /// nowhere.
    pub fn usage_by_group(
        &self,
        group_of: &mut dyn FnMut(&str) -> Option<usize>,
        groups: usize,
        claims: &[(&str, &str)],
    ) -> (Vec<(ResourceList, Vec<String>)>, Vec<bool>) {
        let inner = read(&self.inner);
        let usage = usage_by_group(&inner, group_of, groups);
        let held =
            claims.iter().map(|(ns, c)| inner.claim_holders.contains_key(&(Arc::from(*ns), Arc::from(*c)))).collect();
        (usage, held)
    }

    /// What one gang counts against its team's quota, from the watch (empty when no member
    /// is known).
    pub fn gang_tally(&self, namespace: &str, gang: &str) -> GangTally {
        read(&self.inner).tallies.get(namespace).and_then(|g| g.get(gang)).cloned().unwrap_or_default()
    }

    /// True when the watch has seen this pod, or seen a pod of this name deleted at or after
    /// `since` (a pod admitted at `since` that came and went before anyone looked).
    pub fn seen_since(&self, namespace: &str, name: &str, since: std::time::Instant) -> bool {
        let inner = read(&self.inner);
        let key = key(namespace, name);
        inner.pods.contains(namespace, name) || inner.removed_at.get(&key).is_some_and(|at| *at >= since)
    }

    /// True when the watch saw a pod of this name deleted at or after `since` (remembered for
    /// [`REMOVED_TTL`]).
    pub fn removed_since(&self, namespace: &str, name: &str, since: std::time::Instant) -> bool {
        read(&self.inner).removed_at.get(&key(namespace, name)).is_some_and(|at| *at >= since)
    }
}
