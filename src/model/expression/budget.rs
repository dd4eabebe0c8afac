//! The evaluation budget: a policy must not be able to make Allot allocate without bound.
//!
//! The `cel` crate's interpreter has no cost limit, and an out-of-memory abort cannot be
//! contained like a panic (it takes down the process, every admission with it). What can be
//! decided from the expression alone is refused at load by [`super::check`] (`lists.range` or a
//! `format` precision with a constant beyond the limits below). The rest depends on the object
//! (whose size a tenant controls, up to the server's body limit), so every compiled expression is
//! *instrumented*: [`instrument`] rewrites the tree so that
//!
//! - every `+` and every function call that can build a value (`join`, `split`, `replace`,
//!   `base64.encode`, …; not those that return a number or a boolean, [`SCALAR_FUNCTIONS`])
//!   passes its result through `@allotSized`, which measures it: one value
//!   larger than [`MAX_VALUE_BYTES`], or more than [`MAX_EVALUATION_BYTES`] built by one
//!   evaluation, is an evaluation error. `map`/`filter` accumulate through `@result + [element]`;
//!   there the new element is measured, so a comprehension building a large list stops too;
//! - every comprehension iteration passes through `@allotIteration` (comprehensions are
//!   numbered at load; their step counts are a per-evaluation vector): more than
//!   [`MAX_ITERATIONS`] per evaluation is an evaluation error (nested macros over a tenant's
//!   lists, or over `lists.range`, multiply), and `map`/`filter`, which copy their accumulated
//!   list on every step (quadratic), may copy at most [`MAX_COPIED_ELEMENTS`] elements;
//! - the functions whose output is not linear in their input are replaced by size-checked
//!   versions that refuse *before* allocating: `lists.range(n)` ([`MAX_RANGE`]), `replace`
//!   (`s.replace('', s)` squares `s`), `join` (a large separator times many items), and a
//!   `format` string's `%.Nf` precision ([`MAX_FORMAT_PRECISION`]).
//!
//! `sum` is replaced too, for another reason: kube-cel's adds without checking for overflow.
//!
//! What stays bounded only by the expression's own size times the object's: literals that copy
//! a value (`[s, s, s]` copies `s` three times; the interpreter clones values into lists) and
//! value-linear functions between two checks. Both are bounded (policy size × body limit), and
//! the CPU they take is bounded by the request deadline (evaluation runs on a bounded blocking
//! pool, `server::Evaluations`; only small reviews under policies whose every expression is
//! linear, `Expression::is_linear`, are evaluated in place).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use kube::core::cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, LiteralValue};
use kube::core::cel::cel::common::types::{CelBool, CelInt};
use kube::core::cel::cel::extractors::{Arguments, This};
use kube::core::cel::cel::objects::Key;
use kube::core::cel::cel::{Context, ExecutionError, Value};

/// The largest single value (string bytes, list and map contents, measured deeply) an
/// evaluation may build. Larger than any object the API server accepts (3 MiB by default).
pub const MAX_VALUE_BYTES: u64 = 16 << 20;
/// What one evaluation may build in all (the sum of every measured result).
pub const MAX_EVALUATION_BYTES: u64 = 64 << 20;
/// Comprehension iterations (`all`, `exists`, `map`, `filter`…, nested ones multiplied) per
/// evaluation.
pub const MAX_ITERATIONS: u64 = 1_000_000;
/// The largest `lists.range(n)`.
pub const MAX_RANGE: i64 = 100_000;
/// The largest `%.Nf` / `%.Ne` precision in a `format` string.
pub const MAX_FORMAT_PRECISION: usize = 1_000;

/// Bytes charged per list element or map entry on top of its contents (roughly a `Value`).
const ITEM_BYTES: u64 = 32;

const SIZED: &str = "@allotSized";
const ITERATION: &str = "@allotIteration";
const START: &str = "@allotStart";
const FORMAT_GUARD: &str = "@allotFormat";

/// Elements `map` and `filter` may copy in one evaluation: the interpreter copies the
/// accumulated list on every step, so a comprehension of *n* steps copies about *n²/2*
/// elements (10,000 steps: 5·10⁷).
pub const MAX_COPIED_ELEMENTS: u64 = 50_000_000;

#[derive(Clone, Copy, Default)]
struct Spent {
    bytes: u64,
    iterations: u64,
    copied: u64,
}

