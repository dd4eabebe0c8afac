//! Checked arithmetic: what the `cel` crate computes unchecked, Allot computes itself, so an
//! expression that compiles evaluates to a value or to CEL's overflow error (as cel-go answers),
//! never to a panic, nor to a wrapped, saturated or truncated number.
//!
//! cel 0.13 checks `+`, `-`, `*`, `/` and `%` on ints and uints (an overflow error), and kube-cel
//! 0.8 checks `math.abs`, the shifts and `slice`. Not checked (read from their sources):
//!
//! - unary `-` on an int: `i64::neg`, which panics on `-(-9223372036854775808)` where overflow
//!   checks are on (every Allot profile) and wraps where they are off (fuzz finding
//!   `cel_expression/negate-int-min`). `-int(x)` reaches it from a string a tenant writes.
//! - durations past cel-go's range (Go's `time.Duration`, ±(2^63 − 1) ns, about 292 years):
//!   `duration()` sums its terms without a bound, and `+`/`-` of two durations and `-` of two
//!   timestamps make such durations freely. On them kube-cel's `string()` panics (`seconds *
//!   10^9`), `timestamp + duration` panics in chrono past year 262143 (`DateTime + TimeDelta
//!   overflowed`) and `getSeconds()`/`getMilliseconds()` truncate to 32 bits (a duration over
//!   24.8 days already has a wrong `getMilliseconds()`).
//! - `int(double)` and `uint(double)`: 2^63 (2^64) saturates to the largest int (uint) and
//!   NaN converts to 0, where cel-go reports an overflow.
//!
//! How, without patching the crate:
//!
//! - [`guard`] rewrites the tree at load: every unary `-` becomes `@allotNegate(x)`, and in an
//!   expression that calls `duration` or `timestamp`, every `+` and binary `-` becomes
//!   `@allotAdd`/`@allotSubtract`, which compute durations and timestamps with checked
//!   arithmetic in cel-go's ranges and leave every other pair to the `cel` crate's own
//!   operators. Only such expressions can hold a duration or a timestamp at all (Allot binds
//!   its variables from JSON, which has neither), so every other expression keeps the
//!   interpreter's own `+`, with its in-place list and string appends.
//! - [`register`] adds those functions and replaces `duration`, `int`, `uint`, `getHours`,
//!   `getMinutes`, `getSeconds` and `getMilliseconds` with checked versions (which hand
//!   everything they do not check to the `cel` crate's own).
//! - [`constant_overflow`]: a negation whose operand is a constant that cannot be negated
//!   (`-(-9223372036854775808)`) is refused at load with its column, as cel's parser refuses an
//!   int literal out of range (`9223372036854775808`): it would fail on every request.
//! - Direct evaluation ([`super::direct`]) negates ints with `checked_neg` and gives up on an
//!   overflow, so the interpreter answers with the error.
//!
//! Left as the crate has it: a single `duration()` term past the range saturates to it
//! (`duration('1e300h')` is about 292 years, where cel-go errs); the sum of the terms is range
//! checked, so a term that saturates is refused unless a negative term (which Go's syntax does
//! not allow) takes the sum back into the range.

use std::sync::Arc;

use kube::core::cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue, operators};
use kube::core::cel::cel::extractors::This;
use kube::core::cel::cel::{Context, ExecutionError, FunctionContext, ResolveResult, Value, functions};

const NEGATE: &str = "@allotNegate";
const ADD: &str = "@allotAdd";
const SUBTRACT: &str = "@allotSubtract";

/// The longest text `duration()` parses. cel's parser saturates each term at 2^63 − 1 ns and
/// sums the terms as chrono durations, which panic past 2^63 − 1 ms; a term takes at least two
/// characters (`1h`), so 2^20 characters sum to at most 2^19 · (2^63 − 1) ns, 10^6 times below
/// that. A duration in cel-go's range needs far fewer.
pub const MAX_DURATION_TEXT: usize = 1 << 20;

/// The earliest and latest second of CEL's timestamp range (0001-01-01T00:00:00Z to
/// 9999-12-31T23:59:59.999999999Z), as seconds since the Unix epoch.
const MIN_TIMESTAMP_SECONDS: i64 = -62_135_596_800;
const MAX_TIMESTAMP_SECONDS: i64 = 253_402_300_799;

/// `expr` with the guarded operators (see the module documentation); `expr` is the tree as
/// the interpreter will evaluate it.
pub fn guard(expr: &IdedExpr) -> IdedExpr {
    let temporal = uses_time(expr);
    rename_calls(expr, &|call| match (call.func_name.as_str(), call.args.len()) {
        (operators::NEGATE, 1) => Some(NEGATE),
        (operators::ADD, 2) if temporal => Some(ADD),
        (operators::SUBSTRACT, 2) if temporal => Some(SUBTRACT),
        _ => None,
    })
}

