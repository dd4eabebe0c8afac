//! JUnit XML: the one writer behind `allot check --output junit` (a test case per object) and
//! `allot test --junit` (a test suite per Test document, a test case per case). Callers describe
//! suites and cases; escaping and layout live here.

/// One `<testsuite>`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suite {
    pub name: String,
    pub cases: Vec<Case>,
}

/// One `<testcase>`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Case {
    pub classname: String,
    pub name: String,
    /// The file the case comes from, when it has one of its own.
    pub file: Option<String>,
    pub failure: Option<Failure>,
    /// What else there is to say (shown by CI next to the case).
    pub output: Option<String>,
}

/// Why a case failed: a one-line `message` and the whole story in `body`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Failure {
    pub message: String,
    /// The `type` attribute (`denied`, `mismatch`).
    pub kind: &'static str,
    pub body: String,
}

impl Suite {
    fn failures(&self) -> usize {
        self.cases.iter().filter(|c| c.failure.is_some()).count()
    }
}

/// The whole document: `<testsuites name=…>` around `suites`, with the totals.
pub fn render(name: &str, suites: &[Suite]) -> String {
    let tests: usize = suites.iter().map(|s| s.cases.len()).sum();
    let failures: usize = suites.iter().map(Suite::failures).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!("<testsuites name=\"{}\" tests=\"{tests}\" failures=\"{failures}\">\n", escape(name)));
    for suite in suites {
        out.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">\n",
            escape(&suite.name),
            suite.cases.len(),
            suite.failures()
        ));
        for case in &suite.cases {
            out.push_str(&format!(
                "    <testcase classname=\"{}\" name=\"{}\"",
                escape(&case.classname),
                escape(&case.name)
            ));
            if let Some(file) = &case.file {
                out.push_str(&format!(" file=\"{}\"", escape(file)));
            }
            if case.failure.is_none() && case.output.is_none() {
                out.push_str(" />\n");
                continue;
            }
            out.push_str(">\n");
            if let Some(f) = &case.failure {
                out.push_str(&format!(
                    "      <failure message=\"{}\" type=\"{}\">{}</failure>\n",
                    escape(&f.message),
                    f.kind,
                    escape(&f.body)
                ));
            }
            if let Some(output) = &case.output {
                out.push_str(&format!("      <system-out>{}</system-out>\n", escape(output)));
            }
            out.push_str("    </testcase>\n");
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Escapes text for XML attributes and content (control characters become spaces: XML 1.0
/// cannot carry them).
pub fn escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&apos;".to_string(),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => " ".to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_escaping_and_both_case_forms() {
        let suites = [Suite {
            name: "a <b>".into(),
            cases: vec![
                Case { classname: "c".into(), name: "ok".into(), file: Some("t.yaml".into()), ..Case::default() },
                Case {
                    classname: "c".into(),
                    name: "bad".into(),
                    failure: Some(Failure {
                        message: "it's \"wrong\"".into(),
                        kind: "mismatch",
                        body: "x\u{1}y".into(),
                    }),
                    output: Some("note & more".into()),
                    ..Case::default()
                },
            ],
        }];
        let xml = render("allot test", &suites);
        assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"allot test\" tests=\"2\" failures=\"1\">\n"), "{xml}");
        assert!(xml.contains("  <testsuite name=\"a &lt;b&gt;\" tests=\"2\" failures=\"1\">\n"), "{xml}");
        assert!(xml.contains("    <testcase classname=\"c\" name=\"ok\" file=\"t.yaml\" />\n"), "{xml}");
        assert!(xml.contains(
            "    <testcase classname=\"c\" name=\"bad\">\n      <failure message=\"it&apos;s &quot;wrong&quot;\" type=\"mismatch\">x y</failure>\n      <system-out>note &amp; more</system-out>\n    </testcase>\n"
        ), "{xml}");
        assert!(xml.ends_with("  </testsuite>\n</testsuites>\n"), "{xml}");
    }
}
