//! CEL for policies: compile once at load, evaluate per request.
//!
//! The environment is the `cel` crate's standard library plus the Kubernetes CEL libraries from
//! kube-cel (strings, lists, regex, format, url…; `quantity()` on Allot's exact quantities, see
//! [`quantity`]), plus Allot's accelerator helpers:
//!
//! | function | on | returns |
//! |---|---|---|
//! | `accelerators(x)` | a Pod, a pod spec or a container | total accelerator units requested (Pod: the scheduler's effective request) |
//! | `acceleratorRequests(x)` | a Pod, a pod spec or a container | map of accelerator name → units requested |
//! | `acceleratorLimits(c)` | a container | map of accelerator name → units in `limits` |
//!
//! e.g. `accelerators(object) <= 8`, `object.spec.containers.all(c, accelerators(c) == 0 ||
//! has(c.resources.limits))`. Units are whole devices, rounded up (`500m` counts as 1).
//!
//! Variables: `object` (the Pod, or the workload object for non-Pod kinds), `oldObject` (on
//! UPDATE, else null), `workload` (the top-level object under review), `namespace` (string),
//! `team` (string, `""` if none), `request` (`operation`, `dryRun`, `userInfo.username`,
//! `userInfo.groups`).
//!
//! Variables are bound by Allot itself from JSON, map keys unescaped: `labels['a.b/c']` and
//! `limits['nvidia.com/gpu']` read exactly what they say (kube-cel's `VapEvaluator` escapes keys,
//! so a rule reading `nvidia.com/gpu` errors there). `metadata.managedFields` is not bound: no
//! policy needs it and it is the largest part of most objects.
//!
//! Most expressions never reach the interpreter: those made only of the common parts (field
//! selects, comparisons, `all`/`exists`, a few string functions, `accelerators`) are also
//! compiled for evaluation over the request's JSON in place ([`direct`]), and the interpreter
//! answers only where that gives up ([`Evaluator`]). For those that do reach it:
//!
//! Binding is most of an evaluation's cost (the `cel` crate copies a bound value into its own
//! representation, and copies a map's field again on every select), so what is bound is cut to
//! what the expressions read, decided at load time ([`Needs`]): an object is bound with only
//! the fields its select chains reach (`object.spec.containers` binds `{spec: {containers}}`);
//! a variable used any other way is bound whole. `accelerators(object)` is answered from the
//! JSON before evaluation and bound as a number ([`OBJECT_ACCELERATORS`]).

pub mod arith;
pub mod budget;
pub mod check;
pub mod depth;
pub mod direct;
pub mod fixes;
pub mod panics;
pub mod quantity;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr};
use kube::core::cel::cel::objects::{Key, Map};
use kube::core::cel::cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use crate::resources::{self, ContainerResources, ResourceList, ResourceMatcher, accelerators_only};
use crate::workload::PodView;

/// The variable names a policy expression may use.
pub const VARIABLES: &[&str] = &["object", "oldObject", "workload", "namespace", "team", "request"];

pub use panics::{RULE_PANICS, RuleLabels, install_hook as install_panic_hook};

/// Evaluations that ended in an ordinary error (a missing key, a wrong type, the budget), per
/// rule (`Rule` name or `placement/<name>`): `allot_rule_evaluation_errors_total{rule}`. Such a
/// rule answers "could not be evaluated" (a Deny rule denies) on every object it errors on, so a
/// platform team wants to hear of it. Process-wide like [`RULE_PANICS`].
pub static RULE_ERRORS: std::sync::LazyLock<
    prometheus_client::metrics::family::Family<RuleLabels, prometheus_client::metrics::counter::Counter>,
> = std::sync::LazyLock::new(Default::default);

/// Counts one evaluation error of `owner`.
fn count_error(owner: &dyn std::fmt::Display) {
    RULE_ERRORS.get_or_create(&RuleLabels { rule: owner.to_string() }).inc();
}

/// Why an evaluation gave no value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// CEL reported an error (a missing field, a type mismatch, an overflow…).
    #[error("{0}")]
    Cel(String),
    /// The interpreter panicked; contained at the evaluation boundary (see [`panics`]).
    #[error("CEL evaluation panicked: {0}")]
    Panic(String),
}

/// A compiled CEL expression with its source, for messages.
#[derive(Debug)]
pub struct Expression {
    source: String,
    /// The checked tree, `accelerators(object)` made a variable, with the evaluation budget's
    /// guards in it ([`budget::instrument`]).
    instrumented: IdedExpr,
    /// How many comprehensions the tree holds (the budget counts their steps by number).
    comprehensions: usize,
    needs: Needs,
    /// Its cost is at most linear in the bound objects ([`is_linear`]).
    linear: bool,
    /// The depth of `instrumented`: the evaluation gets stack for it ([`depth`]).
    tree_depth: usize,
    /// The same tree compiled for evaluation over JSON in place, when every part of it can be
    /// ([`direct`]).
    direct: Option<direct::Direct>,
}

/// A set of [`VARIABLES`] as a bit mask (bit *i* = `VARIABLES[i]`), plus
/// [`OBJECT_ACCELERATORS_BIT`]. Binding a variable converts an object into CEL's representation,
/// so only what an evaluation's expressions mention is bound.
pub type VarSet = u8;

/// The bit of a variable name (0 for a name that is not one of [`VARIABLES`]).
pub fn var_bit(name: &str) -> VarSet {
    VARIABLES.iter().position(|v| *v == name).map_or(0, |i| 1 << i)
}

/// The variable `accelerators(object)` is rewritten to at load: the count is computed from the
/// JSON once per evaluation scope instead of converting the object back and forth in CEL.
pub const OBJECT_ACCELERATORS: &str = "@allotObjectAccelerators";
/// The [`VarSet`] bit of [`OBJECT_ACCELERATORS`].
pub const OBJECT_ACCELERATORS_BIT: VarSet = 1 << VARIABLES.len();

