//! `allot check --output github`: the report as GitHub Actions workflow commands, so each
//! finding shows on the pull request as an annotation on the file and line of its object.
//!
//! Denials become `::error`, warnings and audits `::warning`, notes (a rule that could not be
//! evaluated) `::warning` too. The full text report follows in a collapsed log group, between
//! `::stop-commands::` markers: names, messages and paths come from the manifests (tenants'
//! text), and a line of theirs that starts with `::` must not run as a workflow command.

use sha2::{Digest, Sha256};

use crate::cli::check::{ObjectReport, Report, render_text};
use crate::model::policy::Action;

/// Escapes a command's message as `@actions/core` does (`escapeData`).
pub fn escape_data(text: &str) -> String {
    text.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// Escapes a property value (`file=`, `title=`) as `@actions/core` does (`escapeProperty`):
/// `:` and `,` also, since they end a property.
pub fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

/// One workflow command line: `::error file=F,line=L,title=T::message`.
fn command(name: &str, properties: &[(&str, String)], message: &str) -> String {
    let properties: Vec<String> =
        properties.iter().map(|(key, value)| format!("{key}={}", escape_property(value))).collect();
    let separator = if properties.is_empty() { "" } else { " " };
    format!("::{name}{separator}{}::{}\n", properties.join(","), escape_data(message))
}

/// Where an annotation points: the object's file and line, when it came from a file.
fn location(r: &ObjectReport) -> Vec<(&'static str, String)> {
    let mut properties = Vec::new();
    if r.source != "-" {
        properties.push(("file", r.source.strip_prefix("./").unwrap_or(&r.source).to_string()));
        if r.line > 0 {
            properties.push(("line", r.line.to_string()));
        }
    }
    properties
}

/// The annotations for one object: one per finding, one per note.
fn annotations(r: &ObjectReport) -> String {
    let mut out = String::new();
    for f in &r.findings {
        let (name, verb) = match f.action {
            Action::Deny => ("error", "denied"),
            Action::Warn => ("warning", "warning"),
            Action::Audit => ("warning", "audit"),
        };
        let mut properties = location(r);
        properties.push(("title", format!("allot {verb}: {}", f.rule)));
        out.push_str(&command(name, &properties, &format!("{}: {}", r.label(), f.describe())));
    }
    for note in &r.notes {
        let mut properties = location(r);
        properties.push(("title", "allot: not evaluated".to_string()));
        out.push_str(&command("warning", &properties, &format!("{}: {note}", r.label())));
    }
    out
}

/// The whole report: annotations, then the text report in a log group with workflow commands
/// stopped, then the summary line.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    for r in &report.results {
        out.push_str(&annotations(r));
    }
    let text = render_text(report);
    let token = stop_token(&text);
    out.push_str("::group::allot check report\n");
    out.push_str(&format!("::stop-commands::{token}\n"));
    out.push_str(&text);
    if !text.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!("::{token}::\n"));
    out.push_str("::endgroup::\n");
    let s = &report.summary;
    out.push_str(&format!(
        "allot check: {} object(s), {} admitted ({} mutated), {} denied, {} with warnings\n",
        s.objects, s.admitted, s.mutated, s.denied, s.warned
    ));
    out
}

