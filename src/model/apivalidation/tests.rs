//! Cases from the Go tests of the same rules (`content/kube_test.go`, `content/dns_test.go`,
//! `api/validation/objectmeta_test.go`, `core/validation/validation_test.go`), plus the three
//! values of issue #11 that the API server refused.

use super::*;
use proptest::prelude::*;
use serde_json::json;

fn messages(errs: &[FieldError]) -> Vec<String> {
    errs.iter().map(ToString::to_string).collect()
}

#[test]
fn qualified_names_from_the_go_table() {
    let long_prefix = format!("{}/{}", "a".repeat(253), "b".repeat(63));
    let good = [
        "simple",
        "now-with-dashes",
        "1-starts-with-num",
        "1234",
        "simple/simple",
        "now-with-dashes/simple",
        "now-with-dashes/now-with-dashes",
        "now.with.dots/simple",
        "now-with.dashes-and.dots/simple",
        "1-num.2-num/3-num",
        "1234/5678",
        "1.2.3.4/5678",
        "Uppercase_Is_OK_123",
        "example.com/Uppercase_Is_OK_123",
        "requests.storage-foo",
        &"a".repeat(63),
        &long_prefix,
        "nvidia.com/gpu",
        "allot.dev/gang",
    ];
    for name in good {
        assert_eq!(qualified_name(name), Vec::<String>::new(), "{name}");
    }
    let too_long_prefix = format!("{}/abc", "a".repeat(254));
    let bad = [
        "nospecialchars%^=@",
        "cantendwithadash-",
        "-cantstartwithadash-",
        "only/one/slash",
        "Example.com/abc",
        "example_com/abc",
        "example.com/",
        "/simple",
        &"a".repeat(64),
        &too_long_prefix,
        "",
        "example.com/pool~x",
    ];
    for name in bad {
        assert!(!qualified_name(name).is_empty(), "{name:?} should be refused");
    }
}

/// Word for word, with Go's `RegexError` double spaces between examples.
#[test]
fn qualified_name_messages_are_the_api_servers() {
    assert_eq!(
        qualified_name("example.com/pool~x"),
        ["name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an \
          alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is \
          '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"]
    );
    assert_eq!(qualified_name(&"a".repeat(64))[0], "name part must be no more than 63 bytes");
    assert_eq!(qualified_name("/x"), ["prefix part must be non-empty"]);
    assert!(qualified_name("Example.com/x")[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
    assert!(qualified_name("a/b/c")[0].starts_with("a valid label key must consist"));
}

#[test]
fn label_values_from_the_go_table() {
    for value in ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", &"a".repeat(63), ""] {
        assert_eq!(label_value(value), Vec::<String>::new(), "{value}");
    }
    let seventy = "a".repeat(70);
    for value in [
        "nospecialchars%^=@",
        "Tama-nui-te-rā.is.Māori.sun",
        "\\backslashes\\are\\bad",
        "-starts-with-dash",
        "ends-with-dash-",
        ".starts.with.dot",
        "ends.with.dot.",
        &"a".repeat(64),
        &seventy,
    ] {
        assert!(!label_value(value).is_empty(), "{value:?} should be refused");
    }
    assert_eq!(label_value(&seventy), ["must be no more than 63 bytes"]);
}

#[test]
fn dns1123_subdomains_from_the_go_table() {
    let max = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
    assert_eq!(max.len(), 253);
    for name in
        ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "a.a", "ab.a", "1.2.3.4.5", &max]
    {
        assert_eq!(dns1123_subdomain(name), Vec::<String>::new(), "{name}");
    }
    let over = format!("{max}e");
    for name in [
        "",
        "A",
        "ABC",
        "aBc",
        "A1",
        "A-1",
        "1-A",
        "-",
        "a-",
        "-a",
        "1-",
        "-1",
        "_",
        "a_",
        "_a",
        "a_b",
        "1_",
        "_1",
        "1_2",
        ".",
        "a.",
        ".a",
        "a..b",
        "1.",
        ".1",
        "1..2",
        " ",
        "a ",
        " a",
        "a b",
        "A.a",
        "aB.a",
        "ab.A",
        "A1.a",
        "a1.A",
        "Low_Priority",
        &over,
    ] {
        assert!(!dns1123_subdomain(name).is_empty(), "{name:?} should be refused");
    }
}

#[test]
fn labels_name_the_key_and_the_value() {
    let errs = labels(&json!({"example.com/pool~x": "a", "ok": "b".repeat(70)}), "spec.nodeSelector");
    let m = messages(&errs);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m[0].starts_with("spec.nodeSelector: Invalid value: \"example.com/pool~x\": name part must consist"),
        "{m:?}"
    );
    assert!(m[1].starts_with("spec.nodeSelector: Invalid value: \"bbbb"), "{m:?}");
    assert!(m[1].ends_with("must be no more than 63 bytes"), "{m:?}");
    assert!(labels(&Value::Null, "x").is_empty());
    assert_eq!(messages(&labels(&json!({"a": 1}), "m")), ["m[a]: Invalid value: must be a string"]);
}