/// What of a bound object expressions read: all of it, or some fields (each with what is read
/// of it). Built at load from the select chains on the variable (`object.spec.containers`); any
/// other use of a value (an index, a function argument, a comparison) reads it whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Projection {
    whole: bool,
    fields: BTreeMap<String, Projection>,
}

impl Projection {
    /// Everything.
    pub fn whole() -> Projection {
        Projection { whole: true, fields: BTreeMap::new() }
    }

    /// True when the whole value is read.
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// True when any of the value at `path` (field names from here) may be read: it, a part
    /// of it, or something holding it is read.
    pub fn reads(&self, path: &[&str]) -> bool {
        if self.whole {
            return true;
        }
        match path.split_first() {
            None => !self.fields.is_empty(),
            Some((first, rest)) => self.fields.get(*first).is_some_and(|sub| sub.reads(rest)),
        }
    }

    fn add_path(&mut self, path: &[&str]) {
        if self.whole {
            return;
        }
        match path.split_first() {
            None => *self = Projection::whole(),
            Some((first, rest)) => self.fields.entry((*first).to_string()).or_default().add_path(rest),
        }
    }

    /// Adds what `other` reads.
    pub fn merge(&mut self, other: &Projection) {
        if self.whole {
            return;
        }
        if other.whole {
            *self = Projection::whole();
            return;
        }
        for (name, sub) in &other.fields {
            self.fields.entry(name.clone()).or_default().merge(sub);
        }
    }
}

/// What evaluating some expressions needs bound: the variables, and of each object variable the
/// part read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub vars: VarSet,
    pub object: Projection,
    pub old_object: Projection,
    pub workload: Projection,
}

impl Needs {
    /// Everything: every variable, every object whole.
    pub fn all() -> Needs {
        Needs {
            vars: VarSet::MAX,
            object: Projection::whole(),
            old_object: Projection::whole(),
            workload: Projection::whole(),
        }
    }

    /// True when `name` (one of [`VARIABLES`]) is needed.
    pub fn wants(&self, name: &str) -> bool {
        self.vars & var_bit(name) != 0
    }

    /// True when any bound object (`object`, `oldObject`, `workload`) may be read at `path`:
    /// for a Pod under review the three are the Pod itself or its previous version.
    pub fn reads_object_at(&self, path: &[&str]) -> bool {
        [&self.object, &self.old_object, &self.workload].iter().any(|p| p.reads(path))
    }

    /// Adds what `other` needs.
    pub fn merge(&mut self, other: &Needs) {
        self.vars |= other.vars;
        self.object.merge(&other.object);
        self.old_object.merge(&other.old_object);
        self.workload.merge(&other.workload);
    }

    fn projection_mut(&mut self, name: &str) -> Option<&mut Projection> {
        match name {
            "object" => Some(&mut self.object),
            "oldObject" => Some(&mut self.old_object),
            "workload" => Some(&mut self.workload),
            _ => None,
        }
    }

    /// Records one read of variable `name` through the field `path`.
    fn read(&mut self, name: &str, path: &[&str]) {
        if name == OBJECT_ACCELERATORS {
            self.vars |= OBJECT_ACCELERATORS_BIT;
            return;
        }
        self.vars |= var_bit(name);
        if let Some(projection) = self.projection_mut(name) {
            projection.add_path(path);
        }
    }
}

impl Expression {
    /// Compiles `source`, rejecting syntax errors, unknown variables, expressions nested
    /// deeper than [`depth`] allows and everything [`check::unsupported`] finds the engine
    /// cannot evaluate.
    pub fn compile(source: &str) -> Result<Expression, String> {
        // Before the parser: cel's parser recurses with large frames, and past its own limit
        // of 96 levels its depth counter underflows and panics (fuzz/regressions/
        // cel_expression/parser-depth-underflow); see `depth`.
        before_parsing(source)?;
        depth::on_parser_stack(|| Expression::compile_checked(source))
    }

    fn compile_checked(source: &str) -> Result<Expression, String> {
        // The scan keeps the parser below its limit; an input it misjudges still costs only a
        // policy error (the panic contained), not the process.
        let parsed = panics::contain(&"CEL parser", || Program::compile(source))
            .map_err(|panic| format!("CEL syntax error: the parser failed on this expression ({panic})"))?;
        let program = parsed.map_err(|e| format!("CEL syntax error: {e}"))?;
        let unsupported = check::unsupported(program.expression(), source);
        if !unsupported.is_empty() {
            return Err(unsupported.join("; "));
        }
        let mut unknown = Vec::new();
        free_identifiers(program.expression(), &mut Vec::new(), &mut unknown);
        unknown.sort_unstable();
        unknown.dedup();
        if !unknown.is_empty() {
            return Err(format!(
                "CEL expression uses unknown variable(s) {}; available: {}",
                unknown.join(", "),
                VARIABLES.join(", ")
            ));
        }
        let rewritten = precompute_object_accelerators(program.expression(), &mut Vec::new());
        let mut needs = Needs::default();
        collect_needs(&rewritten, &mut Vec::new(), &mut needs);
        let linear = is_linear(&rewritten, None);
        let direct = direct::Direct::compile(&rewritten);
        let (instrumented, comprehensions) = budget::instrument(&rewritten);
        let instrumented = arith::guard(&instrumented);
        let tree_depth = depth::tree_depth(&instrumented);
        if tree_depth > depth::MAX_TREE_DEPTH {
            return Err(depth::tree_message(tree_depth));
        }
        Ok(Expression { source: source.to_string(), instrumented, comprehensions, needs, linear, tree_depth, direct })
    }

    /// How deep the evaluated tree is (see [`depth::tree_depth`]).
    pub fn tree_depth(&self) -> usize {
        self.tree_depth
    }

