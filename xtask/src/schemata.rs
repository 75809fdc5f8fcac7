//! Shared builds for the mutants of one crate ("mutant schemata").
//!
//! Most of a mutants run is rebuilding: a mutant of `onebit-kernels` rebuilds that crate
//! at opt-level 1 in 7–12 s and then runs its tests in one or two. So the mutants of a
//! crate are compiled together where they can be, each behind a switch read at run time,
//! and the crate is built once for all of them:
//!
//! ```text
//! NODE   →   (if {switch "NAME"} { NODE with the mutant's edit } else { NODE })
//! ```
//!
//! where the switch is true only when the environment variable [`SWITCH`] equals the
//! mutant's name (read once per site, then a `OnceLock`). A mutant is then its tests run
//! with `ONEBIT_MUTANT=NAME`, and with no name set every site takes its original branch.
//!
//! That is the textual mutant's program only when `NODE` is a whole node an `if` can
//! stand for, so [`site`] takes, from the file's syntax tree (syn):
//! - the anchor itself when it is a run of whole statements of one block, each an
//!   expression statement ended by `;` (no `let`: its binding would end with the `else`
//!   block), and the replacement parses as statements;
//! - otherwise the smallest *value* expression that holds the whole edit (the anchor and
//!   its replacement without their common beginning and end): not a place such as `a[i]`
//!   or `x.f` (a borrow of it or an assignment through it would reach a copy), not a
//!   closure, `async` block or `let` condition, nothing in a constant context; the node
//!   with the edit made must parse as an expression.
//!
//! Everything else (edits in patterns or a function's own statements, mutants with a
//! second edit) keeps a build of its own. The caller still checks that the shared build
//! compiles (dropping sites whose two branches do not type-check together) and that every
//! test selection passes with no mutant switched on before it trusts a verdict from it.

use proc_macro2::LineColumn;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The environment variable that switches one mutant of a shared build on.
pub const SWITCH: &str = "ONEBIT_MUTANT";

/// What an anchor is in its file's syntax tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One value expression.
    Expr,
    /// A run of whole expression statements (each ended by `;`) of one block.
    Stmts,
}

/// Where a mutant's edit sits and what a shared build puts there: the byte range of the
/// node that holds the edit, what the node is, and the node's text with the edit made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
    /// Whether the node is an expression statement without `;` (an `if`, a loop...): it
    /// is wrapped without parentheses, which would make the next line part of it.
    pub bare: bool,
    /// The node's text as the mutant has it.
    pub mutated: String,
}

/// One expression of the file: its range and whether an `if` can stand for it.
#[derive(Clone, Copy)]
struct ExprNode {
    start: usize,
    end: usize,
    wrappable: bool,
}

/// One statement of a block.
#[derive(Clone, Copy)]
struct StmtNode {
    start: usize,
    end: usize,
    /// An expression statement ended by `;` (or a macro statement with one).
    ended: bool,
    /// An expression statement without `;` (block-like, or the block's value).
    open: bool,
}

/// The nodes an edit may sit in, collected from one file.
#[derive(Default)]
struct Nodes {
    exprs: Vec<ExprNode>,
    blocks: Vec<Vec<StmtNode>>,
}

struct Collector<'a> {
    offsets: Offsets<'a>,
    nodes: Nodes,
}

impl Collector<'_> {
    fn range(&self, node: &impl Spanned) -> Option<(usize, usize)> {
        let span = node.span();
        Some((self.offsets.of(span.start())?, self.offsets.of(span.end())?))
    }
}

/// Whether an `if` can stand for `e` without changing the program: a value expression,
/// not a place (a wrapped place would be a copy that a borrow or an assignment then
/// changes instead of the original) and not one whose type only it has (closures,
/// `async` blocks) or that is not an expression of its own (`let` in conditions).
fn wrappable(e: &syn::Expr) -> bool {
    use syn::Expr;
    match e {
        Expr::Path(_) | Expr::Field(_) | Expr::Index(_) => false,
        Expr::Unary(u) => !matches!(u.op, syn::UnOp::Deref(_)),
        Expr::Paren(p) => wrappable(&p.expr),
        Expr::Group(g) => wrappable(&g.expr),
        Expr::Closure(_) | Expr::Async(_) | Expr::Let(_) | Expr::Verbatim(_) => false,
        Expr::Const(_) => false,
        _ => true,
    }
}

