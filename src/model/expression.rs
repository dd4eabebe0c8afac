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

mod analysis;
pub mod arith;
pub mod budget;
pub mod check;
pub mod depth;
pub mod direct;
mod error;
pub mod fixes;
pub mod panics;
pub mod quantity;
mod values;

use analysis::*;
pub use error::ExpressionError;
use values::*;
pub use values::{json_to_cel, json_to_cel_projected, object_accelerators};

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::IdedExpr;
use kube::core::cel::cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use crate::model::resources::{ContainerResources, ResourceMatcher, accelerators_only};
use crate::model::workload::PodView;

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
    pub fn compile(source: &str) -> Result<Expression, ExpressionError> {
        // Before the parser: cel's parser recurses with large frames, and past its own limit
        // of 96 levels its depth counter underflows and panics (fuzz/regressions/
        // cel_expression/parser-depth-underflow); see `depth`.
        before_parsing(source)?;
        depth::on_parser_stack(|| Expression::compile_checked(source))
    }

    fn compile_checked(source: &str) -> Result<Expression, ExpressionError> {
        // The scan keeps the parser below its limit; an input it misjudges still costs only a
        // policy error (the panic contained), not the process.
        let program = parse(source)?;
        let unsupported = check::unsupported(program.expression(), source);
        if !unsupported.is_empty() {
            return Err(ExpressionError::Unsupported(unsupported));
        }
        let mut unknown = Vec::new();
        free_identifiers(program.expression(), &mut Vec::new(), &mut unknown);
        unknown.sort_unstable();
        unknown.dedup();
        if !unknown.is_empty() {
            return Err(ExpressionError::UnknownVariables(unknown));
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
            return Err(ExpressionError::TooDeep(tree_depth));
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
            Err(panic) => Err(EvalError::Panic(panic.message)),
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

fn describe(e: &ExecutionError) -> String {
    format!("CEL evaluation error: {e}")
}

/// What is checked on the text before cel's parser sees it: nesting past [`depth::MAX_NESTING`]
/// (the parser's depth counter underflows and panics past its own limit, see `depth`) and a
/// doubled unary operator (`!!x` is `!x` in cel 0.13).
fn before_parsing(source: &str) -> Result<(), ExpressionError> {
    let nesting = depth::scan(source);
    if nesting.depth > depth::MAX_NESTING {
        return Err(ExpressionError::TooNested(nesting));
    }
    if let Some((operator, column)) = depth::repeated_unary(source) {
        return Err(ExpressionError::RepeatedUnary { operator, column });
    }
    Ok(())
}

/// cel's parser under the panic boundary (call it on [`depth::on_parser_stack`]): the one place
/// both kinds of expression turn text into a program.
fn parse(source: &str) -> Result<Program, ExpressionError> {
    panics::contain(&"CEL parser", || Program::compile(source))
        .map_err(ExpressionError::ParserPanicked)?
        .map_err(|e| ExpressionError::Syntax(e.to_string()))
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
    pub fn compile(source: &str) -> Result<ForeignExpression, ExpressionError> {
        before_parsing(source)?;
        depth::on_parser_stack(|| {
            let program = parse(source)?;
            let tree = arith::guard(program.expression());
            let tree_depth = depth::tree_depth(&tree);
            if tree_depth > depth::MAX_TREE_DEPTH {
                return Err(ExpressionError::TooDeep(tree_depth));
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
            Err(panic) => Err(EvalError::Panic(panic.message)),
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

#[cfg(test)]
mod tests;
