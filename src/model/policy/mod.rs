//! Policy files: loading, strict parsing and compilation into an immutable [`PolicySet`].
//!
//! A policy directory holds YAML (or JSON) files, each with one or more documents of
//! `apiVersion: allot.dev/v1alpha1` and a kind: `Cluster`, `Team`, `Placement`, `Rule` or
//! `GangPolicy`; each kind compiles in its own `Compile` impl (`policy::compile`).
//! Loading is all-or-nothing: every error of every file is collected and reported with file,
//! document number and field path, and no partial set is ever produced — so a server never
//! drops to an empty or half policy set because one file is broken.

pub mod cohort;
mod compile;
mod fields;
pub mod model;
pub mod preemption;
pub mod quota;
mod read;
pub mod schema;
pub mod tenancy;
pub mod topology;
mod values;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use globset::{Glob, GlobMatcher};
use serde_json::Value;

use crate::model::dra::DeviceClasses;
use crate::model::expression::{Environment, Expression};
use crate::model::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};
use compile::{Compile, Context, Problems};
pub use model::*;
pub use read::{
    DecodeError, Source, load_dir, parse_documents, parse_policy_documents, policy_files, read_sources, version_of,
};
use read::{Doc, decode_sources, versioned};

/// Every problem found while loading a policy directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadErrors(pub Vec<String>);

impl fmt::Display for LoadErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} policy error(s):", self.0.len())?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadErrors {}

/// Name globs (`vision`, `vision-*`); empty means "everything".
#[derive(Debug, Clone, Default)]
pub struct NameGlobs(Vec<GlobMatcher>);

/// A namespace pattern that is not a glob.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid glob {pattern:?}: {source}")]
pub struct GlobError {
    pub pattern: String,
    pub source: globset::Error,
}

impl GlobError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        "invalid_glob"
    }
}

impl NameGlobs {
    fn compile(patterns: &[String]) -> Result<NameGlobs, GlobError> {
        patterns
            .iter()
            .map(|p| {
                Glob::new(p).map(|g| g.compile_matcher()).map_err(|source| GlobError { pattern: p.clone(), source })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(NameGlobs)
    }

    /// The scope every policy kind has: these namespace globs (none: all) and these teams
    /// (none: any, else the namespace's team must be one of them).
    pub fn in_scope(&self, teams: &[String], namespace: &str, team: Option<&str>) -> bool {
        self.matches_or_empty(namespace) && (teams.is_empty() || team.is_some_and(|t| teams.iter().any(|x| x == t)))
    }

    /// True when a pattern matches (or there are none).
    pub fn matches_or_empty(&self, name: &str) -> bool {
        self.0.is_empty() || self.matches(name)
    }

    /// True when a pattern matches.
    pub fn matches(&self, name: &str) -> bool {
        self.0.iter().any(|g| g.is_match(name))
    }

    /// The patterns as written (`allot compile` turns them into CEL).
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|g| g.glob().glob())
    }
}

/// A compiled `Team`.
#[derive(Debug)]
pub struct Team {
    pub name: String,
    pub names: NameGlobs,
    pub selector: Option<LabelSelector>,
    pub priority: TeamPrioritySpec,
    pub quota: Option<quota::Quota>,
    /// Its `preemption`, over the Cluster's.
    pub preemption: preemption::Preemption,
}

/// A compiled `Placement`.
#[derive(Debug)]
pub struct Placement {
    pub name: String,
    pub spec: PlacementSpec,
    /// `spec.tolerations` as written. The webhook's share of a native split clears the spec's
    /// (the native policy adds them), but `reserveTolerations` stays with the webhook and
    /// judges other pods' tolerations against these.
    pub declared_tolerations: Vec<crate::model::policy::Toleration>,
    pub resources: Arc<ResourceMatcher>,
    pub namespaces: NameGlobs,
    pub when: Option<Expression>,
}

