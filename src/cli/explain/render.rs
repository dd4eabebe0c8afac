//! `allot explain`'s output: text for people, JSON (the [`Report`] as it is) for machines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::CohortReport;
use super::{GangReport, NodeReport, PodReport, QueueEntry, Report, TeamReport};

/// Pretty JSON of the report (ends with a newline).
pub fn json(report: &Report) -> String {
    let mut text = serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// The report as text. Tenants write some of what it prints (condition messages, through
/// `pods/status`): control characters are escaped, so nothing in a field can move the cursor,
/// recolour the terminal or start a line that looks like Allot's.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    match report {
        Report::Pod(p) => pod(&mut out, p),
        Report::Gang(g) => gang(&mut out, g, ""),
        Report::Team(t) => team(&mut out, t),
    }
    escape_controls(&out, true)
}

/// `text` with control characters shown as `\u{..}`; line feeds too unless `keep_newlines`.
fn escape_controls(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && !(keep_newlines && c == '\n') {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// One field written by someone else, on one line.
fn field(text: &str) -> String {
    escape_controls(text, false)
}

fn notes(out: &mut String, notes: &[String], indent: &str) {
    for n in notes {
        let _ = writeln!(out, "{indent}note: {n}");
    }
}

fn pod(out: &mut String, p: &PodReport) {
    let _ = writeln!(out, "Pod {}/{}", p.namespace, p.name);
    let _ = writeln!(out, "  phase:   {}", p.phase.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "  node:    {}", p.node.as_deref().unwrap_or("-"));
    let _ = writeln!(out, "  team:    {}", p.team.as_deref().unwrap_or("- (no team)"));
    let gates = if p.gates.is_empty() { "-".to_string() } else { p.gates.join(", ") };
    let _ = writeln!(out, "  gates:   {gates}");
    let gang_line = p.gang.as_ref().map_or("-".to_string(), |g| match g.declared {
        Some(n) => format!("{} ({}/{n} members present)", g.name, g.present),
        None => format!("{} ({} members present, size unknown)", g.name, g.present),
    });
    let _ = writeln!(out, "  gang:    {gang_line}");
    let _ = writeln!(out, "  waiting for:");
    for w in &p.waiting_for {
        let _ = writeln!(out, "    - {w}");
    }
    for c in &p.conditions {
        let _ = writeln!(
            out,
            "  condition {}={} ({}): {}",
            field(&c.type_),
            field(&c.status),
            field(c.reason.as_deref().unwrap_or("-")),
            field(c.message.as_deref().unwrap_or(""))
        );
    }
    if let Some(q) = &p.quota {
        let _ = writeln!(out, "  quota queue of team {}:", q.team);
        queue_entry(out, q, "    ");
    }
    notes(out, &p.notes, "  ");
    if let Some(g) = &p.gang {
        let _ = writeln!(out);
        gang(out, g, "");
    }
}

fn gang(out: &mut String, g: &GangReport, indent: &str) {
    let size = g.declared.map_or("size unknown".to_string(), |n| format!("{n} declared"));
    let _ = writeln!(out, "{indent}Gang {}/{}: {} present, {size}", g.namespace, g.name, g.present);
    for m in &g.members {
        let node = m.node.as_deref().map(|n| format!(" on {n}")).unwrap_or_default();
        let _ = writeln!(out, "{indent}  member {} {}{node}", m.name, m.state);
    }
    if let Some(d) = &g.decision {
        let _ = writeln!(out, "{indent}  decision: {} (gang #{} in the controller's order)", d.reason, d.position + 1);
        let _ = writeln!(out, "{indent}    {}", d.message);
        if let Some(by) = &d.blocked_by {
            let _ = writeln!(out, "{indent}    waits behind gang {by}");
        }
        for v in &d.victims {
            let _ = writeln!(out, "{indent}    would evict {}", super::victims::line(v));
        }
    }
    if !g.nodes.is_empty() {
        nodes(out, &g.nodes, indent);
    }
    if let Some(a) = &g.assembly {
        let when = if a.remaining_seconds >= 0 {
            format!("{}s left", a.remaining_seconds)
        } else {
            format!("passed {}s ago", a.remaining_seconds.unsigned_abs())
        };
        let applies = if a.applies { "" } else { " (applies only while members are missing)" };
        let _ = writeln!(
            out,
            "{indent}  assembly timeout: {}s, {when}; on timeout: {}{applies}",
            a.timeout_seconds, a.on_timeout
        );
    }
    if let Some(st) = &g.start {
        let when = if st.remaining_seconds >= 0 {
            format!("{}s left", st.remaining_seconds)
        } else {
            format!("passed {}s ago", st.remaining_seconds.unsigned_abs())
        };
        let then = if st.on_start_timeout == "Fail" { "every member deleted" } else { "the reservation ends" };
        let _ = writeln!(
            out,
            "{indent}  start timeout: {}s, {when}; on start timeout: {} ({then}); not bound yet: {}",
            st.timeout_seconds,
            st.on_start_timeout,
            st.unbound.join(", ")
        );
    }
    match &g.condition {
        Some(c) => {
            let _ = writeln!(
                out,
                "{indent}  condition {}={} ({}): {}",
                field(&c.type_),
                field(&c.status),
                field(c.reason.as_deref().unwrap_or("-")),
                field(c.message.as_deref().unwrap_or(""))
            );
        }
        None if g.decision.is_some() => {
            let _ = writeln!(out, "{indent}  condition allot.dev/GangReady: not written yet");
        }
        None => {}
    }
    notes(out, &g.notes, &format!("{indent}  "));
}

/// Nodes listed one by one up to this many; beyond it, those that take members (the most
/// first) and the others grouped by why not (JSON always has every node).
const NODE_LINES: usize = 20;

fn nodes(out: &mut String, nodes: &[NodeReport], indent: &str) {
    let taking: Vec<&NodeReport> = nodes.iter().filter(|n| n.members > 0).collect();
    let total = taking.iter().fold(0u64, |sum, n| sum.saturating_add(n.members));
    let _ = writeln!(
        out,
        "{indent}  nodes: {total} member(s) of this gang's shape fit now, on {} of {} node(s):",
        taking.len(),
        nodes.len()
    );
    let width = nodes.iter().map(|n| n.name.len()).max().unwrap_or(0).min(40);
    let line = |out: &mut String, n: &NodeReport| {
        let why = n.why_not.as_deref().map(|w| format!("  ({w})")).unwrap_or_default();
        let _ = writeln!(out, "{indent}    {:<width$}  {}{why}", n.name, n.members);
    };
    if nodes.len() <= NODE_LINES {
        nodes.iter().for_each(|n| line(out, n));
        return;
    }
    let mut taking = taking;
    taking.sort_by(|a, b| b.members.cmp(&a.members).then_with(|| a.name.cmp(&b.name)));
    taking.iter().take(NODE_LINES).for_each(|n| line(out, n));
    if taking.len() > NODE_LINES {
        let _ = writeln!(out, "{indent}    … and {} more node(s) that take members", taking.len() - NODE_LINES);
    }
    let mut groups: std::collections::BTreeMap<String, (usize, &str)> = std::collections::BTreeMap::new();
    for n in nodes.iter().filter(|n| n.members == 0) {
        let key = match &n.refusal {
            Some(r) => r.to_string(),
            None => format!("short of {}", n.short.iter().map(|s| s.resource.as_str()).collect::<Vec<_>>().join(", ")),
        };
        groups.entry(key).or_insert((0, n.name.as_str())).0 += 1;
    }
    let mut groups: Vec<(String, (usize, &str))> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(&b.0)));
    for (why, (count, example)) in groups {
        let _ = writeln!(out, "{indent}    {count} node(s) take none: {why} (e.g. {example})");
    }
}

