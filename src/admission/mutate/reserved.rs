//! Tolerations of taints that placements reserve (`reserveTolerations`): a pod that is not one
//! of a placement's may neither tolerate its reserved taint nor be bound past it.

use super::*;

/// The pod's tolerations of taints a Placement keeps for the pods it places
/// (`reserveTolerations`), where that Placement does not place this pod: a CPU pod tolerating
/// the GPU taint, or every taint (`operator: Exists` without a key), would take the CPU and
/// memory of the nodes that taint guards, and another team's pod would take its pool. One
/// finding for the pod, at its first such toleration (saying how many more), and one for a
/// `spec.nodeName` past such a taint ([`bound_past_reserved_taint`]). `applied` says which placements apply ([`applying_placements`]);
/// `before`, on an UPDATE, the tolerations the pod had: the API server lets a pod gain
/// tolerations, so only the ones added are judged. Namespaces of no team are the platform's
/// (device plugins and node agents tolerate every taint) and are not checked.
pub fn reserved_taints(
    policies: &PolicySet,
    spec: &Value,
    ctx: &PodContext<'_>,
    applied: &[bool],
    before: Option<&Value>,
    spec_path: &str,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let tolerations = spec.get("tolerations").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let bound = spec.get("nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    if ctx.team.team.is_none() || (tolerations.is_empty() && !bound) {
        return findings;
    }
    if !policies.placements.iter().any(|p| p.spec.reserve_tolerations.and_then(|a| a.action()).is_some()) {
        return findings;
    }
    let pod = ReservedFrom { policies, spec, ctx, applied };
    // What the pod had before an UPDATE, as a set built once (a pod may carry tens of thousands
    // of tolerations; a list search per toleration was quadratic on the request path). The API
    // server keeps every old toleration, `tolerationSeconds` aside, so it is left out.
    let had: std::collections::HashSet<_> = before
        .and_then(|b| b.get("tolerations"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(toleration_identity)
        .collect();
    // One finding for the pod, at its first such toleration: a pod carrying thousands of them
    // gets one line, not a denial of megabytes.
    let mut offending = tolerations
        .iter()
        .enumerate()
        .filter(|(_, t)| pod.may_meet_a_reserved_taint(t))
        .filter(|(_, t)| had.is_empty() || !had.contains(&toleration_identity(t)))
        .filter_map(|(i, t)| pod.reserving(t).map(|found| (i, t, found)));
    if let Some((i, toleration, (placement, taint, action))) = offending.next() {
        let path = format!("{spec_path}.tolerations[{i}]");
        findings.push(reserved_toleration_finding(toleration, placement, taint, action, offending.count(), path));
    }
    findings.extend(bound_past_reserved_taint(&pod, before, spec_path));
    findings
}

/// One pod against the placements that reserve taints: which apply to it (`applied`), what
/// they grant it, and which keep their taints from it.
struct ReservedFrom<'a, 'c> {
    policies: &'a PolicySet,
    spec: &'a Value,
    ctx: &'a PodContext<'c>,
    applied: &'a [bool],
}

impl<'a> ReservedFrom<'a, '_> {
    /// Whether the pod asks for a resource `matcher` matches (requests or DRA claims). Only
    /// computed for a toleration or node that meets a reserved taint: most pods carry only the
    /// API server's default tolerations and never get here.
    fn asks(&self, matcher: &resources::ResourceMatcher) -> bool {
        resources::requests_any(self.spec, matcher)
            || self.ctx.claims.accelerators(&self.policies.device_classes).keys().any(|name| matcher.matches(name))
    }

    /// A pod asking for accelerators, none of them `p`'s, can only run where its own devices
    /// are: `p`'s taint guards nodes it cannot use.
    fn elsewhere(&self, p: &Placement) -> bool {
        p.spec.applies_to == AppliesTo::AcceleratorPods
            && !self.asks(&p.resources)
            && self.asks(&self.policies.accelerators)
    }

    /// What the placements that do apply grant: theirs to add, not reserved against this pod.
    fn granted(&self) -> impl Iterator<Item = &'a Toleration> + use<'a> {
        let applied = self.applied;
        self.policies
            .placements
            .iter()
            .zip(applied)
            .filter(|(_, applies)| **applies)
            .flat_map(|(p, _)| &p.declared_tolerations)
    }

    /// The placement (with its reserved taint and action) that keeps a taint `toleration`
    /// tolerates from this pod.
    fn reserving(&self, toleration: &Value) -> Option<(&'a Placement, &'a Toleration, Action)> {
        self.policies.placements.iter().zip(self.applied).filter(|(_, applies)| !**applies).find_map(|(p, _)| {
            let action = p.spec.reserve_tolerations.and_then(|a| a.action())?;
            let taint = p.declared_tolerations.iter().find(|r| {
                is_reserving(r)
                    && tolerates_some_taint_of(toleration, r)
                    && !self.granted().any(|g| covers(&serde_json::to_value(g).unwrap_or(Value::Null), r))
            })?;
            (!self.elsewhere(p)).then_some((p, taint, action))
        })
    }

    /// A toleration with a key meets only reserved taints of that key: most pods carry only the
    /// API server's default tolerations (`node.kubernetes.io/not-ready`, ...), which no
    /// placement reserves, and are let go on one string compare per reserved taint.
    fn may_meet_a_reserved_taint(&self, toleration: &Value) -> bool {
        match toleration.get("key").and_then(Value::as_str) {
            None | Some("") => true,
            Some(key) => self
                .policies
                .placements
                .iter()
                .flat_map(|p| &p.declared_tolerations)
                .any(|r| is_reserving(r) && r.key.as_deref() == Some(key)),
        }
    }
}

/// The one finding for a pod's tolerations of taints that placements reserve for other pods:
/// the first such `toleration` (at `path`), and how many `more` do the same.
fn reserved_toleration_finding(
    toleration: &Value,
    placement: &Placement,
    taint: &Toleration,
    action: Action,
    more: usize,
    path: String,
) -> Finding {
    let wildcard = toleration.get("key").and_then(Value::as_str).is_none_or(str::is_empty);
    let what = if wildcard {
        format!("tolerates every taint (operator Exists without a key), {} among them", describe_taint(taint))
    } else {
        format!("tolerates the taint {}", describe_taint(taint))
    };
    let others = match more {
        0 => String::new(),
        n => format!(" ({n} more of its tolerations do the same)"),
    };
    Finding {
        rule: crate::admission::finding::Check::TenantTolerations.into(),
        action,
        path,
        message: format!(
            "{what}, which placement {} keeps for {}; this pod is not one of them: remove the toleration{}{others}",
            placement.name,
            placed_pods(placement),
            if wildcard { " or give it a key" } else { "" }
        ),
    }
}

/// A toleration as the API server tells old ones from new on an UPDATE (`tolerationSeconds`
/// may change; an omitted operator is `Equal`).
type TolerationIdentity<'t> = (Option<&'t str>, &'t str, Option<&'t str>, Option<&'t str>);

fn toleration_identity(t: &Value) -> TolerationIdentity<'_> {
    let field = |name: &str| t.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
    (field("key"), field("operator").unwrap_or("Equal"), field("value"), field("effect"))
}