/// A compiled `GangPolicy`, or the defaults when none matches.
#[derive(Debug, Clone)]
pub struct GangPolicy {
    pub name: String,
    pub namespaces: NameGlobs,
    pub teams: Vec<String>,
    pub infer: Vec<crate::model::gang::membership::InferredKind>,
    pub coscheduling_size: Option<u32>,
    pub assembly_timeout: std::time::Duration,
    pub on_timeout: OnTimeout,
    /// How long a released member may stay unbound before its gang has failed to start (and
    /// how long the gang's reservation lasts at most).
    pub start_timeout: std::time::Duration,
    pub on_start_timeout: OnStartTimeout,
    pub starvation_after: std::time::Duration,
    /// The largest gang a Pod may declare or an owner imply.
    pub max_size: u32,
    /// Inferred gangs go to the scheduler's native gang scheduling where the cluster has it.
    pub native_scheduling: bool,
    /// The topology levels its gangs are released inside ([`topology`]); `None`: anywhere.
    pub topology: Option<topology::Topology>,
    /// What a disruption of one released member does to the others.
    pub disruption: Disruption,
}

impl Default for GangPolicy {
    fn default() -> Self {
        GangPolicy {
            name: String::new(),
            namespaces: NameGlobs::default(),
            teams: Vec::new(),
            infer: Vec::new(),
            coscheduling_size: None,
            assembly_timeout: DEFAULT_ASSEMBLY_TIMEOUT,
            on_timeout: OnTimeout::Warn,
            start_timeout: DEFAULT_START_TIMEOUT,
            on_start_timeout: OnStartTimeout::Fail,
            starvation_after: DEFAULT_STARVATION,
            max_size: crate::model::gang::membership::DEFAULT_MAX_GANG_SIZE,
            native_scheduling: false,
            topology: None,
            disruption: Disruption::Gang,
        }
    }
}

/// Default time for a gang's members to all exist.
pub const DEFAULT_ASSEMBLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// Default time a released gang member may stay unbound ([`GangPolicy::start_timeout`]): 10
/// minutes, twice Kueue's `waitForPodsReady` default (which also waits for image pulls and
/// readiness, where this only waits for the bind). It outlasts the scheduler's own waits before
/// a bind: a pod found unschedulable once is retried at least every 5 minutes
/// (`podMaxInUnschedulablePodsDuration`), and a member that preempts waits for its victims'
/// termination grace period. A gang that cannot start holds its reservation this long.
pub const DEFAULT_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// Default wait after which a gang that does not fit stops backfill past it.
pub const DEFAULT_STARVATION: std::time::Duration = std::time::Duration::from_secs(1800);

/// A duration field (`30m`) that humantime cannot read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid duration {raw:?} ({source}); write e.g. 90s, 10m, 1h")]
pub struct DurationError {
    pub raw: String,
    pub source: humantime::DurationError,
}

impl DurationError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        "invalid_duration"
    }
}

fn parse_duration(raw: &str) -> Result<std::time::Duration, DurationError> {
    humantime::parse_duration(raw).map_err(|source| DurationError { raw: raw.to_string(), source })
}

/// Which objects a `Rule` sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KindMatch {
    /// Every Pod and every Pod template.
    Pods,
    /// Objects of this kind (and group, if given).
    Kind { group: Option<String>, kind: String },
    /// Every object.
    Any,
}

impl KindMatch {
    /// Whether a rule of this kind sees an object of `group`/`kind`, or (`is_pod`) a Pod or a
    /// Pod template seen as a Pod.
    pub fn matches(&self, group: &str, kind: &str, is_pod: bool) -> bool {
        match self {
            KindMatch::Any => true,
            KindMatch::Pods => is_pod,
            KindMatch::Kind { group: g, kind: k } => !is_pod && k == kind && g.as_deref().is_none_or(|g| g == group),
        }
    }

    fn parse(s: &str) -> KindMatch {
        match s {
            "*" => KindMatch::Any,
            "Pod" => KindMatch::Pods,
            other => match other.rsplit_once('/') {
                Some((group, kind)) => KindMatch::Kind { group: Some(group.to_string()), kind: kind.to_string() },
                None => KindMatch::Kind { group: None, kind: other.to_string() },
            },
        }
    }
}

/// A compiled `Rule`.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    pub spec: RuleSpec,
    pub kinds: Vec<KindMatch>,
    pub namespaces: NameGlobs,
    pub expression: Expression,
    pub message_expression: Option<Expression>,
}

impl Rule {
    /// The rule's compiled expressions: `expression`, then `messageExpression` if any.
    pub fn expressions(&self) -> impl Iterator<Item = &Expression> {
        std::iter::once(&self.expression).chain(&self.message_expression)
    }
}