fn queue_entry(out: &mut String, q: &QueueEntry, indent: &str) {
    let asks: Vec<String> = q.asks.iter().map(|(r, a)| format!("{a} {r}")).collect();
    let state = match &q.message {
        Some(m) => format!("waits: {m}"),
        None => match &q.borrows_from {
            Some(cohort) => format!(
                "releasable: the controller lifts its quota gate on its next pass, on quota borrowed from cohort {cohort}"
            ),
            None => "releasable: the controller lifts its quota gate on its next pass".to_string(),
        },
    };
    let _ = writeln!(
        out,
        "{indent}#{} {} (priority {}, asks {}): {state}",
        q.position,
        q.unit,
        q.priority,
        if asks.is_empty() { "nothing".to_string() } else { asks.join(", ") }
    );
}

/// A cohort's teams, the next borrower first.
fn cohort(out: &mut String, c: &CohortReport) {
    let unused: Vec<String> = c.unused.iter().map(|(r, q)| format!("{q} {r}")).collect();
    let _ = writeln!(out, "  cohort {} ({} unused); its teams, the next to borrow first:", c.name, unused.join(", "));
    for t in &c.teams {
        let _ = writeln!(out, "    {} (share {}):", t.team, t.share);
        for (resource, nominal) in &t.nominal {
            let of = |m: &BTreeMap<String, String>| m.get(resource).cloned().unwrap_or_else(|| "0".into());
            let _ = writeln!(
                out,
                "      {resource}: nominal {nominal}, uses {}, borrowed {}, lent {}",
                of(&t.used),
                of(&t.borrowed),
                of(&t.lent)
            );
        }
    }
}