thread_local! {
    static SPENT: Cell<Spent> = const { Cell::new(Spent { bytes: 0, iterations: 0, copied: 0 }) };
    /// Steps so far of each running comprehension, by its number ([`instrument`]).
    static STEPS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Starts a new evaluation's budget on this thread (evaluations do not nest), for an
/// expression of `comprehensions` comprehensions.
pub fn start(comprehensions: usize) {
    SPENT.with(|s| s.set(Spent::default()));
    STEPS.with(|s| {
        let mut steps = s.borrow_mut();
        steps.clear();
        steps.resize(comprehensions, 0);
    });
}

/// Comprehension steps counted on this thread since [`start`] (tests compare direct
/// evaluation's count with it).
#[cfg(test)]
pub(crate) fn iterations_spent() -> u64 {
    SPENT.with(Cell::get).iterations
}

/// The step counter of comprehension `instance` (grown if an evaluation was not started for
/// this expression: a counter is never skipped).
fn with_steps<R>(instance: i64, f: impl FnOnce(&mut u64) -> R) -> R {
    STEPS.with(|s| {
        let mut steps = s.borrow_mut();
        let index = usize::try_from(instance).unwrap_or(0);
        if index >= steps.len() {
            steps.resize(index + 1, 0);
        }
        f(&mut steps[index])
    })
}

fn stopped(what: String) -> ExecutionError {
    ExecutionError::function_error("comprehension", format!("{what} in one evaluation; Allot stops it there"))
}

/// One step of comprehension `instance`; `accumulates`: it copies its list on every step.
fn iteration(instance: i64, accumulates: bool) -> Result<(), ExecutionError> {
    let step = with_steps(instance, |step| {
        *step += 1;
        *step
    });
    let mut spent = SPENT.with(Cell::get);
    spent.iterations += 1;
    if accumulates {
        spent.copied = spent.copied.saturating_add(step);
    }
    SPENT.with(|s| s.set(spent));
    if spent.iterations > MAX_ITERATIONS {
        return Err(stopped(format!(
            "more than {MAX_ITERATIONS} macro iterations (all/exists/map/filter, nested ones multiply)"
        )));
    }
    if spent.copied > MAX_COPIED_ELEMENTS {
        return Err(stopped(format!(
            "map/filter copied more than {MAX_COPIED_ELEMENTS} list elements (their cost grows with the square of the list)"
        )));
    }
    Ok(())
}

/// Refuses a value of `bytes` before it is built, without charging it: its size is charged
/// once built ([`SIZED`]).
fn refuse_oversized(bytes: u64, function: &str) -> Result<(), ExecutionError> {
    if bytes > MAX_VALUE_BYTES {
        return Err(ExecutionError::function_error(
            function,
            format!("the result would be larger than {} MiB; Allot refuses to build it", MAX_VALUE_BYTES >> 20),
        ));
    }
    Ok(())
}

fn charge_bytes(bytes: u64, function: &str) -> Result<(), ExecutionError> {
    refuse_oversized(bytes, function)?;
    SPENT.with(|s| {
        let mut spent = s.get();
        spent.bytes = spent.bytes.saturating_add(bytes);
        s.set(spent);
        if spent.bytes > MAX_EVALUATION_BYTES {
            Err(ExecutionError::function_error(
                function,
                format!(
                    "the expression built more than {} MiB of values in one evaluation; Allot stops it there",
                    MAX_EVALUATION_BYTES >> 20
                ),
            ))
        } else {
            Ok(())
        }
    })
}

/// The deep size of `value`, counted up to `cap` (measuring stops there, so it costs no more
/// than the limit it enforces).
pub fn measure(value: &Value, cap: u64) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(match v {
            Value::String(s) => s.len() as u64,
            Value::Bytes(b) => b.len() as u64,
            Value::List(items) => {
                stack.extend(items.iter());
                ITEM_BYTES.saturating_mul(items.len() as u64)
            }
            Value::Map(m) => {
                for (k, v) in m.map.iter() {
                    if let Key::String(s) = k {
                        total = total.saturating_add(s.len() as u64);
                    }
                    stack.push(v);
                }
                ITEM_BYTES.saturating_mul(m.map.len() as u64)
            }
            _ => ITEM_BYTES,
        });
        if total > cap {
            break;
        }
    }
    total
}

