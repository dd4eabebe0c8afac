//! The documentation's links hold: every relative link in the book (`docs/src/`), README.md and
//! the other Markdown files of the repository goes to a file that exists and, when it names a
//! section of a Markdown file, to a heading that file has; and every page of the book is listed
//! in its SUMMARY.md. mdBook checks neither (it builds a page with a dead link or anchor without
//! a word), so this is what makes a renamed or moved section fail CI.
//!
//! Section anchors are made as mdBook 0.5 and GitHub make them from a heading's text: lowercased,
//! each space a `-`, letters, digits, `-` and `_` kept, everything else dropped (so
//! "`Cluster` (at most one)" is `#cluster-at-most-one`), and a repeated heading gets `-1`, `-2`…
//! Explicit `<a id="…">` / `<a name="…">` anchors count too. Links to other sites are not
//! fetched. Std only: the checker is a few small scanners over the text, not a Markdown parser;
//! fenced code blocks and inline code spans are skipped, as Markdown does not link inside them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Directories never searched for Markdown: build output, tool caches, fuzzing data.
const SKIPPED_DIRECTORIES: &[&str] = &["target", ".git", "node_modules", "corpus", "artifacts"];

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One relative link: where it is written, and what it names.
#[derive(Debug)]
struct Link {
    line: usize,
    target: String,
}

/// What the checker reads from one Markdown file.
#[derive(Debug, Default)]
struct Document {
    anchors: BTreeSet<String>,
    links: Vec<Link>,
}

/// Every `.md` file under `dir`, in path order.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if !SKIPPED_DIRECTORIES.contains(&name) {
                found.extend(markdown_files(&path));
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
    found
}

/// The opening of a code fence (```` ``` ```` or `~~~`, three or more), indented or not.
fn fence_opening(line: &str) -> Option<(char, usize)> {
    let trimmed = line.trim_start();
    let first = trimmed.chars().next()?;
    if first != '`' && first != '~' {
        return None;
    }
    let run = trimmed.chars().take_while(|&c| c == first).count();
    (run >= 3).then_some((first, run))
}

/// The lines of `text`, with the lines of fenced code blocks (fences included) made empty.
fn without_code_blocks(text: &str) -> Vec<&str> {
    let mut open: Option<(char, usize)> = None;
    text.lines()
        .map(|line| match open {
            None => {
                if let Some(fence) = fence_opening(line) {
                    open = Some(fence);
                    ""
                } else {
                    line
                }
            }
            Some((c, n)) => {
                let trimmed = line.trim();
                if trimmed.len() >= n && trimmed.chars().all(|x| x == c) {
                    open = None;
                }
                ""
            }
        })
        .collect()
}

/// `text` with the inside of every inline code span made spaces (line breaks kept, so line
/// numbers hold). A span may run over a line break but not over a blank line; an unclosed run
/// of backticks is plain text.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        let start = i + run;
        let mut j = start;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' && chars[j + 1..].iter().take_while(|c| **c != '\n').all(|c| c.is_whitespace()) {
                break; // a blank line ends the paragraph
            }
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|&&c| c == '`').count();
                if other == run {
                    close = Some(j);
                    break;
                }
                j += other;
                continue;
            }
            j += 1;
        }
        match close {
            Some(end) => {
                for c in &mut out[start..end] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = end + run;
            }
            None => i = start,
        }
    }
    out.into_iter().collect()
}

/// A heading's text as it reads on the page: links become their text, code its content, HTML
/// tags and a closing `#` sequence go.
fn heading_text(raw: &str) -> String {
    let raw = raw.trim().trim_end_matches('#').trim_end();
    let mut text = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' => {
                for c in chars.by_ref() {
                    if c == '>' {
                        break;
                    }
                }
            }
            ']' if chars.peek() == Some(&'(') => {
                for c in chars.by_ref() {
                    if c == ')' {
                        break;
                    }
                }
            }
            '[' | '`' => {}
            _ => text.push(c),
        }
    }
    text
}

