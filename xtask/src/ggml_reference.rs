//! `cargo xtask ggml-reference`: regenerate `fixtures/ggml-reference/` with gguf-py.
//!
//! Creates a virtual environment under `target/ggml-reference-venv`, installs
//! `gguf==0.19.0` and numpy from PyPI, and runs `xtask/scripts/ggml_reference.py`.
//! The output is committed; tests compare onebit's ggml arithmetic against it.

use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn run(_args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let venv = root.join("target/ggml-reference-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let st = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("ggml-reference: cannot run python3")?;
        if !st.success() {
            bail!("ggml-reference: python3 -m venv failed");
        }
    }
    let st = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "gguf==0.19.0",
            "numpy",
        ])
        .status()?;
    if !st.success() {
        bail!("ggml-reference: pip install gguf==0.19.0 numpy failed; is PyPI reachable?");
    }
    let out = root.join("fixtures/ggml-reference/gguf-py-0.19.0.safetensors");
    let st = Command::new(&python)
        .arg(root.join("xtask/scripts/ggml_reference.py"))
        .arg(&out)
        .status()?;
    if !st.success() {
        bail!("ggml-reference: the generator script failed");
    }
    Ok(())
}
