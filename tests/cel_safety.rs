//! The load-time CEL check and the panic boundary, through the same entry points the policy
//! loader, the engine and the admission layer use (an integration test: it crosses modules that
//! `expression` itself must not import).

use serde_json::json;

use allot::admission::engine::Engine;
use allot::admission::validate::action_on_error;
use allot::admission::{self, Phase};
use allot::model::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels};
use allot::model::namespaces::NoNamespaces;
use allot::model::policy::{self, Action, Source};
use std::sync::Arc;

use allot::model::expression::check;
use kube::core::cel::cel::{ExecutionError, Program, Value as CelValue};

fn rule_doc(name: &str, expression: &str, action: &str) -> String {
    format!(
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: {name}}}\nspec:\n  expression: {expression:?}\n  message: m\n  action: {action}\n"
    )
}

fn load(text: &str) -> Result<policy::PolicySet, policy::LoadErrors> {
    policy::compile(&[Source { name: "rules.yaml".into(), text: text.into() }])
}

fn load_error(text: &str) -> String {
    load(text).map(|_| ()).expect_err("must be refused at load").to_string()
}

/// The environment `allot serve` builds for the default accelerator names.
fn default_env() -> Environment {
    Environment::new(Arc::new(allot::model::resources::ResourceMatcher::new(
        allot::model::resources::DEFAULT_ACCELERATORS,
    )))
}

/// Bindings of nothing: for expressions that read no variable.
fn no_bindings() -> Bindings {
    Bindings {
        vars: 0,
        object: CelValue::Null,
        old_object: CelValue::Null,
        workload: CelValue::Null,
        namespace: String::new(),
        team: String::new(),
        request: CelValue::Null,
        object_accelerators: None,
    }
}

#[test]
fn message_literals_are_refused_at_load_with_their_location() {
    for (expression, part) in [
        ("object.spec.containers.all(c, c.image{}.contains(':'))", "`c.image{}` (column 31)"),
        ("Foo{} == null", "`Foo{}` (column 1)"),
        ("google.protobuf.Int64Value{value: 1} == 1", "`google.protobuf.Int64Value{value: 1}` (column 1)"),
    ] {
        let err = load_error(&rule_doc("typo", expression, "Warn"));
        assert!(err.contains("rules.yaml: document 1 (Rule typo): spec.expression:"), "{err}");
        assert!(err.contains(part), "{err}");
        assert!(err.contains("message literal"), "{err}");
    }
}

#[test]
fn the_fuzz_crash_input_is_refused_at_load() {
    let text = include_str!("../fuzz/regressions/policy_parse/struct-literal-rule.yaml");
    let err = load_error(text);
    assert!(err.contains("(Rule typo): spec.expression: `c.image{}`"), "{err}");
}

#[test]
fn message_literals_in_message_expressions_and_placement_conditions_are_refused() {
    let rule = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: msg}\nspec:\n  expression: 'false'\n  messageExpression: \"Msg{text: 'x'}\"\n  action: Deny\n";
    let err = load_error(rule);
    assert!(err.contains("(Rule msg): spec.messageExpression: `Msg{text: 'x'}`"), "{err}");
    let placement = "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: gpu}\nspec:\n  nodeSelector: {a: b}\n  when: 'Cond{}'\n";
    let err = load_error(placement);
    assert!(err.contains("(Placement gpu): spec.when: `Cond{}`"), "{err}");
}

#[test]
fn unknown_functions_and_helper_misuse_are_refused_at_load() {
    for (expression, says) in [
        ("sizee(object.spec.containers) > 0", "unknown function sizee() with 1 argument(s)"),
        ("object.metadata.name.startswith('a')", "unknown function .startswith()"),
        ("accelerators() == 0", "accelerators() takes exactly one argument"),
        (
            "accelerators(object, object) == 0",
            "accelerators() takes exactly one argument (a Pod, a pod spec or a container), got 2",
        ),
        ("object.accelerators() == 0", "write accelerators(x), not x.accelerators()"),
        ("size(acceleratorLimits()) == 0", "acceleratorLimits() takes exactly one argument"),
        ("object.spec.containers.all(c) ", "all is a macro"),
        ("math.nosuch(1) == 1", "unknown function .nosuch()"),
    ] {
        let err = Expression::compile(expression).expect_err(expression).to_string();
        assert!(err.contains(says), "{expression}: {err}");
    }
    for fine in [
        "math.abs(-1) == 1",
        "quantity('1').isInteger()",
        "size(object.spec.containers) > 0 && object.spec.containers.all(c, accelerators(c) <= 8)",
        "acceleratorRequests(object.spec).size() >= 0",
        "object.metadata.name.matches('^a') || {'a': 1}.size() == 1",
        "optional.of(1).hasValue()",
        "base64.encode(b'x') != ''",
    ] {
        assert!(Expression::compile(fine).is_ok(), "{fine}: {:?}", Expression::compile(fine).err());
    }
}

