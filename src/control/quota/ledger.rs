//! One team's deny-mode ledger, as kept in one ConfigMap in Allot's namespace
//! (`allot-quota-TEAM`): the charges of pods admitted but not yet seen by the leader's watch
//! (one data key per pod), and what the leader's watch counts per namespace (one data key per
//! namespace). Pure: no I/O here; [`super::shared`] reads and writes the object with
//! resourceVersion-guarded updates.
//!
//! Why a ledger in the API server: every replica decides from the same numbers, and a charge is
//! committed (an optimistic write that a concurrent writer makes fail with 409) before the pod
//! is admitted, so N replicas cannot each admit up to the limit. The idea is the in-tree
//! ResourceQuota admission plugin's, not its code.
//!
//! A charge's life:
//! - **pending**: written by admission (key: the pod's UID, which the API server has assigned by
//!   the time validating webhooks run). A re-sent admission for the same pod finds its key and
//!   is not charged twice.
//! - **folded**: the leader's reconcile found the pod in its watch, at least
//!   [`FOLD_DELAY_SECS`] old: the pending entry goes, in the same write that puts the pod into
//!   its namespace's [`Folded`] totals.
//! - **released**: the pod is no longer in the leader's watch (deleted), or finished
//!   (Succeeded/Failed). A terminating pod stays counted until it is gone (it holds its devices
//!   until then).
//! - **expired**: a pending charge whose pod the leader has not seen after [`PENDING_TTL_SECS`]
//!   (a later webhook or the API server refused the pod). Only the reconciler folds, expires or
//!   releases anything: while no replica leads, the ledger only grows (it over-counts, never
//!   under-counts).
//!
//! A pod admitted from a replica's [`Allowance`] (see [`super::shared`]) is counted by that
//! allowance until its holder writes its pending charge, shortly after the admission.
//!
//! Size: the folded totals are recomputed from the leader's pod watch at every reconcile, never
//! adjusted by what changed since the last one, so they cannot drift, and a release is counted
//! exactly once: a pod that is gone is simply not in the next recount. (The recount reads groups
//! of pods the watch keeps, `shared::recount_kept`, not every pod; a property test holds it
//! equal to the walk over every pod.) A ledger therefore holds one value per
//! namespace (with one small record per gang and request shape) plus the pending charges, not
//! one value per pod. Until a ledger has been reconciled once, admission refuses against it (its
//! usage is not known).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::admission::quota::{QuotaRequest, Refusal, asks, decide};
use crate::model::dra::SharedClaims;
use crate::model::policy::quota::Quota;
use crate::model::quantity::Quantity;
use crate::model::resources::ResourceList;
use crate::model::tally::{GangTally, add_to};

pub mod parts;
mod recount;
mod wire;

pub use recount::{CountedPod, Reconciled, Recount, SeenPod, Sighting};
use wire::{ALLOWANCE_PREFIX, DRAIN_KEY, FOLDED_PREFIX, parse_drain};
pub use wire::{WireError, admission_key, allowance_key, drain_requested_in, object_name};

/// How long a charge waits for its pod to appear in the leader's watch before it expires
/// (seconds). Long enough for any admission chain to finish and the watch to deliver the pod;
/// a pod that never appeared over-counts its team for at most this long.
pub const PENDING_TTL_SECS: i64 = 120;

/// Most pending charges (admitted, not yet folded) one ledger holds. With typical names a charge
/// is ~150 bytes, so 4,096 charges are ~600 KiB, well below the API server's 1 MiB object limit;
/// the leader folds charges within about a second of their pods appearing, so only a burst of
/// more than 4,096 admissions of one team inside that second meets it. Beyond it a pod is
/// refused with a message saying so (fail closed), never silently under-counted.
pub const MAX_ENTRIES: usize = 4096;

/// Most gang members the folded totals of one ledger may describe: a bound on the work of
/// decoding a ledger whose numbers someone edited (each member is counted into its gang's
/// tally one by one). Far above any team (gangs have at most `maxGangSize` members).
pub const MAX_FOLDED_MEMBERS: u64 = 1_000_000;

/// Most bytes of charge data (keys and values) one ledger holds: a bound that holds whatever the
/// names' lengths (names of 253 characters would pass 1 MiB long before [`MAX_ENTRIES`]).
pub const MAX_BYTES: usize = 800 * 1024;

