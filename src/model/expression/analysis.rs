//! What a compiled expression's syntax tree says before it runs: its free variables, whether it
//! is linear in the object's size, which parts of each variable it reads ([`super::Needs`]), and
//! the rewrite that answers `accelerators(object)` from the JSON before evaluation.

use kube::core::cel::cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr};

use super::*;

/// Type names CEL lets an expression mention as identifiers (`type(x) == int`).
pub(super) const TYPE_NAMES: &[&str] =
    &["int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"];

/// Collects identifiers that are neither policy variables, type names, nor bound by an
/// enclosing comprehension (`all(c, …)`): a typo such as `objet` fails at load time instead of
/// erroring on every request.
pub(super) fn free_identifiers<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, out: &mut Vec<String>) {
    match &expr.expr {
        Expr::Ident(name) => {
            let name = name.as_str();
            if !name.starts_with('@')
                && !bound.contains(&name)
                && !VARIABLES.contains(&name)
                && !TYPE_NAMES.contains(&name)
            {
                out.push(name.to_string());
            }
        }
        Expr::Call(call) => {
            // `math.abs(x)` is a call of `abs` on the identifier `math`: a namespace, not a variable.
            let namespace = matches!(&call.target.as_deref(), Some(IdedExpr { expr: Expr::Ident(prefix), .. })
                if check::is_known_function(&format!("{prefix}.{}", call.func_name)));
            if let Some(target) = call.target.as_ref().filter(|_| !namespace) {
                free_identifiers(target, bound, out);
            }
            for arg in &call.args {
                free_identifiers(arg, bound, out);
            }
        }
        Expr::Comprehension(comp) => in_comprehension(comp, bound, |part, bound| free_identifiers(part, bound, out)),
        Expr::List(list) => list.elements.iter().for_each(|e| free_identifiers(e, bound, out)),
        Expr::Map(map) => map.entries.iter().for_each(|e| entry_identifiers(e, bound, out)),
        Expr::Struct(st) => st.entries.iter().for_each(|e| entry_identifiers(e, bound, out)),
        Expr::Select(select) => free_identifiers(&select.operand, bound, out),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// Visits a comprehension's parts: its range and initial value in the outer scope, its loop
/// condition, step and result with its iteration and accumulator variables bound.
pub(super) fn in_comprehension<'e>(
    comp: &'e ComprehensionExpr,
    bound: &mut Vec<&'e str>,
    mut visit: impl FnMut(&'e IdedExpr, &mut Vec<&'e str>),
) {
    visit(&comp.iter_range, bound);
    visit(&comp.accu_init, bound);
    let depth = bound.len();
    bound.push(comp.iter_var.as_str());
    if let Some(v) = &comp.iter_var2 {
        bound.push(v.as_str());
    }
    bound.push(comp.accu_var.as_str());
    for part in [&comp.loop_cond, &comp.loop_step, &comp.result] {
        visit(part, bound);
    }
    bound.truncate(depth);
}

pub(super) fn entry_identifiers<'e>(entry: &'e IdedEntryExpr, bound: &mut Vec<&'e str>, out: &mut Vec<String>) {
    match &entry.expr {
        EntryExpr::MapEntry(e) => {
            free_identifiers(&e.key, bound, out);
            free_identifiers(&e.value, bound, out);
        }
        EntryExpr::StructField(f) => free_identifiers(&f.value, bound, out),
    }
}

