//! Prompt lookup from the command line: `run --lookup` (adaptive and fixed k,
//! `--compare`), `bench --lookup`, and the refusals.

mod common;
use common::{fixture, json_of, onebit};

use serde_json::Value;

const PROMPT: &str = "1,17,300,42,7,255,3,99,128,64,5,400,17,300,42";

fn run_json(dir: &str, extra: &[&str]) -> Value {
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            PROMPT,
            "--max-tokens",
            "48",
            "--ignore-eos",
            "--json",
        ])
        .args(extra)
        .arg("--model")
        .arg(fixture(dir))
        .output()
        .unwrap();
    json_of(out)
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn run_lookup_text_equals_plain_and_reports_statistics() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let plain = run_json(dir, &[]);
        assert!(plain.get("speculative").is_none());
        for extra in [
            &["--lookup"][..],
            &["--lookup", "--fixed-k", "--draft-max", "5"],
            &["--lookup", "--lookup-ngram", "2", "--draft-max", "3"],
        ] {
            let v = run_json(dir, extra);
            assert_eq!(ids(&v["tokens"]), ids(&plain["tokens"]), "{dir} {extra:?}");
            let s = &v["speculative"];
            assert_eq!(s["drafter"], "lookup");
            let fixed = extra.contains(&"--fixed-k");
            assert_eq!(s["adaptive"], !fixed, "{dir} {extra:?}");
            let draft_max = s["draft_max"].as_u64().unwrap() as usize;
            let hist = ids(&s["k_histogram"]);
            assert!(hist.len() <= draft_max + 1, "{dir} {extra:?}: {hist:?}");
            assert_eq!(
                hist.iter().sum::<u64>(),
                s["rounds"].as_u64().unwrap() + s["plain_steps"].as_u64().unwrap(),
                "{dir} {extra:?}: a choice per step"
            );
            if fixed {
                assert_eq!(hist.len(), draft_max + 1);
                assert_eq!(s["calibration_seconds"], 0.0);
            } else {
                assert!(s["calibration_seconds"].as_f64().unwrap() > 0.0);
                // Calibrated rows 1, 2 and draft_max + 1 at least.
                assert!(s["pass_costs"].as_array().unwrap().len() >= 3);
                assert!(s["speedup_vs_plain_estimate"].as_f64().unwrap() > 0.0);
            }
            let share = s["draft_share"].as_f64().unwrap();
            assert!((0.0..1.0).contains(&share));
            assert!(s["tokens_per_round"].as_f64().unwrap() >= 0.0);
            assert!(s["acceptance_by_position"].as_array().unwrap().len() <= draft_max);
        }
    }
    // tiny-llama repeats itself ("19 19 19 19", "227 227 ..."): fixed k drafts are accepted.
    let v = run_json("tiny-llama", &["--lookup", "--fixed-k"]);
    assert!(v["speculative"]["accepted"].as_u64().unwrap() > 0);
}

#[test]
fn run_lookup_compare_prints_both_decodings() {
    let v = run_json("tiny-qwen3", &["--lookup", "--compare"]);
    assert_eq!(v["texts_equal"], true);
    assert_eq!(v["plain"]["tokens"], v["speculative"]["tokens"]);
    assert_eq!(v["drafter"], "lookup (n-grams up to 4)");
    assert_eq!(v["adaptive"], true);
    // The speed-up is of decode (first token to last), the prompt's prefill aside;
    // with the same tokens it is the ratio of the decode times.
    let secs = |side: &str, key: &str| v[side][key].as_f64().unwrap();
    let decode = secs("plain", "decode_seconds") / secs("speculative", "decode_seconds");
    let speedup = v["speedup_vs_plain"].as_f64().unwrap();
    assert!(
        (speedup / decode - 1.0).abs() < 1e-9,
        "{speedup} vs {decode}"
    );
    let overall = secs("plain", "seconds") / secs("speculative", "seconds");
    let with_prefill = v["speedup_vs_plain_with_prefill"].as_f64().unwrap();
    assert!(
        (with_prefill / overall - 1.0).abs() < 1e-9,
        "{with_prefill} vs {overall}"
    );
    assert!(secs("plain", "seconds") > secs("plain", "decode_seconds"));
    assert!(v["speculative"]["stats"]["k_histogram"].is_array());
    // The terminal form says what it compares.
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            PROMPT,
            "--max-tokens",
            "24",
            "--ignore-eos",
            "--lookup",
            "--compare",
            "--fixed-k",
            "--model",
        ])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("── plain greedy decoding"), "{text}");
    assert!(text.contains("k = 7, drafter: prompt lookup"), "{text}");
    assert!(text.contains("texts equal: yes"), "{text}");
}