/// How old (by creationTimestamp, seconds) a pod must be before the leader folds it into its
/// namespace's totals. A pod admitted from a replica's [`Allowance`] is written into the ledger
/// as a pending charge shortly *after* its admission (see [`super::shared`]): were the leader to
/// fold the pod first, that late charge would count it twice. Until then a young pod is counted
/// by its pending charge (kept, not released, while the pod is young) or by the allowance it was
/// admitted from; a young pod of neither (admitted while Allot was down) is counted once it is
/// this old.
pub const FOLD_DELAY_SECS: i64 = 3;

/// How long an [`Allowance`] stays in the ledger after its holder last wrote it (seconds): the
/// leader drops it after that (its holder crashed, or lost the API server). Its holder stops
/// admitting from it long before ([`super::shared`]), so that every pod admitted from it is
/// created and seen by the leader while the allowance still covers it.
pub const ALLOWANCE_TTL_SECS: i64 = 15;

/// The annotation on a ledger's ConfigMap that records the leader's last reconcile (RFC 3339).
pub const RECONCILED_ANNOTATION: &str = "allot.dev/reconciled-at";

/// Written with [`RECONCILED_ANNOTATION`], the same timestamp, by leaders that know
/// [`Allowance`]s. Replicas grant allowances only while the two agree: a leader of an older
/// Allot (during a rolling upgrade) rewrites only the first, and would take `a.` keys for
/// unreadable charges and drop them.
pub const ALLOWANCES_ANNOTATION: &str = "allot.dev/reconciled-with-allowances";

/// Written with [`RECONCILED_ANNOTATION`], the same timestamp, by leaders that charge shared
/// ResourceClaims once per claim (pending and folded `cl` values). Until the two agree (an
/// older leader during a rolling upgrade, which would take a `cl` value for unreadable and drop
/// it) admission charges a pod's shared claims with the pod, the older way (over, never under).
pub const CLAIMS_ANNOTATION: &str = "allot.dev/reconciled-with-shared-claims";

/// The label on every ledger's ConfigMap: its team (or `cohort.NAME` for a cohort's).
pub const TEAM_LABEL: &str = "allot.dev/quota-ledger";

/// One charge: a pod and what it counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub namespace: String,
    pub name: String,
    /// The pod's creationTimestamp (unix seconds; 0 when unknown): tells a pod from a later one
    /// of the same name.
    pub created: i64,
    /// When the charge was written (unix seconds).
    pub at: i64,
    /// The pod's requests of the resources the quota counts.
    pub requests: ResourceList,
    /// The gang it belongs to, and the size it declares.
    pub gang: Option<(String, Option<u32>)>,
    /// The shared ResourceClaims it names, with their counted devices: each counted once per
    /// namespace, whoever else names it.
    pub claims: SharedClaims,
    /// The leader's watch has seen the pod.
    pub seen: bool,
    /// The pod is being deleted (still holds its devices; not present for its gang's quorum).
    pub terminating: bool,
}

/// Capacity one replica has set aside in the ledger, to admit plain pods from without a round
/// trip to the API server (see [`super::shared`]). It counts as usage for every other writer, so
/// together with the charges it never takes the team past a limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Allowance {
    /// The amounts set aside, of limited resources (resource terms).
    pub reserved: ResourceList,
    /// Unix seconds after which the leader drops it.
    pub until: i64,
}

impl Entry {
    /// The charge of an admitted `request` at `now`.
    pub fn admitted(quota: &Quota, request: &QuotaRequest<'_>, now: i64) -> Entry {
        let mut entry = Entry::of(request, counted(quota, &request.requests), now);
        entry.claims = counted_claims(quota, &request.shared_claims);
        entry
    }

    /// The charge of an admitted `request` whose counted requests ([`counted`]) are known.
    pub fn of(request: &QuotaRequest<'_>, requests: ResourceList, now: i64) -> Entry {
        Entry {
            namespace: request.namespace.to_string(),
            name: request.pod.to_string(),
            created: request.created,
            at: now,
            requests,
            gang: request.gang.map(|(g, n)| (g.to_string(), Some(n))),
            claims: SharedClaims::new(),
            seen: false,
            terminating: false,
        }
    }

    fn bytes(key: &str, value: &str) -> usize {
        key.len() + value.len()
    }

