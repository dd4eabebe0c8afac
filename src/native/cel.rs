//! CEL text for the native policies: literals, resource-name and namespace predicates, the
//! team of a namespace, the Pods inside a workload, and the rewriting of an Allot expression
//! into one the API server evaluates.
//!
//! Everything here produces source text; `tests` compile every piece with the `cel` crate, and
//! the end-to-end test has the API server type-check and run it.

use crate::policy::{LabelSelector, NameGlobs, PolicySet, SelectorOperator};
use crate::resources::ResourceMatcher;
use crate::workload::Step;

/// A CEL string literal (JSON's escapes are all valid CEL escapes).
pub fn string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "''".to_string())
}

/// A CEL list of string literals.
pub fn string_list<S: AsRef<str>>(items: &[S]) -> String {
    format!("[{}]", items.iter().map(|s| string(s.as_ref())).collect::<Vec<_>>().join(", "))
}

/// `key` (a CEL string expression) is one of the matcher's names or prefixes.
pub fn resource_matches(matcher: &ResourceMatcher, key: &str) -> String {
    let (exact, prefixes) = matcher.patterns();
    let mut terms: Vec<String> = exact.iter().map(|e| format!("{key} == {}", string(e))).collect();
    terms.extend(prefixes.iter().map(|p| format!("{key}.startsWith({})", string(p))));
    if terms.is_empty() { "false".to_string() } else { format!("({})", terms.join(" || ")) }
}

/// The container `c` names a matching resource in its requests or its limits (what
/// `resources::requests_any` reads).
pub fn container_names_any(matcher: &ResourceMatcher, c: &str) -> String {
    let m = resource_matches(matcher, "k");
    format!(
        "(has({c}.resources) && ((has({c}.resources.requests) && {c}.resources.requests.exists(k, {m})) || \
         (has({c}.resources.limits) && {c}.resources.limits.exists(k, {m}))))"
    )
}

/// Every container of the pod spec `s`, init containers included.
pub fn all_containers(s: &str) -> String {
    format!("((has({s}.containers) ? {s}.containers : []) + (has({s}.initContainers) ? {s}.initContainers : []))")
}

/// The pod spec `s` names a matching resource in some container.
pub fn pod_names_any(matcher: &ResourceMatcher, s: &str) -> String {
    format!("{}.exists(c, {})", all_containers(s), container_names_any(matcher, "c"))
}

/// Why a piece of policy cannot be expressed natively.
pub type Unsupported = String;

/// A namespace-name glob as a predicate on `name`: literal names and `*`/`?` wildcards (a
/// namespace name is `[a-z0-9-]`, so nothing else needs escaping); other glob syntax is
/// reported.
pub fn glob(pattern: &str, name: &str) -> Result<String, Unsupported> {
    if !pattern.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*' | '?')) {
        return Err(format!("namespace glob {pattern:?} uses glob syntax beyond * and ?"));
    }
    if !pattern.contains(['*', '?']) {
        return Ok(format!("{name} == {}", string(pattern)));
    }
    if let Some(prefix) = pattern.strip_suffix('*').filter(|p| !p.contains(['*', '?'])) {
        return Ok(format!("{name}.startsWith({})", string(prefix)));
    }
    let mut regex = String::from("^");
    for c in pattern.chars() {
        match c {
            '*' => regex.push_str(".*"),
            '?' => regex.push('.'),
            '.' => regex.push_str("\\."),
            other => regex.push(other),
        }
    }
    regex.push('$');
    Ok(format!("{name}.matches({})", string(&regex)))
}

/// Any of the globs matches `name` (`false` for none).
pub fn globs(globs: &NameGlobs, name: &str) -> Result<String, Unsupported> {
    let terms = globs.patterns().map(|p| glob(p, name)).collect::<Result<Vec<_>, _>>()?;
    Ok(if terms.is_empty() { "false".to_string() } else { format!("({})", terms.join(" || ")) })
}

/// The labels of the namespace under review (`{}` when it has none).
pub const NAMESPACE_LABELS: &str = "(has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {})";