/// Registers the budget's functions and the size-checked replacements; called after every
/// other library so the replacements win.
pub fn register(ctx: &mut Context<'_>) {
    ctx.add_function(SIZED, |v: Value| -> Result<Value, ExecutionError> {
        charge_bytes(measure(&v, MAX_VALUE_BYTES), "value size")?;
        Ok(v)
    });
    ctx.add_function(START, |init: Value, instance: i64| -> Result<Value, ExecutionError> {
        with_steps(instance, |step| *step = 0);
        Ok(init)
    });
    ctx.add_function(ITERATION, |cond: Value, instance: i64, accumulates: bool| -> Result<Value, ExecutionError> {
        iteration(instance, accumulates)?;
        Ok(cond)
    });
    ctx.add_function(FORMAT_GUARD, |v: Value| -> Result<Value, ExecutionError> {
        if let Value::String(s) = &v {
            if let Some(precision) = excessive_precision(s) {
                return Err(ExecutionError::function_error("format", precision_message(precision)));
            }
            // Each verb's digits are allocated before the result can be measured.
            refuse_oversized(float_output_bound(s), "format")?;
        }
        Ok(v)
    });
    ctx.add_function("lists.range", |n: i64| -> Result<Value, ExecutionError> {
        if n < 0 {
            return Err(ExecutionError::function_error("lists.range", "range argument must be non-negative"));
        }
        if n > MAX_RANGE {
            return Err(ExecutionError::function_error("lists.range", range_message(n)));
        }
        charge_bytes(ITEM_BYTES * n as u64, "lists.range")?;
        Ok(Value::List(Arc::new((0..n).map(Value::Int).collect())))
    });
    ctx.add_function("replace", replace);
    ctx.add_function("sum", sum);
    ctx.add_function("join", join);
}

pub(crate) fn range_message(n: i64) -> String {
    format!("lists.range({n}) is larger than Allot allows ({MAX_RANGE} items)")
}

pub(crate) fn precision_message(precision: u128) -> String {
    format!("format precision %.{precision} is larger than Allot allows ({MAX_FORMAT_PRECISION} digits)")
}

/// The verbs of a format string as kube-cel reads them: each verb's character (`None` when the
/// string ends first) and its `%.N` precision, if written (`u128::MAX` past 40 digits). `%%` is a
/// literal percent sign, not a verb.
fn verbs(format: &str) -> impl Iterator<Item = (Option<char>, Option<u128>)> + '_ {
    let mut chars = format.chars().peekable();
    std::iter::from_fn(move || {
        loop {
            match chars.next()? {
                '%' => {}
                _ => continue,
            }
            match chars.next() {
                Some('%') => continue,
                Some('.') => {}
                verb => return Some((verb, None)),
            }
            let mut digits = String::new();
            while let Some(d) = chars.next_if(char::is_ascii_digit) {
                if digits.len() < 40 {
                    digits.push(d);
                }
            }
            let precision = (!digits.is_empty()).then(|| digits.parse::<u128>().unwrap_or(u128::MAX));
            return Some((chars.next(), precision));
        }
    })
}

/// The first `%.N` precision in a format string beyond [`MAX_FORMAT_PRECISION`].
pub(crate) fn excessive_precision(format: &str) -> Option<u128> {
    verbs(format).filter_map(|(_, precision)| precision).find(|p| *p > MAX_FORMAT_PRECISION as u128)
}

/// Most bytes the `%f` and `%e` verbs of a format string can write: their precision (6 when
/// none is written) plus the integer part of the largest double (309 digits) and a sign.
fn float_output_bound(format: &str) -> u64 {
    verbs(format)
        .filter(|(verb, _)| matches!(verb, Some('f' | 'e')))
        .map(|(_, precision)| u64::try_from(precision.unwrap_or(6)).unwrap_or(u64::MAX).saturating_add(312))
        .fold(0, u64::saturating_add)
}

/// The format string of a `format` call: its receiver (`'%.2f'.format([x])`), or its first
/// argument in the global form (`format('%.2f', [x])`), which kube-cel's `This` extractor takes
/// as the receiver too (fuzz finding `cel_expression/format-global-precision`).
pub(crate) fn format_string_of(call: &CallExpr) -> Option<&IdedExpr> {
    if call.func_name != "format" {
        return None;
    }
    // Any number of arguments: cel hands a function the ones it asks for and drops the rest
    // (`format(fmt, [x], 1, 2)` formats like `format(fmt, [x])`).
    call.target.as_deref().or(call.args.first())
}

