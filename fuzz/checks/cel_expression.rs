//! CEL expressions alone, from a structured generator (`arbitrary`): the fuzzer builds a tree of
//! literals, variables, selections, indexes, operators, function and method calls (Allot's
//! helpers, the Kubernetes libraries, made-up names), macros and message literals, renders it as
//! source, and runs it through `Expression::compile` and, when it compiles, evaluation against a
//! GPU Pod (and `oldObject`) bound like the engine binds them.
//!
//! Checks: compiling never panics; an expression that compiles never panics when evaluated —
//! the evaluation boundary would contain it, so a contained panic (`EvalError::Panic`) is a
//! finding here: the load-time check should have refused the expression.

use std::sync::{Arc, OnceLock};

use allot::model::expression::{Bindings, Environment, EvalError, Expression, json_to_cel};
use allot::model::resources::{DEFAULT_ACCELERATORS, ResourceMatcher};
use arbitrary::{Arbitrary, Unstructured};
use serde_json::json;

const VARIABLES: &[&str] = &["object", "oldObject", "workload", "namespace", "team", "request", "x", "y", "nope"];
const FIELDS: &[&str] = &[
    "spec",
    "metadata",
    "containers",
    "resources",
    "limits",
    "requests",
    "labels",
    "name",
    "image",
    "operation",
    "userInfo",
    "groups",
    "initContainers",
    "nodeSelector",
    "missing",
];
const FUNCTIONS: &[&str] = &[
    "accelerators",
    "acceleratorRequests",
    "acceleratorLimits",
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "quantity",
    "isQuantity",
    "isGreaterThan",
    "compareTo",
    "add",
    "sub",
    "asInteger",
    "split",
    "join",
    "lowerAscii",
    "charAt",
    "indexOf",
    "substring",
    "replace",
    "format",
    "url",
    "ip",
    "cidr",
    "semver",
    "isSorted",
    "sum",
    "min",
    "max",
    "sort",
    "distinct",
    "flatten",
    "reverse",
    "slice",
    "first",
    "last",
    "math.abs",
    "math.greatest",
    "math.least",
    "math.bitShiftLeft",
    "math.sqrt",
    "sets.contains",
    "lists.range",
    "base64.decode",
    "base64.encode",
    "strings.quote",
    "duration",
    "timestamp",
    "getHours",
    "find",
    "findAll",
    "optional.of",
    "optional.none",
    "value",
    "hasValue",
    "orValue",
    "or",
    "type",
    "dyn",
    "nosuch",
    "jsonpatch.escapeKey",
    "format.dns1123Label",
    "format.named",
    "validate",
    "trim",
    "upperAscii",
];
const BINARY: &[&str] = &["+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "in"];
const MACROS: &[&str] = &["all", "exists", "exists_one", "map", "filter"];

#[derive(Arbitrary, Debug)]
pub enum Node {
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Bytes(Vec<u8>),
    Bool(bool),
    Null,
    Var(u8),
    Select(Box<Node>, u8),
    Has(Box<Node>, u8),
    Index(Box<Node>, Box<Node>),
    Unary(bool, Box<Node>),
    Binary(u8, Box<Node>, Box<Node>),
    Ternary(Box<Node>, Box<Node>, Box<Node>),
    Call(u8, Vec<Node>),
    Method(Box<Node>, u8, Vec<Node>),
    Macro(Box<Node>, u8, u8, Box<Node>),
    List(Vec<Node>),
    Map(Vec<(Node, Node)>),
    Message(u8, Vec<(u8, Node)>),
}

fn pick<'a>(list: &[&'a str], i: u8) -> &'a str {
    list[usize::from(i) % list.len()]
}

