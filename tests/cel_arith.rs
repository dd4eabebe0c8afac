//! Integer arithmetic at the edges of CEL's ints and uints (negation, `math.abs`, `+ - * / %`,
//! `int()`/`uint()`/`double()` conversions, values a tenant writes), generated: every expression
//! that compiles evaluates to a value or to an error, never a panic, through the interpreter and
//! through direct evaluation alike; where direct evaluation answers, the interpreter gives the
//! same answer; and where the answer is decided by ints or uints alone, it is the one checked
//! arithmetic gives (an overflow is an error, as in cel-go), computed here independently.

use std::sync::Arc;

use allot::model::expression::{
    Environment, EvalError, Evaluator, Expression, Inputs, Needs, RULE_PANICS, RuleLabels, direct,
};
use allot::model::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};
use proptest::prelude::*;
use serde_json::{Value, json};

/// What the reference arithmetic says an expression is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ref {
    Int(i64),
    UInt(u64),
    Double(f64),
    /// CEL reports an error (overflow, division by zero, no overload).
    Err,
}

/// An integer expression and its rendering.
#[derive(Debug, Clone)]
enum E {
    Int(i64),
    UInt(u64),
    Double(f64),
    /// `object.spec.<name>`: a JSON number of the bound object.
    Field(&'static str),
    /// `int(object.metadata.annotations.<name>)`: a string a tenant writes.
    Parsed(&'static str),
    Neg(Box<E>),
    Abs(Box<E>),
    Bin(&'static str, Box<E>, Box<E>),
    Conv(&'static str, Box<E>),
}

const INTS: &[i64] =
    &[i64::MIN, i64::MIN + 1, -4_611_686_018_427_387_904, -2, -1, 0, 1, 2, 3_037_000_500, i64::MAX - 1, i64::MAX];
const UINTS: &[u64] = &[0, 1, 2, 9_223_372_036_854_775_807, 9_223_372_036_854_775_808, u64::MAX - 1, u64::MAX];
const DOUBLES: &[f64] = &[0.0, -0.5, 1.5, -9.223372036854776e18, 9.223372036854776e18, 1.8446744073709552e19, 1e300];
/// `object.spec` fields, with their values.
const FIELDS: &[(&str, i64)] = &[("min", i64::MIN), ("max", i64::MAX), ("minusOne", -1), ("zero", 0)];
/// `object.metadata.annotations` values, parsed with `int()`.
const PARSED: &[(&str, &str)] = &[("min", "-9223372036854775808"), ("max", "9223372036854775807"), ("two", "2")];
const BINARY: &[&str] = &["+", "-", "*", "/", "%"];

fn leaf() -> impl Strategy<Value = E> {
    prop_oneof![
        4 => prop::sample::select(INTS).prop_map(E::Int),
        1 => prop::sample::select(UINTS).prop_map(E::UInt),
        1 => prop::sample::select(DOUBLES).prop_map(E::Double),
        2 => prop::sample::select(FIELDS).prop_map(|(name, _)| E::Field(name)),
        2 => prop::sample::select(PARSED).prop_map(|(name, _)| E::Parsed(name)),
    ]
}

fn expr() -> impl Strategy<Value = E> {
    leaf().prop_recursive(4, 24, 2, |inner| {
        prop_oneof![
            3 => inner.clone().prop_map(|e| E::Neg(Box::new(e))),
            1 => inner.clone().prop_map(|e| E::Abs(Box::new(e))),
            4 => (prop::sample::select(BINARY), inner.clone(), inner.clone())
                .prop_map(|(op, l, r)| E::Bin(op, Box::new(l), Box::new(r))),
            2 => (prop::sample::select(&["int", "uint", "double"][..]), inner)
                .prop_map(|(f, e)| E::Conv(f, Box::new(e))),
        ]
    })
}

fn render(e: &E) -> String {
    match e {
        E::Int(i) => format!("({i})"),
        E::UInt(u) => format!("{u}u"),
        E::Double(d) => format!("({d:?})"),
        E::Field(name) => format!("object.spec.{name}"),
        E::Parsed(name) => format!("int(object.metadata.annotations.{name})"),
        E::Neg(e) => format!("-({})", render(e)),
        E::Abs(e) => format!("math.abs({})", render(e)),
        E::Bin(op, l, r) => format!("({} {op} {})", render(l), render(r)),
        E::Conv(f, e) => format!("{f}({})", render(e)),
    }
}

/// Checked arithmetic on the values, as cel-go defines it.
fn reference(e: &E) -> Ref {
    match e {
        E::Int(i) => Ref::Int(*i),
        E::UInt(u) => Ref::UInt(*u),
        E::Double(d) => Ref::Double(*d),
        E::Field(name) => Ref::Int(FIELDS.iter().find(|(n, _)| n == name).map_or(0, |(_, v)| *v)),
        E::Parsed(name) => {
            PARSED.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.parse().ok()).map_or(Ref::Err, Ref::Int)
        }
        E::Neg(e) => match reference(e) {
            Ref::Int(i) => i.checked_neg().map_or(Ref::Err, Ref::Int),
            Ref::Double(d) => Ref::Double(-d),
            _ => Ref::Err,
        },
        E::Abs(e) => match reference(e) {
            Ref::Int(i) => i.checked_abs().map_or(Ref::Err, Ref::Int),
            Ref::Double(d) => Ref::Double(d.abs()),
            other => other,
        },
        E::Bin(op, l, r) => binary(op, reference(l), reference(r)),
        E::Conv(f, e) => convert(f, reference(e)),
    }
}

fn binary(op: &str, l: Ref, r: Ref) -> Ref {
    match (l, r) {
        (Ref::Int(a), Ref::Int(b)) => match op {
            "+" => a.checked_add(b),
            "-" => a.checked_sub(b),
            "*" => a.checked_mul(b),
            "/" => a.checked_div(b),
            _ => a.checked_rem(b),
        }
        .map_or(Ref::Err, Ref::Int),
        (Ref::UInt(a), Ref::UInt(b)) => match op {
            "+" => a.checked_add(b),
            "-" => a.checked_sub(b),
            "*" => a.checked_mul(b),
            "/" => a.checked_div(b),
            _ => a.checked_rem(b),
        }
        .map_or(Ref::Err, Ref::UInt),
        (Ref::Double(a), Ref::Double(b)) => match op {
            "+" => Ref::Double(a + b),
            "-" => Ref::Double(a - b),
            "*" => Ref::Double(a * b),
            "/" => Ref::Double(a / b),
            _ => Ref::Err,
        },
        _ => Ref::Err,
    }
}

fn convert(f: &str, v: Ref) -> Ref {
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    match (f, v) {
        (_, Ref::Err) => Ref::Err,
        ("int", Ref::Int(i)) => Ref::Int(i),
        ("int", Ref::UInt(u)) => i64::try_from(u).map_or(Ref::Err, Ref::Int),
        ("int", Ref::Double(d)) if d > -TWO_TO_63 && d < TWO_TO_63 => Ref::Int(d as i64),
        ("uint", Ref::Int(i)) => u64::try_from(i).map_or(Ref::Err, Ref::UInt),
        ("uint", Ref::UInt(u)) => Ref::UInt(u),
        ("uint", Ref::Double(d)) if (0.0..2.0 * TWO_TO_63).contains(&d) => Ref::UInt(d as u64),
        ("double", Ref::Int(i)) => Ref::Double(i as f64),
        ("double", Ref::UInt(u)) => Ref::Double(u as f64),
        ("double", Ref::Double(d)) => Ref::Double(d),
        _ => Ref::Err,
    }
}

fn object() -> Value {
    let spec: serde_json::Map<String, Value> = FIELDS.iter().map(|(n, v)| ((*n).to_string(), json!(v))).collect();
    let annotations: serde_json::Map<String, Value> =
        PARSED.iter().map(|(n, v)| ((*n).to_string(), json!(v))).collect();
    json!({"metadata": {"annotations": annotations}, "spec": spec})
}

const OWNER: &str = "cel-arith-property";

fn panics(owner: &str) -> u64 {
    RULE_PANICS.get_or_create(&RuleLabels { rule: owner.to_string() }).get()
}

/// Compiles `left <cmp> right` and checks it against the properties in the file's documentation.
fn check(left: &E, cmp: &str, right: &E) -> Result<(), TestCaseError> {
    let source = format!("{} {cmp} {}", render(left), render(right));
    let expression = match Expression::compile(&source) {
        Ok(expression) => expression,
        // Refused at load: only a constant negation that overflows.
        Err(e) => {
            prop_assert!(e.to_string().contains("overflows"), "{source}: {e}");
            return Ok(());
        }
    };
    let object = object();
    let matcher = ResourceMatcher::new(DEFAULT_ACCELERATORS);
    let env = Environment::new(Arc::new(ResourceMatcher::new(DEFAULT_ACCELERATORS)));
    let inputs = Inputs { needs: Needs::all(), object: Some(&object), workload: Some(&object), ..Inputs::default() };
    let (direct_panics, panics_before) = (format!("{OWNER} (direct evaluation)"), panics(OWNER));
    let direct_before = panics(&direct_panics);

    let interpreted = expression.eval_bool(&env.scope(&inputs.bindings()), &OWNER);
    let direct = expression.evaluate_direct(&inputs.variables(), &matcher, &OWNER);
    let engine = Evaluator::new(&env, &inputs).eval_bool(&expression, &OWNER);

    prop_assert!(!matches!(interpreted, Err(EvalError::Panic(_))), "{source}: {interpreted:?}");
    prop_assert!(!matches!(engine, Err(EvalError::Panic(_))), "{source}: {engine:?}");
    prop_assert_eq!(panics(OWNER), panics_before, "{}", source);
    prop_assert_eq!(panics(&direct_panics), direct_before, "{}: direct evaluation panicked", source);
    if let Some(answer) = direct {
        let matches = matches!((&answer, &interpreted), (direct::Val::Bool(d), Ok(i)) if d == i);
        prop_assert!(matches, "{}: direct {:?}, interpreter {:?}", source, answer, interpreted);
    }
    prop_assert_eq!(&engine, &interpreted, "{}", source);
    match (reference(left), reference(right)) {
        (Ref::Err, _) | (_, Ref::Err) => {
            prop_assert!(
                matches!(interpreted, Err(EvalError::Cel(_))),
                "{source}: expected an error, got {interpreted:?}"
            );
        }
        (Ref::Int(a), Ref::Int(b)) => prop_assert_eq!(interpreted, Ok(compare(cmp, a.cmp(&b))), "{}", source),
        (Ref::UInt(a), Ref::UInt(b)) => prop_assert_eq!(interpreted, Ok(compare(cmp, a.cmp(&b))), "{}", source),
        _ => {}
    }
    Ok(())
}

fn compare(cmp: &str, ordering: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    match cmp {
        "==" => ordering == Equal,
        "!=" => ordering != Equal,
        "<" => ordering == Less,
        "<=" => ordering != Greater,
        ">" => ordering == Greater,
        _ => ordering != Less,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 768, ..ProptestConfig::default() })]

    #[test]
    fn integer_arithmetic_at_the_edges_answers_or_errs_never_panics(
        left in expr(),
        cmp in prop::sample::select(&["==", "!=", "<", "<=", ">", ">="][..]),
        right in expr(),
    ) {
        check(&left, cmp, &right)?;
    }
}

/// The cases the issue names, fixed, through the same checks.
#[test]
fn the_issue_s_cases() {
    let min = || Box::new(E::Int(i64::MIN));
    let parsed_min = || Box::new(E::Parsed("min"));
    for (left, right) in [
        (E::Neg(parsed_min()), E::Int(0)),
        (E::Neg(Box::new(E::Field("min"))), E::Int(0)),
        (E::Abs(min()), E::Int(0)),
        (E::Bin("/", min(), Box::new(E::Int(-1))), E::Int(0)),
        (E::Bin("%", min(), Box::new(E::Field("minusOne"))), E::Int(0)),
        (E::Conv("int", Box::new(E::Double(9.223372036854776e18))), E::Int(0)),
        (E::Neg(Box::new(E::Neg(Box::new(E::Neg(parsed_min()))))), E::Int(0)),
    ] {
        check(&left, ">", &right).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(reference(&left), Ref::Err, "{}", render(&left));
    }
}