/// The loaded, compiled, immutable policy set. Cheap to share (`Arc`), swapped whole on reload.
#[derive(Debug)]
pub struct PolicySet {
    pub accelerators: Arc<ResourceMatcher>,
    pub checks: ChecksSpec,
    pub allowed_accelerators: Option<ResourceMatcher>,
    pub priority: ClusterPrioritySpec,
    /// The Cluster's `preemption`: what gangs in no team's namespace may do, and how long their
    /// pods run before they may be evicted.
    pub preemption: preemption::Preemption,
    pub teams: Vec<Team>,
    /// The teams' cohorts (`quota.cohort`).
    pub cohorts: cohort::Cohorts,
    pub placements: Vec<Placement>,
    pub rules: Vec<Rule>,
    pub gang_policies: Vec<GangPolicy>,
    /// The Cluster's DRA DeviceClass mapping: what claim devices count as (the policy's own
    /// mapping and, unless it says not to, the cluster's DeviceClasses' extended resources).
    pub device_classes: Arc<DeviceClasses>,
    /// The classes mapped from the cluster's DeviceClasses (class → resource), not the policy.
    pub discovered_classes: BTreeMap<String, String>,
    /// Trust and bounds for what tenants write (Cluster `externalSchedulers`, `trust`,
    /// `accelerators.maxAmount`).
    pub tenancy: tenancy::TenantPolicy,
    pub env: Environment,
    /// Short hash of every file's path and content: equal on replicas serving the same policies.
    pub version: String,
    /// The sources the set was compiled from.
    pub files: Vec<PathBuf>,
    /// What of an object under review no expression of this set reads, so the server need not
    /// build it ([`Unread`]). Decided once here, not per request, from this set's own Rules and
    /// Placements: a set derived by removing some (the native split) may keep it, one that
    /// added any must compute it again.
    pub unread: Unread,
    /// Every Rule and Placement expression is linear ([`crate::model::expression::Expression::is_linear`]):
    /// a small review's evaluation is then bounded by its size, and the server may run it in
    /// place. Decided once here, not per request.
    pub linear: bool,
}

/// The annotation `kubectl apply` keeps its copy of the manifest in.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The prefix Kubernetes reserves for its own PriorityClasses (`system-node-critical`,
/// `system-cluster-critical`: priorities above a billion, usable in any namespace since 1.17).
pub const SYSTEM_PRIORITY_PREFIX: &str = "system-";

/// Parts of an object under review (`request.object`, `request.oldObject`) that Allot's own
/// checks never read and that no Rule or Placement expression of a set can read: the server
/// skips them while decoding a review, so they are never built. On a Pod applied with
/// `kubectl apply` they are about a fifth of what decoding and dropping it costs the server
/// (a third with glibc's malloc): the projected service account token volume is on every Pod,
/// and the last-applied copy is an escaped string as long as the manifest. A set whose expressions may read one of them (`object.spec.volumes`,
/// `object.metadata.annotations[...]`, `object` whole, the same on `oldObject` or `workload`)
/// keeps it. `metadata.managedFields` is never bound to CEL, so it is always skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unread {
    /// `metadata.annotations[`[`LAST_APPLIED_ANNOTATION`]`]` (the other annotations are kept).
    pub last_applied: bool,
    /// The object's own `spec.volumes` (a Pod's; a template's are kept).
    pub volumes: bool,
}

impl Unread {
    /// Nothing left out: the object decoded whole (but for `managedFields`).
    pub const NOTHING: Unread = Unread { last_applied: false, volumes: false };
    /// Every part left out (a set none of whose expressions reads them, as the shipped one).
    pub const EVERYTHING: Unread = Unread { last_applied: true, volumes: true };

    /// True when every part `self` leaves out, `other` leaves out too: an object decoded
    /// leaving out `self` can be answered by a set that leaves out `other`.
    pub fn within(self, other: Unread) -> bool {
        (!self.last_applied || other.last_applied) && (!self.volumes || other.volumes)
    }

