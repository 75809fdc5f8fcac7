//! `onebit run` and `onebit bench` as a user runs them.

mod common;
use common::{fixture, json_of, onebit};

use predicates::prelude::*;
use serde_json::Value;

/// Greedy decoding from the reference prompt reproduces transformers' 24 greedy tokens
/// (every margin in both fixtures is above 0.02, far over the forward's 3e-5 error).
#[test]
fn greedy_run_reproduces_the_reference_continuation() {
    for (dir, greedy) in [
        (
            "tiny-llama",
            [
                463, 91, 227, 19, 19, 19, 19, 77, 87, 166, 105, 50, 50, 438, 91, 227, 227, 227,
                227, 227, 227, 19, 242, 269,
            ],
        ),
        (
            "tiny-qwen3",
            [
                35, 380, 218, 413, 257, 393, 264, 356, 45, 122, 437, 404, 434, 308, 348, 122, 324,
                286, 307, 133, 145, 504, 493, 459,
            ],
        ),
    ] {
        let out = onebit()
            .args([
                "run",
                "--prompt-tokens",
                "1,17,300,42,7,255,3,99,128,64,5,400",
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--json",
                "--precision",
                "f32",
                "--model",
            ])
            .arg(fixture(dir))
            .output()
            .unwrap();
        let v = json_of(out);
        let tokens: Vec<u64> = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens, greedy.map(|t| t as u64), "{dir}");
        assert_eq!(v["prompt_tokens"].as_array().unwrap().len(), 12);
        assert!(v["timings"]["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
        assert_eq!(v["stop_reason"], "max_tokens");
    }
}

#[test]
fn sampling_is_seeded_and_reproducible() {
    let run = |seed: &str| {
        let out = onebit()
            .args([
                "run",
                "--prompt-tokens",
                "1,17,300",
                "--max-tokens",
                "16",
                "--ignore-eos",
                "--json",
                "--temp",
                "0.8",
                "--top-p",
                "0.9",
                "--seed",
                seed,
                "--model",
            ])
            .arg(fixture("tiny-qwen3"))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["tokens"].clone()
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(run("7"), run("8"));
}

#[test]
fn bad_run_inputs_exit_2_by_name() {
    onebit()
        .args(["run", "--prompt-tokens", "9999", "--model"])
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "target: token id 9999 is outside the vocabulary of 512",
        ));
    onebit()
        .args(["run", "--prompt-tokens", "1", "--threads", "0", "--model"])
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--threads must be at least 1"));
    onebit()
        .args(["run", "--prompt", "hi", "--chat", "--model"])
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--chat needs a chat_template in config.json",
        ));
    onebit()
        .args([
            "run",
            "--prompt",
            "hi",
            "--chat",
            "--chat-template",
            "/nonexistent/t.jinja",
            "--model",
        ])
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--chat-template /nonexistent/t.jinja: cannot read it",
        ));
    onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1",
            "--head",
            "embedding",
            "--model",
        ])
        .arg(fixture("tiny-qwen3"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("tie_word_embeddings"));
}

