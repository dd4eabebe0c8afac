//! Compilation per kind: one [`Compile`] impl per spec type (in the manner of linkerd's
//! `Validate<T>`), so what a Team, Placement, Rule, GangPolicy or Cluster document must satisfy
//! is read in one place. [`super::compile`] only sorts documents by kind and assembles the set.
//!
//! Problems accumulate instead of stopping at the first: the person fixing a policy wants every
//! one at once, each prefixed with its file, document and field path ([`Problems`]).

use std::collections::HashSet;
use std::fmt::Display;
use std::sync::Arc;

use super::{
    ClusterSpec, DEFAULT_ASSEMBLY_TIMEOUT, DEFAULT_START_TIMEOUT, DEFAULT_STARVATION, GangPolicy, GangPolicySpec,
    KindMatch, NameGlobs, Placement, PlacementSpec, Rule, RuleSpec, SelectorOperator, Team, TeamSpec, parse_duration,
    quota, values,
};
use crate::model::dra::{ClassWeight, DeviceClasses};
use crate::model::expression::Expression;
use crate::model::resources::ResourceMatcher;

/// The problems of one document, each written as `LOCATION: field: problem`.
pub(super) struct Problems<'a> {
    location: &'a str,
    errors: &'a mut Vec<String>,
}

impl<'a> Problems<'a> {
    pub(super) fn new(location: &'a str, errors: &'a mut Vec<String>) -> Self {
        Problems { location, errors }
    }

    /// Records one problem; `what` starts with the field path (`spec.when: …`).
    pub(super) fn push(&mut self, what: impl Display) {
        self.errors.push(format!("{}: {what}", self.location));
    }

    /// Records each problem of a `field: problem` list (the [`values`] checks).
    fn extend(&mut self, problems: impl IntoIterator<Item = impl Display>) {
        for p in problems {
            self.push(p);
        }
    }

    /// The value, or `None` with the error recorded under `field`.
    fn ok<T, E: Display>(&mut self, field: &str, result: Result<T, E>) -> Option<T> {
        result.map_err(|e| self.push(format_args!("{field}: {e}"))).ok()
    }
}

/// What a document's compilation may consult besides its own spec: facts from other documents.
pub(super) struct Context<'a> {
    /// Every Team defined in the set, for `spec.match.teams`.
    pub team_names: &'a HashSet<String>,
    /// The Cluster's accelerator names: a Placement's default `resources`.
    pub accelerators: &'a Arc<ResourceMatcher>,
    /// The Cluster's DRA DeviceClasses: a team quota weighs their devices.
    pub device_classes: &'a DeviceClasses,
    /// The Cluster's `preemption`: what a Team's overrides.
    pub preemption: super::preemption::Preemption,
}

impl Context<'_> {
    /// `spec.match.teams` names only Teams that exist.
    fn check_teams(&self, teams: &[String], problems: &mut Problems<'_>) {
        for t in teams.iter().filter(|t| !self.team_names.contains(*t)) {
            problems.push(format_args!("spec.match.teams: no Team named {t:?}"));
        }
    }
}

/// One kind's compilation: check the spec, report every problem, and build the compiled form
/// when nothing prevents it (`None` when something does; the problem is in `problems`).
pub(super) trait Compile {
    type Output;
    fn compile(self, name: String, cx: &Context<'_>, problems: &mut Problems<'_>) -> Option<Self::Output>;
}

impl Compile for TeamSpec {
    type Output = Team;

    fn compile(self, name: String, cx: &Context<'_>, problems: &mut Problems<'_>) -> Option<Team> {
        let spec = self;
        if spec.namespaces.names.is_empty() && spec.namespaces.selector.is_none() {
            problems.push("spec.namespaces: give names, a selector, or both");
        }
        if let Some(sel) = &spec.namespaces.selector {
            for (i, req) in sel.match_expressions.iter().enumerate() {
                let needs_values = matches!(req.operator, SelectorOperator::In | SelectorOperator::NotIn);
                if needs_values == req.values.is_empty() {
                    problems.push(format_args!(
                        "spec.namespaces.selector.matchExpressions[{i}]: operator {:?} {} values",
                        req.operator,
                        if needs_values { "needs" } else { "takes no" }
                    ));
                }
            }
        }
        if let (Some(default), Some(allowed)) = (&spec.priority.default, &spec.priority.allowed)
            && !allowed.contains(default)
        {
            problems
                .push(format_args!("spec.priority.default: {default:?} is not in spec.priority.allowed {allowed:?}"));
        }
        if let (Some(default), None) = (&spec.priority.default, &spec.priority.allowed)
            && default.starts_with(super::SYSTEM_PRIORITY_PREFIX)
        {
            problems.push(format_args!(
                "spec.priority.default: {default:?} is a system priority class, which a team without \
                 spec.priority.allowed may not use: list it there to give it to the team's pods"
            ));
        }
        problems.extend(values::team_priority(&spec.priority));
        // The quota's error already starts with its field path below `spec.`.
        let quota =
            match spec.quota.as_ref().map(|q| quota::Quota::compile_with_classes(q, cx.device_classes)).transpose() {
                Ok(q) => q,
                Err(e) => {
                    problems.push(format_args!("spec.{e}"));
                    None
                }
            };
        let preemption = cx.preemption.overlaid(&spec.preemption).unwrap_or_else(|e| {
            problems.push(format_args!("spec.{e}"));
            cx.preemption
        });
        let names = problems.ok("spec.namespaces.names", NameGlobs::compile(&spec.namespaces.names))?;
        Some(Team { name, names, selector: spec.namespaces.selector, priority: spec.priority, quota, preemption })
    }
}

