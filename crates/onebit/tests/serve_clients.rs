//! `onebit serve` on the real SmolLM2 as the official Python clients use it: the pinned
//! `openai` (1.x) and `ollama` (0.6.3) packages of `cargo xtask client-env`
//! (`target/client-venv`) run `xtask/scripts/clients_check.py` against a server started
//! with `--api-key`. Skipped by name when the model (`cargo xtask fetch-model smollm2`)
//! or the venv (`cargo xtask client-env`) is missing; `.ci/run` makes both.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::server::Server;
use serde_json::json;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every check of the script: each must report `ok` (a check the script lost would
/// otherwise pass unseen).
const CHECKS: &[&str] = &[
    "unauthorized_without_the_key",
    "authorized_with_the_key",
    "models_list_and_retrieve",
    "chat_and_stream_with_usage",
    "regenerate_without_a_seed_differs",
    "seeded_replays_are_equal",
    "chat_logprobs_shapes",
    "echo_logprobs_equal_perplexity",
    "ollama_list_show_chat_latest",
    "ollama_preload_and_unload",
];

/// The served echo log-probabilities are f32 roundings of the f64 values `onebit
/// perplexity` computes from the same logits (the same log-softmax in f64, over the
/// same rows): they differ by at most half an f32 ulp of the value, under 1e-6 for
/// log-probabilities above -16. The tolerance allows that rounding and nothing more.
const ECHO_TOLERANCE: f64 = 2e-6;

const KEY: &str = "the-clients-key";

/// The clients' checks (see `clients_check.py` for each one).
#[test]
fn the_openai_and_ollama_python_clients_work_against_smollm2() {
    let test = "the_openai_and_ollama_python_clients_work_against_smollm2";
    let Some(pkg) = test_support::fetched_model!("smollm2", test) else {
        return;
    };
    let python = workspace().join("target/client-venv/bin/python");
    if !python.exists() {
        test_support::skip!(
            test,
            "the Python clients are not installed in target/client-venv (run `cargo xtask client-env`)"
        );
        return;
    }
    // The reference: onebit perplexity's per-token values over one 64-token window.
    let dir = tempfile::tempdir().unwrap();
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(6)
        + "Pack my box with five dozen liquor jugs, and then sing a song of sixpence, a pocket full of rye.";
    let file = dir.path().join("text.txt");
    std::fs::write(&file, &text).unwrap();
    let ctx = 64usize;
    let out = common::onebit()
        .args(["perplexity", "--json", "--token-logprobs", "--windows", "1"])
        .args(["--ctx", &ctx.to_string(), "--threads", "1", "--model"])
        .arg(&pkg)
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    let reference = common::json_of(out);
    let s = Server::start(&pkg, &["--api-key", KEY, "--alias", "smollm2"], true);
    let r = test_support::http::client()
        .post(s.url("/tokenize"))
        .bearer_auth(KEY)
        .json(&json!({"content": text, "add_special": false}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let ids: serde_json::Value = r.json().unwrap();
    let ids = ids["tokens"].as_array().unwrap();
    assert!(ids.len() >= ctx, "{} tokens", ids.len());
    let expect = json!({
        "base": s.base,
        "model": "smollm2",
        "api_key": KEY,
        "window": ids[..ctx],
        "first_scored": reference["first_scored"],
        "token_logprobs": reference["token_logprobs"],
        "tolerance": ECHO_TOLERANCE,
    });
    let expect_file = dir.path().join("expect.json");
    std::fs::write(&expect_file, expect.to_string()).unwrap();
    let script = workspace().join("xtask/scripts/clients_check.py");
    let mut cmd = Command::new(&python);
    cmd.arg(&script).arg(&expect_file);
    // Nothing of the caller's environment steers the clients elsewhere.
    for var in [
        "OLLAMA_HOST",
        "OLLAMA_API_KEY",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("NO_PROXY", "127.0.0.1,localhost");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "clients_check.py failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        s.log().join("\n")
    );
    for check in CHECKS {
        assert!(
            stdout.lines().any(|l| l == format!("ok {check}")),
            "check {check} did not pass:\n{stdout}\n{stderr}"
        );
    }
}