/// Every sampling flag reaches the sampler: greedy with strong penalties is another
/// text than plain greedy (the penalties change the argmax), top-k 1 at a high
/// temperature is greedy, and a seed replays a penalized sampled run.
/// `--chat-template FILE` gives a package without a template a chat prompt: the rendered
/// text is what the model is prompted with (`--json` reports its tokens).
#[test]
fn a_chat_template_file_makes_the_chat_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.jinja");
    std::fs::write(
        &file,
        "{% for m in messages %}{{ m.content }} {% endfor %}{% if add_generation_prompt %}ok{% endif %}",
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = onebit()
            .args(["run", "--json", "--max-tokens", "1", "--model"])
            .arg(fixture("tiny-qwen3"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["prompt_tokens"].clone()
    };
    let chat = run(&[
        "--chat",
        "--chat-template",
        file.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    let raw = run(&["--prompt", "hi ok"]);
    assert!(chat.as_array().is_some_and(|ids| !ids.is_empty()), "{chat}");
    assert_eq!(chat, raw, "the chat prompt is the file's rendering");
}

#[test]
fn sampling_flags_reach_the_sampler() {
    let run = |extra: &[&str]| -> String {
        let out = onebit()
            .args([
                "run",
                "--prompt-tokens",
                "1,17,300,42",
                "--max-tokens",
                "24",
                "--ignore-eos",
                "--json",
            ])
            .args(extra)
            .arg("--model")
            .arg(fixture("tiny-qwen3"))
            .output()
            .unwrap();
        json_of(out)["tokens"].to_string()
    };
    let greedy = run(&[]);
    assert_ne!(
        run(&[
            "--repeat-penalty",
            "3",
            "--repeat-last-n",
            "-1",
            "--presence-penalty",
            "2",
            "--frequency-penalty",
            "2"
        ]),
        greedy
    );
    assert_eq!(run(&["--temp", "5", "--top-k", "1", "--seed", "9"]), greedy);
    let sampled = [
        "--temp",
        "1.2",
        "--top-k",
        "50",
        "--min-p",
        "0.01",
        "--top-p",
        "0.95",
        "--repeat-penalty",
        "1.3",
        "--seed",
        "4",
    ];
    assert_eq!(run(&sampled), run(&sampled));
}

/// Sampling parameters are checked by the library (`mtp::SamplingConfig::check`)
/// before the model is opened: exit 2 with the parameter and its value.
#[test]
fn out_of_range_sampling_parameters_exit_2_by_value() {
    for (flag, value, message) in [
        (
            "--temp",
            "nan",
            "sampling: temperature must be a finite number >= 0, got NaN",
        ),
        (
            "--temp",
            "-1",
            "sampling: temperature must be a finite number >= 0, got -1",
        ),
        (
            "--top-p",
            "0",
            "sampling: top_p must be a number in (0, 1], got 0",
        ),
        (
            "--top-p",
            "1.5",
            "sampling: top_p must be a number in (0, 1], got 1.5",
        ),
        (
            "--min-p",
            "1.5",
            "sampling: min_p must be a number in [0, 1], got 1.5",
        ),
        (
            "--repeat-penalty",
            "0",
            "sampling: repeat_penalty must be a finite number > 0 (1 is off), got 0",
        ),
        (
            "--presence-penalty",
            "-2.5",
            "sampling: presence_penalty must be a number in [-2, 2], got -2.5",
        ),
        (
            "--frequency-penalty",
            "3",
            "sampling: frequency_penalty must be a number in [-2, 2], got 3",
        ),
        (
            "--repeat-last-n",
            "-2",
            "--repeat-last-n must be a count of tokens or -1 (the whole context), got '-2'",
        ),
    ] {
        onebit()
            .args(["run", "--prompt-tokens", "1,2", "--max-tokens", "3"])
            .arg(format!("{flag}={value}"))
            .arg("--model")
            .arg(fixture("tiny-qwen3"))
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(message));
    }
}

#[test]
fn bench_reports_json() {
    let out = onebit()
        .args([
            "bench",
            "--json",
            "--decode-tokens",
            "4",
            "--prefill-tokens",
            "8",
            "--model",
        ])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    let v = json_of(out);
    assert!(v["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(v["read_bandwidth_gb_s"].as_f64().unwrap() > 0.0);
    // The default KV type on the CPU backend at the default (integer) precision.
    assert_eq!(v["kv_type"], "bf16");
    let passes = v["passes"].as_array().unwrap();
    assert_eq!(
        passes
            .iter()
            .map(|p| p["rows"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 4, 8, 16]
    );
    // Each pass's figures are consistent with its own timing: the cost is its time over
    // the 1-row pass's time, the rate its rows over its seconds (the old check,
    // `cost_vs_1_row == 1.0` on the 1-row pass, held by construction).
    let ms_of = |p: &Value| p["ms"].as_f64().unwrap();
    let one = ms_of(&passes[0]);
    assert!(one > 0.0);
    for p in passes {
        let (ms, rows) = (ms_of(p), p["rows"].as_f64().unwrap());
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
        assert!(close(p["cost_vs_1_row"].as_f64().unwrap(), ms / one), "{p}");
        assert!(
            close(p["rows_per_second"].as_f64().unwrap(), rows / (ms / 1e3)),
            "{p}"
        );
    }
}

/// `bench --profile`: per row count, a time for every stage of the pass, which add up to
/// no more than the pass (the rest is "other"); the stages that every pass runs took
/// time; the table has a line per row count. Without --profile there is no profile.
#[test]
fn bench_profile_times_every_stage() {
    let bench = |extra: &[&str]| {
        onebit()
            .arg("bench")
            .args(extra)
            .args(["--decode-tokens", "2", "--prefill-tokens", "8", "--model"])
            .arg(fixture("tiny-llama"))
            .output()
            .unwrap()
    };
    let v = json_of(bench(&["--json", "--profile"]));
    let profile = v["profile"].as_array().unwrap();
    assert_eq!(
        profile
            .iter()
            .map(|p| p["rows"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 2, 4, 8, 16]
    );
    for p in profile {
        let stages = p["stages_ms"].as_object().unwrap();
        let names: Vec<&str> = stages.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "embed",
                "norms",
                "quantize",
                "projections",
                "rope",
                "kv-append",
                "attention",
                "activation",
                "residual",
                "head",
                "other"
            ]
        );
        let sum: f64 = stages.values().map(|t| t.as_f64().unwrap()).sum();
        let pass = p["ms"].as_f64().unwrap();
        assert!(
            (sum - pass).abs() <= 1e-6 * pass.max(1.0),
            "stages add up to the pass: {p}"
        );
        for stage in ["norms", "quantize", "projections", "attention", "head"] {
            assert!(
                stages[stage].as_f64().unwrap() > 0.0,
                "{stage} untimed: {p}"
            );
        }
    }
    assert_eq!(
        json_of(bench(&["--json"]))["profile"],
        serde_json::json!([])
    );
    let text = String::from_utf8(bench(&["--profile"]).stdout).unwrap();
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("where a pass's time goes"))
        .skip(2)
        .collect();
    let counts: Vec<&str> = table
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(counts, ["1", "2", "4", "8", "16"], "{text}");
}

/// `--kv-type` picks the KV cache's storage and reports it; `auto` is f32 at
/// `--precision f32` (the exact reference) and bf16 at the integer precisions.
#[test]
fn kv_type_is_chosen_and_reported() {
    for (args, want) in [
        (&["--kv-type", "q8"][..], "q8"),
        (&["--kv-type", "f32"][..], "f32"),
        (&["--precision", "f32"][..], "f32"),
        (&["--precision", "q8"][..], "bf16"),
    ] {
        let out = onebit()
            .args([
                "run",
                "--json",
                "--prompt-tokens",
                "1,2,3",
                "--max-tokens",
                "3",
            ])
            .args(args)
            .arg("--model")
            .arg(fixture("tiny-qwen3"))
            .output()
            .unwrap();
        let v = json_of(out);
        assert_eq!(v["kv_type"], want, "{args:?}");
        assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    }
}

/// A prompt plus `--max-tokens` beyond the context is refused before any work, with
/// both numbers; `--ctx-len` above the model's positions is refused; without
/// `--max-tokens` the run stops where the context ends.
#[test]
fn context_limits_are_refused_by_name() {
    for (args, message) in [
        (
            &["--max-tokens", "300"][..],
            "the prompt (3 tokens) plus max_tokens (300) exceeds the context size (256 tokens)",
        ),
        (
            &["--ctx-len", "10", "--max-tokens", "8"][..],
            "the prompt (3 tokens) plus max_tokens (8) exceeds the context size (10 tokens)",
        ),
        (
            &["--ctx-len", "3"][..],
            "the prompt (3 tokens) leaves no room to generate in the context size (3 tokens)",
        ),
        (
            &["--ctx-len", "300"][..],
            "--ctx-len 300 exceeds the model's max_position_embeddings 256",
        ),
    ] {
        onebit()
            .args(["run", "--prompt-tokens", "1,2,3"])
            .args(args)
            .arg("--model")
            .arg(fixture("tiny-qwen3"))
            .assert()
            .code(2)
            .stdout("")
            .stderr(predicate::str::contains(message));
    }
    let out = onebit()
        .args(["run", "--json", "--ignore-eos", "--prompt-tokens", "1,2,3"])
        .args(["--ctx-len", "8", "--model"])
        .arg(fixture("tiny-qwen3"))
        .output()
        .unwrap();
    let v = json_of(out);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(v["stop_reason"], "max_tokens");
}

/// `bench --context N` prefills N tokens and measures at that depth; a benchmark that
/// does not fit the context is refused with the numbers.
#[test]
fn bench_context_mode() {
    let out = onebit()
        .args([
            "bench",
            "--json",
            "--context",
            "100",
            "--decode-tokens",
            "4",
        ])
        .arg("--model")
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    let v = json_of(out);
    assert_eq!(v["context"], 100);
    assert_eq!(v["prefill_tokens"], 100);
    assert!(v["decode_tokens_per_second"].as_f64().unwrap() > 0.0);
    onebit()
        .args(["bench", "--context", "240", "--decode-tokens", "4", "--model"])
        .arg(fixture("tiny-llama"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "bench: 240 prompt tokens + 4 decode steps + a 16-row pass need 260 positions, more than the context of 256",
        ));
}

/// A machine with `kib` KiB available, as `/proc/meminfo` says it (for ONEBIT_MEMINFO).
fn meminfo(kib: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meminfo");
    std::fs::write(
        &path,
        format!("MemTotal: 4096 kB\nMemFree: 1 kB\nMemAvailable: {kib} kB\n"),
    )
    .unwrap();
    (dir, path)
}

/// Without `--ctx-len` the context is the model's max_position_embeddings (256) capped
/// so a full-context KV cache takes at most half the available memory, and the reason is
/// printed: with 128 KiB available, tiny-qwen3's bf16 cache (2 layers x 2 kv heads x K
/// and V x 32 x 2 bytes = 512 bytes a position) gets 64 KiB, 128 positions; at f32, 64.
/// An explicit `--ctx-len` is taken as given; unreadable memory means no cap, silently.
#[test]
fn the_default_context_is_capped_by_available_memory() {
    let (_dir, mem) = meminfo(128);
    let reason = "onebit: --ctx-len defaults to 128 positions: 256 would need 128.0 KiB of KV cache (bf16), more than half of the 128.0 KiB available; pass --ctx-len to choose\n";
    let run = |args: &[&str], mem: &std::path::Path| {
        let mut c = onebit();
        c.env("ONEBIT_MEMINFO", mem)
            .args(["run", "--json", "--ignore-eos", "--prompt-tokens", "1,2,3"])
            .args(args)
            .arg("--model")
            .arg(fixture("tiny-qwen3"));
        c
    };
    run(&["--max-tokens", "200"], &mem)
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::starts_with(reason))
        .stderr(predicate::str::contains(
            "the prompt (3 tokens) plus max_tokens (200) exceeds the context size (128 tokens)",
        ));
    let out = run(&[], &mem).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), reason);
    assert_eq!(json_of(out)["tokens"].as_array().unwrap().len(), 125);
    run(&["--kv-type", "f32", "--max-tokens", "100"], &mem)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "onebit: --ctx-len defaults to 64 positions: 256 would need 256.0 KiB of KV cache (f32), more than half of the 128.0 KiB available",
        ))
        .stderr(predicate::str::contains("exceeds the context size (64 tokens)"));
    for args in [
        &["--ctx-len", "200", "--max-tokens", "150"][..],
        &["--max-tokens", "200"],
    ] {
        let mem = match args[0] {
            "--ctx-len" => mem.clone(),
            _ => std::path::PathBuf::from("/nonexistent/meminfo"),
        };
        let out = run(args, &mem).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{args:?}");
        assert!(out.status.success(), "{args:?}");
    }
    onebit()
        .env("ONEBIT_MEMINFO", &mem)
        .args(["bench", "--context", "120", "--decode-tokens", "4", "--model"])
        .arg(fixture("tiny-llama"))
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with(reason))
        .stderr(predicate::str::contains(
            "bench: 120 prompt tokens + 4 decode steps + a 16-row pass need 140 positions, more than the context of 128",
        ));
}

