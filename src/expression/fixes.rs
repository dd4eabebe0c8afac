//! Replacements for functions of the `cel` crate that panic on some input.
//!
//! - `contains` on bytes: cel 0.13 searches with `windows(needle.len())`, which panics for an
//!   empty needle (`b'x'.contains(b'')`; fuzz finding `cel_expression/bytes-contains-empty`).
//!   An empty needle is contained in every byte string, as in CEL's specification; every other
//!   receiver goes to cel's own `contains`.

use kube::core::cel::cel::extractors::This;
use kube::core::cel::cel::{Context, ResolveResult, Value, functions};

/// Registers the replacements; called after every library so they win.
pub fn register(ctx: &mut Context<'_>) {
    ctx.add_function("contains", contains);
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

    use crate::expression::{Bindings, Environment, EvalError, Expression, RULE_PANICS, RuleLabels};
    use crate::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};
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
        };
        Expression::compile(source).map_err(EvalError::Cel)?.eval_bool(&env.scope(&none), &"fixes-contains")
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
}