/// Kubernetes label-selector semantics over the namespace's labels.
pub fn selector(selector: &LabelSelector) -> String {
    let l = NAMESPACE_LABELS;
    let mut terms: Vec<String> = selector
        .match_labels
        .iter()
        .map(|(k, v)| format!("({k} in {l} && {l}[{k}] == {v})", k = string(k), v = string(v)))
        .collect();
    for req in &selector.match_expressions {
        let (k, values) = (string(&req.key), string_list(&req.values));
        terms.push(match req.operator {
            SelectorOperator::In => format!("({k} in {l} && {l}[{k}] in {values})"),
            SelectorOperator::NotIn => format!("(!({k} in {l}) || !({l}[{k}] in {values}))"),
            SelectorOperator::Exists => format!("({k} in {l})"),
            SelectorOperator::DoesNotExist => format!("!({k} in {l})"),
        });
    }
    if terms.is_empty() { "true".to_string() } else { format!("({})", terms.join(" && ")) }
}

/// The name of the team owning the namespace under review (`''` for none): the first team in
/// policy order whose names or selector match, as `namespaces::team_of` decides.
pub fn team(policies: &PolicySet) -> Result<String, Unsupported> {
    let mut out = "''".to_string();
    for team in policies.teams.iter().rev() {
        let mut cond = globs(&team.names, "request.namespace")?;
        if let Some(sel) = &team.selector {
            cond = format!("({cond} || (namespaceObject != null && {}))", selector(sel));
        }
        out = format!("({cond} ? {} : {out})", string(&team.name));
    }
    Ok(out)
}

/// A policy's scope (namespace globs, team names) as a condition; `None` when it has none.
/// `team` is the CEL of the namespace's team ([`team`]; match conditions cannot read
/// `variables`).
pub fn scope(namespaces: &NameGlobs, teams: &[String], team: &str) -> Result<Option<String>, Unsupported> {
    let mut terms = Vec::new();
    if namespaces.patterns().next().is_some() {
        terms.push(globs(namespaces, "request.namespace")?);
    }
    if !teams.is_empty() {
        terms.push(format!("{team} in {}", string_list(teams)));
    }
    Ok(if terms.is_empty() { None } else { Some(terms.join(" && ")) })
}

/// The Pod templates at `paths` inside `object`, as a CEL list (a path may cross at most one
/// list or map; every kind in the workload table does).
pub fn templates(paths: &[&[Step]]) -> Result<String, Unsupported> {
    let lists = paths.iter().map(|p| template_list(p)).collect::<Result<Vec<_>, _>>()?;
    Ok(if lists.is_empty() { "[]".to_string() } else { lists.join(" + ") })
}

fn field_chain(base: &str, fields: &[&str]) -> (String, Vec<String>) {
    let mut expr = base.to_string();
    let mut guards = Vec::new();
    for f in fields {
        guards.push(format!("has({expr}.{f})"));
        expr = format!("{expr}.{f}");
    }
    (expr, guards)
}

fn template_list(path: &[Step]) -> Result<String, Unsupported> {
    let split = path.iter().position(|s| !matches!(s, Step::Field(_)));
    let fields = |steps: &[Step]| -> Result<Vec<&'static str>, Unsupported> {
        steps
            .iter()
            .map(|s| match s {
                Step::Field(f) => Ok(*f),
                _ => Err("a template path crosses two lists or maps".to_string()),
            })
            .collect()
    };
    let guarded = |guards: &[String], then: String| {
        if guards.is_empty() { then } else { format!("({} ? {then} : [])", guards.join(" && ")) }
    };
    match split {
        None => {
            let (expr, guards) = field_chain("object", &fields(path)?);
            Ok(guarded(&guards, format!("[{expr}]")))
        }
        Some(i) => {
            let (outer, guards) = field_chain("object", &fields(&path[..i])?);
            let (inner, inner_guards) = field_chain("x", &fields(&path[i + 1..])?);
            let items = match path[i] {
                Step::Values => format!("{outer}.map(k, {outer}[k])"),
                _ => outer.clone(),
            };
            let filter = if inner_guards.is_empty() { "true".to_string() } else { inner_guards.join(" && ") };
            Ok(guarded(&guards, format!("{items}.filter(x, {filter}).map(x, {inner})")))
        }
    }
}