    /// What expressions with these needs leave unread.
    pub fn of(needs: &crate::model::expression::Needs) -> Unread {
        Unread {
            last_applied: !needs.reads_object_at(&["metadata", "annotations", LAST_APPLIED_ANNOTATION]),
            volumes: !needs.reads_object_at(&["spec", "volumes"]),
        }
    }
}

/// Every CEL expression of a set evaluated on objects under review: each Rule's expression and
/// message, each Placement's `when`.
fn reviewed_expressions<'s>(rules: &'s [Rule], placements: &'s [Placement]) -> impl Iterator<Item = &'s Expression> {
    rules.iter().flat_map(Rule::expressions).chain(placements.iter().filter_map(|p| p.when.as_ref()))
}

/// What those expressions read, together.
fn expression_needs(rules: &[Rule], placements: &[Placement]) -> crate::model::expression::Needs {
    let mut needs = crate::model::expression::Needs::default();
    for expression in reviewed_expressions(rules, placements) {
        needs.merge(expression.needs());
    }
    needs
}

/// What the policies build on that is read from the cluster rather than written in them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ClusterFacts {
    /// DeviceClass name → its `spec.extendedResourceName`, for classes that have one.
    pub extended_resource_names: BTreeMap<String, String>,
}

impl ClusterFacts {
    /// The extended resource of every DeviceClass that names one.
    pub fn from_device_classes<'a>(
        classes: impl IntoIterator<Item = &'a k8s_openapi::api::resource::v1::DeviceClass>,
    ) -> ClusterFacts {
        let extended_resource_names = classes
            .into_iter()
            .filter_map(|class| {
                let name = class.metadata.name.clone()?;
                let resource = class.spec.as_ref()?.extended_resource_name.clone().filter(|r| !r.is_empty())?;
                Some((name, resource))
            })
            .collect();
        ClusterFacts { extended_resource_names }
    }

    /// The facts among Kubernetes objects (manifests): `resource.k8s.io` DeviceClasses with an
    /// extended resource name.
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a Value>) -> ClusterFacts {
        let mut facts = ClusterFacts::default();
        for object in objects {
            let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            if !api_version.starts_with("resource.k8s.io/")
                || object.get("kind").and_then(Value::as_str) != Some("DeviceClass")
            {
                continue;
            }
            let name = object.pointer("/metadata/name").and_then(Value::as_str);
            let resource = object.pointer("/spec/extendedResourceName").and_then(Value::as_str);
            if let (Some(name), Some(resource)) = (name, resource.filter(|r| !r.is_empty())) {
                facts.extended_resource_names.insert(name.to_string(), resource.to_string());
            }
        }
        facts
    }
}

/// Compiles policy sources into a set, or returns every error found.
pub fn compile(sources: &[Source]) -> Result<PolicySet, LoadErrors> {
    compile_with(sources, &ClusterFacts::default())
}

