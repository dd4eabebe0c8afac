//! How deep an expression may nest, and the stack the parser and the evaluator get.
//!
//! cel 0.13's parser and evaluator recurse once per level of nesting, with large frames, so an
//! expression nested deep enough overflows a thread's stack: an abort that no panic boundary
//! contains. Measured 2026-11-23 on the project's 2-vCPU VM (each construct nested n deep,
//! compiled and evaluated in a child process on a 2 MiB thread, n bisected to the first
//! overflow), before this module: in a debug build, parsing overflowed at 12 nested
//! parentheses (about 170 KiB of stack per level: antlr4rust's prediction recurses too) and
//! evaluating at trees 54 to 58 levels deep, whatever the construct (about 37 KiB per level).
//! Allot runs CEL on 2 MiB threads (tokio workers and the blocking pool: policy reloads and
//! evaluations) as well as on the CLI's main thread (8 MiB).
//!
//! Three guards:
//! - [`scan`], before the parser sees the text: an upper bound of the nesting, counted on the
//!   text (brackets, `? :`, chains of operators and selections), refused beyond
//!   [`MAX_NESTING`] with its column. It also keeps every accepted expression far below cel's
//!   own recursion limit (96), whose handling underflows a counter and panics
//!   (fuzz/regressions/cel_expression/parser-depth-underflow).
//! - [`on_parser_stack`]: the parser and the load-time walks run on a stack of their own,
//!   [`PARSER_STACK`], large enough for anything cel's limit lets through, so an expression the
//!   text scan misjudges can at worst reach cel's limit (an error, or its panic, contained).
//! - [`tree_depth`], after parsing: the exact depth of the tree the evaluator will walk,
//!   refused beyond [`MAX_TREE_DEPTH`]; evaluation runs with at least
//!   [`evaluation_stack`] bytes of stack for that depth (on a stack of its own when the thread
//!   has less left).

use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};

/// The largest nesting [`scan`] accepts: far below cel's parser limit (96), far above what
/// policies need (the shipped ones scan at most 17, their trees 12 deep:
/// `the_shipped_policies_nest_far_below_the_limits` in tests/cel_depth.rs).
pub const MAX_NESTING: usize = 64;

/// The deepest tree (after Allot's rewriting, see [`super::budget::instrument`]) a rule may
/// evaluate.
pub const MAX_TREE_DEPTH: usize = 160;

/// Stack for parsing one expression and walking its tree at load: cel's parser stops at 96
/// nested levels, which take about 16 MiB in a debug build; chains of operators cost less per
/// level and are bounded by [`MAX_NESTING`] (virtual memory: only the pages used are touched).
pub const PARSER_STACK: usize = 64 << 20;

/// Stack one level of the evaluated tree may use, with a margin (measured: about 37 KiB in a
/// debug build; optimised frames are smaller). With it, trees up to about 25 deep (the shipped
/// policies' are at most 12) evaluate in place on a 2 MiB thread; deeper ones get a stack of
/// their own, an `mmap` per evaluation.
const EVALUATION_STACK_PER_LEVEL: usize = 64 << 10;

/// What every evaluation has besides its levels (bindings, the interpreter's own frames).
const EVALUATION_STACK_BASE: usize = 256 << 10;

/// The stack an evaluation of a tree `depth` levels deep needs.
pub fn evaluation_stack(depth: usize) -> usize {
    EVALUATION_STACK_BASE + depth.saturating_mul(EVALUATION_STACK_PER_LEVEL)
}

/// Runs `evaluate` (of a tree `depth` deep) with enough stack: in place when the thread has it,
/// else on a new stack.
pub fn with_evaluation_stack<T>(depth: usize, evaluate: impl FnOnce() -> T) -> T {
    let needed = evaluation_stack(depth);
    stacker::maybe_grow(needed, needed.max(1 << 20), evaluate)
}

/// Stack one level of a direct evaluation may use ([`super::direct`]: one small frame per
/// level, about 1 KiB in a debug build), with a margin.
const DIRECT_STACK_PER_LEVEL: usize = 4 << 10;