/// What each Allot variable becomes in a native expression.
#[derive(Debug, Clone, Copy)]
pub struct Bindings<'a> {
    /// `object` (the Pod, the template seen as a Pod, or the workload itself).
    pub object: &'a str,
    /// `oldObject`; `None` where it has no native counterpart (a template's old version).
    pub old_object: Option<&'a str>,
    /// The Cluster's accelerator names, which `accelerators(c)` counts.
    pub accelerators: &'a ResourceMatcher,
}

/// Allot's own CEL functions. `accelerators(c)` of a container bound by a macro over a
/// containers list is expanded ([`container_units`]); every other use has no Kubernetes CEL
/// form yet.
const HELPERS: &[&str] = &["accelerators", "acceleratorRequests", "acceleratorLimits"];
/// Macros whose first argument binds a variable.
const MACROS: &[&str] = &["all", "exists", "exists_one", "map", "filter"];
/// Pod fields holding containers.
const CONTAINER_LISTS: &[&str] = &["containers", "initContainers", "ephemeralContainers"];

/// Whole devices of a quantity `q` (a CEL expression), rounded up like `Quantity::ceil_units`
/// (accelerator amounts are never negative: the API server refuses them).
fn units(q: &str) -> String {
    let q = format!("quantity(string({q}))");
    format!("({q}.isInteger() ? {q}.asInteger() : int({q}.asApproximateFloat()) + 1)")
}

/// `accelerators(c)` for a container `c`: the accelerator units of its effective requests (a
/// request, else the limit), each rounded up, summed — as the engine's helper counts them.
pub fn container_units(accelerators: &ResourceMatcher, c: &str) -> String {
    let m = resource_matches(accelerators, "k");
    let requested = format!("(has({c}.resources.requests) && k in {c}.resources.requests)");
    format!(
        "(has({c}.resources) ? \
         (has({c}.resources.requests) ? {c}.resources.requests.filter(k, {m}).map(k, {}).sum() : 0) + \
         (has({c}.resources.limits) ? {c}.resources.limits.filter(k, {m} && !{requested}).map(k, {}).sum() : 0) \
         : 0)",
        units(&format!("{c}.resources.requests[k]")),
        units(&format!("{c}.resources.limits[k]")),
    )
}

/// Macro variables that range over a containers list only (`….containers.all(c, …)`).
fn container_variables<'t>(tokens: &[Token<'t>]) -> Vec<&'t str> {
    let significant: Vec<&Token<'t>> = tokens.iter().filter(|t| !matches!(t, Token::Space(_))).collect();
    let mut bound: Vec<(&'t str, bool)> = Vec::new();
    for w in significant.windows(6) {
        if let [
            Token::Ident(range),
            Token::Punct("."),
            Token::Ident(m),
            Token::Punct("("),
            Token::Ident(var),
            Token::Punct(","),
        ] = w
            && MACROS.contains(m)
        {
            bound.push((var, CONTAINER_LISTS.contains(range)));
        }
    }
    let mut out: Vec<&'t str> = bound.iter().filter(|(_, c)| *c).map(|(v, _)| *v).collect();
    out.retain(|v| bound.iter().all(|(w, c)| w != v || *c));
    out
}

