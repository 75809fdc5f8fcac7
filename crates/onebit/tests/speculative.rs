//! Speculative decoding from the command line: `run --draft`, `run --oracle`,
//! `bench --oracle`, `bench --draft`.

mod common;
use common::{fixture, json_of, onebit, reference_pair};

#[test]
fn run_with_a_dflash_draft_reproduces_the_reference_and_reports_statistics() {
    let (_dir, target, draft) = reference_pair();
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,17,300,42,7,255,3,99,128,64",
            "--max-tokens",
            "48",
            "--ignore-eos",
            "--json",
            "--draft-max",
            "7",
            // z-lab's reference is float arithmetic: compare at the exact precision.
            "--precision",
            "f32",
            "--fixed-k",
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
    let spec: Vec<i64> = reference.tensor("spec_tokens").unwrap().to_i64().unwrap();
    let tokens: Vec<i64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect();
    assert_eq!(tokens, spec);
    let s = &v["speculative"];
    let rounds: Vec<u64> = s["accepted_per_round"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_u64().unwrap())
        .collect();
    // z-lab's first ten rounds (its eleventh runs past the 48th token).
    assert_eq!(rounds[..10], [3, 0, 7, 4, 4, 0, 0, 7, 3, 5]);
    assert_eq!(s["rounds"].as_u64().unwrap(), rounds.len() as u64);
    assert_eq!(s["accepted"].as_u64().unwrap(), rounds.iter().sum::<u64>());
    assert!(s["acceptance_by_position"].as_array().unwrap().len() == 7);
}

/// At the integer precisions the trained draft's speculative text equals plain decoding
/// at the same precision: per-row activation quantization keeps verify passes
/// batch-invariant. (`--fixed-k` so that every round drafts and verifies 7 rows.)
#[test]
fn speculative_text_equals_plain_text_at_the_integer_precisions() {
    let (_dir, target, draft) = reference_pair();
    for precision in ["q8", "q8x2"] {
        let run = |with_draft: bool| {
            let mut cmd = onebit();
            cmd.args(["run", "--prompt-tokens", "1,17,300,42,7,255,3,99,128,64"])
                .args(["--max-tokens", "48", "--ignore-eos", "--json"])
                .args(["--precision", precision, "--model"])
                .arg(&target);
            if with_draft {
                cmd.arg("--draft").arg(&draft).arg("--fixed-k");
            }
            json_of(cmd.output().unwrap())
        };
        let (plain, spec) = (run(false), run(true));
        assert_eq!(plain["precision"], precision);
        assert_eq!(spec["tokens"], plain["tokens"], "{precision}");
        assert!(spec["speculative"]["accepted"].as_u64().unwrap() > 0);
        assert!(spec["speculative"]["rounds"].as_u64().unwrap() > 1);
    }
}

#[test]
fn oracle_side_by_side_and_bench() {
    let out = onebit()
        .args([
            "run",
            "--prompt-tokens",
            "1,17,300",
            "--max-tokens",
            "40",
            "--ignore-eos",
            "--json",
            "--oracle",
            "every-third",
            // Fixed k: the drafted/accepted comparison must not depend on timings.
            "--fixed-k",
            "--model",
        ])
        .arg(fixture("tiny-qwen3"))
        .output()
        .unwrap();
    let v = json_of(out);
    assert_eq!(v["texts_equal"], true);
    assert_eq!(v["plain"]["tokens"], v["speculative"]["tokens"]);
    let stats = &v["speculative"]["stats"];
    assert!(stats["accepted"].as_u64().unwrap() < stats["drafted"].as_u64().unwrap());

    for rule in ["always", "never"] {
        let out = onebit()
            .args([
                "bench",
                "--json",
                "--tokens",
                "30",
                "--draft-max",
                "7",
                "--oracle",
                rule,
                "--model",
            ])
            .arg(fixture("tiny-llama"))
            .output()
            .unwrap();
        let v = json_of(out);
        let row = &v["speculative"][0];
        assert_eq!(row["text_equals_plain"], true);
        let (acc, drafted) = (
            row["stats"]["accepted"].as_u64().unwrap(),
            row["stats"]["drafted"].as_u64().unwrap(),
        );
        if rule == "always" {
            assert_eq!(acc, drafted);
        } else {
            assert_eq!(acc, 0);
        }
    }
}