    /// True when each step of evaluating costs at most time linear in the bound objects' size
    /// (so the whole is at most quadratic, through one comprehension): no nested
    /// comprehensions, none that accumulates a list (`map`, `filter`: quadratic copies), and only
    /// functions of linear cost ([`LINEAR_FUNCTIONS`]). The server evaluates such rules on small
    /// objects in place instead of on the blocking pool (`server::Evaluations`).
    pub fn is_linear(&self) -> bool {
        self.linear
    }

    /// The variables the expression reads.
    pub fn vars(&self) -> VarSet {
        self.needs.vars
    }

    /// What the expression reads of its variables.
    pub fn needs(&self) -> &Needs {
        &self.needs
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// True when it is compiled for direct evaluation ([`direct`]).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Its value by direct evaluation over `variables`, under the panic boundary with stack for
    /// its depth; `None` where the interpreter must answer (or the expression is not compiled
    /// for it). A panic here is a defect of direct evaluation, not of the rule: it is counted
    /// under `<owner> (direct evaluation)` and the interpreter answers.
    pub fn evaluate_direct<'a>(
        &'a self,
        variables: &direct::Variables<'a>,
        accelerators: &ResourceMatcher,
        owner: &dyn std::fmt::Display,
    ) -> Option<direct::Val<'a>> {
        let direct = self.direct.as_ref()?;
        depth::with_direct_stack(self.tree_depth, || {
            panics::contain(&format_args!("{owner} (direct evaluation)"), || direct.evaluate(variables, accelerators))
        })
        .ok()?
        .ok()
    }

    /// Runs the program under the panic boundary; `owner` (the `Rule` name or
    /// `placement/<name>`) labels a contained panic's metric and log line.
    fn execute(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<CelValue, EvalError> {
        budget::start(self.comprehensions);
        let evaluated = depth::with_evaluation_stack(self.tree_depth, || {
            panics::contain(owner, || CelValue::resolve(&self.instrumented, ctx))
        });
        match evaluated {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                count_error(owner);
                Err(EvalError::Cel(describe(&e)))
            }
            Err(panic) => Err(EvalError::Panic(panic)),
        }
    }

    /// Evaluates to a boolean; anything else is an error.
    pub fn eval_bool(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<bool, EvalError> {
        match self.execute(ctx, owner)? {
            CelValue::Bool(b) => Ok(b),
            other => {
                count_error(owner);
                Err(EvalError::Cel(format!("expression returned {other:?}, not a bool")))
            }
        }
    }

    /// Evaluates to a string; anything else is an error.
    pub fn eval_string(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<String, EvalError> {
        match self.execute(ctx, owner)? {
            CelValue::String(s) => Ok(s.as_str().to_string()),
            other => {
                count_error(owner);
                Err(EvalError::Cel(format!("messageExpression returned {other:?}, not a string")))
            }
        }
    }
}

/// Type names CEL lets an expression mention as identifiers (`type(x) == int`).
const TYPE_NAMES: &[&str] = &["int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type"];

/// Collects identifiers that are neither policy variables, type names, nor bound by an
/// enclosing comprehension (`all(c, …)`): a typo such as `objet` fails at load time instead of
/// erroring on every request.
fn free_identifiers<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, out: &mut Vec<String>) {
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
fn in_comprehension<'e>(
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

fn entry_identifiers<'e>(entry: &'e IdedEntryExpr, bound: &mut Vec<&'e str>, out: &mut Vec<String>) {
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
fn precompute_object_accelerators(expr: &IdedExpr, bound: &mut Vec<String>) -> IdedExpr {
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

fn rewrite_entry(entry: &IdedEntryExpr, bound: &mut Vec<String>) -> IdedEntryExpr {
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
fn is_linear(expr: &IdedExpr, within: Option<&str>) -> bool {
    match &expr.expr {
        Expr::Call(call) => {
            (check::is_operator(&call.func_name) || LINEAR_FUNCTIONS.contains(&call.func_name.as_str()))
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
fn part_of(expr: &IdedExpr, var: &str) -> bool {
    match &expr.expr {
        Expr::Select(select) if !select.test => {
            matches!(&select.operand.expr, Expr::Ident(name) if name == var) || part_of(&select.operand, var)
        }
        _ => false,
    }
}

/// Collects what `expr` reads of the policy variables (see [`Projection`]): a chain of field
/// selects on a variable reads that path; any other use of a variable reads it whole.
fn collect_needs<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, needs: &mut Needs) {
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

fn entry_needs<'e>(entry: &'e IdedEntryExpr, bound: &mut Vec<&'e str>, needs: &mut Needs) {
    match &entry.expr {
        EntryExpr::MapEntry(e) => {
            collect_needs(&e.key, bound, needs);
            collect_needs(&e.value, bound, needs);
        }
        EntryExpr::StructField(f) => collect_needs(&f.value, bound, needs),
    }
}

fn describe(e: &ExecutionError) -> String {
    format!("CEL evaluation error: {e}")
}

/// What is checked on the text before cel's parser sees it: nesting past [`depth::MAX_NESTING`]
/// (the parser's depth counter underflows and panics past its own limit, see `depth`) and a
/// doubled unary operator (`!!x` is `!x` in cel 0.13).
fn before_parsing(source: &str) -> Result<(), String> {
    let nesting = depth::scan(source);
    if nesting.depth > depth::MAX_NESTING {
        return Err(depth::nesting_message(nesting));
    }
    if let Some((operator, column)) = depth::repeated_unary(source) {
        return Err(depth::repeated_unary_message(operator, column));
    }
    Ok(())
}

/// A CEL expression Allot evaluates but does not own, such as a DeviceClass's device selector
/// (`device.driver == 'gpu.nvidia.com'`): parsed behind the same guards as a Rule (the text
/// scan that keeps cel's parser below its depth limit, the refused `!!x`, the parser on its
/// own stack, its panics contained) and evaluated under the panic boundary with stack for its
/// depth, but over the variables its owner's API defines instead of Allot's, with no metric:
/// its errors are its owner's, not a policy's.
#[derive(Debug)]
pub struct ForeignExpression {
    tree: IdedExpr,
    tree_depth: usize,
}

impl ForeignExpression {
    /// Parses `source`; the error says why it cannot be evaluated.
    pub fn compile(source: &str) -> Result<ForeignExpression, String> {
        before_parsing(source)?;
        depth::on_parser_stack(|| {
            let parsed = panics::contain(&"CEL parser", || Program::compile(source))
                .map_err(|panic| format!("CEL syntax error: the parser failed on this expression ({panic})"))?;
            let program = parsed.map_err(|e| format!("CEL syntax error: {e}"))?;
            let tree = arith::guard(program.expression());
            let tree_depth = depth::tree_depth(&tree);
            if tree_depth > depth::MAX_TREE_DEPTH {
                return Err(depth::tree_message(tree_depth));
            }
            Ok(ForeignExpression { tree, tree_depth })
        })
    }

    /// Evaluates in `ctx` with stack for its depth, a panic contained (counted under `owner`).
    fn evaluate(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<CelValue, EvalError> {
        let evaluated = depth::with_evaluation_stack(self.tree_depth, || {
            panics::contain(owner, || CelValue::resolve(&self.tree, ctx))
        });
        match evaluated {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(EvalError::Cel(describe(&e))),
            Err(panic) => Err(EvalError::Panic(panic)),
        }
    }

    /// Evaluates in `ctx`; `None` on an error or a panic.
    pub fn value(&self, ctx: &Context<'_>) -> Option<CelValue> {
        self.evaluate(ctx, &"CEL value").ok()
    }

    /// Evaluates to a boolean in `ctx`; anything else, an error or a panic is an error.
    pub fn eval_bool(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<bool, EvalError> {
        match self.evaluate(ctx, owner)? {
            CelValue::Bool(b) => Ok(b),
            other => Err(EvalError::Cel(format!("expression returned {other:?}, not a bool"))),
        }
    }
}

/// A root context with the Kubernetes CEL libraries (kube-cel's, with Allot's exact quantities)
/// and none of Allot's own functions or variables: where [`ForeignExpression`]s evaluate.
pub fn library_context() -> Context<'static> {
    let mut root = Context::default();
    root.register_all();
    quantity::register(&mut root);
    fixes::register(&mut root);
    arith::register(&mut root);
    root
}

/// The root CEL context of a policy set: every function registered once, shared read-only by
/// all requests. Requests bind their variables in a child scope.
pub struct Environment {
    root: Context<'static>,
    /// What `accelerators(object)` counts, when it is computed at binding.
    accelerators: Arc<ResourceMatcher>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Environment")
    }
}

impl Environment {
    /// Builds the environment; `accelerators` decides what the helper functions count.
    pub fn new(accelerators: Arc<ResourceMatcher>) -> Environment {
        let mut root = Context::default();
        root.register_all();
        quantity::register(&mut root);
        fixes::register(&mut root);
        budget::register(&mut root);
        arith::register(&mut root);
        let m = accelerators.clone();
        root.add_function("accelerators", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            let list = requests_of(&v, &m, "accelerators")?;
            total_units(&list).map(CelValue::Int).ok_or_else(|| units_overflow("accelerators"))
        });
        let m = accelerators.clone();
        root.add_function("acceleratorRequests", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            Ok(units_map(&requests_of(&v, &m, "acceleratorRequests")?))
        });
        let m = accelerators.clone();
        root.add_function("acceleratorLimits", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            let json = to_json(&v, "acceleratorLimits")?;
            let resources = ContainerResources::from_container(&json, "", &mut Vec::new());
            Ok(units_map(&accelerators_only(&resources.limits, &m)))
        });
        #[cfg(feature = "test-hooks")]
        root.add_function(check::TEST_PANIC, |v: CelValue| -> Result<CelValue, ExecutionError> {
            panic!("allotTestPanic called on {v:?} (test-hooks build)")
        });
        Environment { root, accelerators }
    }

    /// A scope for one evaluation, with the variables in `bindings.vars` bound.
    pub fn scope(&self, bindings: &Bindings) -> Context<'_> {
        let mut ctx = self.root.new_inner_scope();
        let has = |name: &str| bindings.vars & var_bit(name) != 0;
        if has("object") {
            ctx.add_variable_from_value("object", bindings.object.clone());
        }
        if has("oldObject") {
            ctx.add_variable_from_value("oldObject", bindings.old_object.clone());
        }
        if has("workload") {
            ctx.add_variable_from_value("workload", bindings.workload.clone());
        }
        if has("namespace") {
            ctx.add_variable_from_value("namespace", CelValue::String(Arc::new(bindings.namespace.clone())));
        }
        if has("team") {
            ctx.add_variable_from_value("team", CelValue::String(Arc::new(bindings.team.clone())));
        }
        if has("request") {
            ctx.add_variable_from_value("request", bindings.request.clone());
        }
        if bindings.vars & OBJECT_ACCELERATORS_BIT != 0 {
            // Computed by the caller from the JSON, or here from the bound object. When it
            // cannot be computed the variable stays unbound: the rule errors, as
            // `accelerators(object)` would have.
            let count = bindings.object_accelerators.or_else(|| {
                let list = requests_of(&bindings.object, &self.accelerators, "accelerators").ok()?;
                total_units(&list)
            });
            if let Some(count) = count {
                ctx.add_variable_from_value(OBJECT_ACCELERATORS, CelValue::Int(count));
            }
        }
        ctx
    }
}

/// Values bound to the CEL variables of one evaluation (already converted, so several rules on
/// the same object share one conversion). Only the variables in `vars` are filled in.
#[derive(Clone, Debug)]
pub struct Bindings {
    pub vars: VarSet,
    pub object: CelValue,
    pub old_object: CelValue,
    pub workload: CelValue,
    pub namespace: String,
    pub team: String,
    pub request: CelValue,
    /// `accelerators(object)`, when the caller computed it from the JSON
    /// ([`object_accelerators`]); else it is computed from `object` when needed.
    pub object_accelerators: Option<i64>,
}

/// One evaluation's variables as the request's JSON, with what its expressions read
/// ([`Needs`]). Expressions compiled for direct evaluation read the JSON in place; the
/// interpreter's [`Bindings`] are converted from it only for an expression that needs them
/// ([`Evaluator`]).
#[derive(Debug, Clone, Default)]
pub struct Inputs<'a> {
    pub needs: Needs,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    /// The top-level object under review (the same reference as `object` for a Pod).
    pub workload: Option<&'a Value>,
    pub namespace: &'a str,
    pub team: &'a str,
    /// `request` as it is bound (`operation`, `dryRun`, `userInfo`), when needed.
    pub request: Option<Value>,
    /// `accelerators(object)`, when needed and computable.
    pub object_accelerators: Option<i64>,
    /// The Pod view `object` is, when it is one: `accelerators(c)` of one of its containers
    /// reads the resources the view parsed instead of parsing them again ([`requests_of_json`]).
    pub view: Option<&'a PodView<'a>>,
}