/// kube-cel's `replace`, sized before it allocates: `s.replace('', s)` squares `s`.
fn replace(This(this): This<Arc<String>>, Arguments(args): Arguments) -> Result<Value, ExecutionError> {
    let (Some(Value::String(from)), Some(Value::String(to))) = (args.first(), args.get(1)) else {
        return Err(ExecutionError::function_error("replace", "expected string argument"));
    };
    let limit = match args.get(2) {
        Some(Value::Int(n)) => Some(usize::try_from(*n).unwrap_or(0)),
        _ => None,
    };
    let occurrences = if from.is_empty() { this.chars().count() + 1 } else { this.matches(from.as_str()).count() };
    let replaced = limit.map_or(occurrences, |n| n.min(occurrences)) as u64;
    let size = (this.len() as u64).saturating_add(replaced.saturating_mul(to.len() as u64));
    charge_bytes(size, "replace")?;
    let result = match limit {
        Some(n) => this.replacen(from.as_str(), to.as_str(), n),
        None => this.replace(from.as_str(), to.as_str()),
    };
    Ok(Value::String(Arc::new(result)))
}

/// kube-cel's `sum`, with checked arithmetic: kube-cel adds with `+`, which panics on overflow
/// in a build with overflow checks and wraps silently in one without (fuzz finding
/// `cel_expression/sum-uint-overflow`); CEL's own `+` reports an overflow error.
fn sum(This(this): This<Arc<Vec<Value>>>) -> Result<Value, ExecutionError> {
    let Some((first, rest)) = this.split_first() else {
        return Ok(Value::Int(0));
    };
    rest.iter().try_fold(first.clone(), |total, item| match (&total, item) {
        (Value::Int(a), Value::Int(b)) => a
            .checked_add(*b)
            .map(Value::Int)
            .ok_or_else(|| ExecutionError::Overflow("sum", total.clone(), item.clone())),
        (Value::UInt(a), Value::UInt(b)) => a
            .checked_add(*b)
            .map(Value::UInt)
            .ok_or_else(|| ExecutionError::Overflow("sum", total.clone(), item.clone())),
        (Value::Float(a), Value::Float(b)) => Ok(Value::Float(a + b)),
        _ => Err(ExecutionError::function_error("sum", "cannot sum values of this type")),
    })
}