/// Runs a direct evaluation of a tree `depth` deep with enough stack (see
/// [`with_evaluation_stack`]).
pub fn with_direct_stack<T>(depth: usize, evaluate: impl FnOnce() -> T) -> T {
    let needed = (64 << 10) + depth.saturating_mul(DIRECT_STACK_PER_LEVEL);
    stacker::maybe_grow(needed, needed.max(1 << 20), evaluate)
}

/// Runs `parse` on a stack of [`PARSER_STACK`] bytes.
pub fn on_parser_stack<T>(parse: impl FnOnce() -> T) -> T {
    stacker::grow(PARSER_STACK, parse)
}

/// The deepest point [`scan`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nesting {
    /// Levels, counted as [`scan`] says.
    pub depth: usize,
    /// 1-based column (in characters) of the bracket that opens the deepest part, or 1.
    pub column: usize,
}

/// One open bracket (or the whole expression) while scanning.
#[derive(Debug, Clone, Copy)]
struct Group {
    /// Column of the opening bracket (1 for the whole expression).
    column: usize,
    /// `?` seen in this group: each nests the rest (`a ? b : c ? d : e`).
    questions: usize,
    /// `&&` and `||` seen: cel builds a balanced tree of them, log2 deep.
    logic: usize,
    /// Operators and selections in the current operand (between `,` `?` `:` `&&` `||`): cel
    /// nests each left-associative chain one level per operator.
    chain: usize,
    /// The deepest group closed in the current operand, with its column.
    inner: Nesting,
    /// The deepest finished operand of this group.
    deepest: Nesting,
}

impl Group {
    fn new(column: usize) -> Group {
        let none = Nesting { depth: 0, column };
        Group { column, questions: 0, logic: 0, chain: 0, inner: none, deepest: none }
    }

    /// Ends the current operand.
    fn end_operand(&mut self) {
        let operand = Nesting { depth: self.chain + self.inner.depth, column: self.inner.column };
        if operand.depth > self.deepest.depth {
            self.deepest = operand;
        }
        self.chain = 0;
        self.inner = Nesting { depth: 0, column: self.column };
    }

    /// The group's nesting once it is closed.
    fn close(mut self) -> Nesting {
        self.end_operand();
        let logic_levels = (usize::BITS - self.logic.leading_zeros()) as usize;
        Nesting { depth: 1 + self.questions + logic_levels + self.deepest.depth, column: self.deepest.column }
    }
}

/// An upper bound of how deep cel's parser and evaluator nest for `source`, from the text
/// alone (no recursion, linear time): every bracket, `?`, `&&`/`||` (log2 of their number),
/// and every operator, `.` or `[` chained in one operand counts a level. String literals and
/// comments are skipped only when they are well-formed as cel's lexer reads them; a malformed
/// one is read as code (so its brackets count, as they do for cel's lexer after the error).
pub fn scan(source: &str) -> Nesting {
    let chars: Vec<char> = source.chars().collect();
    let mut groups: Vec<(char, Group)> = vec![(' ', Group::new(1))];
    // The last token ended an operand (a name, a literal, a closing bracket): a `[` after it
    // is an index (a chain), else a list.
    let mut after_operand = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let Some((_, group)) = groups.last_mut() else { break };
        let before_operand = after_operand;
        if let Some(end) = comment_end(&chars, i) {
            i = end;
            continue;
        }
        if let Some((end, well_formed)) = operand_at(&chars, i) {
            if chars[i..end] == ['i', 'n'] {
                group.chain += 1;
            }
            after_operand = well_formed;
            i = end;
            continue;
        }
        if !c.is_whitespace() {
            after_operand = matches!(c, ')' | ']' | '}');
        }
        match c {
            '(' | '[' | '{' => {
                if c == '[' && before_operand {
                    group.chain += 1; // an index chains like a selection
                }
                groups.push((c, Group::new(i + 1)));
            }
            ')' | ']' | '}' => {
                let opener = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                // A stray or mismatched closer is a syntax error; not closing anything keeps
                // the bound an upper bound.
                if groups.len() > 1 && groups.last().is_some_and(|(open, _)| *open == opener) {
                    close_group(&mut groups);
                }
            }
            ',' | ':' => group.end_operand(),
            '?' => {
                group.end_operand();
                group.questions += 1;
            }
            '&' | '|' if next == Some(c) => {
                group.end_operand();
                group.logic += 1;
                i += 2;
                continue;
            }
            '=' | '!' | '<' | '>' if next == Some('=') => {
                group.chain += 1;
                i += 2;
                continue;
            }
            // No cel token is a single `=`, `&` or `|`: the lexer fails on the next character
            // and drops it too.
            '=' | '&' | '|' => {
                i += 2;
                continue;
            }
            '.' | '+' | '-' | '*' | '/' | '%' | '<' | '>' | '!' => group.chain += 1,
            _ => {}
        }
        i += 1;
    }
    while groups.len() > 1 {
        close_group(&mut groups);
    }
    groups.pop().map_or(Nesting { depth: 0, column: 1 }, |(_, root)| root.close())
}

