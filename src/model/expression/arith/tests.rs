use std::sync::Arc;

use serde_json::json;

use crate::model::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels, json_to_cel};
use crate::model::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};

const OWNER: &str = "arith-tests";

/// Evaluates `source` with `object.metadata.annotations.v` bound to `value` (a string a tenant
/// writes), by the interpreter.
fn eval(source: &str, value: &str) -> Result<bool, EvalError> {
    let env = Environment::new(Arc::new(ResourceMatcher::new(DEFAULT_ACCELERATORS)));
    let object = json_to_cel(&json!({"metadata": {"annotations": {"v": value}}}));
    let bindings = Bindings {
        vars: u8::MAX,
        object: object.clone(),
        old_object: object.clone(),
        workload: object,
        namespace: String::new(),
        team: String::new(),
        request: kube::core::cel::cel::Value::Null,
        object_accelerators: None,
    };
    let expression = Expression::compile(source).map_err(|e| EvalError::Cel(e.to_string()))?;
    expression.eval_bool(&env.scope(&bindings), &OWNER)
}

fn overflow(source: &str, value: &str) -> String {
    match eval(source, value) {
        Err(EvalError::Cel(message)) => message,
        other => panic!("{source} on {value:?}: expected an evaluation error, got {other:?}"),
    }
}

fn panics() -> u64 {
    RULE_PANICS.get_or_create(&RuleLabels { rule: OWNER.into() }).get()
}

/// The case: `-int(x)` over a tenant's string is CEL's overflow error, not a panic
/// contained at the boundary.
#[test]
fn negating_the_smallest_int_is_an_overflow_error() {
    let before = panics();
    let message = overflow("-int(object.metadata.annotations.v) > 0", "-9223372036854775808");
    assert!(message.contains("integer overflow"), "{message}");
    assert_eq!(eval("-int(object.metadata.annotations.v) == 9223372036854775807", "-9223372036854775807"), Ok(true));
    assert_eq!(eval("-(-int(object.metadata.annotations.v)) == 5", "5"), Ok(true));
    // A Deny rule written like the (`… || true`) answers as CEL does: true.
    assert_eq!(eval("-int(object.metadata.annotations.v) > 0 || true", "-9223372036854775808"), Ok(true));
    // Doubles and bools negate as the `cel` crate negates them; other types have no overload.
    assert_eq!(eval("-double(object.metadata.annotations.v) == 1.5 && -true == false", "-1.5"), Ok(true));
    assert!(overflow("-object.metadata.annotations.v == ''", "x").contains("No such overload"));
    assert_eq!(panics(), before);
}

#[test]
fn constant_negations_that_overflow_are_refused_at_load_with_their_column() {
    for (source, column) in [
        ("-(-9223372036854775808) > 0 || true", 1),
        ("1 == 1 && -(-(-(-(-(-(-(-(-(-(-(-((-9223372036854775808))))))))))))) > 0", 33),
        ("[1, -( -9223372036854775808)].size() == 2", 5),
    ] {
        let err = Expression::compile(source).expect_err(source).to_string();
        assert!(err.contains(&format!("`-(-9223372036854775808)` (column {column}) overflows")), "{source}: {err}");
    }
    // Constants that negate are fine, and so are the literal itself and a computed operand.
    for source in ["-(-9223372036854775807) > 0", "-9223372036854775808 < 0", "-(-(-9223372036854775808)) < 0 || true"]
    {
        let compiled = Expression::compile(source);
        assert_eq!(compiled.is_ok(), !source.starts_with("-(-(-"), "{source}: {compiled:?}");
    }
    assert!(Expression::compile("-(int('-9223372036854775808')) > 0").is_ok());
}

