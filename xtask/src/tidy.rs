//! `cargo xtask tidy`: the invariants of ARCHITECTURE.md that the source tree itself can
//! show, checked by reading it (no build).
//!
//! Each check is a function from the workspace root to the violations it finds, each
//! naming a file and a line. Comments and string literals are blanked before any check
//! reads code ([`code_only`]), so a doc comment that names `CpuModel` or the word
//! `unsafe` is not a violation, and a line number still points at the source line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// One broken invariant at one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Relative to the workspace root.
    pub file: PathBuf,
    /// 1-based.
    pub line: usize,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

type Check = fn(&Path) -> Result<Vec<Violation>>;

/// Every check, by the name ARCHITECTURE.md's invariant list gives it.
pub const CHECKS: &[(&str, Check)] = &[
    ("mtp-names-no-backend", mtp_names_no_backend),
    ("isa-detection-only-in-isa-rs", isa_detection_only_in_isa_rs),
    ("unsafe-only-where-allowed", unsafe_only_where_allowed),
    ("no-unused-dependencies", no_unused_dependencies),
    ("binary-modules-acyclic", binary_modules_acyclic),
    ("skips-are-logged", skips_are_logged),
    ("serve-depends-only-on-engine", serve_depends_only_on_engine),
    (
        "kernel-families-share-one-layout",
        kernel_families_share_one_layout,
    ),
    ("binary-names-no-mtp", binary_names_no_mtp),
];

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("tidy: takes no arguments (got '{a}')");
    }
    let root = crate::workspace_root();
    let mut failed = 0;
    for (name, check) in CHECKS {
        let found = check(&root).with_context(|| format!("tidy: {name}"))?;
        if found.is_empty() {
            println!("tidy: {name}: ok");
        } else {
            failed += 1;
            println!("tidy: {name}: {} violation(s)", found.len());
            for v in &found {
                println!("  {v}");
            }
        }
    }
    if failed > 0 {
        bail!("tidy: {failed} check(s) failed (ARCHITECTURE.md, Invariants)");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The checks.

/// Names of the CPU and NPU backends (and their module) that the speculative loop must
/// not name: it sees a target only as `&mut dyn Forward` and a draft's view of the target
/// through `DraftHooks`.
pub const BACKEND_NAMES: &[&str] = &[
    "CpuModel",
    "CpuTarget",
    "CpuOptions",
    "NpuTarget",
    "SimDevice",
    "XrtDevice",
    "npu_runtime::npu",
];

/// No backend name in `crates/mtp/src`.
pub fn mtp_names_no_backend(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for file in rust_files(&root.join("crates/mtp/src"))? {
        let code = code_only(&read(&file)?);
        for name in BACKEND_NAMES {
            for line in word_lines(&code, name) {
                out.push(Violation {
                    file: rel(root, &file),
                    line,
                    message: format!(
                        "mtp names the backend `{name}` (the loop sees a target only as `dyn Forward`, a draft's view of it through `DraftHooks`)"
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// The one file allowed to ask the CPU what it has.
pub const ISA_FILE: &str = "crates/onebit-kernels/src/isa.rs";

/// No `is_x86_feature_detected!` in `crates/` outside [`ISA_FILE`]: everything else takes
/// the `Isa` token. (xtask's mutant runner asks too, to skip mutants of code this CPU
/// cannot run; it is tooling, not a kernel, and is not under `crates/`.)
pub fn isa_detection_only_in_isa_rs(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for file in rust_files(&root.join("crates"))? {
        if rel(root, &file) == Path::new(ISA_FILE) {
            continue;
        }
        let code = code_only(&read(&file)?);
        for line in word_lines(&code, "is_x86_feature_detected") {
            out.push(Violation {
                file: rel(root, &file),
                line,
                message: format!(
                    "`is_x86_feature_detected!` outside {ISA_FILE}: take the `Isa` token instead"
                ),
            });
        }
    }
    Ok(out)
}

/// Crates whose code may use `unsafe` anywhere (intrinsics, AMX `asm!`, FFI).
pub const UNSAFE_CRATES: &[&str] = &["onebit-kernels", "xrt-sys"];
/// Crates allowed exactly one `unsafe`: a memory map of a model file.
pub const MMAP_CRATES: &[&str] = &["q4nx-format", "q4nx-convert"];
const MMAP_CALL: &str = "unsafe { memmap2::Mmap::map(";

/// Every other crate forbids `unsafe_code` at its root and has no `unsafe` in any of its
/// files (src, tests, benches, build.rs: the attribute covers only the library); the
/// memory-map crates hold one `unsafe { memmap2::Mmap::map(..) }` each.
pub fn unsafe_only_where_allowed(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for krate in members(root)? {
        let name = package_name(&krate)?;
        if UNSAFE_CRATES.contains(&name.as_str()) {
            continue;
        }
        let mmap = MMAP_CRATES.contains(&name.as_str());
        if !mmap {
            for root_file in ["src/lib.rs", "src/main.rs"] {
                let path = krate.join(root_file);
                if path.exists() && !code_only(&read(&path)?).contains("#![forbid(unsafe_code)]") {
                    out.push(Violation {
                        file: rel(root, &path),
                        line: 1,
                        message: format!("crate `{name}` does not say `#![forbid(unsafe_code)]`"),
                    });
                }
            }
        }
        let mut unsafes = Vec::new();
        for file in rust_files(&krate)? {
            let code = code_only(&read(&file)?);
            for line in word_lines(&code, "unsafe") {
                let text = code.lines().nth(line - 1).unwrap_or("");
                unsafes.push((file.clone(), line, text.contains(MMAP_CALL)));
            }
        }
        let mut maps = 0;
        for (file, line, is_map) in unsafes {
            if mmap && is_map && maps == 0 {
                maps += 1;
                continue;
            }
            let why = if mmap {
                format!(
                    "`unsafe` in `{name}`, which may hold one `{MMAP_CALL}..)` and nothing else"
                )
            } else {
                format!(
                    "`unsafe` in `{name}` (only {} may use it)",
                    UNSAFE_CRATES.join(" and ")
                )
            };
            out.push(Violation {
                file: rel(root, &file),
                line,
                message: why,
            });
        }
    }
    Ok(out)
}

/// Every dependency a member's Cargo.toml declares (normal, dev or build) is named by
/// some Rust file of that crate (src, tests, benches, examples, build.rs), as a path
/// (`name::`), in `use name` or in `extern crate name`.
pub fn no_unused_dependencies(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for krate in members(root)? {
        let manifest = krate.join("Cargo.toml");
        let deps = dependencies(&read(&manifest)?);
        let code: Vec<String> = rust_files(&krate)?
            .iter()
            .map(|f| read(f).map(|s| code_only(&s)))
            .collect::<Result<_>>()?;
        for dep in deps {
            let ident = dep.name.replace('-', "_");
            if !code.iter().any(|c| names_crate(c, &ident)) {
                out.push(Violation {
                    file: rel(root, &manifest),
                    line: dep.line,
                    message: format!(
                        "[{}] `{}` is named by no Rust file of {} (src, tests, benches, build.rs)",
                        dep.table,
                        dep.name,
                        rel(root, &krate).display()
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// The server crate, which sees the model only through `onebit-engine`'s public API.
pub const SERVE_CRATE: &str = "crates/onebit-serve";

/// The onebit crates below the engine, which the server must neither depend on nor name.
pub const BELOW_ENGINE: &[&str] = &[
    "npu-runtime",
    "mtp",
    "onebit-kernels",
    "dflash-draft",
    "q4nx-format",
    "q4nx-convert",
    "xrt-sys",
];

/// `onebit-serve`'s `[dependencies]` hold `onebit-engine` and none of [`BELOW_ENGINE`]
/// (its tests may build packages with them), and no file of its `src/` names one of
/// them as a path (`npu_runtime::`, `use mtp`).
pub fn serve_depends_only_on_engine(root: &Path) -> Result<Vec<Violation>> {
    let krate = root.join(SERVE_CRATE);
    let manifest = krate.join("Cargo.toml");
    let mut out = Vec::new();
    let deps = dependencies(&read(&manifest)?);
    let normal: Vec<&Dep> = deps.iter().filter(|d| d.table == "dependencies").collect();
    if !normal.iter().any(|d| d.name == "onebit-engine") {
        out.push(Violation {
            file: rel(root, &manifest),
            line: 1,
            message:
                "onebit-serve does not depend on onebit-engine (the one onebit crate it may use)"
                    .into(),
        });
    }
    for dep in normal {
        if BELOW_ENGINE.contains(&dep.name.as_str()) {
            out.push(Violation {
                file: rel(root, &manifest),
                line: dep.line,
                message: format!(
                    "onebit-serve depends on `{}`, below onebit-engine: add what it needs to the engine's public API",
                    dep.name
                ),
            });
        }
    }
    for file in rust_files(&krate.join("src"))? {
        let code = code_only(&read(&file)?);
        for name in BELOW_ENGINE {
            let ident = name.replace('-', "_");
            for at in crate_name_sites(&code, &ident) {
                out.push(Violation {
                    file: rel(root, &file),
                    line: line_of(&code, at),
                    message: format!(
                        "onebit-serve names `{ident}`, below onebit-engine: use the engine's public API"
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// The kernels crate's source.
pub const KERNELS_SRC: &str = "crates/onebit-kernels/src";
/// The kernel families with per-ISA variants: a directory each.
pub const KERNEL_FAMILIES: &[&str] = &["matmul", "q8", "dense", "attention"];
/// What each family directory holds: the dispatch from an `Isa` token, the scalar code
/// that defines the bits, and the x86 variants.
pub const FAMILY_FILES: &[&str] = &["mod.rs", "reference.rs", "x86.rs"];
/// Files of the kernels crate, besides the families' `x86.rs`, that may name
/// `std::arch`: detection, the crate root's prefetch hint, the AMX variant's `asm!` layer.
pub const ARCH_FILES: &[&str] = &["isa.rs", "lib.rs", "q8/amx.rs"];

/// Every kernel family is laid out alike (`mod.rs` + `reference.rs` + `x86.rs`), and x86
/// intrinsics (`std::arch`) appear only in the families' `x86.rs` and [`ARCH_FILES`], so
/// a reader finds a family's bits and its variants in the same places every time.
pub fn kernel_families_share_one_layout(root: &Path) -> Result<Vec<Violation>> {
    let src = root.join(KERNELS_SRC);
    let mut out = Vec::new();
    for family in KERNEL_FAMILIES {
        for file in FAMILY_FILES {
            let path = src.join(family).join(file);
            if !path.is_file() {
                out.push(Violation {
                    file: rel(root, &path),
                    line: 1,
                    message: format!(
                        "kernel family `{family}` has no {file}: each family is {} (the dispatch, the bits, the x86 variants)",
                        FAMILY_FILES.join(" + ")
                    ),
                });
            }
        }
    }
    for file in rust_files(&src)? {
        let inner = file.strip_prefix(&src).unwrap_or(&file);
        let in_family_x86 = inner.file_name().is_some_and(|n| n == "x86.rs")
            && inner
                .parent()
                .and_then(|p| p.to_str())
                .is_some_and(|p| KERNEL_FAMILIES.contains(&p));
        let allowed = ARCH_FILES.iter().any(|a| inner == Path::new(a));
        if in_family_x86 || allowed {
            continue;
        }
        let code = code_only(&read(&file)?);
        for line in word_lines(&code, "std::arch") {
            out.push(Violation {
                file: rel(root, &file),
                line,
                message: "x86 intrinsics (`std::arch`) outside a kernel family's x86.rs: put the variant there".into(),
            });
        }
    }
    Ok(out)
}

/// The binary's source, whose top-level modules must not import each other in a cycle.
pub const BINARY_SRC: &str = "crates/onebit/src";

/// The binary's subcommands generate through `onebit-engine`'s `Engine` and `Session`
/// only: no file of its `src/` names the `mtp` crate (`mtp::run`, `use mtp`). The
/// decoding loop, its drafters and the oracle runs are the engine's to drive.
pub fn binary_names_no_mtp(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for file in rust_files(&root.join(BINARY_SRC))? {
        let code = code_only(&read(&file)?);
        for at in crate_name_sites(&code, "mtp") {
            out.push(Violation {
                file: rel(root, &file),
                line: line_of(&code, at),
                message: "the binary names `mtp`: generate through onebit-engine's Engine and Session (add what is missing to the engine)".into(),
            });
        }
    }
    Ok(out)
}

/// No cycle among the binary's top-level modules (`run`, `bench`, `serve`, ...) through
/// `crate::module` paths: a module shared by two subcommands is a neutral one.
pub fn binary_modules_acyclic(root: &Path) -> Result<Vec<Violation>> {
    let src = root.join(BINARY_SRC);
    let files = rust_files(&src)?;
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    // edge (from, to) -> the first place it is made
    let mut edges: BTreeMap<(String, String), (PathBuf, usize)> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(&src, file) else {
            continue; // main.rs: the root declares every module
        };
        let code = code_only(&read(file)?);
        let depth = file.strip_prefix(&src)?.components().count();
        let nested = file.file_name().is_some_and(|n| n != "mod.rs") && depth > 1;
        for (line, to) in crate_paths(&code, nested) {
            if to != from && modules.contains(&to) {
                edges
                    .entry((from.clone(), to))
                    .or_insert((rel(root, file), line));
            }
        }
    }
    Ok(cycles(&edges)
        .into_iter()
        .map(|cycle| {
            let hops: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let (file, line) = &edges[&(w[0].clone(), w[1].clone())];
                    format!("{} -> {} ({}:{line})", w[0], w[1], file.display())
                })
                .collect();
            let (file, line) = edges[&(cycle[0].clone(), cycle[1].clone())].clone();
            Violation {
                file,
                line,
                message: format!(
                    "the binary's modules import each other: {} (move what they share into a neutral module)",
                    hops.join(", ")
                ),
            }
        })
        .collect())
}

/// A test that returns early because a resource is missing says so through
/// `test_support::skip!` (the skip log `.ci/run` prints and checks), never by a bare
/// `eprintln!("skip..")` that reads as a pass. Any print whose message starts with
/// "skip" in `crates/` (test-support, which implements the log, aside) is one.
pub fn skips_are_logged(root: &Path) -> Result<Vec<Violation>> {
    let mut out = Vec::new();
    for file in rust_files(&root.join("crates"))? {
        if rel(root, &file).starts_with("crates/test-support") {
            continue;
        }
        let raw = read(&file)?;
        let code = code_only(&raw);
        for mac in ["println", "eprintln", "print", "eprint"] {
            for at in word_positions(&code, mac) {
                let Some(args) = code[at + mac.len()..].strip_prefix("!(") else {
                    continue;
                };
                let open = code.len() - args.len();
                let message = raw[open..].trim_start();
                if let Some(text) = message.strip_prefix('"') {
                    if text.to_lowercase().starts_with("skip") {
                        out.push(Violation {
                            file: rel(root, &file),
                            line: line_of(&code, at),
                            message: format!(
                                "a skip printed with `{mac}!` bypasses the skip log: use `test_support::skip!`"
                            ),
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Reading the tree.

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("tidy: cannot read {}", path.display()))
}

fn rel(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root).unwrap_or(path).to_path_buf()
}

/// Every `.rs` file under `dir`, sorted, skipping `target` and hidden directories.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in
            std::fs::read_dir(&d).with_context(|| format!("tidy: cannot list {}", d.display()))?
        {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The workspace's member directories, from the root Cargo.toml's `members = [...]`.
pub(crate) fn members(root: &Path) -> Result<Vec<PathBuf>> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let start = manifest
        .find("members")
        .context("tidy: the root Cargo.toml has no `members`")?;
    let list = &manifest[start..];
    let open = list.find('[').context("tidy: `members` is not a list")?;
    let close = list.find(']').context("tidy: `members` is not a list")?;
    Ok(list[open + 1..close]
        .split(',')
        .map(|s| s.trim().trim_matches('"'))
        .filter(|s| !s.is_empty())
        .map(|s| root.join(s))
        .collect())
}

/// `[package] name` of a member.
pub(crate) fn package_name(krate: &Path) -> Result<String> {
    let manifest = read(&krate.join("Cargo.toml"))?;
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[package]")
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "name").then(|| v.trim().trim_matches('"').to_string())
        })
        .with_context(|| format!("tidy: no package name in {}/Cargo.toml", krate.display()))
}

/// A dependency as a manifest declares it.
#[derive(Debug, PartialEq)]
struct Dep {
    /// The name code uses (the key, which `package = ".."` renames from).
    name: String,
    table: String,
    line: usize,
}

/// The dependencies of a manifest: every key of a `[dependencies]`,
/// `[dev-dependencies]` or `[build-dependencies]` table (also under `[target.'..']`),
/// and every `[dependencies.name]` table. Enough TOML for Cargo manifests.
fn dependencies(manifest: &str) -> Vec<Dep> {
    let mut out = Vec::new();
    let mut table: Option<String> = None;
    for (i, raw) in manifest.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.starts_with('[') {
            let header = line.trim_matches(|c| c == '[' || c == ']').trim();
            let kind = ["dependencies", "dev-dependencies", "build-dependencies"]
                .into_iter()
                .find(|k| header == *k || header.ends_with(&format!(".{k}")));
            table = kind.map(str::to_string);
            // `[dependencies.name]` (or `[target.'cfg'.dependencies.name]`).
            if table.is_none() {
                for k in ["dependencies", "dev-dependencies", "build-dependencies"] {
                    let marker = format!("{k}.");
                    if let Some(at) = header.find(&marker) {
                        if at == 0 || header[..at].ends_with('.') {
                            out.push(Dep {
                                name: header[at + marker.len()..].trim_matches('"').into(),
                                table: k.into(),
                                line: i + 1,
                            });
                        }
                    }
                }
            }
            continue;
        }
        let Some(t) = &table else { continue };
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        // `name.workspace = true` or `name = ...`
        let name = key
            .trim()
            .split('.')
            .next()
            .unwrap_or("")
            .trim()
            .trim_matches('"');
        if !name.is_empty() {
            out.push(Dep {
                name: name.into(),
                table: t.clone(),
                line: i + 1,
            });
        }
    }
    out
}

/// Whether `code` names the crate `ident` as a path root (`ident::`), in `use ident` or
/// `extern crate ident` — not a field, method or local module of the same name.
fn names_crate(code: &str, ident: &str) -> bool {
    !crate_name_sites(code, ident).is_empty()
}

/// Where `code` names the crate `ident` ([`names_crate`]'s rule), as byte offsets.
fn crate_name_sites(code: &str, ident: &str) -> Vec<usize> {
    word_positions(code, ident)
        .into_iter()
        .filter(|&at| {
            let before = code[..at].trim_end();
            let after = code[at + ident.len()..].trim_start();
            let rooted = !before.ends_with("::") && !before.ends_with('.');
            (rooted && after.starts_with("::"))
                || before.ends_with("use")
                || before.ends_with("extern crate")
        })
        .collect()
}

/// The top-level module a file of the binary belongs to (`run.rs` → `run`,
/// `serve/api.rs` → `serve`); `None` for `main.rs`.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("main") => None,
        Some(m) => Some(m.into()),
        None => Some(first.into()),
    }
}

/// The top-level modules a file's code reaches through `crate::m`, `crate::{m, ..}` and,
/// in a top-level module (`nested` false), `super::m`, with their lines.
fn crate_paths(code: &str, nested: bool) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut roots = word_positions(code, "crate");
    if !nested {
        roots.extend(word_positions(code, "super"));
    }
    for at in roots {
        let rest = &code[at..];
        let Some(rest) = rest
            .split_once("::")
            .map(|(head, tail)| (head.trim(), tail))
        else {
            continue;
        };
        if rest.0 != "crate" && rest.0 != "super" {
            continue;
        }
        let line = line_of(code, at);
        let tail = rest.1.trim_start();
        if let Some(group) = tail.strip_prefix('{') {
            // Only the group's first level: `crate::{run::X, bench::{Y, Z}}` → run, bench.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && depth == 0 && is_ident(c) => {
                        out.push((line, ident_at(group, i)));
                        item_start = false;
                    }
                    c if !c.is_whitespace() => item_start = false,
                    _ => {}
                }
            }
        } else {
            let name = ident_at(tail, 0);
            if !name.is_empty() {
                out.push((line, name));
            }
        }
    }
    out
}

/// Each elementary cycle found by depth-first search (one per back edge), as the modules
/// along it with the first repeated at the end.
fn cycles(edges: &BTreeMap<(String, String), (PathBuf, usize)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    fn visit<'a>(
        node: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        out: &mut Vec<Vec<String>>,
    ) {
        if let Some(i) = path.iter().position(|&n| n == node) {
            let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(node.into());
            out.push(cycle);
            return;
        }
        if done.contains(node) {
            return;
        }
        path.push(node);
        for &to in next.get(node).map(Vec::as_slice).unwrap_or(&[]) {
            visit(to, next, path, done, out);
        }
        path.pop();
        done.insert(node);
    }
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    let starts: Vec<&str> = next.keys().copied().collect();
    for start in starts {
        visit(start, &next, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Lexing just enough Rust.

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_at(s: &str, at: usize) -> String {
    s[at..].chars().take_while(|&c| is_ident(c)).collect()
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// Byte offsets where `word` occurs with no identifier character on either side (a
/// `word` that itself contains `::` matches as a whole).
fn word_positions(code: &str, word: &str) -> Vec<usize> {
    code.match_indices(word)
        .filter(|&(at, _)| {
            let before = code[..at].chars().next_back();
            let after = code[at + word.len()..].chars().next();
            !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
        })
        .map(|(at, _)| at)
        .collect()
}

/// The lines (1-based, each once) where `word` occurs in `code`.
fn word_lines(code: &str, word: &str) -> Vec<usize> {
    let mut lines: Vec<usize> = word_positions(code, word)
        .into_iter()
        .map(|at| line_of(code, at))
        .collect();
    lines.dedup();
    lines
}

/// `src` with every comment and the contents of every string, byte-string, raw-string
/// and char literal replaced by spaces (newlines kept, so lines and columns stay put).
pub fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    // A blanked character becomes as many spaces as its UTF-8 bytes, so byte offsets in
    // the result are byte offsets in `src` too.
    let blank = |out: &mut String, c: char| {
        if c == '\n' {
            out.push('\n')
        } else {
            out.extend(std::iter::repeat_n(' ', c.len_utf8()))
        }
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if !prev_ident && (c == 'r' || (c == 'b' && next == Some('r'))) && {
            // A raw string: r"..", r#".."#, br"..".
            let mut j = i + if c == 'b' { 2 } else { 1 };
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            chars.get(j) == Some(&'"')
        } {
            let mut j = i + if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while chars[j] == '#' {
                hashes += 1;
                j += 1;
            }
            for &k in &chars[i..=j] {
                out.push(k);
            }
            i = j + 1;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '"' && (0..hashes).all(|h| chars.get(i + 1 + h) == Some(&'#')) {
                    out.push('"');
                    out.extend(std::iter::repeat_n('#', hashes));
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
            if i < chars.len() {
                out.push('"');
                i += 1;
            }
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a, kept).
            let end = if next == Some('\\') {
                (i + 2..chars.len()).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push('\'');
                    for &k in &chars[i + 1..end] {
                        blank(&mut out, k);
                    }
                    out.push('\'');
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch tree: files by relative path.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    /// The one violation a planted tree has, as `file:line: message`.
    fn only(found: Vec<Violation>) -> String {
        assert_eq!(found.len(), 1, "expected one violation: {found:#?}");
        found[0].to_string()
    }

    const WS: &str = "[workspace]\nmembers = [\"crates/a\", \"crates/b\"]\n";

    #[test]
    fn the_real_tree_passes_every_check() {
        let root = crate::workspace_root();
        for (name, check) in CHECKS {
            let found = check(&root).unwrap();
            assert!(
                found.is_empty(),
                "tidy {name}:\n{}",
                found.iter().map(|v| format!("  {v}\n")).collect::<String>()
            );
        }
    }

    #[test]
    fn a_kernel_family_out_of_layout_is_found() {
        let family = |f: &'static str| {
            FAMILY_FILES
                .iter()
                .map(move |file| (format!("{KERNELS_SRC}/{f}/{file}"), String::from("//! x\n")))
        };
        let mut files: Vec<(String, String)> =
            KERNEL_FAMILIES.iter().flat_map(|&f| family(f)).collect();
        files.push((
            format!("{KERNELS_SRC}/matmul/x86.rs"),
            "use std::arch::x86_64::*;\n".into(),
        ));
        files.push((
            format!("{KERNELS_SRC}/isa.rs"),
            "use std::arch::x86_64::__cpuid;\n".into(),
        ));
        let as_refs = |files: &[(String, String)]| -> tempfile::TempDir {
            let refs: Vec<(&str, &str)> = files
                .iter()
                .map(|(p, t)| (p.as_str(), t.as_str()))
                .collect();
            tree(&refs)
        };
        let t = as_refs(&files);
        assert!(kernel_families_share_one_layout(t.path())
            .unwrap()
            .is_empty());
        // A family without its reference.
        let missing: Vec<_> = files
            .iter()
            .filter(|(p, _)| !p.ends_with("dense/reference.rs"))
            .cloned()
            .collect();
        let t = as_refs(&missing);
        assert!(only(kernel_families_share_one_layout(t.path()).unwrap())
            .starts_with("crates/onebit-kernels/src/dense/reference.rs:1: kernel family `dense` has no reference.rs"));
        // Intrinsics in a family's dispatch.
        let mut planted = files.clone();
        planted.push((
            format!("{KERNELS_SRC}/q8/quantize.rs"),
            "//! std::arch in a comment is fine\nfn f() {}\nuse std::arch::x86_64::_mm_add_ps;\n"
                .into(),
        ));
        let t = as_refs(&planted);
        assert!(only(kernel_families_share_one_layout(t.path()).unwrap())
            .starts_with("crates/onebit-kernels/src/q8/quantize.rs:3: x86 intrinsics"));
    }

    #[test]
    fn the_server_reaching_below_the_engine_is_found() {
        let manifest = "[package]\nname = \"onebit-serve\"\n\n[dependencies]\nonebit-engine.workspace = true\n\n[dev-dependencies]\nq4nx-convert.workspace = true\n";
        let clean =
            "//! Not `npu_runtime::TargetConfig` (a comment).\nuse onebit_engine::Engine;\n";
        let t = tree(&[
            ("crates/onebit-serve/Cargo.toml", manifest),
            ("crates/onebit-serve/src/lib.rs", clean),
            // Tests may build packages with lower crates.
            (
                "crates/onebit-serve/tests/t.rs",
                "use q4nx_convert::GgufConverter;\n",
            ),
        ]);
        assert!(serve_depends_only_on_engine(t.path()).unwrap().is_empty());
        // A source naming a lower crate.
        let t = tree(&[
            ("crates/onebit-serve/Cargo.toml", manifest),
            (
                "crates/onebit-serve/src/lib.rs",
                "fn f(c: &npu_runtime::TargetConfig) {}\n",
            ),
        ]);
        let v = only(serve_depends_only_on_engine(t.path()).unwrap());
        assert!(v.starts_with("crates/onebit-serve/src/lib.rs:1: "), "{v}");
        assert!(v.contains("`npu_runtime`"), "{v}");
        // A lower crate among the dependencies.
        let t = tree(&[
            (
                "crates/onebit-serve/Cargo.toml",
                &manifest.replace(
                    "[dev-dependencies]",
                    "mtp.workspace = true\n\n[dev-dependencies]",
                ),
            ),
            ("crates/onebit-serve/src/lib.rs", clean),
        ]);
        let v = only(serve_depends_only_on_engine(t.path()).unwrap());
        assert!(v.starts_with("crates/onebit-serve/Cargo.toml:7: "), "{v}");
        assert!(v.contains("depends on `mtp`"), "{v}");
        // No engine at all.
        let t = tree(&[
            (
                "crates/onebit-serve/Cargo.toml",
                "[package]\nname = \"onebit-serve\"\n",
            ),
            ("crates/onebit-serve/src/lib.rs", clean),
        ]);
        assert!(only(serve_depends_only_on_engine(t.path()).unwrap())
            .contains("does not depend on onebit-engine"));
    }

    #[test]
    fn the_binary_naming_mtp_is_found() {
        let clean = "//! Not `mtp::run` (a comment).\nuse onebit_engine::Engine;\nfn f(s: &Stats) -> usize { s.mtp + self.mtp::<u8>() }\n";
        let t = tree(&[("crates/onebit/src/run.rs", clean)]);
        assert!(binary_names_no_mtp(t.path()).unwrap().is_empty());
        let t = tree(&[
            ("crates/onebit/src/run.rs", clean),
            (
                "crates/onebit/src/bench.rs",
                "use std::fmt;\n\nfn f() -> usize {\n    mtp::DEFAULT_MAX_NGRAM\n}\n",
            ),
        ]);
        let v = only(binary_names_no_mtp(t.path()).unwrap());
        assert!(v.starts_with("crates/onebit/src/bench.rs:4: "), "{v}");
        assert!(v.contains("names `mtp`"), "{v}");
        let t = tree(&[("crates/onebit/src/serve/mod.rs", "use mtp::Stats;\n")]);
        assert!(only(binary_names_no_mtp(t.path()).unwrap())
            .starts_with("crates/onebit/src/serve/mod.rs:1: "));
    }

    #[test]
    fn a_backend_name_in_mtp_is_found_but_not_in_a_comment() {
        let t = tree(&[(
            "crates/mtp/src/lib.rs",
            "//! Not a [`CpuModel`].\nconst S: &str = \"CpuTarget\";\nuse npu_runtime::CpuModel;\n",
        )]);
        let v = only(mtp_names_no_backend(t.path()).unwrap());
        assert!(v.starts_with("crates/mtp/src/lib.rs:3: "), "{v}");
        assert!(v.contains("`CpuModel`"), "{v}");
        let t = tree(&[(
            "crates/mtp/src/x.rs",
            "fn f() { npu_runtime::npu::plan(); }\n",
        )]);
        assert!(only(mtp_names_no_backend(t.path()).unwrap()).contains("npu_runtime::npu"));
    }

    #[test]
    fn feature_detection_outside_isa_rs_is_found() {
        let t = tree(&[
            (ISA_FILE, "fn d() -> bool { is_x86_feature_detected!(\"avx2\") }\n"),
            (
                "crates/onebit-kernels/src/elementwise.rs",
                "// is_x86_feature_detected! in a comment\n\nfn f() -> bool {\n    std::arch::is_x86_feature_detected!(\"fma\")\n}\n",
            ),
        ]);
        let v = only(isa_detection_only_in_isa_rs(t.path()).unwrap());
        assert!(
            v.starts_with("crates/onebit-kernels/src/elementwise.rs:4: "),
            "{v}"
        );
    }

    #[test]
    fn unsafe_outside_the_allowed_crates_is_found() {
        let forbid = "#![forbid(unsafe_code)]\n";
        // A test file of a forbidding crate (the attribute covers only its library).
        let t = tree(&[
            ("Cargo.toml", WS),
            ("crates/a/Cargo.toml", "[package]\nname = \"a\"\n"),
            ("crates/a/src/lib.rs", forbid),
            (
                "crates/a/tests/t.rs",
                "// unsafe here is prose\nfn f() {\n    unsafe { g() }\n}\n",
            ),
            (
                "crates/b/Cargo.toml",
                "[package]\nname = \"onebit-kernels\"\n",
            ),
            ("crates/b/src/lib.rs", "pub unsafe fn f() {}\n"),
        ]);
        let v = only(unsafe_only_where_allowed(t.path()).unwrap());
        assert!(v.starts_with("crates/a/tests/t.rs:3: "), "{v}");
        // A crate root without the attribute.
        let t = tree(&[
            ("Cargo.toml", WS),
            ("crates/a/Cargo.toml", "[package]\nname = \"a\"\n"),
            ("crates/a/src/main.rs", "fn main() {}\n"),
            ("crates/b/Cargo.toml", "[package]\nname = \"b\"\n"),
            ("crates/b/src/lib.rs", forbid),
        ]);
        let v = only(unsafe_only_where_allowed(t.path()).unwrap());
        assert!(
            v.starts_with("crates/a/src/main.rs:1: ") && v.contains("forbid"),
            "{v}"
        );
        // A memory-map crate: one map is fine, a second `unsafe` is not.
        let map = "let m = unsafe { memmap2::Mmap::map(&file) };\n";
        let t = tree(&[
            ("Cargo.toml", WS),
            ("crates/a/Cargo.toml", "[package]\nname = \"q4nx-format\"\n"),
            ("crates/a/src/lib.rs", map),
            ("crates/a/src/more.rs", &format!("{map}{map}")),
            ("crates/b/Cargo.toml", "[package]\nname = \"b\"\n"),
            ("crates/b/src/lib.rs", forbid),
        ]);
        let found = unsafe_only_where_allowed(t.path()).unwrap();
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].to_string().starts_with("crates/a/src/more.rs:1: "),
            "{found:#?}"
        );
    }

    #[test]
    fn an_unused_dependency_is_found_by_its_manifest_line() {
        let t = tree(&[
            ("Cargo.toml", WS),
            (
                "crates/a/Cargo.toml",
                "[package]\nname = \"a\"\n\n[dependencies]\nserde-json.workspace = true\nhalf = \"2\"\nrenamed = { package = \"rand\", version = \"0.9\" }\n\n[dev-dependencies]\nproptest = \"1\"\n",
            ),
            // `half` only as a word and a local module, never as a crate.
            (
                "crates/a/src/lib.rs",
                "use serde_json::Value;\n/// half of it\nfn f(half: u8) -> u8 { crate::half::g(half) }\nfn r() { renamed::random(); }\n",
            ),
            ("crates/a/tests/p.rs", "use proptest::prelude::*;\n"),
            ("crates/b/Cargo.toml", "[package]\nname = \"b\"\n[build-dependencies]\ncc = \"1\"\n"),
            ("crates/b/build.rs", "fn main() { cc::Build::new(); }\n"),
        ]);
        let v = only(no_unused_dependencies(t.path()).unwrap());
        assert!(v.starts_with("crates/a/Cargo.toml:6: "), "{v}");
        assert!(v.contains("`half`"), "{v}");
    }

    #[test]
    fn a_cycle_between_binary_modules_is_found() {
        let t = tree(&[
            (
                "crates/onebit/src/main.rs",
                "mod run;\nmod bench;\nmod context;\nmod serve;\n",
            ),
            (
                "crates/onebit/src/run.rs",
                "use crate::context::len;\n\nfn f() { crate::bench::rate() }\n",
            ),
            (
                "crates/onebit/src/bench.rs",
                "use crate::{context, run::{Args, X}};\n",
            ),
            (
                "crates/onebit/src/context.rs",
                "// crate::run::Args in a comment\n",
            ),
            (
                "crates/onebit/src/serve/mod.rs",
                "use crate::run::Args;\nmod api;\n",
            ),
            ("crates/onebit/src/serve/api.rs", "use super::Job;\n"),
        ]);
        let v = only(binary_modules_acyclic(t.path()).unwrap());
        assert!(v.starts_with("crates/onebit/src/bench.rs:1: "), "{v}");
        assert!(
            v.contains("bench -> run (crates/onebit/src/bench.rs:1), run -> bench (crates/onebit/src/run.rs:3)"),
            "{v}"
        );
        // Without the back edge the same tree passes.
        std::fs::write(
            t.path().join("crates/onebit/src/run.rs"),
            "use crate::context::len;\n",
        )
        .unwrap();
        assert!(binary_modules_acyclic(t.path()).unwrap().is_empty());
    }

    #[test]
    fn a_skip_printed_past_the_log_is_found() {
        let t = tree(&[
            (
                "crates/onebit/tests/real.rs",
                "// eprintln!(\"skipped: in a comment\")\nfn f() {\n    eprintln!(\"note: not a skip\");\n    eprintln!(\n        \"Skipped: {test}: no model\"\n    );\n}\n",
            ),
            ("crates/test-support/src/lib.rs", "fn r() { eprint!(\"skip {line}\"); }\n"),
        ]);
        let v = only(skips_are_logged(t.path()).unwrap());
        assert!(v.starts_with("crates/onebit/tests/real.rs:4: "), "{v}");
    }

    #[test]
    fn code_only_blanks_comments_and_literals_but_keeps_lines() {
        let src = "let a = \"unsafe\\\" x — ü\"; // unsafe ü\n/* unsafe /* nested */ still */ let b = r#\"unsafe\"#;\nlet c = '\\''; let d: &'static str = b\"unsafe\"; unsafe {}\n";
        let code = code_only(src);
        assert_eq!(code.lines().count(), src.lines().count());
        assert_eq!(code.len(), src.len(), "byte offsets are kept");
        assert_eq!(word_lines(&code, "unsafe"), [3]);
        assert!(code.contains("&'static str"));
    }
}
