//! The crate's modules depend on each other in one direction only: no import cycles.
//!
//! Reads `src/**/*.rs` (comments and string literals skipped), takes every `crate::<module>`
//! path (and `super::<sibling>` inside a split module) as an edge, and fails on any cycle,
//! printing it. Nodes are the top-level modules, except the modules split by job (`gang`,
//! `cluster`), whose submodules are nodes of their own. A test module inside a file counts as
//! that file's dependency: a test should not need a module that needs the one it tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules whose submodules are nodes of their own.
const SPLIT: &[&str] = &["gang", "cluster"];

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

/// The node a file belongs to: `src/engine.rs` → `engine`, `src/server/tls.rs` → `server`,
/// `src/gang/fit.rs` → `gang::fit`, `src/gang/mod.rs` → `gang`. `None` for the crate roots.
fn node_of(relative: &Path) -> Option<String> {
    let parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    match parts.as_slice() {
        [root] if root == "lib" || root == "main" => None,
        [module] => Some(module.clone()),
        [module, sub, ..] if SPLIT.contains(&module.as_str()) && sub != "mod" => Some(format!("{module}::{sub}")),
        [module, ..] => Some(module.clone()),
        [] => None,
    }
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

/// The identifiers a path continues with after `prefix::`: one for `crate::engine::X`, several
/// for `crate::{engine, policy::X}`.
fn heads(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let needle = format!("{prefix}::");
    let mut from = 0;
    while let Some(at) = code[from..].find(&needle) {
        let start = from + at;
        from = start + needle.len();
        if is_ident(code[..start].chars().last().as_ref()) {
            continue; // `my_crate::` or `self.crate::`
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                out.push(segments(item.trim()));
            }
        } else {
            out.push(segments(rest));
        }
    }
    out
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

fn target(path: &[String], nodes: &BTreeSet<String>) -> Option<String> {
    let first = path.first()?;
    if SPLIT.contains(&first.as_str())
        && let Some(sub) = path.get(1)
        && nodes.contains(&format!("{first}::{sub}"))
    {
        return Some(format!("{first}::{sub}"));
    }
    nodes.contains(first).then(|| first.clone())
}

/// node → the nodes it uses, with one file and path that shows each edge.
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let located: Vec<(PathBuf, String)> = files
        .into_iter()
        .filter_map(|f| {
            let relative = f.strip_prefix(&src).unwrap().to_path_buf();
            node_of(&relative).map(|n| (relative, n))
        })
        .collect();
    let nodes: BTreeSet<String> = located.iter().map(|(_, n)| n.clone()).collect();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> =
        nodes.iter().map(|n| (n.clone(), BTreeMap::new())).collect();
    for (relative, node) in &located {
        let code = code_only(&std::fs::read_to_string(src.join(relative)).unwrap());
        let mut paths = heads(&code, "crate");
        // Inside a split module, `super::sibling` is an edge too.
        if let Some((module, _)) = node.split_once("::") {
            paths.extend(heads(&code, "super").into_iter().map(|p| [vec![module.to_string()], p].concat()));
        }
        for path in paths {
            if let Some(to) = target(&path, &nodes).filter(|to| to != node) {
                edges
                    .get_mut(node)
                    .unwrap()
                    .entry(to)
                    .or_insert_with(|| format!("{}: crate::{}", relative.display(), path.join("::")));
            }
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

/// The reader itself: a cycle written in a fixture is found and printed, a path in a comment or
/// string is not an edge, and grouped imports count.
#[test]
fn the_reader_finds_edges_and_cycles() {
    let code = code_only(
        "use crate::{engine::Request, policy};\n// crate::server\nlet s = \"crate::quota\";\nlet c = '\"'; crate::files::x();",
    );
    let nodes: BTreeSet<String> = ["engine", "policy", "server", "quota", "files"].map(String::from).into();
    let found: BTreeSet<String> = heads(&code, "crate").iter().filter_map(|p| target(p, &nodes)).collect();
    assert_eq!(found, ["engine", "files", "policy"].map(String::from).into());

    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "d2")] {
        edges.entry(from.into()).or_default().insert(to.into(), String::new());
        edges.entry(to.into()).or_default();
    }
    assert_eq!(cycles(&edges), vec![vec!["a", "b", "c", "a"]]);
    edges.get_mut("c").unwrap().remove("a");
    assert!(cycles(&edges).is_empty());
}

/// The split modules' files are nodes of their own; crate roots are not nodes.
#[test]
fn nodes_follow_the_file_layout() {
    assert_eq!(node_of(Path::new("engine.rs")).as_deref(), Some("engine"));
    assert_eq!(node_of(Path::new("server/tls.rs")).as_deref(), Some("server"));
    assert_eq!(node_of(Path::new("gang/fit.rs")).as_deref(), Some("gang::fit"));
    assert_eq!(node_of(Path::new("gang/mod.rs")).as_deref(), Some("gang"));
    assert_eq!(node_of(Path::new("lib.rs")), None);
}
