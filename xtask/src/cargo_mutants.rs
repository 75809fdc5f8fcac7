//! `cargo xtask cargo-mutants`: cargo-mutants (generated mutants, as opposed to the
//! named ones of `cargo xtask mutants`) over the `mtp` and `dflash-draft` crates.
//!
//! Installs the pinned cargo-mutants if it is missing, runs it crate by crate (or one
//! shard of it: `--shard K/N`, for CI machines that split the work), writes its output
//! under `target/cargo-mutants/out/<crate>` and prints caught / missed / timeout / unviable
//! counts. Too slow for every CI run (hundreds of mutants, each a rebuild and a test
//! run); run it nightly or before a release. Missed mutants are listed in
//! `target/cargo-mutants/out/<crate>/mutants.out/missed.txt`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The cargo-mutants release this project's settings were checked with.
const CARGO_MUTANTS_VERSION: &str = "27.1.0";

/// The crates it covers.
const CRATES: &[&str] = &["mtp", "dflash-draft"];

pub fn run(args: &[String]) -> Result<()> {
    let mut crates: Vec<String> = Vec::new();
    let mut shard: Option<String> = None;
    let mut files: Vec<String> = Vec::new();
    let mut passthrough: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            // Everything after `--` goes to cargo-mutants as is (e.g. `-- --iterate`
            // to retest only what the previous run did not catch).
            "--" => {
                passthrough.extend(it.by_ref().cloned());
                break;
            }
            "--shard" => shard = Some(it.next().context("--shard needs K/N")?.clone()),
            "--file" => files.push(it.next().context("--file needs a path")?.clone()),
            name if CRATES.contains(&name) => crates.push(name.to_string()),
            other => bail!(
                "cargo-mutants: unknown argument '{other}' (crates: {}; options: --shard K/N, --file PATH, -- ARGS for cargo-mutants)",
                CRATES.join(", ")
            ),
        }
    }
    if crates.is_empty() {
        crates = CRATES.iter().map(|c| c.to_string()).collect();
    }
    ensure_installed()?;
    let root = crate::workspace_root();
    // cargo-mutants mutates in place here: a scratch copy beside which `../shared`
    // resolves, never the working tree.
    let base = root.join("target/cargo-mutants");
    let ws = scratch_workspace(&root, &base)?;
    let mut summary = Vec::new();
    for krate in &crates {
        let out = base.join("out").join(krate);
        std::fs::create_dir_all(&out)?;
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&ws)
            .env("CARGO_TARGET_DIR", ws.join("target"))
            .args([
                "mutants",
                "--in-place",
                "--package",
                krate,
                "--timeout",
                "300",
                "--output",
            ])
            .arg(&out);
        if let Some(shard) = &shard {
            cmd.args(["--shard", shard]);
        }
        for file in &files {
            cmd.args(["--file", file]);
        }
        cmd.args(&passthrough);
        eprintln!("cargo-mutants: {krate} (output in {})", out.display());
        // cargo-mutants exits non-zero when mutants are missed; the counts say why.
        let status = cmd.status().context("cannot run cargo mutants")?;
        let outcomes = out.join("mutants.out/outcomes.json");
        let text = std::fs::read_to_string(&outcomes)
            .with_context(|| format!("cargo mutants wrote no {}", outcomes.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)?;
        let count = |key: &str| json[key].as_u64().unwrap_or(0);
        summary.push(format!(
            "{krate:<14} {:>6} {:>7} {:>7} {:>8} {:>9}   (exit {})",
            count("total_mutants"),
            count("caught"),
            count("missed"),
            count("timeout"),
            count("unviable"),
            status.code().unwrap_or(-1)
        ));
    }
    println!("\ncrate           total  caught  missed  timeout  unviable");
    for line in summary {
        println!("{line}");
    }
    Ok(())
}

fn ensure_installed() -> Result<()> {
    let installed = Command::new("cargo")
        .args(["mutants", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if installed {
        return Ok(());
    }
    eprintln!("cargo-mutants: installing cargo-mutants {CARGO_MUTANTS_VERSION} from crates.io");
    let status = Command::new("cargo")
        .args([
            "install",
            "--locked",
            "cargo-mutants",
            "--version",
            CARGO_MUTANTS_VERSION,
        ])
        .status()
        .context("cannot run cargo install")?;
    if !status.success() {
        bail!("cargo-mutants: `cargo install cargo-mutants` failed");
    }
    Ok(())
}

/// A scratch copy of the workspace's tracked files at `base/ws`, with `base/shared`
/// linked to the reference fixtures (tests find them at `../shared`). Only changed
/// files are rewritten, so builds there stay incremental.
fn scratch_workspace(root: &Path, base: &Path) -> Result<PathBuf> {
    let ws = base.join("ws");
    std::fs::create_dir_all(&ws)?;
    let shared_link = base.join("shared");
    if !shared_link.exists() {
        #[cfg(unix)]
        std::os::unix::fs::symlink(
            root.join("../shared")
                .canonicalize()
                .context("cargo-mutants: ../shared is missing")?,
            &shared_link,
        )?;
    }
    copy_tree(root, &ws)?;
    Ok(ws)
}

fn copy_tree(root: &Path, dest: &Path) -> Result<()> {
    for rel in crate::git_files(root, &[], "cargo-mutants")? {
        let (src, dst) = (root.join(&rel), dest.join(&rel));
        if !src.exists() {
            continue;
        }
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // Only rewrite changed files, so the scratch build stays incremental. A file new
        // to the scratch keeps the tree's mtime; a file that changed is stamped now, so
        // its crate rebuilds.
        match std::fs::read(&dst).ok() {
            Some(old) if old == std::fs::read(&src)? => {}
            Some(_) => {
                std::fs::copy(&src, &dst)?;
            }
            None => {
                std::fs::copy(&src, &dst)?;
                let modified = std::fs::metadata(&src)?.modified()?;
                std::fs::File::options()
                    .write(true)
                    .open(&dst)?
                    .set_modified(modified)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracked file new to the scratch keeps the tree's mtime; one whose content
    /// changed is stamped anew (so it rebuilds).
    #[test]
    fn the_scratch_keeps_mtimes_of_new_files_and_stamps_changed_ones() {
        let tree = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .args(args)
                .current_dir(tree.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        let src = tree.path().join("a.rs");
        std::fs::write(&src, "one").unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
        std::fs::File::options()
            .write(true)
            .open(&src)
            .unwrap()
            .set_modified(old)
            .unwrap();
        git(&["add", "a.rs"]);
        let scratch = tempfile::tempdir().unwrap();
        copy_tree(tree.path(), scratch.path()).unwrap();
        let copy = scratch.path().join("a.rs");
        let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
        assert_eq!(mtime(&copy), old);
        std::fs::write(&src, "two").unwrap();
        copy_tree(tree.path(), scratch.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "two");
        assert!(mtime(&copy) > old);
    }
}