/// The tree with every `accelerators(object)` (where `object` is the policy variable, not a
/// comprehension's) replaced by the variable [`OBJECT_ACCELERATORS`].
pub(super) fn precompute_object_accelerators(expr: &IdedExpr, bound: &mut Vec<String>) -> IdedExpr {
    let id = expr.id;
    let walk = |e: &IdedExpr, bound: &mut Vec<String>| precompute_object_accelerators(e, bound);
    let rewritten = match &expr.expr {
        Expr::Call(call)
            if call.func_name == "accelerators"
                && call.target.is_none()
                && matches!(call.args.as_slice(), [IdedExpr { expr: Expr::Ident(name), .. }]
                    if name == "object" && !bound.iter().any(|b| b == "object")) =>
        {
            Expr::Ident(OBJECT_ACCELERATORS.to_string())
        }
        Expr::Call(call) => {
            let mut call = call.clone();
            call.target = call.target.as_deref().map(|t| Box::new(walk(t, bound)));
            call.args = call.args.iter().map(|a| walk(a, bound)).collect();
            Expr::Call(call)
        }
        Expr::Comprehension(comp) => {
            let mut comp = comp.as_ref().clone();
            comp.iter_range = walk(&comp.iter_range, bound);
            comp.accu_init = walk(&comp.accu_init, bound);
            let depth = bound.len();
            bound.push(comp.iter_var.clone());
            bound.extend(comp.iter_var2.clone());
            bound.push(comp.accu_var.clone());
            comp.loop_cond = walk(&comp.loop_cond, bound);
            comp.loop_step = walk(&comp.loop_step, bound);
            comp.result = walk(&comp.result, bound);
            bound.truncate(depth);
            Expr::Comprehension(Box::new(comp))
        }
        Expr::List(list) => {
            let mut list = list.clone();
            list.elements = list.elements.iter().map(|e| walk(e, bound)).collect();
            Expr::List(list)
        }
        Expr::Map(map) => {
            let mut map = map.clone();
            map.entries = map.entries.iter().map(|e| rewrite_entry(e, bound)).collect();
            Expr::Map(map)
        }
        Expr::Struct(st) => {
            let mut st = st.clone();
            st.entries = st.entries.iter().map(|e| rewrite_entry(e, bound)).collect();
            Expr::Struct(st)
        }
        Expr::Select(select) => {
            let mut select = select.clone();
            select.operand = Box::new(walk(&select.operand, bound));
            Expr::Select(select)
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => expr.expr.clone(),
    };
    IdedExpr { id, expr: rewritten }
}

pub(super) fn rewrite_entry(entry: &IdedEntryExpr, bound: &mut Vec<String>) -> IdedEntryExpr {
    let expr = match &entry.expr {
        EntryExpr::MapEntry(e) => {
            let mut e = e.clone();
            e.key = precompute_object_accelerators(&e.key, bound);
            e.value = precompute_object_accelerators(&e.value, bound);
            EntryExpr::MapEntry(e)
        }
        EntryExpr::StructField(f) => {
            let mut f = f.clone();
            f.value = precompute_object_accelerators(&f.value, bound);
            EntryExpr::StructField(f)
        }
    };
    IdedEntryExpr { id: entry.id, expr }
}

/// Functions whose cost is linear in their arguments (no regular expressions compiled from
/// data, nothing that builds a value larger than its input by more than a constant).
pub const LINEAR_FUNCTIONS: &[&str] = &[
    "accelerators",
    "acceleratorRequests",
    "acceleratorLimits",
    "contains",
    "double",
    "endsWith",
    "indexOf",
    "int",
    "lastIndexOf",
    "lowerAscii",
    "size",
    "startsWith",
    "string",
    "substring",
    "trim",
    "uint",
    "upperAscii",
];

/// See [`Expression::is_linear`]; `within`: the iteration variable of the innermost
/// comprehension around `expr` (`None` outside any).
///
/// A comprehension inside another is linear too when it walks a part of the outer one's
/// element (`object.spec.containers.all(c, !has(c.env) || c.env.all(e, …))`): each element's
/// part is walked once, so the walks together are linear in the object, not the product of
/// two lists (`containers.all(c, containers.all(d, …))`, or two parts of one element,
/// `c.a.all(x, c.b.all(y, …))`, are not: there the inner walk is rooted elsewhere).
pub(super) fn is_linear(expr: &IdedExpr, within: Option<&str>) -> bool {
    match &expr.expr {
        Expr::Call(call) => {
            (budget::is_operator(&call.func_name) || LINEAR_FUNCTIONS.contains(&call.func_name.as_str()))
                && call.target.as_deref().is_none_or(|t| is_linear(t, within))
                && call.args.iter().all(|a| is_linear(a, within))
        }
        Expr::Comprehension(comp) => {
            within.is_none_or(|var| part_of(&comp.iter_range, var))
                && comp.iter_var2.is_none()
                && !matches!(comp.accu_init.expr, Expr::List(_) | Expr::Map(_))
                && is_linear(&comp.iter_range, within)
                && is_linear(&comp.accu_init, within)
                && [&comp.loop_cond, &comp.loop_step, &comp.result]
                    .iter()
                    .all(|e| is_linear(e, Some(comp.iter_var.as_str())))
        }
        Expr::List(list) => list.elements.iter().all(|e| is_linear(e, within)),
        Expr::Map(map) => map.entries.iter().all(|e| match &e.expr {
            EntryExpr::MapEntry(m) => is_linear(&m.key, within) && is_linear(&m.value, within),
            EntryExpr::StructField(_) => false,
        }),
        Expr::Select(select) => is_linear(&select.operand, within),
        Expr::Ident(_) | Expr::Literal(_) => true,
        Expr::Struct(_) | Expr::Unspecified => false,
    }
}

/// `expr` is a field of the iteration variable `var` (`c.env`, `c.resources.limits`).
pub(super) fn part_of(expr: &IdedExpr, var: &str) -> bool {
    match &expr.expr {
        Expr::Select(select) if !select.test => {
            matches!(&select.operand.expr, Expr::Ident(name) if name == var) || part_of(&select.operand, var)
        }
        _ => false,
    }
}

/// Collects what `expr` reads of the policy variables (see [`Projection`]): a chain of field
/// selects on a variable reads that path; any other use of a variable reads it whole.
pub(super) fn collect_needs<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, needs: &mut Needs) {
    match &expr.expr {
        Expr::Ident(name) => {
            if !bound.contains(&name.as_str()) {
                needs.read(name, &[]);
            }
        }
        Expr::Select(_) => {
            // Walk down the chain of selects to its root.
            let mut path = Vec::new();
            let mut node = expr;
            while let Expr::Select(select) = &node.expr {
                path.push(select.field.as_str());
                node = &select.operand;
            }
            match &node.expr {
                Expr::Ident(name) if !bound.contains(&name.as_str()) => {
                    path.reverse();
                    needs.read(name, &path);
                }
                _ => collect_needs(node, bound, needs),
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                collect_needs(target, bound, needs);
            }
            for arg in &call.args {
                collect_needs(arg, bound, needs);
            }
        }
        Expr::Comprehension(comp) => in_comprehension(comp, bound, |part, bound| collect_needs(part, bound, needs)),
        Expr::List(list) => list.elements.iter().for_each(|e| collect_needs(e, bound, needs)),
        Expr::Map(map) => map.entries.iter().for_each(|e| entry_needs(e, bound, needs)),
        Expr::Struct(st) => st.entries.iter().for_each(|e| entry_needs(e, bound, needs)),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

pub(super) fn entry_needs<'e>(entry: &'e IdedEntryExpr, bound: &mut Vec<&'e str>, needs: &mut Needs) {
    match &entry.expr {
        EntryExpr::MapEntry(e) => {
            collect_needs(&e.key, bound, needs);
            collect_needs(&e.value, bound, needs);
        }
        EntryExpr::StructField(f) => collect_needs(&f.value, bound, needs),
    }
}