/// kube-cel's `join`, sized before it allocates: a large separator times many items.
fn join(This(this): This<Arc<Vec<Value>>>, Arguments(args): Arguments) -> Result<Value, ExecutionError> {
    let separator = match args.first() {
        Some(Value::String(s)) => s.to_string(),
        _ => String::new(),
    };
    let separators = (separator.len() as u64).saturating_mul(this.len().saturating_sub(1) as u64);
    charge_bytes(separators.saturating_add(measure(&Value::List(this.clone()), MAX_VALUE_BYTES)), "join")?;
    let parts: Vec<String> = this
        .iter()
        .map(|v| match v {
            Value::String(s) => s.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    Ok(Value::String(Arc::new(parts.join(&separator))))
}

/// The instrumented copy of a checked expression (see the module documentation), and how many
/// comprehensions it numbered (0, 1, …): pass that to [`start`].
pub fn instrument(expr: &IdedExpr) -> (IdedExpr, usize) {
    let mut comprehensions = 0;
    let instrumented = instrument_in(expr, None, &mut comprehensions);
    (instrumented, comprehensions)
}

/// `accumulator`: the accumulator of the comprehension whose step this is. A macro's step
/// `@result + [element]` is not measured whole (that would cost the accumulator's length on
/// every iteration); its new element is, so the accumulated list is charged once, linearly.
/// `numbered`: comprehensions numbered so far.
fn instrument_in(expr: &IdedExpr, accumulator: Option<&str>, numbered: &mut usize) -> IdedExpr {
    let id = expr.id;
    let rewritten = match &expr.expr {
        Expr::Call(call) => {
            let mut target = call.target.as_deref().map(|e| instrument_in(e, accumulator, numbered));
            let mut args: Vec<IdedExpr> = call.args.iter().map(|e| instrument_in(e, accumulator, numbered)).collect();
            if format_string_of(call).is_some() {
                // The global form becomes the method form (what kube-cel's `This` reads either
                // way): an error in an argument's evaluation reaches the caller as cel's
                // "Missing argument or target", one in the receiver's as itself.
                let format = target.take().or_else(|| (!args.is_empty()).then(|| args.remove(0)));
                target = format.map(|f| wrap(FORMAT_GUARD, f));
            }
            let call_expr =
                Expr::Call(CallExpr { func_name: call.func_name.clone(), target: target.map(Box::new), args });
            let mut node = IdedExpr { id, expr: call_expr };
            let appends_to_accumulator = call.func_name == "_+_"
                && matches!((call.args.first(), accumulator), (Some(IdedExpr { expr: Expr::Ident(name), .. }), Some(accu)) if name == accu);
            if appends_to_accumulator {
                if let Expr::Call(c) = &mut node.expr
                    && let Some(element) = c.args.pop()
                {
                    c.args.push(wrap(SIZED, element));
                }
                return node;
            }
            return if builds_value(&call.func_name) { wrap(SIZED, node) } else { node };
        }
        Expr::Comprehension(comp) => {
            let mut comp = comp.as_ref().clone();
            let number = *numbered;
            *numbered += 1;
            comp.iter_range = instrument_in(&comp.iter_range, accumulator, numbered);
            // `map` and `filter` accumulate a list, which the interpreter copies on every step.
            let accumulates = matches!(comp.accu_init.expr, Expr::List(_));
            let literal = |value: LiteralValue| IdedExpr { id, expr: Expr::Literal(value) };
            let instance = literal(LiteralValue::Int(CelInt::from(number as i64)));
            comp.accu_init =
                call(START, vec![instrument_in(&comp.accu_init, accumulator, numbered), instance.clone()], id);
            comp.loop_cond = call(
                ITERATION,
                vec![
                    instrument_in(&comp.loop_cond, accumulator, numbered),
                    instance,
                    literal(LiteralValue::Boolean(CelBool::from(accumulates))),
                ],
                id,
            );
            comp.result = instrument_in(&comp.result, accumulator, numbered);
            comp.loop_step = instrument_in(&comp.loop_step, Some(comp.accu_var.as_str()), numbered);
            Expr::Comprehension(Box::new(comp))
        }
        Expr::List(list) => {
            let mut list = list.clone();
            list.elements = list.elements.iter().map(|e| instrument_in(e, accumulator, numbered)).collect();
            Expr::List(list)
        }
        Expr::Map(map) => {
            let mut map = map.clone();
            map.entries = map.entries.iter().map(|e| instrument_entry(e, accumulator, numbered)).collect();
            Expr::Map(map)
        }
        Expr::Struct(st) => {
            let mut st = st.clone();
            st.entries = st.entries.iter().map(|e| instrument_entry(e, accumulator, numbered)).collect();
            Expr::Struct(st)
        }
        Expr::Select(select) => {
            let mut select = select.clone();
            select.operand = Box::new(instrument_in(&select.operand, accumulator, numbered));
            Expr::Select(select)
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => expr.expr.clone(),
    };
    IdedExpr { id, expr: rewritten }
}

fn instrument_entry(entry: &IdedEntryExpr, accumulator: Option<&str>, numbered: &mut usize) -> IdedEntryExpr {
    let expr = match &entry.expr {
        EntryExpr::MapEntry(e) => {
            let mut e = e.clone();
            e.key = instrument_in(&e.key, accumulator, numbered);
            e.value = instrument_in(&e.value, accumulator, numbered);
            EntryExpr::MapEntry(e)
        }
        EntryExpr::StructField(f) => {
            let mut f = f.clone();
            f.value = instrument_in(&f.value, accumulator, numbered);
            EntryExpr::StructField(f)
        }
    };
    IdedEntryExpr { id: entry.id, expr }
}

/// Functions that return a number, a boolean or a time (never a string, list or map): their
/// results need no measuring. Anything not listed is measured.
pub const SCALAR_FUNCTIONS: &[&str] = &[
    "accelerators",
    "asApproximateFloat",
    "asInteger",
    "compareTo",
    "contains",
    "containsCIDR",
    "containsIP",
    "double",
    "duration",
    "endsWith",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getMonth",
    "getSeconds",
    "hasValue",
    "indexOf",
    "int",
    "isGreaterThan",
    "isInteger",
    "isLessThan",
    "lastIndexOf",
    "matches",
    "size",
    "startsWith",
    "timestamp",
    "uint",
];

/// Operators the parser emits (`_+_`, `_[_]`, `@in`…): always well-formed, handled by the
/// interpreter itself.
pub(crate) fn is_operator(name: &str) -> bool {
    name.starts_with('@') || name.contains(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
}

/// `+`, and every named function except [`SCALAR_FUNCTIONS`]; not the other operators, which
/// return booleans or scalars, or select from what exists.
fn builds_value(func_name: &str) -> bool {
    func_name == "_+_" || !(is_operator(func_name) || SCALAR_FUNCTIONS.contains(&func_name))
}

fn wrap(function: &str, inner: IdedExpr) -> IdedExpr {
    let id = inner.id;
    call(function, vec![inner], id)
}

fn call(function: &str, args: Vec<IdedExpr>, id: u64) -> IdedExpr {
    IdedExpr { id, expr: Expr::Call(CallExpr { func_name: function.to_string(), target: None, args }) }
}