#[test]
fn annotations_keys_are_checked_in_lower_case_and_their_size_is_bounded() {
    assert!(annotations(&json!({"UpperCase123": "bar", "Example.COM/x": "y"}), "metadata.annotations").is_empty());
    assert_eq!(annotations(&json!({"only/one/slash": "bar"}), "a").len(), 1);
    let just_under = json!({"a": "b".repeat(TOTAL_ANNOTATION_SIZE_LIMIT - 1)});
    assert!(annotations(&just_under, "a").is_empty());
    let halves = json!({"a": "b".repeat(TOTAL_ANNOTATION_SIZE_LIMIT / 2 - 1), "c": "d".repeat(TOTAL_ANNOTATION_SIZE_LIMIT / 2 - 1)});
    assert!(annotations(&halves, "a").is_empty());
    let over = json!({"a": "b".repeat(TOTAL_ANNOTATION_SIZE_LIMIT)});
    let m = messages(&annotations(&over, "metadata.annotations"));
    assert_eq!(m.len(), 1);
    assert!(m[0].starts_with("metadata.annotations: Too long: may not be more than 262144 bytes"), "{m:?}");
}

#[test]
fn tolerations_follow_validate_tolerations() {
    let ok = json!([
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "foo", "value": "bar"},
        {"key": "foo", "operator": "Equal", "value": "bar", "effect": "NoExecute", "tolerationSeconds": 60},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "sla", "operator": "Gt", "value": "950"},
    ]);
    assert_eq!(messages(&tolerations(&ok, "spec.tolerations")), Vec::<String>::new());
    let cases = [
        (
            json!({"key": "nospecialchars^=@", "operator": "Equal", "value": "bar", "effect": "NoSchedule"}),
            "t.key: Invalid value",
        ),
        (
            json!({"key": "foo", "operator": "In", "value": "bar", "effect": "NoSchedule"}),
            "t.operator: Unsupported value: \"In\"",
        ),
        (
            json!({"key": "foo", "operator": "Exists", "value": "bar"}),
            "t.operator: Invalid value: \"bar\": value must be empty when `operator` is 'Exists'",
        ),
        (
            json!({"operator": "Equal", "value": "bar"}),
            "t.operator: Invalid value: \"Equal\": operator must be Exists when `key` is empty",
        ),
        (json!({"value": "bar"}), "t.operator: Invalid value: \"\": operator must be Exists when `key` is empty"),
        (
            json!({"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 20}),
            "t.effect: Invalid value: \"NoSchedule\": effect must be 'NoExecute'",
        ),
        (json!({"key": "a", "value": "x".repeat(64)}), "t.operator: Invalid value: \"xxxx"),
        (json!({"key": "a", "operator": "Exists", "effect": "NoScheduleNoAdmit"}), "t.effect: Unsupported value"),
        (
            json!({"key": "a", "operator": "Lt", "value": "high"}),
            "t.value: Invalid value: \"high\": value must be an integer",
        ),
    ];
    for (t, want) in cases {
        let m = messages(&toleration(&t, "t"));
        assert_eq!(m.len(), 1, "{t}: {m:?}");
        assert!(m[0].starts_with(want), "{t}: {m:?}");
    }
    assert_eq!(
        messages(&tolerations(&json!({}), "spec.tolerations")),
        ["spec.tolerations: Invalid value: must be a list"]
    );
}

#[test]
fn node_selector_requirements_follow_validate_node_selector_requirement() {
    for (req, errors) in [
        (json!({"key": "gpu", "operator": "In", "values": ["a100"]}), 0),
        (json!({"key": "gpu", "operator": "Exists"}), 0),
        (json!({"key": "gpu", "operator": "DoesNotExist", "values": []}), 0),
        (json!({"key": "mem", "operator": "Gt", "values": ["80"]}), 0),
        (json!({"key": "gpu", "operator": "In"}), 1),
        (json!({"key": "gpu", "operator": "NotIn", "values": []}), 1),
        (json!({"key": "gpu", "operator": "Exists", "values": ["x"]}), 1),
        (json!({"key": "mem", "operator": "Lt", "values": ["1", "2"]}), 1),
        (json!({"key": "gpu", "operator": "Like", "values": ["x"]}), 1),
        (json!({"key": "bad~key", "operator": "Exists"}), 1),
        (json!({"key": "gpu", "operator": "In", "values": ["ok", "not ok"]}), 1),
    ] {
        assert_eq!(node_selector_requirement(&req, true, "r").len(), errors, "{req}");
    }
    // Preferred terms keep invalid label values (they can still match on a one-node cluster).
    let lax = json!({"key": "gpu", "operator": "In", "values": ["not ok"]});
    assert!(node_selector_requirement(&lax, false, "r").is_empty());
    let m = messages(&node_selector_requirement(&json!({"key": "gpu", "operator": "In"}), true, "r"));
    assert_eq!(m, ["r.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"]);
}

#[test]
fn node_affinity_checks_required_and_preferred_terms() {
    let affinity = json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["bad value"]}]}
        ]},
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["bad value"]}]}}
        ]
    }});
    let m = messages(&node_affinity(&affinity, "spec.affinity"));
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0].starts_with(
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]: Invalid value: \"bad value\""
    ), "{m:?}");
    assert!(
        m[1].ends_with(
            "preferredDuringSchedulingIgnoredDuringExecution[0].weight: Invalid value: 0: must be in the range 1-100"
        ),
        "{m:?}"
    );
    let empty = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}});
    assert_eq!(
        messages(&node_affinity(&empty, "a"))[0],
        "a.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: Required value: must have at least one node selector term"
    );
    assert!(node_affinity(&json!({"podAffinity": {}}), "a").is_empty());
}