/// [`compile`], with what is read from the cluster (`facts`): DeviceClasses whose extended
/// resource is an accelerator count as it, where the Cluster policy does not map them and does
/// not turn that off (`dra.fromDeviceClasses: false`). The set's version then says so
/// (`VERSION+dc-HASH`), so that replicas that read different classes do not look alike.
pub fn compile_with(sources: &[Source], facts: &ClusterFacts) -> Result<PolicySet, LoadErrors> {
    let mut errors = Vec::new();
    let docs = by_kind(decode_sources(sources, &mut errors), &mut errors);
    let cluster_location = docs.cluster.as_ref().map(|(location, _)| location.clone());
    let cluster = compile_cluster(docs.cluster, &mut errors);
    let accelerators = Arc::new(match &cluster.accelerators.resources {
        Some(list) => ResourceMatcher::new(list),
        None => ResourceMatcher::new(DEFAULT_ACCELERATORS),
    });
    let team_names: HashSet<String> = docs.teams.iter().map(|(_, n, _)| n.clone()).collect();
    let (device_classes, discovered_classes) =
        device_classes_of(&cluster, cluster_location.as_deref(), &accelerators, facts, &mut errors);
    // (A bad Cluster minRuntime was reported when the Cluster compiled.)
    let cluster_preemption = preemption::Preemption::default().overlaid(&cluster.preemption).unwrap_or_default();
    let cx = Context {
        team_names: &team_names,
        accelerators: &accelerators,
        device_classes: &device_classes,
        preemption: cluster_preemption,
    };
    let team_locations: HashMap<String, String> = docs.teams.iter().map(|(l, n, _)| (n.clone(), l.clone())).collect();
    let teams = compile_all(docs.teams, &cx, &mut errors);
    let location = |team: &str| team_locations.get(team).cloned().unwrap_or_default();
    let cohorts = cohort::compile(&teams, &location).unwrap_or_else(|problems| {
        errors.extend(problems);
        cohort::Cohorts::default()
    });
    let placements = compile_all(docs.placements, &cx, &mut errors);
    let rules = compile_all(docs.rules, &cx, &mut errors);
    let gang_policies = compile_all(docs.gangs, &cx, &mut errors);

    if !errors.is_empty() {
        return Err(LoadErrors(errors));
    }
    let allowed_accelerators =
        cluster.accelerators.checks.allowed_resources.as_ref().map(|a| ResourceMatcher::new(&a.names));
    let linear = reviewed_expressions(&rules, &placements).all(Expression::is_linear);
    let unread = Unread::of(&expression_needs(&rules, &placements));
    Ok(PolicySet {
        linear,
        unread,
        tenancy: tenancy::TenantPolicy::from_cluster(&cluster),
        device_classes: Arc::new(device_classes),
        version: versioned(version_of(sources), &discovered_classes),
        discovered_classes,
        env: Environment::new(accelerators.clone()),
        accelerators,
        checks: cluster.accelerators.checks,
        allowed_accelerators,
        priority: cluster.priority,
        preemption: cluster_preemption,
        teams,
        cohorts,
        placements,
        rules,
        gang_policies,
        files: sources.iter().map(|s| PathBuf::from(&s.name)).collect(),
    })
}

/// One kind's documents, each as (location, name, spec).
type Specs<S> = Vec<(String, String, S)>;

/// A set's documents sorted by kind: the kinds compile in an order (the Cluster first), not
/// in the files' order.
struct ByKind {
    cluster: Option<(String, ClusterSpec)>,
    teams: Specs<TeamSpec>,
    placements: Specs<PlacementSpec>,
    rules: Specs<RuleSpec>,
    gangs: Specs<GangPolicySpec>,
}