/// Keeps [`check`]'s list of known functions honest: each is registered in the real
/// environment (calling it may fail for its arguments, never as an undeclared reference).
#[test]
fn every_listed_function_is_registered() {
    let env = default_env();
    let ctx = env.scope(&no_bindings());
    let undeclared = |call: &str| {
        let program = Program::compile(call).unwrap_or_else(|e| panic!("{call}: {e}"));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.execute(&ctx)));
        matches!(result, Ok(Err(ExecutionError::UndeclaredReference(_))))
    };
    for name in check::known_functions() {
        assert!(!undeclared(&format!("{name}(1)")), "{name} is listed but not registered");
    }
    assert!(undeclared("notAFunction(1)"), "the probe must be able to fail");
}

/// fuzz/regressions/cel_expression/sum-uint-overflow: kube-cel's `sum()` added with `+`, which
/// panicked (overflow checks) or wrapped silently (release builds). Now an overflow error, as for
/// CEL's own `+`.
#[test]
fn sum_overflow_is_an_evaluation_error() {
    for source in [
        // The sum the cel_expression target rendered (inside `workload.map(y, …)`).
        "sum([[[[[1374463283923456787u, 1374463283923456787u, 1374463283923456787u, \
         1374463283923456787u, 16131858542891098079u], 'J', (0)]]]][(0)][(0)][(0)][(0)]) > 0u",
        "[18446744073709551615u, 1u].sum() > 0u",
        "[9223372036854775807, 1].sum() > 0",
        "[-9223372036854775807, -2].sum() < 0",
    ] {
        let err = eval_on_tenant_pod(source, 0, 1).unwrap_err();
        assert!(matches!(&err, EvalError::Cel(m) if m.contains("Overflow")), "{source}: {err:?}");
    }
    assert_eq!(
        eval_on_tenant_pod(
            "[1, 2, 3].sum() == 6 && [1u, 2u].sum() == 3u && [0.5, 0.25].sum() == 0.75 && [].sum() == 0",
            0,
            1
        ),
        Ok(true)
    );
}

#[test]
fn integer_overflow_stays_an_evaluation_error() {
    let env = default_env();
    let ctx = env.scope(&no_bindings());
    for source in ["9223372036854775807 + 1 > 0", "-9223372036854775807 - 2 < 0", "9223372036854775807 * 2 > 0"] {
        let err = Expression::compile(source).unwrap().eval_bool(&ctx, &"overflow").unwrap_err();
        assert!(matches!(&err, EvalError::Cel(m) if m.contains("Overflow")), "{source}: {err:?}");
    }
}

fn panic_count(rule: &str) -> u64 {
    RULE_PANICS.get_or_create(&RuleLabels { rule: rule.to_string() }).get()
}