/// A Pod created with `spec.nodeName` skips the scheduler, and the kubelet admits it past
/// `NoSchedule` taints: one naming a node that a reserving Placement's taint guards, where
/// that Placement does not place it, would take that node's CPU and memory as surely as a
/// toleration would. Whoever creates it (a DaemonSet's template can name the node). A node the
/// view has listed no node by is refused too: the pod would wait for a node of that name to
/// join (the next GPU node an autoscaler names predictably) and run there past its taints.
/// Where the nodes are not watched (`allot check`, a view not listed yet) nothing is said.
fn bound_past_reserved_taint(pod: &ReservedFrom<'_, '_>, before: Option<&Value>, spec_path: &str) -> Option<Finding> {
    let (policies, ctx) = (pod.policies, pod.ctx);
    let node = pod.spec.get("nodeName").and_then(Value::as_str).filter(|n| !n.is_empty())?;
    if before.is_some() || ctx.requester.is_node() {
        return None;
    }
    // The placements that keep their taints from this pod.
    let mut reserving = policies
        .placements
        .iter()
        .zip(pod.applied)
        .filter(|(_, a)| !**a)
        .filter_map(|(p, _)| Some((p, p.spec.reserve_tolerations.and_then(|a| a.action())?)))
        .filter(|(p, _)| !pod.elsewhere(p));
    let finding = |action, message| Finding {
        rule: crate::admission::finding::Check::TenantTolerations.into(),
        action,
        path: format!("{spec_path}.nodeName"),
        message,
    };
    let taints = match ctx.cluster.node(node) {
        NodeLookup::NotWatched => return None,
        NodeLookup::Unknown => {
            let (placement, action) = reserving.next()?;
            return Some(finding(
                action,
                format!(
                    "no node {node} is known to Allot: a pod bound by name waits for a node of that name to join \
                     and skips its taints, which placement {} keeps for {}, and this pod is not one of them: \
                     remove spec.nodeName",
                    placement.name,
                    placed_pods(placement)
                ),
            ));
        }
        NodeLookup::Taints(taints) => taints,
    };
    let (placement, taint, action) = reserving.find_map(|(p, action)| {
        let taint = taints.iter().find(|taint| {
            taint.effect != "PreferNoSchedule"
                && p.declared_tolerations.iter().any(|r| is_reserving(r) && tolerates_taint(r, taint))
                && !pod.granted().any(|g| tolerates_taint(g, taint))
        })?;
        Some((p, taint, action))
    })?;
    let value = taint.value.as_deref().filter(|v| !v.is_empty()).map(|v| format!("={v}")).unwrap_or_default();
    Some(finding(
        action,
        format!(
            "node {node} has the taint {}{value}:{}, which placement {} keeps for {}; a pod bound by name skips \
             the taint, and this pod is not one of them: remove spec.nodeName",
            taint.key,
            taint.effect,
            placement.name,
            placed_pods(placement)
        ),
    ))
}

