//! The crate is laid out by its flow, in five layers that each import only those before them:
//! `model` → `admission` → `control` → `server` → `cli`. And no two modules import each other,
//! directly or around a loop.
//!
//! Reads `src/**/*.rs` (comments and string literals skipped) and takes every `crate::…`,
//! `super::…` and `self::…` path as an edge from the file's module (with the inline `mod x { … }`
//! blocks it sits in) to the module the path names. Nodes are the modules three levels deep
//! (`control::gang::plan`; a layer's own `mod.rs` is the node `control`), and whatever lies deeper
//! belongs to its ancestor at that depth. A test module inside a file counts as that file's
//! dependency: a test should not need a module that needs the one it tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first: a module may import its own layer and those before it.
const LAYERS: &[&str] = &["model", "admission", "control", "server", "cli"];

/// How many path segments name a node.
const NODE_DEPTH: usize = 3;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file is: `admission/engine.rs` → [admission, engine], `control/gang/mod.rs` →
/// [control, gang]. `None` for the crate roots.
fn module_of(relative: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> =
        relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    match parts.as_slice() {
        [] => None,
        [root] if root == "lib" || root == "main" => None,
        _ => Some(parts),
    }
}

/// The node a module belongs to: its first [`NODE_DEPTH`] segments.
fn node_of(module: &[String]) -> String {
    module[..module.len().min(NODE_DEPTH)].join("::")
}

/// The layer a node is in, as an index into [`LAYERS`]; `None` for a module outside them.
fn layer_of(node: &str) -> Option<usize> {
    let first = node.split("::").next()?;
    LAYERS.iter().position(|l| *l == first)
}

/// The code of a file without comments, string and char literals (a path in a doc comment or
/// a message is not a dependency).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !is_ident(chars.get(i.wrapping_sub(1))) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{1F600}'); otherwise a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// One path in a file: the inline modules it sits in, its root (`crate`, `super`, `self`) and
/// what follows (one entry per item of a `{…}` group).
#[derive(Debug, PartialEq)]
struct UsedPath {
    inline: Vec<String>,
    root: String,
    segments: Vec<String>,
}

/// Every `crate::`, `super::` and `self::` path in `code` (already [`code_only`]), with the
/// inline `mod name { … }` blocks around it.
fn used_paths(code: &str) -> Vec<UsedPath> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    // (module name, brace depth inside it) of the inline modules open here.
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_mod: Option<String> = None;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        let at_word = !is_ident(code[..i].chars().last().as_ref());
        if c == '{' {
            depth += 1;
            if let Some(name) = pending_mod.take() {
                open.push((name, depth));
            }
        } else if c == '}' {
            if open.last().is_some_and(|(_, d)| *d == depth) {
                open.pop();
            }
            depth = depth.saturating_sub(1);
        } else if c == ';' {
            pending_mod = None;
        } else if at_word && code[i..].starts_with("mod ") {
            let name: String =
                code[i + 4..].trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            pending_mod = Some(name);
        } else if at_word
            && let Some(root) = ["crate::", "super::", "self::"].iter().find(|r| code[i..].starts_with(**r))
        {
            let inline: Vec<String> = open.iter().map(|(n, _)| n.clone()).collect();
            let rest = &code[i + root.len()..];
            let root = root.trim_end_matches("::").to_string();
            let mut push =
                |segments: Vec<String>| out.push(UsedPath { inline: inline.clone(), root: root.clone(), segments });
            match rest.strip_prefix('{') {
                Some(group) => {
                    let end = group.find('}').unwrap_or(group.len());
                    group[..end].split(',').map(|item| segments(item.trim())).for_each(&mut push);
                }
                None => push(segments(rest)),
            }
            // Skip the path itself, so that `super::super::x` is one path.
            let skipped = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').count();
            i += root.len() + 2 + skipped;
            continue;
        }
        i += c.len_utf8().max(1);
        while i < bytes.len() && !code.is_char_boundary(i) {
            i += 1;
        }
    }
    out
}