    fn counts_in(&self, tallies: &mut HashMap<(String, String), GangTally>, plain: &mut ResourceList) {
        match &self.gang {
            Some((gang, size)) => tallies.entry((self.namespace.clone(), gang.clone())).or_default().add(
                self.requests.iter().map(|(k, v)| (k.as_str(), *v)),
                *size,
                self.terminating,
            ),
            None => add_to(plain, &self.requests, 1),
        }
    }
}

/// What the leader's watch counted in one namespace at its last reconcile: the plain pods'
/// requests summed, and every gang's members grouped by what they request and declare (gang
/// members cannot be summed away: admission needs each gang's tally for its placeholders and
/// its declared size).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Folded {
    pub namespace: String,
    /// Pods counted (plain pods and gang members).
    pub pods: u32,
    /// Σ of the plain (gangless) pods' counted requests.
    pub plain: ResourceList,
    /// Gang name → its members, grouped.
    pub gangs: BTreeMap<String, GangMembers>,
    /// The shared ResourceClaims its pods name, each with its counted devices (once).
    pub claims: SharedClaims,
}

/// One gang's members grouped by (counted requests, declared size) → (members, of which
/// terminating): gang members are mostly alike, so a gang takes one or two groups.
pub type GangMembers = BTreeMap<(ResourceList, Option<u32>), (u32, u32)>;

/// The shared claims' devices the quota counts; claims that count nothing are left out.
pub fn counted_claims(quota: &Quota, claims: &SharedClaims) -> SharedClaims {
    claims
        .iter()
        .map(|(claim, devices)| (claim.clone(), counted(quota, devices)))
        .filter(|(_, devices)| !devices.is_empty())
        .collect()
}

/// A ledger's usage with its pending charges ([`Ledger::current`]).
struct Current {
    total: ResourceList,
    namespaces: BTreeSet<String>,
    touched: HashMap<(String, String), GangTally>,
    claims: BTreeSet<(String, String)>,
}

/// The folded part of a ledger's usage, computed once when the ledger is read or reconciled
/// (admission adds the pending charges on top).
#[derive(Debug, Clone, Default, PartialEq)]
struct Base {
    /// Σ of the plain pods' requests, all namespaces.
    plain: ResourceList,
    /// Σ of every folded gang's total (members plus placeholders).
    gangs_total: ResourceList,
    tallies: HashMap<(String, String), GangTally>,
    /// The folded shared claims, by (namespace, claim); their devices are in `plain`.
    claims: BTreeSet<(String, String)>,
    /// Namespaces whose folded pods count anything.
    namespaces: BTreeSet<String>,
}

impl Base {
    fn of<'a>(folded: impl Iterator<Item = &'a Folded>) -> Base {
        let mut base = Base::default();
        for f in folded {
            add_to(&mut base.plain, &f.plain, 1);
            let mut uses = f.plain.values().any(|q| q.nanos() != 0);
            for (claim, devices) in &f.claims {
                add_to(&mut base.plain, devices, 1);
                uses |= devices.values().any(|q| q.nanos() != 0);
                base.claims.insert((f.namespace.clone(), claim.clone()));
            }
            for (gang, members) in &f.gangs {
                let tally = base.tallies.entry((f.namespace.clone(), gang.clone())).or_default();
                for ((requests, size), (count, terminating)) in members {
                    uses |= requests.values().any(|q| q.nanos() != 0);
                    for i in 0..*count {
                        tally.add(requests.iter().map(|(k, v)| (k.as_str(), *v)), *size, i < *terminating);
                    }
                }
            }
            if uses {
                base.namespaces.insert(f.namespace.clone());
            }
        }
        for tally in base.tallies.values() {
            add_to(&mut base.gangs_total, &tally.total(), 1);
        }
        base
    }
}

/// How admission's charge went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// Written now (the ledger changed; it must be committed before the pod is admitted).
    New,
    /// The key was charged before (a re-sent admission): nothing to write.
    Already,
    /// Dry run: it would fit; nothing written.
    WouldFit,
}

