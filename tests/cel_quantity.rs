//! CEL quantities (`src/model/expression/quantity.rs`): every quantity operation on extreme values is
//! a correct answer or an evaluation error, never a panic (kube-cel 0.8's own quantity library
//! panicked on them; the panic boundary only contained it).

use std::sync::Arc;

use serde_json::json;

use allot::admission::engine::Engine;
use allot::admission::{self, Phase};
use allot::model::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels, json_to_cel};
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::{self, Source};
use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::{Context, Program, Value as CelValue};

/// The environment `allot serve` builds for the default accelerator names.
fn default_env() -> Environment {
    Environment::new(Arc::new(allot::model::resources::ResourceMatcher::new(
        allot::model::resources::DEFAULT_ACCELERATORS,
    )))
}

fn gpu_pod() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "i:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "7Ei"}}}]}})
}

fn bindings() -> Bindings {
    Bindings {
        vars: u8::MAX,
        object: json_to_cel(&gpu_pod()),
        old_object: CelValue::Null,
        workload: json_to_cel(&gpu_pod()),
        namespace: "default".into(),
        team: String::new(),
        request: CelValue::Null,
        object_accelerators: None,
    }
}

fn panic_count(rule: &str) -> u64 {
    RULE_PANICS.get_or_create(&RuleLabels { rule: rule.to_string() }).get()
}

/// Evaluates `source` (which must compile) as a boolean, labelled `owner` for the panic counter.
fn eval(source: &str, owner: &str) -> Result<bool, EvalError> {
    let env = default_env();
    let b = bindings();
    let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    expression.eval_bool(&env.scope(&b), &owner)
}

/// Extremes of every kind: beyond any `i128` scale arithmetic, at the edge of Allot's range
/// (±9.2·10¹⁸ units, 1n), sub-nano, exponents at `i32`'s limits, binary suffixes.
const EXTREMES: &[&str] = &[
    "1e40",
    "-1e40",
    "9e18",
    "-9e18",
    "9223372036854775807",
    "9223372036854775808",
    "8Ei",
    "1n",
    "-1n",
    "1e-40",
    "1e-30",
    "1e30",
    "0",
    "1.5",
    "1e-2147483648",
    "10e2147483647",
    "1.5e-2147483648",
    "99999999999999999999999999999",
    "object.spec.containers[0].resources.limits['memory']",
];

fn quantity(value: &str) -> String {
    if value.starts_with("object.") { format!("quantity({value})") } else { format!("quantity('{value}')") }
}

#[test]
fn every_quantity_operation_on_extremes_answers_or_errors_never_panics() {
    let owner = "quantity-extremes";
    let unary = [".isInteger()", ".asInteger() > 0", ".asApproximateFloat() > 0.0", ".sign() > 0"];
    let binary = [
        ".isGreaterThan(B)",
        ".isLessThan(B)",
        ".compareTo(B) > 0",
        " == B",
        " != B",
        ".add(B).isGreaterThan(A)",
        ".sub(B).isLessThan(A)",
        ".add(B).sub(B) == A",
        ".add(9223372036854775807).compareTo(B) >= 0",
        ".sub(-9223372036854775808).compareTo(B) >= 0",
        ".add(18446744073709551615u).isGreaterThan(B)",
    ];
    let mut sources = Vec::new();
    for a in EXTREMES {
        if !a.starts_with("object.") {
            sources.push(format!("isQuantity('{a}') || true"));
        }
        for op in unary {
            sources.push(format!("{}{op}", quantity(a)));
        }
        for b in EXTREMES {
            for op in binary {
                sources.push(format!("{}{}", quantity(a), op.replace('B', &quantity(b)).replace('A', &quantity(a))));
            }
        }
    }
    let (mut answers, mut errors) = (0, 0);
    for source in &sources {
        match eval(source, owner) {
            Ok(_) => answers += 1,
            Err(EvalError::Cel(_)) => errors += 1,
            Err(EvalError::Panic(p)) => panic!("{source} panicked: {p}"),
        }
    }
    assert_eq!(panic_count(owner), 0, "no evaluation went through the panic boundary");
    // Both outcomes occur: the matrix reaches real arithmetic, not only parse errors.
    assert!(answers > 500 && errors > 500, "answers {answers}, errors {errors} of {}", sources.len());
}