/// The module `path`, used in `module`, names: the longest known module its resolved segments
/// start with (`crate::admission::engine::Engine` → [admission, engine]).
fn resolve(module: &[String], path: &UsedPath, known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut full: Vec<String> = match path.root.as_str() {
        "crate" => Vec::new(),
        _ => [module, &path.inline[..]].concat(),
    };
    let mut segments = path.segments.as_slice();
    if path.root == "super" {
        full.pop()?;
    }
    while let Some((first, rest)) = segments.split_first()
        && first == "super"
    {
        full.pop()?;
        segments = rest;
    }
    full.extend(segments.iter().cloned());
    (1..=full.len()).rev().map(|n| full[..n].to_vec()).find(|prefix| known.contains(prefix))
}

/// `engine::Request<'_>` → [`engine`, `Request`].
fn segments(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = path;
    loop {
        let ident: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if ident.is_empty() {
            break;
        }
        rest = &rest[ident.len()..];
        out.push(ident);
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// node → the nodes it uses, with one file and path that shows each edge.
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let located: Vec<(PathBuf, Vec<String>)> = files
        .into_iter()
        .filter_map(|f| {
            let relative = f.strip_prefix(&src).unwrap().to_path_buf();
            module_of(&relative).map(|m| (relative, m))
        })
        .collect();
    let known: BTreeSet<Vec<String>> =
        located.iter().flat_map(|(_, m)| (1..=m.len()).map(|n| m[..n].to_vec())).collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> =
        located.iter().map(|(_, m)| (node_of(m), BTreeMap::new())).collect();
    for (relative, module) in &located {
        let node = node_of(module);
        let code = code_only(&std::fs::read_to_string(src.join(relative)).unwrap());
        for path in used_paths(&code) {
            let Some(to) = resolve(module, &path, &known).map(|m| node_of(&m)).filter(|to| *to != node) else {
                continue;
            };
            // A module's use of its own ancestors' re-exports (`super::Item` in `gang/plan.rs`)
            // is no edge of the graph's: an ancestor is the folder the module lives in.
            if node.starts_with(&format!("{to}::")) && path.root != "crate" {
                continue;
            }
            edges
                .get_mut(&node)
                .unwrap()
                .entry(to)
                .or_insert_with(|| format!("{}: {}::{}", relative.display(), path.root, path.segments.join("::")));
        }
    }
    edges
}

/// Every cycle, found as the strongly connected components with more than one node (Tarjan),
/// each shown as one concrete loop through it.
fn cycles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        edges: &'g BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        components: Vec<Vec<&'g str>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                self.components.push(component);
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|component| {
            // Walk from the first node, staying inside the component, until a node repeats.
            let inside: BTreeSet<&str> = component.iter().copied().collect();
            let start = *inside.iter().next().unwrap();
            let mut path = vec![start.to_string()];
            let mut seen = BTreeSet::from([start]);
            let mut at = start;
            loop {
                let next = edges[at].keys().map(String::as_str).find(|w| inside.contains(w)).unwrap();
                path.push(next.to_string());
                if !seen.insert(next) {
                    let from = path.iter().position(|p| p == next).unwrap();
                    break path[from..].to_vec();
                }
                at = next;
            }
        })
        .collect()
}

#[test]
fn modules_have_no_import_cycles() {
    let edges = graph();
    let found = cycles(&edges);
    let shown: Vec<String> = found
        .iter()
        .map(|cycle| {
            let steps: Vec<String> =
                cycle.windows(2).map(|w| format!("  {} -> {}  ({})", w[0], w[1], edges[&w[0]][&w[1]])).collect();
            format!("{}\n{}", cycle.join(" -> "), steps.join("\n"))
        })
        .collect();
    assert!(found.is_empty(), "import cycles between modules:\n{}", shown.join("\n\n"));
}