/// cel 0.13 reads an even run of `!`, or of unary `-`, as one (its parser drops the result it
/// computes for the doubled operator: `!!true` is `false`, `--1` is `-1`), so a rule written
/// `!!has(…)` would silently decide the opposite. Returns the operator and the 1-based column
/// of the first run of two or more (odd runs included: they are correct, but only by parity).
/// Strings and comments are skipped as [`scan`] skips them.
pub fn repeated_unary(source: &str) -> Option<(char, usize)> {
    let chars: Vec<char> = source.chars().collect();
    // The next character that is not whitespace or in a comment, from `from`.
    let significant = |mut from: usize| -> Option<usize> {
        while from < chars.len() {
            if let Some(end) = comment_end(&chars, from) {
                from = end;
            } else if chars[from].is_whitespace() {
                from += 1;
            } else {
                return Some(from);
            }
        }
        None
    };
    let mut after_operand = false;
    let mut i = 0;
    while let Some(at) = significant(i) {
        i = at;
        if let Some((end, well_formed)) = operand_at(&chars, i) {
            after_operand = well_formed;
            i = end;
            continue;
        }
        let next = chars.get(i + 1).copied();
        match chars[i] {
            '!' if next != Some('=') => {
                if significant(i + 1).is_some_and(|j| chars[j] == '!' && chars.get(j + 1) != Some(&'=')) {
                    return Some(('!', i + 1));
                }
                after_operand = false;
            }
            '-' if !after_operand => {
                if significant(i + 1).is_some_and(|j| chars[j] == '-') {
                    return Some(('-', i + 1));
                }
                after_operand = false;
            }
            ')' | ']' | '}' => after_operand = true,
            '!' | '=' | '<' | '>' if next == Some('=') => {
                after_operand = false;
                i += 2;
                continue;
            }
            // `&&`, `||`, or a lone `=`, `&`, `|` whose next character the lexer drops.
            '=' | '&' | '|' => {
                after_operand = false;
                i += 2;
                continue;
            }
            _ => after_operand = false,
        }
        i += 1;
    }
    None
}

/// Where a `//` comment starting at `i` ends (its newline, or the end), or `None`.
fn comment_end(chars: &[char], i: usize) -> Option<usize> {
    if chars.get(i) != Some(&'/') || chars.get(i + 1) != Some(&'/') {
        return None;
    }
    Some(chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n))
}