fn validate_pod(policies: &policy::PolicySet) -> serde_json::Value {
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {"username": "u"},
                    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    });
    let engine = Engine::new(policies, &NoNamespaces);
    let answer = admission::review(&serde_json::to_vec(&review).unwrap(), Phase::Validate, &engine).unwrap();
    serde_json::from_slice(&answer.body).unwrap()
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_panicking_rule_yields_its_error_handling_and_is_counted() {
    let text = [
        rule_doc("panics-deny", "allotTestPanic(object)", "Deny"),
        rule_doc("panics-warn", "allotTestPanic(object)", "Warn"),
        rule_doc("panics-audit", "allotTestPanic(object)", "Audit"),
    ]
    .join("---\n");
    let policies = load(&text).unwrap_or_else(|e| panic!("{e}"));
    let before: Vec<u64> = ["panics-deny", "panics-warn", "panics-audit"].iter().map(|r| panic_count(r)).collect();
    let out = validate_pod(&policies);
    let response = &out["response"];
    assert_eq!(response["uid"], "u-1");
    assert_eq!(response["allowed"], false, "a Deny rule that panics denies: {out}");
    let message = response["status"]["message"].as_str().unwrap();
    assert!(message.contains("panics-deny") && message.contains("CEL evaluation panicked"), "{message}");
    let warnings: Vec<&str> = response["warnings"].as_array().unwrap().iter().filter_map(|w| w.as_str()).collect();
    assert!(warnings.iter().any(|w| w.contains("panics-warn") && w.contains("panicked")), "{warnings:?}");
    assert!(warnings.iter().any(|w| w.contains("panics-audit") && w.contains("panicked")), "Audit warns: {warnings:?}");
    let after: Vec<u64> = ["panics-deny", "panics-warn", "panics-audit"].iter().map(|r| panic_count(r)).collect();
    assert_eq!(after, before.iter().map(|b| b + 1).collect::<Vec<_>>());
    // The ordinary error of an Audit rule keeps its action.
    assert_eq!(action_on_error(&EvalError::Cel("x".into()), Action::Audit), Action::Audit);
    assert_eq!(action_on_error(&EvalError::Panic("x".into()), Action::Audit), Action::Warn);
    assert_eq!(action_on_error(&EvalError::Panic("x".into()), Action::Deny), Action::Deny);
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_panicking_placement_condition_denies() {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Placement\nmetadata: {name: boom}\nspec:\n  appliesTo: AllPods\n  nodeSelector: {a: b}\n  when: allotTestPanic(object)\n";
    let policies = load(text).unwrap_or_else(|e| panic!("{e}"));
    let before = panic_count("placement/boom");
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-2", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "default", "operation": "CREATE", "userInfo": {"username": "u"},
                    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    });
    let engine = Engine::new(&policies, &NoNamespaces);
    let answer = admission::review(&serde_json::to_vec(&review).unwrap(), Phase::Mutate, &engine).unwrap();
    let out: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(out["response"]["allowed"], false, "{out}");
    assert!(out["response"]["status"]["message"].as_str().unwrap().contains("placement/boom"), "{out}");
    assert_eq!(panic_count("placement/boom"), before + 1);
}

#[test]
fn the_test_hook_exists_only_in_test_builds() {
    // `cargo test` turns test-hooks on (self dev-dependency); a release build never has it.
    assert_eq!(Expression::compile("allotTestPanic(object)").is_ok(), cfg!(feature = "test-hooks"));
}

/// An environment and bindings with a Pod whose annotation `big` holds `big_bytes` bytes and
/// that has `containers` containers: what a tenant controls, up to the body limit.
fn eval_on_tenant_pod(source: &str, big_bytes: usize, containers: usize) -> Result<bool, EvalError> {
    let env = Environment::new(Arc::new(allot::model::resources::ResourceMatcher::new(
        allot::model::resources::DEFAULT_ACCELERATORS,
    )));
    let containers: Vec<_> = (0..containers).map(|i| json!({"name": format!("c{i}")})).collect();
    let pod = json!({"metadata": {"name": "p", "annotations": {"big": "x".repeat(big_bytes)}},
                     "spec": {"containers": containers}});
    let ctx = env.scope(&Bindings {
        vars: u8::MAX,
        object: allot::model::expression::json_to_cel(&pod),
        old_object: CelValue::Null,
        workload: CelValue::Null,
        namespace: "vision".into(),
        team: String::new(),
        request: CelValue::Null,
        object_accelerators: None,
    });
    let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    expression.eval_bool(&ctx, &"budget")
}

fn budget_error(source: &str, big_bytes: usize, containers: usize) -> String {
    match eval_on_tenant_pod(source, big_bytes, containers) {
        Err(EvalError::Cel(message)) => message,
        other => panic!("{source}: expected an evaluation error, got {other:?}"),
    }
}

/// fuzz/regressions/cel_expression/oom-0589b2cd…: the cel_expression target rendered it as
/// `lists.range((151059314))`, which compiled and then allocated ~4.8 GB (151 million list
/// items) when evaluated: an out-of-memory abort, which no panic boundary contains.
#[test]
fn the_cel_expression_oom_input_is_refused_at_load() {
    let err = Expression::compile("lists.range((151059314))").unwrap_err().to_string();
    assert!(err.contains("lists.range(151059314) is larger than Allot allows (100000 items)"), "{err}");
    // Computed, it is an evaluation error before anything is allocated.
    let computed = budget_error("lists.range(size(object.metadata.name) * 151059314).size() > 0", 0, 1);
    assert!(computed.contains("lists.range(151059314) is larger than Allot allows"), "{computed}");
}

#[test]
fn constant_sizes_beyond_the_budget_are_refused_at_load() {
    for (expression, part) in [
        ("lists.range(1000000000).size() > 0", "lists.range(1000000000) is larger than Allot allows (100000 items)"),
        ("'%.99999999999f'.format([1.0]) != ''", "format precision %.99999999999 is larger than Allot allows"),
    ] {
        let err = load_error(&rule_doc("huge", expression, "Deny"));
        assert!(err.contains("(Rule huge): spec.expression:") && err.contains(part), "{err}");
    }
    // Within the limits they load.
    assert!(load(&rule_doc("ok", "lists.range(3).size() == 3 && '%.2f'.format([1.0]) == '1.00'", "Deny")).is_ok());
}