#[test]
fn representable_extremes_give_exact_answers() {
    // `None`: an evaluation error is the right answer (beyond ±9223372036854775807 units: 8Ei is
    // 2^63 units, one more than the largest `int`; 1e30).
    for (source, expected) in [
        ("quantity('9e18').isGreaterThan(quantity('1n'))", Some(true)),
        ("quantity('-9e18').isLessThan(quantity('-1n'))", Some(true)),
        ("quantity('1n').isGreaterThan(quantity('9e18'))", Some(false)),
        ("quantity('9e18').add(quantity('1n')).isGreaterThan(quantity('9e18'))", Some(true)),
        ("quantity('9e18').add(quantity('1n')).sub(quantity('1n')) == quantity('9e18')", Some(true)),
        ("quantity('9e18').add(quantity('9e18')).sub(quantity('9e18')) == quantity('9e18')", Some(true)),
        ("quantity('9e18').add(9223372036854775807).compareTo(quantity('9e18')) == 1", Some(true)),
        ("quantity('-9e18').sub(9223372036854775807).sign() == -1", Some(true)),
        ("quantity('9e18').asInteger() == 9000000000000000000", Some(true)),
        ("quantity('9223372036854775807').asInteger() == 9223372036854775807", Some(true)),
        ("quantity('8Ei').sign() == 1", None),
        ("quantity('7Ei') == quantity('8070450532247928832')", Some(true)),
        ("quantity(object.spec.containers[0].resources.limits['memory']) == quantity('7Ei')", Some(true)),
        ("quantity('1e-30') == quantity('1n')", Some(true)),
        ("quantity('1.5n') == quantity('2n')", Some(true)),
        ("quantity('1n').isInteger()", Some(false)),
        ("quantity('1n').sign() == 1 && quantity('-1n').sign() == -1 && quantity('0').sign() == 0", Some(true)),
        ("quantity('1.5').add(1) == quantity('2500m')", Some(true)),
        ("quantity('1.5').sub(2u) == quantity('-500m')", Some(true)),
        ("quantity('1Gi').compareTo(quantity('1G')) == 1", Some(true)),
        ("quantity('1Gi').isGreaterThan(quantity('1Mi'))", Some(true)),
        ("quantity('500m').asApproximateFloat() == 0.5", Some(true)),
        ("quantity('1e30').asApproximateFloat() > 0.0", None),
        ("isQuantity('9e18') && !isQuantity('1e40') && !isQuantity('1e-2147483648')", Some(true)),
    ] {
        match (eval(source, "quantity-answers"), expected) {
            (Ok(answer), Some(expected)) => assert_eq!(answer, expected, "{source}"),
            (Err(EvalError::Cel(_)), None) => {}
            (other, expected) => panic!("{source}: got {other:?}, expected {expected:?}"),
        }
    }
    assert_eq!(panic_count("quantity-answers"), 0);
}

#[test]
fn quantities_beyond_the_range_are_clear_evaluation_errors() {
    for (source, says) in [
        ("quantity('1e40').isGreaterThan(quantity('1n'))", "invalid quantity \"1e40\": exponent out of range"),
        ("quantity('-1e40') == quantity('1')", "invalid quantity \"-1e40\""),
        ("quantity('1e-40').isInteger()", "invalid quantity \"1e-40\""),
        ("quantity('1e-2147483648').isInteger()", "exponent out of range"),
        ("quantity('1e2147483648').isInteger()", "bad exponent"),
        ("quantity('10e2147483647').sign() == 1", "exponent out of range"),
        ("quantity('9223372036854775808').sign() == 1", "too large"),
        ("quantity('9e18').add(quantity('9e18')).asInteger() > 0", "too large for an int"),
        ("quantity('1.5').asInteger() == 1", "is not an integer"),
        ("quantity('1').add('x') == quantity('1')", "expects a quantity or an int"),
        ("quantity('1').isGreaterThan(1)", "expects a quantity"),
        ("semver('1.0.0').isGreaterThan(quantity('1'))", ""),
        ("quantity('1').isGreaterThan(semver('1.0.0'))", "expects a quantity"),
        ("'a'.isLessThan('b')", ""),
    ] {
        match eval(source, "quantity-errors") {
            Err(EvalError::Cel(e)) => assert!(e.contains(says), "{source}: {e}"),
            other => panic!("{source}: expected an evaluation error, got {other:?}"),
        }
    }
    assert_eq!(panic_count("quantity-errors"), 0);
}