/// The anchor mdBook 0.5 (`id_from_content`) and GitHub give a heading.
fn anchor_of(heading: &str) -> String {
    heading_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c)
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// `<a id="x">` and `<a name="x">` anchors on a line.
fn explicit_anchors(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for tag in line.split("<a ").skip(1) {
        let tag = tag.split('>').next().unwrap_or_default();
        for attribute in ["id=\"", "name=\""] {
            if let Some(at) = tag.find(attribute) {
                let value = &tag[at + attribute.len()..];
                if let Some(end) = value.find('"') {
                    found.push(value[..end].to_string());
                }
            }
        }
    }
    found
}

/// The targets of inline links and images (`[text](target "title")`) and of reference
/// definitions (`[name]: target`) in `text`, which has no code left in it.
fn link_targets(text: &str) -> Vec<Link> {
    let mut links = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix('[')
            && let Some((label, definition)) = rest.split_once("]:")
            && !label.is_empty()
            && !label.contains('[')
            && let Some(target) = definition.split_whitespace().next()
        {
            let target = target.trim_start_matches('<').trim_end_matches('>');
            links.push(Link { line: number + 1, target: target.to_string() });
        }
    }
    let mut line = 1;
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        line += rest[..at].matches('\n').count();
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = i;
                    break;
                }
                ')' => depth -= 1,
                '\n' => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        let inside = after[..end].trim();
        let target = if let Some(bracketed) = inside.strip_prefix('<') {
            bracketed.split('>').next().unwrap_or_default()
        } else {
            inside.split_whitespace().next().unwrap_or_default()
        };
        links.push(Link { line, target: target.to_string() });
        rest = &after[end..];
    }
    links
}

fn read_document(text: &str) -> Document {
    let lines = without_code_blocks(text);
    let mut used = BTreeSet::new();
    let mut anchors = BTreeSet::new();
    for line in &lines {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        let is_heading = (1..=6).contains(&level)
            && line.len() - trimmed.len() <= 3
            && trimmed[level..].chars().next().is_none_or(|c| c == ' ' || c == '\t');
        if is_heading {
            let id = anchor_of(&trimmed[level..]);
            let mut unique = id.clone();
            let mut counter = 1;
            while !used.insert(unique.clone()) {
                unique = format!("{id}-{counter}");
                counter += 1;
            }
            anchors.insert(unique);
        }
        anchors.extend(explicit_anchors(line));
    }
    let prose = without_code_spans(&lines.join("\n"));
    Document { anchors, links: link_targets(&prose) }
}

/// `%XX` escapes decoded (GitHub writes non-ASCII anchors and spaces that way).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape =
            bytes.get(i + 1..i + 3).and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match escape {
            Some(byte) if bytes[i] == b'%' => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `path` with `.` and `..` resolved without touching the file system.
fn normalized(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether `target` names another site (`https:`, `mailto:` …), which is not checked.
fn is_external(target: &str) -> bool {
    let mut chars = target.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && target
            .split_once(':')
            .is_some_and(|(scheme, _)| scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c)))
}