#[test]
fn durations_stay_in_cel_go_s_range() {
    let before = panics();
    let d = "duration('2562047h')";
    // Sums and differences past ±2^63 ns are overflow errors instead of values that panicked
    // string() and timestamp arithmetic.
    for source in [
        format!("string({d} + {d}) != ''"),
        format!("string(duration('-2562047h') - {d}) != ''"),
        "string(timestamp('9999-01-01T00:00:00Z') - timestamp('0001-01-01T00:00:00Z')) != ''".to_string(),
        format!(
            "timestamp('2000-01-01T00:00:00Z') + duration('{}') > timestamp('2000-01-01T00:00:00Z')",
            "2562047h".repeat(1000)
        ),
        "timestamp('9999-12-31T23:59:59Z') + duration('1s') > timestamp('2000-01-01T00:00:00Z')".to_string(),
    ] {
        let message = overflow(&source, "");
        // cel reports an error inside a function's argument as a missing argument.
        let wrapped = source.starts_with("string(");
        assert!(wrapped || message.contains("Overflow") || message.contains("out of range"), "{source}: {message}");
    }
    let message = overflow(&format!("{d} + {d} > {d}"), "");
    assert!(message.contains("Overflow from binary operator 'add'"), "{message}");
    let message =
        overflow("timestamp('9999-01-01T00:00:00Z') - timestamp('0001-01-01T00:00:00Z') > duration('0s')", "");
    assert!(message.contains("Overflow from binary operator 'sub'"), "{message}");
    assert!(
        overflow("duration(object.metadata.annotations.v) > duration('0s')", &"1h".repeat(600_000)).contains("at most")
    );
    assert!(overflow("duration(object.metadata.annotations.v) > duration('0s')", "1e300h").contains("out of range"));
    // In range, the arithmetic and the getters answer as cel-go: totals as 64-bit ints.
    for source in [
        "duration('720h').getMilliseconds() == 2592000000 && duration('720h').getSeconds() == 2592000",
        "duration('90m').getHours() == 1 && duration('90m').getMinutes() == 90",
        "timestamp('2023-05-28T00:00:00Z') + duration('24h') == timestamp('2023-05-29T00:00:00Z')",
        "timestamp('2023-05-29T00:00:00Z') - timestamp('2023-05-28T00:00:00Z') == duration('24h')",
        "timestamp('2023-05-29T00:00:00Z') - duration('24h') == timestamp('2023-05-28T00:00:00Z')",
        "duration('1h') - duration('30m') == duration('30m') && string(duration('1h1m')) == '1h1m0s'",
        "timestamp('2023-05-29T10:20:30Z').getHours() == 10 && timestamp('2023-05-29T10:20:30Z').getSeconds() == 30",
        "1 + 2 == 3 && 'a' + 'b' == 'ab' && b'a' + b'b' == b'ab' && [1] + [2] == [1, 2] && 3 - 1 == 2",
        "duration('1s') > duration('0s') && (9223372036854775807 + 1 > 0 || true)",
    ] {
        assert_eq!(eval(source, ""), Ok(true), "{source}");
    }
    assert_eq!(panics(), before);
}

#[test]
fn double_conversions_out_of_range_are_overflow_errors() {
    for (source, value) in [
        ("int(double(object.metadata.annotations.v)) > 0", "9223372036854775808"),
        ("int(double(object.metadata.annotations.v)) < 0", "-9223372036854775808"),
        ("int(double(object.metadata.annotations.v)) == 0", "NaN"),
        ("uint(double(object.metadata.annotations.v)) > 0u", "18446744073709551616"),
        ("uint(double(object.metadata.annotations.v)) == 0u", "NaN"),
        ("uint(double(object.metadata.annotations.v)) == 0u", "-1"),
        ("uint(double(object.metadata.annotations.v)) == 0u", "-0.5"),
    ] {
        assert!(overflow(source, value).contains("overflow"), "{source} on {value}");
    }
    assert_eq!(
        eval("int(double(object.metadata.annotations.v)) == 9223372036854774784", "9223372036854774784"),
        Ok(true)
    );
    assert_eq!(eval("uint(double(object.metadata.annotations.v)) == 0u", "-0.0"), Ok(true));
    assert_eq!(
        eval("int(1.9) == 1 && int(-1.9) == -1 && uint(2.5) == 2u && int('7') == 7 && uint(3) == 3u", ""),
        Ok(true)
    );
}
