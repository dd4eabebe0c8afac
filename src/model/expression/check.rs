//! The load-time check of a parsed CEL expression: everything a walk of the AST can see that
//! the engine cannot evaluate is refused when the policy loads, not on every request.
//!
//! Refused:
//! - message (struct) literals such as `c.image{}`, `Foo{}` or
//!   `google.protobuf.Int64Value{value: 1}`: the `cel` crate has no message types and panics
//!   on them (`not yet implemented: Support structs!`), so a stray pair of braces would take
//!   down every admission the rule sees;
//! - calls to functions the environment does not define (`sizee(x)`, `x.startswith('a')`): they
//!   would fail on every request;
//! - Allot's helpers (`accelerators`, `acceleratorRequests`, `acceleratorLimits`) called with
//!   other than one argument, or as a method (`c.accelerators()`);
//! - a constant `lists.range(n)` or `format` precision beyond the evaluation budget's limits
//!   ([`budget`]): it would fail on every request (evaluated unguarded, it would allocate
//!   without bound);
//! - a negation of a constant that overflows (`-(-9223372036854775808)`, [`arith`]): it
//!   would fail on every request;
//! - parts of the tree the interpreter does not evaluate (unspecified nodes, struct fields in
//!   a map literal, two-variable comprehensions).

use kube::core::cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue};

use super::{arith, budget};

/// Allot's own functions, each called as `name(x)` with exactly one argument.
pub const HELPERS: &[&str] = &["accelerators", "acceleratorRequests", "acceleratorLimits"];

/// The function a test build (`--features test-hooks`) registers to make a rule panic.
#[cfg(feature = "test-hooks")]
pub const TEST_PANIC: &str = "allotTestPanic";

/// Functions of the `cel` crate's standard environment (with its `regex` and `chrono` features).
const CEL_STANDARD: &[&str] = &[
    "contains",
    "size",
    "max",
    "min",
    "startsWith",
    "endsWith",
    "string",
    "bytes",
    "double",
    "int",
    "uint",
    "optional.none",
    "optional.of",
    "optional.ofNonZeroValue",
    "value",
    "hasValue",
    "or",
    "orValue",
    "matches",
    "duration",
    "timestamp",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
];

/// Functions kube-cel registers with its default features (the Kubernetes CEL libraries).
/// `every_listed_function_is_registered` keeps this list honest against the real environment.
const KUBERNETES: &[&str] = &[
    "add",
    "asApproximateFloat",
    "asInteger",
    "base64.decode",
    "base64.encode",
    "charAt",
    "cidr",
    "compareTo",
    "containsCIDR",
    "containsIP",
    "distinct",
    "family",
    "find",
    "findAll",
    "first",
    "flatten",
    "format",
    "format.byte",
    "format.date",
    "format.datetime",
    "format.dns1035Label",
    "format.dns1035LabelPrefix",
    "format.dns1123Label",
    "format.dns1123LabelPrefix",
    "format.dns1123Subdomain",
    "format.dns1123SubdomainPrefix",
    "format.labelValue",
    "format.named",
    "format.qualifiedName",
    "format.uri",
    "format.uuid",
    "getEscapedPath",
    "getHost",
    "getHostname",
    "getPort",
    "getQuery",
    "getScheme",
    "indexOf",
    "ip",
    "ip.isCanonical",
    "isCIDR",
    "isCIDRv4",
    "isCIDRv6",
    "isGlobalUnicast",
    "isGreaterThan",
    "isIP",
    "isIPv4",
    "isIPv6",
    "isInteger",
    "isLessThan",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isLoopback",
    "isQuantity",
    "isSemver",
    "isSorted",
    "isURL",
    "isUnspecified",
    "join",
    "jsonpatch.escapeKey",
    "last",
    "lastIndexOf",
    "lists.range",
    "lowerAscii",
    "major",
    "masked",
    "math.abs",
    "math.bitAnd",
    "math.bitNot",
    "math.bitOr",
    "math.bitShiftLeft",
    "math.bitShiftRight",
    "math.bitXor",
    "math.ceil",
    "math.floor",
    "math.greatest",
    "math.isFinite",
    "math.isInf",
    "math.isNaN",
    "math.least",
    "math.round",
    "math.sign",
    "math.sqrt",
    "math.trunc",
    "minor",
    "patch",
    "prefixLength",
    "quantity",
    "replace",
    "reverse",
    "semver",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "sign",
    "slice",
    "sort",
    "split",
    "strings.quote",
    "sub",
    "substring",
    "sum",
    "trim",
    "upperAscii",
    "url",
    "validate",
];

/// Every function name an expression may call (the namespaced ones spelled `math.abs`).
pub fn is_known_function(name: &str) -> bool {
    #[cfg(feature = "test-hooks")]
    if name == TEST_PANIC {
        return true;
    }
    HELPERS.contains(&name) || CEL_STANDARD.contains(&name) || KUBERNETES.contains(&name)
}

/// Every function name the check accepts, for the test that probes them in the real environment.
pub fn known_functions() -> impl Iterator<Item = &'static str> {
    HELPERS.iter().chain(CEL_STANDARD).chain(KUBERNETES).copied()
}