/// Rewrites an Allot expression for the API server: `object`/`oldObject`/`workload` as
/// `bindings` says, `namespace` and `team` as `variables.namespaceName`/`variables.team`
/// (`namespace` is reserved in CEL); `request` is the same. Field names after a `.` and string
/// literals are left alone. Allot's helpers (but `accelerators(c)` of a container), and a
/// macro variable named like an Allot variable, are reported.
pub fn rewrite(source: &str, bindings: Bindings<'_>) -> Result<String, Unsupported> {
    let tokens = tokenize(source)?;
    let containers = container_variables(&tokens);
    let mut out = String::with_capacity(source.len() + 32);
    let mut prev_significant: Option<&Token<'_>> = None;
    let mut i = 0;
    while i < tokens.len() {
        let token = &tokens[i];
        let after_dot = matches!(prev_significant, Some(Token::Punct(".")));
        let next: Vec<(usize, &Token<'_>)> =
            tokens.iter().enumerate().skip(i + 1).filter(|(_, t)| !matches!(t, Token::Space(_))).take(3).collect();
        match token {
            Token::Ident("accelerators") if !after_dot => match next.as_slice() {
                [(_, Token::Punct("(")), (_, Token::Ident(c)), (close, Token::Punct(")"))]
                    if containers.contains(c) =>
                {
                    out.push_str(&container_units(bindings.accelerators, c));
                    prev_significant = Some(&tokens[*close]);
                    i = close + 1;
                    continue;
                }
                _ => {
                    return Err(
                        "uses Allot's helper accelerators() on a Pod (only a container's count is expanded yet)"
                            .to_string(),
                    );
                }
            },
            Token::Ident(name) if !after_dot => {
                if HELPERS.contains(name) {
                    return Err(format!("uses Allot's helper {name}(), which has no Kubernetes CEL form yet"));
                }
                let is_macro_var = matches!(prev_significant, Some(Token::Punct("(")))
                    && matches!(next.first(), Some((_, Token::Punct(","))))
                    && macro_before(&tokens[..i]);
                let replacement = match *name {
                    _ if is_macro_var && crate::expression::VARIABLES.contains(name) => {
                        return Err(format!("a macro variable is named {name}, like an Allot variable"));
                    }
                    "object" => Some(bindings.object.to_string()),
                    "workload" => Some("object".to_string()),
                    "oldObject" => Some(
                        bindings
                            .old_object
                            .ok_or_else(|| {
                                "reads oldObject of a Pod template, which the API server does not have".to_string()
                            })?
                            .to_string(),
                    ),
                    "namespace" => Some("variables.namespaceName".to_string()),
                    "team" => Some("variables.team".to_string()),
                    _ => None,
                };
                out.push_str(replacement.as_deref().unwrap_or(name));
            }
            other => out.push_str(other.text()),
        }
        if !matches!(token, Token::Space(_)) {
            prev_significant = Some(token);
        }
        i += 1;
    }
    Ok(out)
}

/// True when the tokens end with `.<macro>(` (the identifier after them is a macro variable).
fn macro_before(tokens: &[Token<'_>]) -> bool {
    let mut significant = tokens.iter().rev().filter(|t| !matches!(t, Token::Space(_)));
    matches!(
        (significant.next(), significant.next(), significant.next()),
        (Some(Token::Punct("(")), Some(Token::Ident(m)), Some(Token::Punct("."))) if MACROS.contains(m)
    )
}

#[derive(Debug, PartialEq)]
enum Token<'a> {
    Ident(&'a str),
    /// A string or bytes literal, kept verbatim.
    Literal(&'a str),
    Punct(&'a str),
    /// Whitespace, numbers and anything else kept verbatim.
    Space(&'a str),
}

impl<'a> Token<'a> {
    fn text(&self) -> &'a str {
        match self {
            Token::Ident(s) | Token::Literal(s) | Token::Punct(s) | Token::Space(s) => s,
        }
    }
}

fn tokenize(source: &str) -> Result<Vec<Token<'_>>, Unsupported> {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            // A string prefix: r'…', b'…', rb'…'.
            if i < bytes.len()
                && matches!(bytes[i], b'\'' | b'"')
                && source[start..i].chars().all(|c| "rRbB".contains(c))
            {
                i = skip_string(bytes, i)?;
                tokens.push(Token::Literal(&source[start..i]));
            } else {
                tokens.push(Token::Ident(&source[start..i]));
            }
        } else if c == b'\'' || c == b'"' {
            i = skip_string(bytes, i)?;
            tokens.push(Token::Literal(&source[start..i]));
        } else if c.is_ascii_digit() {
            // Numbers, including `1.5` and `1e3`: the `.` of a number is not a select.
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
            tokens.push(Token::Space(&source[start..i]));
        } else if c.is_ascii_whitespace() {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            tokens.push(Token::Space(&source[start..i]));
        } else {
            // One character (multi-byte UTF-8 kept whole).
            let len = source[i..].chars().next().map_or(1, char::len_utf8);
            i += len;
            tokens.push(Token::Punct(&source[start..i]));
        }
    }
    Ok(tokens)
}

/// The end of the string literal starting at `i` (a quote), triple quotes included.
fn skip_string(bytes: &[u8], i: usize) -> Result<usize, Unsupported> {
    let quote = bytes[i];
    let triple = bytes.len() >= i + 3 && bytes[i + 1] == quote && bytes[i + 2] == quote;
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < bytes.len() {
        if bytes[j] == b'\\' {
            j += 2;
            continue;
        }
        if bytes[j] == quote {
            if !triple {
                return Ok(j + 1);
            }
            if bytes.len() >= j + 3 && bytes[j + 1] == quote && bytes[j + 2] == quote {
                return Ok(j + 3);
            }
        }
        j += 1;
    }
    Err("an unterminated string literal".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Bindings<'static> {
        static GPUS: std::sync::LazyLock<ResourceMatcher> =
            std::sync::LazyLock::new(|| ResourceMatcher::new(["nvidia.com/gpu", "nvidia.com/mig-*"]));
        Bindings { object: "object", old_object: Some("oldObject"), accelerators: &GPUS }
    }

    #[test]
    fn rewrites_variables_but_not_fields_or_strings() {
        let out = rewrite("object.metadata.namespace == namespace && team != 'team' && workload.kind != \"x\"", pod());
        assert_eq!(
            out.as_deref(),
            Ok(
                "object.metadata.namespace == variables.namespaceName && variables.team != 'team' && object.kind != \"x\""
            )
        );
        let t = Bindings { object: "allotPod", old_object: None, ..pod() };
        assert_eq!(rewrite("object.spec.x == 1.5", t).as_deref(), Ok("allotPod.spec.x == 1.5"));
        assert!(rewrite("oldObject == null", t).is_err(), "no oldObject for templates");
    }

    #[test]
    fn helpers_and_shadowing_macro_variables_are_reported() {
        assert!(rewrite("accelerators(object) == 0", pod()).unwrap_err().contains("accelerators"));
        assert!(rewrite("object.spec.containers.all(team, team.name != '')", pod()).is_err());
        // A container's count is expanded; a Pod's, or a variable that is not only a container, is not.
        let expanded = rewrite("object.spec.containers.all(c, accelerators(c) == 0)", pod()).expect("expanded");
        assert!(
            expanded.contains("c.resources.requests.filter(k,") && !expanded.contains("accelerators("),
            "{expanded}"
        );
        assert!(rewrite("object.spec.volumes.all(c, accelerators(c) == 0)", pod()).is_err());
        assert!(rewrite("object.spec.containers.all(c, accelerators(c) == 0) && x.all(c, true)", pod()).is_err());
        assert!(rewrite("object.spec.containers.all(c, accelerators(c) == 0)", pod()).is_ok());
        assert!(rewrite("object.spec.containers.all(c, c.name != 'team')", pod()).is_ok());
        assert!(rewrite("'unterminated", pod()).is_err());
    }

    proptest::proptest! {
        /// Any text, valid CEL or not: an answer (rewritten or refused), never a panic.
        #[test]
        fn rewriting_never_panics(source in "[a-z.()'\"\\\\ ,_é0-9]{0,48}") {
            let _ = rewrite(&source, pod());
        }
    }

    #[test]
    fn globs_become_predicates() {
        assert_eq!(glob("vision", "n").as_deref(), Ok("n == \"vision\""));
        assert_eq!(glob("vision-*", "n").as_deref(), Ok("n.startsWith(\"vision-\")"));
        assert_eq!(glob("a?-*-b", "n").as_deref(), Ok("n.matches(\"^a.-.*-b$\")"));
        assert!(glob("team-{a,b}", "n").is_err());
    }
}