/// Registers the checked functions; called after every library so the replacements win.
pub fn register(ctx: &mut Context<'_>) {
    ctx.add_function(NEGATE, negate);
    ctx.add_function(ADD, add);
    ctx.add_function(SUBTRACT, subtract);
    ctx.add_function("duration", duration);
    ctx.add_function("int", int);
    ctx.add_function("uint", uint);
    ctx.add_function("getHours", get_hours);
    ctx.add_function("getMinutes", get_minutes);
    ctx.add_function("getSeconds", get_seconds);
    ctx.add_function("getMilliseconds", get_milliseconds);
}

/// A negation of a constant that overflows (`-(-9223372036854775808)`), with its column where
/// the source shows it; `None` for any other call.
pub fn constant_overflow(call: &CallExpr, source: &str) -> Option<String> {
    if call.func_name != operators::NEGATE || call.target.is_some() {
        return None;
    }
    let [operand] = call.args.as_slice() else { return None };
    let value = constant_int(operand)?;
    if value.checked_neg().is_some() {
        return None;
    }
    let at = negation_column(source, value).map_or_else(String::new, |column| format!(" (column {column})"));
    Some(format!(
        "`-({value})`{at} overflows: CEL's ints are -9223372036854775808 to 9223372036854775807, so this \
         negation would fail on every evaluation"
    ))
}