/// Every broken link among `files` (paths under `root`), as `file:line: link `target`: why`.
/// Anchors of files outside `files` are read when a link names one.
fn broken_links(root: &Path, files: &[PathBuf]) -> (Vec<String>, usize) {
    fn read(path: &Path, documents: &mut BTreeMap<PathBuf, Document>) {
        if !documents.contains_key(path) {
            let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            documents.insert(path.to_path_buf(), read_document(&text));
        }
    }
    let mut documents: BTreeMap<PathBuf, Document> = BTreeMap::new();
    for file in files {
        read(file, &mut documents);
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in files {
        let links: Vec<(usize, String)> =
            documents[file].links.iter().map(|link| (link.line, link.target.clone())).collect();
        let shown = file.strip_prefix(root).unwrap_or(file).display().to_string();
        for (line, target) in links {
            if target.is_empty() {
                problems.push(format!("{shown}:{line}: an empty link"));
                continue;
            }
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            if path.starts_with('/') {
                problems.push(format!(
                    "{shown}:{line}: link `{target}`: absolute paths mean one thing on GitHub and another in the book; write it relative to this file"
                ));
                continue;
            }
            let destination = if path.is_empty() {
                file.clone()
            } else {
                normalized(&file.parent().expect("a file's directory").join(percent_decoded(path)))
            };
            if !destination.exists() {
                problems.push(format!("{shown}:{line}: link `{target}`: no file {}", destination.display()));
                continue;
            }
            let is_markdown = destination.extension().is_some_and(|e| e == "md");
            if fragment.is_empty() || !is_markdown {
                continue;
            }
            read(&destination, &mut documents);
            let anchor = percent_decoded(fragment);
            if !documents[&destination].anchors.contains(&anchor) {
                let near: Vec<&String> = documents[&destination]
                    .anchors
                    .iter()
                    .filter(|a| a.contains(&anchor) || anchor.contains(a.as_str()))
                    .take(3)
                    .collect();
                problems.push(format!(
                    "{shown}:{line}: link `{target}`: {} has no section `#{anchor}`{}",
                    destination.strip_prefix(root).unwrap_or(&destination).display(),
                    if near.is_empty() { String::new() } else { format!(" (similar: {near:?})") }
                ));
            }
        }
    }
    (problems, checked)
}

/// The book's pages (`docs/src/**/*.md` but SUMMARY.md) that SUMMARY.md does not link to.
fn pages_missing_from_summary(book_src: &Path) -> Vec<String> {
    let summary = book_src.join("SUMMARY.md");
    let text = fs::read_to_string(&summary).unwrap_or_else(|e| panic!("cannot read {}: {e}", summary.display()));
    let listed: BTreeSet<PathBuf> = read_document(&text)
        .links
        .iter()
        .map(|link| normalized(&book_src.join(link.target.split('#').next().unwrap_or_default())))
        .collect();
    markdown_files(book_src)
        .into_iter()
        .filter(|page| *page != summary && !listed.contains(&normalized(page)))
        .map(|page| page.strip_prefix(book_src).unwrap_or(&page).display().to_string())
        .collect()
}

#[test]
fn every_link_in_the_documentation_resolves() {
    let root = repository();
    let files = markdown_files(&root);
    let book: Vec<_> = files.iter().filter(|f| f.starts_with(root.join("docs/src"))).collect();
    assert!(book.len() >= 10, "the book's pages were not found under docs/src: {book:?}");
    for required in ["README.md", "deploy/README.md", "benches/README.md", "fuzz/README.md"] {
        assert!(files.contains(&root.join(required)), "{required} is not among the files checked");
    }
    let (problems, checked) = broken_links(&root, &files);
    println!("{} Markdown files, {checked} relative links checked", files.len());
    assert!(checked >= 100, "only {checked} relative links found: is the link scanner broken?");
    assert!(problems.is_empty(), "{} broken link(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let missing = pages_missing_from_summary(&repository().join("docs/src"));
    assert!(missing.is_empty(), "pages not listed in docs/src/SUMMARY.md (mdBook would leave them out): {missing:?}");
}

/// Issue 44: the README is a front door; what does not fit belongs in the book.
#[test]
fn the_readme_is_a_front_door() {
    let readme = fs::read_to_string(repository().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines, over 300: move the detail into a page of docs/src/");
}

/// The lines of the first fenced block after the heading `heading` in `text`.
fn first_block_after(text: &str, heading: &str) -> Vec<String> {
    let mut lines =
        text.lines().skip_while(|line| line.trim() != heading).skip_while(|line| fence_opening(line).is_none());
    lines.next();
    lines.take_while(|line| fence_opening(line).is_none()).map(String::from).collect()
}

/// The README and the book's first page show the same two commands, and `.ci/run` is the second.
#[test]
fn the_readme_and_the_book_give_the_same_two_commands() {
    let root = repository();
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    let book = fs::read_to_string(root.join("docs/src/introduction.md")).expect("docs/src/introduction.md");
    let commands = first_block_after(&readme, "## The two commands");
    assert!(commands.iter().any(|line| line == ".ci/run"), "README.md's two commands: {commands:#?}");
    assert_eq!(commands, first_block_after(&book, "## The two commands"));
}

#[test]
fn anchors_are_made_as_mdbook_and_github_make_them() {
    let doc = read_document(
        "# Allot\n## `Cluster` (at most one)\n### Allot's identity\n## Native admission policies (`allot compile`)\n\
         ## Why is my pod waiting? `allot explain`\n## Metrics\n## Metrics\n## Metrics\n\
         ## A [linked](x.md) heading ##\n```sh\n# not a heading\n```\n  ### indented, still one\n\
         #hashtag is no heading\n<a id=\"explicit\"></a>\n",
    );
    let expected: BTreeSet<String> = [
        "allot",
        "cluster-at-most-one",
        "allots-identity",
        "native-admission-policies-allot-compile",
        "why-is-my-pod-waiting-allot-explain",
        "metrics",
        "metrics-1",
        "metrics-2",
        "a-linked-heading",
        "indented-still-one",
        "explicit",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(doc.anchors, expected);
}

#[test]
fn links_in_code_are_not_links() {
    let doc = read_document(
        "[a](one.md) and `[b](two.md)` and ``x `[c](three.md)` y``\n\n```md\n[d](four.md)\n```\n\
         [e](<five.md> \"title\") ![f](six.png) [g](seven.md#part (1))\n[ref]: eight.md#x\n\
         a `span that runs\nover a line [h](nine.md)` ends\n",
    );
    let targets: Vec<&str> = doc.links.iter().map(|l| l.target.as_str()).collect();
    assert_eq!(targets, ["eight.md#x", "one.md", "five.md", "six.png", "seven.md#part"]);
    assert_eq!(doc.links.iter().map(|l| l.line).collect::<Vec<_>>(), [7, 1, 6, 6, 6]);
}

/// The checker itself fails on what it exists to catch: a missing file, a missing section, a
/// page left out of SUMMARY.md; and passes the same files once they are right.
#[test]
fn the_checker_reports_broken_links_and_unlisted_pages() {
    let root = std::env::temp_dir().join(format!("allot-docs-test-{}", std::process::id()));
    let src = root.join("docs/src");
    fs::create_dir_all(&src).unwrap();
    let write = |path: &Path, text: &str| fs::write(path, text).unwrap();
    write(&root.join("README.md"), "# R\n[ok](docs/src/a.md#a-section) [gone](docs/src/a.md#renamed)\n");
    write(&src.join("SUMMARY.md"), "# Summary\n- [A](a.md)\n");
    write(&src.join("a.md"), "# A\n## A section\n[self](#a-section) [missing](b.md) [up](../../README.md#r)\n");
    write(&src.join("c.md"), "# C, not in the summary\n");
    let files = markdown_files(&root);
    let (problems, checked) = broken_links(&root, &files);
    assert_eq!(checked, 6);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].starts_with("README.md:2: link `docs/src/a.md#renamed`: docs/src/a.md has no section `#renamed`")
    );
    assert!(problems[1].starts_with("docs/src/a.md:3: link `b.md`: no file"));
    assert_eq!(pages_missing_from_summary(&src), ["c.md"]);

    write(&root.join("README.md"), "# R\n[ok](docs/src/a.md#a-section)\n");
    write(&src.join("a.md"), "# A\n## A section\n[self](#a-section) [up](../../README.md#r)\n");
    write(&src.join("SUMMARY.md"), "# Summary\n- [A](a.md)\n- [C](c.md)\n");
    assert_eq!(broken_links(&root, &markdown_files(&root)).0, Vec::<String>::new());
    assert!(pages_missing_from_summary(&src).is_empty());
    fs::remove_dir_all(&root).unwrap();
}
