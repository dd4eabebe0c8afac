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

pub mod budget;
pub mod check;
pub mod fixes;
pub mod panics;
pub mod quantity;

use std::collections::HashMap;
use std::sync::Arc;

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr};
use kube::core::cel::cel::objects::{Key, Map};
use kube::core::cel::cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use crate::resources::{self, ContainerResources, ResourceList, ResourceMatcher, accelerators_only};

/// The variable names a policy expression may use.
pub const VARIABLES: &[&str] = &["object", "oldObject", "workload", "namespace", "team", "request"];

pub use panics::{RULE_PANICS, RuleLabels, install_hook as install_panic_hook};

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
    /// The checked tree with the evaluation budget's guards in it ([`budget::instrument`]).
    instrumented: IdedExpr,
    vars: u8,
}

/// A set of [`VARIABLES`] as a bit mask (bit *i* = `VARIABLES[i]`). Binding a variable converts
/// a whole object into CEL's representation (~10 µs for a Pod), so only what an evaluation's
/// expressions mention is bound.
pub type VarSet = u8;

/// The bit of a variable name.
pub fn var_bit(name: &str) -> VarSet {
    VARIABLES.iter().position(|v| *v == name).map_or(0, |i| 1 << i)
}

impl Expression {
    /// Compiles `source`, rejecting syntax errors, unknown variables and everything
    /// [`check::unsupported`] finds the engine cannot evaluate.
    pub fn compile(source: &str) -> Result<Expression, String> {
        let program = Program::compile(source).map_err(|e| format!("CEL syntax error: {e}"))?;
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
        let vars = program.references().variables().iter().fold(0, |acc, v| acc | var_bit(v));
        let instrumented = budget::instrument(program.expression());
        Ok(Expression { source: source.to_string(), instrumented, vars })
    }

    /// The variables the expression reads.
    pub fn vars(&self) -> VarSet {
        self.vars
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the program under the panic boundary; `owner` (the `Rule` name or
    /// `placement/<name>`) labels a contained panic's metric and log line.
    fn execute(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<CelValue, EvalError> {
        budget::start();
        match panics::contain(owner, || CelValue::resolve(&self.instrumented, ctx)) {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(EvalError::Cel(describe(&e))),
            Err(panic) => Err(EvalError::Panic(panic)),
        }
    }

    /// Evaluates to a boolean; anything else is an error.
    pub fn eval_bool(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<bool, EvalError> {
        match self.execute(ctx, owner)? {
            CelValue::Bool(b) => Ok(b),
            other => Err(EvalError::Cel(format!("expression returned {other:?}, not a bool"))),
        }
    }

    /// Evaluates to a string; anything else is an error.
    pub fn eval_string(&self, ctx: &Context<'_>, owner: &dyn std::fmt::Display) -> Result<String, EvalError> {
        match self.execute(ctx, owner)? {
            CelValue::String(s) => Ok(s.as_str().to_string()),
            other => Err(EvalError::Cel(format!("messageExpression returned {other:?}, not a string"))),
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
        Expr::Comprehension(comp) => {
            free_identifiers(&comp.iter_range, bound, out);
            free_identifiers(&comp.accu_init, bound, out);
            let depth = bound.len();
            bound.push(comp.iter_var.as_str());
            if let Some(v) = &comp.iter_var2 {
                bound.push(v.as_str());
            }
            bound.push(comp.accu_var.as_str());
            for part in [&comp.loop_cond, &comp.loop_step, &comp.result] {
                free_identifiers(part, bound, out);
            }
            bound.truncate(depth);
        }
        Expr::List(list) => list.elements.iter().for_each(|e| free_identifiers(e, bound, out)),
        Expr::Map(map) => map.entries.iter().for_each(|e| entry_identifiers(e, bound, out)),
        Expr::Struct(st) => st.entries.iter().for_each(|e| entry_identifiers(e, bound, out)),
        Expr::Select(select) => free_identifiers(&select.operand, bound, out),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
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

fn describe(e: &ExecutionError) -> String {
    format!("CEL evaluation error: {e}")
}

/// The root CEL context of a policy set: every function registered once, shared read-only by
/// all requests. Requests bind their variables in a child scope.
pub struct Environment {
    root: Context<'static>,
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
        let m = accelerators.clone();
        root.add_function("accelerators", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            let list = requests_of(&v, &m, "accelerators")?;
            Ok(CelValue::Int(list.values().map(|q| q.ceil_units()).sum()))
        });
        let m = accelerators.clone();
        root.add_function("acceleratorRequests", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            Ok(units_map(&requests_of(&v, &m, "acceleratorRequests")?))
        });
        let m = accelerators;
        root.add_function("acceleratorLimits", move |v: CelValue| -> Result<CelValue, ExecutionError> {
            let json = to_json(&v, "acceleratorLimits")?;
            let resources = ContainerResources::from_container(&json, "", &mut Vec::new());
            Ok(units_map(&accelerators_only(&resources.limits, &m)))
        });
        #[cfg(feature = "test-hooks")]
        root.add_function(check::TEST_PANIC, |v: CelValue| -> Result<CelValue, ExecutionError> {
            panic!("allotTestPanic called on {v:?} (test-hooks build)")
        });
        Environment { root }
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
    // A Pod: only its spec matters, so only the spec is converted back (not the metadata).
    if let CelValue::Map(m) = v
        && let Some(spec) = m.map.get(&Key::String(Arc::new("spec".to_string())))
    {
        return Ok(accelerators_only(&resources::pod_requests(&to_json(spec, function)?), matcher));
    }
    let json = to_json(v, function)?;
    let all = if json.get("containers").is_some() {
        resources::pod_requests(&json)
    } else if json.is_object() {
        ContainerResources::from_container(&json, "", &mut Vec::new()).effective_requests()
    } else {
        return Err(ExecutionError::function_error(function, "expects a Pod, a pod spec or a container"));
    };
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

fn convert(value: &Value, depth: usize, in_metadata: bool) -> CelValue {
    match value {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                CelValue::Int(i)
            } else if let Some(u) = n.as_u64() {
                CelValue::UInt(u)
            } else {
                CelValue::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
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

    #[test]
    fn non_bool_results_are_errors() {
        assert!(eval("1 + 1", json!({})).is_err());
        assert!(eval("object.spec.missing.field", json!({"spec": {}})).is_err());
    }
}