/// The operand token that starts at `i`, as cel's lexer reads it: a string or bytes literal
/// (prefixes `r`, `b`, `br` …), a quoted identifier, a name or a number. Returns where it ends
/// and whether it is well-formed. A malformed literal ends where cel's (ANTLR) lexer gives up
/// on it: the character it failed on is dropped with it (ANTLR's lexer recovery consumes it),
/// and the rest is read as code. `None`: no operand here.
fn operand_at(chars: &[char], i: usize) -> Option<(usize, bool)> {
    let c = *chars.get(i)?;
    let mut end = i;
    match c {
        '"' | '\'' | '`' => {
            let length =
                if c == '`' { quoted_identifier_length(&chars[i..]) } else { literal_length(&chars[i..], false) };
            Some(match length {
                Ok(length) => (i + length, true),
                Err(failed_at) => ((i + failed_at + 1).min(chars.len()), false),
            })
        }
        c if c.is_ascii_alphabetic() || c == '_' => {
            while end < chars.len() && (chars[end].is_ascii_alphanumeric() || chars[end] == '_') {
                end += 1;
            }
            let word: String = chars[i..end].iter().collect();
            let raw = matches!(word.as_str(), "r" | "R" | "br" | "bR" | "Br" | "BR");
            // A malformed literal after a prefix: the lexer backs up to the prefix (a name).
            if (raw || matches!(word.as_str(), "b" | "B"))
                && matches!(chars.get(end), Some('"' | '\''))
                && let Ok(length) = literal_length(&chars[end..], raw)
            {
                end += length;
            }
            Some((end, true))
        }
        c if c.is_ascii_digit() => {
            // Digits, letters (`0x1F`, `1e5`, `1u`) and a `.` between digits.
            while end < chars.len()
                && (chars[end].is_ascii_alphanumeric()
                    || (chars[end] == '.' && chars.get(end + 1).is_some_and(char::is_ascii_digit))
                    || (matches!(chars[end], '+' | '-') && matches!(chars[end - 1], 'e' | 'E')))
            {
                end += 1;
            }
            Some((end, true))
        }
        _ => None,
    }
}

/// Why [`repeated_unary`] refuses an expression.
pub fn repeated_unary_message(operator: char, column: usize) -> String {
    let (name, example) = if operator == '!' { ("`!`", "`!!x` as `!x`") } else { ("unary `-`", "`--x` as `-x`") };
    format!(
        "{name} twice in a row (column {column}): the CEL engine Allot runs (cel 0.13) evaluates {example}, so the \
         rule would decide the opposite of what it says; write the operand itself (or the operator once)"
    )
}

/// Closes the innermost group into its parent.
fn close_group(groups: &mut Vec<(char, Group)>) {
    if let Some((_, closed)) = groups.pop()
        && let Some((_, parent)) = groups.last_mut()
    {
        let own_column = closed.column;
        let mut nesting = closed.close();
        if nesting.depth == 1 {
            nesting.column = own_column;
        }
        if nesting.depth > parent.inner.depth {
            parent.inner = nesting;
        }
    }
}

/// The length of the string literal `text` starts with (at its quote), if it is well-formed
/// as cel's lexer reads it: `'…'`, `"…"` (no newline), `'''…'''`, `"""…"""`, with valid
/// escapes unless `raw`. Else the offset of the character the lexer fails on (`text.len()` at
/// the end of the text).
fn literal_length(text: &[char], raw: bool) -> Result<usize, usize> {
    let quote = *text.first().ok_or(0usize)?;
    let triple = text.len() >= 3 && text[1] == quote && text[2] == quote;
    if triple && let Ok(length) = literal_body(text, 3, quote, true, raw) {
        return Ok(length);
    }
    // An unterminated `'''` is read as the empty string `''` followed by more (the lexer
    // backs up to the longest token it had matched).
    literal_body(text, 1, quote, false, raw)
}

fn literal_body(text: &[char], open: usize, quote: char, triple: bool, raw: bool) -> Result<usize, usize> {
    let mut i = open;
    loop {
        let c = *text.get(i).ok_or(i)?;
        if c == quote && (!triple || (text.get(i + 1) == Some(&quote) && text.get(i + 2) == Some(&quote))) {
            return Ok(i + if triple { 3 } else { 1 });
        }
        if !triple && (c == '\n' || c == '\r') {
            return Err(i);
        }
        if c == '\\' && !raw {
            i += escape_length(&text[i..]).map_err(|failed_at| i + failed_at)?;
        } else {
            i += 1;
        }
    }
}

/// The length of the escape sequence `text` starts with (at its backslash), if valid; else
/// the offset of the character that makes it invalid.
fn escape_length(text: &[char]) -> Result<usize, usize> {
    let digits = |from: usize, count: usize, valid: fn(&char) -> bool| {
        (from..from + count).find(|&k| !text.get(k).is_some_and(valid)).map_or(Ok(from + count), Err)
    };
    match text.get(1).ok_or(1usize)? {
        'a' | 'b' | 'f' | 'n' | 'r' | 't' | 'v' | '"' | '\'' | '\\' | '?' | '`' => Ok(2),
        '0'..='3' => digits(2, 2, |c| ('0'..='7').contains(c)),
        'x' | 'X' => digits(2, 2, char::is_ascii_hexdigit),
        'u' => digits(2, 4, char::is_ascii_hexdigit),
        'U' => digits(2, 8, char::is_ascii_hexdigit),
        _ => Err(1),
    }
}