/// A chat template's `raise_exception` reaches the user as a named error with the
/// template's own text (here Gemma 2's refusal of a system turn).
#[test]
fn a_template_refusal_is_a_named_error() {
    let (_dir, pkg) = common::tiny_llama_package();
    let config_path = pkg.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["chat_template"] = Value::from(
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
         {% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}",
    );
    std::fs::write(&config_path, config.to_string()).unwrap();
    onebit()
        .args([
            "run",
            "--chat",
            "--system",
            "S",
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--model",
        ])
        .arg(&pkg)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "onebit: error: the chat template refused the messages: System role not supported",
        ));
    // Without the system turn the same template renders and the run answers.
    onebit()
        .args([
            "run",
            "--chat",
            "--prompt",
            "hi",
            "--max-tokens",
            "2",
            "--model",
        ])
        .arg(&pkg)
        .assert()
        .success();
}

/// `onebit run` with no prompt on a terminal chats turn by turn, reusing the KV cache
/// (the second turn reports reused prompt tokens); `/exit` quits. The terminal is a
/// pseudo-terminal from util-linux `script`.
#[test]
fn interactive_run_chats_over_turns_on_a_terminal() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        test_support::skip!(
            "interactive_run_chats_over_turns_on_a_terminal",
            "util-linux `script` (a pseudo-terminal) is not installed"
        );
        return;
    }
    let (_dir, pkg) = common::tiny_llama_package();
    let command = format!(
        "{} run --model {} --max-tokens 6 --threads 1",
        env!("CARGO_BIN_EXE_onebit"),
        pkg.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .write_stdin_lines(&["Hello there", "And again", "/exit"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("onebit: chatting with tiny"), "{text}");
    let turns: Vec<&str> = text.lines().filter(|l| l.contains(" tokens, ")).collect();
    assert_eq!(turns.len(), 2, "{text}");
    assert!(turns[0].contains(", 0 reused"), "{text}");
    assert!(
        !turns[1].contains(", 0 reused"),
        "the second turn reuses the first: {text}"
    );
}

/// The interactive chat takes its context by the same rule: capped by available memory
/// with the reason printed before the chat starts, and a turn beyond it refused with
/// the capped number (the chat goes on).
#[test]
fn interactive_run_states_a_capped_context() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        test_support::skip!(
            "interactive_run_states_a_capped_context",
            "util-linux `script` (a pseudo-terminal) is not installed"
        );
        return;
    }
    let (_dir, pkg) = common::tiny_llama_package();
    let (_mem_dir, mem) = meminfo(64);
    let command = format!(
        "{} run --model {} --max-tokens 100 --threads 1",
        env!("CARGO_BIN_EXE_onebit"),
        pkg.display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("ONEBIT_MEMINFO", &mem)
        .write_stdin_lines(&["Hello there", "/exit"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("onebit: --ctx-len defaults to 64 positions: 256 would need 128.0 KiB of KV cache (bf16), more than half of the 64.0 KiB available; pass --ctx-len to choose"),
        "{text}"
    );
    assert!(
        text.contains("exceeds the context size (64 tokens)"),
        "{text}"
    );
}

/// Feeds lines to a child's standard input, slowly enough for a terminal program to
/// read them one turn at a time, and collects its output.
trait WriteStdinLines {
    fn write_stdin_lines(&mut self, lines: &[&str]) -> std::process::Output;
}

impl WriteStdinLines for std::process::Command {
    fn write_stdin_lines(&mut self, lines: &[&str]) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        for line in lines {
            std::thread::sleep(std::time::Duration::from_millis(200));
            writeln!(stdin, "{line}").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        drop(stdin);
        child.wait_with_output().unwrap()
    }
}

/// Streaming text through tiny-llama's converted tokenizer (byte-fallback tokens under a
/// SentencePiece decoder: emitted text can read otherwise once later bytes arrive) never
/// stalls: over many token sequences mixing stray bytes and word pieces, the word pieces
/// at the end of each always come out, as they read on their own.
#[test]
fn streamed_text_never_stalls_on_stray_bytes() {
    use onebit_engine::{Detokenizer, Text};
    let (_dir, package) = common::tiny_llama_package();
    let text = Text::open(&package).unwrap().unwrap();
    // Word pieces without the leading-space marker read the same alone and in context.
    let words = [300u32, 304, 305, 307, 308];
    let mut s = 0x2545F4914F6CDD1Du64;
    let mut next = |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    };
    let mut stalled = 0;
    for case in 0..300 {
        let mut ids: Vec<u32> = (0..8)
            .map(|_| match next(3) {
                0 => 3 + next(256) as u32, // a byte token <0x00>..<0xFF>
                _ => 259 + next(253) as u32,
            })
            .collect();
        ids.extend([words[case % 5], words[(case + 1) % 5]]);
        let mut detok = Detokenizer::default();
        let mut streamed = String::new();
        for &id in &ids {
            streamed += &detok.push(&text, id).unwrap();
        }
        streamed += &detok.flush(&text).unwrap();
        let tail = text.decode(&ids[ids.len() - 2..]).unwrap();
        if !streamed.ends_with(&tail) {
            stalled += 1;
            eprintln!("case {case}: {ids:?} streamed {streamed:?}, tail {tail:?}");
        }
    }
    assert_eq!(stalled, 0, "streams that dropped their last words");
}