impl Inputs<'_> {
    /// The variables for direct evaluation.
    pub fn variables(&self) -> direct::Variables<'_> {
        direct::Variables {
            object: self.object,
            old_object: self.old_object,
            workload: self.workload,
            namespace: self.namespace,
            team: self.team,
            request: self.request.as_ref(),
            object_accelerators: self.object_accelerators,
            view: self.view,
        }
    }

    /// The interpreter's bindings: each object converted only as far as the expressions read it.
    pub fn bindings(&self) -> Bindings {
        let needs = &self.needs;
        let convert = |value: Option<&Value>, name: &str, projection: &Projection| match value {
            Some(value) if needs.wants(name) => json_to_cel_projected(value, projection),
            _ => CelValue::Null,
        };
        let object = convert(self.object, "object", &needs.object);
        let same_as_object = matches!((self.object, self.workload), (Some(o), Some(w)) if std::ptr::eq(o, w));
        let workload =
            if same_as_object && needs.wants("object") && needs.wants("workload") && needs.workload == needs.object {
                object.clone()
            } else {
                convert(self.workload, "workload", &needs.workload)
            };
        Bindings {
            vars: needs.vars,
            old_object: convert(self.old_object, "oldObject", &needs.old_object),
            object,
            workload,
            namespace: self.namespace.to_string(),
            team: self.team.to_string(),
            request: self.request.as_ref().filter(|_| needs.wants("request")).map_or(CelValue::Null, json_to_cel),
            object_accelerators: self.object_accelerators,
        }
    }
}