#[test]
fn bench_lookup_compares_with_plain_on_the_same_prompt() {
    let out = onebit()
        .args([
            "bench",
            "--json",
            "--tokens",
            "40",
            "--lookup",
            "--draft-max",
            "4",
            "--repeat",
            "2",
            "--model",
        ])
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    let v = json_of(out);
    assert_eq!(v["drafter"], "lookup");
    assert_eq!(v["repeat"], 2, "each figure is the fastest of two runs");
    let rows = v["speculative"].as_array().unwrap();
    let rules: Vec<&str> = rows.iter().map(|r| r["k_rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["adaptive k <= 4", "k = 4"]);
    for r in rows {
        assert_eq!(r["text_equals_plain"], true);
        assert!(r["speedup_vs_plain"].as_f64().unwrap() > 0.0);
        assert!(r["stats"]["k_histogram"].as_array().unwrap().len() <= 5);
    }
    assert!(v["calibration_seconds"].as_f64().unwrap() > 0.0);
}

#[test]
fn lookup_options_are_checked() {
    for (args, needle) in [
        (&["--lookup", "--lookup-ngram", "0"][..], "lookup-ngram"),
        (&["--lookup-ngram", "3"], "--lookup"),
        (&["--compare"], "--lookup"),
        (&["--lookup", "--oracle", "always"], "cannot be used with"),
    ] {
        let out = onebit()
            .args(["run", "--prompt-tokens", "1,2", "--model"])
            .arg(fixture("tiny-llama"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `bench --repeat` takes 1 to 100 repetitions and says so.
#[test]
fn bench_repeat_is_checked() {
    for bad in ["0", "101"] {
        let out = onebit()
            .args(["bench", "--lookup", "--repeat", bad, "--model"])
            .arg(fixture("tiny-llama"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "--repeat {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--repeat") && err.contains(bad),
            "--repeat {bad}: {err}"
        );
    }
}

/// Lookup keeps sampling lossless: with the same seed its tokens are plain sampling's
/// (every emitted token is one draw from the target, in order); and it runs on the
/// simulated NPU backend with the CPU backend's text.
#[test]
fn run_lookup_with_sampling_and_on_the_sim_backend() {
    let sampling = ["--temp", "0.8", "--top-p", "0.9", "--seed", "5"];
    let plain = run_json("tiny-qwen3", &sampling);
    let lookup = run_json("tiny-qwen3", &[&sampling[..], &["--lookup"]].concat());
    assert_eq!(ids(&lookup["tokens"]), ids(&plain["tokens"]));
    let other_seed = run_json(
        "tiny-qwen3",
        &["--temp", "0.8", "--top-p", "0.9", "--seed", "6", "--lookup"],
    );
    assert_ne!(
        ids(&other_seed["tokens"]),
        ids(&plain["tokens"]),
        "the seed matters"
    );

    // The sim runs the f32 family: compare at the same precision.
    let cpu = run_json("tiny-llama", &["--precision", "f32"]);
    // Fixed k: every step after the prompt drafts, whatever the machine's timings.
    let sim = run_json("tiny-llama", &["--backend", "sim", "--lookup", "--fixed-k"]);
    assert_eq!(ids(&sim["tokens"]), ids(&cpu["tokens"]));
    assert!(sim["backend"].as_str().unwrap().starts_with("sim"));
    assert!(sim["speculative"]["rounds"].as_u64().unwrap() > 0);
}

/// The adaptive default with a DFlash draft: the text is still the reference greedy
/// text, and the draft keeps drafting (its pass costs were calibrated before its layer
/// taps were set, so the tap sink holds only committed rows).
#[test]
fn run_draft_with_adaptive_k_keeps_the_reference_text() {
    let (_dir, target, draft) = common::reference_pair();
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,17,300,42,7,255,3,99,128,64",
            "--max-tokens",
            "48",
            "--ignore-eos",
            "--json",
            // z-lab's reference is float arithmetic: compare at the exact precision.
            "--precision",
            "f32",
        ])
        .arg("--model")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .output()
        .unwrap();
    let v = json_of(out);
    let reference =
        q4nx_format::Container::open(fixture("dflash-ref/reference.safetensors")).unwrap();
    let spec: Vec<u64> = reference
        .tensor("spec_tokens")
        .unwrap()
        .to_i64()
        .unwrap()
        .iter()
        .map(|&t| t as u64)
        .collect();
    assert_eq!(ids(&v["tokens"]), spec[..48]);
    let s = &v["speculative"];
    assert_eq!(s["drafter"], "dflash");
    assert_eq!(s["adaptive"], true);
    // Paid probes (a 1-draft round after 8 plain steps, backing off) guarantee rounds
    // whatever the timings; how many drafts they accept depends on the timings.
    assert!(s["rounds"].as_u64().unwrap() > 0, "{s}");
}
