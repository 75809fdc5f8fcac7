//! `onebit perplexity` against a float64 computation made here from the library's own
//! logits: the same windows, the same scored positions, an independent log-sum-exp.

mod common;
use common::{fixture, json_of, onebit};

use npu_runtime::{CpuTarget, Forward, Precision, TargetPackage};

const TEXT: &str = "The quick brown fox jumps over the lazy dog. A journey of a thousand miles \
begins with a single step. All that glitters is not gold, and every cloud has a silver lining. \
Where there is a will, there is a way; the early bird catches the worm, they say. Time flies.";

/// -log p(token) by log-sum-exp with the sum taken in sorted order (another order than
/// the command's), in float64.
fn nll(row: &[f32], token: usize) -> f64 {
    let mut v: Vec<f64> = row.iter().map(|&x| x as f64).collect();
    v.sort_by(|a, b| b.total_cmp(a));
    let top = v[0];
    let lse = top + v.iter().map(|x| (x - top).exp()).sum::<f64>().ln();
    lse - row[token] as f64
}

fn softmax(row: &[f32]) -> Vec<f64> {
    let top = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let e: Vec<f64> = row.iter().map(|&x| (x as f64 - top).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

#[test]
fn perplexity_and_comparison_match_a_float64_computation() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.txt");
    std::fs::write(&file, TEXT).unwrap();
    let model = fixture("tiny-llama");
    let ctx = 16;
    let out = onebit()
        .args(["perplexity", "--json", "--ctx", "16", "--precision", "q8"])
        // f32 KV, as the float64 evaluation below builds its targets.
        .args(["--kv-type", "f32"])
        .args(["--compare-precision", "f32", "--model"])
        .arg(&model)
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    let got = json_of(out);

    let tokenizer = tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
    let tokens = tokenizer.encode(TEXT, false).unwrap().get_ids().to_vec();
    let package = std::sync::Arc::new(TargetPackage::open(&model).unwrap());
    let vocab = package.config.vocab_size;
    // f32 KV at both precisions, as the command above runs (`--kv-type f32`).
    let logits_at = |p: Precision, window: &[u32]| {
        let kv_type = npu_runtime::KvType::F32;
        let options = npu_runtime::CpuOptions {
            precision: p,
            kv_type,
            ..Default::default()
        };
        let mut t = CpuTarget::with_options(&package, options).unwrap();
        t.forward(window).unwrap()
    };
    let windows = tokens.len() / ctx;
    assert!(windows >= 2, "the text makes {} tokens", tokens.len());
    let (mut q8_nll, mut f32_nll, mut kl, mut agree) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for w in 0..windows {
        let window = &tokens[w * ctx..(w + 1) * ctx];
        let (lq, lf) = (
            logits_at(Precision::Q8, window),
            logits_at(Precision::F32, window),
        );
        for i in ctx / 2 - 1..ctx - 1 {
            let (rq, rf) = (
                &lq[i * vocab..(i + 1) * vocab],
                &lf[i * vocab..(i + 1) * vocab],
            );
            let next = window[i + 1] as usize;
            q8_nll.push(nll(rq, next));
            f32_nll.push(nll(rf, next));
            let (pq, pf) = (softmax(rq), softmax(rf));
            kl.push(
                pf.iter()
                    .zip(&pq)
                    .map(|(f, q)| f * (f / q).ln())
                    .sum::<f64>()
                    .max(0.0),
            );
            agree += (npu_runtime::argmax(rq) == npu_runtime::argmax(rf)) as usize;
        }
    }
    let ppl = |v: &[f64]| (v.iter().sum::<f64>() / v.len() as f64).exp();
    let close = |a: f64, b: f64, what: &str| {
        assert!(
            (a - b).abs() <= 1e-9 * b.abs().max(1e-12),
            "{what}: {a} vs float64 {b}"
        );
    };
    assert_eq!(got["tokens"], q8_nll.len());
    assert_eq!(got["windows"], windows);
    assert_eq!(got["precision"], "q8");
    close(
        got["perplexity"].as_f64().unwrap(),
        ppl(&q8_nll),
        "perplexity",
    );
    let cmp = &got["compare"];
    assert_eq!(cmp["precision"], "f32");
    close(
        cmp["perplexity"].as_f64().unwrap(),
        ppl(&f32_nll),
        "f32 perplexity",
    );
    close(
        cmp["kld_mean"].as_f64().unwrap(),
        kl.iter().sum::<f64>() / kl.len() as f64,
        "kld_mean",
    );
    let mut sorted = kl.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p99 = sorted[(sorted.len() as f64 * 0.99).ceil() as usize - 1];
    close(cmp["kld_p99"].as_f64().unwrap(), p99, "kld_p99");
    close(
        cmp["top1_agreement"].as_f64().unwrap(),
        agree as f64 / q8_nll.len() as f64,
        "top1_agreement",
    );
    // q8 and f32 are different precisions: the comparison must see a difference.
    assert!(cmp["kld_mean"].as_f64().unwrap() > 0.0);
}

#[test]
fn perplexity_refuses_a_text_shorter_than_a_window() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("short.txt");
    std::fs::write(&file, "Too short.").unwrap();
    let out = onebit()
        .args(["perplexity", "--ctx", "64", "--model"])
        .arg(fixture("tiny-llama"))
        .arg("--file")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fewer than one window of --ctx 64") && err.contains("short.txt"),
        "{err}"
    );
}