/// Evaluates a policy set's expressions over one [`Inputs`]: directly over the JSON where an
/// expression is compiled for it and its evaluation does not give up, else by the interpreter,
/// in a scope bound once (on first need) and shared by the later expressions.
pub struct Evaluator<'e> {
    env: &'e Environment,
    inputs: &'e Inputs<'e>,
    scope: std::cell::OnceCell<Context<'e>>,
}

impl<'e> Evaluator<'e> {
    pub fn new(env: &'e Environment, inputs: &'e Inputs<'e>) -> Evaluator<'e> {
        Evaluator { env, inputs, scope: std::cell::OnceCell::new() }
    }

    fn scope(&self) -> &Context<'e> {
        self.scope.get_or_init(|| self.env.scope(&self.inputs.bindings()))
    }

    fn direct<'x>(&'x self, expression: &'x Expression, owner: &dyn std::fmt::Display) -> Option<direct::Val<'x>> {
        expression.evaluate_direct(&self.inputs.variables(), &self.env.accelerators, owner)
    }

    /// Evaluates to a boolean; anything else is an error.
    pub fn eval_bool(&self, expression: &Expression, owner: &dyn std::fmt::Display) -> Result<bool, EvalError> {
        match self.direct(expression, owner) {
            Some(direct::Val::Bool(b)) => Ok(b),
            _ => expression.eval_bool(self.scope(), owner),
        }
    }

    /// Evaluates to a string; anything else is an error.
    pub fn eval_string(&self, expression: &Expression, owner: &dyn std::fmt::Display) -> Result<String, EvalError> {
        match self.direct(expression, owner) {
            Some(direct::Val::Str(s)) => Ok(s.into_owned()),
            _ => expression.eval_string(self.scope(), owner),
        }
    }
}

/// `accelerators(x)` of a JSON value (a Pod, a pod spec or a container), as the CEL function
/// computes it; `None` when it is none of those or the total overflows. `view`: the Pod view
/// `value` may be or sit in ([`requests_of_json`]).
pub fn object_accelerators(value: &Value, view: Option<&PodView<'_>>, matcher: &ResourceMatcher) -> Option<i64> {
    total_units(&accelerators_only(&*requests_of_json(value, view)?, matcher))
}

/// Whole devices in all, `None` past `i64`.
fn total_units(list: &ResourceList) -> Option<i64> {
    list.values().try_fold(0i64, |sum, q| sum.checked_add(q.ceil_units()))
}

fn units_overflow(function: &str) -> ExecutionError {
    ExecutionError::function_error(function, "the total does not fit in an int")
}

/// Every resource a Pod, a pod spec or a container asks for. When `json` is `view`'s Pod or
/// one of its containers (the very value, not an equal one), what the view parsed already is
/// read instead of parsing the quantities again.
fn requests_of_json<'v>(json: &Value, view: Option<&'v PodView<'_>>) -> Option<Cow<'v, ResourceList>> {
    if let Some(spec) = json.get("spec") {
        Some(match view.filter(|v| std::ptr::eq(json, &*v.pod)) {
            Some(view) => Cow::Borrowed(view.requests()),
            None => Cow::Owned(resources::pod_requests(spec)),
        })
    } else if json.get("containers").is_some() {
        Some(Cow::Owned(resources::pod_requests(json)))
    } else if json.is_object() {
        Some(Cow::Owned(match view.and_then(|v| v.container_of(json)) {
            Some(parsed) => parsed.resources.effective_requests(),
            None => ContainerResources::from_container(json, "", &mut Vec::new()).effective_requests(),
        }))
    } else {
        None
    }
}