/// Walks the whole tree and returns one line per construct that cannot be evaluated, each
/// naming the offending part (as written in `source` where it can be found).
pub fn unsupported(expr: &IdedExpr, source: &str) -> Vec<String> {
    let mut problems = Vec::new();
    walk(expr, source, &mut problems);
    problems.dedup();
    problems
}

fn walk(expr: &IdedExpr, source: &str, out: &mut Vec<String>) {
    match &expr.expr {
        Expr::Struct(st) => {
            out.push(format!(
                "{} is a message literal, which Allot's CEL cannot evaluate; remove the braces \
                 (write a field as `x.field`, a map as `{{'key': value}}`)",
                quote_struct(&st.type_name, source)
            ));
            st.entries.iter().for_each(|e| walk_entry(e, source, out));
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::StructField(field) = &entry.expr {
                    out.push(format!("map literal entry `{}:` must have a quoted or computed key", field.field));
                }
                walk_entry(entry, source, out);
            }
        }
        Expr::Call(call) => {
            check_call(&call.func_name, call.target.as_deref(), call.args.len(), out);
            check_constant_sizes(call, source, out);
            out.extend(arith::constant_overflow(call, source));
            if let Some(target) = &call.target {
                walk(target, source, out);
            }
            call.args.iter().for_each(|a| walk(a, source, out));
        }
        Expr::Comprehension(comp) => {
            if let Some(second) = &comp.iter_var2 {
                out.push(format!(
                    "two-variable comprehension ({}, {second}) is not supported; use one variable",
                    comp.iter_var
                ));
            }
            for part in [&comp.iter_range, &comp.accu_init, &comp.loop_cond, &comp.loop_step, &comp.result] {
                walk(part, source, out);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| walk(e, source, out)),
        Expr::Select(select) => walk(&select.operand, source, out),
        Expr::Unspecified => out.push("the expression has an empty part that cannot be evaluated".to_string()),
        Expr::Ident(_) | Expr::Literal(_) => {}
    }
}

fn walk_entry(entry: &IdedEntryExpr, source: &str, out: &mut Vec<String>) {
    match &entry.expr {
        EntryExpr::MapEntry(e) => {
            walk(&e.key, source, out);
            walk(&e.value, source, out);
        }
        EntryExpr::StructField(f) => walk(&f.value, source, out),
    }
}

fn check_call(name: &str, target: Option<&IdedExpr>, args: usize, out: &mut Vec<String>) {
    if budget::is_operator(name) {
        return;
    }
    if HELPERS.contains(&name) {
        if target.is_some() {
            out.push(format!("{name}() is a function, not a method: write {name}(x), not x.{name}()"));
        } else if args != 1 {
            out.push(format!("{name}() takes exactly one argument (a Pod, a pod spec or a container), got {args}"));
        }
        return;
    }
    // `math.abs(x)` parses as a call of `abs` on the identifier `math`.
    if let Some(IdedExpr { expr: Expr::Ident(prefix), .. }) = target
        && is_known_function(&format!("{prefix}.{name}"))
    {
        return;
    }
    if is_known_function(name) {
        return;
    }
    let hint = match name {
        "all" | "exists" | "exists_one" | "map" | "filter" => {
            format!("; {name} is a macro: write list.{name}(x, condition)")
        }
        "has" => "; has() takes one field selection: has(object.spec.x)".to_string(),
        _ => String::new(),
    };
    let shown = if target.is_some() { format!(".{name}()") } else { format!("{name}()") };
    out.push(format!("unknown function {shown} with {args} argument(s){hint}"));
}

/// `lists.range(n)` and `'%.Nf'.format(…)` (or `format('%.Nf', …)`) with constants beyond
/// [`budget`]'s limits, with the precision's column where the source shows it.
fn check_constant_sizes(call: &CallExpr, source: &str, out: &mut Vec<String>) {
    let target = call.target.as_deref().map(|t| &t.expr);
    let namespaced_range = call.func_name == "range" && matches!(target, Some(Expr::Ident(ns)) if ns == "lists");
    if (namespaced_range || (call.func_name == "lists.range" && target.is_none()))
        && let [IdedExpr { expr: Expr::Literal(LiteralValue::Int(n)), .. }] = call.args.as_slice()
        && *n.inner() > budget::MAX_RANGE
    {
        out.push(budget::range_message(*n.inner()));
    }
    if let Some(IdedExpr { expr: Expr::Literal(LiteralValue::String(format)), .. }) = budget::format_string_of(call)
        && let Some(precision) = budget::excessive_precision(format.inner())
    {
        let written = format!("%.{precision}");
        let at = source
            .find(&written)
            .map_or_else(String::new, |byte| format!(" (column {})", source[..byte].chars().count() + 1));
        out.push(format!("{}{at}", budget::precision_message(precision)));
    }
}

/// `c.image{…}` as written, with its column (1-based) when the source shows it.
fn quote_struct(type_name: &str, source: &str) -> String {
    let found = source.match_indices(type_name).find(|(at, _)| {
        source[at + type_name.len()..].trim_start().starts_with('{')
            && !source[..*at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    });
    match found {
        Some((at, _)) => {
            let rest = &source[at..];
            let end = rest.find('}').map_or(rest.len(), |i| i + 1);
            let column = source[..at].chars().count() + 1;
            format!("`{}` (column {column})", &rest[..end])
        }
        None => format!("`{type_name}{{…}}`"),
    }
}