// Constant contexts (a `const` or `static`, array lengths, const generic arguments,
// `const fn` bodies, discriminants) are not visited: a switch read at run time cannot
// stand there.
impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_expr(&mut self, e: &'ast syn::Expr) {
        if let Some((start, end)) = self.range(e) {
            self.nodes.exprs.push(ExprNode {
                start,
                end,
                wrappable: wrappable(e),
            });
        }
        syn::visit::visit_expr(self, e);
    }

    fn visit_block(&mut self, b: &'ast syn::Block) {
        let stmts = b
            .stmts
            .iter()
            .filter_map(|s| {
                let (start, end) = self.range(s)?;
                Some(StmtNode {
                    start,
                    end,
                    ended: matches!(
                        s,
                        syn::Stmt::Expr(_, Some(_))
                            | syn::Stmt::Macro(syn::StmtMacro {
                                semi_token: Some(_),
                                ..
                            })
                    ),
                    open: matches!(s, syn::Stmt::Expr(_, None)),
                })
            })
            .collect();
        self.nodes.blocks.push(stmts);
        syn::visit::visit_block(self, b);
    }

    fn visit_item_const(&mut self, _: &'ast syn::ItemConst) {}
    fn visit_item_static(&mut self, _: &'ast syn::ItemStatic) {}
    fn visit_impl_item_const(&mut self, _: &'ast syn::ImplItemConst) {}
    fn visit_trait_item_const(&mut self, _: &'ast syn::TraitItemConst) {}
    fn visit_type_array(&mut self, _: &'ast syn::TypeArray) {}
    fn visit_generic_argument(&mut self, a: &'ast syn::GenericArgument) {
        if !matches!(a, syn::GenericArgument::Const(_)) {
            syn::visit::visit_generic_argument(self, a);
        }
    }
    fn visit_expr_repeat(&mut self, r: &'ast syn::ExprRepeat) {
        self.visit_expr(&r.expr);
    }
    fn visit_variant(&mut self, _: &'ast syn::Variant) {}
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if f.sig.constness.is_none() {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if f.sig.constness.is_none() {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
}

/// Byte offsets of proc-macro2's line/column positions (columns count characters).
struct Offsets<'a> {
    text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Offsets<'a> {
    fn new(text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Offsets { text, line_starts }
    }

    fn of(&self, at: LineColumn) -> Option<usize> {
        let start = *self.line_starts.get(at.line.checked_sub(1)?)?;
        let line = &self.text[start..];
        let within = match line.char_indices().nth(at.column) {
            Some((i, _)) => i,
            // The end of the text (a span may end there).
            None if line.chars().count() == at.column => line.len(),
            None => return None,
        };
        Some(start + within)
    }
}

/// The bytes a mutant changes: `source[start..end]` becomes `text` (the anchor and its
/// replacement without their common beginning and end).
fn edit_of<'r>(at: usize, find: &str, replace: &'r str) -> (usize, usize, &'r str) {
    let mut p = find
        .bytes()
        .zip(replace.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !(find.is_char_boundary(p) && replace.is_char_boundary(p)) {
        p -= 1;
    }
    let room = find.len().min(replace.len()) - p;
    let mut q = find
        .bytes()
        .rev()
        .zip(replace.bytes().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    while !(find.is_char_boundary(find.len() - q) && replace.is_char_boundary(replace.len() - q)) {
        q -= 1;
    }
    (at + p, at + find.len() - q, &replace[p..replace.len() - q])
}

/// Where the mutant that replaces `find` (found exactly once in `source`) by `replace`
/// can sit in a shared build, if anywhere; `None` keeps it on its own build.
///
/// The site is the anchor itself when it is a run of whole expression statements and the
/// replacement parses as statements; otherwise the smallest value expression that holds
/// the whole edit (the two texts without their common beginning and end), with the edit
/// made in its text, which must parse as an expression.
pub fn site(source: &str, find: &str, replace: &str) -> Option<Site> {
    if source.matches(find).count() != 1 {
        return None;
    }
    let at = source.find(find)?;
    let file = syn::parse_file(source).ok()?;
    let mut collector = Collector {
        offsets: Offsets::new(source),
        nodes: Nodes::default(),
    };
    collector.visit_file(&file);
    let nodes = collector.nodes;

    let lead = find.len() - find.trim_start().len();
    let (start, end) = (at + lead, at + find.trim_end().len());
    let statements = start < end
        && nodes.blocks.iter().any(|stmts| {
            let first = stmts.iter().position(|s| s.start == start);
            let last = stmts.iter().position(|s| s.end == end);
            matches!((first, last), (Some(f), Some(l)) if f <= l && stmts[f..=l].iter().all(|s| s.ended))
        });
    if statements && syn::parse_str::<syn::Block>(&format!("{{\n{replace}\n}}")).is_ok() {
        return Some(Site {
            start,
            end,
            kind: Kind::Stmts,
            bare: false,
            mutated: replace.to_string(),
        });
    }

    let (es, ee, text) = edit_of(at, find, replace);
    let holder = nodes
        .exprs
        .iter()
        .filter(|n| n.wrappable && n.start <= es && ee <= n.end && n.start < n.end)
        // An insertion at a node's edge is outside it.
        .filter(|n| es < ee || (n.start < es && es < n.end))
        .min_by_key(|n| n.end - n.start)?;
    let mutated = format!(
        "{}{text}{}",
        &source[holder.start..es],
        &source[ee..holder.end]
    );
    syn::parse_str::<syn::Expr>(&mutated).ok()?;
    let bare = nodes
        .blocks
        .iter()
        .flatten()
        .any(|s| s.open && (s.start, s.end) == (holder.start, holder.end));
    Some(Site {
        start: holder.start,
        end: holder.end,
        kind: Kind::Expr,
        bare,
        mutated,
    })
}

/// The switch of mutant `name`: true when [`SWITCH`] is set to `name`, read once.
fn switch(name: &str) -> String {
    format!(
        "{{ static ON: ::std::sync::OnceLock<bool> = ::std::sync::OnceLock::new(); \
         *ON.get_or_init(|| ::std::env::var_os(\"{SWITCH}\").is_some_and(|v| v == \"{name}\")) }}"
    )
}

/// `source` with each `(site, name)` wrapped behind its switch (the sites must not
/// overlap; the text outside them is unchanged), and the lines (1-based, first and last)
/// each site's wrapping takes in the result, in the order of `sites`: a compiler error
/// there belongs to that mutant.
pub fn wrap(source: &str, sites: &[(Site, &str)]) -> (String, Vec<(usize, usize)>) {
    let mut order: Vec<usize> = (0..sites.len()).collect();
    order.sort_by_key(|&i| sites[i].0.start);
    let mut lines = vec![(0, 0); sites.len()];
    let line_of = |text: &str| text.matches('\n').count() + 1;
    let mut out = String::with_capacity(source.len() + sites.len() * 200);
    let mut at = 0;
    for i in order {
        let (site, name) = &sites[i];
        assert!(site.start >= at, "schemata: overlapping sites");
        out.push_str(&source[at..site.start]);
        let first = line_of(&out);
        let original = &source[site.start..site.end];
        let cond = switch(name);
        let mutated = &site.mutated;
        out.push_str(&match (site.kind, site.bare) {
            (Kind::Expr, false) => format!("(if {cond} {{ {mutated} }} else {{ {original} }})"),
            (Kind::Expr, true) => format!("if {cond} {{ {mutated} }} else {{ {original} }}"),
            (Kind::Stmts, _) => format!("if {cond} {{\n{mutated}\n}} else {{ {original} }}"),
        });
        lines[i] = (first, line_of(&out));
        at = site.end;
    }
    out.push_str(&source[at..]);
    (out, lines)
}

/// Whether two sites share a byte.
pub fn overlap(a: &Site, b: &Site) -> bool {
    a.start < b.end && b.start < a.end
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "const N: usize = 4 * 2;
fn f(a: &mut [f32], x: f32, n: usize) -> f32 {
    let y = x.mul_add(2.0, 1.0) * 3.0;
    a[0] = y;
    a[n - 1] += 1.0;
    let v = vec![x + 1.0];
    let g = |z: f32| z * 2.0;
    for i in 0..n {
        a[i] = v[0];
    }
    g(y) + v[0] + splat(a[n - 1])
}
";

    fn text(s: &Site) -> &str {
        &SRC[s.start..s.end]
    }

    #[test]
    fn the_smallest_value_expression_holding_the_edit_is_the_site() {
        let s = site(SRC, "x.mul_add(2.0, 1.0)", "x.mul_add(2.0, 0.0)").unwrap();
        assert_eq!(
            (s.kind, text(&s), s.mutated.as_str()),
            (Kind::Expr, "1.0", "0.0")
        );
        let s = site(SRC, "z * 2.0", "z").unwrap();
        assert_eq!((text(&s), s.mutated.as_str()), ("z * 2.0", "z"));
        // A place is never the site: the value that holds it is.
        let s = site(SRC, "splat(a[n - 1])", "splat(a[n])").unwrap();
        assert_eq!((text(&s), s.mutated.as_str()), ("n - 1", "n"));
        let s = site(SRC, "+ splat(a[n - 1])", "+ splat(x)").unwrap();
        assert_eq!(
            (text(&s), s.mutated.as_str()),
            ("splat(a[n - 1])", "splat(x)")
        );
        // A macro's arguments are not parsed: the whole call is the value.
        let s = site(SRC, "vec![x + 1.0]", "vec![x]").unwrap();
        assert_eq!(text(&s), "vec![x + 1.0]");
        // A loop is a statement of its own: it is wrapped without parentheses.
        let s = site(SRC, "a[i] = v[0];", "a[i] = v[0] + 1.0;").unwrap();
        assert_eq!((s.kind, s.bare), (Kind::Stmts, false));
        let s = site(SRC, "for i in 0..n {", "for i in 1..n {").unwrap();
        assert_eq!((text(&s), s.bare), ("0", false));
        let s = site(SRC, "        a[i] = v[0];\n", "").unwrap();
        assert_eq!((s.kind, text(&s)), (Kind::Stmts, "a[i] = v[0];"));
    }

    #[test]
    fn whole_expression_statements_are_a_site_with_their_whitespace_trimmed() {
        let s = site(SRC, "    a[0] = y;\n    a[n - 1] += 1.0;\n", "a[1] = y;").unwrap();
        assert_eq!(s.kind, Kind::Stmts);
        assert_eq!(text(&s), "a[0] = y;\n    a[n - 1] += 1.0;");
        assert_eq!(s.mutated, "a[1] = y;");
    }

    #[test]
    fn constants_patterns_lets_and_unparsable_edits_are_not_sites() {
        for (find, replace) in [
            ("4 * 2", "4 * 3"),                                     // a constant context
            ("let y =", "let z ="),                                 // a pattern
            ("    let v = vec![x + 1.0];\n", ""),                   // a `let` removed
            ("x.mul_add(2.0, 1.0) * 3.0", "x.mul_add(2.0, 1.0) *"), // no expression
            ("v[0]", "v[1]"),                                       // not unique
        ] {
            assert_eq!(site(SRC, find, replace), None, "{find}");
        }
        // A statement inserted into a function's own body: no expression holds it.
        assert_eq!(
            site(SRC, "    a[0] = y;", "    return 0.0;\n    a[0] = y;").map(|s| s.kind),
            Some(Kind::Stmts)
        );
        assert_eq!(site(SRC, "    let g", "    println!();\n    let g"), None);
    }

    #[test]
    fn a_block_like_statement_is_wrapped_without_parentheses() {
        let src = "fn f(n: usize) -> usize {\n    let mut t = 0;\n    for i in 0..n {\n        t += i;\n    }\n    t\n}\n";
        let s = site(src, "t += i;\n    }", "t += i;\n        t += 1;\n    }").unwrap();
        assert!(s.bare, "{s:?}");
        assert_eq!(
            &src[s.start..s.end],
            "for i in 0..n {\n        t += i;\n    }"
        );
        let (out, _) = wrap(src, &[(s, "m")]);
        syn::parse_file(&out).unwrap();
        assert!(
            out.contains("} else { for i in 0..n {\n        t += i;\n    } }\n    t\n}"),
            "{out}"
        );
    }

    #[test]
    fn wrapped_sources_parse_and_keep_every_original_branch() {
        let e = site(SRC, "x.mul_add(2.0, 1.0)", "x.mul_add(2.0, 0.0)").unwrap();
        let s = site(SRC, "a[0] = y;", "a[1] = y;").unwrap();
        assert!(!overlap(&e, &s));
        let (out, _) = wrap(SRC, &[(s.clone(), "second"), (e.clone(), "first")]);
        syn::parse_file(&out).unwrap();
        assert!(out.contains("== \"first\")) } { 0.0 } else { 1.0 })"));
        assert!(out.contains("== \"second\")) } {\na[1] = y;\n} else { a[0] = y; }"));
        assert!(out.ends_with("    g(y) + v[0] + splat(a[n - 1])\n}\n"));
        let (same, lines) = wrap(SRC, &[(s, "second"), (e, "first")]);
        assert_eq!((same, lines), (out.clone(), vec![(4, 6), (3, 3)]));
        // Nothing to wrap: the text itself.
        assert_eq!(wrap(SRC, &[]), (SRC.to_string(), vec![]));
    }

    #[test]
    fn positions_count_characters_not_bytes() {
        let src = "fn f() -> f32 { /* ·⊕ */ 1.0 + 2.0 }\n";
        let s = site(src, "1.0 + 2.0", "1.0 - 2.0").unwrap();
        assert_eq!(&src[s.start..s.end], "1.0 + 2.0");
        let s = site(src, "/* ·⊕ */ 1.0", "/* ·⊕ */ 3.0").unwrap();
        assert_eq!(&src[s.start..s.end], "1.0");
    }
}