fn to_json(v: &CelValue, function: &str) -> Result<Value, ExecutionError> {
    cel_to_json(v).ok_or_else(|| ExecutionError::function_error(function, "argument cannot be read as JSON"))
}

/// Converts a CEL value back to JSON (maps with string keys, lists, scalars).
fn cel_to_json(v: &CelValue) -> Option<Value> {
    Some(match v {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        CelValue::String(s) => Value::String(s.as_str().to_string()),
        CelValue::List(items) => Value::Array(items.iter().map(cel_to_json).collect::<Option<_>>()?),
        CelValue::Map(m) => Value::Object(
            m.map
                .iter()
                .map(|(k, v)| match k {
                    Key::String(s) => Some((s.as_str().to_string(), cel_to_json(v)?)),
                    _ => None,
                })
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

fn requests_of(v: &CelValue, matcher: &ResourceMatcher, function: &str) -> Result<ResourceList, ExecutionError> {
    let key = |name: &str| Key::String(Arc::new(name.to_string()));
    // A Pod: only its spec matters, so only the spec is converted back (not the metadata).
    if let CelValue::Map(m) = v
        && let Some(spec) = m.map.get(&key("spec"))
    {
        return Ok(accelerators_only(&resources::pod_requests(&to_json(spec, function)?), matcher));
    }
    // A container: only its `resources` are read, so only they are converted back.
    if let CelValue::Map(m) = v
        && !m.map.contains_key(&key("containers"))
    {
        let mut container = serde_json::Map::new();
        if let Some(resources) = m.map.get(&key("resources")) {
            container.insert("resources".to_string(), to_json(resources, function)?);
        }
        let all = ContainerResources::from_container(&Value::Object(container), "", &mut Vec::new());
        return Ok(accelerators_only(&all.effective_requests(), matcher));
    }
    let json = to_json(v, function)?;
    let all = requests_of_json(&json, None)
        .ok_or_else(|| ExecutionError::function_error(function, "expects a Pod, a pod spec or a container"))?;
    Ok(accelerators_only(&all, matcher))
}

fn units_map(list: &ResourceList) -> CelValue {
    let map: HashMap<Key, CelValue> =
        list.iter().map(|(name, q)| (Key::String(Arc::new(name.clone())), CelValue::Int(q.ceil_units()))).collect();
    CelValue::Map(Map { map: Arc::new(map) })
}

/// Converts JSON to a CEL value. At the top level's `metadata`, `managedFields` is dropped.
pub fn json_to_cel(value: &Value) -> CelValue {
    convert(value, 0, false)
}

/// Converts the part of `value` that `projection` reads (see [`Projection`]); a field it reads
/// that the JSON lacks stays absent, so `has()` and a missing-field error answer as on the
/// whole value.
pub fn json_to_cel_projected(value: &Value, projection: &Projection) -> CelValue {
    project(value, projection, 0, false)
}

fn project(value: &Value, projection: &Projection, depth: usize, in_metadata: bool) -> CelValue {
    match value {
        Value::Object(map) if !projection.whole => {
            let mut out = HashMap::with_capacity(projection.fields.len());
            for (k, sub) in &projection.fields {
                if in_metadata && k == "managedFields" {
                    continue;
                }
                if let Some(v) = map.get(k) {
                    let child_is_metadata = depth == 0 && k == "metadata";
                    out.insert(Key::String(Arc::new(k.clone())), project(v, sub, depth + 1, child_is_metadata));
                }
            }
            CelValue::Map(Map { map: Arc::new(out) })
        }
        _ => convert(value, depth, in_metadata),
    }
}

/// How a JSON number is read by CEL: an int when it fits, else a uint, else a double. One rule
/// for the interpreter's bindings and direct evaluation, which must agree.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JsonNumber {
    Int(i64),
    UInt(u64),
    Double(f64),
}

impl JsonNumber {
    pub(crate) fn of(n: &serde_json::Number) -> JsonNumber {
        if let Some(i) = n.as_i64() {
            JsonNumber::Int(i)
        } else if let Some(u) = n.as_u64() {
            JsonNumber::UInt(u)
        } else {
            JsonNumber::Double(n.as_f64().unwrap_or(f64::NAN))
        }
    }
}

fn convert(value: &Value, depth: usize, in_metadata: bool) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => match JsonNumber::of(n) {
            JsonNumber::Int(i) => CelValue::Int(i),
            JsonNumber::UInt(u) => CelValue::UInt(u),
            JsonNumber::Double(d) => CelValue::Float(d),
        },
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(|v| convert(v, depth + 1, false)).collect())),
        Value::Object(map) => {
            let mut out = HashMap::with_capacity(map.len());
            for (k, v) in map {
                if in_metadata && k == "managedFields" {
                    continue;
                }
                let child_is_metadata = depth == 0 && k == "metadata";
                out.insert(Key::String(Arc::new(k.clone())), convert(v, depth + 1, child_is_metadata));
            }
            CelValue::Map(Map { map: Arc::new(out) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> Environment {
        Environment::new(Arc::new(ResourceMatcher::new(resources::DEFAULT_ACCELERATORS)))
    }

    fn bindings(object: Value) -> Bindings {
        Bindings {
            vars: u8::MAX,
            object: json_to_cel(&object),
            old_object: CelValue::Null,
            workload: json_to_cel(&object),
            namespace: "vision".into(),
            team: "vision".into(),
            request: json_to_cel(&json!({"operation": "CREATE", "dryRun": false})),
            object_accelerators: None,
        }
    }

    fn eval(source: &str, object: Value) -> Result<bool, String> {
        let env = env();
        let b = bindings(object);
        Expression::compile(source)?.eval_bool(&env.scope(&b), &"test").map_err(|e| e.to_string())
    }

    fn gpu_pod(n: u32) -> Value {
        json!({"metadata": {"labels": {"allot.dev/gang-name": "g"}, "managedFields": [{"x": 1}]},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": n.to_string()}}}]}})
    }

    #[test]
    fn keys_with_dots_and_slashes_are_read_as_written() {
        // The pitfall DESIGN.md warns about: this must evaluate, and evaluate to false for 4.
        let rule = "object.spec.containers.all(c, !has(c.resources.limits) || !('nvidia.com/gpu' in c.resources.limits) || int(c.resources.limits['nvidia.com/gpu']) <= 2)";
        assert_eq!(eval(rule, gpu_pod(1)), Ok(true));
        assert_eq!(eval(rule, gpu_pod(4)), Ok(false));
        assert_eq!(eval("object.metadata.labels['allot.dev/gang-name'] == 'g'", gpu_pod(1)), Ok(true));
    }

    #[test]
    fn accelerator_helpers() {
        assert_eq!(eval("accelerators(object) == 3", gpu_pod(3)), Ok(true));
        assert_eq!(eval("accelerators(object.spec.containers[0]) == 3", gpu_pod(3)), Ok(true));
        assert_eq!(eval("acceleratorRequests(object)['nvidia.com/gpu'] == 2", gpu_pod(2)), Ok(true));
        assert_eq!(eval("acceleratorLimits(object.spec.containers[0])['nvidia.com/gpu'] == 2", gpu_pod(2)), Ok(true));
        assert_eq!(eval("accelerators(object) == 0", json!({"spec": {"containers": [{}]}})), Ok(true));
    }

    #[test]
    fn kubernetes_libraries_are_available() {
        assert_eq!(eval("quantity('1Gi').isGreaterThan(quantity('1Mi'))", json!({})), Ok(true));
        assert_eq!(eval("'a-b'.split('-').size() == 2", json!({})), Ok(true));
    }

    #[test]
    fn evaluation_errors_are_counted_per_rule_and_answers_are_not() {
        let env = env();
        let b = bindings(gpu_pod(1));
        let count = |owner: &str| RULE_ERRORS.get_or_create(&RuleLabels { rule: owner.into() }).get();
        let missing = Expression::compile("object.metadata.labels['absent'] == 'x'").unwrap();
        assert!(missing.eval_bool(&env.scope(&b), &"errors-missing-key").is_err());
        assert!(missing.eval_bool(&env.scope(&b), &"errors-missing-key").is_err());
        assert_eq!(count("errors-missing-key"), 2);
        let not_bool = Expression::compile("object.metadata.labels").unwrap();
        assert!(not_bool.eval_bool(&env.scope(&b), &"errors-not-bool").is_err());
        assert_eq!(count("errors-not-bool"), 1);
        // true and false are answers, not errors.
        let fine = Expression::compile("accelerators(object) == 1").unwrap();
        assert_eq!(fine.eval_bool(&env.scope(&b), &"errors-none"), Ok(true));
        assert_eq!(count("errors-none"), 0);
    }

    #[test]
    fn managed_fields_are_not_bound() {
        assert_eq!(eval("!has(object.metadata.managedFields)", gpu_pod(1)), Ok(true));
    }

    #[test]
    fn compile_errors_are_clear() {
        assert!(Expression::compile("object.spec.(").unwrap_err().contains("syntax"));
        let err = Expression::compile("objet.spec.containers.size() > 0").unwrap_err();
        assert!(err.contains("objet"), "{err}");
        // Comprehension variables are bound only inside their macro.
        assert!(Expression::compile("object.spec.containers.all(c, c.name != '')").is_ok());
        assert!(Expression::compile("object.spec.containers.exists(c, true) && c.name == ''").is_err());
        // Type names are not unknown variables; but `type()` itself is not in cel 0.13's
        // environment (it fails on every evaluation), so the load-time check now refuses it.
        let err = Expression::compile("type(object) == map").unwrap_err();
        assert!(err.contains("unknown function type()") && !err.contains("variable"), "{err}");
        let program = Program::compile("type(object) == map").unwrap();
        let root = Context::default();
        assert!(matches!(program.execute(&root), Err(ExecutionError::UndeclaredReference(_))));
    }

    /// Bindings of `object` cut to what `source` reads, as the engine binds them.
    fn projected(source: &str, object: &Value) -> Bindings {
        let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
        let needs = expression.needs();
        let matcher = ResourceMatcher::new(resources::DEFAULT_ACCELERATORS);
        Bindings {
            vars: needs.vars,
            object: json_to_cel_projected(object, &needs.object),
            workload: json_to_cel_projected(object, &needs.workload),
            object_accelerators: object_accelerators(object, None, &matcher),
            ..bindings(object.clone())
        }
    }

    #[test]
    fn select_chains_bind_only_the_fields_they_reach() {
        let e = Expression::compile("object.spec.containers.size() > 0 && has(object.spec.priorityClassName)").unwrap();
        let needs = e.needs();
        assert!(!needs.object.is_whole());
        assert_eq!(needs.object.fields.keys().collect::<Vec<_>>(), ["spec"]);
        let spec = &needs.object.fields["spec"];
        assert_eq!(spec.fields.keys().collect::<Vec<_>>(), ["containers", "priorityClassName"]);
        assert!(spec.fields.values().all(Projection::is_whole));
        // Any other use of the variable reads it whole: an index, an argument, a comparison.
        for source in ["object['spec'] != null", "size(object) > 0", "object == {}", "object.exists(k, k == 'spec')"] {
            assert!(Expression::compile(source).unwrap().needs().object.is_whole(), "{source}");
        }
        // A comprehension variable named like a policy variable is not that variable.
        let e = Expression::compile("[{'a': 1}].all(object, object.a == 1) && team == ''").unwrap();
        assert_eq!(e.vars(), var_bit("team"));
        // accelerators(object) is computed before evaluation: the object is not bound for it.
        let e = Expression::compile("accelerators(object) == 0 || team != ''").unwrap();
        assert_eq!(e.vars(), OBJECT_ACCELERATORS_BIT | var_bit("team"));
    }

    #[test]
    fn projected_bindings_evaluate_like_whole_ones() {
        let mut pod = gpu_pod(3);
        pod["spec"]["priorityClassName"] = json!("high-priority");
        pod["spec"]["initContainers"] = json!([{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "5"}}}]);
        pod["metadata"]["annotations"] = json!({"a": "b"});
        let sources = [
            "accelerators(object) == 5",
            "accelerators(object) == 0 || team != ''",
            "object.spec.containers.all(c, accelerators(c) == 0 || c.name == 'c')",
            "has(object.spec.priorityClassName) && object.spec.priorityClassName == 'high-priority'",
            "!has(object.spec.nodeName)",
            "object.spec.nodeName == 'x'",
            "object.metadata.labels['allot.dev/gang-name'] == 'g'",
            "object.metadata.annotations.a == 'b' && !has(object.metadata.managedFields)",
            "object.spec.containers[0].resources.limits['nvidia.com/gpu'] == '3'",
            "workload.spec.containers.size() == 1 && accelerators(workload) == 5",
            "[{'spec': {'containers': [{'resources': {'limits': {'nvidia.com/gpu': '2'}}}]}}].all(object, accelerators(object) == 2)",
            "object.status.phase == 'Pending'",
            "object.spec.containers.exists(c, c.missing == 1)",
            // A missing key at any depth, a select or has() on a list, a string or null.
            "has(object.status.phase)",
            "object.spec.missing.deeper == 1",
            "has(object.spec.containers.name)",
            "object.spec.containers.name == false",
            "object.spec.priorityClassName.x == false && has(object.spec.priorityClassName.x) == false",
            "object.metadata.nullField.x == false && !has(object.metadata.nullField.x)",
            "object.spec.containers.all(object, has(object.name)) && object.spec.containers.size() == 1",
            "'p-' + object.spec.priorityClassName in ['p-high-priority'] && object.spec.nodeName == 'x'",
            "object.spec.containers.exists(c, c.name == object.spec.containers[0].name)",
        ];
        pod["metadata"]["nullField"] = Value::Null;
        let env = env();
        for source in sources {
            let e = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
            let whole = e.eval_bool(&env.scope(&bindings(pod.clone())), &"whole");
            let cut = e.eval_bool(&env.scope(&projected(source, &pod)), &"projected");
            // The same answer, and the same error where there is one.
            assert_eq!(whole, cut, "{source}");
        }
        assert_eq!(eval("accelerators(object) == 5", pod.clone()), Ok(true));
    }

    #[test]
    fn linear_expressions_are_recognised() {
        let linear = |source: &str| Expression::compile(source).unwrap_or_else(|e| panic!("{e}")).is_linear();
        for source in [
            "accelerators(object) == 0 || team != ''",
            "object.spec.containers.all(c, accelerators(c) == 0 || c.image.contains('@sha256:') || \
             (c.image.substring(c.image.lastIndexOf('/') + 1).contains(':') && !c.image.endsWith(':latest')))",
            "!has(object.spec.priorityClassName) || object.spec.priorityClassName != 'high-priority'",
            "'high-priority pod requesting ' + string(accelerators(object)) + ' accelerator(s)'",
            // A walk over each element's own part: linear in the object together.
            "object.spec.containers.all(c, !has(c.env) || c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES'))",
            "object.spec.containers.all(c, c.ports.all(p, p.containerPort > 0))",
        ] {
            assert!(linear(source), "{source}");
        }
        // The shipped nested walk is also evaluated directly over the JSON (not by the
        // interpreter, which converts every bound object first).
        let nested = "object.spec.containers.all(c, !has(c.env) || accelerators(c) > 0 || \
                      c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && e.value in ['void', 'none'])))";
        assert!(Expression::compile(nested).is_ok_and(|e| e.is_direct() && e.is_linear()));
        for source in [
            // Nested: quadratic in the list.
            "object.spec.containers.all(c, object.spec.containers.all(d, c.name == d.name))",
            // Two parts of one element walked one inside the other, or a part of something
            // other than the innermost element.
            "object.spec.containers.all(c, c.env.all(e, c.ports.all(p, e.name != p.name)))",
            "object.spec.containers.all(c, c.env.all(e, c.env.all(f, e.name != f.name)))",
            // map/filter copy their accumulated list on every step.
            "object.spec.containers.map(c, c.name).size() > 0",
            "object.spec.containers.filter(c, c.name == 'x').size() == 0",
            // A regular expression, or a function of unknown cost.
            "object.metadata.name.matches('^a+$')",
            "object.metadata.name.split('-').size() > 0",
        ] {
            assert!(!linear(source), "{source}");
        }
    }

    #[test]
    fn accelerator_totals_that_overflow_are_errors_not_panics() {
        let huge = json!({"spec": {"containers": [{"resources": {"limits": {
            "nvidia.com/gpu": "9223372036854775807", "nvidia.com/mig-1g.10gb": "9223372036854775807"}}}]}});
        let matcher = ResourceMatcher::new(resources::DEFAULT_ACCELERATORS);
        assert_eq!(object_accelerators(&huge, None, &matcher), None);
        assert!(eval("accelerators(object) > 0", huge.clone()).is_err());
        assert!(eval("accelerators(object.spec.containers[0]) > 0", huge).is_err());
    }

    #[test]
    fn non_bool_results_are_errors() {
        assert!(eval("1 + 1", json!({})).is_err());
        assert!(eval("object.spec.missing.field", json!({"spec": {}})).is_err());
    }
}
