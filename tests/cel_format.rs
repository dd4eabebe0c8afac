//! kube-cel's `format`, bounded: a `%.N` precision beyond [`MAX_FORMAT_PRECISION`] is refused at
//! load when the format string is a constant and is an evaluation error when it is computed, in
//! the method form (`'%.2f'.format([x])`) and the global form (`format('%.2f', [x])`) alike.
//!
//! kube-cel 0.8 formats `%f`/`%e` with `format!("{f:.precision$}")`, which panics ("Formatting
//! argument out of range") above 65,535 and builds a string of `precision` digits below it. The
//! global form reached it unguarded: fuzz finding `cel_expression/format-global-precision`,
//! `format("233%.5786648343f7", workload.map(y, (0)))`.

use std::sync::Arc;

use allot::model::expression::budget::MAX_FORMAT_PRECISION;
use allot::model::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels, json_to_cel};
use allot::model::policy::{self, Source};
use kube::core::cel::cel::Value as CelValue;
use proptest::prelude::*;
use serde_json::json;

fn rule_doc(expression: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: fmt}}\nspec:\n  expression: {expression:?}\n  message: m\n  action: Deny\n"
    )
}

fn load(expression: &str) -> Result<policy::PolicySet, policy::LoadErrors> {
    policy::compile(&[Source { name: "rules.yaml".into(), text: rule_doc(expression) }])
}

/// Evaluates `source` on a Pod whose annotation `digits` holds `digits` (so a precision can be
/// computed from the object, as a tenant would steer it).
fn eval(source: &str, digits: &str) -> Result<bool, EvalError> {
    let env = Environment::new(Arc::new(allot::model::resources::ResourceMatcher::new(
        allot::model::resources::DEFAULT_ACCELERATORS,
    )));
    let pod = json!({"metadata": {"name": "p", "annotations": {"digits": digits}}, "spec": {"containers": []}});
    let scope = env.scope(&Bindings {
        vars: u8::MAX,
        object: json_to_cel(&pod),
        old_object: CelValue::Null,
        workload: json_to_cel(&json!([1, 2])),
        namespace: "vision".into(),
        team: String::new(),
        request: CelValue::Null,
        object_accelerators: None,
    });
    let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    expression.eval_bool(&scope, &"cel-format")
}

fn panics() -> u64 {
    RULE_PANICS.get_or_create(&RuleLabels { rule: "cel-format".into() }).get()
}

#[test]
fn the_fuzz_input_is_refused_at_load_with_its_column() {
    let source = "format(\"233%.5786648343f7\", workload.map(y, (0))) != ''";
    let err = Expression::compile(source).expect_err("a constant precision past the limit").to_string();
    assert!(err.contains("format precision %.5786648343 is larger than Allot allows (1000 digits)"), "{err}");
    assert!(err.contains("(column 12)"), "{err}");
    // The second finding: the same with more arguments than `format` takes (cel drops them).
    let more = "format(\"233%.5786648343f\\r\\r7\", workload.map(y, 940422246894996749u), 940422246894996749u, [], object, (0)) != ''";
    let err = Expression::compile(more).expect_err("refused with extra arguments too").to_string();
    assert!(err.contains("format precision %.5786648343 is larger than Allot allows"), "{err}");
    let err = load("format('%.99999999999e', [1.0]) != ''").map(|_| ()).expect_err("refused").to_string();
    assert!(err.contains("(Rule fmt): spec.expression:") && err.contains("%.99999999999 is larger"), "{err}");
}

#[test]
fn a_computed_precision_is_an_evaluation_error_in_both_forms() {
    for source in [
        "format('%.' + object.metadata.annotations.digits + 'f', [1.5]) != ''",
        "('%.' + object.metadata.annotations.digits + 'e').format([1.5]) != ''",
        "format('x%%y%.' + object.metadata.annotations.digits + 'f', [1.5]) != ''",
        "format('%.' + object.metadata.annotations.digits + 'f', [1.5], 7, 'extra') != ''",
    ] {
        for digits in ["5786648343", "65536", "1001", "99999999999999999999999999999999999999999999"] {
            match eval(source, digits) {
                Err(EvalError::Cel(message)) => {
                    assert!(
                        message.contains("is larger than Allot allows (1000 digits)"),
                        "{source} {digits}: {message}"
                    )
                }
                other => panic!("{source} with {digits}: expected the budget's error, got {other:?}"),
            }
        }
        assert_eq!(eval(source, "2"), Ok(true), "{source}");
        assert_eq!(eval(source, &MAX_FORMAT_PRECISION.to_string()), Ok(true), "{source}");
    }
    assert_eq!(panics(), 0);
}