#[test]
fn semver_comparisons_still_reach_kube_cel() {
    for source in [
        "semver('1.2.3').isGreaterThan(semver('1.0.0'))",
        "semver('1.0.0').isLessThan(semver('2.0.0'))",
        "semver('1.0.0').compareTo(semver('1.0.0')) == 0",
        "!semver('1.0.0').isGreaterThan(semver('1.0.1'))",
    ] {
        assert_eq!(eval(source, "semver"), Ok(true), "{source}");
    }
}

/// Why Allot replaces the library: kube-cel 0.8 alone panics on these. (When an upgrade makes
/// this fail, kube-cel has fixed it, and `src/model/expression/quantity.rs` can be reconsidered.)
#[test]
fn kube_cel_alone_panics_where_allot_answers() {
    let mut kube_only = Context::default();
    kube_only.register_all();
    for source in [
        "quantity('1e40').isGreaterThan(quantity('1n'))",
        "quantity('-1e40') == quantity('1')",
        "quantity('1e-2147483648').isInteger()",
    ] {
        let program = Program::compile(source).unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.execute(&kube_only)));
        assert!(result.is_err(), "{source}: kube-cel no longer panics: {:?}", result.ok());
        assert!(matches!(eval(source, "kube-cel-contrast"), Err(EvalError::Cel(_))), "{source}");
    }
    assert_eq!(panic_count("kube-cel-contrast"), 0);
}

/// fuzz/regressions/policy_parse/quantity-extremes.yaml through the policy loader and the
/// validating webhook's entry point: each rule's evaluation error is handled by its action
/// (Deny denies, Warn warns), no rule goes through the panic boundary.
#[test]
fn the_quantity_fuzz_regression_is_handled_as_evaluation_errors() {
    let text = include_str!("../fuzz/regressions/policy_parse/quantity-extremes.yaml");
    let policies = policy::compile(&[Source { name: "quantity-extremes.yaml".into(), text: text.into() }])
        .unwrap_or_else(|e| panic!("{e}"));
    let rules = ["huge-vs-nano", "huge-equals", "min-exponent", "tiny-plus-limit"];
    let before: Vec<u64> = rules.iter().map(|r| panic_count(r)).collect();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-q", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {"username": "u"},
                    "object": gpu_pod()}
    });
    let engine = Engine::new(&policies, &NoNamespaces);
    let answer = admission::review(&serde_json::to_vec(&review).unwrap(), Phase::Validate, &engine).unwrap();
    let out: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    let response = &out["response"];
    assert_eq!(response["uid"], "u-q");
    assert_eq!(response["allowed"], false, "the Deny rule's error denies: {out}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("huge-equals") && message.contains("-1e40"), "{message}");
    assert!(!message.contains("panicked"), "{message}");
    let warnings: Vec<&str> = response["warnings"].as_array().unwrap().iter().filter_map(|w| w.as_str()).collect();
    for rule in ["huge-vs-nano", "tiny-plus-limit"] {
        assert!(warnings.iter().any(|w| w.contains(rule) && w.contains("invalid quantity")), "{rule}: {warnings:?}");
    }
    assert!(warnings.iter().all(|w| !w.contains("panicked")), "{warnings:?}");
    let after: Vec<u64> = rules.iter().map(|r| panic_count(r)).collect();
    assert_eq!(after, before, "no rule went through the panic boundary");
}
