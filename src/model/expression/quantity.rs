//! The Kubernetes CEL quantity library (`quantity()`, `isQuantity()`, `add`, `sub`,
//! `isGreaterThan`, `isLessThan`, `compareTo`, `isInteger`, `asInteger`, `asApproximateFloat`,
//! `sign`) on Allot's own exact [`Quantity`], replacing kube-cel's.
//!
//! Why: kube-cel 0.8 keeps a quantity as `mantissa × 10^scale` and scales mantissas with
//! unchecked `i128`/`i32` arithmetic, so comparing or adding quantities far apart
//! (`quantity('1e40').isGreaterThan(quantity('1n'))`, or `quantity('1e-2147483648').isInteger()`)
//! panics, and equality (`==`) goes through the same code. The panic boundary contained it, but a
//! quantity is ordinary policy input, not a bug to contain. Here a quantity is what the accounting
//! uses: `i128` nano-units, parsed by [`Quantity::parse`] (sub-nano precision rounds up, as the
//! API server does; beyond ±9.2·10¹⁸ units, or an exponent beyond ±30, is an evaluation error),
//! and `add`/`sub` are checked (an overflow is an evaluation error, like CEL's own `+`).
//!
//! `isGreaterThan`, `isLessThan` and `compareTo` are shared with kube-cel's semver library: for
//! a receiver that is not a quantity they run kube-cel's own implementation ([`delegate`]).

use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::extractors::This;
use kube::core::cel::cel::objects::Opaque;
use kube::core::cel::cel::{Context, ExecutionError, Program, ResolveResult, Value};

use crate::model::quantity::Quantity;

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// A quantity as a CEL value. The type name is kube-cel's (and the Kubernetes CEL library's),
/// so `type()`-style messages read the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CelQuantity(pub Quantity);

impl Opaque for CelQuantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// Registers the library; called after kube-cel's `register_all`, so these replace its
/// functions of the same names.
pub fn register(ctx: &mut Context<'_>) {
    ctx.add_function("quantity", parse);
    ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
    ctx.add_function("isInteger", |This(this): This<Value>| -> ResolveResult {
        Ok(Value::Bool(quantity_of(&this, "isInteger")?.is_whole()))
    });
    ctx.add_function("asInteger", as_integer);
    ctx.add_function("asApproximateFloat", |This(this): This<Value>| -> ResolveResult {
        // Rounds to the nearest double; exact for every whole quantity below 2^53.
        Ok(Value::Float(quantity_of(&this, "asApproximateFloat")?.nanos() as f64 / NANOS_PER_UNIT as f64))
    });
    ctx.add_function("sign", |This(this): This<Value>| -> ResolveResult {
        Ok(Value::Int(quantity_of(&this, "sign")?.nanos().signum() as i64))
    });
    ctx.add_function("add", |This(this): This<Value>, other: Value| arithmetic("add", &this, &other));
    ctx.add_function("sub", |This(this): This<Value>, other: Value| arithmetic("sub", &this, &other));
    ctx.add_function("isGreaterThan", |This(this): This<Value>, other: Value| {
        compare("isGreaterThan", this, other, |o| Value::Bool(o == Ordering::Greater))
    });
    ctx.add_function("isLessThan", |This(this): This<Value>, other: Value| {
        compare("isLessThan", this, other, |o| Value::Bool(o == Ordering::Less))
    });
    ctx.add_function("compareTo", |This(this): This<Value>, other: Value| {
        compare("compareTo", this, other, |o| Value::Int(o as i64))
    });
}

/// `quantity(<string>)`.
fn parse(s: Arc<String>) -> ResolveResult {
    match Quantity::parse(&s) {
        Ok(q) => Ok(Value::Opaque(Arc::new(CelQuantity(q)))),
        Err(e) => Err(ExecutionError::function_error("quantity", e.to_string())),
    }
}

/// `<Quantity>.asInteger()`: the whole number of units, an error for `500m` or beyond `int`.
fn as_integer(This(this): This<Value>) -> ResolveResult {
    let q = quantity_of(&this, "asInteger")?;
    if !q.is_whole() {
        return Err(ExecutionError::function_error("asInteger", format!("quantity {q} is not an integer")));
    }
    i64::try_from(q.nanos() / NANOS_PER_UNIT)
        .map(Value::Int)
        .map_err(|_| ExecutionError::function_error("asInteger", format!("quantity {q} is too large for an int")))
}