pub fn render(node: &Node, out: &mut String, depth: usize) {
    if depth > 12 {
        out.push('1');
        return;
    }
    let d = depth + 1;
    let args = |items: &[Node], out: &mut String| {
        for (i, a) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            render(a, out, d);
        }
    };
    match node {
        Node::Int(i) => out.push_str(&format!("({i})")),
        Node::Uint(u) => out.push_str(&format!("{u}u")),
        Node::Double(f) if f.is_finite() => out.push_str(&format!("{f:?}")),
        Node::Double(_) => out.push_str("double('NaN')"),
        Node::Str(s) => out.push_str(&format!("{s:?}")),
        Node::Bytes(b) => out.push_str(&format!("b{:?}", String::from_utf8_lossy(b))),
        Node::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Node::Null => out.push_str("null"),
        Node::Var(v) => out.push_str(pick(VARIABLES, *v)),
        Node::Select(n, f) => {
            render(n, out, d);
            out.push('.');
            out.push_str(pick(FIELDS, *f));
        }
        Node::Has(n, f) => {
            out.push_str("has(");
            render(n, out, d);
            out.push('.');
            out.push_str(pick(FIELDS, *f));
            out.push(')');
        }
        Node::Index(n, i) => {
            render(n, out, d);
            out.push('[');
            render(i, out, d);
            out.push(']');
        }
        Node::Unary(neg, n) => {
            out.push_str(if *neg { "-(" } else { "!(" });
            render(n, out, d);
            out.push(')');
        }
        Node::Binary(op, l, r) => {
            out.push('(');
            render(l, out, d);
            out.push_str(&format!(" {} ", pick(BINARY, *op)));
            render(r, out, d);
            out.push(')');
        }
        Node::Ternary(c, a, b) => {
            out.push('(');
            render(c, out, d);
            out.push_str(" ? ");
            render(a, out, d);
            out.push_str(" : ");
            render(b, out, d);
            out.push(')');
        }
        Node::Call(f, items) => {
            out.push_str(pick(FUNCTIONS, *f));
            out.push('(');
            args(items, out);
            out.push(')');
        }
        Node::Method(target, f, items) => {
            render(target, out, d);
            out.push('.');
            out.push_str(pick(FUNCTIONS, *f));
            out.push('(');
            args(items, out);
            out.push(')');
        }
        Node::Macro(target, m, v, body) => {
            render(target, out, d);
            let var = if v % 2 == 0 { "x" } else { "y" };
            out.push_str(&format!(".{}({var}, ", pick(MACROS, *m)));
            render(body, out, d);
            out.push(')');
        }
        Node::List(items) => {
            out.push('[');
            args(items, out);
            out.push(']');
        }
        Node::Map(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render(k, out, d);
                out.push_str(": ");
                render(v, out, d);
            }
            out.push('}');
        }
        Node::Message(t, fields) => {
            out.push_str(pick(&["Foo", "c.image", "google.protobuf.Int64Value", "object.spec"], *t));
            out.push('{');
            for (i, (f, v)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(pick(FIELDS, *f));
                out.push_str(": ");
                render(v, out, d);
            }
            out.push('}');
        }
    }
}

struct Setup {
    env: Environment,
    bindings: Bindings,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

fn setup() -> &'static Setup {
    SETUP.get_or_init(|| {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "vision", "labels": {"allot.dev/gang-name": "g"}},
            "spec": {"containers": [
                {"name": "c", "image": "i:1", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "500m"},
                                                         "requests": {"nvidia.com/gpu": "2"}}},
                {"name": "d", "image": "i", "resources": {}}
            ], "initContainers": [{"name": "init", "image": "i"}], "nodeSelector": {"a": "b"}}
        });
        Setup {
            env: Environment::new(Arc::new(ResourceMatcher::new(DEFAULT_ACCELERATORS))),
            bindings: Bindings {
                vars: u8::MAX,
                object: json_to_cel(&pod),
                old_object: json_to_cel(&pod),
                workload: json_to_cel(&pod),
                namespace: "vision".into(),
                team: "vision".into(),
                request: json_to_cel(&json!({"operation": "UPDATE", "dryRun": false,
                                             "userInfo": {"username": "u", "groups": ["g"]}})),
                object_accelerators: None,
            },
        }
    })
}

/// The target's check of one input: `data` decoded as libfuzzer-sys 0.4 decodes a typed
/// target's input (too short for the size hint: skipped; else `arbitrary_take_rest`), so a
/// kept input replays as it was found.
pub fn run(data: &[u8]) {
    if data.len() < Node::size_hint(0).0 {
        return;
    }
    let Ok(node) = Node::arbitrary_take_rest(Unstructured::new(data)) else { return };
    check(&node);
}

/// `node` rendered as CEL, compiled and evaluated.
pub fn check(node: &Node) {
    let mut source = String::new();
    render(node, &mut source, 0);
    if std::env::var_os("ALLOT_FUZZ_PRINT").is_some() {
        eprintln!("{source}");
    }
    let Ok(expression) = Expression::compile(&source) else { return };
    let setup = setup();
    let scope = setup.env.scope(&setup.bindings);
    for result in [expression.eval_bool(&scope, &"fuzz").err(), expression.eval_string(&scope, &"fuzz").err()] {
        if let Some(EvalError::Panic(message)) = result {
            panic!("{source:?} compiled but panicked when evaluated: {message}");
        }
    }
}
