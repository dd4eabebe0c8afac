//! Direct evaluation: the common shapes of policy expressions answered over the request's JSON
//! in place, without converting it into the `cel` crate's values.
//!
//! The interpreter needs its variables converted (every map and list of the bound part of an
//! object copied into CEL's representation) and copies a map again on every field select:
//! on the shipped policies that was most of `/validate`'s CPU. Most policy expressions only
//! select fields, compare scalars, call a few string functions and Allot's `accelerators()`,
//! and loop with `all`/`exists`: those are compiled here, at load, into a small tree that reads
//! `serde_json` values by reference.
//!
//! The interpreter stays the reference. A direct evaluation either gives the value the
//! interpreter gives, or gives up ([`GiveUp`]) and the caller asks the interpreter, which then
//! produces its own answer, error message and metrics. It gives up on every error (a missing
//! key, a type mismatch, an overflow), on every mix of types whose comparison the interpreter
//! decides by rules of its own (`1 == 1u`, `x == null` on a string), on strings that are not
//! ASCII where an index is in characters, and past the evaluation budget. So what it answers is
//! only ever what both agree on; `tests/cel_direct.rs` compares the two on the shipped policies,
//! the example policies and generated objects.
//!
//! One difference is by design: a comprehension over a map (`labels.all(k, …)`) visits the keys in
//! sorted order, the interpreter in its hash map's (random) order. Where the interpreter's answer
//! depends on that order (a `false` and an error in one `all`: `false` if the `false` comes
//! first, an error otherwise), direct evaluation gives the answer CEL specifies, `false`.
//!
//! What is compiled (anything else leaves the expression to the interpreter alone): literals
//! (not bytes); the policy variables and comprehension variables; field selection and `has()`;
//! `!`, `&&`, `||`, `?:`; `==`, `!=`, `<`, `<=`, `>`, `>=`; `+` and `-` on ints (and `+` on
//! strings), unary `-` on ints and doubles (an overflow gives up); `[]` on maps and lists; `in`; list literals; `all`, `exists`, `exists_one`;
//! `size`, `contains`, `startsWith`, `endsWith`, `indexOf`, `lastIndexOf` (one argument),
//! `substring`, `string`, `int`, and `accelerators` — but not a method called on an identifier
//! that also names a function namespace (`sets.contains(x)` is kube-cel's `sets.contains` in the
//! interpreter, even where `sets` is a comprehension variable).

use std::borrow::Cow;
use std::rc::Rc;

use kube::core::cel::cel::common::ast::{Expr, IdedExpr, LiteralValue};
use serde_json::Value;

use super::budget::{MAX_EVALUATION_BYTES, MAX_ITERATIONS, MAX_VALUE_BYTES};
use super::{JsonNumber, OBJECT_ACCELERATORS, total_units};
use crate::model::resources::{ResourceMatcher, accelerators_only};
use crate::model::workload::PodView;

/// The interpreter must answer: the expression erred, or meets something direct evaluation does
/// not decide the way the interpreter would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveUp;

type Eval<T> = Result<T, GiveUp>;

/// The variables of one evaluation, as JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variables<'a> {
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub workload: Option<&'a Value>,
    pub namespace: &'a str,
    pub team: &'a str,
    /// `request`, already shaped as the interpreter binds it.
    pub request: Option<&'a Value>,
    /// `accelerators(object)`, computed by the caller (`None`: not computable, the rule errs).
    pub object_accelerators: Option<i64>,
    /// The Pod view `object` is, when it is one ([`super::Inputs::view`]).
    pub view: Option<&'a PodView<'a>>,
}

/// An expression compiled for direct evaluation.
#[derive(Debug)]
pub struct Direct {
    root: Node,
    /// Comprehension variables (iteration and accumulator), by slot.
    locals: usize,
}

