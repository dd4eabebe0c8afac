//! What a tenant may not change on a Pod UPDATE: Allot's gates (and Kueue's, where trusted),
//! the keys that decide how Allot gates and counts the pod, its owners, its accelerator amounts;
//! nor may it add an ephemeral container that asks for accelerators.

use super::*;

/// A Pod UPDATE (any subresource: the object is the whole Pod) by `username`. Allot's own
/// identity (`allot`) may do anything here; everyone else may change neither Allot's gates nor
/// guarded keys ([`is_guarded_key`]), nor what the Pod holds of accelerators (an in-place resize
/// of CPU and memory stays allowed), nor add accelerators in ephemeral containers.
pub fn check_pod_update(policies: &PolicySet, old: &Value, new: &Value, username: &str, allot: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    if username == allot {
        return findings;
    }
    let who = if username.is_empty() { "an anonymous user" } else { username };
    check_gate_changes(policies, old, new, (username, who), allot, &mut findings);
    check_guarded_keys(old, new, who, allot, &mut findings);
    if let Some(finding) = check_owner_change(old, new, username, allot, who) {
        findings.push(finding);
    }
    let (Some(old_spec), Some(new_spec)) = (old.get("spec"), new.get("spec")) else {
        return findings;
    };
    check_accelerator_resize(policies, old_spec, new_spec, &mut findings);
    check_ephemeral_containers(policies, new, new_spec, &mut findings);
    findings
}

/// Allot's gates, moved by someone else than Allot; Kueue's gate, lifted by someone else than
/// Kueue (where the Cluster trusts Kueue).
fn check_gate_changes(
    policies: &PolicySet,
    old: &Value,
    new: &Value,
    (username, who): (&str, &str),
    allot: &str,
    findings: &mut Vec<Finding>,
) {
    let (old_gates, new_gates) = (allot_gates(old), allot_gates(new));
    if old_gates != new_gates {
        let removed: Vec<&str> = old_gates.iter().filter(|g| !new_gates.contains(g)).copied().collect();
        let changed = if removed.is_empty() { old_gates.join(", ") } else { removed.join(", ") };
        let changed = if changed.is_empty() { new_gates.join(", ") } else { changed };
        findings.push(deny(
            Check::TenantAllotGates,
            "spec.schedulingGates".into(),
            format!(
                "only Allot ({allot}) may remove or change the scheduling gate {changed}, not {who}; Allot lifts it \
                 when the whole gang fits and the team's quota has room (delete the pod to give up its place)"
            ),
        ));
    }
    if policies.tenancy.external_schedulers.contains(&ExternalScheduler::Kueue)
        && lifts_kueue_gate(old, new)
        && !policies.tenancy.is_kueue(username)
    {
        findings.push(deny(
            Check::TenantAllotGates,
            "spec.schedulingGates".into(),
            format!(
                "the scheduling gate {} keeps this pod out of Allot's gang and quota gates, for Kueue to admit \
                 it: only Kueue ({}) may lift it, not {who} (the Cluster policy's trust.kueueControllers)",
                membership::KUEUE_GATE,
                policies.tenancy.kueue_controllers.join(", ")
            ),
        ));
    }
}

/// The labels and annotations that decide how Allot gates and counts a pod, changed.
fn check_guarded_keys(old: &Value, new: &Value, who: &str, allot: &str, findings: &mut Vec<Finding>) {
    for (field, what) in [("labels", "label"), ("annotations", "annotation")] {
        let (before, after) = (string_map(old, field), string_map(new, field));
        let keys: std::collections::BTreeSet<&str> =
            before.keys().chain(after.keys()).copied().filter(|k| is_guarded_key(k)).collect();
        for key in keys.into_iter().filter(|k| before.get(k) != after.get(k)) {
            findings.push(deny(
                Check::TenantReservedKeys,
                format!("metadata.{field}"),
                format!(
                    "{what} {} decides how Allot gates and counts this pod; after creation only Allot ({allot}) may \
                     change it, not {who} (from {} to {}); delete and recreate the pod instead",
                    shorten(key),
                    describe(before.get(key)),
                    describe(after.get(key))
                ),
            ));
        }
    }
}

/// A container's accelerator requests or limits, changed (an in-place resize).
fn check_accelerator_resize(policies: &PolicySet, old_spec: &Value, new_spec: &Value, findings: &mut Vec<Finding>) {
    let (before, after) =
        (accelerator_amounts(old_spec, &policies.accelerators), accelerator_amounts(new_spec, &policies.accelerators));
    for (name, res) in &after {
        let was = before.get(name).cloned().unwrap_or_default();
        if was != *res {
            findings.push(deny(
                Check::TenantResize,
                "spec.containers".into(),
                format!(
                    "container {name}: accelerator requests/limits may not change after creation ({} -> {}); \
                     resize CPU and memory only, or recreate the pod",
                    show(&was),
                    show(res)
                ),
            ));
        }
    }
}

/// An ephemeral container (added by UPDATE) that asks for accelerators.
fn check_ephemeral_containers(policies: &PolicySet, new: &Value, new_spec: &Value, findings: &mut Vec<Finding>) {
    let Some(list) = new_spec.get("ephemeralContainers").and_then(Value::as_array) else { return };
    let view = PodView::new(String::new(), std::borrow::Cow::Borrowed(new));
    for (i, container) in list.iter().enumerate() {
        let path = format!("{}.ephemeralContainers[{i}]", view.spec_path());
        let res = ContainerResources::from_container(container, &path, &mut Vec::new());
        let names: std::collections::BTreeSet<String> = accelerators_only(&res.requests, &policies.accelerators)
            .into_keys()
            .chain(accelerators_only(&res.limits, &policies.accelerators).into_keys())
            .collect();
        if !names.is_empty() {
            let cname = container.get("name").and_then(Value::as_str).unwrap_or("?");
            findings.push(deny(
                Check::TenantEphemeralContainers,
                path,
                format!(
                    "ephemeral container {cname} asks for {}; ephemeral containers may not use accelerators",
                    names.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
}