/// `<Quantity>.add(<Quantity | int>)`, `<Quantity>.sub(…)`, checked.
fn arithmetic(function: &'static str, this: &Value, other: &Value) -> ResolveResult {
    let a = quantity_of(this, function)?.nanos();
    let b = match other {
        Value::Int(n) => i128::from(*n) * NANOS_PER_UNIT,
        Value::UInt(n) => i128::from(*n) * NANOS_PER_UNIT,
        other => quantity_of(other, function)
            .map_err(|_| ExecutionError::function_error(function, "expects a quantity or an int"))?
            .nanos(),
    };
    let result = if function == "add" { a.checked_add(b) } else { a.checked_sub(b) };
    match result {
        Some(nanos) => Ok(Value::Opaque(Arc::new(CelQuantity(Quantity::from_nanos(nanos))))),
        None => Err(ExecutionError::function_error(function, "quantity overflow")),
    }
}

/// A comparison of two quantities; any other receiver goes to kube-cel (semver).
fn compare(function: &'static str, this: Value, other: Value, answer: impl Fn(Ordering) -> Value) -> ResolveResult {
    let Some(a) = as_quantity(&this) else {
        return delegate(function, this, other);
    };
    let b = quantity_of(&other, function)?;
    Ok(answer(a.cmp(&b)))
}

fn as_quantity(value: &Value) -> Option<Quantity> {
    match value {
        Value::Opaque(o) => o.downcast_ref::<CelQuantity>().map(|q| q.0),
        _ => None,
    }
}

fn quantity_of(value: &Value, function: &str) -> Result<Quantity, ExecutionError> {
    as_quantity(value).ok_or_else(|| {
        ExecutionError::function_error(function, format!("expects a quantity, got {:?}", value.type_of()))
    })
}

/// kube-cel's environment alone, with one program per shared comparison (`a.<name>(b)`).
struct KubeCel {
    ctx: Context<'static>,
    programs: Vec<(&'static str, Program)>,
}

static KUBE_CEL: LazyLock<KubeCel> = LazyLock::new(|| {
    let mut ctx = Context::default();
    ctx.register_all();
    let programs = ["isGreaterThan", "isLessThan", "compareTo"]
        .into_iter()
        .filter_map(|name| Program::compile(&format!("a.{name}(b)")).ok().map(|p| (name, p)))
        .collect();
    KubeCel { ctx, programs }
});

/// Runs kube-cel's own `this.<function>(other)` (its semver comparisons, and its error for a
/// receiver of another type).
fn delegate(function: &'static str, this: Value, other: Value) -> ResolveResult {
    let kube = &*KUBE_CEL;
    let Some((_, program)) = kube.programs.iter().find(|(name, _)| *name == function) else {
        return Err(ExecutionError::function_error(function, "not available"));
    };
    let mut scope = kube.ctx.new_inner_scope();
    scope.add_variable_from_value("a", this);
    scope.add_variable_from_value("b", other);
    program.execute(&scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(nanos: i128) -> Value {
        Value::Opaque(Arc::new(CelQuantity(Quantity::from_nanos(nanos))))
    }

    /// Parsed quantities cannot get here (±9.2·10¹⁸ units is far inside `i128` nano-units), but a
    /// sum of sums could: it is an error, not a wrapped or panicking `+`.
    #[test]
    fn add_and_sub_report_overflow_instead_of_wrapping() {
        assert_eq!(arithmetic("add", &q(i128::MAX - 1), &q(1)), Ok(q(i128::MAX)));
        assert!(arithmetic("add", &q(i128::MAX), &q(1)).is_err());
        assert!(arithmetic("add", &q(i128::MAX), &Value::Int(1)).is_err());
        assert!(arithmetic("sub", &q(i128::MIN), &Value::UInt(1)).is_err());
        assert_eq!(arithmetic("sub", &q(0), &Value::Int(i64::MIN)), Ok(q(-(i128::from(i64::MIN) * NANOS_PER_UNIT))));
    }
}