/// One team's ledger, decoded from its ConfigMap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    /// Pending charges, by key (and, from ledgers written before folding, seen ones: the next
    /// reconcile folds them).
    entries: BTreeMap<String, (Entry, String)>,
    /// The leader's counts per namespace, by key (`n.NAMESPACE`). Shared by copies, as `base`:
    /// only a reconcile replaces them, so a round's copy costs its pending charges, not each gang.
    folded: Arc<BTreeMap<String, (Folded, String)>>,
    /// Replicas' allowances, by key (`a.HOLDER`).
    allowances: BTreeMap<String, (Allowance, String)>,
    /// When a writer last asked every holder to give its allowance back (unix milliseconds),
    /// as stored.
    drain: Option<(i64, String)>,
    base: Arc<Base>,
    /// Data values that do not decode (someone edited the object): admission refuses until the
    /// reconciler rewrites it.
    unreadable: BTreeMap<String, String>,
    bytes: usize,
    /// The leader has reconciled it against the pods at least once.
    pub reconciled: bool,
    /// Its last reconcile was by a leader that knows allowances ([`ALLOWANCES_ANNOTATION`]).
    pub allowances_known: bool,
    /// Its last reconcile was by a leader that knows shared claims ([`CLAIMS_ANNOTATION`]).
    pub claims_known: bool,
    /// How many ledgers share its object (a cohort's teams, each a part of it): its charges
    /// may take that share of [`MAX_BYTES`] and [`MAX_ENTRIES`] (0 is read as 1).
    pub sharing: usize,
}

impl Ledger {
    /// A ledger from its ConfigMap's data and whether the reconciled annotation is set.
    pub fn from_data(data: &BTreeMap<String, String>, reconciled: bool) -> Ledger {
        let mut ledger = Ledger { reconciled, ..Ledger::default() };
        let mut members = 0;
        let mut folded = BTreeMap::new();
        for (key, value) in data {
            ledger.bytes += Entry::bytes(key, value);
            let decoded = if key.starts_with(FOLDED_PREFIX) {
                Folded::decode(value, &mut members).map(|f| {
                    folded.insert(key.clone(), (f, value.clone()));
                })
            } else if key.starts_with(ALLOWANCE_PREFIX) {
                Allowance::decode(value).map(|a| {
                    ledger.allowances.insert(key.clone(), (a, value.clone()));
                })
            } else if key == DRAIN_KEY {
                parse_drain(value).map(|at| ledger.drain = Some((at, value.clone())))
            } else {
                Entry::decode(value).map(|e| {
                    ledger.entries.insert(key.clone(), (e, value.clone()));
                })
            };
            if let Err(e) = decoded {
                ledger.unreadable.insert(key.clone(), e.to_string());
            }
        }
        ledger.base = Arc::new(Base::of(folded.values().map(|(f, _)| f)));
        ledger.folded = Arc::new(folded);
        ledger
    }