/// The token that resumes workflow commands: a hash of the text it guards (which therefore
/// cannot contain it), the process and the time, so manifests cannot guess it.
fn stop_token(text: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let digest = Sha256::new()
        .chain_update(text.as_bytes())
        .chain_update(std::process::id().to_le_bytes())
        .chain_update(nanos.to_le_bytes())
        .finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("allot-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::finding::{Check, Finding, RuleId};
    use crate::cli::check::Summary;

    fn object(source: &str, line: usize, findings: Vec<Finding>, notes: Vec<String>) -> ObjectReport {
        ObjectReport {
            source: source.into(),
            document: 2,
            line,
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "vision".into(),
            name: "p".into(),
            allowed: !crate::admission::finding::any_denied(&findings),
            mutated: false,
            patch: Vec::new(),
            changes: Vec::new(),
            findings,
            notes,
        }
    }

    fn finding(action: Action, rule: RuleId, message: &str) -> Finding {
        Finding { rule, action, path: "spec.containers[0]".into(), message: message.into() }
    }

    #[test]
    fn escaping_matches_the_actions_toolkit() {
        // Expected strings as @actions/core's command.ts produces them.
        assert_eq!(escape_data("50% done\r\nnext: a, b"), "50%25 done%0D%0Anext: a, b");
        assert_eq!(escape_property("dir,1/a:b%.yaml\n"), "dir%2C1/a%3Ab%25.yaml%0A");
        // `%` first, so an escape already in the text is not read back as another character.
        assert_eq!(escape_data("%0A"), "%250A");
    }

    /// The runner's unescaping (actions/runner `ActionCommand`: each escape replaced back in
    /// the order it lists them, `%25` last).
    fn unescape(text: &str, property: bool) -> String {
        let mut out = text.replace("%0D", "\r").replace("%0A", "\n");
        if property {
            out = out.replace("%3A", ":").replace("%2C", ",");
        }
        out.replace("%25", "%")
    }

    proptest::proptest! {
        #[test]
        fn escaping_round_trips_and_keeps_a_command_on_one_line(text in ".*", raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let raw = String::from_utf8_lossy(&raw).into_owned();
            for input in [text.as_str(), raw.as_str(), "%0A%25%3A"] {
                let data = escape_data(input);
                proptest::prop_assert!(!data.contains('\n') && !data.contains('\r'));
                proptest::prop_assert_eq!(unescape(&data, false), input);
                let property = escape_property(input);
                proptest::prop_assert!(!property.contains(',') && !property.contains(':') && !property.contains('\n'));
                proptest::prop_assert_eq!(unescape(&property, true), input);
            }
        }
    }

    #[test]
    fn each_finding_is_an_annotation_on_its_file_and_line() {
        let report = Report {
            policy_version: "v".into(),
            results: vec![object(
                "./manifests/a,b.yaml",
                14,
                vec![
                    finding(Action::Deny, Check::WholeNumbers.into(), "0.5 nvidia.com/gpu: whole numbers only"),
                    finding(Action::Warn, RuleId::Rule("pinned-images-on-gpus".into()), "pin\nthe tag"),
                    finding(Action::Audit, RuleId::Rule("high-priority-is-audited".into()), "audited"),
                ],
                vec!["rule x could not be evaluated: No such key: image".into()],
            )],
            summary: Summary { objects: 1, denied: 1, ..Summary::default() },
        };
        let out = render(&report);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..4],
            [
                "::error file=manifests/a%2Cb.yaml,line=14,title=allot denied%3A accelerators/whole-numbers::Pod vision/p: spec.containers[0]: 0.5 nvidia.com/gpu: whole numbers only",
                "::warning file=manifests/a%2Cb.yaml,line=14,title=allot warning%3A pinned-images-on-gpus::Pod vision/p: spec.containers[0]: pin%0Athe tag",
                "::warning file=manifests/a%2Cb.yaml,line=14,title=allot audit%3A high-priority-is-audited::Pod vision/p: spec.containers[0]: audited",
                "::warning file=manifests/a%2Cb.yaml,line=14,title=allot%3A not evaluated::Pod vision/p: rule x could not be evaluated: No such key: image",
            ]
        );
        assert!(
            out.ends_with("allot check: 1 object(s), 0 admitted (0 mutated), 1 denied, 0 with warnings\n"),
            "{out}"
        );
    }

    #[test]
    fn stdin_and_unknown_lines_leave_the_location_out() {
        let deny = || vec![finding(Action::Deny, Check::MaxPerPod.into(), "too many")];
        let from_stdin = annotations(&object("-", 3, deny(), Vec::new()));
        assert!(from_stdin.starts_with("::error title=allot denied%3A accelerators/max-per-pod::"), "{from_stdin}");
        let unknown_line = annotations(&object("a.yaml", 0, deny(), Vec::new()));
        assert!(unknown_line.starts_with("::error file=a.yaml,title="), "{unknown_line}");
    }

    #[test]
    fn text_from_manifests_cannot_run_workflow_commands() {
        // A message that puts a workflow command on a line of its own in the text report.
        let hostile = "x\n::add-mask::secret\n  ::error::forged";
        let report = Report {
            policy_version: "v".into(),
            results: vec![object("a.yaml", 1, vec![finding(Action::Deny, Check::MaxPerPod.into(), hostile)], vec![])],
            summary: Summary { objects: 1, denied: 1, ..Summary::default() },
        };
        let out = render(&report);
        let stop = out.lines().position(|l| l.starts_with("::stop-commands::")).expect("commands stopped");
        let token = out.lines().nth(stop).and_then(|l| l.strip_prefix("::stop-commands::")).expect("token");
        assert!(token.len() > 30, "{token}");
        let resume = out.lines().position(|l| l == format!("::{token}::")).expect("commands resumed");
        // Every line that a runner would read as a command (after leading blanks) is either ours
        // or between the markers.
        for (i, line) in out.lines().enumerate() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("::") && (i < stop || i > resume) {
                assert!(
                    ["::error ", "::warning ", "::group::", "::endgroup::"].iter().any(|p| trimmed.starts_with(p)),
                    "line {i} runs a command: {line}"
                );
            }
        }
        assert!(out.contains("::error file=a.yaml,line=1,title=allot denied%3A accelerators/max-per-pod::Pod vision/p: spec.containers[0]: x%0A::add-mask::secret%0A  ::error::forged\n"));
    }
}
