//! `onebit serve` as a command: the flags the binary resolves before it calls the
//! `onebit-serve` crate (the default context capped by available memory, the key from
//! `ONEBIT_API_KEY`), and the server's echoed log-probabilities against `onebit
//! perplexity`. The server's routes are tested in `crates/onebit-serve/tests`.

mod common;

use std::path::{Path, PathBuf};

use common::server::Server;
use serde_json::{json, Value};
use test_support::http::client;

/// tiny-llama converted (model, config, a tokenizer that encodes) into a temp dir.
fn tiny() -> (tempfile::TempDir, PathBuf) {
    common::tiny_llama_package()
}

fn chat(content: &str, max_tokens: u64) -> Value {
    json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Without --ctx-len the context is the model's max_position_embeddings (256) capped so
/// a full-context KV cache takes at most half the available memory: on a machine
/// (ONEBIT_MEMINFO) with 128 KiB available, tiny-llama's bf16 cache (512 bytes a
/// position) gets 64 KiB, 128 positions, and the log says why; a request beyond that is
/// refused with the capped number. An explicit --ctx-len is not capped.
#[test]
fn the_default_context_is_capped_by_available_memory() {
    let (dir, pkg) = tiny();
    let meminfo = dir.path().join("meminfo");
    std::fs::write(&meminfo, "MemTotal: 1024 kB\nMemAvailable: 128 kB\n").unwrap();
    let env = [("ONEBIT_MEMINFO", meminfo.as_path())];
    let s = Server::start_env(&pkg, &[], &env, true);
    s.wait_log("ready in", 1);
    let log = s.log();
    assert!(
        log.iter().any(|l| l == "onebit: --ctx-len defaults to 128 positions: 256 would need 128.0 KiB of KV cache (bf16), more than half of the 128.0 KiB available; pass --ctx-len to choose"),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("(ctx 128,")), "{log:?}");
    let (status, e) = s.post("/v1/chat/completions", &chat("hi", 200));
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the context holds 128 tokens"),
        "{e}"
    );
    drop(s);
    let s = Server::start_env(&pkg, &["--ctx-len", "200"], &env, true);
    s.wait_log("ready in", 1);
    let log = s.log();
    assert!(
        log.iter().all(|l| !l.contains("--ctx-len defaults")),
        "{log:?}"
    );
    assert!(log.iter().any(|l| l.contains("(ctx 200,")), "{log:?}");
}