    /// The ConfigMap data (unreadable values are dropped: only the reconciler writes with any).
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let pending = self.entries.iter().map(|(k, (_, v))| (k.clone(), v.clone()));
        let allowances = self.allowances.iter().map(|(k, (_, v))| (k.clone(), v.clone()));
        let drain = self.drain.iter().map(|(_, v)| (DRAIN_KEY.to_string(), v.clone()));
        pending
            .chain(self.folded.iter().map(|(k, (_, v))| (k.clone(), v.clone())))
            .chain(allowances)
            .chain(drain)
            .collect()
    }

    /// The allowance held under `key`, if any.
    pub fn allowance(&self, key: &str) -> Option<&Allowance> {
        self.allowances.get(key).map(|(a, _)| a)
    }

    /// Sets (or, with `None` or nothing reserved, removes) the allowance held under `key`.
    pub fn set_allowance(&mut self, key: &str, allowance: Option<Allowance>) {
        if let Some((_, old)) = self.allowances.remove(key) {
            self.bytes -= Entry::bytes(key, &old);
        }
        if let Some(a) = allowance.filter(|a| a.reserved.values().any(|q| q.nanos() != 0)) {
            let value = a.encode();
            self.bytes += Entry::bytes(key, &value);
            self.allowances.insert(key.to_string(), (a, value));
        }
    }

    /// The ledger as it would be if every holder gave its allowance back.
    pub fn without_allowances(&self) -> Ledger {
        let mut bare = self.clone();
        for key in self.allowances.keys() {
            bare.set_allowance(key, None);
        }
        bare
    }

    /// Allowances held, by key.
    pub fn allowances(&self) -> impl Iterator<Item = (&str, &Allowance)> {
        self.allowances.iter().map(|(k, (a, _))| (k.as_str(), a))
    }

    /// When a writer last asked the holders to give their allowances back (unix ms).
    pub fn drain_requested(&self) -> Option<i64> {
        self.drain.as_ref().map(|(at, _)| *at)
    }

    /// Asks every holder to give its allowance back (`at`: unix milliseconds).
    pub fn request_drain(&mut self, at: i64) {
        let value = at.to_string();
        if let Some((_, old)) = self.drain.take() {
            self.bytes -= Entry::bytes(DRAIN_KEY, &old);
        }
        self.bytes += Entry::bytes(DRAIN_KEY, &value);
        self.drain = Some((at, value));
    }

    /// Writes the charge of a pod already admitted (from an allowance) under `key`, unless the
    /// key is charged already. Never refused: the pod is in; the allowance it came from, which
    /// its holder shrinks in the same write, covered it until now.
    pub fn settle(&mut self, key: &str, entry: &Entry) {
        if !self.contains(key) {
            self.insert(key.to_string(), entry.clone());
        }
    }

    /// What is left under each limit (charge units; negative where usage is above it).
    pub fn free(&self, quota: &Quota) -> crate::model::policy::quota::Charge {
        let used = quota.charge(&self.usage().0);
        quota.limits.iter().map(|(r, limit)| (r.clone(), limit - used.get(r).copied().unwrap_or(0))).collect()
    }

    /// The most pending charges and bytes this ledger may hold: its share of its object.
    pub fn bounds(&self) -> (usize, usize) {
        let sharing = self.sharing.max(1);
        (MAX_ENTRIES / sharing, MAX_BYTES / sharing)
    }

    /// Every value decoded (none edited into something else).
    pub fn readable(&self) -> bool {
        self.unreadable.is_empty()
    }

    /// Pending charges.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No pending charge.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of data the object holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Pending charges.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, (e, _))| (k.as_str(), e))
    }

    /// The leader's counts, one per namespace with pods.
    pub fn folded(&self) -> impl Iterator<Item = &Folded> {
        self.folded.values().map(|(f, _)| f)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.entries.contains_key(key)
    }

    fn insert(&mut self, key: String, entry: Entry) {
        let value = entry.encode();
        self.bytes += Entry::bytes(&key, &value);
        if let Some((_, old)) = self.entries.insert(key.clone(), (entry, value)) {
            self.bytes -= Entry::bytes(&key, &old);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some((_, old)) = self.entries.remove(key) {
            self.bytes -= Entry::bytes(key, &old);
        }
    }

    /// Usage with the pending charges counted in: the total, the namespaces that use anything,
    /// the tallies of the gangs pending charges touch (others are in `self.base`), and the
    /// shared claims pending charges count (folded ones are in `self.base`).
    fn current(&self) -> Current {
        let mut plain = self.base.plain.clone();
        let mut touched: HashMap<(String, String), GangTally> = HashMap::new();
        let mut namespaces = self.base.namespaces.clone();
        let mut claims = BTreeSet::new();
        for (entry, _) in self.entries.values() {
            for (claim, devices) in &entry.claims {
                let id = (entry.namespace.clone(), claim.clone());
                if !self.base.claims.contains(&id) && !claims.contains(&id) {
                    add_to(&mut plain, devices, 1);
                    claims.insert(id);
                    namespaces.insert(entry.namespace.clone());
                }
            }
            if let Some((gang, _)) = &entry.gang {
                let id = (entry.namespace.clone(), gang.clone());
                if !touched.contains_key(&id) {
                    touched.insert(id.clone(), self.base.tallies.get(&id).cloned().unwrap_or_default());
                }
            }
            entry.counts_in(&mut touched, &mut plain);
            if entry.requests.values().any(|q| q.nanos() != 0) {
                namespaces.insert(entry.namespace.clone());
            }
        }
        let mut total = plain;
        add_to(&mut total, &self.base.gangs_total, 1);
        for (allowance, _) in self.allowances.values() {
            add_to(&mut total, &allowance.reserved, 1);
        }
        for (id, tally) in &touched {
            add_to(&mut total, &tally.total(), 1);
            if let Some(folded) = self.base.tallies.get(id) {
                add_to(&mut total, &folded.total(), -1);
            }
        }
        Current { total, namespaces, touched, claims }
    }

    /// True when a folded pod or a pending charge of `namespace` names the shared `claim`.
    fn holds_claim(&self, current: &Current, namespace: &str, claim: &str) -> bool {
        let id = (namespace.to_string(), claim.to_string());
        self.base.claims.contains(&id) || current.claims.contains(&id)
    }

    /// Usage in resource terms (plain pods plus each gang's [`GangTally`] total: every member,
    /// placeholders for missing ones; folded and pending alike), and the namespaces that use
    /// anything.
    pub fn usage(&self) -> (ResourceList, BTreeSet<String>) {
        let Current { total, namespaces, .. } = self.current();
        (total, namespaces)
    }

    /// Decides `request` against this ledger and, when it fits (and is not a dry run), charges
    /// it under `key`. The same formula as the in-memory books ([`super::asks`], [`decide`]).
    pub fn charge(
        &mut self,
        quota: &Quota,
        request: &QuotaRequest<'_>,
        key: &str,
        now: i64,
    ) -> Result<Charged, Refusal> {
        self.charge_in(quota, request, key, now, &BTreeMap::new())
    }

    /// [`Ledger::charge`] for a team of a cohort, whose ledger is one part of the cohort's:
    /// `others` is what the cohort's other teams use (their parts' [`Ledger::usage`]).
    pub fn charge_in(
        &mut self,
        quota: &Quota,
        request: &QuotaRequest<'_>,
        key: &str,
        now: i64,
        others: &BTreeMap<String, ResourceList>,
    ) -> Result<Charged, Refusal> {
        if self.contains(key) {
            return Ok(Charged::Already);
        }
        if !self.reconciled {
            return Err(Refusal::Unknown {
                reason: "its quota ledger has not been reconciled with the team's pods yet (Allot's leader does that \
                         within seconds of start-up); retry shortly"
                    .into(),
            });
        }
        if let Some((key, error)) = self.unreadable.iter().next() {
            return Err(Refusal::Unknown {
                reason: format!(
                    "its quota ledger has an unreadable charge {key:?} ({error}); Allot's leader rewrites it on its next \
                     reconcile; retry shortly"
                ),
            });
        }
        // A leader that cannot read shared claims: charged with the pod, per pod, as it counts them.
        let per_pod;
        let request = if self.claims_known || request.shared_claims.is_empty() {
            request
        } else {
            per_pod = with_claims_per_pod(quota, request);
            &per_pod
        };
        let current = self.current();
        let before = match request.gang {
            Some((gang, _)) => {
                let id = (request.namespace.to_string(), gang.to_string());
                current.touched.get(&id).or_else(|| self.base.tallies.get(&id)).cloned().unwrap_or_default()
            }
            None => GangTally::default(),
        };
        let asks = asks(request, &before, &|claim| self.holds_claim(&current, request.namespace, claim))?;
        decide(quota, request, &current.total, &mut |team| others.get(team).cloned(), &asks, || {
            let mut namespaces = current.namespaces;
            namespaces.insert(request.namespace.to_string());
            namespaces.into_iter().collect()
        })?;
        if request.dry_run {
            return Ok(Charged::WouldFit);
        }
        let entry = Entry::admitted(quota, request, now);
        let size = Entry::bytes(key, &entry.encode());
        let (max_entries, max_bytes) = self.bounds();
        if self.entries.len() >= max_entries || self.bytes + size > max_bytes {
            return Err(Refusal::Unknown {
                reason: format!(
                    "its quota ledger is full ({} pending charges, {} KiB; at most {max_entries} charges not yet seen \
                     by Allot's leader and {} KiB fit in its ledger), so this charge cannot be recorded; Allot \
                     refuses rather than count the pod nowhere; retry shortly",
                    self.entries.len(),
                    self.bytes / 1024,
                    max_bytes / 1024
                ),
            });
        }
        self.insert(key.to_string(), entry);
        Ok(Charged::New)
    }

    /// Brings the ledger in line with the pods of the team the leader's watch sees (`pods`) at
    /// `now`: see the module doc for the rules. A pod is matched by namespace, name and
    /// creationTimestamp (the watch keeps no UID).
    pub fn reconcile(&mut self, pods: &[SeenPod], now: i64) -> Reconciled {
        self.reconcile_with(&Recount::from_pods(pods), now, &|_| false)
    }

    /// [`Ledger::reconcile`], where `deleted` says whether the watch saw a pending charge's pod
    /// deleted after it was charged (it came and went before the leader looked): its charge is
    /// released then rather than at expiry.
    pub fn reconcile_with(&mut self, recount: &Recount, now: i64, deleted: &dyn Fn(&Entry) -> bool) -> Reconciled {
        let mut out = Reconciled { dropped_unreadable: self.unreadable.len(), ..Reconciled::default() };
        self.unreadable.clear();
        let keys: Vec<String> = self.entries.keys().cloned().collect();
        for key in keys {
            let Some((entry, _)) = self.entries.get(&key) else { continue };
            if !recount.knows(&entry.namespace, &entry.name) {
                out.not_looked_up += 1;
                continue;
            }
            let pod = recount.find(&entry.namespace, &entry.name);
            let same = pod.filter(|p| entry.created == 0 || p.created == 0 || entry.created == p.created);
            let counter = match same {
                Some(p) if p.finished => &mut out.released,
                // Counted by this charge until the pod is folded (see FOLD_DELAY_SECS).
                Some(p) if p.young => continue,
                // The watch counts it now (duplicates of one pod included: it is counted once).
                Some(_) => &mut out.seen,
                // Folded by a reconcile before folding existed: the recount replaces it.
                None if entry.seen || deleted(entry) => &mut out.released,
                None if now.saturating_sub(entry.at) > PENDING_TTL_SECS || entry.at > now + PENDING_TTL_SECS => {
                    &mut out.expired
                }
                None => continue,
            };
            *counter += 1;
            self.remove(&key);
        }
        let unchanged = recount.by_namespace.len() == self.folded.len()
            && recount.folded().all(|(k, f)| self.folded.get(&k).is_some_and(|(old, _)| old == f));
        if !unchanged {
            out.refolded = true;
            let folded: BTreeMap<_, _> = recount.folded().map(|(k, f)| (k, (f.clone(), f.encode()))).collect();
            self.folded = Arc::new(folded);
            self.base = Arc::new(Base::of(self.folded.values().map(|(f, _)| f)));
        }
        let expired: Vec<String> =
            self.allowances.iter().filter(|(_, (a, _))| a.until < now).map(|(k, _)| k.clone()).collect();
        for key in expired {
            out.allowances_expired += 1;
            self.allowances.remove(&key);
        }
        if self.drain.as_ref().is_some_and(|(at, _)| at / 1000 + DRAIN_KEEP_SECS < now) {
            self.drain = None;
            out.drain_dropped = true;
        }
        out.allowances_held = self.allowances.len();
        // Unreadable values are gone and the folded ones rewritten: count the bytes again.
        self.bytes = self.to_data().iter().map(|(k, v)| Entry::bytes(k, v)).sum();
        self.reconciled = true;
        out
    }
}