impl Compile for PlacementSpec {
    type Output = Placement;

    fn compile(self, name: String, cx: &Context<'_>, problems: &mut Problems<'_>) -> Option<Placement> {
        let spec = self;
        cx.check_teams(&spec.scope.teams, problems);
        if spec.tolerations.is_empty() && spec.node_selector.is_empty() && spec.node_affinity.is_empty() {
            problems.push("spec: a Placement needs tolerations, nodeSelector or nodeAffinity");
        }
        problems.extend(values::placement(&spec));
        let when = problems.ok("spec.when", spec.when.as_deref().map(Expression::compile).transpose())?;
        let namespaces = problems.ok("spec.match.namespaces", NameGlobs::compile(&spec.scope.namespaces))?;
        let resources = match &spec.resources {
            Some(list) => Arc::new(ResourceMatcher::new(list)),
            None => cx.accelerators.clone(),
        };
        let declared_tolerations = spec.tolerations.clone();
        Some(Placement { name, spec, declared_tolerations, resources, namespaces, when })
    }
}

impl Compile for RuleSpec {
    type Output = Rule;

    fn compile(self, name: String, cx: &Context<'_>, problems: &mut Problems<'_>) -> Option<Rule> {
        let spec = self;
        cx.check_teams(&spec.rule_match.teams, problems);
        if spec.message.is_none() && spec.message_expression.is_none() {
            problems.push("spec: a Rule needs message or messageExpression");
        }
        if spec.rule_match.kinds.is_empty() {
            problems.push("spec.match.kinds: must not be empty");
        }
        // All three are compiled (and reported) even when an earlier one fails.
        let expression = problems.ok("spec.expression", Expression::compile(&spec.expression));
        let message_expression = problems
            .ok("spec.messageExpression", spec.message_expression.as_deref().map(Expression::compile).transpose());
        let namespaces = problems.ok("spec.match.namespaces", NameGlobs::compile(&spec.rule_match.namespaces));
        let (expression, message_expression, namespaces) = (expression?, message_expression?, namespaces?);
        let kinds = spec.rule_match.kinds.iter().map(|k| KindMatch::parse(k)).collect();
        Some(Rule { name, spec, kinds, namespaces, expression, message_expression })
    }
}

impl Compile for GangPolicySpec {
    type Output = GangPolicy;

    fn compile(self, name: String, cx: &Context<'_>, problems: &mut Problems<'_>) -> Option<GangPolicy> {
        let spec = self;
        cx.check_teams(&spec.scope.teams, problems);
        if spec.max_gang_size == Some(0) {
            problems.push("spec.maxGangSize: must be a positive integer");
        }
        if spec.coscheduling_size == Some(0) {
            problems.push("spec.coschedulingSize: must be a positive integer");
        }
        // A bad duration is reported; the default stands in so the other checks still run.
        let mut duration = |field: &str, raw: &Option<String>, default| match raw {
            None => default,
            Some(r) => problems.ok(&format!("spec.{field}"), parse_duration(r)).unwrap_or(default),
        };
        let assembly_timeout = duration("assemblyTimeout", &spec.assembly_timeout, DEFAULT_ASSEMBLY_TIMEOUT);
        let starvation_after = duration("starvationTimeout", &spec.starvation_timeout, DEFAULT_STARVATION);
        let mut start_timeout = duration("startTimeout", &spec.start_timeout, DEFAULT_START_TIMEOUT);
        if start_timeout.as_secs() == 0 {
            // No "never": the reservation of a released gang lasts until this timeout, and one
            // that lasted forever would let a member that never binds hold its nodes for good.
            problems.push("spec.startTimeout: must be at least 1s (a released gang's reservation ends at it)");
            start_timeout = DEFAULT_START_TIMEOUT;
        }
        let topology = match spec.topology.as_ref().map(super::topology::TopologySpec::compile) {
            Some(Ok(topology)) => Some(topology),
            Some(Err(found)) => {
                problems.extend(found);
                None
            }
            None => None,
        };
        let namespaces = problems.ok("spec.match.namespaces", NameGlobs::compile(&spec.scope.namespaces))?;
        Some(GangPolicy {
            topology,
            disruption: spec.disruption,
            name,
            namespaces,
            teams: spec.scope.teams,
            infer: spec.infer,
            coscheduling_size: spec.coscheduling_size,
            assembly_timeout,
            on_timeout: spec.on_timeout,
            start_timeout,
            on_start_timeout: spec.on_start_timeout,
            starvation_after,
            max_size: spec.max_gang_size.unwrap_or(crate::model::gang::membership::DEFAULT_MAX_GANG_SIZE),
            native_scheduling: spec.native_scheduling,
        })
    }
}

