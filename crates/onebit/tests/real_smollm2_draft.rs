//! A DFlash draft that never guesses right, on the real model: the synthetic draft of
//! SmolLM2 geometry (`dflash_draft::synthetic::smollm2_config`, random weights) over
//! SmolLM2-135M-Instruct (`cargo xtask fetch-model smollm2`). Skipped by name when the
//! model has not been fetched.

mod common;

use common::{json_of, onebit};
use serde_json::Value;

/// Greedy text with the random draft equals plain text, at adaptive k (the default:
/// it falls to plain steps) and at fixed k = 7 (every round drafts a whole block and
/// the target rejects it), and the draft package passes the checks against the target.
#[test]
fn real_smollm2_random_draft_text_equals_plain() {
    let Some(pkg) =
        test_support::fetched_model!("smollm2", "real_smollm2_random_draft_text_equals_plain")
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    dflash_draft::synthetic::write_synthetic(
        dir.path(),
        &dflash_draft::synthetic::smollm2_config(),
        135,
    )
    .unwrap();
    let run = |extra: &[&str]| -> Value {
        json_of(
            onebit()
                .args([
                    "run",
                    "--chat",
                    "--json",
                    "--ignore-eos",
                    "--max-tokens",
                    "40",
                ])
                .args([
                    "--prompt",
                    "Tell me about the history of the printing press.",
                ])
                .arg("--model")
                .arg(&pkg)
                .args(extra)
                .output()
                .unwrap(),
        )
    };
    let plain = run(&[]);
    let draft = dir.path().to_str().unwrap();
    for extra in [
        &["--draft", draft][..],
        &["--draft", draft, "--fixed-k"][..],
    ] {
        let v = run(extra);
        assert_eq!(v["tokens"], plain["tokens"], "{extra:?}");
        let s = &v["speculative"];
        assert_eq!(s["drafter"], "dflash");
        eprintln!(
            "{extra:?}: {} rounds, {} plain steps, {}/{} drafts accepted, k histogram {}",
            s["rounds"], s["plain_steps"], s["accepted"], s["drafted"], s["k_histogram"]
        );
        // Adaptive k follows this machine's timings, so only fixed k is held to its
        // rounds: every one drafts and is verified.
        if extra.contains(&"--fixed-k") {
            assert_eq!(s["plain_steps"], 0, "fixed k drafts every round: {s}");
            assert!(s["rounds"].as_u64().unwrap() > 0, "{s}");
        }
    }
}