/// `request` with its shared claims' devices among its own requests (no `cl` written).
fn with_claims_per_pod<'a>(quota: &Quota, request: &QuotaRequest<'a>) -> QuotaRequest<'a> {
    let mut requests = request.requests.clone();
    for devices in request.shared_claims.values() {
        add_to(&mut requests, devices, 1);
    }
    QuotaRequest { charge: quota.charge(&requests), requests, shared_claims: SharedClaims::new(), ..request.clone() }
}

/// The requests of the resources `quota` counts (limits and their equivalents): all a ledger
/// keeps of a pod.
pub fn counted(quota: &Quota, requests: &ResourceList) -> ResourceList {
    counted_pairs(quota, requests.iter().map(|(k, v)| (k.as_str(), *v)))
}

/// [`counted`] of (name, amount) pairs: a record's interned requests or claim devices, without
/// a copy of them all first.
pub fn counted_pairs<'a>(quota: &Quota, pairs: impl IntoIterator<Item = (&'a str, Quantity)>) -> ResourceList {
    pairs.into_iter().filter(|(k, v)| quota.counts(k, *v)).map(|(k, v)| (k.to_string(), v)).collect()
}

/// How long a drain request is kept after it was made (seconds): only its holders act on it.
const DRAIN_KEEP_SECS: i64 = 60;

#[cfg(test)]
mod tests;