/// The value of an int literal, or of negations of one that do not overflow.
fn constant_int(expr: &IdedExpr) -> Option<i64> {
    match &expr.expr {
        Expr::Literal(LiteralValue::Int(i)) => Some(*i.inner()),
        Expr::Call(call) if call.func_name == operators::NEGATE && call.target.is_none() => {
            match call.args.as_slice() {
                [operand] => constant_int(operand)?.checked_neg(),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The 1-based column of the `-` that negates the literal `value` in `source` (the operator
/// before it, past brackets and spaces), when the text shows one.
fn negation_column(source: &str, value: i64) -> Option<usize> {
    let digits = value.unsigned_abs().to_string();
    let chars: Vec<char> = source.chars().collect();
    let skip_back = |mut i: usize, skip: &[char]| {
        while i > 0 && skip.contains(&chars[i - 1]) {
            i -= 1;
        }
        i
    };
    source.match_indices(digits.as_str()).find_map(|(byte, _)| {
        let start = source[..byte].chars().count();
        let end = start + digits.chars().count();
        if chars.get(end).is_some_and(|c| c.is_ascii_alphanumeric() || *c == '.') {
            return None;
        }
        // The literal's own sign (negative values), then the operator that negates it.
        let mut i = skip_back(start, &[' ', '\t', '\n', '\r']);
        if value < 0 {
            i = i.checked_sub(1).filter(|&sign| chars[sign] == '-')?;
        }
        let i = skip_back(i, &[' ', '\t', '\n', '\r', '(']);
        let operator = i.checked_sub(1).filter(|&op| chars[op] == '-')?;
        Some(operator + 1)
    })
}

/// True when the tree calls `duration` or `timestamp`: only then can it hold such a value.
fn uses_time(expr: &IdedExpr) -> bool {
    let mut found = false;
    visit(expr, &mut |e| {
        found |= matches!(&e.expr, Expr::Call(call) if call.func_name == "duration" || call.func_name == "timestamp");
    });
    found
}

/// Calls `f` on every node of the tree.
fn visit(expr: &IdedExpr, f: &mut dyn FnMut(&IdedExpr)) {
    f(expr);
    match &expr.expr {
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                visit(target, f);
            }
            call.args.iter().for_each(|a| visit(a, f));
        }
        Expr::Comprehension(comp) => {
            for part in [&comp.iter_range, &comp.accu_init, &comp.loop_cond, &comp.loop_step, &comp.result] {
                visit(part, f);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| visit(e, f)),
        Expr::Map(map) => map.entries.iter().for_each(|e| visit_entry(e, f)),
        Expr::Struct(st) => st.entries.iter().for_each(|e| visit_entry(e, f)),
        Expr::Select(select) => visit(&select.operand, f),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn visit_entry(entry: &IdedEntryExpr, f: &mut dyn FnMut(&IdedExpr)) {
    match &entry.expr {
        EntryExpr::MapEntry(e) => {
            visit(&e.key, f);
            visit(&e.value, f);
        }
        EntryExpr::StructField(field) => visit(&field.value, f),
    }
}

/// The tree with each call that `rename` names called by that name instead (same target and
/// arguments, themselves renamed).
fn rename_calls(expr: &IdedExpr, rename: &dyn Fn(&CallExpr) -> Option<&'static str>) -> IdedExpr {
    let walk = |e: &IdedExpr| rename_calls(e, rename);
    let rewritten = match &expr.expr {
        Expr::Call(call) => Expr::Call(CallExpr {
            func_name: rename(call).map_or_else(|| call.func_name.clone(), str::to_string),
            target: call.target.as_deref().map(|t| Box::new(walk(t))),
            args: call.args.iter().map(walk).collect(),
        }),
        Expr::Comprehension(comp) => {
            let mut comp = comp.as_ref().clone();
            for part in
                [&mut comp.iter_range, &mut comp.accu_init, &mut comp.loop_cond, &mut comp.loop_step, &mut comp.result]
            {
                *part = walk(part);
            }
            Expr::Comprehension(Box::new(comp))
        }
        Expr::List(list) => {
            let mut list = list.clone();
            list.elements = list.elements.iter().map(walk).collect();
            Expr::List(list)
        }
        Expr::Map(map) => {
            let mut map = map.clone();
            map.entries = map.entries.iter().map(|e| rename_entry(e, rename)).collect();
            Expr::Map(map)
        }
        Expr::Struct(st) => {
            let mut st = st.clone();
            st.entries = st.entries.iter().map(|e| rename_entry(e, rename)).collect();
            Expr::Struct(st)
        }
        Expr::Select(select) => {
            let mut select = select.clone();
            select.operand = Box::new(walk(&select.operand));
            Expr::Select(select)
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => expr.expr.clone(),
    };
    IdedExpr { id: expr.id, expr: rewritten }
}

fn rename_entry(entry: &IdedEntryExpr, rename: &dyn Fn(&CallExpr) -> Option<&'static str>) -> IdedEntryExpr {
    let expr = match &entry.expr {
        EntryExpr::MapEntry(e) => {
            let mut e = e.clone();
            e.key = rename_calls(&e.key, rename);
            e.value = rename_calls(&e.value, rename);
            EntryExpr::MapEntry(e)
        }
        EntryExpr::StructField(f) => {
            let mut f = f.clone();
            f.value = rename_calls(&f.value, rename);
            EntryExpr::StructField(f)
        }
    };
    IdedEntryExpr { id: entry.id, expr }
}

fn integer_overflow(function: &str, detail: String) -> ExecutionError {
    ExecutionError::function_error(function, format!("integer overflow: {detail}"))
}

/// Unary `-` as the `cel` crate has it (ints, doubles, and bools, which it negates), with an
/// int's overflow an error.
fn negate(value: Value) -> ResolveResult {
    match value {
        Value::Int(i) => {
            i.checked_neg().map(Value::Int).ok_or_else(|| integer_overflow("-_", format!("-({i}) is not an int")))
        }
        Value::Float(f) => Ok(Value::Float(-f)),
        Value::Bool(b) => Ok(Value::Bool(!b)),
        _ => Err(ExecutionError::NoSuchOverload),
    }
}

/// A duration in cel-go's range (±(2^63 − 1) ns), else the overflow error of `operation`.
fn in_duration_range(value: Value, operation: &'static str, lhs: Value, rhs: Value) -> ResolveResult {
    match &value {
        Value::Duration(d) if d.num_nanoseconds().is_some() => Ok(value),
        _ => Err(ExecutionError::Overflow(operation, lhs, rhs)),
    }
}

/// A timestamp in CEL's range (years 1 to 9999), else the overflow error of `operation`.
fn in_timestamp_range(value: Value, operation: &'static str, lhs: Value, rhs: Value) -> ResolveResult {
    match &value {
        Value::Timestamp(t) if (MIN_TIMESTAMP_SECONDS..=MAX_TIMESTAMP_SECONDS).contains(&t.timestamp()) => Ok(value),
        _ => Err(ExecutionError::Overflow(operation, lhs, rhs)),
    }
}

/// `+` in an expression that uses durations or timestamps.
fn add(lhs: Value, rhs: Value) -> ResolveResult {
    let sum = match (&lhs, &rhs) {
        (Value::Duration(l), Value::Duration(r)) => l.checked_add(r).map(Value::Duration),
        (Value::Timestamp(t), Value::Duration(d)) => t.checked_add_signed(*d).map(Value::Timestamp),
        // The interpreter's `+` on a duration takes only a duration.
        (Value::Duration(_), _) => return Err(ExecutionError::UnsupportedBinaryOperator("add", lhs, rhs)),
        (Value::Bytes(l), Value::Bytes(r)) => return Ok(Value::Bytes(Arc::new([l.as_slice(), r.as_slice()].concat()))),
        _ => return lhs + rhs,
    };
    let sum = sum.ok_or_else(|| ExecutionError::Overflow("add", lhs.clone(), rhs.clone()))?;
    match sum {
        Value::Duration(_) => in_duration_range(sum, "add", lhs, rhs),
        _ => in_timestamp_range(sum, "add", lhs, rhs),
    }
}

/// Binary `-` in an expression that uses durations or timestamps.
fn subtract(lhs: Value, rhs: Value) -> ResolveResult {
    let difference = match (&lhs, &rhs) {
        (Value::Duration(l), Value::Duration(r)) => l.checked_sub(r).map(Value::Duration),
        (Value::Timestamp(t), Value::Duration(d)) => t.checked_sub_signed(*d).map(Value::Timestamp),
        (Value::Timestamp(l), Value::Timestamp(r)) => Some(Value::Duration(l.signed_duration_since(r))),
        (Value::Duration(_), _) => return Err(ExecutionError::NoSuchOverload),
        _ => return lhs - rhs,
    };
    let difference = difference.ok_or_else(|| ExecutionError::Overflow("sub", lhs.clone(), rhs.clone()))?;
    match difference {
        Value::Duration(_) => in_duration_range(difference, "sub", lhs, rhs),
        _ => in_timestamp_range(difference, "sub", lhs, rhs),
    }
}

/// `duration(text)`: cel's parser, on text it cannot overflow ([`MAX_DURATION_TEXT`]), its
/// result in cel-go's range.
fn duration(text: Arc<String>) -> ResolveResult {
    if text.len() > MAX_DURATION_TEXT {
        return Err(ExecutionError::function_error(
            "duration",
            format!("the text is {} bytes long; Allot parses at most {MAX_DURATION_TEXT}", text.len()),
        ));
    }
    // A term past the range saturates to ±(2^63 − 1) ns in cel's parser: a sum at either end
    // is taken for one.
    match functions::duration(text)? {
        Value::Duration(d) if d.num_nanoseconds().is_some_and(|n| n.checked_abs().is_some_and(|a| a < i64::MAX)) => {
            Ok(Value::Duration(d))
        }
        _ => Err(ExecutionError::function_error("duration", "out of range (at most ±2562047h47m16.854775806s)")),
    }
}

/// 2^63 and 2^64 as doubles (exact).
const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
const TWO_TO_64: f64 = 18_446_744_073_709_551_616.0;

/// `int(x)`: a double outside (−2^63, 2^63), or NaN, is an overflow as in cel-go (which refuses
/// −2^63 too); everything else is the `cel` crate's conversion.
fn int(ftx: &FunctionContext<'_, '_>, This(this): This<Value>) -> ResolveResult {
    match this {
        Value::Float(f) if !(f > -TWO_TO_63 && f < TWO_TO_63) => Err(ftx.error("integer overflow")),
        other => functions::int(ftx, This(other)),
    }
}

/// `uint(x)`: a double outside [0, 2^64), or NaN, is an overflow as in cel-go.
fn uint(ftx: &FunctionContext<'_, '_>, This(this): This<Value>) -> ResolveResult {
    match this {
        Value::Float(f) if !(0.0..TWO_TO_64).contains(&f) => Err(ftx.error("unsigned integer overflow")),
        other => functions::uint(ftx, This(other)),
    }
}

/// A duration's total hours, minutes, seconds or milliseconds as a 64-bit int (cel-go's);
/// a timestamp's field is the `cel` crate's.
fn get_hours(This(this): This<Value>) -> ResolveResult {
    match &this {
        Value::Duration(d) => Ok(Value::Int(d.num_hours())),
        _ => functions::time::get_hours(This(this)),
    }
}

fn get_minutes(This(this): This<Value>) -> ResolveResult {
    match &this {
        Value::Duration(d) => Ok(Value::Int(d.num_minutes())),
        _ => functions::time::get_minutes(This(this)),
    }
}

fn get_seconds(This(this): This<Value>) -> ResolveResult {
    match &this {
        Value::Duration(d) => Ok(Value::Int(d.num_seconds())),
        _ => functions::time::get_seconds(This(this)),
    }
}

fn get_milliseconds(This(this): This<Value>) -> ResolveResult {
    match &this {
        Value::Duration(d) => Ok(Value::Int(d.num_milliseconds())),
        _ => functions::time::get_milliseconds(This(this)),
    }
}

#[cfg(test)]
mod tests;
