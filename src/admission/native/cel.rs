//! CEL text for the native policies: literals, resource-name and namespace predicates, the
//! team of a namespace, the Pods inside a workload, and the rewriting of an Allot expression
//! into one the API server evaluates.
//!
//! Everything here produces source text; `tests` compile every piece with the `cel` crate, and
//! the end-to-end test has the API server type-check and run it.

use crate::model::policy::{LabelSelector, NameGlobs, PolicySet, SelectorOperator};
use crate::model::resources::ResourceMatcher;
use crate::model::workload::Step;

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

/// The container `c` asks for a matching resource, an amount other than zero, in its requests
/// or its limits (what `resources::requests_any` reads).
pub fn container_names_any(matcher: &ResourceMatcher, c: &str) -> String {
    let m = resource_matches(matcher, "k");
    let asks = |list: &str| {
        format!(
            "(has({c}.resources.{list}) && {c}.resources.{list}.exists(k, {m} && \
             quantity(string({c}.resources.{list}[k])).compareTo(quantity('0')) != 0))"
        )
    };
    format!("(has({c}.resources) && ({} || {}))", asks("requests"), asks("limits"))
}

/// Every container of the pod spec `s`, init containers included.
pub fn all_containers(s: &str) -> String {
    format!("((has({s}.containers) ? {s}.containers : []) + (has({s}.initContainers) ? {s}.initContainers : []))")
}

/// The pod spec `s` names a matching resource in some container.
pub fn pod_names_any(matcher: &ResourceMatcher, s: &str) -> String {
    format!("{}.exists(c, {})", all_containers(s), container_names_any(matcher, "c"))
}

pub use super::unsupported::Unsupported;