/// lm-evaluation-harness's loglikelihood request (`local-completions`: the tokenized
/// prompt as a batch of one, `echo`, `logprobs: 1`, `max_tokens` 0 or 1): every prompt
/// token's log-probability (the first null), equal to `onebit perplexity`'s per-token
/// values on the same text: the perplexity of the scored half of a 64-token window,
/// recomputed from the served values, equals the one `onebit perplexity --json`
/// reports. A drafting server (`--lookup`) serves the same values, prompt and
/// generated, bit for bit.
#[test]
fn echo_logprobs_equal_perplexity_and_speculation_changes_none() {
    let (dir, pkg) = tiny();
    let s = Server::start(&pkg, &[], true);
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(8)
        + "Pack my box with five dozen liquor jugs, and then sing a song of sixpence.";
    let file = dir.path().join("text.txt");
    std::fs::write(&file, &text).unwrap();
    let (st, v) = s.post("/tokenize", &json!({"content": text, "add_special": false}));
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let ctx = 64;
    assert!(ids.len() >= ctx, "{} tokens", ids.len());
    let window = &ids[..ctx];
    let request = |max_tokens: u64| json!({"model": "tiny-llama", "prompt": [window], "max_tokens": max_tokens, "temperature": 0, "logprobs": 1, "echo": true, "seed": 1234});
    let (st, v) = s.post("/v1/completions", &request(0));
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let values = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(values.len(), ctx);
    assert!(
        values[0].is_null() && lp["top_logprobs"][0].is_null(),
        "{lp}"
    );
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ctx);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    // The text is the prompt echoed.
    let (_, d) = s.post("/detokenize", &json!({"tokens": window}));
    assert_eq!(v["choices"][0]["text"], d["content"]);
    // onebit perplexity scores tokens ctx/2..ctx of the first window.
    let nll: Vec<f64> = values[ctx / 2..]
        .iter()
        .map(|v| -v.as_f64().unwrap())
        .collect();
    let served = (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    let out = common::onebit()
        .args([
            "perplexity",
            "--json",
            "--ctx",
            "64",
            "--windows",
            "1",
            "--threads",
            "1",
            "--model",
        ])
        .arg(&pkg)
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    let reported = common::json_of(out)["perplexity"].as_f64().unwrap();
    // The served values are f32 (about 7 digits each).
    assert!(
        ((served - reported) / reported).abs() < 1e-5,
        "served {served} vs onebit perplexity {reported}"
    );
    // max_tokens 1 (what the harness sends now): the prompt's values, then the one
    // generated token's.
    let (st, one) = s.post("/v1/completions", &request(1));
    assert_eq!(st, 200, "{one}");
    let one_values = one["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(one_values.len(), ctx + 1);
    assert_eq!(&one_values[..ctx], &values[..]);
    // Speculation changes no value: a lookup server on the same requests, and on a
    // generation long enough to accept drafts (a repetitive prompt; fixed k, so that
    // drafting does not hang on pass costs timed on a busy machine).
    let lookup = Server::start(&pkg, &["--lookup", "--fixed-k"], true);
    let (_, spec) = lookup.post("/v1/completions", &request(1));
    assert_eq!(
        spec["choices"][0]["logprobs"],
        one["choices"][0]["logprobs"]
    );
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 8][i % 4]).collect();
    let body = json!({"prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": true, "logprobs": 5});
    let (_, a) = s.post("/v1/completions", &body);
    let (_, b) = lookup.post("/v1/completions", &body);
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    assert!(
        b["timings"]["draft_n_accepted"].as_u64().unwrap() > 0,
        "{}",
        b["timings"]
    );
    let mut chat_body = chat("one two three one two three one two three", 24);
    chat_body["logprobs"] = json!(true);
    chat_body["top_logprobs"] = json!(4);
    chat_body["ignore_eos"] = json!(true);
    let (_, a) = s.post("/v1/chat/completions", &chat_body);
    let (_, b) = lookup.post("/v1/chat/completions", &chat_body);
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
}

/// `ONEBIT_API_KEY` is the key when --api-key is not given.
#[test]
fn the_api_key_may_come_from_the_environment() {
    let (_dir, pkg) = tiny();
    let env_key = Path::new("from-the-environment");
    let s = Server::start_env(&pkg, &[], &[("ONEBIT_API_KEY", env_key)], true);
    assert_eq!(s.get("/v1/models").0, 401);
    let r = client()
        .get(s.url("/v1/models"))
        .header("authorization", "Bearer from-the-environment")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// `xtask/scripts/serve_streams.py`, the tool behind issue 25's serve row, against a
/// real server with shared passes: two concurrent greedy streams and the same two one at
/// a time report their throughput, each generates its whole budget, and every concurrent
/// answer equals its alone-served one (the script exits 1 when one differs). A request
/// the server refuses, and a port where nothing listens, fail the run by name. Python 3
/// is on every machine CI runs on.
#[test]
fn the_serve_streams_script_measures_and_compares_answers() {
    let (_dir, pkg) = tiny();
    let s = Server::start(&pkg, &["--parallel", "2", "--ctx-len", "128"], true);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../xtask/scripts/serve_streams.py");
    let run = |url: &str, tokens: &str| {
        std::process::Command::new("python3")
            .arg(&script)
            .args(["--url", url, "--streams", "2", "--trials", "2"])
            .args(["--tokens", tokens])
            .env("NO_PROXY", "127.0.0.1,localhost")
            .output()
            .unwrap()
    };
    let out = run(&s.base, "12");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "serve_streams.py failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["answers_equal"], true, "{summary}");
    assert_eq!(summary["streams"], 2);
    assert_eq!(summary["ratios"].as_array().unwrap().len(), 2, "{summary}");
    // With ignore_eos every stream generates the whole budget.
    assert_eq!(summary["full_length"], true, "{summary}");
    assert_eq!(summary["completion_tokens"], json!([12, 12]), "{summary}");
    // A budget past the context: the server's refusal, with its own text, fails the run.
    let out = run(&s.base, "500");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("serve_streams: a request to") && stderr.contains("HTTP 400"),
        "{stderr}"
    );
    drop(s);
    let out = run("http://127.0.0.1:9", "12");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("serve_streams: cannot list the models of http://127.0.0.1:9"),
        "{stderr}"
    );
}