#[derive(Debug)]
enum Node {
    Literal(Literal),
    Variable(Variable),
    Local(usize),
    Select { operand: Box<Node>, field: String, test: bool },
    Not(Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Conditional(Box<[Node; 3]>),
    Compare(Comparison, Box<Node>, Box<Node>),
    Add(Box<Node>, Box<Node>),
    Subtract(Box<Node>, Box<Node>),
    Negate(Box<Node>),
    Index(Box<Node>, Box<Node>),
    In(Box<Node>, Box<Node>),
    NotStrictlyFalse(Box<Node>),
    List(Vec<Node>),
    Call(Function, Vec<Node>),
    Comprehension(Box<Comprehension>),
}

#[derive(Debug)]
enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    String(String),
}

#[derive(Debug, Clone, Copy)]
enum Variable {
    Object,
    OldObject,
    Workload,
    Namespace,
    Team,
    Request,
    ObjectAccelerators,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

/// The functions compiled, each with the receiver (if a method) as its first argument.
#[derive(Debug, Clone, Copy)]
enum Function {
    Size,
    Contains,
    StartsWith,
    EndsWith,
    IndexOf,
    LastIndexOf,
    Substring,
    String,
    Int,
    Accelerators,
}

#[derive(Debug)]
struct Comprehension {
    range: Node,
    iter: usize,
    accu: usize,
    init: Node,
    condition: Node,
    step: Node,
    result: Node,
}

impl Direct {
    /// Compiles `expr` (the tree after Allot's own rewriting, before the budget's guards), or
    /// `None` when it uses anything not listed in the module's documentation.
    pub fn compile(expr: &IdedExpr) -> Option<Direct> {
        let mut compiler = Compiler { scope: Vec::new(), locals: 0 };
        let root = compiler.node(expr)?;
        Some(Direct { root, locals: compiler.locals })
    }

    /// Evaluates over `variables`; [`GiveUp`] where the interpreter must answer.
    pub fn evaluate<'a>(&'a self, variables: &Variables<'a>, accelerators: &ResourceMatcher) -> Eval<Val<'a>> {
        self.evaluate_counting(variables, accelerators).0
    }

    /// [`Direct::evaluate`], and the comprehension steps it counted against the budget.
    fn evaluate_counting<'a>(
        &'a self,
        variables: &Variables<'a>,
        accelerators: &ResourceMatcher,
    ) -> (Eval<Val<'a>>, u64) {
        let mut run = Run { variables, accelerators, locals: vec![None; self.locals], iterations: 0, built: 0 };
        let value = run.eval(&self.root);
        (value, run.iterations)
    }
}

struct Compiler<'e> {
    /// Comprehension variables in scope, innermost last.
    scope: Vec<(&'e str, usize)>,
    locals: usize,
}

impl<'e> Compiler<'e> {
    fn boxed(&mut self, expr: &'e IdedExpr) -> Option<Box<Node>> {
        self.node(expr).map(Box::new)
    }

    fn node(&mut self, expr: &'e IdedExpr) -> Option<Node> {
        Some(match &expr.expr {
            Expr::Literal(literal) => Node::Literal(match literal {
                LiteralValue::Null => Literal::Null,
                LiteralValue::Boolean(b) => Literal::Bool(*b.inner()),
                LiteralValue::Int(i) => Literal::Int(*i.inner()),
                LiteralValue::UInt(u) => Literal::UInt(*u.inner()),
                LiteralValue::Double(d) => Literal::Double(*d.inner()),
                LiteralValue::String(s) => Literal::String(s.inner().to_string()),
                LiteralValue::Bytes(_) => return None,
            }),
            Expr::Ident(name) => match self.scope.iter().rev().find(|(n, _)| n == name) {
                Some((_, slot)) => Node::Local(*slot),
                None => Node::Variable(match name.as_str() {
                    "object" => Variable::Object,
                    "oldObject" => Variable::OldObject,
                    "workload" => Variable::Workload,
                    "namespace" => Variable::Namespace,
                    "team" => Variable::Team,
                    "request" => Variable::Request,
                    OBJECT_ACCELERATORS => Variable::ObjectAccelerators,
                    _ => return None,
                }),
            },
            Expr::Select(select) => {
                Node::Select { operand: self.boxed(&select.operand)?, field: select.field.clone(), test: select.test }
            }
            Expr::List(list) if list.optional_indices.is_empty() => {
                Node::List(list.elements.iter().map(|e| self.node(e)).collect::<Option<_>>()?)
            }
            Expr::Call(call) => {
                // `sets.contains(x)` calls kube-cel's `sets.contains` even where `sets` is a
                // comprehension variable: the interpreter looks for `<ident>.<name>` first.
                if let Some(IdedExpr { expr: Expr::Ident(prefix), .. }) = call.target.as_deref()
                    && super::check::is_known_function(&format!("{prefix}.{}", call.func_name))
                {
                    return None;
                }
                let mut args: Vec<&'e IdedExpr> = call.target.as_deref().into_iter().collect();
                args.extend(call.args.iter());
                self.call(&call.func_name, call.target.is_some(), &args)?
            }
            Expr::Comprehension(comp) => {
                // `map` and `filter` build lists (`@result + [x]`): left to the interpreter.
                if comp.iter_var2.is_some() || !matches!(comp.accu_init.expr, Expr::Literal(_)) {
                    return None;
                }
                let range = self.node(&comp.iter_range)?;
                let init = self.node(&comp.accu_init)?;
                let depth = self.scope.len();
                let iter = self.local(&comp.iter_var);
                let accu = self.local(&comp.accu_var);
                let parts =
                    (|| Some((self.node(&comp.loop_cond)?, self.node(&comp.loop_step)?, self.node(&comp.result)?)))();
                self.scope.truncate(depth);
                let (condition, step, result) = parts?;
                Node::Comprehension(Box::new(Comprehension { range, iter, accu, init, condition, step, result }))
            }
            Expr::List(_) | Expr::Map(_) | Expr::Struct(_) | Expr::Unspecified => return None,
        })
    }