/// The length of a well-formed `` `quoted.identifier` `` at the start of `text`, else the
/// offset of the character the lexer fails on.
fn quoted_identifier_length(text: &[char]) -> Result<usize, usize> {
    let valid = |c: &char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ' ');
    for (k, c) in text.iter().enumerate().skip(1) {
        match c {
            '`' if k > 1 => return Ok(k + 1),
            c if valid(c) => {}
            _ => return Err(k),
        }
    }
    Err(text.len())
}

/// The message for an expression [`scan`] refuses.
pub fn nesting_message(nesting: Nesting) -> String {
    format!(
        "the expression nests {} levels deep (deepest part from column {}); Allot accepts at most {MAX_NESTING} \
         (each bracket, call, `? :` and each operator or `.` chained in one operand counts a level): split it \
         into several rules or simpler parts",
        nesting.depth, nesting.column
    )
}

/// The depth of the tree, without recursion.
pub fn tree_depth(root: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(root, 1usize)];
    while let Some((expr, depth)) = pending.pop() {
        deepest = deepest.max(depth);
        let below = depth + 1;
        match &expr.expr {
            Expr::Call(call) => {
                pending.extend(call.target.as_deref().map(|t| (t, below)));
                pending.extend(call.args.iter().map(|a| (a, below)));
            }
            Expr::Comprehension(comp) => {
                for part in [&comp.iter_range, &comp.accu_init, &comp.loop_cond, &comp.loop_step, &comp.result] {
                    pending.push((part, below));
                }
            }
            Expr::List(list) => pending.extend(list.elements.iter().map(|e| (e, below))),
            Expr::Map(map) => {
                for entry in &map.entries {
                    push_entry(&entry.expr, below, &mut pending);
                }
            }
            Expr::Struct(st) => {
                for entry in &st.entries {
                    push_entry(&entry.expr, below, &mut pending);
                }
            }
            Expr::Select(select) => pending.push((&select.operand, below)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    deepest
}

fn push_entry<'e>(entry: &'e EntryExpr, depth: usize, pending: &mut Vec<(&'e IdedExpr, usize)>) {
    match entry {
        EntryExpr::MapEntry(e) => {
            pending.push((&e.key, depth));
            pending.push((&e.value, depth));
        }
        EntryExpr::StructField(f) => pending.push((&f.value, depth)),
    }
}

/// The message for a tree deeper than [`MAX_TREE_DEPTH`].
pub fn tree_message(depth: usize) -> String {
    format!(
        "the expression's evaluation would nest {depth} levels deep; Allot accepts at most {MAX_TREE_DEPTH}: \
         split it into several rules or simpler parts"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(source: &str) -> usize {
        scan(source).depth
    }

    #[test]
    fn brackets_ternaries_and_chains_count() {
        assert_eq!(depth("x"), 1);
        assert_eq!(depth("((x))"), 3);
        assert_eq!(depth("[[[1]]]"), 4);
        assert_eq!(depth("f(g(h(1)))"), 4);
        assert_eq!(depth("a ? b : c ? d : e"), 3);
        assert_eq!(depth("a.b.c.d"), 4);
        assert_eq!(depth("1 + 1 + 1 + 1"), 4);
        assert_eq!(depth("a == b"), 2);
        assert_eq!(depth("x in y"), 2);
        // `&&` and `||` build a balanced tree: log2 of their number.
        assert_eq!(depth("a && b"), 2);
        assert_eq!(depth("a && b && c && d"), 3);
        // Operands separated by `,` do not add up; the deepest counts, with its column.
        assert_eq!(scan("f(a.b, [[c]])"), Nesting { depth: 4, column: 9 });
    }

    #[test]
    fn well_formed_strings_and_comments_are_skipped() {
        assert_eq!(depth("'((((' + \"[[[[\""), 2);
        assert_eq!(depth("'''(((\n((('''"), 1);
        assert_eq!(depth(r#"r'\((((' == b"\x41(((""#), 2);
        assert_eq!(depth("x // ((((((\n"), 1);
        assert_eq!(depth("`a.b/c` == 1"), 2);
        assert_eq!(depth("'it\\'s (' + \"\\u00e9 (\""), 2);
        assert_eq!(depth("1.5e+3 + 0x1Fu"), 2);
    }

    #[test]
    fn malformed_literals_end_where_cels_lexer_gives_up() {
        // ANTLR's lexer reports the error and drops the character it failed on; the rest is code.
        // `\0(` is not a cel escape: the first `(` goes with the literal.
        assert_eq!(depth("'\\0((((("), 5);
        // A newline ends a one-line string, and goes with it.
        assert_eq!(depth("'((\n((("), 4);
        // Unterminated: the literal runs to the end.
        assert_eq!(depth("\"[["), 1);
        assert_eq!(depth("'\\' + ((x))"), 1);
        // A raw string has no escapes: `r'\'` is complete.
        assert_eq!(depth("r'\\' + ((x))"), 4);
        // A quoted identifier with a character it may not hold; the second backtick opens
        // another, which fails at `+`.
        assert_eq!(depth("`a(b)` + (x)"), 2);
        // No token is a lone `=`, `&` or `|`: the next character is dropped with it, here the
        // quote, so the `(` is code (found by the_scan_bounds_cel_s_nesting in CI).
        assert_eq!(depth("='('"), 2);
        assert_eq!(depth("a & '(' + (x)"), 3);
    }

    #[test]
    fn malformed_literal_counts_bound_cels_own() {
        use kube::core::cel::cel::parser::Parser;
        for source in
            ["'\\0(((((", "'((\n(((", "\"[[", "'\\' + ((x))", "`a(b)` + (x)", "='('", "a & '(' + (x)", "|'((('"]
        {
            let bound = depth(source);
            let parsed = Parser::new().max_recursion_depth(bound.saturating_sub(1) as u16).parse(source);
            let message = parsed.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(!message.contains("Recursion limit"), "scan says {bound} for {source:?}: {message}");
        }
    }

    #[test]
    fn unclosed_and_stray_brackets_keep_an_upper_bound() {
        assert_eq!(depth("(((("), 5);
        assert_eq!(depth("))))(("), 3);
        assert_eq!(depth("([)])"), 3);
    }

    #[test]
    fn the_tree_depth_is_exact() {
        let parse = |s: &str| kube::core::cel::cel::Program::compile(s).map(|p| tree_depth(p.expression()));
        assert_eq!(parse("x").ok(), Some(1));
        assert_eq!(parse("((x))").ok(), Some(1));
        assert_eq!(parse("a.b.c").ok(), Some(3));
        assert_eq!(parse("1 + 2 + 3").ok(), Some(3));
        assert_eq!(parse("[[1]]").ok(), Some(3));
        assert_eq!(parse("{'a': {'b': 1}}").ok(), Some(3));
    }

    #[test]
    fn doubled_unary_operators_are_found_outside_strings_and_comments() {
        for (source, found) in [
            ("!!has(object.spec)", Some(('!', 1))),
            ("x && ! !y", Some(('!', 6))),
            ("!!!x", Some(('!', 1))),
            ("--1 == -1", Some(('-', 1))),
            ("a == - -b", Some(('-', 6))),
            ("[1, --2]", Some(('-', 5))),
            ("!(!x)", None),
            ("a != !b", None),
            ("!x != !y", None),
            ("1 - -1 == 2", None),
            ("a--1", None),
            ("1e-5 - 2", None),
            ("'!!' + \"--\" == r'!!'", None),
            ("x // !!\n && !y", None),
            ("`a-b` - -1", None),
        ] {
            assert_eq!(repeated_unary(source), found, "{source}");
        }
    }

    #[test]
    fn cel_still_reads_a_doubled_not_as_one() {
        // Why the refusal exists; when cel fixes its parser, this fails and the refusal can go.
        let value = kube::core::cel::cel::Program::compile("!!true")
            .map(|p| p.execute(&kube::core::cel::cel::Context::default()));
        assert!(matches!(value, Ok(Ok(kube::core::cel::cel::Value::Bool(false)))), "{value:?}");
    }
}