/// The Cluster document compiles to itself once its values pass the API server's rules: its
/// settings are read by the set as they are (accelerator names, checks, priority, tenancy).
impl Compile for ClusterSpec {
    type Output = ClusterSpec;

    fn compile(self, _: String, _: &Context<'_>, problems: &mut Problems<'_>) -> Option<ClusterSpec> {
        problems.extend(values::cluster_priority(&self.priority));
        if let Err(e) = super::preemption::Preemption::default().overlaid(&self.preemption) {
            problems.push(format_args!("spec.{e}"));
        }
        // A system class as the cluster's default would be given to every pod of a team without
        // a default, then denied to it (team/priority-class); as its globalDefault it would be
        // what asking nothing means, allowed everywhere.
        for (field, class) in [("globalDefault", &self.priority.global_default), ("default", &self.priority.default)] {
            if let Some(class) = class.as_deref().filter(|c| c.starts_with(super::SYSTEM_PRIORITY_PREFIX)) {
                problems.push(format_args!(
                    "spec.priority.{field}: {class:?} is a system priority class, kept for the cluster's own components: \
                     name one of your own"
                ));
            }
        }
        Some(self)
    }
}

/// `classes` with every DeviceClass of `facts` whose extended resource is an accelerator added
/// (weight 1) unless `classes` maps it already; also returns what was added.
pub(super) fn with_discovered_classes(
    classes: DeviceClasses,
    facts: &super::ClusterFacts,
    accelerators: &ResourceMatcher,
) -> (DeviceClasses, std::collections::BTreeMap<String, String>) {
    let added: std::collections::BTreeMap<String, String> = facts
        .extended_resource_names
        .iter()
        .filter(|(class, resource)| classes.get(class).is_none() && accelerators.matches(resource))
        .map(|(class, resource)| (class.clone(), resource.clone()))
        .collect();
    if added.is_empty() {
        return (classes, added);
    }
    let mut all: std::collections::BTreeMap<String, ClassWeight> =
        classes.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    for (class, resource) in &added {
        all.insert(class.clone(), ClassWeight { counts_as: resource.clone(), numerator: 1, denominator: 1 });
    }
    (DeviceClasses::new(all, classes.all_count()), added)
}

/// The Cluster's `dra` block compiled: weights parsed, every `countsAs` an accelerator name.
pub(super) fn device_classes(
    spec: &super::DraSpec,
    accelerators: &ResourceMatcher,
    problems: &mut Problems<'_>,
) -> DeviceClasses {
    let mut classes = std::collections::BTreeMap::new();
    for (class, mapping) in &spec.device_classes {
        let field = format!("spec.dra.deviceClasses.{class}");
        if !accelerators.matches(&mapping.counts_as) {
            problems.push(format_args!(
                "{field}.countsAs: {:?} is not one of the Cluster's accelerator resources",
                mapping.counts_as
            ));
            continue;
        }
        let weight = match &mapping.weight {
            None => Ok((1, 1)),
            Some(raw) => quota::parse_weight(raw),
        };
        let Some((numerator, denominator)) = problems.ok(&format!("{field}.weight"), weight) else { continue };
        classes.insert(class.clone(), ClassWeight { counts_as: mapping.counts_as.clone(), numerator, denominator });
    }
    DeviceClasses::new(classes, spec.allocation_mode_all_count.unwrap_or(crate::model::dra::DEFAULT_ALL_COUNT))
}