#[test]
fn scheduling_gates_are_qualified_names_without_duplicates() {
    assert!(scheduling_gates(&json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/quota"}]), "g").is_empty());
    let m = messages(&scheduling_gates(
        &json!([{"name": "allot.dev/gang"}, {"name": "allot.dev/gang"}, {"name": "a b"}]),
        "g",
    ));
    assert_eq!(m.len(), 2, "{m:?}");
    assert_eq!(m[0], "g[1]: Duplicate value: \"allot.dev/gang\"");
    assert!(m[1].starts_with("g[2]: Invalid value: \"a b\""), "{m:?}");
}

#[test]
fn a_pod_is_checked_where_allot_writes() {
    let pod = json!({
        "metadata": {"labels": {"team": "vision"}, "annotations": {"note": "x"}},
        "spec": {
            "nodeSelector": {"example.com/pool~x": "a100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "priorityClassName": "Low_Priority",
            "schedulingGates": [{"name": "allot.dev/gang"}],
            "nodeName": "node-1",
        }
    });
    let m = messages(&super::pod(&pod, "", true));
    assert_eq!(m.len(), 3, "{m:?}");
    assert!(m[0].starts_with("spec.nodeSelector: Invalid value: \"example.com/pool~x\""), "{m:?}");
    assert!(
        m[1].starts_with("spec.priorityClassName: Invalid value: \"Low_Priority\": a lowercase RFC 1123 subdomain"),
        "{m:?}"
    );
    assert_eq!(m[2], "spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared");
    // A template is not a Pod at CREATE: its nodeName is the controller's business.
    let m = messages(&super::pod(&pod, "spec.template", false));
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(m[0].starts_with("spec.template.spec.nodeSelector: "), "{m:?}");
    let bad_meta = json!({"metadata": {"labels": {"team": "x".repeat(70)}}});
    assert!(
        messages(&super::pod(&bad_meta, "spec.template", false))[0]
            .starts_with("spec.template.labels: Invalid value: \"xxx")
    );
}

proptest! {
    /// The hand-written matchers agree with the regexes the API server uses.
    #[test]
    fn matchers_agree_with_the_regexes(s in "[-A-Za-z0-9_./~ ]{0,12}") {
        let token = regex_lite_match(&s, false);
        prop_assert_eq!(is_label_token(&s), token);
        prop_assert_eq!(label_value(&s).is_empty(), s.is_empty() || token);
        prop_assert_eq!(is_dns1123_subdomain(&s), regex_lite_match(&s, true));
    }

    /// Any value never panics any validator.
    #[test]
    fn validators_never_panic(s in ".{0,80}") {
        let _ = qualified_name(&s);
        let _ = label_value(&s);
        let _ = dns1123_subdomain(&s);
        let _ = toleration(&json!({"key": s, "operator": s, "value": s, "effect": s}), "t");
    }
}

/// A reference matcher written straight from the regexes: `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`,
/// or (`dns`) `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`.
fn regex_lite_match(s: &str, dns: bool) -> bool {
    let alnum = |c: char| if dns { c.is_ascii_lowercase() || c.is_ascii_digit() } else { c.is_ascii_alphanumeric() };
    let inner = |c: char| alnum(c) || c == '-' || (!dns && (c == '_' || c == '.'));
    let word = |w: &str| {
        let chars: Vec<char> = w.chars().collect();
        match chars.as_slice() {
            [] => false,
            [one] => alnum(*one),
            [first, middle @ .., last] => alnum(*first) && alnum(*last) && middle.iter().all(|c| inner(*c)),
        }
    };
    if dns { s.split('.').all(word) } else { word(s) }
}