/// A window shorter than two tokens scores nothing, and one longer than the model's
/// positions cannot run: both refused by value before any work.
#[test]
fn perplexity_refuses_windows_the_model_cannot_score() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.txt");
    std::fs::write(&file, TEXT).unwrap();
    for (ctx, want) in [
        ("1", "perplexity: --ctx must be at least 2, got 1"),
        (
            "100000",
            "perplexity: --ctx 100000 exceeds the model's 256 positions",
        ),
    ] {
        let out = onebit()
            .args(["perplexity", "--ctx", ctx, "--model"])
            .arg(fixture("tiny-llama"))
            .arg("--file")
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
}

/// Gemma 3 270M (`cargo xtask fetch-model gemma3`) at its defaults (q8x2, the screened
/// head, bf16 KV) against `f32`, on the opening of *Around the World in 80 Days*
/// (`tests/data/eighty-chapter-1.txt`: Project Gutenberg's text, public domain): the
/// perplexity within issue 26's 1% of f32's. Measured here: 2 windows of 256, ratio
/// 1.0022, KL mean 0.0030 (2 windows of 512: 0.9988; docs/speed.md: 4 windows of 1024 of
/// the whole book, 1.0051). Deterministic: the same bits every run. About 15 s.
#[test]
fn real_gemma3_default_perplexity_is_within_one_percent_of_f32() {
    let Some(model) = test_support::fetched_model!(
        "gemma3",
        "real_gemma3_default_perplexity_is_within_one_percent_of_f32"
    ) else {
        return;
    };
    let text = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/eighty-chapter-1.txt");
    let out = onebit()
        .args([
            "perplexity",
            "--ctx",
            "256",
            "--windows",
            "2",
            "--compare-precision",
            "f32",
            "--json",
            "--model",
        ])
        .arg(&model)
        .arg("--file")
        .arg(&text)
        .output()
        .unwrap();
    let v = json_of(out);
    assert_eq!(v["head"], "screened", "{v}");
    let (ours, f32) = (
        v["perplexity"].as_f64().unwrap(),
        v["compare"]["perplexity"].as_f64().unwrap(),
    );
    let ratio = ours / f32;
    eprintln!(
        "gemma3 default vs f32: perplexity {ours:.4} vs {f32:.4} (ratio {ratio:.4}), KL mean {}, top-1 {}",
        v["compare"]["kld_mean"], v["compare"]["top1_agreement"]
    );
    assert!(ratio < 1.01, "perplexity ratio {ratio} (1% bar)");
}
