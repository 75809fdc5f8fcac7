//! `cargo xtask client-env`: a Python virtual environment at `target/client-venv` holding
//! the official `openai` and `ollama` clients, pinned with every dependency in
//! `xtask/scripts/clients-requirements.txt` (installed `--no-deps`, wheels only, so
//! nothing is resolved or compiled). The serve tests that drive `onebit serve` with them
//! (`crates/onebit/tests/serve_clients.rs`) skip by name without it. A venv already
//! holding exactly these pins (its stamp file) is kept: a second run costs nothing.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::workspace_root;

/// Where the environment is made.
pub fn venv_dir() -> PathBuf {
    workspace_root().join("target/client-venv")
}

/// The pins.
fn requirements() -> PathBuf {
    workspace_root().join("xtask/scripts/clients-requirements.txt")
}

/// The file recording which pins the venv holds.
const STAMP: &str = "onebit-requirements.txt";

pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("client-env: takes no arguments, got '{a}'");
    }
    let venv = venv_dir();
    let reqs_path = requirements();
    let reqs = std::fs::read_to_string(&reqs_path)
        .with_context(|| format!("client-env: cannot read {}", reqs_path.display()))?;
    let python = venv.join("bin/python");
    let stamp = venv.join(STAMP);
    if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(reqs.as_str()) {
        println!(
            "client-env: {} already holds the pinned clients",
            venv.display()
        );
        return Ok(());
    }
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .with_context(|| format!("client-env: cannot remove the old {}", venv.display()))?;
    }
    run_step(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv",
    )?;
    run_step(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "-r",
            ])
            .arg(&reqs_path),
        "pip install -r xtask/scripts/clients-requirements.txt",
    )?;
    // The clients import: a wheel that installed but cannot load fails here, not in a test.
    run_step(
        Command::new(&python).args([
            "-c",
            "import openai, ollama; print('client-env: openai', openai.__version__, '+ ollama')",
        ]),
        "import openai, ollama",
    )?;
    std::fs::write(&stamp, &reqs)
        .with_context(|| format!("client-env: cannot write {}", stamp.display()))?;
    println!("client-env: made {}", venv.display());
    Ok(())
}

fn run_step(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("client-env: cannot run {what}"))?;
    if !status.success() {
        bail!("client-env: {what} failed ({status})");
    }
    Ok(())
}
