//! `cargo xtask cargo-mutants`: cargo-mutants (generated mutants, as opposed to the
//! named ones of `cargo xtask mutants`) over the `mtp` and `dflash-draft` crates.
//!
//! Installs the pinned cargo-mutants if it is missing, runs it crate by crate (or one
//! shard of it: `--shard K/N`, for CI machines that split the work), writes its output
//! under `target/cargo-mutants/out/<crate>` and prints caught / missed / timeout / unviable
//! counts. Too slow for every CI run (hundreds of mutants, each a rebuild and a test
//! run); run it nightly or before a release. Missed mutants are listed in
//! `target/cargo-mutants/out/<crate>/mutants.out/missed.txt`.

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
    let ws = crate::mutants::scratch_workspace(&root, &base)?;
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