/// Every module is in a layer, and imports only its own layer and those before it.
#[test]
fn layers_import_only_those_below_them() {
    let edges = graph();
    let outside: Vec<&String> = edges.keys().filter(|n| layer_of(n).is_none()).collect();
    assert!(outside.is_empty(), "modules outside the layers {LAYERS:?}: {outside:?}");
    let upward: Vec<String> = edges
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |(to, shown)| (from, to, shown)))
        .filter(|(from, to, _)| layer_of(to) > layer_of(from))
        .map(|(from, to, shown)| format!("  {from} -> {to}  ({shown})"))
        .collect();
    assert!(upward.is_empty(), "imports against the layer order {LAYERS:?}:\n{}", upward.join("\n"));
    // The graph is read at all: the layers' known edges are there.
    assert!(edges["admission::engine"].contains_key("model::policy"));
    assert!(edges["cli"].keys().any(|n| n.starts_with("server")));
}

/// The reader itself: grouped imports count, a path in a comment or string is not an edge,
/// `super::` resolves from the inline module it is written in, and a cycle is found and printed.
#[test]
fn the_reader_finds_edges_and_cycles() {
    let code = code_only(
        "use crate::{engine::Request, policy};\n// crate::server\nlet s = \"crate::quota\";\nlet c = '\"'; crate::files::x();\n\
         mod tests { use super::super::sibling::Thing; mod deeper { fn f() { self::g(); } } }\nuse super::other;",
    );
    let found: Vec<(Vec<String>, String, Vec<String>)> =
        used_paths(&code).into_iter().map(|p| (p.inline, p.root, p.segments)).collect();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![
            (vec![], "crate".into(), strings(&["engine", "Request"])),
            (vec![], "crate".into(), strings(&["policy"])),
            (vec![], "crate".into(), strings(&["files", "x"])),
            (strings(&["tests"]), "super".into(), strings(&["super", "sibling", "Thing"])),
            (strings(&["tests", "deeper"]), "self".into(), strings(&["g"])),
            (vec![], "super".into(), strings(&["other"])),
        ]
    );
    let known: BTreeSet<Vec<String>> =
        [vec!["a"], vec!["a", "sibling"], vec!["a", "file"]].iter().map(|m| strings(m)).collect();
    let module = strings(&["a", "file"]);
    let in_tests = UsedPath {
        inline: strings(&["tests"]),
        root: "super".into(),
        segments: strings(&["super", "sibling", "Thing"]),
    };
    assert_eq!(resolve(&module, &in_tests, &known), Some(strings(&["a", "sibling"])));
    let at_top = UsedPath { inline: vec![], root: "super".into(), segments: strings(&["sibling"]) };
    assert_eq!(resolve(&module, &at_top, &known), Some(strings(&["a", "sibling"])));

    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "d2")] {
        edges.entry(from.into()).or_default().insert(to.into(), String::new());
        edges.entry(to.into()).or_default();
    }
    assert_eq!(cycles(&edges), vec![vec!["a", "b", "c", "a"]]);
    edges.get_mut("c").unwrap().remove("a");
    assert!(cycles(&edges).is_empty());
}

/// Nodes are modules three levels deep; crate roots are no modules.
#[test]
fn nodes_follow_the_file_layout() {
    let node = |p: &str| module_of(Path::new(p)).map(|m| node_of(&m));
    assert_eq!(node("admission/engine.rs").as_deref(), Some("admission::engine"));
    assert_eq!(node("server/mod.rs").as_deref(), Some("server"));
    assert_eq!(node("control/gang/plan.rs").as_deref(), Some("control::gang::plan"));
    assert_eq!(node("control/gang/decision/preemption/search.rs").as_deref(), Some("control::gang::decision"));
    assert_eq!(node("lib.rs"), None);
    assert_eq!(layer_of("control::gang::plan"), Some(2));
    assert_eq!(layer_of("engine"), None);
}