fn team(out: &mut String, t: &TeamReport) {
    let _ = writeln!(out, "Team {}", t.team);
    let ns = if t.namespaces.is_empty() { "- (none seen)".to_string() } else { t.namespaces.join(", ") };
    let _ = writeln!(out, "  namespaces: {ns}");
    match &t.quota {
        Some(q) => {
            let _ = writeln!(out, "  quota ({}):", q.mode);
            for l in &q.limits {
                let over = if l.over { " (over the limit)" } else { "" };
                let _ = writeln!(out, "    {}: {} of {} used{over}", l.resource, l.used, l.limit);
            }
            if let Some(c) = &q.cohort {
                cohort(out, c);
            }
        }
        None => {
            let _ = writeln!(out, "  quota: none");
        }
    }
    if !t.usage_by_namespace.is_empty() {
        let _ = writeln!(out, "  usage by namespace:");
        for u in &t.usage_by_namespace {
            let amounts: Vec<String> = u.requests.iter().map(|(r, q)| format!("{q} {r}")).collect();
            let _ = writeln!(out, "    {}: {}", u.namespace, amounts.join(", "));
        }
    }
    if !t.top_pods.is_empty() {
        let _ = writeln!(out, "  top pods:");
        for p in &t.top_pods {
            let amounts: Vec<String> = p.requests.iter().map(|(r, q)| format!("{q} {r}")).collect();
            let _ = writeln!(out, "    {}/{} {}: {}", p.namespace, p.pod, p.state, amounts.join(", "));
        }
    }
    if t.queue.is_empty() {
        let _ = writeln!(out, "  queue: empty");
    } else {
        let _ = writeln!(out, "  queue:");
        for q in &t.queue {
            queue_entry(out, q, "    ");
        }
    }
    notes(out, &t.notes, "  ");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(
        name: &str,
        members: u64,
        why_not: Option<&str>,
        refusal: Option<crate::control::gang::fit::NodeRefusal>,
    ) -> NodeReport {
        let short = match (members, &refusal) {
            (0, None) => {
                vec![super::super::Short { resource: "nvidia.com/gpu".into(), asked: "2".into(), free: "1".into() }]
            }
            _ => Vec::new(),
        };
        NodeReport { name: name.into(), members, why_not: why_not.map(str::to_string), refusal, short }
    }

    #[test]
    fn many_nodes_are_summarised_by_why_not() {
        let mut list: Vec<NodeReport> = (0..30)
            .map(|i| {
                node(&format!("cpu-{i:02}"), 0, Some("taint"), Some(crate::control::gang::fit::NodeRefusal::Cordoned))
            })
            .collect();
        list.extend((0..5).map(|i| node(&format!("full-{i}"), 0, Some("nvidia.com/gpu free 1 < 2 asked"), None)));
        list.extend((0..25).map(|i| node(&format!("gpu-{i:02}"), 1 + i % 3, None, None)));
        let mut out = String::new();
        nodes(&mut out, &list, "");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "  nodes: 49 member(s) of this gang's shape fit now, on 25 of 60 node(s):");
        assert_eq!(lines[1].split_whitespace().collect::<Vec<_>>(), ["gpu-02", "3"], "the most first");
        assert_eq!(lines.len(), 1 + NODE_LINES + 3, "{out}");
        assert_eq!(lines[NODE_LINES + 1], "    … and 5 more node(s) that take members");
        assert_eq!(lines[NODE_LINES + 2], "    30 node(s) take none: cordoned (e.g. cpu-00)");
        assert_eq!(lines[NODE_LINES + 3], "    5 node(s) take none: short of nvidia.com/gpu (e.g. full-0)");
        // Few nodes: every one, in name order.
        let mut out = String::new();
        nodes(&mut out, &list[28..33], "");
        assert_eq!(out.lines().count(), 6, "{out}");
    }

    #[test]
    fn fields_cannot_forge_lines_or_drive_the_terminal() {
        assert_eq!(field("ok\n  decision: Released"), "ok\\u{a}  decision: Released");
        assert_eq!(escape_controls("a\u{1b}[31mred\nnext", true), "a\\u{1b}[31mred\nnext");
    }
}