    fn local(&mut self, name: &'e str) -> usize {
        let slot = self.locals;
        self.locals += 1;
        self.scope.push((name, slot));
        slot
    }

    fn call(&mut self, name: &str, method: bool, args: &[&'e IdedExpr]) -> Option<Node> {
        use kube::core::cel::cel::common::ast::operators as op;
        let mut nodes = args.iter().map(|a| self.boxed(a)).collect::<Option<Vec<_>>>()?.into_iter();
        let mut next = || nodes.next();
        let compare = |c| (args.len() == 2).then_some(c);
        let node = match (name, args.len()) {
            (op::LOGICAL_NOT, 1) => Node::Not(next()?),
            (op::NOT_STRICTLY_FALSE, 1) => Node::NotStrictlyFalse(next()?),
            (op::LOGICAL_AND, 2) => Node::And(next()?, next()?),
            (op::LOGICAL_OR, 2) => Node::Or(next()?, next()?),
            (op::CONDITIONAL, 3) => Node::Conditional(Box::new([*next()?, *next()?, *next()?])),
            (op::ADD, 2) => Node::Add(next()?, next()?),
            (op::SUBSTRACT, 2) => Node::Subtract(next()?, next()?),
            (op::NEGATE, 1) => Node::Negate(next()?),
            (op::INDEX, 2) => Node::Index(next()?, next()?),
            (op::IN, 2) => Node::In(next()?, next()?),
            (op::EQUALS | op::NOT_EQUALS | op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS, _) => {
                let comparison = compare(match name {
                    op::EQUALS => Comparison::Equal,
                    op::NOT_EQUALS => Comparison::NotEqual,
                    op::LESS => Comparison::Less,
                    op::LESS_EQUALS => Comparison::LessOrEqual,
                    op::GREATER => Comparison::Greater,
                    _ => Comparison::GreaterOrEqual,
                })?;
                Node::Compare(comparison, next()?, next()?)
            }
            _ => {
                let function = match (name, method, args.len()) {
                    ("size", _, 1) => Function::Size,
                    ("contains", true, 2) => Function::Contains,
                    ("startsWith", true, 2) => Function::StartsWith,
                    ("endsWith", true, 2) => Function::EndsWith,
                    ("indexOf", true, 2) => Function::IndexOf,
                    ("lastIndexOf", true, 2) => Function::LastIndexOf,
                    ("substring", true, 2 | 3) => Function::Substring,
                    ("string", false, 1) => Function::String,
                    ("int", false, 1) => Function::Int,
                    ("accelerators", false, 1) => Function::Accelerators,
                    _ => return None,
                };
                return Some(Node::Call(function, nodes.map(|b| *b).collect()));
            }
        };
        Some(node)
    }
}

/// A value during direct evaluation: scalars, or JSON read in place.
#[derive(Debug, Clone)]
pub enum Val<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Double(f64),
    Str(Cow<'a, str>),
    /// A JSON array.
    List(&'a [Value]),
    /// A JSON object (always a `Value::Object`).
    Map(&'a Value),
    /// A bound variable's top-level object: its `metadata` is read without `managedFields`,
    /// which the interpreter's binding leaves out.
    Root(&'a Value),
    /// That `metadata`: `managedFields` is absent; any use but selecting a field gives up.
    Metadata(&'a Value),
    /// A list literal's values.
    Items(Rc<Vec<Val<'a>>>),
}

impl<'a> Val<'a> {
    fn json(value: &'a Value) -> Val<'a> {
        match value {
            Value::Null => Val::Null,
            Value::Bool(b) => Val::Bool(*b),
            Value::Number(n) => match JsonNumber::of(n) {
                JsonNumber::Int(i) => Val::Int(i),
                JsonNumber::UInt(u) => Val::UInt(u),
                JsonNumber::Double(d) => Val::Double(d),
            },
            Value::String(s) => Val::Str(Cow::Borrowed(s)),
            Value::Array(items) => Val::List(items),
            Value::Object(_) => Val::Map(value),
        }
    }

    /// A variable's value as the interpreter binds it (`null` when absent).
    fn root(value: Option<&'a Value>) -> Val<'a> {
        match value {
            Some(map @ Value::Object(_)) => Val::Root(map),
            Some(other) => Val::json(other),
            None => Val::Null,
        }
    }

    fn as_bool(&self) -> Eval<bool> {
        match self {
            Val::Bool(b) => Ok(*b),
            _ => Err(GiveUp),
        }
    }

    fn as_str(&self) -> Eval<&str> {
        match self {
            Val::Str(s) => Ok(s),
            _ => Err(GiveUp),
        }
    }

    fn as_int(&self) -> Eval<i64> {
        match self {
            Val::Int(i) => Ok(*i),
            _ => Err(GiveUp),
        }
    }
}

struct Run<'r, 'a> {
    variables: &'r Variables<'a>,
    accelerators: &'r ResourceMatcher,
    locals: Vec<Option<Val<'a>>>,
    iterations: u64,
    /// Bytes of values built (an over-estimate of what the budget measures).
    built: u64,
}

/// Bytes charged per value built, as the budget charges a list item.
const BUILT_ITEM_BYTES: u64 = 32;

impl<'a> Run<'_, 'a> {
    fn eval(&mut self, node: &'a Node) -> Eval<Val<'a>> {
        Ok(match node {
            Node::Literal(literal) => match literal {
                Literal::Null => Val::Null,
                Literal::Bool(b) => Val::Bool(*b),
                Literal::Int(i) => Val::Int(*i),
                Literal::UInt(u) => Val::UInt(*u),
                Literal::Double(d) => Val::Double(*d),
                Literal::String(s) => Val::Str(Cow::Borrowed(s)),
            },
            Node::Variable(variable) => {
                let v = self.variables;
                match variable {
                    Variable::Object => Val::root(v.object),
                    Variable::OldObject => Val::root(v.old_object),
                    Variable::Workload => Val::root(v.workload),
                    Variable::Request => Val::root(v.request),
                    Variable::Namespace => Val::Str(Cow::Borrowed(v.namespace)),
                    Variable::Team => Val::Str(Cow::Borrowed(v.team)),
                    Variable::ObjectAccelerators => Val::Int(v.object_accelerators.ok_or(GiveUp)?),
                }
            }
            Node::Local(slot) => self.locals[*slot].clone().ok_or(GiveUp)?,
            Node::Select { operand, field, test } => {
                let operand = self.eval(operand)?;
                select(&operand, field, *test)?
            }
            Node::Not(operand) => Val::Bool(!self.eval(operand)?.as_bool()?),
            // `false && x` and `true || x` do not evaluate x, as in the interpreter; every other
            // combination needs both sides to be booleans (an error on either side gives up).
            Node::And(left, right) => {
                if !self.eval(left)?.as_bool()? {
                    Val::Bool(false)
                } else {
                    Val::Bool(self.eval(right)?.as_bool()?)
                }
            }
            Node::Or(left, right) => {
                if self.eval(left)?.as_bool()? {
                    Val::Bool(true)
                } else {
                    Val::Bool(self.eval(right)?.as_bool()?)
                }
            }
            Node::Conditional(parts) => {
                let [condition, then, otherwise] = parts.as_ref();
                if self.eval(condition)?.as_bool()? { self.eval(then)? } else { self.eval(otherwise)? }
            }
            Node::Compare(comparison, left, right) => {
                let left = self.eval(left)?;
                let right = self.eval(right)?;
                Val::Bool(compare(*comparison, &left, &right)?)
            }
            Node::Add(..) | Node::Subtract(..) | Node::Negate(_) => self.arithmetic(node)?,
            Node::Index(container, key) => {
                let container = self.eval(container)?;
                let key = self.eval(key)?;
                index(&container, &key)?
            }
            Node::In(item, container) => {
                let item = self.eval(item)?;
                let container = self.eval(container)?;
                Val::Bool(contains(&container, &item)?)
            }
            Node::NotStrictlyFalse(operand) => Val::Bool(!matches!(self.eval(operand)?, Val::Bool(false))),
            Node::List(elements) => {
                let items = elements.iter().map(|e| self.eval(e)).collect::<Eval<Vec<_>>>()?;
                Val::Items(Rc::new(items))
            }
            Node::Call(function, args) => {
                let args = args.iter().map(|a| self.eval(a)).collect::<Eval<Vec<_>>>()?;
                let result = self.call(*function, &args)?;
                if matches!(result, Val::Str(_)) {
                    self.charge(&result)?;
                }
                result
            }
            Node::Comprehension(comp) => self.comprehension(comp)?,
        })
    }

    /// `+`, binary `-` and unary `-`: checked, an overflow gives up (the interpreter errs).
    fn arithmetic(&mut self, node: &'a Node) -> Eval<Val<'a>> {
        Ok(match node {
            Node::Add(left, right) => {
                let left = self.eval(left)?;
                let right = self.eval(right)?;
                let sum = match (left, right) {
                    (Val::Int(l), Val::Int(r)) => Val::Int(l.checked_add(r).ok_or(GiveUp)?),
                    (Val::Str(l), Val::Str(r)) => Val::Str(Cow::Owned([l.as_ref(), r.as_ref()].concat())),
                    _ => return Err(GiveUp),
                };
                self.charge(&sum)?;
                sum
            }
            Node::Subtract(left, right) => {
                let (left, right) = (self.eval(left)?.as_int()?, self.eval(right)?.as_int()?);
                Val::Int(left.checked_sub(right).ok_or(GiveUp)?)
            }
            // An int that cannot be negated is the interpreter's overflow error (`super::arith`).
            Node::Negate(operand) => match self.eval(operand)? {
                Val::Int(i) => Val::Int(i.checked_neg().ok_or(GiveUp)?),
                Val::Double(d) => Val::Double(-d),
                _ => return Err(GiveUp),
            },
            _ => return Err(GiveUp),
        })
    }

    fn comprehension(&mut self, comp: &'a Comprehension) -> Eval<Val<'a>> {
        let init = self.eval(&comp.init)?;
        let range = self.eval(&comp.range)?;
        self.locals[comp.accu] = Some(init);
        // Unbound until the first step, as in the interpreter's fresh scope.
        self.locals[comp.iter] = None;
        let items: Box<dyn Iterator<Item = Val<'a>> + 'a> = match range {
            Val::List(items) => Box::new(items.iter().map(Val::json)),
            Val::Map(map) => Box::new(fields(map)?.keys().map(|k| Val::Str(Cow::Borrowed(k.as_str())))),
            Val::Items(items) => Box::new((0..items.len()).map(move |i| items[i].clone())),
            _ => return Err(GiveUp),
        };
        for item in items {
            // Counted as the budget counts: each evaluation of the loop condition, the last one
            // that stops an `all` or `exists` early included (`@allotIteration` wraps it).
            self.iterations += 1;
            if self.iterations > MAX_ITERATIONS {
                return Err(GiveUp);
            }
            if !self.eval(&comp.condition)?.as_bool()? {
                break;
            }
            self.locals[comp.iter] = Some(item);
            let accu = self.eval(&comp.step)?;
            self.locals[comp.accu] = Some(accu);
        }
        self.eval(&comp.result)
    }

    /// Counts a built value against the budget; past it, the interpreter decides (it errs).
    fn charge(&mut self, value: &Val<'_>) -> Eval<()> {
        let bytes = match value {
            Val::Str(s) => s.len() as u64,
            _ => 0,
        } + BUILT_ITEM_BYTES;
        self.built = self.built.saturating_add(bytes);
        if bytes > MAX_VALUE_BYTES || self.built > MAX_EVALUATION_BYTES {
            return Err(GiveUp);
        }
        Ok(())
    }

    fn call(&self, function: Function, args: &[Val<'a>]) -> Eval<Val<'a>> {
        let str_arg = |i: usize| args.get(i).ok_or(GiveUp)?.as_str();
        let ascii = |i: usize| str_arg(i).and_then(|s| if s.is_ascii() { Ok(s) } else { Err(GiveUp) });
        Ok(match function {
            // The `cel` crate's size() of a string counts bytes.
            Function::Size => Val::Int(
                i64::try_from(match args.first().ok_or(GiveUp)? {
                    Val::Str(s) => s.len(),
                    Val::List(items) => items.len(),
                    Val::Map(map) | Val::Root(map) => fields(map)?.len(),
                    Val::Items(items) => items.len(),
                    _ => return Err(GiveUp),
                })
                .map_err(|_| GiveUp)?,
            ),
            Function::Contains => Val::Bool(str_arg(0)?.contains(str_arg(1)?)),
            Function::StartsWith => Val::Bool(str_arg(0)?.starts_with(str_arg(1)?)),
            Function::EndsWith => Val::Bool(str_arg(0)?.ends_with(str_arg(1)?)),
            // Indexes count characters: ASCII only, where they are bytes; an empty needle has
            // rules of its own.
            Function::IndexOf | Function::LastIndexOf => {
                let (haystack, needle) = (ascii(0)?, ascii(1)?);
                if needle.is_empty() {
                    return Err(GiveUp);
                }
                let found = match function {
                    Function::IndexOf => haystack.find(needle),
                    _ => haystack.rfind(needle),
                };
                Val::Int(found.map_or(Ok(-1), i64::try_from).map_err(|_| GiveUp)?)
            }
            Function::Substring => {
                let s = ascii(0)?;
                let start = usize::try_from(args.get(1).ok_or(GiveUp)?.as_int()?).map_err(|_| GiveUp)?;
                let end = match args.get(2) {
                    Some(end) => usize::try_from(end.as_int()?).map_err(|_| GiveUp)?,
                    None => s.len(),
                };
                Val::Str(Cow::Owned(s.get(start..end).ok_or(GiveUp)?.to_string()))
            }
            Function::String => match args.first().ok_or(GiveUp)? {
                Val::Str(s) => Val::Str(s.clone()),
                Val::Int(i) => Val::Str(Cow::Owned(i.to_string())),
                Val::UInt(u) => Val::Str(Cow::Owned(u.to_string())),
                _ => return Err(GiveUp),
            },
            Function::Int => Val::Int(args.first().ok_or(GiveUp)?.as_int()?),
            Function::Accelerators => match args.first().ok_or(GiveUp)? {
                Val::Map(object) | Val::Root(object) => Val::Int(self.accelerators_of(object)?),
                _ => return Err(GiveUp),
            },
        })
    }

    /// `accelerators(x)` of a Pod, a pod spec or a container, as the interpreter's helper
    /// counts it.
    fn accelerators_of(&self, object: &Value) -> Eval<i64> {
        let all = super::requests_of_json(object, self.variables.view).ok_or(GiveUp)?;
        total_units(&accelerators_only(&all, self.accelerators)).ok_or(GiveUp)
    }
}

/// `operand.field` (or `has(operand.field)` when `test`), as the interpreter selects: on a map
/// the field or an error when absent; on anything else `false`.
fn select<'a>(operand: &Val<'a>, field: &str, test: bool) -> Eval<Val<'a>> {
    let map = match operand {
        Val::Map(map) | Val::Root(map) => fields(map)?,
        Val::Metadata(map) if field != "managedFields" => fields(map)?,
        Val::Metadata(_) if test => return Ok(Val::Bool(false)),
        Val::Metadata(_) => return Err(GiveUp),
        Val::Items(_)
        | Val::Null
        | Val::Bool(_)
        | Val::Int(_)
        | Val::UInt(_)
        | Val::Double(_)
        | Val::Str(_)
        | Val::List(_) => {
            return Ok(Val::Bool(false));
        }
    };
    if test {
        return Ok(Val::Bool(map.contains_key(field)));
    }
    let value = map.get(field).ok_or(GiveUp)?;
    Ok(match (operand, field, value) {
        (Val::Root(_), "metadata", Value::Object(_)) => Val::Metadata(value),
        _ => Val::json(value),
    })
}

/// The fields of a JSON object.
fn fields(object: &Value) -> Eval<&serde_json::Map<String, Value>> {
    object.as_object().ok_or(GiveUp)
}

/// `container[key]`: a map by a string key, a list by an int index; anything else gives up.
fn index<'a>(container: &Val<'a>, key: &Val<'a>) -> Eval<Val<'a>> {
    match (container, key) {
        (Val::Map(_) | Val::Root(_) | Val::Metadata(_), Val::Str(field)) => select(container, field, false),
        (Val::List(items), Val::Int(i)) => {
            Ok(Val::json(items.get(usize::try_from(*i).map_err(|_| GiveUp)?).ok_or(GiveUp)?))
        }
        (Val::Items(items), Val::Int(i)) => items.get(usize::try_from(*i).map_err(|_| GiveUp)?).cloned().ok_or(GiveUp),
        _ => Err(GiveUp),
    }
}

/// `item in container`: a string in a list of strings, or a map's key.
fn contains(container: &Val<'_>, item: &Val<'_>) -> Eval<bool> {
    let item = item.as_str()?;
    match container {
        Val::Map(map) | Val::Root(map) => Ok(fields(map)?.contains_key(item)),
        Val::List(items) => {
            let mut found = false;
            for element in *items {
                found |= element.as_str().ok_or(GiveUp)? == item;
            }
            Ok(found)
        }
        Val::Items(items) => {
            let mut found = false;
            for element in items.iter() {
                found |= element.as_str()? == item;
            }
            Ok(found)
        }
        _ => Err(GiveUp),
    }
}

/// Compares two scalars of one type; any other pair gives up (the interpreter has its own rules
/// for mixed numbers, null, lists and maps).
fn compare(comparison: Comparison, left: &Val<'_>, right: &Val<'_>) -> Eval<bool> {
    use std::cmp::Ordering;
    let ordering = match (left, right) {
        (Val::Int(l), Val::Int(r)) => l.cmp(r),
        (Val::UInt(l), Val::UInt(r)) => l.cmp(r),
        (Val::Str(l), Val::Str(r)) => l.as_ref().cmp(r.as_ref()),
        (Val::Double(l), Val::Double(r)) => l.partial_cmp(r).ok_or(GiveUp)?,
        (Val::Bool(l), Val::Bool(r)) if matches!(comparison, Comparison::Equal | Comparison::NotEqual) => l.cmp(r),
        (Val::Null, Val::Null) if matches!(comparison, Comparison::Equal | Comparison::NotEqual) => Ordering::Equal,
        _ => return Err(GiveUp),
    };
    Ok(match comparison {
        Comparison::Equal => ordering == Ordering::Equal,
        Comparison::NotEqual => ordering != Ordering::Equal,
        Comparison::Less => ordering == Ordering::Less,
        Comparison::LessOrEqual => ordering != Ordering::Greater,
        Comparison::Greater => ordering == Ordering::Greater,
        Comparison::GreaterOrEqual => ordering != Ordering::Less,
    })
}

#[cfg(test)]
mod tests;