/// True when the Placement toleration `t` tolerates the node's `taint`, as the scheduler
/// matches them.
fn tolerates_taint(t: &Toleration, taint: &k8s_openapi::api::core::v1::Taint) -> bool {
    let key_ok = match t.key.as_deref().filter(|k| !k.is_empty()) {
        None => t.operator == Some(TolerationOperator::Exists),
        Some(k) => k == taint.key,
    };
    let effect_ok = t.effect.is_none_or(|e| effect_name(e) == taint.effect);
    let value_ok = t.operator == Some(TolerationOperator::Exists)
        || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
    key_ok && effect_ok && value_ok
}

/// A Placement toleration that keeps other pods off nodes: one for a named taint whose effect
/// keeps pods away (`PreferNoSchedule` only steers the scheduler; a toleration without a key
/// names no taint of its own).
fn is_reserving(t: &Toleration) -> bool {
    t.key.as_deref().is_some_and(|k| !k.is_empty()) && t.effect != Some(TaintEffect::PreferNoSchedule)
}

/// True when some taint the Placement toleration `reserved` is for is also tolerated by the
/// pod's toleration `pod`. Operators other than `Exists` and `Equal` (the feature-gated `Lt`
/// and `Gt`) are taken to match any value.
fn tolerates_some_taint_of(pod: &Value, reserved: &Toleration) -> bool {
    let field = |name: &str| pod.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
    let operator = field("operator").unwrap_or("Equal");
    let key_ok = match field("key") {
        None => operator == "Exists",
        Some(k) => reserved.key.as_deref() == Some(k),
    };
    let effect_ok = match field("effect") {
        None => true,
        Some("PreferNoSchedule") => false,
        Some(e) => reserved.effect.is_none_or(|r| effect_name(r) == e),
    };
    let value_ok = operator != "Equal"
        || reserved.operator == Some(TolerationOperator::Exists)
        || field("value") == reserved.value.as_deref().filter(|v| !v.is_empty());
    key_ok && effect_ok && value_ok
}

fn describe_taint(t: &Toleration) -> String {
    let key = t.key.as_deref().unwrap_or("*");
    let value = match (t.operator, t.value.as_deref()) {
        (Some(TolerationOperator::Exists), _) | (_, None | Some("")) => String::new(),
        (_, Some(v)) => format!("={v}"),
    };
    let effect = t.effect.map(|e| format!(":{}", effect_name(e))).unwrap_or_default();
    format!("{key}{value}{effect}")
}

/// The pods a Placement places, in words: "pods asking for nvidia.com/gpu or amd.com/gpu of
/// team vision".
fn placed_pods(p: &Placement) -> String {
    let (exact, prefixes) = p.resources.patterns();
    let names: Vec<String> = exact.iter().cloned().chain(prefixes.iter().map(|x| format!("{x}*"))).collect();
    let mut out = match p.spec.applies_to {
        AppliesTo::AcceleratorPods => format!("pods asking for {}", names.join(" or ")),
        AppliesTo::OtherPods => format!("pods asking for none of {}", names.join(", ")),
        AppliesTo::AllPods => "the pods it places".to_string(),
    };
    if !p.spec.scope.teams.is_empty() {
        out.push_str(&format!(" of team {}", p.spec.scope.teams.join(" or ")));
    }
    if !p.spec.scope.namespaces.is_empty() {
        out.push_str(&format!(" in namespaces {}", p.spec.scope.namespaces.join(", ")));
    }
    if p.when.is_some() {
        out.push_str(" when its condition holds");
    }
    out
}