/// Sorts decoded documents by kind, refusing a second document of one kind and name and a
/// second Cluster, so that every later step can look a document up by its name.
fn by_kind(docs: Vec<(String, Metadata, Doc)>, errors: &mut Vec<String>) -> ByKind {
    let mut sorted =
        ByKind { cluster: None, teams: Vec::new(), placements: Vec::new(), rules: Vec::new(), gangs: Vec::new() };
    let mut seen: HashSet<(&'static str, String)> = HashSet::new();
    for (location, meta, doc) in docs {
        let kind = match &doc {
            Doc::Cluster(_) => "Cluster",
            Doc::Team(_) => "Team",
            Doc::Placement(_) => "Placement",
            Doc::Rule(_) => "Rule",
            Doc::GangPolicy(_) => "GangPolicy",
        };
        if !seen.insert((kind, meta.name.clone())) {
            errors.push(format!("{location}: metadata.name: a {kind} named {:?} is already defined", meta.name));
            continue;
        }
        match doc {
            Doc::Cluster(spec) => match &sorted.cluster {
                Some((first, _)) => {
                    errors.push(format!("{location}: only one Cluster document is allowed (first: {first})"))
                }
                None => sorted.cluster = Some((location, spec)),
            },
            Doc::Team(spec) => sorted.teams.push((location, meta.name, spec)),
            Doc::Placement(spec) => sorted.placements.push((location, meta.name, spec)),
            Doc::Rule(spec) => sorted.rules.push((location, meta.name, spec)),
            Doc::GangPolicy(spec) => sorted.gangs.push((location, meta.name, spec)),
        }
    }
    sorted
}

/// The Cluster document compiled first, since the other kinds read its accelerator names; it
/// consults no other document, so its context is empty. No Cluster: the defaults.
fn compile_cluster(cluster: Option<(String, ClusterSpec)>, errors: &mut Vec<String>) -> ClusterSpec {
    let Some((location, spec)) = cluster else { return ClusterSpec::default() };
    let none = HashSet::new();
    let placeholder = Arc::new(ResourceMatcher::new(DEFAULT_ACCELERATORS));
    let no_classes = DeviceClasses::default();
    let cx = Context {
        team_names: &none,
        accelerators: &placeholder,
        device_classes: &no_classes,
        preemption: preemption::Preemption::default(),
    };
    spec.compile(String::new(), &cx, &mut Problems::new(&location, errors)).unwrap_or_default()
}

/// The DRA DeviceClass mapping team quotas weigh devices by: the Cluster's own (checked
/// against its accelerator names, problems under `location`) and, unless it turns that off,
/// the cluster's classes (`facts`) whose extended resource is an accelerator.
fn device_classes_of(
    cluster: &ClusterSpec,
    location: Option<&str>,
    accelerators: &ResourceMatcher,
    facts: &ClusterFacts,
    errors: &mut Vec<String>,
) -> (DeviceClasses, BTreeMap<String, String>) {
    let device_classes = match location {
        Some(location) => compile::device_classes(&cluster.dra, accelerators, &mut Problems::new(location, errors)),
        None => DeviceClasses::default(),
    };
    if cluster.dra.from_device_classes.unwrap_or(true) {
        compile::with_discovered_classes(device_classes, facts, accelerators)
    } else {
        (device_classes, BTreeMap::new())
    }
}

/// Compiles every document of one kind, in order, keeping those that compiled.
fn compile_all<S: Compile>(
    specs: Vec<(String, String, S)>,
    cx: &Context<'_>,
    errors: &mut Vec<String>,
) -> Vec<S::Output> {
    specs
        .into_iter()
        .filter_map(|(location, name, spec)| spec.compile(name, cx, &mut Problems::new(&location, errors)))
        .collect()
}

impl PolicySet {
    /// The `preemption` of `team` (the Cluster's for a namespace of no team).
    pub fn preemption_of(&self, team: Option<&Team>) -> preemption::Preemption {
        team.map_or(self.preemption, |t| t.preemption)
    }

    /// The first GangPolicy whose scope matches, or the defaults.
    pub fn gang_policy(&self, namespace: &str, team: Option<&str>) -> std::borrow::Cow<'_, GangPolicy> {
        self.gang_policies
            .iter()
            .find(|g| g.namespaces.in_scope(&g.teams, namespace, team))
            .map_or_else(|| std::borrow::Cow::Owned(GangPolicy::default()), std::borrow::Cow::Borrowed)
    }

    /// The gang of a Pod under the GangPolicy of its namespace and team (`infer`,
    /// `coschedulingSize`): the one place admission, the controller and `allot check` find
    /// gangs, so they always agree on who is a member.
    pub fn gang_of(
        &self,
        facts: &crate::model::gang::membership::PodFacts<'_>,
        namespace: &str,
        team: Option<&str>,
    ) -> Result<Option<crate::model::gang::membership::Membership>, crate::model::gang::membership::GangMetadataError>
    {
        let policy = self.gang_policy(namespace, team);
        crate::model::gang::membership::membership(facts, &policy.infer, policy.coscheduling_size, policy.max_size)
    }

    /// Why the topology level a gang member asks for (`allot.dev/topology`) is not one its
    /// GangPolicy allows (never a looser one, never a way out of the levels the platform set);
    /// `None` when it asks none or an allowed one. Judged at CREATE only: a member admitted
    /// before a policy change keeps its gang (the controller then uses the policy's levels).
    pub fn topology_refusal(
        &self,
        facts: &crate::model::gang::membership::PodFacts<'_>,
        namespace: &str,
        team: Option<&str>,
    ) -> Option<String> {
        let asked = facts.annotations.get(topology::TOPOLOGY_ANNOTATION)?;
        let refusal = match &self.gang_policy(namespace, team).topology {
            Some(levels) => levels.for_gang(Some(asked)).err(),
            None => Some(topology::no_levels(asked)),
        };
        refusal.map(|r| r.to_string())
    }

    /// Counts of each kind, for logs and `/readyz`.
    pub fn summary(&self) -> BTreeMap<&'static str, usize> {
        BTreeMap::from([
            ("teams", self.teams.len()),
            ("placements", self.placements.len()),
            ("rules", self.rules.len()),
            ("files", self.files.len()),
        ])
    }
}

#[cfg(test)]
mod tests;