/// A namespace-name glob as a predicate on `name`: literal names and `*`/`?` wildcards (a
/// namespace name is `[a-z0-9-]`, so nothing else needs escaping); other glob syntax is
/// reported.
pub fn glob(pattern: &str, name: &str) -> Result<String, Unsupported> {
    if !pattern.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*' | '?')) {
        return Err(Unsupported::GlobSyntax(pattern.to_string()));
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
/// list or map; every kind in the workload table does), and beside it the CEL list of where
/// each template is, in the same order:
/// the path the engine names in its findings (`spec.template`,
/// `spec.replicatedJobs[1].template.spec.template`), with `*` for a map key
/// (`spec.pytorchReplicaSpecs.*.template`, where the engine names `Worker`).
pub fn templates_with_paths(paths: &[&[Step]]) -> Result<(String, String), Unsupported> {
    let lists = paths.iter().map(|p| template_list(p)).collect::<Result<Vec<_>, _>>()?;
    if lists.is_empty() {
        return Ok(("[]".to_string(), "[]".to_string()));
    }
    let (templates, paths): (Vec<String>, Vec<String>) = lists.into_iter().unzip();
    Ok((templates.join(" + "), paths.join(" + ")))
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

/// The templates at one path, and their paths.
fn template_list(path: &[Step]) -> Result<(String, String), Unsupported> {
    let split = path.iter().position(|s| !matches!(s, Step::Field(_)));
    let fields = |steps: &[Step]| -> Result<Vec<&'static str>, Unsupported> {
        steps
            .iter()
            .map(|s| match s {
                Step::Field(f) => Ok(*f),
                _ => Err(Unsupported::TemplatePath),
            })
            .collect()
    };
    let guarded = |guards: &[String], then: String| {
        if guards.is_empty() { then } else { format!("({} ? {then} : [])", guards.join(" && ")) }
    };
    match split {
        None => {
            let names = fields(path)?;
            let (expr, guards) = field_chain("object", &names);
            Ok((guarded(&guards, format!("[{expr}]")), guarded(&guards, format!("[{}]", string(&names.join("."))))))
        }
        Some(i) => {
            let (outer_names, inner_names) = (fields(&path[..i])?, fields(&path[i + 1..])?);
            let (outer, guards) = field_chain("object", &outer_names);
            let (inner, inner_guards) = field_chain("x", &inner_names);
            let filter = if inner_guards.is_empty() { "true".to_string() } else { inner_guards.join(" && ") };
            let suffix = string(&inner_names.iter().map(|n| format!(".{n}")).collect::<String>());
            let prefix = outer_names.join(".");
            // Both lists keep the same elements (`.all` over a one-element list binds `x` to it,
            // as the templates' filter does). A list is walked in its order both times; a map is
            // not (CEL, like Go, iterates maps in no fixed order, and each walk may differ: seen
            // in the cel crate), so a map's templates are named by a key pattern, `.*.`, the
            // same for each, rather than by a key that might belong to another template.
            let (items, paths) = match path[i] {
                Step::Values => (
                    format!("{outer}.map(k, {outer}[k])"),
                    format!(
                        "{outer}.map(k, k).filter(k, [{outer}[k]].all(x, {filter})).map(k, {})",
                        string(&format!(
                            "{prefix}.*{}",
                            inner_names.iter().map(|n| format!(".{n}")).collect::<String>()
                        ))
                    ),
                ),
                _ => (
                    outer.clone(),
                    format!(
                        "lists.range(size({outer})).filter(i, [{outer}[i]].all(x, {filter})).map(i, {} + string(i) + ']' + {suffix})",
                        string(&format!("{prefix}["))
                    ),
                ),
            };
            Ok((guarded(&guards, format!("{items}.filter(x, {filter}).map(x, {inner})")), guarded(&guards, paths)))
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
/// containers list ([`container_units`]) and `accelerators(object)` / `accelerators(object.spec)`
/// ([`pod_units`]) are expanded, and so is one entry, a string literal, of the maps of
/// `acceleratorRequests()` / `acceleratorLimits()` ([`MapLookup`]); other uses are not.
const HELPERS: &[&str] = &["accelerators", "acceleratorRequests", "acceleratorLimits"];
/// Macros whose first argument binds a variable.
const MACROS: &[&str] = &["all", "exists", "exists_one", "map", "filter"];
/// Pod fields holding containers.
const CONTAINER_LISTS: &[&str] = &["containers", "initContainers", "ephemeralContainers"];

/// Exact nano-units of the Kubernetes quantity `q` (a CEL quantity expression), as an int.
///
/// Kubernetes CEL has no exact scaling of a quantity, so: `g` = the float's truncation (off by
/// at most a few units for huge values), `d = q - g` exactly, `floor(q) = g + floor(d)` (`d` is
/// small, so its float is exact to far better than a nano), and the fraction `q - floor(q)` in
/// `[0, 1)` read through its float and rounded to the nearest nano. A value beyond ±9.2·10⁹
/// units overflows `int` (an evaluation error, so a Deny policy refuses, as `failurePolicy:
/// Fail` says). Single-element `map`s stand for `let` (the API server has no `cel.bind`), and
/// `isLessThan(quantity('0'))` for `sign()`, which 1.36 does not offer on a quantity.
pub fn nanos(q: &str) -> String {
    format!(
        "[{q}].map(allotQ, [int(allotQ.asApproximateFloat())].map(allotG, [allotQ.sub(allotG)].map(allotD, \
         [allotG + int(allotD.asApproximateFloat()) - (allotD.sub(int(allotD.asApproximateFloat())).isLessThan(quantity('0')) ? 1 : 0)]\
         .map(allotF, allotF * 1000000000 + int(allotQ.sub(allotF).asApproximateFloat() * 1000000000.0 + 0.5))[0])[0])[0])[0]"
    )
}

/// Whole devices of `n` nano-units, rounded up like `Quantity::ceil_units` (CEL's `/` and `%`
/// truncate toward zero, which is already the ceiling below zero).
pub fn ceil_units(n: &str) -> String {
    format!("[{n}].map(allotN, allotN / 1000000000 + (allotN % 1000000000 > 0 ? 1 : 0))[0]")
}

/// Whole devices of the quantity `q`, rounded up (`500m` is one device).
fn units(q: &str) -> String {
    ceil_units(&nanos(&format!("quantity(string({q}))")))
}

/// The nano-units of resource `r` the container `c` asks for: its request, else its limit
/// (the API server defaults a missing request to the limit), else 0 — as
/// `ContainerResources::effective_requests` reads it.
fn effective_nanos(c: &str, r: &str) -> String {
    format!(
        "[(has({c}.resources) && has({c}.resources.requests) && {r} in {c}.resources.requests) ? \
         string({c}.resources.requests[{r}]) : (has({c}.resources) && has({c}.resources.limits) && \
         {r} in {c}.resources.limits) ? string({c}.resources.limits[{r}]) : '0'].map(allotV, {})[0]",
        nanos("quantity(allotV)")
    )
}

/// The container `c` names resource `r` in its requests or limits.
fn names_resource(c: &str, r: &str) -> String {
    format!(
        "(has({c}.resources) && ((has({c}.resources.requests) && {r} in {c}.resources.requests) || \
         (has({c}.resources.limits) && {r} in {c}.resources.limits)))"
    )
}

/// The nano-units of resource `r` the pod spec `s` holds at its peak, the scheduler's
/// effective request, exactly as `resources::pod_requests` computes it: app containers plus
/// native sidecars (init containers with `restartPolicy: Always`), or — when larger — an init
/// container's request plus the sidecars started before it (a sidecar's own step counts it
/// with those before); the init peak is at least 0 when some init container names `r`; then
/// the pod overhead.
pub fn pod_resource_nanos(s: &str, r: &str) -> String {
    let init = format!("(has({s}.initContainers) ? {s}.initContainers : [])");
    let app = format!("(has({s}.containers) ? {s}.containers : [])");
    let sidecars_before = "lists.range(allotI).filter(allotJ, allotSide[allotJ]).map(allotJ, allotE[allotJ]).sum()";
    format!(
        "([{init}].map(allotInit, [allotInit.map(allotC, {eff})].map(allotE, \
         [allotInit.map(allotC, has(allotC.restartPolicy) && allotC.restartPolicy == 'Always')].map(allotSide, \
         ([{app}.map(allotC, {eff}).sum() + lists.range(size(allotE)).filter(allotI, allotSide[allotI])\
         .map(allotI, allotE[allotI]).sum()] + (allotInit.exists(allotC, {named}) ? \
         [0] + lists.range(size(allotE)).map(allotI, {sidecars_before} + allotE[allotI]) : [])).max())[0])[0])[0] + \
         ((has({s}.overhead) && {r} in {s}.overhead) ? [string({s}.overhead[{r}])].map(allotV, {overhead})[0] : 0))",
        eff = effective_nanos("allotC", r),
        named = names_resource("allotC", r),
        overhead = nanos("quantity(allotV)"),
    )
}

/// Whole devices of resource `r` (a CEL string) the pod spec `s` asks for: what
/// `max-per-pod` compares.
pub fn pod_resource_units(s: &str, r: &str) -> String {
    ceil_units(&pod_resource_nanos(s, r))
}

/// `accelerators(pod)` for the pod spec `s`: over every distinct accelerator name its
/// containers or overhead name, the whole devices of the pod's effective request, summed —
/// as the engine's helper counts them.
pub fn pod_units(accelerators: &ResourceMatcher, s: &str) -> String {
    let keys = |c: &str| {
        format!(
            "((has({c}.resources) && has({c}.resources.requests) ? {c}.resources.requests.map(allotK, allotK) : []) + \
             (has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits.map(allotK, allotK) : []))"
        )
    };
    let names = format!(
        "({}.map(allotC, {}).flatten() + (has({s}.overhead) ? {s}.overhead.map(allotK, allotK) : [])).filter(allotK, {})",
        all_containers(s),
        keys("allotC"),
        resource_matches(accelerators, "allotK"),
    );
    format!(
        "[{names}].map(allotNames, lists.range(size(allotNames)).filter(allotI, allotNames.indexOf(allotNames[allotI]) == allotI)\
         .map(allotI, allotNames[allotI]))[0].map(allotR, {}).sum()",
        pod_resource_units(s, "allotR")
    )
}

/// `accelerators(x)` of a Pod-shaped value `x` (`{metadata, spec}`); a value without a spec
/// counts 0, as the engine reads it (a map without `spec` or `containers` is a container
/// without resources).
pub fn pod_value_units(accelerators: &ResourceMatcher, x: &str) -> String {
    format!("(has({x}.spec) ? {} : 0)", pod_units(accelerators, &format!("{x}.spec")))
}

/// `accelerators(c)` for a container `c`: the accelerator units of its effective requests (a
/// request, else the limit), each rounded up, summed — as the engine's helper counts them.
pub fn container_units(accelerators: &ResourceMatcher, c: &str) -> String {
    let m = resource_matches(accelerators, "allotK");
    let requested = format!("(has({c}.resources.requests) && allotK in {c}.resources.requests)");
    format!(
        "(has({c}.resources) ? \
         (has({c}.resources.requests) ? {c}.resources.requests.filter(allotK, {m}).map(allotK, {}).sum() : 0) + \
         (has({c}.resources.limits) ? {c}.resources.limits.filter(allotK, {m} && !{requested}).map(allotK, {}).sum() : 0) \
         : 0)",
        units(&format!("{c}.resources.requests[allotK]")),
        units(&format!("{c}.resources.limits[allotK]")),
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
    let mut rewriter = Rewriter {
        tokens: &tokens,
        bindings,
        containers: container_variables(&tokens),
        out: String::with_capacity(source.len() + 32),
        prev_significant: None,
    };
    let mut i = 0;
    while i < tokens.len() {
        i = rewriter.step(i)?;
    }
    Ok(rewriter.out)
}

/// [`rewrite`]'s state: the tokens, what is written so far, and the last token that was not
/// whitespace (a `.` before an identifier makes it a field name).
struct Rewriter<'t, 'b> {
    tokens: &'t [Token<'t>],
    bindings: Bindings<'b>,
    containers: Vec<&'t str>,
    out: String,
    prev_significant: Option<&'t Token<'t>>,
}

impl<'t> Rewriter<'t, '_> {
    /// Writes the token at `i` (or the helper call starting there); gives the next index.
    fn step(&mut self, i: usize) -> Result<usize, Unsupported> {
        let tokens = self.tokens;
        let token = &tokens[i];
        let after_dot = matches!(self.prev_significant, Some(Token::Punct(".")));
        let next: Vec<(usize, &Token<'_>)> =
            tokens.iter().enumerate().skip(i + 1).filter(|(_, t)| !matches!(t, Token::Space(_))).take(3).collect();
        let replaced_up_to = match token {
            Token::Ident("accelerators") if !after_dot => Some(self.accelerators_call(i, &next)?),
            Token::Ident(name) if !after_dot && HELPERS.contains(name) => {
                let lookup = map_lookup(tokens, i, &self.containers)
                    .ok_or_else(|| Unsupported::HelperLookup(name.to_string()))?;
                self.out.push_str(&lookup.expand(self.bindings));
                Some(lookup.close)
            }
            Token::Ident(name) if !after_dot => {
                self.identifier(i, name, &next)?;
                None
            }
            other => {
                self.out.push_str(other.text());
                None
            }
        };
        if let Some(close) = replaced_up_to {
            self.prev_significant = Some(&tokens[close]);
            return Ok(close + 1);
        }
        if !matches!(token, Token::Space(_)) {
            self.prev_significant = Some(token);
        }
        Ok(i + 1)
    }

    /// `accelerators(c)` of a container, `accelerators(object)` or `accelerators(object.spec)`
    /// at `i`, expanded; gives the index of its closing parenthesis.
    fn accelerators_call(&mut self, i: usize, next: &[(usize, &Token<'_>)]) -> Result<usize, Unsupported> {
        let accelerators = self.bindings.accelerators;
        match next {
            [(_, Token::Punct("(")), (_, Token::Ident(c)), (close, Token::Punct(")"))]
                if self.containers.contains(c) =>
            {
                self.out.push_str(&container_units(accelerators, c));
                Ok(*close)
            }
            [(_, Token::Punct("(")), (_, Token::Ident("object")), (close, Token::Punct(")"))] => {
                self.out.push_str(&pod_value_units(accelerators, self.bindings.object));
                Ok(*close)
            }
            _ => {
                let close = pod_spec_argument(self.tokens, i).ok_or(Unsupported::AcceleratorsArgument)?;
                let spec = format!("{}.spec", self.bindings.object);
                self.out.push_str(&format!("({})", pod_units(accelerators, &spec)));
                Ok(close)
            }
        }
    }

    /// An identifier that is not a field name: Allot's variables as bound, anything else as is.
    fn identifier(&mut self, i: usize, name: &str, next: &[(usize, &Token<'_>)]) -> Result<(), Unsupported> {
        if name.starts_with("allot") {
            return Err(Unsupported::ReservedName(name.to_string()));
        }
        let is_macro_var = matches!(self.prev_significant, Some(Token::Punct("(")))
            && matches!(next.first(), Some((_, Token::Punct(","))))
            && macro_before(&self.tokens[..i]);
        let bindings = self.bindings;
        let replacement = match name {
            _ if is_macro_var && crate::model::expression::VARIABLES.contains(&name) => {
                return Err(Unsupported::MacroVariable(name.to_string()));
            }
            "object" => Some(bindings.object),
            "workload" => Some("object"),
            "oldObject" => Some(bindings.old_object.ok_or(Unsupported::TemplateOldObject)?),
            "namespace" => Some("variables.namespaceName"),
            "team" => Some("variables.team"),
            _ => None,
        };
        self.out.push_str(replacement.unwrap_or(name));
        Ok(())
    }
}

/// `acceleratorRequests(x)['name']` or `acceleratorLimits(c)['name']`: one entry of the
/// helper's map, which CEL can build (a literal key, a computed value).
struct MapLookup<'t> {
    limits: bool,
    /// A container macro variable, or `None` for `object` / `object.spec` (`spec` true).
    container: Option<&'t str>,
    spec: bool,
    /// The key's CEL literal and its value.
    key: &'t str,
    name: String,
    /// Index of the closing `]`.
    close: usize,
}

impl MapLookup<'_> {
    /// `{name: units}` when the engine's map holds `name`, else `{}`, indexed by `name`: a
    /// missing key is an evaluation error in both.
    fn expand(&self, bindings: Bindings<'_>) -> String {
        let (key, matcher) = (self.key, bindings.accelerators);
        if !matcher.matches(&self.name) {
            return format!("{{}}[{key}]");
        }
        let entry = |present: String, units: String| format!("({present} ? {{{key}: {units}}} : {{}})[{key}]");
        match (self.limits, self.container) {
            (true, Some(c)) => entry(
                format!("(has({c}.resources) && has({c}.resources.limits) && {key} in {c}.resources.limits)"),
                units(&format!("{c}.resources.limits[{key}]")),
            ),
            (false, Some(c)) => entry(names_resource(c, key), ceil_units(&effective_nanos(c, key))),
            (_, None) => {
                // A Pod (or a spec with containers) is counted as the scheduler does, an
                // exactly-zero total left out of the map; anything else reads as a container
                // without resources: an empty map.
                let (guard, spec) = if self.spec {
                    (format!("has({}.spec.containers)", bindings.object), format!("{}.spec", bindings.object))
                } else {
                    (format!("has({}.spec)", bindings.object), format!("{}.spec", bindings.object))
                };
                format!(
                    "({guard} ? [{}].map(allotT, allotT != 0 ? {{{key}: {}}} : {{}})[0] : {{}})[{key}]",
                    pod_resource_nanos(&spec, key),
                    ceil_units("allotT"),
                )
            }
        }
    }
}

/// The helper call at token `i` as a [`MapLookup`], when it is one.
fn map_lookup<'t>(tokens: &[Token<'t>], i: usize, containers: &[&'t str]) -> Option<MapLookup<'t>> {
    let limits = matches!(tokens.get(i), Some(Token::Ident("acceleratorLimits")));
    let significant: Vec<(usize, &Token<'t>)> =
        tokens.iter().enumerate().skip(i + 1).filter(|(_, t)| !matches!(t, Token::Space(_))).take(8).collect();
    let (container, spec, rest) = match significant.as_slice() {
        [(_, Token::Punct("(")), (_, Token::Ident(c)), (_, Token::Punct(")")), rest @ ..] if containers.contains(c) => {
            (Some(*c), false, rest)
        }
        [(_, Token::Punct("(")), (_, Token::Ident("object")), (_, Token::Punct(")")), rest @ ..] if !limits => {
            (None, false, rest)
        }
        [
            (_, Token::Punct("(")),
            (_, Token::Ident("object")),
            (_, Token::Punct(".")),
            (_, Token::Ident("spec")),
            (_, Token::Punct(")")),
            rest @ ..,
        ] if !limits => (None, true, rest),
        _ => return None,
    };
    let [(_, Token::Punct("[")), (_, Token::Literal(key)), (close, Token::Punct("]")), ..] = rest else {
        return None;
    };
    // A plain single-quoted or double-quoted literal without escapes.
    let quote = key.chars().next()?;
    let name = key.strip_prefix(quote)?.strip_suffix(quote)?;
    if !matches!(quote, '\'' | '"') || name.contains(['\\', '\'', '"']) || key.len() < 2 {
        return None;
    }
    Some(MapLookup { limits, container, spec, key, name: name.to_string(), close: *close })
}

/// `accelerators(object.spec)` at token `i`: the index of the closing `)`.
fn pod_spec_argument(tokens: &[Token<'_>], i: usize) -> Option<usize> {
    let significant: Vec<(usize, &Token<'_>)> =
        tokens.iter().enumerate().skip(i + 1).filter(|(_, t)| !matches!(t, Token::Space(_))).take(5).collect();
    match significant.as_slice() {
        [
            (_, Token::Punct("(")),
            (_, Token::Ident("object")),
            (_, Token::Punct(".")),
            (_, Token::Ident("spec")),
            (close, Token::Punct(")")),
        ] => Some(*close),
        _ => None,
    }
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
    Err(Unsupported::UnterminatedString)
}

#[cfg(test)]
mod tests;