#[test]
fn value_dependent_sizes_stop_with_an_evaluation_error() {
    // Each of these would allocate gigabytes (or try to at once and abort the process).
    let range = budget_error("lists.range(size(object.metadata.name) * 1000000000).size() > 0", 0, 1);
    assert!(range.contains("lists.range(1000000000) is larger than Allot allows"), "{range}");
    let squared = budget_error(
        "object.metadata.name.replace('', object.metadata.annotations.big).replace('', object.metadata.annotations.big).size() > 0",
        3000,
        1,
    );
    assert!(squared.contains("replace") && squared.contains("larger than 16 MiB"), "{squared}");
    let join = budget_error("lists.range(5000).map(x, 'a').join(object.metadata.annotations.big) != ''", 4000, 1);
    assert!(join.contains("join"), "{join}");
    let precision =
        budget_error("('%.' + string(size(object.metadata.name)) + '0000000000f').format([1.0]) != ''", 0, 1);
    assert!(precision.contains("format precision %.10000000000"), "{precision}");
}

#[test]
fn comprehensions_over_tenant_data_cannot_build_without_bound() {
    // 200 containers × a 1 MiB annotation: 200 MiB of strings built by one map().
    let map = budget_error(
        "object.spec.containers.map(c, object.metadata.annotations.big + c.name).size() > 0",
        1 << 20,
        200,
    );
    assert!(map.contains("more than 64 MiB of values in one evaluation"), "{map}");
    // Nested macros multiply: 2,000 × 2,000 iterations.
    let nested = budget_error("object.spec.containers.all(c, object.spec.containers.all(d, c.name != ''))", 0, 2000);
    assert!(nested.contains("more than 1000000 macro iterations"), "{nested}");
    let ranges = budget_error("lists.range(100000).all(x, lists.range(100000).all(y, y >= 0))", 0, 1);
    assert!(ranges.contains("Allot stops it there"), "{ranges}");
    // map/filter copy their list on every step: 20,000 steps would copy 2·10⁸ elements.
    let quadratic = budget_error("lists.range(20000).map(x, x).size() > 0", 0, 1);
    assert!(quadratic.contains("copied more than 50000000 list elements"), "{quadratic}");
}

#[test]
fn ordinary_expressions_are_unaffected_by_the_budget() {
    for source in [
        "object.spec.containers.map(c, c.name).join(',') == 'c0,c1,c2'",
        "object.spec.containers.filter(c, c.name != 'c1').size() == 2",
        "object.metadata.name.replace('p', 'q') == 'q' && 'a-b-c'.replace('-', '', 1) == 'ab-c'",
        "'ab'.replace('', '-') == '-a-b-' && ['a', 'b'].join() == 'ab'",
        "lists.range(3) == [0, 1, 2] && lists.range(3).map(i, object.spec.containers[i].name)[2] == 'c2'",
        "'%.3f %s'.format([1.5, object.metadata.name]) == '1.500 p'",
        "object.metadata.name + '/' + object.spec.containers[0].name == 'p/c0'",
        "object.spec.containers.all(c, object.spec.containers.exists(d, d.name == c.name))",
        "size(object.metadata.annotations.big + 'y') == 1048577",
    ] {
        assert_eq!(eval_on_tenant_pod(source, 1 << 20, 3), Ok(true), "{source}");
    }
}

/// cel 0.13 evaluates `!!x` as `!x`: a rule written with a doubled `!` (or unary `-`) would
/// decide the opposite of what it says, so it is refused at load with its location.
#[test]
fn doubled_unary_operators_are_refused_at_load_with_their_location() {
    for (expression, words) in [
        ("!!has(object.metadata.labels)", "`!` twice in a row (column 1)"),
        ("object.spec.containers.size() == - -1", "unary `-` twice in a row (column 34)"),
    ] {
        let err = load_error(&rule_doc("inverted", expression, "Deny"));
        assert!(err.contains("rules.yaml: document 1 (Rule inverted): spec.expression:"), "{err}");
        assert!(err.contains(words), "{err}");
    }
    // The same operators apart, or in a string, are fine.
    for expression in ["!(!has(object.metadata.labels))", "object.metadata.name != '!!'", "1 - -1 == 2"] {
        assert!(
            allot::model::policy::compile(&[allot::model::policy::Source {
                name: "rules.yaml".into(),
                text: rule_doc("ok", expression, "Deny")
            }])
            .is_ok(),
            "{expression}"
        );
    }
}