#[test]
fn many_long_verbs_are_refused_before_their_digits_are_built() {
    // 14,400 verbs of 1,000 digits each: about 19 MB of digits, past the 16 MiB a value may take.
    let many = "lists.range(120).map(x, lists.range(120).map(y, '%.1000f').join('')).join('')";
    for source in [format!("format({many}, [1.5]) != ''"), format!("({many}).format([1.5]) != ''")] {
        match eval(&source, "") {
            Err(EvalError::Cel(message)) => assert!(message.contains("larger than 16 MiB"), "{message}"),
            other => panic!("{source}: {other:?}"),
        }
    }
    // A tenth of that is formatted (and each verb wants an argument: kube-cel's own error).
    let fewer = "lists.range(12).map(x, lists.range(120).map(y, '%.1000f').join('')).join('')";
    match eval(&format!("format({fewer}, [1.5]) != ''"), "") {
        Err(EvalError::Cel(message)) => assert!(message.contains("not enough arguments"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(panics(), 0);
}

#[test]
fn literal_percent_signs_are_no_precision() {
    // `%%` is a literal percent sign in kube-cel: `%%.99999f` prints `%.99999f`, no digits.
    assert!(load("'%%.99999999f'.format([]) == '%.99999999f'").is_ok());
    assert!(load("format('%%.99999999f %.2f', [1.0]) == '%.99999999f 1.00'").is_ok());
    assert_eq!(eval("format('%%.99999999f %.2f', [1.0]) == '%.99999999f 1.00'", ""), Ok(true));
    assert_eq!(eval("'%.3e|%d'.format([1500.0, 7]) == '1.500e+03|7'", ""), Ok(true));
}

/// Format strings that can reach kube-cel's precision parsing: a precision of any length around
/// the limits that matter (Allot's 1,000; Rust's 65,535; `usize`; past `u128`), other verbs,
/// literal `%%`, and text around them.
fn format_string() -> impl Strategy<Value = String> {
    let precision = prop_oneof![
        0u128..=1_200,
        65_530u128..=65_540,
        Just(u128::from(u64::MAX)),
        any::<u128>(),
        Just(u128::MAX).prop_map(|m| m / 7),
    ]
    .prop_map(|p| p.to_string());
    let piece = prop_oneof![
        (precision.clone(), prop::sample::select(vec!['f', 'e', 'd', 's', 'x', 'q']))
            .prop_map(|(p, v)| format!("%.{p}{v}")),
        precision.prop_map(|p| format!("%%.{p}f")),
        prop::sample::select(vec!["%s", "%d", "abc", "%", "%.", "%.f", "ü"]).prop_map(str::to_string),
    ];
    prop::collection::vec(piece, 1..4).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the format string, in either form, constant or read from the object: loading
    /// refuses it or evaluation answers or errs — never a panic, never a string of more than
    /// [`MAX_FORMAT_PRECISION`] digits per verb.
    #[test]
    fn format_answers_or_errs_never_panics(
        fmt in format_string(),
        global in any::<bool>(),
        computed in any::<bool>(),
        extra in prop::sample::select(vec!["", ", 1", ", [], object, 2u"]),
    ) {
        let args = format!("[1.5, 2, 'x']{extra}");
        let fmt_expr = if computed { "object.metadata.annotations.digits".to_string() } else { format!("{fmt:?}") };
        let call = if global { format!("format({fmt_expr}, {args})") } else { format!("({fmt_expr}).format({args})") };
        let source = format!("{call}.size() >= 0");
        let before = panics();
        match Expression::compile(&source) {
            Err(e) => prop_assert!(!computed && e.to_string().contains("format precision"), "{source}: {e}"),
            Ok(_) => match eval(&source, &fmt) {
                Ok(answer) => prop_assert!(answer),
                Err(EvalError::Cel(_)) => {}
                Err(other) => prop_assert!(false, "{source} on {fmt:?}: {other:?}"),
            },
        }
        prop_assert_eq!(panics(), before);
    }
}
