//! The cluster view's store: every [`PodRecord`] and [`NodeInfo`] the watches saw, indexed by
//! gang and with per-namespace usage kept up to date, behind one lock. Writers are the
//! controller's watches (and its local marks before the API confirms); readers are admission
//! (gang peers, deny-mode quota usage), the gang snapshot, the quota queue and the gauges.
//!
//! Everything here can be rebuilt from the API at any time: gates, gang labels and the
//! `allot.dev/gang-released` annotation are the only state, and they live on the Pods.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use super::records::{ClaimDevices, ClaimId, Key, NodeInfo, Owner, PodRecord, key};
use super::tally::{GangTally, add_to};
use crate::gang::directory::{GangDirectory, NodeLookup, Peer};
use crate::gang::membership::OwnerGang;
use crate::quantity::Quantity;
use crate::resources::ResourceList;

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
struct ClaimsCell(std::sync::OnceLock<Arc<dyn crate::dra::ClaimSource>>);

impl std::fmt::Debug for ClaimsCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() { "ClaimsCell(set)" } else { "ClaimsCell(unset)" })
    }
}

impl ClusterState {
    /// Resolves the DRA claims of pods recorded from now on in `claims` (the first call wins).
    pub fn set_claims(&self, claims: Arc<dyn crate::dra::ClaimSource>) {
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
    pub fn claims(&self) -> &dyn crate::dra::ClaimSource {
        self.claims.0.get().map_or(&crate::dra::NoClaims, |c| c.as_ref())
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Boxed: the table then holds 40 bytes a pod, so growing it (doubling, with the old table
    /// alive while it moves) costs little next to the records.
    pods: HashMap<Key, Box<PodRecord>>,
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
    Known(Arc<crate::dra::slices::NodeDevices>),
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

/// One condition the controller wrote (or is writing) on a pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Flight {
    /// Its fingerprint ([`super::records::condition_fingerprint`]); 0: none.
    fingerprint: u64,
    /// When its write completed; `None` while under way.
    landed: Option<std::time::Instant>,
}

impl Flight {
    /// What the record of a watch event carrying condition fingerprint `seen` holds: the
    /// flight's fingerprint while it flies; the watch's once the event echoes the write, or the
    /// write landed more than [`ECHO_WAIT`] ago (the flight ends then).
    fn follow(&mut self, seen: u64, now: std::time::Instant) -> u64 {
        let echoed = seen == self.fingerprint;
        let waited_out = self.landed.is_some_and(|at| now.saturating_duration_since(at) >= ECHO_WAIT);
        if self.fingerprint == 0 || echoed || waited_out {
            *self = Flight::default();
            seen
        } else {
            self.fingerprint
        }
    }
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
            let by_name = (record.namespace.clone(), Arc::from(crate::dra::shared_claim_name(&claim.name)));
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
        let old = self.pods.remove(key)?;
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
            match self.pods.get(&key).and_then(|old| old.arrival.map(|a| (a, old.arrival_stamped))) {
                Some((seen, stamped)) => {
                    record.arrival = Some(seen);
                    record.arrival_stamped = stamped;
                }
                None => record.arrival = Some(self.next_arrival()),
            }
        }
        if let Some(old) = self.pods.get(&key) {
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
        let emptied = self.unindex(&key);
        if let Some(g) = &record.gang {
            self.gangs.entry((record.namespace.clone(), g.name.clone())).or_default().insert(record.name.clone());
        }
        self.usage_delta(&record, 1);
        self.count_gates(&record, 1);
        self.pods.insert(key, Box::new(record));
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
    use crate::dra::shared_claim_name as name_of;
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
    let is_class = |name: &str| name.starts_with(crate::dra::CLASS_RESOURCE_PREFIX);
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
fn usage_of(inner: &Inner, include: &mut dyn FnMut(&str) -> bool) -> (ResourceList, Vec<String>) {
    let mut total = ResourceList::new();
    let mut namespaces = Vec::new();
    for (ns, usage) in &inner.ns_usage {
        if !include(ns) {
            continue;
        }
        if usage.values().any(|q| q.nanos() != 0) {
            namespaces.push(ns.to_string());
        }
        add_to(&mut total, usage, 1);
        for tally in inner.tallies.get(ns).into_iter().flat_map(HashMap::values) {
            add_to(&mut total, &tally.placeholders(), 1);
        }
    }
    namespaces.sort();
    (total, namespaces)
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

    /// Every Pod the watch has seen (finished ones included), in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &PodRecord> {
        self.inner.pods.values().map(|p| &**p)
    }

    /// One Pod, if the watch has seen it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodRecord> {
        self.inner.pods.get(&key(namespace, name)).map(|p| &**p)
    }

    /// Every Node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.inner.nodes.values()
    }

    /// The DRA devices each node offers, when the ResourceSlices have been read.
    pub fn node_devices(&self) -> Option<&crate::dra::slices::NodeDevices> {
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
        let group = format!("{}{pod_group}", crate::gang::membership::NATIVE_GROUP_PREFIX);
        let Some(members) = inner.gangs.get(&(Arc::from(namespace), group)) else { return };
        let keys: Vec<Key> = members.iter().map(|m| (Arc::from(namespace), m.clone())).collect();
        let mut changed = false;
        for key in keys {
            let resized =
                inner.pods.get(&key).and_then(|r| r.gang.as_ref()).is_some_and(|g| g.native && g.size != size);
            let Some(mut record) = inner.pods.remove(&key).filter(|_| resized) else { continue };
            // In place (not `index`): only the tally changes; which relist saw it does not.
            inner.usage_delta(&record, -1);
            if let Some(gang) = record.gang.as_mut() {
                gang.size = size;
            }
            inner.usage_delta(&record, 1);
            inner.pods.insert(key, record);
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

    /// A (re)list of Pods begins: its pods are applied one by one as they come
    /// ([`ClusterState::upsert_pod`]), so the view never holds the old set and the new one at
    /// once; [`ClusterState::finish_relist`] then drops what the list did not contain.
    pub fn begin_relist(&self) {
        let mut inner = write(&self.inner);
        inner.relist = inner.relist.wrapping_add(1);
        inner.relisting = true;
    }

    /// True while a (re)list is applied pod by pod: decisions (gate lifts, queue order, ledger
    /// releases) wait for its end, which wakes them ([`ClusterState::changed`]).
    pub fn relisting(&self) -> bool {
        read(&self.inner).relisting
    }

    /// The view is whole enough to decide gates on: Pods and Nodes have each been listed once
    /// and no relist is half applied. Until then a gang may look incomplete and every node
    /// absent; whatever a pass wrote then (an "InsufficientResources, 0 free" explanation)
    /// would be wrong. Where DRA devices are watched, their first lists must be in too, or a
    /// gang asking claim devices would be judged without them.
    pub fn complete(&self) -> bool {
        let inner = read(&self.inner);
        inner.pods_listed && inner.nodes_listed && !inner.relisting && !matches!(inner.devices, Devices::Waiting)
    }

    /// The (re)list is complete: forgets the pods it did not contain (deleted while the watch
    /// was down). They are not remembered as removed: nobody saw them go.
    pub fn finish_relist(&self) {
        let mut inner = write(&self.inner);
        let current = inner.relist;
        let gone: Vec<Key> = inner.pods.iter().filter(|(_, p)| p.relist != current).map(|(k, _)| k.clone()).collect();
        for key in &gone {
            let emptied = inner.unindex(key);
            inner.forget_owner_if_gone(emptied);
            inner.conditions_in_flight.remove(key);
        }
        inner.pods.shrink_to_fit();
        inner.relisting = false;
        inner.pods_listed = true;
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Replaces every Pod at once (tests and tools; the watch uses
    /// [`ClusterState::begin_relist`]).
    pub fn replace_pods(&self, records: Vec<PodRecord>) {
        let mut inner = write(&self.inner);
        // A relist keeps what was seen of the pods that are still there.
        let arrivals: HashMap<Key, i64> = inner
            .pods
            .iter()
            .filter_map(|(k, p)| p.arrival.filter(|_| !p.arrival_stamped).map(|a| (k.clone(), a)))
            .collect();
        let records = records.into_iter().map(|mut r| {
            if r.arrival.is_none() {
                r.arrival = arrivals.get(&r.key()).copied();
            }
            r
        });
        inner.pods.clear();
        inner.gangs.clear();
        inner.ns_usage.clear();
        inner.tallies.clear();
        inner.claim_holders.clear();
        inner.claim_pods.clear();
        inner.gang_gated = 0;
        inner.quota_gated = 0;
        inner.awaiting_bind = 0;
        inner.told_late = 0;
        inner.disrupted = 0;
        for r in records {
            inner.index(r);
        }
        let Inner { pods, conditions_in_flight, gangs, owner_gangs, owner_lookups, .. } = &mut *inner;
        conditions_in_flight.retain(|k, _| pods.contains_key(k));
        let alive =
            |(namespace, gang): &(String, String)| gangs.contains_key(&(Arc::from(namespace.as_str()), gang.clone()));
        owner_gangs.retain(|k, _| alive(k));
        owner_lookups.retain(|k, _| alive(k));
        inner.pods_listed = true;
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

    /// Records what an inferred gang's owner declares (nothing when the gang has no pod left).
    pub fn set_owner_gang(&self, namespace: &str, gang: &str, owner: OwnerGang) {
        let mut inner = write(&self.inner);
        if !inner.has_gang(namespace, gang) {
            return;
        }
        let previous = inner.owner_gangs.insert((namespace.to_string(), gang.to_string()), owner.clone());
        if previous.as_ref() != Some(&owner) {
            inner.generation += 1;
            self.wake.notify_one();
        }
    }

    /// Records a lookup of `owner`, the owner of inferred gang `gang`, made at `at`: what it
    /// declares, or `None` when it is not there or declares no usable size, in which case it is
    /// not asked for again before [`OWNER_RETRY_FIRST`], doubling each time up to
    /// [`OWNER_RETRY_MOST`]. (A read that failed is not recorded.) Nothing is kept for a gang
    /// whose pods are gone.
    pub fn owner_looked_up(
        &self,
        namespace: &str,
        gang: &str,
        owner: &Owner,
        declared: Option<OwnerGang>,
        at: std::time::Instant,
    ) {
        {
            let mut inner = write(&self.inner);
            if !inner.has_gang(namespace, gang) {
                return;
            }
            let lookups = inner.owner_lookups.entry((namespace.to_string(), gang.to_string())).or_default();
            let retry = match &declared {
                Some(_) => None,
                None => {
                    let waited = lookups.get(owner).and_then(|last| last.retry).map(|(_, wait)| wait);
                    let wait = waited.map_or(OWNER_RETRY_FIRST, |w| w.saturating_mul(2).min(OWNER_RETRY_MOST));
                    Some((at + wait, wait))
                }
            };
            lookups.insert(owner.clone(), OwnerLookup { at, retry });
        }
        if let Some(declared) = declared {
            self.set_owner_gang(namespace, gang, declared);
        }
    }

    /// Marks members released locally at `at` (seconds since the epoch), before the API
    /// confirms, so the next pass already counts their reservation.
    pub fn mark_released(&self, namespace: &str, names: &[String], at: i64) {
        let mut inner = write(&self.inner);
        for n in names {
            if let Some(p) = inner.pods.get_mut(&key(namespace, n)) {
                let awaited = p.awaits_bind();
                let was_gated = p.gate_index.take().is_some();
                p.released_at = Some(at);
                p.gang_released = true;
                let awaits = p.awaits_bind();
                if was_gated {
                    inner.gang_gated = inner.gang_gated.saturating_sub(1);
                }
                if awaits && !awaited {
                    inner.awaiting_bind += 1;
                }
            }
        }
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// A released member now carries the node selector `key: value` (its gang's topology
    /// domain): its record's placement says so before the watch shows the patch.
    pub fn pin_placement(&self, namespace: &str, name: &str, key: &str, value: &str) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(&self::key(namespace, name)) {
            p.pin_placement(key, value);
        }
    }

    /// What the non-finished pods of the namespaces `include` accepts count against a quota,
    /// in resource terms: their requests (terminating pods included: they hold their devices
    /// until they are gone), plus, for each gang that has fewer members than it declares, its
    /// placeholders (see [`GangTally`]: a gang is charged whole). Also returns the namespaces
    /// that use anything. Costs O(namespaces + gangs), never O(members or declared sizes).
    pub fn usage_where(&self, include: &mut dyn FnMut(&str) -> bool) -> (ResourceList, Vec<String>) {
        usage_of(&read(&self.inner), include)
    }

    /// [`ClusterState::usage_where`], and which of `claims` ((namespace, claim) pairs) the watch
    /// holds, read under the same lock: a usage without a claim and a "held" answer for it
    /// from a later state would count the claim nowhere.
    pub fn usage_and_claims(
        &self,
        include: &mut dyn FnMut(&str) -> bool,
        claims: &[(&str, &str)],
    ) -> (ResourceList, Vec<String>, Vec<bool>) {
        let inner = read(&self.inner);
        let (total, namespaces) = usage_of(&inner, include);
        let held =
            claims.iter().map(|(ns, c)| inner.claim_holders.contains_key(&(Arc::from(*ns), Arc::from(*c)))).collect();
        (total, namespaces, held)
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
        inner.pods.contains_key(&key) || inner.removed_at.get(&key).is_some_and(|at| *at >= since)
    }

    /// True when the watch saw a pod of this name deleted at or after `since` (remembered for
    /// [`REMOVED_TTL`]).
    pub fn removed_since(&self, namespace: &str, name: &str, since: std::time::Instant) -> bool {
        read(&self.inner).removed_at.get(&key(namespace, name)).is_some_and(|at| *at >= since)
    }

    /// Marks a pod's quota gate lifted locally at `at` (seconds since the epoch), before the
    /// watch confirms it. A gang gate after it moves up one place, so a release in the same pass
    /// tests and removes the right index.
    pub fn mark_quota_released(&self, namespace: &str, name: &str, at: i64) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(&key(namespace, name)) {
            // What the lift patch wrote in `allot.dev/quota-released` (so the pod has
            // annotations now: a gang release in the same pass adds its key to them).
            let awaited = p.awaits_bind();
            p.released_at = p.released_at.max(Some(at));
            let newly_awaits = p.awaits_bind() && !awaited;
            p.has_annotations = true;
            if let (Some(quota), Some(gang)) = (p.quota_gate_index, p.gate_index)
                && gang > quota
            {
                p.gate_index = Some(gang - 1);
            }
            if p.quota_gate_index.take().is_some() {
                inner.quota_gated = inner.quota_gated.saturating_sub(1);
            }
            if newly_awaits {
                inner.awaiting_bind += 1;
            }
        }
        inner.generation += 1;
        self.wake.notify_one();
    }

    /// Resolves after the next change (or at once if one happened since the last wait): the
    /// controller's decision loop waits on it instead of polling.
    pub async fn changed(&self) {
        self.wake.notified().await
    }

    /// Records that the controller is deleting the pod (assembly timeout under `onTimeout:
    /// Fail`) before the watch says so: the next pass must not count it as a member again and
    /// delete it twice (CI saw the second member deleted again, 404, with a second Event, when a
    /// pass ran between the two deletions' watch events). `false` when the deletion failed
    /// (a later pass tries again). Only the pod of `uid`, when given: a pod made again under
    /// the name since the pass decided is not the one being deleted.
    pub fn mark_deleting(&self, namespace: &str, name: &str, uid: Option<&str>, deleting: bool) {
        let mut inner = write(&self.inner);
        let Some(record) = inner.pods.get(&key(namespace, name)) else { return };
        if record.terminating == deleting || record.finished || uid.is_some_and(|u| record.uid.as_deref() != Some(u)) {
            return;
        }
        let mut record = (**record).clone();
        record.terminating = deleting;
        // Re-indexed whole: the gang tallies count terminating members apart.
        inner.index(record);
    }

    /// Records that the pod's arrival is being written (`allot.dev/arrival`), so it is not
    /// written twice before the watch echoes it; `false` when the write failed (try again).
    pub fn mark_arrival_stamped(&self, namespace: &str, name: &str, stamped: bool) {
        let mut inner = write(&self.inner);
        if let Some(p) = inner.pods.get_mut(&key(namespace, name)) {
            p.arrival_stamped = stamped;
        }
    }

    /// Records the condition the controller is writing on a pod (see
    /// [`PodRecord::gang_condition`]), so it is not written again before the watch echoes it;
    /// watch events of the pod meanwhile keep the mark until the write completes
    /// ([`ClusterState::condition_landed`], [`ClusterState::unmark_condition`]).
    pub fn mark_condition(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        let key = key(namespace, name);
        let Some(p) = inner.pods.get_mut(&key) else { return };
        if quota {
            p.quota_condition = fingerprint;
        } else {
            p.gang_condition = fingerprint;
        }
        inner.conditions_in_flight.entry(key).or_default()[usize::from(quota)] = Flight { fingerprint, landed: None };
    }

    /// The write of `fingerprint` completed. The mark stays until the watch echoes it (an event
    /// the watch delivers late, older than the write, still carries the pod without it), or
    /// for [`ECHO_WAIT`] at most.
    pub fn condition_landed(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        if let Some(slot) = inner.flight(&key(namespace, name), quota, fingerprint) {
            slot.landed = Some(std::time::Instant::now());
        }
    }

    /// Undoes [`ClusterState::mark_condition`] of `fingerprint` (a write that failed), unless
    /// the pod's record carries another condition by now (a newer one on its way, or the watch's).
    pub fn unmark_condition(&self, namespace: &str, name: &str, quota: bool, fingerprint: u64) {
        let mut inner = write(&self.inner);
        let key = key(namespace, name);
        inner.end_flight(&key, quota, fingerprint);
        if let Some(p) = inner.pods.get_mut(&key) {
            let marked = if quota { &mut p.quota_condition } else { &mut p.gang_condition };
            if *marked == fingerprint {
                *marked = 0;
            }
        }
    }

    /// A counter that changes whenever the state does.
    pub fn generation(&self) -> u64 {
        read(&self.inner).generation
    }

    /// Counts for logs and metrics: (pods, nodes, gated members). O(1).
    pub fn counts(&self) -> (usize, usize, usize) {
        let inner = read(&self.inner);
        (inner.pods.len(), inner.nodes.len(), inner.gang_gated)
    }

    /// Pods behind Allot's gang gate and behind its quota gate: when a count is 0, the pass
    /// that works on them has nothing to do and need not walk every pod. O(1).
    pub fn gated(&self) -> (usize, usize) {
        let inner = read(&self.inner);
        (inner.gang_gated, inner.quota_gated)
    }

    /// Gang members Allot released that are not bound yet ([`PodRecord::awaits_bind`]): when
    /// there are any, the gang pass has reservations to hold or end and start timeouts to
    /// apply, even with nothing gated. O(1).
    /// Members of released gangs that a disruption is taking away: with none, no pass needs
    /// to look for broken gangs.
    pub fn disrupted(&self) -> usize {
        read(&self.inner).disrupted
    }

    pub fn awaiting_bind(&self) -> usize {
        read(&self.inner).awaiting_bind
    }

    /// Bound gang members still told that their gang did not start
    /// ([`PodRecord::told_late_and_bound`]): the gang pass has conditions to set right. O(1).
    pub fn told_late(&self) -> usize {
        read(&self.inner).told_late
    }

    /// Pods Allot holds in a quota queue whose arrival is not on them yet: `(namespace, name,
    /// arrival)`. O(1) when nothing is queued: the controller's passes follow every burst of
    /// watch events, and the walk over every pod after each of them cost Allot ~11 % of its CPU
    /// with a few thousand pods and nothing queued (perf, scale.sh). While pods are queued it
    /// walks every pod (as that pass's queue plan does).
    pub fn arrivals_to_stamp(&self) -> Vec<(String, String, i64)> {
        let inner = read(&self.inner);
        if inner.quota_gated == 0 {
            return Vec::new();
        }
        inner
            .pods
            .values()
            .filter(|p| p.needs_arrival_stamp())
            .filter_map(|p| Some((p.namespace.to_string(), p.name.to_string(), p.arrival?)))
            .collect()
    }

    /// How much the view holds, for the `allot_cluster_*` gauges: O(1).
    pub fn tracked(&self) -> Tracked {
        let inner = read(&self.inner);
        Tracked { pods: inner.pods.len(), gangs: inner.gangs.len(), nodes: inner.nodes.len() }
    }

    /// Native PodGroups Allot hands inferred gangs to (GangPolicy `nativeScheduling`), as
    /// (namespace, PodGroup name, the gang's owner): one per group that has a live member, in
    /// O(gangs). The leader creates those that do not exist.
    pub fn hand_offs(&self) -> Vec<(String, String, Owner)> {
        let inner = read(&self.inner);
        let mut out: Vec<_> = inner
            .gangs
            .iter()
            .filter_map(|((namespace, gang), members)| {
                let pod_group = gang.strip_prefix(crate::gang::membership::NATIVE_GROUP_PREFIX)?;
                let owner = members.iter().find_map(|m| {
                    let p = inner.pods.get(&(namespace.clone(), m.clone()))?;
                    p.present().then(|| p.gang.as_ref()?.owner.clone()).flatten()
                })?;
                Some((namespace.to_string(), pod_group.to_string(), owner))
            })
            .collect();
        out.sort();
        out
    }

    /// Inferred gangs with a gated member whose owner is due to be read in the round that
    /// began at `round` (one controller pass): at most `most` of them, as (namespace, gang,
    /// owner), and whether more were due. Due: an owner never asked for (first), then one last
    /// asked for before `round` that is not waiting out a failure ([`OWNER_RETRY_FIRST`]),
    /// longest ago first — so an elastic owner is read again on every pass the cap allows
    /// (its size followed, never a stale one), and those a pass leaves come first in the next.
    pub fn owners_to_resolve(&self, round: std::time::Instant, most: usize) -> (Vec<(String, String, Owner)>, bool) {
        let inner = read(&self.inner);
        let mut wanted: Vec<_> = inner
            .pods
            .values()
            .filter(|p| p.gate_index.is_some())
            .filter_map(|p| {
                let g = p.gang.as_ref()?;
                Some((p.namespace.to_string(), g.name.clone(), g.owner.clone()?))
            })
            .collect();
        wanted.sort();
        wanted.dedup();
        // Ordered by when last asked for (`None`: never, first), then, among equals (owners
        // never read, above all), one namespace at a time in turn: a tenant naming hundreds of
        // made-up owners takes one place per round, not every place until hers are done (which
        // name order would give her namespace, or a later one's).
        let mut turn: HashMap<String, usize> = HashMap::new();
        let mut due: Vec<_> = wanted
            .into_iter()
            .filter_map(|(namespace, gang, owner)| {
                let last = inner.owner_lookups.get(&(namespace.clone(), gang.clone())).and_then(|l| l.get(&owner));
                let at = match last {
                    None => None,
                    Some(l) if l.at >= round || l.retry.is_some_and(|(not_before, _)| not_before > round) => {
                        return None;
                    }
                    Some(l) => Some(l.at),
                };
                let n = turn.entry(namespace.clone()).or_default();
                *n += 1;
                Some(((at, *n), (namespace, gang, owner)))
            })
            .collect();
        due.sort();
        // Soon again only for owners never read: those read before are read again by the
        // passes that come anyway (a pass a second for ever otherwise, once over the cap).
        let more = due.iter().skip(most).any(|((at, _), _)| at.is_none());
        (due.into_iter().take(most).map(|(_, owner)| owner).collect(), more)
    }
}

impl GangDirectory for ClusterState {
    fn peers(&self, namespace: &str, name: &str) -> Vec<Peer> {
        let inner = read(&self.inner);
        let Some(members) = inner.gangs.get(&(Arc::from(namespace), name.to_string())) else { return Vec::new() };
        members
            .iter()
            .filter_map(|m| inner.pods.get(&(Arc::from(namespace), m.clone())))
            .filter(|p| p.present())
            .filter_map(|p| {
                let g = p.gang.as_ref()?;
                Some(Peer {
                    pod: p.name.to_string(),
                    size: g.size,
                    priority_class: g.priority_class.as_deref().map(str::to_string),
                    scheduler_name: g.scheduler_name.as_deref().map(str::to_string),
                })
            })
            .collect()
    }

    fn node(&self, name: &str) -> NodeLookup {
        let inner = read(&self.inner);
        match inner.nodes.get(name) {
            Some(n) => NodeLookup::Taints(n.taints.clone()),
            None if inner.nodes_listed => NodeLookup::Unknown,
            None => NodeLookup::NotWatched,
        }
    }

    /// From the index kept with the usage: O(pods naming the claim), in name order.
    fn pods_naming_claim(&self, namespace: &str, claim: &str) -> Vec<String> {
        let inner = read(&self.inner);
        let id: ClaimId = (Arc::from(namespace), Arc::from(claim));
        inner.claim_pods.get(&id).map(|pods| pods.keys().map(|p| p.to_string()).collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod flight_tests {
    use super::{ECHO_WAIT, Flight};
    use std::time::{Duration, Instant};

    #[test]
    fn a_flight_holds_its_mark_until_the_echo_or_the_wait_ends() {
        let now = Instant::now();
        let mut none = Flight::default();
        assert_eq!(none.follow(7, now), 7, "no flight: the watch's");

        let mut under_way = Flight { fingerprint: 5, landed: None };
        assert_eq!(under_way.follow(0, now + ECHO_WAIT * 10), 5, "no wait while the write is under way");
        assert_eq!(under_way.follow(3, now), 5, "another condition seen (an older one): still ours");
        assert_eq!(under_way, Flight { fingerprint: 5, landed: None });
        assert_eq!(under_way.follow(5, now), 5, "the echo");
        assert_eq!(under_way, Flight::default(), "ends the flight");

        let mut landed = Flight { fingerprint: 5, landed: Some(now) };
        assert_eq!(landed.follow(0, now + ECHO_WAIT - Duration::from_millis(1)), 5);
        assert_eq!(landed.follow(3, now + ECHO_WAIT), 3, "waited out: the watch's");
        assert_eq!(landed, Flight::default());
    }
}

#[cfg(test)]
mod owner_lookup_tests {
    use std::time::{Duration, Instant};

    use serde_json::json;

    use super::{ClusterState, OWNER_RETRY_FIRST, OWNER_RETRY_MOST};
    use crate::cluster::fixtures::{member, policies, record};
    use crate::gang::membership::OwnerGang;

    const INFER_JOBSET: &str =
        "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [JobSet]\n";

    /// Gated pod `name` labelled as a pod of JobSet `jobset` (gang `jobset-<jobset>`).
    fn jobset_pod(name: &str, jobset: &str) -> crate::cluster::PodRecord {
        let mut pod = member(name, "-", 1, "2026-11-22T01:00:00Z", json!({}));
        pod["metadata"]["labels"] = json!({"jobset.sigs.k8s.io/jobset-name": jobset});
        pod["metadata"]["annotations"] = json!({});
        record(&pod, &policies(INFER_JOBSET))
    }

    fn sized(size: u32) -> OwnerGang {
        OwnerGang { size, leader_first: false, worker_template: None }
    }

    /// Which gangs' owners are due at `at` (one at most per call when `most` is 1).
    fn due(state: &ClusterState, at: Instant, most: usize) -> (Vec<String>, bool) {
        let (owners, more) = state.owners_to_resolve(at, most);
        (owners.into_iter().map(|(_, gang, _)| gang).collect(), more)
    }

    /// An owner that could not be read is not asked for again before a backoff that doubles,
    /// up to its most; one that was read is asked for again on every later round (its size
    /// followed), never twice in one; those never asked for come first, then the longest ago.
    #[test]
    fn an_owner_that_cannot_be_read_waits_out_a_doubling_backoff() {
        let state = ClusterState::default();
        state.replace_pods(vec![jobset_pod("a-0", "a"), jobset_pod("b-0", "b")]);
        let t0 = Instant::now();
        assert_eq!(due(&state, t0, 1), (vec!["jobset-a".to_string()], true), "the cap leaves one");
        let (owners, _) = state.owners_to_resolve(t0, 2);
        let (ns, gang, owner) = owners[0].clone();
        state.owner_looked_up(&ns, &gang, &owner, None, t0);
        assert_eq!(due(&state, t0, 1), (vec!["jobset-b".to_string()], false), "a is not due");

        let mut failed_at = t0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            let wait = (1..=OWNER_RETRY_MOST.as_secs())
                .map(Duration::from_secs)
                .find(|w| due(&state, failed_at + *w, 2).0.contains(&gang))
                .expect("due again after at most the longest wait");
            waits.push(wait.as_secs());
            failed_at += wait;
            state.owner_looked_up(&ns, &gang, &owner, None, failed_at);
        }
        let first = OWNER_RETRY_FIRST.as_secs();
        assert_eq!(waits, [first, 2 * first, 4 * first, 8 * first, 16 * first, 600, 600]);

        // Read at last: asked for again in every later round (an elastic owner), not in this one.
        state.owner_looked_up(&ns, &gang, &owner, Some(sized(4)), failed_at);
        assert_eq!(state.view().owner_gang(&ns, &gang).map(|o| o.size), Some(4));
        assert!(!due(&state, failed_at, 2).0.contains(&gang));
        let next_round = failed_at + Duration::from_millis(1);
        assert!(due(&state, next_round, 2).0.contains(&gang));
        // b was never asked for: it comes first.
        assert_eq!(due(&state, next_round, 1).0, ["jobset-b"]);
        // A failure after a success starts the backoff again from its first wait.
        state.owner_looked_up(&ns, &gang, &owner, None, next_round);
        assert!(!due(&state, next_round + OWNER_RETRY_FIRST - Duration::from_secs(1), 2).0.contains(&gang));
        assert!(due(&state, next_round + OWNER_RETRY_FIRST, 2).0.contains(&gang));
    }

    /// Pods of one gang that name different owners (a Job gang's name comes from a label, its
    /// owner from the ownerReferences): each owner waits out its own failure, rather than each
    /// lookup making the other look new and both being asked for on every pass.
    #[test]
    fn owners_named_by_one_gang_each_wait_out_their_failures() {
        let p =
            policies("apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: g}\nspec:\n  infer: [Job]\n");
        let job_pod = |name: &str, owner: &str| {
            let mut pod = member(name, "-", 1, "2026-11-22T01:00:00Z", json!({}));
            pod["metadata"]["labels"] =
                json!({"batch.kubernetes.io/job-name": "x", "batch.kubernetes.io/job-completion-index": "0"});
            pod["metadata"]["annotations"] = json!({});
            pod["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "batch/v1", "kind": "Job", "name": owner, "uid": format!("uid-{owner}")}]);
            record(&pod, &p)
        };
        let state = ClusterState::default();
        state.replace_pods(vec![job_pod("a", "y1"), job_pod("b", "y2")]);
        let t0 = Instant::now();
        let (owners, more) = state.owners_to_resolve(t0, 16);
        assert_eq!((owners.len(), more), (2, false), "{owners:?}");
        for (ns, gang, owner) in &owners {
            state.owner_looked_up(ns, gang, owner, None, t0);
        }
        assert_eq!(state.owners_to_resolve(t0 + Duration::from_secs(1), 16).0, []);
        assert_eq!(state.owners_to_resolve(t0 + OWNER_RETRY_FIRST, 16).0.len(), 2);
    }

    /// What an owner said, and when it was asked for, goes with the last pod of its gang
    /// (deleted, or missing from a relist), not with an update of it; a lookup that answers
    /// after the gang went keeps nothing. Before, `owner_gangs` kept every gang ever seen.
    #[test]
    fn what_an_owner_said_goes_with_its_gangs_last_pod() {
        let state = ClusterState::default();
        state.replace_pods(vec![jobset_pod("r-0", "r"), jobset_pod("r-1", "r")]);
        let owner = state.owners_to_resolve(Instant::now(), 1).0.remove(0).2;
        state.set_owner_gang("ml", "jobset-r", sized(2));
        let size = |state: &ClusterState| state.view().owner_gang("ml", "jobset-r").map(|o| o.size);
        state.remove_pod("ml", "r-0");
        state.upsert_pod(jobset_pod("r-1", "r"));
        assert_eq!(size(&state), Some(2), "the gang still has a pod");
        state.remove_pod("ml", "r-1");
        assert_eq!(size(&state), None);
        state.owner_looked_up("ml", "jobset-r", &owner, Some(sized(2)), Instant::now());
        assert_eq!(size(&state), None, "a late answer for a gang that is gone");

        state.upsert_pod(jobset_pod("r-2", "r"));
        assert_eq!(due(&state, Instant::now(), 1).0, ["jobset-r"], "asked for anew");
        state.owner_looked_up("ml", "jobset-r", &owner, None, Instant::now());
        state.set_owner_gang("ml", "jobset-r", sized(2));
        // A pod that moves to another gang takes its old gang's owner along when it was the last.
        state.upsert_pod(jobset_pod("r-2", "elsewhere"));
        assert_eq!(size(&state), None);
        assert_eq!(due(&state, Instant::now(), 2).0, ["jobset-elsewhere"]);
        // A relist without the gang's pods forgets it too (replaced whole, or pod by pod).
        state.upsert_pod(jobset_pod("r-3", "r"));
        state.set_owner_gang("ml", "jobset-r", sized(2));
        state.replace_pods(vec![jobset_pod("r-2", "elsewhere")]);
        assert_eq!(size(&state), None);
        state.set_owner_gang("ml", "jobset-elsewhere", sized(1));
        state.begin_relist();
        state.finish_relist();
        assert_eq!(state.view().owner_gang("ml", "jobset-elsewhere"), None);
    }
}
