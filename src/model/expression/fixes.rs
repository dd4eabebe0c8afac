//! Replacements for functions of the `cel` crate and kube-cel that panic on some input.
//!
//! - `contains` on bytes: cel 0.13 searches with `windows(needle.len())`, which panics for an
//!   empty needle (`b'x'.contains(b'')`; fuzz finding `cel_expression/bytes-contains-empty`).
//!   An empty needle is contained in every byte string, as in CEL's specification; every other
//!   receiver goes to cel's own `contains`.

use std::cmp::Ordering;
use std::sync::Arc;

use kube::core::cel::cel::extractors::This;
use kube::core::cel::cel::{Context, ExecutionError, ResolveResult, Value, functions};

/// Registers the replacements; called after every library so they win.
pub fn register(ctx: &mut Context<'_>) {
    ctx.add_function("contains", contains);
    ctx.add_function("sort", sort);
}

fn sort(This(this): This<Arc<Vec<Value>>>) -> ResolveResult {
    let sortable = |v: &Value| match v {
        Value::Float(f) => !f.is_nan(),
        Value::Int(_) | Value::UInt(_) | Value::String(_) | Value::Bool(_) | Value::Bytes(_) => true,
        _ => false,
    };
    let one_type = this.first().is_none_or(|first| {
        this.iter().all(|v| sortable(v) && std::mem::discriminant(v) == std::mem::discriminant(first))
    });
    if !one_type {
        return Err(ExecutionError::function_error(
            "sort",
            "can sort only a list of one type: int, uint, double (not NaN), string, bool or bytes",
        ));
    }
    let mut items: Vec<Value> = this.iter().cloned().collect();
    items.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
    Ok(Value::List(Arc::new(items)))
}

fn contains(This(this): This<Value>, arg: Value) -> ResolveResult {
    match (&this, &arg) {
        (Value::Bytes(haystack), Value::Bytes(needle)) => {
            Ok(Value::Bool(needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle.as_slice())))
        }
        _ => functions::contains(This(this), arg),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::model::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels};
    use crate::model::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};
    use kube::core::cel::cel::Value;

    fn eval(source: &str) -> Result<bool, EvalError> {
        let env = Environment::new(Arc::new(ResourceMatcher::new(DEFAULT_ACCELERATORS)));
        let none = Bindings {
            vars: 0,
            object: Value::Null,
            old_object: Value::Null,
            workload: Value::Null,
            namespace: String::new(),
            team: String::new(),
            request: Value::Null,
            object_accelerators: None,
        };
        Expression::compile(source)
            .map_err(|e| EvalError::Cel(e.to_string()))?
            .eval_bool(&env.scope(&none), &"fixes-contains")
    }

    /// fuzz/regressions/cel_expression/bytes-contains-empty renders as `!(b"".contains(b""))`.
    #[test]
    fn bytes_contains_an_empty_needle_instead_of_panicking() {
        assert_eq!(eval(r#"!(b"".contains(b""))"#), Ok(false));
        for (source, expected) in [
            ("b'abc'.contains(b'')", true),
            ("b'abc'.contains(b'bc')", true),
            ("b'abc'.contains(b'x')", false),
            ("b''.contains(b'x')", false),
            ("'abc'.contains('b') && !'abc'.contains('x') && 'abc'.contains('')", true),
            ("[1, 2].contains(2) && !{'a': 1}.contains('b') && {'a': 1}.contains('a')", true),
        ] {
            assert_eq!(eval(source), Ok(expected), "{source}");
        }
        assert_eq!(RULE_PANICS.get_or_create(&RuleLabels { rule: "fixes-contains".into() }).get(), 0);
    }

    /// fuzz/regressions/cel_expression/sort-mixed-types renders as `sort([workload, …, (1), …])`.
    #[test]
    fn sort_of_mixed_types_is_an_error_instead_of_a_panic() {
        for source in [
            "sort([{}, {}, {}, {}, {}, 2, 1, 3, 1, 1, 1, 1, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 5]) == []",
            "[1, 'a', 2u, 0.5, true, 1, 'b'].sort() == []",
            "[1.0, double('NaN')].sort() == []",
        ] {
            assert!(matches!(eval(source), Err(EvalError::Cel(e)) if e.contains("can sort only")), "{source}");
        }
        assert_eq!(eval("[3, 1, 2].sort() == [1, 2, 3] && ['b', 'a'].sort() == ['a', 'b']"), Ok(true));
        assert_eq!(eval("[2.5, -1.0].sort() == [-1.0, 2.5] && [true, false].sort() == [false, true]"), Ok(true));
        assert_eq!(eval("[].sort() == [] && [2u, 1u].sort() == [1u, 2u]"), Ok(true));
        assert_eq!(RULE_PANICS.get_or_create(&RuleLabels { rule: "fixes-contains".into() }).get(), 0);
    }
}