#[test]
fn bench_runs_adaptive_k_then_sweeps_k_for_a_draft() {
    let (_dir, target, draft) = reference_pair();
    let out = onebit()
        .args(["bench", "--json", "--tokens", "24"])
        .arg("--model")
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .output()
        .unwrap();
    let v = json_of(out);
    let rules = test_support::strings_of(&v["speculative"], "k_rule");
    assert_eq!(
        rules[0], "adaptive k <= 7",
        "adaptive k first, as `run` decodes"
    );
    let ks: Vec<u64> = v["speculative"].as_array().unwrap()[1..]
        .iter()
        .map(|r| r["k"].as_u64().unwrap())
        .collect();
    assert_eq!(ks, [1, 2, 3, 4, 5, 6, 7]);
    assert!(v["speculative"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["text_equals_plain"] == true));
}

/// `--draft DIR --lookup` chains the two drafters: on a prompt that repeats itself, both
/// propose rounds (lookup where the output copies, the draft elsewhere), and the text
/// equals plain decoding's at the exact and the default precision.
#[test]
fn chained_lookup_and_draft_give_plain_text() {
    let (_dir, target, draft) = reference_pair();
    // A prompt whose second half repeats its first: lookup finds matches.
    let prompt = "1,17,300,42,7,255,3,99,128,64,1,17,300,42,7,255,3,99,128,64,1,17,300";
    for precision in ["f32", "q8x2"] {
        let run = |args: &[&str]| {
            let mut cmd = onebit();
            cmd.args(["run", "--prompt-tokens", prompt])
                .args(["--max-tokens", "64", "--ignore-eos", "--json"])
                .args(["--precision", precision, "--model"])
                .arg(&target)
                .args(args);
            cmd
        };
        let plain = json_of(run(&[]).output().unwrap());
        let chained = json_of(
            run(&["--lookup", "--fixed-k"])
                .arg("--draft")
                .arg(&draft)
                .output()
                .unwrap(),
        );
        assert_eq!(chained["tokens"], plain["tokens"], "{precision}");
        let s = &chained["speculative"];
        assert_eq!(s["drafter"], "lookup+dflash");
        // Rounds, drafted and accepted tokens by drafter: both drafted, and each
        // counter sums to the run's total.
        let by = &s["drafters"];
        assert_eq!(by.as_object().unwrap().len(), 2, "{by}");
        for total in ["rounds", "drafted", "accepted"] {
            let (lookup, dflash) = (
                by["lookup"][total].as_u64().unwrap(),
                by["dflash"][total].as_u64().unwrap(),
            );
            if total != "accepted" {
                assert!(lookup > 0 && dflash > 0, "{precision}: {total}: {by}");
            }
            assert_eq!(lookup + dflash, s[total].as_u64().unwrap(), "{total}: {s}");
        }
    }
}

/// `bench --lookup --draft DIR` measures the chain against each drafter alone on the
/// same prompt: every text equals plain, each row names its drafter, and the summary
/// carries the tokens per pass of all three (the chain's drafters' counters in its row).
#[test]
fn bench_compares_the_chain_with_each_drafter_alone() {
    let (_dir, target, draft) = reference_pair();
    let out = onebit()
        .args([
            "bench", "--lookup", "--json", "--repeat", "1", "--tokens", "48",
        ])
        .args(["--precision", "f32", "--model"])
        .arg(&target)
        .arg("--draft")
        .arg(&draft)
        .output()
        .unwrap();
    let v = json_of(out);
    let rows = v["speculative"].as_array().unwrap();
    let drafters: Vec<&str> = rows
        .iter()
        .map(|r| r["drafter"].as_str().unwrap())
        .collect();
    assert_eq!(
        drafters,
        ["lookup+dflash", "lookup", "dflash", "lookup+dflash"],
        "{v}"
    );
    assert!(rows.iter().all(|r| r["text_equals_plain"] == true), "{v}");
    // Each drafter alone reports only itself.
    for (row, name) in [(&rows[1], "lookup"), (&rows[2], "dflash")] {
        let by = row["stats"]["drafters"].as_object().unwrap();
        assert!(by.keys().all(|k| k == name), "{name}: {row}");
    }
    let c = &v["chain_vs_alone"];
    for who in ["chain", "lookup", "dflash"] {
        let tpp = c[who]["tokens_per_pass"].as_f64().unwrap();
        assert!(tpp >= 1.0, "{who}: {c}");
    }
    assert_eq!(c["chain"]["tokens_per_pass"], rows[0]["tokens_per_pass"]);
    assert_eq!(c["lookup"]["tokens_per_pass"], rows[1]["tokens_per_pass"]);
    assert_eq!(c["dflash"]["tokens_per_pass"], rows[2]["tokens_per_pass"]);
}
